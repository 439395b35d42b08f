"""`dcp-bench env`: a description of the system a result was obtained on (written as env.json
beside every run record)."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import socket
import subprocess
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


def git_state(cwd: str | os.PathLike[str] = REPO_ROOT) -> dict[str, Any]:
    """The git sha and dirty flag of the checkout (None when not in a git checkout)."""
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10
        )
        if sha.returncode != 0:
            return {"git_sha": None, "git_dirty": None}
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=10,
        )
        return {"git_sha": sha.stdout.strip(), "git_dirty": bool(status.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        return {"git_sha": None, "git_dirty": None}


def collect_env() -> dict[str, Any]:
    """One JSON-serialisable dict: software versions, accelerator, CPU, memory, host, git."""
    import torch

    cuda = torch.cuda.is_available()
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda else []
    nccl = None
    if cuda and torch.distributed.is_nccl_available():
        v = torch.cuda.nccl.version()
        nccl = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda if cuda else None,
        "nccl": nccl,
        "gpu_model": gpus[0] if gpus else None,
        "gpu_count": len(gpus),
        "cpu_model": _cpu_model(),
        "cpu_cores": os.cpu_count(),
        "memory_bytes": _memory_bytes(),
        "hostname": socket.gethostname(),
        **git_state(),
        "dcp_bench": _version("dcp-bench"),
        "dependencies": {name: _version(name) for name in RUNTIME_DEPENDENCIES},
    }
    return info
