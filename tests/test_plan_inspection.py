"""`dcp_bench.run.plan_inspection` (what `dcp-bench plan` shows): the digest's counts agree with a
walk over the plan's rounds, the plan covers the batch it carries, the lower bound is below the
simulated step, and the rule check reports a planner that raises instead of raising."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

from dcp_bench.batch import GlobalBatch
from dcp_bench.cost.base import CostModel
from dcp_bench.plan import StepPlan
from dcp_bench.planners.base import Planner
from dcp_bench.run.plan_inspection import StepInput, check_step_plan, digest, load_step, plan_step

RUN = ["workload=prolong", "method=bucket_static", "cluster=h200x8", "model=llama3_8b", "seed=3"]


@pytest.fixture(scope="module")
def step_input() -> StepInput:
    return load_step(RUN, 2)


def test_digest_counts_what_the_plan_holds(step_input: StepInput) -> None:
    planned = plan_step(step_input)
    plan, batch = planned.plan, step_input.batch
    assert batch.step == 2 and planned.planner_ms >= 0
    mbs = [(g.size, mb) for r in plan.rounds for g in r.groups for mb in g.micro_batches]
    d = digest(planned)
    assert d.rounds == len(plan.rounds)
    assert d.groups == sum(len(r.groups) for r in plan.rounds)
    assert d.micro_batches == len(mbs)
    assert d.micro_batches_per_sp == dict(Counter(size for size, _ in mbs))
    assert (
        d.covered_samples == batch.n == len({s for _, mb in mbs for s in mb.samples})
    )  # fair mode: every sample
    assert 0 < d.lower_bound_s <= d.step_time_s * (1 + 1e-9)
    assert plan.info["batch"]["sample_ids"] == batch.sample_ids.tolist()
    assert plan.info["cost_model"] == step_input.parts.cost.describe()


class _Raises(Planner):
    name = "raises"

    def plan(self, batch: GlobalBatch, cost: CostModel) -> StepPlan:
        raise ValueError("no plan today")


def test_check_lists_no_offence_for_a_valid_plan_and_reports_a_raising_planner(
    step_input: StepInput,
) -> None:
    ok = check_step_plan(step_input)
    assert ok.raised is None and ok.offences == []
    assert ok.memory_cap_gib == step_input.parts.cost.memory_cap_bytes / 2**30
    broken = dataclasses.replace(
        step_input, parts=dataclasses.replace(step_input.parts, planner=_Raises())
    )
    check = check_step_plan(broken)
    assert check.raised is not None and check.raised.startswith("ValueError: no plan today (")
    assert __file__ in check.raised and check.offences == [] and check.memory_cap_gib is None
