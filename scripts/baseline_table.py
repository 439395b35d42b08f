#!/usr/bin/env python
"""Simulated step time per workload x method at 32 H200s: the baselines (and DCP where shipped).

Text workloads run Llama-3-8B, video workloads STDiT3-XL/2 (``--all-models``: both). For each
workload, ``--steps`` global batches (the same batches for every method) are planned and
simulated with `dcp_bench.sim.simulate_step` on the analytical cost model (no noise); the table
shows the median simulated step time in seconds, the batch's lower bound, and for the tuned
static baseline the configuration its grid search chose. Provenance: simulated on the analytical
cost model's constants, not measured.

    python scripts/baseline_table.py --steps 2
    python scripts/baseline_table.py --methods bucket_static dcp --workloads prolong --csv out.csv
"""

from __future__ import annotations

import argparse
import csv
import time

import numpy as np

from dcp_bench.config import group_choices, load_config
from dcp_bench.cost import make_cost_model
from dcp_bench.errors import DcpBenchError
from dcp_bench.planners.base import make_planner
from dcp_bench.sim import lower_bound, simulate_step
from dcp_bench.workload import load_workload

BASELINES = ["bucket_static", "static_tuned", "packed_static", "megatron_hybrid_cp", "flexsp_milp", "wlb_llm"]
MODEL_FOR_KIND = {"text": "llama3_8b", "video": "stdit3_xl2"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    shipped = set(group_choices("method"))
    default_methods = [m for m in [*BASELINES, "dcp"] if m in shipped]
    ap.add_argument("--methods", nargs="+", default=default_methods)
    ap.add_argument("--workloads", nargs="+", default=None, help="default: every shipped workload but lengths_file")
    ap.add_argument("--cluster", default="h200x32")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--all-models", action="store_true")
    ap.add_argument("--csv", default=None, help="write one row per (workload, model, method, step)")
    args = ap.parse_args(argv)

    workloads = args.workloads or [w for w in group_choices("workload") if w != "lengths_file"]
    rows: list[dict[str, object]] = []
    head = "| workload | model | lower bound s | " + " | ".join(f"{m} s" for m in args.methods) + " |"
    print(head)
    print("|---|---|---|" + "---|" * len(args.methods))
    notes: list[str] = []
    for wname in workloads:
        wl = load_workload(wname)
        models = ["llama3_8b", "stdit3_xl2"] if args.all_models else [MODEL_FOR_KIND.get(wl.kind, "llama3_8b")]
        for model in models:
            cost = make_cost_model(model, args.cluster)
            W = cost.cluster.world_size
            batches = [wl.global_batch(s, W, cost.model.max_seq_len) for s in range(args.steps)]
            lbs = [lower_bound(b, cost, infeasible="skip") for b in batches]
            cells = []
            for m in args.methods:
                planner = make_planner(load_config([f"method={m}"]).method)  # fresh state per workload
                times: list[float] = []
                failure = ""
                for b in batches:
                    try:
                        t0 = time.perf_counter()
                        plan = planner.plan(b, cost)
                        plan_s = time.perf_counter() - t0
                        res = simulate_step(plan, b, cost)
                    except DcpBenchError as exc:
                        failure = type(exc).__name__
                        break
                    times.append(res.step_time_s)
                    rows.append({"workload": wname, "model": model, "method": m, "step": b.step,
                                 "step_time_s": res.step_time_s, "lower_bound_s": lbs[b.step],
                                 "plan_s": plan_s, "tokens": res.tokens, "oom": res.oom,
                                 "info": {k: v for k, v in plan.info.items() if k in ("tuned_config", "status", "sp")}})
                    if m == "static_tuned" and b.step == 0:
                        notes.append(f"{wname}/{model}: static_tuned chose {plan.info.get('tuned_config')}")
                cells.append(failure or f"{np.median(times):.3f}")
            print(f"| {wname} | {model} | {np.median(lbs):.3f} | " + " | ".join(cells) + " |", flush=True)
    for n in notes:
        print(f"- {n}")
    print(f"\n{args.steps} step(s) per cell, median; {args.cluster}; analytical cost model (simulated, not measured).")
    if args.csv:
        with open(args.csv, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
