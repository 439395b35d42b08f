#!/usr/bin/env python
"""Simulated step time / lower bound, per workload, cluster size and method.

For every shipped workload (text ones with llama3_8b, video ones with stdit3_xl2, or both models
with --all-models) on 8, 16, 32 and 64 H200s, plan ``--steps`` global batches with each method,
simulate each plan (`dcp_bench.sim.simulate_step`, analytical cost model, no noise) and divide
the step time by the batch's lower bound (`dcp_bench.sim.lower_bound`). Prints a markdown table
of medians and, with --csv, writes every step. Provenance: the analytical cost model's constants
(simulated, not measured).

    python scripts/planner_table.py                      # dcp and dcp_inter_pac
    python scripts/planner_table.py --methods dcp dcp_inter_pac bucket_static --steps 5
"""

from __future__ import annotations

import argparse
import csv
import sys
import time

import numpy as np

from dcp_bench.config import group_choices, load_config
from dcp_bench.cost import make_cost_model
from dcp_bench.errors import DcpBenchError
from dcp_bench.planners.base import make_planner
from dcp_bench.sim import lower_bound, simulate_step
from dcp_bench.workload import load_workload

CLUSTERS = {8: "h200x8", 16: "h200x16", 32: "h200x32", 64: "h200x64"}
MODEL_FOR_KIND = {"text": "llama3_8b", "video": "stdit3_xl2"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", nargs="+", default=["dcp", "dcp_inter_pac"])
    ap.add_argument("--workloads", nargs="+", default=None, help="default: every shipped workload but lengths_file")
    ap.add_argument("--gpus", nargs="+", type=int, default=[8, 16, 32, 64])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--all-models", action="store_true", help="run every workload with both models")
    ap.add_argument("--csv", default=None)
    args = ap.parse_args(argv)

    workloads = args.workloads or [w for w in group_choices("workload") if w != "lengths_file"]
    planners = {m: make_planner(load_config([f"method={m}"]).method) for m in args.methods}
    rows: list[dict[str, object]] = []
    print("| workload | model | GPUs | " + " | ".join(f"{m} step/LB" for m in args.methods) + " | dcp plan ms |")
    print("|---|---|---|" + "---|" * (len(args.methods) + 1))
    for wname in workloads:
        wl = load_workload(wname)
        models = ["llama3_8b", "stdit3_xl2"] if args.all_models else [MODEL_FOR_KIND.get(wl.kind, "llama3_8b")]
        for model in models:
            for W in args.gpus:
                cost = make_cost_model(model, CLUSTERS[W])
                ratios: dict[str, list[float]] = {m: [] for m in args.methods}
                plan_ms: list[float] = []
                for step in range(args.steps):
                    batch = wl.global_batch(step, W, cost.model.max_seq_len)
                    lb = lower_bound(batch, cost, infeasible="skip")
                    for m, planner in planners.items():
                        t0 = time.perf_counter()
                        try:
                            plan = planner.plan(batch, cost)
                        except DcpBenchError as exc:
                            print(f"  {wname} {model} {W} {m}: {exc}", file=sys.stderr)
                            ratios[m].append(float("nan"))
                            continue
                        dt = time.perf_counter() - t0
                        if m == "dcp":
                            plan_ms.append(dt * 1e3)
                        res = simulate_step(plan, batch, cost)
                        # Paper-mode plans see fewer samples: compare per seen sample.
                        seen = plan.info.get("samples_seen", batch.n) or 1
                        r = res.step_time_s / lb * (batch.n / seen)
                        ratios[m].append(r)
                        rows.append(
                            {"workload": wname, "model": model, "gpus": W, "step": step, "method": m,
                             "samples": batch.n, "step_time_s": res.step_time_s, "lower_bound_s": lb,
                             "ratio": r, "plan_ms": dt * 1e3, "oom": res.oom}
                        )
                cells = [f"{np.nanmedian(ratios[m]):.3f}" if ratios[m] else "-" for m in args.methods]
                pm = f"{np.median(plan_ms):.1f}" if plan_ms else "-"
                print(f"| {wname} | {model} | {W} | " + " | ".join(cells) + f" | {pm} |", flush=True)
    if args.csv:
        with open(args.csv, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
