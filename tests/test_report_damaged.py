"""`dcp-bench report` on a campaign holding damaged records: the report is written, skipping
each bad record, naming it and counting it (issue 15, item 4). The records layer reads a damaged
record as one `RecordError` naming the file; the report (dcp_bench/report/) catches it per run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from dcp_bench.campaign.sweep import plan_sweep, run_sweep
from dcp_bench.cli import main
from dcp_bench.records import RecordError, read_steps, read_summary

sys.path.insert(0, str(Path(__file__).resolve().parent))
from runner_doubles import toy_assemble, write_toy_conf  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def _campaign(tmp_path: Path) -> list:  # type: ignore[type-arg]
    conf = write_toy_conf(tmp_path / "conf")
    specs = plan_sweep(
        [
            f"extra_conf={conf}",
            "workload=toy",
            "method=toy_static,toy_greedy",
            "cluster=h200x8",
            "model=tiny_llama",
            "run.steps=2",
            "run.warmup_steps=1",
            f"run.root={tmp_path / 'runs'}",
            "run.campaign=dmg",
        ],
        repeats=2,
    )
    run_sweep(specs, build=toy_assemble, progress=False, env={})
    return specs


def _cut(path: Path, keep: float) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


@pytest.mark.parametrize("name,keep", [("run.json", 0.5), ("steps.jsonl", 0.7)])
def test_damaged_record_reads_as_one_error_naming_the_file(
    tmp_path: Path, name: str, keep: float
) -> None:
    specs = _campaign(tmp_path)
    run_dir = Path(specs[0].root) / "dmg" / specs[0].run_id
    _cut(run_dir / name, keep)
    with pytest.raises(RecordError) as info:
        read_summary(run_dir) if name == "run.json" else read_steps(run_dir)
    assert str(run_dir / name) in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("name,keep", [("run.json", 0.5), ("steps.jsonl", 0.7)])
def test_report_skips_names_and_counts_a_damaged_record(
    tmp_path: Path, name: str, keep: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    specs = _campaign(tmp_path)
    bad = specs[0].run_id
    _cut(Path(specs[0].root) / "dmg" / bad / name, keep)
    out = tmp_path / "report"
    assert main(["report", "campaign=dmg", f"root={tmp_path / 'runs'}", f"out={out}"]) == 0
    text = (out / "report.md").read_text()
    assert bad in text and name in text
    summary = (out / "summary.json").read_text()
    assert bad in summary


def test_a_run_the_budget_cut_is_left_out_not_counted_as_a_failure(tmp_path: Path) -> None:
    """A run recorded as a timeout because a sweep's time budget ran out (extra.limit "budget")
    is the harness's shortfall, not the method's: it is named and left out of every statistic;
    a timeout of the run's own limit stays a failure."""
    import json

    from dcp_bench.report.tables import load_campaign

    specs = _campaign(tmp_path)
    for spec, limit in ((specs[0], "budget"), (specs[1], None)):
        path = Path(spec.root) / "dmg" / spec.run_id / "run.json"
        data = json.loads(path.read_text())
        data["status"], data["step_time_s"] = "timeout", None
        data["context"]["limit"] = limit
        path.write_text(json.dumps(data))
    c = load_campaign(tmp_path / "runs", "dmg")
    assert c.cut_by_budget == [specs[0].run_id]
    assert specs[0].run_id not in set(c.runs["run_id"])
    assert c.runs.set_index("run_id").loc[specs[1].run_id, "status"] == "timeout"


def _edit_json(path: Path, **changes) -> None:  # type: ignore[no-untyped-def]
    import json

    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def _edit_first_step(path: Path, **changes) -> None:  # type: ignore[no-untyped-def]
    import json

    lines = path.read_text().splitlines()
    first = json.loads(lines[0])
    first.update(changes)
    path.write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")


def _edit_config(path: Path, **changes) -> None:  # type: ignore[no-untyped-def]
    import yaml

    data = yaml.safe_load(path.read_text())
    data.update(changes)
    path.write_text(yaml.safe_dump(data))


# Records that parse but hold the wrong types (issue 27, finding 3): (file, edit, what is named).
WRONG_TYPES = {
    "step_time_s a string": (
        "run.json",
        lambda d: _edit_json(d / "run.json", step_time_s="fast"),
        "step_time_s",
    ),
    "context a string": (
        "run.json",
        lambda d: _edit_json(d / "run.json", context="oops"),
        "context",
    ),
    "seed a float": ("run.json", lambda d: _edit_json(d / "run.json", seed=1.5), "seed"),
    "method a list in config.yaml": (
        "config.yaml",
        lambda d: _edit_config(d / "config.yaml", method=[1, 2]),
        "method",
    ),
    "a step's extra not an object": (
        "steps.jsonl",
        lambda d: _edit_first_step(d / "steps.jsonl", extra=[1]),
        "extra",
    ),
    "a step's busy_s holding a string": (
        "steps.jsonl",
        lambda d: _edit_first_step(d / "steps.jsonl", busy_s=["x"]),
        "busy_s",
    ),
}


@pytest.mark.parametrize("case", list(WRONG_TYPES))
def test_report_skips_names_and_counts_a_record_of_the_wrong_types(
    tmp_path: Path, case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    monkeypatch.chdir(REPO)
    specs = _campaign(tmp_path)
    bad = specs[0].run_id
    name, edit, field = WRONG_TYPES[case]
    edit(Path(specs[0].root) / "dmg" / bad)
    out = tmp_path / "report"
    assert main(["report", "campaign=dmg", f"root={tmp_path / 'runs'}", f"out={out}"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    skipped = {s["run_id"]: s["why"] for s in summary["skipped_records"]}
    assert list(skipped) == [bad]
    assert name in skipped[bad] and field in skipped[bad]
    assert summary["runs"] == len(specs) - 1  # the others are all read


def test_report_and_sweep_share_one_damaged_record_rule(tmp_path: Path) -> None:
    """A run whose steps.jsonl was emptied under a run.json that counts its steps: the sweep's
    resume calls it damaged (and redoes it), and the report skips it as damaged too, naming the
    same problem, rather than counting its summary as a good run."""
    from dcp_bench.campaign.sweep import pending
    from dcp_bench.report.tables import load_campaign

    specs = _campaign(tmp_path)
    bad = specs[0]
    (Path(bad.root) / "dmg" / bad.run_id / "steps.jsonl").write_text("")
    warned: list[str] = []
    todo, result = pending(specs, resume=True, retry_failed=False, warn=warned.append)
    assert [s.run_id for s in todo] == [bad.run_id]
    assert [run_id for run_id, _ in result.damaged] == [bad.run_id]
    c = load_campaign(tmp_path / "runs", "dmg")
    assert [run_id for run_id, _ in c.skipped] == [bad.run_id]
    assert bad.run_id not in set(c.runs["run_id"])
    (problem,) = [why for _, why in c.skipped]
    assert "measured step(s), steps.jsonl holds 0" in problem
    assert "measured step(s), steps.jsonl holds 0" in result.damaged[0][1]
