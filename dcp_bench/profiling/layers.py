"""What the profiler runs: one checkpointing unit of the runtime's models on one micro-batch shard.

A *layer case* is a llama decoder layer or an STDiT spatial+temporal block pair, taken from the
runtime's own model classes (`dcp_bench.runtime.models`) and run on this rank's shard of a packed
micro-batch, with the model's sequence-parallel exchanges inside it: what the executor runs,
one unit at a time. The *outer case* is the model with zero layers (embedding, head, loss).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from dcp_bench.cost.profile_artifact import summarize
from dcp_bench.cost.profile_fit import fit_nonnegative
from dcp_bench.cost.specs import ModelSpec
from dcp_bench.profiling.collectives import slowest_rank_times
from dcp_bench.runtime.attention import SINGLE, SPContext
from dcp_bench.runtime.models import (
    LlamaModel,
    RuntimeModel,
    STDiTModel,
    build_model,
    rope_tables,
    sincos_embedding,
)
from dcp_bench.runtime.step_meter import (
    SavedTensorMeter,
    reset_resident_peak,
    resident_bytes,
    resident_peak_bytes,
)
from dcp_bench.runtime.training import TrainingState, build_training_state, optimizer_state_bytes

SEED = 0


@dataclass
class LayerCase:
    module: nn.Module  # whose parameters the case trains (excluded from activation bytes)
    fn: Callable[[Tensor], Tensor]
    make_input: Callable[[], Tensor]
    tokens_per_rank: int  # rows of this rank's shard, padding included
    # the unit checkpointed as the runtime's model checkpoints it (None: not checkpointed there)
    ckpt_fn: Callable[[Tensor], Tensor] | None = None


def sp_context(size: int, rank: int, group: Any) -> SPContext:
    return SINGLE if size == 1 else SPContext(size=size, rank=rank, group=group)


def one_layer_model(spec: ModelSpec, device: torch.device, dtype: torch.dtype) -> RuntimeModel:
    """The runtime model of ``spec`` cut to one layer (built once per profiling process)."""
    return build_model(
        dataclasses.replace(spec, num_layers=1), seed=SEED, device=device, dtype=dtype
    )


def no_layer_model(spec: ModelSpec, device: torch.device, dtype: torch.dtype) -> RuntimeModel:
    """The runtime model of ``spec`` without layers: embedding, conditioning, head, loss."""
    return build_model(
        dataclasses.replace(spec, num_layers=0), seed=SEED, device=device, dtype=dtype
    )


def layer_case(
    model: RuntimeModel,
    sp: SPContext,
    samples: list[tuple[int, int]],
    dtype: torch.dtype,
) -> LayerCase:
    """The first layer of ``model`` (see `one_layer_model`) on this rank's shard of the samples
    ((tokens, frames) each)."""
    spec, device = model.spec, model.device()
    ids = np.arange(len(samples))
    tokens = np.array([t for t, _ in samples])
    frames = np.array([f for _, f in samples])
    with torch.no_grad():
        shard = model.make_inputs(ids, tokens, frames, sp, SEED)
    h = spec.hidden
    layer: nn.Module
    if isinstance(model, LlamaModel):
        layer = model.layers[0]
        rope = rope_tables(shard.positions, spec.head_dim, dtype)
        rows = int(shard.input_ids.shape[0])

        def fn(x: Tensor) -> Tensor:
            return layer(x, shard, rope, sp)

        def ckpt_fn(x: Tensor) -> Tensor:  # as LlamaModel.forward checkpoints a layer
            out: Tensor = checkpoint(layer, x, shard, rope, sp, use_reentrant=False)
            return out

    else:
        assert isinstance(model, STDiTModel)
        layer = model.pairs[0]
        rows = int(shard.x_t.shape[0])
        # conditioning inputs as the model computes them (leaves that take gradients, as in
        # training where they come from the timestep and caption embedders)
        with torch.no_grad():
            t_emb = model.t_embed(sincos_embedding(shard.timesteps, model.FREQ_DIM).to(dtype))
            t_mod = model.t_block(torch.nn.functional.silu(t_emb)).view(-1, 6, h)  # per sample
            caption_h = model.y_embed(shard.captions.to(dtype))
        t_mod.requires_grad_(True)
        caption_h.requires_grad_(True)

        def fn(x: Tensor) -> Tensor:
            return layer(x, shard, t_mod, caption_h, sp)

        def ckpt_fn(x: Tensor) -> Tensor:  # each block its own checkpoint, as STDiTPair does
            out: Tensor = layer(x, shard, t_mod, caption_h, sp, checkpointed=True)
            return out

    def make_input() -> Tensor:
        return torch.randn(rows, h, device=device, dtype=dtype).requires_grad_(True)

    return LayerCase(
        module=layer, fn=fn, make_input=make_input, tokens_per_rank=rows, ckpt_fn=ckpt_fn
    )


def outer_case(
    model: RuntimeModel, samples: list[tuple[int, int]], dtype: torch.dtype
) -> LayerCase:
    """The model without its layers (`no_layer_model`) on one micro-batch of ``samples``
    ((tokens, frames) each)."""
    device = model.device()
    tokens = np.array([t for t, _ in samples])
    frames = np.array([f for _, f in samples])
    with torch.no_grad():
        shard = model.make_inputs(np.arange(len(samples)), tokens, frames, SINGLE, SEED)

    def fn(x: Tensor) -> Tensor:
        del x  # the outer part reads its inputs from the shard
        return model.loss_sum(shard, SINGLE, 0)

    def make_input() -> Tensor:
        return torch.zeros(1, device=device, dtype=dtype)

    return LayerCase(module=model, fn=fn, make_input=make_input, tokens_per_rank=int(tokens.sum()))


def time_inputs(
    model: RuntimeModel, samples: list[tuple[int, int]], reps: int, warmup: int
) -> dict[str, float]:
    """Time of building one micro-batch's inputs (`RuntimeModel.make_inputs`: the executor does
    it for every micro-batch, on the step clock), median over ``reps``."""
    tokens = np.array([t for t, _ in samples])
    frames = np.array([f for _, f in samples])
    ids = np.arange(len(samples))
    device = model.device()
    times = []
    for rep in range(warmup + reps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        with torch.no_grad():
            model.make_inputs(ids, tokens, frames, SINGLE, SEED + rep)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if rep >= warmup:
            times.append(time.perf_counter() - t0)
    return summarize(times)


STEP_LR = 1e-4
STEP_GRAD_CLIP = 1.0  # the runs' default ``train.grad_clip``


def step_state(
    spec: ModelSpec, device: torch.device, dtype: torch.dtype, zero_stage: int
) -> TrainingState:
    """The whole model with its training states as a run's rank holds them at ``zero_stage``
    (`dcp_bench.runtime.training.build_training_state`: the same builder the runs use)."""
    return build_training_state(spec, SEED, device, STEP_LR, zero_stage=zero_stage, compute=dtype)


def _micro_batch(
    state: TrainingState, samples: list[tuple[int, int]], seed: int, meter: Any = None
) -> tuple[Tensor, int]:
    """Forward and backward of one micro-batch of ``samples`` through the state's model (its
    gradients accumulate as in training); returns the detached loss and, with a
    `SavedTensorMeter`, the bytes autograd saved."""
    model = state.model
    tokens = np.array([t for t, _ in samples])
    frames = np.array([f for _, f in samples])
    shard = model.make_inputs(
        np.arange(len(samples)) + 1000 * seed, tokens, frames, SINGLE, SEED + seed
    )
    saved = 0
    if meter is not None:
        with meter.active():
            loss = model.loss_sum(shard, SINGLE, 0)
        saved = int(meter.bytes)
    else:
        loss = model.loss_sum(shard, SINGLE, 0)
    loss.backward()
    return loss.detach(), saved


def time_training_step(
    state: TrainingState, samples: list[tuple[int, int]], reps: int, warmup: int
) -> list[float]:
    """This rank's seconds of the runtime's end-of-step work, ``state.finish_step`` (the gradient
    reduction of its ZeRO stage, the norm, clipping, the AdamW step and, under ZeRO-1, the
    all-gather of the updated parameters), once per repetition after one micro-batch of
    ``samples`` (off the clock) has filled the gradient accumulators."""
    device = state.model.device()
    distributed = dist.is_initialized() and dist.get_world_size() > 1
    times = []
    for rep in range(warmup + reps):
        state.begin_step()
        loss, _ = _micro_batch(state, samples, rep)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if distributed:
            dist.barrier()
        t0 = time.perf_counter()
        state.finish_step(loss, STEP_GRAD_CLIP)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if rep >= warmup:
            times.append(time.perf_counter() - t0)
    return times


def step_costs(
    spec: ModelSpec,
    device: torch.device,
    dtype: torch.dtype,
    reps: int,
    warmup: int,
    zero_stage: int,
    step_samples: list[tuple[int, int]],
    memory_batches: list[list[tuple[int, int]]] | None = None,
) -> dict[str, Any]:
    """What one training step costs besides its micro-batches, on the whole model as a run's
    rank holds it at ``zero_stage`` (`step_state`): the runtime's own end-of-step work
    (`time_training_step`: ``TrainingState.finish_step``; ``step_overhead_s``, slowest rank);
    and the process's memory baseline: its resident set once ready to train (process group,
    model, training states, steps done) minus what the state holds (``state.static_bytes()``;
    ``process_baseline_bytes``, the largest over ranks). Measured before anything else.

    ``memory_batches`` (CPU): micro-batches ((tokens, frames) per sample), smallest first, each
    run in training steps of the state (`_resident_point`): the resident set's growth over the
    baseline (``VmHWM``, as a training step measures it, glibc's allocator keeping what it keeps;
    the largest over ranks) against the bytes autograd saved in a micro-batch (the activations
    the cost model predicts), fitted as ``resident_fixed_bytes + resident_factor x saved`` (the
    fixed part by least squares, the factor the largest any point needs, so every point is at or
    under the law): the step's own buffers, and what the allocator's retention and the ops'
    temporaries add per saved byte."""
    state = step_state(spec, device, dtype, zero_stage)
    distributed = dist.is_initialized() and dist.get_world_size() > 1
    times = time_training_step(state, step_samples, reps, warmup)
    out: dict[str, Any] = {
        "zero_stage": state.zero_stage,
        "step_overhead_s": summarize(slowest_rank_times(times)),
        "state_bytes": int(state.static_bytes()),
        "optimizer_state_bytes": optimizer_state_bytes(getattr(state, "optimizer", None)),
    }
    rss = resident_bytes()
    if rss is not None:
        base = torch.tensor([float(rss - state.static_bytes())], dtype=torch.float64)
        if distributed:
            dist.all_reduce(base, op=dist.ReduceOp.MAX)
        out["process_baseline_bytes"] = int(base.item())
        out["process_baseline_bytes_profiler"] = int(base.item())
        if memory_batches:
            out.update(_resident_law(state, memory_batches, rss, distributed))
    del state
    return out


def _resident_law(
    state: TrainingState, memory_batches: list[list[tuple[int, int]]], rss: int, distributed: bool
) -> dict[str, Any]:
    """The resident-memory law of `step_costs` from one `_resident_point` per micro-batch."""
    points = [_resident_point(state, samples, rss) for samples in memory_batches]
    growth = torch.tensor(
        [[float(p["resident_bytes"]), float(p["saved_bytes"])] for p in points], dtype=torch.float64
    )
    if distributed:  # the rank that grew most at each point
        dist.all_reduce(growth, op=dist.ReduceOp.MAX)
    for p, (g, _) in zip(points, growth.tolist()):
        p["resident_bytes"] = int(g)
    # resident growth = fixed + factor x saved: the step's own buffers (the gradient accumulator's
    # reduction, the optimizer's temporaries; the least-squares intercept) and what the allocator
    # holds per activation byte, the largest any point needed, so that no measured point exceeds
    # the law (planning under a memory cap needs that side)
    r, saved = growth[:, 0].numpy(), growth[:, 1].numpy()
    fit = fit_nonnegative(np.stack([np.ones(len(points)), saved], axis=1), np.maximum(r, 1.0))
    fixed = float(fit.coef[0])
    factor = max(float(np.max((r - fixed) / np.maximum(saved, 1.0))), 0.0)
    pred = fixed + factor * saved
    return {
        "resident_points": points,
        "resident_fixed_bytes": fixed,
        "resident_factor": factor,
        "resident_fit_max_rel_err": float(np.max(np.abs(pred - r) / np.maximum(r, 1.0))),
    }


def _release_free_memory() -> None:
    """Return the pages glibc's allocator holds free to the OS (``malloc_trim``; nothing where
    this is not glibc)."""
    name = ctypes.util.find_library("c")
    if name:
        try:
            libc = ctypes.CDLL(name)
            if hasattr(libc, "malloc_trim"):
                libc.malloc_trim(0)
        except OSError:
            pass


def _resident_point(
    state: TrainingState, samples: list[tuple[int, int]], rss_before: int
) -> dict[str, Any]:
    """Resident growth over ``rss_before`` during a training step of the state (two
    micro-batches of ``samples`` forward and backward, then ``finish_step``: the runtime's
    gradient reduction, clipping and optimizer step; the third of three such steps, as
    allocations settle), and the most bytes autograd saved in one micro-batch."""
    meter = SavedTensorMeter(state.model)
    peak = saved = 0
    _release_free_memory()  # what earlier points left in the allocator is not this point's
    for rep in range(3):
        reset_resident_peak()
        state.begin_step()
        loss = torch.zeros(())
        for mb in range(2):
            mb_loss, mb_saved = _micro_batch(state, samples, 2 * rep + mb, meter)
            loss = loss + mb_loss
            saved = max(saved, mb_saved)
            del mb_loss
        state.finish_step(loss, STEP_GRAD_CLIP)
        peak = int(resident_peak_bytes() or 0)
    state.begin_step()
    return {
        "tokens": int(sum(t for t, _ in samples)),
        "samples": len(samples),
        "saved_bytes": int(saved),
        "resident_bytes": max(0, peak - rss_before),
    }


def count_params(spec: ModelSpec) -> tuple[int, int]:
    """(parameters of the whole model, parameters of one layer), counted on the meta device so
    that a large model is never materialised."""
    with torch.device("meta"):
        full = build_model(spec, seed=SEED, device="meta")
        one = build_model(dataclasses.replace(spec, num_layers=1), seed=SEED, device="meta")
    per_layer = sum(p.numel() for p in one.parameters()) - sum(
        p.numel() for n, p in one.named_parameters() if not n.startswith(("layers.", "pairs."))
    )
    return sum(p.numel() for p in full.parameters()), per_layer


def static_costs(
    spec: ModelSpec, device: torch.device, dtype: torch.dtype, reps: int, warmup: int
) -> dict[str, Any]:
    """Parameter counts and the optimizer step time. The AdamW step is timed on a one-layer
    model and scaled by the parameter ratio (the step is elementwise: linear in parameters)."""
    params, per_layer = count_params(spec)
    model = build_model(
        dataclasses.replace(spec, num_layers=1), seed=SEED, device=device, dtype=dtype
    )
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    times = []
    for rep in range(warmup + reps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if rep >= warmup:
            times.append(time.perf_counter() - t0)
    small = sum(p.numel() for p in model.parameters())
    step = summarize(times)
    elem = torch.tensor([], dtype=dtype).element_size()
    return {
        "params": int(params),
        "layer_params": int(per_layer),
        "param_bytes": int(params) * elem,
        "optimizer_step_s": step["median"] * params / small,
        "optimizer_step_measured": {"params": int(small), "time_s": step},
    }
