"""`megatron_lm_tuned`: Megatron-LM with a fixed (TP, PP, CP, DP) layout, as FlexSP configured it.

FlexSP (Wang et al., ASPLOS'25, arXiv 2412.01523, section 6.1) compares against Megatron-LM with
tensor, pipeline, context and data parallelism (DP with ZeRO-1, Megatron's distributed optimizer)
hand-tuned per setting, and best-fit packing of the global batch for both baselines. Megatron-LM's
own data pipeline instead concatenates documents and cuts them into samples of exactly
``--seq-length`` tokens, a document crossing sample boundaries (NVIDIA/Megatron-LM 002398e7,
megatron/core/datasets/gpt_dataset.py, ``_build_document_sample_shuffle_indices`` calling
``helpers.build_sample_idx``); the reproduction follows FlexSP's evaluation, which keeps every
sequence whole:

1. a launch fixes ``tp`` (inside a node), ``pp`` (dividing the layers), ``cp`` and
   ``dp = world / (tp pp cp)``, the recompute (none, selective = core attention, full = every
   layer) and the sequence length ``seq_length`` (the workload's max length): one micro-batch
   holds at most ``seq_length`` tokens, its sequences attending each within itself (THD packing);
2. the global batch is packed by best-fit decreasing into micro-batches of ``seq_length`` tokens
   (`baselines.deepspeed_ulysses.best_fit_decreasing`, FlexSP's BestFitDecreasing,
   Hetu-Galvatron b4666892 galvatron/flexsp_solver/utils.py:31-59);
3. the packed micro-batches are dealt in order to the ``dp`` replicas (micro-batch ``i`` to
   replica ``i mod dp``), as FlexSP's solver deals its baseline's groups (solver.py:757-767);
   each replica runs its micro-batches through the 1F1B pipeline and the step ends with the
   slowest replica, then the gradient sync over the data-parallel ranks;
4. a launch runs only when a full micro-batch of ``seq_length`` tokens fits the memory cap on
   every stage (`dcp_bench.cost.megatron`: ``pp`` micro-batches in flight on the first stage);
   otherwise it is refused with the reason.

`MegatronLM` is one launch; `MegatronLMTuned` (``megatron_lm_tuned``) is the paper's "hand-tuned"
baseline: every launch (TP, PP, CP, recompute) that runs every batch it is tuned on, priced with
the cost model on those batches, the fastest kept. The search stands for the trial runs the
paper's authors made: it is offline tuning, recorded in ``plan.info`` (every candidate and its
summed step time, ``tune_s``) and not charged to any step. Tensor and pipeline parallelism are
priced by the analytical cost model only (`dcp_bench.cost.base.CostModel.with_model_parallel`);
other sources refuse.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from baselines.deepspeed_ulysses import best_fit_decreasing
from dcp_bench.cost.megatron import pipeline_time
from dcp_bench.errors import ConfigError, InfeasibleError
from dcp_bench.layout import MEGATRON_RECOMPUTE, ModelParallel, is_power_of_two
from dcp_bench.plan import Group, MicroBatch, Mode, Round, StepPlan
from dcp_bench.planners.base import Planner

if TYPE_CHECKING:
    from dcp_bench.batch import GlobalBatch
    from dcp_bench.cost.base import CostModel


@dataclass(frozen=True)
class MegatronLaunch:
    """One Megatron-LM launch: the parallel degrees and the recompute."""

    tp: int
    pp: int
    cp: int
    recompute: str

    def layout(self) -> ModelParallel:
        return ModelParallel(tp=self.tp, pp=self.pp, selective=self.recompute == "selective")

    def ckpt_layers(self, num_layers: int) -> int:
        return num_layers if self.recompute == "full" else 0

    def describe(self, world: int) -> str:
        dp = world // (self.tp * self.pp * self.cp)
        return f"tp={self.tp} pp={self.pp} cp={self.cp} dp={dp} recompute={self.recompute}"


def _check_recompute(recompute: str) -> None:
    if recompute not in MEGATRON_RECOMPUTE:
        raise ConfigError(
            f"recompute={recompute!r}; expected one of {', '.join(MEGATRON_RECOMPUTE)}"
        )


def launch_memory(
    cost: CostModel, launch: MegatronLaunch, seq_length: int
) -> tuple[CostModel, float]:
    """The cost model pricing ``launch`` and the per-rank peak of its heaviest stage running a
    full micro-batch of ``seq_length`` tokens (raises `ConfigError` where the cost source or the
    model cannot price the layout)."""
    mp_cost = cost.with_model_parallel(launch.layout())
    c = mp_cost.microbatch_costs(
        np.array([seq_length], dtype=np.int64),
        np.ones(1, dtype=np.int64),
        np.zeros(1, dtype=np.int64),
        np.array([launch.cp]),
        np.array([launch.ckpt_layers(cost.model.num_layers)]),
        ulysses=np.ones(1),
    )
    return mp_cost, float(c["mem_bytes"][0])


def megatron_plan(
    batch: GlobalBatch,
    cost: CostModel,
    launch: MegatronLaunch,
    seq_length: int,
    name: str = "megatron_lm",
    mode: Mode = "fair",
) -> StepPlan:
    """The plan of one step under ``launch`` (module docstring, rules 1-4)."""
    W = cost.cluster.world_size
    replica = launch.tp * launch.pp * launch.cp
    if W % replica:
        raise ConfigError(f"{launch.describe(W)}: tp*pp*cp={replica} does not divide world {W}")
    dp = W // replica
    if not batch.n:
        raise InfeasibleError("an empty global batch has nothing to pack")
    mp_cost, peak = launch_memory(cost, launch, seq_length)
    cap = mp_cost.memory_cap_bytes
    if peak > cap:
        raise InfeasibleError(
            f"launch {launch.describe(W)}: a micro-batch of {seq_length} tokens needs "
            f"{peak / 2**30:.2f} GiB per rank, over the memory cap {cap / 2**30:.2f} GiB"
        )
    lengths = [float(t) for t in batch.tokens]
    if max(lengths) > seq_length:
        p = int(np.argmax(batch.tokens))
        raise InfeasibleError(
            f"sample {p} ({int(batch.tokens[p])} tokens) is longer than seq_length={seq_length}"
        )
    bins = best_fit_decreasing(lengths, float(seq_length))
    L = cost.model.num_layers
    ckpt = launch.ckpt_layers(L)
    groups = [
        Group(
            r * replica,
            replica,
            [MicroBatch(tuple(sorted(b)), ckpt_layers=ckpt, sp_kind="ring") for b in bins[r::dp]],
        )
        for r in range(dp)
    ]
    return StepPlan(
        world_size=W,
        rounds=[Round(groups=[g for g in groups if g.micro_batches])],
        method=name,
        mode=mode,
        step=batch.step,
        info={
            "launch": launch.describe(W),
            "tp": launch.tp,
            "pp": launch.pp,
            "cp": launch.cp,
            "dp": dp,
            "recompute": launch.recompute,
            "seq_length": seq_length,
            "micro_batches": len(bins),
            "micro_batches_per_replica": [len(bins[r::dp]) for r in range(dp)],
            "peak_mem_gib": peak / 2**30,
        },
        model_parallel=launch.layout(),
    )


def predicted_step_time(plan: StepPlan, batch: GlobalBatch, cost: CostModel) -> float:
    """The step time of a `megatron_plan` on ``cost`` (noise-free), as the simulator runs it:
    each replica's micro-batches through its 1F1B pipeline, the slowest replica, then the
    once-per-step gradient sync."""
    assert plan.model_parallel is not None
    mp_cost = cost.with_model_parallel(plan.model_parallel)
    mbs = [(gi, mb) for gi, g in enumerate(plan.rounds[0].groups) for mb in g.micro_batches]
    cp = plan.context_parallel(plan.rounds[0].groups[0])
    pos = np.fromiter((p for _, mb in mbs for p in mb.samples), dtype=np.int64)
    counts = np.fromiter((len(mb.samples) for _, mb in mbs), dtype=np.int64)
    c = mp_cost.microbatch_costs(
        batch.tokens[pos],
        batch.frames[pos],
        np.repeat(np.arange(len(mbs)), counts),
        np.full(len(mbs), cp),
        np.fromiter((mb.ckpt_layers for _, mb in mbs), dtype=np.int64),
        ulysses=np.ones(len(mbs)),
    )
    dur = mp_cost.total_time(c)
    gid = np.fromiter((gi for gi, _ in mbs), dtype=np.int64)
    n = len(plan.rounds[0].groups)
    work = np.bincount(gid, weights=dur, minlength=n)
    longest = np.zeros(n)
    np.maximum.at(longest, gid, dur)
    replica = pipeline_time(work, longest, plan.model_parallel.pp)
    return float(replica.max()) + mp_cost.step_sync_time()


class MegatronLM(Planner):
    """Megatron-LM with one fixed launch (module docstring).

    Args:
        tp, pp, cp: the tensor-, pipeline- and context-parallel degrees (powers of two; tp
            inside a node); dp is world / (tp pp cp).
        recompute: none | selective (core attention) | full (every layer).
        seq_length: tokens of one packed micro-batch (Megatron's ``--seq-length``); null: the
            longest sequence of the first batch planned.
        mode: labels runs only.
    """

    name = "megatron_lm"
    source = (
        "Megatron-LM (TP with sequence parallelism, 1F1B PP, ring CP, DP with ZeRO-1) as FlexSP "
        "(ASPLOS'25, section 6.1) configured it: a fixed layout, best-fit packing of whole "
        "sequences into micro-batches of seq_length tokens (FlexSP's evaluation; Megatron's own "
        "GPTDataset cuts documents instead). Priced by the analytical cost model only. Defaults: "
        "tp = pp = cp = 1, no recompute, seq_length the first batch's longest sequence."
    )
    OPTION_MINIMA = {"tp": 1, "pp": 1, "cp": 1, "seq_length": 1}
    simulated_only = True  # the runtime runs no tensor or pipeline parallelism

    def __init__(
        self,
        tp: int = 1,
        pp: int = 1,
        cp: int = 1,
        recompute: str = "none",
        seq_length: int | None = None,
        mode: Mode = "fair",
    ) -> None:
        super().__init__(mode)
        _check_recompute(recompute)
        for key, v in (("tp", tp), ("pp", pp), ("cp", cp)):
            if not is_power_of_two(v):
                raise ConfigError(f"{key}={v}; expected a power of two >= 1")
        if seq_length is not None and seq_length < 1:
            raise ConfigError(f"seq_length={seq_length}; expected a positive token count")
        self.launch = MegatronLaunch(tp, pp, cp, recompute)
        self.seq_length = seq_length

    def plan(self, batch: GlobalBatch, cost: CostModel) -> StepPlan:
        if self.seq_length is None and batch.n:
            self.seq_length = int(batch.tokens.max())
        return megatron_plan(
            batch, cost, self.launch, int(self.seq_length or 1), self.name, self.mode
        )


class MegatronLMTuned(Planner):
    """`MegatronLM` with its launch hand-tuned: the fastest of every (tp, pp, cp, recompute)
    that runs every tuning batch, priced on the cost model (module docstring).

    Args:
        seq_length: tokens of one packed micro-batch; null: the longest sequence of the first
            batch planned.
        tp_choices, pp_choices, cp_choices: degrees to try; null: every power of two the
            cluster and model admit (tp up to a node and dividing the heads, pp dividing the
            layers).
        recompute_choices: subset of none / selective / full.
        tune_batches: the search prices the first N batches; a later batch the winner cannot
            run triggers a new search over every batch seen.
        mode: labels runs only.
    """

    name = "megatron_lm_tuned"
    source = (
        "Megatron-LM as FlexSP (ASPLOS'25, section 6.1) ran it, hand-tuned: every fixed "
        "(TP, PP, CP, DP, recompute) launch that fits, priced on the cost model over the "
        "tuning batches, the fastest kept; best-fit packing into micro-batches of seq_length "
        "tokens. The search is offline tuning (tune_s), not charged per step. Analytical cost "
        "model only (it prices TP and PP). Defaults: every power of two for TP (up to a node), "
        "PP (dividing the layers) and CP, recompute none / selective / full, tuned on the first "
        "batch; seq_length the first batch's longest sequence (the claims set the max length)."
    )
    OPTION_MINIMA = {"seq_length": 1, "tune_batches": 1}
    simulated_only = True  # the runtime runs no tensor or pipeline parallelism

    def __init__(
        self,
        seq_length: int | None = None,
        tp_choices: list[int] | None = None,
        pp_choices: list[int] | None = None,
        cp_choices: list[int] | None = None,
        recompute_choices: list[str] | tuple[str, ...] = MEGATRON_RECOMPUTE,
        tune_batches: int = 1,
        mode: Mode = "fair",
    ) -> None:
        super().__init__(mode)
        for r in recompute_choices:
            _check_recompute(r)
        if not recompute_choices:
            raise ConfigError("recompute_choices is empty; expected some of none/selective/full")
        for key, vals in (("tp", tp_choices), ("pp", pp_choices), ("cp", cp_choices)):
            for v in vals or []:
                if not is_power_of_two(v):
                    raise ConfigError(f"{key}_choices holds {v}; expected powers of two >= 1")
        if tune_batches < 1:
            raise ConfigError(f"tune_batches={tune_batches}; expected >= 1")
        if seq_length is not None and seq_length < 1:
            raise ConfigError(f"seq_length={seq_length}; expected a positive token count")
        self.seq_length = seq_length
        self.tp_choices = tp_choices
        self.pp_choices = pp_choices
        self.cp_choices = cp_choices
        self.recompute_choices = list(recompute_choices)
        self.tune_batches = tune_batches
        self._seen: list[GlobalBatch] = []
        self._best: MegatronLaunch | None = None
        self._search: list[dict[str, Any]] = []
        self._cost_key = ""
        self._tune_s = 0.0

    def candidates(self, cost: CostModel) -> list[MegatronLaunch]:
        """Every launch the search tries, least recompute first (a tie keeps less recompute)."""
        c, m = cost.cluster, cost.model
        W, gpn = c.world_size, c.gpus_per_node
        powers = [1 << i for i in range(W.bit_length()) if W % (1 << i) == 0]
        tps = self.tp_choices or [t for t in powers if t <= gpn and m.heads % t == 0]
        pps = self.pp_choices or [p for p in powers if m.num_layers % p == 0]
        cps = self.cp_choices or powers
        out = []
        for r in self.recompute_choices:
            for tp in tps:
                for pp in pps:
                    for cp in cps:
                        if W % (tp * pp * cp) == 0:
                            out.append(MegatronLaunch(tp, pp, cp, r))
        if not out:
            raise ConfigError(
                f"no (tp, pp, cp) among tp {tps}, pp {pps}, cp {cps} tiles the world of {W}"
            )
        return out

    def tune(self, batches: list[GlobalBatch], cost: CostModel) -> MegatronLaunch:
        """The fastest launch over ``batches`` (summed predicted step time); every candidate and
        its time (or why it cannot run) is kept for ``plan.info``. Raises `InfeasibleError`
        naming the reason when no launch runs them all."""
        t0 = time.process_time()  # CPU time: what the run loop books as offline tuning
        cost.with_model_parallel(ModelParallel())  # a source that prices no TP/PP refuses here
        W = cost.cluster.world_size
        seq = int(self.seq_length or 1)
        search: list[dict[str, Any]] = []
        best: tuple[float, MegatronLaunch] | None = None
        for launch in self.candidates(cost):
            row: dict[str, Any] = {"launch": launch.describe(W)}
            try:
                _, peak = launch_memory(cost, launch, seq)
                row["peak_mem_gib"] = round(peak / 2**30, 3)
                total = 0.0
                for b in batches:
                    plan = megatron_plan(b, cost, launch, seq, self.name, self.mode)
                    total += predicted_step_time(plan, b, cost)
                row["step_s_sum"] = total
                if best is None or total < best[0]:
                    best = (total, launch)
            except (InfeasibleError, ConfigError) as exc:
                row["refused"] = str(exc)
            search.append(row)
        self._search = search
        self._tune_s = time.process_time() - t0
        if best is None:
            first = next(r["refused"] for r in search if "refused" in r)
            raise InfeasibleError(
                f"no Megatron-LM launch of {len(search)} tried runs every tuning batch on "
                f"{cost.cluster.name} with seq_length={seq} (e.g. {first})"
            )
        return best[1]

    def plan(self, batch: GlobalBatch, cost: CostModel) -> StepPlan:
        if self.seq_length is None and batch.n:
            self.seq_length = int(batch.tokens.max())
        key = json.dumps(cost.describe(), sort_keys=True, default=str)
        if key != self._cost_key:  # a different cost model or cluster: tune afresh
            self._cost_key, self._seen, self._best = key, [], None
        tuned_now = retuned = False
        if self._best is None or len(self._seen) < self.tune_batches:
            self._seen.append(batch)
            self._best = self.tune(self._seen, cost)
            tuned_now = True
        seq = int(self.seq_length or 1)
        try:
            plan = megatron_plan(batch, cost, self._best, seq, self.name, self.mode)
        except InfeasibleError:
            # a batch the tuned launch cannot run: a new search over every batch seen so far
            self._seen.append(batch)
            self._best = self.tune(self._seen, cost)
            plan = megatron_plan(batch, cost, self._best, seq, self.name, self.mode)
            retuned = True
        plan.info.update(
            tuned_launch=self._best.describe(cost.cluster.world_size),
            candidates=len(self._search),
            candidates_feasible=sum(1 for r in self._search if "step_s_sum" in r),
            tuned_on_batches=len(self._seen),
            retuned=retuned,
            tune_search=self._search if (tuned_now or retuned) else [],
            # the search is offline work (the paper's hand-tuning); not charged per step
            tune_s=self._tune_s if (tuned_now or retuned) else 0.0,
        )
        return plan
