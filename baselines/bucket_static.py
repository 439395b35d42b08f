"""`bucket_static`: Open-Sora / VideoSys "bucket parallel", the static baseline of the DCP paper.

One fixed SP degree for every sample, samples grouped into shape buckets, one batch size per
bucket (the largest that fits the memory cap at that SP degree), full activation checkpointing.
Fair mode runs every sample of the global batch exactly once; paper mode with ``run.unit=step``
deals one batch per step (median-time batch-size damping, skipped buckets, one bucket per
data-parallel replica, remainder dropped), all deals in one plan. The reference runtime itself
(paper mode, ``run.unit=epoch``) is `BucketStatic.plan_epoch`: the reference profile (powers of
two, no cap, its throughput guard and median damping over all profiled buckets) and the
reference's bucket sampler over a fixed dataset, every deal its own iteration (its own barrier,
gradient sync and optimizer step). See baselines/README.md for sources and deviations.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any

import numpy as np

from baselines.scheduling import (
    check_sp_degree,
    ckpt_layers_for,
    largest_batch_size,
    smallest_sp_for_batch,
    split_for,
    static_round,
)
from dcp_bench.archs import get_arch
from dcp_bench.errors import ConfigError, InfeasibleError
from dcp_bench.plan import MicroBatch, Mode, Split, StepPlan
from dcp_bench.planners.base import Planner
from dcp_bench.reference.epoch import (
    EpochPlan,
    bucket_label,
    bucket_shape,
    dataset_buckets,
    deal_summary,
    iteration_plan,
    merge_iterations,
    packed_plan,
)
from dcp_bench.reference.samplers import bucket_epoch
from dcp_bench.reference.trial_search import (
    MEMORY_BELIEFS,
    BucketProfile,
    baseline_search,
    cost_measure,
    damp_to_median,
    profile_memory_info,
)

if TYPE_CHECKING:
    from dcp_bench.batch import GlobalBatch
    from dcp_bench.cost.base import CostModel

BucketKey = tuple[int, int]


def bucket_key(tokens: int, frames: int, arch: str) -> BucketKey:
    """The size bucket of a sample, as its architecture states it (`dcp_bench.archs`): STDiT3
    video by exact latent shape (T', spatial), as the reference's (resolution, frame count)
    buckets do; text by the next power of two of its length."""
    return get_arch(arch).bucket_key(tokens, frames)


def damp_batch_sizes(
    bs: dict[BucketKey, int], times: dict[BucketKey, float]
) -> dict[BucketKey, int]:
    """The reference benchmark's rule: for every bucket slower than the median bucket time
    t_med, bs := max(1, floor(bs * t_med / t)). Buckets at or below the median keep their size."""
    if not times:
        return dict(bs)
    t_med = float(np.median(list(times.values())))
    out = {}
    for k, b in bs.items():
        t = times[k]
        out[k] = max(1, int(np.floor(b * t_med / t))) if t > t_med else b
    return out


# Fair mode's per-bucket batch sizes: "reference" = the reference baseline's rules (its profile's
# power-of-two search on its own memory prediction, no upper bound, then the damping toward the
# median bucket time); "capped" = the largest batch the counted memory fits, at most
# max_batch_size, no damping (a weaker baseline, labelled as such).
BATCH_RULES = ("reference", "capped")


class BucketStatic(Planner):
    """Fixed SP degree, per-bucket batch sizes, full checkpointing (Open-Sora bucket parallel).

    Args:
        mode: "fair" (every sample once) or "paper" (the reference benchmark's behaviour).
        sp: fixed SP degree; None = the smallest that fits the longest sequence seen so far
            (it only grows, so the degree stays fixed once the workload's longest has appeared).
        recompute: "full" (the reference), "selective" or "none".
        seed: seeds the random order in which micro-batches are dealt to replicas.
        max_batch_size: upper bound on a bucket's batch size (fair and per-step paper mode; the
            reference profile of ``plan_epoch`` has no bound).
        deals_per_iteration: ``plan_epoch`` only: deals per optimizer step. 1 (the reference):
            every deal is an iteration with its own barrier and gradient sync; k > 1: k deals
            run back to back in one plan; 0: the epoch's deals in one plan (readings for the
            report, not the reference).
        profile_memory: "reference" (a profile trial fits when the reference's own memory
            prediction is under the cap, `trial_search.cost_measure`) or "counted" (the counted
            memory decides); the epoch's profile and fair mode's reference rules.
        batch_rules: fair mode's per-bucket batch sizes (`BATCH_RULES`): "reference" (the
            reference baseline's profile and damping, over the buckets of the global batch) or
            "capped" (the old rule; a run's label names the override).
    """

    name = "bucket_static"
    source = (
        "Open-Sora v1.2 / VideoSys bucket parallel (VideoSys 4cce477), the DCP paper's baseline. "
        "Defaults: the smallest fixed SP degree that fits (the reference benchmark: 4), full "
        "checkpointing as the reference config, per-bucket batch sizes."
    )
    OPTION_MINIMA = {"max_batch_size": 1}
    SP_OPTIONS = ("sp",)

    def __init__(
        self,
        mode: Mode = "fair",
        sp: int | None = None,
        recompute: str = "full",
        seed: int = 0,
        max_batch_size: int = 256,
        deals_per_iteration: int = 1,
        profile_memory: str = "reference",
        batch_rules: str = "reference",
    ) -> None:
        super().__init__(mode)
        if batch_rules not in BATCH_RULES:
            raise ConfigError(
                f"bucket_static: batch_rules={batch_rules!r}; expected one of "
                f"{', '.join(BATCH_RULES)}"
            )
        self.batch_rules = str(batch_rules)
        if profile_memory not in MEMORY_BELIEFS:
            raise ConfigError(
                f"bucket_static: profile_memory={profile_memory!r}; expected one of "
                f"{', '.join(MEMORY_BELIEFS)}"
            )
        self.profile_memory = str(profile_memory)
        self.sp = sp
        self.recompute = recompute
        self.seed = seed
        self.max_batch_size = max_batch_size
        if int(deals_per_iteration) < 0:
            raise ConfigError(
                f"bucket_static: deals_per_iteration={deals_per_iteration}; expected 0 (all deals "
                "of the epoch in one plan) or a count >= 1"
            )
        self.deals_per_iteration = int(deals_per_iteration)
        self._auto_sp = 1  # the smallest fitting degree of the longest sample seen so far
        ckpt_layers_for(recompute, 1)  # reject an unknown policy at construction
        self._ref_profiles: dict[
            int, tuple[Any, dict[tuple[int, int, int, int], BucketProfile | None]]
        ] = {}

    def fixed_sp(self, batch: GlobalBatch, cost: CostModel, ckpt: int) -> int:
        W = cost.cluster.world_size
        if self.sp is not None:
            check_sp_degree(int(self.sp), W, cost.model)
            return int(self.sp)
        self._auto_sp = max(self._auto_sp, smallest_sp_for_batch(batch, cost, ckpt))
        return self._auto_sp

    def plan(self, batch: GlobalBatch, cost: CostModel) -> StepPlan:
        W = cost.cluster.world_size
        ckpt = ckpt_layers_for(self.recompute, cost.model.num_layers)
        sp = self.fixed_sp(batch, cost, ckpt)
        dp = W // sp

        buckets: dict[BucketKey, list[int]] = defaultdict(list)
        for p in range(batch.n):
            buckets[bucket_key(int(batch.tokens[p]), int(batch.frames[p]), cost.model.arch)].append(
                p
            )
        keys = sorted(buckets)

        bs: dict[BucketKey, int] = {}
        splits: dict[BucketKey, Split] = {}
        reference_rules = self.mode == "fair" and self.batch_rules == "reference"
        ref_times: dict[BucketKey, float] = {}
        for k in keys:
            pos = buckets[k]
            rep = max(pos, key=lambda p: int(batch.tokens[p]))  # the bucket's largest sample
            splits[k] = split_for(batch, pos, cost)
            if reference_rules:
                prof = self.reference_profile(
                    cost, int(batch.tokens[rep]), int(batch.frames[rep]), sp, ckpt
                )
                bs[k] = 0 if prof is None else prof.bs
                if prof is not None:
                    ref_times[k] = prof.time_s
                continue
            limit = (
                self.max_batch_size if self.mode == "paper" else min(self.max_batch_size, len(pos))
            )
            bs[k] = largest_batch_size(
                int(batch.tokens[rep]), int(batch.frames[rep]), cost, sp, ckpt, splits[k], limit
            )
        if reference_rules and ref_times:
            # the reference's damping toward the median time of the profiled buckets
            # (`profiler.py:318-364`), over the buckets this global batch holds
            damped = damp_batch_sizes({k: bs[k] for k in ref_times}, ref_times)
            bs = {k: min(damped.get(k, b), len(buckets[k])) if b else 0 for k, b in bs.items()}

        skipped = [k for k in keys if bs[k] == 0]
        if skipped and self.mode == "fair":
            k = skipped[0]
            raise InfeasibleError(
                f"bucket {k} (frames, spatial) does not fit at batch size 1 with the fixed SP "
                f"degree {sp} and {ckpt} checkpointed layers; a larger sp is needed"
            )
        live = [k for k in keys if bs[k] > 0]
        if self.mode == "paper":
            times = {}
            for k in live:
                rep = max(buckets[k], key=lambda p: int(batch.tokens[p]))
                t = np.full(bs[k], batch.tokens[rep])
                f = np.full(bs[k], batch.frames[rep])
                times[k] = cost.microbatch_cost(t, f, sp, ckpt, splits[k]).total_s
            bs = {**bs, **damp_batch_sizes({k: bs[k] for k in live}, times)}

        micro: list[MicroBatch] = []
        for k in live:
            pos = buckets[k]
            for i in range(0, len(pos), bs[k]):
                micro.append(
                    MicroBatch(tuple(pos[i : i + bs[k]]), ckpt_layers=ckpt, split=splits[k])
                )
        rng = np.random.default_rng([self.seed, batch.step])
        order = rng.permutation(len(micro))
        micro = [micro[i] for i in order]

        info: dict[str, Any] = {
            "sp": sp,
            "ckpt_layers": ckpt,
            "recompute": self.recompute,
            "bucket_batch_sizes": {f"{k[0]}x{k[1]}": bs[k] for k in keys},
        }
        if self.mode == "paper":
            # One micro-batch per replica per reference step; only whole deals are kept.
            per_replica = max(1, len(micro) // dp)
            kept = micro[: per_replica * dp]
            dropped = micro[per_replica * dp :]
            per_group = [kept[g::dp] for g in range(dp)]
            info.update(
                reference_steps=per_replica,
                skipped_buckets=[f"{k[0]}x{k[1]}" for k in skipped],
                dropped_samples=sum(len(mb.samples) for mb in dropped)
                + sum(len(buckets[k]) for k in skipped),
            )
        else:
            per_group = [micro[g::dp] for g in range(dp)]
        return StepPlan(
            world_size=W,
            rounds=[static_round(W, sp, per_group)],
            method=self.name,
            mode=self.mode,
            step=batch.step,
            info=info,
        )

    # -- the reference runtime: an epoch (run.unit=epoch) ---------------------------------------

    def reference_profile(
        self, cost: CostModel, tokens: int, frames: int, sp: int, ckpt: int
    ) -> BucketProfile | None:
        """The reference baseline profile of one bucket shape at the fixed degree (cached)."""
        entry = self._ref_profiles.setdefault(id(cost), (cost, {}))
        key = (tokens, frames, sp, ckpt)
        if key not in entry[1]:
            measure = cost_measure(
                cost, tokens, frames, pac=False, ckpt_layers=ckpt, memory=self.profile_memory
            )
            entry[1][key] = baseline_search(measure, sp)
        return entry[1][key]

    def plan_epoch(self, dataset: GlobalBatch, cost: CostModel, epoch: int = 0) -> EpochPlan:
        """The reference baseline's epoch over the fixed ``dataset`` (module docstring)."""
        W = cost.cluster.world_size
        ckpt = ckpt_layers_for(self.recompute, cost.model.num_layers)
        sp = self.fixed_sp(dataset, cost, ckpt)
        buckets = dataset_buckets(dataset)
        raw = {b.key: self.reference_profile(cost, *bucket_shape(b.key), sp, ckpt) for b in buckets}
        damped = damp_to_median({k: p for k, p in raw.items() if p is not None})
        profile: dict[Any, BucketProfile | None] = {k: damped.get(k) for k in raw}
        deal = bucket_epoch(buckets, profile, sp, W // sp, np.random.default_rng(self.seed + epoch))
        if self.deals_per_iteration == 1:
            iterations = [
                iteration_plan(it, W, self.name, i) for i, it in enumerate(deal.iterations)
            ]
        else:
            chunks = merge_iterations(deal, self.deals_per_iteration)
            iterations = [packed_plan(chunk, W, self.name, i) for i, chunk in enumerate(chunks)]
        info = deal_summary(deal)
        info["optimizer_steps"] = len(iterations)
        info["profile"] = {
            bucket_label(k): None
            if p is None
            else {
                "sp": p.sp,
                "bs": p.bs,
                "time_s": p.time_s,
                "undamped_bs": raw[k].bs,  # type: ignore[union-attr]
                **profile_memory_info(raw[k]),  # type: ignore[arg-type]
            }
            for k, p in profile.items()
        }
        return EpochPlan(iterations, info)


__all__ = ["BucketStatic", "bucket_key", "damp_batch_sizes"]
