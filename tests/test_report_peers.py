"""The peer table (dcp_bench/report/peers.py) against hand-computed tables and against the run
records of a real (small, simulated) sweep."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from dcp_bench.campaign.sweep import plan_sweep, run_sweep
from dcp_bench.records import iter_run_dirs, read_steps, read_summary
from dcp_bench.report.document import Document
from dcp_bench.report.peers import cell_text, failure_kind, peer_matrix, peer_section, peer_table
from dcp_bench.report.tables import load_campaign


def run_row(
    method: str, seed: int, status: str = "ok", step: float = 2.0, bound: float = 1.0, **kw
):
    row = {
        "run_id": (
            f"{method}-{seed}-{kw.get('world_size', 8)}-"
            f"{kw.get('mode', 'fair')}-{kw.get('params', '')}"
        ),
        "status": status,
        "error": kw.pop("error", None),
        "executor": "sim",
        "method": method,
        "label": method,
        "mode": "fair",
        "params": "{}",
        "workload": "prolong",
        "cluster": "h200x8",
        "world_size": 8,
        "model": "llama3_8b",
        "seed": seed,
        "scales": "{}",
        "mem_cap_fraction": 0.7,
        "step_time_s": step if status == "ok" else None,
        "lower_bound_s": bound if status == "ok" else None,
        "planner_ms": 1.0,
        "n_steps": 2 if status == "ok" else 0,
        "cost_source": "analytical",
    }
    row.update(kw)
    return row


def test_failure_kinds_from_status_and_error():
    assert failure_kind("ok", None) is None
    assert failure_kind("oom", "step 0: peak memory over ...") == "oom"
    assert failure_kind("timeout", "run exceeded ...") == "timeout"
    assert (
        failure_kind("error", "InfeasibleError: a sample of 984223 tokens fits no SP degree")
        == "infeasible"
    )
    assert failure_kind("error", "PlanError: sample 3 twice") == "error"


def test_peer_table_by_hand():
    """Ratios, medians over repeats, failure counts and what is left out, computed by hand."""
    runs = pd.DataFrame(
        [
            run_row("dcp", 0, step=10.2, bound=10.0),
            run_row("dcp", 1, step=11.0, bound=10.0),
            run_row("dcp", 2, step=10.4, bound=10.0),
            run_row(
                "megatron_hybrid_cp", 0, status="error", error="InfeasibleError: no CP size fits"
            ),
            run_row("megatron_hybrid_cp", 1, step=30.0, bound=10.0),
            run_row(
                "megatron_hybrid_cp",
                2,
                status="oom",
                error="step 1: peak memory over the GPU's usable memory",
            ),
            run_row("flexsp_milp", 0, status="timeout", error="run exceeded run.timeout_s=900"),
            # left out: a paper-mode run and a sensitivity variant
            run_row("dcp", 0, step=1.0, bound=10.0, mode="paper"),
            run_row("dcp", 0, step=1.0, bound=10.0, scales=json.dumps({"act_bytes": 2.0})),
            # another GPU count is another row
            run_row("dcp", 0, step=12.0, bound=10.0, world_size=32, cluster="h200x32"),
        ]
    )
    t = peer_table(runs).set_index(["world_size", "method"])
    dcp = t.loc[(8, "dcp")]
    assert dcp["runs"] == 3 and dcp["ok"] == 3
    assert dcp["step_over_bound"] == pytest.approx(1.04)
    assert (dcp["step_over_bound_min"], dcp["step_over_bound_max"]) == pytest.approx((1.02, 1.10))
    assert dcp["steps"] == 6  # two measured steps per run
    assert sum(dcp[k] for k in ("oom", "infeasible", "timeout", "error")) == 0
    meg = t.loc[(8, "megatron_hybrid_cp")]
    assert (meg["runs"], meg["ok"], meg["infeasible"], meg["oom"], meg["timeout"]) == (
        3,
        1,
        1,
        1,
        0,
    )
    assert meg["step_over_bound"] == pytest.approx(3.0)
    flex = t.loc[(8, "flexsp_milp")]
    assert flex["ok"] == 0 and flex["timeout"] == 1 and math.isnan(flex["step_over_bound"])
    assert t.loc[(32, "dcp")]["step_over_bound"] == pytest.approx(1.2)
    assert list(peer_table(runs)["method"])[:1] == ["dcp"]  # ours first

    wide = peer_matrix(peer_table(runs)).set_index("GPUs")
    assert wide.loc[8, "dcp"] == "1.040"
    assert wide.loc[8, "megatron_hybrid_cp"] == "3.000 (1 oom, 1 infeasible)"
    assert wide.loc[8, "flexsp_milp"] == "timeout 1/1"
    assert wide.loc[32, "megatron_hybrid_cp"] == "-"


def test_per_step_bounds_are_used_when_recorded():
    runs = pd.DataFrame([run_row("dcp", 0, step=10.5, bound=10.0)])
    steps = pd.DataFrame(
        {
            "run_id": [runs["run_id"][0]] * 3,
            "step_time_s": [10.0, 12.0, 11.0],
            "lower_bound_s": [10.0, 10.0, 10.0],
        }
    )
    row = peer_table(runs, steps).iloc[0]
    assert row["step_over_bound"] == pytest.approx(1.1)
    assert (row["step_over_bound_min"], row["step_over_bound_max"], row["steps"]) == pytest.approx(
        (1.0, 1.2, 3)
    )


def test_two_configurations_of_one_method_are_told_apart():
    runs = pd.DataFrame(
        [
            run_row(
                "bucket_static", 0, step=20.0, params=json.dumps({"sp": 4, "recompute": "full"})
            ),
            run_row(
                "bucket_static", 0, step=30.0, params=json.dumps({"sp": 8, "recompute": "full"})
            ),
        ]
    )
    t = peer_table(runs)
    assert sorted(t["method"]) == ["bucket_static(sp=4)", "bucket_static(sp=8)"]


def test_cell_text_spells_out_failures():
    base = {
        "runs": 3,
        "ok": 3,
        "step_over_bound": 1.0234,
        "oom": 0,
        "infeasible": 0,
        "timeout": 0,
        "error": 0,
    }
    assert cell_text(pd.Series(base)) == "1.023"
    assert (
        cell_text(pd.Series({**base, "ok": 0, "step_over_bound": math.nan, "infeasible": 3}))
        == "infeasible 3/3"
    )
    assert (
        cell_text(pd.Series({**base, "ok": 0, "step_over_bound": math.nan, "oom": 1, "timeout": 2}))
        == "failed: 1 oom, 2 timeout"
    )


def test_peer_table_from_the_records_of_a_sweep(tmp_path: Path):
    """A small simulated sweep through the runner (one cell infeasible by construction: a static
    SP degree of 1 without recompute for 16K-token sequences): the table's ratios equal each
    run's step time over its bound as the run records hold them, and the failure is counted."""
    common = [
        "workload=synthetic_fixed",
        "workload.tokens_per_gpu=32768",
        "model=llama3_8b",
        "cluster=h200x8",
        "run.steps=2",
        "run.warmup_steps=0",
        "run.campaign=peers_test",
        f"run.root={tmp_path}",
    ]
    specs = plan_sweep([*common, "method=dcp,static_tuned"], repeats=2)
    specs += plan_sweep(
        [*common, "method=bucket_static", "method.sp=1", "method.recompute=none"], repeats=1
    )
    res = run_sweep(specs, resume=False, jobs=1, progress=False, isolate=False)
    assert len(res.ran) == 5
    campaign = load_campaign(tmp_path, "peers_test")
    t = peer_table(campaign.runs, campaign.steps).set_index("method")
    for method in ("dcp", "static_tuned"):
        ratios = []
        for run_dir in iter_run_dirs(tmp_path, "peers_test"):
            s = read_summary(run_dir)
            if s is not None and s.method == method:
                ratios += [
                    st.step_time_s / st.lower_bound_s for st in read_steps(run_dir) if not st.warmup
                ]
        row = t.loc[method]
        assert row["ok"] == 2 and row["steps"] == 4
        # per run: median step / median bound; the records' per-step ratios bracket it
        assert min(ratios) * (1 - 1e-9) <= row["step_over_bound"] <= max(ratios) * (1 + 1e-9)
        assert row["step_over_bound"] >= 1.0
    # A method run with overridden settings is labelled by them (the report's method names).
    static = [m for m in t.index if m.startswith("bucket_static")]
    assert len(static) == 1 and "sp=1" in static[0]
    assert t.loc[static[0], "infeasible"] == 1 and t.loc[static[0], "ok"] == 0
    doc = Document("t")
    peer_section(doc, SimpleNamespace(campaign=campaign))
    md = doc.to_markdown()
    assert "Every method against the lower bound" in md and "infeasible 1/1" in md


def test_idle_share_is_shown_beside_step_over_bound():
    """A plan at its bound can leave most of the machine idle (one long document sets the bound):
    the cell says so beside the ratio, from the steps' idle share (``imbalance``)."""
    runs = pd.DataFrame([{**run_row("dcp", 0, step=10.0, bound=10.0), "imbalance": 0.5}])
    steps = pd.DataFrame(
        {
            "run_id": [runs["run_id"][0]] * 3,
            "step_time_s": [10.0, 10.0, 10.0],
            "lower_bound_s": [10.0, 10.0, 10.0],
            "imbalance": [0.30, 0.43, 0.13],
        }
    )
    row = peer_table(runs, steps).iloc[0]
    assert row["step_over_bound"] == pytest.approx(1.0)
    assert row["idle_share"] == pytest.approx(0.30)  # the steps' median, not the run's 0.5
    assert cell_text(row) == "1.000, idle 30%"
    # without per-step records, the runs' medians
    assert peer_table(runs).iloc[0]["idle_share"] == pytest.approx(0.5)
    assert peer_matrix(peer_table(runs)).iloc[0]["dcp"] == "1.000, idle 50%"
