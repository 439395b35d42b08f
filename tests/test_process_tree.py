"""Nothing a run starts outlives it, and no late writer changes a final record.

The fake launches mimic torchrun's shape (a launcher whose children run in sessions of their
own, as torchrun starts its ranks) with plain Python processes, so the cleanup is checked in a
second; the `dist` tests do the same with real torchrun runs. Processes are counted by a tag the
test puts in the environment (every descendant inherits it), independent of the launcher's own
mark."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from dcp_bench.campaign.sweep import plan_sweep
from dcp_bench.records import RunSummary, RunWriter, StepRecord, read_summary
from dcp_bench.run.loop import record_unfinished
from dcp_bench.run.torch_run import run_session

sys.path.insert(0, str(Path(__file__).resolve().parent))
from processes import HAS_PROC, TAG, tagged  # noqa: E402
from processes import kill_tagged as _kill_all  # noqa: E402
from runner_doubles import write_toy_conf  # noqa: E402

# A "launcher" that ignores SIGTERM and starts a "rank" in a session of its own that ignores
# SIGTERM too, then either waits (stuck) or exits at once (leaving the rank behind).
FAKE_LAUNCHER = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
rank = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
subprocess.Popen([sys.executable, "-c", rank], start_new_session=True)
time.sleep(0.5)
if sys.argv[1] == "stuck":
    time.sleep(600)
"""

needs_proc = pytest.mark.skipif(not HAS_PROC, reason="needs Linux /proc")


@needs_proc
@pytest.mark.parametrize("how", ["stuck", "exits"])
def test_session_leaves_no_process_behind(how: str) -> None:
    tag = uuid.uuid4().hex
    env = {**os.environ, TAG: tag}
    try:
        out = run_session(
            [sys.executable, "-c", FAKE_LAUNCHER, how], env, 3.0 if how == "stuck" else 30.0
        )
        code = out[0]
        assert (code is None) == (how == "stuck")  # None: killed at its limit
        assert tagged(tag) == []  # the detached rank that ignores SIGTERM is gone too
    finally:
        _kill_all(tag)


def _spec(tmp_path: Path):  # type: ignore[no-untyped-def]
    conf = write_toy_conf(tmp_path / "conf")
    return plan_sweep(
        [
            f"extra_conf={conf}",
            "workload=toy",
            "method=toy_static",
            "cluster=h200x8",
            "model=tiny_llama",
            "run.steps=2",
            "run.warmup_steps=0",
            f"run.root={tmp_path / 'runs'}",
            "run.campaign=late",
        ],
        repeats=1,
    )[0]


def test_late_writer_cannot_rewrite_a_final_record(tmp_path: Path) -> None:
    """A rank still writing after its launcher recorded the run's end (here: timeout) must not
    turn the record into "ok"."""
    spec = _spec(tmp_path)
    late = RunWriter(spec.root, spec.campaign, spec.run_id, dict(spec.config), enabled=True)
    late.add_step(StepRecord(step=0, step_time_s=1.0))
    final = record_unfinished(spec, "timeout", "killed at its limit", time.time())
    run_dir = Path(spec.root) / spec.campaign / spec.run_id
    before = (run_dir / "run.json").read_bytes()
    with contextlib.suppress(RuntimeError):  # the late writer finds it lost the folder
        late.add_step(StepRecord(step=1, step_time_s=1.0))
    with contextlib.suppress(RuntimeError):
        late.finish(dataclasses.replace(final, status="ok", error=None, n_steps=2))
    assert (run_dir / "run.json").read_bytes() == before
    summary = read_summary(run_dir)
    assert summary is not None and summary.status == "timeout"


def test_ownership_is_checked_before_every_write(tmp_path: Path) -> None:
    from dcp_bench.records import RunOwnershipLost, claim_run, take_over, write_summary

    run_dir = tmp_path / "c" / "r"
    token = claim_run(run_dir)
    writer = RunWriter(tmp_path, "c", "r", {"x": 1}, enabled=True, owner=token)
    writer.add_step(StepRecord(step=0, step_time_s=1.0))
    take_over(run_dir)
    with pytest.raises(RunOwnershipLost):
        writer.add_step(StepRecord(step=1, step_time_s=1.0))
    with pytest.raises(RunOwnershipLost):
        writer.finish(
            RunSummary(
                run_id="r",
                campaign="c",
                status="ok",
                executor="sim",
                method="m",
                workload="w",
                cluster="c",
                model="m",
                seed=0,
                config_hash="h",
            )
        )
    assert not (run_dir / "run.json").exists()
    # A writer handed a claim that is no longer current refuses to start (a rank that starts late).
    with pytest.raises(RunOwnershipLost):
        RunWriter(tmp_path, "c", "r", {"x": 1}, enabled=True, owner=token)
    # The new owner writes.
    mine = take_over(run_dir)
    write_summary(
        run_dir,
        RunSummary(
            run_id="r",
            campaign="c",
            status="error",
            executor="sim",
            method="m",
            workload="w",
            cluster="c",
            model="m",
            seed=0,
            config_hash="h",
        ),
        mine,
    )
    summary = read_summary(run_dir)
    assert summary is not None and summary.status == "error"


# ------------------------------------------------------------------------------------------------
# Real torchrun runs

SLOW_STEPS = [
    "workload=sharegpt",
    "method=dcp",
    "model=tiny_llama",
    "workload.length_scale=2",
    "workload.tokens_per_gpu=32768",
    "nproc=2",
    "steps=50",
    "warmup_steps=1",
]


@needs_proc
@pytest.mark.dist
def test_timed_out_torch_run_is_killed_whole_and_stays_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's reproduction, small: steps far longer than the time limit. When the launcher
    returns, no process of the run is alive, the record says timeout, and it still says so (byte
    for byte) a few seconds later."""
    from dcp_bench.run.spec import parse_run_spec
    from dcp_bench.run.torch_run import launch_torch_run
    from dcp_bench.run.train_config import resolve_train_config

    tag = uuid.uuid4().hex
    monkeypatch.setenv(TAG, tag)
    spec = parse_run_spec(
        resolve_train_config(
            [
                *SLOW_STEPS,
                "timeout_s=2",
                "run.kill_grace_s=1",
                f"root={tmp_path}",
                "campaign=orphans",
            ]
        )
    )
    try:
        summary = launch_torch_run(spec)
        assert tagged(tag) == []
        assert summary.status == "timeout", summary.error
        run_json = tmp_path / "orphans" / spec.run_id / "run.json"
        before = run_json.read_bytes()
        time.sleep(3)
        assert run_json.read_bytes() == before
    finally:
        _kill_all(tag)


@needs_proc
@pytest.mark.dist
def test_sigterm_to_train_stops_every_rank(tmp_path: Path) -> None:
    """`dcp-bench train` killed with SIGTERM (a CI cancel, `timeout`) takes its ranks with it."""
    tag = uuid.uuid4().hex
    env = {**os.environ, TAG: tag, "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "dcp_bench.cli",
        "train",
        *SLOW_STEPS,
        f"root={tmp_path}",
        "campaign=term",
    ]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while len(tagged(tag)) < 4 and time.time() < deadline:  # cli + torchrun + 2 ranks
            time.sleep(0.2)
        assert len(tagged(tag)) >= 4, "the ranks never started"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 143, err
        assert tagged(tag) == []
        # the record says the run was stopped, and by which signal
        (run_dir,) = [p for p in (tmp_path / "term").iterdir() if p.is_dir()]
        summary = read_summary(run_dir)
        assert summary is not None and summary.status == "error"
        assert "SIGTERM" in (summary.error or "") and summary.notes.get("signal") == signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
        _kill_all(tag)


@needs_proc
@pytest.mark.slow  # a sweep of real runs, killed and resumed
def test_sigterm_to_a_sweep_stops_its_runs_and_a_resume_redoes_them(tmp_path: Path) -> None:
    """`dcp-bench sweep` of simulated runs (forked processes) killed with SIGTERM: it exits 143
    with no process left, its running runs are left incomplete (no run.json), and a resumed sweep
    redoes them."""
    from dcp_bench.records import check_run

    conf = write_toy_conf(tmp_path / "conf", sleep_s=0.5)
    ovs = [
        f"extra_conf={conf}",
        "workload=toy",
        "method=toy_static,toy_greedy",
        "cluster=h200x8",
        "model=tiny_llama",
        "run.steps=20",
        "run.warmup_steps=0",
        "run.repeats=2",
        f"run.root={tmp_path / 'runs'}",
        "run.campaign=term",
    ]
    tag = uuid.uuid4().hex
    tests = str(Path(__file__).resolve().parent)
    env = {
        **os.environ,
        TAG: tag,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join(p for p in (tests, os.environ.get("PYTHONPATH", "")) if p),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "dcp_bench.cli", "sweep", *ovs, "--jobs", "2"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        camp = tmp_path / "runs" / "term"
        deadline = time.time() + 120
        while time.time() < deadline and not (
            camp.exists()
            and any(
                (d / "steps.jsonl").exists() and (d / "steps.jsonl").stat().st_size
                for d in camp.iterdir()
            )
        ):
            time.sleep(0.1)
        assert len(tagged(tag)) >= 2, "no run started"  # the sweep and at least one forked run
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 143, err
        assert tagged(tag) == []
    finally:
        if proc.poll() is None:
            proc.kill()
        _kill_all(tag)
    specs = plan_sweep(ovs)
    states = [check_run(camp / s.run_id).state for s in specs]
    assert "incomplete" in states and "damaged" not in states  # cut mid-run, nothing half-written
    proc = subprocess.run(
        [sys.executable, "-m", "dcp_bench.cli", "sweep", *ovs, "--jobs", "2", "--no-progress"],
        env={**env, TAG: uuid.uuid4().hex},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert all(check_run(camp / s.run_id).state == "complete" for s in specs)
