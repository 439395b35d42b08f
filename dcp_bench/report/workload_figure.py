"""A workload's length distribution as a figure (``dcp-bench workloads show NAME --plot PATH``)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from dcp_bench.files import atomic_write_bytes
from dcp_bench.workloads.workload import Workload


def write_length_histogram(workload: Workload, path: Path) -> None:
    """A log-x histogram of the share of samples and the share of tokens per length bin."""
    lengths, probs, method = workload.length_distribution()
    lo, hi = max(1.0, float(lengths.min())), float(lengths.max())
    bins = np.geomspace(lo, hi * 1.0001, 60) if hi > lo else np.array([lo * 0.9, lo * 1.1])
    samples, _ = np.histogram(lengths, bins=bins, weights=probs)
    tokens, _ = np.histogram(lengths, bins=bins, weights=probs * lengths)
    tokens = tokens / tokens.sum()
    fig = Figure(figsize=(7, 3.5))
    ax = fig.subplots()
    ax.stairs(samples, bins, label="share of samples", fill=True, alpha=0.5)
    ax.stairs(tokens, bins, label="share of tokens", linewidth=1.5)
    ax.set_xscale("log")
    ax.set_xlabel("sequence length (tokens)")
    ax.set_ylabel("share")
    ax.set_title(f"{workload.name} (v{workload.version}); {method}", fontsize=9)
    ax.legend()
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format=path.suffix.lower().lstrip("."), dpi=120)
    atomic_write_bytes(path, buf.getvalue())  # a regular file or nothing (dcp_bench.files)
