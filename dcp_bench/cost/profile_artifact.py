"""The profile artifact: what `dcp-bench profile` measured, as one JSON file.

Schema (``schema_version`` 1)::

    {
      "kind": "dcp-bench-profile", "schema_version": 1,
      "model": {...ModelSpec fields...},
      "hardware": {cpu_model, cpu_cores, memory_bytes, gpu_model, gpu_count, platform, hostname},
      "software": {python, torch, numpy, dcp_bench, cuda, nccl, flash_attn},
      "settings": {device, dtype, threads_per_rank, nprocs, reps, warmup, grid, attention},
      "layers": [LayerPoint...],          # one per (nproc, sp, tokens_per_rank, shape)
      "outer": [OuterPoint...],           # the model minus its layers (embedding, head, loss)
      "collectives": [CollectivePoint...],
      "static": {params, param_bytes, layer_params, optimizer_step_s},
      "steps": [{nproc, step_overhead_s, process_baseline_bytes}...],  # CPU: per world size
      "ceilings": {...},                  # GPU calibration only: matmul and copy ceilings
      "cost": {wall_s, started_at, finished_at, command},
    }

Layer and outer points carry ``n_samples`` (samples in the micro-batch); outer points also
``inputs_s`` (building the micro-batch's inputs). Older artifacts without these fields are read
as one sample per point and no input cost.

Every timing is a summary of several repetitions after warm-up: ``{"median", "p25", "p75",
"n"}`` in seconds. A file is identified by the SHA-256 of its bytes (``sha256sum`` reproduces
it); run records name the profile by path and that hash.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dcp_bench.archs import get_arch
from dcp_bench.errors import ConfigError
from dcp_bench.paths import REPO_ROOT

SCHEMA_VERSION = 1
KIND = "dcp-bench-profile"


def summarize(samples: Sequence[float]) -> dict[str, float]:
    """Median and inter-quartile range of repeated measurements (warm-up already excluded)."""
    arr = np.asarray(samples, dtype=float)
    if arr.size == 0:
        raise ValueError("no samples to summarise")
    p25, med, p75 = np.percentile(arr, [25, 50, 75])
    return {"median": float(med), "p25": float(p25), "p75": float(p75), "n": int(arr.size)}


def dumps_artifact(artifact: dict[str, Any]) -> str:
    """Canonical text of an artifact (sorted keys), so equal content gives equal hashes."""
    return json.dumps(artifact, indent=1, sort_keys=True) + "\n"


def resolve_profile_path(path: str | os.PathLike[str]) -> Path:
    """Relative paths are taken from the repository root (how cluster configs name profiles)."""
    p = Path(path)
    if not p.is_absolute() and not p.exists():
        p = REPO_ROOT / p
    return p


def load_artifact(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and check a profile artifact; errors name the file and what is wrong."""
    p = resolve_profile_path(path)
    if not p.exists():
        raise ConfigError(f"profile {str(path)!r} not found; run `dcp-bench profile` to make one")
    try:
        data = json.loads(p.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"profile {str(p)!r} is not valid JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("kind") != KIND:
        raise ConfigError(f"profile {str(p)!r} is not a dcp-bench profile (kind {KIND!r} expected)")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ConfigError(
            f"profile {str(p)!r} has schema_version {version}; this dcp-bench reads "
            f"{SCHEMA_VERSION}"
        )
    for key in ("model", "layers", "collectives", "static"):
        if key not in data:
            raise ConfigError(f"profile {str(p)!r} lacks the {key!r} section")
    return data


def attention_pairs(tokens: np.ndarray, frames: np.ndarray, arch: str) -> np.ndarray:
    """Query-key pairs a sample's attention computes, the size feature that grows quadratically.

    Each architecture counts its own (`dcp_bench.archs`): causal 1-D text attends L^2/2 pairs; an
    STDiT3 block pair attends spatially within each frame (F * S^2) and temporally across frames
    at each position (S * F^2). Per pair the work is the same (same head width), so one
    coefficient serves both.
    """
    return get_arch(arch).attention_pairs(tokens, frames)
