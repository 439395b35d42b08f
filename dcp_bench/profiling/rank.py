"""One profiling rank: what every process of a profile measures.

`dcp_bench.profiling.run` starts ``nproc`` of these under torchrun (``python -m
torch.distributed.run ... -m dcp_bench.profiling.rank --request R --out O``), as runs start their
ranks (`dcp_bench.run.torch_run`); a one-rank profile runs `measure_rank` in the calling process.
Each rank measures, in order: the training step's own costs (CPU: `layers.step_costs`, the
runtime's `TrainingState` step at the request's ZeRO stage, and the process's memory), the
collectives, every layer grid point with its SP groups running at once, and the model without
layers. Rank 0 writes the result (JSON) to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from dcp_bench.cost.profile_artifact import attention_pairs
from dcp_bench.cost.specs import model_spec
from dcp_bench.profiling import layers as layer_cases
from dcp_bench.profiling.collectives import measure_collectives
from dcp_bench.profiling.module_timing import ModuleTiming, measure_interleaved, measure_module
from dcp_bench.profiling.request import ProfileRequest, grid_points, sample_shapes, shape_counts
from dcp_bench.run.torch_run import write_rank_error
from dcp_bench.runtime.attention import SPContext
from dcp_bench.runtime.device import backend_for
from dcp_bench.runtime.groups import ProcessGroupPool

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
PG_TIMEOUT_S = 300  # a collective waiting longer fails (as a run's ``train.pg_timeout_s``)


def request_payload(req: ProfileRequest) -> dict[str, Any]:
    """``req`` as JSON-ready data (`request_from_payload` reads it back)."""
    out: dict[str, Any] = {f: getattr(req, f) for f in req.__dataclass_fields__ if f != "model"}
    model = {f: getattr(req.model, f) for f in req.model.__dataclass_fields__}
    model["patch"] = list(req.model.patch)
    return {**out, "model": model}


def request_from_payload(data: dict[str, Any]) -> ProfileRequest:
    data = dict(data)
    return ProfileRequest(model=model_spec(**data.pop("model")), **data)


def _report(entry: dict[str, Any]) -> None:
    msg = (
        "out of memory"
        if entry.get("oom")
        else (
            f"fwd {entry['fwd_s']['median'] * 1e3:.1f} ms, bwd "
            f"{entry['bwd_s']['median'] * 1e3:.1f} ms"
        )
    )
    print(
        f"  nproc {entry['nproc']} sp {entry['sp']} {entry['shape']:6s} "
        f"{entry['tokens_per_rank']:7d} tok/rank: {msg}",
        file=sys.stderr,
        flush=True,
    )


def _step_entry(
    req: ProfileRequest, device: torch.device, dtype: torch.dtype, world: int
) -> dict[str, Any] | None:
    """CPU: the step's costs and the process's memory (`layers.step_costs`), first, while the
    process holds nothing else. The memory points: the grid's sizes from 256 tokens up, as one
    sample and packed as densely as the grid packs (allocation patterns, and so the allocator's
    retention, differ with tensor sizes: glibc serves blocks under 32 MiB from its heap)."""
    if device.type != "cpu":
        return None
    model = req.model
    sizes = [t for t in sorted(req.tokens) if t >= 256] or sorted(req.tokens)[-1:]
    shapes = [("single", 1)] + (
        [("packed", max(req.packed_samples))] if "packed" in req.shapes else []
    )
    batches = [
        sample_shapes(model, t, shape, n, req.video_spatial, 1)
        for t in sizes
        for shape, n in shapes
    ]
    step_samples = sample_shapes(model, min(req.tokens), "single", 1, req.video_spatial, 1)
    costs = layer_cases.step_costs(
        model, device, dtype, req.reps, req.warmup, req.zero_stage, step_samples, batches
    )
    return {"nproc": world, **costs}


def _grid_entries(
    req: ProfileRequest, world: int, rank: int, pool: ProcessGroupPool | None
) -> tuple[list[dict[str, Any]], list[SPContext]]:
    """The layer grid's entries (sizes only) and this rank's SP context of each."""
    entries: list[dict[str, Any]] = []
    contexts = []
    for point in grid_points(req, world):
        sp = point["sp"]
        pg = pool.get(range(rank // sp * sp, rank // sp * sp + sp)) if pool is not None else None
        contexts.append(layer_cases.sp_context(sp, rank % sp, pg))
        tokens = [t for t, _ in point["samples"]]
        frames = [f for _, f in point["samples"]]
        pairs = float(attention_pairs(np.array(tokens), np.array(frames), req.model.arch).sum())
        entries.append(
            {
                "nproc": world,
                "sp": sp,
                "shape": point["shape"],
                "n_samples": len(tokens),
                "sample_tokens": tokens,
                "sample_frames": frames,
                "pairs_per_rank": pairs / sp,
                "tokens_per_rank": sum(tokens) // sp,
            }
        )
    return entries, contexts


def _time_layers(
    req: ProfileRequest,
    device: torch.device,
    dtype: torch.dtype,
    world: int,
    rank: int,
    pool: ProcessGroupPool | None,
) -> list[dict[str, Any]]:
    """Every layer grid point, timed. CPU grids are small: all cases at once, repetition-major
    (`measure_interleaved`); on CUDA one point at a time, a point too large for the device
    recorded as such (``oom``) and left out of the fits."""
    one_layer = layer_cases.one_layer_model(req.model, device, dtype)
    entries, contexts = _grid_entries(req, world, rank, pool)
    if device.type == "cpu":
        cases = [
            layer_cases.layer_case(
                one_layer, ctx, list(zip(e["sample_tokens"], e["sample_frames"])), dtype
            )
            for ctx, e in zip(contexts, entries)
        ]
        results = measure_interleaved(
            [ModuleTiming(c.module, c.fn, c.make_input, ckpt_fn=c.ckpt_fn) for c in cases],
            req.reps,
            req.warmup,
        )
        for entry, case, res in zip(entries, cases, results):
            entry["tokens_per_rank"] = case.tokens_per_rank
            entry.update(res)
        if rank == 0:
            for entry in entries:
                _report(entry)
        return entries
    for ctx, entry in zip(contexts, entries):
        try:
            samples = list(zip(entry["sample_tokens"], entry["sample_frames"]))
            case = layer_cases.layer_case(one_layer, ctx, samples, dtype)
            entry["tokens_per_rank"] = case.tokens_per_rank
            entry.update(
                measure_module(
                    case.module,
                    case.fn,
                    case.make_input,
                    req.reps,
                    req.warmup,
                    ckpt_fn=case.ckpt_fn,
                )
            )
        except torch.cuda.OutOfMemoryError:
            entry["oom"] = True
        finally:
            case = None  # type: ignore[assignment]
            torch.cuda.empty_cache()
        if rank == 0:
            _report(entry)
    return entries


def _time_outer(
    req: ProfileRequest, device: torch.device, dtype: torch.dtype, world: int
) -> list[dict[str, Any]]:
    """The model without layers (embedding, head, loss) and its input building, at each grid
    size up to ``outer_max_tokens`` and each shape."""
    out: list[dict[str, Any]] = []
    no_layers = layer_cases.no_layer_model(req.model, device, dtype)
    for tpr in req.tokens:
        if tpr > req.outer_max_tokens:
            continue
        for shape, n in shape_counts(req):
            samples = sample_shapes(req.model, tpr, shape, n, req.video_spatial, 1)
            try:
                case = layer_cases.outer_case(no_layers, samples, dtype)
                m = measure_module(
                    case.module, case.fn, case.make_input, req.reps, req.warmup, ckpt=False
                )
                inputs = layer_cases.time_inputs(no_layers, samples, req.reps, req.warmup)
                out.append(
                    {
                        "nproc": world,
                        "sp": 1,
                        "shape": shape,
                        "n_samples": len(samples),
                        "tokens_per_rank": case.tokens_per_rank,
                        "fwd_s": m["fwd_s"],
                        "bwd_s": m["bwd_s"],
                        "inputs_s": inputs,
                        "act_bytes": m["act_bytes"],
                    }
                )
            except torch.cuda.OutOfMemoryError:
                out.append(
                    {
                        "nproc": world,
                        "sp": 1,
                        "shape": shape,
                        "n_samples": n,
                        "tokens_per_rank": tpr,
                        "oom": True,
                    }
                )
            finally:
                case = None  # type: ignore[assignment]
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    return out


def measure_rank(
    req: ProfileRequest, rank: int, world: int, device: torch.device
) -> dict[str, Any]:
    """Everything one rank measures (the process group, when ``world`` > 1, is initialised).
    Collective: every rank of the world calls it. The result is complete on rank 0 (``static``
    and ``step`` are rank 0's, already reduced over ranks where that matters)."""
    torch.set_num_threads(req.threads_per_rank)
    torch.manual_seed(1234 + rank)
    if rank == req.fail_rank:
        raise RuntimeError(f"injected failure on profiling rank {rank} (fail_rank)")
    pool = ProcessGroupPool(timeout_s=PG_TIMEOUT_S) if world > 1 else None
    dtype = DTYPES[req.dtype]
    result: dict[str, Any] = {"layers": [], "outer": [], "collectives": []}
    step = _step_entry(req, device, dtype, world)
    if req.collectives and pool is not None:
        groups = [g for g in (2, 4, 8, 16, 32, 64) if g <= world]
        result["collectives"] = measure_collectives(
            req.collective_bytes, groups, req.reps, req.warmup, pool
        )
    result["layers"] = _time_layers(req, device, dtype, world, rank, pool)
    if req.outer:
        result["outer"] = _time_outer(req, device, dtype, world)
    if rank == 0:
        result["static"] = layer_cases.static_costs(req.model, device, dtype, req.reps, req.warmup)
        result["step"] = step
    return result


def rank_main(req: ProfileRequest, out_path: str) -> None:
    """One rank under torchrun (RANK, WORLD_SIZE, LOCAL_RANK set): join the world, measure,
    rank 0 writes the result, and leave together."""
    device = torch.device(req.device)
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    dist.init_process_group(backend_for("auto", device), timeout=timedelta(seconds=PG_TIMEOUT_S))
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        result = measure_rank(req, rank, world, device)
        if rank == 0:
            Path(out_path).write_text(json.dumps(result))
        # Leave together: a rank tearing down its gloo context while its peer still works (rank 0
        # measures the static costs alone) can abort the process at exit.
        dist.barrier()
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="one rank of a dcp-bench profile (started by torchrun)"
    )
    parser.add_argument(
        "--request", required=True, help="the ProfileRequest as JSON (request_payload)"
    )
    parser.add_argument("--out", required=True, help="where rank 0 writes the result")
    args = parser.parse_args(argv)
    try:
        rank_main(request_from_payload(json.loads(Path(args.request).read_text())), args.out)
        return 0
    except Exception as exc:
        write_rank_error(exc)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
