"""Launching real training: torchrun underneath, gloo on CPU, NCCL on CUDA.

`launch_train` (what ``dcp-bench train`` calls) starts
``python -m torch.distributed.run --nproc-per-node N ... -m dcp_bench.runtime.launch`` with the
resolved config in a JSON file, waits for it, and reads back the run summary. Every rank runs
`worker_main`: it initialises the process group (with a timeout), builds the group pool, the model
(identical on every rank: seeded), the optimizer, the workload, the planner and the cost model; then
for every step:

1. barrier, start the clock;
2. rank 0 samples nothing new (every rank draws the same global batch from the workload), plans
   the step and broadcasts the plan (one planner, so planners with time limits cannot make ranks
   disagree); planner time is on the clock;
3. `execute_step`; barrier; stop the clock;
4. per-rank busy time and peak memory are gathered; rank 0 writes the step record.

A non-finite loss ends the run with status ``nonfinite``. A rank that raises exits non-zero;
torchrun then stops the other ranks (no restarts), and ranks blocked in a collective fail at the
process-group timeout, so a crash never hangs. Multi-node: run the same module under torchrun with
``--nnodes``/``--rdzv-endpoint`` (docs/runtime.md has a Slurm example).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from dcp_bench.errors import DcpBenchError


@dataclass
class TrainSettings:
    """Settings of a real training run (the ``train`` overrides that are not config groups)."""

    nproc: int = 4
    steps: int = 20
    warmup_steps: int = 2
    seed: int = 0
    lr: float = 1e-3
    grad_clip: float | None = 1.0
    backend: str = "auto"  # auto: nccl on CUDA, gloo otherwise
    device: str = "auto"  # auto | cpu | cuda
    threads: int = 1  # torch threads per rank on CPU (pinned: the thread count changes low bits)
    timeout_s: float = 300.0  # process-group timeout: a collective waiting longer fails
    run_timeout_s: float | None = None  # whole-run limit for the launcher
    root: str = "runs"
    campaign: str = "train"
    run_id: str = ""
    fail_rank: int = -1  # fault injection for tests: this rank raises ...
    fail_step: int = 0  # ... at the start of this step
    torchrun_args: tuple[str, ...] = ()  # extra torchrun arguments (e.g. multi-node rendezvous)


# A rank's failure is summarised on one stderr line after this mark, for the launcher's message.
RANK_ERROR_MARK = "dcp-bench rank failure:"


class TrainError(DcpBenchError):
    """A training run that failed (a rank crashed, timed out, or could not start)."""


def _torch_dtype(name: str) -> Any:
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[name]


def _worker_device(settings: TrainSettings) -> Any:
    import torch

    if settings.device == "cuda" or (settings.device == "auto" and torch.cuda.is_available()):
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu")


def _backend(settings: TrainSettings, device: Any) -> str:
    if settings.backend != "auto":
        return settings.backend
    return "nccl" if device.type == "cuda" else "gloo"


def _cluster_for_world(cluster: Any, world: int) -> Any:
    """The cluster spec resized to the launched world when they differ (e.g. 2 CPU ranks of the
    4-rank ``cpu`` cluster): one node of ``world`` ranks if it fits a node, else whole nodes."""
    if cluster.world_size == world:
        return cluster
    if world <= cluster.gpus_per_node:
        return dataclasses.replace(cluster, num_nodes=1, gpus_per_node=world)
    if world % cluster.gpus_per_node:
        raise TrainError(
            f"{world} ranks do not fill whole nodes of {cluster.gpus_per_node} GPUs (cluster {cluster.name!r})"
        )
    return dataclasses.replace(cluster, num_nodes=world // cluster.gpus_per_node)


def worker_main(config: dict[str, Any], settings: TrainSettings, summary_path: str | None) -> int:
    """One rank of a training run (started by torchrun: RANK, WORLD_SIZE, LOCAL_RANK set)."""
    import torch
    import torch.distributed as dist

    from dcp_bench.config import config_hash, instantiate
    from dcp_bench.cost import make_cost_model
    from dcp_bench.envinfo import collect_env
    from dcp_bench.plan import StepPlan, validate_plan
    from dcp_bench.planners.base import make_planner
    from dcp_bench.records import RunSummary, RunWriter, StepRecord
    from dcp_bench.runtime.executor import execute_step, gather_floats
    from dcp_bench.runtime.groups import ProcessGroupPool
    from dcp_bench.runtime.measure import describe_memory_measure
    from dcp_bench.runtime.models import build_model, param_count
    from dcp_bench.workload import make_workload

    torch.set_num_threads(max(1, settings.threads))
    device = _worker_device(settings)
    dist.init_process_group(_backend(settings, device), timeout=timedelta(seconds=settings.timeout_s))
    rank, world = dist.get_rank(), dist.get_world_size()
    started = time.time()
    try:
        pool = ProcessGroupPool(timeout_s=settings.timeout_s)
        spec = instantiate(config["model"])
        cluster = _cluster_for_world(instantiate(config["cluster"]), world)
        dtype = _torch_dtype(spec.dtype) if device.type == "cuda" else _torch_dtype("fp32")
        model = build_model(spec, seed=settings.seed, device=device, dtype=dtype)
        optimizer = torch.optim.AdamW(model.parameters(), lr=settings.lr, weight_decay=0.0)
        workload = make_workload(config["workload"])
        planner = make_planner(config["method"])
        cost = make_cost_model(spec, cluster, mem_cap_fraction=float(config.get("mem_cap_fraction", 0.7)))
        hardware = f"{world} x {'cuda ' + torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'} ranks ({_backend(settings, device)})"
        writer = RunWriter(
            settings.root,
            settings.campaign,
            settings.run_id or f"{config['method'].get('name', 'method')}-s{settings.seed}",
            config,
            env=collect_env() if rank == 0 else None,
            enabled=rank == 0,
        )
        status = "ok"
        error = None
        losses: list[float] = []
        for step in range(settings.steps):
            if step == settings.fail_step and rank == settings.fail_rank:
                raise RuntimeError(f"injected failure on rank {rank} at step {step}")
            batch = workload.global_batch(step, world, max_seq_len=spec.max_seq_len)
            dist.barrier()
            t0 = time.perf_counter()
            payload: list[Any] = [None, 0.0, None]
            if rank == 0:
                tp = time.perf_counter()
                try:
                    plan = planner.plan(batch, cost)
                    validate_plan(plan, batch, num_layers=spec.num_layers)
                    payload = [plan.to_dict(), time.perf_counter() - tp, None]
                except DcpBenchError as exc:
                    payload = [None, time.perf_counter() - tp, f"{type(exc).__name__}: {exc}"]
            dist.broadcast_object_list(payload, src=0)
            if payload[2] is not None:
                status, error = "error", f"step {step}: {payload[2]}"
                break
            plan = StepPlan.from_dict(payload[0])
            res = execute_step(plan, batch, model, optimizer, pool, seed=settings.seed, grad_clip=settings.grad_clip)
            dist.barrier()
            step_time = time.perf_counter() - t0
            per_rank = gather_floats([res.busy_s, float(res.peak_mem_bytes)], device=device)
            busy = [r[0] for r in per_rank]
            peaks = [r[1] / 2**30 for r in per_rank]
            idle = [max(step_time - b, 0.0) for b in busy]
            losses.append(res.loss)
            writer.add_step(
                StepRecord(
                    step=step,
                    step_time_s=step_time,
                    warmup=step < settings.warmup_steps,
                    planner_ms=1e3 * float(payload[1]),
                    tokens=res.tokens,
                    samples=res.samples,
                    samples_dropped=res.samples_dropped + batch.dropped,
                    samples_truncated=int(batch.truncated),
                    imbalance=sum(idle) / (world * step_time) if step_time > 0 else 0.0,
                    peak_mem_gib=max(peaks),
                    peak_mem_per_rank_gib=peaks,
                    busy_s=busy,
                    idle_s=idle,
                    loss=res.loss,
                    grad_norm=res.grad_norm,
                    extra={"rounds": len(plan.rounds), "micro_batches": sum(1 for _ in plan.micro_batches())},
                )
            )
            if not res.finite:
                status, error = "nonfinite", f"non-finite loss or gradient at step {step}"
                break
        measured = [s for s in writer.steps if not s.warmup and s.step_time_s is not None]
        times = sorted(s.step_time_s for s in measured if s.step_time_s is not None)
        total_t = sum(times)
        summary = RunSummary(
            run_id=writer.path.name,
            campaign=settings.campaign,
            status=status,  # type: ignore[arg-type]
            executor="torch",
            method=planner.label(),
            workload=str(config["workload"].get("name", "")),
            cluster=cluster.name,
            model=spec.name,
            seed=settings.seed,
            config_hash=config_hash(config, exclude=("seed",)),
            n_steps=len(measured),
            n_warmup=len(writer.steps) - len(measured),
            step_time_s=_median(times),
            imbalance=_median([s.imbalance for s in measured if s.imbalance is not None]),
            peak_mem_gib=max((s.peak_mem_gib for s in writer.steps if s.peak_mem_gib is not None), default=None),
            planner_ms=_median([s.planner_ms for s in measured]),
            tokens_per_s=(sum(s.tokens for s in measured) / total_t) if total_t > 0 else None,
            hardware=hardware,
            error=error,
            started_at=started,
            finished_at=time.time(),
            extra={
                "losses": losses,
                "grad_norms": [s.grad_norm for s in writer.steps],
                "step_times_s": [s.step_time_s for s in writer.steps],
                "world_size": world,
                "param_count": param_count(model),
                "memory_measure": describe_memory_measure(device),
                "lr": settings.lr,
                "threads": settings.threads,
                "run_dir": str(writer.path),
            },
        )
        if rank == 0:
            writer.finish(summary)
            if summary_path:
                Path(summary_path).write_text(json.dumps(dataclasses.asdict(summary), default=str))
        return 0 if status == "ok" else 3
    finally:
        dist.destroy_process_group()


def _median(values: list[float]) -> float | None:
    vals = sorted(v for v in values if v is not None and math.isfinite(v))
    if not vals:
        return None
    mid = len(vals) // 2
    return vals[mid] if len(vals) % 2 else 0.5 * (vals[mid - 1] + vals[mid])


def launch_train(config: dict[str, Any], settings: TrainSettings) -> dict[str, Any]:
    """Run training under torchrun and return the run summary (a dict). Raises `TrainError` when
    a rank fails, the run exceeds ``run_timeout_s``, or no summary comes back."""
    with tempfile.TemporaryDirectory(prefix="dcp-bench-train-") as tmp:
        cfg_path = Path(tmp) / "config.json"
        out_path = Path(tmp) / "summary.json"
        cfg_path.write_text(json.dumps({"config": config, "settings": dataclasses.asdict(settings)}, default=str))
        cmd = [
            sys.executable, "-m", "torch.distributed.run",
            *(settings.torchrun_args or ("--standalone",)),
            "--nproc-per-node", str(settings.nproc),
            "--max-restarts", "0",
            "-m", "dcp_bench.runtime.launch",
            "--config", str(cfg_path), "--summary", str(out_path),
        ]  # fmt: skip
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", str(settings.threads))
        for attempt in range(2):
            try:
                proc = subprocess.run(cmd, env=env, timeout=settings.run_timeout_s, capture_output=True, text=True)
            except subprocess.TimeoutExpired:
                raise TrainError(f"training did not finish within run_timeout_s={settings.run_timeout_s}") from None
            summary = json.loads(out_path.read_text()) if out_path.exists() else None
            if attempt == 0 and proc.returncode != 0 and summary is None and _is_launch_failure(proc.stderr):
                continue  # the launch itself failed (no rank trained): start it once more
            break
        if proc.returncode != 0 and (summary is None or summary.get("status") == "ok"):
            tail = _error_tail(proc.stderr)
            raise TrainError(f"training failed (torchrun exit {proc.returncode}): {tail}")
        if summary is None:
            raise TrainError(f"training wrote no summary: {_error_tail(proc.stderr)}")
        return dict(summary)


# Signs that torchrun's launch failed before any rank trained (a rendezvous that did not form, or
# a port taken between torchrun choosing it and a rank binding it). Such a launch is retried
# once; a failure inside a rank's training (marked with RANK_ERROR_MARK) never is.
LAUNCH_FAILURE_SIGNS = (
    "DistNetworkError",
    "EADDRINUSE",
    "Address already in use",
    "RendezvousError",
    "RendezvousConnectionError",
    "Connection refused",
    "Connection reset by peer",
)


def _is_launch_failure(stderr: str) -> bool:
    return RANK_ERROR_MARK not in stderr and any(sign in stderr for sign in LAUNCH_FAILURE_SIGNS)


def _error_tail(stderr: str) -> str:
    """The most telling line of the ranks' stderr: a rank's marked failure, else the last
    exception line that says more than torchrun's own "ChildFailedError"."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    marked = [ln[len(RANK_ERROR_MARK) :].strip() for ln in lines if ln.startswith(RANK_ERROR_MARK)]
    if marked:
        return marked[0][:500]
    for ln in reversed(lines):
        if "Error" in ln and not ln.startswith(("File ", "[")) and not ln.endswith("ChildFailedError:"):
            return ln[:500]
    return lines[-1][:500] if lines else "no output"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="one rank of dcp-bench train (started by torchrun)")
    parser.add_argument("--config", required=True)
    parser.add_argument("--summary", default=None)
    args = parser.parse_args(argv)
    data = json.loads(Path(args.config).read_text())
    raw = data["settings"]
    raw["torchrun_args"] = tuple(raw.get("torchrun_args") or ())
    settings = TrainSettings(**raw)
    try:
        return worker_main(data["config"], settings, args.summary)
    except Exception as exc:
        rank = os.environ.get("RANK", "?")
        sys.stderr.write(f"{traceback.format_exc()}{RANK_ERROR_MARK} rank {rank}: {type(exc).__name__}: {exc}\n")
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
