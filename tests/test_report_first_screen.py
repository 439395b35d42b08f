"""The report's first screen gives the answer: the verdict with its basis, CI and model band,
one forest plot of every headline comparison, what the verdict rests on; figures fit the page;
long tables go to the appendix; the same section order for a claim's campaign and a user's.
Rendered in headless Chromium (skipped, with the reason, where none is installed): the verdict
and the forest plot lie inside the first 1,000 px of a 1,400 px wide window, no image is shrunk
below 60% of its natural width unless it fits the page, and nothing overflows sideways."""

from __future__ import annotations

import base64
import colorsys
import io
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import matplotlib.colors as mcolors
import numpy as np
import pandas as pd
import pytest
import yaml

from dcp_bench.campaign.sweep import plan_sweep, run_sweep
from dcp_bench.paths import REPO_ROOT
from dcp_bench.report import figures as fig
from dcp_bench.report.claims import evaluate_claims, load_claims, tolerance_band
from dcp_bench.report.document import LONG_TABLE_ROWS, Document
from dcp_bench.report.first_screen import completeness_line, model_band_text, verdict_lines
from dcp_bench.report.tables import cell_table, load_campaign
from dcp_bench.report.writer import ReportInputs, build_report
from tools.browser import find_chromium, layout_problems, measure_page, screenshot

sys.path.insert(0, str(Path(__file__).resolve().parent))
from runner_doubles import toy_assemble, write_toy_conf  # noqa: E402

CLAIMS = """
claims:
  - id: toy_claim
    statement: greedy is 1.5x faster than static
    value: 1.5
    tolerance: 0.15
    context: {workload: toy, cluster: h200x8, model: tiny_llama}
    baseline: {method: toy_static, mode: paper}
    method: {method: toy_greedy, mode: paper}
comparisons:
  - id: toy_fair
    title: the same in fair mode
    context: {workload: toy, cluster: h200x8, model: tiny_llama}
    baseline: {method: toy_static, mode: fair}
    method: {method: toy_greedy, mode: fair}
"""

CHROMIUM = find_chromium()
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None,
    reason="no Chromium on this machine (Debian: apt-get install "
    "chromium; or set CHROMIUM=/path/to/chrome)",
)


def h2s(md: str) -> list[str]:
    return re.findall(r"^## (.+)$", md, re.M)


@pytest.fixture(scope="module")
def claim_report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    tmp = tmp_path_factory.mktemp("first_screen")
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
        "run.campaign=fs",
    ]
    specs = plan_sweep([*base, "method=toy_static,toy_greedy"], repeats=3)
    specs += plan_sweep([*base, "method=toy_static,toy_greedy", "method.mode=paper"], repeats=3)
    run_sweep(specs, build=toy_assemble, progress=False, env={"cpu_model": "test"})
    claims = tmp / "claims.yaml"
    claims.write_text(CLAIMS)
    out = tmp / "report"
    summary = build_report(
        ReportInputs(
            root=root,
            campaign="fs",
            out_dir=out,
            claims_path=claims,
            command="pytest",
            baselines=["toy_static"],
            n_boot=200,
            completeness={
                "complete": False,
                "sections_done": 3,
                "sections_total": 4,
                "cut": ["sensitivity"],
            },
        )
    )
    return out, summary


def test_first_screen_opens_with_the_verdict_and_the_forest_plot(
    claim_report: tuple[Path, dict],
) -> None:
    out, summary = claim_report
    md = (out / "report.md").read_text()
    heads = h2s(md)
    assert heads[0] == "Verdict"
    # the first screen: the verdict box, then the forest plot, before any other section or table
    first = md.split("\n## ", 2)[1]
    box = first.index("> **toy_claim: ")
    assert box < first.index("figures/forest_headline.png")
    assert "|" not in first.split("figures/forest_headline.png")[0]  # no table before the plot
    claim = summary["claims"][0]
    assert f"{claim['speedup']:.2f}x, 95% CI over {claim['pairs']} paired seeds" in first
    assert (
        "model band: not computed" in first
        and "Share of the epoch each side trains: not computed" in first
    )
    assert "in simulation" in first  # the basis: the toy runs are simulated
    assert (
        "**Incomplete**: 3 of 4 sections ran (cut: sensitivity); rerun `make reproduce` to resume."
        in first
    )
    assert summary["completeness"]["sections_done"] == 3
    # method labels in the glossary, not in the opening lines
    assert "Methods: `" not in md and "Method labels" in heads
    # the detailed verdict says simulated, not measured, for a simulated number
    detail = md.split("## Verdict in detail", 1)[1].split("\n## ", 1)[0]
    assert "- simulated " in detail and "- measured " not in detail


def test_the_engine_judges_each_claim_file_against_its_own_band(
    claim_report: tuple[Path, dict], tmp_path: Path
) -> None:
    """Two claim files on the same toy cells: the same speedup and CI, each judged against its
    own band, and (no published measurement validates either) both undecided in simulation."""
    out, summary = claim_report
    toy = summary["claims"][0]
    for name, value, tol in (("near", float(toy["speedup"]), 1.0), ("far", 100.0, 0.1)):
        claim = {
            "id": f"toy_{name}",
            "statement": f"greedy is {value:g}x faster than static",
            "source": {"publication": "a toy", "location": "table 1"},
            "setup": {"workload": "toy", "cluster": "h200x8", "model": "tiny_llama"},
            "value": value,
            "tolerance": tol,
            "decide": {
                "baseline": {"method": "toy_static", "mode": "paper"},
                "method": {"method": "toy_greedy", "mode": "paper"},
            },
        }
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(claim))
    listing = tmp_path / "claims.yaml"
    listing.write_text(yaml.safe_dump({"version": 3, "claim_files": ["near.yaml", "far.yaml"]}))
    c = load_campaign(out.parent / "runs", "fs")
    near, far = evaluate_claims(c, cell_table(c), load_claims(listing), n_boot=200)
    for r in (near, far):
        assert r.result.speedup == pytest.approx(toy["speedup"])
        assert (r.result.ci_low, r.result.ci_high) == pytest.approx((toy["ci_low"], toy["ci_high"]))
        assert r.band == pytest.approx(tolerance_band(r.claimed, r.tolerance))
        assert r.verdict == "undecided" and "no published end-to-end measurement" in r.verdict_rule
    # near: the band [s / 2, 2 s] holds the CI; far: the band [90.9, 110] lies far above it
    assert near.ci_verdict == "reproduced" and far.ci_verdict == "not reproduced"
    assert far.band == pytest.approx((100 / 1.1, 110.0))


SECTION_TAIL = ["Method labels", "Provenance"]  # every report ends so, before its appendix


def check_section_order(heads: list[str]) -> None:
    """The order every report keeps (a claim's campaign and a user's alike): the answer first,
    the campaign's description after the evidence it leads with, the glossary and provenance
    last, the appendix of long tables after everything."""
    body = [h for h in heads if not h.startswith("Appendix")]
    assert body[-2:] == SECTION_TAIL and "About this campaign" in body, heads
    if "Appendix: long tables" in heads:
        assert heads[-1] == "Appendix: long tables"


def test_claim_report_section_order(claim_report: tuple[Path, dict]) -> None:
    out, _ = claim_report
    heads = h2s((out / "report.md").read_text())
    check_section_order(heads)
    assert heads[:2] == ["Verdict", "Verdict in detail"]


def test_fields_from_other_parts_light_up_when_present() -> None:
    """The claim row as the memory model and the reliability checks extend it: the screen shows
    the verdict string it carries, the basis, the model band and the per-side shares."""
    claim = {
        "id": "c",
        "claimed": 2.88,
        "tolerance": 0.15,
        "speedup": 2.67,
        "ci_low": 2.53,
        "ci_high": 2.68,
        "pairs": 5,
        "method": "m (paper mode)",
        "baseline": "b (paper mode)",
        "workload": "w",
        "statement": "m is 2.88x faster",
        "verdict": "incomplete: 3 of 11 sections, rerun `make reproduce` to resume",
        "basis": (
            "in simulation (analytical model calibrated on published measurements, not validated "
            "on a GPU)"
        ),
        "model_band_low": 2.31,
        "model_band_high": 2.95,
        "trained_fraction": {"method": 0.93, "baseline": 1.0},
        "imbalance": {"method": 0.04, "baseline": 0.21},
    }
    lines = verdict_lines(SimpleNamespace(), claim)
    assert lines[0] == (
        "**c: incomplete: 3 of 11 sections, rerun `make reproduce` to resume**, in simulation "
        "(analytical model calibrated on published measurements, not validated on a GPU)."
    )
    assert (
        "2.67x, 95% CI over 5 paired seeds [2.53, 2.68]; model band [2.31, 2.95]; claimed 2.88x, "
        "tolerance band [2.50, 3.31]" in lines[1]
    )
    assert model_band_text({}) == "model band: not computed"
    assert (
        model_band_text({"model_band_low": float("nan"), "model_band_high": 2.0})
        == "model band: not computed"
    )
    from dcp_bench.report.first_screen import _per_side

    assert _per_side(claim["trained_fraction"], "Share") == "Share: method 93%, baseline 100%"
    assert completeness_line(SimpleNamespace(inp=SimpleNamespace(completeness=None))) is None
    done = {"complete": True, "sections_done": 11, "sections_total": 11, "cut": []}
    assert (
        completeness_line(SimpleNamespace(inp=SimpleNamespace(completeness=done)))
        == "Complete: all 11 sections ran."
    )


def _forest_rows() -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "group": "claim",
                "label": "a over b",
                "method": "a",
                "speedup": 2.67,
                "ci_low": 2.53,
                "ci_high": 2.68,
                "model_band_low": 2.3,
                "model_band_high": 2.9,
                "band_low": 2.88 / 1.15,
                "band_high": 2.88 * 1.15,
            },
            {
                "group": "fair",
                "label": "a over b",
                "method": "a",
                "speedup": 2.28,
                "ci_low": 2.06,
                "ci_high": 2.41,
            },
            {
                "group": "fair",
                "label": "c over b",
                "method": "c",
                "speedup": 0.9,
                "ci_low": 0.8,
                "ci_high": 1.05,
            },
            {
                "group": "fair",
                "label": "d over b",
                "method": "d",
                "speedup": float("nan"),
                "why": "method failed",
            },
        ]
    )


def test_forest_plot_draws_each_row_point_ci_band_and_1x() -> None:
    rows = _forest_rows()
    colors = fig.method_colors(["a", "c", "d"])
    f = fig.draw_forest_plot(rows, "simulated", colors)
    ax = f.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == list(rows["label"])
    ys = [t for t in ax.get_yticks()]
    points = {
        round(float(ln.get_ydata()[0]), 6): float(ln.get_xdata()[0])
        for ln in ax.get_lines()
        if ln.get_marker() == "o"
    }
    whiskers = {
        round(float(ln.get_ydata()[0]), 6): sorted(map(float, ln.get_xdata()))
        for ln in ax.get_lines()
        if ln.get_marker() in ("None", "", None)
        and len(ln.get_xdata()) == 2
        and ln.get_ydata()[0] == ln.get_ydata()[1]
    }
    for y, (_, r) in zip(ys, rows.iterrows()):
        if np.isnan(r["speedup"]):
            assert round(y, 6) not in points
            continue
        assert points[round(y, 6)] == pytest.approx(r["speedup"])
        assert whiskers[round(y, 6)] == pytest.approx([r["ci_low"], r["ci_high"]])
    assert any(t.get_text().strip() == "method failed" for t in ax.texts)
    one = [ln for ln in ax.get_lines() if list(ln.get_xdata()) == [1.0, 1.0]]
    assert one, "no 1x line"
    # the tolerance band spans the claimed value's band; the model band is drawn for the claim row
    band = [c for c in ax.collections if c.get_label() == "claimed value's tolerance band"]
    xs = band[0].get_paths()[0].vertices[:, 0]
    assert (xs.min(), xs.max()) == pytest.approx((2.88 / 1.15, 2.88 * 1.15))
    model = [
        p for p in ax.patches if p.get_alpha() == pytest.approx(0.25)
    ]  # the model band's pale bar
    assert (
        len(model) == 1
        and model[0].get_x() == pytest.approx(2.3)
        and model[0].get_width() == pytest.approx(0.6)
    )
    assert f.get_size_inches()[0] <= fig.MAX_WIDTH_IN


def _png_width(png: bytes) -> int:
    from PIL import Image

    return int(Image.open(io.BytesIO(png)).size[0])


def test_many_variants_stay_within_the_page() -> None:
    """12 methods (10 in paper mode) over 10 baselines on 2 workloads: the speedup figure is drawn
    at most `MAX_WIDTH_IN` wide by its own layout (not squeezed by the backstop), one panel per
    baseline, each axis with at most `MAX_SERIES` methods."""
    methods = [
        "dcp",
        "dcp_inter_pac",
        *[f"dcp_inter_pac(v={i}) (paper mode)" for i in range(9)],
        "dcp_intra (paper mode)",
    ]
    baselines = [
        "bucket_static",
        "packed_static",
        "static_tuned",
        "flexsp_milp",
        "megatron_hybrid_cp",
        "bucket_static(sp=4)",
        *[f"bucket_static(sp=4, d={i}) (paper mode)" for i in range(4)],
    ]
    rows = [
        {
            "workload": w,
            "method": m,
            "baseline": b,
            "speedup": 1.5,
            "ci_low": 1.4,
            "ci_high": 1.6,
            "outcome": "faster",
            "flags": "",
        }
        for w in ("w1", "w2")
        for m in methods
        for b in baselines
    ]
    sp = pd.DataFrame(rows)
    colors = fig.method_colors(methods)
    f = fig.draw_speedup_bars(sp, "simulated", colors)
    assert f.get_size_inches()[0] <= fig.MAX_WIDTH_IN
    visible = [ax for ax in f.axes if ax.get_visible()]
    assert len(visible) == len(baselines)
    for ax in visible:
        assert len({p.get_facecolor() for p in ax.patches}) <= fig.MAX_SERIES
    assert _png_width(fig._png(f)) <= fig.MAX_WIDTH_PX


def test_colours_one_hue_per_family_shades_for_variants() -> None:
    labels = [
        "dcp_inter_pac",
        "dcp_inter_pac (paper mode)",
        "dcp_inter_pac(eject=false) (paper mode)",
        "dcp_inter_pac(sp_rule=largest) (paper mode)",
        "bucket_static",
        "bucket_static(sp=4) (paper mode)",
        "dcp",
    ]
    colors = fig.method_colors(labels)
    assert len({tuple(np.round(c, 6)) for c in colors.values()}) == len(
        labels
    )  # every label its own colour

    def hue(c: object) -> float:
        return colorsys.rgb_to_hls(*mcolors.to_rgb(c))[0]

    fam = {lb: fig.method_family(lb) for lb in labels}
    assert fam["dcp_inter_pac(eject=false) (paper mode)"] == "dcp_inter_pac"
    for a in labels:
        for b in labels:
            assert (abs(hue(colors[a]) - hue(colors[b])) < 0.02) == (fam[a] == fam[b]), (a, b)
    assert fig.method_colors(labels) == colors  # the same labels always get the same colours


def test_long_tables_go_to_the_appendix_with_a_link() -> None:
    doc = Document("t")
    doc.table(pd.DataFrame({"a": range(LONG_TABLE_ROWS + 1)}), "Long one")
    doc.table(pd.DataFrame({"a": range(3)}), "Short one")
    md, page = doc.to_markdown(), doc.to_html()
    body, appendix = md.split("## Appendix: long tables")
    assert "*Long one*: 16 rows, in the [appendix](#table-a1)." in body and "**Short one**" in body
    assert '<a id="table-a1"></a>' in appendix and "**Long one**" in appendix
    assert "<details id='table-a1'>" in page and "href='#table-a1'" in page
    assert page.count("<div class='scroll'><table>") == 2  # every table scrolls in its box


def _page_with(img_px: int, shown_px: int, table_px: int) -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (img_px, 20), "white").save(buf, format="PNG")
    data = base64.b64encode(buf.getvalue()).decode()
    return (
        "<!DOCTYPE html><html><body><div id='answer'>verdict</div><figure "
        f"id='fig-forest_headline'><img style='width:{shown_px}px' "
        f"src='data:image/png;base64,{data}'></figure><table "
        f"style='width:{table_px}px'><tr><td>x</td></tr></table></body></html>"
    )


@needs_chromium
def test_the_layout_check_catches_a_strip_and_an_overflowing_table(tmp_path: Path) -> None:
    """The browser check can fail: a 3,000 px image shown at 1,000 px and a 2,000 px table."""
    bad = tmp_path / "bad.html"
    bad.write_text(_page_with(3000, 1000, 2000))
    problems = layout_problems(measure_page(bad))
    assert any("shown at 1000 px (33% < 60%)" in p for p in problems), problems
    assert any("scrolls sideways" in p for p in problems), problems
    good = tmp_path / "good.html"
    good.write_text(_page_with(1200, 1000, 500))  # 83% of its natural width: fine
    assert layout_problems(measure_page(good)) == []


@needs_chromium
def test_report_renders_with_the_answer_on_the_first_screen(
    claim_report: tuple[Path, dict], tmp_path: Path
) -> None:
    out, summary = claim_report
    m = measure_page(out / "report.html")
    assert layout_problems(m) == []
    assert m["client_width"] == 1400
    # the rendered box names the claim with the verdict the engine gave it, in capitals
    verdict = summary["claims"][0]["verdict"]
    assert f"toy_claim: {verdict.upper()}" in m["verdict_text"], m["verdict_text"]
    assert m["forest"]["top"] > m["verdict"]["bottom"]  # the plot follows the verdict
    shot = screenshot(out / "report.html", tmp_path / "first_screen.png")
    from PIL import Image

    assert Image.open(shot).size == (1400, 1000)


COMMITTED = REPO_ROOT / "reports" / "reproduce" / "report.html"


@needs_chromium
@pytest.mark.skipif(
    not COMMITTED.is_file() or "id='answer'" not in COMMITTED.read_text(errors="replace"),
    reason="the committed reports/reproduce/report.html predates the first-screen layout "
    "(regenerate it with `make reproduce`)",
)
def test_committed_report_renders_with_the_answer_on_the_first_screen() -> None:
    assert layout_problems(measure_page(COMMITTED)) == []
