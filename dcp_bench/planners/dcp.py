"""`dcp`: our planner. Per-sequence SP degree and recompute chosen jointly with the step's schedule.

1. Settings: for every distinct shape and SP degree, the fewest checkpointed layers that fit
   the cap (recompute only where memory is short) and the sample's time: its packed share where
   it can share a micro-batch, its time alone otherwise (`ShapeTable`).
2. Choice: each sample starts at its cheapest feasible GPU-seconds (sp x time); samples longer
   than the step's lower-bound estimate max(work / W, longest sample at its fastest degree)
   are raised to the smallest degree that brings them under it.
3. Schedule: list scheduling onto aligned blocks with per-rank free times. Multi-rank tasks go
   first, each to the aligned block that frees earliest; single-rank tasks follow by LPT (longest
   first onto the least-loaded rank). Two task orders are tried and the shorter kept.
4. Refinement: while the makespan is set by a task whose SP degree can still grow, double its
   degree and reschedule; keep the change only when the makespan shrinks.
5. Plan: the schedule becomes rounds by giving each group the level after the last group its
   ranks used; consecutive tasks of one block share a group. A group's samples without
   recompute are bin-packed (first-fit decreasing by memory) into the fewest micro-batches the
   memory cap allows, so small kernels run efficiently.
6. Small batches (``search_max_samples``): packing decides much of the real cost there, so the
   planner also builds the plans that raise every sample to at least degree j and the one-degree
   plans (all samples at degree j, packed across the batch, balanced over equal groups), prices
   every candidate with the cost model (`predicted_step_time`) and keeps the fastest.

Fair mode only: every sample once, one optimizer step.
"""

from __future__ import annotations

import gc
import heapq
from dataclasses import dataclass, replace
from itertools import accumulate
from typing import TYPE_CHECKING

import numpy as np

from dcp_bench.errors import ConfigError
from dcp_bench.layout import aligned_sp_degrees, ulysses_span
from dcp_bench.plan import Group, MicroBatch, Mode, Round, SPKind, StepPlan
from dcp_bench.planners.base import Planner
from dcp_bench.planners.settings import ShapeTable, build_shape_table, raise_if_infeasible

if TYPE_CHECKING:
    from dcp_bench.batch import GlobalBatch
    from dcp_bench.cost.base import CostModel


@dataclass
class Schedule:
    """Where and when every sample runs: aligned block (start rank, size) and start time."""

    makespan: float
    block_start: np.ndarray  # (n,)
    size: np.ndarray  # (n,)
    start: np.ndarray  # (n,)
    end: np.ndarray  # (n,)
    rank_free: np.ndarray  # (W,)


def _pow2_upto(world_size: int) -> list[int]:
    """Aligned group sizes > 1 that tile the world."""
    return aligned_sp_degrees(world_size)[1:]


def place_wide(
    times: np.ndarray,
    sizes: np.ndarray,
    tasks: np.ndarray,
    free: np.ndarray,
    node: int,
    bstart: np.ndarray,
    start: np.ndarray,
) -> None:
    """Place the ``tasks`` whose group is not an aligned block (ring or hybrid groups of whole
    nodes, `CostModel.ring_settings`), longest first, each onto the whole-node block of its size
    (start a multiple of ``node``) whose ranks are all free earliest (ties: the lowest start), in
    place. Such tasks are a step's few longest samples."""
    W = len(free)
    for i in tasks[np.argsort(-times[tasks], kind="stable")].tolist():
        s = int(sizes[i])
        starts = np.arange(0, W - s + 1, node)
        ready = np.maximum.reduceat(free, np.r_[0:W:node])  # per node
        win = np.lib.stride_tricks.sliding_window_view(ready, s // node).max(axis=1)
        b = int(starts[int(win[: len(starts)].argmin())])
        t0 = float(free[b : b + s].max())
        free[b : b + s] = t0 + times[i]
        bstart[i] = b
        start[i] = t0


def list_schedule(
    times: np.ndarray, sizes: np.ndarray, world_size: int, order: str, node: int = 1
) -> Schedule:
    """Place every task (time, block size) onto a world of ``world_size`` ranks.

    Tasks on groups that are not aligned blocks (sizes that are not powers of two dividing the
    world: ring or hybrid groups of whole nodes of ``node`` ranks) first (`place_wide`). Then
    tasks with size > 1, in ``order`` ("size": size then time, descending; "time": time
    descending), each onto the aligned block whose ranks are all free earliest; then size-1
    tasks by LPT with a heap of rank free times.
    """
    n = len(times)
    W = world_size
    free = np.zeros(W)
    bstart = np.zeros(n, dtype=np.int64)
    start = np.zeros(n)
    wide = (sizes & (sizes - 1)) != 0
    wide |= (W % np.maximum(sizes, 1)) != 0
    big = np.flatnonzero((sizes > 1) & ~wide)
    if wide.any():
        place_wide(times, sizes, np.flatnonzero(wide), free, node, bstart, start)
    if len(big):
        if order == "size":
            big = big[np.lexsort((-times[big], -sizes[big]))]
        else:
            big = big[np.argsort(-times[big], kind="stable")]
        # ready[s][b]: when every rank of aligned block b of size s is free (max over its ranks),
        # kept per level so each placement costs O(levels) small updates, not O(W).
        levels = sorted({int(x) for x in sizes[big]} | {int(x) for x in _pow2_upto(W)})
        ready = {lv: free.reshape(-1, lv).max(axis=1) for lv in levels}
        if order == "size":
            _place_by_size_class(big, sizes, times, ready, levels, free, bstart, start)
            big = big[:0]
        for i, s, t in zip(big.tolist(), sizes[big].tolist(), times[big].tolist()):
            rs = ready[s]
            b = int(rs.argmin())
            t0 = float(rs[b])
            end_t = t0 + t
            free[b * s : (b + 1) * s] = end_t
            for lv in levels:
                if lv < s:
                    f = s // lv
                    ready[lv][b * f : (b + 1) * f] = end_t
                elif lv > s:
                    c = (b * s) // lv
                    if ready[lv][c] < end_t:
                        ready[lv][c] = end_t
            rs[b] = end_t
            bstart[i] = b * s
            start[i] = t0
    small = np.flatnonzero(sizes == 1)
    if len(small):
        small = small[np.argsort(-times[small], kind="stable")]
        ranks_a, starts_a = lpt(times[small], free)
        bstart[small] = ranks_a
        start[small] = starts_a
    end = start + times
    return Schedule(
        float(free.max()) if W else 0.0, bstart, sizes.astype(np.int64), start, end, free
    )


# Worlds from this size on run LPT in batches (`lpt`); smaller ones with the heap alone.
LPT_BATCH_MIN_WORLD = 256


def lpt(times: np.ndarray, free: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Longest processing time first: each task (``times`` in the order given, longest first)
    onto the rank free earliest (ties: the lowest rank), as a heap of (free time, rank) does it.
    Returns each task's rank and start; ``free`` is updated in place.

    On large worlds it runs in batches with the same result: with the ranks sorted by (free
    time, rank), the next m tasks go to the first m ranks in order as long as, for every j < m,
    each rank already given a task in the batch stays busy past the j-th rank's free time (then
    the j-th rank is the heap's minimum when the j-th task comes). A batch stops at the first j
    where that fails (ties included); where batches stay short, the heap takes over for a
    while."""
    n, W = len(times), len(free)
    ranks = np.empty(n, dtype=np.int64)
    starts = np.empty(n)
    i = 0
    tl = times.tolist()
    if W >= LPT_BATCH_MIN_WORLD:
        order = np.lexsort((np.arange(W), free))
        F, R = free[order], order
        while i < n:
            m = min(W, n - i)
            g = F[:m] + times[i : i + m]
            pm = np.minimum.accumulate(g)
            bad = np.flatnonzero(pm[:-1] <= F[1:m])  # task j+1 would not go to rank position j+1
            k = int(bad[0]) + 1 if len(bad) else m
            ranks[i : i + k] = R[:k]
            starts[i : i + k] = F[:k]
            i += k
            if k == m:
                F = np.concatenate([g, F[m:]])
            else:
                F = np.concatenate([g[:k], F[k:]])
            o = np.lexsort((R, F))
            F, R = F[o], R[o]
            if k < 64 and i < n:
                # Short batches: the heap for the next W tasks (a sorted list is a heap).
                heap = list(zip(F.tolist(), R.tolist()))
                stop = min(n, i + W)
                replace = heapq.heapreplace
                for j in range(i, stop):
                    f, r = heap[0]
                    replace(heap, (f + tl[j], r))
                    ranks[j] = r
                    starts[j] = f
                i = stop
                heap.sort()
                F = np.fromiter((f for f, _ in heap), dtype=float, count=W)
                R = np.fromiter((r for _, r in heap), dtype=np.int64, count=W)
        free[R] = F
        return ranks, starts
    heap2: list[tuple[float, int]] = [(float(free[r]), r) for r in range(W)]
    heapq.heapify(heap2)
    rk: list[int] = []
    st: list[float] = []
    replace = heapq.heapreplace
    for t in tl:
        f, r = heap2[0]
        replace(heap2, (f + t, r))
        rk.append(r)
        st.append(f)
    for f, r in heap2:
        free[r] = f
    ranks[:] = rk
    starts[:] = st
    return ranks, starts


def _place_by_size_class(
    big: np.ndarray,
    sizes: np.ndarray,
    times: np.ndarray,
    ready: dict[int, np.ndarray],
    levels: list[int],
    free: np.ndarray,
    bstart: np.ndarray,
    start: np.ndarray,
) -> None:
    """`list_schedule`'s multi-rank placement when tasks come largest size first (order "size"),
    in place: the same blocks and start times, computed a size class at a time.

    Within a class only the ready times of that size's blocks matter (larger classes are done,
    smaller ones come later), so each task goes to the block that frees earliest (ties: lowest
    block), a heap over that level; when the class is done, each block it used passes its last
    end time down to its sub-blocks and ranks, as the task-by-task updates would have left them."""
    sz = sizes[big]
    cuts = np.flatnonzero(np.r_[True, sz[1:] != sz[:-1], True])
    for lo, hi in zip(cuts[:-1].tolist(), cuts[1:].tolist()):
        s = int(sz[lo])
        rs = ready[s]
        heap = [(float(v), b) for b, v in enumerate(rs.tolist())]
        heapq.heapify(heap)
        blocks: list[int] = []
        t0s: list[float] = []
        replace = heapq.heapreplace
        for t in times[big[lo:hi]].tolist():
            f, b = heap[0]
            replace(heap, (f + t, b))
            blocks.append(b)
            t0s.append(f)
        tasks = big[lo:hi]
        bstart[tasks] = np.asarray(blocks, dtype=np.int64) * s
        start[tasks] = t0s
        used = np.unique(np.asarray(blocks, dtype=np.int64))
        for f, b in heap:
            rs[b] = f
        end = rs[used]
        for lv in levels:
            if lv < s:
                f_ = s // lv
                ready[lv].reshape(-1, f_)[used] = end[:, None]
            elif lv > s:
                # Larger blocks are never chosen again; keep them as the task-by-task loop would.
                c = (used * s) // lv
                np.maximum.at(ready[lv], c, end)
        free.reshape(-1, s)[used] = end[:, None]


def balance_items(durations: list[float], bins: int, max_moves: int = 64) -> list[list[int]]:
    """Deal items to ``bins`` by LPT (longest first onto the least-loaded bin), then move or
    swap items between the most and the least loaded bin while that lowers the larger of the
    two (each step brings their loads nearest to equal)."""
    members: list[list[int]] = [[] for _ in range(bins)]
    load = [0.0] * bins
    heap = [(0.0, g) for g in range(bins)]
    for m in sorted(range(len(durations)), key=lambda i: -durations[i]):
        lo, g = heap[0]
        heapq.heapreplace(heap, (lo + durations[m], g))
        members[g].append(m)
        load[g] += durations[m]
    for _ in range(max_moves):
        hi = max(range(bins), key=load.__getitem__)
        lo = min(range(bins), key=load.__getitem__)
        gap = load[hi] - load[lo]
        if gap <= 0:
            break
        best: tuple[float, int, int] | None = (
            None  # (resulting pair max, item from hi, item from lo or -1)
        )
        for a in members[hi]:
            d = durations[a]
            if 0 < d < gap:
                new_max = max(load[hi] - d, load[lo] + d)
                if best is None or new_max < best[0]:
                    best = (new_max, a, -1)
            for b in members[lo]:
                d2 = d - durations[b]
                if 0 < d2 < gap:
                    new_max = max(load[hi] - d2, load[lo] + d2)
                    if best is None or new_max < best[0]:
                        best = (new_max, a, b)
        if best is None or best[0] >= load[hi] * (1 - 1e-12):
            break
        _, a, b = best
        members[hi].remove(a)
        members[lo].append(a)
        load[hi] -= durations[a]
        load[lo] += durations[a]
        if b >= 0:
            members[lo].remove(b)
            members[hi].append(b)
            load[lo] -= durations[b]
            load[hi] += durations[b]
    return members


def charge_microbatch_overhead(table: ShapeTable, cost: CostModel) -> None:
    """Price every setting without recompute in ``table`` with the fixed cost of its micro-batch
    (`CostModel.microbatch_overhead`), in place.

    On one rank a sample shares its micro-batch with the step's many short samples, which fill
    it up to the memory cap (`CostModel.microbatch_token_capacity`): it carries its token share
    of a full micro-batch's fixed cost, even when it fills most of the micro-batch itself. On an
    SP group it shares only with the few samples the same group runs, so it is priced as paying
    the whole fixed cost (its time alone). Without this, a sample of half to all of a rank's
    capacity looks cheaper split over two ranks (packed there, alone on one) and pays the
    all-to-all for nothing; the degree that fits on the fewest ranks wins instead."""
    ring = table.is_ring()
    for j, sp in enumerate(table.sps.tolist()):
        if ring[j]:
            continue  # priced alone (`add_ring_columns`): its fixed cost is in its time
        k0 = np.flatnonzero(table.ckpt[:, j] == 0)
        over = cost.microbatch_overhead(sp, 0)
        if not len(k0) or over <= 0:
            continue
        share = np.asarray(
            cost.sample_time_packed(table.tokens[k0], table.frames[k0], sp, 0), dtype=float
        )
        cap = cost.microbatch_token_capacity(sp, 0)
        if sp == 1 and np.isfinite(cap) and cap > 0:
            table.time[k0, j] = share + table.tokens[k0] / cap * over
        else:
            table.time[k0, j] = np.maximum(table.time[k0, j], share + over)


def predicted_step_time(plan: StepPlan, batch: GlobalBatch, cost: CostModel) -> float:
    """Compute time of ``plan`` priced by the cost model: every micro-batch in one vectorised
    call, then each group starting when all its ranks are free (rounds in order)."""
    mb_sizes: list[int] = []
    mb_ckpt: list[int] = []
    mb_samples: list[tuple[int, ...]] = []
    mb_span: list[int] = []
    for _, g, mb in plan.micro_batches():
        mb_sizes.append(g.size)
        mb_ckpt.append(mb.ckpt_layers)
        mb_samples.append(mb.samples)
        mb_span.append(ulysses_span(mb.sp_kind, mb.ulysses_degree, g.size))
    if not mb_samples:
        return 0.0
    pos = np.fromiter((s for ss in mb_samples for s in ss), dtype=np.int64)
    mb_index = np.repeat(np.arange(len(mb_samples)), [len(ss) for ss in mb_samples])
    c = cost.microbatch_costs(
        batch.tokens[pos],
        batch.frames[pos],
        mb_index,
        np.asarray(mb_sizes),
        np.asarray(mb_ckpt),
        **({} if mb_span == mb_sizes else {"ulysses": np.asarray(mb_span)}),
    )
    dur = cost.total_time(c).tolist()
    free = np.zeros(plan.world_size)
    k = 0
    for rnd in plan.rounds:
        for g in rnd.groups:
            t = float(free[g.start : g.start + g.size].max())
            for _ in g.micro_batches:
                t += dur[k]
                k += 1
            free[g.start : g.start + g.size] = t
    return float(free.max())


def sort_by_keys(*keys: np.ndarray) -> np.ndarray:
    """``np.lexsort(keys[::-1])`` for non-negative integer keys (the first key the primary):
    the stable order by all keys at once. Packed into one int64 key and sorted with one stable
    argsort where the keys' ranges allow it (a few times faster than lexsort), else lexsort."""
    if not len(keys[0]):
        return np.zeros(0, dtype=np.int64)
    spans = [int(k.max()) + 1 for k in keys]
    if min(int(k.min()) for k in keys) < 0 or np.prod([float(x) for x in spans]) >= 2.0**62:
        return np.lexsort(keys[::-1])
    packed = keys[0].astype(np.int64)
    for k, span in zip(keys[1:], spans[1:]):
        packed = packed * span + k
    return np.argsort(packed, kind="stable")


def pack_groups(
    by_group: np.ndarray,
    bounds: np.ndarray,
    chosen: np.ndarray,
    tokens: np.ndarray,
    ckpt: np.ndarray,
    mem0: np.ndarray,
    budget: float,
    limits: np.ndarray,
) -> dict[int, list[MicroBatch]]:
    """`DCPPlanner._pack` for many groups at once: group j's samples are
    ``by_group[bounds[j]:bounds[j+1]]`` (shortest first) and ``limits[j]`` its token limit; only
    the groups where ``chosen`` is true are packed. The same micro-batches in the same order:
    samples that recompute (or reach the limit) alone, in order; then the others by memory,
    largest first (ties in order), each into the first micro-batch with room for its memory
    and tokens, else a new one. The k-th item of every group is placed in one vectorised step,
    with the same float additions in the same order as the one-group loop."""
    groups = np.flatnonzero(chosen)
    if not len(groups):
        return {}
    counts = (bounds[1:] - bounds[:-1])[groups]
    # Positions (into by_group) of the chosen groups' samples, and their group slot.
    slot = np.repeat(np.arange(len(groups)), counts)
    first_of_slot = np.cumsum(counts) - counts
    pos = bounds[groups][slot] + (np.arange(len(slot)) - first_of_slot[slot])
    sample = by_group[pos]
    tok = tokens[sample]
    alone = (ckpt[sample] > 0) | (tok >= limits[groups][slot])
    # Packable items of each group: memory descending, ties in the group's order (stable).
    items = np.flatnonzero(~alone)
    items = items[np.lexsort((pos[items], -mem0[sample[items]], slot[items]))]
    it_slot = slot[items]
    starts = np.searchsorted(it_slot, np.arange(len(groups) + 1))
    bin_of = _first_fit_bins(mem0[sample[items]], tok[items], starts, limits[groups], budget)
    # Micro-batches per group: the alone samples in order, then the bins in order of creation,
    # each holding its items in the order they arrived. One sort lays every micro-batch's
    # samples out in that order: key (group slot, alone 0 / bin 1, position or bin, arrival).
    n_al = len(slot) - len(items)
    al = np.flatnonzero(alone)
    k_slot = np.concatenate([slot[al], it_slot])
    k_kind = np.r_[np.zeros(n_al, dtype=np.int64), np.ones(len(items), dtype=np.int64)]
    k_sub = np.concatenate([pos[al] - bounds[groups][slot[al]], bin_of])
    k_arr = np.concatenate(
        [np.zeros(n_al, dtype=np.int64), np.arange(len(items)) - starts[it_slot]]
    )
    k_sample = np.concatenate([sample[al], sample[items]])
    order = sort_by_keys(k_slot, k_kind, k_sub, k_arr)
    k_slot, k_kind, k_sub, k_sample = k_slot[order], k_kind[order], k_sub[order], k_sample[order]
    first = np.flatnonzero(
        np.r_[
            True,
            (k_slot[1:] != k_slot[:-1]) | (k_kind[1:] != k_kind[:-1]) | (k_sub[1:] != k_sub[:-1]),
        ]
    )
    mb_ckpt = np.where(k_kind[first] == 0, ckpt[k_sample[first]], 0)
    ids = k_sample.tolist()
    cut = first.tolist()
    cut.append(len(ids))
    tuples = [tuple(ids[a:b]) for a, b in zip(cut[:-1], cut[1:])]
    mbs = MicroBatch.many(tuples, mb_ckpt.tolist())
    per = np.searchsorted(k_slot[first], np.arange(len(groups) + 1)).tolist()
    return {g: mbs[per[j] : per[j + 1]] for j, g in enumerate(groups.tolist())}


def _first_fit_bins(
    it_mem: np.ndarray, it_tok: np.ndarray, starts: np.ndarray, lim: np.ndarray, budget: float
) -> np.ndarray:
    """`pack_groups`'s first fit: the bin (0, 1, ... in order of creation) of every packable item,
    the items of group j being ``starts[j]:starts[j+1]`` in the order they are placed and
    ``lim[j]`` its token limit. The k-th item of every group is placed in one vectorised step."""
    n_items = np.diff(starts)
    bin_of = np.zeros(len(it_mem), dtype=np.int64)
    width = int(n_items.max()) if len(it_mem) else 0
    # Work rows ordered by item count, most first: the groups that still place a k-th item are
    # then the first rows (views, no gathers).
    row_slot = np.argsort(-n_items, kind="stable")
    row_starts = starts[:-1][row_slot]
    active = np.searchsorted(
        -n_items[row_slot], -np.arange(width), side="left"
    )  # rows with > k items
    bin_mem = np.zeros((len(n_items), max(width, 1)))
    bin_tok = np.zeros((len(n_items), max(width, 1)), dtype=np.int64)
    n_bins = np.zeros(len(n_items), dtype=np.int64)
    lim_rows = lim[row_slot]
    for k in range(width):
        cnt = int(active[k])
        at = row_starts[:cnt] + k  # the k-th item of every row that has one
        m = it_mem[at]
        t = it_tok[at]
        nb = n_bins[:cnt]
        w = int(nb.max())
        if w:
            fits = (
                (np.arange(w)[None, :] < nb[:, None])
                & (bin_mem[:cnt, :w] + m[:, None] <= budget)
                & (bin_tok[:cnt, :w] + t[:, None] <= lim_rows[:cnt, None])
            )
            first = np.where(fits.any(axis=1), fits.argmax(axis=1), nb)
        else:
            first = nb.copy()
        fresh = first >= nb
        rows = np.arange(cnt)
        bin_mem[rows, first] = np.where(fresh, m, bin_mem[rows, first] + m)
        bin_tok[rows, first] = np.where(fresh, t, bin_tok[rows, first] + t)
        n_bins[:cnt] = np.maximum(nb, first + 1)
        bin_of[at] = first
    return bin_of


def schedule_groups(sched: Schedule, W: int) -> tuple[list[Round], list[Group], np.ndarray]:
    """The rounds and groups (no micro-batches yet) a schedule becomes, and each sample's group
    (an index into the groups): each group at the level after the last group its ranks used;
    consecutive tasks of one aligned block share a group; every rank's single-rank tasks one group
    after its last multi-rank group (module docstring, step 5)."""
    rounds: list[Round] = []
    groups: list[Group] = []
    gid = np.full(len(sched.size), -1, dtype=np.int64)  # sample -> index into groups
    # Per rank: round index and group index of the last group it joined.
    last_round = np.full(W, -1, dtype=np.int64)
    last_group = [-1] * W
    # Per group: how many ranks still have it as their last group (all of them, size, means
    # no rank of its block has joined another group since).
    holding: list[int] = []
    big = np.flatnonzero(sched.size > 1)
    order = big[np.lexsort((sched.block_start[big], sched.start[big]))]
    for i, b, s in zip(
        order.tolist(), sched.block_start[order].tolist(), sched.size[order].tolist()
    ):
        g0 = last_group[b]
        if g0 >= 0 and groups[g0].start == b and groups[g0].size == s and holding[g0] == s:
            gid[i] = g0  # consecutive tasks of one block share its group
            continue
        level = int(last_round[b : b + s].max()) + 1
        while len(rounds) <= level:
            rounds.append(Round())
        g = Group(start=b, size=s)
        rounds[level].groups.append(g)
        new = len(groups)
        gid[i] = new
        for r in range(b, b + s):
            old = last_group[r]
            if old >= 0:
                holding[old] -= 1
            last_group[r] = new
        groups.append(g)
        holding.append(s)
        last_round[b : b + s] = level
    # Single-rank tasks start after every multi-rank task of their rank (list_schedule places
    # them last), so each rank runs them as one group after its last multi-rank group.
    small = np.flatnonzero(sched.size == 1)
    if len(small):
        ranks = np.unique(sched.block_start[small])
        rank_gid = np.empty(W, dtype=np.int64)
        for r in ranks.tolist():
            level = int(last_round[r]) + 1
            while len(rounds) <= level:
                rounds.append(Round())
            g = Group(start=r, size=1)
            rounds[level].groups.append(g)
            rank_gid[r] = len(groups)
            groups.append(g)
        gid[small] = rank_gid[sched.block_start[small]]
    return rounds, groups, gid


def set_sp_kinds(groups: list[Group], table: ShapeTable) -> None:
    """Give the sequence-split micro-batches of every ring or hybrid group (a size the table's
    ring columns have: `ShapeTable.ulysses`) their kind, in place: ``ring`` for a span of 1,
    else ``hybrid`` with that Ulysses degree. Ring sizes never coincide with Ulysses degrees, so
    a group's size says its kind."""
    if table.ulysses is None:
        return
    ring = table.is_ring()
    span = {int(s): int(u) for s, u in zip(table.sps[ring], table.ulysses[ring])}
    if not span:
        return
    for g in groups:
        u = span.get(g.size)
        if u is None:
            continue
        kind: SPKind = "ring" if u == 1 else "hybrid"
        g.micro_batches = [
            replace(mb, sp_kind=kind, ulysses_degree=u if u > 1 else 0)
            if mb.split == "sequence"
            else mb
            for mb in g.micro_batches
        ]


def sp_histogram(sps: np.ndarray, choice: np.ndarray) -> dict[int, int]:
    """How many samples run at each SP degree (ascending): ``choice`` indexes ``sps``. Counted
    per column (`np.bincount`), not by sorting the samples' degrees."""
    counts = np.bincount(choice, minlength=len(sps)).tolist()
    hist: dict[int, int] = {}
    for j in np.argsort(sps, kind="stable").tolist():
        if counts[j]:
            s = int(sps[j])
            hist[s] = hist.get(s, 0) + counts[j]
    return hist


class DCPPlanner(Planner):
    """Our planner (method ``dcp``): joint per-sequence SP degree, recompute and schedule."""

    name = "dcp"
    OPTION_MINIMA = {"pack_tokens": 1, "search_max_samples": 1}

    def __init__(
        self,
        mode: Mode = "fair",
        pack_tokens: int = 1 << 20,
        refine_steps: int = 16,
        search_max_samples: int = 384,
    ) -> None:
        super().__init__(mode)
        if mode != "fair":
            raise ConfigError(
                f"method dcp plans fair mode only, got mode={mode!r}; paper mode belongs to the "
                "faithful DCP methods (dcp_intra, dcp_inter, dcp_inter_pac)"
            )
        if pack_tokens < 1 or refine_steps < 0 or search_max_samples < 0:
            raise ConfigError(
                f"dcp: pack_tokens={pack_tokens} must be >= 1, refine_steps={refine_steps} and "
                f"search_max_samples={search_max_samples} >= 0"
            )
        self.pack_tokens = int(pack_tokens)
        self.refine_steps = int(refine_steps)
        # A schedule this close to the bound is not searched further (planning time matters).
        self.good_enough = 0.002
        # Batches up to this many samples also build the per-degree candidate plans and keep the
        # one the cost model prices fastest (a dozen plans: tens of ms).
        self.floor_search_max = int(search_max_samples)
        # Groups of at most this many samples are packed by `pack_groups`, all at once.
        self.vector_pack_max = 64

    # -- choice --------------------------------------------------------------------------------

    @staticmethod
    def initial_choice(table: ShapeTable, counts: np.ndarray, world_size: int) -> np.ndarray:
        """Per shape: the SP-degree index to start from (see the module docstring, step 2)."""
        T = table.time
        G = table.gpu_seconds
        # Cheapest GPU-seconds; a larger degree must be strictly (1e-9) cheaper to win.
        choice = np.argmin(G * (1.0 + 1e-9 * np.arange(T.shape[1]))[None, :], axis=1)
        fastest = T.min(axis=1)
        for _ in range(4):
            work = float((G[np.arange(len(choice)), choice] * counts).sum()) / world_size
            target = max(work, float(fastest.max()))
            t_now = T[np.arange(len(choice)), choice]
            over = t_now > target * (1 + 1e-9)
            if not over.any():
                break
            for i in np.flatnonzero(over):
                ok = np.flatnonzero(T[i] <= target * (1 + 1e-9))
                choice[i] = int(ok[0]) if len(ok) else int(np.argmin(T[i]))
        return choice

    # -- plan ----------------------------------------------------------------------------------

    def plan(self, batch: GlobalBatch, cost: CostModel) -> StepPlan:
        # A large step builds hundreds of thousands of micro-batches, groups and tuples, none in
        # a reference cycle; the cyclic garbage collector, left on, rescans them again and again
        # as they accumulate (a fifth of the planning time of a 12,288-GPU step). It is paused
        # while planning and restored as it was; reference counting still frees everything.
        enabled = gc.isenabled()
        gc.disable()
        try:
            return self._plan(batch, cost)
        finally:
            if enabled:
                gc.enable()

    def _plan(self, batch: GlobalBatch, cost: CostModel) -> StepPlan:
        W = cost.cluster.world_size
        if batch.n == 0:
            return StepPlan(
                world_size=W, rounds=[], method=self.name, mode=self.mode, step=batch.step
            )
        # Packed shares: short samples are packed into well-filled micro-batches (step 5).
        table = build_shape_table(batch.tokens, batch.frames, cost, packed=True, ring=True)
        raise_if_infeasible(table, batch.tokens, batch.frames, cost)
        node = cost.cluster.gpus_per_node
        charge_microbatch_overhead(table, cost)
        inv = table.inverse
        counts = np.bincount(inv, minlength=len(table.tokens))
        choice = self.initial_choice(table, counts, W)
        sched, sample_choice, bound = self._schedule_with_refinement(table, choice[inv], W, node)
        plan = self._to_plan(batch, cost, table, sched, sample_choice, W)
        if batch.n <= self.floor_search_max and len(table.sps) > 1:
            # Packing decides the real cost (how full micro-batches are, and samples of one
            # group share them); the schedule's per-sample estimates cannot see it. Small
            # batches therefore also build the plans that raise every sample to at least degree
            # j, price every candidate with the cost model, and keep the fastest.
            best_t = predicted_step_time(plan, batch, cost)
            T = table.time[inv]
            for j in range(1, len(table.sps)):
                trial = np.where((j > sample_choice) & np.isfinite(T[:, j]), j, sample_choice)
                if np.array_equal(trial, sample_choice):
                    continue
                s2 = self._schedule(table, trial, W, bound, node)
                p2 = self._to_plan(batch, cost, table, s2, trial, W)
                t2 = predicted_step_time(p2, batch, cost)
                if t2 < best_t * (1 - 1e-9):
                    plan, best_t, sched, sample_choice = p2, t2, s2, trial
            # And the one-degree plans: every sample at degree j, micro-batches packed across
            # the whole batch, then dealt longest first to the least-loaded group.
            for j in range(len(table.sps)):
                p3 = self._uniform_plan(batch, cost, table, j, W)
                if p3 is None:
                    continue
                t3 = predicted_step_time(p3, batch, cost)
                if t3 < best_t * (1 - 1e-9):
                    plan, best_t = p3, t3
                    sample_choice = np.full(batch.n, j)
            plan.info["predicted_step_time_s"] = best_t
        plan.info.update(
            {
                "schedule_estimate_s": sched.makespan,
                "sp_histogram": sp_histogram(table.sps, sample_choice),
                "samples_seen": batch.n,
            }
        )
        return plan

    def _schedule(
        self, table: ShapeTable, sample_choice: np.ndarray, W: int, bound: float, node: int
    ) -> Schedule:
        times = table.time[table.inverse, sample_choice]
        sizes = table.sps[sample_choice]
        best: Schedule | None = None
        for order in ("size", "time"):
            s = list_schedule(times, sizes, W, order, node)
            if best is None or s.makespan < best.makespan * (1 - 1e-12):
                best = s
            if not (sizes > 1).any() or best.makespan <= bound * (1 + self.good_enough):
                break  # the other order gives the same schedule, or cannot matter
        assert best is not None
        return best

    def _schedule_with_refinement(
        self, table: ShapeTable, sample_choice: np.ndarray, W: int, node: int
    ) -> tuple[Schedule, np.ndarray, float]:
        # The bound no schedule beats: max(cheapest total work / W, longest sample at its fastest).
        counts = np.bincount(table.inverse, minlength=len(table.tokens))
        bound = max(
            float((table.gpu_seconds.min(axis=1) * counts).sum()) / W,
            float(table.time.min(axis=1).max()),
        )
        sched = self._schedule(table, sample_choice, W, bound, node)
        K = len(table.sps)
        n = len(sample_choice)
        if sched.makespan > bound * (1 + self.good_enough) and n <= self.floor_search_max:
            # Small batches: also try raising every sample to at least degree j (where that is
            # faster); a tail of short samples then shares the big groups instead of idling them.
            T = table.time[table.inverse]  # (n, K)
            rows = np.arange(n)
            for j in range(1, K):
                faster = (j > sample_choice) & (T[:, j] < T[rows, sample_choice])
                if not faster.any():
                    continue
                trial = np.where(faster, j, sample_choice)
                s2 = self._schedule(table, trial, W, bound, node)
                if s2.makespan < sched.makespan * (1 - 1e-9):
                    sched, sample_choice = s2, trial
        tried: set[int] = set()
        for _ in range(self.refine_steps):
            if sched.makespan <= bound * (1 + self.good_enough):
                break
            crit = np.flatnonzero(sched.end >= sched.makespan * (1 - 1e-12))
            # The critical task that can still grow its degree and get faster.
            cands = [
                int(i)
                for i in crit[np.argsort(-(sched.end - sched.start)[crit])]
                if int(i) not in tried
                and sample_choice[i] + 1 < K
                and table.time[table.inverse[i], sample_choice[i] + 1]
                < table.time[table.inverse[i], sample_choice[i]]
            ]
            if not cands:
                break
            i = cands[0]
            trial = sample_choice.copy()
            trial[i] += 1
            s2 = self._schedule(table, trial, W, bound, node)
            if s2.makespan < sched.makespan * (1 - 1e-9):
                sched, sample_choice = s2, trial
            else:
                tried.add(i)
        return sched, sample_choice, bound

    def _to_plan(
        self,
        batch: GlobalBatch,
        cost: CostModel,
        table: ShapeTable,
        sched: Schedule,
        sample_choice: np.ndarray,
        W: int,
    ) -> StepPlan:
        inv = table.inverse
        ckpt = table.ckpt[inv, sample_choice]
        mem0 = table.mem[inv, sample_choice]
        budget = cost.memory_cap_bytes - cost.static_memory_bytes()
        rounds, groups, gid = schedule_groups(sched, W)
        # Every group's samples, shortest first, from one sort.
        by_group = sort_by_keys(gid, batch.tokens)
        bounds = np.searchsorted(gid[by_group], np.arange(len(groups) + 1))
        sizes = np.fromiter((g.size for g in groups), dtype=np.int64, count=len(groups))
        counts = np.diff(bounds)
        # Groups of few samples are packed together, vectorised over groups (`pack_groups`, the
        # same first-fit as `_pack`); the rest one by one.
        few = counts <= self.vector_pack_max
        mbs_of = pack_groups(
            by_group, bounds, few, batch.tokens, ckpt, mem0, budget, self.pack_tokens * sizes
        )
        for j, mbs in mbs_of.items():
            groups[j].micro_batches = mbs
        many = np.flatnonzero(~few).tolist()
        if many:
            ckpt_l: list[int] = ckpt.tolist()
            mem0_l: list[float] = mem0.tolist()
        for j in many:
            lo, hi = int(bounds[j]), int(bounds[j + 1])
            ids = by_group[lo:hi]
            g = groups[j]
            g.micro_batches = self._pack(
                ids.tolist(), batch.tokens[ids].tolist(), ckpt_l, mem0_l, budget, g.size
            )
        for rnd in rounds:
            rnd.groups.sort(key=lambda g: g.start)
        set_sp_kinds(groups, table)
        return StepPlan(
            world_size=W, rounds=rounds, method=self.name, mode=self.mode, step=batch.step
        )

    def _uniform_plan(
        self, batch: GlobalBatch, cost: CostModel, table: ShapeTable, j: int, W: int
    ) -> StepPlan | None:
        """One round of equal groups of degree ``sps[j]``; None when a sample does not fit it."""
        size = int(table.sps[j])
        inv = table.inverse
        ckpt = table.ckpt[inv, j]
        if (ckpt < 0).any():
            return None
        budget = cost.memory_cap_bytes - cost.static_memory_bytes()
        order = np.argsort(-batch.tokens, kind="stable")
        mbs = self._pack(
            order.tolist(),
            batch.tokens[order].tolist(),
            ckpt.tolist(),
            table.mem[inv, j].tolist(),
            budget,
            size,
        )
        pos = np.fromiter((s for mb in mbs for s in mb.samples), dtype=np.int64)
        mb_index = np.repeat(np.arange(len(mbs)), [len(mb.samples) for mb in mbs])
        uly = int(table.ulysses[j]) if table.ulysses is not None else size
        c = cost.microbatch_costs(
            batch.tokens[pos],
            batch.frames[pos],
            mb_index,
            np.full(len(mbs), size),
            np.asarray([mb.ckpt_layers for mb in mbs]),
            **({} if uly == size else {"ulysses": np.full(len(mbs), uly)}),
        )
        dur = cost.total_time(c)
        members = balance_items(dur.tolist(), W // size)
        groups = [
            Group(start=g * size, size=size, micro_batches=[mbs[m] for m in ms])
            for g, ms in enumerate(members)
            if ms
        ]
        set_sp_kinds(groups, table)
        return StepPlan(
            world_size=W,
            rounds=[Round(groups=groups)],
            method=self.name,
            mode=self.mode,
            step=batch.step,
        )

    def _pack(
        self,
        samples: list[int],
        tokens: list[int],
        ckpt: list[int],
        mem0: list[float],
        budget: float,
        size: int,
    ) -> list[MicroBatch]:
        """Micro-batches of one group (``samples`` shortest first, ``tokens`` their lengths).

        Samples that need recompute run alone. The others are bin-packed first-fit decreasing
        by memory into micro-batches bounded by the memory budget and ``pack_tokens`` tokens per
        rank: every micro-batch pays a fixed share of small-kernel inefficiency, so the fewest,
        fullest micro-batches are fastest.
        """
        out: list[MicroBatch] = []
        limit = self.pack_tokens * size
        items: list[tuple[float, int, int]] = []
        for i, tok in zip(samples, tokens):
            if ckpt[i] > 0 or tok >= limit:
                out.append(MicroBatch(samples=(i,), ckpt_layers=ckpt[i]))
            else:
                items.append((mem0[i], tok, i))
        items.sort(key=lambda x: -x[0])
        if items:
            # Most groups' samples all fit one micro-batch. First-fit puts item j in the first bin
            # when that bin's sum so far plus item j's memory (tokens) is within the budget: the
            # running sums below, the same additions in the same order. Non-negative terms only
            # grow the sums, so the last one within budget means every item went to that bin.
            *_, mem_total = accumulate(x[0] for x in items)
            tok_total = sum(x[1] for x in items)
            if mem_total <= budget and tok_total <= limit:
                out.append(MicroBatch(samples=tuple(x[2] for x in items), ckpt_layers=0))
                return out
        bin_mem: list[float] = []
        bin_tok: list[int] = []
        bins: list[list[int]] = []
        for m, tok, i in items:
            for j in range(len(bins)):
                if bin_mem[j] + m <= budget and bin_tok[j] + tok <= limit:
                    bin_mem[j] += m
                    bin_tok[j] += tok
                    bins[j].append(i)
                    break
            else:
                bin_mem.append(m)
                bin_tok.append(tok)
                bins.append([i])
        out.extend(MicroBatch(samples=tuple(b), ckpt_layers=0) for b in bins)
        return out
