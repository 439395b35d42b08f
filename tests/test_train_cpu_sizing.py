"""`dcp-bench train` with a tiny model on a CPU sizes the workload so a step takes seconds (the
scale and cap printed); a GPU, a full-size model, or any sizing key on the command line keeps
the workload as it is."""

from __future__ import annotations

from typing import Any

from dcp_bench.run.train_config import CPU_MAX_LEN, CPU_TOKENS_PER_RANK, cpu_sizing


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
