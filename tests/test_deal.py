"""The one deal (`dcp_bench.run.deal`): each optimizer step's work for both units, against
independent references (the workload's own batches, the planner's own epoch sampling), and its
users: the step loop and the memory precheck walk the same steps."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from dcp_bench.config import MEM_CAP_FRACTION, SEED_DEFAULT, load_config, to_container
from dcp_bench.cost.analytical import SCALE_DEFAULTS
from dcp_bench.errors import ConfigError
from dcp_bench.run.assemble import RunParts, assemble
from dcp_bench.run.capabilities import EpochSampler, FixedDataset, LatentTokens, StepWorkload
from dcp_bench.run.deal import deal_steps
from dcp_bench.run.memory_precheck import forecast_memory
from dcp_bench.run.simulated import run_simulated
from dcp_bench.run.spec import (
    RUN_DEFAULTS,
    MethodSpec,
    NoiseSettings,
    RunSpec,
    TrainSettings,
    WorkloadSpec,
    parse_run_spec,
)
from dcp_bench.sim import simulate_step
from dcp_bench.train_policy import DEFAULT_ZERO_STAGE

EPOCH = [
    "workload=videosys_zipf",
    "model=tiny_stdit",
    "method=bucket_static",
    "method.sp=4",
    "method.recompute=full",
    "method.mode=paper",
    "nproc=4",
    "cluster=cpu",
    "workload.length_scale=64",
    "workload.tokens_per_gpu=32768",
    "workload.data_size=40",
    "mem_cap_fraction=0.1",
    "run.root=unused",
]
STEP = [
    "workload=videosys_zipf",
    "model=tiny_stdit",
    "method=dcp",
    "nproc=4",
    "cluster=cpu",
    "workload.length_scale=64",
    "workload.tokens_per_gpu=32768",
    "steps=3",
    "warmup_steps=1",
    "run.root=unused",
]


def _spec(overrides: list[str]) -> RunSpec:
    return parse_run_spec(to_container(load_config(overrides)))


def test_step_unit_deals_the_workloads_batches_with_warmup_first() -> None:
    spec = _spec(STEP)
    parts = assemble(spec)
    deals = list(deal_steps(spec, parts, 4))
    assert [d.step for d in deals] == [0, 1, 2, 3]
    assert [d.warmup for d in deals] == [True, False, False, False]
    assert [d.where for d in deals] == ["step 0", "step 1", "step 2", "step 3"]
    fresh = assemble(spec).workload  # an independent workload of the same seed
    for d in deals:
        ref = fresh.global_batch(d.step, 4, spec.model.max_seq_len)
        assert np.array_equal(d.batch.sample_ids, ref.sample_ids) and np.array_equal(
            d.batch.tokens, ref.tokens
        )
        assert d.planner_s is None and d.epoch is None
        plan = d.plan_fn(d.batch)
        assert sorted(set(plan.sample_positions())) == list(range(d.batch.n))


def test_epoch_unit_deals_the_samplers_iterations_epoch_after_epoch() -> None:
    spec = _spec([*EPOCH, "run.epochs=2"])
    assert spec.unit == "epoch"
    parts = assemble(spec)
    deals = list(deal_steps(spec, parts, 4))
    # The reference: a separately built planner of the same seed samples the same epochs.
    ref = assemble(spec)
    dataset = ref.workload.epoch_dataset(4, spec.model.max_seq_len)
    assert isinstance(ref.planner, EpochSampler)
    epochs = [ref.planner.plan_epoch(dataset, ref.plan_cost, e) for e in range(2)]
    expected = [(e, i, it) for e, ep in enumerate(epochs) for i, it in enumerate(ep.iterations)]
    assert len(deals) == len(expected) >= 4
    for step, (d, (e, i, it)) in enumerate(zip(deals, expected)):
        assert (d.step, d.epoch, d.iteration, d.warmup) == (step, e, i, False)
        assert d.where == f"epoch {e}, iteration {i}"
        assert np.array_equal(d.batch.sample_ids, dataset.sample_ids[it.positions])
        assert d.batch.step == step and d.batch.info == {"epoch": e, "iteration": i}
        assert d.plan_fn(d.batch).to_dict() == it.plan.to_dict()
        assert d.planner_s is not None and d.planner_s >= 0
        assert (d.epoch_info is not None) == (i == 0)
    firsts = [d for d in deals if d.iteration == 0]
    assert [f.epoch_info["iterations"] for f in firsts] == [len(ep.iterations) for ep in epochs]  # type: ignore[index]


def test_capabilities_are_protocols() -> None:
    parts = assemble(_spec(EPOCH))
    assert isinstance(parts.workload, StepWorkload) and isinstance(parts.workload, FixedDataset)
    assert isinstance(parts.workload, LatentTokens) and isinstance(parts.planner, EpochSampler)
    step_parts = assemble(_spec(STEP))
    assert not isinstance(step_parts.planner, EpochSampler)


def test_epoch_unit_without_an_epoch_sampler_is_refused() -> None:
    spec = _spec(EPOCH)
    parts = assemble(spec)
    bare = RunParts(
        workload=parts.workload,
        cost=parts.cost,
        plan_cost=parts.plan_cost,
        planner=assemble(_spec(STEP)).planner,
    )
    with pytest.raises(
        ConfigError, match="run.unit=epoch needs a method with a reference epoch sampler"
    ):
        next(deal_steps(spec, bare, 4))


def test_the_memory_precheck_walks_the_epochs_the_run_deals() -> None:
    spec = _spec(EPOCH)
    fc = forecast_memory(spec)
    ref = assemble(spec)
    dataset = ref.workload.epoch_dataset(4, spec.model.max_seq_len)
    assert isinstance(ref.planner, EpochSampler)
    ep = ref.planner.plan_epoch(dataset, ref.plan_cost, 0)
    peaks = []
    for it in ep.iterations:  # priced here without the deal, from the sampler's own plans
        batch = dataset.subset(it.positions)
        peaks.append(float(np.max(simulate_step(it.plan, batch, ref.cost).peak_mem_bytes)))
    assert fc.steps_planned == len(ep.iterations) != spec.total_steps
    assert fc.rank_peak_bytes == pytest.approx(max(peaks))
    assert fc.step == int(np.argmax(peaks))


def test_the_loop_records_the_deal_of_both_units() -> None:
    s = run_simulated(_spec(STEP), write=False)
    assert s.status == "ok", s.error
    assert (s.n_steps, s.n_warmup) == (3, 1)
    spec = _spec([*EPOCH, "run.epochs=2"])
    n = sum(1 for _ in deal_steps(spec, assemble(spec), 4))
    e = run_simulated(spec, write=False)
    assert e.status == "ok", e.error
    assert (e.n_steps, e.n_warmup, e.epochs.epochs_done if e.epochs else None) == (n, 0, 2)


def test_a_budget_cut_names_the_budget_in_both_units() -> None:
    """The epoch loop used to name ``run.timeout_s`` even when a sweep's budget set the limit."""
    for overrides, where in ((STEP, "before step 0"), (EPOCH, "before epoch 0, iteration 0")):
        spec = _spec(overrides).with_timeout(1e-9, source="the time budget")
        s: Any = run_simulated(spec, write=False)
        assert s.status == "timeout"
        assert "the time budget" in s.error and where in s.error and "run.timeout_s" not in s.error


def test_method_and_workload_are_typed_specs_that_read_as_their_nodes() -> None:
    spec = _spec([*STEP, "method.mode=fair"])
    assert isinstance(spec.method, MethodSpec) and isinstance(spec.workload, WorkloadSpec)
    assert (spec.method.name, spec.method.target, spec.method.mode) == (
        "dcp",
        "dcp_bench.planners.dcp.DCPPlanner",
        "fair",
    )
    cfg = spec.config["method"]
    assert dict(spec.method) == cfg and spec.method["_target_"] == cfg["_target_"]
    assert spec.method.options == {k: v for k, v in cfg.items() if k not in ("name", "_target_")}
    assert spec.workload.name == "videosys_zipf" and spec.workload.registered
    assert dict(spec.workload) == spec.config["workload"]
    user = _spec([*STEP, "workload._target_=tests.test_deal.NoSuchWorkload"])
    assert not user.workload.registered and user.workload.target == "tests.test_deal.NoSuchWorkload"


def test_a_bad_method_node_names_the_offence() -> None:
    with pytest.raises(ConfigError, match="method.mode='odd'; expected fair or paper"):
        _spec([*STEP, "method.mode=odd"])


def test_the_runs_zero_stage_is_a_field_of_the_spec() -> None:
    assert _spec(STEP).zero_stage == DEFAULT_ZERO_STAGE
    assert _spec([*STEP, "cost.zero_stage=0"]).zero_stage == 0
    with pytest.raises(ConfigError, match="cost.zero_stage=5: expected one of 0, 1, 2, 3 or null"):
        _spec([*STEP, "cost.zero_stage=5"])


def test_config_defaults_are_the_parsers_defaults() -> None:
    """What the packaged config writes and what the parser assumes for a missing key agree, key
    by key (the cost scales: `SCALE_DEFAULTS`, and tests/test_scale_defaults.py)."""
    cfg = to_container(load_config([]))
    assert {k: cfg["run"][k] for k in RUN_DEFAULTS} == RUN_DEFAULTS
    assert cfg["mem_cap_fraction"] == MEM_CAP_FRACTION.default
    assert cfg["seed"] == SEED_DEFAULT
    assert cfg["cost"]["scales"] == SCALE_DEFAULTS
    assert cfg["train"] == dataclasses.asdict(TrainSettings())
    assert cfg["run"]["noise"] == dataclasses.asdict(NoiseSettings())
    bare = parse_run_spec(
        {
            "method": cfg["method"],
            "workload": cfg["workload"],
            "cluster": cfg["cluster"],
            "model": cfg["model"],
        }
    )
    full = parse_run_spec(cfg)
    for f in (
        "steps",
        "warmup_steps",
        "planner_clock",
        "executor",
        "unit",
        "epochs",
        "train",
        "noise",
        "mem_cap_fraction",
        "away_from_default",
        "seed",
        "root",
        "campaign",
        "timeout_s",
        "zero_stage",
    ):
        assert getattr(bare, f) == getattr(full, f), f


def test_a_batch_dealer_trains_every_fresh_sample_once_over_the_run() -> None:
    # WLB-LLM delays outliers (its `deal_batch`): the run's steps train the workload's samples,
    # each once, some in a later step than they arrived; the rest are still waiting at the end
    spec = _spec(
        [
            "workload=synthetic_lognormal",
            "model=tiny_llama",
            "method=wlb_llm",
            "method.outlier_thresholds=[2048]",
            "method.outlier_queues=1",
            "nproc=4",
            "cluster=cpu",
            "steps=5",
            "warmup_steps=1",
            "run.root=unused",
        ]
    )
    parts = assemble(spec)
    fresh = assemble(spec).workload
    trained: list[int] = []
    arrived: list[int] = []
    late = 0
    for d in deal_steps(spec, parts, 4):
        ids = fresh.global_batch(d.step, 4, spec.model.max_seq_len).sample_ids.tolist()
        arrived += ids
        plan = d.plan_fn(d.batch)
        assert sorted(set(plan.sample_positions())) == list(range(d.batch.n))
        late += len(plan.info["released_samples"])
        trained += d.batch.sample_ids.tolist()
        assert d.deal_s >= 0.0
    waiting = plan.info["documents_waiting"]
    assert len(trained) == len(set(trained)) and set(trained) <= set(arrived)
    assert len(trained) + waiting == len(arrived)
    assert late > 0  # some outlier did wait for a later step
