"""The cost-model interface every planner, baseline and the simulator use.

One interface, two sources: `analytical` (FLOPs, bytes, bandwidths, efficiency curves) and
`profiled` (tables measured by `dcp-bench profile`). Sizes are numpy arrays, one entry per sample
of a micro-batch: ``tokens`` (frames * spatial) and ``frames`` (T'; 1 for text).

Groups are aligned blocks of ranks and nodes of a multi-node cluster hold a power-of-two number
of GPUs (any number of nodes), so an SP group of size ``sp`` spans nodes exactly when
``sp > cluster.gpus_per_node``.
"""

from __future__ import annotations

import functools
import operator
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import numpy as np

from dcp_bench.archs import arch_of
from dcp_bench.config import MEM_CAP_FRACTION
from dcp_bench.cost.activations import activation_terms
from dcp_bench.cost.specs import describe_sp_degrees, runnable_sp_degrees
from dcp_bench.errors import ConfigError
from dcp_bench.layout import ring_group_settings

# The per-GPU memory cap of every method, as a fraction of usable GPU memory: the DCP reference
# profiles under 0.7 (docs/cost_model.md). The one default; configs and reports refer to it.
DEFAULT_MEM_CAP_FRACTION = MEM_CAP_FRACTION.default  # declared once: dcp_bench.config

if TYPE_CHECKING:
    from dcp_bench.cost.specs import ClusterSpec, ModelSpec
    from dcp_bench.layout import ModelParallel


def deal_by_tokens(tokens: np.ndarray, size: int) -> np.ndarray:
    """The rank (0..size-1) each sample of a batch-split micro-batch runs on, dealt as the runtime
    deals them (`dcp_bench.runtime.executor.deal_samples`): largest first (ties by position),
    each to the rank with the fewest tokens so far (ties to the lowest rank)."""
    t = np.asarray(tokens)
    owner = np.empty(len(t), dtype=np.int64)
    load = np.zeros(size)
    for i in sorted(range(len(t)), key=lambda j: (-int(t[j]), j)):
        r = int(np.argmin(load))  # argmin returns the lowest index among ties
        owner[i] = r
        load[r] += int(t[i])
    return owner


@dataclass(frozen=True)
class TimeTerm:
    """One declared time term of a cost model: seconds per rank, named ``name`` in
    `CostModel.microbatch_costs` (per micro-batch) or `CostModel.step_sync_breakdown` (once per
    step). Everything that sums, books or reports time iterates the declared terms
    (`CostModel.time_terms`, `CostModel.step_terms`) instead of naming them."""

    name: str  # the key, e.g. "comm_s"
    part: str  # the part of a step's time it is booked to: a step record's column, a report row
    label: str  # what the report calls that part
    communication: bool = False  # counted in a step's communication share
    sequence_split_only: bool = (
        False  # zero in a batch-split micro-batch (sequence-parallel collectives)
    )


# The micro-batch time terms every cost source prices, in the order every total adds them.
MICROBATCH_TIME_TERMS: tuple[TimeTerm, ...] = (
    TimeTerm("fwd_s", "compute_s", "forward + backward compute"),
    TimeTerm("bwd_s", "compute_s", "forward + backward compute"),
    TimeTerm("recompute_s", "recompute_s", "activation recomputation"),
    TimeTerm(
        "comm_s",
        "comm_s",
        "sequence-parallel communication",
        communication=True,
        sequence_split_only=True,
    ),
)
# The once-per-step terms (`CostModel.step_sync_breakdown`); a step account books them together.
SYNC_PART = "sync_s"
STEP_TIME_TERMS: tuple[TimeTerm, ...] = (
    TimeTerm("grad_sync_s", SYNC_PART, "gradient sync + optimizer step", communication=True),
    TimeTerm("optimizer_s", SYNC_PART, "gradient sync + optimizer step"),
)
# What a micro-batch's cost holds besides its time terms (the other keys of `microbatch_costs`).
MICROBATCH_OTHER_KEYS = ("mem_bytes", "model_flops")

_T = TypeVar("_T", float, np.ndarray)


def add_in_order(values: list[_T]) -> _T:
    """The sum of ``values`` left to right (every total of time terms adds them in declaration
    order this way, so a total is bit-identical wherever it is computed; from Python 3.12 `sum`
    of floats compensates rounding and can differ in the last bit)."""
    return functools.reduce(operator.add, values)


def time_parts(terms: tuple[TimeTerm, ...]) -> dict[str, str]:
    """The parts ``terms`` are booked to, in declaration order, with their labels."""
    return {t.part: t.label for t in terms}


@dataclass(frozen=True)
class MicroBatchCost:
    """Predicted cost of one micro-batch on one SP group (per rank; all ranks of a group are
    symmetric). The time terms are `MICROBATCH_TIME_TERMS` and, in ``added_s``, the ones a cost
    model declares beyond them (`CostModel.time_terms`), in declaration order."""

    fwd_s: float
    bwd_s: float
    recompute_s: float
    comm_s: float  # sequence-parallel communication (all-to-all), forward + backward
    mem_bytes: float  # peak memory per rank while this micro-batch runs (static memory included)
    model_flops: float  # model FLOPs of the micro-batch over the whole group, recompute excluded
    added_s: tuple[tuple[str, float], ...] = ()  # (name, seconds) of the added time terms

    @classmethod
    def from_terms(cls, values: Mapping[str, float]) -> MicroBatchCost:
        """From every time term and `MICROBATCH_OTHER_KEYS` by name (as `microbatch_costs` keys
        them); names beyond `MICROBATCH_TIME_TERMS` become ``added_s`` in the order given."""
        base = {t.name for t in MICROBATCH_TIME_TERMS} | set(MICROBATCH_OTHER_KEYS)
        return cls(
            **{k: float(values[k]) for k in base},
            added_s=tuple((k, float(v)) for k, v in values.items() if k not in base),
        )

    def times(self) -> dict[str, float]:
        """Every time term by name, in declaration order."""
        return {
            **{t.name: float(getattr(self, t.name)) for t in MICROBATCH_TIME_TERMS},
            **dict(self.added_s),
        }

    @property
    def total_s(self) -> float:
        return add_in_order(list(self.times().values()))


@dataclass
class CostModel(ABC):
    model: ModelSpec
    cluster: ClusterSpec
    mem_cap_fraction: float = DEFAULT_MEM_CAP_FRACTION
    provenance: dict[str, Any] = field(default_factory=dict)

    source: str = "abstract"  # "analytical" or "profiled"
    # The declared time terms (`TimeTerm`): per micro-batch (`microbatch_costs`) and once per step
    # (`step_sync_breakdown`). A cost model that adds a term declares it here and prices it in
    # `added_costs` (docs/extending.md, "A new cost term"); nothing else names it.
    time_terms: ClassVar[tuple[TimeTerm, ...]] = MICROBATCH_TIME_TERMS
    step_terms: ClassVar[tuple[TimeTerm, ...]] = STEP_TIME_TERMS
    # Whether `microbatch_cost` takes ``sp_kind`` and ``ulysses_degree`` (ring and hybrid SP,
    # `dcp_bench.plan.MicroBatch`); sources that cannot price them refuse such micro-batches.
    prices_ring: ClassVar[bool] = False
    # Whether the source splits a ring or hybrid micro-batch's time into per-sample packed shares
    # and a fixed cost (`ring_packed_share`), as the lower bound needs. Planners use ring and
    # hybrid groups (`ring_settings`) only with such a source, so the bound always covers them.
    bounds_ring: ClassVar[bool] = False

    @property
    def memory_cap_bytes(self) -> float:
        """Per-GPU memory cap that plans must respect."""
        return self.mem_cap_fraction * self.cluster.gpu.usable_mem_bytes

    @abstractmethod
    def microbatch_cost(
        self,
        tokens: np.ndarray,
        frames: np.ndarray,
        sp: int,
        ckpt_layers: int,
        split: str = "sequence",
    ) -> MicroBatchCost:
        """Cost of the samples packed into one micro-batch on an SP group of ``sp`` ranks with the
        first ``ckpt_layers`` layers checkpointed."""

    @abstractmethod
    def sample_time(
        self, tokens: np.ndarray, frames: np.ndarray, sp: int, ckpt_layers: int
    ) -> np.ndarray:
        """Vectorised: the time (s) of each sample run alone as its own micro-batch."""

    @abstractmethod
    def sample_memory(
        self, tokens: np.ndarray, frames: np.ndarray, sp: int, ckpt_layers: int
    ) -> np.ndarray:
        """Vectorised: activation bytes per rank of each sample (static memory excluded).
        Activation memory is additive over the samples of a packed micro-batch."""

    @abstractmethod
    def static_memory_bytes(self) -> float:
        """Parameters, gradients, optimizer states (with the configured sharding) and workspace
        per rank."""

    @abstractmethod
    def step_sync_time(self) -> float:
        """Gradient all-reduce / reduce-scatter plus optimizer step, once per global batch."""

    def step_sync_breakdown(self) -> dict[str, float]:
        """`step_sync_time` by declared step term (`step_terms`). Sources that cannot separate
        it book the whole of it to the gradient sync (communication)."""
        return {"grad_sync_s": self.step_sync_time()}

    def added_costs(
        self,
        tokens: np.ndarray,
        frames: np.ndarray,
        mb_index: np.ndarray,
        sp: np.ndarray,
        ckpt_layers: np.ndarray,
    ) -> dict[str, np.ndarray]:
        """Seconds per rank of every time term this model declares beyond
        `MICROBATCH_TIME_TERMS` (the rest of `time_terms`, in that order), for the micro-batches
        `microbatch_costs` describes (same arguments: sample ``i`` in micro-batch
        ``mb_index[i]``; ``sp`` and ``ckpt_layers`` one entry per micro-batch). Every source adds
        them to `microbatch_costs`, `microbatch_cost` and `sample_time`, so the planners, the
        simulator and the records see them. The bounds (`sample_time_packed`,
        `microbatch_overhead`) leave them out, which keeps them bounds. Default: none."""
        del tokens, frames, mb_index, sp, ckpt_layers
        return {}

    def with_added_costs(
        self,
        costs: dict[str, np.ndarray],
        tokens: np.ndarray,
        frames: np.ndarray,
        mb_index: np.ndarray,
        sp: np.ndarray,
        ckpt_layers: np.ndarray,
    ) -> dict[str, np.ndarray]:
        """A source's own costs (`MICROBATCH_TIME_TERMS` and `MICROBATCH_OTHER_KEYS`) with the
        terms this model adds (`added_costs`), each checked against its declaration."""
        declared = [t.name for t in self.time_terms]
        if declared[: len(MICROBATCH_TIME_TERMS)] != [t.name for t in MICROBATCH_TIME_TERMS]:
            raise TypeError(
                f"{type(self).__name__}.time_terms must start with MICROBATCH_TIME_TERMS; got "
                f"{declared}"
            )
        added = self.added_costs(tokens, frames, mb_index, sp, ckpt_layers)
        if list(added) != declared[len(MICROBATCH_TIME_TERMS) :]:
            raise TypeError(
                f"{type(self).__name__}.added_costs priced {list(added)}; its time_terms declare "
                f"{declared[len(MICROBATCH_TIME_TERMS) :]} beyond MICROBATCH_TIME_TERMS"
            )
        m = len(sp)
        return {
            **costs,
            **{
                k: np.broadcast_to(np.asarray(v, dtype=float), (m,)).copy()
                for k, v in added.items()
            },
        }

    def total_time(self, costs: Mapping[str, _T]) -> _T:
        """The sum of the declared time terms (`time_terms`) of ``costs`` (`microbatch_costs`'s
        arrays or one micro-batch's floats), in declaration order."""
        return add_in_order([costs[t.name] for t in self.time_terms])

    def with_model_parallel(self, mp: ModelParallel) -> CostModel:
        """This cost model pricing a plan's Megatron-style tensor and pipeline parallelism
        (`dcp_bench.layout.ModelParallel`). Sources that cannot price it refuse."""
        raise ConfigError(
            f"the {self.source} cost model ({type(self).__name__}) prices no tensor or pipeline "
            f"parallelism (tp={mp.tp}, pp={mp.pp}); use cost.source=analytical"
        )

    def microbatch_memory(
        self,
        tokens: np.ndarray,
        frames: np.ndarray,
        sp: int,
        ckpt_layers: int,
        split: str = "sequence",
    ) -> float:
        return self.microbatch_cost(tokens, frames, sp, ckpt_layers, split).mem_bytes

    def checkpointed_layer_bytes(self, tokens_per_rank: float, sp: int) -> float:
        """Bytes one checkpointed layer unit keeps per rank (its checkpointed blocks' inputs) for
        a sequence-split micro-batch of ``tokens_per_rank``, as this source counts them in
        `microbatch_memory`: the difference a layer more or less makes with every layer
        checkpointed. Default: the closed-form bytes the runtime's models keep per checkpointed
        layer unit (`dcp_bench.cost.activations`); sources with their own memory law override it."""
        del sp
        return float(tokens_per_rank * activation_terms(self.model).checkpoint_input_tok)

    def sample_time_packed(
        self, tokens: np.ndarray, frames: np.ndarray, sp: int, ckpt_layers: int
    ) -> np.ndarray:
        """Vectorised: each sample's share of a micro-batch packed with enough other samples to
        saturate the kernels (no fixed per-micro-batch overheads). A micro-batch never takes less
        than the sum of its samples' shares, which makes this the basis of the lower bound.
        Sources that cannot separate the overheads return `sample_time` (still an upper bound on
        the share, so a bound built from it is labelled by the source)."""
        return self.sample_time(tokens, frames, sp, ckpt_layers)

    def microbatch_overhead(self, sp: int, ckpt_layers: int) -> float:
        """Seconds every sequence-split micro-batch on ``sp`` ranks with ``ckpt_layers``
        checkpointed layers takes beyond the sum of its samples' packed shares
        (`sample_time_packed`): the fixed costs it pays once however many samples it holds
        (GEMMs below their saturated efficiency, collective latencies). A micro-batch never takes
        less than its shares plus this; with the memory cap limiting the tokens of a micro-batch,
        it tightens the lower bound (`dcp_bench.sim.sample_bounds`). Sources that cannot
        separate these costs return 0, which is always true."""
        del sp, ckpt_layers
        return 0.0

    def microbatch_token_capacity(self, sp: int, ckpt_layers: int) -> float:
        """The most tokens per rank a sequence-split micro-batch on ``sp`` ranks with
        ``ckpt_layers`` checkpointed layers can hold under the memory cap.

        Activation memory is additive over a micro-batch's samples (`sample_memory`). When a
        sample's memory is ``a + b * tokens / sp`` with ``a >= 0`` and no dependence on its frame
        count (both sources), a micro-batch of x tokens per rank needs at least ``a + b * x``, so
        x <= (cap - static - a) / b. Where the memory law is not of that form no capacity is
        claimed (inf), which keeps every bound built on it true."""
        budget = self.memory_cap_bytes - self.static_memory_bytes()
        big = 1 << 20
        probe = np.asarray([0, sp, big * sp, big * sp], dtype=np.int64)
        frames = np.asarray([1, 1, 1, 16], dtype=np.int64)
        m0, m1, mb, mb16 = (float(v) for v in self.sample_memory(probe, frames, sp, ckpt_layers))
        a, b = m0, m1 - m0
        if a >= 0 and b > 0 and abs(mb - (a + b * big)) <= 1e-9 * abs(mb) and mb16 == mb:
            return max(budget - a, 0.0) / b
        return float("inf")

    def microbatch_costs(
        self,
        tokens: np.ndarray,
        frames: np.ndarray,
        mb_index: np.ndarray,
        sp: np.ndarray,
        ckpt_layers: np.ndarray,
        ulysses: np.ndarray | None = None,
    ) -> dict[str, np.ndarray]:
        """Vectorised over many sequence-split micro-batches: sample ``i`` belongs to micro-batch
        ``mb_index[i]`` (0..m-1, every micro-batch non-empty); ``sp`` and ``ckpt_layers`` have one
        entry per micro-batch. Returns arrays of length m keyed by the declared time terms
        (`time_terms`) and `MICROBATCH_OTHER_KEYS`. ``ulysses`` (None: Ulysses over each whole
        group) gives each micro-batch's head-sharding span (`dcp_bench.layout.ulysses_span`):
        smaller than its group means ring attention across the rest (ring or hybrid SP); only
        sources that price ring attention accept it (`AnalyticalCostModel`). The default loops
        over `microbatch_cost`; sources override it for speed."""
        ring = ulysses is not None and not np.array_equal(np.asarray(ulysses), np.asarray(sp))
        if ring and not self.prices_ring:
            raise ConfigError(
                f"the {self.source} cost model ({type(self).__name__}) does not price ring or "
                "hybrid sequence parallelism; use cost.source=analytical"
            )
        m = len(sp)
        order = np.argsort(mb_index, kind="stable")
        bounds = np.searchsorted(mb_index[order], np.arange(m + 1))
        out = {k: np.zeros(m) for k in (*(t.name for t in self.time_terms), *MICROBATCH_OTHER_KEYS)}
        for j in range(m):
            sel = order[bounds[j] : bounds[j + 1]]
            size, ckpt = int(sp[j]), int(ckpt_layers[j])
            u = size if ulysses is None else int(np.asarray(ulysses)[j])
            if u == size:
                c = self.microbatch_cost(tokens[sel], frames[sel], size, ckpt)
            else:  # a source with prices_ring takes the micro-batch's kind
                kind = "ring" if u == 1 else "hybrid"
                c = self.microbatch_cost(  # type: ignore[call-arg]
                    tokens[sel], frames[sel], size, ckpt, "sequence", sp_kind=kind, ulysses_degree=u
                )
            values = {**c.times(), "mem_bytes": c.mem_bytes, "model_flops": c.model_flops}
            for k in out:
                out[k][j] = values[k]
        return out

    # -- batched over settings: one call for many (sample, SP degree, checkpoint) triples ------
    # A planner that prices every shape of a batch at every SP degree (`build_shape_table`) asks
    # once instead of once per degree and checkpoint count. Sample ``i`` is priced at ``sp[i]``
    # and ``ckpt_layers[i]`` exactly as the per-setting method prices it (same value, bit for
    # bit); the defaults call that method once per distinct setting, sources override them.

    def sample_time_many(
        self, tokens: np.ndarray, frames: np.ndarray, sp: np.ndarray, ckpt_layers: np.ndarray
    ) -> np.ndarray:
        """`sample_time` of sample ``i`` at ``sp[i]``, ``ckpt_layers[i]``."""
        return self._per_setting(self.sample_time, tokens, frames, sp, ckpt_layers)

    def sample_time_packed_many(
        self, tokens: np.ndarray, frames: np.ndarray, sp: np.ndarray, ckpt_layers: np.ndarray
    ) -> np.ndarray:
        """`sample_time_packed` of sample ``i`` at ``sp[i]``, ``ckpt_layers[i]``."""
        return self._per_setting(self.sample_time_packed, tokens, frames, sp, ckpt_layers)

    def sample_memory_many(
        self, tokens: np.ndarray, frames: np.ndarray, sp: np.ndarray, ckpt_layers: np.ndarray
    ) -> np.ndarray:
        """`sample_memory` of sample ``i`` at ``sp[i]``, ``ckpt_layers[i]``."""
        return self._per_setting(self.sample_memory, tokens, frames, sp, ckpt_layers)

    @staticmethod
    def _per_setting(
        fn: Any, tokens: np.ndarray, frames: np.ndarray, sp: np.ndarray, ckpt_layers: np.ndarray
    ) -> np.ndarray:
        n = len(tokens)
        s = np.broadcast_to(np.asarray(sp, dtype=np.int64), (n,))
        k = np.broadcast_to(np.asarray(ckpt_layers, dtype=np.int64), (n,))
        out = np.zeros(n)
        if n == 0:
            return out
        keys, inverse = np.unique(s * (1 << 20) + k, return_inverse=True)
        for j, key in enumerate(keys.tolist()):
            sel = np.flatnonzero(inverse == j)
            out[sel] = fn(tokens[sel], frames[sel], key >> 20, key & ((1 << 20) - 1))
        return out

    def spans_nodes(self, sp: int) -> bool:
        return sp > self.cluster.gpus_per_node

    def sp_degrees(self) -> list[int]:
        """The SP degrees plans may use on this cluster with this model: aligned degrees the
        model's attention heads divide (`dcp_bench.cost.specs.runnable_sp_degrees`). Every
        planner takes its degrees from here."""
        return runnable_sp_degrees(self.model, self.cluster.world_size)

    def ring_settings(self) -> list[tuple[int, int]]:
        """(group size, Ulysses span) of the ring and hybrid groups plans may use beside the
        Ulysses degrees (`sp_degrees`), ascending by size: every aligned size the model's heads
        do not divide, and groups of whole nodes larger than the largest aligned group, up to
        `MAX_RING_NODES` nodes (a world of 3 nodes of 8 has aligned groups of at most 8 GPUs;
        a ring of 16 or 24 holds a 1M-token document). Each runs Ulysses over the largest
        runnable degree that divides its size (and, for whole-node groups, the node: the
        sub-groups are then aligned blocks), ring attention across (a span of 1: pure ring).
        Empty for video models (DSP) and for sources without `bounds_ring`."""
        if not (self.bounds_ring and self.prices_ring and arch_of(self.model).text_sp_kinds):
            return []
        return ring_group_settings(
            self.cluster.world_size, self.cluster.gpus_per_node, self.sp_degrees()
        )

    def ring_packed_share(
        self, tokens: np.ndarray, frames: np.ndarray, sp: int, ulysses: int, ckpt_layers: int
    ) -> np.ndarray:
        """Vectorised: each sample's packed share (`sample_time_packed`) of a ring or hybrid
        micro-batch on ``sp`` ranks with a Ulysses span of ``ulysses``; with
        ``microbatch_overhead(ulysses, ckpt_layers)`` added once per micro-batch it is a lower
        bound of the micro-batch's time. Sources with `bounds_ring` implement it."""
        raise ConfigError(
            f"the {self.source} cost model ({type(self).__name__}) gives no packed shares of "
            "ring or hybrid micro-batches"
        )

    def describe_sp_degrees(self) -> str:
        """`sp_degrees` in words, with why (for errors that say no degree fits)."""
        return describe_sp_degrees(self.model, self.cluster.world_size)

    def describe(self) -> dict[str, Any]:
        """Provenance of every number this model produces (shown beside simulated results)."""
        return {
            "source": self.source,
            "model": self.model.name,
            "cluster": self.cluster.name,
            "mem_cap_fraction": self.mem_cap_fraction,
            **self.provenance,
        }
