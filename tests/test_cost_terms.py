"""Cost terms are one declared structure: a term added in one place (docs/extending.md, "A new cost
term": the page's own module, written into an empty folder) reaches the planner, the simulator,
the step records and the report; and the declared terms add up the way the code always added
them."""

from __future__ import annotations

import functools
import importlib
import json
import operator
import re
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from dcp_bench.batch import GlobalBatch
from dcp_bench.config import load_config, to_container
from dcp_bench.cost import make_cost_model
from dcp_bench.cost.base import MICROBATCH_TIME_TERMS, MicroBatchCost
from dcp_bench.paths import REPO_ROOT
from dcp_bench.plan import Group, MicroBatch, Round, StepPlan, validate_plan
from dcp_bench.planners.dcp import DCPPlanner
from dcp_bench.report.claims import part_names
from dcp_bench.report.tables import STEP_PARTS, load_campaign
from dcp_bench.run.assemble import RunParts, assemble
from dcp_bench.run.simulated import run_simulated
from dcp_bench.run.spec import RunSpec, parse_run_spec
from dcp_bench.sim import simulate_step

DOC = REPO_ROOT / "docs" / "extending.md"
FENCE = re.compile(r"^```(\w+)(?:[ \t]+(\S+))?[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)
IO_S = 0.05  # seconds per checkpointed layer and micro-batch: large, so it decides choices


@pytest.fixture
def term_module(tmp_path: Path) -> Iterator[ModuleType]:
    """The page's cost-term module, written into an empty folder and imported from there."""
    files = {
        path: body
        for _, path, body in FENCE.findall(DOC.read_text())
        if path.startswith("my_cost/")
    }
    assert set(files) == {"my_cost/checkpoint_io.py", "my_cost/__init__.py"}
    for path, body in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(body)
    sys.path.insert(0, str(tmp_path))
    try:
        yield importlib.import_module("my_cost.checkpoint_io")
    finally:
        sys.path.remove(str(tmp_path))
        for name in [n for n in sys.modules if n == "my_cost" or n.startswith("my_cost.")]:
            del sys.modules[name]


def _batch(tokens: list[int]) -> GlobalBatch:
    t = np.asarray(tokens, dtype=np.int64)
    return GlobalBatch(
        step=0, sample_ids=np.arange(len(t)), tokens=t, frames=np.ones(len(t), dtype=np.int64)
    )


def test_the_declared_terms_add_up_in_the_order_the_code_always_added_them() -> None:
    """`total_s` is ((fwd + bwd) + recompute) + comm, bit for bit, and the terms are the four
    the step records have always named."""
    assert [t.name for t in MICROBATCH_TIME_TERMS] == ["fwd_s", "bwd_s", "recompute_s", "comm_s"]
    assert STEP_PARTS == ("compute_s", "recompute_s", "comm_s", "sync_s", "idle_s")
    rng = np.random.default_rng(0)
    for _ in range(200):
        f, b, r, c = (float(x) for x in rng.lognormal(size=4))
        assert MicroBatchCost(f, b, r, c, 0.0, 0.0).total_s == ((f + b) + r) + c
    cost = make_cost_model("llama3_8b", "h200x8")
    tok = np.array([4096, 128, 30000, 700])
    vec = cost.microbatch_costs(
        tok, np.ones(4, dtype=np.int64), np.array([0, 0, 1, 1]), np.array([2, 4]), np.array([0, 3])
    )
    assert list(vec) == [
        "fwd_s",
        "bwd_s",
        "recompute_s",
        "comm_s",
        "mem_bytes",
        "model_flops",
        "short_attn_s",
        "host_input_s",
    ]
    np.testing.assert_array_equal(
        cost.total_time(vec),
        (((vec["fwd_s"] + vec["bwd_s"]) + vec["recompute_s"]) + vec["comm_s"] + vec["short_attn_s"])
        + vec["host_input_s"],
    )


def test_a_new_term_reaches_every_price(term_module: ModuleType) -> None:
    """The term is in `microbatch_costs`, `microbatch_cost` (both splits), `total_s` and
    `sample_time`, at the value the page's formula gives; the other terms are unchanged."""
    base = make_cost_model("llama3_8b", "h200x8")
    new = term_module.CheckpointIOCost(model=base.model, cluster=base.cluster, io_s_per_layer=IO_S)
    tok, fr = np.array([9000, 300, 2000]), np.ones(3, dtype=np.int64)
    for sp, k, split in (
        (1, 0, "sequence"),
        (2, 5, "sequence"),
        (8, 32, "sequence"),
        (4, 7, "batch"),
    ):
        a, b = (
            base.microbatch_cost(tok, fr, sp, k, split),
            new.microbatch_cost(tok, fr, sp, k, split),
        )
        assert b.times() == {**a.times(), "checkpoint_io_s": IO_S * k}
        assert b.total_s == pytest.approx(a.total_s + IO_S * k, rel=1e-12)
        assert (b.mem_bytes, b.model_flops) == (a.mem_bytes, a.model_flops)
    np.testing.assert_allclose(
        new.sample_time(tok, fr, 2, 4), base.sample_time(tok, fr, 2, 4) + 4 * IO_S, rtol=1e-12
    )
    vec = new.microbatch_costs(tok, fr, np.array([0, 1, 1]), np.array([1, 2]), np.array([3, 0]))
    np.testing.assert_array_equal(vec["checkpoint_io_s"], [3 * IO_S, 0.0])


def test_the_simulator_adds_the_term_to_every_micro_batch(term_module: ModuleType) -> None:
    """A fixed plan: one round, groups of 2 and 4 ranks and single ranks, some micro-batches
    checkpointed. Step time = the slowest group's micro-batch times + sync, computed here from
    each micro-batch's price plus the page's term; the step's parts add up to it."""
    base = make_cost_model("llama3_8b", "h200x8")
    new = term_module.CheckpointIOCost(model=base.model, cluster=base.cluster, io_s_per_layer=IO_S)
    batch = _batch([20000, 3000, 500, 64000, 8000, 1200, 900, 40000])
    plan = StepPlan(
        world_size=8,
        rounds=[
            Round(
                groups=[
                    Group(0, 4, [MicroBatch((3,), ckpt_layers=16), MicroBatch((1, 2))]),
                    Group(
                        4, 2, [MicroBatch((7,), ckpt_layers=32), MicroBatch((5, 6), ckpt_layers=0)]
                    ),
                    Group(6, 1, [MicroBatch((0,), ckpt_layers=8)]),
                    Group(7, 1, [MicroBatch((4,), ckpt_layers=2)]),
                ]
            )
        ],
    )
    validate_plan(plan, batch, num_layers=base.model.num_layers)
    L = base.model.num_layers
    assert L == 32

    def expected(io: float) -> tuple[float, float]:
        per_group = [
            sum(
                base.microbatch_cost(
                    batch.tokens[list(mb.samples)],
                    batch.frames[list(mb.samples)],
                    g.size,
                    mb.ckpt_layers,
                ).total_s
                + io * mb.ckpt_layers
                for mb in g.micro_batches
            )
            for g in plan.rounds[0].groups
        ]
        io_part = (
            sum(
                io * mb.ckpt_layers * g.size
                for g in plan.rounds[0].groups
                for mb in g.micro_batches
            )
            / 8
        )
        return max(per_group) + base.step_sync_time(), io_part

    old, res = simulate_step(plan, batch, base), simulate_step(plan, batch, new)
    assert old.step_time_s == pytest.approx(expected(0.0)[0], rel=1e-9)
    step, io_part = expected(IO_S)
    assert res.step_time_s == pytest.approx(step, rel=1e-9)
    assert res.step_time_s > old.step_time_s + 0.5  # 16 + 32 layers' I/O on the slowest groups
    acct = res.account
    assert acct is not None
    assert acct.parts["checkpoint_io_s"] == pytest.approx(io_part, rel=1e-12)
    assert functools.reduce(operator.add, acct.parts.values()) + acct.idle_s == pytest.approx(
        res.step_time_s, rel=1e-12
    )
    assert old.account is not None and "checkpoint_io_s" not in old.account.parts


def test_the_planner_weighs_the_new_term(term_module: ModuleType) -> None:
    """Samples that fit one rank only with checkpointing: without the term `dcp` runs them on one
    rank, checkpointed; with checkpointing made dear, on two ranks without it. Its own prediction
    of the plan it made includes the term."""
    base = make_cost_model("llama3_8b", "h200x8")
    new = term_module.CheckpointIOCost(model=base.model, cluster=base.cluster, io_s_per_layer=IO_S)
    budget = base.memory_cap_bytes - base.static_memory_bytes()
    # the longest length that fits one rank without checkpointing, and a little more
    lo, hi = 1, 1 << 20
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (
            (mid, hi)
            if base.sample_memory(np.array([mid]), np.ones(1, dtype=np.int64), 1, 0)[0] <= budget
            else (lo, mid)
        )
    batch = _batch([int(lo * 1.05)] * 8 + [2000] * 40)
    planner = DCPPlanner()
    plans = {name: planner.plan(batch, cost) for name, cost in (("base", base), ("new", new))}
    for plan in plans.values():
        validate_plan(plan, batch, num_layers=base.model.num_layers, cost=base)
    ckpt = {
        name: sum(mb.ckpt_layers for _, _, mb in p.micro_batches()) for name, p in plans.items()
    }
    assert ckpt["base"] > 0 and ckpt["new"] == 0
    # what the new plan costs under the new model is what the simulator says it costs
    sim = simulate_step(plans["new"], batch, new)
    assert plans["new"].info["predicted_step_time_s"] == pytest.approx(sim.compute_end_s, rel=1e-9)
    # and the base plan, priced with the term, costs its checkpointed layers' I/O more
    assert (
        simulate_step(plans["base"], batch, new).step_time_s
        > simulate_step(plans["base"], batch, base).step_time_s
    )


def test_records_and_report_show_the_new_term_by_name(
    term_module: ModuleType, tmp_path: Path
) -> None:
    """A simulated run priced with the page's cost model: every step record has the new part
    beside the others, they add up to the simulated step time, and the report's step table and
    decomposition rows name it."""
    cfg = to_container(
        load_config(
            [
                "workload=sharegpt",
                "model=llama3_8b",
                "cluster=h200x8",
                "method=dcp",
                "steps=2",
                "warmup_steps=0",
                f"run.root={tmp_path / 'runs'}",
                "run.campaign=terms",
            ]
        )
    )

    def build(spec: RunSpec) -> RunParts:
        parts = assemble(spec)
        cost = term_module.CheckpointIOCost(
            model=spec.model,
            cluster=spec.cluster,
            mem_cap_fraction=spec.mem_cap_fraction,
            io_s_per_layer=IO_S,
        )
        return replace(parts, cost=cost, plan_cost=cost)

    summary = run_simulated(parse_run_spec(cfg), build=build)
    assert summary.status == "ok", summary.error
    campaign = load_campaign(tmp_path / "runs", "terms")
    assert campaign.added_parts == {
        "short_attn_s": "short attention, memory-traffic floor",
        "host_input_s": "input copy to the GPU (the reference's loop)",
        "checkpoint_io_s": "checkpoint offload I/O",
    }
    assert campaign.step_parts == (
        "compute_s",
        "recompute_s",
        "comm_s",
        "short_attn_s",
        "host_input_s",
        "checkpoint_io_s",
        "sync_s",
        "idle_s",
    )
    steps = campaign.steps
    assert len(steps) == 2 and steps["checkpoint_io_s"].notna().all()
    records = [
        json.loads(ln)
        for ln in (tmp_path / "runs" / "terms" / summary.run_id / "steps.jsonl")
        .read_text()
        .splitlines()
    ]
    for rec, (_, row) in zip(records, steps.iterrows()):
        ex = rec["extra"]
        assert ex["added_parts"] == campaign.added_parts
        assert ex["checkpoint_io_s"] == row["checkpoint_io_s"]
        total = functools.reduce(operator.add, (ex[k] for k in campaign.step_parts))
        assert total == pytest.approx(ex["sim_step_time_s"], rel=1e-12)
    assert (
        steps["checkpoint_io_s"].sum() > 0
    )  # sharegpt's longest conversations are checkpointed on 8 GPUs
    names = part_names(campaign)
    assert names["checkpoint_io_s"] == "checkpoint offload I/O"
    assert list(names) == [
        "idle_s",
        "checkpoint_io_s",
        "host_input_s",
        "short_attn_s",
        "comm_s",
        "recompute_s",
        "compute_s",
        "sync_s",
        "planner_s",
    ]
