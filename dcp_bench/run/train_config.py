"""The composed config of a real run from its command line (``dcp-bench train``, ``dcp-bench
slurm``, the tests that launch real runs): `resolve_train_config` fills in what a real run needs
and a simulated one does not (the torch executor, the ``train`` campaign, the ``cpu`` cluster on a
machine without a GPU, the tiny model of the workload's kind) and, on a CPU with a tiny model,
sizes the workload so that a step takes seconds (`cpu_sizing`)."""

from __future__ import annotations

import math
import os
from typing import Any

from dcp_bench.config import load_config, to_container
from dcp_bench.errors import ConfigError
from dcp_bench.run.spec import RunSpec
from dcp_bench.workloads import make_workload

# What a GPU driver puts in /dev (NVIDIA's control device; AMD's compute device for ROCm torch):
# torch sees no CUDA device without one.
GPU_DRIVER_NODES = ("/dev/nvidiactl", "/dev/kfd")


def _cuda_available() -> bool:
    """Whether torch sees a CUDA device. torch is imported only on a machine with a GPU driver,
    not with this module, so on a CPU machine a bad command line is refused without the seconds
    torch takes to import."""
    if not any(os.path.exists(node) for node in GPU_DRIVER_NODES):
        return False
    import torch  # here, not at the top: a CPU machine's bad command line never waits for it

    return bool(torch.cuda.is_available())


# A real run on a CPU with a tiny model: lengths scaled so that a rank's step holds about this many
# tokens, and capped, so that a step takes seconds (ShareGPT at full size: ~90 s a step on a quiet
# 2-core machine). Any of `CPU_SIZING_KEYS` given on the command line keeps the workload as it is.
CPU_TOKENS_PER_RANK = 2048
CPU_MAX_LEN = 2048
CPU_SIZING_KEYS = (
    "workload.length_scale",
    "workload.tokens_per_gpu",
    "workload.samples_per_step",
    "workload.max_len",
)


def resolve_train_config(overrides: list[str], notes: list[str] | None = None) -> dict[str, Any]:
    """The composed config for a real run: without ``cluster=`` the ``cpu`` cluster when no GPU
    is present; without ``model=`` the tiny model matching the workload's kind; executor torch.
    A CPU sizing applied is described in ``notes`` (when given)."""
    keys = {ov.partition("=")[0].lstrip("+~") for ov in overrides}
    if "workload" not in keys:
        raise ConfigError("train needs workload=NAME (see `dcp-bench workloads list`)")
    if "method" not in keys:
        raise ConfigError("train needs method=NAME (one of dcp_bench/conf/method)")
    ovs = (
        [*overrides, "run.executor=torch", "run.campaign=train"]
        if "campaign" not in keys and "run.campaign" not in keys
        else [*overrides, "run.executor=torch"]
    )
    if "cluster" not in keys and not _cuda_available():
        ovs.append("cluster=cpu")
    cfg = to_container(load_config(ovs))
    if "model" not in keys:
        kind = getattr(make_workload(cfg["workload"]), "kind", "text")
        ovs = [*ovs, f"model={'tiny_stdit' if kind == 'video' else 'tiny_llama'}"]
        cfg = to_container(load_config(ovs))
    sizing = cpu_sizing(cfg, keys, _cuda_available())
    if sizing:
        cfg = to_container(load_config([*ovs, *sizing]))
        full = cfg["workload"].get("tokens_per_gpu")
        if notes is not None:
            notes.append(
                f"CPU-sized workload: {' '.join(sizing)} (about {CPU_TOKENS_PER_RANK} tokens per "
                "rank a step, lengths divided by the scale and capped; the workload's full size, "
                f"{full} tokens per rank: add workload.length_scale=1)"
            )
    return cfg


def cpu_model(model: dict[str, Any]) -> bool:
    """Whether ``model`` is one of the CPU-sized models: the tiny ones, and ``model=hf`` with its
    default config (a small Llama of tiny_llama's sizes; a ``model.config_file`` names a model of
    its own, trained at the workload's size)."""
    name = str(model.get("name", ""))
    return name.startswith("tiny_") or (name == "hf" and not model.get("config_file"))


def cpu_sizing(cfg: dict[str, Any], keys: set[str], cuda: bool) -> list[str]:
    """The overrides that CPU-size the run (none on a GPU, for a model other than the CPU-sized
    ones, `cpu_model`, or when the command line sizes the workload itself)."""
    model = cfg.get("model") or {}
    work = cfg.get("workload") or {}
    cluster = cfg.get("cluster") or {}
    cpu = str(cluster.get("name", "")) == "cpu" and (
        str((cfg.get("train") or {}).get("device", "auto")) == "cpu" or not cuda
    )
    if not cpu or not cpu_model(model) or keys & set(CPU_SIZING_KEYS):
        return []
    budget = work.get("tokens_per_gpu")
    if (
        work.get("samples_per_step") is not None
        or isinstance(budget, bool)
        or not isinstance(budget, (int, float))
    ):
        return []
    scale = max(1, math.ceil(float(budget) / CPU_TOKENS_PER_RANK))
    current = work.get("length_scale", 1)
    out = (
        []
        if "length_scale" not in work or not isinstance(current, (int, float)) or current >= scale
        else [f"workload.length_scale={scale}"]
    )
    if "max_len" in work and (work["max_len"] is None or int(work["max_len"]) > CPU_MAX_LEN):
        out.append(f"workload.max_len={CPU_MAX_LEN}")
    return out


def run_device(spec: RunSpec) -> str:
    """The device a real run trains on: ``train.device``, or with ``auto`` CUDA when present."""
    if spec.train.device == "auto":
        return "cuda" if _cuda_available() else "cpu"
    return str(spec.train.device)
