"""Timing and activation-memory measurement of one module on one input.

Time: each repetition runs forward, backward, then a checkpointed forward and its backward, all
four timed; the first ``warmup`` repetitions are discarded, every phase starts after a barrier
over the world (so SP groups start together and contention is that of a training round), and a
repetition's time is the slowest rank's. On CUDA the device is synchronised before each clock
read. The checkpointed pass is the module's own checkpointing call when the case gives one
(``ckpt_fn``: e.g. STDiT checkpoints each block of a pair separately), else
``torch.utils.checkpoint.checkpoint`` around the module. Its forward is timed because it is not
the plain forward: non-reentrant checkpointing runs a saved-tensor hook for every tensor the
forward would save and keeps the RNG state, a cost per operation that is a large share of a
small layer's forward on CPU (thread CPU time on the development machine: 10-36% more than the
plain forward for the tiny STDiT pair at the real CPU section's shapes, 1-3% for the tiny Llama
layer).

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

from dcp_bench.cost.profile_artifact import summarize
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


class ModuleTiming:
    """Repeated timing of one module on one input shape; `rep` runs one repetition (forward,
    backward, and with ``ckpt`` a checkpointed forward and its backward), `result` summarises."""

    def __init__(
        self,
        module: torch.nn.Module,
        fn: Callable[[Tensor], Tensor],
        make_input: Callable[[], Tensor],
        ckpt: bool = True,
        ckpt_fn: Callable[[Tensor], Tensor] | None = None,
    ) -> None:
        self.module, self.fn, self.make_input, self.ckpt = module, fn, make_input, ckpt
        self.ckpt_fn = ckpt_fn or self._checkpointed
        self.device = next(module.parameters()).device
        self.fwd: list[float] = []
        self.bwd: list[float] = []
        self.fwd_ckpt: list[float] = []
        self.bwd_ckpt: list[float] = []
        self.peak = 0

    def _checkpointed(self, x: Tensor) -> Tensor:
        out: Tensor = checkpoint(self.fn, x, use_reentrant=False)
        return out

    def rep(self, record: bool) -> None:
        device, fn = self.device, self.fn
        x = self.make_input()
        base = 0
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
            self.peak = max(self.peak, torch.cuda.max_memory_allocated(device) - base)
        del y
        t4 = t5 = t6 = t7 = 0.0
        if self.ckpt:
            x = self.make_input()
            _barrier(device)
            t4 = time.perf_counter()
            y = self.ckpt_fn(x)
            _sync(device)
            t5 = time.perf_counter()
            _barrier(device)
            t6 = time.perf_counter()
            y.backward(grad)
            _sync(device)
            t7 = time.perf_counter()
            del y
        del grad
        self.module.zero_grad(set_to_none=True)
        if record:
            self.fwd.append(t1 - t0)
            self.bwd.append(t3 - t2)
            self.fwd_ckpt.append(t5 - t4)
            self.bwd_ckpt.append(t7 - t6)

    def result(self) -> dict[str, Any]:
        """Summaries (slowest rank per repetition; a collective call on every rank) and bytes."""
        x = self.make_input()
        act = saved_activation_bytes(self.fn, x, parameter_storages(self.module))
        out: dict[str, Any] = {
            "fwd_s": summarize(slowest_rank_times(self.fwd)),
            "bwd_s": summarize(slowest_rank_times(self.bwd)),
            "act_bytes": act,
            "ckpt_bytes": int(x.untyped_storage().nbytes()),
        }
        if self.ckpt:
            out["fwd_ckpt_s"] = summarize(slowest_rank_times(self.fwd_ckpt))
            out["bwd_ckpt_s"] = summarize(slowest_rank_times(self.bwd_ckpt))
        if self.device.type == "cuda":  # allocator peak over forward + backward above what was live
            out["cuda_peak_bytes"] = int(self.peak)
        return out


def measure_interleaved(
    timings: list[ModuleTiming], reps: int, warmup: int
) -> list[dict[str, Any]]:
    """Time several cases repetition-major (rep 1 of every case, then rep 2, ...), so a burst of
    load from other processes on a shared machine spreads over all sizes instead of skewing one;
    each case gets its own warm-up first."""
    for _ in range(warmup):
        for t in timings:
            t.rep(record=False)
    for _ in range(reps):
        for t in timings:
            t.rep(record=True)
    return [t.result() for t in timings]


def measure_module(
    module: torch.nn.Module,
    fn: Callable[[Tensor], Tensor],
    make_input: Callable[[], Tensor],
    reps: int,
    warmup: int,
    ckpt: bool = True,
    ckpt_fn: Callable[[Tensor], Tensor] | None = None,
) -> dict[str, Any]:
    """Forward, backward, checkpointed-forward and checkpointed-backward times (median/p25/p75
    over ``reps``) and the saved-activation bytes of ``fn`` applied to a fresh ``make_input()``
    (a leaf that requires grad, so the module's input gradient is computed as inside a model);
    ``ckpt_fn``: the module's own checkpointed call (see the module docstring)."""
    timing = ModuleTiming(module, fn, make_input, ckpt, ckpt_fn)
    for rep in range(warmup + reps):
        timing.rep(record=rep >= warmup)
    return timing.result()
