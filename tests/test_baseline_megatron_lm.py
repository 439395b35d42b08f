"""megatron_lm / megatron_lm_tuned: Megatron-LM with a fixed TP/PP/CP/DP launch, as FlexSP ran it.
Properties checked against independent references: best-fit packing by hand, every sample once,
the deal to replicas, the tuned launch being the argmin of a brute-force pricing of every launch
by the simulator, and one-line refusals."""

from __future__ import annotations

import numpy as np
import pytest

from baselines.megatron_lm import MegatronLaunch, MegatronLM, MegatronLMTuned, megatron_plan
from dcp_bench.batch import GlobalBatch
from dcp_bench.config import load_config, to_container
from dcp_bench.cost import make_cost_model
from dcp_bench.errors import ConfigError, InfeasibleError
from dcp_bench.plan import validate_plan
from dcp_bench.planners.base import make_planner
from dcp_bench.sim import simulate_step


def cost(cap: float = 0.75) -> object:
    return make_cost_model("gpt_7b", "a100x64", "analytical", mem_cap_fraction=cap)


def test_best_fit_packing_and_deal_hand_worked() -> None:
    """Lengths 60, 50, 40, 30, 20, 10 (thousands) into 100K micro-batches by best-fit
    decreasing: [60, 40], [50, 30, 20], [10]; dealt in order to dp=2 replicas: replica 0 holds
    micro-batches 0 and 2, replica 1 micro-batch 1."""
    c = cost()
    batch = GlobalBatch.from_lengths([10_000, 60_000, 30_000, 50_000, 20_000, 40_000])
    launch = MegatronLaunch(tp=8, pp=2, cp=2, recompute="full")  # 32 ranks a replica, dp = 2
    plan = megatron_plan(batch, c, launch, 100_000)
    g0, g1 = plan.rounds[0].groups
    assert (g0.start, g0.size, g1.start, g1.size) == (0, 32, 32, 32)
    assert [mb.samples for mb in g0.micro_batches] == [(1, 5), (0,)]
    assert [mb.samples for mb in g1.micro_batches] == [(2, 3, 4)]
    assert all(mb.ckpt_layers == 32 and mb.sp_kind == "ring" for _, _, mb in plan.micro_batches())
    assert plan.model_parallel is not None and (plan.model_parallel.tp, plan.model_parallel.pp) == (
        8,
        2,
    )
    assert plan.info["dp"] == 2 and plan.info["micro_batches_per_replica"] == [2, 1]
    validate_plan(plan, batch, c)


def test_plan_covers_every_sample_and_simulates() -> None:
    c = cost()
    rng = np.random.default_rng(0)
    batch = GlobalBatch.from_lengths(rng.integers(200, 30_000, 300).tolist())
    plan = MegatronLM(tp=4, pp=2, cp=2, recompute="full", seq_length=65_536).plan(batch, c)
    assert sorted(plan.sample_positions()) == list(range(batch.n))
    validate_plan(plan, batch, c)
    res = simulate_step(plan, batch, c)
    assert not res.oom and res.step_time_s > 0
    assert res.tokens == int(batch.tokens.sum())


def test_launch_that_fits_no_gpu_is_refused_in_one_line() -> None:
    c = cost()
    batch = GlobalBatch.from_lengths([100_000, 2_000])
    with pytest.raises(InfeasibleError) as exc:
        MegatronLM(tp=1, pp=1, cp=1, recompute="none", seq_length=192_000).plan(batch, c)
    msg = str(exc.value)
    assert "\n" not in msg and "tp=1 pp=1 cp=1 dp=64 recompute=none" in msg
    assert "over the memory cap" in msg


def test_fitted_cost_source_is_refused_with_its_name() -> None:
    fitted = make_cost_model(
        "gpt_7b", "a100x64", source="flexsp_fitted", seq_limit_k=192, memory_limit_gb=30
    )
    batch = GlobalBatch.from_lengths([10_000, 2_000])
    with pytest.raises(ConfigError, match="flexsp_fitted cost model"):
        MegatronLM(tp=2, seq_length=16_384).plan(batch, fitted)
    with pytest.raises(ConfigError, match="flexsp_fitted cost model .* prices no tensor"):
        MegatronLMTuned(seq_length=16_384).plan(batch, fitted)


def test_bad_options_are_named() -> None:
    with pytest.raises(ConfigError, match="recompute='half'; expected one of none, selective"):
        MegatronLM(recompute="half")
    with pytest.raises(ConfigError, match="tp=3; expected a power of two"):
        MegatronLM(tp=3)
    with pytest.raises(ConfigError, match="cp_choices holds 6"):
        MegatronLMTuned(cp_choices=[2, 6])


def test_tuned_launch_is_the_argmin_of_every_launch_simulated() -> None:
    """Brute force: simulate every candidate launch on the batch; the tuned one is the fastest,
    its search is recorded (candidates and times) and booked as offline tuning (tune_s)."""
    c = cost()
    rng = np.random.default_rng(3)
    batch = GlobalBatch.from_lengths(rng.integers(500, 60_000, 200).tolist())
    tuner = MegatronLMTuned(
        seq_length=65_536, tp_choices=[2, 8], pp_choices=[1, 4], cp_choices=[1, 4]
    )
    plan = tuner.plan(batch, c)
    best: tuple[float, str] | None = None
    for launch in tuner.candidates(c):
        try:
            p = megatron_plan(batch, c, launch, 65_536)
        except InfeasibleError:
            continue
        t = simulate_step(p, batch, c).step_time_s
        if best is None or t < best[0]:
            best = (t, launch.describe(64))
    assert best is not None and plan.info["tuned_launch"] == best[1]
    assert simulate_step(plan, batch, c).step_time_s == pytest.approx(best[0], rel=1e-9)
    rows = plan.info["tune_search"]
    assert len(rows) == plan.info["candidates"] == len(tuner.candidates(c))
    assert plan.info["tune_s"] > 0
    # the next batch reuses the launch without searching again
    again = tuner.plan(batch, c)
    assert again.info["tune_s"] == 0.0 and again.info["tuned_launch"] == best[1]


def test_method_config_builds_the_tuned_peer() -> None:
    node = dict(to_container(load_config(["method=megatron_lm_tuned"]))["method"])
    planner = make_planner(node)
    assert isinstance(planner, MegatronLMTuned) and planner.name == "megatron_lm_tuned"
