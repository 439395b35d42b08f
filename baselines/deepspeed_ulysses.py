"""`deepspeed_ulysses`: DeepSpeed (ZeRO + Ulysses SP) as FlexSP's evaluation configured it.

FlexSP (Wang et al., ASPLOS'25, section 6.1) compares against DeepSpeed with a fixed Ulysses SP
degree and best-fit packing of the global batch. Its solver implements that baseline as
``solve_homo_sp_ffd_bfd_globalbatch`` (PKU-DAIR/Hetu-Galvatron, branch ``flexsp``, commit
b4666892, ``galvatron/flexsp_solver/solver.py``, cited as ``solver.py:LINE``), and this module
follows it rule by rule:

1. a group of ``sp`` ranks holds at most ``max(0.9 x sp x per-rank token capacity, longest
   sequence)`` tokens (solver.py:746); the per-rank capacity is what the memory cap leaves for
   activations (FlexSP's ``token_capacity``, solver.py:69-70; here the cost model's
   `CostModel.microbatch_token_capacity`);
2. the whole global batch is packed into such groups by best-fit decreasing: longest first, each
   into the open group with the least room left that holds it, a new group when none does
   (``BestFitDecreasing``, galvatron/flexsp_solver/utils.py:31-59);
3. the groups are dealt in order into micro-batches of ``world / sp`` groups each; the last
   micro-batch's empty groups each take the first sequence of the latest earlier group holding
   more than one (solver.py:757-781);
4. at ``sp >= 16`` with empty groups, the last micro-batch is evened out: a group under the
   micro-batch's average takes sequences from earlier groups over it while they hold more than
   one and it stays under its capacity (solver.py:711, 784-797);
5. a micro-batch is infeasible when a group holds more than the per-rank capacity x ``sp``
   (``judge_feasibility``, solver.py:140-150); the step is the micro-batches one after the
   other, each as long as its slowest group (solver.py:1191): rounds with a barrier.

The fixed degree is the planner's ``sp`` option (FlexSP's solver driver fixes 64 for its
``static`` method, solver.py:1186; the paper's baseline is hand-tuned: a report picks the
fastest degree that runs every step). ``sp: null`` takes the smallest runnable degree whose
group holds the batch's longest sequence, the driver's ``min_sp`` rule (solver.py:1175-1177,
``homo_sp_baseline_ffd_bfd_globalbatch`` with ``sp_select_rule='min_sp'``, 705-736).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from baselines.scheduling import check_sp_degree, ckpt_layers_for
from dcp_bench.errors import InfeasibleError
from dcp_bench.plan import Group, MicroBatch, Mode, Round, StepPlan
from dcp_bench.planners.base import Planner

if TYPE_CHECKING:
    from dcp_bench.batch import GlobalBatch
    from dcp_bench.cost.base import CostModel

GROUP_FILL = 0.9  # solver.py:746


def best_fit_decreasing(lengths: list[float], capacity: float) -> list[list[int]]:
    """Bins (lists of positions) of best-fit decreasing (utils.py:31-59): positions longest
    first (ties by position, as Python's stable sort of FlexSP's sequences), each into the bin
    whose room left after it is least (ties: the lowest bin), a new bin when none holds it."""
    order = sorted(range(len(lengths)), key=lambda p: (-lengths[p], p))
    bins: list[list[int]] = []
    room: list[float] = []
    for p in order:
        L = lengths[p]
        best, best_left = -1, math.inf
        for b, r in enumerate(room):
            if r >= L and r - L < best_left:
                best, best_left = b, r - L
        if best < 0:
            if capacity < L:
                raise InfeasibleError(
                    f"sample {p} ({L:.0f}) is over the group capacity {capacity:.0f}"
                )
            bins.append([])
            room.append(capacity)
            best = len(bins) - 1
        bins[best].append(p)
        room[best] -= L
    return bins


def deal_into_microbatches(
    bins: list[list[int]],
    lengths: list[float],
    per_mb: int,
    capacity: float,
    even_distribute: bool,
) -> list[list[list[int]]]:
    """The groups of each micro-batch (solver.py:757-797): ``per_mb`` groups each, the last
    micro-batch's empty groups filled from earlier groups, then (``even_distribute``, which
    solver.py:784 applies only when there were empty groups) its groups evened out. A group's
    members are kept in FlexSP's row order (by position) for the moves."""
    groups = [sorted(b) for b in bins]
    mb_num = -(-len(groups) // per_mb)
    empty = per_mb * mb_num - len(groups)
    groups += [[] for _ in range(empty)]
    first_empty = len(groups) - empty
    for i in range(first_empty, len(groups)):  # solver.py:769-781
        j = first_empty - 1
        while j >= 0 and len(groups[j]) <= 1:
            j -= 1
        if j < 0:
            # FlexSP's code stops here too (solver.py:779-780: assert False)
            raise InfeasibleError(
                f"{len(bins)} packed group(s) for {per_mb} groups a micro-batch and no group "
                "holds two sequences to fill an empty one"
            )
        groups[i].append(groups[j].pop(0))
    if even_distribute and empty > 0:  # solver.py:784-797
        lo = (mb_num - 1) * per_mb

        def tok(g: list[int]) -> float:
            return sum(lengths[k] for k in g)

        avg = sum(tok(groups[i]) for i in range(lo, len(groups))) // per_mb
        for i in range(lo + 1, len(groups)):
            if tok(groups[i]) > avg:
                continue
            for j in range(lo, i):
                for k in sorted(groups[j]):  # FlexSP scans rows k = 0, 1, ... of group j
                    if not (tok(groups[i]) < avg and tok(groups[j]) > avg and len(groups[j]) > 1):
                        break
                    if tok(groups[i]) + lengths[k] <= capacity:
                        groups[j].remove(k)
                        groups[i].append(k)
                        groups[i].sort()
    return [groups[m * per_mb : (m + 1) * per_mb] for m in range(mb_num)]


class DeepSpeedUlysses(Planner):
    """DeepSpeed ZeRO + Ulysses with a fixed SP degree and best-fit packing (module docstring).

    Args:
        sp: the fixed SP degree (a power of two dividing the world that the heads divide);
            None: the smallest runnable degree that holds the longest sequence.
        recompute: "full", "selective" or "none" (FlexSP's runs recompute fully).
        mode: labels runs only.
    """

    name = "deepspeed_ulysses"
    source = (
        "DeepSpeed ZeRO + Ulysses as FlexSP (ASPLOS'25) configured it: fixed SP degree, best-fit "
        "decreasing packing of the global batch, micro-batches of world/sp groups "
        "(Hetu-Galvatron b4666892 solver.py:745-824). Defaults: the solver's min_sp rule (the "
        "smallest runnable degree that holds the longest sequence); full recompute, as FlexSP's "
        "runs recompute."
    )
    OPTION_MINIMA = {"sp": 1}
    SP_OPTIONS = ("sp",)

    def __init__(self, sp: int | None = None, recompute: str = "full", mode: Mode = "fair") -> None:
        super().__init__(mode)
        ckpt_layers_for(recompute, 1)
        if sp is not None:
            check_sp_degree(sp, sp)
        self.sp = sp
        self.recompute = recompute

    @staticmethod
    def group_sizes(
        batch: GlobalBatch, cost: CostModel, sp: int, ckpt: int
    ) -> tuple[list[float], float, str]:
        """What the packing counts for each sample, a group's limit and the unit. FlexSP's rule
        is tokens against the per-rank token capacity x ``sp`` (solver.py:69-70, 145-146); where
        the cost model's memory law gives no token capacity (it is not linear in tokens, e.g.
        video), each sample's per-rank activation bytes against the memory left per rank (the
        additive law every planner here packs by)."""
        capacity = cost.microbatch_token_capacity(sp, ckpt)
        if math.isfinite(capacity):
            return [float(t) for t in batch.tokens], float(math.floor(capacity) * sp), "tokens"
        room = cost.memory_cap_bytes - cost.static_memory_bytes()
        mem = cost.sample_memory(batch.tokens, batch.frames, sp, ckpt)
        return [float(m) for m in mem], float(room), "bytes"

    def min_sp(self, batch: GlobalBatch, cost: CostModel, ckpt: int) -> int:
        """The smallest runnable degree whose group holds the batch's longest sequence
        (solver.py:1175-1177: the driver's ``min_sp`` over a batch of the longest sequence)."""
        p = int(max(range(batch.n), key=lambda i: (int(batch.tokens[i]), -i)))
        for d in cost.sp_degrees():
            sizes, limit, _ = self.group_sizes(batch.subset([p]), cost, d, ckpt)
            if sizes[0] <= limit:
                return d
        raise InfeasibleError(
            f"sample {p} ({int(batch.tokens[p])} tokens) fits no runnable SP degree "
            f"{cost.describe_sp_degrees()} under the memory cap"
        )

    def plan(self, batch: GlobalBatch, cost: CostModel) -> StepPlan:
        W = cost.cluster.world_size
        ckpt = ckpt_layers_for(self.recompute, cost.model.num_layers)
        if not batch.n:
            raise InfeasibleError("an empty global batch has nothing to pack")
        sp = self.sp if self.sp is not None else self.min_sp(batch, cost, ckpt)
        if sp not in cost.sp_degrees():
            check_sp_degree(sp, W, cost.model)
            raise InfeasibleError(
                f"sp={sp} is not a runnable degree here: {cost.describe_sp_degrees()}"
            )
        sizes, limit, unit = self.group_sizes(batch, cost, sp, ckpt)
        largest = max(sizes)
        capacity = max(limit * GROUP_FILL, largest)
        bins = best_fit_decreasing(sizes, capacity)
        mbs = deal_into_microbatches(bins, sizes, W // sp, capacity, sp >= 16)
        rounds = []
        for groups in mbs:
            laid = []
            for gi, members in enumerate(groups):
                held = sum(sizes[k] for k in members)
                if held > limit:  # judge_feasibility, solver.py:145-147
                    raise InfeasibleError(
                        f"a group of sp={sp} holds {held:.0f} {unit}, over its capacity "
                        f"{limit:.0f} (the largest sample has {largest:.0f})"
                    )
                mb = [MicroBatch(tuple(members), ckpt_layers=ckpt)] if members else []
                laid.append(Group(gi * sp, sp, mb))
            rounds.append(Round(groups=laid))
        return StepPlan(
            world_size=W,
            rounds=rounds,
            method=self.name,
            mode=self.mode,
            step=batch.step,
            info={
                "sp": sp,
                "recompute": self.recompute,
                "ckpt_layers": ckpt,
                "micro_batches": len(rounds),
                "group_capacity": float(capacity),
                "packing_unit": unit,
                "tokens_per_group": [
                    [int(np.sum(batch.tokens[list(g)])) if g else 0 for g in groups]
                    for groups in mbs
                ],
            },
            round_barrier=True,
        )
