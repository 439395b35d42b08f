"""The step meter: a training step's time and peak memory per rank, as the executor reads them
(the profiler, `dcp_bench.profiling`, uses the same meters).

Memory, the peak per rank over one step:

- CUDA: ``torch.cuda.max_memory_allocated`` over the step (reset before it).
- CPU on Linux: the process's peak resident set over the step. `reset_peak` writes ``5`` to
  ``/proc/self/clear_refs``, which resets the kernel's high-water mark ``VmHWM`` to the current
  resident set; `peak_bytes` reads ``VmHWM`` from ``/proc/self/status`` after the step. The number
  is what the process really holds: interpreter, libraries, gloo buffers and the memory glibc's
  allocator keeps after frees included (the CPU profile measures a training rank's baseline and
  how much resident memory a step holds per saved activation byte; the profiled cost model
  predicts this number from them). Started with ``MALLOC_MMAP_THRESHOLD_=65536
  MALLOC_TRIM_THRESHOLD_=0`` a process returns freed blocks at once and the same number follows live
  tensor bytes (within
  0.2 MB of an allocator-level tracker on the development machine), but steps then ran 2.1-2.9x
  slower (fresh pages faulted in for every block, the heap trimmed on every free; a 256 KiB
  threshold was still 3x slower on the video model's small tensors), so training runs keep
  glibc's defaults and the cost model predicts the resident set those give.
- Elsewhere (no ``/proc``): an estimate, static bytes (parameters + gradients + optimizer state)
  plus the most bytes autograd saved for backward in one micro-batch, counted with the public
  ``torch.autograd.graph.saved_tensors_hooks`` (each storage once, parameters excluded). It misses
  the recomputed layer's activations and single ops' temporaries: a lower bound of the true peak.
"""

from __future__ import annotations

import os
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


def load_average_1m() -> float | None:
    """The machine's 1-minute load average (runnable processes, ``os.getloadavg``), or None
    where the platform has none. A measured time on a machine shared with other work depends on
    it; records keep it beside the time (`docs/runtime.md`)."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


class PhaseClock:
    """Wall seconds per phase of a step on this rank: building micro-batch inputs, forward,
    backward, and the end-of-step work (gradient synchronisation, clipping, optimizer step).
    Beside the step clock so that a measured step can be compared with the cost model's terms
    one by one; CUDA work is synchronised at the span edges."""

    PHASES = ("inputs", "forward", "backward", "finish")

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._seconds = dict.fromkeys(self.PHASES, 0.0)

    @contextmanager
    def span(self, phase: str) -> Iterator[None]:
        if phase not in self._seconds:
            raise ValueError(f"phase {phase!r}; expected one of {', '.join(self.PHASES)}")
        synchronize(self.device)
        t0 = time.perf_counter()
        try:
            yield
        finally:
            synchronize(self.device)
            self._seconds[phase] += time.perf_counter() - t0

    def seconds(self) -> dict[str, float]:
        return dict(self._seconds)


_PROC_STATUS = "/proc/self/status"
_PROC_CLEAR_REFS = "/proc/self/clear_refs"


def _status_bytes(field: str) -> int | None:
    """A ``kB`` field of ``/proc/self/status`` in bytes (None without procfs)."""
    try:
        with open(_PROC_STATUS) as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def resident_bytes() -> int | None:
    """This process's resident set now (``VmRSS``), or None without procfs."""
    return _status_bytes("VmRSS")


def resident_peak_bytes() -> int | None:
    """This process's resident-set high-water mark (``VmHWM``) since it started or since the
    last `reset_resident_peak`, or None without procfs."""
    return _status_bytes("VmHWM")


def reset_resident_peak() -> bool:
    """Reset ``VmHWM`` to the current resident set (Linux >= 4.0); False where impossible."""
    try:
        with open(_PROC_CLEAR_REFS, "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def cpu_peak_supported() -> bool:
    """Whether the CPU peak is measured (procfs with a resettable high-water mark), not
    estimated."""
    return os.path.exists(_PROC_CLEAR_REFS) and resident_peak_bytes() is not None


def reset_peak(device: torch.device) -> None:
    """Start a peak measurement on ``device`` (call right before the step)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    elif device.type == "cpu" and cpu_peak_supported():
        reset_resident_peak()


def peak_bytes(device: torch.device) -> int | None:
    """The peak since `reset_peak`: the CUDA allocator's, or on CPU the process's resident-set
    high-water mark; None where neither is measurable (the caller then estimates)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    if device.type == "cpu" and cpu_peak_supported():
        return resident_peak_bytes()
    return None


def describe_memory_measure(device: Any) -> str:
    dev = torch.device(device)
    if dev.type == "cuda":
        return "torch.cuda.max_memory_allocated"
    if dev.type == "cpu" and cpu_peak_supported():
        return "cpu: process peak resident set over the step (VmHWM after clear_refs)"
    return "cpu: static (params+grads+optimizer) + max saved-for-backward bytes per micro-batch"
