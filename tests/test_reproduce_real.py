"""The real-hardware reproduction preset (`dcp-bench reproduce preset=real cluster=h200x32`) and
its CPU twin (`preset=real_cpu`): the presets compose into torch-executor runs only (no simulated
twins), the twin mirrors the real preset's sections, methods and modes with tiny models, and the
twin runs end to end on 4 gloo ranks into a report titled "measured" whose claim is computed from
the measured runs (`slow`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dcp_bench.campaign.reproduce_config import load_reproduce_config
from dcp_bench.campaign.sweep import plan_sweep
from dcp_bench.cli import main
from dcp_bench.records import read_steps, read_summary


def _specs(preset: str, *overrides: str) -> dict[str, list[Any]]:
    cfg = load_reproduce_config([f"preset={preset}", *overrides])
    out = {}
    for sec in cfg.sections:
        specs = []
        for grid in sec.grids:
            base = [*(sec.common or ()), *grid, *cfg.grid_keys()]
            specs += plan_sweep([*base, "run.executor=torch"], repeats=1, sweep=sec.name)
        out[sec.name] = specs
        assert sec.real and sec.simulate is False  # measured only
    return out


def _shape(specs: dict[str, list[Any]]) -> dict[str, list[tuple[str, str, str]]]:
    return {
        name: sorted((s.method_name, s.mode, s.workload_name) for s in ss)
        for name, ss in specs.items()
    }


def test_real_preset_trains_the_claim_on_the_named_cluster() -> None:
    specs = _specs("real", "cluster=h200x8")
    claim = specs["claim"]
    assert {s.model.name for s in claim} == {"stdit3_xl2"} and {s.workload_name for s in claim} == {
        "videosys_zipf"
    }
    assert {(s.method_name, s.mode) for s in claim} == {
        ("bucket_static", "paper"),
        ("bucket_static", "fair"),
        ("dcp_inter_pac", "paper"),
        ("dcp_inter_pac", "fair"),
        ("dcp", "fair"),
    }
    assert {s.model.name for s in specs["text"]} == {"llama3_8b"}
    for s in (*claim, *specs["text"]):
        assert s.executor == "torch" and s.cluster.name == "h200x8" and s.world_size == 8
    # the preset's own default cluster is the claim's
    assert {s.cluster.name for s in _specs("real")["claim"]} == {"h200x32"}


def test_multi_node_keys_reach_every_run() -> None:
    specs = _specs("real", "nnodes=4", "rdzv_endpoint=node001:29500")
    for s in specs["claim"]:
        assert s.train.nnodes == 4 and s.train.torchrun_args[:2] == ("--nnodes", "4")


def test_cpu_twin_mirrors_the_real_preset() -> None:
    real, twin = _specs("real"), _specs("real_cpu")
    assert _shape(real) == _shape(twin)
    models = {"stdit3_xl2": "tiny_stdit", "llama3_8b": "tiny_llama"}
    for name in real:
        assert sorted(models[s.model.name] for s in real[name]) == sorted(
            s.model.name for s in twin[name]
        )
        assert all(s.cluster.name == "cpu" and s.world_size == 4 for s in twin[name])


def test_paper_runs_use_the_reference_epoch_on_gpus_and_steps_in_the_cpu_twin() -> None:
    real, twin = _specs("real")["claim"], _specs("real_cpu")["claim"]
    assert {s.unit for s in real if s.mode == "paper"} == {"epoch"}
    assert {s.unit for s in twin} == {"step"}  # why: dcp_bench/conf/reproduce/real_cpu.yaml


@pytest.mark.slow
@pytest.mark.dist
@pytest.mark.timeout(600)
def test_the_reference_epoch_loop_trains_for_real(tmp_path: Path) -> None:
    """One small epoch of the reference's loop on 4 gloo ranks: every dealt iteration is one
    measured step of the torch executor, and the record carries the epoch's accounting."""
    rc = main(
        [
            "train",
            "workload=videosys_zipf",
            "model=tiny_stdit",
            "method=bucket_static",
            "method.sp=4",
            "method.recompute=full",
            "method.mode=paper",
            "nproc=4",
            "timeout_s=400",
            "workload.length_scale=64",
            "workload.tokens_per_gpu=32768",
            "workload.data_size=40",
            "mem_cap_fraction=0.1",
            f"root={tmp_path}",
        ]
    )
    assert rc == 0
    (run,) = (tmp_path / "train").glob("*/run.json")
    s = read_summary(run.parent)
    assert s is not None and s.status == "ok" and s.executor == "torch", s and s.error
    assert s.epochs is not None
    info = s.epochs.epoch_info[0]
    assert s.epochs.epochs_done == 1
    assert s.n_steps == s.epochs.iterations == info["iterations"] >= 2
    steps = read_steps(run.parent)
    assert [st.extra["iteration"] for st in steps if not st.warmup] == list(range(s.n_steps))
    assert (
        info["trained_samples"] + sum(info["dropped_samples"].values()) == info["dataset_samples"]
    )
    assert s.epochs.epoch_time_s == pytest.approx(
        sum(st.step_time_s for st in steps if not st.warmup), rel=1e-6
    )


def test_unknown_preset_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["reproduce", "preset=nope"]) == 2
    assert "nope" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.dist
@pytest.mark.timeout(1800)
def test_cpu_twin_runs_end_to_end_into_a_measured_report(tmp_path: Path) -> None:
    out = tmp_path / "report"
    assert (
        main(
            [
                "reproduce",
                "preset=real_cpu",
                f"root={tmp_path / 'runs'}",
                f"out={out}",
                "budget_s=1500",
                "--no-progress",
            ]
        )
        == 0
    )
    summary = json.loads((out / "summary.json").read_text())
    text = (out / "report.md").read_text()
    assert "measured" in text.splitlines()[0]
    runs = sorted((tmp_path / "runs" / "reproduce_real_cpu").glob("*/run.json"))
    assert len(runs) == 11  # 5 claim runs + 2 workloads x 3 methods
    for run in runs:
        s = read_summary(run.parent)
        assert s is not None and s.status == "ok" and s.executor == "torch", (run, s and s.error)
        steps = read_steps(run.parent)
        assert all(len(st.peak_mem_per_rank_gib or []) == 4 and st.step_time_s > 0 for st in steps)
    claim = summary["claims"][0]
    assert (
        claim["id"] == "dcp_paper_headline" and claim["reproduced_value"] is not None
    )  # from measured runs
