"""The reference samplers: how one epoch of a fixed dataset is dealt into iterations
(docs/reference_semantics.md, "Samplers", cites every rule).

Input: the dataset's buckets (`Bucket`: a key and the dataset positions of its samples, in
dataset order; buckets in order of first appearance, as the reference's ordered dict keeps them)
and each bucket's profile (`BucketProfile`, or None for a bucket the profile left out: its samples
are never trained). Output: a list of `Iteration` s, each a list of `GroupWork` (one SP group: its
degree, its bucket and its micro-batches' sample positions). An iteration is one optimizer step;
its groups run side by side and the next iteration starts after every group has finished.

Randomness: one numpy generator per epoch (the reference uses one torch generator seeded
``seed + epoch``; the draws here follow the same rules, not the same stream). Samples are
consumed from each bucket's shuffled list in order, as the reference's execution mapping
assigns them (iterations in order, groups in order, micro-batches in order).

* `bucket_epoch` (the baseline): per bucket, drop the remainder past a multiple of its batch
  size and shuffle; list each bucket once per micro-batch, shuffle the list, cut it to a
  multiple of the replicas; iteration i gives replica r the list's entry i * R + r.
* `dcp_inter_epoch` (DCP-inter, DCP-inter + PAC): per bucket, drop the remainder, shuffle; fill
  the world group by group (an SP degree drawn among the eligible ones, a bucket drawn uniformly
  among that degree's live ones, its next micro-batch); when the world is full, eject the
  groups whose bucket has too few micro-batches left for the accumulation it would need
  (their bucket's samples are dropped) and fill again; finally sort groups by SP degree and
  give each its gradient-accumulation count of micro-batches (`accumulation_counts`).
* `dcp_intra_epoch` (DCP-intra): no upfront drop; fill with a categorical SP draw, dropping the
  fastest partial micro-batch whenever an iteration holds more than one plan; pass 1 moves every
  plan toward the fastest plan's time (larger SP degrees, other batch sizes), the fit step
  pops the smallest-SP plans until the world fits, pass 2 raises batch sizes toward a common
  time. Iterations that cannot fill the world are discarded with the samples they took.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from dcp_bench.reference.trial_search import BucketProfile

SP_RULES = ("threshold", "categorical", "largest")
BOUNDS = ("literal", "per_group")


@dataclass
class Bucket:
    """One bucket of the dataset: its key and its samples' dataset positions (dataset order)."""

    key: Hashable
    positions: list[int]


@dataclass
class GroupWork:
    """One SP group of an iteration: its bucket, SP degree, checkpointed layers, and the
    micro-batches it runs one after another (gradient accumulation), as sample counts until the
    epoch is dealt, then as dataset positions."""

    bucket: Hashable
    sp: int
    sizes: list[int]
    ckpt_layers: int = 0
    positions: list[list[int]] = field(default_factory=list)
    time_s: float = 0.0  # the profile's predicted time of the group's first micro-batch


@dataclass
class EpochDeal:
    """An epoch dealt into iterations, and what it left out (counted, as the reference drops it)."""

    iterations: list[list[GroupWork]]
    samples: int  # samples in the dataset
    dropped: dict[str, int]  # reason -> samples never trained this epoch

    @property
    def trained(self) -> int:
        return sum(sum(g.sizes) for it in self.iterations for g in it)


# -------------------------------------------------------------------------------------------------
# Rules shared by the DCP samplers


def draw_sp(rule: str, counts: Sequence[int], rng: np.random.Generator) -> int:
    """Index of the SP degree drawn among the eligible degrees (ascending), ``counts`` = live
    buckets of each.

    ``threshold`` (DCP-inter, the code as written): one uniform ``u``; the first degree whose own
    share ``n_k / sum(n)`` exceeds ``u``, else the last. ``categorical`` (DCP-intra; also the other
    reading of DCP-inter's rule): degree k with probability ``n_k / sum(n)``. ``largest``: the
    largest eligible degree (the reference's branch without shuffling).
    """
    if not counts:
        raise ValueError("no eligible SP degree")
    if rule == "largest":
        return len(counts) - 1
    total = float(sum(counts))
    u = float(rng.random())
    if rule == "threshold":
        for i, n in enumerate(counts):
            if u < n / total:
                return i
        return len(counts) - 1
    if rule == "categorical":
        acc = 0.0
        for i, n in enumerate(counts):
            acc += n / total
            if u < acc:
                return i
        return len(counts) - 1
    raise ValueError(f"SP rule {rule!r}; expected one of {', '.join(SP_RULES)}")


def _mismatch(t: float, target: float) -> float:
    # An over-run costs 1.2x an under-run.
    return 1.2 * (t - target) if t > target else target - t


def accumulation_counts(
    times: Sequence[float], max_steps: int, min_steps: int, bounds: str = "literal"
) -> list[int]:
    """Gradient-accumulation micro-steps per group so the groups finish together.

    ``literal`` (the reference's code): horizon ``H = max(t) * max_steps``; candidate targets
    ``t_j * m`` for m = 1 .. floor(H / t_j); each group takes ``g`` in 1 .. floor(H / t_i) with
    the least mismatch (over-runs cost 1.2x; ties: the smaller g); the first target with the
    least total mismatch wins; if the largest count is below ``min_steps``, every count is
    multiplied by ``ceil(min_steps / max g)``. Only the slowest group is bounded by
    ``max_steps``; ``min_steps`` is no per-group floor.

    ``per_group`` (the documentation's wording): every count and every candidate multiplier in
    ``min_steps .. max_steps``.
    """
    if not times:
        return []
    if bounds == "per_group":
        return _accumulation_per_group(list(times), min_steps, max_steps)
    if bounds != "literal":
        raise ValueError(f"bounds {bounds!r}; expected one of {', '.join(BOUNDS)}")
    t = np.asarray(times, dtype=np.float64)
    horizon = float(t.max()) * max_steps
    # Candidate targets in the reference's order: group by group, multiples 1, 2, ... up to the
    # horizon (its loop stops at the first multiple past it).
    targets = []
    for t_out in times:
        for m in range(1, int(horizon / t_out) + 1):
            if t_out * m > horizon:
                break
            targets.append(t_out * m)
    target = np.asarray(targets)[:, None]
    # Each group's count: the mismatch is V-shaped in g, so the reference's scan over 1..gmax
    # (first strict minimum) lands on floor(target / t) or the next count, clipped to 1..gmax.
    gmax = np.floor(horizon / t)
    gmax = np.where(t * gmax > horizon, gmax - 1, gmax)  # the scan stops at the first count past H
    lo = np.clip(np.floor(target / t), 1, gmax)
    hi = np.minimum(lo + 1, gmax)
    d_lo, d_hi = _mismatch_array(t * lo, target), _mismatch_array(t * hi, target)
    g = np.where(d_hi < d_lo, hi, lo)
    d = np.minimum(d_lo, d_hi)
    total = np.cumsum(d, axis=1)[:, -1]  # summed group by group, as the reference adds them
    best = [int(x) for x in g[int(np.argmin(total))]]  # the first target with the least total
    if max(best) < min_steps:
        factor = math.ceil(min_steps / max(best))
        best = [x * factor for x in best]
    return best


def _mismatch_array(t: np.ndarray, target: np.ndarray) -> np.ndarray:
    return np.where(t > target, (t - target) * 1.2, target - t)


def _accumulation_per_group(times: list[float], min_steps: int, max_steps: int) -> list[int]:
    horizon = max(times) * max_steps
    best: list[int] = [min_steps] * len(times)
    best_score = math.inf
    for t_out in times:
        for m in range(min_steps, max_steps + 1):
            target = t_out * m
            if target > horizon * (1 + 1e-12):
                break
            steps, score = [], 0.0
            for t in times:
                g = min(
                    range(min_steps, max_steps + 1), key=lambda k: (_mismatch(t * k, target), k)
                )
                steps.append(g)
                score += _mismatch(t * g, target)
            if score < best_score - 1e-15:
                best, best_score = steps, score
    return best


class _SpMap:
    """The live buckets of each profiled SP degree and the list of degrees with live buckets, as
    the reference keeps them: buckets in insertion order, degrees ascending at the start. A
    degree that comes back after emptying is appended (unsorted), as the reference does."""

    def __init__(self) -> None:
        self.buckets: dict[int, list[Hashable]] = {}
        self.degrees: list[int] = []

    def start(self, sp: int, key: Hashable) -> None:
        self.buckets.setdefault(sp, []).append(key)

    def freeze(self) -> None:
        self.degrees = sorted(self.buckets)

    def eligible(self, free: int) -> list[int]:
        """The prefix of the degree list that fits ``free`` ranks (the reference scans a prefix)."""
        n = 0
        while n < len(self.degrees) and free >= self.degrees[n]:
            n += 1
        return self.degrees[:n]

    def remove(self, sp: int, key: Hashable) -> None:
        if sp in self.buckets and key in self.buckets[sp]:
            self.buckets[sp].remove(key)
            if not self.buckets[sp]:
                self.buckets.pop(sp)
                self.degrees.remove(sp)

    def add_back(self, sp: int, key: Hashable) -> None:
        if sp not in self.buckets:
            self.buckets[sp] = [key]
            self.degrees.append(sp)
        elif key not in self.buckets[sp]:
            self.buckets[sp].append(key)


def _assign(iterations: list[list[GroupWork]], lists: Mapping[Hashable, list[int]]) -> None:
    """Dataset positions for every micro-batch: each bucket's shuffled list consumed in order of
    iterations, groups and micro-batches (the reference's execution mapping)."""
    cursor: dict[Hashable, int] = {}
    for it in iterations:
        for g in it:
            g.positions = []
            for n in g.sizes:
                c = cursor.get(g.bucket, 0)
                take = lists[g.bucket][c : c + n]
                if len(take) != n:
                    raise AssertionError(
                        f"bucket {g.bucket!r}: {n} samples asked, {len(take)} left"
                    )
                g.positions.append(take)
                cursor[g.bucket] = c + n


def _shuffled(positions: list[int], rng: np.random.Generator) -> list[int]:
    return [positions[i] for i in rng.permutation(len(positions))]


def _whole_batches(
    buckets: Sequence[Bucket],
    profile: Mapping[Hashable, BucketProfile | None],
    dropped: dict[str, int],
    rng: np.random.Generator,
) -> Iterator[tuple[Bucket, BucketProfile, list[int]]]:
    """Each profiled bucket cut to whole batches of its profiled size and shuffled, in bucket
    order (the reference drops a bucket's remainder); the samples of unprofiled buckets and the
    remainders are counted in ``dropped``."""
    for b in buckets:
        p = profile.get(b.key)
        if p is None:
            dropped["unprofiled"] += len(b.positions)
            continue
        keep = len(b.positions) - len(b.positions) % p.bs
        dropped["bucket_remainder"] += len(b.positions) - keep
        yield b, p, _shuffled(b.positions[:keep], rng)


# -------------------------------------------------------------------------------------------------
# The baseline's bucket sampler


def bucket_epoch(
    buckets: Sequence[Bucket],
    profile: Mapping[Hashable, BucketProfile | None],
    sp: int,
    replicas: int,
    rng: np.random.Generator,
) -> EpochDeal:
    """The baseline's epoch (module docstring): every iteration gives each of the ``replicas``
    data-parallel groups of ``sp`` ranks one micro-batch of one bucket."""
    dropped = {"unprofiled": 0, "bucket_remainder": 0, "access_remainder": 0}
    lists: dict[Hashable, list[int]] = {}
    n_mb: dict[Hashable, int] = {}
    for b, p, kept in _whole_batches(buckets, profile, dropped, rng):
        lists[b.key] = kept
        n_mb[b.key] = len(kept) // p.bs
    access = [k for k, n in n_mb.items() for _ in range(n)]
    access = [access[i] for i in rng.permutation(len(access))]
    cut = len(access) - len(access) % replicas
    for k in access[cut:]:
        dropped["access_remainder"] += profile[k].bs  # type: ignore[union-attr]
    access = access[:cut]
    iterations: list[list[GroupWork]] = []
    for i in range(0, len(access), replicas):
        it = []
        for k in access[i : i + replicas]:
            q = profile[k]
            assert q is not None
            it.append(GroupWork(k, sp, [q.bs], q.ckpt_layers, time_s=q.time_s))
        iterations.append(it)
    _assign(iterations, lists)
    return EpochDeal(iterations, sum(len(b.positions) for b in buckets), dropped)


# -------------------------------------------------------------------------------------------------
# DCP-inter (and DCP-inter + PAC)


def dcp_inter_epoch(
    buckets: Sequence[Bucket],
    profile: Mapping[Hashable, BucketProfile | None],
    world_size: int,
    rng: np.random.Generator,
    max_steps: int = 5,
    min_steps: int = 2,
    bounds: str = "literal",
    sp_rule: str = "threshold",
    eject: bool = True,
) -> EpochDeal:
    """DCP-inter's epoch (module docstring). ``eject=False`` skips the ejection rule (a reading
    for the report, not the reference)."""
    dropped = {"unprofiled": 0, "bucket_remainder": 0, "ejected": 0, "discarded_iteration": 0}
    lists: dict[Hashable, list[int]] = {}
    spmap = _SpMap()
    for b, p, kept in _whole_batches(buckets, profile, dropped, rng):
        lists[b.key] = kept
        if kept:
            # A bucket with less than one full batch would give the reference a group with no
            # samples, which its execution mapping rejects (ambiguity A14): it is skipped here.
            spmap.start(p.sp, b.key)
    spmap.freeze()
    taken = {k: 0 for k in lists}  # samples counted out of each list (trained or dropped)
    iterations: list[list[GroupWork]] = []

    def prof(k: Hashable) -> BucketProfile:
        p = profile[k]
        assert p is not None
        return p

    def exhaust(k: Hashable) -> None:
        spmap.remove(prof(k).sp, k)

    while spmap.degrees:
        entries: list[tuple[Hashable, int]] = []
        free = world_size
        complete = True
        while free > 0:
            eligible = spmap.eligible(free)
            if not eligible:
                complete = False
                break
            sp = eligible[draw_sp(sp_rule, [len(spmap.buckets[s]) for s in eligible], rng)]
            free -= sp
            live = spmap.buckets[sp]
            key = live[int(rng.integers(len(live)))]
            n = min(prof(key).bs, len(lists[key]) - taken[key])
            entries.append((key, n))
            taken[key] += n
            if taken[key] == len(lists[key]):
                exhaust(key)
            if eject and free <= 0:
                gas = accumulation_counts(
                    [prof(k).time_s for k, _ in entries], max_steps, min_steps, bounds
                )
                t_max = max(prof(k).time_s * g for (k, _), g in zip(entries, gas))
                i = 0
                while i < len(entries):
                    key, _n = entries[i]
                    p = prof(key)
                    need = (t_max // p.time_s - 1) * sum(1 for k, _ in entries if k == key)
                    have = (len(lists[key]) - taken[key]) // p.bs
                    if have < need:
                        entries.pop(i)
                        free += p.sp
                        dropped["ejected"] += len(lists[key]) - taken[key] + _n
                        taken[key] = len(lists[key])
                        exhaust(key)
                    else:
                        i += 1
        if not complete:
            dropped["discarded_iteration"] += sum(n for _, n in entries)
            continue
        entries.sort(key=lambda e: -prof(e[0]).sp)  # stable: the reference sorts by SP, descending
        gas = accumulation_counts(
            [prof(k).time_s for k, _ in entries], max_steps, min_steps, bounds
        )
        it: list[GroupWork] = []
        for (key, n), g in zip(entries, gas):
            p = prof(key)
            sizes = [n]
            more = g - 1
            while more > 0 and taken[key] < len(lists[key]):
                m = min(p.bs, len(lists[key]) - taken[key])
                sizes.append(m)
                taken[key] += m
                more -= 1
            if taken[key] == len(lists[key]):
                exhaust(key)
            it.append(GroupWork(key, p.sp, sizes, p.ckpt_layers, time_s=p.time_s))
        iterations.append(it)
    # Samples taken by ejected groups' first micro-batches are counted in "ejected" above; a list's
    # tail past the last iteration's take is never reached when its bucket was ejected.
    _assign(iterations, lists)
    deal = EpochDeal(iterations, sum(len(b.positions) for b in buckets), dropped)
    return deal


# -------------------------------------------------------------------------------------------------
# DCP-intra


@dataclass
class _Plan:
    key: Hashable
    n: int
    sp: int
    time_s: float


def dcp_intra_epoch(
    buckets: Sequence[Bucket],
    profile: Mapping[Hashable, BucketProfile | None],
    world_size: int,
    max_sp: int,
    rng: np.random.Generator,
    sp_rule: str = "categorical",
    second_pass: bool = True,
) -> EpochDeal:
    """DCP-intra's epoch (module docstring). ``second_pass=False`` skips pass 2 (a reading for the
    report: the project's earlier planner had none)."""
    dropped = {"unprofiled": 0, "partial_plan": 0, "discarded_iteration": 0}
    lists: dict[Hashable, list[int]] = {}
    remaining: dict[Hashable, int] = {}
    spmap = _SpMap()
    for b in buckets:
        p = profile.get(b.key)
        if p is None:
            dropped["unprofiled"] += len(b.positions)
            continue
        lists[b.key] = _shuffled(b.positions, rng)
        remaining[b.key] = len(b.positions)
        spmap.start(p.sp, b.key)
    spmap.freeze()

    def prof(k: Hashable) -> BucketProfile:
        p = profile[k]
        assert p is not None
        return p

    def detail(k: Hashable, sp: int) -> tuple[int, float] | None:
        row = prof(k).detail.get(sp)
        return (row.bs, row.time_s) if row is not None else None

    def take(k: Hashable, n: int) -> None:
        remaining[k] -= n
        if remaining[k] == 0:
            spmap.remove(prof(k).sp, k)

    def give_back(k: Hashable, n: int) -> None:
        remaining[k] += n
        spmap.add_back(prof(k).sp, k)

    iterations: list[list[GroupWork]] = []
    while spmap.degrees:
        plans: list[_Plan] = []
        free = world_size
        complete = True
        while free > 0:
            eligible = spmap.eligible(free)
            if not eligible:
                complete = False
                break
            sp = eligible[draw_sp(sp_rule, [len(spmap.buckets[s]) for s in eligible], rng)]
            live = spmap.buckets[sp]
            key = live[int(rng.integers(len(live)))]
            p = prof(key)
            n = min(p.bs, remaining[key])
            take(key, n)
            plans.append(_Plan(key, n, sp, p.time_s / p.bs * n))
            free -= sp
            if len(plans) > 1:
                # Drop the fastest partial plan (a bucket's tail): its samples are not trained.
                idx, t_min = -1, math.inf
                for i, pl in enumerate(plans):
                    if pl.time_s < t_min and prof(pl.key).bs > pl.n:
                        idx, t_min = i, pl.time_s
                if idx > -1:
                    gone = plans.pop(idx)
                    free += gone.sp
                    dropped["partial_plan"] += gone.n
        if not complete:
            dropped["discarded_iteration"] += sum(pl.n for pl in plans)
            continue
        # Pass 1: every plan not of the fastest plan's bucket moves toward the fastest time.
        fastest = min(plans, key=lambda pl: pl.time_s)
        t_min, b_min = fastest.time_s, fastest.key
        for pl in plans:
            if pl.key == b_min:
                continue
            rem = remaining[pl.key]
            best_diff = math.inf
            best = (pl.time_s, pl.n, pl.sp)
            s = pl.sp
            while s <= max_sp:
                row = detail(pl.key, s)
                if row is not None:
                    cap, t_cap = row
                    unit = t_cap / cap
                    if cap - pl.n > rem:
                        cap = pl.n + rem
                    n = max(1, round(t_min / unit))  # Python rounds half to even, as the reference
                    n = min(n, cap)
                    t = unit * n
                    diff = abs(t - t_min)
                    if diff < best_diff:
                        best_diff, best = diff, (t, n, s)
                        if abs(t / t_min - 1) < 0.1:
                            break
                s *= 2
            t_new, n_new, s_new = best
            if n_new < pl.n:
                give_back(pl.key, pl.n - n_new)
            elif n_new > pl.n:
                take(pl.key, n_new - pl.n)
            pl.n, pl.time_s, pl.sp = n_new, t_new, s_new
        # Fit: the smallest-SP plans go back to their buckets until the world fits.
        plans.sort(key=lambda pl: -pl.sp)
        total = sum(pl.sp for pl in plans)
        while total > world_size:
            gone = plans.pop()
            give_back(gone.key, gone.n)
            total -= gone.sp
        # Pass 2: batch sizes rise toward the smallest achievable time of any plan.
        if second_pass:
            target = math.inf
            for pl in plans:
                row = detail(pl.key, pl.sp)
                cap = row[0] if row is not None else pl.n
                if cap - pl.n > remaining[pl.key]:
                    cap = pl.n + remaining[pl.key]
                target = min(target, pl.time_s / pl.n * cap)
            for pl in plans:
                row = detail(pl.key, pl.sp)
                cap = row[0] if row is not None else pl.n
                unit = pl.time_s / pl.n
                gap = target - pl.time_s
                if gap <= 0:
                    continue
                inc = int(gap // unit)
                if inc + pl.n > cap:
                    inc = cap - pl.n
                inc = min(inc, remaining[pl.key])
                if inc > 0:
                    take(pl.key, inc)
                    pl.n += inc
                    pl.time_s += unit * inc
        iterations.append(
            [
                GroupWork(pl.key, pl.sp, [pl.n], prof(pl.key).ckpt_layers, time_s=pl.time_s)
                for pl in plans
            ]
        )
    deal = EpochDeal(iterations, sum(len(b.positions) for b in buckets), dropped)
    _assign(iterations, lists)
    return deal


__all__ = [
    "BOUNDS",
    "Bucket",
    "EpochDeal",
    "GroupWork",
    "SP_RULES",
    "accumulation_counts",
    "bucket_epoch",
    "dcp_inter_epoch",
    "dcp_intra_epoch",
    "draw_sp",
]
