"""Timing and activation-memory measurement of one module on one input.

Time: each repetition runs forward, backward, then a checkpointed forward and its backward; the
first ``warmup`` repetitions are discarded, every phase starts after a barrier over the world (so
SP groups start together and contention is that of a training round), and a repetition's time is
the slowest rank's. On CUDA the device is synchronised before each clock read.

Memory: there is no CPU allocator peak counter, so activation memory is the bytes autograd saves
for backward, counted with ``torch.autograd.graph.saved_tensors_hooks``: each distinct storage
once, parameters excluded (they are static memory). With the module checkpointed, autograd keeps
only the module's input (recomputation regenerates the rest), so its footprint is the input's
bytes. Transient buffers (e.g. an attention kernel's workspace) are not counted there; on CUDA the
allocator's peak over forward + backward is recorded as well (``cuda_peak_bytes``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from dcp_bench.profiling.artifact import summarize
from dcp_bench.profiling.collectives import slowest_rank_times


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _barrier(device: torch.device) -> None:
    _sync(device)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def saved_activation_bytes(fn: Callable[[Tensor], Tensor], x: Tensor, exclude: set[int]) -> int:
    """Bytes of the distinct storages autograd saves while running ``fn(x)``, leaving out the
    storages whose data pointers are in ``exclude`` (the parameters)."""
    seen: dict[int, int] = {}

    def pack(t: Tensor) -> Tensor:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in exclude and ptr != 0:
            seen[ptr] = max(seen.get(ptr, 0), storage.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = fn(x)
    del y
    return int(sum(seen.values()))


def parameter_storages(module: torch.nn.Module) -> set[int]:
    return {p.untyped_storage().data_ptr() for p in module.parameters()}


def measure_module(
    module: torch.nn.Module,
    fn: Callable[[Tensor], Tensor],
    make_input: Callable[[], Tensor],
    reps: int,
    warmup: int,
    ckpt: bool = True,
) -> dict[str, Any]:
    """Forward, backward and checkpointed-backward times (median/p25/p75 over ``reps``) and the
    saved-activation bytes of ``fn`` applied to a fresh ``make_input()`` (a leaf that requires
    grad, so the module's input gradient is computed as inside a model)."""
    device = next(module.parameters()).device
    fwd_t, bwd_t, ckpt_t = [], [], []
    peak = 0
    for rep in range(warmup + reps):
        x = make_input()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
        _barrier(device)
        t0 = time.perf_counter()
        y = fn(x)
        _sync(device)
        t1 = time.perf_counter()
        grad = torch.ones_like(y)
        _barrier(device)
        t2 = time.perf_counter()
        y.backward(grad)
        _sync(device)
        t3 = time.perf_counter()
        if device.type == "cuda":
            peak = max(peak, torch.cuda.max_memory_allocated(device) - base)
        del y
        t4 = t5 = 0.0
        if ckpt:
            x = make_input()
            y = checkpoint(fn, x, use_reentrant=False)
            _barrier(device)
            t4 = time.perf_counter()
            y.backward(grad)
            _sync(device)
            t5 = time.perf_counter()
            del y
        del grad
        module.zero_grad(set_to_none=True)
        if rep >= warmup:
            fwd_t.append(t1 - t0)
            bwd_t.append(t3 - t2)
            ckpt_t.append(t5 - t4)
    exclude = parameter_storages(module)
    x = make_input()
    act = saved_activation_bytes(fn, x, exclude)
    ckpt_bytes = x.untyped_storage().nbytes()
    out: dict[str, Any] = {
        "fwd_s": summarize(slowest_rank_times(fwd_t)),
        "bwd_s": summarize(slowest_rank_times(bwd_t)),
        "act_bytes": act,
        "ckpt_bytes": int(ckpt_bytes),
    }
    if ckpt:
        out["bwd_ckpt_s"] = summarize(slowest_rank_times(ckpt_t))
    if device.type == "cuda":  # allocator peak over forward + backward, above what was live before
        out["cuda_peak_bytes"] = int(peak)
    return out
