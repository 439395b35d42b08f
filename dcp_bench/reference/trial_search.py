"""The reference profiler's searches, priced on a cost model (docs/reference_semantics.md,
"Profile").

Trials here are priced, not run: the profiler that measures real hardware is `dcp_bench.profiling`
(the ``dcp-bench profile`` command, `dcp_bench.commands.profile`).

A *trial* runs one micro-batch of ``bs`` copies of a bucket's shape on an SP group of ``sp`` ranks
and reports whether it fits (the reference: no OOM and predicted memory under the cap, which is
the cost model's ``memory_cap_bytes``) and its time. The searches take a ``measure(sp, bs)``
callable, so each rule can be checked against a hand-computed table; `cost_measure` builds one
from a cost model.

* `baseline_search` (the baseline, fixed SP): batch sizes 1, 2, 4, ... with no upper bound; the
  first failure ends the search; the last success is kept unless the one before it had more than
  twice its throughput (samples per GPU-second). A bucket that fails at 1 is left out.
* `damp_to_median` (the baseline's "interpolation"): every bucket slower than the median time of
  all profiled buckets gets ``bs' = max(1, floor(bs * median / time))`` and a time scaled by
  ``bs' / bs``; the others keep theirs.
* `dcp_search` (DCP): SP degrees 1, 2, 4, ... up to the GPUs of a node, each searched like the
  baseline; the next degree restarts at ``max(1, failed_bs // 4)`` (PAC: at 1). Only when no
  degree inside a node fits does the search go on across nodes (up to the world). Candidates:
  for DCP-intra the largest fitting batch size of each degree, for DCP-inter (and PAC) every
  fitting trial; the winner has the most samples per GPU-second (ties: the earliest). DCP-intra
  also keeps, per SP degree, its largest fitting batch size and time (its second pass needs them).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from dcp_bench.errors import InfeasibleError

if TYPE_CHECKING:
    from dcp_bench.cost.base import CostModel

VARIANTS = ("intra", "inter", "pac")
MAX_DOUBLINGS = (
    40  # batch sizes up to 2^40: memory grows with the batch, so a real search stops long before
)


@dataclass(frozen=True)
class Trial:
    """One profiled micro-batch: whether it fits, its time (s), peak memory per rank (bytes) and
    the checkpointed layers it ran with."""

    fits: bool
    time_s: float = 0.0
    mem_bytes: float = 0.0
    ckpt_layers: int = 0


Measure = Callable[[int, int], Trial]  # (sp, bs) -> Trial


@dataclass(frozen=True)
class ProfileRow:
    """A fitting trial: SP degree, batch size, time of the full micro-batch, checkpointed layers."""

    sp: int
    bs: int
    time_s: float
    ckpt_layers: int

    @property
    def samples_per_gpu_second(self) -> float:
        return self.bs / self.sp / self.time_s


@dataclass(frozen=True)
class BucketProfile:
    """A bucket's profiled setting, and (DCP-intra) its largest fitting row per SP degree."""

    sp: int
    bs: int
    time_s: float
    ckpt_layers: int
    detail: Mapping[int, ProfileRow] = field(default_factory=dict)

    @property
    def unit_time_s(self) -> float:
        return self.time_s / self.bs


def baseline_search(measure: Measure, sp: int) -> BucketProfile | None:
    """The baseline profiler's batch-size search at the fixed degree ``sp`` (module docstring).
    With a single success the throughput guard has nothing to compare: the reference indexes
    the row before the last and would fail; this keeps the one success (ambiguity A1)."""
    rows: list[ProfileRow] = []
    bs = 1
    for _ in range(MAX_DOUBLINGS):
        trial = measure(sp, bs)
        if not trial.fits:
            break
        rows.append(ProfileRow(sp, bs, trial.time_s, trial.ckpt_layers))
        bs *= 2
    else:
        raise InfeasibleError(
            f"baseline profile: batch size {bs} still fits at sp={sp}; memory does not grow"
        )
    if not rows:
        return None
    best = rows[-1]
    if len(rows) >= 2 and rows[-2].samples_per_gpu_second / best.samples_per_gpu_second > 2:
        best = rows[-2]
    return BucketProfile(best.sp, best.bs, best.time_s, best.ckpt_layers, {best.sp: rows[-1]})


def damp_to_median(profiles: Mapping[Hashable, BucketProfile]) -> dict[Hashable, BucketProfile]:
    """The baseline's damping of slow buckets toward the median time of all profiled buckets
    (module docstring); batch sizes only shrink, times scale linearly with them."""
    if not profiles:
        return {}
    median = float(np.median([p.time_s for p in profiles.values()]))
    out: dict[Hashable, BucketProfile] = {}
    for key, p in profiles.items():
        if p.time_s > median:
            bs = max(1, int(p.bs * median / p.time_s))
            out[key] = replace(p, bs=bs, time_s=p.time_s * bs / p.bs)
        else:
            out[key] = p
    return out


def dcp_search(
    measure: Measure,
    max_sp: int,
    world_size: int,
    variant: str,
    runs: Callable[[int], bool] | None = None,
) -> BucketProfile | None:
    """The DCP profiler's search (module docstring) for ``variant`` intra, inter or pac.
    ``runs(sp)``: whether the model can run SP degree ``sp`` (its attention heads divide it,
    `dcp_bench.cost.specs.ModelSpec.sp_degree_offence`); the search never doubles to a degree
    it cannot (default: every degree runs)."""

    def can_double(sp: int, limit: int) -> bool:
        return sp < limit and world_size % (2 * sp) == 0 and (runs is None or runs(2 * sp))

    if variant not in VARIANTS:
        raise ValueError(f"variant {variant!r}; expected one of {', '.join(VARIANTS)}")
    candidates: list[ProfileRow] = []
    detail: dict[int, ProfileRow] = {}
    latest: ProfileRow | None = None
    sp, bs = 1, 1
    while True:
        for _ in range(MAX_DOUBLINGS):
            trial = measure(sp, bs)
            if not trial.fits:
                break
            latest = ProfileRow(sp, bs, trial.time_s, trial.ckpt_layers)
            detail[sp] = latest  # the last success of a degree is its largest batch size
            if variant != "intra":
                candidates.append(latest)
            bs *= 2
        else:
            raise InfeasibleError(
                f"DCP profile: batch size {bs} still fits at sp={sp}; memory does not grow"
            )
        if variant == "intra" and bs > 1 and latest is not None:
            # The reference appends its latest success when a degree fails above batch size 1.
            candidates.append(latest)
        restart = 1 if variant == "pac" else max(1, bs // 4)
        # A doubled degree must still tile the world (3 nodes of 8 GPUs: up to 8; the
        # reference's worlds are powers of two, where this always holds).
        if can_double(sp, max_sp):
            sp, bs = sp * 2, restart
            continue
        if not candidates:
            if can_double(sp, world_size):
                sp, bs = sp * 2, restart
                continue
            return None
        break
    best = candidates[0]
    for row in candidates[1:]:
        if row.samples_per_gpu_second > best.samples_per_gpu_second:
            best = row
    return BucketProfile(best.sp, best.bs, best.time_s, best.ckpt_layers, dict(detail))


def fewest_ckpt_fitting(mem_at: Callable[[int], float], num_layers: int, cap: float) -> int:
    """The fewest checkpointed layers ``k`` in 0..num_layers with ``mem_at(k) <= cap`` (memory
    does not grow with k), given that ``k = num_layers`` fits. PAC's knapsack over identical
    layers keeps as many layers as the memory left affords, which is this ``k``."""
    lo, hi = 0, num_layers  # hi fits
    if mem_at(0) <= cap:
        return 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if mem_at(mid) <= cap:
            hi = mid
        else:
            lo = mid
    return hi


def cost_measure(
    cost: CostModel,
    tokens: int,
    frames: int,
    pac: bool,
    ckpt_layers: int | None = None,
    split: str = "sequence",
) -> Measure:
    """A trial priced on ``cost``: ``bs`` copies of one (tokens, frames) shape on ``sp`` ranks.
    It fits when its memory with ``ckpt_layers`` checkpointed layers (default: every layer, the
    benchmark's ``grad_checkpoint``) is under the cap; with ``pac`` the memory left then buys
    non-checkpointed layers (`fewest_ckpt_fitting`) and the time is the one at that setting."""
    L = cost.model.num_layers
    full = L if ckpt_layers is None else int(ckpt_layers)
    cap = cost.memory_cap_bytes

    def measure(sp: int, bs: int) -> Trial:
        t = np.full(bs, tokens, dtype=np.int64)
        f = np.full(bs, frames, dtype=np.int64)
        c = cost.microbatch_cost(t, f, sp, full, split)
        if not c.mem_bytes <= cap:
            return Trial(False, c.total_s, c.mem_bytes, full)
        if not pac:
            return Trial(True, c.total_s, c.mem_bytes, full)
        k = fewest_ckpt_fitting(lambda kk: cost.microbatch_memory(t, f, sp, kk, split), full, cap)
        ck = c if k == full else cost.microbatch_cost(t, f, sp, k, split)
        return Trial(True, ck.total_s, ck.mem_bytes, k)

    return measure


__all__ = [
    "BucketProfile",
    "Measure",
    "ProfileRow",
    "Trial",
    "VARIANTS",
    "baseline_search",
    "cost_measure",
    "damp_to_median",
    "dcp_search",
    "fewest_ckpt_fitting",
]
