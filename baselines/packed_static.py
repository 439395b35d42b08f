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
    microbatch_fits,
    pack_under_budget,
    recompute_holding_longest,
    smallest_sp_for_batch,
    static_round,
    whole_cp_degrees,
)
from dcp_bench.archs import arch_of
from dcp_bench.errors import ConfigError, InfeasibleError
from dcp_bench.plan import MicroBatch, Mode, SPKind, StepPlan
from dcp_bench.planners.base import Planner

if TYPE_CHECKING:
    from dcp_bench.batch import GlobalBatch
    from dcp_bench.cost.base import CostModel


PACKINGS = ("lpt", "dp_balanced")
# Megatron's ``--cp-comm-type`` (megatron/training/arguments.py:3221-3226 at d98e8a64, default
# p2p; the kinds at megatron/core/transformer/transformer_config.py:1030-1040): ``p2p`` is ring
# attention over the CP group, ``a2a`` all-to-all over heads (Ulysses), ``a2a+p2p`` the
# hierarchical mix (all-to-all inside the first level, the ring across). all_gather has no
# counterpart in the cost models and is refused.
CP_COMM_TYPES = ("a2a+p2p", "p2p", "a2a")


def sp_kind_for(cost: CostModel, sp: int, cp_comm_type: str) -> tuple[SPKind, int]:
    """The plan's (``sp_kind``, ``ulysses_degree``) of a micro-batch on ``sp`` ranks under
    ``cp_comm_type``: ``p2p`` a ring over the group; ``a2a+p2p`` Ulysses inside each node and
    the ring across nodes (Ulysses alone when the group fits a node); ``a2a`` Ulysses. Rings
    only on text models where the cost model prices them (`CostModel.prices_ring`; video
    sequence parallelism is priced as DSP's all-to-all): elsewhere Ulysses."""
    if (
        sp <= 1
        or cp_comm_type == "a2a"
        or not arch_of(cost.model).text_sp_kinds
        or not cost.prices_ring
    ):
        return "ulysses", 0
    if cp_comm_type == "p2p":
        return "ring", 0
    node = cost.cluster.gpus_per_node
    return ("ulysses", 0) if sp <= node else ("hybrid", node)


def ring_cp_degrees(cost: CostModel, cp_comm_type: str) -> list[int]:
    """The CP degrees beyond the powers of two that ``cp_comm_type`` runs on this world
    (`whole_cp_degrees`): none for ``a2a`` (Ulysses: the heads and the aligned layout limit it),
    multiples of the node for ``a2a+p2p``, every divisor of the world for ``p2p``."""
    if cp_comm_type == "a2a":
        return []
    return whole_cp_degrees(cost, hierarchical=cp_comm_type == "a2a+p2p")


def dp_balanced_packs(
    batch: GlobalBatch, cost: CostModel, sp: int, ckpt: int, token_budget: int | None, dp: int
) -> list[list[tuple[int, ...]]]:
    """Megatron-Core's ``dp_balanced`` sequence-packing scheduler (NVIDIA/Megatron-LM d98e8a64,
    megatron/core/datasets/data_schedule.py:437-489, `DpBalancedScheduler`), the packed baseline
    of examples/dynamic_context_parallel/: the samples in the order the loader gives them,
    next-fit into packs of at most ``max_seqlen_per_dp_cp_rank x cp_size`` tokens (here
    ``token_budget``, or what the memory cap holds); while the pack count is not a multiple of
    ``dp``, the last sample of the last pack holding more than one moves to a pack of its own;
    pack ``q`` goes to replica ``q % dp`` as its micro-batch ``q // dp``. Per replica, its
    micro-batches in order."""
    room = cost.memory_cap_bytes - cost.static_memory_bytes()
    act: list[float] = (
        cost.sample_memory(batch.tokens, batch.frames, sp, ckpt).tolist() if batch.n else []
    )
    packs: list[list[int]] = []
    size = mem = 0.0
    for p in range(batch.n):
        L, m = int(batch.tokens[p]), float(act[p])
        if m > room or (token_budget is not None and token_budget < L):
            raise InfeasibleError(
                f"sample {p} ({L} tokens) does not fit one micro-batch at the fixed SP degree "
                f"{sp} (token budget {token_budget}, memory cap)"
            )
        fits = (token_budget is None or size + L <= token_budget) and mem + m <= room
        if packs and fits:
            packs[-1].append(p)
            size, mem = size + L, mem + m
        else:
            packs.append([p])
            size, mem = L, m
    i = len(packs) - 1
    while len(packs) % dp and i >= 0:
        # (the reference asserts it finds enough samples; with too few, replicas stay idle)
        if len(packs[i]) > 1:
            packs.append([packs[i].pop()])
        else:
            i -= 1
    per_group: list[list[tuple[int, ...]]] = [[] for _ in range(dp)]
    for q, pk in enumerate(packs):
        if microbatch_fits(batch, pk, cost, sp, ckpt, "sequence"):
            per_group[q % dp].append(tuple(pk))
        else:  # the memory estimate is additive; a cost model's may not be
            per_group[q % dp].extend(pack_under_budget(batch, pk, cost, sp, ckpt, token_budget))
    return per_group


def packed_static_plan(
    batch: GlobalBatch,
    cost: CostModel,
    sp: int,
    ckpt: int,
    token_budget: int | None,
    method: str = "packed_static",
    mode: Mode = "fair",
    packing: str = "lpt",
    cp_comm_type: str = "a2a",
) -> StepPlan:
    """One round of ``world // sp`` equal SP groups. ``lpt``: sequences balanced over the groups
    by longest-processing-time on their predicted time alone at this SP degree (attention makes
    it grow as L^2), then packed per group under the token budget and the memory cap;
    ``dp_balanced``: Megatron's in-order packing and dealing (`dp_balanced_packs`).
    ``cp_comm_type``: ``a2a`` (Ulysses, the suite's SP), ``p2p`` (ring attention) or
    ``a2a+p2p`` (`sp_kind_for`)."""
    W = cost.cluster.world_size
    kind, uly = sp_kind_for(cost, sp, cp_comm_type)
    # ring attention: the heads do not limit the degree, and a CP size dividing the world runs
    check_sp_degree(
        sp, W, cost.model if kind == "ulysses" else None, ring_cp_degrees(cost, cp_comm_type)
    )
    dp = W // sp
    per_group: list[list[MicroBatch]] = []
    if packing == "dp_balanced":
        for packs in dp_balanced_packs(batch, cost, sp, ckpt, token_budget, dp):
            per_group.append([MicroBatch(p, ckpt, sp_kind=kind, ulysses_degree=uly) for p in packs])
    else:
        times: list[float] = (
            cost.sample_time(batch.tokens, batch.frames, sp, ckpt).tolist() if batch.n else []
        )
        for members in lpt_assign(times, dp):
            packs = pack_under_budget(batch, members, cost, sp, ckpt, token_budget)
            per_group.append([MicroBatch(p, ckpt, sp_kind=kind, ulysses_degree=uly) for p in packs])
    info: dict[str, Any] = {
        "sp": sp,
        "ckpt_layers": ckpt,
        "token_budget": token_budget,
        "packing": packing,
        "cp_attention": kind if kind != "hybrid" else f"hybrid (ulysses {uly})",
    }
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
        recompute: "selective" (the first half of the layers, the suite's stand-in for
            Megatron's ``--recompute-activations``, its usual long-context setting), "full" or
            "none"; None = selective, and full from the first batch whose longest sequence
            selective cannot hold at any SP degree (the user's fallback; it stays).
        token_budget: most tokens per packed micro-batch (the packed length; over the whole SP
            group); None = limited by the memory cap only.
        packing: ``lpt`` (L^2-aware balance over replicas, then first-fit-decreasing packing:
            stronger than Megatron's) or ``dp_balanced`` (Megatron-Core's packed-sequence
            scheduler as the dynamic-CP example's baseline runs it: in order, round-robin).
        cp_comm_type: Megatron's ``--cp-comm-type``: ``a2a+p2p`` (the default here: heads
            split inside a node, the CP ring across nodes; the plan IR's stand-in for the
            tensor parallelism inside a node that long-context Megatron launches combine with
            CP), ``p2p`` (Megatron's own default: one ring over the group, TP 1) or ``a2a``
            (Ulysses all-to-all over the group, the suite's earlier default).
    """

    name = "packed_static"
    source = (
        "Megatron-LM / Transformer Engine packed sequences (THD, `PackedSeqParams`) at a fixed SP "
        "degree. Defaults: the smallest SP degree that fits the longest sequence seen; selective "
        "recompute (Megatron's `--recompute-activations`, megatron/training/arguments.py:607-608 "
        "at d98e8a64; here the first half of the layers), full once selective cannot hold the "
        "longest sequence at any degree; micro-batches limited by the memory cap; L^2-aware "
        "balance over replicas; CP heads split inside a node and ring attention across nodes "
        "(`--cp-comm-type a2a+p2p`, transformer_config.py:1034 at d98e8a64: the stand-in for TP "
        "inside the node; Megatron's own default p2p is cp_comm_type=p2p)."
    )
    OPTION_MINIMA = {"token_budget": 1}
    SP_OPTIONS = ("sp",)
    # a CP size that divides the world runs as a ring (whole nodes) beside the powers of two
    SP_POWER_OF_TWO = False

    def __init__(
        self,
        mode: Mode = "fair",
        sp: int | None = None,
        recompute: str | None = None,
        token_budget: int | None = None,
        packing: str = "lpt",
        cp_comm_type: str = "a2a+p2p",
    ) -> None:
        super().__init__(mode)
        if cp_comm_type not in CP_COMM_TYPES:
            raise ConfigError(
                f"cp_comm_type={cp_comm_type!r}; expected one of {', '.join(CP_COMM_TYPES)}"
            )
        self.cp_comm_type = cp_comm_type
        if packing not in PACKINGS:
            raise ConfigError(f"packing={packing!r}; expected one of {', '.join(PACKINGS)}")
        self.packing = packing
        if token_budget is not None and token_budget < 1:
            raise ConfigError(
                f"token_budget={token_budget}; expected a positive token count or null"
            )
        self._fallback = recompute is None
        recompute = recompute or "selective"
        ckpt_layers_for(recompute, 1)
        self.sp = sp
        self.recompute = recompute
        self.token_budget = token_budget
        self._auto_sp = 1  # the smallest fitting degree of the longest sample seen so far

    def plan(self, batch: GlobalBatch, cost: CostModel) -> StepPlan:
        comm = self.cp_comm_type if cost.prices_ring else "a2a"
        # CP sizes beyond the powers of two, tried only when no power of two holds the longest
        # sequence (3 nodes of 8 with a2a+p2p: 24, a 1M-token document)
        extra = ring_cp_degrees(cost, comm)
        if self._fallback:
            self.recompute = recompute_holding_longest(batch, cost, self.recompute, extra=extra)
        ckpt = ckpt_layers_for(self.recompute, cost.model.num_layers)
        if self.sp is not None:
            sp = int(self.sp)
        else:
            self._auto_sp = max(self._auto_sp, smallest_sp_for_batch(batch, cost, ckpt, extra))
            sp = self._auto_sp
        plan = packed_static_plan(
            batch,
            cost,
            sp,
            ckpt,
            self.token_budget,
            self.name,
            self.mode,
            self.packing,
            comm,
        )
        plan.info["recompute"] = self.recompute
        return plan
