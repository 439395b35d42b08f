"""`dcp-bench simulate` and `dcp-bench plan` with a trivial static planner registered from a user
config folder; the printed numbers are checked against the simulator run directly."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dcp_bench.cli import main
from dcp_bench.config import load_config
from dcp_bench.cost import make_cost_model
from dcp_bench.errors import ConfigError
from dcp_bench.plan import Group, MicroBatch, Round, StepPlan
from dcp_bench.planners.base import Planner
from dcp_bench.sim import lower_bound, simulate_run, simulate_step
from dcp_bench.workload import make_workload


class OneGroupPerRank(Planner):
    """Static data parallelism: sample i on rank i mod W, every layer checkpointed."""

    name = "one_group_per_rank"

    def plan(self, batch, cost):
        W = cost.cluster.world_size
        L = cost.model.num_layers
        groups = [Group(r, 1, [MicroBatch((i,), L) for i in range(r, batch.n, W)]) for r in range(W)]
        return StepPlan(W, [Round([g for g in groups if g.micro_batches])], method=self.name, mode=self.mode, step=batch.step)


class NeedsPositiveWidth(OneGroupPerRank):
    def __init__(self, width: int, mode: str = "fair") -> None:
        super().__init__(mode)  # type: ignore[arg-type]
        if width < 1:
            raise ConfigError(f"width={width}: expected >= 1")


@pytest.fixture
def conf_dir(tmp_path: Path) -> Path:
    (tmp_path / "method").mkdir()
    (tmp_path / "method" / "per_rank.yaml").write_text(
        f"name: per_rank\n_target_: {__name__}.OneGroupPerRank\nmode: fair\n"
    )
    (tmp_path / "method" / "bad_width.yaml").write_text(
        f"name: bad_width\n_target_: {__name__}.NeedsPositiveWidth\nwidth: 0\n"
    )
    return tmp_path


def overrides(conf_dir: Path, steps: int = 3) -> list[str]:
    return [
        f"extra_conf={conf_dir}", "method=per_rank", "workload=synthetic_uniform", "cluster=h200x8",
        "model=llama3_8b", "workload.tokens_per_gpu=16384", f"run.steps={steps}", "run.warmup_steps=1",
        "+run.planner_on_clock=false",
    ]


def test_simulate_run_medians_equal_direct_simulation(conf_dir):
    cfg = load_config(overrides(conf_dir))
    summary, records = simulate_run(cfg)
    assert len(records) == 4 and records[0]["warmup"] and not records[1]["warmup"]
    cost = make_cost_model("llama3_8b", "h200x8")
    workload = make_workload(cfg.workload)
    times, bounds = [], []
    for step in range(1, 4):
        batch = workload.global_batch(step, 8, cost.model.max_seq_len)
        plan = OneGroupPerRank().plan(batch, cost)
        times.append(simulate_step(plan, batch, cost).step_time_s)
        bounds.append(lower_bound(batch, cost))
    assert summary["step_time_s"] == pytest.approx(float(np.median(times)))
    assert summary["lower_bound_s"] == pytest.approx(float(np.median(bounds)))
    assert summary["lower_bound_s"] <= summary["step_time_s"]
    assert summary["label"] == "simulated" and summary["cost_model"]["source"] == "analytical"
    assert summary["oom_steps"] == 0 and summary["steps"] == 3


def test_simulate_json_has_the_issue_keys(conf_dir, capsys):
    assert main(["simulate", *overrides(conf_dir, steps=2), "seed=3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("step_time_s", "lower_bound_s", "imbalance", "peak_mem_gib", "oom_steps", "mfu", "planner_ms", "config"):
        assert key in out
    assert out["config"]["seed"] == 3 and out["label"] == "simulated"
    assert out["config"]["run"]["steps"] == 2


def test_simulate_steps_shortcut_and_text_output(conf_dir, capsys):
    args = [a for a in overrides(conf_dir) if not a.startswith("run.steps")]
    assert main(["simulate", *args, "steps=1"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("SIMULATED:") and "1 steps after 1 warm-up" in text and "median lower bound" in text


def test_plan_prints_a_loadable_plan(conf_dir, capsys):
    args = [a for a in overrides(conf_dir) if not a.startswith("run.")]
    assert main(["plan", *args, "step=2"]) == 0
    plan = StepPlan.from_json(capsys.readouterr().out)
    assert plan.step == 2 and plan.world_size == 8
    assert sorted(plan.sample_positions()) == list(range(len(plan.info["batch"]["tokens"])))
    assert plan.info["cost_model"]["cluster"] == "h200x8"


def test_bad_input_is_one_line_exit_2(conf_dir, capsys):
    assert main(["simulate", "cluster=h300x32"]) == 2
    err = capsys.readouterr().err
    assert "unknown cluster 'h300x32'" in err and "h200x32" in err and err.count("\n") == 1
    assert main(["plan", f"extra_conf={conf_dir}", "method=per_rank", "step=-1"]) == 2
    assert "step=-1" in capsys.readouterr().err
    assert main(["simulate", f"extra_conf={conf_dir}", "method=per_rank", "+cost.source=guess"]) == 2
    assert "unknown cost source 'guess'" in capsys.readouterr().err


def test_world_no_layout_fits_is_a_cluster_error(conf_dir, capsys):
    assert main(["simulate", f"extra_conf={conf_dir}", "method=per_rank", "cluster.gpus_per_node=6"]) == 2
    err = capsys.readouterr().err
    assert "gpus_per_node=6 is not a power of two" in err


def test_noise_and_scales_from_the_config(conf_dir):
    base = [*overrides(conf_dir, steps=2), "+noise.jitter_sigma=0.1", "+cost.scales.act_bytes=1.5"]
    a, _ = simulate_run(load_config([*base, "seed=4"]))
    b, _ = simulate_run(load_config([*base, "seed=4"]))
    c, _ = simulate_run(load_config([*base, "seed=5"]))
    assert a["noise"] == {"seed": 4, "jitter_sigma": 0.1, "straggler_prob": 0.0, "straggler_slowdown": 1.5}
    assert a["step_time_s"] == b["step_time_s"] != c["step_time_s"]
    assert a["cost_model"]["scales"]["act_bytes"] == 1.5


def test_a_planner_constructor_error_is_one_line(conf_dir, capsys):
    """Config errors raised while building a method reach the user as themselves, not wrapped."""
    assert main(["simulate", f"extra_conf={conf_dir}", "method=bad_width"]) == 2
    err = capsys.readouterr().err
    assert err == "dcp-bench simulate: error: width=0: expected >= 1\n"
