"""`dcp-bench simulate` and `dcp-bench plan` with a trivial static planner registered from a user
config folder; the printed numbers are checked against the simulator run directly, and the one
run path gives the same numbers whichever command runs a config."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dcp_bench.campaign.sweep import plan_sweep, run_sweep
from dcp_bench.cli import main
from dcp_bench.config import load_config, to_container
from dcp_bench.cost import make_cost_model
from dcp_bench.errors import ConfigError
from dcp_bench.plan import Group, MicroBatch, Round, StepPlan
from dcp_bench.planners.base import Planner
from dcp_bench.records import RunSummary, read_steps
from dcp_bench.run.simulated import run_simulated
from dcp_bench.run.spec import parse_run_spec
from dcp_bench.sim import lower_bound, simulate_step
from dcp_bench.summary_schema import NoiseRecord
from dcp_bench.workloads import make_workload


class OneGroupPerRank(Planner):
    """Static data parallelism: sample i on rank i mod W, every layer checkpointed."""

    name = "one_group_per_rank"

    def plan(self, batch, cost):
        W = cost.cluster.world_size
        L = cost.model.num_layers
        groups = [
            Group(r, 1, [MicroBatch((i,), L) for i in range(r, batch.n, W)]) for r in range(W)
        ]
        return StepPlan(
            W,
            [Round([g for g in groups if g.micro_batches])],
            method=self.name,
            mode=self.mode,
            step=batch.step,
        )


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
        f"extra_conf={conf_dir}",
        "method=per_rank",
        "workload=synthetic_uniform",
        "cluster=h200x8",
        "model=llama3_8b",
        "workload.tokens_per_gpu=16384",
        f"run.steps={steps}",
        "run.warmup_steps=1",
        "run.planner_clock=off",
    ]


def simulate(ovs: list[str], **kw) -> RunSummary:
    return run_simulated(parse_run_spec(to_container(load_config(ovs))), write=False, **kw)


def test_simulate_run_medians_equal_direct_simulation(conf_dir):
    summary = simulate(overrides(conf_dir))
    assert summary.n_steps == 3 and summary.n_warmup == 1
    cost = make_cost_model("llama3_8b", "h200x8")
    cfg = load_config(overrides(conf_dir))
    workload = make_workload(cfg.workload, seed=0)
    times, bounds = [], []
    for step in range(1, 4):
        batch = workload.global_batch(step, 8, cost.model.max_seq_len)
        plan = OneGroupPerRank().plan(batch, cost)
        times.append(simulate_step(plan, batch, cost).step_time_s)
        bounds.append(lower_bound(batch, cost))
    assert summary.step_time_s == pytest.approx(float(np.median(times)))
    assert summary.lower_bound_s == pytest.approx(float(np.median(bounds)))
    assert summary.lower_bound_s <= summary.step_time_s
    assert summary.executor == "sim" and summary.cost_description is not None
    assert summary.cost_description.source == "analytical"
    assert summary.oom_steps == 0 and summary.status == "ok"


def test_simulate_json_has_the_issue_keys(conf_dir, capsys):
    assert main(["simulate", *overrides(conf_dir, steps=2), "seed=3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in (
        "step_time_s",
        "lower_bound_s",
        "imbalance",
        "peak_mem_gib",
        "oom_steps",
        "mfu",
        "planner_ms",
    ):
        assert key in out
    assert out["seed"] == 3 and out["executor"] == "sim" and out["hardware"] == "simulated h200x8"
    assert out["n_steps"] == 2 and out["n_warmup"] == 1


def test_simulate_steps_shortcut_and_text_output(conf_dir, capsys):
    args = [a for a in overrides(conf_dir) if not a.startswith("run.steps")]
    assert main(["simulate", *args, "steps=1"]) == 0
    text = capsys.readouterr().out
    assert (
        text.startswith("SIMULATED:")
        and "1 measured steps after 1 warm-up" in text
        and "median lower bound" in text
    )
    # the idle share sits beside step / bound, equal to the run's median imbalance
    summary = simulate([*args, "steps=1"])
    lines = text.splitlines()
    ratio = next(i for i, line in enumerate(lines) if line.strip().startswith("step / bound"))
    assert f"{summary.step_time_s / summary.lower_bound_s:.3f}" in lines[ratio]
    assert lines[ratio + 1].strip().startswith("idle share of GPU time")
    assert f"{100 * summary.imbalance:.1f}%" in lines[ratio + 1]


def test_the_seed_picks_the_batches_in_simulate(conf_dir):
    """One seed feeds the workload: another seed is other batches (here, other lower bounds)."""
    base = [
        "workload=videosys_zipf",
        "method=bucket_static",
        "cluster=h200x32",
        "model=stdit3_xl2",
        "steps=3",
        "warmup_steps=0",
    ]
    a, b, c = (simulate([*base, f"seed={s}"]) for s in (0, 0, 3))
    assert a.lower_bound_s == b.lower_bound_s != c.lower_bound_s


def test_simulate_and_sweep_give_bit_identical_step_times(conf_dir, tmp_path):
    """The same config through `simulate` and through a sweep: the same run, step for step."""
    ovs = [*overrides(conf_dir, steps=3), "seed=2", f"run.root={tmp_path}", "run.campaign=same"]
    alone = simulate(ovs)
    specs = plan_sweep(ovs, repeats=1)
    assert len(specs) == 1 and specs[0].seed == 2
    run_sweep(specs, progress=False, env={})
    recorded = read_steps(tmp_path / "same" / specs[0].run_id)
    assert [s.step_time_s for s in recorded if not s.warmup] and alone.step_time_s is not None
    via_sweep = [s.step_time_s for s in recorded if not s.warmup]
    assert float(np.median(via_sweep)) == alone.step_time_s  # bit-identical, not approximately


def test_plan_summary_and_a_loadable_plan(conf_dir, capsys, tmp_path):
    args = [a for a in overrides(conf_dir) if not a.startswith("run.")]
    assert main(["plan", *args, "step=2", f"--out={tmp_path / 'plan.json'}"]) == 0
    text = capsys.readouterr().out
    assert "rounds 1" in text and "simulated step" in text and len(text) < 2000
    assert main(["plan", *args, "step=2", "--json"]) == 0
    plan = StepPlan.from_json(capsys.readouterr().out)
    written = StepPlan.from_json((tmp_path / "plan.json").read_text())
    assert (
        written.rounds == plan.rounds and written.info["batch"] == plan.info["batch"]
    )  # planner_ms differs
    assert plan.step == 2 and plan.world_size == 8
    assert sorted(plan.sample_positions()) == list(range(len(plan.info["batch"]["tokens"])))
    assert plan.info["cost_model"]["cluster"] == "h200x8"


def test_bad_input_is_one_line_exit_2(conf_dir, capsys):
    assert main(["simulate", "cluster=h300x32"]) == 2
    err = capsys.readouterr().err
    assert "unknown cluster 'h300x32'" in err and "h200x32" in err and err.count("\n") == 1
    assert main(["plan", f"extra_conf={conf_dir}", "method=per_rank", "step=-1"]) == 2
    assert "step=-1" in capsys.readouterr().err
    assert main(["simulate", f"extra_conf={conf_dir}", "method=per_rank", "cost.source=guess"]) == 2
    assert "cost.source='guess'" in capsys.readouterr().err


def test_world_no_layout_fits_is_a_cluster_error(conf_dir, capsys):
    assert (
        main(["simulate", f"extra_conf={conf_dir}", "method=per_rank", "cluster.gpus_per_node=6"])
        == 2
    )
    err = capsys.readouterr().err
    assert "gpus_per_node=6 on 4 nodes; expected a power of two per node" in err


def test_noise_and_scales_from_the_config(conf_dir):
    base = [
        *overrides(conf_dir, steps=2),
        "run.noise.jitter_sigma=0.1",
        "cost.scales.act_bytes=1.5",
    ]
    a, b, c = (simulate([*base, f"seed={s}"]) for s in (4, 4, 5))
    assert a.context is not None and a.context.noise == NoiseRecord(
        jitter_sigma=0.1, straggler_prob=0.0, straggler_slowdown=1.5
    )
    assert a.step_time_s == b.step_time_s != c.step_time_s
    assert a.cost_description is not None
    assert a.cost_description.provenance["scales"]["act_bytes"] == 1.5


def test_old_spellings_name_the_one_that_works(conf_dir, capsys):
    for bad, right in (
        ("+noise.jitter_sigma=0.1", "run.noise.jitter_sigma"),
        ("++sim.noise.jitter_sigma=0.1", "run.noise.jitter_sigma"),
        ("lengths_file=x.txt", "workload.lengths_file"),
        ("+workload.seed=3", "seed"),
    ):
        assert main(["simulate", bad]) == 2
        assert f"spelled {right}" in capsys.readouterr().err


def test_a_planner_constructor_error_is_one_line(conf_dir, capsys):
    """Config errors raised while building a method reach the user as themselves, not wrapped."""
    assert main(["simulate", f"extra_conf={conf_dir}", "method=bad_width"]) == 2
    err = capsys.readouterr().err
    assert err == "dcp-bench simulate: error: width=0: expected >= 1\n"
