"""Running a profile: spawn the ranks, measure the grid, assemble the artifact.

`ProfileRequest` is the whole grid. `run_profile` spawns ``nproc`` gloo (CPU) processes per
entry of ``nprocs`` — ranks share the machine's cores, so a profile measured with 4 ranks
describes 4-rank training — and each rank measures every grid point with its SP groups running
at once. Rank 0 returns the points through a file; nothing is cached between runs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dcp_bench.cost.profile_artifact import KIND, SCHEMA_VERSION, attention_pairs
from dcp_bench.cost.specs import ModelSpec
from dcp_bench.errors import ConfigError


@dataclass
class ProfileRequest:
    """What to measure. ``tokens`` are tokens per rank; a grid point with SP degree ``sp`` runs
    samples of ``tokens * sp`` tokens in total over its group."""

    model: ModelSpec
    tokens: list[int] = field(default_factory=lambda: [256, 512, 1024, 2048])
    sp: list[int] = field(default_factory=lambda: [1, 2])
    shapes: list[str] = field(default_factory=lambda: ["single", "packed"])
    # samples per packed grid point: one packed point per count (many short samples per
    # micro-batch pin the per-sample cost of the runtime's loops over samples)
    packed_samples: list[int] = field(default_factory=lambda: [4])
    nprocs: list[int] = field(default_factory=lambda: [2])
    reps: int = 5
    warmup: int = 1
    collective_bytes: list[int] = field(
        default_factory=lambda: [1 << 12, 1 << 15, 1 << 18, 1 << 20, 1 << 22]
    )
    threads_per_rank: int = 1
    device: str = "cpu"
    dtype: str = "fp32"
    outer: bool = True
    outer_max_tokens: int = 1 << 20  # the LM head's fp32 logits grow with tokens x vocab
    video_spatial: int = 256  # patches per latent frame of the profiled video samples
    collectives: bool = True
    ceilings: bool = False

    def check(self) -> None:
        if not self.tokens or min(self.tokens) < 1:
            raise ConfigError(f"profile.tokens must be positive token counts, got {self.tokens}")
        for s in self.sp:
            if s < 1 or s & (s - 1):
                raise ConfigError(f"profile.sp: {s} is not a power of two")
        for n in self.nprocs:
            if n < 1:
                raise ConfigError(f"nproc must be >= 1, got {n}")
        if isinstance(self.packed_samples, int):  # one count, as older requests wrote it
            self.packed_samples = [self.packed_samples]
        if not self.packed_samples or min(self.packed_samples) < 2:
            raise ConfigError(f"profile.packed_samples must be counts >= 2, got {self.packed_samples}")
        if self.reps < 1 or self.warmup < 0:
            raise ConfigError(f"profile.reps must be >= 1 and warmup >= 0 (got {self.reps}, {self.warmup})")
        bad = set(self.shapes) - {"single", "packed"}
        if bad:
            raise ConfigError(f"profile.shapes: {sorted(bad)}; expected 'single' and/or 'packed'")
        if self.dtype not in ("fp32", "bf16", "fp16"):
            raise ConfigError(f"profile.dtype {self.dtype!r}; expected fp32, bf16 or fp16")
        if self.device not in ("cpu", "cuda"):
            raise ConfigError(f"profile.device {self.device!r}; expected cpu or cuda")
        if self.device == "cuda" and max(self.nprocs) > 1:
            raise ConfigError("profile.device=cuda measures one device: use nproc=1")


def sample_shapes(
    model: ModelSpec, total: int, shape: str, packed: int, video_spatial: int = 256, sp: int = 1
) -> list[tuple[int, int]]:
    """(tokens, frames) of the samples of one grid point holding ``total`` tokens.

    Text: one sample of ``total`` tokens, or ``packed`` equal samples. Video: frames of up to
    ``video_spatial`` patches, with at least ``sp`` frames so that DSP's frame sharding needs no
    padding; packing splits the frames while each sample keeps ``sp`` of them, else the patches.
    """
    n = 1 if shape == "single" else packed
    if model.arch == "llama":
        return [(total // n, 1)] * n
    spatial = max(1, min(video_spatial, total // sp))
    frames = max(1, total // spatial)
    if n == 1:
        return [(frames * spatial, frames)]
    if frames // n >= sp:
        f = frames // n
        return [(f * spatial, f)] * n
    s = max(1, spatial // n)
    return [(s * frames, frames)] * n


def shape_counts(req: ProfileRequest) -> list[tuple[str, int]]:
    """(shape, samples) of every grid shape: ``single`` is one sample, ``packed`` one entry per
    count in ``packed_samples``."""
    out: list[tuple[str, int]] = []
    for shape in req.shapes:
        if shape == "single":
            out.append(("single", 1))
        else:
            out += [("packed", int(n)) for n in req.packed_samples]
    return out


def grid_points(req: ProfileRequest, world: int) -> list[dict[str, Any]]:
    """The layer grid a world of ``world`` ranks measures (SP degrees above it are skipped)."""
    out = []
    for sp in req.sp:
        if sp > world:
            continue
        for tpr in req.tokens:
            for shape, n in shape_counts(req):
                samples = sample_shapes(req.model, tpr * sp, shape, n, req.video_spatial, sp)
                out.append({"sp": sp, "tokens_per_rank_target": tpr, "shape": shape, "samples": samples})
    return out


def _report(entry: dict[str, Any]) -> None:
    msg = "out of memory" if entry.get("oom") else (
        f"fwd {entry['fwd_s']['median'] * 1e3:.1f} ms, bwd {entry['bwd_s']['median'] * 1e3:.1f} ms"
    )
    print(
        f"  nproc {entry['nproc']} sp {entry['sp']} {entry['shape']:6s} "
        f"{entry['tokens_per_rank']:7d} tok/rank: {msg}",
        file=sys.stderr, flush=True,
    )


def _worker(rank: int, world: int, init_file: str, req_json: str, out_path: str) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import numpy as np
    import torch
    import torch.distributed as dist

    from dcp_bench.cost.specs import model_spec
    from dcp_bench.profiling import layers as layer_cases
    from dcp_bench.profiling.collectives import measure_collectives
    from dcp_bench.profiling.module_timing import ModuleTiming, measure_interleaved, measure_module
    from dcp_bench.runtime.groups import ProcessGroupPool

    req_d = json.loads(req_json)
    model = model_spec(**req_d.pop("model"))
    req = ProfileRequest(model=model, **req_d)
    torch.set_num_threads(req.threads_per_rank)
    torch.manual_seed(1234 + rank)
    if world > 1:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        pool = ProcessGroupPool() if world > 1 else None
        device = torch.device(req.device)
        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[req.dtype]
        result: dict[str, Any] = {"layers": [], "outer": [], "collectives": []}
        step_costs: dict[str, Any] = {}
        if device.type == "cpu":
            # first, while the process holds nothing else: its memory baseline and what one
            # step's gradient sync and optimizer step cost on the whole model
            # the memory points: the grid's sizes from 256 tokens up, as one sample and packed as
            # densely as the grid packs (allocation patterns, and so the allocator's retention,
            # differ with tensor sizes: glibc serves blocks under 32 MiB from its heap)
            sizes = [t for t in sorted(req.tokens) if t >= 256] or sorted(req.tokens)[-1:]
            shapes = [("single", 1)] + ([("packed", max(req.packed_samples))] if "packed" in req.shapes else [])
            batches = [sample_shapes(model, t, shape, n, req.video_spatial, 1) for t in sizes for shape, n in shapes]
            step_costs = layer_cases.step_costs(model, device, dtype, req.reps, req.warmup, batches)
        if req.collectives and pool is not None:
            result["collectives"] = measure_collectives(
                req.collective_bytes, [g for g in (2, 4, 8, 16, 32, 64) if g <= world],
                req.reps, req.warmup, pool,
            )
        one_layer = layer_cases.one_layer_model(model, device, dtype)
        entries: list[dict[str, Any]] = []
        contexts = []
        for point in grid_points(req, world):
            sp = point["sp"]
            pg = pool.get(range(rank // sp * sp, rank // sp * sp + sp)) if pool is not None else None
            contexts.append(layer_cases.sp_context(sp, rank % sp, pg))
            tokens = [t for t, _ in point["samples"]]
            frames = [f for _, f in point["samples"]]
            pairs = float(attention_pairs(np.array(tokens), np.array(frames), model.arch).sum())
            entries.append({
                "nproc": world, "sp": sp, "shape": point["shape"], "n_samples": len(tokens),
                "sample_tokens": tokens, "sample_frames": frames, "pairs_per_rank": pairs / sp,
                "tokens_per_rank": sum(tokens) // sp,
            })
        if device.type == "cpu":
            # CPU grids are small: all cases at once, repetition-major (see measure_interleaved)
            cases = [
                layer_cases.layer_case(one_layer, ctx, list(zip(e["sample_tokens"], e["sample_frames"])), dtype)
                for ctx, e in zip(contexts, entries)
            ]
            results = measure_interleaved(
                [ModuleTiming(c.module, c.fn, c.make_input) for c in cases], req.reps, req.warmup
            )
            for entry, case, res in zip(entries, cases, results):
                entry["tokens_per_rank"] = case.tokens_per_rank
                entry.update(res)
            del cases
        else:
            for ctx, entry in zip(contexts, entries):
                try:
                    samples = list(zip(entry["sample_tokens"], entry["sample_frames"]))
                    case = layer_cases.layer_case(one_layer, ctx, samples, dtype)
                    entry["tokens_per_rank"] = case.tokens_per_rank
                    entry.update(measure_module(case.module, case.fn, case.make_input, req.reps, req.warmup))
                except torch.cuda.OutOfMemoryError:
                    # a point too large for the device is recorded as such and left out of the fits
                    entry["oom"] = True
                finally:
                    case = None  # type: ignore[assignment]
                    torch.cuda.empty_cache()
                if rank == 0:
                    _report(entry)
        if rank == 0 and device.type == "cpu":
            for entry in entries:
                _report(entry)
        result["layers"] = entries
        del one_layer
        if req.outer:
            no_layers = layer_cases.no_layer_model(model, device, dtype)
            for tpr in req.tokens:
                if tpr > req.outer_max_tokens:
                    continue
                for shape, n in shape_counts(req):
                    samples = sample_shapes(model, tpr, shape, n, req.video_spatial, 1)
                    try:
                        case = layer_cases.outer_case(no_layers, samples, dtype)
                        m = measure_module(case.module, case.fn, case.make_input, req.reps, req.warmup, ckpt=False)
                        inputs = layer_cases.time_inputs(no_layers, samples, req.reps, req.warmup)
                        result["outer"].append({
                            "nproc": world, "sp": 1, "shape": shape, "n_samples": len(samples),
                            "tokens_per_rank": case.tokens_per_rank, "fwd_s": m["fwd_s"], "bwd_s": m["bwd_s"],
                            "inputs_s": inputs, "act_bytes": m["act_bytes"],
                        })
                    except torch.cuda.OutOfMemoryError:
                        result["outer"].append({"nproc": world, "sp": 1, "shape": shape, "n_samples": n,
                                                "tokens_per_rank": tpr, "oom": True})
                    finally:
                        case = None  # type: ignore[assignment]
                        if device.type == "cuda":
                            torch.cuda.empty_cache()
            del no_layers
        if rank == 0:
            result["static"] = layer_cases.static_costs(model, device, dtype, req.reps, req.warmup)
            result["step"] = {"nproc": world, **step_costs} if step_costs else None
            Path(out_path).write_text(json.dumps(result))
        if world > 1:
            # Leave together: a rank tearing down its gloo context while its peer still works
            # (rank 0 measures the static costs alone) can abort the process at exit.
            dist.barrier()
    finally:
        if world > 1:
            dist.destroy_process_group()


def _spawn(req: ProfileRequest, nproc: int) -> dict[str, Any]:
    import torch.multiprocessing as mp

    req_d = dataclasses.asdict(req)
    req_d["model"] = dataclasses.asdict(req.model)
    req_d["model"]["patch"] = list(req.model.patch)
    with tempfile.TemporaryDirectory(prefix="dcp-profile-") as tmp:
        init_file = os.path.join(tmp, "init")
        out_path = os.path.join(tmp, "result.json")
        if nproc == 1:
            _worker(0, 1, init_file, json.dumps(req_d), out_path)
        else:
            try:
                mp.spawn(_worker, args=(nproc, init_file, json.dumps(req_d), out_path), nprocs=nproc, join=True)
            except mp.ProcessExitedException as exc:
                # A rank killed by a signal after rank 0 wrote the complete result (gloo can abort
                # in the process-group teardown even after a barrier) loses no measurement; any
                # other exit, or a missing result, is the failure it is.
                if exc.exit_code >= 0 or not Path(out_path).exists():
                    raise
                sys.stderr.write(f"note: profiling rank {exc.error_index} ended by signal {-exc.exit_code} after "
                                 "the result was written; the result is complete\n")
        return json.loads(Path(out_path).read_text())


def software_versions() -> dict[str, Any]:
    from dcp_bench.envinfo import collect_env

    env = collect_env()
    deps = env.get("dependencies", {})
    return {
        "python": env["python"], "torch": env["torch"], "numpy": _version("numpy"),
        "dcp_bench": env.get("dcp_bench"), "cuda": env.get("cuda"), "nccl": env.get("nccl"),
        "flash_attn": deps.get("flash-attn"), "git_sha": env.get("git_sha"),
        "git_dirty": env.get("git_dirty"),
    }


def _version(name: str) -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def hardware_description() -> dict[str, Any]:
    from dcp_bench.envinfo import collect_env

    env = collect_env()
    keys = ("cpu_model", "cpu_cores", "memory_bytes", "gpu_model", "gpu_count", "platform", "hostname")
    return {k: env.get(k) for k in keys}


def run_profile(req: ProfileRequest, command: str = "") -> dict[str, Any]:
    """Measure everything ``req`` asks for and return the artifact (not yet written)."""
    req.check()
    started = time.time()
    layers: list[dict[str, Any]] = []
    outer: list[dict[str, Any]] = []
    colls: list[dict[str, Any]] = []
    static: dict[str, Any] = {}
    steps: list[dict[str, Any]] = []
    for nproc in req.nprocs:
        part = _spawn(req, nproc)
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
            "device": req.device, "dtype": req.dtype, "threads_per_rank": req.threads_per_rank,
            "nprocs": req.nprocs, "reps": req.reps, "warmup": req.warmup,
            "grid": {"tokens_per_rank": req.tokens, "sp": req.sp, "shapes": req.shapes,
                     "packed_samples": req.packed_samples, "collective_bytes": req.collective_bytes,
                     "video_spatial": req.video_spatial},
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
        "cost": {"wall_s": round(finished - started, 2), "started_at": started,
                 "finished_at": finished, "command": command},
    }


def measure_ceilings(device_name: str, dtype_name: str) -> dict[str, Any]:
    import torch

    from dcp_bench.profiling.ceilings import copy_ceiling, matmul_ceiling

    device = torch.device(device_name)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype_name]
    big = device.type == "cuda"
    return {
        "matmul": [matmul_ceiling(device, dtype, n) for n in ((4096, 8192) if big else (256, 512))],
        "copy": [copy_ceiling(device, n) for n in ((1 << 28, 1 << 30) if big else (1 << 22,))],
    }
