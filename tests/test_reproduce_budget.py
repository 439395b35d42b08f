"""`dcp-bench reproduce` and time: no wall-clock cut by default (every packaged preset, and the
budget logic with no budget), a budget that bounds the command's wall time with a margin even with
a core kept busy (the running runs ended, the cut runs listed, the report written within the
budget), a short report when the full one cannot finish in time, and progress lines with an
estimate of what is left."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from dcp_bench.campaign.reproduce import (
    REPORT_MARGIN_S,
    Estimate,
    Progress,
    WallClock,
    later_reserves,
    section_deadline,
    write_report,
)
from dcp_bench.campaign.reproduce_config import (
    ReproduceSection,
    find_claims,
    load_reproduce_config,
)
from dcp_bench.errors import ConfigError
from dcp_bench.paths import CONF_DIR

sys.path.insert(0, str(Path(__file__).resolve().parent))
from runner_doubles import write_toy_conf  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
PRESETS = sorted(
    p.stem for p in (CONF_DIR / "reproduce").glob("*.yaml") if not p.stem.endswith("_claims")
)


@pytest.mark.parametrize("preset", PRESETS)
def test_no_packaged_preset_cuts_by_wall_clock(preset: str) -> None:
    cfg = load_reproduce_config([f"preset={preset}"])
    assert cfg.budget_s is None
    assert [s.name for s in cfg.sections if s.budget_s is not None] == []
    clock = WallClock(1000.0, cfg.budget_s, cfg.report_reserve_s)
    assert clock.runs_end() is None and clock.report_end() is None and clock.margin_s == 0.0
    assert later_reserves(clock, cfg.sections) == [0.0] * len(cfg.sections)
    for sec in cfg.sections:
        assert section_deadline(clock, sec, 0.0, now=1000.0) is None


def test_a_budget_is_an_option_and_none_lifts_one(tmp_path: Path) -> None:
    assert load_reproduce_config(["budget_s=600"]).budget_s == 600.0
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({"budget_s": 300, "sections": [{"name": "a"}]}))
    assert load_reproduce_config([f"config={path}"]).budget_s == 300.0
    assert load_reproduce_config([f"config={path}", "budget_s=none"]).budget_s is None
    with pytest.raises(ConfigError, match=r"^budget_s='soon': expected a finite number"):
        load_reproduce_config(["budget_s=soon"])


def test_a_budget_bounds_runs_and_report_with_margins() -> None:
    """Worked by hand: budget 600 s, 60 s for the report; the runs' margin is 5% of the budget
    (30 s, between 15 and 60), so runs end at 510 s and the full report at 595 s."""
    clock = WallClock(1000.0, 600.0, 60.0)
    assert clock.margin_s == 30.0
    assert clock.runs_end() == 1000.0 + 510.0
    assert clock.report_end() == 1000.0 + 600.0 - REPORT_MARGIN_S
    assert WallClock(0.0, 100.0, 60.0).margin_s == 15.0  # at least 15 s
    assert WallClock(0.0, 7200.0, 60.0).margin_s == 60.0  # at most 60 s
    secs = [ReproduceSection(name=n, reserve_s=20.0) for n in "abcd"]
    # 60 s kept by later sections of a 510 s window: unscaled
    assert later_reserves(clock, secs) == [60.0, 40.0, 20.0, 0.0]
    # a 90 s budget: runs have 90 - 60 - 15 = 15 s; later reserves take at most half (7.5 s)
    small = WallClock(0.0, 90.0, 60.0)
    assert later_reserves(small, secs) == pytest.approx([7.5, 5.0, 2.5, 0.0])
    # a section's own cap applies from when it starts, within the whole budget's share
    capped = dataclasses.replace(secs[0], budget_s=100.0)
    assert section_deadline(clock, capped, 60.0, now=1010.0) == 1110.0
    assert section_deadline(clock, capped, 60.0, now=1400.0) == 1000.0 + 510.0 - 60.0
    assert section_deadline(WallClock(0.0), capped, 0.0, now=5.0) == 105.0  # no whole budget


def _summary(kind: str, run_id: str, took: float) -> Any:
    return SimpleNamespace(
        executor="torch" if kind == "real" else "sim",
        status="ok",
        run_id=run_id,
        started_at=100.0,
        finished_at=100.0 + took,
    )


def test_the_estimate_prices_what_is_left_at_the_measured_time_per_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    est = Estimate({"real": 2, "sim": 10}, sections=2)
    assert est.total == 12 and est.left_text() == (
        "left: 12 run(s), 2 real run(s) not yet timed + 10 sim run(s) not yet timed"
    )
    est.begin("sim", now=0.0)
    for i in range(4):
        est.run_done(_summary("sim", f"s{i}", 1.5))
    # 4 simulated runs in 8 s of the sweep's wall time: 2 s each, 6 left -> 12 s; real not timed
    assert est.rate("sim", now=8.0) == 2.0
    assert est.left_text(now=8.0) == "left: 8 run(s), about 12 s + 2 real run(s) not yet timed"
    est.end(planned=6, now=8.0)  # the sweep had 6 to do and ran 4: the other 2 leave the count
    assert est.left == {"real": 2, "sim": 4}
    est.begin("real", now=8.0)
    est.run_done(_summary("real", "r0", 30.0))
    est.end(planned=1, now=38.0)
    assert est.left_text(now=38.0) == "left: 5 run(s), about 38 s"  # 1 x 30 s + 4 x 2 s
    est.section_done("toy", 38.0)
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("reproduce: [1/12] ok 1.5 s sim s0; left: 11 run(s)")
    assert err[4].startswith("reproduce: [5/12] ok 30.0 s real r0; left: 5 run(s), about")
    assert err[-1].startswith("reproduce: section toy done in 38 s (1 of 2 sections); left: 5")


def _toy_config(tmp_path: Path, sleep_s: float, **top: Any) -> tuple[Path, Path]:
    conf = write_toy_conf(tmp_path / "conf", sleep_s=sleep_s)
    out = tmp_path / "reports" / "toy"
    grid = [f"extra_conf={conf}", "workload=toy", "model=tiny_llama"]
    cfg = {
        "campaign": "toy",
        "root": str(tmp_path / "runs"),
        "out": str(out),
        "claims": str(REPO / "results" / "reference" / "claims.yaml"),
        "jobs": 1,
        "repeats": 2,
        "real": False,
        "sim_common": ["run.warmup_steps=0", "run.steps=2", "run.planner_clock=off"],
        "sections": [
            {"name": "first", "grids": [[*grid, "cluster=h200x8", "method=toy_static,toy_greedy"]]},
            {"name": "second", "grids": [[*grid, "cluster=h200x16", "method=toy_greedy"]]},
        ],
        **top,
    }
    path = tmp_path / "reproduce.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path, out


def test_a_budget_the_full_report_cannot_meet_leaves_a_short_report(tmp_path: Path) -> None:
    """The full report has no time left (its end is past): the short one is written beside
    ``out`` at once, with the notes (what was cut) and the command that builds the full one."""
    config, out = _toy_config(tmp_path, sleep_s=0.0, budget_s=100, report_reserve_s=30)
    cfg = load_reproduce_config([f"config={config}"])
    done = Progress(
        notes=["section first: CUT: 0 run(s) now", "section first: cells ... `toy_static`"],
        wanted=["first", "second"],
        cut=["first", "second"],
    )
    clock = WallClock(time.time() - 200.0, cfg.budget_s, cfg.report_reserve_s)
    code = write_report(cfg, find_claims(cfg.claims), "dcp-bench reproduce x", done, clock)
    assert code == 4
    partial = out.parent / "toy.partial"
    md = (partial / "report.md").read_text()
    assert "(short report)" in md and "section first: CUT" in md
    assert "dcp-bench report campaign=toy" in md
    summary = json.loads((partial / "summary.json").read_text())
    assert summary["completeness"]["report"] == "short" and not summary["completeness"]["complete"]
    assert summary["report"]["md"].endswith("report.md")  # as the report shows paths
    assert not out.exists()  # no complete report was there, and none is claimed


def _busy_core() -> subprocess.Popen[bytes]:
    """One core kept busy for the length of a test."""
    return subprocess.Popen(["sh", "-c", "while :; do :; done"], stdout=subprocess.DEVNULL)


@pytest.mark.slow  # a reproduction against its budget with a core kept busy
def test_a_small_budget_bounds_the_wall_time_with_a_core_busy(tmp_path: Path) -> None:
    """Every toy step plans for 30 s, so the sections' 6 runs would take minutes; under
    ``budget_s=50`` the command, run as a user runs it with one core kept busy, ends within 50 s
    of wall time, counted from before its process starts: what runs is cut, the rest listed as
    left out, the report (full or short) written beside ``out``, exit 4, and progress lines on
    stderr."""
    config, out = _toy_config(tmp_path, sleep_s=30.0)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")]),
    }
    busy = _busy_core()
    try:
        started = time.monotonic()
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "dcp_bench.cli",
                "reproduce",
                f"config={config}",
                "budget_s=50",
                "report_reserve_s=10",
            ],
            capture_output=True,
            text=True,
            env=env,
            cwd=REPO,
            timeout=120,
        )
        wall = time.monotonic() - started
    finally:
        busy.kill()
        busy.wait()
    assert proc.returncode == 4, proc.stderr[-2000:]
    assert wall < 50.0, (wall, proc.stdout[-2000:])
    partial = out.parent / "toy.partial"
    summary = json.loads((partial / "summary.json").read_text())
    assert (partial / "report.md").is_file()
    assert summary["completeness"]["complete"] is False
    notes = "\n".join(summary["notes"])
    assert "cut or left out by the budget" in notes or "left out by the time budget" in notes
    assert "reproduce: planning 2 section(s)" in proc.stderr
    assert "reproduce: time budget 50 s" in proc.stderr
    assert "left:" in proc.stderr


def test_the_first_screen_names_the_cpu_calibration_or_the_mismatch() -> None:
    import pandas as pd

    from dcp_bench.report.first_screen import CALIBRATION_NOTE, _simulator_error_line

    val = pd.DataFrame({"error": [0.10, -0.20, 0.05]})
    here = CALIBRATION_NOTE + "this machine's, measured by this reproduction (12 s)"
    data = SimpleNamespace(inp=SimpleNamespace(notes=["a note", here]), validation=val)
    line = _simulator_error_line(data)  # type: ignore[arg-type]
    assert line is not None
    assert "median error 10% on step time" in line  # |0.10|, |0.20|, |0.05| -> 0.10
    assert "priced with calibration: this machine's, measured by this reproduction" in line
    # no measured runs, but a calibration that could not be measured: still on the first screen
    mismatch = CALIBRATION_NOTE + "MISMATCH: this machine's could not be measured (timeout)"
    data = SimpleNamespace(inp=SimpleNamespace(notes=[mismatch]), validation=pd.DataFrame())
    assert _simulator_error_line(data) == (  # type: ignore[arg-type]
        "The simulator's CPU check: calibration MISMATCH: this machine's could not be measured "
        "(timeout)."
    )
    data = SimpleNamespace(inp=SimpleNamespace(notes=[]), validation=pd.DataFrame())
    assert _simulator_error_line(data) is None  # type: ignore[arg-type]


def _real_spec(tmp_path: Path, model: str = "tiny_llama", arch: str = "llama") -> Any:
    return SimpleNamespace(
        model=SimpleNamespace(name=model, arch=arch),
        world_size=2,
        executor="torch",
        root=str(tmp_path / "runs"),
        campaign="toy",
        run_id=f"{model}__h",
        config_hash="h",
        seed=0,
    )


def test_a_calibration_with_no_time_left_is_a_mismatch_the_report_states(tmp_path: Path) -> None:
    from dcp_bench.campaign.reproduce import calibrate_section
    from dcp_bench.report.first_screen import CALIBRATION_NOTE

    config, _ = _toy_config(tmp_path, sleep_s=0.0, budget_s=100, report_reserve_s=30)
    cfg = load_reproduce_config([f"config={config}"])
    section = ReproduceSection(name="cpu", real=True, calibrate=True)
    est = Estimate({}, 1, enabled=False)
    got = calibrate_section(cfg, section, [_real_spec(tmp_path)], time.time() + 5.0, est)
    assert got["profile"] is None and got["measured_here"] is False
    note = got["note"]
    assert note.startswith(CALIBRATION_NOTE + "MISMATCH: this machine's could not be measured")
    assert "no time left in the budget (budget_s=100)" in note
    # the committed one, with the machine its artifact says it was measured on
    assert "`results/calibration/cpu` (tiny_llama: " in note and "cores" in note
    assert not (tmp_path / "runs" / "toy.calibration").exists()


def test_a_calibration_past_its_time_is_ended_with_every_process(tmp_path: Path) -> None:
    from dcp_bench.campaign.reproduce import calibrate_here

    folder = tmp_path / "runs" / "toy.calibration"
    problem = calibrate_here([("tiny_llama", "llama")], [2], folder, time.time() + 3.0)
    assert problem == "tiny_llama: not done within the calibration's time; every process ended"
    assert not folder.exists() and list(folder.parent.iterdir()) == []  # nothing half-written
    assert calibrate_here([("m", "mamba")], [2], folder, time.time() + 60.0) == (
        "no calibration grid for m (arch mamba)"
    )


@pytest.mark.slow
def test_a_short_calibration_of_this_cpu_prices_the_tiny_model(tmp_path: Path) -> None:
    """The reproduction's calibration of this machine, for real: an artifact of this CPU that
    the profiled cost model reads, on the sizes the real CPU section trains."""
    from dcp_bench.campaign.reproduce import calibrate_here
    from dcp_bench.cost import make_cost_model
    from dcp_bench.cost.specs import cluster_spec
    from dcp_bench.envinfo import collect_env

    folder = tmp_path / "cal"
    assert calibrate_here([("tiny_llama", "llama")], [2], folder, time.time() + 400.0) is None
    art = json.loads((folder / "tiny_llama.json").read_text())
    assert art["hardware"]["cpu_model"] == collect_env().get("cpu_model")
    assert art["settings"]["grid"]["tokens_per_rank"] == [64, 256, 1024]
    two_ranks = cluster_spec("cpu").resized(2)  # the section's runs: nproc=2
    cost = make_cost_model("tiny_llama", two_ranks, "auto", profile=str(folder))
    assert cost.describe()["profile"]["path"].endswith("tiny_llama.json")
    small = cost.microbatch_cost([256], [1], 1, 0).total_s
    big = cost.microbatch_cost([1024], [1], 1, 0).total_s
    assert 0 < small < big


def test_the_estimate_names_only_what_it_has_timed() -> None:
    est = Estimate({"real": 3, "sim": 0}, sections=1)
    est.begin("sim", now=0.0)
    est.run_done(_summary("sim", "extra", 1.0))  # a sim run timed, none of that kind left
    assert est.left_text(now=2.0) == "left: 3 run(s), 3 real run(s) not yet timed"
