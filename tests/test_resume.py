"""Resume semantics: a damaged record is redone with a warning naming it, a failed run is kept
(listed, exit status 3) until ``--retry-failed``, a deadline bounds running runs and records the
run it cuts as ``timeout``, and progress shows one line per run when not on a terminal."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from dcp_bench.campaign.sweep import plan_sweep, run_sweep
from dcp_bench.cli import main
from dcp_bench.records import read_steps, read_summary

sys.path.insert(0, str(Path(__file__).resolve().parent))
from runner_doubles import toy_assemble, write_toy_conf  # noqa: E402

BASE = [
    "workload=toy",
    "cluster=h200x8",
    "model=tiny_llama",
    "run.steps=3",
    "run.warmup_steps=1",
    "run.planner_clock=off",
]


def _ovs(tmp_path: Path, methods: str = "toy_static,toy_greedy", **conf_kw) -> list[str]:  # type: ignore[no-untyped-def]
    conf = write_toy_conf(tmp_path / "conf", **conf_kw)
    return [
        f"extra_conf={conf}",
        *BASE,
        f"method={methods}",
        f"run.root={tmp_path / 'runs'}",
        "run.campaign=r",
    ]


def _sweep(ovs: list[str], repeats: int = 2):  # type: ignore[no-untyped-def]
    return run_sweep(
        plan_sweep(ovs, repeats=repeats),
        build=toy_assemble,
        progress=False,
        env={},
        warn=lambda m: None,
    )


def _truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def _edit_summary(path: Path, **changes) -> None:  # type: ignore[no-untyped-def]
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


DAMAGE = {
    "truncated run.json": lambda d: _truncate(d / "run.json"),
    "run.json not an object": lambda d: (d / "run.json").write_text("[1, 2]"),
    "run.json with an unknown status": lambda d: _edit_summary(d / "run.json", status="great"),
    "truncated steps.jsonl": lambda d: _truncate(d / "steps.jsonl", 0.7),
    "steps.jsonl with a garbage line": lambda d: (d / "steps.jsonl").write_text(
        (d / "steps.jsonl").read_text() + "garbage\n"
    ),
    "run.json of another config": lambda d: _edit_summary(
        d / "run.json", config_hash="0123456789ab"
    ),
    "run.json of another seed": lambda d: _edit_summary(d / "run.json", seed=99),
    "run.json of another run": lambda d: _edit_summary(d / "run.json", run_id="someone_else"),
    "run.json counting other steps": lambda d: _edit_summary(d / "run.json", n_steps=7),
    "config.yaml missing": lambda d: (d / "config.yaml").unlink(),
    "config.yaml unreadable": lambda d: (d / "config.yaml").write_bytes(b"\xff\xfe: [\n"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_record_is_redone_with_a_warning(tmp_path: Path, damage: str) -> None:
    ovs = _ovs(tmp_path)
    specs = plan_sweep(ovs, repeats=2)
    _sweep(ovs)
    victim = Path(specs[1].root) / "r" / specs[1].run_id
    good = read_summary(victim)
    DAMAGE[damage](victim)
    warnings: list[str] = []
    res = run_sweep(specs, build=toy_assemble, progress=False, env={}, warn=warnings.append)
    assert [s.run_id for s in res.ran] == [specs[1].run_id]
    assert len(res.skipped) == 3 and [d[0] for d in res.damaged] == [specs[1].run_id]
    assert len(warnings) == 1 and specs[1].run_id in warnings[0] and "damaged" in warnings[0]
    again = read_summary(victim)
    assert again is not None and good is not None
    assert again.status == "ok" and again.step_time_s == pytest.approx(good.step_time_s)
    assert [s.step for s in read_steps(victim)] == [0, 1, 2, 3]


def test_sweep_command_names_the_damaged_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ovs = _ovs(tmp_path, "toy_static")
    assert main(["sweep", *ovs, "run.repeats=2", "--no-progress"]) == 0
    spec = plan_sweep(ovs, repeats=2)[0]
    _truncate(Path(spec.root) / "r" / spec.run_id / "run.json")
    capsys.readouterr()
    assert main(["sweep", *ovs, "run.repeats=2", "--no-progress"]) == 0
    out, err = capsys.readouterr()
    assert f"run {spec.run_id}: damaged record, redoing it" in err and "run.json" in err
    assert "1 run(s) done, 1 already complete, 1 damaged record(s) redone, 0 failed" in out


def test_failed_runs_are_kept_listed_and_retried(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flag = tmp_path / "broken"
    flag.write_text("the input is broken")
    ovs = _ovs(tmp_path, "toy_static,toy_flaky", fail_flag=flag)
    args = ["sweep", *ovs, "run.repeats=1", "--no-progress"]
    assert main(args) == 3  # a run failed: non-zero
    out = capsys.readouterr().out
    flaky = [s for s in plan_sweep(ovs, repeats=1) if s.method_name == "toy_flaky"][0]
    assert "1 failed" in out and f"error: {flaky.run_id}: InfeasibleError" in out

    flag.unlink()  # the user fixes the input; the run's config (and id) is unchanged
    assert main(args) == 3  # the failure is kept, and still listed
    out = capsys.readouterr().out
    assert (
        "0 run(s) done, 2 already complete" in out
        and flaky.run_id in out
        and "--retry-failed" in out
    )
    summary = read_summary(Path(flaky.root) / "r" / flaky.run_id)
    assert summary is not None and summary.status == "error"

    assert main([*args, "--retry-failed"]) == 0
    out = capsys.readouterr().out
    assert "1 run(s) done, 1 already complete" in out and "0 failed" in out
    summary = read_summary(Path(flaky.root) / "r" / flaky.run_id)
    assert summary is not None and summary.status == "ok"


def test_dry_run_tells_done_failed_damaged_and_todo(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ovs = _ovs(tmp_path, "toy_static,toy_fail")
    specs = plan_sweep(ovs, repeats=2)
    run_sweep(specs[:3], build=toy_assemble, progress=False, env={})
    _truncate(Path(specs[0].root) / "r" / specs[0].run_id / "run.json")
    capsys.readouterr()
    assert main(["sweep", *ovs, "run.repeats=2", "--dry-run"]) == 0
    states = {line.split()[1]: line.split()[0] for line in capsys.readouterr().out.splitlines()}
    by_id = {s.run_id: s for s in specs}
    assert {by_id[i].method_name + str(by_id[i].seed): st for i, st in states.items()} == {
        "toy_static0": "damaged",
        "toy_static1": "done",
        "toy_fail0": "failed:error",
        "toy_fail1": "todo",
    }


def test_deadline_cuts_a_running_run_and_records_timeout(tmp_path: Path) -> None:
    """A budget bounds running runs: a run that would plan for 30 s per step is killed when the
    deadline passes, recorded as ``timeout`` naming the budget (not dropped), and redone by a
    later sweep that has the time."""
    ovs = _ovs(tmp_path, "toy_static", sleep_s=30.0)
    specs = plan_sweep(ovs, repeats=1)
    res = run_sweep(specs, build=toy_assemble, progress=False, env={}, deadline=time.time() + 1.0)
    assert not res.unrun
    assert [s.status for s in res.ran] == ["timeout"]
    summary = read_summary(Path(specs[0].root) / "r" / specs[0].run_id)
    assert summary is not None and summary.status == "timeout"
    assert "the time budget" in (summary.error or "") and summary.cut_by_budget
    # A later sweep redoes it: it was cut by the budget, it did not fail on its own.
    res = run_sweep(specs, build=toy_assemble, progress=False, env={}, deadline=time.time() + 1.0)
    assert [s.run_id for s in res.ran] == [specs[0].run_id] and not res.skipped


def test_own_timeout_is_kept_as_a_failure(tmp_path: Path) -> None:
    ovs = [*_ovs(tmp_path, "toy_static", sleep_s=30.0), "run.timeout_s=0.5", "run.kill_grace_s=0.5"]
    specs = plan_sweep(ovs, repeats=1)
    first = run_sweep(specs, build=toy_assemble, progress=False, env={})
    assert [s.status for s in first.ran] == ["timeout"] and "run.timeout_s=0.5" in (
        first.ran[0].error or ""
    )
    again = run_sweep(specs, build=toy_assemble, progress=False, env={})
    assert not again.ran and [s.status for s in again.kept_failed] == ["timeout"]


def test_bounded_limit_names_the_budget(tmp_path: Path) -> None:
    from dcp_bench.campaign.sweep import BUDGET_KILL_GRACE_S, _bounded

    spec = plan_sweep([*_ovs(tmp_path, "toy_static"), "run.timeout_s=100"], repeats=1)[0]
    assert _bounded(spec, None) is spec
    assert _bounded(spec, time.time() + 1000) is spec  # its own limit is the tighter one
    cut = _bounded(spec, time.time() + 20)
    assert cut.timeout_s is not None and 15 < cut.timeout_s <= 20
    assert cut.limit_source == "the time budget" and "the time budget" in cut.limit_text()
    limit = cut.hard_limit_s()
    assert limit is not None and limit <= cut.timeout_s + BUDGET_KILL_GRACE_S
    assert cut.run_id == spec.run_id and cut.config_hash == spec.config_hash


def test_progress_lines_when_not_on_a_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ovs = _ovs(tmp_path)
    specs = plan_sweep(ovs, repeats=2)
    run_sweep(
        specs, build=toy_assemble, progress=True, env={}
    )  # stderr is not a terminal under pytest
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 4
    assert all(line.startswith(f"[{i}/4] ok") for i, line in enumerate(lines, 1))
    assert {line.split()[-1] for line in lines} == {s.run_id for s in specs}
    run_sweep(specs, build=toy_assemble, progress=False, env={}, resume=False)
    assert capsys.readouterr().err == ""
