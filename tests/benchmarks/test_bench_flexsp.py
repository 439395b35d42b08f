"""Planning time of `flexsp_milp` per step at its defaults (HiGHS stopped after ``mip_max_nodes``
= 50 branch-and-bound nodes a round: deterministic work; ``step_time_limit_s`` = 60 s is only a
wall-clock safety cap; everything in ``plan()`` on the clock: cost model, bucketing, programs,
HiGHS, layout). Checked: no step hits the safety cap (a plan that did would depend on the host's
load); the time itself is read from the table, never asserted. Cases: 32 H200s x 512
sequences (the batch of the other planner benchmarks), the first steps of a 32-GPU video
(videosys_zipf, stdit3_xl2) and text
(prolong, llama3_8b) workload, and prolong on 64 GPUs (whose first step once held HiGHS's
presolve for more than 15 minutes: in the default suite, where each case plans once, the test's
timeout is what catches a planning step that never ends). ``extra_info`` holds each run's planning
time and gaps. Run: ``pytest tests/benchmarks/test_bench_flexsp.py --benchmark-enable``.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

from dcp_bench.batch import GlobalBatch
from dcp_bench.config import load_config
from dcp_bench.cost import make_cost_model
from dcp_bench.plan import StepPlan, validate_plan
from dcp_bench.planners.base import make_planner
from dcp_bench.workloads import load_workload


def lognormal_batch(n: int, seed: int = 0) -> GlobalBatch:
    rng = np.random.default_rng(seed)
    return GlobalBatch.from_lengths(
        np.minimum(rng.lognormal(8.5, 1.2, n).astype(np.int64) + 16, 131_072)
    )


CASES = {
    "lognormal_512": ("llama3_8b", None, "h200x32"),
    "videosys_zipf": ("stdit3_xl2", "videosys_zipf", "h200x32"),
    "prolong": ("llama3_8b", "prolong", "h200x32"),
    "prolong_64": ("llama3_8b", "prolong", "h200x64"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bench_flexsp_step_planning_time(benchmark, case: str) -> None:
    model, workload, cluster = CASES[case]
    cost = make_cost_model(model, cluster)
    if workload is None:
        batches = [lognormal_batch(512)]
    else:
        wl = load_workload(workload)
        batches = [
            wl.global_batch(step, cost.cluster.world_size, cost.model.max_seq_len)
            for step in range(3)
        ]
    planner = make_planner(load_config(["method=flexsp_milp"]).method)
    steps = itertools.cycle(batches)
    plans: list[tuple[StepPlan, GlobalBatch]] = []

    def plan_next() -> StepPlan:
        batch = next(steps)
        plan = planner.plan(batch, cost)
        plans.append((plan, batch))
        return plan

    benchmark.pedantic(plan_next, rounds=5, iterations=1, warmup_rounds=1)
    for plan, batch in plans:
        validate_plan(plan, batch, cost)
        assert sorted(plan.sample_positions()) == list(range(batch.n))
    # The warm-up round left out (with --benchmark-disable, the default suite, there is one round).
    infos: list[dict[str, Any]] = [p.info for p, _ in (plans[1:] if len(plans) > 1 else plans)]
    assert not any(i["safety_cap_hit"] for i in infos), [i["cap_hit_rounds"] for i in infos]
    benchmark.extra_info.update(
        step_time_limit_s=infos[0]["step_time_limit_s"],
        mip_max_nodes=infos[0]["mip_max_nodes"],
        mip_nodes=[i["mip_nodes"] for i in infos],
        plan_s=[round(i["plan_s"], 4) for i in infos],
        rounds=[i["rounds"] for i in infos],
        mip_gap=[i["mip_gap"] for i in infos],
        step_lb_gap=[round(i["step_lb_gap"], 4) for i in infos],
        status=[i["status"] for i in infos],
    )
