"""`megatron_hybrid_cp`: Megatron-Core's dynamic ("hybrid") context parallelism, reimplemented
from its public code (NVIDIA/Megatron-LM at d98e8a64ddf34856e74b24714e3bedb2f5a39553,
megatron/core/pipeline_parallel/hybrid_cp_schedule.py, `BalancedCPScheduler`; with
``scheduler=default_dynamic_cp`` the dev branch's `DefaultDynamicCPScheduler` at d48bd6be, see
`dynamic_cp_micro_batch`), run from the launch flags a user sets. Its CP is ring attention
(`cp_attention_kind`).

Per sequence, a context-parallel group of 2^ceil(log2(L / max_tokens_per_rank)) ranks. The
global batch is cut into *groups* (our rounds; the reference puts a barrier between them):
sequences, longest first, are dealt to a new CP group while ranks are free, else to the
least-loaded existing group of exactly the size they need, with the load estimated as L^2 / cp;
a round closes early once it is balanced within ``delta``; the most recent sequence of the
busiest group is handed to the next round while that reduces the imbalance; idle ranks are
filled by doubling the smallest groups. A group's sequences of a round are packed (THD) into
micro-batches of at most ``max_tokens_per_rank`` tokens per rank; ``pack_sequences=False`` runs
each sequence alone, as the schedule read does.

Megatron fixes two settings per launch: the per-rank token ceiling ``max_seqlen_per_dp_cp_rank``
(``--max-seqlen-per-dp-cp-rank``) and the activation recompute (``--recompute-granularity`` /
``--recompute-method`` / ``--recompute-num-layers``). `MegatronHybridCP` takes them as flags:
the recompute of the example launch (``examples/dynamic_context_parallel/benchmark_dcp.sh``
sets none), the ceiling by its documented meaning, the most tokens one rank holds without
overflowing memory (``model_parallel_config.py:111-118``). `MegatronHybridCPTuned`
(``megatron_hybrid_cp_tuned``) instead searches the pair on the cost model once per workload, an
offline tuning a user would do with trial runs (its time is recorded as ``tune_s``). See
baselines/README.md for the rules, their sources and the deviations.
"""

from __future__ import annotations

import json
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from baselines.scheduling import (
    ckpt_layers_for,
    estimate_step_time,
    largest_fitting,
    max_tokens_fitting_one_rank,
    microbatch_memory,
    pack_under_budget,
)
from dcp_bench.archs import arch_of
from dcp_bench.errors import ConfigError, InfeasibleError
from dcp_bench.layout import aligned_sp_degrees
from dcp_bench.plan import Group, MicroBatch, Mode, Round, SPKind, StepPlan
from dcp_bench.planners.base import Planner

if TYPE_CHECKING:
    from dcp_bench.batch import GlobalBatch
    from dcp_bench.cost.base import CostModel

Seq = tuple[int, int]  # (position in the batch, tokens)

# The schedulers a launch selects (``--sequence-packing-scheduler``): ``balanced_cp`` is
# `BalancedCPScheduler` (d98e8a64, hybrid_cp_schedule.py), ``default_dynamic_cp`` the dev
# branch's `DefaultDynamicCPScheduler` (d48bd6be, data_schedule.py:407-447).
SCHEDULERS = ("balanced_cp", "default_dynamic_cp")
DEV_COMMIT = "d48bd6be0a85cc0d6d3cc71e8750cf357cc6bdb1"  # NVIDIA/Megatron-LM branch dev


def cp_attention_kind(cost: CostModel) -> SPKind:
    """Megatron's context parallelism is ring attention (Transformer Engine's point-to-point
    CP): ``ring`` for a text model where the cost model prices rings; else the suite's Ulysses
    (video models, whose sequence parallelism the cost models price as DSP only)."""
    return "ring" if arch_of(cost.model).text_sp_kinds and cost.prices_ring else "ulysses"


def largest_cp_group(cost: CostModel) -> int:
    """The largest CP group a plan holds: with ring attention the heads do not limit it, only
    the aligned layout of the world (the powers of two dividing it); with Ulysses the model's
    runnable degrees (`CostModel.sp_degrees`)."""
    if cp_attention_kind(cost) == "ring":
        return aligned_sp_degrees(cost.cluster.world_size)[-1]
    return cost.sp_degrees()[-1]


def megatron_cp_group_sizes(world_size: int) -> list[int]:
    """The CP group sizes Megatron-Core's hybrid CP has a process group for on a DPxCP world of
    ``world_size`` ranks (TP = PP = 1): 1 (each rank), the powers of two from 2 below
    2^floor(log2 W) (`create_hybrid_dp_cp_groups`, megatron/core/parallel_state.py:440-460 at
    d98e8a64, consecutive blocks, :449), and the whole world (`get_hybrid_data_context_parallel_
    groups` returns the DP-with-CP group for that size, :1851-1860). 3 nodes of 8: 1, 2, 4, 8,
    24; no group of 16. Blocks of a power of two that does not divide the world (40 ranks: 16)
    are left out: the plan layout holds no such group."""
    out = [1]
    s = 2
    while 2 * s <= world_size:
        if world_size % s == 0:
            out.append(s)
        s *= 2
    if world_size > 1:
        out.append(world_size)
    return out


def gpus_needed(tokens: int, max_tokens_per_rank: int) -> int:
    """2^ceil(log2(L / max_tokens_per_rank)), at least 1 (exact integer arithmetic)."""
    cp = 1
    while cp * max_tokens_per_rank < tokens:
        cp *= 2
    return cp


def workload(tokens: int, cp: int) -> float:
    """The reference's relative per-rank workload of a sequence: L^2 / cp (attention-bound)."""
    return tokens * tokens / cp


def equal_work_buckets(seqs: list[Seq], cp_of: dict[int, int]) -> list[deque[Seq]]:
    """Cut the (longest-first) sequences into as many contiguous buckets as there are distinct
    CP sizes, each holding about the same total workload (closing a bucket at 110% of the
    target, or when the remaining sequences are needed to give every bucket one)."""
    k = len({cp_of[p] for p, _ in seqs})
    work = [workload(L, cp_of[p]) for p, L in seqs]
    target = sum(work) / k
    buckets: list[deque[Seq]] = []
    cur: list[Seq] = []
    cur_work = 0.0
    for i, ((p, L), w) in enumerate(zip(seqs, work)):
        if cur and (cur_work + w > 1.1 * target or len(seqs) - i <= k - len(buckets)):
            buckets.append(deque(cur))
            cur, cur_work = [], 0.0
        cur.append((p, L))
        cur_work += w
    if cur:
        buckets.append(deque(cur))
    return buckets


@dataclass
class CPGroup:
    size: int
    seqs: list[Seq] = field(default_factory=list)
    load: float = 0.0  # per-rank workload, sum of L^2 / size


def form_round(
    seqs: list[Seq], cp_of: dict[int, int], world_size: int, delta: float, max_degree: int
) -> tuple[list[CPGroup], list[Seq]]:
    """One reference "group" (our round): the CP groups with their sequences, and the leftovers.
    ``max_degree``: the largest group the model runs on this world (`CostModel.sp_degrees`: the
    largest power of two dividing both the world size and the model's attention heads)."""
    buckets = equal_work_buckets(seqs, cp_of)
    groups: list[CPGroup] = []
    free = world_size
    first_needed: int | None = None
    check_balance = False

    def rank_loads() -> list[float]:
        return [g.load for g in groups for _ in range(g.size)] + [0.0] * free

    while buckets:
        pick = None
        for b, bucket in enumerate(buckets):
            p, L = bucket[0]
            need = cp_of[p]
            if free >= need or any(g.size == need for g in groups):
                pick = b
                break
        if pick is None:
            break
        p, L = buckets[pick].popleft()
        need = cp_of[p]
        if first_needed is None:
            first_needed = need
        same = [g for g in groups if g.size == need]
        best = min(same, key=lambda g: g.load) if same else None
        # A fresh group's ranks carry no load yet, so it wins whenever enough ranks are free
        # and every existing candidate already has work.
        if free >= need and (best is None or best.load > 0.0):
            best = CPGroup(size=need)
            groups.append(best)
            free -= need
        assert best is not None
        best.seqs.append((p, L))
        best.load += workload(L, need)
        buckets = [bk for bk in buckets if bk]
        if need < first_needed:
            check_balance = True
        loads = rank_loads()
        if check_balance and buckets and max(loads) - min(loads) <= delta * max(loads):
            break
    leftovers = [s for bk in buckets for s in bk]

    # Trim: hand the most recent sequence of the busiest group to the next round while that
    # lowers the spread between the busiest and the idlest rank.
    while groups:
        loads = rank_loads()
        hi, lo = max(loads), min(loads)
        if hi - lo <= delta * hi or lo == 0.0:
            break
        top = max(groups, key=lambda g: g.load)
        if len(top.seqs) <= 1:
            break
        p, L = top.seqs[-1]
        w = workload(L, top.size)
        top.load -= w
        new = rank_loads()
        if max(new) - min(new) < hi - lo:
            top.seqs.pop()
            leftovers.append((p, L))
        else:
            top.load += w
            break

    # Fill idle ranks by doubling the smallest group (its sequences spread over twice the ranks).
    while free > 0 and groups:
        g = min(groups, key=lambda g: g.size)
        grow = min(2 * g.size, max_degree) - g.size
        if grow <= 0 or grow > free:
            break
        g.size += grow
        free -= grow
        g.load = sum(workload(L, g.size) for _, L in g.seqs)
    return groups, leftovers


# ------------------------------------------------------------------ the launch configuration


@dataclass(frozen=True)
class LaunchConfig:
    """The two per-launch settings of Megatron hybrid CP that this planner chooses.

    ``max_tokens_per_rank`` is Megatron's ``max_seqlen_per_dp_cp_rank``; ``ckpt_layers`` is how
    many of the first layers recompute their activations in the backward (Megatron's
    ``--recompute-granularity full --recompute-method block --recompute-num-layers k``; all
    layers is full recompute, see `recompute_flags`).
    """

    max_tokens_per_rank: int
    ckpt_layers: int

    def describe(self, num_layers: int) -> str:
        """The configuration as Megatron's settings (``plan.info["tuned_config"]``)."""
        return (
            f"max_seqlen_per_dp_cp_rank={self.max_tokens_per_rank} "
            f"recompute={recompute_flags(self.ckpt_layers, num_layers)}"
        )


def recompute_flags(ckpt_layers: int, num_layers: int) -> str:
    """Megatron's recompute flags for ``ckpt_layers`` recomputed layers, as
    granularity/method/num-layers: ``none``; ``full/block/k`` (the first k layers); with every
    layer, ``full/uniform/1`` (each layer its own recompute unit: the least memory of any
    full-granularity setting, the same recompute work as ``full/block/<num_layers>``)."""
    if ckpt_layers <= 0:
        return "none"
    if ckpt_layers >= num_layers:
        return "full/uniform/1"
    return f"full/block/{ckpt_layers}"


def max_tokens_per_rank_ladder(cost: CostModel, limit: int) -> list[int]:
    """For k = 0 .. num_layers recomputed layers, the most tokens (<= ``limit``) one rank holds
    under the memory cap: what Megatron's documentation asks ``max_seqlen_per_dp_cp_rank`` to be
    ("the maximum sequence length each rank can handle without overflowing the memory").
    0 where not even one token fits. Non-decreasing in k: recompute only frees memory."""
    one = np.ones(1, dtype=np.int64)
    out: list[int] = []
    for k in range(cost.model.num_layers + 1):

        def fits(n: int, k: int = k) -> bool:
            t = np.array([n], dtype=np.int64)
            return bool(cost.microbatch_memory(t, one, 1, k, "sequence") <= cost.memory_cap_bytes)

        out.append(largest_fitting(fits, limit))
    return out


def hybrid_cp_plan(
    batch: GlobalBatch,
    cost: CostModel,
    config: LaunchConfig,
    delta: float = 0.05,
    pack_sequences: bool = True,
    method: str = "megatron_hybrid_cp",
    mode: Mode = "fair",
) -> StepPlan:
    """The hybrid-CP plan of one global batch under one launch configuration.

    Raises `InfeasibleError` naming the sample when a sequence needs more context-parallel ranks
    than the world has at this ceiling (Megatron's scheduler cannot place it and asks the user to
    raise ``max-seqlen-per-cp-rank``) or does not fit the memory cap on its group.
    """
    W = cost.cluster.world_size
    # The largest group an aligned layout holds (3 nodes of 8 GPUs: 8); with Ulysses also one
    # the model's heads divide (`largest_cp_group`).
    max_degree = largest_cp_group(cost)
    kind = cp_attention_kind(cost)
    m, ckpt = config.max_tokens_per_rank, config.ckpt_layers
    if m < 1:
        raise InfeasibleError(f"not even one token fits a GPU with {ckpt} recomputed layers")
    cp_of: dict[int, int] = {}
    held = set(aligned_sp_degrees(W))
    if kind == "ring":
        # Megatron-Core has a CP group of every power of two below the world and the whole
        # world (hybrid_cp_schedule.py:373-374: growth to min(2 s, total_gpus)); the port caps
        # groups at the largest aligned one unless the longest sequence needs more, then the
        # source's bound, the world, holds (`megatron_cp_group_sizes`)
        held = set(megatron_cp_group_sizes(W))
        longest = int(batch.tokens.max()) if batch.n else 0
        if max_degree < gpus_needed(longest, m) <= W:
            max_degree = W
    for p in range(batch.n):
        L = int(batch.tokens[p])
        need = gpus_needed(L, m)
        if need > max_degree:
            raise InfeasibleError(
                f"sample {p} ({L} tokens) needs {need} context-parallel ranks at "
                f"max_tokens_per_rank={m}, more than the largest CP group on "
                f"{W} ranks ({max_degree}; CP groups {', '.join(map(str, sorted(held)))})"
            )
        cp_of[p] = need
    remaining: list[Seq] = sorted(
        ((p, int(batch.tokens[p])) for p in range(batch.n)), key=lambda s: (-s[1], s[0])
    )
    rounds: list[Round] = []
    expanded = 0
    while remaining:
        groups, remaining = form_round(remaining, cp_of, W, delta, max_degree)
        expanded += sum(1 for g in groups for p, _ in g.seqs if g.size > cp_of[p])
        # Aligned layout: power-of-two sizes placed largest first are always aligned.
        start = 0
        laid: list[Group] = []
        for g in sorted(groups, key=lambda g: -g.size):
            if g.size not in held:
                p0, L0 = max(g.seqs, key=lambda s: s[1])
                raise InfeasibleError(
                    f"Megatron's hybrid CP formed a CP group of {g.size} ranks on {W} ranks for "
                    f"sample {p0} ({L0} tokens) and others; "
                    f"Megatron-Core has CP groups of {', '.join(map(str, sorted(held)))} "
                    "ranks only (parallel_state.py:440-460, :1851-1860 at d98e8a64)"
                )
            members = [p for p, _ in g.seqs]
            # activation memory is additive per sample (the cost-model contract): one
            # vectorised check of every sequence alone on its group
            act = cost.sample_memory(batch.tokens[members], batch.frames[members], g.size, ckpt)
            over = np.flatnonzero(act + cost.static_memory_bytes() > cost.memory_cap_bytes)
            if len(over):
                p = members[int(over[0])]
                raise InfeasibleError(
                    f"sample {p} ({int(batch.tokens[p])} tokens) does not fit the memory cap on "
                    f"{g.size} ranks: max_tokens_per_rank={m} is too large for this model with "
                    f"{ckpt} recomputed layers"
                )
            if pack_sequences:
                budget = max(m * g.size, max(L for _, L in g.seqs))
                packs = pack_under_budget(batch, members, cost, g.size, ckpt, budget)
            else:
                packs = [(p,) for p in members]
            k = kind if g.size > 1 else "ulysses"
            mbs = [MicroBatch(samples=pk, ckpt_layers=ckpt, sp_kind=k) for pk in packs]
            laid.append(Group(start=start, size=g.size, micro_batches=mbs))
            start += g.size
        rounds.append(Round(groups=laid))
    L_model = cost.model.num_layers
    info: dict[str, Any] = {
        "max_tokens_per_rank": m,
        "recompute": recompute_flags(ckpt, L_model),
        "ckpt_layers": ckpt,
        "rounds": len(rounds),
        "cp_sizes_needed": sorted({cp_of[p] for p in cp_of}),
        "sequences_on_expanded_groups": expanded,
        "pack_sequences": pack_sequences,
        "scheduler": "balanced_cp",
        "cp_attention": kind,
    }
    return StepPlan(
        world_size=W, rounds=rounds, method=method, mode=mode, step=batch.step, info=info
    )


# ------------------------------------------- DefaultDynamicCPScheduler (Megatron-LM dev branch)
# Rules of `next_hdp_group_packing_aware` (data_schedule_utils.py:592-831 at d48bd6be), called
# by `DefaultDynamicCPScheduler.get_groups_and_subsamples` (data_schedule.py:419-447) once per
# micro-batch until every sequence is placed. One call forms one micro-batch over all DPxCP
# ranks: a set of CP groups (disjoint rank blocks), each running its sequences packed (THD).

DYNAMIC_CP_CAP_DELTA = 0.05  # `_DYNAMIC_CP_WORKLOAD_CAP_DELTA`, data_schedule_utils.py:12


def dynamic_cp_gpus_needed(tokens: int, max_tokens_per_rank: int, min_cp_size: int = 1) -> int:
    """`dcp_gpus_needed` (data_schedule_utils.py:933-936): the next power of two of
    L / max_tokens_per_rank, at least 1 and at least ``min_cp_size``."""
    return max(min_cp_size, gpus_needed(tokens, max_tokens_per_rank))


@dataclass
class DynamicGroup:
    """One CP group of a dynamic-CP micro-batch: its ranks (a contiguous block), its sequences
    and the tokens each of its ranks holds (sum of L / size)."""

    ranks: list[int]
    seqs: list[Seq] = field(default_factory=list)
    per_rank_tokens: float = 0.0

    @property
    def size(self) -> int:
        return len(self.ranks)


def dynamic_cp_micro_batch(
    seqs: list[Seq],
    total_ranks: int,
    max_tokens_per_rank: int,
    min_cp_size: int = 1,
    max_cp_size: int | None = None,
) -> tuple[list[DynamicGroup], list[Seq]]:
    """One micro-batch of `DefaultDynamicCPScheduler` over ``total_ranks`` DPxCP ranks: its CP
    groups (in creation order) and the sequences left for the next micro-batch (in the order
    they were met). ``max_cp_size`` caps a group below the world (None: the world, as the
    source; `DynamicCPPlanner` passes the largest group the plan layout holds).

    The rules, each at data_schedule_utils.py (d48bd6be):

    - sequences longest first (:626); a rank's workload is L^2 / cp (:623-624); the micro-batch's
      cap is tallest x max_tokens_per_rank x 1.05 (:627-628);
    - the tallest opens a group of its `dynamic_cp_gpus_needed` ranks 0.. (:640-657);
    - every other sequence tries CP sizes from the least it needs, doubling up to the world
      (:664-697); at each size, every existing group of that size whose ranks stay within
      max_tokens_per_rank tokens (:668-680), then a new group on the free ranks of least
      workload (:682-695); the placement of least projected busiest-rank workload within the
      cap wins, the first met on a tie (strict ``<``); none: left over (:699-701);
    - empty ranks are filled by doubling a smallest group (``min(2 s, world)`` ranks, the
      first such group that fits before the world's end, the groups after it shifted right;
      :724-795) until none is empty; when no group can grow, the whole micro-batch is replaced
      by one group of every rank holding the sequences, longest first, whose per-rank tokens
      fit, the rest left over (:797-824, :826-829).
    """
    if not seqs:
        return [], []
    top = total_ranks if max_cp_size is None else min(max_cp_size, total_ranks)
    m = max_tokens_per_rank
    order = sorted(seqs, key=lambda s: -s[1])  # stable: equal lengths keep their order
    cap = float(order[0][1]) * float(m) * (1.0 + DYNAMIC_CP_CAP_DELTA)
    load = [0.0] * total_ranks
    owner: list[int | None] = [None] * total_ranks
    groups: list[DynamicGroup] = []

    def place(g: DynamicGroup, seq: Seq) -> None:
        g.seqs.append(seq)
        g.per_rank_tokens += seq[1] / g.size
        for r in g.ranks:
            load[r] += workload(seq[1], g.size)

    first = order[0]
    need = dynamic_cp_gpus_needed(first[1], m, min_cp_size)
    if need > top:
        raise InfeasibleError(
            f"sample {first[0]} ({first[1]} tokens) needs {need} CP ranks at "
            f"max_tokens_per_rank={m}; at most {top} are available"
        )
    groups.append(DynamicGroup(ranks=list(range(need))))
    for r in groups[0].ranks:
        owner[r] = 0
    place(groups[0], first)
    leftovers: list[Seq] = []
    for seq in order[1:]:
        L = seq[1]
        best: tuple[float, int, DynamicGroup | None, list[int] | None] | None = None
        cp = dynamic_cp_gpus_needed(L, m, min_cp_size)
        while cp <= top:
            w = workload(L, cp)
            for g in groups:
                if g.size != cp or g.per_rank_tokens + L / cp > m:
                    continue
                members = set(g.ranks)
                projected = max(x + w if r in members else x for r, x in enumerate(load))
                if projected <= cap and (best is None or projected < best[0]):
                    best = (projected, cp, g, None)
            free = [r for r in range(total_ranks) if owner[r] is None]
            if len(free) >= cp:
                chosen = sorted(free, key=lambda r: load[r])[:cp]
                picked = set(chosen)
                projected = max(x + w if r in picked else x for r, x in enumerate(load))
                if projected <= cap and (best is None or projected < best[0]):
                    best = (projected, cp, None, chosen)
            cp *= 2
        if best is None:
            leftovers.append(seq)
            continue
        _, cp, target, new_ranks = best
        if target is None:
            assert new_ranks is not None
            target = DynamicGroup(ranks=new_ranks)
            for r in new_ranks:
                owner[r] = len(groups)
            groups.append(target)
        place(target, seq)

    def grow_once() -> bool:
        busy = {r for g in groups for r in g.ranks}
        empty = [r for r in range(total_ranks) if r not in busy]
        if not empty:
            return False
        smallest = min(g.size for g in groups)
        grown = min(2 * smallest, top)
        extra = grown - smallest
        for g in groups:
            if g.size != smallest or extra <= 0:
                continue
            end = g.ranks[-1]
            if end + 1 > empty[0] or end + extra >= total_ranks:
                continue
            for other in groups:
                if other is not g and min(other.ranks) > end:
                    other.ranks = [r + extra for r in other.ranks]
            g.ranks = list(range(g.ranks[0], end + extra + 1))
            g.per_rank_tokens = sum(L for _, L in g.seqs) / g.size
            return True
        return False

    while any(r not in {x for g in groups for x in g.ranks} for r in range(total_ranks)):
        if not grow_once():
            # one group of every DPxCP rank (the source's fallback, :797-824)
            whole = DynamicGroup(ranks=list(range(total_ranks)))
            rest: list[Seq] = []
            for seq in order:
                if whole.per_rank_tokens + seq[1] / total_ranks <= m:
                    whole.seqs.append(seq)
                    whole.per_rank_tokens += seq[1] / total_ranks
                else:
                    rest.append(seq)
            if not whole.seqs:
                raise InfeasibleError(
                    f"no sequence fits one group of all {total_ranks} ranks at "
                    f"max_tokens_per_rank={m} (Megatron asserts here: raise "
                    "--max-seqlen-per-dp-cp-rank)"
                )
            return [whole], rest
    return groups, leftovers


def dynamic_cp_plan(
    batch: GlobalBatch,
    cost: CostModel,
    config: LaunchConfig,
    min_cp_size: int = 1,
    method: str = "megatron_hybrid_cp",
    mode: Mode = "fair",
) -> StepPlan:
    """The plan of one global batch under `DefaultDynamicCPScheduler`: one round per scheduled
    micro-batch (`dynamic_cp_micro_batch` until every sequence is placed,
    data_schedule.py:428-437), each CP group running its sequences as one packed micro-batch
    (`build_packed_microbatches`, data_schedule.py:345), a barrier between rounds (every rank
    runs every micro-batch). Groups are laid out largest first so the layout is aligned (the
    source's contiguous blocks in creation order; only positions change).

    With ring attention (`cp_attention_kind`) a group may be the whole world (Megatron-Core's
    DP-with-CP group; 3 nodes of 8: a ring of 24), reached by the source's growth or its
    whole-world fallback.

    Raises `InfeasibleError` for a sequence longer than the largest group holds, a group of a
    size Megatron-Core has no process group for (`megatron_cp_group_sizes`; 24 ranks: 16) or
    the plan layout cannot hold (Ulysses: no power of two dividing the world), or a micro-batch
    over the memory cap.
    """
    W = cost.cluster.world_size
    top = largest_cp_group(cost)
    kind = cp_attention_kind(cost)
    m, ckpt = config.max_tokens_per_rank, config.ckpt_layers
    if m < 1:
        raise InfeasibleError(f"not even one token fits a GPU with {ckpt} recomputed layers")
    remaining: list[Seq] = sorted(
        ((p, int(batch.tokens[p])) for p in range(batch.n)), key=lambda s: (-s[1], s[0])
    )
    # The port caps groups at the largest aligned one (on a world that is no power of two the
    # source may form groups Megatron-Core has no process group for); a ring-attention run
    # whose longest sequence needs more ranks than that takes the source's own bound, the world
    # (data_schedule_utils.py:664-697, :724-795: sizes up to and growth to ``total_ranks``).
    sizes_held = set(aligned_sp_degrees(W))
    if kind == "ring" and remaining:
        sizes_held = set(megatron_cp_group_sizes(W))
        if dynamic_cp_gpus_needed(remaining[0][1], m, min_cp_size) > top:
            top = W
    rounds: list[Round] = []
    sizes: set[int] = set()
    while remaining:
        groups, left = dynamic_cp_micro_batch(remaining, W, m, min_cp_size, top)
        if len(left) == len(remaining):
            raise InfeasibleError(f"dynamic CP placed none of {len(left)} sequences (m={m})")
        remaining = left
        laid: list[Group] = []
        start = 0
        for g in sorted(groups, key=lambda g: -g.size):
            if g.size not in sizes_held:
                p0, L0 = max(g.seqs, key=lambda s: s[1])
                raise InfeasibleError(
                    f"Megatron's dynamic CP formed a CP group of {g.size} ranks on {W} ranks for "
                    f"sample {p0} ({L0} tokens); "
                    f"Megatron-Core has CP groups of {', '.join(map(str, sorted(sizes_held)))} "
                    "ranks only (parallel_state.py:440-460, :1851-1860 at d98e8a64)"
                    if kind == "ring"
                    else f"Megatron's dynamic CP formed a CP group of {g.size} ranks (its "
                    f"whole-world fallback on {W} ranks); plans hold power-of-two groups "
                    "dividing the world"
                )
            members = [p for p, _ in g.seqs]
            mem = microbatch_memory(
                cost, batch.tokens[members], batch.frames[members], g.size, ckpt, "sequence"
            )
            if mem > cost.memory_cap_bytes:
                raise InfeasibleError(
                    f"samples {members[:5]} packed on {g.size} ranks exceed the memory cap: "
                    f"max_tokens_per_rank={m} is too large for this model with {ckpt} "
                    "recomputed layers"
                )
            k = kind if g.size > 1 else "ulysses"
            mb = MicroBatch(samples=tuple(members), ckpt_layers=ckpt, sp_kind=k)
            laid.append(Group(start=start, size=g.size, micro_batches=[mb]))
            sizes.add(g.size)
            start += g.size
        rounds.append(Round(groups=laid))
    info: dict[str, Any] = {
        "max_tokens_per_rank": m,
        "recompute": recompute_flags(ckpt, cost.model.num_layers),
        "ckpt_layers": ckpt,
        "rounds": len(rounds),
        "cp_sizes": sorted(sizes),
        "scheduler": "default_dynamic_cp",
        "min_cp_size": min_cp_size,
        "cp_attention": kind,
    }
    return StepPlan(
        world_size=W,
        rounds=rounds,
        method=method,
        mode=mode,
        step=batch.step,
        info=info,
        round_barrier=True,
    )


def candidate_configs(
    longest: int,
    max_degree: int,
    ladder: list[int],
    allowed_ckpt: list[int],
    pinned_budget: int | None = None,
) -> list[LaunchConfig]:
    """The launch configurations a user tries, least recompute first.

    Ceilings (``max_seqlen_per_dp_cp_rank``): with ``pinned_budget`` just that one; otherwise
    every value from ceil(longest / ``max_degree``) — the smallest that still places the longest
    sequence on the largest group the model runs (``max_degree``), Megatron's documented
    starting point "maximum sequence length / context parallel size" — up to the most a rank
    holds with the allowed recompute: that starting point, the powers of two between, and the
    memory limit of every allowed recompute setting (``ladder[k]``). Each ceiling takes the
    least allowed recompute under which it fits (more recompute only adds time: the plan is the
    same, since no rank holds more than the ceiling); a pinned ceiling that fits none takes the
    most recompute allowed and fails in the plan, naming the sample. Empty when no ceiling
    places the longest sequence.
    """
    ks = sorted(allowed_ckpt)
    if pinned_budget is not None:
        k = next((k for k in ks if ladder[k] >= pinned_budget), ks[-1])
        return [LaunchConfig(pinned_budget, k)]
    lo = max(1, -(-longest // max_degree))
    hi = max(ladder[k] for k in ks)
    if lo > hi:
        return []
    budgets = {lo} | {ladder[k] for k in ks if ladder[k] >= lo}
    p2 = 1
    while p2 <= hi:
        if p2 >= lo:
            budgets.add(p2)
        p2 *= 2
    out = [LaunchConfig(m, next(k for k in ks if ladder[k] >= m)) for m in budgets]
    return sorted(out, key=lambda c: (c.ckpt_layers, -c.max_tokens_per_rank))


# -------------------------------------------------------------------------------- the planner


class MegatronHybridCP(Planner):
    """Megatron-Core hybrid (dynamic) context parallelism from its launch flags.

    Args:
        mode: labels runs only (the reference takes one optimizer step per global batch).
        max_tokens_per_rank: ``--max-seqlen-per-dp-cp-rank``; None = its documented meaning,
            the most tokens one rank holds under the memory cap with the launch's recompute
            (`max_tokens_fitting_one_rank`; for the tuned variant: searched).
        recompute: ``none`` (the example launch's, Megatron's default), ``selective`` (the
            first half of the layers, the suite's stand-in), ``full`` (every layer, Megatron's
            ``full/uniform/1``), ``block`` (the first ``recompute_num_layers`` layers); the
            tuned variant also takes ``auto`` (searched: no recompute, or the first k layers).
        recompute_num_layers: with ``recompute: block``, Megatron's ``--recompute-num-layers``.
        delta: balance slack of a round (the reference's 5%).
        pack_sequences: True packs a group's sequences of a round into THD micro-batches of at
            most ``max_tokens_per_rank`` tokens per rank (Megatron's packed-sequence path);
            False runs every sequence as its own forward/backward (the schedule as read).
        tune_batches: how many first batches the tuning scores (summed predicted step time):
            a short trial run; each batch is priced once per configuration.
        shortlist: how many of the fastest configurations on the first batch are tried on the
            later tuning batches.
        round_barrier: every rank waits at the end of each of the schedule's groups (our
            rounds), as the reference does (`hybrid_cp_schedule.py:616`); False lets ranks flow
            into the next round as soon as their own group is free.
        scheduler: ``--sequence-packing-scheduler``: ``balanced_cp`` (`BalancedCPScheduler`,
            d98e8a64) or ``default_dynamic_cp`` (the dev branch's `DefaultDynamicCPScheduler`,
            d48bd6be data_schedule.py:407-447, which ``--dynamic-context-parallel`` selects,
            arguments.py:1554-1555; `dynamic_cp_plan`). The dynamic scheduler always packs
            and has its own fixed slack (5%), so it refuses ``pack_sequences: false`` and a
            ``delta`` other than 0.05.
        min_cp_size: ``--min-dynamic-context-parallel-size`` (default 1,
            model_parallel_config.py:91 at d48bd6be): the least CP size of any sequence under
            ``default_dynamic_cp``; ``balanced_cp`` has no such flag and refuses another value.
    """

    name = "megatron_hybrid_cp"
    source = (
        'Megatron-Core dynamic ("hybrid") CP (NVIDIA/Megatron-LM d98e8a64, hybrid_cp_schedule.py '
        "BalancedCPScheduler; scheduler=default_dynamic_cp: the dev branch's "
        "DefaultDynamicCPScheduler, d48bd6be data_schedule.py:407), ring-attention CP. Defaults "
        "are launch flags: max_seqlen_per_dp_cp_rank = what one rank holds (its documented "
        "meaning, model_parallel_config.py:111-118), no recompute as "
        "examples/dynamic_context_parallel/ launches, full recompute once that cannot place the "
        "longest sequence (the relaunch); the scheduler's delta 0.05."
    )
    search = False  # the tuned variant searches the launch flags on the cost model
    default_recompute: str | None = None  # none, or full when none cannot place the longest
    OPTION_MINIMA = {"max_tokens_per_rank": 1, "tune_batches": 1, "shortlist": 1}

    def __init__(
        self,
        mode: Mode = "fair",
        max_tokens_per_rank: int | None = None,
        recompute: str | None = None,
        recompute_num_layers: int | None = None,
        delta: float = 0.05,
        pack_sequences: bool = True,
        tune_batches: int = 3,
        shortlist: int = 5,
        round_barrier: bool = True,
        scheduler: str = "balanced_cp",
        min_cp_size: int = 1,
    ) -> None:
        super().__init__(mode)
        if scheduler not in SCHEDULERS:
            raise ConfigError(f"scheduler={scheduler!r}; expected one of {', '.join(SCHEDULERS)}")
        if min_cp_size < 1 or min_cp_size & (min_cp_size - 1):
            raise ConfigError(f"min_cp_size={min_cp_size}; expected a power of two >= 1")
        if scheduler == "balanced_cp" and min_cp_size != 1:
            raise ConfigError(
                f"min_cp_size={min_cp_size} is a flag of scheduler=default_dynamic_cp "
                "(--min-dynamic-context-parallel-size); balanced_cp has none"
            )
        if scheduler == "default_dynamic_cp" and (not pack_sequences or delta != 0.05):
            raise ConfigError(
                f"scheduler=default_dynamic_cp always packs with its own 5% slack; got "
                f"pack_sequences={pack_sequences}, delta={delta} (expected true and 0.05)"
            )
        recompute = recompute or self.default_recompute
        self._relaunch = recompute is None  # none, full when a launch without cannot run
        self._relaunched = False  # a launch without recompute stopped: full recompute from now
        recompute = recompute or "none"
        if recompute == "auto" and not self.search:
            raise ConfigError(
                "recompute=auto searches the launch flags: that is the tuned variant "
                "(method=megatron_hybrid_cp_tuned); megatron_hybrid_cp takes none, selective, "
                "full or block"
            )
        if max_tokens_per_rank is not None and max_tokens_per_rank < 1:
            raise ConfigError(
                f"max_tokens_per_rank={max_tokens_per_rank}; expected a positive token count or "
                "null"
            )
        if not 0.0 <= delta < 1.0:
            raise ConfigError(f"delta={delta}; expected a fraction in [0, 1)")
        if recompute == "block":
            if recompute_num_layers is None or recompute_num_layers < 0:
                raise ConfigError(
                    f"recompute=block needs recompute_num_layers >= 0 (got {recompute_num_layers})"
                )
        elif recompute_num_layers is not None:
            raise ConfigError(
                f"recompute_num_layers is for recompute=block only (recompute={recompute!r})"
            )
        elif recompute != "auto":
            ckpt_layers_for(recompute, 1)  # ConfigError naming the choices
        if tune_batches < 1:
            raise ConfigError(f"tune_batches={tune_batches}; expected >= 1")
        if shortlist < 1:
            raise ConfigError(f"shortlist={shortlist}; expected >= 1")
        self.max_tokens_per_rank = max_tokens_per_rank
        self.recompute = recompute
        self.recompute_num_layers = recompute_num_layers
        self.delta = delta
        self.pack_sequences = pack_sequences
        self.tune_batches = tune_batches
        self.shortlist = shortlist
        self.round_barrier = round_barrier
        self.scheduler = scheduler
        self.min_cp_size = min_cp_size
        self._seen: list[GlobalBatch] = []
        self._best: LaunchConfig | None = None
        self._search: list[tuple[LaunchConfig, float | None]] = []
        self._shortlist: list[LaunchConfig] = []
        self._cost_key = ""
        self._tune_s = 0.0
        self._prices: dict[tuple[int, LaunchConfig], float | InfeasibleError] = {}
        self._ladder: tuple[int, list[int]] | None = None
        self._longest = 0

    def allowed_ckpt(self, num_layers: int) -> list[int]:
        """Recomputed-layer counts the search may use (all of 0 .. num_layers under ``auto``)."""
        if self.recompute == "auto":
            return list(range(num_layers + 1))
        if self.recompute == "block":
            assert self.recompute_num_layers is not None
            if self.recompute_num_layers > num_layers:
                raise ConfigError(
                    f"recompute_num_layers={self.recompute_num_layers} exceeds the model's "
                    f"{num_layers} layers"
                )
            return [self.recompute_num_layers]
        return [ckpt_layers_for(self.recompute, num_layers)]

    def fixed_plan(self, batch: GlobalBatch, cost: CostModel, config: LaunchConfig) -> StepPlan:
        """The plan under one launch configuration (no tuning), by the launch's scheduler."""
        if self.scheduler == "default_dynamic_cp":
            plan = dynamic_cp_plan(batch, cost, config, self.min_cp_size, self.name, self.mode)
        else:
            plan = hybrid_cp_plan(
                batch, cost, config, self.delta, self.pack_sequences, self.name, self.mode
            )
        plan.round_barrier = self.round_barrier
        return plan

    def candidates(self, batches: list[GlobalBatch], cost: CostModel) -> list[LaunchConfig]:
        """The configurations to try on ``batches`` (see `candidate_configs`).

        Raises `InfeasibleError` naming the longest sample when no configuration of the real
        system runs it: longer than the whole world holds even with the most recompute allowed.
        """
        W = cost.cluster.world_size
        num_layers = cost.model.num_layers
        ks = self.allowed_ckpt(num_layers)
        where = [(i, int(np.argmax(b.tokens))) for i, b in enumerate(batches) if b.n]
        bi, p = max(where, key=lambda ip: int(batches[ip[0]].tokens[ip[1]]), default=(0, 0))
        longest = int(batches[bi].tokens[p]) if where else 1
        # a ceiling above the longest sequence still changes the packing, so the ladder reaches
        # the model's context length
        limit = max(longest, cost.model.max_seq_len, self.max_tokens_per_rank or 0)
        if self._ladder is None or self._ladder[0] != limit:
            self._ladder = (limit, max_tokens_per_rank_ladder(cost, limit))
        ladder = self._ladder[1]
        top = largest_cp_group(cost)
        cands = candidate_configs(longest, top, ladder, ks, self.max_tokens_per_rank)
        if not cands:
            k = max(ks, key=lambda k: ladder[k])
            raise InfeasibleError(
                f"sample {p} ({longest} tokens) cannot run on {W} ranks with any hybrid-CP "
                f"configuration: with recompute {recompute_flags(k, num_layers)} one rank holds "
                f"at most {ladder[k]} tokens, so one sequence (on at most {top} ranks, the "
                f"largest of the CP groups {', '.join(map(str, aligned_sp_degrees(W)))} the "
                f"search tries on {W}) can have at most {ladder[k] * top} tokens"
            )
        return cands

    def tune(
        self, batches: list[GlobalBatch], cost: CostModel, use_shortlist: bool = True
    ) -> LaunchConfig:
        """The fastest configuration over ``batches`` (summed predicted step time).

        On the first batch every candidate is priced and the ``shortlist`` fastest are kept; the
        later tuning batches price only those (a user's longer trial of the most promising
        settings), unless none of them runs every batch, or ``use_shortlist`` is off (a retune
        after a failure): then every candidate is priced on every batch.
        """
        t0 = time.process_time()  # CPU time: what the run loop books as offline tuning
        cands = self.candidates(batches, cost)
        best: LaunchConfig | None = None
        if use_shortlist and len(batches) > 1 and self._shortlist:
            best, results, error = self.fastest(
                [c for c in cands if c in self._shortlist], batches, cost
            )
        if best is None:
            best, results, error = self.fastest(cands, batches, cost)
        if best is None:
            assert error is not None
            raise error
        if len(batches) == 1:
            priced = sorted((t, i) for i, (_, t) in enumerate(results) if t is not None)
            self._shortlist = [results[i][0] for _, i in priced[: self.shortlist]]
        self._search = results
        self._tune_s = time.process_time() - t0
        return best

    def fastest(
        self, cands: list[LaunchConfig], batches: list[GlobalBatch], cost: CostModel
    ) -> tuple[
        LaunchConfig | None, list[tuple[LaunchConfig, float | None]], InfeasibleError | None
    ]:
        """The candidate with the least summed price over ``batches`` (None when none runs them
        all), every candidate's sum (None where it cannot run), and the first error met."""
        results: list[tuple[LaunchConfig, float | None]] = []
        best: tuple[float, LaunchConfig] | None = None
        first_error: InfeasibleError | None = None
        for c in cands:
            prices = [self.price(i, b, cost, c) for i, b in enumerate(batches)]
            failed = [x for x in prices if isinstance(x, InfeasibleError)]
            if failed:
                first_error = first_error or failed[0]
                results.append((c, None))
                continue
            t = sum(x for x in prices if not isinstance(x, InfeasibleError))
            results.append((c, t))
            # strict '<': candidates come least recompute first, so a tie keeps less recompute
            if best is None or t < best[0]:
                best = (t, c)
        return (best[1] if best else None), results, first_error

    def price(
        self, index: int, batch: GlobalBatch, cost: CostModel, config: LaunchConfig
    ) -> float | InfeasibleError:
        """Predicted step time of tuning batch ``index`` under ``config`` (kept: a trial run
        measured once), or the error that stops it. Priced as the executors run the plan (with the
        barrier between rounds when the plan has one), so the winner is the fastest
        configuration as measured here."""
        key = (index, config)
        if key not in self._prices:
            try:
                plan = self.fixed_plan(batch, cost, config)
                self._prices[key] = estimate_step_time(
                    plan, batch, cost, round_barrier=plan.round_barrier
                )
            except InfeasibleError as exc:
                self._prices[key] = exc
        return self._prices[key]

    def launch_config(self, cost: CostModel, longest: int = 0) -> LaunchConfig:
        """The launch's flags: the pinned recompute, and the pinned ceiling or the documented
        one (the most tokens one rank holds with that recompute). With the recompute left to
        the default: none, unless that ceiling cannot place a sequence of ``longest`` tokens
        on the largest group the world holds, or a launch without it stopped; then full
        recompute (``full/uniform/1``: the
        user's relaunch after the scheduler stops, hybrid_cp_schedule.py:369-370)."""
        L = cost.model.num_layers
        ckpt = self.allowed_ckpt(L)[0]
        m = self.max_tokens_per_rank or max_tokens_fitting_one_rank(cost, ckpt)
        top = largest_cp_group(cost)
        if self._relaunch and (self._relaunched or m * top < longest):
            m = self.max_tokens_per_rank or max_tokens_fitting_one_rank(cost, L)
            return LaunchConfig(int(m), L)
        return LaunchConfig(int(m), ckpt)

    def plan(self, batch: GlobalBatch, cost: CostModel) -> StepPlan:
        if not self.search:
            # the launch is for the longest sequence seen so far: it never goes back
            self._longest = max(self._longest, int(batch.tokens.max()) if batch.n else 0)
            config = self.launch_config(cost, self._longest)
            try:
                try:
                    plan = self.fixed_plan(batch, cost, config)
                except InfeasibleError:
                    if not self._relaunch or self._relaunched:
                        raise
                    # the scheduler stopped (hybrid_cp_schedule.py:369-370): the user relaunches
                    # with full recompute, which stays on
                    self._relaunched = True
                    config = self.launch_config(cost, self._longest)
                    plan = self.fixed_plan(batch, cost, config)
            except InfeasibleError as exc:
                raise InfeasibleError(
                    f"{exc} (launch {config.describe(cost.model.num_layers)}; Megatron stops "
                    "here too, hybrid_cp_schedule.py:369-370: relaunch with more recompute, "
                    "e.g. method.recompute=full, or method=megatron_hybrid_cp_tuned)"
                ) from None
            plan.info.update(launch_config=config.describe(cost.model.num_layers), tune_s=0.0)
            return plan
        key = json.dumps(cost.describe(), sort_keys=True, default=str)
        if key != self._cost_key:  # a different cost model or cluster: tune afresh
            self._cost_key, self._seen, self._best = key, [], None
            self._prices, self._ladder, self._shortlist = {}, None, []
        tuned_now = False
        if self._best is None or len(self._seen) < self.tune_batches:
            self._seen.append(batch)
            self._best = self.tune(self._seen, cost)
            tuned_now = True
        retuned = False
        try:
            plan = self.fixed_plan(batch, cost, self._best)
        except InfeasibleError:
            # a longer sequence than any seen while tuning: the user relaunches with a new
            # configuration that runs every batch seen so far
            self._seen.append(batch)
            self._best = self.tune(self._seen, cost, use_shortlist=False)
            plan = self.fixed_plan(batch, cost, self._best)
            retuned = True
        plan.info.update(
            tuned_config=self._best.describe(cost.model.num_layers),
            candidates=len(self._search),
            candidates_feasible=sum(1 for _, t in self._search if t is not None),
            tuned_on_batches=len(self._seen),
            retuned=retuned,
            # the search is offline work a user does once per workload; reports may leave it out
            # of the per-step planning time
            tune_s=self._tune_s if (tuned_now or retuned) else 0.0,
        )
        return plan


class MegatronHybridCPTuned(MegatronHybridCP):
    """`MegatronHybridCP` with its two launch flags searched on the cost model once per
    workload (``recompute: auto`` by default): every ceiling that still places the longest
    sequence on the world, each with the least recompute under which it fits, priced on the
    first ``tune_batches`` batches; the fastest wins, and a later batch it cannot run retunes.
    Not how Megatron is run: an upper reference for what the best fixed launch could do. The
    search time is ``plan.info["tune_s"]`` (the run records it as offline tuning,
    ``offline_tune_s``)."""

    name = "megatron_hybrid_cp_tuned"
    source = (
        "megatron_hybrid_cp with its two launch flags searched on the cost model: an upper "
        "reference, not how Megatron is run. Defaults: every per-rank ceiling from the one "
        "placing the longest sequence up, each with the least recompute that fits, priced on "
        "the first 3 batches; the search is offline tuning (tune_s), not charged per step."
    )
    search = True
    default_recompute = "auto"
