"""`wlb_llm`: WLB-LLM's workload-balanced variable-length packing with outlier delay (Wang et
al., "WLB-LLM: Workload-Balanced 4D Parallelism for Large Language Model Training", OSDI'25),
reimplemented from the paper's description.

Fixed SP (context-parallel) degree. Instead of packing every micro-batch to the same token
count, sequences are packed so that every micro-batch carries about the same *workload*
(predicted time, linear + quadratic in length) under a token capacity; micro-batches are spread
evenly over the data-parallel replicas. Outlier delay: sequences far longer than the rest are
held back until there are enough of them to give every replica one, so no replica is stuck with
two while others have none. Holding a sample back changes which samples a step trains on, so
delay only happens in paper mode (the delayed samples are listed in ``plan.info``); fair mode
places outliers first, one per replica. See baselines/README.md.
"""

from __future__ import annotations

import heapq
import math
from typing import TYPE_CHECKING, Any

import numpy as np

from baselines.scheduling import (
    check_sp_degree,
    ckpt_layers_for,
    microbatch_fits,
    pack_under_budget,
    smallest_sp_for_batch,
    static_round,
)
from dcp_bench.errors import ConfigError, InfeasibleError
from dcp_bench.plan import MicroBatch, Mode, StepPlan
from dcp_bench.planners.base import Planner

if TYPE_CHECKING:
    from dcp_bench.batch import GlobalBatch
    from dcp_bench.cost.base import CostModel


def workload_balanced_bins(
    work: np.ndarray, tokens: np.ndarray, act: np.ndarray, num_bins: int, capacity: int, room: float
) -> list[list[int]] | None:
    """Greedy variable-length packing: items in decreasing workload, each into the bin with the
    least workload that still has token capacity and activation memory left. None when some
    item fits no bin (the caller adds micro-batches)."""
    bins: list[list[int]] = [[] for _ in range(num_bins)]
    load = [0.0] * num_bins
    toks = [0] * num_bins
    mem = [0.0] * num_bins
    heap = [(0.0, b) for b in range(num_bins)]
    for i in sorted(range(len(work)), key=lambda i: (-float(work[i]), i)):
        skipped = []
        placed = False
        while heap:
            w, b = heapq.heappop(heap)
            if toks[b] + int(tokens[i]) <= capacity and mem[b] + float(act[i]) <= room:
                bins[b].append(i)
                load[b] += float(work[i])
                toks[b] += int(tokens[i])
                mem[b] += float(act[i])
                heapq.heappush(heap, (load[b], b))
                placed = True
                break
            skipped.append((w, b))
        for s in skipped:
            heapq.heappush(heap, s)
        if not placed:
            return None
    return bins


class WLBLLM(Planner):
    """WLB-LLM variable-length packing (workload-balanced micro-batches) with outlier delay.

    Args:
        mode: "fair" (every sample once; outliers placed first) or "paper" (outliers delayed).
        sp: fixed SP degree; None = the smallest that fits the longest sequence seen so far.
        recompute: "full", "selective" (first half of the layers) or "none".
        token_capacity: most tokens per micro-batch over the SP group; None = what the memory
            cap allows for one sequence at this degree.
        outlier_factor: a sequence is an outlier when longer than this many times the batch's
            mean length (paper mode delays outliers that cannot be spread one per replica).
    """

    name = "wlb_llm"
    OPTION_MINIMA = {"token_capacity": 1}
    SP_OPTIONS = ("sp",)

    def __init__(
        self,
        mode: Mode = "fair",
        sp: int | None = None,
        recompute: str = "full",
        token_capacity: int | None = None,
        outlier_factor: float = 8.0,
    ) -> None:
        super().__init__(mode)
        ckpt_layers_for(recompute, 1)
        if token_capacity is not None and token_capacity < 1:
            raise ConfigError(
                f"token_capacity={token_capacity}; expected a positive token count or null"
            )
        if outlier_factor <= 1:
            raise ConfigError(f"outlier_factor={outlier_factor}; expected > 1")
        self.sp = sp
        self.recompute = recompute
        self.token_capacity = token_capacity
        self.outlier_factor = outlier_factor
        self._auto_sp = 1

    def _held_outliers(self, batch: GlobalBatch, dp: int) -> tuple[list[int], list[int]]:
        """(positions planned this step, positions delayed): in paper mode, outliers (longer than
        ``outlier_factor`` times the mean) are released only in whole rounds of one per replica;
        the rest is held back."""
        positions = list(range(batch.n))
        delayed: list[int] = []
        if batch.n:
            mean = float(batch.tokens.mean())
            outliers = [p for p in positions if batch.tokens[p] > self.outlier_factor * mean]
            if self.mode == "paper" and outliers:
                # release outliers only in whole rounds of one per replica; hold back the rest
                keep = len(outliers) - len(outliers) % dp
                by_len = sorted(outliers, key=lambda p: (-int(batch.tokens[p]), p))
                delayed = sorted(by_len[keep:])
                held = set(delayed)
                positions = [p for p in positions if p not in held]
        return positions, delayed

    def plan(self, batch: GlobalBatch, cost: CostModel) -> StepPlan:
        W = cost.cluster.world_size
        ckpt = ckpt_layers_for(self.recompute, cost.model.num_layers)
        if self.sp is not None:
            sp = int(self.sp)
            check_sp_degree(sp, W)
        else:
            self._auto_sp = max(self._auto_sp, smallest_sp_for_batch(batch, cost, ckpt))
            sp = self._auto_sp
        dp = W // sp
        positions, delayed = self._held_outliers(batch, dp)

        room = cost.memory_cap_bytes - cost.static_memory_bytes()
        tok = batch.tokens[positions]
        fr = batch.frames[positions]
        act = cost.sample_memory(tok, fr, sp, ckpt) if positions else np.zeros(0)
        work = cost.sample_time(tok, fr, sp, ckpt) if positions else np.zeros(0)
        if positions and float(act.max()) > room:
            p = positions[int(np.argmax(act))]
            raise InfeasibleError(
                f"sample {p} ({int(batch.tokens[p])} tokens) does not fit the memory cap at the "
                f"fixed SP degree {sp}"
            )
        capacity = self.token_capacity or int(max(1, tok.max() if positions else 1))
        if self.token_capacity is None and positions:
            # one micro-batch may hold as many tokens as memory allows for the longest sequence
            per_tok = float(act.max()) / float(tok[int(np.argmax(act))])
            capacity = max(int(tok.max()), int(room / per_tok))
        if positions and int(tok.max()) > capacity:
            raise InfeasibleError(
                f"token_capacity={capacity} is below the sequence of {int(tok.max())} tokens and "
                f"the fixed SP degree {sp} cannot split it further"
            )
        # micro-batches per replica: the fewest the tokens and the memory allow, then more until
        # the greedy packing places every sequence
        k = max(
            1,
            math.ceil(float(tok.sum()) / (capacity * dp)),
            math.ceil(float(act.sum()) / (room * dp)),
        )
        bins = None
        while positions and bins is None:
            bins = workload_balanced_bins(work, tok, act, k * dp, capacity, room)
            if bins is None:
                k += 1
        per_group: list[list[MicroBatch]] = [[] for _ in range(dp)]
        if bins is not None:
            per_group = _deal_bins(batch, cost, bins, positions, work, dp, k, sp, ckpt, capacity)
        info: dict[str, Any] = {
            "sp": sp,
            "ckpt_layers": ckpt,
            "recompute": self.recompute,
            "token_capacity": capacity,
            "micro_batches_per_replica": k,
            "delayed_samples": [int(batch.sample_ids[p]) for p in delayed],
        }
        return StepPlan(
            world_size=W,
            rounds=[static_round(W, sp, per_group)],
            method=self.name,
            mode=self.mode,
            step=batch.step,
            info=info,
        )


def _deal_bins(
    batch: GlobalBatch,
    cost: CostModel,
    bins: list[list[int]],
    positions: list[int],
    work: np.ndarray,
    dp: int,
    k: int,
    sp: int,
    ckpt: int,
    capacity: int,
) -> list[list[MicroBatch]]:
    """The micro-batches of each of the ``dp`` replicas (``k`` slots each): bins dealt so each
    replica's total workload is balanced, heaviest bin to the lightest replica that still has a
    slot; a bin whose samples do not fit one micro-batch together is split under the budget."""
    per_group: list[list[MicroBatch]] = [[] for _ in range(dp)]
    order = sorted(range(len(bins)), key=lambda b: -sum(float(work[i]) for i in bins[b]))
    heap = [(0.0, r) for r in range(dp)]
    slots = [0] * dp
    for b in order:
        if not bins[b]:
            continue
        pending = []
        while True:
            load, r = heapq.heappop(heap)
            if slots[r] < k:
                break
            pending.append((load, r))
        for item in pending:
            heapq.heappush(heap, item)
        members = [positions[i] for i in bins[b]]
        if microbatch_fits(batch, members, cost, sp, ckpt, "sequence"):
            packs = [tuple(members)]
        else:  # the cost model's memory is not additive here: split the bin
            packs = pack_under_budget(batch, members, cost, sp, ckpt, capacity)
        per_group[r].extend(MicroBatch(samples=pk, ckpt_layers=ckpt) for pk in packs)
        slots[r] += 1
        heapq.heappush(heap, (load + sum(float(work[i]) for i in bins[b]), r))
    return per_group
