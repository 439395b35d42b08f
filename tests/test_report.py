"""A report is produced from a small sweep, and its numbers match the run records."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dcp_bench.campaign.sweep import plan_sweep, run_sweep
from dcp_bench.records import iter_summaries
from dcp_bench.report.claims import verdict
from dcp_bench.report.writer import ReportInputs, build_report

sys.path.insert(0, str(Path(__file__).resolve().parent))
from runner_doubles import toy_assemble, write_toy_conf  # noqa: E402

CLAIMS = """
claims:
  - id: toy_claim
    statement: greedy is 1.5x faster than static
    value: 1.5
    tolerance: 0.15
    context: {workload: toy, cluster: h200x8, model: tiny_llama}
    baseline: {method: toy_static, mode: fair}
    method: {method: toy_greedy, mode: fair}
comparisons:
  - id: toy_vs_fail
    title: greedy vs a failing method
    context: {workload: toy, cluster: h200x8, model: tiny_llama}
    baseline: {method: toy_static}
    method: {method: toy_fail}
sensitivity:
  claim: toy_claim
  constants: [act_bytes]
  factors: [0.5, 2.0]
"""


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict]:
    tmp = tmp_path_factory.mktemp("report")
    conf = write_toy_conf(tmp / "conf")
    root = tmp / "runs"
    base = [
        f"extra_conf={conf}",
        "workload=toy",
        "cluster=h200x8",
        "model=tiny_llama",
        "run.steps=3",
        "run.warmup_steps=1",
        "run.planner_clock=off",
        f"run.root={root}",
        "run.campaign=small",
    ]
    specs = plan_sweep([*base, "method=toy_static,toy_greedy,toy_fail"], repeats=5)
    specs += plan_sweep(
        [*base, "method=toy_static,toy_greedy", "++cost.scales.act_bytes=0.5,2.0"], repeats=5
    )
    specs += plan_sweep([*base, "method=toy_static,toy_greedy", "method.mode=paper"], repeats=5)
    run_sweep(specs, build=toy_assemble, progress=False, env={"cpu_model": "test"})
    claims = tmp / "claims.yaml"
    claims.write_text(CLAIMS)
    out = tmp / "report"
    summary = build_report(
        ReportInputs(
            root=root,
            campaign="small",
            out_dir=out,
            claims_path=claims,
            command="pytest",
            baselines=["toy_static"],
            n_boot=500,
        )
    )
    return root, out, summary


def test_report_files(report: tuple[Path, Path, dict]) -> None:
    _, out, summary = report
    md = (out / "report.md").read_text()
    html = (out / "report.html").read_text()
    assert "## Verdict" in md and "toy_claim" in md
    assert "data:image/png;base64," in html
    assert "src='http" not in html and 'src="http' not in html  # self-contained
    for name in ("cells", "speedups", "runs", "sensitivity"):
        assert (out / "tables" / f"{name}.csv").exists(), name
    assert (out / "summary.json").exists()
    assert json.loads((out / "summary.json").read_text())["claims"][0]["id"] == "toy_claim"
    assert list((out / "figures").glob("*.png"))


def test_claim_value_matches_run_records(report: tuple[Path, Path, dict]) -> None:
    root, _, summary = report
    # independent reference: the median of per-seed ratios of the run summaries (fair mode,
    # default constants only)
    times: dict[tuple[str, int], float] = {}
    for s in iter_summaries(root, "small"):
        if s.context is None or s.context.scales or s.context.mode != "fair":
            continue
        times[(s.method, s.seed)] = s.step_time_s  # type: ignore[assignment]
    expect = float(
        np.median([times[("toy_static", k)] / times[("toy_greedy", k)] for k in range(5)])
    )
    claim = summary["claims"][0]
    assert claim["reproduced_value"] == pytest.approx(expect) == claim["speedup"]
    lo, hi = claim["ci95"]
    assert lo <= expect <= hi and (lo, hi) == (claim["ci_low"], claim["ci_high"])
    assert claim["verdict"] == verdict(1.5, 0.15, lo, hi)
    assert claim["pairs"] == 5
    assert claim["measured_steps_per_run"] == 3 and claim["unit"] == "step"
    assert "data sampling" in claim["ci_covers"]


def test_failures_are_counted(report: tuple[Path, Path, dict]) -> None:
    _, out, summary = report
    cells = pd.read_csv(out / "tables" / "cells.csv")
    failing = cells[cells["method"] == "toy_fail"]
    assert len(failing) == 1 and int(failing["failures"].iloc[0]) == 5
    assert summary["failed_runs"] == 5
    comp = [c for c in summary["comparisons"] if c["comparison"] == "toy_vs_fail"]
    assert comp and comp[0]["speedup"] == 0.0  # a method that always fails is infinitely slow


def test_cells_statistics_match_records(report: tuple[Path, Path, dict]) -> None:
    root, out, _ = report
    cells = pd.read_csv(out / "tables" / "cells.csv")
    by_hash: dict[str, list[float]] = {}
    for s in iter_summaries(root, "small"):
        if s.status == "ok":
            by_hash.setdefault(s.config_hash, []).append(s.step_time_s)  # type: ignore[arg-type]
    for h, vals in by_hash.items():
        row = cells[cells["config_hash"] == h].iloc[0]
        assert row["repeats"] == 5
        assert row["median_s"] == pytest.approx(float(np.median(vals)), rel=1e-5)
        srt = sorted(vals)
        assert row["olympic_mean_s"] == pytest.approx(float(np.mean(srt[1:-1])), rel=1e-5)


def test_sensitivity_rows(report: tuple[Path, Path, dict]) -> None:
    _, out, _ = report
    sens = pd.read_csv(out / "tables" / "sensitivity.csv")
    assert set(sens["factor"]) == {0.5, 2.0}
    assert np.isfinite(sens["speedup"]).all()


def test_decomposition_multiplies_to_the_headline(report: tuple[Path, Path, dict]) -> None:
    """The factors' product equals thr(method, paper) / thr(baseline, paper), computed here from
    the run records' throughputs."""
    root, out, _ = report
    thr: dict[tuple[str, str], list[float]] = {}
    for s in iter_summaries(root, "small"):
        if s.context is None or s.context.scales or s.status != "ok":
            continue
        thr.setdefault((s.method, s.context.mode), []).append(s.tokens_per_s)  # type: ignore[arg-type]
    expect = np.median(thr[("toy_greedy", "paper")]) / np.median(thr[("toy_static", "paper")])
    dec = pd.read_csv(out / "tables" / "decomposition.csv")
    assert float(np.prod(dec["factor_x"])) == pytest.approx(expect, rel=1e-4)  # CSV keeps 6 digits
    # fair-mode parts: the time saved by the greedy planner is mostly imbalance and recompute
    parts = dec[dec["factor"].str.startswith("fair mode:")]
    assert parts["baseline_s"].notna().sum() >= 5


def test_deadline_leaves_runs_unrun(tmp_path: Path) -> None:
    import time

    conf = write_toy_conf(tmp_path / "conf")
    specs = plan_sweep(
        [
            f"extra_conf={conf}",
            "workload=toy",
            "method=toy_static",
            "cluster=h200x8",
            "model=tiny_llama",
            "run.steps=1",
            f"run.root={tmp_path / 'runs'}",
        ],
        repeats=3,
    )
    res = run_sweep(specs, build=toy_assemble, progress=False, env={}, deadline=time.time() - 1)
    assert not res.ran and sorted(res.unrun) == sorted(s.run_id for s in specs)


def _run_as_measured(specs):  # type: ignore[no-untyped-def]
    """'Measured' runs: every step exactly 10% slower than the toy simulator predicts."""
    import dataclasses
    import functools

    from dcp_bench.files import atomic_write_json
    from dcp_bench.run.simulated import run_simulated

    for spec in specs:
        summary = run_simulated(spec, build=functools.partial(toy_assemble, slowdown=1.1), env={})
        summary = dataclasses.replace(summary, executor="torch")
        atomic_write_json(
            Path(spec.root) / spec.campaign / spec.run_id / "run.json", dataclasses.asdict(summary)
        )


def test_simulator_error_table(tmp_path: Path) -> None:
    conf = write_toy_conf(tmp_path / "conf")
    root = tmp_path / "runs"
    base = [
        f"extra_conf={conf}",
        "workload=toy",
        "cluster=h200x8",
        "model=tiny_llama",
        "run.steps=2",
        "run.warmup_steps=1",
        "run.planner_clock=off",
        "method=toy_static,toy_greedy",
        f"run.root={root}",
        "run.campaign=v",
    ]
    run_sweep(
        plan_sweep([*base, "run.executor=sim"], repeats=1),
        build=toy_assemble,
        progress=False,
        env={},
    )
    _run_as_measured(plan_sweep([*base, "run.executor=torch"], repeats=1))
    claims = tmp_path / "claims.yaml"
    claims.write_text("claims: []\n")
    summary = build_report(
        ReportInputs(
            root=root,
            campaign="v",
            out_dir=tmp_path / "out",
            claims_path=claims,
            baselines=["toy_static"],
            n_boot=200,
        )
    )
    err = summary["simulator_error"]
    # predicted / measured - 1 = 1 / 1.1 - 1 for every cell (the sync time is scaled too)
    assert err["median_abs_step_time_error"] == pytest.approx(1 - 1 / 1.1, rel=1e-6)
    # both sides 10% off: the speedup is exact
    assert err["median_abs_speedup_error"] == pytest.approx(0.0, abs=1e-9)
    assert len(err["cells"]) == 2
