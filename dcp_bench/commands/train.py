"""`dcp-bench train`: real distributed training of one method on one workload (torchrun
underneath; gloo on CPU, NCCL on CUDA), through the same run path as simulate and sweep."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
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


def resolve_train_config(overrides: list[str], notes: list[str] | None = None) -> dict[str, Any]:
    """The composed config for a real run: without ``cluster=`` the ``cpu`` cluster when no GPU
    is present; without ``model=`` the tiny model matching the workload's kind; executor torch."""
    import torch

    from dcp_bench.config import load_config, to_container
    from dcp_bench.errors import ConfigError
    from dcp_bench.workloads import make_workload

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
        ovs = [*ovs, f"model={'tiny_stdit' if kind == 'video' else 'tiny_llama'}"]
        cfg = to_container(load_config(ovs))
    sizing = cpu_sizing(cfg, keys, torch.cuda.is_available())
    if sizing:
        cfg = to_container(load_config([*ovs, *sizing]))
        full = cfg["workload"].get("tokens_per_gpu")
        if notes is not None:
            notes.append(f"CPU-sized workload: {' '.join(sizing)} (about {CPU_TOKENS_PER_RANK} tokens per rank a "
                         f"step, lengths divided by the scale and capped; the workload's full size, {full} tokens "
                         "per rank: add workload.length_scale=1)")
    return cfg


# A real run on a CPU with a tiny model: lengths scaled so that a rank's step holds about this many
# tokens, and capped, so that a step takes seconds (ShareGPT at full size: ~90 s a step on a quiet
# 2-core machine). Any of `CPU_SIZING_KEYS` given on the command line keeps the workload as it is.
CPU_TOKENS_PER_RANK = 2048
CPU_MAX_LEN = 2048
CPU_SIZING_KEYS = ("workload.length_scale", "workload.tokens_per_gpu", "workload.samples_per_step",
                   "workload.max_len")


def cpu_sizing(cfg: dict[str, Any], keys: set[str], cuda: bool) -> list[str]:
    """The overrides that CPU-size the run (none on a GPU, for a model other than the tiny ones,
    or when the command line sizes the workload itself)."""
    model = cfg.get("model") or {}
    work = cfg.get("workload") or {}
    cluster = cfg.get("cluster") or {}
    cpu = str(cluster.get("name", "")) == "cpu" and (str((cfg.get("train") or {}).get("device", "auto")) == "cpu"
                                                   or not cuda)
    if not cpu or not str(model.get("name", "")).startswith("tiny_") or keys & set(CPU_SIZING_KEYS):
        return []
    budget = work.get("tokens_per_gpu")
    if work.get("samples_per_step") is not None or isinstance(budget, bool) or not isinstance(budget, (int, float)):
        return []
    scale = max(1, math.ceil(float(budget) / CPU_TOKENS_PER_RANK))
    current = work.get("length_scale", 1)
    out = [] if "length_scale" not in work or not isinstance(current, (int, float)) or current >= scale \
        else [f"workload.length_scale={scale}"]
    if "max_len" in work and (work["max_len"] is None or int(work["max_len"]) > CPU_MAX_LEN):
        out.append(f"workload.max_len={CPU_MAX_LEN}")
    return out


def _note(message: str) -> None:
    sys.stderr.write(f"dcp-bench: {message}\n")
    sys.stderr.flush()


def _device(spec: Any) -> str:
    import torch

    if spec.train.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return str(spec.train.device)


def run(args: argparse.Namespace) -> int:
    from dcp_bench.campaign.sweep import check_run_places
    from dcp_bench.records import executing
    from dcp_bench.run.memory_precheck import check_memory_fits
    from dcp_bench.run.spec import parse_run_spec
    from dcp_bench.run.torch_run import check_local_ranks, launch_torch_run

    notes: list[str] = []
    spec = parse_run_spec(resolve_train_config(list(args.overrides), notes))
    # refuse, before any process starts, more ranks than this node may run, then a run whose
    # plans need more memory than this machine has
    check_local_ranks(spec)
    check_run_places([spec])
    check_memory_fits(spec, _device(spec))
    for note in notes:
        _note(note)
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
