"""Faithful DCP: DCP-intra, DCP-inter and DCP-inter + PAC, as the paper and its public reference
runtime (VideoSys, Open-Sora) describe them, in two modes.

Shared by the three methods: the per-bucket profile (`profile_bucket`: SP degree inside a node
first, the largest power-of-two batch size under the cap, the (sp, bs) with the most samples per
GPU-second; PAC also chooses the checkpointed layers). Samples of a bucket are cut into
micro-batches of the bucket's batch size. An *iteration* fills the world with SP groups: the
largest SP degree that still fits the free ranks is taken first (the reference's deterministic
order), and each group takes the next micro-batch of a bucket with that degree. Groups placed in
descending size order are aligned by construction.

* DCP-intra (the reference's per-iteration SP balance): each group runs one micro-batch; groups
  slower than the fastest group by more than ``tolerance`` shrink their batch (returned samples
  go back to the bucket) and, at batch size 1, double their SP degree while free ranks remain.
* DCP-inter: each group runs its own number of gradient-accumulation micro-steps (between
  ``min_steps`` and ``max_steps``) chosen so the groups finish together (the reference's
  search: for every candidate finishing time, each group's closest step count, over-runs
  penalised 1.2x; the candidate with the least total mismatch wins).
* DCP-inter + PAC: DCP-inter over the PAC profile.

Modes. ``fair`` (default): iterations repeat as rounds of one plan until every sample of the
global batch has run once; buckets the intra-node profile cannot fit use cross-node degrees;
one optimizer step. ``paper`` with ``run.unit=step``: one optimizer step is *one* iteration of a
fresh batch, so it sees only the samples that iteration's groups and micro-steps take; buckets
that fit no intra-node degree are skipped; the rest of the batch is not seen by this step
(``plan.info`` records ``samples_seen``, ``samples_skipped`` and ``samples_deferred``).

The reference runtime itself (``method.mode=paper``, ``run.unit=epoch``, the default of paper
mode) is `plan_epoch`: the reference profile (`dcp_bench.reference.trial_search.dcp_search`) and the
reference sampler (`dcp_bench.reference.samplers`) deal a fixed dataset into iterations, each its
own `StepPlan`. Its parameters are the reference's: ``sampler_max_steps`` / ``sampler_min_steps``
(the benchmark configs: 5 / 2 for DCP-inter, 5 / 15 for PAC), ``sampler_bounds`` (``literal``:
the code's reading; ``per_group``: the documentation's), ``sp_rule`` (null: the reference's rule,
``categorical`` for intra and ``threshold`` for inter; or ``largest``), ``eject`` and
``second_pass`` (both true in the reference). docs/reference_semantics.md cites every rule.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from dcp_bench.errors import ConfigError, InfeasibleError
from dcp_bench.plan import Group, MicroBatch, Mode, Round, StepPlan
from dcp_bench.planners.base import Planner
from dcp_bench.planners.settings import (
    BucketSetting,
    bucket_keys,
    build_shape_table,
    profile_bucket,
    raise_if_infeasible,
)
from dcp_bench.reference.epoch import (
    EpochPlan,
    bucket_label,
    bucket_shape,
    dataset_buckets,
    deal_summary,
    iteration_plan,
)
from dcp_bench.reference.samplers import (
    BOUNDS,
    SP_RULES,
    accumulation_counts,
    dcp_inter_epoch,
    dcp_intra_epoch,
)
from dcp_bench.reference.trial_search import (
    MEMORY_BELIEFS,
    BucketProfile,
    cost_measure,
    dcp_search,
    profile_memory_info,
)

if TYPE_CHECKING:
    from dcp_bench.batch import GlobalBatch
    from dcp_bench.cost.base import CostModel


@dataclass
class _Bucket:
    setting: BucketSetting
    queue: deque[int] = field(default_factory=deque)  # sample positions not yet planned


@dataclass
class _GroupPlan:
    bucket: int
    sp: int
    micro_batches: list[list[int]]
    time_s: float  # predicted time of one micro-batch (profile)


def accumulation_steps(times: list[float], min_steps: int, max_steps: int) -> list[int]:
    """Gradient-accumulation steps per group so the groups finish together, every count within
    ``min_steps .. max_steps`` (the per-group reading of the reference's bounds, which fair mode
    uses; `dcp_bench.reference.samplers.accumulation_counts` has both readings).

    Candidates for the common finishing time are ``t_j * m`` for every group ``j`` and step count
    ``m`` within bounds; each group takes the step count closest to it (an over-run costs 1.2x
    an under-run); the candidate with the least total mismatch wins.
    """
    return accumulation_counts(times, max_steps, min_steps, bounds="per_group")


class FaithfulDCPPlanner(Planner):
    """Common machinery of the faithful DCP methods (profile, buckets, iterations, modes)."""

    name = "dcp_faithful"
    OPTION_MINIMA = {"buckets_per_octave": 1, "max_steps": 1, "sampler_max_steps": 1}
    pac: bool = False
    balance: str = "inter"  # "inter" (accumulation steps) or "intra" (batch size / SP degree)

    def __init__(
        self,
        mode: Mode = "fair",
        buckets_per_octave: int = 2,
        min_steps: int = 1,
        max_steps: int = 2,
        tolerance: float = 0.1,
        seed: int = 0,
        sampler_max_steps: int = 5,
        sampler_min_steps: int = 2,
        sampler_bounds: str = "literal",
        sp_rule: str | None = None,
        eject: bool = True,
        second_pass: bool = True,
        profile_memory: str = "reference",
    ) -> None:
        super().__init__(mode)
        if profile_memory not in MEMORY_BELIEFS:
            raise ConfigError(
                f"{self.name}: profile_memory={profile_memory!r}; expected one of "
                f"{', '.join(MEMORY_BELIEFS)}"
            )
        if buckets_per_octave < 1 or min_steps < 1 or max_steps < min_steps or tolerance < 0:
            raise ConfigError(
                f"{self.name}: need buckets_per_octave >= 1 (got {buckets_per_octave}), "
                f"1 <= min_steps <= max_steps (got {min_steps}, {max_steps}), tolerance >= 0 "
                f"(got {tolerance})"
            )
        if sampler_max_steps < 1 or sampler_min_steps < 1:
            raise ConfigError(
                f"{self.name}: sampler_max_steps={sampler_max_steps} and sampler_min_steps="
                f"{sampler_min_steps}: expected integers >= 1"
            )
        if sampler_bounds not in BOUNDS:
            raise ConfigError(
                f"{self.name}: sampler_bounds={sampler_bounds!r}; expected one of "
                f"{', '.join(BOUNDS)}"
            )
        if sampler_bounds == "per_group" and sampler_min_steps > sampler_max_steps:
            raise ConfigError(
                f"{self.name}: sampler_bounds=per_group needs sampler_min_steps <= "
                f"sampler_max_steps (got {sampler_min_steps}, {sampler_max_steps})"
            )
        if sp_rule is not None and sp_rule not in SP_RULES:
            raise ConfigError(
                f"{self.name}: sp_rule={sp_rule!r}; expected null or one of {', '.join(SP_RULES)}"
            )
        self.buckets_per_octave = int(buckets_per_octave)
        self.min_steps = int(min_steps)
        self.max_steps = int(max_steps)
        self.tolerance = float(tolerance)
        self.seed = int(seed)
        self.sampler_max_steps = int(sampler_max_steps)
        self.sampler_min_steps = int(sampler_min_steps)
        self.sampler_bounds = str(sampler_bounds)
        self.sp_rule = sp_rule
        self.eject = bool(eject)
        self.second_pass = bool(second_pass)
        self.profile_memory = str(profile_memory)
        # The profile, as the reference keeps it: per cost model, per bucket shape. Instance
        # state, not global; the cost model is held so its id cannot be reused while cached.
        self._profiles: dict[
            int, tuple[Any, dict[tuple[int, int, bool], BucketSetting | None]]
        ] = {}
        self._ref_profiles: dict[int, tuple[Any, dict[tuple[int, int], BucketProfile | None]]] = {}

    def _profile(
        self, cost: CostModel, tokens: int, frames: int, cross_node: bool
    ) -> BucketSetting | None:
        entry = self._profiles.setdefault(id(cost), (cost, {}))
        cache = entry[1]
        key = (tokens, frames, cross_node)
        if key not in cache:
            cache[key] = profile_bucket(cost, tokens, frames, self.pac, cross_node=cross_node)
        return cache[key]

    # -- buckets -------------------------------------------------------------------------------

    def _buckets(self, batch: GlobalBatch, cost: CostModel) -> tuple[list[_Bucket], list[int]]:
        inv, rep_t, rep_f = bucket_keys(batch.tokens, batch.frames, self.buckets_per_octave)
        buckets: list[_Bucket] = []
        skipped: list[int] = []
        for b in range(len(rep_t)):
            members = np.flatnonzero(inv == b).tolist()
            setting = self._profile(cost, int(rep_t[b]), int(rep_f[b]), cross_node=False)
            if setting is None and self.mode == "fair":
                setting = self._profile(cost, int(rep_t[b]), int(rep_f[b]), cross_node=True)
            if setting is None and self.mode == "fair":
                # The bucket's upper edge may not fit while its actual members do: profile the
                # longest member instead before giving up.
                longest = int(batch.tokens[members].max())
                frames = int(rep_f[b])
                setting = self._profile(cost, longest, frames, cross_node=True)
            if setting is None:
                if self.mode == "fair":
                    table = build_shape_table(batch.tokens[members], batch.frames[members], cost)
                    raise_if_infeasible(table, batch.tokens[members], batch.frames[members], cost)
                    raise InfeasibleError(
                        f"{self.name}: bucket of {int(rep_t[b])} tokens fits no setting"
                    )
                skipped.extend(members)
                continue
            buckets.append(_Bucket(setting, deque(members)))
        return buckets, skipped

    # -- iterations ----------------------------------------------------------------------------

    def _fill(self, buckets: list[_Bucket], W: int) -> list[_GroupPlan]:
        """One iteration: groups of the largest SP degree that fits the free ranks first."""
        free = W
        groups: list[_GroupPlan] = []
        while free > 0:
            live = [i for i, b in enumerate(buckets) if b.queue and b.setting.sp <= free]
            if not live:
                break
            sp = max(buckets[i].setting.sp for i in live)
            i = next(i for i in live if buckets[i].setting.sp == sp)
            bk = buckets[i]
            take = [bk.queue.popleft() for _ in range(min(bk.setting.bs, len(bk.queue)))]
            groups.append(_GroupPlan(i, sp, [take], bk.setting.time_s))
            free -= sp
        return groups

    def _balance_inter(self, groups: list[_GroupPlan], buckets: list[_Bucket]) -> None:
        steps = accumulation_steps([g.time_s for g in groups], self.min_steps, self.max_steps)
        for g, k in zip(groups, steps):
            bk = buckets[g.bucket]
            for _ in range(k - 1):
                if not bk.queue:
                    break
                g.micro_batches.append(
                    [bk.queue.popleft() for _ in range(min(bk.setting.bs, len(bk.queue)))]
                )

    def _balance_intra(
        self, groups: list[_GroupPlan], buckets: list[_Bucket], W: int, max_sp: int
    ) -> None:
        if not groups:
            return
        t_min = min(
            g.time_s * len(g.micro_batches[0]) / buckets[g.bucket].setting.bs for g in groups
        )
        free = W - sum(g.sp for g in groups)
        for g in groups:
            bk = buckets[g.bucket]
            mb = g.micro_batches[0]
            unit = g.time_s / bk.setting.bs  # the profile's time per sample of this bucket
            t = unit * len(mb)
            if t <= t_min * (1 + self.tolerance):
                continue
            keep = max(1, int(round(t_min / unit)))
            if keep < len(mb):
                for s in reversed(mb[keep:]):
                    bk.queue.appendleft(s)
                del mb[keep:]
                t = unit * keep
            # Batch size 1 and still slow: a larger SP degree (ideal halving, as the reference
            # assumes) while free ranks remain and the doubled degree divides the world and is
            # one the model runs (``max_sp``: the largest; the runnable degrees are a prefix).
            while (
                t > t_min * (1 + self.tolerance)
                and free >= g.sp
                and len(mb) == 1
                and W % (2 * g.sp) == 0
                and 2 * g.sp <= max_sp
            ):
                free -= g.sp
                g.sp *= 2
                t /= 2

    def plan(self, batch: GlobalBatch, cost: CostModel) -> StepPlan:
        W = cost.cluster.world_size
        buckets, skipped = self._buckets(batch, cost)
        rounds: list[Round] = []
        iterations = 0
        while any(b.queue for b in buckets):
            groups = self._fill(buckets, W)
            if not groups:
                break
            if self.balance == "inter":
                self._balance_inter(groups, buckets)
            else:
                self._balance_intra(groups, buckets, W, cost.sp_degrees()[-1])
            rounds.append(self._round(groups, buckets))
            iterations += 1
            if self.mode == "paper":
                break  # one iteration is one optimizer step in the reference runtime
        deferred = sum(len(b.queue) for b in buckets)
        seen = batch.n - deferred - len(skipped)
        info: dict[str, Any] = {
            "samples_seen": seen,
            "samples_skipped": len(skipped),
            "samples_deferred": deferred,
            "iterations": iterations,
            "buckets": len(buckets) + (1 if skipped else 0),
        }
        if self.mode == "paper":
            info["label"] = self.label()
        return StepPlan(
            world_size=W,
            rounds=rounds,
            method=self.name,
            mode=self.mode,
            step=batch.step,
            info=info,
        )

    # -- the reference runtime: an epoch (run.unit=epoch) ---------------------------------------

    @property
    def variant(self) -> str:
        """The reference profiler's variant: intra, inter or pac."""
        return "intra" if self.balance == "intra" else ("pac" if self.pac else "inter")

    def reference_profile(self, cost: CostModel, tokens: int, frames: int) -> BucketProfile | None:
        """The reference profile of one bucket shape on ``cost`` (cached per cost model)."""
        entry = self._ref_profiles.setdefault(id(cost), (cost, {}))
        key = (tokens, frames)
        if key not in entry[1]:
            gpn = min(cost.cluster.gpus_per_node, cost.cluster.world_size)
            # DCP-inter (and PAC) accumulate gradients automatically: the reference's prediction
            # adds the unit grad per layer (`profiler.py:485-489`)
            measure = cost_measure(
                cost,
                tokens,
                frames,
                pac=self.pac,
                memory=self.profile_memory,
                unit_grad=self.balance == "inter",
            )
            entry[1][key] = dcp_search(
                measure,
                gpn,
                cost.cluster.world_size,
                self.variant,
                runs=lambda sp: cost.model.sp_degree_offence(sp) is None,
            )
        return entry[1][key]

    def plan_epoch(self, dataset: GlobalBatch, cost: CostModel, epoch: int = 0) -> EpochPlan:
        """The reference runtime's epoch over the fixed ``dataset`` (module docstring): profile
        every bucket, deal the epoch with the method's sampler (seeded ``seed + epoch``), one
        `StepPlan` per iteration over the sub-batch it trains."""
        W = cost.cluster.world_size
        buckets = dataset_buckets(dataset)
        profile = {b.key: self.reference_profile(cost, *bucket_shape(b.key)) for b in buckets}
        rng = np.random.default_rng(self.seed + epoch)
        if self.variant == "intra":
            # DCP-intra raises a plan's degree up to a node; never past what the model runs
            gpn = min(cost.cluster.gpus_per_node, W, cost.sp_degrees()[-1])
            deal = dcp_intra_epoch(
                buckets,
                profile,
                W,
                gpn,
                rng,
                sp_rule=self.sp_rule or "categorical",
                second_pass=self.second_pass,
            )
        else:
            deal = dcp_inter_epoch(
                buckets,
                profile,
                W,
                rng,
                max_steps=self.sampler_max_steps,
                min_steps=self.sampler_min_steps,
                bounds=self.sampler_bounds,
                sp_rule=self.sp_rule or "threshold",
                eject=self.eject,
            )
        iterations = [iteration_plan(it, W, self.name, i) for i, it in enumerate(deal.iterations)]
        info = deal_summary(deal)
        info["profile"] = {
            bucket_label(k): None
            if p is None
            else {
                "sp": p.sp,
                "bs": p.bs,
                "time_s": p.time_s,
                "ckpt_layers": p.ckpt_layers,
                **profile_memory_info(p),
            }
            for k, p in profile.items()
        }
        return EpochPlan(iterations, info)

    def _round(self, groups: list[_GroupPlan], buckets: list[_Bucket]) -> Round:
        out: list[Group] = []
        start = 0
        for g in sorted(groups, key=lambda g: -g.sp):  # descending sizes stay aligned
            ck = buckets[g.bucket].setting.ckpt_layers
            mbs = [MicroBatch(samples=tuple(m), ckpt_layers=ck) for m in g.micro_batches if m]
            out.append(Group(start=start, size=g.sp, micro_batches=mbs))
            start += g.sp
        return Round(groups=out)


class DCPIntraPlanner(FaithfulDCPPlanner):
    """DCP-intra: per-iteration balance by batch size and SP degree."""

    name = "dcp_intra"
    balance = "intra"


class DCPInterPlanner(FaithfulDCPPlanner):
    """DCP-inter: per-group gradient-accumulation step counts, full recompute."""

    name = "dcp_inter"
    balance = "inter"


class DCPInterPACPlanner(FaithfulDCPPlanner):
    """DCP-inter with Pyramid Activation Checkpointing."""

    name = "dcp_inter_pac"
    balance = "inter"
    pac = True
