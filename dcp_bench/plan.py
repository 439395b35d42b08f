"""The plan IR shared by every method and both executors, and its validator.

A `StepPlan` is a list of rounds. A round partitions (some of) the ranks into sequence-parallel
groups; a group is an *aligned* block of ranks (size a power of two that divides the world size,
start a multiple of the size; any world size), or, when all its micro-batches run ring or hybrid
attention, any block of ranks (a ring needs only point-to-point sends; a hybrid's Ulysses
sub-groups must be aligned blocks).
Each group runs a list of micro-batches; a micro-batch names samples by their position in the
`GlobalBatch` and says how many of the model's first layers are activation-checkpointed.
Rounds run one after another; within a round every group runs independently. Aligned groups
nest, so collectives never meet in opposite orders: deadlock-free by construction.

Static parallelism is one round of equal groups; DCP-inter one round of unequal groups with
different micro-batch counts; FlexSP-style plans use several rounds.
"""

from __future__ import annotations

import json
from collections.abc import Generator, Iterator
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from dcp_bench.archs import arch_of
from dcp_bench.errors import ConfigError, PlanError
from dcp_bench.layout import (
    SP_KINDS,
    ModelParallel,
    aligned_sp_degrees,
    is_power_of_two,
    ring_group_offence,
    spans_nodes_cleanly,
)

if TYPE_CHECKING:
    from dcp_bench.batch import GlobalBatch
    from dcp_bench.cost.base import CostModel
    from dcp_bench.cost.specs import ModelSpec

Mode = Literal["fair", "paper"]
Split = Literal["sequence", "batch"]
SPKind = Literal["ulysses", "ring", "hybrid"]


@dataclass(frozen=True)
class MicroBatch:
    """Samples packed together and run in one forward/backward by one SP group.

    ``split="sequence"`` shards every sample's tokens over the group (Ulysses / DSP);
    ``split="batch"`` deals whole samples to the group's ranks instead (the reference runtime
    does this for images).

    ``sp_kind`` says how a sequence-split micro-batch's attention spans the group: ``ulysses``
    (all-to-all over heads across the group, the default), ``ring`` (ring attention across the
    group: no head constraint) or ``hybrid`` (Ulysses inside sub-groups of ``ulysses_degree``
    consecutive ranks, ring across them). ``ulysses_degree`` is read for ``hybrid`` only.
    """

    samples: tuple[int, ...]
    ckpt_layers: int = 0
    split: Split = "sequence"
    sp_kind: SPKind = "ulysses"
    ulysses_degree: int = 0

    @classmethod
    def many(cls, samples: list[tuple[int, ...]], ckpt_layers: list[int]) -> list[MicroBatch]:
        """``[MicroBatch(samples=s, ckpt_layers=k) for s, k in zip(samples, ckpt_layers)]``
        (the other fields at their defaults), built without the frozen ``__init__``'s five
        guarded attribute writes each: planners make hundreds of thousands per step."""
        new = object.__new__
        put = object.__setattr__
        out: list[MicroBatch] = []
        append = out.append
        for s, k in zip(samples, ckpt_layers, strict=True):
            mb = new(cls)
            put(
                mb,
                "__dict__",
                {
                    "samples": s,
                    "ckpt_layers": k,
                    "split": "sequence",
                    "sp_kind": "ulysses",
                    "ulysses_degree": 0,
                },
            )
            append(mb)
        return out


@dataclass
class Group:
    start: int
    size: int
    micro_batches: list[MicroBatch] = field(default_factory=list)

    @property
    def ranks(self) -> range:
        return range(self.start, self.start + self.size)


@dataclass
class Round:
    groups: list[Group] = field(default_factory=list)


@dataclass
class StepPlan:
    world_size: int
    rounds: list[Round]
    method: str = ""
    mode: Mode = "fair"
    step: int = 0
    info: dict[str, Any] = field(default_factory=dict)
    # Every rank waits at the end of each round until all ranks finish it (a system whose runtime
    # puts a barrier between its groups, e.g. Megatron's hybrid CP schedule). Without it a rank
    # starts its next round's group as soon as that group's own members are free.
    round_barrier: bool = False
    # Megatron-style tensor and pipeline parallelism (`dcp_bench.layout.ModelParallel`): each group
    # is then one model replica of tp x pp x cp ranks whose micro-batches run the 1F1B pipeline,
    # the group's context-parallel degree is its size / (tp x pp). None: every rank holds the
    # whole model (sequence and data parallelism only).
    model_parallel: ModelParallel | None = None

    def context_parallel(self, group: Group) -> int:
        """The ranks one micro-batch's sequence is split over in ``group``: its size, or with
        `model_parallel` its size / (tp x pp)."""
        mp = self.model_parallel
        return group.size if mp is None else group.size // mp.model_ranks

    def micro_batches(self) -> Iterator[tuple[int, Group, MicroBatch]]:
        """(round index, group, micro-batch) for every micro-batch of the plan."""
        for r, rnd in enumerate(self.rounds):
            for g in rnd.groups:
                for mb in g.micro_batches:
                    yield r, g, mb

    def sample_positions(self) -> list[int]:
        return [s for _, _, mb in self.micro_batches() for s in mb.samples]

    def group_for_rank(self, round_index: int, rank: int) -> Group | None:
        for g in self.rounds[round_index].groups:
            if g.start <= rank < g.start + g.size:
                return g
        return None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if self.model_parallel is None:  # plans without it serialise as they always have
            del out["model_parallel"]
        return out

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, default=_default)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepPlan:
        rounds = [
            Round(
                groups=[
                    Group(
                        start=g["start"],
                        size=g["size"],
                        micro_batches=[
                            MicroBatch(
                                samples=tuple(mb["samples"]),
                                ckpt_layers=mb.get("ckpt_layers", 0),
                                split=mb.get("split", "sequence"),
                                sp_kind=mb.get("sp_kind", "ulysses"),
                                ulysses_degree=mb.get("ulysses_degree", 0),
                            )
                            for mb in g["micro_batches"]
                        ],
                    )
                    for g in r["groups"]
                ]
            )
            for r in data["rounds"]
        ]
        return cls(
            world_size=data["world_size"],
            rounds=rounds,
            method=data.get("method", ""),
            mode=data.get("mode", "fair"),
            step=data.get("step", 0),
            info=data.get("info", {}),
            round_barrier=bool(data.get("round_barrier", False)),
            model_parallel=(
                None
                if data.get("model_parallel") is None
                else ModelParallel.from_dict(data["model_parallel"])
            ),
        )

    @classmethod
    def from_json(cls, text: str) -> StepPlan:
        return cls.from_dict(json.loads(text))


def _default(obj: Any) -> Any:
    if hasattr(obj, "tolist"):
        return obj.tolist()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


PLAN_RULES = (
    "every group's size is a power of two that divides the world size, and the group is aligned "
    "(its first rank a multiple of its size); or every sequence-split micro-batch of the group is "
    "ring or hybrid (ring attention needs only point-to-point sends: any block of ranks)",
    "every group lies inside the world (ranks 0 .. world_size - 1)",
    "with a cost model: every group lies inside one node or is made of whole nodes",
    "with a model: a micro-batch that shards heads (Ulysses / DSP over its group, a hybrid over "
    "its Ulysses sub-groups) does so over a number of ranks dividing the model's attention heads",
    "groups of one round are disjoint (a rank is in at most one group per round)",
    "every micro-batch holds at least one sample, and its split is 'sequence' or 'batch'",
    "a micro-batch's sp_kind is 'ulysses', 'ring' or 'hybrid'; a hybrid one's ulysses_degree is a "
    "power of two, more than 1, that divides its group's size and is less than it, divides the "
    "world size, and divides the group's first rank (its Ulysses sub-groups are aligned blocks)",
    "with a cost model: ring and hybrid micro-batches only where it prices them (text models)",
    "ckpt_layers is between 0 and the model's number of layers",
    "every sample position is in the batch (0 .. n - 1) and used at most once in the plan",
    "fair mode: every sample position of the batch is used exactly once",
    "with a cost model: every micro-batch's predicted memory per rank is under the cost model's "
    "cap",
    "with model_parallel: the layout fits the model and cluster (tp and pp powers of two, tp "
    "inside a node and dividing the heads, pp dividing the layers, tp x pp dividing the world), "
    "the cost model prices it, every group is a replica of tp x pp x (a power of two) ranks, and "
    "every micro-batch is sequence-split with sp_kind 'ring' (context parallelism)",
)
"""The rules `validate_plan` enforces, in words (docs/extending.md lists them for planner
authors)."""


def check_is_plan(plan: Any, who: str = "the planner") -> StepPlan:
    """``plan`` itself when it is a `StepPlan`; else a `PlanError` saying what ``who`` returned."""
    if not isinstance(plan, StepPlan):
        shown = repr(plan)
        raise PlanError(
            f"{who} returned {type(plan).__name__} {shown[:60]}{'...' if len(shown) > 60 else ''}, "
            "not a StepPlan"
        )
    return plan


def validate_plan(
    plan: StepPlan,
    batch: GlobalBatch | int,
    cost: CostModel | None = None,
    num_layers: int | None = None,
    model: ModelSpec | None = None,
) -> None:
    """Raise `PlanError` naming the first offence found; return None for a valid plan.

    Checks (`PLAN_RULES`): group sizes powers of two dividing the world, aligned, inside the
    world (and, with a cost model, inside one node or whole nodes), disjoint within a round;
    with a model (``model``, else the cost model's), sequence-split groups of a size the model's
    attention heads divide; non-empty micro-batches; every sample position in range and used at
    most once, and in fair mode exactly once; checkpoint settings in range; with a cost model, every
    micro-batch's predicted per-rank memory under the cost model's cap. `plan_offences` lists
    every offence instead of the first.
    """
    check_is_plan(plan)
    for offence in _offences(plan, batch, cost, num_layers, model):
        raise PlanError(offence)


def plan_offences(
    plan: StepPlan,
    batch: GlobalBatch | int,
    cost: CostModel | None = None,
    num_layers: int | None = None,
    model: ModelSpec | None = None,
) -> list[str]:
    """Every offence of ``plan`` against the rules `validate_plan` enforces, in words, in the order
    found (an empty list for a valid plan). For a planner author's check (`dcp-bench plan
    --validate`); the run loop stops at the first with `validate_plan`."""
    return list(_offences(plan, batch, cost, num_layers, model))


def _offences(
    plan: StepPlan,
    batch: GlobalBatch | int,
    cost: CostModel | None,
    num_layers: int | None,
    model: ModelSpec | None = None,
) -> Iterator[str]:
    """The checks, one pass over the plan: structure, coverage and head rules per group and
    micro-batch, then every micro-batch's memory in one vectorised cost-model call (at 12,288
    GPUs a plan has ~10^5 micro-batches; one call each took minutes)."""
    n = batch if isinstance(batch, int) else batch.n
    W = plan.world_size
    if W < 1:
        yield f"world_size must be >= 1, got {W}"
        return
    if plan.mode not in ("fair", "paper"):
        yield f"mode must be 'fair' or 'paper', got {plan.mode!r}"
    layers = num_layers if num_layers is not None else (cost.model.num_layers if cost else None)
    model = model if model is not None else (cost.model if cost is not None else None)
    mp = plan.model_parallel
    if mp is not None:
        gpn = cost.cluster.gpus_per_node if cost is not None else W
        why = None if model is None else mp.offence(W, gpn, model.heads, model.num_layers)
        if why is not None:
            yield f"model_parallel: {why}"
            return
        if cost is not None:
            try:  # a cost source without tensor / pipeline pricing says so here
                cost = cost.with_model_parallel(mp)
            except ConfigError as exc:
                yield str(exc)
                return
    used = [-1] * max(n, 0)  # the round of each sample's first use
    used_at = [-1] * max(n, 0)  # ... and its group's first rank
    memory = _MemoryChecks() if cost is not None and not isinstance(batch, int) else None
    for r, rnd in enumerate(plan.rounds):
        owner = np.full(W, -1, dtype=np.int64)
        for g in rnd.groups:
            where = f"round {r}, group at rank {g.start} (size {g.size})"
            placed = yield from _group_offences(where, g, W, cost, owner, model)
            if mp is not None:
                placed = (yield from _model_parallel_offences(where, g, mp)) and placed
            for m, mb in enumerate(g.micro_batches):
                ok = yield from _micro_batch_offences(
                    f"{where}, micro-batch {m}", mb, g, r, n, layers, used, used_at
                )
                if memory is not None and ok and placed:
                    memory.add(f"{where}, micro-batch {m}", mb, plan.context_parallel(g))
    if memory is not None:
        assert cost is not None and not isinstance(batch, int)
        yield from memory.offences(batch, cost)
    if plan.mode == "fair" and n > 0 and min(used) < 0:
        missing = [p for p, r in enumerate(used) if r < 0]
        yield f"fair mode: {len(missing)} sample(s) missing from the plan, e.g. {missing[:5]}"


def _group_offences(
    where: str,
    g: Group,
    W: int,
    cost: CostModel | None,
    owner: np.ndarray,
    model: ModelSpec | None,
) -> Generator[str, None, bool]:
    """What is wrong with where group ``g`` sits in a world of ``W`` ranks; ``owner`` holds the
    round's ranks taken so far (their group's start, -1 when free) and gains ``g``'s. With a
    ``model``, a sequence-split group must be a size its attention heads divide. Returns whether
    the group is placed (a valid size, inside the world)."""
    placed = True
    seq = [mb for mb in g.micro_batches if mb.split == "sequence"]
    # A group of ring or hybrid micro-batches only needs no process group of its own: any block.
    ringed = g.size > 1 and bool(seq) and all(mb.sp_kind in ("ring", "hybrid") for mb in seq)
    batch_split = g.size > 1 and len(seq) < len(g.micro_batches)
    if g.size < 1:
        yield f"{where}: group size must be >= 1"
        placed = False
    elif g.size > W:
        yield f"{where}: group larger than the world ({W} ranks)"
        placed = False
    elif not (is_power_of_two(g.size) and W % g.size == 0 and g.start % g.size == 0) and (
        not ringed or batch_split
    ):
        if not is_power_of_two(g.size):
            what, placed = "group size must be a power of two", False
        elif W % g.size:
            what, placed = f"group size must divide the world size {W}", False
        else:
            what = f"group not aligned (start must be a multiple of {g.size})"
        yield f"{where}: {what} (or every micro-batch of it ring or hybrid: any block of ranks)"
    elif cost is not None and not spans_nodes_cleanly(g.start, g.size, cost.cluster.gpus_per_node):
        yield (
            f"{where}: group crosses a node boundary (nodes of "
            f"{cost.cluster.gpus_per_node} GPUs; a group lies inside one node or is made "
            "of whole nodes)"
        )
    # the heads are sharded over the Ulysses part only: the whole group (ulysses), a hybrid's
    # sub-group, none for a pure ring
    uly = max(
        (
            g.size
            if mb.sp_kind == "ulysses"
            else (mb.ulysses_degree if mb.sp_kind == "hybrid" else 1)
            for mb in g.micro_batches
            if mb.split == "sequence"
        ),
        default=1,
    )
    for mb in seq:
        if mb.sp_kind == "hybrid" and g.size > 1:
            offence = ring_group_offence(g.start, g.size, mb.ulysses_degree, W)
            if offence is not None:
                yield f"{where}: {offence}"
                break
    if (
        cost is not None
        and any(mb.sp_kind in ("ring", "hybrid") for mb in seq)
        and (not cost.prices_ring or not arch_of(cost.model).text_sp_kinds)
    ):
        yield (
            f"{where}: ring or hybrid micro-batches, which the {cost.source} cost model does not "
            f"price for model {cost.model.name!r} (text models only)"
        )
    if model is not None and uly > 1 and placed and is_power_of_two(uly):
        offence = model.sp_degree_offence(uly)
        if offence is not None:
            degrees = [d for d in aligned_sp_degrees(W) if model.sp_degree_offence(d) is None]
            yield (
                f"{where}: the model cannot run it: {offence}; runnable SP degrees on {W} GPUs: "
                f"{', '.join(map(str, degrees))}"
            )
    if g.start < 0 or g.start + g.size > W:
        yield f"{where}: ranks {g.start}..{g.start + g.size - 1} outside world of {W}"
        placed = False
    if placed:
        taken = owner[g.start : g.start + g.size]
        clash = np.flatnonzero(taken >= 0)
        if len(clash):
            rank = g.start + int(clash[0])
            yield f"{where}: overlaps the group at rank {int(owner[rank])} on rank {rank}"
        taken[taken < 0] = g.start
    return placed


def _model_parallel_offences(where: str, g: Group, mp: ModelParallel) -> Generator[str, None, bool]:
    """What is wrong with group ``g`` as one model replica of a `ModelParallel` plan: its size
    tp x pp x cp with cp a power of two, and every micro-batch sequence-split with its context
    parallelism as ring attention (Megatron's context parallel). Returns whether it is placed."""
    cp, rest = divmod(g.size, mp.model_ranks)
    if rest or not is_power_of_two(cp):
        yield (
            f"{where}: a model replica of tp={mp.tp} x pp={mp.pp} x cp ranks needs a size "
            f"tp x pp x (a power of two), got {g.size}"
        )
        return False
    for mb in g.micro_batches:
        if mb.split != "sequence" or mb.sp_kind != "ring":
            yield (
                f"{where}: with model_parallel every micro-batch is split='sequence' with "
                f"sp_kind='ring' (context parallelism), got {mb.split!r} / {mb.sp_kind!r}"
            )
            break
    return True


def _micro_batch_offences(
    where: str,
    mb: MicroBatch,
    g: Group,
    r: int,
    n: int,
    layers: int | None,
    used: list[int],
    used_at: list[int],
) -> Generator[str, None, bool]:
    """What is wrong with micro-batch ``mb`` of group ``g`` in round ``r`` (memory aside);
    ``used`` / ``used_at`` hold the round and group start of every sample planned so far (-1:
    not yet) and gain ``mb``'s. Returns whether its memory can be checked (samples in range,
    a known split, checkpoint setting in range). Plain Python: most micro-batches hold a
    sample or a few, where per-call array overheads would dominate."""
    if not mb.samples:
        yield f"{where}: empty"
        return False
    ok = True
    if mb.split not in ("sequence", "batch"):
        yield f"{where}: unknown split {mb.split!r}"
        ok = False
    if mb.sp_kind not in SP_KINDS:
        yield f"{where}: unknown sp_kind {mb.sp_kind!r}; expected one of {', '.join(SP_KINDS)}"
    elif mb.sp_kind == "hybrid" and not (
        is_power_of_two(mb.ulysses_degree)
        and 1 < mb.ulysses_degree < g.size
        and g.size % mb.ulysses_degree == 0
    ):
        yield (
            f"{where}: hybrid ulysses_degree {mb.ulysses_degree} must be a power of two, more "
            f"than 1, dividing the group size {g.size} and less than it"
        )
    if mb.ckpt_layers < 0 or (layers is not None and mb.ckpt_layers > layers):
        yield f"{where}: ckpt_layers={mb.ckpt_layers} outside 0..{layers}"
        ok = False
    for p in mb.samples:
        if not 0 <= p < n:
            yield f"{where}: sample {p} not in batch of {n}"
            ok = False
        elif used[p] >= 0:
            yield (
                f"sample {p} repeated (round {used[p]}, rank {used_at[p]} and "
                f"round {r}, rank {g.start})"
            )
        else:
            used[p], used_at[p] = r, g.start
    return ok


class _MemoryChecks:
    """The micro-batches whose predicted memory the validator checks, priced together: the
    sequence-split ones in one vectorised `CostModel.microbatch_costs` call, batch-split ones
    (a few image micro-batches) one by one."""

    def __init__(self) -> None:
        self.where: list[str] = []
        self.samples: list[tuple[int, ...]] = []
        self.sizes: list[int] = []
        self.ckpt: list[int] = []
        self.batch_split: list[tuple[int, MicroBatch, int]] = []

    def add(self, where: str, mb: MicroBatch, size: int) -> None:
        if mb.split == "batch" and size > 1:
            self.batch_split.append((len(self.where), mb, size))
        self.where.append(where)
        self.samples.append(mb.samples)
        self.sizes.append(size)
        self.ckpt.append(mb.ckpt_layers)

    def offences(self, batch: GlobalBatch, cost: CostModel) -> Iterator[str]:
        m = len(self.where)
        if m == 0:
            return
        mem = np.zeros(m)
        seq = np.ones(m, dtype=bool)
        for j, mb, size in self.batch_split:
            seq[j] = False
            one = list(mb.samples)
            mem[j] = cost.microbatch_memory(
                batch.tokens[one], batch.frames[one], size, mb.ckpt_layers, mb.split
            )
        idx = np.flatnonzero(seq)
        if len(idx):
            counts = np.fromiter((len(self.samples[j]) for j in idx), np.int64, len(idx))
            pos = np.fromiter(
                (p for j in idx for p in self.samples[j]), np.int64, int(counts.sum())
            )
            mb_index = np.repeat(np.arange(len(idx), dtype=np.int64), counts)
            c = cost.microbatch_costs(
                batch.tokens[pos],
                batch.frames[pos],
                mb_index,
                np.asarray(self.sizes, dtype=np.int64)[idx],
                np.asarray(self.ckpt, dtype=np.int64)[idx],
            )
            mem[idx] = c["mem_bytes"]
        cap = cost.memory_cap_bytes
        for j in np.flatnonzero(mem > cap).tolist():
            yield (
                f"{self.where[j]}: predicted {mem[j] / 2**30:.2f} GiB per rank "
                f"over the memory cap {cap / 2**30:.2f} GiB"
            )
