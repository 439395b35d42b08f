"""Claims over paper-mode (epoch) runs: the headline is the median of paired per-seed ratios of the
runs the claim names (never of a reading's variant cell), each reading of "what it takes" is the
ratio of its own cells, and the paper-mode table covers every method, workload and cluster."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dcp_bench.campaign.sweep import plan_sweep, run_sweep
from dcp_bench.records import iter_summaries
from dcp_bench.reference import unit_of_label
from dcp_bench.report.claims import evaluate_claims, select_cells
from dcp_bench.report.tables import cell_table, load_campaign

CLAIMS = {
    "statistics": {"max_relative_half_width": 0.05},
    "claims": [
        {
            "id": "headline",
            "statement": "x",
            "value": 2.88,
            "tolerance": 0.15,
            "context": {
                "workload": "videosys_mix_long",
                "cluster": "h200x8",
                "model": "stdit3_xl2",
            },
            "baseline": {
                "method": "bucket_static",
                "mode": "paper",
                "params": {"sp": 4, "recompute": "full"},
            },
            "method": {"method": "dcp_inter_pac", "mode": "paper"},
        }
    ],
    "readings": [
        {"question": "barrier", "reading": "every deal", "headline": True},
        {
            "question": "barrier",
            "reading": "one plan per epoch",
            "baseline": {"params": {"deals_per_iteration": 0}},
        },
        {
            "question": "unit",
            "reading": "per step",
            "baseline": {"unit": "step"},
            "method": {"unit": "step"},
        },
    ],
    "paper_table": {
        "methods": [{"method": "dcp_inter_pac", "mode": "paper"}],
        "workloads": ["videosys_mix_long"],
        "clusters": ["h200x8"],
    },
}


@pytest.fixture(scope="module")
def campaign(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("claims") / "runs"
    base = [
        "workload=videosys_mix_long",
        "cluster=h200x8",
        "model=stdit3_xl2",
        "method.mode=paper",
        "run.planner_clock=off",
        f"run.root={root}",
        "run.campaign=c",
        "run.steps=2",
        "run.warmup_steps=0",
    ]
    bs = ["method=bucket_static", "method.sp=4", "method.recompute=full"]
    specs = plan_sweep([*base, *bs], repeats=5)
    specs += plan_sweep([*base, *bs, "method.deals_per_iteration=0"], repeats=5)
    specs += plan_sweep([*base, "method=dcp_inter_pac"], repeats=5)
    specs += plan_sweep([*base, *bs, "run.unit=step"], repeats=5)
    specs += plan_sweep([*base, "method=dcp_inter_pac", "run.unit=step"], repeats=5)
    run_sweep(specs, progress=False, env={"cpu_model": "test"}, jobs=2)
    return root


def _ratios(root: Path, baseline: dict[str, object]) -> float:
    thr: dict[tuple[str, int, str], float] = {}
    for s in iter_summaries(root, "c"):
        key = (
            "deals0"
            if s.context is not None
            and any("deals_per_iteration=0" in o for o in s.context.overrides)
            else ""
        )
        thr[(s.method + key, s.seed, "epoch" if s.epochs else "step")] = s.tokens_per_s  # type: ignore[assignment]
    b_name, unit = str(baseline["name"]), str(baseline["unit"])
    return float(
        np.median([thr[("dcp_inter_pac", k, unit)] / thr[(b_name, k, unit)] for k in range(5)])
    )


def test_headline_and_readings_come_from_their_own_cells(campaign: Path) -> None:
    c = load_campaign(campaign, "c")
    cells = cell_table(c)
    results = evaluate_claims(c, cells, CLAIMS, n_boot=500)
    head = results[0].to_summary()
    assert head["speedup"] == pytest.approx(
        _ratios(campaign, {"name": "bucket_static", "unit": "epoch"})
    )
    assert head["pairs"] == 5 and head["unit"] == "epoch" and head["measured_steps_per_run"] > 1
    assert "dealing of the fixed dataset" in head["ci_covers"]
    rows = {r["reading"]: r for r in head["what_it_takes"]}
    assert rows["every deal"]["speedup"] == pytest.approx(head["speedup"])
    assert rows["one plan per epoch"]["speedup"] == pytest.approx(
        _ratios(campaign, {"name": "bucket_staticdeals0", "unit": "epoch"})
    )
    assert rows["per step"]["speedup"] == pytest.approx(
        _ratios(campaign, {"name": "bucket_static", "unit": "step"})
    )
    assert [r["method"] for r in head["paper_mode_table"]][0].startswith("bucket_static")
    assert head["paper_mode_table"][1]["speedup"] == pytest.approx(head["speedup"])


def test_selection_prefers_default_parameters_and_the_epoch_loop(campaign: Path) -> None:
    cells = cell_table(load_campaign(campaign, "c"))
    ctx = CLAIMS["claims"][0]["context"]  # type: ignore[index]
    picked = select_cells(
        cells, ctx, {"method": "bucket_static", "mode": "paper", "params": {"sp": 4}}
    )
    assert len(picked) == 1 and unit_of_label(picked.iloc[0]["label"]) == "epoch"
    assert '"deals_per_iteration": 1' in picked.iloc[0]["params"]
    step = select_cells(cells, ctx, {"method": "bucket_static", "mode": "paper", "unit": "step"})
    assert len(step) == 1 and "paper mode, per step" in step.iloc[0]["label"]


def test_reproduce_headline_sensitivity_and_readings_share_seeds_and_epochs() -> None:
    """The shipped reproduction: every paper-mode section uses the headline's seeds, epochs and
    (no) noise, so the sensitivity and readings rows have the headline's runs as their reference."""
    from dcp_bench.campaign.reproduce_config import load_reproduce_config

    cfg = load_reproduce_config([])
    sections = {s.name: s for s in cfg.sections}
    epoch_sections = ["claim", "sensitivity", "readings", "paper_h200", "paper_h100"]
    commons = [sections[n].common for n in epoch_sections]
    assert all(c == commons[0] for c in commons)
    assert "run.noise.jitter_sigma=0.0" in commons[0] and "method.mode=paper" in commons[0]
    assert sections["claim"].repeats_in(cfg) == sections["sensitivity"].repeats_in(cfg) >= 5
    # Every sensitivity grid is a headline grid plus one constant's factors.
    claim_grids = [sorted(g) for g in sections["claim"].grids]
    for grid in sections["sensitivity"].grids:
        base = sorted(g for g in grid if not g.startswith(("++cost.scales.", "mem_cap_fraction=")))
        assert base in claim_grids, grid
