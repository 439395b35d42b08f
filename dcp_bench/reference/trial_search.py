"""The reference profiler's searches, priced on a cost model (docs/reference_semantics.md,
"Profile").

Trials here are priced, not run: the profiler that measures real hardware is `dcp_bench.profiling`
(the ``dcp-bench profile`` command, `dcp_bench.commands.profile`).

A *trial* runs one micro-batch of ``bs`` copies of a bucket's shape on an SP group of ``sp`` ranks
and reports whether it fits and its time. The reference decides "fits" from its own prediction:
it runs the trial through two layers and extrapolates, ``pred_full_mem = max_alloc(2 layers) +
(input_memory + unit_grad) x (L - 2)`` under ``alloc_fraction`` (0.7) of the GPU
(`reference_predicted_memory`; VideoSys 4cce477 `profiler.py:176`, `:207`, `:485-489`, `:559-564`,
`:785-797`; `train.py:499-504`). `cost_measure` decides the same way by default
(``memory="reference"``) and records the counted memory beside it; ``memory="counted"`` decides on
the cost model's counted memory instead (a reading the report varies). The runs themselves are
checked against counted memory (the simulator's OOM test). The searches take a
``measure(sp, bs)`` callable, so each rule can be checked against a hand-computed table.

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

from dcp_bench.cost.activations import reference_block_inputs
from dcp_bench.cost.params import param_breakdown
from dcp_bench.errors import ConfigError, InfeasibleError

if TYPE_CHECKING:
    from dcp_bench.cost.base import CostModel

VARIANTS = ("intra", "inter", "pac")
MEMORY_BELIEFS = ("reference", "counted")
PROFILE_DEPTH = 2  # layers a profile trial runs (`profiler.py:176`, ``profile_depth=2``)
GIB = float(1 << 30)  # the PAC knapsack's memory unit (`profiler.py:579`, ``GB``)
MAX_DOUBLINGS = (
    40  # batch sizes up to 2^40: memory grows with the batch, so a real search stops long before
)


@dataclass(frozen=True)
class Trial:
    """One profiled micro-batch: whether it fits, its time (s), counted peak memory per rank
    (bytes), the checkpointed layers it ran with, and the memory the deciding prediction gave
    (the reference's ``pred_full_mem``; equal to ``mem_bytes`` when deciding on counted memory)."""

    fits: bool
    time_s: float = 0.0
    mem_bytes: float = 0.0
    ckpt_layers: int = 0
    pred_mem_bytes: float = 0.0


Measure = Callable[[int, int], Trial]  # (sp, bs) -> Trial


@dataclass(frozen=True)
class ProfileRow:
    """A fitting trial: SP degree, batch size, time of the full micro-batch, checkpointed layers,
    counted and predicted memory per rank (bytes)."""

    sp: int
    bs: int
    time_s: float
    ckpt_layers: int
    mem_bytes: float = 0.0
    pred_mem_bytes: float = 0.0

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
    mem_bytes: float = 0.0
    pred_mem_bytes: float = 0.0

    @property
    def unit_time_s(self) -> float:
        return self.time_s / self.bs


def _row(sp: int, bs: int, trial: Trial) -> ProfileRow:
    return ProfileRow(
        sp, bs, trial.time_s, trial.ckpt_layers, trial.mem_bytes, trial.pred_mem_bytes
    )


def _profile(best: ProfileRow, detail: dict[int, ProfileRow]) -> BucketProfile:
    return BucketProfile(
        best.sp,
        best.bs,
        best.time_s,
        best.ckpt_layers,
        detail,
        best.mem_bytes,
        best.pred_mem_bytes,
    )


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
        rows.append(_row(sp, bs, trial))
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
    return _profile(best, {best.sp: rows[-1]})


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
            latest = _row(sp, bs, trial)
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
    return _profile(best, dict(detail))


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


def profile_memory_info(p: BucketProfile) -> dict[str, float]:
    """A profiled bucket's memory for the run record: the prediction that decided it and the
    counted memory of the same trial (GiB per rank), where the two differ the report says so."""
    return {
        "pred_mem_gib": round(p.pred_mem_bytes / GIB, 3),
        "mem_gib": round(p.mem_bytes / GIB, 3),
    }


def unit_grad_bytes(cost: CostModel) -> float:
    """The reference's ``profile_unit_grad_in_bytes``: the parameter bytes of the first module of
    every registered block list (a spatial and a temporal block: one layer unit), in the model's
    16-bit parameter dtype, added per layer when gradients accumulate (`profiler.py:485-489`)."""
    return float(param_breakdown(cost.model).per_layer * cost.model.dtype_bytes)


def reference_predicted_memory(
    cost: CostModel,
    tokens: np.ndarray,
    frames: np.ndarray,
    sp: int,
    split: str = "sequence",
    unit_grad: bool = False,
) -> float:
    """The reference's ``pred_full_mem`` of a trial, every layer checkpointed as its profile runs
    them (`recompute.py:147`): the peak of a run through `PROFILE_DEPTH` layers (the counted
    memory of the full run less the checkpointed layers it does not run) plus, per layer not run,
    the block inputs it sums (`reference_block_inputs`: the caption and modulations again for
    every block) and, for methods that accumulate gradients, the unit grad
    (`profiler.py:785-797`)."""
    L = cost.model.num_layers
    depth = min(PROFILE_DEPTH, L)
    full = cost.microbatch_memory(tokens, frames, sp, L, split)
    tpr = float(np.sum(tokens)) / sp
    shallow = full - (L - depth) * cost.checkpointed_layer_bytes(tpr, sp)
    per_tok, per_sample = reference_block_inputs(cost.model)
    per_layer = tpr * per_tok + len(tokens) * per_sample
    grad = unit_grad_bytes(cost) if unit_grad else 0.0
    return float(shallow + (L - depth) * (per_layer + grad))


def reference_pac_layers(
    cost: CostModel,
    tokens: np.ndarray,
    frames: np.ndarray,
    sp: int,
    split: str,
    left_bytes: float,
) -> tuple[int, float]:
    """PAC's knapsack as the reference prices it (`profiler.py:579-622`): the memory left under the
    cap, in whole GiB rounded down, buys layers that keep their activations; each costs the
    activation bytes its blocks allocate (`recompute.py:41`, the counted stored layer), rounded
    up to whole GiB per block type. The two block types of a layer unit cost alike here and the
    runtime checkpoints by layer unit, so the knapsack is over layer units. Returns the
    checkpointed layers and the GiB it spends."""
    L = cost.model.num_layers
    avail = int(np.floor(left_bytes / GIB))
    if L < 2 or avail <= 0:
        return L, 0.0
    tpr = float(np.sum(tokens)) / sp
    stored = cost.microbatch_memory(tokens, frames, sp, L - 2, split) - cost.microbatch_memory(
        tokens, frames, sp, L - 1, split
    )
    per_block = (stored + cost.checkpointed_layer_bytes(tpr, sp)) / 2

    def spend(n: int) -> int:
        return 2 * int(np.ceil(per_block * n / GIB))

    kept = 0
    for n in range(1, L + 1):
        if spend(n) > avail:
            break
        kept = n
    return L - kept, float(spend(kept)) * GIB


def cost_measure(
    cost: CostModel,
    tokens: int,
    frames: int,
    pac: bool,
    ckpt_layers: int | None = None,
    split: str = "sequence",
    memory: str = "reference",
    unit_grad: bool = False,
) -> Measure:
    """A trial priced on ``cost``: ``bs`` copies of one (tokens, frames) shape on ``sp`` ranks.

    ``memory="reference"`` (default): it fits when the reference's prediction
    (`reference_predicted_memory`, with the unit grad when ``unit_grad``) is under the cap, and PAC
    buys kept layers with the reference's knapsack (`reference_pac_layers`). ``"counted"``: when
    the counted memory with ``ckpt_layers`` checkpointed layers (default: every layer, the
    benchmark's ``grad_checkpoint``) is under the cap; PAC then keeps as many layers as the
    counted memory affords (`fewest_ckpt_fitting`). The time is the cost model's at the setting
    chosen; ``mem_bytes`` is always the counted memory there."""
    if memory not in MEMORY_BELIEFS:
        raise ConfigError(f"profile memory {memory!r}; expected one of {', '.join(MEMORY_BELIEFS)}")
    L = cost.model.num_layers
    full = L if ckpt_layers is None else int(ckpt_layers)
    cap = cost.memory_cap_bytes

    def predicted(t: np.ndarray, f: np.ndarray, sp: int, counted: float) -> float:
        if memory == "counted":
            return counted
        pred = reference_predicted_memory(cost, t, f, sp, split, unit_grad)
        if full < L:  # stored layers beyond the reference's all-checkpointed profile: counted
            pred += counted - cost.microbatch_memory(t, f, sp, L, split)
        return pred

    def measure(sp: int, bs: int) -> Trial:
        t = np.full(bs, tokens, dtype=np.int64)
        f = np.full(bs, frames, dtype=np.int64)
        c = cost.microbatch_cost(t, f, sp, full, split)
        pred = predicted(t, f, sp, c.mem_bytes)
        if not pred <= cap:
            return Trial(False, c.total_s, c.mem_bytes, full, pred)
        if not pac:
            return Trial(True, c.total_s, c.mem_bytes, full, pred)
        if memory == "counted":
            k = fewest_ckpt_fitting(
                lambda kk: cost.microbatch_memory(t, f, sp, kk, split), full, cap
            )
            spent = 0.0
        else:
            k, spent = reference_pac_layers(cost, t, f, sp, split, cap - pred)
        ck = c if k == full else cost.microbatch_cost(t, f, sp, k, split)
        return Trial(
            True, ck.total_s, ck.mem_bytes, k, pred if memory == "counted" else pred + spent
        )

    return measure


__all__ = [
    "MEMORY_BELIEFS",
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
    "profile_memory_info",
    "reference_pac_layers",
    "reference_predicted_memory",
    "unit_grad_bytes",
]
