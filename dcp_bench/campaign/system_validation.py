"""Simulate every published end-to-end measurement in ``results/validation/systems.yaml`` and
write the comparison (`dcp_bench.report.system_validation`): ``systems.md``, ``systems.csv`` and
``systems.json`` beside the file. Runs are simulated in this process, one per row and seed, as the
publication ran them; nothing is fitted to the published figures."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dcp_bench.config import load_config, to_container
from dcp_bench.files import atomic_write_json, atomic_write_text
from dcp_bench.paths import RESULTS_DIR
from dcp_bench.records import RunSummary
from dcp_bench.report.system_validation import (
    ROW_FIELDS,
    PublishedSystem,
    SystemValidation,
    load_systems,
    validate_system,
)
from dcp_bench.run.simulated import run_simulated
from dcp_bench.run.spec import parse_run_spec

SYSTEMS_FILE = RESULTS_DIR / "validation" / "systems.yaml"


def metric_value(summary: RunSummary, metric: str) -> float | None:
    """A validated metric (`dcp_bench.report.system_validation.METRICS`) of a run: the summary's
    own field, or the epoch unit's latent-voxel throughput."""
    if metric == "latent_tokens_per_s":
        return summary.epochs.latent_tokens_per_s if summary.epochs is not None else None
    value = getattr(summary, metric)
    return None if value is None else float(value)


def simulate_system(
    system: PublishedSystem, say: Callable[[str], None] | None = None
) -> SystemValidation:
    """Every row of ``system`` simulated for each of its seeds, then compared."""
    values: dict[str, dict[int, float]] = {}
    failures = []
    for row in system.rows:
        for seed in system.seeds:
            spec = parse_run_spec(to_container(load_config(system.run_overrides(row, seed))))
            summary = run_simulated(spec, write=False)
            if summary.status != "ok":
                failures.append(f"{row.id} seed {seed}: {summary.status} ({summary.error})")
                continue
            value = metric_value(summary, system.metric)
            if value is None or not math.isfinite(float(value)):
                failures.append(f"{row.id} seed {seed}: no {system.metric}")
                continue
            values.setdefault(row.id, {})[seed] = float(value)
            if say:
                say(f"{system.id}: {row.id} seed {seed}: {float(value) * system.scale:.3g}")
    return validate_system(system, values, note="; ".join(failures))


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.0%}"


def render_markdown(results: list[SystemValidation]) -> str:
    lines = [
        "# System-level validation: the simulator against published end-to-end measurements",
        "",
        "Every published figure of a system the suite simulates "
        "(`results/validation/systems.yaml`), simulated as the publication ran it (paper mode: "
        "the reference's own loop and profile), "
        "absolute in the publication's unit and as speedups over its baseline. Error = simulated / "
        "published - 1. These measurements validate the simulator; no constant is fitted to them. "
        "Regenerate: `dcp-bench validate`.",
    ]
    for v in results:
        s = v.system
        lines += [
            "",
            f"## {s.system}: {s.id}",
            "",
            f"Hardware: {s.hardware}. Source: {s.source}. Unit: {s.unit}. Simulated on "
            f"`{', '.join(f'{k}={x}' for k, x in s.context.items())}`, seeds "
            f"{', '.join(map(str, s.seeds))} (median).",
            "",
            "| row | published | simulated | error | published speedup | simulated speedup | "
            "speedup error |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in v.rows:
            sim = "-" if r["simulated"] is None else f"{r['simulated']:.2f}"
            ssp = "-" if r["simulated_speedup"] is None else f"{r['simulated_speedup']:.2f}"
            lines.append(
                f"| {r['label']} | {r['published']:.2f} | {sim} | {_pct(r['error'])} | "
                f"{r['published_speedup']:.2f} | {ssp} | {_pct(r['speedup_error'])} |"
            )
        cm = s.claimed_comparison
        err = None if not math.isfinite(v.claimed_error) else v.claimed_error
        lines += [
            "",
            f"Claimed comparison (claim `{s.claim}`): `{cm['method']}` over `{cm['baseline']}`, "
            f"published {v.claimed_published:.2f}x, simulated {v.claimed_simulated:.2f}x: "
            f"error **{_pct(err)}**.",
        ]
        if v.note:
            lines += ["", f"Not simulated: {v.note}"]
    return "\n".join(lines) + "\n"


def render_csv(results: list[SystemValidation]) -> str:
    buf = io.StringIO()
    fields = ["system", "row", *ROW_FIELDS]
    w = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    w.writeheader()
    for v in results:
        for r in v.rows:
            w.writerow({"system": v.system.id, "row": r["id"], **{k: r[k] for k in fields[2:]}})
    return buf.getvalue()


def validate_systems(
    path: Path | None = None, out: Path | None = None, say: Callable[[str], None] | None = None
) -> tuple[list[SystemValidation], Path]:
    """Simulate every system of ``path`` (default `SYSTEMS_FILE`) and write the three files into
    ``out`` (default beside ``path``)."""
    path = path or SYSTEMS_FILE
    out = out or path.parent
    results = [simulate_system(s, say) for s in load_systems(path)]
    doc: dict[str, Any] = {"systems": [v.to_dict() for v in results], "simulated": True}
    atomic_write_text(out / "systems.md", render_markdown(results))
    atomic_write_text(out / "systems.csv", render_csv(results))
    atomic_write_json(out / "systems.json", doc)
    return results, out


__all__ = ["SYSTEMS_FILE", "render_markdown", "simulate_system", "validate_systems"]
