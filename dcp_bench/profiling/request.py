"""What a profile measures: `ProfileRequest` (the whole grid), the grid points a world of ranks
measures, and the request built from ``dcp-bench profile``'s ``profile.*`` / ``nproc`` overrides."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dcp_bench.archs import arch_of
from dcp_bench.cost.specs import ModelSpec
from dcp_bench.errors import ConfigError
from dcp_bench.train_policy import DEFAULT_ZERO_STAGE, check_zero_stage


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
    # the ZeRO stage whose training step (`TrainingState.finish_step`) the step overhead times:
    # the stage the runs it prices train at (the runtime's default unless they name another)
    zero_stage: int = DEFAULT_ZERO_STAGE
    timeout_s: float | None = None  # per set of ranks: every process is ended when it passes
    fail_rank: int = -1  # fault injection (tests): this rank raises before it measures anything

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
            raise ConfigError(
                f"profile.packed_samples must be counts >= 2, got {self.packed_samples}"
            )
        if self.reps < 1 or self.warmup < 0:
            raise ConfigError(
                f"profile.reps must be >= 1 and warmup >= 0 (got {self.reps}, {self.warmup})"
            )
        bad = set(self.shapes) - {"single", "packed"}
        if bad:
            raise ConfigError(f"profile.shapes: {sorted(bad)}; expected 'single' and/or 'packed'")
        if self.dtype not in ("fp32", "bf16", "fp16"):
            raise ConfigError(f"profile.dtype {self.dtype!r}; expected fp32, bf16 or fp16")
        if self.device not in ("cpu", "cuda"):
            raise ConfigError(f"profile.device {self.device!r}; expected cpu or cuda")
        if self.device == "cuda" and max(self.nprocs) > 1:
            raise ConfigError("profile.device=cuda measures one device: use nproc=1")
        check_zero_stage(self.zero_stage)
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise ConfigError(
                f"profile.timeout_s must be a number of seconds > 0, got {self.timeout_s}"
            )


def sample_shapes(
    model: ModelSpec, total: int, shape: str, packed: int, video_spatial: int = 256, sp: int = 1
) -> list[tuple[int, int]]:
    """(tokens, frames) of the samples of one grid point holding ``total`` tokens.

    Text: one sample of ``total`` tokens, or ``packed`` equal samples. Video: ``packed`` equal
    samples of ``total // packed`` tokens each, every sample shaped as a single one of its size:
    frames of up to ``video_spatial`` patches, with at least ``sp`` frames so that DSP's frame
    sharding needs no padding. Short samples are thus images (one frame) of a few patches, as
    the short samples of video data are (98% of the scaled `videosys_zipf` samples the real CPU
    section trains are images of 2-56 patches), not one-patch clips of many frames.
    """
    n = 1 if shape == "single" else packed
    if not arch_of(model).video:
        return [(total // n, 1)] * n
    each = max(1, total // n)
    spatial = max(1, min(video_spatial, each // sp))
    frames = max(1, each // spatial)
    return [(frames * spatial, frames)] * n


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
                out.append(
                    {"sp": sp, "tokens_per_rank_target": tpr, "shape": shape, "samples": samples}
                )
    return out


# override key (``profile.KEY=VALUE``) -> ProfileRequest field
KEYS = {
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
    "zero_stage": "zero_stage",
    "timeout_s": "timeout_s",
}
# read by `dcp_bench.profiling.run.profile_to_file`, not grid settings
RUN_KEYS = ("profile.rank_baseline",)


def _nproc(value: Any) -> int:
    """One rank count: an integer power of two (the ranks form aligned SP groups, and the rank
    baseline run is a training run of that many ranks), checked before anything is measured."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1 or value & (value - 1):
        raise ConfigError(
            f"nproc={value!r}: expected a power of two (1, 2, 4, ...) or a list of them"
        )
    return value


def request_from_overrides(own: dict[str, Any], model: ModelSpec) -> ProfileRequest:
    """The checked request of ``nproc=...`` and ``profile.KEY=VALUE`` overrides (values already
    parsed: ``[1,2]`` is a list; a single value stands for a one-element list where the field is
    a list)."""
    kwargs: dict[str, Any] = {}
    for key, value in own.items():
        if key in RUN_KEYS or key == "out":
            continue
        if key == "nproc":
            kwargs["nprocs"] = [_nproc(v) for v in (value if isinstance(value, list) else [value])]
        elif key.startswith("profile."):
            name = key.split(".", 1)[1]
            if name not in KEYS:
                raise ConfigError(
                    f"unknown profile option {key!r}; valid: "
                    f"{', '.join('profile.' + k for k in KEYS)}"
                )
            field_name = KEYS[name]
            default = getattr(ProfileRequest(model=model), field_name)
            if isinstance(default, list) and not isinstance(value, list):
                value = [value]
            kwargs[field_name] = value
    req = ProfileRequest(model=model, **kwargs)
    req.check()
    return req
