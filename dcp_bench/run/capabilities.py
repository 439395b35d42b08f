"""What a run's parts can do, as protocols the run path checks with ``isinstance``.

A workload deals global batches (`StepWorkload`); the reference's epoch loop (``run.unit=epoch``)
needs a planner with an epoch sampler (`EpochSampler`) and a workload with a fixed dataset
(`FixedDataset`); a workload that knows the reference's latent-voxel token count of its samples
(`LatentTokens`) has it recorded beside each iteration; one that documents itself
(`DocumentedWorkload`) has its description and provenance kept in the run summary; a planner
that decides which documents a step trains (`BatchDealer`: WLB-LLM delays outliers) deals each
fresh batch before it is planned.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from dcp_bench.batch import GlobalBatch

if TYPE_CHECKING:
    from dcp_bench.cost.base import CostModel
    from dcp_bench.reference.epoch import EpochPlan


@runtime_checkable
class StepWorkload(Protocol):
    """A workload: the global batch of ``step`` for ``world_size`` ranks."""

    def global_batch(
        self, step: int, world_size: int, max_seq_len: int | None = None
    ) -> GlobalBatch: ...


@runtime_checkable
class FixedDataset(Protocol):
    """A workload with a fixed dataset the reference's epoch loop goes through."""

    def epoch_dataset(self, world_size: int, max_seq_len: int | None = None) -> GlobalBatch: ...


@runtime_checkable
class LatentTokens(Protocol):
    """A workload that knows the reference's latent-voxel token count of its samples (None when
    it does not for these)."""

    def latent_tokens(self, sample_ids: Any) -> Any: ...


@runtime_checkable
class DocumentedWorkload(Protocol):
    """A workload that says what it is and where its data comes from (the run summary keeps
    both): a ``description`` and a ``provenance`` (source, licence, data file and its SHA-256)."""

    description: str
    provenance: dict[str, Any]


@runtime_checkable
class EpochSampler(Protocol):
    """A planner with the reference's epoch sampler: an epoch's iterations and their plans."""

    def plan_epoch(self, dataset: GlobalBatch, cost: CostModel, epoch: int = 0) -> EpochPlan: ...


@runtime_checkable
class BatchDealer(Protocol):
    """A planner whose method decides which samples a step trains (e.g. delaying some to a
    later step): given each fresh global batch in step order, the batch the step trains.
    Stateful over a run; every sample it takes in is trained once, in that step or a later
    one (those still held when the run ends are listed by the planner)."""

    def deal_batch(self, batch: GlobalBatch, cost: CostModel) -> GlobalBatch: ...
