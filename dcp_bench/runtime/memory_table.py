"""Activation memory counted from the runtime's models beside the cost model's (what ``dcp-bench
memory`` writes): `write_activation_table` counts, per unit, what autograd keeps for the backward
in STDiT3-XL/2 and Llama-3-8B at full width (`dcp_bench.runtime.memory_count.memory_table`: fake
tensors, no data, seconds on a CPU), with and without checkpointing, and writes ``table.csv``,
``table.md`` and ``summary.json``: every unit's counted bytes, the analytical cost model's bytes
and their relative error."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dcp_bench.files import atomic_write_json, atomic_write_text
from dcp_bench.runtime.memory_count import memory_table


def _mib(x: float) -> str:
    return f"{x / 2**20:,.2f}"


def render_markdown(rows: list[dict[str, Any]], layers: int, tolerance: float, worst: float) -> str:
    lines = [
        "# Activation memory: counted from the runtime's models vs the cost model",
        "",
        "Rebuild: `dcp-bench memory --out results/memory` (seconds on a CPU; no GPU).",
        "",
        "Counted: `dcp_bench.runtime.memory_count.count_activations` builds the model at full "
        f"width with {layers} layer units (the rest of the depth is the same layers), runs one "
        "forward under `FakeTensorMode` on the CPU device (real shapes, dtypes, storages and "
        "operator dispatch; no data), and adds up every storage handed to a "
        "`saved_tensors_hooks` pack hook once (parameters excluded), plus the inputs each "
        "checkpointed unit holds. Attention runs SDPA restricted to its fused kernels: the CPU "
        "flash kernel keeps q, k, v, the output and an fp32 log-sum-exp per head and row (the "
        "`attention` column names the backward node seen); a saved square attention-length "
        "tensor fails the count.",
        "",
        "Model: `AnalyticalCostModel.activation_breakdown` (closed form, "
        "`dcp_bench.cost.activations`) for the full-depth model. Per-layer units are one layer's "
        "bytes; `shared` is what every layer reads and is kept once (caption features, RoPE "
        "tables; with checkpointing also the per-row timestep modulation); `total` is the "
        "full-depth micro-batch (per-layer units x layers), without the recomputation peak of one "
        "block that the cost model adds when every layer is checkpointed. Tokens per rank at SP "
        "degree 1, compute dtype bf16. Checkpointing: every layer unit, each STDiT3 block its own "
        "checkpoint (cross-attention inside), as the reference checkpoints it.",
        "",
        f"Largest |relative error| over all rows: {worst:.2%} (tolerance {tolerance:.0%}).",
        "",
        "| model | tokens | samples | frames | checkpoint | unit | counted MiB | model MiB | "
        "error |",
        "|---|---:|---:|---:|---|---|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['tokens']} | {r['samples']} | {r['frames']} | {r['checkpoint']} "
            f"| {r['unit']} | {_mib(r['counted_bytes'])} | {_mib(r['model_bytes'])} | "
            f"{r['rel_err']:+.2%} |"
        )
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class ActivationTable:
    """What `write_activation_table` wrote: its rows and the largest |relative error| among them."""

    rows: list[dict[str, Any]]
    worst: float


def write_activation_table(
    out: str, layers: int, cluster: str, tolerance: float
) -> ActivationTable:
    """Count and compare (the module docstring) with ``layers`` full-width layer units against the
    analytical cost model of ``cluster``; write the three files to ``out`` (``tolerance`` is the
    bound the table states)."""
    rows = memory_table(layers=layers, cluster=cluster)
    worst = max(abs(r["rel_err"]) for r in rows)
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(folder / "table.csv", buf.getvalue())
    atomic_write_text(folder / "table.md", render_markdown(rows, layers, tolerance, worst))
    atomic_write_json(
        folder / "summary.json",
        {
            "command": f"dcp-bench memory --out {out} --layers {layers} --cluster {cluster}",
            "method": "saved_tensors_hooks under FakeTensorMode (CPU device, fused SDPA), storages "
            "deduplicated, parameters excluded; checkpointed units add the inputs they hold",
            "cost_model": f"analytical, cluster {cluster}",
            "max_abs_rel_err": worst,
            "tolerance": tolerance,
            "rows": len(rows),
        },
    )
    return ActivationTable(rows=rows, worst=worst)
