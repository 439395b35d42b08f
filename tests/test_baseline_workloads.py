"""Every baseline's plan passes the validator on every shipped workload at 32 H200s, with the
shipped analytical cost model (Llama-3-8B for text workloads, STDiT3-XL/2 for video), and on
the other model too; one step each, with a smaller token budget per GPU to stay fast."""

from __future__ import annotations

import pytest

from dcp_bench.config import group_choices, load_config
from dcp_bench.cost import make_cost_model
from dcp_bench.plan import validate_plan
from dcp_bench.planners.base import make_planner
from dcp_bench.workloads import WORKLOADS as NAMED_WORKLOADS
from dcp_bench.workloads import load_workload

BASELINES = [
    "bucket_static",
    "static_tuned",
    "packed_static",
    "megatron_hybrid_cp",
    "flexsp_milp",
    "wlb_llm",
]
# the named workloads (FlexSP's iterations, a class of their own read for FlexSP's 64-GPU world,
# are planned by the FlexSP claim's tests: tests/test_reproduce_claim.py, test_flexsp_claim.py)
WORKLOADS = [w for w in group_choices("workload") if w in NAMED_WORKLOADS and w != "lengths_file"]
COSTS: dict[str, object] = {}


def cost_for(model: str):
    if model not in COSTS:
        COSTS[model] = make_cost_model(model, "h200x32")
    return COSTS[model]


def shipped(method: str) -> bool:
    return method in group_choices("method")


def check_workload(method: str, workload: str, tokens_per_gpu: int) -> None:
    if not shipped(method):
        pytest.skip(f"{method} not shipped")
    wl = load_workload(workload, tokens_per_gpu=tokens_per_gpu)
    model = "llama3_8b" if wl.kind == "text" else "stdit3_xl2"
    for m in (model, "stdit3_xl2" if model == "llama3_8b" else "llama3_8b"):
        cost = cost_for(m)
        batch = wl.global_batch(0, 32, cost.model.max_seq_len)
        overrides = [f"method={method}"]
        if method == "flexsp_milp":
            overrides.append("method.step_time_limit_s=0.3")
        planner = make_planner(load_config(overrides).method)
        plan = planner.plan(batch, cost)
        validate_plan(plan, batch, cost)
        assert plan.method == method and plan.world_size == 32
        if plan.mode == "fair":
            assert sorted(plan.sample_positions()) == list(range(batch.n))


@pytest.mark.parametrize("workload", ["prolong", "videosys_zipf"])
@pytest.mark.parametrize("method", BASELINES)
def test_plans_validate_on_a_text_and_a_video_workload(method, workload):
    check_workload(method, workload, 8 * 1024)


@pytest.mark.slow
@pytest.mark.parametrize("workload", WORKLOADS)
@pytest.mark.parametrize("method", BASELINES)
def test_plans_validate_on_every_workload(method, workload):
    check_workload(method, workload, 32 * 1024)


@pytest.mark.parametrize("method", BASELINES)
def test_paper_mode_plans_validate(method):
    if not shipped(method):
        pytest.skip(f"{method} not shipped")
    wl = load_workload("videosys_zipf", tokens_per_gpu=8 * 1024)
    cost = cost_for("stdit3_xl2")
    batch = wl.global_batch(0, 32, cost.model.max_seq_len)
    overrides = [f"method={method}", "method.mode=paper"]
    if method == "flexsp_milp":
        overrides.append("method.step_time_limit_s=0.3")
    plan = make_planner(load_config(overrides).method).plan(batch, cost)
    validate_plan(plan, batch, cost)
    assert plan.mode == "paper"
