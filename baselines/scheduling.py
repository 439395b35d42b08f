"""Building blocks the static and peer baselines share: memory fit under the cost model's cap,
per-bucket batch sizes, packing under a token budget, greedy load balancing (LPT), static group
layouts, and a plan-level step-time estimate on the same cost model the simulator uses.

Everything here is pure numpy: no torch, no torch.distributed.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from dcp_bench.archs import arch_of
from dcp_bench.cost.specs import describe_sp_degrees, runnable_sp_degrees
from dcp_bench.errors import ConfigError, InfeasibleError
from dcp_bench.layout import is_power_of_two, ulysses_span
from dcp_bench.plan import Group, MicroBatch, Round, Split, StepPlan

if TYPE_CHECKING:
    from dcp_bench.batch import GlobalBatch
    from dcp_bench.cost.base import CostModel
    from dcp_bench.cost.specs import ModelSpec

RECOMPUTE_POLICIES = ("full", "selective", "none")


def ckpt_layers_for(policy: str, num_layers: int) -> int:
    """Checkpointed layers of a recompute policy: ``full`` = every layer, ``selective`` = the
    first half of the layers (rounded down), ``none`` = no recomputation."""
    if policy == "full":
        return num_layers
    if policy == "selective":
        return num_layers // 2
    if policy == "none":
        return 0
    raise ConfigError(
        f"recompute policy {policy!r}; expected one of {', '.join(RECOMPUTE_POLICIES)}"
    )


def whole_cp_degrees(cost: CostModel, hierarchical: bool) -> list[int]:
    """The fixed context-parallel degrees a ring-attention system runs on this world beyond the
    powers of two (`runnable_sp_degrees`), ascending: Megatron-Core asks only that TP x PP x CP
    divide the world size (NVIDIA/Megatron-LM d98e8a64, megatron/core/parallel_state.py:812-823,
    `initialize_model_parallel`; TP = PP = 1 in the plan IR), so a divisor of the world that is
    no power of two. ``hierarchical`` (``--cp-comm-type
    a2a+p2p``: all-to-all inside a node, the ring across nodes): the levels' sizes must multiply
    to the CP size (parallel_state.py:1127-1128) with the all-to-all level the node, so only
    multiples of the node (3 nodes of 8: 24). Both keep to what plans hold: a group lies inside
    one node or is made of whole nodes (`dcp_bench.layout.spans_nodes_cleanly`; so 3 nodes of 8
    give 24 for ``p2p`` too, where Megatron would also run 3, 6 or 12 across node boundaries).
    Empty where rings are not priced (video models, cost models without ring pricing): there
    the degrees stay the Ulysses ones."""
    if not arch_of(cost.model).text_sp_kinds or not cost.prices_ring:
        return []
    W, node = cost.cluster.world_size, cost.cluster.gpus_per_node
    out = [
        d
        for d in range(3, W + 1)
        if W % d == 0 and not is_power_of_two(d) and (d % node == 0 or node % d == 0)
    ]
    if hierarchical:
        out = [d for d in out if d > node and d % node == 0]
    return out


def check_sp_degree(
    sp: int, world_size: int, model: ModelSpec | None = None, extra: Sequence[int] = ()
) -> None:
    """A fixed SP degree must be a power of two that divides the world and, given the
    ``model``, a degree its attention heads divide (`ModelSpec.sp_degree_offence`), or one of
    ``extra`` (the ring degrees `whole_cp_degrees` of the system's CP layout)."""
    if sp in extra:
        return
    if not is_power_of_two(sp):
        more = f", or one of {', '.join(map(str, extra))}" if extra else ""
        raise ConfigError(f"sp={sp} is not a power of two (expected 1, 2, 4, ...{more})")
    if sp > world_size:
        raise ConfigError(f"sp={sp} is larger than the world ({world_size} ranks)")
    if world_size % sp:
        raise ConfigError(f"sp={sp} does not divide the world size {world_size}")
    offence = model.sp_degree_offence(sp) if model is not None else None
    if offence is not None:
        assert model is not None
        raise ConfigError(
            f"sp={sp}: {offence}; runnable degrees {describe_sp_degrees(model, world_size)}"
        )


def split_for(batch: GlobalBatch, positions: Sequence[int], cost: CostModel) -> Split:
    """The reference video runtime deals images (T' = 1 on a video model) to the ranks of an SP
    group whole ("batch" split); everything else is sharded along the sequence."""
    if arch_of(cost.model).video and all(int(batch.frames[p]) == 1 for p in positions):
        return "batch"
    return "sequence"


def microbatch_memory(
    cost: CostModel, tokens: np.ndarray, frames: np.ndarray, sp: int, ckpt: int, split: str
) -> float:
    """`CostModel.microbatch_memory`, and on a degree that is no power of two (a ring CP size,
    `whole_cp_degrees`, which no Ulysses group has) the memory of one ring micro-batch on
    ``sp`` ranks (`CostModel.microbatch_costs` with a Ulysses span of 1): a sequence sharded
    over ``sp`` ranks keeps the same activations whatever its attention's kind."""
    if is_power_of_two(sp) or split != "sequence" or len(tokens) == 0:
        return float(cost.microbatch_memory(tokens, frames, sp, ckpt, split))
    c = cost.microbatch_costs(
        np.asarray(tokens, dtype=np.int64),
        np.asarray(frames, dtype=np.int64),
        np.zeros(len(tokens), dtype=np.int64),
        np.array([sp]),
        np.array([ckpt]),
        np.array([1]),
    )
    return float(c["mem_bytes"][0])


def microbatch_fits(
    batch: GlobalBatch, positions: Sequence[int], cost: CostModel, sp: int, ckpt: int, split: str
) -> bool:
    """Whether the cost model predicts the micro-batch under the per-GPU memory cap (the same
    check the plan validator makes)."""
    pos = list(positions)
    mem = microbatch_memory(cost, batch.tokens[pos], batch.frames[pos], sp, ckpt, split)
    return bool(mem <= cost.memory_cap_bytes)


def smallest_fitting_sp(
    tokens: int,
    frames: int,
    cost: CostModel,
    ckpt: int,
    world_size: int,
    split: str = "sequence",
    extra: Sequence[int] = (),
) -> int | None:
    """The smallest SP degree the model runs (`runnable_sp_degrees`) at which one sample fits
    alone, then the smallest of ``extra`` (ring degrees beyond the powers of two, tried only
    when none of those fits), or None."""
    t = np.array([tokens], dtype=np.int64)
    f = np.array([frames], dtype=np.int64)
    for sp in [*runnable_sp_degrees(cost.model, world_size), *extra]:
        if microbatch_memory(cost, t, f, sp, ckpt, split) <= cost.memory_cap_bytes:
            return sp
    return None


def largest_fitting(fits: Callable[[int], bool], limit: int) -> int:
    """The largest n in 1..``limit`` with ``fits(n)``, for a predicate that stays false once it
    turns false (memory grows with size); 0 when even 1 does not fit. Doubling, then bisection."""
    if limit < 1 or not fits(1):
        return 0
    lo, hi = 1, 2
    while hi <= limit and fits(hi):
        lo, hi = hi, 2 * hi
    hi = min(hi, limit + 1)  # exclusive: hi does not fit, or is past the limit
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def largest_batch_size(
    tokens: int, frames: int, cost: CostModel, sp: int, ckpt: int, split: str, limit: int
) -> int:
    """The largest number (<= ``limit``) of copies of one sample shape that fit as one
    micro-batch; 0 when even one does not fit. Memory grows with the batch size, so a binary
    search finds it."""

    def fits(bs: int) -> bool:
        t = np.full(bs, tokens, dtype=np.int64)
        f = np.full(bs, frames, dtype=np.int64)
        return bool(microbatch_memory(cost, t, f, sp, ckpt, split) <= cost.memory_cap_bytes)

    return largest_fitting(fits, limit)


def pack_under_budget(
    batch: GlobalBatch,
    positions: Sequence[int],
    cost: CostModel,
    sp: int,
    ckpt: int,
    token_budget: int | None,
    split: str = "sequence",
) -> list[tuple[int, ...]]:
    """First-fit-decreasing packing of samples into micro-batches of at most ``token_budget``
    tokens (None: no token limit) whose predicted memory stays under the cap.

    Raises `InfeasibleError` for a sample longer than the budget or that does not fit alone at
    this SP degree: a fixed-SP system has no way to split it further.
    """
    order = sorted(positions, key=lambda p: -int(batch.tokens[p]))
    act: list[float] = (
        cost.sample_memory(batch.tokens[order], batch.frames[order], sp, ckpt).tolist()
        if order
        else []
    )
    room = cost.memory_cap_bytes - cost.static_memory_bytes()
    bins: list[list[int]] = []
    bin_tokens: list[int] = []
    bin_mem: list[float] = []
    for p, m in zip(order, act):
        L = int(batch.tokens[p])
        if token_budget is not None and token_budget < L:
            raise InfeasibleError(
                f"token budget {token_budget} is below the sequence of {L} tokens (sample {p}) and "
                f"the fixed SP degree {sp} cannot split it further"
            )
        if m > room or (
            split != "sequence" and not microbatch_fits(batch, [p], cost, sp, ckpt, split)
        ):
            raise InfeasibleError(
                f"sample {p} ({L} tokens) does not fit the memory cap "
                f"{cost.memory_cap_bytes / 2**30:.1f} GiB at SP degree {sp} with {ckpt} "
                "checkpointed layers"
            )
        for i in range(len(bins)):
            if (token_budget is None or bin_tokens[i] + L <= token_budget) and bin_mem[
                i
            ] + m <= room:
                bins[i].append(p)
                bin_tokens[i] += L
                bin_mem[i] += float(m)
                break
        else:
            bins.append([p])
            bin_tokens.append(L)
            bin_mem.append(float(m))
    # The additive estimate may miss a non-additive term of a cost model; confirm with the same
    # check the validator makes and split any offender.
    out: list[tuple[int, ...]] = []
    stack = [b for b in reversed(bins)]
    while stack:
        b = stack.pop()
        if len(b) == 1 or microbatch_fits(batch, b, cost, sp, ckpt, split):
            out.append(tuple(b))
        else:
            half = len(b) // 2
            stack.extend([b[half:], b[:half]])
    return out


def lpt_assign(costs: Sequence[float], num_bins: int) -> list[list[int]]:
    """Longest-processing-time-first: items in decreasing cost, each to the least-loaded bin.
    Returns the item indices per bin (ties go to the lowest bin index, deterministic)."""
    bins: list[list[int]] = [[] for _ in range(num_bins)]
    heap = [(0.0, b) for b in range(num_bins)]
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        load, b = heapq.heappop(heap)
        bins[b].append(i)
        heapq.heappush(heap, (load + float(costs[i]), b))
    return bins


def microbatch_time(
    batch: GlobalBatch, positions: Sequence[int], cost: CostModel, sp: int, ckpt: int, split: str
) -> float:
    """Predicted time of one micro-batch on an SP group (compute, recompute, communication)."""
    pos = list(positions)
    return cost.microbatch_cost(batch.tokens[pos], batch.frames[pos], sp, ckpt, split).total_s


def static_round(world_size: int, sp: int, per_group: list[list[MicroBatch]]) -> Round:
    """One round of ``world_size // sp`` equal aligned groups, each running its micro-batches."""
    groups = [Group(start=i * sp, size=sp, micro_batches=mbs) for i, mbs in enumerate(per_group)]
    return Round(groups=groups)


def estimate_step_time(
    plan: StepPlan, batch: GlobalBatch, cost: CostModel, round_barrier: bool = True
) -> float:
    """Predicted step time of a plan: rounds run one after another, a round lasts as long as its
    slowest group, a group runs its micro-batches back to back; plus the once-per-step gradient
    synchronisation. Used to tune and to compare candidate plans inside a planner.

    ``round_barrier=False`` prices the plan as the executors run it instead (the simulator's
    timeline): no barrier between rounds, a group starts once all its ranks are free.

    Cost models that offer a batched ``microbatch_costs(tokens, frames, mb_index, sp,
    ckpt_layers)`` (the analytical one does) are asked once for every sequence-split
    micro-batch of the plan; others micro-batch by micro-batch."""
    where: list[tuple[int, int]] = []  # (round, group index) of each micro-batch
    times: list[float] = []
    batched = getattr(cost, "microbatch_costs", None)
    pos: list[int] = []
    mb_index: list[int] = []
    sps: list[int] = []
    ckpts: list[int] = []
    spans: list[int] = []  # each micro-batch's head-sharding span (ring / hybrid: below its group)
    seq_slots: list[int] = []
    for r, rnd in enumerate(plan.rounds):
        for gi, g in enumerate(rnd.groups):
            for mb in g.micro_batches:
                where.append((r, gi))
                if batched is not None and mb.split == "sequence":
                    seq_slots.append(len(times))
                    mb_index.extend([len(sps)] * len(mb.samples))
                    pos.extend(mb.samples)
                    sps.append(g.size)
                    ckpts.append(mb.ckpt_layers)
                    spans.append(ulysses_span(mb.sp_kind, mb.ulysses_degree, g.size))
                    times.append(0.0)
                else:
                    times.append(
                        microbatch_time(batch, mb.samples, cost, g.size, mb.ckpt_layers, mb.split)
                    )
    if seq_slots:
        assert batched is not None
        c = batched(
            batch.tokens[pos],
            batch.frames[pos],
            np.asarray(mb_index, dtype=np.int64),
            np.asarray(sps),
            np.asarray(ckpts),
            # as the simulator asks: ``ulysses`` only where a micro-batch runs a ring
            **({"ulysses": np.asarray(spans)} if spans != sps else {}),
        )
        total = cost.total_time(c)  # every declared time term, in declaration order
        for slot, t in zip(seq_slots, total):
            times[slot] = float(t)
    per_group: dict[tuple[int, int], float] = {}
    for key, t in zip(where, times):
        per_group[key] = per_group.get(key, 0.0) + t
    if not round_barrier:
        free = np.zeros(plan.world_size)
        for r, rnd in enumerate(plan.rounds):
            for gi, g in enumerate(rnd.groups):
                a, b = g.start, g.start + g.size
                free[a:b] = free[a:b].max() + per_group.get((r, gi), 0.0)
        return float(free.max(initial=0.0)) + cost.step_sync_time()
    slowest: dict[int, float] = {}
    for (r, _), t in per_group.items():
        slowest[r] = max(slowest.get(r, 0.0), t)
    return sum(slowest.values()) + cost.step_sync_time()


def smallest_sp_for_batch(
    batch: GlobalBatch, cost: CostModel, ckpt: int, extra: Sequence[int] = ()
) -> int:
    """The smallest SP degree the model runs at which the longest sample of ``batch`` fits alone
    (sharded along the sequence), then the smallest of the ring degrees ``extra``
    (`whole_cp_degrees`). `InfeasibleError` naming the degrees tried and the sample's length
    when none does."""
    W = cost.cluster.world_size
    if batch.n == 0:
        return 1
    p = int(np.argmax(batch.tokens))
    sp = smallest_fitting_sp(
        int(batch.tokens[p]), int(batch.frames[p]), cost, ckpt, W, "sequence", extra
    )
    if sp is None:
        more = f", nor at the ring degrees {', '.join(map(str, extra))}" if extra else ""
        raise InfeasibleError(
            f"sample {p} ({int(batch.tokens[p])} tokens) does not fit the memory cap "
            f"{cost.memory_cap_bytes / 2**30:.1f} GiB with {ckpt} checkpointed layers at any "
            f"runnable SP degree {cost.describe_sp_degrees()}{more}"
        )
    return sp


def recompute_holding_longest(
    batch: GlobalBatch,
    cost: CostModel,
    preferred: str,
    fallback: str = "full",
    extra: Sequence[int] = (),
) -> str:
    """``preferred`` when the batch's longest sample fits some SP degree of the world with it,
    else ``fallback``: a user's default recompute, and the more recompute they switch to when
    the default runs out of memory on the longest sequence. The ring degrees ``extra``
    (`whole_cp_degrees`) come last: ``fallback`` when it holds the sample at a power of two,
    else ``preferred`` when a ring degree holds it with that, else ``fallback``."""
    if batch.n == 0 or preferred == fallback:
        return preferred

    def holds(policy: str, degrees: Sequence[int]) -> bool:
        try:
            smallest_sp_for_batch(batch, cost, ckpt_layers_for(policy, cost.model.num_layers))
        except InfeasibleError:
            pass
        else:
            return True
        if not degrees:
            return False
        # only the ring degrees: the powers of two were tried above
        p = int(np.argmax(batch.tokens))
        t = batch.tokens[p : p + 1]
        f = batch.frames[p : p + 1]
        ckpt = ckpt_layers_for(policy, cost.model.num_layers)
        return any(
            microbatch_memory(cost, t, f, sp, ckpt, "sequence") <= cost.memory_cap_bytes
            for sp in degrees
        )

    if holds(preferred, ()) or (extra and not holds(fallback, ()) and holds(preferred, extra)):
        return preferred
    return fallback


def max_tokens_fitting_one_rank(cost: CostModel, ckpt: int, frames: int = 1) -> int:
    """The longest single sequence (tokens) that fits one GPU under the cap with ``ckpt``
    checkpointed layers; 0 when not even one token fits. Memory grows with length: binary
    search up to the model's maximum length."""

    def fits(n: int) -> bool:
        t = np.array([n * frames], dtype=np.int64)
        f = np.array([frames], dtype=np.int64)
        return bool(cost.microbatch_memory(t, f, 1, ckpt, "sequence") <= cost.memory_cap_bytes)

    return largest_fitting(fits, max(1, cost.model.max_seq_len // frames)) * frames
