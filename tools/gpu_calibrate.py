"""GPU calibration on one device: matmul and copy ceilings, then per-layer time and memory of a
Llama-3-8B decoder layer (1K to 64K tokens) and an STDiT3-XL/2 spatial+temporal block pair (1K to
128K) in bf16, each written as a profile artifact (``<out>/<model>.json``, ``--out`` required:
nothing is written into the repository), rewritten after every point (``complete``/``pending``
say how far it got), so a kill loses at most the point in progress.

Every grid point is measured on its own (`dcp_bench.profiling.run.run_profile` with one size and
one shape), so a point that fails for any reason (out of memory, a kernel error, an unsupported
shape) is recorded and the next point still runs: out-of-memory points go into ``layers`` with
``oom: true`` (the profiled cost model leaves them out of its fits), other failures and the points
a time budget left out into ``failures`` with their error. Sizes run smallest first.

Run by ``scripts/gpu_check.sh`` (the whole GPU check) or ``scripts/gpu_calibrate.sh`` (this
alone); ``--device cpu --tiny`` is a dry run of the same code on the CPU test models (small
sizes, fp32) used by the test suite. Attention runs the runtime's kernel for the device
(`dcp_bench.runtime.attention.select_attention_kernel`: flash-attn or PyTorch's varlen flash
kernel in bf16 on CUDA, else fused SDPA). A one-device profile has no collective measurements;
the profiled cost model prices collectives analytically then.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from dcp_bench.cost.profile_artifact import dumps_artifact
from dcp_bench.cost.specs import ModelSpec, model_spec
from dcp_bench.files import atomic_write_text, sha256_file
from dcp_bench.profiling.request import ProfileRequest
from dcp_bench.profiling.run import measure_ceilings, run_profile

FULL_TOKENS = [1024 << i for i in range(8)]  # 1K .. 128K
FULL_MODELS = ("llama3_8b", "stdit3_xl2")
TINY_TOKENS = [64, 128, 256]
TINY_MODELS = ("tiny_llama", "tiny_stdit")
# 720p latents with patch 2x2: 90 x 160 / 4 = 3,600 patches per latent frame
VIDEO_SPATIAL = 3600
SHAPES = ("single", "packed")
# fp32 logits of 128K tokens x a 128K vocabulary would not fit beside the model
OUTER_MAX_TOKENS = 1 << 15


def point_request(
    spec: ModelSpec, tokens: int, shape: str, device: str, tiny: bool, reps: int
) -> ProfileRequest:
    """The profile request of one grid point (the model without layers is measured with the
    single-sample shape)."""
    return ProfileRequest(
        model=spec,
        tokens=[tokens],
        sp=[1],
        shapes=[shape],
        nprocs=[1],
        reps=1 if tiny else reps,
        warmup=1,
        device=device,
        dtype="fp32" if tiny else "bf16",
        threads_per_rank=1 if tiny else (os.cpu_count() or 1),
        outer=shape == "single" and tokens <= OUTER_MAX_TOKENS,
        outer_max_tokens=OUTER_MAX_TOKENS,
        collectives=False,  # one device: no group to measure
        ceilings=False,  # measured once per model
        video_spatial=64 if tiny else VIDEO_SPATIAL,
    )


def _release(device: str) -> None:
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def _artifact(
    base: dict[str, Any],
    layers: list[dict[str, Any]],
    outer: list[dict[str, Any]],
    failures: list[dict[str, Any]],
    ceilings: dict[str, Any],
    tokens: list[int],
    started: float,
    command: str,
    pending: list[dict[str, Any]],
) -> dict[str, Any]:
    now = time.time()
    grid = dict(base["settings"]["grid"], tokens_per_rank=tokens, shapes=list(SHAPES))
    return {
        **base,
        "settings": {
            **base["settings"],
            "grid": grid,
            "isolation": "one run_profile per grid point",
        },
        "layers": list(layers),
        "outer": list(outer),
        "ceilings": ceilings,
        "failures": list(failures),
        # False while points are still to run: a run stopped early leaves this file as it was after
        # its last finished point, with the points it did not reach listed here.
        "complete": not pending,
        "pending": list(pending),
        "cost": {
            "wall_s": round(now - started, 2),
            "started_at": started,
            "finished_at": now,
            "command": command,
        },
    }


def model_tokens(name: str, tiny: bool) -> list[int]:
    """The grid of one model: Llama-3-8B layers at 1K..64K (the claim's text lengths per rank),
    STDiT3-XL/2 at 1K..128K (the longest clip, 432K tokens, is 108K per rank at SP 4)."""
    if tiny:
        return list(TINY_TOKENS)
    return [t for t in FULL_TOKENS if t <= 65536] if name.startswith("llama") else list(FULL_TOKENS)


def calibrate_model(
    name: str,
    device: str,
    tiny: bool,
    reps: int,
    deadline: float,
    command: str,
    write: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """The profile artifact of one model (see the module docstring). ``write`` gets the artifact
    after every point (so a kill loses at most the point in progress); a point whose expected
    time (2.5 x the last point of its shape) would pass ``deadline`` (a ``time.time()``) is not
    started and is listed as skipped."""
    spec = model_spec(name)
    started = time.time()
    layers: list[dict[str, Any]] = []
    outer: list[dict[str, Any]] = []
    failures: list[dict[str, Any]] = []
    base: dict[str, Any] | None = None
    tokens_grid = model_tokens(name, tiny)
    grid = [(t, shape) for t in tokens_grid for shape in SHAPES]
    try:
        ceilings = measure_ceilings(device, "fp32" if tiny else "bf16")
    except Exception as exc:  # the layer points are worth more than the ceilings
        ceilings = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    last: dict[str, float] = {}
    for i, (tokens, shape) in enumerate(grid):
        where = {"tokens_per_rank": tokens, "shape": shape}
        expected = 2.5 * last.get(shape, 0.0)
        if time.time() + expected > deadline:
            failures.append({**where, "error": "skipped: the calibration's time budget was spent"})
            continue
        t0 = time.time()
        try:
            art = run_profile(
                point_request(spec, tokens, shape, device, tiny, reps), command=command
            )
        except Exception as exc:  # any failure of one point must not end the calibration
            failures.append({**where, "error": f"{type(exc).__name__}: {str(exc)[:500]}"})
            print(
                f"  {name} {shape} {tokens}: FAILED {type(exc).__name__}: {str(exc)[:200]}",
                file=sys.stderr,
                flush=True,
            )
            del exc
            _release(device)
            continue
        last[shape] = time.time() - t0
        base = base or art
        layers += art["layers"]
        outer += art["outer"]
        _release(device)
        if write is not None:
            pending = [{"tokens_per_rank": t, "shape": s} for t, s in grid[i + 1 :]]
            write(
                _artifact(
                    base, layers, outer, failures, ceilings, tokens_grid, started, command, pending
                )
            )
    if base is None:
        raise RuntimeError(
            f"calibration of {name}: no grid point could be measured: {failures[:3]}"
        )
    return _artifact(base, layers, outer, failures, ceilings, tokens_grid, started, command, [])


def calibrate(
    out: Path,
    device: str,
    tiny: bool,
    reps: int = 3,
    budget_s: float = 420.0,
    command: str = "",
    models: tuple[str, ...] | None = None,
) -> list[Path]:
    """Calibrate every model (`FULL_MODELS`, or `TINY_MODELS` with ``tiny``) into ``out``, each
    with its own share of the budget (a model that finishes early leaves its time to the next).
    Every artifact is rewritten after each point. Returns the artifacts written; a model with
    no measured point is reported on stderr and the next model still runs."""
    models = models or (TINY_MODELS if tiny else FULL_MODELS)
    end = time.time() + budget_s
    written = []
    for i, name in enumerate(models):
        deadline = time.time() + (end - time.time()) / (len(models) - i)
        print(
            f"calibrating {name} ({'fp32' if tiny else 'bf16'}, {device})",
            file=sys.stderr,
            flush=True,
        )
        path = out / f"{name}.json"

        def write(art: dict[str, Any], path: Path = path) -> None:
            atomic_write_text(path, dumps_artifact(art))

        try:
            artifact = calibrate_model(name, device, tiny, reps, deadline, command, write)
        except RuntimeError as exc:
            print(f"calibration of {name}: {exc}", file=sys.stderr, flush=True)
            continue
        write(artifact)
        ceil = artifact["ceilings"]
        rates = (
            (
                f"matmul {max(c['flops_per_s'] for c in ceil['matmul']) / 1e12:.1f} TFLOP/s, copy "
                f"{max(c['bytes_per_s'] for c in ceil['copy']) / 1e9:.0f} GB/s, "
            )
            if "matmul" in ceil
            else ""
        )
        print(
            f"wrote {path} (sha256 {sha256_file(path)}): {rates}{len(artifact['failures'])} "
            f"point(s) failed or skipped, {artifact['cost']['wall_s']:.0f} s",
            flush=True,
        )
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--tiny", action="store_true", help="CPU dry run: tiny models, small sizes")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument(
        "--budget-s", type=float, default=420.0, help="time for all models (default 420)"
    )
    parser.add_argument("--out", required=True, help="folder for the artifacts (<model>.json)")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            "gpu_calibrate: no CUDA device; use --device cpu --tiny for a dry run", file=sys.stderr
        )
        return 2
    started = time.time()
    cmd = f"scripts/gpu_calibrate.sh --device {args.device}{' --tiny' if args.tiny else ''}"
    calibrate(Path(args.out), args.device, args.tiny, args.reps, args.budget_s, cmd)
    print(f"calibration done in {time.time() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
