"""`dcp-bench simulate`: simulate a method on a workload, cluster and model; print the medians."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

NAME = "simulate"
HELP = (
    "simulate N steps of a method (e.g. `dcp-bench simulate workload=prolong method=dcp "
    "cluster=h200x32 model=llama3_8b steps=20 seed=0 --json`) and print median step time, lower "
    "bound, imbalance, peak memory, OOM steps, MFU and planner time (all simulated)"
)

# Shortcuts accepted on the command line for keys that live deeper in the config.
SHORTCUTS = {"steps": "run.steps", "warmup_steps": "run.warmup_steps"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="config overrides: workload=, method=, cluster=, model=, steps=, seed=, "
                        "cost.source=analytical|profiled|auto, +cost.scales.act_bytes=1.2, +noise.jitter_sigma=0.05")
    parser.add_argument("--json", action="store_true", help="print one JSON object (medians + config)")


def expand_shortcuts(overrides: Sequence[str], shortcuts: dict[str, str]) -> list[str]:
    """Rewrite ``steps=N`` as ``run.steps=N`` (and the like), leaving other overrides alone."""
    out = []
    for ov in overrides:
        key, sep, value = ov.partition("=")
        out.append(f"{shortcuts[key]}={value}" if sep and key in shortcuts else ov)
    return out


def _fmt(value: object, unit: str = "", digits: int = 4) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}g}{unit}"
    return f"{value}{unit}"


def run(args: argparse.Namespace) -> int:
    from dcp_bench.config import load_config
    from dcp_bench.sim import simulate_run

    cfg = load_config(expand_shortcuts(args.overrides, SHORTCUTS))
    summary, _ = simulate_run(cfg)
    if args.json:
        print(json.dumps(summary, indent=2, sort_keys=True, default=str))
        return 0
    cm = summary["cost_model"]
    print(f"SIMULATED: {summary['method']} on {summary['workload']}, {summary['cluster']} "
          f"({summary['world_size']} ranks), {summary['model']}; {summary['steps']} steps after "
          f"{summary['warmup_steps']} warm-up, seed {summary['seed']}")
    print(f"cost model: {cm.get('source')} (cluster {cm.get('cluster')}, memory cap "
          f"{cm.get('mem_cap_fraction')} of usable GPU memory)")
    if cm.get("auto_fallback"):
        print(f"note: {cm['auto_fallback']}")
    rows = [
        ("median step time", _fmt(summary["step_time_s"], " s")),
        ("  of which simulated", _fmt(summary["sim_step_time_s"], " s")),
        ("median lower bound", _fmt(summary["lower_bound_s"], " s")),
        ("median imbalance", _fmt(summary["imbalance"])),
        ("median comm share", _fmt(summary["comm_share"])),
        ("median peak memory", _fmt(summary["peak_mem_gib"], " GiB")),
        ("OOM steps", _fmt(summary["oom_steps"])),
        ("steps over the cap", _fmt(summary["over_cap_steps"])),
        ("median MFU", _fmt(summary["mfu"])),
        ("median planner time", _fmt(summary["planner_ms"], " ms")),
        ("tokens/s", _fmt(summary["tokens_per_s"])),
    ]
    width = max(len(k) for k, _ in rows)
    for key, val in rows:
        print(f"  {key:<{width}}  {val}")
    return 0
