"""A simulated result depends only on its inputs (DESIGN.md, principle 9): the same simulated run
on a quiet machine and with a core kept busy by another process gives the same step records.
Planning time is measured both ways on every step (CPU and wall clock) but, by default, the
simulator charges none of it (``run.planner_time=auto``); the measured fields are the only ones
that may differ."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from dcp_bench.config import load_config, to_container
from dcp_bench.records import read_steps
from dcp_bench.run.loop import charged_planning
from dcp_bench.run.simulated import run_simulated
from dcp_bench.run.spec import parse_run_spec

# What a step record measures about the host, not the simulation: planning's CPU and wall time.
MEASURED = ("planner_ms",)
MEASURED_EXTRA = ("planner_wall_ms", "planner_cpu_ms")

# A busy loop that ends by itself (the test kills it sooner): never left spinning.
BUSY = "import time\nend = time.time() + 120\nwhile time.time() < end:\n    pass\n"


def _records(root: Path, campaign: str, extra: list[str]) -> list[dict[str, Any]]:
    overrides = [
        "workload=sharegpt",
        "model=llama3_8b",
        "cluster=h200x8",
        "method=dcp",
        "run.steps=3",
        "run.warmup_steps=1",
        # serial: any planning time charged would land in the step time whole
        "run.planner_clock=serial",
        f"run.root={root}",
        f"run.campaign={campaign}",
        *extra,
    ]
    spec = parse_run_spec(to_container(load_config(overrides)))
    summary = run_simulated(spec)
    assert summary.status == "ok", summary.error
    return [dataclasses.asdict(s) for s in read_steps(root / campaign / spec.run_id)]


def _without_measured(rec: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in rec.items() if k not in MEASURED}
    out["extra"] = {k: v for k, v in rec["extra"].items() if k not in MEASURED_EXTRA}
    return out


def test_charged_planning_by_policy() -> None:
    assert charged_planning(wall_s=3.0, cpu_s=1.0, what="cpu") == 1.0
    assert charged_planning(wall_s=3.0, cpu_s=1.0, what="wall") == 3.0
    assert charged_planning(wall_s=3.0, cpu_s=1.0, what="none") == 0.0


def test_simulated_records_equal_on_a_quiet_and_a_busy_machine(tmp_path: Path) -> None:
    quiet = _records(tmp_path, "quiet", [])
    busy_proc = subprocess.Popen([sys.executable, "-c", BUSY])
    try:
        time.sleep(0.2)  # let it start spinning
        busy = _records(tmp_path, "busy", [])
    finally:
        busy_proc.kill()
        busy_proc.wait(timeout=30)
    assert len(quiet) == len(busy) == 4
    # both runs measured their planning (the fields the comparison leaves out are real)
    for rec in quiet + busy:
        assert rec["planner_ms"] > 0 and rec["extra"]["planner_wall_ms"] > 0
        assert rec["extra"]["planner_cpu_ms"] == rec["planner_ms"]
        assert rec["extra"]["planner_charged_ms"] == 0.0
    assert [_without_measured(r) for r in quiet] == [_without_measured(r) for r in busy]


@pytest.mark.parametrize("what", ["cpu", "wall"])
def test_a_charged_planning_time_is_the_one_recorded(tmp_path: Path, what: str) -> None:
    """With ``run.planner_time=cpu`` (or ``wall``) the serial clock adds exactly that measured
    time to the executed step: the records say what was charged."""
    recs = _records(tmp_path, what, [f"run.planner_time={what}"])
    for rec in recs:
        charged = rec["extra"]["planner_cpu_ms" if what == "cpu" else "planner_wall_ms"] / 1e3
        assert rec["extra"]["planner_charged_ms"] == pytest.approx(charged * 1e3)
        assert rec["step_time_s"] == pytest.approx(rec["extra"]["executed_s"] + charged)
