"""`dcp-bench simulate`: simulate a method on a workload, cluster and model; print the medians.
The command parses its arguments and calls `dcp_bench.campaign.one_run.simulate_one`."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

NAME = "simulate"
HELP = (
    "simulate N measured steps of a method (e.g. `dcp-bench simulate workload=prolong method=dcp "
    "cluster=h200x32 model=llama3_8b steps=20 seed=0 --json`) and print median step time, lower "
    "bound, imbalance, peak memory, OOM steps, MFU and planner time (all simulated); "
    "`--record` also writes the run records"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="config overrides: workload=, method=, cluster=, model=, steps= (measured), "
        "warmup_steps=, seed=, cost.source=analytical|profiled|auto, cost.scales.act_bytes=1.2, "
        "run.noise.jitter_sigma=0.05, planner_clock=overlap|serial|off, "
        "planner_time=auto|cpu|wall|none",
    )
    parser.add_argument(
        "--json", action="store_true", help="print the run summary as one JSON object"
    )
    parser.add_argument(
        "--record",
        action="store_true",
        help="write the run records under <run.root>/<run.campaign>/<run id>/ (as a sweep does)",
    )


def _fmt(value: object, unit: str = "", digits: int = 4) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}g}{unit}"
    return f"{value}{unit}"


def _ratio(num: float | None, den: float | None) -> str:
    if num is None or den is None or not den > 0:
        return "n/a"
    return f"{num / den:.3f}"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _note(message: str) -> None:
    sys.stderr.write(f"dcp-bench: {message}\n")
    sys.stderr.flush()


def run(args: argparse.Namespace) -> int:
    from dcp_bench.campaign.one_run import simulate_one

    spec, summary = simulate_one(list(args.overrides), record=args.record, say=_note)
    refused = next(
        (k for k in ("PlanError: ", "ConfigError: ") if (summary.error or "").startswith(k)), None
    )
    if summary.status == "error" and refused is not None:
        # a plan the validator refuses (e.g. an SP degree the model's heads do not divide), or a
        # method setting the model cannot run, is not a result: one line, the usage-error status
        sys.stderr.write(
            f"dcp-bench simulate: error: {summary.method} has no runnable plan: "
            f"{(summary.error or '')[len(refused) :]}\n"
        )
        return 2
    if summary.status == "error" and not args.json:
        sys.stderr.write(
            "dcp-bench simulate: error: the run failed after "
            f"{len(summary.training.losses) if summary.training else 0} step(s): "
            f"{summary.error}\n"
        )
        return 3
    if args.json:
        print(json.dumps(dataclasses.asdict(summary), indent=2, sort_keys=True, default=str))
        return 0 if summary.status == "ok" else 3
    cm = summary.cost_description.as_flat() if summary.cost_description else {}
    out = summary.outcome
    print(
        f"SIMULATED: {summary.method}{' (paper mode)' if spec.mode == 'paper' else ''} on "
        f"{summary.workload}, {summary.cluster} ({summary.world_size} ranks), {summary.model}; "
        f"{summary.n_steps} measured steps after {summary.n_warmup} warm-up, seed {summary.seed}; "
        f"status {summary.status}"
    )
    if summary.error:
        print(f"error: {summary.error}")
    print(
        f"cost model: {cm.get('source')} (cluster {cm.get('cluster')}, memory cap "
        f"{cm.get('mem_cap_fraction')} of usable GPU memory); planner clock {spec.planner_clock}, "
        f"charged planning time: {spec.planner_time}"
    )
    if cm.get("auto_fallback"):
        print(f"note: {cm['auto_fallback']}")
    rows = [
        ("median step time", _fmt(summary.step_time_s, " s")),
        ("  of which executed", _fmt(out.executed_s if out else None, " s")),
        ("median lower bound", _fmt(summary.lower_bound_s, " s") + " at the cap"),
        ("  at physical memory", _fmt(out.lower_bound_physical_s if out else None, " s")),
        ("step / bound", _ratio(summary.step_time_s, summary.lower_bound_s)),
        ("  idle share of GPU time", _pct(summary.imbalance) + " (median imbalance)"),
        ("median comm share", _fmt(out.comm_share if out else None)),
        ("peak memory", _fmt(summary.peak_mem_gib, " GiB")),
        ("OOM steps", _fmt(summary.oom_steps)),
        ("steps over the cap", _fmt(out.over_cap_steps if out else None)),
        ("median MFU", _fmt(summary.mfu)),
        ("median planner CPU time", _fmt(summary.planner_ms, " ms")),
        ("tokens/s", _fmt(summary.tokens_per_s)),
    ]
    width = max(len(k) for k, _ in rows)
    for key, val in rows:
        print(f"  {key:<{width}}  {val}")
    return 0 if summary.status == "ok" else 3
