"""The cost-model interface every planner, baseline and the simulator use.

One interface, two sources: `analytical` (FLOPs, bytes, bandwidths, efficiency curves) and
`profiled` (tables measured by `dcp-bench profile`). Sizes are numpy arrays, one entry per sample
of a micro-batch: ``tokens`` (frames * spatial) and ``frames`` (T'; 1 for text).

Groups are aligned blocks of ranks and nodes of a multi-node cluster hold a power-of-two number
of GPUs (any number of nodes), so an SP group of size ``sp`` spans nodes exactly when
``sp > cluster.gpus_per_node``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

# The per-GPU memory cap of every method, as a fraction of usable GPU memory: the DCP reference
# profiles under 0.7 (docs/cost_model.md). The one default; configs and reports refer to it.
DEFAULT_MEM_CAP_FRACTION = 0.7

if TYPE_CHECKING:
    from dcp_bench.cost.specs import ClusterSpec, ModelSpec


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
class MicroBatchCost:
    """Predicted cost of one micro-batch on one SP group (per rank; all ranks of a group are
    symmetric)."""

    fwd_s: float
    bwd_s: float
    recompute_s: float
    comm_s: float  # sequence-parallel communication (all-to-all), forward + backward
    mem_bytes: float  # peak memory per rank while this micro-batch runs (static memory included)
    model_flops: float  # model FLOPs of the micro-batch over the whole group, recompute excluded

    @property
    def total_s(self) -> float:
        return self.fwd_s + self.bwd_s + self.recompute_s + self.comm_s


@dataclass
class CostModel(ABC):
    model: ModelSpec
    cluster: ClusterSpec
    mem_cap_fraction: float = DEFAULT_MEM_CAP_FRACTION
    provenance: dict[str, Any] = field(default_factory=dict)

    source: str = "abstract"  # "analytical" or "profiled"

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
    def sample_time(self, tokens: np.ndarray, frames: np.ndarray, sp: int, ckpt_layers: int) -> np.ndarray:
        """Vectorised: the time (s) of each sample run alone as its own micro-batch."""

    @abstractmethod
    def sample_memory(self, tokens: np.ndarray, frames: np.ndarray, sp: int, ckpt_layers: int) -> np.ndarray:
        """Vectorised: activation bytes per rank of each sample (static memory excluded).
        Activation memory is additive over the samples of a packed micro-batch."""

    @abstractmethod
    def static_memory_bytes(self) -> float:
        """Parameters, gradients, optimizer states (with the configured sharding) and workspace
        per rank."""

    @abstractmethod
    def step_sync_time(self) -> float:
        """Gradient all-reduce / reduce-scatter plus optimizer step, once per global batch."""

    def microbatch_memory(
        self,
        tokens: np.ndarray,
        frames: np.ndarray,
        sp: int,
        ckpt_layers: int,
        split: str = "sequence",
    ) -> float:
        return self.microbatch_cost(tokens, frames, sp, ckpt_layers, split).mem_bytes

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
    ) -> dict[str, np.ndarray]:
        """Vectorised over many sequence-split micro-batches: sample ``i`` belongs to micro-batch
        ``mb_index[i]`` (0..m-1, every micro-batch non-empty); ``sp`` and ``ckpt_layers`` have one
        entry per micro-batch. Returns arrays of length m keyed by the `MicroBatchCost` field
        names. The default loops over `microbatch_cost`; sources override it for speed."""
        m = len(sp)
        order = np.argsort(mb_index, kind="stable")
        bounds = np.searchsorted(mb_index[order], np.arange(m + 1))
        out = {k: np.zeros(m) for k in ("fwd_s", "bwd_s", "recompute_s", "comm_s", "mem_bytes", "model_flops")}
        for j in range(m):
            sel = order[bounds[j] : bounds[j + 1]]
            c = self.microbatch_cost(tokens[sel], frames[sel], int(sp[j]), int(ckpt_layers[j]))
            for k in out:
                out[k][j] = getattr(c, k)
        return out

    def spans_nodes(self, sp: int) -> bool:
        return sp > self.cluster.gpus_per_node

    def describe(self) -> dict[str, Any]:
        """Provenance of every number this model produces (shown beside simulated results)."""
        return {"source": self.source, "model": self.model.name, "cluster": self.cluster.name,
                "mem_cap_fraction": self.mem_cap_fraction, **self.provenance}
