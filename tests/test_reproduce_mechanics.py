"""`dcp-bench reproduce` mechanics on a toy config: the report replaces ``out`` only when it is
complete, an unknown section is refused before anything runs, and a section's budget cuts a
running run, which is recorded as ``timeout`` and named in the report's notes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from dcp_bench.cli import main
from dcp_bench.records import iter_summaries

sys.path.insert(0, str(Path(__file__).resolve().parent))
from runner_doubles import write_toy_conf  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def _config(
    tmp_path: Path,
    sleep_s: float = 0.0,
    section_budget: float | None = None,
    claims: Path = REPO / "results" / "reference" / "claims.yaml",
) -> tuple[Path, Path]:
    conf = write_toy_conf(tmp_path / "conf", sleep_s=sleep_s)
    out = tmp_path / "reports" / "toy"
    cfg = {
        "campaign": "toy",
        "root": str(tmp_path / "runs"),
        "out": str(out),
        "claims": str(claims),
        # no whole-command budget (the default): a loaded host makes these tests slower, never
        # cut; the cut test below sets section budgets of its own
        "jobs": 1,
        "repeats": 1,
        "real": False,
        "sim_common": ["run.warmup_steps=0", "run.steps=2", "run.planner_clock=off"],
        "sections": [
            {
                "name": "toy",
                "title": "toy",
                "budget_s": section_budget,
                "grids": [
                    [
                        f"extra_conf={conf}",
                        "workload=toy",
                        "cluster=h200x8",
                        "model=tiny_llama",
                        "method=toy_static,toy_greedy",
                    ]
                ],
            },
            {
                "name": "other",
                "title": "other",
                "budget_s": None,
                "grids": [
                    [
                        f"extra_conf={conf}",
                        "workload=toy",
                        "cluster=h200x16",
                        "model=tiny_llama",
                        "method=toy_greedy",
                    ]
                ],
            },
        ],
    }
    path = tmp_path / "reproduce.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path, out


def _stale_report(out: Path) -> None:
    (out / "figures").mkdir(parents=True)
    (out / "figures" / "stale.png").write_bytes(b"old figure")
    (out / "report.md").write_text("the previous report\n")


def test_report_replaces_out_only_when_complete(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    bad_claims = tmp_path / "claims.yaml"
    bad_claims.write_text(
        "claims:\n  - id: broken\n"
    )  # no value: the report fails after the sweeps
    config, out = _config(tmp_path, claims=bad_claims)
    _stale_report(out)
    assert main(["reproduce", f"config={config}", "--no-progress"]) == 2
    assert "broken" in capsys.readouterr().err
    assert (out / "report.md").read_text() == "the previous report\n"  # untouched
    assert (out / "figures" / "stale.png").exists()
    assert [p.name for p in out.parent.iterdir()] == ["toy"]  # no temporary folder left behind

    config, out = _config(tmp_path)
    assert main(["reproduce", f"config={config}", "--no-progress"]) == 0
    assert "the previous report" not in (out / "report.md").read_text()
    assert not (out / "figures" / "stale.png").exists()  # a fresh folder: nothing stale survives
    assert [p.name for p in out.parent.iterdir()] == ["toy"]
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["report"]) == {"md", "html"}
    for key, name in (("md", "report.md"), ("html", "report.html")):
        # where the file lives (not the temporary folder), never as an absolute local path
        shown = summary["report"][key]
        assert shown.endswith(f"/{name}") and not shown.startswith("/") and "partial" not in shown
    assert f"report: {out / 'report.md'}" in capsys.readouterr().out


def test_unknown_section_runs_nothing_and_keeps_the_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    config, out = _config(tmp_path)
    _stale_report(out)
    assert main(["reproduce", f"config={config}", "sections=toy,nosuch"]) == 2
    err = capsys.readouterr().err.strip()
    assert "'nosuch'" in err and "toy, other" in err and "\n" not in err
    assert (out / "report.md").read_text() == "the previous report\n"
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow  # waits out a section budget on real runs
def test_section_budget_cuts_running_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every toy step plans for 600 s; each section has 10 s (its runs start within it even on a
    loaded host, and end long before they would finish). The first section's running run is cut and
    recorded as a timeout naming the budget (a cut, not a failure), the rest of it is listed as
    left out, and the next section still gets its turn. The reproduction is incomplete: it says
    so, exits 4, writes its report beside ``out`` and leaves the complete report in ``out``."""
    monkeypatch.chdir(REPO)
    config, out = _config(tmp_path, sleep_s=600.0, section_budget=10.0)
    cfg = yaml.safe_load(config.read_text())
    cfg["sections"][1]["budget_s"] = 10.0
    config.write_text(yaml.safe_dump(cfg))
    _stale_report(out)
    assert main(["reproduce", f"config={config}", "--no-progress"]) == 4
    stdout = capsys.readouterr().out
    assert (
        "section toy: CUT: 1 run(s) now, 0 already complete, 0 failed, 1 cut by the time budget, "
        "1 left out by the time budget"
    ) in stdout
    assert "section other: CUT: 1 run(s) now" in stdout
    assert "verdict: incomplete: 0 of 2 sections, rerun `make reproduce` to resume" in stdout
    assert "REPRODUCED" not in stdout and "failed run" not in stdout
    runs = list(iter_summaries(tmp_path / "runs", "toy"))
    assert len(runs) == 2 and {r.status for r in runs} == {"timeout"}
    assert all(r.cut_by_budget and "the time budget" in (r.error or "") for r in runs)
    # the last complete report stands; the incomplete one is beside it
    assert (out / "report.md").read_text() == "the previous report\n"
    assert (out / "figures" / "stale.png").exists()
    partial = out.parent / "toy.partial"
    summary = json.loads((partial / "summary.json").read_text())
    assert summary["completeness"] == {
        "complete": False,
        "sections_done": 0,
        "sections_total": 2,
        "cut": ["toy", "other"],
    }
    assert summary["notes"][0].startswith("completeness: incomplete: 0 of 2 sections")
    assert not any("failed run" in n for n in summary["notes"])
    assert any("cut or left out by the budget" in n for n in summary["notes"])
    assert sorted(p.name for p in out.parent.iterdir()) == ["toy", "toy.partial"]


def test_a_complete_reproduction_says_so_from_another_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    config, out = _config(
        tmp_path, claims=Path("results/reference/claims.yaml")
    )  # relative: found in the repository
    monkeypatch.chdir(tmp_path)
    assert main(["reproduce", f"config={config}", "--no-progress", "sections=toy"]) == 0
    stdout = capsys.readouterr().out
    assert "verdict: complete" in stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["completeness"] == {
        "complete": True,
        "sections_done": 1,
        "sections_total": 1,
        "cut": [],
    }


def test_unwritable_out_is_refused_before_any_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    config, _ = _config(tmp_path)
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    assert main(["reproduce", f"config={config}", f"out={blocker / 'report'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "out=" in err and "a_file" in err and "\n" not in err
    assert not (tmp_path / "runs").exists()
