"""Hardware ceilings: the matmul FLOP/s and copy bandwidth a device reaches (GPU calibration)."""

from __future__ import annotations

import time
from typing import Any

import torch

from dcp_bench.cost.profile_artifact import summarize


def _timed(fn: Any, device: torch.device, reps: int, warmup: int) -> list[float]:
    out = []
    for rep in range(warmup + reps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if rep >= warmup:
            out.append(time.perf_counter() - t0)
    return out


def matmul_ceiling(
    device: torch.device, dtype: torch.dtype, n: int, reps: int = 10, warmup: int = 3
) -> dict[str, Any]:
    """FLOP/s of an n x n x n matmul (2 n^3 FLOPs)."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    t = summarize(_timed(lambda: torch.mm(a, b), device, reps, warmup))
    return {
        "n": n,
        "dtype": str(dtype).replace("torch.", ""),
        "time_s": t,
        "flops_per_s": 2.0 * n**3 / t["median"],
    }


def copy_ceiling(
    device: torch.device, nbytes: int, reps: int = 10, warmup: int = 3
) -> dict[str, Any]:
    """Bytes/s of a device-to-device copy (each byte read once and written once)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).random_(0, 255)
    dst = torch.empty_like(src)
    t = summarize(_timed(lambda: dst.copy_(src), device, reps, warmup))
    return {"bytes": nbytes, "time_s": t, "bytes_per_s": 2.0 * nbytes / t["median"]}
