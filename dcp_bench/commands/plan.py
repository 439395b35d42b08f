"""`dcp-bench plan`: one step's plan, summarised or as JSON, for inspection."""

from __future__ import annotations

import argparse
import time
from collections import Counter
from typing import Any

NAME = "plan"
HELP = (
    "the plan a method makes for one global batch (e.g. `dcp-bench plan workload=videosys_zipf "
    "method=dcp cluster=h200x32 model=stdit3_xl2 step=0`): a summary by default, the whole plan as "
    "JSON with --json or --out PATH (StepPlan.from_json reads it back); --validate checks it against "
    "every plan rule and prints each offence"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="config overrides: workload=, method=, cluster=, model=, step=K, seed=")
    parser.add_argument("--json", action="store_true", help="print the whole plan as JSON")
    parser.add_argument("--out", default=None, metavar="PATH", help="write the whole plan as JSON to PATH")
    parser.add_argument("--no-validate", action="store_true",
                        help="show the plan even if the validator rejects it")
    parser.add_argument("--validate", action="store_true",
                        help="check the plan against every plan rule (memory under the cap included) and print "
                             "each offence in words; exit status 1 when there is one")


def run(args: argparse.Namespace) -> int:
    from dcp_bench.config import load_config, to_container
    from dcp_bench.errors import ConfigError
    from dcp_bench.files import atomic_write_text, check_output
    from dcp_bench.plan import check_is_plan, validate_plan
    from dcp_bench.run.assemble import assemble
    from dcp_bench.run.spec import parse_run_spec
    from dcp_bench.sim import lower_bound, simulate_step

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
    if args.out:
        check_output(args.out, "--out", folder=False)
    spec = parse_run_spec(to_container(load_config(overrides)))
    parts = assemble(spec)
    batch = parts.workload.global_batch(step, spec.world_size, spec.model.max_seq_len)
    if args.validate:
        return check_plan(spec, parts, batch, step)
    t0 = time.perf_counter()
    plan = check_is_plan(parts.planner.plan(batch, parts.plan_cost), f"planner {type(parts.planner).__name__}.plan")
    planner_ms = (time.perf_counter() - t0) * 1e3
    if not args.no_validate:
        validate_plan(plan, batch, parts.cost)
    plan.info = {
        **plan.info,
        "planner_ms": planner_ms,
        "batch": {"step": batch.step, "sample_ids": batch.sample_ids.tolist(), "tokens": batch.tokens.tolist(),
                  "frames": batch.frames.tolist()},
        "cost_model": parts.cost.describe(),
    }
    if args.out:
        atomic_write_text(args.out, plan.to_json())
    if args.json:
        print(plan.to_json())
        return 0
    sim = simulate_step(plan, batch, parts.cost)
    sp = Counter(g.size for _, g, _ in plan.micro_batches())
    print(f"plan of {spec.label} for step {step} of {spec.workload_name} (seed {spec.seed}) on {spec.cluster.name} "
          f"({spec.world_size} ranks), {spec.model.name}")
    print(f"  batch: {batch.n} samples, {batch.total_tokens} tokens; plan covers {len(set(plan.sample_positions()))}")
    print(f"  rounds {len(plan.rounds)}, groups {sum(len(r.groups) for r in plan.rounds)}, micro-batches "
          f"{sum(1 for _ in plan.micro_batches())}; micro-batches per SP degree {dict(sorted(sp.items()))}")
    print(f"  simulated step {sim.step_time_s:.4g} s (lower bound {lower_bound(batch, parts.cost, infeasible='skip'):.4g} s), "
          f"peak memory {sim.peak_mem_gib:.3g} GiB, planner {planner_ms:.1f} ms ({parts.cost.source} cost model)")
    print("  whole plan: --json (stdout) or --out PATH" + (f"; written to {args.out}" if args.out else ""))
    return 0


def check_plan(spec: Any, parts: Any, batch: Any, step: int) -> int:
    """`plan --validate`: the plan's offences against every rule, in words; 0 when it has none,
    1 when it has some or the planner raised."""
    import traceback

    from dcp_bench.plan import PLAN_RULES, check_is_plan, plan_offences

    head = f"{spec.label} on step {step} of {spec.workload_name} ({batch.n} samples), {spec.cluster.name}, {spec.model.name}"
    try:
        plan = check_is_plan(parts.planner.plan(batch, parts.plan_cost), f"planner {type(parts.planner).__name__}.plan")
    except Exception as exc:  # the check reports a planner that fails instead of crashing with it
        where = traceback.extract_tb(exc.__traceback__)[-1]
        print(f"{head}: the planner raised {type(exc).__name__}: {exc} ({where.filename}:{where.lineno})")
        return 1
    offences = plan_offences(plan, batch, parts.cost)
    if not offences:
        print(f"{head}: valid plan ({len(PLAN_RULES)} rules checked, memory against the "
              f"{parts.cost.memory_cap_bytes / 2**30:.1f} GiB cap of the {parts.cost.source} cost model)")
        return 0
    print(f"{head}: {len(offences)} offence(s) against the plan rules (docs/extending.md):")
    for line in offences:
        print(f"  - {line}")
    return 1
