"""`dcp-bench reproduce claim=NAME`: the claim picks its packaged reproduce config (the default is
the DCP claim's, unchanged), an unknown claim or a missing input is refused in one line before
any work, a section waiting for a method without a config is skipped and said, and a small
`claim=flexsp` runs through the normal machinery with its verdict from the claims engine, checked
here against a ratio and a rule computed independently from the run records."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from dcp_bench.campaign.reproduce import WallClock, check_sections, missing_method, run_sections
from dcp_bench.campaign.reproduce_config import (
    claim_presets,
    load_reproduce_config,
    read_reproduce_yaml,
)
from dcp_bench.cli import main
from dcp_bench.errors import ConfigError
from dcp_bench.paths import REPO_ROOT
from dcp_bench.records import iter_run_dirs, read_steps, read_summary
from dcp_bench.report.claims import compare
from dcp_bench.report.first_screen import claim_line
from dcp_bench.report.tables import cell_table, load_campaign

LENGTHS = Path("/work/shared/data/wikipedia_flexsp_lengths.txt")


def test_each_claim_picks_its_reproduce_config() -> None:
    assert claim_presets() == {"dcp": "default", "flexsp": "flexsp", "flexsp_deepspeed": "flexsp"}
    # claim=dcp is the default reproduction itself: the same config, field by field
    assert load_reproduce_config(["claim=dcp"]) == load_reproduce_config([])
    for name in ("flexsp", "flexsp_deepspeed"):
        cfg = load_reproduce_config([f"claim={name}"])
        assert Path(cfg.path).name == "flexsp.yaml"
        assert (cfg.claims, cfg.out, cfg.campaign) == (
            "results/reference/flexsp_claims.yaml",
            "reports/flexsp",
            "flexsp",
        )
    # the FlexSP list holds both halves of the sentence
    claims = yaml.safe_load((REPO_ROOT / "results/reference/flexsp_claims.yaml").read_text())
    assert claims["claim_files"] == ["../claims/flexsp_deepspeed.yaml", "../claims/flexsp.yaml"]


def test_the_default_reproduction_is_unchanged() -> None:
    cfg = load_reproduce_config([])
    assert Path(cfg.path).name == "default.yaml" and cfg.claims == "results/reference/claims.yaml"
    assert cfg.out == "reports/reproduce" and cfg.steps is None and cfg.required_files == ()
    assert cfg.grid_keys() == [] and all(s.when_method is None for s in cfg.sections)
    # no FlexSP cell is run (nor read) by it: its claims list holds the DCP claim alone
    assert not any("flexsp_wikipedia" in o for sec in cfg.sections for g in sec.grids for o in g)
    claims = yaml.safe_load((REPO_ROOT / cfg.claims).read_text())
    assert claims["claim_files"] == ["../claims/dcp.yaml"]


def test_an_unknown_claim_is_refused_in_one_line_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ConfigError) as err:
        load_reproduce_config(["claim=flexps"])
    assert str(err.value) == (
        "claim='flexps': unknown claim; expected one of dcp, flexsp, flexsp_deepspeed"
    )
    with pytest.raises(ConfigError, match=r"claim='flexsp': picks its own reproduce config"):
        load_reproduce_config(["claim=flexsp", "preset=real"])
    monkeypatch.chdir(tmp_path)
    assert main(["reproduce", "claim=nosuch", f"root={tmp_path / 'runs'}"]) == 2
    err_lines = capsys.readouterr().err.strip().splitlines()
    assert len(err_lines) == 1 and "claim='nosuch': unknown claim" in err_lines[0]
    assert not (tmp_path / "runs").exists()


def test_a_missing_input_file_is_refused_in_one_line(tmp_path: Path) -> None:
    raw = yaml.safe_load((REPO_ROOT / "dcp_bench/conf/reproduce/flexsp.yaml").read_text())
    missing = tmp_path / "nowhere" / "wikipedia_flexsp_lengths.txt"
    raw["required_files"] = [str(missing)]
    path = tmp_path / "flexsp.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError) as err:
        load_reproduce_config([f"config={path}"])
    assert str(err.value).startswith(f"{missing}: not found; this reproduction reads it")
    assert "\n" not in str(err.value)


def test_a_section_waiting_for_a_method_runs_only_once_it_exists(tmp_path: Path) -> None:
    common = ["seed=0", "cluster=cpu", "model=tiny_llama", "workload=sharegpt", "run.steps=1"]
    path = tmp_path / "c.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "campaign": "c",
                "root": str(tmp_path / "runs"),
                "out": str(tmp_path / "out"),
                "repeats": 1,
                "real": False,
                "sections": [
                    {"name": "waits", "when_method": "no_such_method", "common": common,
                     "grids": [["method=no_such_method"]]},
                    {"name": "present", "when_method": "packed_static", "common": common,
                     "grids": [["method=packed_static"]]},
                ],
            }
        )
    )  # fmt: skip
    cfg = read_reproduce_yaml(path)
    assert missing_method(cfg.sections[0]) == "no_such_method"
    assert missing_method(cfg.sections[1]) is None
    # the waiting section is not composed (its method would not compose) and not run
    assert list(check_sections(cfg)) == ["present"]
    done = run_sections(cfg, WallClock(0.0))
    assert (
        "section waits: not judged: no method no_such_method (the section runs once "
        "dcp_bench/conf/method/no_such_method.yaml exists)" in done.notes
    )
    assert done.wanted == ["present"] and not done.cut


def test_a_claim_line_comes_from_the_engines_rows() -> None:
    row = {
        "id": "x_headline",
        "method": "m",
        "baseline": "b",
        "claimed": 1.72,
        "verdict": "undecided",
        "by_cost_source": [
            {"cost_source": "flexsp_fitted", "speedup": 1.66, "ci95": [1.6, 1.7],
             "verdict": "undecided", "note": ""},
            {"cost_source": "analytical", "speedup": None, "ci95": [None, None],
             "verdict": "no data", "note": "no data: baseline not in this campaign"},
        ],
    }  # fmt: skip
    assert claim_line(row) == (
        "**x_headline** (`m` over `b`): 1.66x [1.60, 1.70] simulated under `flexsp_fitted` vs "
        "1.72x claimed: UNDECIDED (the claim's verdict); no data: baseline not in this campaign "
        "under `analytical`."
    )
    for r in row["by_cost_source"]:
        r.update(speedup=None, note="not judged: no method megatron_lm_tuned; more")
    assert claim_line(row) == (
        "**x_headline** (`m` over `b`): not judged: no method megatron_lm_tuned."
    )


def _runs(root: Path) -> list[tuple[dict[str, object], list[float]]]:
    """Every run of the campaign from its own records: (what it was, its step times)."""
    out = []
    for run_dir in iter_run_dirs(root, "flexsp"):
        s = read_summary(run_dir)
        assert s is not None
        steps = [st.step_time_s for st in read_steps(run_dir) if not st.warmup]
        out.append(
            (
                {"method": s.method, "workload": s.workload, "source": s.cost_source,
                 "status": s.status, "config": s.config_hash},
                [float(t) for t in steps],
            )
        )  # fmt: skip
    return out


@pytest.mark.slow
@pytest.mark.skipif(not LENGTHS.is_file(), reason=f"FlexSP's length list is not at {LENGTHS}")
def test_a_small_flexsp_reproduction_takes_its_verdict_from_the_engine(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "report"
    code = main(
        ["reproduce", "claim=flexsp", "steps=2", "sections=flexsp_fitted",
         f"root={tmp_path / 'runs'}", f"out={out}", "--no-progress"]
    )  # fmt: skip
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    claims = {c["id"]: c for c in summary["claims"]}
    ds = claims["flexsp_vs_deepspeed_headline"]
    runs = [
        (r, t)
        for r, t in _runs(tmp_path / "runs")
        if r["workload"] == "flexsp_wikipedia_192k" and r["source"] == "flexsp_fitted"
    ]
    # independently: DeepSpeed at its fastest fixed degree among those that ran every step
    ok_ds = [t for r, t in runs if r["method"] == "deepspeed_ulysses" and r["status"] == "ok"]
    fx = [t for r, t in runs if r["method"] == "flexsp_milp_solver"]
    assert len(ok_ds) >= 1 and len(fx) == 1 and len(fx[0]) == 2
    best = min(ok_ds, key=lambda t: float(np.median(t)))
    ratio = sum(best) / sum(fx[0])
    assert ds["reproduced_value"] == pytest.approx(ratio, rel=1e-12)
    fitted = ds["by_cost_source"][0]
    assert fitted["cost_source"] == "flexsp_fitted"
    assert fitted["speedup"] == pytest.approx(ratio, rel=1e-12)
    assert fitted["pairs"] == 2 and ds["pair_by"] == "step"
    # the analytical section did not run: no number under it, said so
    assert ds["by_cost_source"][1]["speedup"] is None
    # the validation rule, by hand: every simulated system within 15% + 1 s of its published
    # time (192K Wikipedia: DeepSpeed 8.2 s, FlexSP 4.8 s) and the speedup within 15% of 8.2/4.8
    misses = [
        abs(float(np.mean(t)) - pub) > 0.15 * pub + 1.0 for t, pub in ((best, 8.2), (fx[0], 4.8))
    ]
    lo, hi = ds["ci95"]
    band = (1.72 / 1.15, 1.72 * 1.15)
    ci_verdict = (
        "reproduced"
        if band[0] <= lo and hi <= band[1]
        else "not reproduced"
        if hi < band[0] or lo > band[1]
        else "undecided"
    )
    assert ds["ci_verdict"] == ci_verdict
    speedup_miss = abs(ratio / (8.2 / 4.8) - 1) > 0.15
    expected = "undecided" if any(misses) or speedup_miss else ci_verdict
    assert ds["verdict"] == expected
    # Megatron: not judged while no method megatron_lm_tuned exists, in one line
    mg = claims["flexsp_vs_megatron_headline"]
    if not (REPO_ROOT / "dcp_bench/conf/method/megatron_lm_tuned.yaml").is_file():
        assert mg["verdict"] == "no data" and math.isnan(float(mg["speedup"] or math.nan))
        assert "not judged: no method megatron_lm_tuned" in mg["reasons"]
    # the first screen carries one line per claim, the engine's numbers in it
    md = (out / "report.md").read_text()
    line = "- **flexsp_vs_deepspeed_headline** (`flexsp_milp_solver` over `deepspeed_ulysses`): "
    assert f"{line}{ratio:.2f}x" in md
    printed = capsys.readouterr().out
    assert f"flexsp_vs_deepspeed_headline: {ds['verdict'].upper()}" in printed
    # a tuned side whose every setting failed somewhere says so (SP 1 holds no 192K iteration)
    camp = load_campaign(tmp_path / "runs", "flexsp")
    ctx = {"workload": "flexsp_wikipedia_192k", "cluster": "a100x64", "model": "gpt_7b",
           "cost_source": "flexsp_fitted"}  # fmt: skip
    sp1 = {"method": "deepspeed_ulysses", "params": {"sp": 1}, "pick": "fastest"}
    fx_sel = {"method": "flexsp_milp_solver", "pick": "fastest"}
    res = compare(camp, cell_table(camp), ctx, sp1, fx_sel, mem_cap_fraction=None)[0]
    assert res.note == "not judged: every baseline cell (deepspeed_ulysses) failed in some run"


@pytest.mark.skipif(not LENGTHS.is_file(), reason=f"FlexSP's length list is not at {LENGTHS}")
def test_the_flexsp_workload_deals_flexsps_own_iterations() -> None:
    from dcp_bench.config import load_config
    from dcp_bench.errors import WorkloadError
    from dcp_bench.workloads import make_workload
    from dcp_bench.workloads.flexsp_corpus import read_flexsp_corpus

    cfg = load_config(["workload=flexsp_wikipedia_384k", "cluster=a100x64", "model=gpt_7b"])
    wl = make_workload(cfg.workload, seed=7)
    corpus = read_flexsp_corpus("wikipedia", LENGTHS, 384, 64)
    for step in (0, 39):
        got = wl.global_batch(step, 64, 1_048_576)
        # step s is FlexSP's iteration 3 + s: the consecutive slice of 512 kept lengths
        lo = (3 + step) * 512
        assert got.step == step and got.info["flexsp_iteration"] == 3 + step
        assert np.array_equal(got.tokens, corpus.lengths[lo : lo + 512])
        assert np.array_equal(got.sample_ids, np.arange(lo, lo + 512))
    # the seed does not change FlexSP's iterations
    other = make_workload(cfg.workload, seed=0).global_batch(5, 64, 1_048_576)
    assert np.array_equal(other.tokens, wl.global_batch(5, 64, 1_048_576).tokens)
    with pytest.raises(WorkloadError, match="read for 64 GPUs"):
        wl.global_batch(0, 32, 1_048_576)
    assert wl.stats()["n"] == len(corpus.lengths) and wl.stats()["max"] <= 384_000
