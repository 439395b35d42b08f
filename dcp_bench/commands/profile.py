"""`dcp-bench profile`: measure the model's layers and the collectives on this hardware and write a
profile artifact for the ``profiled`` cost source.

Example (the committed CPU calibration)::

    dcp-bench profile model=tiny_llama nproc=[2,4] profile.tokens=[256,512,1024,2048] \\
        profile.sp=[1,2,4] profile.reps=7 out=results/calibration/cpu/tiny_llama.json

Keys: ``model=NAME`` (config group), ``nproc=N`` or ``nproc=[2,4]`` (ranks per measurement),
``out=PATH``, and ``profile.KEY=VALUE`` for the grid: tokens (per rank), sp, shapes
(single/packed), packed_samples, reps, warmup, collective_bytes, threads, device (cpu/cuda), dtype
(fp32/bf16/fp16), video_spatial (patches per video frame), outer_max_tokens, outer, collectives,
ceilings (true/false).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from dcp_bench.errors import ConfigError
from dcp_bench.train_policy import DEFAULT_ZERO_STAGE, precision_policy, static_state_bytes

NAME = "profile"
HELP = (
    "measure per-layer time/memory and collective times on this hardware; write a profile "
    "artifact (JSON) for the profiled cost model"
)

# override key -> ProfileRequest field
_KEYS = {
    "tokens": "tokens",
    "sp": "sp",
    "shapes": "shapes",
    "packed_samples": "packed_samples",
    "reps": "reps",
    "warmup": "warmup",
    "collective_bytes": "collective_bytes",
    "threads": "threads_per_rank",
    "device": "device",
    "dtype": "dtype",
    "outer": "outer",
    "collectives": "collectives",
    "ceilings": "ceilings",
    "video_spatial": "video_spatial",
    "outer_max_tokens": "outer_max_tokens",
}


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


def _nproc(value: Any) -> int:
    """One rank count: an integer power of two (the ranks form aligned SP groups, and the rank
    baseline run is a training run of that many ranks), checked before anything is measured."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1 or value & (value - 1):
        raise ConfigError(f"nproc={value!r}: expected a power of two (1, 2, 4, ...) or a list of them")
    return value


def build_request(own: dict[str, Any], model: Any) -> Any:
    from dcp_bench.profiling.run import ProfileRequest

    kwargs: dict[str, Any] = {}
    for key, value in own.items():
        if key == "profile.rank_baseline":  # read by run(), not a grid setting
            continue
        if key == "nproc":
            kwargs["nprocs"] = [_nproc(v) for v in (value if isinstance(value, list) else [value])]
        elif key.startswith("profile."):
            name = key.split(".", 1)[1]
            if name not in _KEYS:
                raise ConfigError(
                    f"unknown profile option {key!r}; valid: {', '.join('profile.' + k for k in _KEYS)}"
                )
            field = _KEYS[name]
            default = getattr(ProfileRequest(model=model), field)
            if isinstance(default, list) and not isinstance(value, list):
                value = [value]
            kwargs[field] = value
    req = ProfileRequest(model=model, **kwargs)
    req.check()
    return req


def measure_rank_baseline(model: Any, nproc: int, static: dict[str, Any]) -> dict[str, Any]:
    """The resident baseline of a real training rank (CPU): a short `dcp-bench train`-style run
    of ``nproc`` ranks under torchrun on near-empty batches (16-token samples), its largest
    measured peak resident set (`dcp_bench.runtime.step_meter`) minus parameters, gradients and
    AdamW state. A torchrun rank holds more than a profiling process (its own process-group
    store, the run loop, the records), which the profiled model's workspace must include; the
    profiling process's own figure is kept as ``process_baseline_bytes_profiler``."""
    import tempfile

    from dcp_bench.config import load_config, to_container
    from dcp_bench.records import read_steps
    from dcp_bench.run.spec import parse_run_spec
    from dcp_bench.run.torch_run import launch_torch_run

    workload = (["workload=videosys_zipf", "workload.length_scale=4096", "workload.tokens_per_gpu=4096"]
                if model.arch == "stdit" else
                ["workload=synthetic_fixed", "workload.length=16", "workload.tokens_per_gpu=64"])
    with tempfile.TemporaryDirectory(prefix="dcp-baseline-") as tmp:
        cfg = to_container(load_config([
            f"model={model.name}", "cluster=cpu", f"nproc={nproc}", *workload, "method=bucket_static",
            "run.executor=torch", "run.steps=3", "run.warmup_steps=1", f"run.root={tmp}", "run.campaign=baseline",
            "run.timeout_s=300", "cost.source=analytical",
        ]))
        summary = launch_torch_run(parse_run_spec(cfg))
        if summary.status != "ok":
            raise ConfigError(f"the rank baseline run of {model.name} on {nproc} ranks failed: {summary.error}")
        steps = [s for s in read_steps(Path(tmp) / "baseline" / summary.run_id) if not s.warmup]
    peak = max(max(s.peak_mem_per_rank_gib or [0.0]) for s in steps) * 2**30
    # the training states the run's ranks held (its ZeRO stage and precision: `train_policy`)
    states = static_state_bytes(int(static["params"]), int(static.get("layer_params") or 0), nproc, DEFAULT_ZERO_STAGE,
                                precision_policy(model.dtype))
    held = float(sum(states.values()))
    return {"process_baseline_bytes": int(peak - held), "process_baseline_method":
            f"peak resident set of a {nproc}-rank torchrun training run on 16-token samples, minus "
            "parameters, gradients and AdamW state"}


def run(args: argparse.Namespace) -> int:
    from dcp_bench.config import instantiate, load_config
    from dcp_bench.cost.profile_artifact import dumps_artifact
    from dcp_bench.files import atomic_write_text, sha256_file
    from dcp_bench.profiling.run import run_profile

    own, rest = split_overrides(list(args.overrides))
    cfg = load_config(rest)
    model = instantiate(cfg.model)
    req = build_request(own, model)
    out = Path(own.get("out") or f"profiles/{model.name}_{req.device}.json")
    print(
        f"profiling {model.name} on {req.device} ({req.dtype}): tokens/rank {req.tokens}, "
        f"sp {req.sp}, shapes {req.shapes}, nproc {req.nprocs}, {req.reps} reps after "
        f"{req.warmup} warm-up",
        file=sys.stderr,
    )
    command = "dcp-bench profile " + " ".join(shlex.quote(o) for o in args.overrides)
    artifact = run_profile(req, command=command)
    if req.device == "cpu" and own.get("profile.rank_baseline", True):
        for entry in artifact.get("steps", []):
            entry.update(measure_rank_baseline(model, int(entry["nproc"]), artifact["static"]))
        artifact["cost"]["wall_s"] = round(time.time() - artifact["cost"]["started_at"], 2)
    atomic_write_text(out, dumps_artifact(artifact))
    print(
        f"wrote {out} (sha256 {sha256_file(out)}) in {artifact['cost']['wall_s']:.1f} s: "
        f"{len(artifact['layers'])} layer points, {len(artifact['collectives'])} collective points"
    )
    return 0
