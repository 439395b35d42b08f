"""One run id, one executing process: two sweeps on one campaign at the same time complete every
run once and record no failure for a run the other one finished; a grid value given twice is one
run; a re-run killed at any instant leaves the old complete record or the new one."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from dcp_bench.campaign.sweep import plan_sweep, run_sweep
from dcp_bench.records import PREVIOUS_DIR, check_run, read_summary, try_lock_run, unlock_run
from dcp_bench.run.assemble import RunParts
from dcp_bench.run.simulated import run_simulated
from dcp_bench.run.spec import RunSpec

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


def _ovs(tmp_path: Path, methods: str, sleep_s: float = 0.0) -> list[str]:
    conf = write_toy_conf(tmp_path / "conf", sleep_s=sleep_s)
    return [
        f"extra_conf={conf}",
        *BASE,
        f"method={methods}",
        f"run.root={tmp_path / 'runs'}",
        "run.campaign=shared",
    ]


def _sweep_in_child(ovs: list[str], out: str, jobs: int) -> None:
    res = run_sweep(
        plan_sweep(ovs, repeats=3),
        jobs=jobs,
        build=toy_assemble,
        progress=False,
        env={},
        warn=lambda m: None,
    )
    Path(out).write_text(
        json.dumps(
            {
                "ran": [s.run_id for s in res.ran],
                "failed": [f"{s.run_id}: {s.status}: {s.error}" for s in res.all_failed],
                "skipped": res.skipped,
            }
        )
    )


@pytest.mark.parametrize("jobs", [2])
def test_two_concurrent_sweeps_run_every_run_once(tmp_path: Path, jobs: int) -> None:
    # Each step's planning sleeps, so the two sweeps overlap on every run.
    a = _ovs(tmp_path, "toy_static,toy_greedy", sleep_s=0.1)
    b = [*a[:-3], "method=toy_greedy,toy_static", *a[-2:]]
    ctx = mp.get_context("fork")
    procs = [
        ctx.Process(target=_sweep_in_child, args=(ovs, str(tmp_path / f"{name}.json"), jobs))
        for name, ovs in (("a", a), ("b", b))
    ]
    try:
        for p in procs:
            p.start()
        for p in procs:
            p.join(120)
            assert p.exitcode == 0
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    res_a, res_b = (json.loads((tmp_path / f"{n}.json").read_text()) for n in "ab")
    every = {s.run_id for s in plan_sweep(a, repeats=3)}
    assert len(every) == 6
    assert res_a["failed"] == [] and res_b["failed"] == []
    # every run executed by exactly one of the two sweeps; the other one counted it as complete
    assert sorted(res_a["ran"] + res_b["ran"]) == sorted(every)
    assert set(res_a["ran"]) | set(res_a["skipped"]) == every
    assert set(res_b["ran"]) | set(res_b["skipped"]) == every
    for run_id in every:
        state = check_run(tmp_path / "runs" / "shared" / run_id)
        assert (
            state.state == "complete" and state.summary is not None and state.summary.status == "ok"
        )


def test_a_grid_value_given_twice_is_one_run(tmp_path: Path) -> None:
    once = plan_sweep(_ovs(tmp_path, "toy_static"), repeats=2)
    twice = plan_sweep(_ovs(tmp_path, "toy_static,toy_static"), repeats=2)
    assert [s.run_id for s in twice] == [s.run_id for s in once]
    res = run_sweep(
        [*once, *once], jobs=2, build=toy_assemble, progress=False, env={}, warn=lambda m: None
    )
    assert sorted(s.run_id for s in res.ran) == sorted(s.run_id for s in once)


def _hold_then_run(spec: RunSpec, flags: str) -> None:
    """Another process: takes the run, says so, waits for the word, runs it and lets it go."""
    fd = try_lock_run(Path(spec.root) / spec.campaign / spec.run_id)
    assert fd is not None
    Path(flags, "held").write_text("")
    while not Path(flags, "go").exists():
        time.sleep(0.02)
    run_simulated(spec, build=toy_assemble, env={})
    unlock_run(fd)


def test_a_run_held_by_another_process_waits_and_is_not_run_again(tmp_path: Path) -> None:
    ovs = _ovs(tmp_path, "toy_static")
    spec = plan_sweep(ovs, repeats=1)[0]
    ctx = mp.get_context("fork")
    holder = ctx.Process(target=_hold_then_run, args=(spec, str(tmp_path)))
    holder.start()
    out = tmp_path / "waiter.json"
    waiter = ctx.Process(target=_sweep_in_child, args=(ovs, str(out), 1))
    try:
        deadline = time.time() + 30
        while not (tmp_path / "held").exists() and time.time() < deadline:
            time.sleep(0.02)
        waiter.start()
        time.sleep(1.5)
        assert (
            not out.exists()
        )  # waiting for the run the holder has (its other seeds done meanwhile)
        (tmp_path / "go").write_text("")
        holder.join(60)
        waiter.join(60)
        assert holder.exitcode == 0 and waiter.exitcode == 0
    finally:
        for proc in (holder, waiter):
            if proc.is_alive():
                proc.kill()
                proc.join()
    res = json.loads(out.read_text())
    assert spec.run_id in res["skipped"] and spec.run_id not in res["ran"] and res["failed"] == []
    assert len(res["ran"]) == 2  # seeds 1 and 2, which nobody else held
    state = check_run(Path(spec.root) / spec.campaign / spec.run_id)
    assert state.state == "complete" and state.summary is not None and state.summary.status == "ok"


def _slow_build(delay: float) -> Any:
    def build(spec: RunSpec) -> RunParts:
        parts = toy_assemble(spec)
        parts.planner.sleep_s = delay  # type: ignore[attr-defined]
        return parts

    return build


def _rerun(spec: RunSpec, delay: float) -> None:
    run_sweep(
        [spec],
        resume=False,
        isolate=False,
        build=_slow_build(delay),
        progress=False,
        env={},
        warn=lambda m: None,
    )


@pytest.mark.parametrize("kill_after", [0.05, 0.4, 3.0])
def test_a_killed_rerun_leaves_the_old_or_the_new_complete_record(
    tmp_path: Path, kill_after: float
) -> None:
    spec = plan_sweep(_ovs(tmp_path, "toy_static"), repeats=1)[0]
    run_dir = Path(spec.root) / spec.campaign / spec.run_id
    run_sweep([spec], build=toy_assemble, progress=False, env={}, warn=lambda m: None)
    old = read_summary(run_dir)
    assert old is not None and old.status == "ok"
    ctx = mp.get_context("fork")
    proc = ctx.Process(target=_rerun, args=(spec, 0.2))  # 4 steps of 0.2 s: about 1 s
    proc.start()
    time.sleep(kill_after)
    if proc.is_alive():
        os.kill(proc.pid, signal.SIGKILL)
    proc.join()
    state = check_run(run_dir, config_hash=spec.config_hash, seed=spec.seed)
    assert state.state == "complete" and state.summary is not None and state.summary.status == "ok"
    assert state.summary.started_at == old.started_at or state.summary.started_at > old.finished_at  # type: ignore[operator]
    assert not (run_dir / PREVIOUS_DIR).exists()
    if (
        kill_after < 0.6
    ):  # the re-run takes 0.8 s of planning alone: killed mid-run, the old record stands
        assert proc.exitcode == -signal.SIGKILL and state.summary.started_at == old.started_at
    # and a resumed sweep keeps it instead of redoing it
    res = run_sweep([spec], build=toy_assemble, progress=False, env={}, warn=lambda m: None)
    assert res.ran == [] and res.skipped == [spec.run_id]


def _hold_lock(run_dir: str, shared: bool, ready: Any, release: Any) -> None:
    fd = try_lock_run(run_dir, shared=shared)
    ready.put(fd is not None)
    release.wait(30)
    unlock_run(fd)


def test_the_nodes_of_a_multi_node_run_share_its_lock_and_exclude_a_single_node_run(
    tmp_path: Path,
) -> None:
    """Each node's launcher of a multi-node run holds the run's lock shared (over a shared
    filesystem the nodes' launchers meet at one lock file): a second node gets it too, while an
    exclusive taker (a single-node run of the id, a restore) is refused until all have let go."""
    run_dir = str(tmp_path / "c" / "run")
    ctx = mp.get_context("spawn")
    ready, release = ctx.Queue(), ctx.Event()
    node0 = ctx.Process(target=_hold_lock, args=(run_dir, True, ready, release))
    node0.start()
    try:
        assert ready.get(timeout=60) is True
        node1 = try_lock_run(run_dir, shared=True)
        assert node1 is not None  # the other node of the same run is not kept out
        assert try_lock_run(run_dir) is None  # exclusive: refused while a node holds it
        unlock_run(node1)
        assert try_lock_run(run_dir) is None  # node 0 still holds it
    finally:
        release.set()
        node0.join(60)
    fd = try_lock_run(run_dir)
    assert fd is not None  # every node let go: free
    assert try_lock_run(run_dir, shared=True) is None  # and an exclusive holder keeps nodes out
    unlock_run(fd)
