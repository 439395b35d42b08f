"""An epoch as the one step loop runs it: a list of (dataset positions, `StepPlan`) pairs.

Each iteration of a dealt epoch (`dcp_bench.reference.samplers.EpochDeal`) becomes one
`StepPlan` over the *sub-batch* of the dataset it trains: the plan names samples by their
position in that sub-batch, so the plan validator checks it like any other (every sample of the
sub-batch exactly once), and either executor runs it as one optimizer step with its gradient
sync. Groups are laid out on contiguous ranks in descending SP order, as the reference maps them
(aligned blocks, since degrees are powers of two). Every sample is sharded along the sequence
(the reference splits images along their spatial tokens too).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from dcp_bench.errors import ConfigError
from dcp_bench.plan import Group, MicroBatch, Round, StepPlan
from dcp_bench.reference.samplers import Bucket, EpochDeal, GroupWork

if TYPE_CHECKING:
    from dcp_bench.batch import GlobalBatch


@dataclass
class EpochIteration:
    """One iteration: the dataset positions it trains (sub-batch order) and its plan over them."""

    positions: np.ndarray
    plan: StepPlan


@dataclass
class EpochPlan:
    """What a planner's ``plan_epoch`` returns: the iterations, and the epoch's accounting
    (samples in the dataset, trained, dropped by reason) and profile summary."""

    iterations: list[EpochIteration]
    info: dict[str, Any] = field(default_factory=dict)


def dataset_buckets(dataset: GlobalBatch) -> list[Bucket]:
    """The dataset's buckets by exact shape (frames, spatial), in order of first appearance, each
    with its members' positions in dataset order (the reference's bucket dict)."""
    key = dataset.frames.astype(np.int64) * (1 << 40) + dataset.spatial.astype(np.int64)
    uniq, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    out = []
    for u in order:
        members = np.flatnonzero(inverse == u).tolist()
        f = int(dataset.frames[members[0]])
        out.append(Bucket((f, int(dataset.spatial[members[0]])), members))
    return out


def bucket_shape(key: Hashable) -> tuple[int, int]:
    """(tokens, frames) of a bucket key (frames, spatial)."""
    assert isinstance(key, tuple) and len(key) == 2
    frames, spatial = int(key[0]), int(key[1])
    return frames * spatial, frames


def bucket_label(key: Hashable) -> str:
    """A bucket key as text: ``FRAMESxSPATIAL`` (latent frames x spatial patches)."""
    tokens, frames = bucket_shape(key)
    return f"{frames}x{tokens // frames}"


def iteration_plan(
    groups: Sequence[GroupWork],
    world_size: int,
    method: str,
    step: int,
    info: dict[str, Any] | None = None,
) -> EpochIteration:
    """One iteration as a plan over its own sub-batch (module docstring)."""
    ordered = sorted(groups, key=lambda g: -g.sp)
    positions: list[int] = []
    out: list[Group] = []
    start = 0
    for g in ordered:
        mbs = []
        for mb in g.positions:
            local = tuple(range(len(positions), len(positions) + len(mb)))
            positions.extend(mb)
            mbs.append(MicroBatch(samples=local, ckpt_layers=g.ckpt_layers, split="sequence"))
        out.append(Group(start=start, size=g.sp, micro_batches=mbs))
        start += g.sp
    if start > world_size:
        raise ConfigError(f"{method}: an iteration needs {start} ranks, the world has {world_size}")
    plan = StepPlan(
        world_size=world_size,
        rounds=[Round(groups=out)],
        method=method,
        mode="paper",
        step=step,
        info=dict(info or {}),
    )
    return EpochIteration(np.asarray(positions, dtype=np.int64), plan)


def merge_iterations(deal: EpochDeal, per_step: int) -> list[list[list[GroupWork]]]:
    """Consecutive iterations grouped ``per_step`` at a time into one optimizer step (0: the whole
    epoch in one): a reading without the per-iteration barrier, not the reference."""
    its = deal.iterations
    if per_step <= 0:
        return [its] if its else []
    return [its[i : i + per_step] for i in range(0, len(its), per_step)]


def packed_plan(
    iterations: Iterable[Sequence[GroupWork]],
    world_size: int,
    method: str,
    step: int,
    info: dict[str, Any] | None = None,
) -> EpochIteration:
    """Several iterations of equal, fixed groups (the baseline's deals) as one plan: each group
    runs its micro-batches of every iteration back to back, one sync at the end."""
    merged: dict[int, GroupWork] = {}
    for it in iterations:
        for slot, g in enumerate(it):
            m = merged.setdefault(slot, GroupWork(g.bucket, g.sp, [], g.ckpt_layers))
            if m.sp != g.sp:
                raise ConfigError(f"{method}: packing deals needs fixed group sizes")
            m.sizes += g.sizes
            m.positions += g.positions
    return iteration_plan(list(merged.values()), world_size, method, step, info)


def deal_summary(deal: EpochDeal) -> dict[str, Any]:
    """The epoch's accounting: samples in the dataset, trained, dropped by reason, iterations,
    and per iteration the SP degrees and micro-batch counts (their distribution, not the list)."""
    sps: dict[int, int] = {}
    micro = 0
    for it in deal.iterations:
        for g in it:
            sps[g.sp] = sps.get(g.sp, 0) + sum(g.sizes)
            micro += len(g.sizes)
    return {
        "dataset_samples": deal.samples,
        "trained_samples": deal.trained,
        "dropped_samples": dict(deal.dropped),
        "iterations": len(deal.iterations),
        "micro_batches": micro,
        "samples_per_sp": {str(k): v for k, v in sorted(sps.items())},
        "reference_imbalance": reference_imbalance(deal),
    }


def reference_imbalance(deal: EpochDeal) -> float | None:
    """The epoch's imbalance as the reference's samplers estimate it from the profile, not from
    a simulation (VideoSys 4cce477 `videosys/training/datasets/open_sora/sampler.py:259-271`
    for the bucket sampler, `:929-957` for DCP, the epoch total at `:1081-1084`): each rank's
    time in an iteration is its group's profiled micro-batch time times its micro-batches; the
    iteration's imbalance is the mean over ranks of (slowest - own); the epoch's is the sum of
    those over the sum of the iterations' slowest times. None for an empty epoch."""
    idle = total = 0.0
    for it in deal.iterations:
        if not it:
            continue
        times = [(g.time_s * len(g.sizes), g.sp) for g in it]
        slowest = max(t for t, _ in times)
        ranks = sum(sp for _, sp in times)
        idle += sum((slowest - t) * sp for t, sp in times) / ranks
        total += slowest
    return idle / total if total > 0 else None


__all__ = [
    "EpochIteration",
    "EpochPlan",
    "bucket_label",
    "bucket_shape",
    "dataset_buckets",
    "deal_summary",
    "reference_imbalance",
    "iteration_plan",
    "merge_iterations",
    "packed_plan",
]
