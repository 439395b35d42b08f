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

from dcp_bench.profiling.artifact import summarize


def aligned_groups(world: int) -> dict[int, list[Any]]:
    """Process groups for every aligned power-of-two block, keyed by size (size 1 and the world
    map to None: no group object is needed there). Every rank must call this, in the same order,
    because ``new_group`` pairs ranks by call order."""
    out: dict[int, list[Any]] = {}
    size = 2
    while size < world:
        out[size] = [dist.new_group(list(range(s, s + size))) for s in range(0, world, size)]
        size *= 2
    return out


def group_of(groups: dict[int, list[Any]], size: int, rank: int, world: int) -> Any:
    """The group of ``size`` ranks that holds ``rank`` (the default group for the whole world)."""
    if size == world:
        return dist.group.WORLD
    return groups[size][rank // size]


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
    groups: dict[int, list[Any]],
) -> list[dict[str, Any]]:
    """Time ``all_to_all_single`` and ``all_reduce`` of fp32 tensors of each size (bytes per rank)
    in every group size given; returns one point per (op, group size, size)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    points: list[dict[str, Any]] = []
    for g in group_sizes:
        if g < 2 or g > world:
            continue
        pg = group_of(groups, g, rank, world)
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
