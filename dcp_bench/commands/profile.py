"""`dcp-bench profile`: measure the model's layers and the collectives on this hardware and write a
profile artifact for the ``profiled`` cost source.

Example (the committed CPU calibration)::

    dcp-bench profile model=tiny_llama nproc=[2,4] profile.tokens=[256,512,1024,2048] \\
        profile.sp=[1,2,4] profile.reps=7 out=results/calibration/cpu/tiny_llama.json

Keys: ``model=NAME`` (config group), ``nproc=N`` or ``nproc=[2,4]`` (ranks per measurement),
``out=PATH``, and ``profile.KEY=VALUE`` for the grid: tokens (per rank), sp, shapes
(single/packed), packed_samples, reps, warmup, collective_bytes, threads, device (cpu/cuda), dtype
(fp32/bf16/fp16), video_spatial (patches per video frame), outer_max_tokens, outer, collectives,
ceilings (true/false), zero_stage (the ZeRO stage whose training step is measured: the runs' default
1), timeout_s (per set of ranks). The measuring lives in `dcp_bench.profiling.run`
(`profile_to_file`).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

import yaml

from dcp_bench.errors import ConfigError

NAME = "profile"
HELP = (
    "measure per-layer time/memory and collective times on this hardware; write a profile "
    "artifact (JSON) for the profiled cost model"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="model=NAME, nproc=N|[N,...], out=PATH, profile.tokens=[...], profile.sp=[...], "
        "profile.reps=N, profile.device=cpu|cuda, profile.dtype=fp32|bf16 ...",
    )


def split_overrides(overrides: list[str]) -> tuple[dict[str, Any], list[str]]:
    """Separate the profiler's own keys (``profile.*``, ``nproc``, ``out``) from config
    overrides; values are parsed as YAML (``[1,2]`` is a list)."""
    own: dict[str, Any] = {}
    rest: list[str] = []
    for ov in overrides:
        if "=" not in ov:
            raise ConfigError(f"bad override {ov!r}: expected key=value (e.g. model=tiny_llama)")
        key, value = ov.split("=", 1)
        if key.startswith("profile.") or key in ("nproc", "out"):
            try:
                own[key] = yaml.safe_load(value)
            except yaml.YAMLError:
                raise ConfigError(f"bad value in {ov!r}: not a number, list or word") from None
        else:
            rest.append(ov)
    return own, rest


def run(args: argparse.Namespace) -> int:
    from dcp_bench.config import instantiate, load_config
    from dcp_bench.files import check_output, sha256_file
    from dcp_bench.profiling.request import request_from_overrides

    own, rest = split_overrides(list(args.overrides))
    model = instantiate(load_config(rest).model)
    req = request_from_overrides(own, model)
    out = Path(own.get("out") or f"profiles/{model.name}_{req.device}.json")
    check_output(out, "out", folder=False)  # before the measuring, not after it
    from dcp_bench.profiling.run import profile_to_file  # torch: once the request is known good

    print(
        f"profiling {model.name} on {req.device} ({req.dtype}): tokens/rank {req.tokens}, "
        f"sp {req.sp}, shapes {req.shapes}, nproc {req.nprocs}, {req.reps} reps after "
        f"{req.warmup} warm-up, the training step at ZeRO stage {req.zero_stage}",
        file=sys.stderr,
    )
    command = "dcp-bench profile " + " ".join(shlex.quote(o) for o in args.overrides)
    artifact = profile_to_file(
        req, out, command=command, rank_baseline=bool(own.get("profile.rank_baseline", True))
    )
    print(
        f"wrote {out} (sha256 {sha256_file(out)}) in {artifact['cost']['wall_s']:.1f} s: "
        f"{len(artifact['layers'])} layer points, {len(artifact['collectives'])} collective points"
    )
    return 0
