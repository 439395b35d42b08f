"""Timing and memory measurement for training steps.

Memory: on CUDA, ``torch.cuda.max_memory_allocated`` over the step (reset before it). CPU has no
allocator peak, so there the peak is estimated as

    static bytes (parameters + gradients + optimizer state)
    + max over micro-batches of the bytes autograd saved for backward at the end of the forward,

counted with the public ``torch.autograd.graph.saved_tensors_hooks`` (each storage once; storages
of parameters excluded). With activation checkpointing autograd saves nothing inside the
checkpointed layers; the input each checkpointed layer keeps for its recomputation (one
tokens x hidden tensor), the transient activations of the one layer recomputed during backward
and the temporaries of single ops are not counted, so the CPU number is a lower bound of the
true peak.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn


class SavedTensorMeter:
    """Counts the distinct bytes autograd saves for backward while active."""

    def __init__(self, model: nn.Module) -> None:
        self._param_storages = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self._seen: set[int] = set()
        self.bytes = 0

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        try:
            storage = t.untyped_storage()
            ptr = storage.data_ptr()
        except (RuntimeError, NotImplementedError):  # e.g. tensor subclasses without storage
            return t
        if ptr not in self._param_storages and ptr not in self._seen:
            self._seen.add(ptr)
            self.bytes += storage.nbytes()
        return t

    @staticmethod
    def _unpack(t: torch.Tensor) -> torch.Tensor:
        return t

    @contextmanager
    def active(self) -> Iterator[SavedTensorMeter]:
        self._seen = set()
        self.bytes = 0
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
            yield self


def static_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None) -> int:
    """Parameters, gradients (one per parameter) and optimizer state tensors, in bytes."""
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    state = 0
    if optimizer is not None:
        for st in optimizer.state.values():
            for v in st.values():
                if isinstance(v, torch.Tensor):
                    state += v.numel() * v.element_size()
    return 2 * params + state


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class BusyTimer:
    """Accumulates the wall time spent inside ``span()`` (compute and SP communication of this
    rank's micro-batches); CUDA work is synchronised at the span edges so it is counted."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.seconds = 0.0

    @contextmanager
    def span(self) -> Iterator[None]:
        synchronize(self.device)
        t0 = time.perf_counter()
        try:
            yield
        finally:
            synchronize(self.device)
            self.seconds += time.perf_counter() - t0


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def cuda_peak_bytes(device: torch.device) -> int | None:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return None


def describe_memory_measure(device: Any) -> str:
    dev = torch.device(device)
    if dev.type == "cuda":
        return "torch.cuda.max_memory_allocated"
    return "cpu: static (params+grads+optimizer) + max saved-for-backward bytes per micro-batch"
