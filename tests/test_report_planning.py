"""The planning-cost and machine-bound report sections, from records: offline tuning (warm-up
included), retunes and budget overruns counted; step time over both bounds."""

from __future__ import annotations

import pandas as pd

from dcp_bench.records import StepRecord
from dcp_bench.report.document import Document
from dcp_bench.report.planning import (
    machine_bound_section,
    machine_bound_table,
    planning_cost_section,
    planning_cost_table,
)
from dcp_bench.run.loop import planning_cost


def _step(
    i: int, plan_ms: float, tune: float = 0.0, budget: float | None = None, warmup: bool = False
) -> StepRecord:
    return StepRecord(
        step=i,
        step_time_s=1.0,
        warmup=warmup,
        planner_ms=plan_ms,
        extra={"offline_tune_s": tune, "planner_budget_s": budget},
    )


def test_planning_cost_counts_tuning_retunes_and_overruns() -> None:
    steps = [
        _step(0, 5000, tune=4.9, warmup=True),
        _step(1, 10),
        _step(2, 3000, tune=2.9),
        _step(3, 12),
    ]
    pc = planning_cost(steps)
    assert pc.offline_tune_total_s == 4.9 + 2.9
    assert pc.retunes == 1 and pc.planner_max_ms == 5000
    assert pc.planner_over_budget_steps == 0
    budgeted = [_step(0, 1900, budget=2.0), _step(1, 2250, budget=2.0), _step(2, 2100, budget=2.0)]
    assert planning_cost(budgeted).planner_over_budget_steps == 2
    assert planning_cost([]).planner_max_ms is None


RUNS = pd.DataFrame(
    [
        {
            "workload": "prolong",
            "model": "llama3_8b",
            "world_size": 24,
            "label": "dcp",
            "planner_ms": 40.0,
            "step_time_s": 10.0,
            "lower_bound_s": 9.9,
            "lower_bound_physical_s": 9.8,
            "mem_cap_fraction": 0.7,
            "planner_clock": "overlap",
            "offline_tune_total_s": 0.0,
            "retunes": 0,
            "planner_max_ms": 50.0,
            "planner_over_budget_steps": 0,
        },
        {
            "workload": "prolong",
            "model": "llama3_8b",
            "world_size": 24,
            "label": "megatron_hybrid_cp",
            "planner_ms": 2000.0,
            "step_time_s": 11.0,
            "lower_bound_s": 9.9,
            "lower_bound_physical_s": 9.8,
            "mem_cap_fraction": 0.7,
            "planner_clock": "overlap",
            "offline_tune_total_s": 126.0,
            "retunes": 1,
            "planner_max_ms": 97500.0,
            "planner_over_budget_steps": 0,
        },
        {
            "workload": "prolong",
            "model": "llama3_8b",
            "world_size": 24,
            "label": "megatron_hybrid_cp",
            "planner_ms": 1000.0,
            "step_time_s": 12.0,
            "lower_bound_s": 9.9,
            "lower_bound_physical_s": 9.8,
            "mem_cap_fraction": 0.7,
            "planner_clock": "overlap",
            "offline_tune_total_s": 100.0,
            "retunes": 2,
            "planner_max_ms": 50000.0,
            "planner_over_budget_steps": 1,
        },
    ]
)


def test_tables_show_the_numbers() -> None:
    pc = planning_cost_table(RUNS).set_index("method")
    assert pc.loc["megatron_hybrid_cp", "runs"] == 2
    assert pc.loc["megatron_hybrid_cp", "offline tuning s/run"] == "113"  # median of 126 and 100
    assert (
        pc.loc["megatron_hybrid_cp", "retunes"] == "3"
        and pc.loc["megatron_hybrid_cp", "steps over budget"] == "1"
    )
    assert pc.loc["megatron_hybrid_cp", "longest step ms"] == "9.75e+04"
    assert pc.loc["dcp", "plan() / step time"] == "0.40%"
    mb = machine_bound_table(RUNS).set_index("method")
    assert mb.loc["dcp", "step / bound at cap"] == f"{10 / 9.9:.3g}"
    assert mb.loc["dcp", "step / physical bound"] == f"{10 / 9.8:.3g}"
    assert mb.loc["megatron_hybrid_cp", "step / physical bound"] == f"{11.5 / 9.8:.3g}"


def test_sections_render_and_say_when_records_lack_them() -> None:
    class Data:
        class campaign:  # noqa: N801
            runs = RUNS

    doc = Document("t")
    planning_cost_section(doc, Data)
    machine_bound_section(doc, Data)
    text = doc.to_markdown()
    assert "Planning cost of every method" in text and "whole layers" in text

    class Old:
        class campaign:  # noqa: N801
            runs = RUNS.drop(columns=["lower_bound_physical_s", "planner_ms"])

    doc2 = Document("t")
    planning_cost_section(doc2, Old)
    machine_bound_section(doc2, Old)
    text2 = doc2.to_markdown()
    assert "No runs with planning times" in text2 and "No runs recorded the physical bound" in text2
