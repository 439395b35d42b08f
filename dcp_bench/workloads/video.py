"""Video size sources: the Open-Sora v1.2 / STDiT3 bucket grid and its latent shapes, the reference
benchmark's dummy dataset (`ReferenceDataset`), and the named video mixes built on them (Zipf,
the project's balanced and long mixes, reweighted grids, Open-Sora v1.2 stage 1)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from dcp_bench.errors import WorkloadError
from dcp_bench.workloads.base import ID_SHIFT, SizeSource, pick_by_cdf

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
        return (
            f"{self.resolution}x{self.frames}f" if self.frames > 1 else f"{self.resolution} image"
        )


def image_buckets() -> list[VideoBucket]:
    """The 5 image buckets, ordered by height."""
    return [
        VideoBucket(r, 1) for r in sorted(VIDEO_RESOLUTIONS, key=lambda r: VIDEO_RESOLUTIONS[r][0])
    ]


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
            raise WorkloadError(
                f"dataset distribution {self.distribution!r}; expected zipf or uniform"
            )
        if self.image_mixing_type not in ("exclusive", "inclusive"):
            raise WorkloadError(
                f"dataset image_mixing_type {self.image_mixing_type!r}; expected exclusive or "
                "inclusive"
            )
        if self.image_mixing_type == "exclusive" and self.image_mixing_frac < 0:
            raise WorkloadError(
                f"dataset image_mixing_frac {self.image_mixing_frac!r}: exclusive mixing needs >= 0"
            )
        if self.image_mixing_type == "inclusive" and self.image_mixing_frac > 1:
            raise WorkloadError(
                f"dataset image_mixing_frac {self.image_mixing_frac!r}: inclusive mixing needs <= 1"
            )
        if self.data_size < 1 or self.zipf_offset < 0 or self.data_seed < 0:
            raise WorkloadError(
                f"dataset data_size {self.data_size!r} (>= 1), zipf_offset {self.zipf_offset!r} "
                f"(>= 0) and data_seed {self.data_seed!r} (>= 0) out of range"
            )

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
        prob = prob[self.zipf_offset :]
        counts = np.round(size * prob / prob.sum()).astype(np.int64)  # numpy rounds half to even
        if n:
            counts[0] += size - int(counts.sum())
        return counts

    def describe(self) -> dict[str, Any]:
        buckets, counts = self.counts()
        return {
            "generator": "the reference benchmark's dummy dataset (docs/reference_semantics.md)",
            "distribution": self.distribution,
            "zipf_offset": self.zipf_offset,
            "image_mixing_type": self.image_mixing_type,
            "image_mixing_frac": self.image_mixing_frac,
            "data_size": self.data_size,
            "data_seed": self.data_seed,
            "samples": int(counts.sum()),
            "counts": {b.label: int(c) for b, c in zip(buckets, counts)},
        }


class BucketSource(SizeSource):
    """A weighted set of 2-D buckets; id = bucket << 40 | a 40-bit draw naming the clip."""

    def __init__(
        self, buckets: list[VideoBucket], probs: np.ndarray, population: int | None = None
    ):
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
        b = pick_by_cdf(rng, self._cdf, n)
        return (b << ID_SHIFT) | rng.integers(0, 1 << ID_SHIFT, n, dtype=np.int64)

    def shapes(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        b = np.asarray(ids, dtype=np.int64) >> ID_SHIFT
        return self._frames[b], self._spatial[b]

    def support(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self._frames, self._spatial, self.probs

    def population(self) -> int | None:
        return self._population


def zipf_source(
    population_images: int = 100_000,
    population_videos: int = 2_000,
    alpha: float = 3.0,
    offset: int = 5,
) -> tuple[SizeSource, dict[str, Any]]:
    img, vid = image_buckets(), video_buckets()
    n = population_images + population_videos
    p = (
        np.concatenate(
            [
                zipf_weights(len(img), alpha, offset) * population_images,
                zipf_weights(len(vid), alpha, offset) * population_videos,
            ]
        )
        / n
    )
    prov = {
        "source": (
            "the DCP reference benchmark's video grid (VideoSys, Open-Sora v1.2 / STDiT3 shapes)"
        ),
        "weights": (
            f"Zipf p ~ 1/k^{alpha:g}, k = {offset + 1}..N+{offset}, separately over the 5 image "
            "buckets (by height) and the 20 video buckets (by frames x height); mixed "
            f"{population_images:,} images : {population_videos:,} videos"
        ),
        "licence": "synthetic shapes of a public benchmark grid (no data)",
    }
    return BucketSource(img + vid, p, population=n), prov


# The three mixes of the reference's figure "short sequences dominated / balanced sequences / long
# sequences dominated": the reference defines only the first (its benchmark configs); the other
# two are the project's choices, made with the reference generator's own knobs
# (workloads/README.md says so and why).
MIX_DATASETS: dict[str, dict[str, Any]] = {
    "videosys_zipf": {
        "distribution": "zipf",
        "zipf_offset": 5,
        "image_mixing_type": "exclusive",
        "image_mixing_frac": 50.0,
    },
    "videosys_mix_balanced": {
        "distribution": "uniform",
        "image_mixing_type": "exclusive",
        "image_mixing_frac": 50.0,
    },
    "videosys_mix_long": {
        "distribution": "uniform",
        "image_mixing_type": "inclusive",
        "image_mixing_frac": -1.0,
    },
}


def mix_dataset(name: str, data_size: int = 2000, data_seed: int = 42) -> ReferenceDataset:
    """The fixed dataset of a mix workload: the reference generator with the mix's knobs."""
    return ReferenceDataset(
        **MIX_DATASETS[name], data_size=int(data_size), data_seed=int(data_seed)
    )


def mix_source(
    name: str, data_size: int = 2000, data_seed: int = 42
) -> tuple[SizeSource, dict[str, Any]]:
    """A mix as a bucket distribution (step mode): the shares of its fixed dataset's counts."""
    ds = mix_dataset(name, data_size, data_seed)
    buckets, counts = ds.counts()
    img, vid = image_buckets(), video_buckets()
    order = {(b.resolution, b.frames): c for b, c in zip(buckets, counts)}
    grid = img + vid
    p = np.array([order[(b.resolution, b.frames)] for b in grid], dtype=np.float64)
    knobs = ", ".join(f"{k}={v}" for k, v in MIX_DATASETS[name].items())
    prov = {
        "source": (
            "the DCP reference benchmark's dummy dataset generator (VideoSys), project-chosen knobs"
        ),
        "weights": f"the counts of the generator's dataset ({knobs}, data_size={data_size}, "
        f"seed={data_seed}); step mode draws buckets i.i.d. with these shares, run.unit=epoch "
        "visits the dataset itself",
        "licence": "synthetic shapes of a public benchmark grid (no data)",
    }
    return BucketSource(grid, p, population=int(counts.sum())), prov


def reweighted_source(how: str) -> tuple[SizeSource, dict[str, Any]]:
    buckets = image_buckets() + video_buckets()
    tokens = np.array([b.tokens for b in buckets], dtype=np.float64)
    if how == "balanced":
        p = 1.0 / tokens
        rule = (
            "p_k ~ 1/tokens_k over all 25 buckets: every bucket carries the same token mass (1/25)"
        )
    else:
        p = np.ones_like(tokens)
        rule = (
            "p_k uniform over all 25 buckets (by sample count): token mass ~ tokens_k, so the "
            "long buckets dominate"
        )
    prov = {
        "source": (
            "the DCP reference benchmark's video grid (Open-Sora v1.2 / STDiT3 shapes), reweighted"
        ),
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


def opensora_stage1_source() -> tuple[SizeSource, dict[str, Any]]:
    buckets, p, bs = [], [], {}
    for res, table in OPENSORA_V12_STAGE1.items():
        for frames, (keep, batch) in table.items():
            buckets.append(VideoBucket(res, frames))
            p.append(keep)
            bs[buckets[-1].label] = batch
    prov = {
        "source": "hpcaitech/Open-Sora configs/opensora-v1-2/train/stage1.py (commit 20b7c2f8), "
        "bucket_config",
        "weights": (
            "p ~ the config's keep probability of each (resolution, frames) bucket, assuming "
            "source clips spread evenly over the listed buckets (the config fixes keep "
            "probabilities and per-bucket batch sizes, not the data mix); buckets at "
            "256/512/1024/1080p and with keep probability 0 left out"
        ),
        "config_batch_sizes": bs,
        "licence": "Open-Sora is Apache-2.0; only the config's numbers are used",
    }
    return BucketSource(buckets, np.asarray(p)), prov
