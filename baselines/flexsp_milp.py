"""`flexsp_milp`: FlexSP (Wang et al., ASPLOS'25; PKU-DAIR/Hetu-Galvatron, ``flexsp_solver``).

Per step, the global batch is chunked into rounds (FlexSP's micro-batches) that fit the
cluster's memory; per round a mixed-integer linear program (HiGHS) picks a set of heterogeneous
SP groups (powers of two, at most the world in total) and assigns the sequences to them,
minimising the slowest group's predicted time under each group's memory limit. Sequences are
bucketed by length to keep the program small (FlexSP's bucketed variant). On a time-out without
a proven optimum the better of the incumbent and the heuristic (best homogeneous SP degree,
longest-processing-time balance) is used. Solve time, status and optimality gap go into
``plan.info``. See baselines/README.md.
"""

from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from baselines.scheduling import (
    ckpt_layers_for,
    lpt_assign,
    microbatch_fits,
    pack_under_budget,
    sp_degrees,
)
from dcp_bench.errors import ConfigError, InfeasibleError
from dcp_bench.plan import Group, MicroBatch, Mode, Round, StepPlan
from dcp_bench.planners.base import Planner

if TYPE_CHECKING:
    from dcp_bench.batch import GlobalBatch
    from dcp_bench.cost.base import CostModel


@dataclass
class RoundSolution:
    """SP groups of one round: (size, positions) each, with the model's objective (slowest
    group's predicted time) and how it was found."""

    groups: list[tuple[int, list[int]]]
    objective: float
    method: str  # "milp", "heuristic"
    status: str
    solve_s: float
    gap: float | None


@dataclass
class RoundModel:
    """The data of one round's program at each SP degree: a group of degree d takes
    ``overhead[d]`` plus the sum of its sequences' ``time[:, d]`` (FlexSP's model: per-sequence
    time plus one bias per group), and holds the sum of their ``mem[:, d]``."""

    positions: list[int]
    degrees: list[int]
    time: np.ndarray  # (n, D) seconds: each sequence's share of a packed micro-batch
    mem: np.ndarray  # (n, D) activation bytes per rank
    room: float  # per-rank bytes left under the cap for activations
    world_size: int
    overhead: np.ndarray | None = None  # (D,) seconds per group; None: no overhead

    def allowed(self) -> np.ndarray:
        return self.mem <= self.room

    def group_overhead(self) -> np.ndarray:
        return np.zeros(len(self.degrees)) if self.overhead is None else np.asarray(self.overhead, float)


def length_buckets(model: RoundModel, max_buckets: int) -> list[list[int]]:
    """Indices (into model.positions) grouped into at most ``max_buckets`` buckets of similar
    size: sorted by predicted time alone on one GPU, cut at the largest gaps in log time (equal
    sizes share a bucket, very different ones never do while buckets are left)."""
    n = len(model.positions)
    key = [(float(model.time[i, 0]), float(model.mem[i, 0]), i) for i in range(n)]
    order = [k[2] for k in sorted(key)]
    if n == 0:
        return []
    logt = np.log(np.maximum([model.time[i, 0] for i in order], 1e-30))
    gaps = np.diff(logt)
    cuts = sorted(int(j) + 1 for j in np.argsort(-gaps, kind="stable")[: max_buckets - 1] if gaps[j] > 0)
    bounds = [0, *cuts, n]
    return [order[a:b] for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


def quiet_highs() -> Any:
    """A HiGHS instance with logging off. HiGHS prints a banner from its C++ constructor (once
    per process) straight to file descriptor 1, which would corrupt JSON a command writes to
    stdout; the descriptor is pointed at /dev/null just for the construction."""
    import highspy

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


def solve_round_milp(
    model: RoundModel,
    max_buckets: int,
    time_limit_s: float,
) -> RoundSolution | None:
    """The FlexSP program over group slots (W/d slots of each degree d):

    minimise C  s.t.  sum_g x[b,g] = n_b                    (every sequence placed)
                      o_g y_g + sum_b t[b,d_g] x[b,g] <= C   (slowest group)
                      sum_b m[b,d_g] x[b,g] <= room * y_g    (group memory; y_g: group used)
                      sum_b x[b,g] <= n_g y_g                (only used slots hold sequences)
                      sum_g d_g y_g <= W                     (groups fit the world)
                      y_{d,k+1} <= y_{d,k}                   (symmetry breaking)
                      sum_g d_g (o_g y_g + sum_b t[b,d_g] x[b,g]) <= W C
                                                             (work conservation: a valid cut
                                                              that tightens the LP bound)

    x integer (sequences of bucket b in slot g; o_g the group overhead at the slot's degree; t and
    m are the bucket's mean time and mean
    memory; a bucket may only use degrees its longest sequence fits), y binary. Returns None
    when HiGHS finds no feasible point in the time limit.
    """
    import highspy

    buckets = length_buckets(model, max_buckets)
    degrees, W = model.degrees, model.world_size
    slots = [(di, k) for di, d in enumerate(degrees) for k in range(W // d)]
    t_b = np.array([[model.time[b, di].mean() for di in range(len(degrees))] for b in buckets])
    m_b = np.array([[model.mem[b, di].mean() for di in range(len(degrees))] for b in buckets])
    ok = np.array([[model.mem[b, di].max() <= model.room for di in range(len(degrees))] for b in buckets])
    for bi, b in enumerate(buckets):
        if not ok[bi].any():
            raise InfeasibleError(
                f"sample {model.positions[b[-1]]} does not fit the memory cap even on "
                f"{degrees[-1]} ranks"
            )

    # Columns: C, y_g, then x[b,g] for allowed pairs.
    col_lb: list[float] = [0.0]
    col_ub: list[float] = [highspy.kHighsInf]
    cost_c: list[float] = [1.0]
    integrality: list[int] = [0]
    y_col = {}
    for g in range(len(slots)):
        y_col[g] = len(col_lb)
        col_lb.append(0.0)
        col_ub.append(1.0)
        cost_c.append(0.0)
        integrality.append(1)
    x_col: dict[tuple[int, int], int] = {}
    for bi, b in enumerate(buckets):
        for g, (di, _) in enumerate(slots):
            if ok[bi, di]:
                x_col[bi, g] = len(col_lb)
                col_lb.append(0.0)
                col_ub.append(float(len(b)))
                cost_c.append(0.0)
                integrality.append(1)

    rows: list[tuple[float, float, list[int], list[float]]] = []
    for bi, b in enumerate(buckets):
        cols = [x_col[bi, g] for g in range(len(slots)) if (bi, g) in x_col]
        rows.append((float(len(b)), float(len(b)), cols, [1.0] * len(cols)))
    over = model.group_overhead()
    t_scale = max(float(t_b.max()), float(over.max()), 1e-12)  # keep coefficients near 1 for the solver
    for g, (di, _) in enumerate(slots):
        cols = [x_col[bi, g] for bi in range(len(buckets)) if (bi, g) in x_col]
        vals = [float(t_b[bi, di]) / t_scale for bi in range(len(buckets)) if (bi, g) in x_col]
        rows.append((
            -highspy.kHighsInf, 0.0, cols + [y_col[g], 0], vals + [float(over[di]) / t_scale, -1.0]
        ))
        mvals = [float(m_b[bi, di]) / model.room for bi in range(len(buckets)) if (bi, g) in x_col]
        rows.append((-highspy.kHighsInf, 0.0, cols + [y_col[g]], mvals + [-1.0]))
        # A slot holds sequences only when it is counted as used. The memory row above cannot
        # carry this: a short sequence's memory share is below HiGHS's feasibility tolerance
        # (1 token at SP 8 is 3e-8 of a rank), and a memory-free cost model has no row at all.
        cap = sum(len(buckets[bi]) for bi in range(len(buckets)) if (bi, g) in x_col)
        rows.append((-highspy.kHighsInf, 0.0, cols + [y_col[g]], [1.0] * len(cols) + [-float(cap)]))
    rows.append(
        (-highspy.kHighsInf, float(W), [y_col[g] for g in range(len(slots))],
         [float(degrees[di]) for di, _ in slots])
    )
    for g in range(1, len(slots)):
        if slots[g][0] == slots[g - 1][0]:
            rows.append((-highspy.kHighsInf, 0.0, [y_col[g], y_col[g - 1]], [1.0, -1.0]))
    work_cols = list(x_col.values()) + [y_col[g] for g in range(len(slots))]
    work_vals = [degrees[slots[g][0]] * float(t_b[bi, slots[g][0]]) / t_scale for (bi, g) in x_col]
    work_vals += [degrees[di] * float(over[di]) / t_scale for di, _ in slots]
    rows.append((-highspy.kHighsInf, 0.0, work_cols + [0], work_vals + [-float(W)]))

    h = quiet_highs()
    h.setOptionValue("time_limit", float(max(time_limit_s, 0.01)))
    h.setOptionValue("threads", 1)
    h.setOptionValue("random_seed", 0)
    h.setOptionValue("mip_rel_gap", 1e-6)
    n = len(col_lb)
    h.addVars(n, np.array(col_lb), np.array(col_ub))
    idx = np.arange(n, dtype=np.int32)
    h.changeColsCost(n, idx, np.array(cost_c))
    h.changeColsIntegrality(n, idx, np.array(integrality, dtype=np.uint8))
    lower = np.array([r[0] for r in rows])
    upper = np.array([r[1] for r in rows])
    starts = np.cumsum([0] + [len(r[2]) for r in rows[:-1]]).astype(np.int32)
    index = np.array([c for r in rows for c in r[2]], dtype=np.int32)
    value = np.array([v for r in rows for v in r[3]], dtype=np.float64)
    h.addRows(len(rows), lower, upper, len(index), starts, index, value)
    t0 = time.perf_counter()
    h.run()
    solve_s = time.perf_counter() - t0
    status = h.getModelStatus()
    info = h.getInfo()
    if info.primal_solution_status != 2:  # 2 = a feasible point exists
        return None
    sol = np.asarray(h.getSolution().col_value)
    # Deal each bucket's concrete sequences to its slots, longest first to the least-loaded
    # slot with quota left, so the realised times track the bucket means.
    quota = {k: int(round(sol[c])) for k, c in x_col.items() if round(sol[c]) > 0}
    members: dict[int, list[int]] = {}
    load = {g: float(over[slots[g][0]]) for (_, g) in quota}
    for bi, b in enumerate(buckets):
        targets = {g: q for (bb, g), q in quota.items() if bb == bi}
        for i in sorted(b, key=lambda i: -float(model.time[i, 0])):
            open_slots = [g for g, q in targets.items() if q > 0]
            g = min(open_slots, key=lambda g: (load[g], g))
            targets[g] -= 1
            members.setdefault(g, []).append(i)
            load[g] += float(model.time[i, slots[g][0]])
    groups = [(degrees[slots[g][0]], [model.positions[i] for i in mem]) for g, mem in members.items()]
    gap = float(info.mip_gap) if math.isfinite(info.mip_gap) else None
    name = "optimal" if status == highspy.HighsModelStatus.kOptimal else h.modelStatusToString(status)
    return RoundSolution(groups, max(load.values(), default=0.0), "milp", name, solve_s, gap)


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
            best = RoundSolution(groups, max(loads), "heuristic", "heuristic", 0.0, None)
    mixed = mixed_layout(model)
    if mixed is not None and (best is None or mixed.objective < best.objective):
        best = mixed
    if best is None:
        raise InfeasibleError("no homogeneous or mixed SP layout fits this round under the memory cap")
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
    return RoundSolution(groups, worst, "heuristic", "heuristic", 0.0, None)


def packed_round_time(batch: GlobalBatch, sol: RoundSolution, cost: CostModel, ckpt: int) -> float:
    """Predicted time of a round whose groups each run their sequences as one packed
    micro-batch: the slowest group's micro-batch cost."""
    worst = 0.0
    for size, members in sol.groups:
        c = cost.microbatch_cost(batch.tokens[members], batch.frames[members], size, ckpt, "sequence")
        worst = max(worst, c.total_s)
    return worst


class FlexSPMILP(Planner):
    """FlexSP: per-step MILP over heterogeneous SP groups (HiGHS), with a heuristic fallback.

    Args:
        mode: labels runs only (FlexSP takes one optimizer step per global batch).
        recompute: "full", "selective" (first half of the layers) or "none".
        time_limit_s: HiGHS time limit per step, shared by the step's rounds.
        max_buckets: length buckets per round (program size grows with it).
        fill: the fraction of the cluster's activation memory a round may use (slack for the
            bucket-level memory estimate); more rounds when the batch needs it.
    """

    name = "flexsp_milp"

    def __init__(
        self,
        mode: Mode = "fair",
        recompute: str = "full",
        time_limit_s: float = 2.0,
        max_buckets: int = 16,
        fill: float = 0.9,
    ) -> None:
        super().__init__(mode)
        ckpt_layers_for(recompute, 1)
        if time_limit_s <= 0:
            raise ConfigError(f"time_limit_s={time_limit_s}; expected a positive number of seconds")
        if max_buckets < 1:
            raise ConfigError(f"max_buckets={max_buckets}; expected >= 1")
        if not 0.0 < fill <= 1.0:
            raise ConfigError(f"fill={fill}; expected a fraction in (0, 1]")
        self.recompute = recompute
        self.time_limit_s = time_limit_s
        self.max_buckets = max_buckets
        self.fill = fill

    def round_model(self, batch: GlobalBatch, positions: list[int], cost: CostModel, ckpt: int) -> RoundModel:
        W = cost.cluster.world_size
        degrees = sp_degrees(W)
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
            list(positions), degrees, np.asarray(share, float), np.asarray(mem, float), room, W, overhead
        )

    def chunk(self, batch: GlobalBatch, cost: CostModel, ckpt: int, num_rounds: int) -> list[list[int]]:
        """Deal the sequences, longest first, in a snake order over ``num_rounds`` rounds so
        every round gets a similar mix of lengths."""
        order = sorted(range(batch.n), key=lambda p: (-int(batch.tokens[p]), p))
        chunks: list[list[int]] = [[] for _ in range(num_rounds)]
        for i, p in enumerate(order):
            lap, j = divmod(i, num_rounds)
            chunks[j if lap % 2 == 0 else num_rounds - 1 - j].append(p)
        return [c for c in chunks if c]

    def plan(self, batch: GlobalBatch, cost: CostModel) -> StepPlan:
        W = cost.cluster.world_size
        ckpt = ckpt_layers_for(self.recompute, cost.model.num_layers)
        room = cost.memory_cap_bytes - cost.static_memory_bytes()
        if room <= 0:
            raise InfeasibleError("static memory alone exceeds the memory cap")
        per_rank_w = cost.sample_memory(batch.tokens, batch.frames, W, ckpt) if batch.n else np.zeros(0)
        if batch.n and float(per_rank_w.max()) > room:
            p = int(np.argmax(per_rank_w))
            raise InfeasibleError(
                f"sample {p} ({int(batch.tokens[p])} tokens) does not fit the memory cap even on all "
                f"{W} ranks"
            )
        # the cluster-wide activation footprint of a sequence is smallest on few ranks (per-sample
        # buffers repeat on every rank), so size the rounds by each sequence's smallest footprint
        footprint = (
            np.min([cost.sample_memory(batch.tokens, batch.frames, d, ckpt) * d for d in sp_degrees(W)], axis=0)
            if batch.n else np.zeros(0)
        )
        num_rounds = max(1, math.ceil(float(footprint.sum()) / (self.fill * room * W))) if batch.n else 0
        deadline = time.perf_counter() + self.time_limit_s
        while True:
            chunks = self.chunk(batch, cost, ckpt, num_rounds) if batch.n else []
            sols: list[RoundSolution] = []
            try:
                for r, positions in enumerate(chunks):
                    model = self.round_model(batch, positions, cost, ckpt)
                    left = max(0.01, (deadline - time.perf_counter()) / (len(chunks) - r))
                    try:
                        heur: RoundSolution | None = solve_round_heuristic(model)
                    except InfeasibleError:
                        heur = None
                    # No warm start from the heuristic: HiGHS 1.16 completes a user start point
                    # without honouring time_limit (a step of videosys_zipf on 32 GPUs ran
                    # for minutes); the heuristic competes with the incumbent below instead.
                    sol = solve_round_milp(model, self.max_buckets, left)
                    # compare layouts on their packed micro-batch cost (what the executor runs),
                    # not the program's per-sequence sum
                    for cand in (sol, heur):
                        if cand is not None:
                            cand.objective = packed_round_time(batch, cand, cost, ckpt)
                    if heur is not None and (sol is None or (sol.status != "optimal" and heur.objective < sol.objective)):
                        heur.status = "fallback" if sol is None else f"fallback ({sol.status})"
                        heur.gap = sol.gap if sol is not None else None
                        heur.solve_s += sol.solve_s if sol is not None else left
                        sol = heur
                    if sol is None:
                        raise InfeasibleError(f"round {r} has no feasible layout")
                    sols.append(sol)
                break
            except InfeasibleError:
                if num_rounds >= batch.n:
                    raise
                num_rounds = min(batch.n, 2 * num_rounds)
        rounds: list[Round] = []
        for sol in sols:
            start, laid = 0, []
            for size, members in sorted(sol.groups, key=lambda g: -g[0]):
                # FlexSP runs a group's sequences packed in one pass; split only if the cost
                # model disagrees with the additive memory estimate.
                if microbatch_fits(batch, members, cost, size, ckpt, "sequence"):
                    packs = [tuple(members)]
                else:
                    packs = pack_under_budget(batch, members, cost, size, ckpt, None)
                laid.append(Group(start, size, [MicroBatch(p, ckpt_layers=ckpt) for p in packs]))
                start += size
            rounds.append(Round(groups=laid))
        info: dict[str, Any] = {
            "recompute": self.recompute,
            "ckpt_layers": ckpt,
            "rounds": len(rounds),
            "solve_s": sum(s.solve_s for s in sols),
            "solver": [s.method for s in sols],
            "status": [s.status for s in sols],
            "mip_gap": [s.gap for s in sols],
            "objective_s": [s.objective for s in sols],  # slowest packed group per round
            "time_limit_s": self.time_limit_s,
        }
        return StepPlan(world_size=W, rounds=rounds, method=self.name, mode=self.mode, step=batch.step, info=info)
