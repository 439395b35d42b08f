"""`megatron_hybrid_cp`: Megatron-Core's dynamic ("hybrid") context parallelism, reimplemented
from its public description and code (NVIDIA/Megatron-LM,
megatron/core/pipeline_parallel/hybrid_cp_schedule.py, `BalancedCPScheduler`).

Per sequence, a context-parallel group of 2^ceil(log2(L / max_tokens_per_rank)) ranks. The
global batch is cut into *groups* (our rounds; the reference puts a barrier between them):
sequences, longest first, are dealt to a new CP group while ranks are free, else to the
least-loaded existing group of exactly the size they need, with the load estimated as L^2 / cp;
a round closes early once it is balanced within ``delta``; the most recent sequence of the
busiest group is handed to the next round while that reduces the imbalance; idle ranks are
filled by doubling the smallest groups. A group's sequences of a round are packed (THD) into
micro-batches of at most ``max_tokens_per_rank`` tokens per rank; ``pack_sequences=False`` runs
each sequence alone, as the schedule read does. See baselines/README.md for the deviations.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from baselines.scheduling import (
    ckpt_layers_for,
    max_tokens_fitting_one_rank,
    pack_under_budget,
)
from dcp_bench.errors import ConfigError, InfeasibleError
from dcp_bench.plan import Group, MicroBatch, Mode, Round, StepPlan
from dcp_bench.planners.base import Planner

if TYPE_CHECKING:
    from dcp_bench.batch import GlobalBatch
    from dcp_bench.cost.base import CostModel

Seq = tuple[int, int]  # (position in the batch, tokens)


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
    seqs: list[Seq], cp_of: dict[int, int], world_size: int, delta: float
) -> tuple[list[CPGroup], list[Seq]]:
    """One reference "group" (our round): the CP groups with their sequences, and the leftovers."""
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
        grow = min(2 * g.size, world_size) - g.size
        if grow <= 0 or grow > free:
            break
        g.size += grow
        free -= grow
        g.load = sum(workload(L, g.size) for _, L in g.seqs)
    return groups, leftovers


class MegatronHybridCP(Planner):
    """Megatron-Core hybrid (dynamic) context parallelism.

    Args:
        mode: labels runs only (the reference takes one optimizer step per global batch).
        max_tokens_per_rank: the reference's ``max_seqlen_per_dp_cp_rank``; None = the longest
            sequence that fits one GPU under the memory cap with the chosen recompute policy.
        recompute: "full", "selective" (first half of the layers) or "none".
        delta: balance slack of a round (the reference's 5%).
        pack_sequences: True packs a group's sequences of a round into THD micro-batches of at
            most ``max_tokens_per_rank`` tokens per rank (Megatron's packed-sequence path);
            False runs every sequence as its own forward/backward (the schedule as read).
    """

    name = "megatron_hybrid_cp"

    def __init__(
        self,
        mode: Mode = "fair",
        max_tokens_per_rank: int | None = None,
        recompute: str = "none",
        delta: float = 0.05,
        pack_sequences: bool = True,
    ) -> None:
        super().__init__(mode)
        if max_tokens_per_rank is not None and max_tokens_per_rank < 1:
            raise ConfigError(f"max_tokens_per_rank={max_tokens_per_rank}; expected a positive token count or null")
        if not 0.0 <= delta < 1.0:
            raise ConfigError(f"delta={delta}; expected a fraction in [0, 1)")
        ckpt_layers_for(recompute, 1)
        self.max_tokens_per_rank = max_tokens_per_rank
        self.recompute = recompute
        self.delta = delta
        self.pack_sequences = pack_sequences

    def plan(self, batch: GlobalBatch, cost: CostModel) -> StepPlan:
        W = cost.cluster.world_size
        ckpt = ckpt_layers_for(self.recompute, cost.model.num_layers)
        m = self.max_tokens_per_rank or max_tokens_fitting_one_rank(cost, ckpt)
        if m < 1:
            raise InfeasibleError(f"not even one token fits a GPU with {ckpt} checkpointed layers")
        cp_of: dict[int, int] = {}
        for p in range(batch.n):
            L = int(batch.tokens[p])
            need = gpus_needed(L, m)
            if need > W:
                raise InfeasibleError(
                    f"sample {p} ({L} tokens) needs {need} context-parallel ranks at "
                    f"max_tokens_per_rank={m}, more than the world ({W} ranks)"
                )
            cp_of[p] = need
        remaining: list[Seq] = sorted(
            ((p, int(batch.tokens[p])) for p in range(batch.n)), key=lambda s: (-s[1], s[0])
        )
        rounds: list[Round] = []
        expanded = 0
        while remaining:
            groups, remaining = form_round(remaining, cp_of, W, self.delta)
            expanded += sum(1 for g in groups for p, _ in g.seqs if g.size > cp_of[p])
            # Aligned layout: power-of-two sizes placed largest first are always aligned.
            start = 0
            laid: list[Group] = []
            for g in sorted(groups, key=lambda g: -g.size):
                members = [p for p, _ in g.seqs]
                # activation memory is additive per sample (the cost-model contract): one
                # vectorised check of every sequence alone on its group
                act = cost.sample_memory(batch.tokens[members], batch.frames[members], g.size, ckpt)
                over = np.flatnonzero(act + cost.static_memory_bytes() > cost.memory_cap_bytes)
                if len(over):
                    p = members[int(over[0])]
                    raise InfeasibleError(
                        f"sample {p} ({int(batch.tokens[p])} tokens) does not fit the memory cap on "
                        f"{g.size} ranks: max_tokens_per_rank={m} is too large for this model"
                    )
                if self.pack_sequences:
                    packs = pack_under_budget(batch, members, cost, g.size, ckpt, max(m * g.size, max(L for _, L in g.seqs)))
                else:
                    packs = [(p,) for p in members]
                mbs = [MicroBatch(samples=pk, ckpt_layers=ckpt) for pk in packs]
                laid.append(Group(start=start, size=g.size, micro_batches=mbs))
                start += g.size
            rounds.append(Round(groups=laid))
        info: dict[str, Any] = {
            "max_tokens_per_rank": m,
            "recompute": self.recompute,
            "ckpt_layers": ckpt,
            "rounds": len(rounds),
            "cp_sizes_needed": sorted({cp_of[p] for p in cp_of}),
            "sequences_on_expanded_groups": expanded,
            "pack_sequences": self.pack_sequences,
        }
        return StepPlan(world_size=W, rounds=rounds, method=self.name, mode=self.mode, step=batch.step, info=info)
