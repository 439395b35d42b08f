"""Run records: schema round-trip, atomic writes, a run killed mid-write, the index."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing as mp
import os
import signal
import time
from pathlib import Path

import pandas as pd
import pytest

from dcp_bench import records
from dcp_bench.records import (
    RunSummary,
    RunWriter,
    StepRecord,
    atomic_write_text,
    list_runs,
    read_steps,
    read_summary,
)
from dcp_bench.report.tables import build_index


def _summary(run_id: str, status: str = "ok", **kw) -> RunSummary:
    return RunSummary(
        run_id=run_id,
        campaign="c",
        status=status,
        executor="sim",
        method="dcp",
        workload="prolong",
        cluster="h200x8",
        model="llama3_8b",
        seed=0,
        config_hash="abc",
        **kw,
    )


def test_step_record_round_trip() -> None:
    rec = StepRecord(
        step=3,
        step_time_s=1.5,
        warmup=False,
        planner_ms=2.0,
        tokens=100,
        peak_mem_per_rank_gib=[1.0, 2.0],
        busy_s=[1.0, 1.4],
        extra={"k": [1, 2]},
    )
    again = StepRecord.from_dict(json.loads(json.dumps(dataclasses.asdict(rec))))
    assert again == rec


def test_summary_round_trip_and_status_check() -> None:
    s = _summary("r1", oom_steps=2, notes={"note": "x"})
    assert RunSummary.from_dict(json.loads(json.dumps(dataclasses.asdict(s)))) == s
    with pytest.raises(ValueError, match="status"):
        _summary("r2", status="weird")


def test_newer_schema_is_refused() -> None:
    data = dataclasses.asdict(StepRecord(step=0, step_time_s=1.0))
    data["schema_version"] = records.SCHEMA_VERSION + 1
    with pytest.raises(ValueError, match="newer"):
        StepRecord.from_dict(data)


def test_writer_layout_and_reads(tmp_path: Path) -> None:
    w = RunWriter(tmp_path, "camp", "run-a", {"method": "dcp"}, env={"python": "3"}, enabled=True)
    for i in range(3):
        w.add_step(StepRecord(step=i, step_time_s=float(i + 1)))
    run_dir = tmp_path / "camp" / "run-a"
    assert read_summary(run_dir) is None  # incomplete until finish
    assert [s.step for s in read_steps(run_dir)] == [0, 1, 2]
    w.finish(_summary("run-a", n_steps=3))
    assert {p.name for p in run_dir.iterdir()} == {
        "config.yaml",
        "env.json",
        "steps.jsonl",
        "run.json",
        ".owner",
    }
    assert read_summary(run_dir).run_id == "run-a"
    assert list_runs(tmp_path, "camp") == {"complete": ["run-a"], "incomplete": [], "damaged": []}


def test_disabled_writer_writes_nothing(tmp_path: Path) -> None:
    w = RunWriter(tmp_path, "camp", "run-b", {}, enabled=False)
    w.add_step(StepRecord(step=0, step_time_s=1.0))
    w.finish(_summary("run-b"))
    assert not (tmp_path / "camp").exists()


def test_only_rank_zero_writes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RANK", "1")
    assert RunWriter(tmp_path, "c", "r", {}).enabled is False
    monkeypatch.setenv("RANK", "0")
    assert RunWriter(tmp_path, "c", "r", {}).enabled is True


def _write_forever(run_root: str) -> None:
    w = RunWriter(run_root, "camp", "killed", {"x": 1}, enabled=True)
    i = 0
    while True:  # large steps make a kill inside a write likely
        w.add_step(StepRecord(step=i, step_time_s=1.0, extra={"pad": "x" * 20000}))
        i += 1


def test_run_killed_mid_write_leaves_valid_files(tmp_path: Path) -> None:
    ctx = mp.get_context("fork")
    for delay in (0.3, 0.55, 0.8):
        root = tmp_path / f"d{delay}"
        proc = ctx.Process(target=_write_forever, args=(str(root),))
        proc.start()
        time.sleep(delay)
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        run_dir = root / "camp" / "killed"
        steps = read_steps(run_dir)  # raises on any half-written line
        assert [s.step for s in steps] == list(range(len(steps)))
        assert read_summary(run_dir) is None
        assert list_runs(root, "camp")["incomplete"] == ["killed"]


def test_atomic_write_keeps_old_content_on_failure(tmp_path: Path) -> None:
    target = tmp_path / "f.json"
    atomic_write_text(target, "old")

    with pytest.raises(TypeError):
        atomic_write_text(target, 123)  # type: ignore[arg-type]
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.json"]  # no temp file left behind


def test_index_gathers_complete_runs(tmp_path: Path) -> None:
    for i, status in enumerate(["ok", "oom"]):
        w = RunWriter(tmp_path, "camp", f"r{i}", {}, enabled=True)
        w.add_step(StepRecord(step=0, step_time_s=1.0 + i))
        w.add_step(StepRecord(step=1, step_time_s=2.0 + i))
        w.finish(_summary(f"r{i}", status=status, step_time_s=1.5 + i))
    RunWriter(tmp_path, "camp", "unfinished", {}, enabled=True)
    out = tmp_path / "index.parquet"
    table = build_index(tmp_path, out=out)
    assert sorted(table["run_id"]) == ["r0", "r1"]
    assert pd.read_parquet(out)["status"].tolist() == table["status"].tolist()
    per_step = build_index(tmp_path, steps=True)
    assert len(per_step) == 4
    assert sorted(per_step["step_time_s"]) == [1.0, 2.0, 2.0, 3.0]
    assert set(per_step["run_id"]) == {"r0", "r1"}
