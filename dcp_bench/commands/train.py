"""`dcp-bench train`: real distributed training of one method on one workload (torchrun
underneath; gloo on CPU, NCCL on CUDA)."""

from __future__ import annotations

import argparse
import json
from typing import Any

NAME = "train"
HELP = (
    "train for real under torchrun: `dcp-bench train workload=W method=M model=X nproc=4 steps=N "
    "seed=S [--json]` (gloo on CPU, NCCL on CUDA); writes run records"
)

# Overrides consumed by the launcher rather than the config (value parsers).
SETTING_KEYS: dict[str, Any] = {
    "nproc": int,
    "lr": float,
    "grad_clip": lambda v: None if v.lower() in ("null", "none") else float(v),
    "backend": str,
    "device": str,
    "threads": int,
    "timeout_s": float,
    "run_timeout_s": lambda v: None if v.lower() in ("null", "none") else float(v),
    "fail_rank": int,
    "fail_step": int,
    "run_id": str,
}

# Keys of the `run` config group accepted at the top level (``steps=20`` means ``run.steps=20``).
RUN_KEYS = ("steps", "warmup_steps", "root", "campaign")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "overrides",
        nargs="*",
        help="key=value overrides: workload=, method=, model=, cluster=, steps=, seed=, "
        "mem_cap_fraction=, workload.length_scale=, and launcher settings nproc=, lr=, grad_clip=, "
        "backend=, device=, threads=, timeout_s=, run_timeout_s=, run_id=",
    )
    parser.add_argument("--json", action="store_true", help="print the run summary (with per-step losses) as JSON")


def split_overrides(overrides: list[str]) -> tuple[list[str], dict[str, Any]]:
    """Separate launcher settings from config overrides."""
    from dcp_bench.errors import ConfigError

    config_ovs: list[str] = []
    settings: dict[str, Any] = {}
    for ov in overrides:
        key, sep, value = ov.partition("=")
        if sep and key in RUN_KEYS:
            config_ovs.append(f"run.{key}={value}")  # the spelling of the issue: steps=N
        elif sep and key in SETTING_KEYS:
            try:
                settings[key] = SETTING_KEYS[key](value)
            except ValueError:
                raise ConfigError(f"bad value for {key}: {value!r}") from None
        else:
            config_ovs.append(ov)
    return config_ovs, settings


def resolve_train_config(overrides: list[str]) -> dict[str, Any]:
    """The composed config for a CPU-or-GPU training run: without ``cluster=`` the ``cpu`` cluster
    is used when no GPU is present; without ``model=`` the tiny model matching the workload's kind."""
    import torch

    from dcp_bench.config import load_config, to_container
    from dcp_bench.errors import ConfigError

    keys = {ov.partition("=")[0].lstrip("+~") for ov in overrides}
    if "workload" not in keys:
        raise ConfigError("train needs workload=NAME (see `dcp-bench workloads`)")
    if "method" not in keys:
        raise ConfigError("train needs method=NAME (one of dcp_bench/conf/method)")
    ovs = list(overrides)
    if "cluster" not in keys and not torch.cuda.is_available():
        ovs.append("cluster=cpu")
    cfg = to_container(load_config(ovs))
    if "model" not in keys:
        from dcp_bench.workload import make_workload

        kind = getattr(make_workload(cfg["workload"]), "kind", "text")
        cfg = to_container(load_config([*ovs, f"model={'tiny_stdit' if kind == 'video' else 'tiny_llama'}"]))
    # As in sweeps, the run's seed also picks the global batches (unless workload.seed is given).
    if "workload.seed" not in keys and isinstance(cfg.get("workload"), dict):
        cfg["workload"]["seed"] = cfg.get("seed", 0)
    return cfg


def run(args: argparse.Namespace) -> int:
    from dcp_bench.errors import ConfigError
    from dcp_bench.runtime.launch import TrainSettings, launch_train

    config_ovs, raw = split_overrides(list(args.overrides))
    nproc = raw.get("nproc", 4)
    if nproc < 1 or nproc & (nproc - 1):
        raise ConfigError(f"nproc={nproc}: expected a power of two (aligned SP groups tile such worlds only)")
    cfg = resolve_train_config(config_ovs)
    run_cfg = dict(cfg.get("run") or {})
    settings = TrainSettings(
        steps=int(run_cfg.get("steps", 20)),
        warmup_steps=int(run_cfg.get("warmup_steps", 2)),
        seed=int(cfg.get("seed", 0)),
        root=str(run_cfg.get("root", "runs")),
        campaign=str(run_cfg.get("campaign", "default")),
        **raw,
    )
    if not settings.run_id:
        settings.run_id = f"{cfg['method'].get('name', 'method')}-{cfg['workload'].get('name', 'workload')}-{cfg['model'].get('name', 'model')}-n{settings.nproc}-s{settings.seed}"
    summary = launch_train(cfg, settings)
    if args.json:
        print(json.dumps(summary, indent=2, sort_keys=True, default=str))
    else:
        st = summary.get("step_time_s")
        losses = summary.get("extra", {}).get("losses", [])
        print(
            f"{summary['method']} on {summary['workload']} ({summary['model']}, {summary['hardware']}): "
            f"status {summary['status']}, median step {st if st is None else f'{st:.3f} s'}, "
            f"final loss {losses[-1] if losses else None}, records in {summary.get('extra', {}).get('run_dir')}"
        )
    return 0 if summary.get("status") == "ok" else 3
