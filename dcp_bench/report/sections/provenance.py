"""Report section "Provenance": command, git sha, system, cost models, notes."""

from __future__ import annotations

import json
from pathlib import Path

from dcp_bench.report.data import ReportData, cost_models_used, scrub_paths, shown_path
from dcp_bench.report.document import Document
from dcp_bench.report.sections.calibration import uses_calibration


def provenance_section(doc: Document, data: ReportData) -> None:
    inp, c, git, env, calib = data.inp, data.campaign, data.git, data.env, data.calibration
    doc.h2("Provenance")
    items = [
        f"command: `{scrub_paths(inp.command or 'dcp-bench report campaign=' + inp.campaign)}`",
        f"git sha: `{git.get('git_sha')}`, dirty: {git.get('git_dirty')}",
        f"run records: `{shown_path(Path(inp.root) / inp.campaign)}/<run_id>/` (config.yaml, "
        "env.json, steps.jsonl, run.json); run ids end in the cell's config hash and the seed",
        f"system: {env.get('cpu_model', '?')}, {env.get('cpu_cores', '?')} cores, torch "
        f"{env.get('torch', '?')}, python {env.get('python', '?')}, host "
        f"{env.get('hostname', '?')}",
        *[f"cost model: {scrub_paths(line)}" for line in cost_models_used(c)[:12]],
        *(
            [
                "calibration on record: "
                + (
                    "; ".join(
                        f"`{k}` ({v if isinstance(v, str) else json.dumps(v, default=str)[:200]})"
                        for k, v in calib.items()
                    )
                    if calib
                    else "no calibration error on record in results/calibration/"
                )
            ]
            if uses_calibration(data)
            else []
        ),
        "planner time: measured on this machine (CPU and wall time), charged per "
        "`run.planner_time` (default: none on the simulator, CPU time on measured runs) and "
        "`run.planner_clock` (default overlap: max(step, planner))",
    ]
    doc.bullets(items)
    doc.bullets([scrub_paths(n) for n in inp.notes])
