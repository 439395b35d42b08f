"""The one-command GPU check (``scripts/gpu_check.sh --out DIR``): one 10-minute command on one
GPU, at most 8 files into DIR, nothing into the repository. Phases (`PHASES`), each with its own
deadline (`PhaseClock`), each writing what it measured as soon as it has it:

1. ``kernel``: the packed-attention kernel the runtime selected on this device and why
   (`dcp_bench.runtime.attention.select_attention_kernel`), and forward+backward time and TFLOP/s
   of causal packed attention at Llama-3-8B's heads (32 query / 8 KV, head dim 128, bf16) from 4K
   to 128K tokens, for the selected kernel and for fused per-segment SDPA (grouped KV heads
   repeated before the clock starts when the kernel would repeat them itself).
2. ``smoke``: the selected kernel against an exact fp32 reference, outputs and gradients
   element-wise, at 4K-64K tokens (`dcp_bench.profiling.attention_check`); then a CUDA smoke test
   of the runtime on one rank in bf16: a Llama-3-8B layer (with its embedding, full-vocabulary
   chunked LM loss) and an STDiT3-XL/2 block pair, each trained for 3 steps at 4K, 16K and 64K
   tokens by the real executor (`execute_step` on a 1-rank process group, ZeRO stage 0: fp32
   master weights, fp32 gradient accumulation). Per step: the loss by fused per-segment SDPA
   (when another kernel was selected) and by an fp32 copy of the master weights (the reference),
   every parameter tensor's gradient against the reference's, the measured peak memory
   (``torch.cuda.max_memory_allocated``) beside the analytical cost model's prediction, and the
   state's bytes beside `dcp_bench.train_policy.static_state_bytes`.
3. ``calibration``: the profiles ``llama3_8b.json``, ``stdit3_xl2.json``
   (`tools.gpu_calibrate`), rewritten after every point.
4. ``buckets``, ``floor``, ``fit``, ``claim``: `tools.gpu_measure`
   (``stdit_buckets.json``, ``h200_constants.yaml``, ``claim.tar.gz``).

``check.json`` holds the environment (interpreter, torch, CUDA, driver, GPU name and memory,
commit) and the kernel, smoke and floor results; ``summary.md`` the numbers in tables, the phases'
times and the verdict; ``gpu_check.log`` (written by the shell script) the console.

``--device cpu --tiny``: the same code on the CPU test models at small sizes in fp32 (the test
suite's dry run). Exit status (the smoke test's): 0 when every attention check passed and every
smoke step was finite with losses and layer gradients agreeing with the reference, 1 otherwise
(the files are written either way; the later phases inform and do not change it), 2 for bad
arguments.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from dcp_bench.archs import get_arch
from dcp_bench.batch import GlobalBatch
from dcp_bench.cost import make_cost_model
from dcp_bench.cost.params import param_breakdown
from dcp_bench.cost.specs import ModelSpec, gpu_spec, model_spec
from dcp_bench.envinfo import COMMIT_ENV, collect_env
from dcp_bench.files import atomic_write_json, atomic_write_text, sha256_file
from dcp_bench.plan import Group, MicroBatch, Round, StepPlan
from dcp_bench.profiling.attention_check import check_kernel
from dcp_bench.runtime.attention import (
    SINGLE,
    AttentionKernel,
    _torch_varlen_func,
    repeat_kv,
    select_attention_kernel,
)
from dcp_bench.runtime.executor import execute_step
from dcp_bench.runtime.groups import ProcessGroupPool
from dcp_bench.runtime.models import build_model
from dcp_bench.runtime.training import FlatState, build_training_state
from dcp_bench.train_policy import static_state_bytes
from tools import gpu_measure
from tools.gpu_calibrate import calibrate
from tools.gpu_measure import summary_lines

FILES = ("check.json", "summary.md", "gpu_check.log")
MAX_FILES = 8
# Loss agreement: bf16 against the fp32 reference, and two bf16 kernels against each other (the
# kernels' own accumulation orders differ); fp32 everywhere on the CPU dry run.
TOL_BF16_VS_FP32 = 2e-2
TOL_KERNELS_BF16 = 1e-2
TOL_FP32 = 1e-5
# Layer gradients per parameter tensor, relative L2 against the fp32 reference.
TOL_GRAD_FP32 = 1e-4
TOL_GRAD_BF16 = 5e-2


# ------------------------------------------------------------------------------------------------
# Settings of the full check and of its CPU dry run


@dataclasses.dataclass(frozen=True)
class CheckSizes:
    """What the check runs: models, attention lengths, the smoke steps' samples."""

    llama: str
    stdit: str
    attention_lengths: tuple[int, ...]
    attention_heads: tuple[int, int, int]  # query heads, KV heads, head dim
    text_steps: tuple[tuple[int, ...], ...]  # per step: sample lengths
    video_steps: tuple[tuple[tuple[int, int], ...], ...]  # per step: (frames, patches per frame)
    reps: int
    check_lengths: tuple[int, ...] = ()  # element-wise attention checks: total packed tokens


FULL = CheckSizes(
    llama="llama3_8b",
    stdit="stdit3_xl2",
    attention_lengths=(4096, 16384, 32768, 65536, 131072),
    attention_heads=(32, 8, 128),
    text_steps=((2048, 1024, 512, 512), (8192, 4096, 4096), (65536,)),
    video_steps=(((1, 3600),), ((3, 3600), (1, 3600)), ((18, 3600),)),  # 3.6K, 14.4K, 64.8K
    reps=3,
    check_lengths=(4096, 16384, 65536),
)
TINY = CheckSizes(
    llama="tiny_llama",
    stdit="tiny_stdit",
    attention_lengths=(256, 1024),
    attention_heads=(8, 4, 32),
    text_steps=((128, 64, 32, 32), (256, 128), (512,)),
    video_steps=(((2, 64),), ((3, 64), (1, 64)), ((8, 64),)),
    reps=1,
    check_lengths=(256, 1024),
)


# ------------------------------------------------------------------------------------------------
# Attention kernels


def _timed(fn: Any, device: Any, reps: int) -> float:
    times = []
    for rep in range(reps + 1):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize(device)
            elapsed = start.elapsed_time(end) / 1e3
        else:
            t0 = time.perf_counter()
            fn()
            elapsed = time.perf_counter() - t0
        if rep:  # the first run warms up (kernel selection, allocator)
            times.append(elapsed)
    return statistics.median(times)


def _gqa_outside(kernel: Any) -> bool:
    """True when ``kernel`` would repeat grouped KV heads itself (torch's varlen kernel without
    ``enable_gqa``): the timing then repeats them once, before the clock starts, so the kernel
    and SDPA (which reads grouped heads natively) are compared on the attention alone."""
    if kernel.name != "torch_varlen":
        return False
    fn = _torch_varlen_func()
    return fn is not None and "enable_gqa" not in inspect.signature(fn).parameters


def _time_kernel(
    kernel: Any, qkv: tuple[Any, Any, Any], lens: list[int], device: Any, reps: int
) -> float:
    """Median forward+backward time of causal packed attention by ``kernel``."""

    def step() -> None:
        for t in qkv:
            t.grad = None
        kernel(*qkv, lens, lens, True).float().square().mean().backward()

    return _timed(step, device, reps)


def attention_report(
    device: Any, dtype: Any, sizes: CheckSizes, deadline: float = math.inf, write: Any = None
) -> dict[str, Any]:
    """The selected kernel and its attention throughput against length (see the module doc).
    Lengths whose expected time (4.5 x the last: the work grows as n^2) would pass ``deadline``
    are listed as skipped; ``write`` gets the report after every length."""
    H, KV, D = sizes.attention_heads
    kernel = select_attention_kernel(device, dtype, D)
    kernels = (
        [kernel]
        if kernel.name == "sdpa"
        else [kernel, AttentionKernel("sdpa", fused_only=device.type == "cuda")]
    )
    rows: list[dict[str, Any]] = []
    report = {
        "selected": kernel.describe(),
        "heads": {"query": H, "kv": KV, "head_dim": D},
        "dtype": str(dtype).replace("torch.", ""),
        "throughput": rows,
        "gqa_repeat_outside_timing": [k.name for k in kernels if _gqa_outside(k)],
        "flop_convention": (
            "causal: 2 n^2 H D per forward (QK^T + AV on half the scores), backward 2.5x"
        ),
    }
    last = 0.0
    for n in sizes.attention_lengths:
        if time.time() + 4.5 * last > deadline:
            rows.append(
                {
                    "kernel": "all",
                    "tokens": n,
                    "error": "skipped: the phase's time budget was spent",
                }
            )
            continue
        t_len = time.time()
        lens = [n // 4, n // 4, n // 2]  # three packed documents
        g = torch.Generator(device=device).manual_seed(n)
        q, k, v = (
            torch.randn(n, h, D, generator=g, device=device, dtype=dtype).requires_grad_()
            for h in (H, KV, KV)
        )
        # causal: QK^T and AV over half the score matrix, 2 FLOPs per MAC; backward 2.5 x forward
        flops = 3.5 * sum(2.0 * m * m * H * D for m in lens)
        for kern in kernels:
            try:
                if _gqa_outside(kern):
                    rep = H // KV
                    kr, vr = (repeat_kv(t.detach(), rep, 1).requires_grad_() for t in (k, v))
                    s = _time_kernel(kern, (q, kr, vr), lens, device, sizes.reps)
                    del kr, vr
                else:
                    s = _time_kernel(kern, (q, k, v), lens, device, sizes.reps)
                rows.append(
                    {
                        "kernel": kern.name,
                        "tokens": n,
                        "segments": lens,
                        "fwd_bwd_s": s,
                        "tflop_per_s": flops / s / 1e12,
                    }
                )
            except Exception as exc:
                rows.append(
                    {
                        "kernel": kern.name,
                        "tokens": n,
                        "segments": lens,
                        "error": f"{type(exc).__name__}: {str(exc)[:300]}",
                    }
                )
            if device.type == "cuda":
                torch.cuda.empty_cache()
        del q, k, v
        last = time.time() - t_len
        if write is not None:
            write(report)
    return report


# ------------------------------------------------------------------------------------------------
# Smoke test of the runtime


def _step_plan(n: int) -> Any:
    return StepPlan(
        world_size=1,
        rounds=[
            Round(
                groups=[
                    Group(
                        start=0,
                        size=1,
                        micro_batches=[MicroBatch(samples=tuple(range(n)), ckpt_layers=0)],
                    )
                ]
            )
        ],
        mode="fair",
    )


def _eval_loss(model: Any, batch: Any, seed: int, kernel: Any) -> float:
    saved = model.attention
    model.set_attention(kernel)
    try:
        with torch.no_grad():
            inputs = model.make_inputs(batch.sample_ids, batch.tokens, batch.frames, SINGLE, seed)
            return float(model.loss_sum(inputs, SINGLE, 0)) / batch.total_tokens
    finally:
        model.set_attention(saved)


def _reference_gradients(reference: Any, batch: Any, seed: int) -> Any:
    """The fp32 reference's gradient of the step's loss (summed over tokens, divided by the step's
    token count, as the runtime normalises it), flat in parameter order."""
    reference.zero_grad(set_to_none=True)
    inputs = reference.make_inputs(batch.sample_ids, batch.tokens, batch.frames, SINGLE, seed)
    (reference.loss_sum(inputs, SINGLE, 0) / batch.total_tokens).backward()
    grads = torch.cat(
        [
            (torch.zeros_like(p) if p.grad is None else p.grad).reshape(-1).float()
            for p in reference.parameters()
        ]
    )
    reference.zero_grad(set_to_none=True)
    return grads


def gradient_agreement(got: Any, ref: Any, names: list[tuple[str, int]]) -> dict[str, Any]:
    """Per parameter tensor: the relative L2 error ``|g - r| / |r|`` and the largest element-wise
    error relative to the tensor's largest reference magnitude; the worst of each."""
    rows: list[dict[str, Any]] = []
    off = 0
    for name, n in names:
        g, r = got[off : off + n].float(), ref[off : off + n].float()
        off += n
        rn, rmax = float(r.norm()), float(r.abs().max())
        if rn == 0.0:
            continue
        rows.append(
            {
                "param": name,
                "rel_l2": float((g - r).norm()) / rn,
                "rel_max": float((g - r).abs().max()) / rmax,
            }
        )
    worst_l2 = max(rows, key=lambda x: x["rel_l2"]) if rows else None
    worst_max = max(rows, key=lambda x: x["rel_max"]) if rows else None
    return {
        "tensors": len(rows),
        "worst_rel_l2": worst_l2,
        "worst_rel_max": worst_max,
        "total_rel_l2": float((got - ref).norm()) / max(float(ref.norm()), 1e-30),
    }


def smoke_model(
    name: str,
    steps: list[Any],
    device: Any,
    pool: Any,
    cluster: str,
    seed: int = 0,
    deadline: float = math.inf,
    kernel: Any = None,
    write: Any = None,
) -> dict[str, Any]:
    """Train a one-layer ``name`` for ``len(steps)`` steps (see the module docstring). ``kernel``
    replaces the selected attention kernel (the test suite's broken kernels); a step that would
    start after ``deadline`` is skipped; ``write`` gets the result after every step."""
    spec = dataclasses.replace(model_spec(name), num_layers=1)
    state = build_training_state(spec, seed, device, lr=1e-4, zero_stage=0)
    assert isinstance(state, FlatState)
    model = state.model
    if kernel is not None:
        model.set_attention(kernel)
    cuda = device.type == "cuda"
    sdpa = AttentionKernel("sdpa", fused_only=cuda)
    # The reference: the fp32 master weights in an fp32 model, fused SDPA (efficient kernel on
    # CUDA: flash takes no fp32).
    reference = build_model(spec, seed=seed, device=device, dtype=torch.float32)
    reference.set_attention(sdpa)
    cost = make_cost_model(spec, cluster, source="analytical", zero_stage=0, mem_cap_fraction=1.0)
    pb = param_breakdown(spec)
    policy_bytes = static_state_bytes(pb.total, pb.per_layer, 1, 0, state.policy)  # type: ignore[arg-type]
    out: dict[str, Any] = {
        "model": spec.name,
        "layers": 1,
        "params": pb.total,
        "attention": model.attention.describe(),
        "precision": state.describe()["precision"],
        "zero_stage": 0,
        "steps": [],
        "skipped_steps": [],
    }
    names = [(n, p.numel()) for n, p in reference.named_parameters()]
    last = 0.0
    for i, batch in enumerate(steps):
        if time.time() + 2.0 * last > deadline:
            out["skipped_steps"].append(
                {
                    "step": i,
                    "tokens": int(batch.total_tokens),
                    "reason": "the smoke phase's time budget was spent",
                }
            )
            continue
        t_step = time.time()
        with torch.no_grad():
            # the reference's parameters become views of the fp32 master weights (no copy)
            torch.nn.utils.vector_to_parameters(state.master[: state.numel], reference.parameters())
        losses = {"reference_fp32": _eval_loss(reference, batch, seed, sdpa)}
        ref_grads = _reference_gradients(reference, batch, seed)
        if model.attention.name != "sdpa":
            losses["sdpa_" + str(state.policy.compute)] = _eval_loss(model, batch, seed, sdpa)  # type: ignore[union-attr]
        # No clipping: the accumulated gradient stays as the backward left it, to compare with the
        # reference's (the optimizer reads it and leaves it).
        res = execute_step(_step_plan(batch.n), batch, state, None, pool, seed=seed, grad_clip=None)
        losses["runtime"] = res.loss
        grads = gradient_agreement(state.gradients(), ref_grads, names)
        del ref_grads
        mb = cost.microbatch_cost(batch.tokens, batch.frames, 1, 0)
        static = cost.static_memory_breakdown()  # type: ignore[attr-defined]
        flops = mb.model_flops
        peak_flops = (
            datasheet_peak_flops(torch.cuda.get_device_name(device)) if cuda else float("nan")
        )
        out["steps"].append(
            {
                "step": i,
                "tokens": int(batch.total_tokens),
                "samples": batch.tokens.tolist(),
                "frames": batch.frames.tolist(),
                "losses": losses,
                "gradients": grads,
                "finite": res.finite,
                "grad_norm": res.grad_norm,
                "busy_s": res.busy_s,
                "tokens_per_s": batch.total_tokens / res.busy_s if res.busy_s else None,
                "model_tflop_per_s": flops / res.busy_s / 1e12 if res.busy_s else None,
                "mfu": flops / res.busy_s / peak_flops if res.busy_s and cuda else None,
                "memory": {
                    "measured_peak_bytes": res.peak_mem_bytes,
                    "measure": "torch.cuda.max_memory_allocated"
                    if cuda
                    else "cpu lower bound (static + saved tensors)",
                    "predicted_bytes": mb.mem_bytes,
                    "predicted_workspace_bytes": static.get("workspace", 0.0),
                    "predicted_without_workspace_bytes": mb.mem_bytes
                    - static.get("workspace", 0.0),
                    "predicted_static_breakdown": static,
                    "state_bytes": state.static_bytes(),
                    "policy_state_bytes": policy_bytes,
                },
            }
        )
        print(
            f"  smoke {spec.name} step {i}: {batch.total_tokens} tokens, losses "
            + ", ".join(f"{k} {v:.5f}" for k, v in losses.items())
            + ", layer gradients worst rel. L2 "
            f"{grads['worst_rel_l2']['rel_l2'] if grads['worst_rel_l2'] else 0:.2e}"
            + f", peak {res.peak_mem_bytes / 2**30:.2f} GiB (predicted {mb.mem_bytes / 2**30:.2f} "
            "GiB)",
            file=sys.stderr,
            flush=True,
        )
        if cuda:
            torch.cuda.empty_cache()
        last = time.time() - t_step
        if write is not None:
            write(out)
    return out


def smoke_verdict(smoke: dict[str, Any], fp32: bool) -> list[str]:
    """Problems found in a smoke result (empty: passed): an attention check that failed or did not
    run, a model that failed or ran no step, a non-finite step, losses or layer gradients that
    disagree with the fp32 reference."""
    problems = []
    attn = smoke.get("attention_check", [])
    if not any("passed" in a for a in attn):
        problems.append("attention check: no length was checked")
    for a in attn:
        if a.get("error"):
            problems.append(f"attention check at {a['tokens']} tokens: {a['error']}")
        elif not a.get("passed", True):
            bad = {
                k: f"{v['max_rel_err']:.3g} > {v['tolerance']:.3g}"
                for k, v in a["tensors"].items()
                if not v["passed"]
            }
            problems.append(
                f"attention check at {a['tokens']} tokens: kernel differs from the fp32 reference "
                f"{bad}"
            )
    grad_tol = TOL_GRAD_FP32 if fp32 else TOL_GRAD_BF16
    for model in smoke["models"]:
        if not model.get("error") and not model["steps"]:
            problems.append(f"{model['model']}: no smoke step ran")
        for st in model["steps"]:
            g = st.get("gradients") or {}
            worst = g.get("worst_rel_l2")
            if worst and worst["rel_l2"] > grad_tol:
                problems.append(
                    f"{model['model']} step {st['step']}: layer gradient {worst['param']} differs "
                    f"from the fp32 reference by {worst['rel_l2']:.3g} (relative L2; tolerance "
                    f"{grad_tol:g})"
                )
    for model in smoke["models"]:
        for st in model["steps"]:
            losses = st["losses"]
            where = f"{model['model']} step {st['step']}"
            if not st["finite"] or not all(math.isfinite(v) for v in losses.values()):
                problems.append(f"{where}: non-finite loss or gradient {losses}")
                continue
            ref = losses["reference_fp32"]
            tol = TOL_FP32 if fp32 else TOL_BF16_VS_FP32
            for key, val in losses.items():
                if key == "reference_fp32":
                    continue
                # the runtime's loss is before its update, so it compares with the reference too
                if abs(val - ref) > tol * abs(ref):
                    problems.append(
                        f"{where}: {key} loss {val:.6f} vs fp32 reference {ref:.6f} (tolerance "
                        f"{tol:g})"
                    )
            if "runtime" in losses and len(losses) == 3:
                other = next(v for k, v in losses.items() if k.startswith("sdpa_"))
                tol_k = TOL_FP32 if fp32 else TOL_KERNELS_BF16
                if abs(losses["runtime"] - other) > tol_k * abs(other):
                    problems.append(
                        f"{where}: selected kernel {losses['runtime']:.6f} vs SDPA {other:.6f}"
                    )
    return problems


def run_attention_checks(
    device: Any,
    dtype: Any,
    sizes: CheckSizes,
    deadline: float = math.inf,
    kernel: Any = None,
    write: Any = None,
) -> list[dict[str, Any]]:
    """The selected kernel (or ``kernel``) against the exact fp32 reference at every length of
    ``sizes.check_lengths`` (`dcp_bench.profiling.attention_check`); lengths a spent budget
    leaves out are listed as skipped."""
    H, KV, D = sizes.attention_heads
    kern = kernel if kernel is not None else select_attention_kernel(device, dtype, D)
    rows: list[dict[str, Any]] = []
    last = 0.0
    for n in sizes.check_lengths:
        if time.time() + 4.5 * last > deadline:
            rows.append({"tokens": n, "skipped": "the smoke phase's time budget was spent"})
            continue
        t0 = time.time()
        try:
            row = check_kernel(kern, n, (H, KV, D), device, dtype)
            row["kernel"] = getattr(kern, "name", repr(kern))
        except Exception as exc:
            row = {"tokens": n, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        rows.append(row)
        print(
            f"  attention check {n} tokens: "
            + (
                "error " + row["error"]
                if "error" in row
                else ("passed" if row["passed"] else "FAILED")
                + " "
                + ", ".join(
                    f"{k} {v['max_rel_err']:.2e}/{v['tolerance']:.1e}"
                    for k, v in row["tensors"].items()
                )
            ),
            file=sys.stderr,
            flush=True,
        )
        if device.type == "cuda":
            torch.cuda.empty_cache()
        last = time.time() - t0
        if write is not None:
            write(rows)
    return rows


def run_smoke(
    device: Any,
    sizes: CheckSizes,
    cluster: str,
    deadline: float = math.inf,
    kernel: Any = None,
    write: Any = None,
) -> dict[str, Any]:
    """The attention checks, then both models' smoke runs on a one-rank process group, each
    within its share of the time left before ``deadline``; ``write`` gets the result so far after
    every check and step."""
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    result: dict[str, Any] = {"attention_check": [], "models": []}

    def emit() -> None:
        if write is not None:
            write(result)

    start = time.time()
    # a third of the phase for the kernel checks, the rest shared by the two models
    check_deadline = start + (deadline - start) / 3 if math.isfinite(deadline) else deadline

    def set_checks(rows: list[dict[str, Any]]) -> None:
        result["attention_check"] = rows
        emit()

    result["attention_check"] = run_attention_checks(
        device, dtype, sizes, check_deadline, kernel, set_checks
    )
    emit()
    text = [
        GlobalBatch(
            step=i,
            sample_ids=np.arange(100 * i, 100 * i + len(s)),
            tokens=np.array(s, dtype=np.int64),
            frames=np.ones(len(s), dtype=np.int64),
        )
        for i, s in enumerate(sizes.text_steps)
    ]
    video = [
        GlobalBatch(
            step=i,
            sample_ids=np.arange(100 * i, 100 * i + len(s)),
            tokens=np.array([f * p for f, p in s], dtype=np.int64),
            frames=np.array([f for f, _ in s], dtype=np.int64),
        )
        for i, s in enumerate(sizes.video_steps)
    ]
    with tempfile.TemporaryDirectory(prefix="dcp-gpu-check-") as tmp:
        dist.init_process_group(
            "nccl" if device.type == "cuda" else "gloo",
            init_method=f"file://{tmp}/pg",
            rank=0,
            world_size=1,
        )
        try:
            pool = ProcessGroupPool(timeout_s=300)
            jobs = ((sizes.llama, text), (sizes.stdit, video))
            for j, (name, steps) in enumerate(jobs):
                share = (
                    (deadline - time.time()) / (len(jobs) - j)
                    if math.isfinite(deadline)
                    else math.inf
                )
                model_deadline = time.time() + share
                result["models"].append({"model": name, "steps": [], "running": True})

                def set_model(res: dict[str, Any], j: int = j) -> None:
                    result["models"][j] = {**res, "running": True}
                    emit()

                try:
                    result["models"][j] = smoke_model(
                        name,
                        steps,
                        device,
                        pool,
                        cluster,
                        deadline=model_deadline,
                        kernel=kernel,
                        write=set_model,
                    )
                except Exception as exc:  # recorded: the other model and the calibration still run
                    result["models"][j] = {
                        "model": name,
                        "error": f"{type(exc).__name__}: {str(exc)[:500]}",
                        "steps": [],
                    }
                    print(
                        f"  smoke {name}: FAILED {type(exc).__name__}: {exc}",
                        file=sys.stderr,
                        flush=True,
                    )
                emit()
                if device.type == "cuda":
                    torch.cuda.empty_cache()
        finally:
            dist.destroy_process_group()
    return result


# ------------------------------------------------------------------------------------------------
# Summary


def layer_mfu(artifact: dict[str, Any], tokens: int, peak_flops: float) -> dict[str, Any] | None:
    """Model FLOP/s of one Llama layer at ``tokens`` (single sample) from a calibration artifact:
    3 x the forward FLOPs (GEMMs + causal attention) over forward + backward time."""
    spec = ModelSpec(**{**artifact["model"], "patch": tuple(artifact["model"]["patch"])})
    for p in artifact["layers"]:
        if p.get("oom") or p["shape"] != "single" or p["tokens_per_rank"] != tokens:
            continue
        h, f, kvd = spec.hidden, spec.ffn_hidden, spec.kv_heads * spec.head_dim
        fwd = 2.0 * tokens * (h * (h + 2 * kvd) + h * h + 3 * h * f) + 2.0 * tokens * tokens * h
        t = p["fwd_s"]["median"] + p["bwd_s"]["median"]
        return {
            "tokens": tokens,
            "fwd_bwd_s": t,
            "model_tflop_per_s": 3 * fwd / t / 1e12,
            "mfu": 3 * fwd / t / peak_flops,
        }
    return None


def datasheet_peak_flops(device_name: str) -> float:
    """Dense bf16 peak of the GPU the device name says (`dcp_bench/conf/gpu`), NaN if unknown."""
    for key in ("h200", "h100"):
        if key in device_name.lower():
            return float(gpu_spec(key).peak_flops)
    return float("nan")


def summary_markdown(report: dict[str, Any]) -> str:
    smoke_ran = "smoke" in report.get("phases", {"smoke": 1})
    verdict = ("PASS" if not report["problems"] else "FAIL") if smoke_ran else "NO SMOKE TEST"
    lines = [
        "# dcp-bench GPU check",
        "",
        f"{report['device']} ({report['dtype']}), torch {report['torch']}, python "
        f"`{report.get('interpreter')}`, {report['wall_s']:.0f} s. Verdict (the smoke test): "
        f"**{verdict}**",
        "",
    ]
    for p in report["problems"]:
        lines.append(f"- problem: {p}")
    for n in report.get("notes", []):
        lines.append(f"- note: {n}")
    phases = report.get("phases", {})
    if phases:
        lines += ["", "| phase | budget s | started s | ended s |", "|---|---|---|---|"]
        for name, ph in phases.items():
            lines.append(
                f"| {name} | {ph.get('budget_s', '')} | {ph.get('started_s', '-')} | "
                f"{ph.get('ended_s', '-')} |"
            )
    k = report.get("kernel")
    if k:
        lines += ["", f"## Attention kernel: `{k['selected']['kernel']}`", ""]
        lines += [f"- {n}" for n in k["selected"]["notes"]]
        lines += ["", "| kernel | tokens | fwd+bwd s | TFLOP/s |", "|---|---|---|---|"]
        for r in k["throughput"]:
            lines.append(
                f"| {r['kernel']} | {r['tokens']} | {r.get('fwd_bwd_s', float('nan')):.4f} | "
                f"{r.get('tflop_per_s', float('nan')):.3g} |"
                if "error" not in r
                else f"| {r['kernel']} | {r['tokens']} | error | {r['error'][:80]} |"
            )
    smoke = report.get("smoke")
    if smoke and smoke.get("attention_check"):
        lines += [
            "",
            "## Attention against the exact fp32 reference (max element-wise error / tolerance)",
            "",
            "| tokens | out | dq | dk | dv | passed |",
            "|---|---|---|---|---|---|",
        ]
        for a in smoke["attention_check"]:
            if "tensors" in a:
                cells = [
                    f"{a['tensors'][t]['max_rel_err']:.2e} / {a['tensors'][t]['tolerance']:.1e}"
                    for t in ("out", "dq", "dk", "dv")
                ]
                lines.append(f"| {a['tokens']} | {' | '.join(cells)} | {a['passed']} |")
            else:
                lines.append(f"| {a['tokens']} | {a.get('error') or a.get('skipped')} | | | | |")
    if smoke:
        lines += [
            "",
            "## Smoke test (one rank, one layer, 3 steps)",
            "",
            "| model | step | tokens | losses | layer grads: worst rel. L2 | measured peak GiB | "
            "predicted GiB (w/o workspace) | MFU |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for m in smoke["models"]:
            if m.get("error"):
                lines.append(f"| {m['model']} | - | - | error: {m['error'][:100]} | | | | |")
            for st in m["steps"]:
                mem = st["memory"]
                losses = ", ".join(f"{a} {b:.4f}" for a, b in st["losses"].items())
                mfu = "-" if st["mfu"] is None else f"{st['mfu']:.2f}"
                w = (st.get("gradients") or {}).get("worst_rel_l2")
                gcell = f"{w['rel_l2']:.2e} ({w['param']})" if w else "-"
                lines.append(
                    f"| {m['model']} | {st['step']} | {st['tokens']} | {losses} | {gcell} | "
                    f"{mem['measured_peak_bytes'] / 2**30:.2f} | "
                    f"{mem['predicted_without_workspace_bytes'] / 2**30:.2f} | {mfu} |"
                )
    for name, info in report.get("calibration", {}).items():
        lines += [
            "",
            f"## Calibration: {name}",
            "",
            f"- file: `{info['file']}` (sha256 {info['sha256'][:16]}...)",
            f"- points measured: {info['points']}, out of memory: {info['oom']}, failed or "
            f"skipped: {info['failures']}",
        ]
        if info.get("layer_mfu"):
            m = info["layer_mfu"]
            lines.append(
                f"- one layer at {m['tokens']} tokens: fwd+bwd {m['fwd_bwd_s']:.3f} s, "
                f"{m['model_tflop_per_s']:.0f} model TFLOP/s, MFU {m['mfu']:.2f}"
            )
    lines += summary_lines(report)
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------


# Seconds each phase is planned to take on one H200 (the CPU dry run scales them by its budget).
# A phase stops starting new work at its deadline: its planned end, or half its budget from its
# actual start when earlier phases ran late, but never into the halves the later phases keep.
PHASES: dict[str, float] = {
    "kernel": 35.0,
    "smoke": 110.0,
    "calibration": 190.0,
    "buckets": 110.0,
    "floor": 20.0,
    "fit": 10.0,
    "claim": 65.0,
}


class PhaseClock:
    """The deadlines of the check's phases (see `PHASES`)."""

    def __init__(self, budget_s: float, phases: list[str]) -> None:
        self.start = time.time()
        self.end = self.start + budget_s
        scale = budget_s / sum(PHASES.values())
        self.budget = {p: PHASES[p] * scale for p in phases}
        self.order = list(phases)

    def deadline(self, phase: str) -> float:
        i = self.order.index(phase)
        planned_end = self.start + sum(self.budget[p] for p in self.order[: i + 1])
        now = time.time()
        keep_for_later = sum(self.budget[p] / 2 for p in self.order[i + 1 :])
        return min(max(planned_end, now + self.budget[phase] / 2), self.end - keep_for_later)


def _parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]] | int:
    """The arguments and the phases to run, in `PHASES` order; an exit status (2) when bad."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder for the check's files (at most 8)")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument(
        "--tiny", action="store_true", help="the CPU dry run: tiny models, small sizes, fp32"
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="seconds for the whole check (default 540; 150 with --tiny)",
    )
    parser.add_argument(
        "--phases",
        default=",".join(PHASES),
        help=f"comma-separated phases to run, in this order: {','.join(PHASES)} (default all)",
    )
    parser.add_argument(
        "--no-calibration", action="store_true", help="only the kernel and smoke phases"
    )
    parser.add_argument(
        "--commit", default=None, help="the project's commit, recorded when the tree has no .git"
    )
    parser.add_argument(
        "--fault",
        default=None,
        choices=["attention"],
        help=(
            "the check's self-test: run the smoke phase with a deliberately wrong attention "
            "kernel (it must fail)"
        ),
    )
    args = parser.parse_args(argv)
    phases = [p for p in args.phases.split(",") if p]
    unknown = [p for p in phases if p not in PHASES]
    if unknown or not phases:
        print(
            f"gpu_check: --phases {args.phases!r}: unknown phase {(unknown or [''])[0]!r}; "
            f"expected names from {', '.join(PHASES)}",
            file=sys.stderr,
        )
        return 2
    if args.no_calibration:
        phases = [p for p in phases if p in ("kernel", "smoke")]
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device; use --device cpu --tiny for the dry run", file=sys.stderr)
        return 2
    if args.budget_s is None:
        args.budget_s = 150.0 if args.tiny else 540.0
    if not args.budget_s > 0:
        print(
            f"gpu_check: --budget-s {args.budget_s}: expected a number of seconds > 0",
            file=sys.stderr,
        )
        return 2
    return args, [p for p in PHASES if p in phases]


@dataclasses.dataclass
class CheckFiles:
    """The check's two files as they grow: ``check.json`` (``check``) and ``summary.md`` (from
    ``report``), rewritten at every phase's start and end."""

    out: Path
    clock: PhaseClock
    check: dict[str, Any]
    report: dict[str, Any]

    def write_check(self) -> None:
        atomic_write_json(self.out / "check.json", self.check)

    def write_summary(self) -> None:
        self.report["wall_s"] = time.time() - self.clock.start
        atomic_write_text(self.out / "summary.md", summary_markdown(self.report))

    def begin(self, phase: str) -> float:
        self.check["phases"][phase]["started_s"] = round(time.time() - self.clock.start, 1)
        self.write_check()
        print(
            f"gpu_check: phase {phase} (deadline in "
            f"{self.clock.deadline(phase) - time.time():.0f} s)",
            file=sys.stderr,
            flush=True,
        )
        return self.clock.deadline(phase)

    def finish(self, phase: str) -> None:
        self.check["phases"][phase]["ended_s"] = round(time.time() - self.clock.start, 1)
        self.write_check()
        self.write_summary()


def _kernel_phase(files: CheckFiles, device: Any, dtype: Any, sizes: CheckSizes) -> None:
    deadline = files.begin("kernel")

    def put_kernel(k: dict[str, Any]) -> None:
        files.check["kernel"] = files.report["kernel"] = k
        files.write_check()

    try:
        put_kernel(attention_report(device, dtype, sizes, deadline, put_kernel))
    except Exception as exc:
        files.report["notes"].append(f"kernel timing: {type(exc).__name__}: {str(exc)[:300]}")
    files.finish("kernel")


def _smoke_phase(
    files: CheckFiles, device: Any, dtype: Any, sizes: CheckSizes, cluster: str, fault: str | None
) -> None:
    deadline = files.begin("smoke")
    broken = broken_attention_kernel(device) if fault == "attention" else None

    def put_smoke(sm: dict[str, Any]) -> None:
        files.check["smoke"] = files.report["smoke"] = sm
        files.write_check()

    smoke = run_smoke(device, sizes, cluster, deadline, broken, put_smoke)
    put_smoke(smoke)
    report = files.report
    report["problems"] += [f"{m['model']}: {m['error']}" for m in smoke["models"] if m.get("error")]
    report["problems"] += smoke_verdict(smoke, fp32=dtype == torch.float32)
    if fault:
        report["notes"].append(
            f"--fault {fault}: the smoke phase ran a deliberately wrong attention kernel"
        )
    files.finish("smoke")


def _calibration_phase(files: CheckFiles, device_name: str, tiny: bool, sizes: CheckSizes) -> None:
    deadline = files.begin("calibration")
    report = files.report
    cmd = "scripts/gpu_check.sh" + (" --device cpu --tiny" if tiny else "")
    try:
        paths = calibrate(
            files.out, device_name, tiny, sizes.reps, max(deadline - time.time(), 1.0), cmd
        )
    except Exception as exc:  # the calibration informs; the exit status follows the smoke test
        report["notes"].append(f"calibration: {type(exc).__name__}: {str(exc)[:300]}")
        paths = []
    for path in paths:
        art = json.loads(path.read_text())
        points = [p for p in art["layers"] if not p.get("oom")]
        info: dict[str, Any] = {
            "file": path.name,
            "sha256": sha256_file(path),
            "points": len(points),
            "oom": sum(1 for p in art["layers"] if p.get("oom")),
            "failures": len(art.get("failures", [])),
        }
        if not get_arch(art["model"]["arch"]).video:
            info["layer_mfu"] = layer_mfu(art, 32768, datasheet_peak_flops(report["device"]))
        report["calibration"][art["model"]["name"]] = info
    files.check["calibration"] = report["calibration"]
    files.finish("calibration")


def _measure_phases(files: CheckFiles, phases: list[str], device: Any, tiny: bool) -> None:
    """The `gpu_measure` phases asked for (buckets, floor, fit, claim), each recorded on failure."""
    state = gpu_measure.MeasureRun(
        out=files.out,
        device=device,
        tiny=tiny,
        check=files.check,
        write=files.write_check,
        notes=files.report["notes"],
    )
    for phase, fn in (
        ("buckets", gpu_measure.bucket_phase),
        ("floor", gpu_measure.floor_phase),
        ("fit", gpu_measure.fit_phase),
        ("claim", gpu_measure.claim_phase),
    ):
        if phase not in phases:
            continue
        deadline = files.begin(phase)
        try:
            fn(state, deadline)
        except Exception as exc:  # recorded; the exit status follows the smoke test
            files.report["notes"].append(f"{phase}: {type(exc).__name__}: {str(exc)[:300]}")
            print(
                f"gpu_check: phase {phase} failed: {type(exc).__name__}: {exc}",
                file=sys.stderr,
                flush=True,
            )
        files.report[phase] = files.check.get(phase)
        files.finish(phase)


def _verdict(files: CheckFiles, phases: list[str]) -> int:
    """The summary's last write and the console verdict; the exit status (the smoke test's)."""
    report, out = files.report, files.out
    written = sorted(p.name for p in out.iterdir())
    if len(written) > MAX_FILES:
        report["notes"].append(
            f"{len(written)} files in {out} (at most {MAX_FILES} come back): {written}"
        )
    files.write_summary()
    verdict = "PASS" if not report["problems"] else "FAIL"
    if "smoke" not in phases:
        verdict = "NO SMOKE TEST"
    print(
        f"gpu_check: {verdict} in {time.time() - files.clock.start:.0f} s (interpreter "
        f"{sys.executable}); files in {out}: {', '.join(written)}",
        flush=True,
    )
    for p in report["problems"]:
        print(f"gpu_check: problem: {p}", flush=True)
    for n in report["notes"]:
        print(f"gpu_check: note: {n}", flush=True)
    return 0 if not report["problems"] else 1


def main(argv: list[str] | None = None) -> int:
    parsed = _parse_args(argv)
    if isinstance(parsed, int):
        return parsed
    args, phases = parsed
    if args.commit:
        os.environ[COMMIT_ENV] = (
            args.commit
        )  # read by every env description, the spawned points' too
    clock = PhaseClock(args.budget_s, phases)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    sizes = TINY if args.tiny else FULL
    dtype = torch.float32 if args.tiny or device.type == "cpu" else torch.bfloat16
    # the cluster whose GPU prices the smoke steps' memory (the GPU's capacity plays no part)
    cluster = "cpu" if device.type == "cpu" else "h200x8"
    check: dict[str, Any] = {
        "env": collect_env(),
        "phases": {p: {"budget_s": round(clock.budget[p], 1)} for p in phases},
    }
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "dtype": str(dtype).replace("torch.", ""),
        "torch": torch.__version__,
        "interpreter": sys.executable,
        "problems": [],
        "notes": [],
        "calibration": {},
        "phases": check["phases"],
    }
    files = CheckFiles(out, clock, check, report)
    files.write_check()
    files.write_summary()
    if "kernel" in phases:
        _kernel_phase(files, device, dtype, sizes)
    if "smoke" in phases:
        _smoke_phase(files, device, dtype, sizes, cluster, args.fault)
    if "calibration" in phases:
        _calibration_phase(files, args.device, args.tiny, sizes)
    _measure_phases(files, phases, device, args.tiny)
    return _verdict(files, phases)


def broken_attention_kernel(device: Any) -> Any:
    """The runtime's kernel with its causal mask dropped: what a wrong kernel looks like (its
    output moves the loss of an initialised model by well under 1%, the reason the smoke test
    compares outputs and gradients element-wise)."""
    good = AttentionKernel("sdpa", fused_only=device.type == "cuda")

    class NotCausal(AttentionKernel):
        def __call__(
            self, q: Any, k: Any, v: Any, seg_lens: list[int], valid: list[int], causal: bool
        ) -> Any:
            return good(q, k, v, seg_lens, valid, False)

    return NotCausal(
        "sdpa",
        fused_only=good.fused_only,
        notes=["deliberately wrong: not causal (--fault attention)"],
    )


if __name__ == "__main__":
    raise SystemExit(main())
