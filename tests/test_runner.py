"""The runner: grid, deterministic run ids, warm-up exclusion, failures, resume after a kill."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from dcp_bench.campaign.sweep import expand_grid, plan_sweep, run_sweep, split_alternatives
from dcp_bench.records import is_complete, read_steps, read_summary
from dcp_bench.run.loop import charge_planner

sys.path.insert(0, str(Path(__file__).resolve().parent))
from runner_doubles import toy_assemble, write_toy_conf  # noqa: E402

BASE = [
    "cluster=h200x8",
    "model=tiny_llama",
    "run.steps=3",
    "run.warmup_steps=1",
    "run.planner_clock=off",
]


def _overrides(
    conf: Path,
    methods: str = "toy_static,toy_greedy",
    root: Path | None = None,
    campaign: str = "t",
) -> list[str]:
    where = [f"run.root={root or conf.parent / 'runs'}", f"run.campaign={campaign}"]
    return [f"extra_conf={conf}", "workload=toy", f"method={methods}", *BASE, *where]


def test_planner_clock_policies() -> None:
    assert charge_planner(2.0, 0.5, "serial") == 2.5
    assert charge_planner(2.0, 0.5, "overlap") == 2.0
    assert charge_planner(2.0, 3.0, "overlap") == 3.0
    assert charge_planner(2.0, 3.0, "off") == 2.0


def test_split_and_grid() -> None:
    assert split_alternatives("a,b,[1,2],'x,y'") == ["a", "b", "[1,2]", "'x,y'"]
    grid = expand_grid(["method=a,b", "cluster=c", "x=1,2,3"])
    assert len(grid) == 6 and grid[0] == ["method=a", "cluster=c", "x=1"]


def test_run_ids_deterministic_and_paired(tmp_path: Path) -> None:
    conf = write_toy_conf(tmp_path / "conf")
    a = plan_sweep(_overrides(conf), repeats=3)
    b = plan_sweep(_overrides(conf), repeats=3)
    assert [s.run_id for s in a] == [s.run_id for s in b]
    assert len({s.run_id for s in a}) == 6
    by_method: dict[str, list[int]] = {}
    for s in a:
        by_method.setdefault(s.method_name, []).append(s.seed)
    assert by_method["toy_static"] == by_method["toy_greedy"] == [0, 1, 2]
    # cells: the hash ignores the seed; the comparison context ignores the method too
    assert len({s.config_hash for s in a}) == 2
    assert len({s.context_hash for s in a}) == 1
    # bookkeeping (where records go) does not change ids
    c = plan_sweep([*_overrides(conf), "run.campaign=elsewhere"], repeats=3)
    assert [s.run_id for s in a] == [s.run_id for s in c]


def test_sweep_records_warmup_and_same_batches(tmp_path: Path) -> None:
    conf = write_toy_conf(tmp_path / "conf")
    specs = plan_sweep(_overrides(conf), repeats=2)
    res = run_sweep(specs, build=toy_assemble, progress=False, env={})
    assert len(res.ran) == 4 and not res.failed
    tokens: dict[tuple[int, str], list[int]] = {}
    for s in specs:
        run = tmp_path / "runs" / "t" / s.run_id
        steps = read_steps(run)
        summary = read_summary(run)
        assert summary is not None and summary.status == "ok"
        assert [st.warmup for st in steps] == [True, False, False, False]
        measured = [st.step_time_s for st in steps if not st.warmup]
        assert summary.step_time_s == pytest.approx(float(np.median(measured)))
        assert summary.n_steps == 3 and summary.n_warmup == 1
        # time accounting adds up to the simulated step time
        for st in steps:
            parts = sum(
                st.extra[k] for k in ("compute_s", "recompute_s", "comm_s", "sync_s", "idle_s")
            )
            assert parts == pytest.approx(st.extra["sim_step_time_s"])
            assert st.step_time_s == pytest.approx(st.extra["sim_step_time_s"])  # planner clock off
        tokens[(s.seed, s.method_name)] = [st.tokens for st in steps]
    # same seed -> same global batches for both methods; different seeds differ
    assert tokens[(0, "toy_static")] == tokens[(0, "toy_greedy")]
    assert tokens[(0, "toy_static")] != tokens[(1, "toy_static")]


def test_failure_recorded_not_dropped(tmp_path: Path) -> None:
    conf = write_toy_conf(tmp_path / "conf")
    specs = plan_sweep(_overrides(conf, "toy_fail"), repeats=2)
    res = run_sweep(specs, build=toy_assemble, progress=False, env={})
    assert len(res.failed) == 2
    for s in res.ran:
        assert s.status == "error" and s.step_time_s is None and "no plan fits" in (s.error or "")


def test_resume_redoes_only_incomplete(tmp_path: Path) -> None:
    conf = write_toy_conf(tmp_path / "conf")
    specs = plan_sweep(_overrides(conf), repeats=2)
    root = tmp_path / "runs"
    run_sweep(specs, build=toy_assemble, progress=False, env={})
    victim = root / "t" / specs[1].run_id
    before = json.loads((victim / "run.json").read_text())
    (victim / "run.json").unlink()  # as if killed before the summary was written
    res = run_sweep(specs, build=toy_assemble, progress=False, env={})
    assert [s.run_id for s in res.ran] == [specs[1].run_id]
    assert len(res.skipped) == 3
    after = read_summary(victim)
    assert after is not None and after.step_time_s == pytest.approx(before["step_time_s"])


KILL_SCRIPT = """
import sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from runner_doubles import toy_assemble
from dcp_bench.campaign.sweep import plan_sweep, run_sweep
specs = plan_sweep({overrides!r}, repeats=3)
run_sweep(specs, build=toy_assemble, progress=False, env={{}})
"""


@pytest.mark.timeout(120)
def test_resume_after_killed_sweep(tmp_path: Path) -> None:
    """Kill a sweep process mid-run (SIGKILL: no cleanup), resume it, and check that complete
    runs are skipped, the interrupted one is redone, and the result equals an uninterrupted
    sweep."""
    conf = write_toy_conf(tmp_path / "conf", sleep_s=0.15)
    root = tmp_path / "runs"
    overrides = _overrides(conf, root=root, campaign="k")
    script = KILL_SCRIPT.format(
        tests=str(Path(__file__).resolve().parent), overrides=overrides, root=str(root)
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        start_new_session=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    camp = root / "k"
    deadline = time.time() + 90
    try:
        while time.time() < deadline:
            done = [p for p in camp.glob("*") if is_complete(p)] if camp.exists() else []
            partial = (
                [p for p in camp.glob("*") if p.is_dir() and not is_complete(p)]
                if camp.exists()
                else []
            )
            if len(done) >= 2 and partial and read_steps(partial[0]):
                break
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    complete_before = {p.name for p in camp.iterdir() if is_complete(p)}
    incomplete_before = {p.name for p in camp.iterdir() if p.is_dir() and not is_complete(p)}
    assert len(complete_before) >= 2 and incomplete_before, "the kill did not land mid-sweep"

    specs = plan_sweep(overrides, repeats=3)
    res = run_sweep(specs, build=toy_assemble, progress=False, env={})
    assert set(res.skipped) == complete_before
    assert incomplete_before <= {s.run_id for s in res.ran}
    assert all(is_complete(camp / s.run_id) for s in specs)

    fresh = tmp_path / "fresh"
    run_sweep(
        plan_sweep(_overrides(conf, root=fresh, campaign="k"), repeats=3),
        build=toy_assemble,
        progress=False,
        env={},
    )
    for s in specs:
        a, b = read_summary(camp / s.run_id), read_summary(fresh / "k" / s.run_id)
        assert a is not None and b is not None and a.step_time_s == pytest.approx(b.step_time_s)


def test_stuck_run_is_killed_and_recorded_as_timeout(tmp_path: Path) -> None:
    """A step that never returns in time: the run's process is killed after run.timeout_s plus
    the grace period, and the run is recorded (status timeout), not lost."""
    conf = write_toy_conf(tmp_path / "conf", sleep_s=30.0)
    specs = plan_sweep(
        [*_overrides(conf, "toy_static"), "run.timeout_s=0.5", "run.kill_grace_s=0.5"], repeats=1
    )
    t0 = time.time()
    res = run_sweep(specs, build=toy_assemble, progress=False, env={})
    assert time.time() - t0 < 20
    assert [s.status for s in res.ran] == ["timeout"]
    assert is_complete(tmp_path / "runs" / "t" / specs[0].run_id)
