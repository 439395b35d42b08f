"""`flexsp_milp`: FlexSP (Wang et al., ASPLOS'25; PKU-DAIR/Hetu-Galvatron, ``flexsp_solver``).

Per step, the global batch is chunked into rounds (FlexSP's micro-batches) that fit the
cluster's memory; per round a mixed-integer linear program (HiGHS) picks a set of heterogeneous
SP groups (powers of two, at most the world in total) and assigns the sequences to them,
minimising the slowest group's predicted time under each group's memory limit. As in FlexSP,
sequences are bucketed by length with a dynamic program that minimises padding, and a bucket
enters the program at its longest member's time and memory.

Planning is bounded by deterministic work, so the same step always gets the same plan whatever
the host's load or speed (issue 32; DESIGN.md, principle 9): each round's HiGHS run stops after
``mip_max_nodes`` branch-and-bound nodes (single thread, fixed random seed, no clock in the
search). ``step_time_limit_s`` is only a wall-clock safety cap on the whole step (cost model,
bucketing, programs, HiGHS, layout): each round's HiGHS run also gets a time limit out of what is
left of it, and a round whose solve hit that limit, or that was left no time to solve, makes the
plan depend on the host. ``plan.info["safety_cap_hit"]`` says so (with the rounds it hit in
``cap_hit_rounds``) and a warning is printed to stderr; the defaults keep the cap far from the
project's usual cells. The better of HiGHS's incumbent and a heuristic (best homogeneous SP
degree or a mixed layout, longest-processing-time balance) is kept. ``plan.info`` records the
planning time and, per round, the solver status, the nodes HiGHS searched, its gap to the bound it
proved and the gap to a solver-independent lower bound. See
baselines/README.md.
"""

from __future__ import annotations

import heapq
import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import highspy
import numpy as np

from baselines.scheduling import (
    ckpt_layers_for,
    lpt_assign,
    microbatch_fits,
    pack_under_budget,
)
from dcp_bench.errors import ConfigError, InfeasibleError
from dcp_bench.plan import Group, MicroBatch, Mode, Round, StepPlan
from dcp_bench.planners.base import Planner

if TYPE_CHECKING:
    from dcp_bench.batch import GlobalBatch
    from dcp_bench.cost.base import CostModel

# A round whose HiGHS share is below this gets the heuristic alone: HiGHS needs a few
# milliseconds for presolve and the root LP of even a small round.
MIN_SOLVE_S = 0.005
# Time held back for HiGHS running past its limit: some of its work checks no clock (nor the
# interrupt callbacks), and on a 32-GPU videosys_zipf round it overran by up to 0.17 s of CPU
# time. At most a quarter of a small budget, which then cannot be kept to 10%.
SOLVER_OVERRUN_S = 0.15
# HiGHS's branch-and-bound nodes per round: the deterministic bound on the solver's work.
DEFAULT_MIP_MAX_NODES = 50


@dataclass
class RoundSolution:
    """SP groups of one round: (size, positions) each, with the slowest group's predicted time
    and how the layout was found. ``gap`` and ``bound_s`` are HiGHS's, for the bucketed program
    (None without a HiGHS incumbent)."""

    groups: list[tuple[int, list[int]]]
    objective: float
    method: str  # "milp", "heuristic"
    status: str
    solve_s: float = 0.0
    gap: float | None = None
    bound_s: float | None = None


@dataclass
class RoundModel:
    """The data of one round's program at each SP degree: a group of degree d takes
    ``overhead[d]`` plus the sum of its sequences' ``time[:, d]`` (FlexSP's model: per-sequence
    time plus one bias per group), and holds the sum of their ``mem[:, d]``.

    ``tokens`` orders the sequences for bucketing (None: by time on one rank).
    """

    positions: list[int]
    degrees: list[int]
    time: np.ndarray  # (n, D) seconds: each sequence's share of a packed micro-batch
    mem: np.ndarray  # (n, D) activation bytes per rank
    room: float  # per-rank bytes left under the cap for activations
    world_size: int
    tokens: np.ndarray | None = None  # (n,)
    overhead: np.ndarray | None = None  # (D,) seconds per group; None: no overhead
    # FlexSP's rules (solver.py of Hetu-Galvatron b4666892): the groups use the whole world and
    # each holds a sequence (solver.py:373, 376, 499, 502); fewer slots below the largest minimum
    # degree (``get_sp_options_prune``, solver.py:294-295, 315-319)
    whole_world: bool = False
    prune_slots: bool = False

    def allowed(self) -> np.ndarray:
        return self.mem <= self.room

    def group_overhead(self) -> np.ndarray:
        return (
            np.zeros(len(self.degrees))
            if self.overhead is None
            else np.asarray(self.overhead, float)
        )

    def lengths(self) -> np.ndarray:
        return np.asarray(
            self.tokens if self.tokens is not None else self.time[:, 0], dtype=np.float64
        )

    def footprint(self) -> np.ndarray:
        """Each sequence's smallest cluster-wide activation memory (per-rank bytes x ranks)."""
        return np.min(self.mem * np.asarray(self.degrees, dtype=np.float64), axis=1)


def round_lower_bound(model: RoundModel) -> float:
    """A lower bound on the round's time that no layout can beat, independent of any solver:
    the longest sequence at its fastest degree that fits, and the work bound (each sequence needs
    at least min_d d * t_d rank-seconds; the groups share W ranks, so the slowest group takes at
    least the total over W). The per-group overhead is left out: a micro-batch never takes less
    than its sequences' packed shares (the cost-model contract), but the overhead is an estimate."""
    if not model.positions:
        return 0.0
    share = model.time
    ok = model.allowed()
    fastest = np.where(ok, share, np.inf).min(axis=1)
    work = np.where(ok, share * np.asarray(model.degrees, dtype=np.float64), np.inf).min(axis=1)
    return float(max(fastest.max(), work.sum() / model.world_size))


# ---------------------------------------------------------------- bucketing (FlexSP's DP)


def padding_partitions(
    length: np.ndarray, count: np.ndarray, max_buckets: int
) -> Iterator[list[tuple[int, int]]]:
    """FlexSP's bucketing dynamic program over distinct lengths sorted ascending, each with its
    count: yields, for b = 1 .. min(max_buckets, len(length)), the partition into b contiguous
    buckets (unit ranges [start, end)) with the least padding, sum over sequences of (the
    bucket's longest length - the sequence's length)."""
    U = len(length)
    if U == 0:
        return
    csum = np.concatenate([[0.0], np.cumsum(count, dtype=np.float64)])
    lsum = np.concatenate([[0.0], np.cumsum(length * count, dtype=np.float64)])
    top = np.concatenate(
        [[0.0], np.asarray(length, dtype=np.float64)]
    )  # top[i]: longest of units < i
    # pad[j, i - lo] of a column block [lo, hi): the padding of the bucket of units j .. i-1,
    # whose longest is unit i-1 (inf unless j < i). Only rows j < hi can start such a bucket, so
    # the blocks hold half the (U+1)^2 matrix; computed once, they serve every bucket count.
    blocks: list[tuple[int, int, np.ndarray]] = []
    for lo in range(1, U + 1, 256):
        hi = min(U + 1, lo + 256)
        j = np.arange(hi)[:, None]
        i = np.arange(lo, hi)[None, :]
        pad = top[i] * (csum[i] - csum[j]) - (lsum[i] - lsum[j])
        blocks.append((lo, hi, np.where(j < i, pad, np.inf)))
    dp = np.full(U + 1, np.inf)
    dp[0] = 0.0
    choice: list[np.ndarray] = []
    for b in range(1, min(max_buckets, U) + 1):
        new = np.full(U + 1, np.inf)
        arg = np.zeros(U + 1, dtype=np.int64)
        for lo, hi, pad in blocks:
            tot = dp[:hi, None] + pad
            arg[lo:hi] = tot.argmin(axis=0)
            new[lo:hi] = tot[arg[lo:hi], np.arange(hi - lo)]
        dp = new
        choice.append(arg)
        if math.isfinite(dp[U]):
            ranges, end = [], U
            for bb in range(b - 1, -1, -1):
                start = int(choice[bb][end])
                ranges.append((start, end))
                end = start
            yield ranges[::-1]


def flexsp_buckets(model: RoundModel, buckets: int, max_buckets: int) -> list[list[int]]:
    """Indices (into ``model.positions``) grouped into length buckets the way FlexSP does it:
    FlexSP's padding-minimising DP (`padding_partitions`), starting at ``buckets`` buckets and
    adding buckets (up to ``max_buckets``) until the padded activation footprint is at most half
    way from the real footprint to the cluster's capacity. Sequences identical for the program
    (same length, time and memory at every degree) always share a bucket; with no more such
    shapes than ``buckets`` every bucket holds one shape and the program is exact."""
    n = len(model.positions)
    if n == 0:
        return []
    key = np.column_stack([model.lengths(), model.time, model.mem])
    shapes, inverse = np.unique(key, axis=0, return_inverse=True)  # sorted by length first
    inverse = inverse.reshape(-1)
    order = np.argsort(inverse, kind="stable")
    starts = np.searchsorted(inverse[order], np.arange(len(shapes) + 1))
    members = [order[starts[u] : starts[u + 1]] for u in range(len(shapes))]
    if len(shapes) <= buckets:
        return [m.tolist() for m in members]
    count = np.diff(starts).astype(np.float64)
    degrees = np.asarray(model.degrees, dtype=np.float64)
    real = float(model.footprint().sum())
    halfway = (real + model.world_size * model.room) / 2
    chosen: list[list[int]] = []
    for ranges in padding_partitions(shapes[:, 0], count, max(buckets, max_buckets)):
        if len(ranges) < buckets:
            continue
        chosen = [np.concatenate(members[a:e]).tolist() for a, e in ranges]
        # a bucket enters the program at its largest memory at every degree
        padded = sum(len(b) * float(np.min(model.mem[b].max(axis=0) * degrees)) for b in chosen)
        if padded <= halfway:
            break
    return chosen


# ---------------------------------------------------------------- the program


@dataclass
class RoundProgram:
    """One round's FlexSP program, loaded into a HiGHS instance, and the maps back to it."""

    highs: Any
    buckets: list[list[int]]
    slots: list[int]  # degree index of every group slot (W/d slots of degree d)
    x_col: dict[
        tuple[int, int], int
    ]  # (bucket, slot) -> column: sequences of the bucket in the slot
    y_col: list[int]  # slot -> column: the slot is a group
    t_scale: float  # seconds per unit of the program's time


def quiet_highs() -> Any:
    """A HiGHS instance with logging off. HiGHS prints a banner from its C++ constructor (once
    per process) straight to file descriptor 1, which would corrupt JSON a command writes to
    stdout; the descriptor is pointed at /dev/null just for the construction."""
    sys.stdout.flush()
    saved = os.dup(1)
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        h = highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(null)
    h.setOptionValue("output_flag", False)
    return h


def _highs_program(
    n_cols: int,
    col_ub: np.ndarray,
    integrality: np.ndarray,
    cost: np.ndarray,
    rows: list[tuple[float, float, list[int], list[float]]],
) -> Any:
    """A quiet, single-threaded, deterministic HiGHS instance holding the program: columns with
    their upper bounds, costs and integrality, and ``rows`` as (lower, upper, columns, values)."""
    h = quiet_highs()
    h.setOptionValue("threads", 1)
    h.setOptionValue("random_seed", 0)
    h.setOptionValue("mip_rel_gap", 1e-6)
    # No presolve: HiGHS 1.x's MIP presolve does not check time_limit, and on some rounds it ran
    # for more than 15 minutes (prolong, llama3_8b, 64 GPUs, step 0's second round: 519 rows,
    # 2,160 integer columns); without it the solve stops at its limit. On the steps compared
    # (prolong at 32, wikipedia at 8, videosys_zipf at 32, sharegpt at 64 GPUs) the plans' gaps
    # to the lower bound were the same with and without presolve.
    h.setOptionValue("presolve", "off")
    h.addVars(n_cols, np.zeros(n_cols), col_ub)
    idx = np.arange(n_cols, dtype=np.int32)
    h.changeColsCost(n_cols, idx, cost)
    h.changeColsIntegrality(n_cols, idx, integrality)
    starts = np.cumsum([0] + [len(r[2]) for r in rows[:-1]]).astype(np.int32)
    index = np.array([c for r in rows for c in r[2]], dtype=np.int32)
    value = np.array([v for r in rows for v in r[3]], dtype=np.float64)
    h.addRows(
        len(rows),
        np.array([r[0] for r in rows]),
        np.array([r[1] for r in rows]),
        len(index),
        starts,
        index,
        value,
    )
    return h


def round_slots(model: RoundModel) -> list[int]:
    """The degree index of every group slot: W/d slots of each degree d; with ``prune_slots``,
    FlexSP's ``get_sp_options`` (solver.py:283-300) as ``get_sp_options_prune`` calls it
    (solver.py:315-319): with ``d_max`` the largest of the sequences' smallest fitting degrees
    and ``c`` how many sequences need it, a degree below ``d_max`` gets only
    ``(W - d_max * c) // d`` slots (the ranks the ``d_max`` groups leave)."""
    W, degrees = model.world_size, model.degrees
    count = [W // d for d in degrees]
    ok = model.allowed()
    if model.prune_slots and len(model.positions) and ok.any(axis=1).all():
        smallest = ok.argmax(axis=1)  # index of each sequence's smallest fitting degree
        top = int(smallest.max())
        n_top = int((smallest == top).sum())
        for di, d in enumerate(degrees):
            if di < top:
                count[di] = max(0, (W - degrees[top] * n_top) // d)
    return [di for di in range(len(degrees)) for _ in range(count[di])]


def build_round_program(model: RoundModel, buckets: list[list[int]]) -> RoundProgram:
    """The FlexSP program over group slots (W/d slots of each degree d):

    minimise C  s.t.  sum_g x[b,g] = n_b                    (every sequence placed)
                      o_g y_g + sum_b t[b,d_g] x[b,g] <= C   (slowest group)
                      sum_b m[b,d_g] x[b,g] <= room * y_g    (group memory)
                      sum_b x[b,g] <= n_g y_g                (only used slots hold sequences)
                      sum_g d_g y_g <= W                     (groups fit the world)
                      y_{d,k+1} <= y_{d,k}                   (symmetry breaking)
                      sum_g d_g (o_g y_g + sum_b t[b,d_g] x[b,g]) <= W C
                                                             (work conservation: a valid cut
                                                              that tightens the LP bound)

    x integer (sequences of bucket b in slot g), y binary, o_g the group overhead at the slot's
    degree; t and m are the largest time and
    memory of the bucket's sequences at the slot's degree (FlexSP uses the bucket's longest
    length), and a bucket may only use degrees where that memory fits. Raises `InfeasibleError`
    when a bucket fits no degree.
    """
    inf = highspy.kHighsInf
    degrees, W = model.degrees, model.world_size
    t_b = np.array([model.time[b].max(axis=0) for b in buckets])  # (B, D)
    m_b = np.array([model.mem[b].max(axis=0) for b in buckets])
    ok = m_b <= model.room
    slots = round_slots(model)
    for bi, b in enumerate(buckets):
        if not ok[bi].any():
            raise InfeasibleError(
                f"sample {model.positions[b[-1]]} does not fit the memory cap even on "
                f"{degrees[-1]} ranks"
            )
    over = model.group_overhead()
    t_scale = max(
        float(t_b.max()), float(over.max()), 1e-12
    )  # keep coefficients near 1 for the solver

    # Columns: C, y_g, then x[b,g] for allowed pairs.
    y_col = list(range(1, 1 + len(slots)))
    x_col: dict[tuple[int, int], int] = {}
    for bi in range(len(buckets)):
        for g, di in enumerate(slots):
            if ok[bi, di]:
                x_col[bi, g] = 1 + len(slots) + len(x_col)
    n_cols = 1 + len(slots) + len(x_col)
    col_ub = np.concatenate(
        [[inf], np.ones(len(slots)), [float(len(buckets[bi])) for bi, _ in x_col]]
    )
    integrality = np.array([0] + [1] * (n_cols - 1), dtype=np.uint8)
    cost = np.zeros(n_cols)
    cost[0] = 1.0

    rows: list[tuple[float, float, list[int], list[float]]] = []
    for bi, b in enumerate(buckets):
        cols = [x_col[bi, g] for g in range(len(slots)) if (bi, g) in x_col]
        rows.append((float(len(b)), float(len(b)), cols, [1.0] * len(cols)))
    for g, di in enumerate(slots):
        bs = [bi for bi in range(len(buckets)) if (bi, g) in x_col]
        cols = [x_col[bi, g] for bi in bs]
        rows.append(
            (
                -inf,
                0.0,
                cols + [y_col[g], 0],
                [float(t_b[bi, di]) / t_scale for bi in bs] + [float(over[di]) / t_scale, -1.0],
            )
        )
        rows.append(
            (-inf, 0.0, cols + [y_col[g]], [float(m_b[bi, di]) / model.room for bi in bs] + [-1.0])
        )
        # A slot holds sequences only when it is counted as used. The memory row above cannot
        # carry this: a short sequence's memory share is below HiGHS's feasibility tolerance
        # (1 token at SP 8 is 3e-8 of a rank), and a memory-free cost model has no row at all.
        cap = float(sum(len(buckets[bi]) for bi in bs))
        rows.append((-inf, 0.0, cols + [y_col[g]], [1.0] * len(cols) + [-cap]))
        if model.whole_world:  # a used group holds a sequence (solver.py:373, 499)
            rows.append((0.0, inf, cols + [y_col[g]], [1.0] * len(cols) + [-1.0]))
    # the groups fit the world; FlexSP's use all of it (solver.py:376, 502)
    rows.append(
        (
            float(W) if model.whole_world else -inf,
            float(W),
            y_col,
            [float(degrees[di]) for di in slots],
        )
    )
    for g in range(1, len(slots)):
        if slots[g] == slots[g - 1]:
            rows.append((-inf, 0.0, [y_col[g], y_col[g - 1]], [1.0, -1.0]))
    work_vals = [degrees[slots[g]] * float(t_b[bi, slots[g]]) / t_scale for (bi, g) in x_col]
    work_vals += [degrees[di] * float(over[di]) / t_scale for di in slots]
    rows.append((-inf, 0.0, [*x_col.values(), *y_col, 0], work_vals + [-float(W)]))

    h = _highs_program(n_cols, col_ub, integrality, cost, rows)
    return RoundProgram(h, buckets, slots, x_col, y_col, t_scale)


def solve_program(program: RoundProgram, time_limit_s: float | None) -> float:
    """Run HiGHS on the program (None: no time limit); returns the seconds it ran."""
    h = program.highs
    h.setOptionValue("time_limit", math.inf if time_limit_s is None else float(time_limit_s))
    t0 = time.perf_counter()
    h.run()
    return time.perf_counter() - t0


def extract_solution(
    program: RoundProgram, model: RoundModel, solve_s: float
) -> RoundSolution | None:
    """The groups of HiGHS's incumbent, or None when it has none. The program fixes how many
    sequences of each bucket a slot runs; the concrete sequences are dealt longest first to the
    least-loaded slot with quota left, so realised times track the program's."""
    h = program.highs
    info = h.getInfo()
    if info.primal_solution_status != 2:  # 2 = a feasible point exists
        return None
    sol = np.asarray(h.getSolution().col_value)
    quota: dict[int, dict[int, int]] = {}
    for (bi, g), c in program.x_col.items():
        q = int(round(sol[c]))
        if q > 0:
            quota.setdefault(bi, {})[g] = q
    over = model.group_overhead()
    members: dict[int, list[int]] = {}
    load = {g: float(over[program.slots[g]]) for targets in quota.values() for g in targets}
    for bi, b in enumerate(program.buckets):
        targets = quota.get(bi, {})
        heap = [(load[g], g) for g in targets]
        heapq.heapify(heap)
        for i in sorted(b, key=lambda i: -float(model.time[i, 0])):
            _, g = heapq.heappop(heap)
            members.setdefault(g, []).append(i)
            load[g] += float(model.time[i, program.slots[g]])
            targets[g] -= 1
            if targets[g] > 0:
                heapq.heappush(heap, (load[g], g))
    groups = [
        (model.degrees[program.slots[g]], [model.positions[i] for i in m])
        for g, m in members.items()
    ]
    used = sum(size for size, _ in groups)
    if used > model.world_size:  # the program's world row forbids this; a violation is a bug here
        raise RuntimeError(f"HiGHS layout uses {used} ranks of {model.world_size}")
    status = h.getModelStatus()
    name = (
        "optimal" if status == highspy.HighsModelStatus.kOptimal else h.modelStatusToString(status)
    )
    gap = float(info.mip_gap) if math.isfinite(info.mip_gap) else None
    bound = (
        float(info.mip_dual_bound) * program.t_scale if math.isfinite(info.mip_dual_bound) else None
    )
    return RoundSolution(groups, max(load.values(), default=0.0), "milp", name, solve_s, gap, bound)


def solve_round_milp(
    model: RoundModel, time_limit_s: float | None = None, buckets: list[list[int]] | None = None
) -> RoundSolution | None:
    """Build, solve and read back one round's program (`build_round_program`). ``buckets``
    None: one bucket per distinct sequence shape (the exact program). Returns None when HiGHS
    finds no feasible point within ``time_limit_s`` (None: no limit)."""
    if buckets is None:
        buckets = flexsp_buckets(model, len(model.positions), len(model.positions))
    program = build_round_program(model, buckets)
    return extract_solution(program, model, solve_program(program, time_limit_s))


# ---------------------------------------------------------------- heuristics


def solve_round_heuristic(model: RoundModel) -> RoundSolution:
    """The fallback: for every homogeneous SP degree that fits the round's longest sequence,
    balance the sequences over W/d groups (longest processing time first, under the group
    memory limit), and the mixed layout of `mixed_layout`; keep the fastest."""
    t0 = time.perf_counter()
    ok = model.allowed()
    over = model.group_overhead()
    best: RoundSolution | None = None
    for di, d in enumerate(model.degrees):
        if not ok[:, di].all():
            continue
        owners = lpt_assign(model.time[:, di].tolist(), model.world_size // d)
        if any(model.mem[o, di].sum() > model.room for o in owners if o):
            continue
        loads = [float(over[di] + model.time[o, di].sum()) for o in owners if o]
        groups = [(d, [model.positions[i] for i in o]) for o in owners if o]
        if best is None or max(loads) < best.objective:
            best = RoundSolution(groups, max(loads), "heuristic", "heuristic")
    mixed = mixed_layout(model)
    if mixed is not None and (best is None or mixed.objective < best.objective):
        best = mixed
    if best is None:
        raise InfeasibleError(
            "no homogeneous or mixed SP layout fits this round under the memory cap"
        )
    best.solve_s = time.perf_counter() - t0
    return best


def mixed_layout(model: RoundModel) -> RoundSolution | None:
    """A heterogeneous layout without a solver: every sequence at the smallest degree it fits
    (FlexSP's minimum SP size), ranks shared between the degree classes in proportion to their
    work (time x ranks), sequences balanced within a class by longest processing time. None when
    the classes cannot all get a group or a group breaks the memory limit."""
    ok = model.allowed()
    W = model.world_size
    cls: dict[int, list[int]] = {}
    for i in range(len(model.positions)):
        fits = np.flatnonzero(ok[i])
        if not len(fits):
            return None
        cls.setdefault(int(fits[0]), []).append(i)
    deg = model.degrees
    work = {di: float(model.time[items, di].sum()) * deg[di] for di, items in cls.items()}
    total = sum(work.values()) or 1.0
    count = {di: max(1, int(W * work[di] / total) // deg[di]) for di in cls}
    while sum(count[di] * deg[di] for di in cls) > W:
        over = [di for di in cls if count[di] > 1]
        if not over:
            return None
        di = max(over, key=lambda di: count[di] * deg[di] / max(work[di], 1e-30))
        count[di] -= 1
    while True:  # hand spare ranks to the class with the most work per rank
        spare = W - sum(count[di] * deg[di] for di in cls)
        grow = [di for di in cls if deg[di] <= spare and count[di] < len(cls[di])]
        if not grow:
            break
        di = max(grow, key=lambda di: work[di] / (count[di] * deg[di]))
        count[di] += 1
    overhead = model.group_overhead()
    groups: list[tuple[int, list[int]]] = []
    worst = 0.0
    for di, items in cls.items():
        owners = lpt_assign(model.time[items, di].tolist(), count[di])
        for o in owners:
            members = [items[j] for j in o]
            if not members:
                continue
            if float(model.mem[members, di].sum()) > model.room:
                return None
            worst = max(worst, float(overhead[di] + model.time[members, di].sum()))
            groups.append((deg[di], [model.positions[i] for i in members]))
    return RoundSolution(groups, worst, "heuristic", "heuristic")


def packed_round_time(batch: GlobalBatch, sol: RoundSolution, cost: CostModel, ckpt: int) -> float:
    """Predicted time of a round whose groups each run their sequences as one packed
    micro-batch: the slowest group's micro-batch cost."""
    worst = 0.0
    for size, members in sol.groups:
        c = cost.microbatch_cost(
            batch.tokens[members], batch.frames[members], size, ckpt, "sequence"
        )
        worst = max(worst, c.total_s)
    return worst


# ---------------------------------------------------------------- the step budget


@dataclass
class PlanningBudget:
    """The planning time of one step on ``clock``: HiGHS gets what is left once the other work
    (cost-model evaluation, heuristics, building programs, reading solutions, the layout) is set
    aside, estimated from what that work has cost so far in this step."""

    limit_s: float
    clock: Callable[[], float] = time.perf_counter
    start: float = field(init=False)
    overhead_s: float = 0.0  # the most a finished round spent outside HiGHS

    def __post_init__(self) -> None:
        self.start = self.clock()

    def elapsed(self) -> float:
        return self.clock() - self.start

    def solver_limit(self, rounds_left: int, spent_s: float) -> float:
        """HiGHS's limit for the current round, ``spent_s`` into it: an equal share, over the
        ``rounds_left`` rounds still to solve (this one included), of the time left once three
        things are set aside: the rest of this round (as long again as ``spent_s``), the work
        outside HiGHS of the other rounds and of the final layout (each as much as the costliest
        round so far, or twice ``spent_s``), and HiGHS's overrun of its limit."""
        per_round = max(self.overhead_s, 2 * spent_s)
        slack = min(SOLVER_OVERRUN_S, self.limit_s / 4)
        reserve = spent_s + rounds_left * per_round + slack
        return (self.limit_s - self.elapsed() - reserve) / rounds_left

    def finish_round(self, round_s: float, solve_s: float) -> None:
        self.overhead_s = max(self.overhead_s, round_s - solve_s)


# ---------------------------------------------------------------- the planner


class FlexSPMILP(Planner):
    """FlexSP: per-step MILP over heterogeneous SP groups (HiGHS), with a heuristic fallback.

    Args:
        mode: labels runs only (FlexSP takes one optimizer step per global batch).
        recompute: "full", "selective" (first half of the layers) or "none".
        step_time_limit_s: a wall-clock safety cap on the whole step's planning (cost model,
            programs, HiGHS, layout); a plan it cut short is marked ``safety_cap_hit`` (it
            depends on the host's load). The plan itself is bounded by ``mip_max_nodes``.
        mip_max_nodes: HiGHS's branch-and-bound node limit per round (its ``mip_max_nodes``
            option): deterministic work, so the same input always yields the same plan.
        buckets: length buckets per round to start from (FlexSP's 16).
        max_buckets: at most this many buckets when FlexSP's padding rule asks for more.
        fill: the fraction of the cluster's activation memory a round may use (slack for the
            bucket-level memory estimate); more rounds when the batch needs it.
        clock: the clock the budget is kept on (tests pass a simulated one).
        min_sp: the smallest SP degree a group may have (FlexSP's solver leaves out 1:
            solver.py:287-293 of Hetu-Galvatron b4666892; 2 follows it).
        whole_world: FlexSP's groups use every rank and each holds a sequence (solver.py:373,
            376, 499, 502); False lets a round leave ranks idle.
        prune_slots: FlexSP's slot pruning below the largest minimum degree (solver.py:294-295).
        chunking: how a step is cut into rounds. "snake": by activation footprint, longest
            first in a snake order, rounds doubled until every round is feasible (this
            project's rule). "sort_consec": FlexSP's (solver.py:573-616, 826-874;
            sequence_module_py.py:98-128): the sequences longest first cut into consecutive
            chunks minimising the largest chunk's tokens, starting from the fewest chunks that
            each stay under the cluster's token capacity, and of ``mb_options`` chunk counts
            from there the one whose rounds sum to the least time.
        mb_options: chunk counts tried by "sort_consec" (FlexSP's driver: 5, solver.py:1239);
            the step's planning time is split evenly between them.
        round_barrier: every group waits for the round's slowest before the next round
            regroups the ranks, as FlexSP's driver times an iteration (the sum of each
            micro-batch's slowest group, solver.py:1242); False lets a group start its next
            round as soon as its own ranks are free.
    """

    name = "flexsp_milp"
    source = (
        "FlexSP (ASPLOS'25): a per-step MILP over heterogeneous SP groups, solved with HiGHS. "
        "Defaults: full recompute, HiGHS stopped after 50 branch-and-bound nodes a round "
        "(a 60 s wall-clock safety cap a step), 16 length buckets (FlexSP's), no barrier between "
        "rounds."
    )
    OPTION_MINIMA = {
        "buckets": 1,
        "max_buckets": 1,
        "min_sp": 1,
        "mb_options": 1,
        "mip_max_nodes": 1,
    }

    def __init__(
        self,
        mode: Mode = "fair",
        recompute: str = "full",
        step_time_limit_s: float = 60.0,
        buckets: int = 16,
        max_buckets: int = 32,
        fill: float = 0.9,
        clock: Callable[[], float] = time.perf_counter,
        min_sp: int = 1,
        whole_world: bool = False,
        prune_slots: bool = False,
        chunking: str = "snake",
        mb_options: int = 1,
        mip_max_nodes: int = DEFAULT_MIP_MAX_NODES,
        round_barrier: bool = False,
    ) -> None:
        super().__init__(mode)
        if min_sp < 1 or min_sp & (min_sp - 1):
            raise ConfigError(f"min_sp={min_sp}; expected a power of two >= 1")
        if chunking not in CHUNKINGS:
            raise ConfigError(f"chunking={chunking!r}; expected one of {', '.join(CHUNKINGS)}")
        if mb_options < 1:
            raise ConfigError(f"mb_options={mb_options}; expected >= 1")
        if chunking == "snake" and mb_options != 1:
            raise ConfigError(
                f"mb_options={mb_options} applies to chunking='sort_consec' only; expected 1"
            )
        self.round_barrier = bool(round_barrier)
        self.min_sp = min_sp
        self.whole_world = whole_world
        self.prune_slots = prune_slots
        self.chunking = chunking
        self.mb_options = mb_options
        ckpt_layers_for(recompute, 1)
        if step_time_limit_s <= 0:
            raise ConfigError(
                f"step_time_limit_s={step_time_limit_s}; expected a positive number of seconds"
            )
        if buckets < 1:
            raise ConfigError(f"buckets={buckets}; expected >= 1")
        if (
            isinstance(mip_max_nodes, bool)
            or not isinstance(mip_max_nodes, int)
            or mip_max_nodes < 1
        ):
            raise ConfigError(f"mip_max_nodes={mip_max_nodes!r}; expected an integer >= 1")
        self.mip_max_nodes = mip_max_nodes
        if max_buckets < buckets:
            raise ConfigError(f"max_buckets={max_buckets}; expected >= buckets ({buckets})")
        if not 0.0 < fill <= 1.0:
            raise ConfigError(f"fill={fill}; expected a fraction in (0, 1]")
        self.recompute = recompute
        self.step_time_limit_s = float(step_time_limit_s)
        self.buckets = buckets
        self.max_buckets = max_buckets
        self.fill = fill
        self.clock = clock

    def round_model(
        self, batch: GlobalBatch, positions: list[int], cost: CostModel, ckpt: int
    ) -> RoundModel:
        W = cost.cluster.world_size
        degrees = [d for d in cost.sp_degrees() if d >= self.min_sp]
        if not degrees:
            raise InfeasibleError(
                f"no runnable SP degree is >= min_sp={self.min_sp}: {cost.describe_sp_degrees()}"
            )
        t = batch.tokens[positions]
        f = batch.frames[positions]
        # A group runs its sequences packed in one micro-batch, so a sequence costs its packed
        # share (the cost of it run alone would charge every short sequence the fixed costs of a
        # whole micro-batch: at 32 ranks that is 5x the packed time on prolong). The fixed costs
        # (collective latencies, kernel efficiency) are charged once per group, measured at the
        # round's scale.
        share = np.stack([cost.sample_time_packed(t, f, d, ckpt) for d in degrees], axis=1)
        whole = [cost.microbatch_cost(t, f, d, ckpt, "sequence").total_s for d in degrees]
        overhead = np.maximum(0.0, np.asarray(whole) - share.sum(axis=0))
        mem = np.stack([cost.sample_memory(t, f, d, ckpt) for d in degrees], axis=1)
        room = cost.memory_cap_bytes - cost.static_memory_bytes()
        return RoundModel(
            list(positions),
            degrees,
            np.asarray(share, float),
            np.asarray(mem, float),
            room,
            W,
            tokens=np.asarray(t),
            overhead=overhead,
            whole_world=self.whole_world,
            prune_slots=self.prune_slots,
        )

    def chunk(self, batch: GlobalBatch, num_rounds: int) -> list[list[int]]:
        """Deal the sequences, longest first, in a snake order over ``num_rounds`` rounds so
        every round gets a similar mix of lengths."""
        order = sorted(range(batch.n), key=lambda p: (-int(batch.tokens[p]), p))
        chunks: list[list[int]] = [[] for _ in range(num_rounds)]
        for i, p in enumerate(order):
            lap, j = divmod(i, num_rounds)
            chunks[j if lap % 2 == 0 else num_rounds - 1 - j].append(p)
        return [c for c in chunks if c]

    def solve_round(
        self,
        batch: GlobalBatch,
        positions: list[int],
        cost: CostModel,
        ckpt: int,
        budget: PlanningBudget,
        rounds_left: int,
    ) -> tuple[RoundSolution, dict[str, Any]]:
        """One round within the step's budget: the heuristic, then HiGHS on the bucketed program
        for this round's share of the time left; the faster layout on the packed micro-batch
        cost (what the executor runs). Returns it with the round's record for ``plan.info``."""
        t0 = budget.clock()
        model = self.round_model(batch, positions, cost, ckpt)
        try:
            heur: RoundSolution | None = solve_round_heuristic(model)
        except InfeasibleError:
            heur = None
        buckets = flexsp_buckets(model, self.buckets, self.max_buckets)
        milp, limit, solve_s, nodes, cap_hit = self.solve_within_budget(
            model, buckets, budget, rounds_left, t0
        )
        for cand in (milp, heur):
            if cand is not None:
                cand.objective = packed_round_time(batch, cand, cost, ckpt)
        sol = milp
        if heur is not None and (milp is None or heur.objective < milp.objective):
            reason = (
                "no time left under the safety cap"
                if limit is None
                else (milp.status if milp is not None else "no incumbent")
            )
            heur.status = f"fallback ({reason})"
            sol = heur
        if sol is None:
            raise InfeasibleError(f"round of {len(positions)} sequences has no feasible layout")
        record = {
            "buckets": len(buckets),
            "time_limit_s": limit or 0.0,
            "solve_s": solve_s,
            "mip_nodes": nodes,
            "cap_hit": cap_hit,
            "mip_gap": milp.gap if milp is not None else None,
            "bound_s": milp.bound_s if milp is not None else None,
            "lower_bound_s": round_lower_bound(model),
        }
        budget.finish_round(budget.clock() - t0, solve_s)
        return sol, record

    def solve_within_budget(
        self,
        model: RoundModel,
        buckets: list[list[int]],
        budget: PlanningBudget,
        rounds_left: int,
        round_start: float,
    ) -> tuple[RoundSolution | None, float | None, float, int | None, bool]:
        """Build the round's program and run HiGHS for at most ``mip_max_nodes`` nodes (the
        deterministic limit) and the round's share of the wall-clock safety cap. Returns HiGHS's
        incumbent (None without one), the time limit it had (None: no time was left to run it),
        the seconds it ran, the nodes it searched (None: not run) and whether the safety cap cut
        the round short (no time left, or HiGHS stopped on its time limit): then the layout
        depends on the host's load."""
        if budget.solver_limit(rounds_left, budget.clock() - round_start) < MIN_SOLVE_S:
            return None, None, 0.0, None, True  # not even worth building the program
        # No warm start from the heuristic: HiGHS 1.16 completes a user start point without
        # honouring time_limit (a step of videosys_zipf on 32 GPUs ran for minutes); the
        # heuristic competes with the incumbent instead.
        program = build_round_program(model, buckets)
        limit = budget.solver_limit(rounds_left, budget.clock() - round_start)
        if limit < MIN_SOLVE_S:
            return None, None, 0.0, None, True
        program.highs.setOptionValue("mip_max_nodes", self.mip_max_nodes)
        s0 = budget.clock()
        solve_program(program, limit)
        solve_s = budget.clock() - s0
        timed_out = program.highs.getModelStatus() == highspy.HighsModelStatus.kTimeLimit
        nodes = int(program.highs.getInfo().mip_node_count)
        return extract_solution(program, model, solve_s), limit, solve_s, nodes, timed_out

    def plan(self, batch: GlobalBatch, cost: CostModel) -> StepPlan:
        budget = PlanningBudget(self.step_time_limit_s, self.clock)
        ckpt = ckpt_layers_for(self.recompute, cost.model.num_layers)
        room = cost.memory_cap_bytes - cost.static_memory_bytes()
        if room <= 0:
            raise InfeasibleError("static memory alone exceeds the memory cap")
        # the largest group the model runs (the runnable degrees are a prefix of the aligned ones)
        top = cost.sp_degrees()[-1]
        per_rank_top = (
            cost.sample_memory(batch.tokens, batch.frames, top, ckpt) if batch.n else np.zeros(0)
        )
        if batch.n and float(per_rank_top.max()) > room:
            p = int(np.argmax(per_rank_top))
            raise InfeasibleError(
                f"sample {p} ({int(batch.tokens[p])} tokens) does not fit the memory cap at any "
                f"runnable SP degree {cost.describe_sp_degrees()}"
            )
        # the cluster-wide activation footprint of a sequence is smallest on few ranks (per-sample
        # buffers repeat on every rank), so size the rounds by each sequence's smallest footprint
        footprint = (
            np.min(
                [
                    cost.sample_memory(batch.tokens, batch.frames, d, ckpt) * d
                    for d in cost.sp_degrees()
                ],
                axis=0,
            )
            if batch.n
            else np.zeros(0)
        )
        if self.chunking == "sort_consec":
            sols, records, mb_tried = self.solve_sort_consec(batch, cost, ckpt)
        else:
            sols, records, mb_tried = self.solve_snake(batch, cost, ckpt, budget, footprint, room)
        return self.step_plan(batch, cost, ckpt, sols, records, budget, mb_tried)

    def solve_snake(
        self,
        batch: GlobalBatch,
        cost: CostModel,
        ckpt: int,
        budget: PlanningBudget,
        footprint: np.ndarray,
        room: float,
    ) -> tuple[list[RoundSolution], list[dict[str, Any]], list[int]]:
        """This project's chunking ("snake", see the class docstring)."""
        W = cost.cluster.world_size
        num_rounds = (
            max(1, math.ceil(float(footprint.sum()) / (self.fill * room * W))) if batch.n else 0
        )
        while True:
            chunks = self.chunk(batch, num_rounds) if batch.n else []
            sols: list[RoundSolution] = []
            records: list[dict[str, Any]] = []
            try:
                for r, positions in enumerate(chunks):
                    sol, record = self.solve_round(
                        batch, positions, cost, ckpt, budget, len(chunks) - r
                    )
                    sols.append(sol)
                    records.append(record)
                break
            except InfeasibleError:
                if num_rounds >= batch.n:
                    raise
                num_rounds = min(batch.n, 2 * num_rounds)
        return sols, records, [len(chunks)]

    def solve_sort_consec(
        self, batch: GlobalBatch, cost: CostModel, ckpt: int
    ) -> tuple[list[RoundSolution], list[dict[str, Any]], list[int]]:
        """FlexSP's chunking ("sort_consec", see the class docstring). Each chunk count gets an
        equal share of the step's planning time; an infeasible count is skipped, as FlexSP's
        driver skips it (solver.py:863-867)."""
        if not batch.n:
            return [], [], []
        W = cost.cluster.world_size
        capacity = cost.microbatch_token_capacity(1, ckpt)
        weights: np.ndarray | None = None
        if math.isfinite(capacity):
            # FlexSP's device_token_capacity is an integer (solver.py:69-70)
            cluster_capacity = float(math.floor(capacity) * W)
        else:
            # a memory law not linear in tokens (video): chunks are weighed by each sequence's
            # smallest cluster-wide activation footprint against the cluster's room, the
            # quantity FlexSP's tokens stand for
            weights = np.min(
                [
                    cost.sample_memory(batch.tokens, batch.frames, d, ckpt) * d
                    for d in cost.sp_degrees()
                ],
                axis=0,
            )
            cluster_capacity = float(W * (cost.memory_cap_bytes - cost.static_memory_bytes()))
        first = min_valid_chunks(batch.tokens, cluster_capacity, weights)
        best: tuple[float, list[RoundSolution], list[dict[str, Any]]] | None = None
        tried: list[int] = []
        share = self.step_time_limit_s / self.mb_options
        for mb in range(first, min(first + self.mb_options, batch.n + 1)):
            budget = PlanningBudget(share, self.clock)
            chunks = sort_consec_chunks(batch.tokens, mb, weights)
            sols, records = [], []
            try:
                for r, positions in enumerate(chunks):
                    sol, record = self.solve_round(
                        batch, positions, cost, ckpt, budget, len(chunks) - r
                    )
                    sols.append(sol)
                    records.append(record)
            except InfeasibleError:
                continue
            tried.append(mb)
            total = sum(s.objective for s in sols)
            if best is None or total < best[0]:
                best = (total, sols, records)
        if best is None:
            raise InfeasibleError(
                f"no chunking of the step into {first} .. {first + self.mb_options - 1} rounds "
                "is feasible"
            )
        return best[1], best[2], tried

    def step_plan(
        self,
        batch: GlobalBatch,
        cost: CostModel,
        ckpt: int,
        sols: list[RoundSolution],
        records: list[dict[str, Any]],
        budget: PlanningBudget,
        mb_tried: list[int],
    ) -> StepPlan:
        """The plan of the rounds ``sols`` with their records; ``budget`` is the step's (its
        start is the step's start)."""
        W = cost.cluster.world_size
        rounds = [self.lay_out(batch, sol, cost, ckpt) for sol in sols]
        objective = [s.objective for s in sols]
        lower = [rec["lower_bound_s"] for rec in records]
        info: dict[str, Any] = {
            "recompute": self.recompute,
            "ckpt_layers": ckpt,
            "rounds": len(rounds),
            "step_time_limit_s": self.step_time_limit_s,
            "mip_max_nodes": self.mip_max_nodes,
            "solver": [s.method for s in sols],
            "status": [s.status for s in sols],
            "objective_s": objective,  # slowest packed group per round
            **{
                key: [rec[key] for rec in records]
                for key in (
                    "buckets",
                    "time_limit_s",
                    "solve_s",
                    "mip_nodes",
                    "mip_gap",
                    "bound_s",
                    "lower_bound_s",
                )
            },
            "lb_gap": [gap_to(o, lb) for o, lb in zip(objective, lower)],
            "step_lb_gap": gap_to(sum(objective), sum(lower)),
        }
        if self.chunking != "snake":
            info["chunking"] = self.chunking
            info["chunk_counts_tried"] = mb_tried
        info["plan_s"] = budget.elapsed()
        hit = [r for r, rec in enumerate(records) if rec["cap_hit"]]
        # a layout cut short by the wall-clock cap depends on the host: never silently used
        info["safety_cap_hit"] = bool(hit)
        info["cap_hit_rounds"] = hit
        if hit:
            print(
                f"warning: flexsp_milp step {batch.step}: the wall-clock safety cap "
                f"step_time_limit_s={self.step_time_limit_s} cut rounds {hit} short; this plan "
                "depends on the host's load (raise step_time_limit_s or lower mip_max_nodes)",
                file=sys.stderr,
            )
        return StepPlan(
            world_size=W,
            rounds=rounds,
            method=self.name,
            mode=self.mode,
            step=batch.step,
            info=info,
            round_barrier=self.round_barrier,
        )

    def lay_out(self, batch: GlobalBatch, sol: RoundSolution, cost: CostModel, ckpt: int) -> Round:
        """Aligned groups, largest first from rank 0 (powers of two in decreasing size stay
        aligned), each running its sequences packed in one pass as FlexSP does; split only if
        the cost model disagrees with the additive memory estimate."""
        start, laid = 0, []
        for size, members in sorted(sol.groups, key=lambda g: -g[0]):
            if microbatch_fits(batch, members, cost, size, ckpt, "sequence"):
                packs = [tuple(members)]
            else:
                packs = pack_under_budget(batch, members, cost, size, ckpt, None)
            laid.append(Group(start, size, [MicroBatch(p, ckpt_layers=ckpt) for p in packs]))
            start += size
        return Round(groups=laid)


CHUNKINGS = ("snake", "sort_consec")


def min_valid_chunks(
    tokens: np.ndarray, cluster_capacity: float, weights: np.ndarray | None = None
) -> int:
    """FlexSP's ``get_min_valid_microbatch_num`` (solver.py:573-586): from the fewest chunks
    the total tokens allow, the first count whose `sort_consec_chunks` all stay strictly under
    the cluster's token capacity (``weights``: what a sequence counts instead of its tokens)."""
    n = len(tokens)
    w = np.asarray(tokens if weights is None else weights, dtype=np.float64)
    mb = max(1, math.ceil(float(np.sum(w)) / cluster_capacity))
    while mb < n and any(
        float(np.sum(w[c])) >= cluster_capacity for c in sort_consec_chunks(tokens, mb, weights)
    ):
        mb += 1
    return min(mb, n)


def sort_consec_chunks(
    tokens: np.ndarray, mb_num: int, weights: np.ndarray | None = None
) -> list[list[int]]:
    """FlexSP's ``chunk_globalbatch`` with ``sort_consec`` (sequence_module_py.py:98-128): the
    positions longest first (ties by position: a stable sort), cut into ``mb_num`` consecutive
    non-empty chunks minimising the largest chunk's tokens (``weights``: what a sequence counts
    instead), by its dynamic program (the first cut point reaching the minimum wins, as its
    strict ``<`` keeps it)."""
    order = sorted(range(len(tokens)), key=lambda p: (-int(tokens[p]), p))
    n = len(order)
    if not 1 <= mb_num <= n:
        raise ValueError(f"mb_num={mb_num}; expected 1 .. {n} (the number of sequences)")
    w = tokens if weights is None else weights
    prefix = np.concatenate([[0.0], np.cumsum([float(w[p]) for p in order])])
    dp = np.full(n + 1, np.inf)
    dp[0] = 0.0
    cut = np.zeros((mb_num + 1, n + 1), dtype=np.int64)
    for k in range(1, mb_num + 1):
        new = np.full(n + 1, np.inf)
        for i in range(k, n + 1):
            j = np.arange(k - 1, i)
            val = np.maximum(dp[j], prefix[i] - prefix[j])
            best = int(np.argmin(val))
            new[i] = val[best]
            cut[k, i] = j[best]
        dp = new
    chunks, end = [], n
    for k in range(mb_num, 0, -1):
        start = int(cut[k, end])
        chunks.append(order[start:end])
        end = start
    return chunks[::-1]


def gap_to(objective: float, bound: float) -> float:
    """Relative gap of an objective to a lower bound: (objective - bound) / objective."""
    return (objective - bound) / objective if objective > 0 else 0.0
