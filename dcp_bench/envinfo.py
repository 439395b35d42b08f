"""`dcp-bench env`: a description of the system a result was obtained on (written as env.json
beside every run record)."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import socket
import subprocess
import sys
from typing import Any

from dcp_bench.paths import REPO_ROOT

RUNTIME_DEPENDENCIES = (
    "torch",
    "hydra-core",
    "omegaconf",
    "numpy",
    "pandas",
    "pyarrow",
    "seaborn",
    "matplotlib",
    "tqdm",
    "pyyaml",
    "highspy",
    "flash-attn",
)


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


# A copy of the tree without its .git (a GPU node reached by copying files) names its commit here.
COMMIT_ENV = "DCP_BENCH_COMMIT"


def _commit_passed_in() -> dict[str, Any]:
    sha = os.environ.get(COMMIT_ENV, "").strip()
    if not sha:
        return {"git_sha": None, "git_dirty": None}
    return {"git_sha": sha, "git_dirty": None, "git_sha_source": f"${COMMIT_ENV} (no git checkout)"}


def git_state(cwd: str | os.PathLike[str] = REPO_ROOT) -> dict[str, Any]:
    """The git sha and dirty flag of the checkout; outside a git checkout the commit passed in
    through ``$DCP_BENCH_COMMIT`` (dirty unknown), else None."""
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10
        )
        if sha.returncode != 0:
            return _commit_passed_in()
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=10,
        )
        return {"git_sha": sha.stdout.strip(), "git_dirty": bool(status.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        return _commit_passed_in()


def gpu_driver_version() -> str | None:
    """The NVIDIA driver's version (NVML, else nvidia-smi); None without either."""
    try:
        import pynvml  # lazy: optional (nvidia-ml-py), absent on most machines

        pynvml.nvmlInit()
        try:
            v = pynvml.nvmlSystemGetDriverVersion()
            return v.decode() if isinstance(v, bytes) else str(v)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # not installed, no driver, no permission: try the command line
        pass
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    line = (
        out.stdout.strip().splitlines()[0].strip()
        if out.returncode == 0 and out.stdout.strip()
        else ""
    )
    return line or None


def collect_env() -> dict[str, Any]:
    """One JSON-serialisable dict: software versions, accelerator, CPU, memory, host, git."""
    # lazy: keeps the report path (git_state) and the sweep's (campaign.sweep) import free of torch
    import torch

    cuda = torch.cuda.is_available()
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda else []
    nccl = None
    if cuda and torch.distributed.is_nccl_available():
        v = torch.cuda.nccl.version()
        nccl = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "interpreter": sys.executable,
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda if cuda else None,
        "nccl": nccl,
        "gpu_model": gpus[0] if gpus else None,
        "gpu_count": len(gpus),
        "gpu_memory_bytes": torch.cuda.get_device_properties(0).total_memory if cuda else None,
        "gpu_driver": gpu_driver_version() if cuda else None,
        "cpu_model": _cpu_model(),
        "cpu_cores": os.cpu_count(),
        "memory_bytes": _memory_bytes(),
        "hostname": socket.gethostname(),
        **git_state(),
        "dcp_bench": _version("dcp-bench"),
        "dependencies": {name: _version(name) for name in RUNTIME_DEPENDENCIES},
    }
    return info
