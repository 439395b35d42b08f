"""Planning time of every baseline (on the clock in every run, like DCP's): 32 H200s x 512
sequences, analytical cost model, llama3_8b, log-normal lengths (median ~5K tokens, capped at
128K) -- the same batch as the DCP planner benchmark. static_tuned is timed once tuned (its
grid search is offline work, timed separately); flexsp_milp with a 0.5 s solver limit.
Run: ``pytest tests/benchmarks/test_bench_baselines.py --benchmark-enable``.
"""

from __future__ import annotations

import numpy as np
import pytest

from dcp_bench.batch import GlobalBatch
from dcp_bench.config import load_config
from dcp_bench.cost import make_cost_model
from dcp_bench.plan import validate_plan
from dcp_bench.planners.base import make_planner

BASELINES = [
    "bucket_static",
    "static_tuned",
    "packed_static",
    "megatron_hybrid_cp",
    "flexsp_milp",
    "wlb_llm",
]


def _batch(n: int, seed: int = 0) -> GlobalBatch:
    rng = np.random.default_rng(seed)
    return GlobalBatch.from_lengths(
        np.minimum(rng.lognormal(8.5, 1.2, n).astype(np.int64) + 16, 131_072)
    )


@pytest.mark.parametrize("method", BASELINES)
def test_bench_baseline_planning_time(benchmark, method: str) -> None:
    cost = make_cost_model("llama3_8b", "h200x32")
    batch = _batch(512)
    overrides = [f"method={method}"] + (
        ["method.step_time_limit_s=0.5"] if method == "flexsp_milp" else []
    )
    planner = make_planner(load_config(overrides).method)
    planner.plan(batch, cost)  # tunes static_tuned; warms caches for the rest
    plan = benchmark(planner.plan, batch, cost)
    validate_plan(plan, batch, cost)


def test_bench_static_tuned_grid_search(benchmark) -> None:
    cost = make_cost_model("llama3_8b", "h200x32")
    batch = _batch(512)

    def tune() -> object:
        planner = make_planner(load_config(["method=static_tuned"]).method)
        return planner.plan(batch, cost)

    plan = benchmark.pedantic(tune, rounds=3, iterations=1)
    validate_plan(plan, batch, cost)
