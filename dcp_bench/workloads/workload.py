"""Workloads: sources of sample sizes plus a global-batch policy, turned into `GlobalBatch` es.

A workload is a *size source* (a video bucket grid, a histogram of a published length list, a
derived corpus length list, a user's file, or a labelled synthetic distribution), a seed, a
version, a default model and a batch policy:

- Sampling is i.i.d. from the source with ``np.random.default_rng([seed, step])``, so the batch of
  a step depends only on the workload parameters, the seed, the step and the world size — never on
  the process, rank or method. Draws are made in fixed-size chunks, so the batch at a smaller world
  size is a prefix of the batch at a larger one.
- Budget: samples are taken in draw order while the batch's token total stays within
  ``tokens_per_gpu * world_size / length_scale`` (at least one sample), or exactly
  ``samples_per_step`` samples when that is set.
- ``length_scale`` divides every length (>= 1 token) to make real distributions trainable on CPU:
  2-D video samples keep their latent frames and scale their spatial patches.
- Over-long samples (``max_len`` or the model's ``max_seq_len``) are truncated or dropped as
  ``max_len_policy`` says, and counted in ``GlobalBatch.truncated`` / ``dropped``.
- Lengths above `MAX_SAMPLE_TOKENS` (2^30) are refused where they are read (a lengths file, a
  synthetic length, ``tokens_per_gpu``), naming the value and the limit.

A sample id names the underlying sample: ``shapes(ids)`` recovers every sample's size from its id
alone (a bucket or histogram bin in the high bits and a draw in the low bits; an index for a
length list), so a runtime can derive deterministic content from ids.
"""

from __future__ import annotations

import json
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dcp_bench.batch import GlobalBatch
from dcp_bench.config import instantiate, to_container
from dcp_bench.corpora import read_lengths_file, read_text_dataset
from dcp_bench.errors import WorkloadError
from dcp_bench.files import sha256_file
from dcp_bench.paths import WORKLOADS_DIR

DATA_DIR = WORKLOADS_DIR / "data"
ID_SHIFT = 40  # sample id = (bin or bucket) << ID_SHIFT | draw
ID_DRAW_MASK = (1 << ID_SHIFT) - 1
SYNTH_SHIFT = 32  # synthetic sample id = length << SYNTH_SHIFT | draw
DRAW_CHUNK = 1024  # draws per chunk; fixed so batches are prefixes across world sizes
MAX_DRAWS_PER_STEP = 1 << 22  # guard: a step that keeps nothing after this many draws fails

# Typical global-batch budgets (tokens per GPU per step); see docs/workloads.md for the reasoning.
VIDEO_TOKENS_PER_GPU = 256 * 1024
TEXT_TOKENS_PER_GPU = 128 * 1024
STATS_SAMPLE = 1_000_000  # draws used for the statistics of continuous or histogram sources
STATS_SEED = 12345
KIB = 1024

# The longest sample (and per-GPU token budget) a workload accepts: 2^30 tokens, 1,024 x the
# longest context of any configured model (1,048,576 tokens) and ~600 x the longest document of
# the shipped corpora. Between a model's max_seq_len and this, max_len_policy truncates or drops
# (counted); above it a value is an input error (no cluster holds it; often a unit mistake), and
# synthetic sample ids (length << SYNTH_SHIFT) stay within int64.
MAX_SAMPLE_TOKENS = 1 << 30


def check_length(value: Any, where: str) -> int:
    """``value`` as a length in tokens, 1 <= length <= `MAX_SAMPLE_TOKENS`; a `WorkloadError`
    naming ``where``, the value and the limit otherwise."""
    if isinstance(value, bool):
        raise WorkloadError(f"{where}: {value!r} is not an integer length")
    try:
        as_float = float(value)
    except (TypeError, ValueError, OverflowError):
        raise WorkloadError(f"{where}: {value!r} is not an integer length") from None
    if isinstance(value, (int, np.integer)):
        length = int(value)
    elif math.isfinite(as_float) and as_float.is_integer():
        length = int(as_float)
    else:
        raise WorkloadError(f"{where}: {value!r} is not an integer length")
    if length < 1:
        raise WorkloadError(f"{where}: length {length} is not positive (expected >= 1 token)")
    if length > MAX_SAMPLE_TOKENS:
        raise WorkloadError(f"{where}: length {length} is over the maximum of {MAX_SAMPLE_TOKENS:,} tokens "
                            "(2^30, far above any model's max_seq_len)")
    return length


# ---------------------------------------------------------------------------------------------
# Video grid (Open-Sora v1.2 / STDiT3 latent shapes)

VIDEO_RESOLUTIONS: dict[str, tuple[int, int]] = {
    "144p": (144, 256),
    "240p": (240, 426),
    "360p": (360, 640),
    "480p": (480, 854),
    "720p": (720, 1280),
}
VIDEO_FRAMES = (51, 102, 204, 408)
VAE_STRIDE = 8  # spatial downsampling of the Open-Sora v1.2 VAE (floor on odd sizes)
PATCH = 2  # STDiT3 spatial patch (ceil: the latent is padded to a multiple)


def latent_frames(frames: int) -> int:
    """Latent frames T' of a clip: ``frames * 5 // 17`` (the VAE's 17 -> 5 temporal compression);
    1 for an image."""
    return 1 if frames == 1 else frames * 5 // 17


def spatial_patches(height: int, width: int) -> int:
    """Spatial patches S of a frame: the VAE floors H/8 and W/8, the 2x2 patch embedding pads
    (ceil). 144p/240p/360p/480p/720p give 144/405/920/1,590/3,600."""
    h = -(-(height // VAE_STRIDE) // PATCH)
    w = -(-(width // VAE_STRIDE) // PATCH)
    return h * w


@dataclass(frozen=True)
class VideoBucket:
    resolution: str
    frames: int  # pixel frames (1 = image)

    @property
    def height(self) -> int:
        return VIDEO_RESOLUTIONS[self.resolution][0]

    @property
    def width(self) -> int:
        return VIDEO_RESOLUTIONS[self.resolution][1]

    @property
    def latent_frames(self) -> int:
        return latent_frames(self.frames)

    @property
    def spatial(self) -> int:
        return spatial_patches(self.height, self.width)

    @property
    def tokens(self) -> int:
        return self.latent_frames * self.spatial

    @property
    def label(self) -> str:
        return f"{self.resolution}x{self.frames}f" if self.frames > 1 else f"{self.resolution} image"


def image_buckets() -> list[VideoBucket]:
    """The 5 image buckets, ordered by height."""
    return [VideoBucket(r, 1) for r in sorted(VIDEO_RESOLUTIONS, key=lambda r: VIDEO_RESOLUTIONS[r][0])]


def video_buckets() -> list[VideoBucket]:
    """The 20 video buckets, ordered by frames x height (ties, 102x240 = 51x480, by token count)."""
    buckets = [VideoBucket(r, f) for r in VIDEO_RESOLUTIONS for f in VIDEO_FRAMES]
    return sorted(buckets, key=lambda b: (b.frames * b.height, b.tokens))


def zipf_weights(n: int, alpha: float = 3.0, offset: int = 5) -> np.ndarray:
    """p_k proportional to 1/k^alpha for k = offset+1 .. offset+n, normalised."""
    k = np.arange(offset + 1, offset + n + 1, dtype=np.float64)
    w = k**-alpha
    return w / w.sum()


def latent_voxels(bucket: VideoBucket) -> int:
    """Latent voxels of one sample, T' x floor(H/8) x floor(W/8): the unit the reference's
    throughput counter uses (no 2x2 patching, no padding). 240p: 30 x 53 = 1,590 per frame."""
    return bucket.latent_frames * (bucket.height // VAE_STRIDE) * (bucket.width // VAE_STRIDE)


@dataclass(frozen=True)
class ReferenceDataset:
    """The reference benchmark's dummy dataset generator, as a fixed list of samples.

    The arguments are the generator's own (docs/reference_semantics.md cites each rule): the
    bucket grid (5 resolutions x {1, 51, 102, 204, 408} frames, one aspect ratio each), a
    ``distribution`` (``zipf``: rounded shares of 1/k^3 for k = offset+1.., the first bucket
    absorbing the rounding; ``uniform``: ``size`` uniform draws from a generator seeded
    ``data_seed + data_size``), drawn separately for images and videos in the generator's order
    (videos by frames x height, images by height, ties in config order), and the image mixing
    (``exclusive``: ``frac x data_size`` images on top of ``data_size`` videos; ``inclusive``:
    images take ``frac`` (or, for frac < 0, their share of the candidates) of ``data_size``).
    """

    distribution: str = "zipf"
    zipf_offset: int = 5
    image_mixing_type: str = "exclusive"
    image_mixing_frac: float = 50.0
    data_size: int = 2000
    data_seed: int = 42

    def __post_init__(self) -> None:
        if self.distribution not in ("zipf", "uniform"):
            raise WorkloadError(f"dataset distribution {self.distribution!r}; expected zipf or uniform")
        if self.image_mixing_type not in ("exclusive", "inclusive"):
            raise WorkloadError(f"dataset image_mixing_type {self.image_mixing_type!r}; expected exclusive or inclusive")
        if self.image_mixing_type == "exclusive" and self.image_mixing_frac < 0:
            raise WorkloadError(f"dataset image_mixing_frac {self.image_mixing_frac!r}: exclusive mixing needs >= 0")
        if self.image_mixing_type == "inclusive" and self.image_mixing_frac > 1:
            raise WorkloadError(f"dataset image_mixing_frac {self.image_mixing_frac!r}: inclusive mixing needs <= 1")
        if self.data_size < 1 or self.zipf_offset < 0 or self.data_seed < 0:
            raise WorkloadError(f"dataset data_size {self.data_size!r} (>= 1), zipf_offset {self.zipf_offset!r} "
                                f"(>= 0) and data_seed {self.data_seed!r} (>= 0) out of range")

    @staticmethod
    def candidates() -> tuple[list[VideoBucket], list[VideoBucket]]:
        """(images, videos) in the generator's order: a stable sort of the config order
        (resolutions 144p..720p, frames ascending) by height, and by frames x height."""
        config = [VideoBucket(r, f) for r in VIDEO_RESOLUTIONS for f in (1, *VIDEO_FRAMES)]
        images = sorted((b for b in config if b.frames == 1), key=lambda b: b.height)
        videos = sorted((b for b in config if b.frames > 1), key=lambda b: b.frames * b.height)
        return images, videos

    def sizes(self) -> tuple[int, int]:
        """(images, videos) the mixing rule asks for."""
        n_img = len(self.candidates()[0])
        n_vid = len(self.candidates()[1])
        if self.image_mixing_type == "exclusive":
            return int(self.image_mixing_frac * self.data_size), self.data_size
        if self.image_mixing_frac < 0:
            img = int(n_img / (n_img + n_vid) * self.data_size)
        else:
            img = int(self.image_mixing_frac * self.data_size)
        return img, self.data_size - img

    def counts(self) -> tuple[list[VideoBucket], np.ndarray]:
        """Every bucket (images, then videos, in the generator's order) and its sample count."""
        images, videos = self.candidates()
        img_size, vid_size = self.sizes()
        if self.distribution == "uniform":
            rng = np.random.default_rng(self.data_seed + self.data_size)
            img = np.bincount(rng.integers(0, len(images), size=img_size), minlength=len(images))
            vid = np.bincount(rng.integers(0, len(videos), size=vid_size), minlength=len(videos))
        else:
            img = self._zipf_counts(len(images), img_size)
            vid = self._zipf_counts(len(videos), vid_size)
        return images + videos, np.concatenate([img, vid]).astype(np.int64)

    def _zipf_counts(self, n: int, size: int) -> np.ndarray:
        ranks = np.arange(1, n + 1 + self.zipf_offset, dtype=np.float64) ** 3.0
        prob = 1.0 / (ranks * np.sum(1.0 / ranks))
        prob = prob[self.zipf_offset:]
        counts = np.round(size * prob / prob.sum()).astype(np.int64)  # numpy rounds half to even
        if n:
            counts[0] += size - int(counts.sum())
        return counts

    def describe(self) -> dict[str, Any]:
        buckets, counts = self.counts()
        return {
            "generator": "the reference benchmark's dummy dataset (docs/reference_semantics.md)",
            "distribution": self.distribution, "zipf_offset": self.zipf_offset,
            "image_mixing_type": self.image_mixing_type, "image_mixing_frac": self.image_mixing_frac,
            "data_size": self.data_size, "data_seed": self.data_seed, "samples": int(counts.sum()),
            "counts": {b.label: int(c) for b, c in zip(buckets, counts)},
        }


# ---------------------------------------------------------------------------------------------
# Size sources


class SizeSource(ABC):
    """Where sample sizes come from. ``draw`` picks ids; ``shapes`` maps ids to (frames, spatial)."""

    # How quantiles of the finite support are read: "inverse_cdf" (a value of the support, as for
    # a distribution over buckets) or "linear" (numpy.percentile, as for a list of documents).
    quantile_method = "inverse_cdf"

    @abstractmethod
    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` i.i.d. sample ids (int64)."""

    @abstractmethod
    def shapes(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Unscaled (frames, spatial) of each id; tokens = frames * spatial."""

    def support(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """A finite support (frames, spatial, probability) for exact statistics, or None."""
        return None

    def population(self) -> int | None:
        """Number of documents behind the source, when it has one."""
        return None


def _pick(rng: np.random.Generator, cdf: np.ndarray, n: int) -> np.ndarray:
    # Inverse-CDF on Generator.random: stable across numpy versions, unlike choice()'s internals.
    idx = np.searchsorted(cdf, rng.random(n), side="right")
    return np.minimum(idx, len(cdf) - 1).astype(np.int64)


class BucketSource(SizeSource):
    """A weighted set of 2-D buckets; id = bucket << 40 | a 40-bit draw naming the clip."""

    def __init__(self, buckets: list[VideoBucket], probs: np.ndarray, population: int | None = None):
        p = np.asarray(probs, dtype=np.float64)
        if len(buckets) != len(p) or len(p) == 0 or np.any(p < 0) or p.sum() <= 0:
            raise WorkloadError("bucket weights must be non-negative, not all zero, one per bucket")
        self.buckets = buckets
        self.probs = p / p.sum()
        self._cdf = np.cumsum(self.probs)
        self._frames = np.array([b.latent_frames for b in buckets], dtype=np.int64)
        self._spatial = np.array([b.spatial for b in buckets], dtype=np.int64)
        self._population = population

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        b = _pick(rng, self._cdf, n)
        return (b << ID_SHIFT) | rng.integers(0, 1 << ID_SHIFT, n, dtype=np.int64)

    def shapes(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        b = np.asarray(ids, dtype=np.int64) >> ID_SHIFT
        return self._frames[b], self._spatial[b]

    def support(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self._frames, self._spatial, self.probs

    def population(self) -> int | None:
        return self._population


class HistogramSource(SizeSource):
    """A histogram with integer bins [lo, hi): a bin is picked by count, then a length uniformly
    within it (bins are under 1.1% wide, so uniform and log-uniform agree to well below the 2%
    quantile target). id = bin << 40 | draw; the length is lo + draw mod (hi - lo)."""

    def __init__(self, lo: np.ndarray, hi: np.ndarray, counts: np.ndarray):
        self.lo = np.asarray(lo, dtype=np.int64)
        self.hi = np.asarray(hi, dtype=np.int64)
        self.counts = np.asarray(counts, dtype=np.int64)
        if not (len(self.lo) == len(self.hi) == len(self.counts)) or len(self.lo) == 0:
            raise WorkloadError("histogram needs equal-length, non-empty bin_lo, bin_hi and counts")
        if np.any(self.hi <= self.lo) or np.any(self.lo < 1) or np.any(self.counts < 0):
            raise WorkloadError("histogram bins must satisfy 1 <= lo < hi and counts >= 0")
        self._cdf = np.cumsum(self.counts) / self.counts.sum()

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        b = _pick(rng, self._cdf, n)
        return (b << ID_SHIFT) | rng.integers(0, 1 << ID_SHIFT, n, dtype=np.int64)

    def shapes(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ids = np.asarray(ids, dtype=np.int64)
        b = ids >> ID_SHIFT
        lengths = self.lo[b] + (ids & ID_DRAW_MASK) % (self.hi[b] - self.lo[b])
        return np.ones_like(lengths), lengths

    def population(self) -> int:
        return int(self.counts.sum())


class ListSource(SizeSource):
    """A finite list of lengths; id = index into the list, drawn uniformly with replacement."""

    quantile_method = "linear"

    def __init__(self, lengths: Any, where: str = "length list"):
        arr = lengths if isinstance(lengths, np.ndarray) else None
        if arr is not None and arr.ndim == 1 and arr.size and np.issubdtype(arr.dtype, np.integer):
            bad = np.flatnonzero((arr < 1) | (arr > MAX_SAMPLE_TOKENS))
            if bad.size:
                check_length(arr[bad[0]], f"{where}, length {bad[0] + 1}")  # raises, naming it
            self.lengths = arr.astype(np.int64)
            return
        try:
            values = list(lengths) if arr is None or arr.ndim == 1 else []
        except TypeError:
            values = []
        if not values:
            raise WorkloadError(f"{where}: expected a non-empty list of positive integer lengths")
        # Checked as Python numbers first: a huge value must be named, not overflow int64.
        self.lengths = np.asarray([check_length(v, f"{where}, length {i + 1}") for i, v in enumerate(values)],
                                  dtype=np.int64)

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.integers(0, len(self.lengths), n, dtype=np.int64)

    def shapes(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        lengths = self.lengths[np.asarray(ids, dtype=np.int64)]
        return np.ones_like(lengths), lengths

    def support(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        p = np.full(len(self.lengths), 1.0 / len(self.lengths))
        return np.ones_like(self.lengths), self.lengths, p

    def population(self) -> int:
        return int(len(self.lengths))


class SyntheticSource(SizeSource):
    """A labelled synthetic length distribution; id = length << 32 | a 32-bit draw."""

    def __init__(self, sampler: Callable[[np.random.Generator, int], np.ndarray], fixed: int | None = None):
        self._sampler = sampler
        self._fixed = fixed

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        lengths = np.asarray(self._sampler(rng, n), dtype=np.int64)
        return (lengths << SYNTH_SHIFT) | rng.integers(0, 1 << SYNTH_SHIFT, n, dtype=np.int64)

    def shapes(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        lengths = np.asarray(ids, dtype=np.int64) >> SYNTH_SHIFT
        return np.ones_like(lengths), lengths

    def support(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        if self._fixed is None:
            return None
        one = np.ones(1, dtype=np.int64)
        return one, one * self._fixed, np.ones(1)


# ---------------------------------------------------------------------------------------------
# The workload


@dataclass
class Workload:
    """A size source plus the batch policy. Build one with `load_workload` or `make_workload`."""

    name: str
    kind: str  # "video" | "text" | "synthetic"
    source: SizeSource
    version: str = "1"
    default_model: str = "llama3_8b"
    provenance: dict[str, Any] = field(default_factory=dict)
    description: str = ""
    seed: int = 0
    tokens_per_gpu: int | None = None
    samples_per_step: int | None = None
    length_scale: float = 1.0
    max_len: int | None = None
    max_len_policy: str = "truncate"
    dataset: ReferenceDataset | None = None  # the fixed dataset of an epoch (run.unit=epoch)

    def __post_init__(self) -> None:
        if self.kind not in ("video", "text", "synthetic"):
            raise WorkloadError(f"workload {self.name!r}: kind {self.kind!r}; expected video, text or synthetic")
        if not isinstance(self.seed, (int, np.integer)) or self.seed < 0:
            raise WorkloadError(f"workload {self.name!r}: seed {self.seed!r}; expected an integer >= 0")
        if not 1 <= self.length_scale < float("inf"):  # also refuses nan
            raise WorkloadError(f"workload {self.name!r}: length_scale {self.length_scale!r}; expected a finite number >= 1")
        if self.max_len_policy not in ("truncate", "drop"):
            raise WorkloadError(
                f"workload {self.name!r}: max_len_policy {self.max_len_policy!r}; expected truncate or drop"
            )
        if self.max_len is not None and self.max_len < 1:
            raise WorkloadError(f"workload {self.name!r}: max_len {self.max_len!r}; expected >= 1")
        if self.samples_per_step is not None and self.samples_per_step < 1:
            raise WorkloadError(
                f"workload {self.name!r}: samples_per_step {self.samples_per_step!r}; expected >= 1"
            )
        if self.tokens_per_gpu is None:
            self.tokens_per_gpu = VIDEO_TOKENS_PER_GPU if self.kind == "video" else TEXT_TOKENS_PER_GPU
        if not 1 <= self.tokens_per_gpu <= MAX_SAMPLE_TOKENS:
            raise WorkloadError(f"workload {self.name!r}: tokens_per_gpu {self.tokens_per_gpu!r}; expected an "
                                f"integer in [1, {MAX_SAMPLE_TOKENS:,}]")

    # -- sizes ---------------------------------------------------------------------------------

    def _scaled(self, frames: np.ndarray, spatial: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.length_scale == 1:
            return frames, spatial
        # Video keeps its latent frames and shrinks each frame; text (frames = 1) shrinks its length.
        return frames, np.maximum(1, np.rint(spatial / self.length_scale).astype(np.int64))

    def shapes(self, sample_ids: Any) -> tuple[np.ndarray, np.ndarray]:
        """(tokens, frames) of sample ids after ``length_scale``, before the max-length policy."""
        frames, spatial = self._scaled(*self.source.shapes(np.asarray(sample_ids, dtype=np.int64)))
        return frames * spatial, frames

    def _limit(self, max_seq_len: int | None) -> int | None:
        limits = [x for x in (self.max_len, max_seq_len) if x is not None]
        return int(min(limits)) if limits else None

    def token_budget(self, world_size: int) -> int:
        """Tokens per global batch: ``tokens_per_gpu * world_size`` in unscaled tokens, divided by
        ``length_scale`` so a scaled workload keeps about the same number of samples per step."""
        assert self.tokens_per_gpu is not None
        return max(1, int(self.tokens_per_gpu * world_size // self.length_scale))

    def global_batch(self, step: int, world_size: int, max_seq_len: int | None = None) -> GlobalBatch:
        """The global batch of ``step`` on ``world_size`` GPUs (deterministic; see the module doc)."""
        if step < 0:
            raise WorkloadError(f"workload {self.name!r}: step {step}; expected >= 0")
        if world_size < 1:
            raise WorkloadError(f"workload {self.name!r}: world_size {world_size}; expected >= 1")
        limit = self._limit(max_seq_len)
        rng = np.random.default_rng([int(self.seed), int(step)])
        budget = None if self.samples_per_step else self.token_budget(world_size)
        ids_out: list[np.ndarray] = []
        tok_out: list[np.ndarray] = []
        fr_out: list[np.ndarray] = []
        total = kept = truncated = dropped = drawn = 0
        done = False
        while not done:
            if drawn >= MAX_DRAWS_PER_STEP:
                raise WorkloadError(
                    f"workload {self.name!r}: no sample fits max_len={limit} after {drawn} draws "
                    f"with max_len_policy=drop; raise the limit or use max_len_policy=truncate"
                )
            ids = self.source.draw(rng, DRAW_CHUNK)
            drawn += DRAW_CHUNK
            tokens, frames = self.shapes(ids)
            over = np.zeros(len(ids), dtype=bool) if limit is None else tokens > limit
            if limit is not None and over.any() and self.max_len_policy == "truncate":
                frames, tokens = _truncate(frames, tokens, over, limit)
            drop = over if self.max_len_policy == "drop" else np.zeros(len(ids), dtype=bool)
            cand = np.nonzero(~drop)[0]  # chunk positions that may enter the batch, in draw order
            if budget is None:
                assert self.samples_per_step is not None
                take = min(len(cand), self.samples_per_step - kept)
            else:
                # Greedy fill: every candidate whose running total stays within the budget; the
                # first sample of a step always enters, even when it alone exceeds the budget.
                cum = total + np.cumsum(tokens[cand])
                take = int(np.searchsorted(cum, budget, side="right"))
                if kept == 0 and take == 0 and len(cand):
                    take = 1
            sel = cand[:take]
            ids_out.append(ids[sel])
            tok_out.append(tokens[sel])
            fr_out.append(frames[sel])
            truncated += int(over[sel].sum())
            total += int(tokens[sel].sum())
            kept += take
            # Where the step stopped reading this chunk: dropped samples count only up to there.
            stop = len(ids)
            full = self.samples_per_step is not None and kept >= self.samples_per_step
            if full or (budget is not None and take and total >= budget):
                done, stop = True, int(cand[take - 1])
            elif budget is not None and take < len(cand):
                done, stop = True, int(cand[take])
            dropped += int(drop[:stop].sum())
        return GlobalBatch(
            step=step,
            sample_ids=np.concatenate(ids_out),
            tokens=np.concatenate(tok_out),
            frames=np.concatenate(fr_out),
            truncated=truncated,
            dropped=dropped,
            info={
                "workload": self.name,
                "workload_version": self.version,
                "seed": int(self.seed),
                "token_budget": budget,
                "samples_per_step": self.samples_per_step,
                "length_scale": self.length_scale,
                "max_len": limit,
                "max_len_policy": self.max_len_policy,
            },
        )

    # -- the fixed dataset of an epoch ---------------------------------------------------------

    def epoch_dataset(self, world_size: int, max_seq_len: int | None = None) -> GlobalBatch:
        """The whole fixed dataset an epoch visits (``run.unit=epoch``), in the generator's order
        (images, then videos; positions are dataset indices). The same for every seed, method and
        world size: the run's seed only shuffles how a method's sampler deals it. Sample ids
        name the bucket and the dataset index, so ``shapes`` recovers every size. The batch
        policy's ``length_scale`` and maximum length apply as they do to a step's batch."""
        if self.dataset is None:
            names = ", ".join(n for n, e in WORKLOADS.items() if e.dataset is not None)
            raise WorkloadError(f"workload {self.name!r} has no fixed dataset for run.unit=epoch "
                                f"(workloads with one: {names})")
        if world_size < 1:
            raise WorkloadError(f"workload {self.name!r}: world_size {world_size}; expected >= 1")
        buckets, counts = self.dataset.counts()
        index = {(b.resolution, b.frames): i for i, b in enumerate(getattr(self.source, "buckets", []))}
        missing = [b.label for b in buckets if (b.resolution, b.frames) not in index]
        if missing:
            raise WorkloadError(f"workload {self.name!r}: its dataset has buckets its size source lacks ({missing[0]})")
        bucket_of = np.repeat([index[(b.resolution, b.frames)] for b in buckets], counts).astype(np.int64)
        ids = (bucket_of << ID_SHIFT) | np.arange(len(bucket_of), dtype=np.int64)
        tokens, frames = self.shapes(ids)
        limit = self._limit(max_seq_len)
        over = np.zeros(len(ids), dtype=bool) if limit is None else tokens > limit
        dropped = 0
        if over.any():
            if self.max_len_policy == "truncate":
                frames, tokens = _truncate(frames, tokens, over, limit)  # type: ignore[arg-type]
            else:
                keep = ~over
                ids, tokens, frames, dropped = ids[keep], tokens[keep], frames[keep], int(over.sum())
        return GlobalBatch(
            step=0, sample_ids=ids, tokens=tokens, frames=frames,
            truncated=int(over.sum()) if self.max_len_policy == "truncate" else 0, dropped=dropped,
            info={"workload": self.name, "workload_version": self.version, "dataset": self.dataset.describe(),
                  "length_scale": self.length_scale, "max_len": limit, "max_len_policy": self.max_len_policy},
        )

    def latent_tokens(self, sample_ids: Any) -> np.ndarray | None:
        """Latent voxels of each sample (T' x H/8 x W/8, `latent_voxels`), the reference's token
        unit, after ``length_scale``; None for sources that are not the video grid."""
        buckets = getattr(self.source, "buckets", None)
        if not buckets:
            return None
        per_frame = np.array([b.height // VAE_STRIDE * (b.width // VAE_STRIDE) for b in buckets], dtype=np.int64)
        frames, _ = self.source.shapes(np.asarray(sample_ids, dtype=np.int64))
        b = np.asarray(sample_ids, dtype=np.int64) >> ID_SHIFT
        spatial = per_frame[b]
        if self.length_scale != 1:
            spatial = np.maximum(1, np.rint(spatial / self.length_scale).astype(np.int64))
        return frames * spatial

    # -- statistics ----------------------------------------------------------------------------

    def length_distribution(self) -> tuple[np.ndarray, np.ndarray, str]:
        """(lengths, probabilities, method) of the token-length distribution after
        ``length_scale``: the exact finite support when the source has one, else a fixed-seed
        sample of 1,000,000 draws with equal weights."""
        support = self.source.support()
        if support is not None:
            frames, spatial, probs = support
            frames, spatial = self._scaled(frames, spatial)
            return (frames * spatial).astype(np.float64), probs, "exact"
        rng = np.random.default_rng([STATS_SEED])
        tokens, _ = self.shapes(self.source.draw(rng, STATS_SAMPLE))
        probs = np.full(len(tokens), 1.0 / len(tokens))
        return tokens.astype(np.float64), probs, f"sample of {STATS_SAMPLE:,} draws, seed {STATS_SEED}"

    def stats(self) -> dict[str, Any]:
        """Statistics of the workload's length distribution (after ``length_scale``, before the
        max-length policy): n, mean, p10/p25/p50/p75/p90/p99, max, and the share of tokens and of
        attention cost (sum of L^2) in sequences longer than 8K, 32K and 128K tokens.

        Exact for finite sources (bucket grids, length lists, fixed length); otherwise computed
        from a fixed-seed sample of 1,000,000 draws (``stats_method`` says which)."""
        lengths, probs, method = self.length_distribution()
        out: dict[str, Any] = {"name": self.name, "version": self.version, "kind": self.kind}
        out["n"] = self.source.population()
        quantiles = self.source.quantile_method if method == "exact" else "linear"
        out.update(distribution_stats(lengths, probs, quantiles))
        out["stats_method"] = method
        out["length_scale"] = self.length_scale
        return out

    def describe(self) -> dict[str, Any]:
        """Everything a run record needs to identify the workload."""
        return {
            "name": self.name,
            "version": self.version,
            "kind": self.kind,
            "default_model": self.default_model,
            "seed": int(self.seed),
            "tokens_per_gpu": self.tokens_per_gpu,
            "samples_per_step": self.samples_per_step,
            "length_scale": self.length_scale,
            "max_len": self.max_len,
            "max_len_policy": self.max_len_policy,
            "provenance": self.provenance,
            **({"dataset": self.dataset.describe()} if self.dataset is not None else {}),
        }


def _truncate(
    frames: np.ndarray, tokens: np.ndarray, over: np.ndarray, limit: int
) -> tuple[np.ndarray, np.ndarray]:
    """Cut over-long samples to ``limit`` tokens: a video loses latent frames (whole frames, so it
    keeps its spatial size); a text sequence, an image, or a single frame larger than the limit
    becomes ``limit`` tokens of one frame."""
    frames = frames.copy()
    tokens = tokens.copy()
    spatial = tokens // frames
    keep_frames = limit // spatial
    video = over & (frames > 1) & (keep_frames >= 1)
    frames[video] = keep_frames[video]
    tokens[video] = keep_frames[video] * spatial[video]
    flat = over & ~video
    frames[flat] = 1
    tokens[flat] = limit
    return frames, tokens


def weighted_quantile(values: np.ndarray, probs: np.ndarray, q: float, method: str = "inverse_cdf") -> float:
    """The q-quantile (0..1) of a discrete distribution: ``inverse_cdf`` gives the smallest value
    whose CDF >= q; ``linear`` (equal weights only) interpolates like `numpy.percentile`."""
    if method == "linear":
        return float(np.percentile(values, q * 100))
    order = np.argsort(values, kind="stable")
    v, cdf = values[order], np.cumsum(probs[order])
    i = int(np.searchsorted(cdf, q - 1e-12, side="left"))
    return float(v[min(i, len(v) - 1)])


def distribution_stats(lengths: np.ndarray, probs: np.ndarray, quantiles: str = "linear") -> dict[str, Any]:
    """mean, quantiles, max and the token / attention (L^2) shares above 8K, 32K and 128K."""
    lengths = np.asarray(lengths, dtype=np.float64)
    probs = np.asarray(probs, dtype=np.float64) / np.sum(probs)
    out: dict[str, Any] = {"mean": float(np.dot(lengths, probs))}
    for q in (10, 25, 50, 75, 90, 99):
        out[f"p{q}"] = weighted_quantile(lengths, probs, q / 100, quantiles)
    out["max"] = int(lengths[probs > 0].max())
    tok = lengths * probs
    attn = lengths**2 * probs
    for k in (8, 32, 128):
        longer = lengths > k * KIB
        out[f"token_share_gt_{k}k"] = float(tok[longer].sum() / tok.sum())
        out[f"attn_share_gt_{k}k"] = float(attn[longer].sum() / attn.sum())
    return out


# ---------------------------------------------------------------------------------------------
# The registry of named workloads

# The ``_target_`` of a workload config built from this registry. Configs written before the
# workloads package (the shipped ones among them, and every committed run record) spell it
# ``dcp_bench.workload.load_workload``: both spellings name the registry.
REGISTRY_TARGET = "dcp_bench.workloads.load_workload"
LEGACY_REGISTRY_TARGET = "dcp_bench.workload.load_workload"
REGISTRY_TARGETS = (REGISTRY_TARGET, LEGACY_REGISTRY_TARGET)

_POLICY_PARAMS = ("seed", "tokens_per_gpu", "samples_per_step", "length_scale", "max_len", "max_len_policy")
# What a workload config may say about its data, for records and reports: a one-line
# description, where the data comes from, and under which licence it may be used.
_PROVENANCE_PARAMS = ("description", "source", "licence")


def _video_zipf(population_images: int = 100_000, population_videos: int = 2_000, alpha: float = 3.0, offset: int = 5) -> tuple[SizeSource, dict[str, Any]]:
    img, vid = image_buckets(), video_buckets()
    n = population_images + population_videos
    p = np.concatenate(
        [zipf_weights(len(img), alpha, offset) * population_images, zipf_weights(len(vid), alpha, offset) * population_videos]
    ) / n
    prov = {
        "source": "the DCP reference benchmark's video grid (VideoSys, Open-Sora v1.2 / STDiT3 shapes)",
        "weights": f"Zipf p ~ 1/k^{alpha:g}, k = {offset + 1}..N+{offset}, separately over the 5 image "
        f"buckets (by height) and the 20 video buckets (by frames x height); mixed "
        f"{population_images:,} images : {population_videos:,} videos",
        "licence": "synthetic shapes of a public benchmark grid (no data)",
    }
    return BucketSource(img + vid, p, population=n), prov


# The three mixes of the reference's figure "short sequences dominated / balanced sequences / long
# sequences dominated": the reference defines only the first (its benchmark configs); the other
# two are the project's choices, made with the reference generator's own knobs
# (workloads/README.md says so and why).
MIX_DATASETS: dict[str, dict[str, Any]] = {
    "videosys_zipf": {"distribution": "zipf", "zipf_offset": 5, "image_mixing_type": "exclusive",
                      "image_mixing_frac": 50.0},
    "videosys_mix_balanced": {"distribution": "uniform", "image_mixing_type": "exclusive", "image_mixing_frac": 50.0},
    "videosys_mix_long": {"distribution": "uniform", "image_mixing_type": "inclusive", "image_mixing_frac": -1.0},
}


def mix_dataset(name: str, data_size: int = 2000, data_seed: int = 42) -> ReferenceDataset:
    """The fixed dataset of a mix workload: the reference generator with the mix's knobs."""
    return ReferenceDataset(**MIX_DATASETS[name], data_size=int(data_size), data_seed=int(data_seed))


def _video_mix(name: str, data_size: int = 2000, data_seed: int = 42) -> tuple[SizeSource, dict[str, Any]]:
    """A mix as a bucket distribution (step mode): the shares of its fixed dataset's counts."""
    ds = mix_dataset(name, data_size, data_seed)
    buckets, counts = ds.counts()
    img, vid = image_buckets(), video_buckets()
    order = {(b.resolution, b.frames): c for b, c in zip(buckets, counts)}
    grid = img + vid
    p = np.array([order[(b.resolution, b.frames)] for b in grid], dtype=np.float64)
    knobs = ", ".join(f"{k}={v}" for k, v in MIX_DATASETS[name].items())
    prov = {
        "source": "the DCP reference benchmark's dummy dataset generator (VideoSys), project-chosen knobs",
        "weights": f"the counts of the generator's dataset ({knobs}, data_size={data_size}, seed={data_seed}); "
                   "step mode draws buckets i.i.d. with these shares, run.unit=epoch visits the dataset itself",
        "licence": "synthetic shapes of a public benchmark grid (no data)",
    }
    return BucketSource(grid, p, population=int(counts.sum())), prov


def _video_reweighted(how: str) -> tuple[SizeSource, dict[str, Any]]:
    buckets = image_buckets() + video_buckets()
    tokens = np.array([b.tokens for b in buckets], dtype=np.float64)
    if how == "balanced":
        p = 1.0 / tokens
        rule = "p_k ~ 1/tokens_k over all 25 buckets: every bucket carries the same token mass (1/25)"
    else:
        p = np.ones_like(tokens)
        rule = (
            "p_k uniform over all 25 buckets (by sample count): token mass ~ tokens_k, so the "
            "long buckets dominate"
        )
    prov = {
        "source": "the DCP reference benchmark's video grid (Open-Sora v1.2 / STDiT3 shapes), reweighted",
        "weights": rule,
        "licence": "synthetic shapes of a public benchmark grid (no data)",
    }
    return BucketSource(buckets, p), prov


# Open-Sora v1.2 stage-1 bucket config (hpcaitech/Open-Sora, configs/opensora-v1-2/train/stage1.py,
# commit 20b7c2f8): resolution -> {frames: (keep probability, batch size)}; 0-probability buckets
# and resolutions outside the 5-resolution grid (256, 512, 1024, 1080p) are left out.
OPENSORA_V12_STAGE1: dict[str, dict[int, tuple[float, int]]] = {
    "144p": {1: (0.5, 48), 32: (1.0, 2), 48: (1.0, 4), 96: (1.0, 2), 192: (1.0, 1)},
    "240p": {1: (0.6, 20), 32: (0.5, 2), 48: (0.5, 1), 64: (0.5, 1)},
    "360p": {1: (0.5, 8), 32: (0.2, 1)},
    "480p": {1: (0.2, 4), 16: (0.3, 1)},
    "720p": {1: (0.1, 2)},
}


def _opensora_stage1() -> tuple[SizeSource, dict[str, Any]]:
    buckets, p, bs = [], [], {}
    for res, table in OPENSORA_V12_STAGE1.items():
        for frames, (keep, batch) in table.items():
            buckets.append(VideoBucket(res, frames))
            p.append(keep)
            bs[buckets[-1].label] = batch
    prov = {
        "source": "hpcaitech/Open-Sora configs/opensora-v1-2/train/stage1.py (commit 20b7c2f8), bucket_config",
        "weights": "p ~ the config's keep probability of each (resolution, frames) bucket, assuming "
        "source clips spread evenly over the listed buckets (the config fixes keep probabilities "
        "and per-bucket batch sizes, not the data mix); buckets at 256/512/1024/1080p and with "
        "keep probability 0 left out",
        "config_batch_sizes": bs,
        "licence": "Open-Sora is Apache-2.0; only the config's numbers are used",
    }
    return BucketSource(buckets, np.asarray(p)), prov


def _data_file(path: Path, shown: str) -> dict[str, str]:
    """The file a workload reads, as records name it: the path as given (never made absolute,
    so records and reports hold no local folders) and the SHA-256 of its bytes."""
    return {"data_file": shown, "data_sha256": sha256_file(path)}


def _read_json(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise WorkloadError(f"workload data file {str(path)!r} is missing (derive it: see workloads/README.md)")
    data = json.loads(path.read_text())
    assert isinstance(data, dict)
    return data


def _histogram(name: str) -> tuple[SizeSource, dict[str, Any]]:
    data = _read_json(DATA_DIR / f"{name}_histogram.json")
    src = HistogramSource(np.array(data["bin_lo"]), np.array(data["bin_hi"]), np.array(data["counts"]))
    prov = dict(data["provenance"])
    prov["histogram"] = f"workloads/data/{name}_histogram.json ({data['bins_per_octave']} bins per octave)"
    prov.update(_data_file(DATA_DIR / f"{name}_histogram.json", f"workloads/data/{name}_histogram.json"))
    prov["reference"] = data["reference"]
    return src, prov


def _fixture(name: str) -> tuple[SizeSource, dict[str, Any]]:
    data = _read_json(DATA_DIR / f"{name}_lengths.json")
    prov = dict(data["provenance"])
    prov["fixture"] = f"workloads/data/{name}_lengths.json"
    prov.update(_data_file(DATA_DIR / f"{name}_lengths.json", f"workloads/data/{name}_lengths.json"))
    return ListSource(np.array(data["lengths"])), prov


def _lengths_file(
    path: str | None = None,
    lengths_file: str | None = None,
    column: str | None = None,
    tokenizer: str | None = None,
    text_field: str = "text",
) -> tuple[SizeSource, dict[str, Any]]:
    file = path or lengths_file
    if not file:
        raise WorkloadError(
            "workload 'lengths_file' needs a file: workload.lengths_file=PATH"
        )
    p = Path(file).expanduser()
    if tokenizer:
        lengths = read_text_dataset(p, tokenizer, text_field)
        unit = f"{tokenizer} tokens of field {text_field!r}"
    else:
        lengths = read_lengths_file(p, column)
        unit = "lengths as given in the file"
    prov = {
        "source": str(file),
        **_data_file(p, str(file)),
        "unit": unit,
        "licence": "not stated (say it with licence: in the workload config)",
    }
    return ListSource(lengths, where=str(p)), prov


def _synthetic(kind: str, **p: Any) -> tuple[SizeSource, dict[str, Any]]:
    if kind == "fixed":
        length = check_length(p.get("length", 64 * KIB), "synthetic_fixed: workload.length")
        src = SyntheticSource(lambda rng, n: np.full(n, length, dtype=np.int64), fixed=length)
        rule = f"every sample {length} tokens"
    elif kind == "uniform":
        low = check_length(p.get("low", 1 * KIB), "synthetic_uniform: workload.low")
        high = check_length(p.get("high", 64 * KIB), "synthetic_uniform: workload.high")
        if not 1 <= low <= high:
            raise WorkloadError(f"synthetic_uniform: low={low}, high={high}; expected 1 <= low <= high")
        src = SyntheticSource(lambda rng, n: rng.integers(low, high + 1, n, dtype=np.int64))
        rule = f"uniform integer lengths in [{low}, {high}]"
    else:
        try:
            median, sigma = float(p.get("median", 4 * KIB)), float(p.get("sigma", 1.2))
        except (TypeError, ValueError):
            raise WorkloadError(f"synthetic_lognormal: median={p.get('median')!r}, sigma={p.get('sigma')!r}; "
                                "expected numbers") from None
        low = check_length(p.get("low", 16), "synthetic_lognormal: workload.low")
        high = check_length(p.get("high", 256 * KIB), "synthetic_lognormal: workload.high")
        if not (0 < median <= MAX_SAMPLE_TOKENS and 0 <= sigma <= 100) or not 1 <= low <= high:
            raise WorkloadError(
                f"synthetic_lognormal: median={median}, sigma={sigma}, low={low}, high={high}; expected "
                f"0 < median <= {MAX_SAMPLE_TOKENS}, 0 <= sigma <= 100, 1 <= low <= high"
            )

        def sample(rng: np.random.Generator, n: int) -> np.ndarray:
            x = np.rint(np.exp(math.log(median) + sigma * rng.standard_normal(n)))
            return np.clip(x, low, high).astype(np.int64)

        src = SyntheticSource(sample)
        rule = f"lognormal lengths, median {median:g}, sigma {sigma:g}, clipped to [{low}, {high}]"
    return src, {"source": "synthetic (labelled control, no data)", "distribution": rule}


@dataclass(frozen=True)
class WorkloadEntry:
    kind: str
    default_model: str
    description: str
    build: Callable[..., tuple[SizeSource, dict[str, Any]]]
    params: tuple[str, ...] = ()  # source parameters besides the batch-policy ones
    version: str = "1"
    dataset: Callable[..., ReferenceDataset] | None = None  # the fixed dataset of run.unit=epoch
    dataset_params: tuple[str, ...] = ()  # its parameters (also accepted as workload parameters)


VIDEO_MODEL, TEXT_MODEL = "stdit3_xl2", "llama3_8b"

WORKLOADS: Mapping[str, WorkloadEntry] = {
    "videosys_zipf": WorkloadEntry(
        "video", VIDEO_MODEL, "reference video grid, Zipf(3, offset 5) mix of 100,000 images and 2,000 videos",
        lambda **p: _video_zipf(**p), ("population_images", "population_videos", "alpha", "offset"),
        dataset=lambda **p: mix_dataset("videosys_zipf", **p), dataset_params=("data_size", "data_seed"),
    ),
    "videosys_mix_balanced": WorkloadEntry(
        "video", VIDEO_MODEL, "the project's balanced mix: reference generator, uniform buckets, 100,000 images "
        "+ 2,000 videos (images ~48% of tokens)",
        lambda **p: _video_mix("videosys_mix_balanced", **p), ("data_size", "data_seed"),
        dataset=lambda **p: mix_dataset("videosys_mix_balanced", **p), dataset_params=("data_size", "data_seed"),
    ),
    "videosys_mix_long": WorkloadEntry(
        "video", VIDEO_MODEL, "the project's long mix: reference generator, uniform buckets, inclusive mixing "
        "(400 images + 1,600 videos; videos >99% of tokens)",
        lambda **p: _video_mix("videosys_mix_long", **p), ("data_size", "data_seed"),
        dataset=lambda **p: mix_dataset("videosys_mix_long", **p), dataset_params=("data_size", "data_seed"),
    ),
    "videosys_balanced": WorkloadEntry(
        "video", VIDEO_MODEL, "reference video grid, equal token mass per bucket",
        lambda: _video_reweighted("balanced"),
    ),
    "videosys_long": WorkloadEntry(
        "video", VIDEO_MODEL, "reference video grid, uniform over buckets (long buckets dominate tokens)",
        lambda: _video_reweighted("long"),
    ),
    "opensora_v12_stage1": WorkloadEntry(
        "video", VIDEO_MODEL, "Open-Sora v1.2 stage-1 bucket config (keep probabilities) on the grid",
        _opensora_stage1,
    ),
    "wikipedia": WorkloadEntry(
        "text", TEXT_MODEL, "Wikipedia document lengths (FlexSP list, 1,000,000 docs), histogram",
        lambda: _histogram("wikipedia"),
    ),
    "prolong": WorkloadEntry(
        "text", TEXT_MODEL, "ProLong document lengths (DistCA list, 77,932 docs), histogram",
        lambda: _histogram("prolong"),
    ),
    "sharegpt": WorkloadEntry(
        "text", TEXT_MODEL, "ShareGPT V3 conversations, cl100k tokens (derived fixture)",
        lambda: _fixture("sharegpt"),
    ),
    "debian_docs": WorkloadEntry(
        "text", TEXT_MODEL, "Debian documentation packages, cl100k tokens (derived fixture)",
        lambda: _fixture("debian_docs"),
    ),
    "lengths_file": WorkloadEntry(
        "text", TEXT_MODEL, "the user's lengths file or text dataset (workload.lengths_file=PATH)",
        _lengths_file, ("path", "lengths_file", "column", "tokenizer", "text_field"),
    ),
    "synthetic_fixed": WorkloadEntry(
        "synthetic", TEXT_MODEL, "synthetic control: every sample the same length (default 64K)",
        lambda **p: _synthetic("fixed", **p), ("length",),
    ),
    "synthetic_uniform": WorkloadEntry(
        "synthetic", TEXT_MODEL, "synthetic control: uniform lengths (default 1K..64K)",
        lambda **p: _synthetic("uniform", **p), ("low", "high"),
    ),
    "synthetic_lognormal": WorkloadEntry(
        "synthetic", TEXT_MODEL, "synthetic control: lognormal lengths (default median 4K, sigma 1.2)",
        lambda **p: _synthetic("lognormal", **p), ("median", "sigma", "low", "high"),
    ),
}


def load_workload(name: str, **params: Any) -> Workload:
    """Build a named workload. Batch-policy parameters: ``seed``, ``tokens_per_gpu``,
    ``samples_per_step``, ``length_scale``, ``max_len``, ``max_len_policy``; plus the source's own
    (e.g. ``lengths_file=PATH`` for ``lengths_file``). Unknown names or parameters raise
    `WorkloadError` naming the valid ones."""
    entry = WORKLOADS.get(name)
    if entry is None:
        raise WorkloadError(f"unknown workload {name!r}; valid names: {', '.join(WORKLOADS)}")
    params = {k: v for k, v in params.items() if v is not None or k in _POLICY_PARAMS}
    valid = tuple(dict.fromkeys(_POLICY_PARAMS + _PROVENANCE_PARAMS + entry.params + entry.dataset_params))
    unknown = sorted(set(params) - set(valid) - {"default_model"})
    if unknown:
        raise WorkloadError(
            f"workload {name!r}: unknown parameter(s) {', '.join(unknown)}; valid: {', '.join(valid)}"
        )
    for key in entry.dataset_params:
        if key in params:
            params[key] = _as_int(params[key], name, key)
    source_params = {k: params[k] for k in entry.params if k in params}
    source, prov = entry.build(**source_params)
    dataset = None
    if entry.dataset is not None:
        dataset = entry.dataset(**{k: params[k] for k in entry.dataset_params if k in params})
    policy = {k: params[k] for k in _POLICY_PARAMS if params.get(k) is not None}
    for key in ("seed", "tokens_per_gpu", "samples_per_step", "max_len"):
        if key in policy:
            policy[key] = _as_int(policy[key], name, key)
    if "length_scale" in policy:
        try:
            policy["length_scale"] = float(policy["length_scale"])
        except (TypeError, ValueError):
            raise WorkloadError(f"workload {name!r}: length_scale {policy['length_scale']!r} is not a number") from None
    if source_params:
        prov = {**prov, "params": {k: v for k, v in source_params.items() if k not in ("path", "lengths_file")}}
    # The config's own words about its data replace the loader's generic ones.
    prov.update({k: str(params[k]) for k in ("source", "licence") if params.get(k) is not None})
    return Workload(
        name=name,
        kind=entry.kind,
        source=source,
        version=entry.version,
        default_model=str(params.get("default_model") or entry.default_model),
        provenance=prov,
        description=str(params.get("description") or entry.description),
        dataset=dataset,
        **policy,
    )


def _as_int(value: Any, name: str, key: str) -> int:
    if isinstance(value, bool):
        raise WorkloadError(f"workload {name!r}: {key} {value!r} is not an integer")
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise WorkloadError(f"workload {name!r}: {key} {value!r} is not an integer") from None
    if not f.is_integer():
        raise WorkloadError(f"workload {name!r}: {key} {value!r} is not an integer")
    return int(f)


def make_workload(node: Any, seed: int | None = None) -> Any:
    """Build the workload a ``workload`` config node describes, its global batches seeded by
    ``seed`` (the run's seed). A node whose ``_target_`` is `load_workload` (`REGISTRY_TARGETS`:
    either spelling), or that has none, names a registered workload; any other ``_target_`` is a user's class, built with
    the node's parameters and ``seed``, which must provide ``global_batch(step, world_size,
    max_seq_len)``."""
    if isinstance(node, str):
        return load_workload(node, **({"seed": seed} if seed is not None else {}))
    data = to_container(node)
    if seed is not None:
        data["seed"] = seed
    target = data.pop("_target_", None)
    if target is not None and target not in REGISTRY_TARGETS:
        said = {k: data.pop(k) for k in _PROVENANCE_PARAMS if data.get(k) is not None}
        try:
            built = instantiate({"_target_": target, **{k: v for k, v in data.items() if k != "kind"}})
        except WorkloadError:
            raise
        except Exception as exc:  # an import error, a refused or failing constructor: one line
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise WorkloadError(f"workload _target_ {target!r} could not be built: {first}") from None
        if not callable(getattr(built, "global_batch", None)):
            raise WorkloadError(f"workload {target!r} has no global_batch(step, world_size, max_seq_len) method")
        if isinstance(getattr(built, "provenance", None), dict):
            built.provenance.update({k: str(v) for k, v in said.items() if k != "description"})
        return built
    data.pop("kind", None)
    name = data.pop("name", None)
    if not name:
        raise WorkloadError("workload config has no name")
    return load_workload(str(name), **data)
