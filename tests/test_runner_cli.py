"""The sweep / report / reproduce commands: argument handling and their one-line errors."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from dcp_bench.campaign.reproduce_config import load_reproduce_config
from dcp_bench.campaign.sweep import plan_sweep
from dcp_bench.cli import main
from dcp_bench.errors import ConfigError

sys.path.insert(0, str(Path(__file__).resolve().parent))
from runner_doubles import write_toy_conf  # noqa: E402


def test_sweep_dry_run_lists_every_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    conf = write_toy_conf(tmp_path / "conf")
    ovs = [
        f"extra_conf={conf}",
        "workload=toy",
        "method=toy_static,toy_greedy",
        "cluster=h200x8",
        "model=tiny_llama",
        "run.repeats=3",
        f"run.root={tmp_path / 'runs'}",
        "run.campaign=c",
    ]
    assert main(["sweep", *ovs, "--dry-run"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    expect = [s.run_id for s in plan_sweep(ovs)]
    assert [ln.split()[1] for ln in lines] == expect and all(ln.startswith("todo") for ln in lines)


def test_report_of_empty_campaign_is_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", "campaign=nothing", f"root={tmp_path}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "nothing" in err and "\n" not in err
    assert main(["report", "colour=blue"]) == 2
    assert "colour=blue" in capsys.readouterr().err


def test_reproduce_config_defaults_and_overrides() -> None:
    cfg = load_reproduce_config(["budget_s=100", "repeats=3", "real=false", "sections=claim,text"])
    assert cfg.budget_s == 100.0 and cfg.repeats == 3 and cfg.real is False
    assert cfg.only_sections == ("claim", "text")
    assert [s.name for s in cfg.chosen_sections()] == ["claim", "text"]
    names = [s.name for s in cfg.sections]
    assert names[0] == "claim" and "real_cpu" in names and "sensitivity" in names
    with pytest.raises(ConfigError):
        load_reproduce_config(["speed=fast"])


@pytest.mark.slow
def test_reproduce_grids_compose() -> None:
    """Every grid of the shipped reproduce config composes (names valid workloads, methods,
    clusters and models), so `make reproduce` cannot fail on a typo."""
    cfg = load_reproduce_config([])
    for section in cfg.sections:
        for grid in section.grids:
            specs = plan_sweep([*section.common_in(cfg), *grid], repeats=1)
            assert specs, (section.name, grid)
