"""Running a profile: launch the ranks, measure the grid, assemble the artifact, write it.

`run_profile` starts ``nproc`` ranks per entry of ``nprocs`` through torchrun, as runs start theirs
(`launch_ranks`) — ranks share the machine's cores, so a profile measured with 4 ranks describes
4-rank training — and each rank (`dcp_bench.profiling.rank`) measures every grid point with its SP
groups running at once, and the training step the runtime runs at the request's ZeRO stage. Rank 0
returns the points through a file; nothing is cached between runs. `profile_to_file` is what
``dcp-bench profile`` calls: the profile, then (CPU) a real training rank's baseline
(`measure_rank_baseline`), written as one artifact.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from dcp_bench.archs import arch_of
from dcp_bench.config import load_config, to_container
from dcp_bench.cost.profile_artifact import KIND, SCHEMA_VERSION, dumps_artifact
from dcp_bench.cost.specs import ModelSpec
from dcp_bench.envinfo import collect_env
from dcp_bench.errors import DcpBenchError
from dcp_bench.files import atomic_write_text
from dcp_bench.profiling.ceilings import copy_ceiling, matmul_ceiling
from dcp_bench.profiling.rank import DTYPES, measure_rank, request_payload
from dcp_bench.profiling.request import ProfileRequest
from dcp_bench.records import read_steps
from dcp_bench.run.spec import parse_run_spec
from dcp_bench.run.torch_run import RANK_ERROR_MARK, error_tail, launch_torch_run, run_session
from dcp_bench.runtime.device import backend_for
from dcp_bench.runtime.step_meter import load_average_1m
from dcp_bench.train_policy import precision_policy, static_state_bytes


class ProfileError(DcpBenchError):
    """A profile whose ranks failed, or were ended at the time limit."""


def launch_ranks(req: ProfileRequest, nproc: int) -> dict[str, Any]:
    """Measure with ``nproc`` ranks and return rank 0's result. More than one rank: started as
    runs start theirs (torchrun, in a process session of its own, every process marked, the whole
    tree ended after the exit or at ``req.timeout_s``: `dcp_bench.run.torch_run`); a rank that
    fails makes torchrun end the others, and the profile fails with that rank's error. One rank:
    measured in this process (a process group of one is made for the training step when none
    exists)."""
    if nproc == 1:
        return _measure_here(req)
    with tempfile.TemporaryDirectory(prefix="dcp-profile-") as tmp:
        request_path = os.path.join(tmp, "request.json")
        out_path = os.path.join(tmp, "result.json")
        Path(request_path).write_text(json.dumps(request_payload(req)))
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(nproc),
            "--max-restarts",
            "0",
            "-m",
            "dcp_bench.profiling.rank",
            "--request",
            request_path,
            "--out",
            out_path,
        ]
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", str(req.threads_per_rank))
        code, stderr, survivors = run_session(cmd, env, req.timeout_s)
        sys.stderr.write(
            "".join(ln + "\n" for ln in stderr.splitlines() if ln.startswith("  nproc "))
        )
        if survivors:
            raise ProfileError(
                f"{len(survivors)} process(es) of the {nproc}-rank profile could not be stopped "
                f"(pids {', '.join(map(str, survivors[:8]))})"
            )
        if code is None:
            raise ProfileError(
                f"the {nproc}-rank profile of {req.model.name} passed profile.timeout_s="
                f"{req.timeout_s:g} s; every process it started was ended"
            )
        written = Path(out_path).exists()
        if code != 0 and (not written or RANK_ERROR_MARK in stderr):
            raise ProfileError(
                f"the {nproc}-rank profile of {req.model.name} failed (torchrun exit {code}): "
                f"{error_tail(stderr)}"
            )
        if code != 0:
            # A rank ended by a signal after rank 0 wrote the complete result (gloo can abort in
            # the process group's teardown even after a barrier) loses no measurement.
            sys.stderr.write(
                "note: a profiling rank ended abnormally after the result was written (torchrun "
                f"exit {code}: {error_tail(stderr)}); the result is complete\n"
            )
        return dict(json.loads(Path(out_path).read_text()))


def _measure_here(req: ProfileRequest) -> dict[str, Any]:
    """One rank, in this process: a one-rank process group (the training state of ZeRO stages
    1-3 needs one) unless this process already has one."""
    device = torch.device(req.device, 0) if req.device == "cuda" else torch.device("cpu")
    if dist.is_initialized():
        return measure_rank(req, 0, 1, device)
    with tempfile.TemporaryDirectory(prefix="dcp-profile-") as tmp:
        dist.init_process_group(
            backend_for("auto", device), init_method=f"file://{tmp}/pg", rank=0, world_size=1
        )
        try:
            return measure_rank(req, 0, 1, device)
        finally:
            dist.destroy_process_group()


def software_versions() -> dict[str, Any]:
    env = collect_env()
    deps = env.get("dependencies", {})
    return {
        "python": env["python"],
        "torch": env["torch"],
        "numpy": _version("numpy"),
        "dcp_bench": env.get("dcp_bench"),
        "cuda": env.get("cuda"),
        "nccl": env.get("nccl"),
        "flash_attn": deps.get("flash-attn"),
        "git_sha": env.get("git_sha"),
        "git_dirty": env.get("git_dirty"),
    }


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def hardware_description() -> dict[str, Any]:
    env = collect_env()
    keys = (
        "cpu_model",
        "cpu_cores",
        "memory_bytes",
        "gpu_model",
        "gpu_count",
        "platform",
        "hostname",
    )
    return {k: env.get(k) for k in keys}


def run_profile(req: ProfileRequest, command: str = "") -> dict[str, Any]:
    """Measure everything ``req`` asks for and return the artifact (not yet written)."""
    req.check()
    started = time.time()
    load_start = load_average_1m()
    layers: list[dict[str, Any]] = []
    outer: list[dict[str, Any]] = []
    colls: list[dict[str, Any]] = []
    static: dict[str, Any] = {}
    steps: list[dict[str, Any]] = []
    for nproc in req.nprocs:
        part = launch_ranks(req, nproc)
        layers += part["layers"]
        outer += part["outer"]
        colls += part["collectives"]
        static = part["static"]
        if part.get("step"):
            steps.append(part["step"])
    ceilings: dict[str, Any] = {}
    if req.ceilings:
        ceilings = measure_ceilings(req.device, req.dtype)
    finished = time.time()
    model_d = dataclasses.asdict(req.model)
    model_d["patch"] = list(req.model.patch)
    return {
        "kind": KIND,
        "schema_version": SCHEMA_VERSION,
        "model": model_d,
        "hardware": hardware_description(),
        "software": software_versions(),
        "settings": {
            "device": req.device,
            "dtype": req.dtype,
            "threads_per_rank": req.threads_per_rank,
            "nprocs": req.nprocs,
            "reps": req.reps,
            "warmup": req.warmup,
            "grid": {
                "tokens_per_rank": req.tokens,
                "sp": req.sp,
                "shapes": req.shapes,
                "packed_samples": req.packed_samples,
                "collective_bytes": req.collective_bytes,
                "video_spatial": req.video_spatial,
            },
            "zero_stage": req.zero_stage,
            "step_method": (
                "TrainingState.finish_step (dcp_bench.runtime.training) of the whole model at "
                f"ZeRO stage {req.zero_stage}, after one micro-batch's backward"
            ),
            "memory_method": "bytes saved by autograd (saved_tensors_hooks), parameters excluded; "
            "static.process_baseline_bytes: resident set of a rank ready to train, "
            "minus its parameters, gradients and optimizer state (CPU)",
        },
        "layers": layers,
        "outer": outer,
        "collectives": colls,
        "static": static,
        "steps": steps,
        "ceilings": ceilings,
        "cost": {
            "wall_s": round(finished - started, 2),
            "started_at": started,
            "finished_at": finished,
            # the machine's 1-minute load average when the measurement started and ended: the
            # timings on a machine shared with other work depend on it
            "load_avg_1m": [load_start, load_average_1m()],
            "command": command,
        },
    }


def measure_ceilings(device_name: str, dtype_name: str) -> dict[str, Any]:
    device = torch.device(device_name)
    dtype = DTYPES[dtype_name]
    big = device.type == "cuda"
    return {
        "matmul": [matmul_ceiling(device, dtype, n) for n in ((4096, 8192) if big else (256, 512))],
        "copy": [copy_ceiling(device, n) for n in ((1 << 28, 1 << 30) if big else (1 << 22,))],
    }


def measure_rank_baseline(
    model: ModelSpec, nproc: int, static: dict[str, Any], zero_stage: int
) -> dict[str, Any]:
    """The resident baseline of a real training rank (CPU): a short `dcp-bench train`-style run
    of ``nproc`` ranks at ``zero_stage`` under torchrun on near-empty batches (16-token samples),
    its largest measured peak resident set (`dcp_bench.runtime.step_meter`) minus parameters,
    gradients and AdamW state as that stage holds them. A torchrun rank holds more than a
    profiling process (its own process-group store, the run loop, the records), which the
    profiled model's workspace must include; the profiling process's own figure is kept as
    ``process_baseline_bytes_profiler``."""
    workload = (
        ["workload=videosys_zipf", "workload.length_scale=4096", "workload.tokens_per_gpu=4096"]
        if arch_of(model).video
        else ["workload=synthetic_fixed", "workload.length=16", "workload.tokens_per_gpu=64"]
    )
    with tempfile.TemporaryDirectory(prefix="dcp-baseline-") as tmp:
        cfg = to_container(
            load_config(
                [
                    f"model={model.name}",
                    "cluster=cpu",
                    f"nproc={nproc}",
                    *workload,
                    "method=bucket_static",
                    "run.executor=torch",
                    "run.steps=3",
                    "run.warmup_steps=1",
                    f"run.root={tmp}",
                    "run.campaign=baseline",
                    "run.timeout_s=300",
                    "cost.source=analytical",
                    f"cost.zero_stage={zero_stage}",
                ]
            )
        )
        summary = launch_torch_run(parse_run_spec(cfg))
        if summary.status != "ok":
            raise ProfileError(
                f"the rank baseline run of {model.name} on {nproc} ranks failed: {summary.error}"
            )
        steps = [s for s in read_steps(Path(tmp) / "baseline" / summary.run_id) if not s.warmup]
    peak = max(max(s.peak_mem_per_rank_gib or [0.0]) for s in steps) * 2**30
    # the training states the run's ranks held (its ZeRO stage and precision: `train_policy`)
    states = static_state_bytes(
        int(static["params"]),
        int(static.get("layer_params") or 0),
        nproc,
        zero_stage,
        precision_policy(model.dtype),
    )
    held = float(sum(states.values()))
    return {
        "process_baseline_bytes": int(peak - held),
        "process_baseline_method": (
            f"peak resident set of a {nproc}-rank torchrun training run at ZeRO stage "
            f"{zero_stage} on 16-token samples, minus parameters, gradients and AdamW state"
        ),
    }


def profile_to_file(
    req: ProfileRequest, out: Path, command: str = "", rank_baseline: bool = True
) -> dict[str, Any]:
    """`run_profile`, then on CPU (``rank_baseline``) a real training rank's baseline per world
    size (`measure_rank_baseline`); the artifact written to ``out`` and returned."""
    artifact = run_profile(req, command=command)
    if req.device == "cpu" and rank_baseline:
        for entry in artifact.get("steps", []):
            entry.update(
                measure_rank_baseline(
                    req.model, int(entry["nproc"]), artifact["static"], req.zero_stage
                )
            )
        artifact["cost"]["wall_s"] = round(time.time() - artifact["cost"]["started_at"], 2)
    atomic_write_text(out, dumps_artifact(artifact))
    return artifact
