"""`dcp-bench plan`: print one step's plan as JSON, for inspection."""

from __future__ import annotations

import argparse
import time

NAME = "plan"
HELP = (
    "print the plan a method makes for one global batch as JSON (e.g. `dcp-bench plan "
    "workload=videosys_zipf method=dcp cluster=h200x32 model=stdit3_xl2 step=0`); "
    "StepPlan.from_json reads it back"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="config overrides: workload=, method=, cluster=, model=, step=K, seed=")
    parser.add_argument("--no-validate", action="store_true",
                        help="print the plan even if the validator rejects it")


def run(args: argparse.Namespace) -> int:
    from dcp_bench.config import load_config
    from dcp_bench.cost import resolve_cluster, resolve_model
    from dcp_bench.errors import ConfigError
    from dcp_bench.plan import validate_plan
    from dcp_bench.planners.base import make_planner
    from dcp_bench.sim import cost_model_from_config
    from dcp_bench.workload import make_workload

    step, overrides = 0, []
    for ov in args.overrides:
        key, sep, value = ov.partition("=")
        if sep and key == "step":
            try:
                step = int(value)
            except ValueError:
                raise ConfigError(f"step={value!r}: expected a non-negative integer") from None
            if step < 0:
                raise ConfigError(f"step={step}: expected a non-negative integer")
        else:
            overrides.append(ov)
    cfg = load_config(overrides)
    cluster, model = resolve_cluster(cfg["cluster"]), resolve_model(cfg["model"])
    cost = cost_model_from_config(cfg)
    batch = make_workload(cfg["workload"]).global_batch(step, cluster.world_size, model.max_seq_len)
    planner = make_planner(cfg["method"])
    t0 = time.perf_counter()
    plan = planner.plan(batch, cost)
    planner_ms = (time.perf_counter() - t0) * 1e3
    if not args.no_validate:
        validate_plan(plan, batch, cost)
    plan.info = {
        **plan.info,
        "planner_ms": planner_ms,
        "batch": {
            "step": batch.step,
            "sample_ids": batch.sample_ids.tolist(),
            "tokens": batch.tokens.tolist(),
            "frames": batch.frames.tolist(),
        },
        "cost_model": cost.describe(),
    }
    print(plan.to_json())
    return 0
