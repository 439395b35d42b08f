"""The report of a user's own campaign: it opens with the campaign's methods against its
baselines, shows claim sections only with their data, draws every cell (failures drawn and
labelled), keeps one colour per method, says simulated or measured everywhere, flags thin
evidence; and it survives damaged records, clears what it owns, writes 0644 files and names no
local folder."""

from __future__ import annotations

import json
import math
import re
import stat
import sys
from pathlib import Path

import matplotlib.colors as mcolors
import numpy as np
import pandas as pd
import pytest

from dcp_bench.campaign.sweep import plan_sweep, run_sweep
from dcp_bench.paths import REPO_ROOT, RESULTS_DIR
from dcp_bench.records import iter_summaries
from dcp_bench.report import figures as fig
from dcp_bench.report.tables import comparison_flags
from dcp_bench.report.writer import ReportInputs, build_report, gather_report_data, scrub_paths

sys.path.insert(0, str(Path(__file__).resolve().parent))
from runner_doubles import toy_assemble, write_toy_conf  # noqa: E402

CLAIMS = (
    RESULTS_DIR / "reference" / "claims.yaml"
)  # the real claims: none of them is about a toy campaign


def sweep_toy(tmp: Path, campaign: str = "mine", repeats: int = 3) -> Path:
    """toy_static (baseline), toy_greedy and toy_fail (always infeasible) on h200x8, 3 repeats,
    and toy_static / toy_greedy at two more cluster sizes."""
    conf = write_toy_conf(tmp / "conf")
    root = tmp / "runs"
    base = [
        f"extra_conf={conf}",
        "workload=toy",
        "model=tiny_llama",
        "run.steps=3",
        "run.warmup_steps=1",
        "run.planner_clock=off",
        f"run.root={root}",
        f"run.campaign={campaign}",
    ]
    specs = plan_sweep(
        [*base, "cluster=h200x8", "method=toy_static,toy_greedy,toy_fail"], repeats=repeats
    )
    specs += plan_sweep(
        [*base, "cluster=h200x16,h200x32", "method=toy_static,toy_greedy"], repeats=repeats
    )
    run_sweep(specs, build=toy_assemble, progress=False, env={"cpu_model": "test"})
    return root


def inputs(root: Path, out: Path, **kw: object) -> ReportInputs:
    args: dict[str, object] = {
        "campaign": "mine",
        "claims_path": CLAIMS,
        "command": f"dcp-bench report root={root}",
        "baselines": ["toy_static"],
        "n_boot": 300,
        **kw,
    }
    return ReportInputs(root=root, out_dir=out, **args)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def campaign(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sweep_toy(tmp_path_factory.mktemp("campaign"))


@pytest.fixture(scope="module")
def report(campaign: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("out") / "report"
    return out, build_report(inputs(campaign, out))


def h2s(md: str) -> list[str]:
    return re.findall(r"^## (.+)$", md, re.M)


def test_opens_with_the_campaigns_comparison_and_no_claim_sections(
    report: tuple[Path, dict],
) -> None:
    out, _ = report
    md = (out / "report.md").read_text()
    assert h2s(md)[0] == "Methods against baselines"
    for absent in (
        "Verdict",
        "Headline comparisons",
        "Where the speedup comes from",
        "Sensitivity",
    ):
        assert absent not in h2s(md), absent
    assert "NO DATA" not in md and "not in this campaign" not in md.lower()
    assert "not enough data" not in md  # every figure of the cells present is drawn


def test_user_report_keeps_the_order_of_a_claim_report(report: tuple[Path, dict]) -> None:
    """The user's answer first (its comparison with a forest plot), then the sections in the order
    a claim's report has them (tests/test_report_first_screen.py checks the claim's side)."""
    from test_report_first_screen import check_section_order

    out, _ = report
    md = (out / "report.md").read_text()
    check_section_order(h2s(md))
    first = md.split("\n## ", 2)[1]
    assert first.startswith("Methods against baselines") and "figures/forest_headline.png" in first
    assert "|" not in first.split("figures/forest_headline.png")[0]  # no table before the plot


def test_comparison_rows_are_methods_over_baselines_with_outcome_and_flags(
    report: tuple[Path, dict], campaign: Path
) -> None:
    out, summary = report
    own = pd.DataFrame(summary["method_vs_baseline"])
    assert set(own["baseline"]) == {"toy_static"} and "toy_static" not in set(own["method"])
    h8 = own[own["cluster"] == "h200x8"].set_index("method")
    # toy_greedy's speedup = ratio of the median step times of the records (independent reference)
    t = {
        m: [
            s.step_time_s
            for s in iter_summaries(campaign, "mine")
            if s.method == m and s.cluster == "h200x8"
        ]
        for m in ("toy_static", "toy_greedy")
    }
    assert h8.loc["toy_greedy", "speedup"] == pytest.approx(
        np.median(t["toy_static"]) / np.median(t["toy_greedy"]), rel=1e-9
    )
    assert h8.loc["toy_greedy", "outcome"] in (
        "faster",
        "slower",
        "no clear difference (CI includes 1)",
    )
    assert "3 paired repeats (< 5)" in h8.loc["toy_greedy", "flags"]
    assert h8.loc["toy_fail", "outcome"] == "method failed (error: InfeasibleError)"
    md = (out / "report.md").read_text()
    row = next(
        ln for ln in md.splitlines() if ln.startswith("| toy | h200x8 | tiny_llama | toy_fail |")
    )
    assert (
        "| - | - |" in row and "inf" not in row and "| 0 |" not in row
    )  # failed: words, not 0 or inf


def test_baseline_pairs_only_when_asked(campaign: Path, tmp_path: Path) -> None:
    data = gather_report_data(
        inputs(campaign, tmp_path, baselines=["toy_static", "toy_greedy"], n_boot=100)
    )
    assert not data.own.empty and not data.own["method_is_baseline"].any()
    data = gather_report_data(
        inputs(
            campaign,
            tmp_path,
            baselines=["toy_static", "toy_greedy"],
            baseline_pairs=True,
            n_boot=100,
        )
    )
    pairs = data.own[data.own["method_is_baseline"]]
    assert {(r.method, r.baseline) for r in pairs.itertuples() if r.cluster == "h200x8"} == {
        ("toy_greedy", "toy_static"),
        ("toy_static", "toy_greedy"),
    }


def test_every_figure_says_simulated_or_measured(report: tuple[Path, dict]) -> None:
    out, _ = report
    md = (out / "report.md").read_text()
    captions = re.findall(r"^!\[(.*)\]\(figures/(.+)\.png\)$", md, re.M)
    assert len(captions) >= 6
    for caption, name in captions:
        assert "simulated" in caption or "measured" in caption, name
        assert (out / "figures" / f"{name}.png").exists()
    assert {"scaling", "imbalance_vs_gpus"} <= {n for _, n in captions}


def _face(artist: object) -> tuple[float, ...]:
    return tuple(round(x, 6) for x in mcolors.to_rgba(artist.get_facecolor())[:3])  # type: ignore[attr-defined]


def test_one_colour_per_method_in_every_figure_and_failures_drawn(
    campaign: Path, tmp_path: Path
) -> None:
    data = gather_report_data(inputs(campaign, tmp_path))
    colors = data.colors
    assert len({tuple(mcolors.to_rgb(c)) for c in colors.values()}) == len(colors)  # distinct
    want = {
        m: tuple(round(x, 6) for x in mcolors.to_rgb(colors[m])) for m in ("toy_greedy", "toy_fail")
    }
    # speedup bars: toy_greedy filled with its colour; toy_fail hatched in its colour, labelled
    # failed
    sp = data.own[data.own["cluster"] == "h200x8"]
    f = fig.draw_speedup_bars(sp, "simulated", colors)
    bars = [p for p in f.axes[0].patches if p.get_height() > 0]
    filled = [p for p in bars if not p.get_hatch()]
    hatched = [p for p in bars if p.get_hatch()]
    assert {_face(p) for p in filled} == {want["toy_greedy"]}
    assert (
        len(hatched) == 1
        and tuple(round(x, 6) for x in mcolors.to_rgb(hatched[0].get_edgecolor()))
        == want["toy_fail"]
    )
    assert any(t.get_text() == "method failed" for t in f.axes[0].texts)
    # step times: the same colour for toy_greedy's box; toy_fail has a label saying it failed
    cells = data.default[data.default["cluster"] == "h200x8"]
    steps = data.campaign.steps[data.campaign.steps["config_hash"].isin(cells["config_hash"])]
    f2 = fig.draw_step_time_distributions(steps, cells, "simulated", colors)
    labels = [t.get_text() for t in f2.axes[0].get_yticklabels()]
    boxes = {_face(p) for p in f2.axes[0].patches}
    assert want["toy_greedy"] in boxes and want["toy_fail"] not in boxes
    assert "toy_fail" in labels and any(
        t.get_text().startswith("failed (error, 3/3") for t in f2.axes[0].texts
    )


def test_lines_never_join_different_models_or_machines() -> None:
    """Throughput of one method at 8 and 16 H200s (model A) and at 4 CPU ranks (model B, and A):
    only the H200 points form a line."""
    rows = [
        ("h200x8", "h200", 8, "A", 1.0),
        ("h200x16", "h200", 16, "A", 2.0),
        ("cpu", "cpu", 4, "B", 0.1),
        ("cpu", "cpu", 4, "A", 0.2),
    ]
    cells = pd.DataFrame(
        [
            {
                "workload": "w",
                "label": "m",
                "cluster": c,
                "gpu": g,
                "world_size": float(n),
                "model": mo,
                "executor": "sim",
                "tokens_per_s": v,
            }
            for c, g, n, mo, v in rows
        ]
    )
    f = fig.draw_versus_gpus(cells, "tokens_per_s", "tokens/s", "simulated", {"m": "C0"})
    lines = [ln for ax in f.axes for ln in ax.get_lines()]
    assert len(lines) == 1 and list(lines[0].get_xdata()) == [8.0, 16.0]


@pytest.mark.parametrize(
    ("args", "flags"),
    [
        ((1.2, 1.1, 1.3, 5), []),
        ((1.2, 1.1, 1.3, 3), ["3 paired repeats (< 5)"]),
        (
            (0.9824, 0.9824, 1.004, 3),
            ["3 paired repeats (< 5)", "CI degenerate (a bound equals the estimate)"],
        ),
        ((1.5, 1.5, 1.5, 8), ["CI degenerate (a bound equals the estimate)"]),
        ((1.5, 1.4, math.inf, 6), ["CI unbounded (failed repeats in the resamples)"]),
    ],
)
def test_flags(args: tuple[float, float, float, int], flags: list[str]) -> None:
    assert comparison_flags(*args) == flags


def test_damaged_records_are_skipped_named_and_counted(tmp_path: Path) -> None:
    root = sweep_toy(tmp_path, repeats=2)
    dirs = sorted((root / "mine").iterdir())
    ok_dirs = [d for d in dirs if json.loads((d / "run.json").read_text())["status"] == "ok"]
    cut_summary, cut_steps = ok_dirs[0], ok_dirs[1]
    text = (cut_summary / "run.json").read_text()
    (cut_summary / "run.json").write_text(text[: len(text) // 2])
    text = (cut_steps / "steps.jsonl").read_text()
    (cut_steps / "steps.jsonl").write_text(text[: len(text) - 40])
    out = tmp_path / "report"
    summary = build_report(inputs(root, out))
    skipped = {s["run_id"]: s["why"] for s in summary["skipped_records"]}
    assert set(skipped) == {cut_summary.name, cut_steps.name}
    assert skipped[cut_summary.name].startswith("run.json: ") and skipped[
        cut_steps.name
    ].startswith("steps.jsonl:")  # the sweep's damaged-record rule names the line
    assert summary["runs"] == len(dirs) - 2
    md = (out / "report.md").read_text()
    assert (
        "**2 unreadable record(s) skipped**" in md
        and cut_summary.name in md
        and cut_steps.name in md
    )
    assert str(tmp_path) not in md


def test_report_clears_what_it_owns_writes_0644_and_names_no_local_folder(
    campaign: Path, tmp_path: Path
) -> None:
    out = tmp_path / "report"
    (out / "figures").mkdir(parents=True)
    (out / "tables").mkdir()
    (out / "figures" / "stale_from_an_earlier_report.png").write_bytes(b"x")
    (out / "tables" / "stale.csv").write_text("x\n")
    (out / "notes_of_mine.txt").write_text("kept")  # not the report's: left alone
    build_report(
        inputs(campaign, out, notes=[f"input folder {campaign} and {REPO_ROOT / 'results'}"])
    )
    assert not (out / "figures" / "stale_from_an_earlier_report.png").exists()
    assert not (out / "tables" / "stale.csv").exists()
    assert (out / "notes_of_mine.txt").read_text() == "kept"
    written = [p for p in out.rglob("*") if p.is_file() and p.name != "notes_of_mine.txt"]
    assert {p.suffix for p in written} >= {".md", ".html", ".json", ".csv", ".png"}
    for p in written:
        assert stat.S_IMODE(p.stat().st_mode) == 0o644, p
        if p.suffix != ".png":
            text = p.read_text()
            assert (
                str(tmp_path) not in text
                and str(campaign) not in text
                and str(REPO_ROOT) not in text
            ), p


def test_scrub_paths() -> None:
    assert (
        scrub_paths(f"see {REPO_ROOT}/results/x.json and /elsewhere/data/l.txt")
        == "see results/x.json and .../l.txt"
    )
    assert (
        scrub_paths("https://github.com/a/b and 1/2 and tokens / s")
        == "https://github.com/a/b and 1/2 and tokens / s"
    )


def test_a_failed_scaling_point_is_marked_not_joined() -> None:
    """At 32 GPUs every repeat failed (throughput 0): the line stops at 16 and the 32 point is an
    x labelled failed."""
    rows = [(8, 1.0, 0), (16, 2.0, 0), (32, 0.0, 3)]
    cells = pd.DataFrame(
        [
            {
                "workload": "w",
                "label": "m",
                "cluster": f"h200x{n}",
                "gpu": "h200",
                "world_size": float(n),
                "model": "A",
                "executor": "sim",
                "tokens_per_s": v,
                "failures": f,
                "repeats": 3,
            }
            for n, v, f in rows
        ]
    )
    f = fig.draw_versus_gpus(cells, "tokens_per_s", "tokens/s", "simulated", {"m": "C0"}, log=True)
    ax = f.axes[0]
    lines = [ln for ln in ax.get_lines() if ln.get_linestyle() != "None"]
    marks = [ln for ln in ax.get_lines() if ln.get_marker() == "x"]
    assert len(lines) == 1 and list(lines[0].get_xdata()) == [8.0, 16.0]
    assert len(marks) == 1 and list(marks[0].get_xdata()) == [32.0]
    assert [t.get_text() for t in ax.texts] == ["failed"]
