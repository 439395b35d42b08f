"""Where a rank runs: its device, the collective backend, the compute dtype."""

from __future__ import annotations

import os

import torch

from dcp_bench.cost.specs import ModelSpec

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def pick_device(device: str = "auto") -> torch.device:
    """``cuda`` (this rank's ``LOCAL_RANK`` GPU) when asked for or, with ``auto``, when one is
    present; the CPU otherwise."""
    if device == "cuda" or (device == "auto" and torch.cuda.is_available()):
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu")


def backend_for(backend: str, device: torch.device) -> str:
    """``auto``: NCCL on CUDA, gloo otherwise."""
    if backend != "auto":
        return backend
    return "nccl" if device.type == "cuda" else "gloo"


def compute_dtype(spec: ModelSpec, device: torch.device) -> torch.dtype:
    """The model's dtype on CUDA; fp32 on the CPU (CPU runs check exactness against fp32
    references)."""
    return DTYPES[spec.dtype] if device.type == "cuda" else torch.float32
