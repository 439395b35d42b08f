"""`dcp-bench train`: real distributed training of one method on one workload (torchrun
underneath; gloo on CPU, NCCL on CUDA), through the same run path as simulate and sweep."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

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
        help="key=value overrides: workload=, method=, model=, cluster=, steps=, warmup_steps=, seed=, "
        "nproc=, timeout_s= (whole run), mem_cap_fraction=, workload.length_scale=, train.lr= (lr=), "
        "train.grad_clip=, train.threads=, train.pg_timeout_s=, campaign=, root=",
    )
    parser.add_argument("--json", action="store_true", help="print the run summary (with per-step losses) as JSON")


def resolve_train_config(overrides: list[str]) -> dict[str, Any]:
    """The composed config for a real run: without ``cluster=`` the ``cpu`` cluster when no GPU
    is present; without ``model=`` the tiny model matching the workload's kind; executor torch."""
    import torch

    from dcp_bench.config import load_config, to_container
    from dcp_bench.errors import ConfigError
    from dcp_bench.workload import make_workload

    keys = {ov.partition("=")[0].lstrip("+~") for ov in overrides}
    if "workload" not in keys:
        raise ConfigError("train needs workload=NAME (see `dcp-bench workloads list`)")
    if "method" not in keys:
        raise ConfigError("train needs method=NAME (one of dcp_bench/conf/method)")
    ovs = [*overrides, "run.executor=torch", "run.campaign=train"] if "campaign" not in keys and "run.campaign" not in keys \
        else [*overrides, "run.executor=torch"]
    if "cluster" not in keys and not torch.cuda.is_available():
        ovs.append("cluster=cpu")
    cfg = to_container(load_config(ovs))
    if "model" not in keys:
        kind = getattr(make_workload(cfg["workload"]), "kind", "text")
        cfg = to_container(load_config([*ovs, f"model={'tiny_stdit' if kind == 'video' else 'tiny_llama'}"]))
    return cfg


def _note(message: str) -> None:
    sys.stderr.write(f"dcp-bench: {message}\n")
    sys.stderr.flush()


def _device(spec: Any) -> str:
    import torch

    if spec.train.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return str(spec.train.device)


def run(args: argparse.Namespace) -> int:
    from dcp_bench.records import executing
    from dcp_bench.run.memory_precheck import check_memory_fits
    from dcp_bench.run.spec import parse_run_spec
    from dcp_bench.run.torch_run import check_local_ranks, launch_torch_run
    from dcp_bench.runner import check_run_places

    spec = parse_run_spec(resolve_train_config(list(args.overrides)))
    # refuse, before any process starts, more ranks than this node may run, then a run whose
    # plans need more memory than this machine has
    check_local_ranks(spec)
    check_run_places([spec])
    check_memory_fits(spec, _device(spec))
    with executing(Path(spec.root) / spec.campaign / spec.run_id, say=_note):  # one process per run id
        summary = launch_torch_run(spec)
    if args.json:
        print(json.dumps(dataclasses.asdict(summary), indent=2, sort_keys=True, default=str))
    else:
        st = summary.step_time_s
        losses = summary.extra.get("losses") or []
        print(
            f"{summary.method} on {summary.workload} ({summary.model}, {summary.hardware}): status {summary.status}, "
            f"{summary.n_steps} measured steps, median step {st if st is None else f'{st:.3f} s'}, "
            f"final loss {losses[-1] if losses else None}, records in {spec.root}/{spec.campaign}/{spec.run_id}"
        )
        if summary.error:
            print(f"error: {summary.error}")
    return 0 if summary.status == "ok" else 3
