"""The cluster simulator: runs a `StepPlan` on a cluster through a cost model, and bounds a batch.

Timeline. Every rank works through its groups in round order. A group's task (its micro-batches,
one after another) starts when all of its ranks are free and occupies them all until it ends. Ranks
flow into their next round as soon as their own group is free; no global barrier separates rounds
(``round_barrier=True`` adds one). This is safe, i.e. it is what a deadlock-free executor does: a
group waits only for its own members, and each member reaches the group after finishing its tasks
of earlier rounds, so every wait points from a later round to an earlier one and no cycle of waits
can form. After the last task, every rank takes part in the gradient synchronisation and the
optimizer step (`CostModel.step_sync_time`), which starts when the slowest rank is done.

A plan with Megatron-style model parallelism (`dcp_bench.plan.StepPlan.model_parallel`) is priced
by the cost model's `CostModel.with_model_parallel` (per rank of the slowest pipeline stage); a
group, one model replica, then runs its micro-batches through the 1F1B pipeline
(`dcp_bench.cost.megatron.pipeline_time`), and the pipeline's bubble is idle time.

Speed: costs are computed for all sequence-split micro-batches of a step in one vectorised call
(`CostModel.microbatch_costs`); the timeline is one pass over the groups.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from dcp_bench.cost.base import (
    MICROBATCH_TIME_TERMS,
    SYNC_PART,
    CostModel,
    add_in_order,
    time_parts,
)
from dcp_bench.cost.megatron import pipeline_time
from dcp_bench.errors import ClusterError, InfeasibleError
from dcp_bench.execution import PlanFn, StepOutcome
from dcp_bench.layout import ulysses_span

if TYPE_CHECKING:
    from dcp_bench.batch import GlobalBatch
    from dcp_bench.plan import StepPlan


@dataclass(frozen=True)
class NoiseModel:
    """Seeded run-to-run variation for variance studies.

    Each micro-batch's time on each rank of its group is multiplied by a lognormal factor
    ``exp(N(0, jitter_sigma))`` (kernel-time jitter); the group waits for its slowest rank. With
    probability ``straggler_prob`` a rank is a straggler for the whole step, running
    ``straggler_slowdown`` times slower (thermal throttling, a noisy neighbour). The draws depend
    only on (seed, step), so a step replays identically.
    """

    seed: int = 0
    jitter_sigma: float = 0.03
    straggler_prob: float = 0.0
    straggler_slowdown: float = 1.5

    def __post_init__(self) -> None:
        if (
            self.jitter_sigma < 0
            or not 0 <= self.straggler_prob <= 1
            or self.straggler_slowdown < 1
        ):
            raise ValueError(
                "NoiseModel: need jitter_sigma >= 0, 0 <= straggler_prob <= 1, "
                f"straggler_slowdown >= 1; got {self.jitter_sigma}, {self.straggler_prob}, "
                f"{self.straggler_slowdown}"
            )

    def rng(self, step: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, step])


@dataclass
class SimStepResult:
    """One simulated optimizer step. Times in seconds, memory in bytes, arrays per rank."""

    step: int
    step_time_s: float
    busy_s: np.ndarray  # micro-batch work + gradient sync + optimizer
    idle_s: np.ndarray  # step_time_s - busy_s
    imbalance: float  # idle share of all rank-seconds
    comm_share: float  # communication share of busy rank-seconds (SP all-to-all + grad sync)
    peak_mem_bytes: np.ndarray
    oom: bool  # some micro-batch over the GPU's usable memory (not the planner's cap)
    mfu: float
    model_flops: float
    tokens: int
    compute_end_s: float  # when the last rank finished its micro-batches
    sync_s: float
    info: dict[str, Any] = field(default_factory=dict)
    account: StepAccount | None = (
        None  # where the time goes (noise-free costs, averaged over ranks)
    )

    @property
    def peak_mem_gib(self) -> float:
        return float(self.peak_mem_bytes.max()) / 2**30 if len(self.peak_mem_bytes) else 0.0

    def record_fields(self) -> dict[str, Any]:
        """The fields of a `dcp_bench.records.StepRecord` this result fills."""
        return {
            "step_time_s": self.step_time_s,
            "imbalance": self.imbalance,
            "comm_share": self.comm_share,
            "mfu": self.mfu,
            "peak_mem_gib": self.peak_mem_gib,
            "peak_mem_per_rank_gib": (self.peak_mem_bytes / 2**30).round(4).tolist(),
            "busy_s": self.busy_s.round(6).tolist(),
            "idle_s": self.idle_s.round(6).tolist(),
            "oom": self.oom,
            "tokens": self.tokens,
        }


def _sync_comm_s(cost: CostModel) -> float:
    """The communication share of the once-per-step time: its declared communication terms."""
    breakdown = cost.step_sync_breakdown()
    comm = [
        float(breakdown[t.name]) for t in cost.step_terms if t.communication and t.name in breakdown
    ]
    return add_in_order(comm) if comm else 0.0


@dataclass
class _PlanArrays:
    """A plan flattened for vectorised pricing: one entry per group task and per micro-batch."""

    g_start: np.ndarray  # per group task: first rank, size, round
    g_size: np.ndarray
    g_round: list[int]
    mb_group: np.ndarray  # per micro-batch: its group task
    seq_pos: list[tuple[int, ...]]  # sequence-split micro-batches: samples, index, SP, ckpt
    seq_mb: list[int]
    seq_sp: list[int]
    seq_ckpt: list[int]
    batch_split: list[tuple[int, tuple[int, ...], int, int]]  # (micro-batch, samples, size, ckpt)
    # sequence-split micro-batches: the ranks of their head-sharding part (`ulysses_span`: the
    # group for Ulysses, 1 for ring, the Ulysses degree for hybrid)
    seq_ulysses: list[int] = field(default_factory=list)

    @property
    def n_groups(self) -> int:
        return len(self.g_start)

    @property
    def n_mb(self) -> int:
        return len(self.mb_group)


def _flatten(plan: StepPlan) -> _PlanArrays:
    g_start: list[int] = []
    g_size: list[int] = []
    g_round: list[int] = []
    mb_group: list[int] = []
    out = _PlanArrays(np.zeros(0), np.zeros(0), g_round, np.zeros(0), [], [], [], [], [])
    for r, rnd in enumerate(plan.rounds):
        for g in rnd.groups:
            gid = len(g_start)
            g_start.append(g.start)
            g_size.append(g.size)
            g_round.append(r)
            for mb in g.micro_batches:
                j = len(mb_group)
                mb_group.append(gid)
                if mb.split == "batch" and g.size > 1:
                    out.batch_split.append((j, mb.samples, g.size, mb.ckpt_layers))
                else:
                    cp = plan.context_parallel(g)
                    out.seq_pos.append(mb.samples)
                    out.seq_mb.append(j)
                    out.seq_sp.append(cp)
                    out.seq_ckpt.append(mb.ckpt_layers)
                    out.seq_ulysses.append(ulysses_span(mb.sp_kind, mb.ulysses_degree, cp))
    out.g_start = np.asarray(g_start, dtype=np.int64)
    out.g_size = np.asarray(g_size, dtype=np.int64)
    out.mb_group = np.asarray(mb_group, dtype=np.int64)
    return out


@dataclass
class _Priced:
    """Per micro-batch costs of a flattened plan (seconds, bytes), and per micro-batch sample
    counts and tokens."""

    times: dict[str, np.ndarray]  # per declared time term (`CostModel.time_terms`), in its order
    parts: dict[str, str]  # term -> the part of the step account it is booked to
    communication: tuple[str, ...]  # the terms that count as communication
    mem: np.ndarray
    samples: np.ndarray
    tokens: np.ndarray
    flops: float

    @property
    def dur(self) -> np.ndarray:
        return add_in_order(list(self.times.values()))

    @property
    def comm(self) -> np.ndarray:
        return add_in_order([self.times[k] for k in self.communication])

    def by_part(self) -> dict[str, np.ndarray]:
        """Per micro-batch seconds of each part (its terms added in declaration order)."""
        out: dict[str, np.ndarray] = {}
        for name, t in self.times.items():
            part = self.parts[name]
            out[part] = out[part] + t if part in out else t
        return out


def _price(arr: _PlanArrays, batch: GlobalBatch, cost: CostModel) -> _Priced:
    """Every micro-batch's costs: sequence-split micro-batches in one vectorised call, batch-split
    ones one by one."""
    n = arr.n_mb
    out = _Priced(
        {t.name: np.zeros(n) for t in cost.time_terms},
        {t.name: t.part for t in cost.time_terms},
        tuple(t.name for t in cost.time_terms if t.communication),
        np.zeros(n),
        np.zeros(n, dtype=np.int64),
        np.zeros(n, dtype=np.int64),
        0.0,
    )
    if arr.seq_mb:
        lens = np.fromiter((len(p) for p in arr.seq_pos), dtype=np.int64, count=len(arr.seq_pos))
        pos = np.fromiter(
            (s for p in arr.seq_pos for s in p), dtype=np.int64, count=int(lens.sum())
        )
        local = np.repeat(np.arange(len(arr.seq_pos)), lens)
        args = (
            batch.tokens[pos],
            batch.frames[pos],
            local,
            np.asarray(arr.seq_sp),
            np.asarray(arr.seq_ckpt),
        )
        if arr.seq_ulysses == arr.seq_sp:
            c = cost.microbatch_costs(*args)
        else:  # ring or hybrid micro-batches: a cost model that prices them takes ``ulysses``
            c = cost.microbatch_costs(*args, ulysses=np.asarray(arr.seq_ulysses))
        idx = np.asarray(arr.seq_mb)
        for name, t in out.times.items():
            t[idx] = c[name]
        out.mem[idx] = c["mem_bytes"]
        out.samples[idx] = lens
        out.tokens[idx] = np.bincount(local, weights=batch.tokens[pos], minlength=len(lens)).astype(
            np.int64
        )
        out.flops += float(c["model_flops"].sum())
    for j, samples, size, ckpt in arr.batch_split:
        sel = np.asarray(samples, dtype=np.int64)
        mc = cost.microbatch_cost(batch.tokens[sel], batch.frames[sel], size, ckpt, "batch")
        for name, value in mc.times().items():
            out.times[name][j] = value
        out.mem[j] = mc.mem_bytes
        out.samples[j] = len(sel)
        out.tokens[j] = int(batch.tokens[sel].sum())
        out.flops += mc.model_flops
    return out


def plan_cost(plan: StepPlan, cost: CostModel) -> CostModel:
    """The cost model that prices ``plan``: ``cost`` itself, or for a plan with
    `model_parallel` ``cost.with_model_parallel(...)`` (a source that cannot price it refuses)."""
    mp = plan.model_parallel
    return cost if mp is None else cost.with_model_parallel(mp)


def _with_noise(
    dur: np.ndarray, arr: _PlanArrays, noise: NoiseModel, step: int, world: int
) -> np.ndarray:
    """Micro-batch durations under seeded kernel jitter (the group waits for its slowest rank) and
    straggler ranks (a group runs at its slowest member's pace)."""
    rng = noise.rng(step)
    mb_sizes = arr.g_size[arr.mb_group]
    draws = rng.standard_normal(int(mb_sizes.sum()))
    offsets = np.concatenate(([0], np.cumsum(mb_sizes)[:-1]))
    dur = dur * np.exp(noise.jitter_sigma * np.maximum.reduceat(draws, offsets))
    slow = np.where(rng.random(world) < noise.straggler_prob, noise.straggler_slowdown, 1.0)
    if np.any(slow > 1):
        cum = np.concatenate(([0.0], np.cumsum(slow > 1)))
        has_straggler = cum[arr.g_start + arr.g_size] - cum[arr.g_start] > 0
        dur = dur * np.where(has_straggler[arr.mb_group], noise.straggler_slowdown, 1.0)
    return dur


def _timeline(arr: _PlanArrays, g_dur: np.ndarray, world: int, round_barrier: bool) -> float:
    """When the last rank finishes its micro-batches: groups in round order, each starting when
    its slowest member is free (and, with ``round_barrier``, not before the previous round ends)."""
    free = np.zeros(world)
    current_round = -1
    for gid in range(arr.n_groups):
        if round_barrier and arr.g_round[gid] != current_round:
            free[:] = free.max()
            current_round = arr.g_round[gid]
        a, b = int(arr.g_start[gid]), int(arr.g_start[gid] + arr.g_size[gid])
        free[a:b] = free[a:b].max() + g_dur[gid]
    return float(free.max()) if world else 0.0


def _per_rank_sum(arr: _PlanArrays, values: np.ndarray, world: int) -> np.ndarray:
    """Per rank, the sum of ``values`` (one per group task) over the groups it belongs to."""
    diff = np.zeros(world + 1)
    np.add.at(diff, arr.g_start, values)
    np.add.at(diff, arr.g_start + arr.g_size, -values)
    return np.cumsum(diff[:-1])


def simulate_step(
    plan: StepPlan,
    batch: GlobalBatch,
    cost: CostModel,
    noise: NoiseModel | None = None,
    round_barrier: bool = False,
) -> SimStepResult:
    """Simulate one step of ``plan`` over ``batch`` on ``cost.cluster`` (see the module docstring).
    Rounds are separated by a barrier when ``round_barrier`` or the plan asks for it. The plan is
    not validated here (the run loop validates it once)."""
    W = plan.world_size
    if cost.cluster.world_size != W:
        raise ClusterError(
            f"plan for {W} ranks cannot run on cluster {cost.cluster.name!r} of "
            f"{cost.cluster.world_size} ranks"
        )
    cost = plan_cost(plan, cost)
    arr = _flatten(plan)
    priced = _price(arr, batch, cost)
    dur, comm, mem = priced.dur, priced.comm, priced.mem
    flops, tokens = priced.flops, int(priced.tokens.sum())
    if noise is not None and arr.n_mb:
        # the batch knows its step even if a planner leaves plan.step at 0
        dur = _with_noise(dur, arr, noise, batch.step, W)
    g_work = np.bincount(arr.mb_group, weights=dur, minlength=arr.n_groups)
    g_dur = g_work
    if plan.model_parallel is not None and plan.model_parallel.pp > 1:
        g_long = np.zeros(arr.n_groups)
        np.maximum.at(g_long, arr.mb_group, dur)
        g_dur = pipeline_time(g_work, g_long, plan.model_parallel.pp)
    g_comm = np.bincount(arr.mb_group, weights=comm, minlength=arr.n_groups)
    g_mem = np.zeros(arr.n_groups)
    np.maximum.at(g_mem, arr.mb_group, mem)
    compute_end = _timeline(arr, g_dur, W, round_barrier or plan.round_barrier)

    static = cost.static_memory_bytes()
    peak = np.full(W, static)
    for big in np.flatnonzero(g_mem > static).tolist():
        a, b = int(arr.g_start[big]), int(arr.g_start[big] + arr.g_size[big])
        peak[a:b] = np.maximum(peak[a:b], g_mem[big])
    sync = cost.step_sync_time()
    step_time = compute_end + sync
    busy = _per_rank_sum(arr, g_work, W) + sync  # a pipeline's bubble is idle
    idle = step_time - busy
    total_busy = float(busy.sum())
    comm_total = float(_per_rank_sum(arr, g_comm, W).sum()) + W * _sync_comm_s(cost)
    return SimStepResult(
        step=batch.step,
        step_time_s=step_time,
        busy_s=busy,
        idle_s=idle,
        imbalance=float(idle.sum() / (W * step_time)) if step_time > 0 else 0.0,
        comm_share=comm_total / total_busy if total_busy > 0 else 0.0,
        peak_mem_bytes=peak,
        oom=bool(np.any(peak > cost.cluster.gpu.usable_mem_bytes)),
        mfu=flops / (step_time * W * cost.cluster.gpu.peak_flops) if step_time > 0 else 0.0,
        model_flops=flops,
        tokens=tokens,
        compute_end_s=compute_end,
        sync_s=sync,
        info={"rounds": len(plan.rounds), "groups": arr.n_groups, "micro_batches": arr.n_mb},
        account=_account(arr, priced, W, cost, step_time),
    )


@dataclass(frozen=True)
class SampleBounds:
    """Per-sample ingredients of the lower bound: the cheapest feasible GPU-seconds and the
    fastest feasible time of each sample (inf where no SP degree fits it under the cap)."""

    gpu_seconds: np.ndarray
    fastest_s: np.ndarray
    best_sp: np.ndarray  # SP degree of the fastest feasible setting (0 = infeasible)
    # Per distinct shape (``shape_of``: each sample's row) and group setting (a column per SP
    # degree, ring and hybrid groups after): the least time and GPU-seconds there (inf: unfit).
    setting_time: np.ndarray | None = None
    setting_gpu_seconds: np.ndarray | None = None
    shape_of: np.ndarray | None = None

    @property
    def infeasible(self) -> np.ndarray:
        return ~np.isfinite(self.fastest_s)


def distinct_shapes(
    tokens: np.ndarray, frames: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The distinct (tokens, frames) pairs, sorted by tokens then frames, and each sample's index
    into them (one sort of a combined integer key)."""
    t = np.asarray(tokens, dtype=np.int64)
    f = np.asarray(frames, dtype=np.int64)
    if not len(t):
        return t, f, np.zeros(0, dtype=np.int64)
    span = int(f.max()) + 1
    if int(t.max()) < (1 << 62) // span:
        keys, inverse = np.unique(t * span + f, return_inverse=True)
        return keys // span, keys % span, inverse.reshape(-1)
    pairs, inverse = np.unique(np.stack([t, f]), axis=1, return_inverse=True)
    return pairs[0], pairs[1], inverse.reshape(-1)


def min_feasible_ckpt(
    cost: CostModel, tokens: np.ndarray, frames: np.ndarray, sp: int
) -> np.ndarray:
    """Per sample, the fewest checkpointed layers at which it alone fits the memory cap on an SP
    group of ``sp`` ranks; -1 where even full checkpointing does not fit. Assumes memory falls
    with the checkpointed layer count (true of both cost sources), so every count from the
    fewest on fits too."""
    cap = cost.memory_cap_bytes - cost.static_memory_bytes()
    out = np.full(len(tokens), -1, dtype=np.int64)
    todo = np.arange(len(tokens))
    for k in range(cost.model.num_layers + 1):
        if not len(todo):
            break
        fits = cost.sample_memory(tokens[todo], frames[todo], sp, k) <= cap
        out[todo[fits]] = k
        todo = todo[~fits]
    return out


def _lower_hull(ys: np.ndarray, first: int) -> np.ndarray:
    """Indices k >= ``first`` of the points (k, ys[k]) on their lower convex hull: every
    minimum of ``u * k + w * ys[k]`` with w > 0 over k >= first lies on one of them."""
    hull: list[int] = []
    for k in range(first, len(ys)):
        while len(hull) >= 2:
            i, j = hull[-2], hull[-1]
            # drop j when it lies on or above the segment from i to k
            if (ys[j] - ys[i]) * (k - i) >= (ys[k] - ys[i]) * (j - i):
                hull.pop()
            else:
                break
        hull.append(k)
    return np.asarray(hull, dtype=np.int64)


def _min_over_ckpt(
    share: np.ndarray, weight: np.ndarray, curve: np.ndarray, kmin: np.ndarray, affine: bool
) -> np.ndarray:
    """Per sample i, the least ``share[i, k] + weight[i] * curve[k]`` over k >= kmin[i].
    With shares affine in k only the lower hull of (k, curve[k]) can hold the least value, so
    only those columns are evaluated (a few instead of L+1)."""
    n, K = share.shape
    out = np.full(n, np.inf)
    ks = np.arange(K)
    if not affine:
        vals = np.where(
            ks[None, :] >= kmin[:, None], share + weight[:, None] * curve[None, :], np.inf
        )
        return vals.min(axis=1) if K else out
    for v in np.unique(kmin).tolist():
        sel = np.flatnonzero(kmin == v)
        cols = _lower_hull(curve, int(v))
        vals = share[np.ix_(sel, cols)] + weight[sel, None] * curve[None, cols]
        out[sel] = vals.min(axis=1)
    return out


def _packed_shares_by_ckpt(
    cost: CostModel, tokens: np.ndarray, frames: np.ndarray, sp: int, ulysses: int | None = None
) -> tuple[np.ndarray, bool]:
    """(n, L+1): every sample's packed share at every checkpointed-layer count, and whether it is
    affine in the count. Recompute adds one forward per checkpointed layer, so it usually is;
    checked at the midpoint, with an exact evaluation of every count where it is not.
    ``ulysses`` (None: Ulysses over the group): a ring or hybrid group's Ulysses span
    (`CostModel.ring_packed_share`)."""
    L = cost.model.num_layers

    def share(k: int) -> np.ndarray:
        if ulysses is None:
            return np.asarray(cost.sample_time_packed(tokens, frames, sp, k), dtype=float)
        return np.asarray(cost.ring_packed_share(tokens, frames, sp, ulysses, k), dtype=float)

    t0 = share(0)
    if L == 0:
        return t0[:, None], True
    tL = share(L)
    ks = np.arange(L + 1, dtype=float)
    out = t0[:, None] + (tL - t0)[:, None] * (ks[None, :] / L)
    mid = L // 2
    if 0 < mid < L:
        exact = share(mid)
        if not np.allclose(exact, out[:, mid], rtol=1e-9, atol=1e-15):
            for k in range(1, L):
                out[:, k] = share(k)
            return out, False
    return out, True


def sample_bounds(batch: GlobalBatch, cost: CostModel) -> SampleBounds:
    """Cheapest feasible GPU-seconds and fastest feasible time of every sample of ``batch``.

    A sequence-split micro-batch M on s ranks with k checkpointed layers takes at least the sum
    of its samples' packed shares p_i(s, k) plus the fixed cost o(s, k) it pays once
    (`CostModel.microbatch_overhead`), and the memory cap limits it to N(s, k) tokens per rank
    (`CostModel.microbatch_token_capacity`). Since M's tokens per rank, sum of n_i / s, are at most
    N, its o is at least the sum over its samples of (n_i / s) / N * o. So M's GPU-seconds are at
    least the sum over its samples of

        g_i(s, k) = s * (p_i(s, k) + n_i / (s * N(s, k)) * o(s, k)),

    and a sample's cheapest GPU-seconds is the least g_i over every SP degree of the aligned
    layout and every checkpointed-layer count at which it fits alone. A batch-split micro-batch
    runs one single-rank micro-batch per rank, each covered by its s = 1 terms. The micro-batch
    holding sample i takes at least p_i(s, k) + o(s, k): the sample's fastest time is the least
    of those. Without a capacity or an overhead (sources that give none) this is the packed-share
    bound with the fewest layers that fit."""
    # Samples of one shape have one bound: price each distinct (tokens, frames) once (a batch
    # of 196K text samples holds ~36K distinct lengths), then hand the results back.
    tokens, frames, inverse = distinct_shapes(batch.tokens, batch.frames)
    n = len(tokens)
    gpu_s = np.full(n, np.inf)
    fastest = np.full(n, np.inf)
    best_sp = np.zeros(n, dtype=np.int64)
    L = cost.model.num_layers
    # Every group a plan may use: Ulysses at the degrees the model's heads divide, ring and
    # hybrid groups beside them (`CostModel.ring_settings`; None: Ulysses over the group).
    settings: list[tuple[int, int | None]] = [(sp, None) for sp in cost.sp_degrees()]
    settings += [(sp, u) for sp, u in cost.ring_settings()]
    set_t = np.full((n, len(settings)), np.inf)
    set_g = np.full((n, len(settings)), np.inf)
    for j, (sp, uly) in enumerate(settings):
        kmin = min_feasible_ckpt(cost, tokens, frames, sp)
        ok = np.flatnonzero(kmin >= 0)
        if not len(ok):
            continue
        tok, fr = tokens[ok], frames[ok]
        share, affine = _packed_shares_by_ckpt(cost, tok, fr, sp, uly)  # (m, L+1)
        # a ring or hybrid micro-batch pays at least its Ulysses part's fixed cost
        fixed_at = sp if uly is None else uly
        over = np.array([cost.microbatch_overhead(fixed_at, k) for k in range(L + 1)], dtype=float)
        cap = np.array([cost.microbatch_token_capacity(sp, k) for k in range(L + 1)], dtype=float)
        # a capacity of 0 means nothing fits at that count (no sample is allowed there)
        per_tok = np.where(np.isfinite(cap) & (cap > 0), over / np.where(cap > 0, cap, 1.0), 0.0)
        g = _min_over_ckpt(share, tok / sp, per_tok, kmin[ok], affine)
        t = _min_over_ckpt(share, np.ones(len(ok)), over, kmin[ok], affine)
        gpu_s[ok] = np.minimum(gpu_s[ok], sp * g)
        set_t[ok, j], set_g[ok, j] = t, sp * g
        better = t < fastest[ok]
        best_sp[ok[better]] = sp
        fastest[ok] = np.where(better, t, fastest[ok])
    return SampleBounds(
        gpu_seconds=gpu_s[inverse],
        fastest_s=fastest[inverse],
        best_sp=best_sp[inverse],
        setting_time=set_t,
        setting_gpu_seconds=set_g,
        shape_of=inverse,
    )


# The longest samples each give the bound of `one_sample_bound`; this many are tried.
LONG_SAMPLES_BOUNDED = 8


def one_sample_bound(sb: SampleBounds, i: int, others_gpu_s: float, world: int) -> float:
    """A step time no plan beats, from sample ``i``'s choice of group: on the setting j it runs
    it takes at least T[i, j] and uses at least G[i, j] GPU-seconds, which the other samples'
    cheapest GPU-seconds (``others_gpu_s``) add to; so the step takes at least
    min over j of max(T[i, j], (others + G[i, j]) / W). Tighter than max(work / W, T_i) when
    the sample's fastest group is wide (a ring of the whole world keeps every rank)."""
    assert sb.setting_time is not None and sb.setting_gpu_seconds is not None
    assert sb.shape_of is not None
    r = int(sb.shape_of[i])
    t, g = sb.setting_time[r], sb.setting_gpu_seconds[r]
    fit = np.isfinite(t) & np.isfinite(g)
    if not fit.any():
        return math.inf
    return float(np.maximum(t[fit], (others_gpu_s + g[fit]) / world).min())


def lower_bound(
    batch: GlobalBatch,
    cost: CostModel,
    include_sync: bool = True,
    infeasible: str = "raise",
) -> float:
    """A step time no valid plan of ``batch`` beats on ``cost.cluster``:
    max(sum of cheapest feasible GPU-seconds / world size, slowest sample at its fastest feasible
    setting, `one_sample_bound` of the longest samples) + gradient sync + optimizer.
    ``infeasible``: ``"raise"`` (`InfeasibleError` when a sample fits no SP degree even fully
    checkpointed) or ``"skip"`` (bound the feasible ones, as a plan that drops such samples
    would)."""
    if batch.n == 0:
        return cost.step_sync_time() if include_sync else 0.0
    sb = sample_bounds(batch, cost)
    bad = sb.infeasible
    if infeasible not in ("raise", "skip"):
        raise ValueError(f"infeasible={infeasible!r}; expected 'raise' or 'skip'")
    if np.any(bad) and infeasible == "raise":
        i = int(np.flatnonzero(bad)[0])
        raise InfeasibleError(
            f"{int(bad.sum())} sample(s) fit no SP degree under the memory cap "
            f"({cost.memory_cap_bytes / 2**30:.1f} GiB per rank, every layer checkpointed, at the "
            f"runnable SP degrees {cost.describe_sp_degrees()}); e.g. position {i} with "
            f"{int(batch.tokens[i])} tokens"
        )
    ok = ~bad
    W = cost.cluster.world_size
    total = float(sb.gpu_seconds[ok].sum())
    work = total / W
    longest = float(sb.fastest_s[ok].max()) if np.any(ok) else 0.0
    bound = max(work, longest)
    cand = np.flatnonzero(ok)
    if len(cand) and sb.setting_time is not None:
        top = cand[np.argsort(-sb.fastest_s[cand], kind="stable")[:LONG_SAMPLES_BOUNDED]]
        for i in top.tolist():
            others = total - float(sb.gpu_seconds[i])
            bound = max(bound, one_sample_bound(sb, i, others, W))
    if not math.isfinite(bound):
        raise InfeasibleError("lower bound is not finite")
    return bound + (cost.step_sync_time() if include_sync else 0.0)


# What the lower bound keeps from the cost model (the report lists them beside the bound).
BOUND_ASSUMPTIONS = (
    "SP groups: Ulysses at the powers of two dividing the world (aligned groups) that the "
    "model's attention heads divide (Ulysses shards heads); ring and hybrid groups at the other "
    "aligned sizes and on whole nodes beyond the largest aligned group, up to 16 nodes "
    "(CostModel.ring_settings), with the source's ring pricing (analytical); at a size the heads "
    "divide a group runs Ulysses",
    "recompute is whole layers (the first k of L checkpointed); no selective (attention- or "
    "MLP-only) recompute, which the cost model does not price",
    "no overlap of compute with communication or recompute inside a micro-batch",
    "every sample's time and memory as the cost model prices them (analytical or profiled source)",
    "memory: at the run's configured cap (lower_bound_s) and at the GPU's whole usable memory "
    "(lower_bound_physical_s, mem_cap_fraction = 1)",
)


def with_memory_cap(cost: CostModel, fraction: float) -> CostModel:
    """The same cost model with the memory cap at ``fraction`` of usable GPU memory (a shallow
    copy: the cap is read through `CostModel.memory_cap_bytes`)."""
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction={fraction}; expected 0 < fraction <= 1")
    out = copy.copy(cost)
    out.mem_cap_fraction = float(fraction)
    inner = getattr(out, "analytical", None)
    if isinstance(inner, CostModel):  # the profiled source's analytical stand-in
        out.analytical = with_memory_cap(inner, fraction)  # type: ignore[attr-defined]
    return out


def physical_lower_bound(batch: GlobalBatch, cost: CostModel, include_sync: bool = True) -> float:
    """`lower_bound` with the whole usable GPU memory as the cap instead of the run's configured
    cap: a bound of the machine (under the cost model's other assumptions, `BOUND_ASSUMPTIONS`),
    which no plan under any cap beats. Samples no setting fits even there are skipped."""
    if cost.mem_cap_fraction >= 1.0:
        return lower_bound(batch, cost, include_sync, infeasible="skip")
    return lower_bound(batch, with_memory_cap(cost, 1.0), include_sync, infeasible="skip")


# ------------------------------------------------------------------------------------------------
# Where a step's time goes, and the simulator as an executor of the one step loop.


@dataclass
class StepAccount:
    """Where one step's time goes, averaged over ranks (seconds): ``parts``, one per part the cost
    model's declared time terms are booked to (`TimeTerm.part`: forward+backward compute,
    recomputation, sequence-parallel communication, and any a cost model adds) and the once-per-step
    gradient sync + optimizer (``sync_s``); and the rest of the step time (ranks waiting for the
    slowest: imbalance)."""

    parts: dict[str, float]  # part -> seconds, micro-batch parts in declaration order, then sync_s
    idle_s: float
    sp_samples: dict[int, int] = field(default_factory=dict)  # SP degree -> samples
    ckpt_samples: dict[str, int] = field(default_factory=dict)  # checkpointed fraction -> samples
    sp_tokens: dict[int, int] = field(default_factory=dict)  # SP degree -> tokens
    ckpt_tokens: dict[str, int] = field(default_factory=dict)  # checkpointed fraction -> tokens


def account_step(
    plan: StepPlan, batch: GlobalBatch, cost: CostModel, step_time_s: float
) -> StepAccount:
    """Attribute a simulated step's time to its parts using the cost model's per-micro-batch
    costs (noise-free), averaged over ranks; the idle part is the remainder, so the parts add up
    to the step time exactly."""
    cost = plan_cost(plan, cost)
    arr = _flatten(plan)
    return _account(arr, _price(arr, batch, cost), plan.world_size, cost, step_time_s)


def _account(
    arr: _PlanArrays, priced: _Priced, world: int, cost: CostModel, step_time_s: float
) -> StepAccount:
    # A micro-batch occupies every rank of its group: its rank-seconds are its time x group size.
    size = arr.g_size[arr.mb_group].astype(float) if arr.n_mb else np.zeros(0)
    parts = {part: float((t * size).sum()) / world for part, t in priced.by_part().items()}
    parts[SYNC_PART] = float(cost.step_sync_time())
    layers = max(1, int(cost.model.num_layers))
    ckpt = np.zeros(arr.n_mb, dtype=np.int64)
    ckpt[np.asarray(arr.seq_mb, dtype=np.int64)] = arr.seq_ckpt
    for j, _, _, k in arr.batch_split:
        ckpt[j] = k
    sp_hist: dict[int, int] = {}
    sp_tok: dict[int, int] = {}
    ckpt_hist: dict[str, int] = {}
    ckpt_tok: dict[str, int] = {}
    for j in range(arr.n_mb):
        sp = int(size[j])
        frac = f"{ckpt[j] / layers:.2f}"
        sp_hist[sp] = sp_hist.get(sp, 0) + int(priced.samples[j])
        sp_tok[sp] = sp_tok.get(sp, 0) + int(priced.tokens[j])
        ckpt_hist[frac] = ckpt_hist.get(frac, 0) + int(priced.samples[j])
        ckpt_tok[frac] = ckpt_tok.get(frac, 0) + int(priced.tokens[j])
    return StepAccount(
        parts=parts,
        idle_s=float(step_time_s - add_in_order(list(parts.values()))),
        sp_samples=sp_hist,
        ckpt_samples=ckpt_hist,
        sp_tokens=sp_tok,
        ckpt_tokens=ckpt_tok,
    )


class SimExecutor:
    """The simulator as an `dcp_bench.execution.Executor`: plans in-process and prices each plan
    with ``cost`` (plus seeded ``noise``). Its times are simulated, labelled as such."""

    measured = False
    writes_records = True

    def __init__(self, cost: CostModel, noise: NoiseModel | None = None) -> None:
        self.cost = cost
        self.noise = noise
        self.world_size = cost.cluster.world_size
        self.hardware = f"simulated {cost.cluster.name}"
        self.info: dict[str, Any] = {}

    def agree(self, flag: bool) -> bool:
        return flag

    def plan(self, batch: GlobalBatch, plan_fn: PlanFn) -> tuple[StepPlan, float]:
        t0 = time.perf_counter()
        plan = plan_fn(batch)
        return plan, time.perf_counter() - t0

    def execute(self, plan: StepPlan, batch: GlobalBatch) -> StepOutcome:
        res = simulate_step(plan, batch, self.cost, noise=self.noise)
        acct = res.account
        assert acct is not None
        out = StepOutcome(
            step_time_s=res.step_time_s,
            busy_s=res.busy_s.tolist(),
            peak_mem_bytes=res.peak_mem_bytes.tolist(),
            tokens=res.tokens,
            oom=res.oom,
            comm_share=res.comm_share,
            mfu=res.mfu,
            model_flops=res.model_flops,
            extra={
                "sim_step_time_s": res.step_time_s,
                **acct.parts,
                "idle_s": acct.idle_s,
                "sp_samples": {str(k): v for k, v in acct.sp_samples.items()},
                "ckpt_samples": acct.ckpt_samples,
                "sp_tokens": {str(k): v for k, v in acct.sp_tokens.items()},
                "ckpt_tokens": acct.ckpt_tokens,
            },
        )
        if self.cost.time_terms != MICROBATCH_TIME_TERMS:  # what the report names the added parts
            out.extra["added_parts"] = time_parts(
                self.cost.time_terms[len(MICROBATCH_TIME_TERMS) :]
            )
        return out
