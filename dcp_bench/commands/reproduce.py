"""`dcp-bench reproduce` (= `make reproduce`): the claim reproduction on its embedded defaults
(``dcp_bench/conf/reproduce/default.yaml``), then the report in ``reports/reproduce/``.

Sections run in order, each under its own time budget and all under the command's budget; the
runs a budget leaves out are named in the report, never silently dropped. Resumable: a rerun skips
complete runs (delete ``runs/reproduce`` for a fresh start).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path
from typing import Any

NAME = "reproduce"
HELP = (
    "reproduce the DCP claim: simulated sweeps (all methods, workloads, 8-64 GPUs, repeats, "
    "sensitivity) + a real CPU gloo run, then reports/reproduce/ with summary.json; "
    "`dcp-bench reproduce [budget_s=560] [jobs=2] [repeats=5] [real=false] [config=PATH]`"
)
TOP_KEYS = ("config", "campaign", "root", "out", "claims", "budget_s", "report_reserve_s", "jobs", "repeats", "real", "sections",
            "preset", "cluster", "nnodes", "rdzv_endpoint")
# Run keys a preset leaves open (e.g. `preset=real cluster=h200x32`): added to every grid when set.
GRID_KEYS = ("cluster", "nnodes", "rdzv_endpoint")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("overrides", nargs="*", help=f"key=value; keys: {', '.join(TOP_KEYS)} (sections=a,b runs only those)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def load_reproduce_config(overrides: list[str]) -> dict[str, Any]:
    import yaml

    from dcp_bench.errors import ConfigError
    from dcp_bench.paths import CONF_DIR

    kv: dict[str, str] = {}
    for ov in overrides:
        key, sep, value = ov.partition("=")
        if not sep or key not in TOP_KEYS:
            raise ConfigError(f"bad reproduce argument {ov!r}: expected key=value with key one of {', '.join(TOP_KEYS)}")
        kv[key] = value
    # preset=NAME: the packaged config dcp_bench/conf/reproduce/NAME.yaml (default: default)
    preset = kv.pop("preset", "default")
    presets = sorted(p.stem for p in (CONF_DIR / "reproduce").glob("*.yaml") if not p.stem.endswith("_claims"))
    if preset not in presets:
        raise ConfigError(f"preset={preset!r}: no such reproduce preset; expected one of {', '.join(presets)}")
    path = Path(kv.pop("config", str(CONF_DIR / "reproduce" / f"{preset}.yaml")))
    if not path.exists():
        raise ConfigError(f"reproduce config {str(path)!r} not found")
    cfg = yaml.safe_load(path.read_text()) or {}
    cfg["_path"] = str(path)
    for key, value in kv.items():
        if key in ("budget_s", "report_reserve_s"):
            cfg[key] = float(value)
        elif key in ("jobs", "repeats"):
            cfg[key] = int(value)
        elif key == "real":
            cfg[key] = value.lower() in ("1", "true", "yes", "on")
        elif key == "sections":
            cfg["only_sections"] = [s for s in value.split(",") if s]
        else:
            cfg[key] = value
    return cfg


def _cell_name(run_id: str) -> str:
    return run_id.rsplit("__s", 1)[0]


def run(args: argparse.Namespace) -> int:
    from dcp_bench.errors import ConfigError, DcpBenchError
    from dcp_bench.report.writer import ReportInputs, build_report
    from dcp_bench.run.spec import RunSpec
    from dcp_bench.runner import plan_sweep, run_sweep

    t_start = time.time()
    cfg = load_reproduce_config(list(args.overrides))
    budget = float(cfg.get("budget_s", 560))
    reserve = float(cfg.get("report_reserve_s", 60))
    hard_deadline = t_start + budget - reserve
    root, campaign = str(cfg.get("root", "runs")), str(cfg.get("campaign", "reproduce"))
    jobs = int(cfg.get("jobs", 2))
    progress = not args.no_progress and sys.stderr.isatty()
    notes: list[str] = [f"reproduce config: `{cfg['_path']}`; budget {budget:g} s ({reserve:g} s kept for the report)"]
    only = cfg.get("only_sections")
    sections = [sec for sec in cfg.get("sections", []) if not only or sec["name"] in only]
    notes += [f"section {sec['name']}: skipped (sections={','.join(only)})" for sec in cfg.get("sections", [])
              if only and sec["name"] not in only]
    for index, section in enumerate(sections):
        name = section["name"]
        # Each later section keeps a minimum share (reserve_s), so a slow machine still gets a
        # first repeat of every section rather than none of the last ones.
        later = sum(float(s.get("reserve_s", 20)) for s in sections[index + 1:])
        is_real = bool(section.get("real", False))
        if is_real and not cfg.get("real", True):
            notes.append(f"section {name}: skipped (real=false): no measured runs, so the simulator's error is not measured")
            continue
        repeats = int(section.get("repeats", cfg.get("repeats", 5)))
        common = list(section.get("common", cfg.get("sim_common", [])))
        sim_specs: list[RunSpec] = []
        real_specs: list[RunSpec] = []
        try:
            for grid in section.get("grids", []):
                base = [*common, *[str(g) for g in grid], f"run.campaign={campaign}", f"run.root={root}",
                        *[f"{k}={cfg[k]}" for k in GRID_KEYS if cfg.get(k) is not None]]
                if section.get("simulate", True):  # a measured-only section (preset=real) has no twins
                    sim_specs += plan_sweep([*base, "run.executor=sim"], repeats=repeats, sweep=name)
                if is_real:
                    real_specs += plan_sweep([*base, "run.executor=torch"], repeats=repeats, sweep=name)
        except ConfigError as exc:
            notes.append(f"section {name}: NOT RUN, its configs do not compose: {exc}")
            continue
        sec_deadline = min(hard_deadline - later, time.time() + float(section.get("budget_s", budget)))
        ran = skipped = 0
        unrun: list[str] = []
        failed: list[str] = []
        if real_specs:
            # Real runs first and alone: simulated runs in parallel would disturb their timings.
            try:
                res = run_sweep(real_specs, jobs=1, progress=progress, deadline=sec_deadline)
            except (DcpBenchError, ImportError) as exc:
                notes.append(f"section {name}: real runs NOT RUN: {type(exc).__name__}: {exc}")
                res = None
            if res is not None:
                ran += len(res.ran)
                skipped += len(res.skipped)
                unrun += res.unrun
                failed += [f"{s.run_id} ({s.status}: {s.error})" for s in res.failed]
        res = run_sweep(sim_specs, jobs=jobs, progress=progress,
                        deadline=sec_deadline if not real_specs else hard_deadline - later)
        ran += len(res.ran)
        skipped += len(res.skipped)
        unrun += res.unrun
        failed += [f"{s.run_id} ({s.status}: {s.error})" for s in res.failed]
        msg = (f"section {name}: {ran} run(s) now, {skipped} already complete, {len(failed)} failed, "
               f"{len(unrun)} left out by the time budget")
        print(msg, flush=True)
        notes.append(msg)
        if unrun:
            cells = sorted({_cell_name(u) for u in unrun})
            notes.append(f"section {name}: cells with repeats left out by the budget (raise budget_s to run them): "
                         + ", ".join(f"`{c}`" for c in cells[:30]) + (" ..." if len(cells) > 30 else ""))
        for f in failed[:20]:
            notes.append(f"section {name}: failed run {f}")
    elapsed = time.time() - t_start
    notes.append(f"sweeps took {elapsed:.0f} s")
    command = "dcp-bench reproduce " + " ".join(shlex.quote(a) for a in args.overrides)
    summary = build_report(ReportInputs(root=root, campaign=campaign, out_dir=str(cfg.get("out", "reports/reproduce")),
                                        claims_path=str(cfg.get("claims", "results/reference/claims.yaml")),
                                        command=command.strip(), notes=notes,
                                        title=str(cfg.get("title", "dcp-bench: reproducing the DCP claim"))))
    for c in summary["claims"]:
        val = c["reproduced_value"]
        ci = c["ci95"]
        ci_txt = "-" if ci[0] is None else f"[{ci[0]:.2f}, {ci[1]:.2f}]"
        print(f"{c['id']}: {c['verdict'].upper()} - claimed {c['claimed']}x, reproduced "
              f"{'-' if val is None else f'{val:.2f}x'}, 95% CI {ci_txt}")
    err = summary["simulator_error"]
    if err.get("median_abs_step_time_error") is not None:
        print(f"simulator error on CPU (median |error| of median step time): {err['median_abs_step_time_error']:.1%}")
    print(f"report: {summary['report']['md']} ({time.time() - t_start:.0f} s in all)")
    return 0
