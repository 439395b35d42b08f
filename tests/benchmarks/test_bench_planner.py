"""Planning time of `dcp` (on the clock in every run): 32 GPUs x 512 sequences (target: median
under 5 ms) and 1,024 GPUs x 16,384 sequences (target: under 200 ms), plus the faithful
DCP-inter+PAC at 32 x 512. Analytical cost model, llama3_8b, log-normal lengths (median ~5K
tokens, capped at 128K). Run: ``pytest tests/benchmarks/test_bench_planner.py --benchmark-enable``.
"""

from __future__ import annotations

import numpy as np
import pytest

from dcp_bench.batch import GlobalBatch
from dcp_bench.cost import make_cost_model
from dcp_bench.cost.specs import cluster_spec
from dcp_bench.plan import validate_plan
from dcp_bench.planners.dcp import DCPPlanner
from dcp_bench.planners.dcp_faithful import DCPInterPACPlanner


def _batch(n: int, seed: int = 0) -> GlobalBatch:
    rng = np.random.default_rng(seed)
    return GlobalBatch.from_lengths(np.minimum(rng.lognormal(8.5, 1.2, n).astype(np.int64) + 16, 131_072))


def _cost(world: int):
    if world in (8, 16, 32, 64):
        return make_cost_model("llama3_8b", f"h200x{world}")
    base = cluster_spec("h200x32")
    from dataclasses import replace

    return make_cost_model("llama3_8b", replace(base, name=f"h200x{world}", num_nodes=world // 8))


@pytest.mark.parametrize(("world", "n"), [(32, 512), (1024, 16384)])
def test_bench_dcp_planning_time(benchmark, world: int, n: int) -> None:
    cost = _cost(world)
    batch = _batch(n)
    planner = DCPPlanner()
    plan = benchmark(planner.plan, batch, cost)
    validate_plan(plan, batch, None, num_layers=cost.model.num_layers)
    assert sorted(plan.sample_positions()) == list(range(n))


def test_bench_dcp_inter_pac_planning_time(benchmark) -> None:
    cost = _cost(32)
    batch = _batch(512)
    planner = DCPInterPACPlanner()
    plan = benchmark(planner.plan, batch, cost)
    assert sorted(plan.sample_positions()) == list(range(512))
