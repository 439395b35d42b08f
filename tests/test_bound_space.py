"""The lower bound at the configured memory cap and at the physical limit (the whole usable GPU
memory): the physical bound is a bound of the machine, which no plan under any cap beats."""

from __future__ import annotations

import json

import pytest

from dcp_bench.cli import main
from dcp_bench.cost import make_cost_model
from dcp_bench.cost.specs import cluster_spec
from dcp_bench.plan import validate_plan
from dcp_bench.planners.dcp import DCPPlanner
from dcp_bench.sim import lower_bound, physical_lower_bound, simulate_step, with_memory_cap
from dcp_bench.workloads import load_workload


def test_with_memory_cap_copies() -> None:
    cost = make_cost_model("llama3_8b", "h200x8")
    high = with_memory_cap(cost, 0.95)
    assert cost.mem_cap_fraction == 0.7 and high.mem_cap_fraction == 0.95
    assert high.memory_cap_bytes == pytest.approx(0.95 / 0.7 * cost.memory_cap_bytes)
    with pytest.raises(ValueError, match="fraction=1.5"):
        with_memory_cap(cost, 1.5)


@pytest.mark.parametrize("workload", ["prolong", "wikipedia"])
@pytest.mark.parametrize("world", [8, 24])
def test_no_plan_under_any_cap_beats_the_physical_bound(workload: str, world: int) -> None:
    """dcp planned under caps from 0.7 to 1.0 of usable memory: every plan validates under its
    cap, its simulated step is at least the physical bound, and the bound at the configured cap
    is at least the physical one (more memory only adds settings)."""
    base = make_cost_model("llama3_8b", cluster_spec("h200x8").resized(world))
    batch = load_workload(workload).global_batch(0, world, base.model.max_seq_len)
    physical = physical_lower_bound(batch, base)
    for fraction in (0.7, 0.8, 0.9, 0.95, 1.0):
        cost = with_memory_cap(base, fraction)
        at_cap = lower_bound(batch, cost, infeasible="skip")
        assert at_cap >= physical * (1 - 1e-12)
        plan = DCPPlanner().plan(batch, cost)
        validate_plan(plan, batch, cost)
        step = simulate_step(plan, batch, cost).step_time_s
        assert step >= at_cap * (1 - 1e-12) and step >= physical * (1 - 1e-12)
    assert physical == pytest.approx(
        lower_bound(batch, with_memory_cap(base, 1.0), infeasible="skip")
    )


def test_simulate_records_both_bounds(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            [
                "simulate",
                "workload=wikipedia",
                "method=dcp",
                "cluster=h200x8",
                "model=llama3_8b",
                "steps=1",
                "warmup_steps=0",
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert 0 < out["outcome"]["lower_bound_physical_s"] <= out["lower_bound_s"] * (1 + 1e-12)
