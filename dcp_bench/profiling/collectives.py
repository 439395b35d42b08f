"""Collective timings (all-to-all, all-reduce) against message size, for each group size.

A group size ``g`` tiles the world into ``world / g`` aligned groups that all run at once, as a
round of equal SP groups does in training; every rank takes part. A repetition's time is the
slowest rank's (a collective is done when its last member is), and the first ``warmup``
repetitions are discarded.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from dcp_bench.cost.profile_artifact import summarize
from dcp_bench.runtime.groups import ProcessGroupPool


def slowest_rank_times(times: Sequence[float]) -> list[float]:
    """Element-wise max over ranks of per-repetition times (a collective over the world)."""
    t = torch.tensor(list(times), dtype=torch.float64)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return [float(v) for v in t]


def measure_collectives(
    sizes_bytes: Sequence[int],
    group_sizes: Sequence[int],
    reps: int,
    warmup: int,
    pool: ProcessGroupPool,
) -> list[dict[str, Any]]:
    """Time ``all_to_all_single`` and ``all_reduce`` of fp32 tensors of each size (bytes per rank)
    in every group size given; returns one point per (op, group size, size)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    points: list[dict[str, Any]] = []
    for g in group_sizes:
        if g < 2 or g > world:
            continue
        start = rank // g * g
        pg = pool.get(range(start, start + g))
        for nbytes in sizes_bytes:
            # all-to-all needs a length divisible by the group size
            numel = max(g, (int(nbytes) // 4) // g * g)
            x = torch.randn(numel)
            out = torch.empty_like(x)
            for op in ("all_to_all", "all_reduce"):
                times = []
                for rep in range(warmup + reps):
                    dist.barrier()
                    t0 = time.perf_counter()
                    if op == "all_to_all":
                        dist.all_to_all_single(out, x, group=pg)
                    else:
                        dist.all_reduce(x, group=pg)
                    dt = time.perf_counter() - t0
                    if rep >= warmup:
                        times.append(dt)
                times = slowest_rank_times(times)
                points.append(
                    {
                        "op": op,
                        "nproc": world,
                        "group_size": g,
                        "bytes": numel * 4,
                        "time_s": summarize(times),
                    }
                )
                if op == "all_reduce":  # all_reduce summed in place: keep values bounded
                    x.div_(g)
    return points
