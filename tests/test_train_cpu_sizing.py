"""`dcp-bench train` with a tiny model on a CPU sizes the workload so a step takes seconds (the
scale and cap printed); a GPU, a full-size model, or any sizing key on the command line keeps
the workload as it is."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dcp_bench.run.train_config import CPU_MAX_LEN, CPU_TOKENS_PER_RANK, cpu_sizing

REPO = Path(__file__).resolve().parents[1]


def _cfg(model: str = "tiny_llama", cluster: str = "cpu", **workload: Any) -> dict[str, Any]:
    work = {
        "name": "sharegpt",
        "tokens_per_gpu": 131072,
        "samples_per_step": None,
        "length_scale": 1,
        "max_len": None,
        **workload,
    }
    return {
        "model": {"name": model},
        "cluster": {"name": cluster},
        "train": {"device": "auto"},
        "workload": work,
    }


def test_a_tiny_model_on_a_cpu_gets_a_cpu_sized_workload() -> None:
    # 131072 tokens a rank at full size / 2048 a rank on the CPU = lengths divided by 64
    assert CPU_TOKENS_PER_RANK == 2048 and 131072 // CPU_TOKENS_PER_RANK == 64
    assert cpu_sizing(_cfg(), set(), cuda=False) == [
        "workload.length_scale=64",
        f"workload.max_len={CPU_MAX_LEN}",
    ]
    assert cpu_sizing(_cfg(tokens_per_gpu=3000), set(), cuda=False) == [
        "workload.length_scale=2",
        f"workload.max_len={CPU_MAX_LEN}",
    ]  # rounded up
    assert (
        cpu_sizing(_cfg(length_scale=128, max_len=512), set(), cuda=False) == []
    )  # already smaller


def test_the_full_workload_is_one_key_away_and_gpus_are_left_alone() -> None:
    assert cpu_sizing(_cfg(), {"workload.length_scale"}, cuda=False) == []
    assert cpu_sizing(_cfg(), {"workload.tokens_per_gpu"}, cuda=False) == []
    assert cpu_sizing(_cfg(), set(), cuda=True) == []  # device auto on a CUDA machine
    assert cpu_sizing(_cfg(model="llama3_8b"), set(), cuda=False) == []
    assert cpu_sizing(_cfg(cluster="h200x8"), set(), cuda=False) == []
    assert cpu_sizing(_cfg(samples_per_step=8), set(), cuda=False) == []


def test_the_default_hf_model_is_cpu_sized_and_a_named_one_is_not() -> None:
    # model=hf's default is a small Llama of tiny_llama's sizes (dcp_bench/conf/model/hf.yaml):
    # sized like the tiny models; a config_file names a model of its own, left at full size
    hf = _cfg(model="hf")
    hf["model"]["config_file"] = None
    assert cpu_sizing(hf, set(), cuda=False) == [
        "workload.length_scale=64",
        f"workload.max_len={CPU_MAX_LEN}",
    ]
    named = _cfg(model="hf")
    named["model"]["config_file"] = "/models/llama/config.json"
    assert cpu_sizing(named, set(), cuda=False) == []
    assert cpu_sizing(hf, {"workload.length_scale"}, cuda=False) == []


def test_train_model_hf_is_cpu_sized_through_the_command_line() -> None:
    from dcp_bench.run.train_config import resolve_train_config

    notes: list[str] = []
    cfg = resolve_train_config(
        ["model=hf", "workload=sharegpt", "method=dcp", "nproc=2", "cluster=cpu"], notes
    )
    assert cfg["workload"]["length_scale"] == 64 and cfg["workload"]["max_len"] == CPU_MAX_LEN
    assert notes and notes[0].startswith("CPU-sized workload: workload.length_scale=64")


@pytest.mark.slow
def test_train_model_hf_on_two_cpu_ranks_finishes(tmp_path: Path) -> None:
    """The issue's command (it planned 131,072 tokens a rank and ran for over 15 minutes): now
    CPU-sized, it trains its 2 steps and says how it was sized."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "dcp_bench.cli",
            "train",
            "model=hf",
            "workload=sharegpt",
            "method=dcp",
            "nproc=2",
            "steps=2",
            f"root={tmp_path}",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "CPU-sized workload: workload.length_scale=64" in proc.stdout + proc.stderr
    assert "status ok, 2 measured steps" in proc.stdout
