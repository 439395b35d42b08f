"""`packed_static`: fixed SP degree with packed variable-length sequences (the Megatron-LM /
Transformer Engine packed-sequence way, THD layout with cu_seqlens).

Sequences are dealt to the data-parallel replicas so that their predicted compute (which grows
with L^2 through attention) is balanced, then each replica packs its sequences into
micro-batches of at most ``token_budget`` tokens under the memory cap; the replica runs them as
gradient-accumulation micro-steps. See baselines/README.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from baselines.scheduling import (
    check_sp_degree,
    ckpt_layers_for,
    lpt_assign,
    pack_under_budget,
    smallest_sp_for_batch,
    static_round,
)
from dcp_bench.errors import ConfigError
from dcp_bench.plan import MicroBatch, Mode, StepPlan
from dcp_bench.planners.base import Planner

if TYPE_CHECKING:
    from dcp_bench.batch import GlobalBatch
    from dcp_bench.cost.base import CostModel


def packed_static_plan(
    batch: GlobalBatch,
    cost: CostModel,
    sp: int,
    ckpt: int,
    token_budget: int | None,
    method: str = "packed_static",
    mode: Mode = "fair",
) -> StepPlan:
    """One round of ``world // sp`` equal SP groups; sequences balanced over the groups by
    longest-processing-time on their predicted time alone at this SP degree (attention makes it
    grow as L^2), then packed per group under the token budget and the memory cap."""
    W = cost.cluster.world_size
    check_sp_degree(sp, W)
    dp = W // sp
    times: list[float] = (
        cost.sample_time(batch.tokens, batch.frames, sp, ckpt).tolist() if batch.n else []
    )
    owners = lpt_assign(times, dp)
    per_group: list[list[MicroBatch]] = []
    for members in owners:
        packs = pack_under_budget(batch, members, cost, sp, ckpt, token_budget)
        per_group.append([MicroBatch(samples=p, ckpt_layers=ckpt) for p in packs])
    info: dict[str, Any] = {"sp": sp, "ckpt_layers": ckpt, "token_budget": token_budget}
    return StepPlan(
        world_size=W,
        rounds=[static_round(W, sp, per_group)],
        method=method,
        mode=mode,
        step=batch.step,
        info=info,
    )


class PackedStatic(Planner):
    """Fixed SP degree, sequences packed up to a token budget, L^2-aware balance over replicas.

    Args:
        mode: "fair" only differs from "paper" in its label: the packed-sequence runtime has no
            confounders to reproduce (every sample runs once, one optimizer step).
        sp: fixed SP degree; None = the smallest that fits the longest sequence seen so far.
        recompute: "full", "selective" (first half of the layers) or "none".
        token_budget: most tokens per packed micro-batch (the packed length; over the whole SP
            group); None = limited by the memory cap only.
    """

    name = "packed_static"
    OPTION_MINIMA = {"token_budget": 1}
    SP_OPTIONS = ("sp",)

    def __init__(
        self,
        mode: Mode = "fair",
        sp: int | None = None,
        recompute: str = "full",
        token_budget: int | None = None,
    ) -> None:
        super().__init__(mode)
        if token_budget is not None and token_budget < 1:
            raise ConfigError(
                f"token_budget={token_budget}; expected a positive token count or null"
            )
        ckpt_layers_for(recompute, 1)
        self.sp = sp
        self.recompute = recompute
        self.token_budget = token_budget
        self._auto_sp = 1  # the smallest fitting degree of the longest sample seen so far

    def plan(self, batch: GlobalBatch, cost: CostModel) -> StepPlan:
        ckpt = ckpt_layers_for(self.recompute, cost.model.num_layers)
        if self.sp is not None:
            sp = int(self.sp)
        else:
            self._auto_sp = max(self._auto_sp, smallest_sp_for_batch(batch, cost, ckpt))
            sp = self._auto_sp
        plan = packed_static_plan(batch, cost, sp, ckpt, self.token_budget, self.name, self.mode)
        plan.info["recompute"] = self.recompute
        return plan
