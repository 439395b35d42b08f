"""`dcp-bench plan`: one step's plan, summarised or as JSON, for inspection. The command parses its
arguments, calls `dcp_bench.run.plan_inspection` (the step's batch, the plan, its summary figures
or its check against every plan rule) and prints."""

from __future__ import annotations

import argparse

NAME = "plan"
HELP = (
    "the plan a method makes for one global batch (e.g. `dcp-bench plan workload=videosys_zipf "
    "method=dcp cluster=h200x32 model=stdit3_xl2 step=0`): a summary by default, the whole plan "
    "as JSON with --json or --out PATH (StepPlan.from_json reads it back); --validate checks it "
    "against every plan rule and prints each offence"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="config overrides: workload=, method=, cluster=, model=, step=K, seed=",
    )
    parser.add_argument("--json", action="store_true", help="print the whole plan as JSON")
    parser.add_argument(
        "--out", default=None, metavar="PATH", help="write the whole plan as JSON to PATH"
    )
    parser.add_argument(
        "--no-validate", action="store_true", help="show the plan even if the validator rejects it"
    )
    parser.add_argument(
        "--validate",
        action="store_true",
        help="check the plan against every plan rule (memory under the cap included) and print "
        "each offence in words; exit status 1 when there is one",
    )


def run(args: argparse.Namespace) -> int:
    from dcp_bench.errors import ConfigError
    from dcp_bench.files import atomic_write_text, check_output
    from dcp_bench.run.plan_inspection import check_step_plan, digest, load_step, plan_step

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
    inp = load_step(overrides, step)
    spec, batch, cost = inp.spec, inp.batch, inp.parts.cost
    if args.validate:
        check = check_step_plan(inp)
        head = (
            f"{spec.label} on step {step} of {spec.workload_name} ({batch.n} samples), "
            f"{spec.cluster.name}, {spec.model.name}"
        )
        if check.raised is not None:
            print(f"{head}: the planner raised {check.raised}")
            return 1
        if not check.offences:
            print(
                f"{head}: valid plan ({check.rules} rules checked, memory against the "
                f"{check.memory_cap_gib:.1f} GiB cap of the {cost.source} cost model)"
            )
            return 0
        print(
            f"{head}: {len(check.offences)} offence(s) against the plan rules (docs/extending.md):"
        )
        for line in check.offences:
            print(f"  - {line}")
        return 1
    planned = plan_step(inp, validate=not args.no_validate)
    plan = planned.plan
    if args.out:
        atomic_write_text(args.out, plan.to_json())
    if args.json:
        print(plan.to_json())
        return 0
    d = digest(planned)
    print(
        f"plan of {spec.label} for step {step} of {spec.workload_name} (seed {spec.seed}) on "
        f"{spec.cluster.name} ({spec.world_size} ranks), {spec.model.name}"
    )
    print(
        f"  batch: {batch.n} samples, {batch.total_tokens} tokens; plan covers {d.covered_samples}"
    )
    print(
        f"  rounds {d.rounds}, groups {d.groups}, micro-batches {d.micro_batches}; micro-batches "
        f"per SP degree {d.micro_batches_per_sp}"
    )
    print(
        f"  simulated step {d.step_time_s:.4g} s (lower bound {d.lower_bound_s:.4g} s), peak "
        f"memory {d.peak_mem_gib:.3g} GiB, planner {planned.planner_ms:.1f} ms ({cost.source} "
        "cost model)"
    )
    print(
        "  whole plan: --json (stdout) or --out PATH"
        + (f"; written to {args.out}" if args.out else "")
    )
    return 0
