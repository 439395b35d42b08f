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

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dcp_bench.batch import GlobalBatch
from dcp_bench.errors import WorkloadError
from dcp_bench.workloads.base import (
    DRAW_CHUNK,
    ID_SHIFT,
    MAX_DRAWS_PER_STEP,
    MAX_SAMPLE_TOKENS,
    STATS_SAMPLE,
    STATS_SEED,
    TEXT_TOKENS_PER_GPU,
    VIDEO_TOKENS_PER_GPU,
    SizeSource,
    distribution_stats,
)
from dcp_bench.workloads.video import MIX_DATASETS, VAE_STRIDE, ReferenceDataset


@dataclass
class _Deal:
    """What a step's batch holds so far, as `Workload.global_batch` deals it chunk by chunk."""

    ids: list[np.ndarray] = field(default_factory=list)
    tokens: list[np.ndarray] = field(default_factory=list)
    frames: list[np.ndarray] = field(default_factory=list)
    total: int = 0  # tokens kept
    kept: int = 0  # samples kept
    truncated: int = 0
    dropped: int = 0
    drawn: int = 0
    done: bool = False


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
            raise WorkloadError(
                f"workload {self.name!r}: kind {self.kind!r}; expected video, text or synthetic"
            )
        if not isinstance(self.seed, (int, np.integer)) or self.seed < 0:
            raise WorkloadError(
                f"workload {self.name!r}: seed {self.seed!r}; expected an integer >= 0"
            )
        if not 1 <= self.length_scale < float("inf"):  # also refuses nan
            raise WorkloadError(
                f"workload {self.name!r}: length_scale {self.length_scale!r}; expected a finite "
                "number >= 1"
            )
        if self.max_len_policy not in ("truncate", "drop"):
            raise WorkloadError(
                f"workload {self.name!r}: max_len_policy {self.max_len_policy!r}; expected "
                "truncate or drop"
            )
        if self.max_len is not None and self.max_len < 1:
            raise WorkloadError(f"workload {self.name!r}: max_len {self.max_len!r}; expected >= 1")
        if self.samples_per_step is not None and self.samples_per_step < 1:
            raise WorkloadError(
                f"workload {self.name!r}: samples_per_step {self.samples_per_step!r}; expected >= 1"
            )
        if self.tokens_per_gpu is None:
            self.tokens_per_gpu = (
                VIDEO_TOKENS_PER_GPU if self.kind == "video" else TEXT_TOKENS_PER_GPU
            )
        if not 1 <= self.tokens_per_gpu <= MAX_SAMPLE_TOKENS:
            raise WorkloadError(
                f"workload {self.name!r}: tokens_per_gpu {self.tokens_per_gpu!r}; expected an "
                f"integer in [1, {MAX_SAMPLE_TOKENS:,}]"
            )

    # -- sizes ---------------------------------------------------------------------------------

    def _scaled(self, frames: np.ndarray, spatial: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.length_scale == 1:
            return frames, spatial
        # Video keeps its latent frames and shrinks each frame; text (frames = 1) shrinks its
        # length.
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

    def _capped(
        self, tokens: np.ndarray, frames: np.ndarray, limit: int | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(tokens, frames, over): ``over`` marks the samples longer than ``limit``; under
        ``max_len_policy=truncate`` they come back cut to it (`_truncate`), else as they were."""
        over = np.zeros(len(tokens), dtype=bool) if limit is None else tokens > limit
        if limit is not None and over.any() and self.max_len_policy == "truncate":
            frames, tokens = _truncate(frames, tokens, over, limit)
        return tokens, frames, over

    def global_batch(
        self, step: int, world_size: int, max_seq_len: int | None = None
    ) -> GlobalBatch:
        """The global batch of ``step`` on ``world_size`` GPUs (deterministic; see the module
        doc)."""
        if step < 0:
            raise WorkloadError(f"workload {self.name!r}: step {step}; expected >= 0")
        if world_size < 1:
            raise WorkloadError(f"workload {self.name!r}: world_size {world_size}; expected >= 1")
        limit = self._limit(max_seq_len)
        rng = np.random.default_rng([int(self.seed), int(step)])
        budget = None if self.samples_per_step else self.token_budget(world_size)
        deal = _Deal()
        while not deal.done:
            if deal.drawn >= MAX_DRAWS_PER_STEP:
                raise WorkloadError(
                    f"workload {self.name!r}: no sample fits max_len={limit} after {deal.drawn} "
                    "draws with max_len_policy=drop; raise the limit or use "
                    "max_len_policy=truncate"
                )
            self._deal_chunk(deal, self.source.draw(rng, DRAW_CHUNK), budget, limit)
        return GlobalBatch(
            step=step,
            sample_ids=np.concatenate(deal.ids),
            tokens=np.concatenate(deal.tokens),
            frames=np.concatenate(deal.frames),
            truncated=deal.truncated,
            dropped=deal.dropped,
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

    def _deal_chunk(
        self, deal: _Deal, ids: np.ndarray, budget: int | None, limit: int | None
    ) -> None:
        """Add to ``deal`` the samples of one chunk of draws that enter the batch, in draw order,
        and mark it done when the batch is full (``budget`` tokens, or ``samples_per_step``)."""
        deal.drawn += len(ids)
        tokens, frames, over = self._capped(*self.shapes(ids), limit)
        drop = over if self.max_len_policy == "drop" else np.zeros(len(ids), dtype=bool)
        cand = np.nonzero(~drop)[0]  # chunk positions that may enter the batch, in draw order
        if budget is None:
            assert self.samples_per_step is not None
            take = min(len(cand), self.samples_per_step - deal.kept)
        else:
            # Greedy fill: every candidate whose running total stays within the budget; the
            # first sample of a step always enters, even when it alone exceeds the budget.
            cum = deal.total + np.cumsum(tokens[cand])
            take = int(np.searchsorted(cum, budget, side="right"))
            if deal.kept == 0 and take == 0 and len(cand):
                take = 1
        sel = cand[:take]
        deal.ids.append(ids[sel])
        deal.tokens.append(tokens[sel])
        deal.frames.append(frames[sel])
        deal.truncated += int(over[sel].sum())
        deal.total += int(tokens[sel].sum())
        deal.kept += take
        # Where the step stopped reading this chunk: dropped samples count only up to there.
        stop = len(ids)
        full = self.samples_per_step is not None and deal.kept >= self.samples_per_step
        if full or (budget is not None and take and deal.total >= budget):
            deal.done, stop = True, int(cand[take - 1])
        elif budget is not None and take < len(cand):
            deal.done, stop = True, int(cand[take])
        deal.dropped += int(drop[:stop].sum())

    # -- the fixed dataset of an epoch ---------------------------------------------------------

    def epoch_dataset(self, world_size: int, max_seq_len: int | None = None) -> GlobalBatch:
        """The whole fixed dataset an epoch visits (``run.unit=epoch``), in the generator's order
        (images, then videos; positions are dataset indices). The same for every seed, method and
        world size: the run's seed only shuffles how a method's sampler deals it. Sample ids
        name the bucket and the dataset index, so ``shapes`` recovers every size. The batch
        policy's ``length_scale`` and maximum length apply as they do to a step's batch."""
        if self.dataset is None:
            # The registry gives a fixed dataset to exactly the mixes of `MIX_DATASETS`.
            names = ", ".join(MIX_DATASETS)
            raise WorkloadError(
                f"workload {self.name!r} has no fixed dataset for run.unit=epoch "
                f"(workloads with one: {names})"
            )
        if world_size < 1:
            raise WorkloadError(f"workload {self.name!r}: world_size {world_size}; expected >= 1")
        buckets, counts = self.dataset.counts()
        index = {
            (b.resolution, b.frames): i for i, b in enumerate(getattr(self.source, "buckets", []))
        }
        missing = [b.label for b in buckets if (b.resolution, b.frames) not in index]
        if missing:
            raise WorkloadError(
                f"workload {self.name!r}: its dataset has buckets its size source lacks "
                f"({missing[0]})"
            )
        bucket_of = np.repeat([index[(b.resolution, b.frames)] for b in buckets], counts).astype(
            np.int64
        )
        ids = (bucket_of << ID_SHIFT) | np.arange(len(bucket_of), dtype=np.int64)
        limit = self._limit(max_seq_len)
        tokens, frames, over = self._capped(*self.shapes(ids), limit)
        dropped = 0
        if over.any() and self.max_len_policy == "drop":
            keep = ~over
            ids, tokens, frames, dropped = ids[keep], tokens[keep], frames[keep], int(over.sum())
        return GlobalBatch(
            step=0,
            sample_ids=ids,
            tokens=tokens,
            frames=frames,
            truncated=int(over.sum()) if self.max_len_policy == "truncate" else 0,
            dropped=dropped,
            info={
                "workload": self.name,
                "workload_version": self.version,
                "dataset": self.dataset.describe(),
                "length_scale": self.length_scale,
                "max_len": limit,
                "max_len_policy": self.max_len_policy,
            },
        )

    def latent_tokens(self, sample_ids: Any) -> np.ndarray | None:
        """Latent voxels of each sample (T' x H/8 x W/8, `latent_voxels`), the reference's token
        unit, after ``length_scale``; None for sources that are not the video grid."""
        buckets = getattr(self.source, "buckets", None)
        if not buckets:
            return None
        per_frame = np.array(
            [b.height // VAE_STRIDE * (b.width // VAE_STRIDE) for b in buckets], dtype=np.int64
        )
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
        return (
            tokens.astype(np.float64),
            probs,
            f"sample of {STATS_SAMPLE:,} draws, seed {STATS_SEED}",
        )

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
