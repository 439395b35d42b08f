"""`dcp-bench train`: real distributed training of one method on one workload (torchrun
underneath; gloo on CPU, NCCL on CUDA), through the same run path as simulate and sweep. The
command parses its arguments and calls `dcp_bench.campaign.one_run.train_one`; the config a real
run gets from its command line is `dcp_bench.run.train_config.resolve_train_config`."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

NAME = "train"
HELP = (
    "train for real under torchrun: `dcp-bench train workload=W method=M [model=X] nproc=4 steps=N "
    "seed=S [--json]` (gloo on CPU, NCCL on CUDA; steps = measured steps, after run.warmup_steps); "
    "writes run records"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "overrides",
        nargs="*",
        help=(
            "key=value overrides: workload=, method=, model=, cluster=, steps=, warmup_steps=, "
            "seed=, nproc=, timeout_s= (whole run), mem_cap_fraction=, workload.length_scale=, "
            "train.lr= (lr=), train.grad_clip=, train.threads=, train.pg_timeout_s=, campaign=, "
            "root="
        ),
    )
    parser.add_argument(
        "--json", action="store_true", help="print the run summary (with per-step losses) as JSON"
    )


def _note(message: str) -> None:
    sys.stderr.write(f"dcp-bench: {message}\n")
    sys.stderr.flush()


def run(args: argparse.Namespace) -> int:
    from dcp_bench.campaign.one_run import train_one

    spec, summary = train_one(list(args.overrides), say=_note)
    if args.json:
        print(json.dumps(dataclasses.asdict(summary), indent=2, sort_keys=True, default=str))
    else:
        st = summary.step_time_s
        losses = summary.training.losses if summary.training else ()
        print(
            f"{summary.method} on {summary.workload} ({summary.model}, {summary.hardware}): "
            f"status {summary.status}, {summary.n_steps} measured steps, median step "
            f"{st if st is None else f'{st:.3f} s'}, final loss {losses[-1] if losses else None}, "
            f"records in {spec.root}/{spec.campaign}/{spec.run_id}"
        )
        if summary.error:
            print(f"error: {summary.error}")
    return 0 if summary.status == "ok" else 3
