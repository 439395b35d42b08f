"""`GlobalBatch`: the samples of one optimizer step, as every method sees them.

Planners refer to samples by their *position* in the batch (0..n-1); ``sample_ids`` names the
underlying data (the same ids for every method and rank at a given workload, seed and step).
A sample has a 2-D shape (frames, spatial): video latents keep (T', S); text is (1, L).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class GlobalBatch:
    step: int
    sample_ids: np.ndarray  # int64, shape (n,)
    tokens: np.ndarray  # int64, shape (n,): tokens per sample (frames * spatial)
    frames: np.ndarray  # int64, shape (n,): latent frames T' (1 for text and images)
    truncated: int = 0  # samples cut to the model's maximum length by the batch policy
    dropped: int = 0  # samples dropped by the batch policy (over the maximum length)
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.tokens)
        if len(self.sample_ids) != n or len(self.frames) != n:
            raise ValueError("sample_ids, tokens and frames must have the same length")
        if n and (np.any(self.tokens <= 0) or np.any(self.frames <= 0)):
            raise ValueError("tokens and frames must be positive")
        if n and np.any(self.tokens % self.frames):
            raise ValueError("tokens must be a multiple of frames (tokens = frames * spatial)")

    @classmethod
    def from_lengths(cls, lengths: Any, step: int = 0, frames: Any = None) -> GlobalBatch:
        tokens = np.asarray(lengths, dtype=np.int64)
        fr = np.ones_like(tokens) if frames is None else np.asarray(frames, dtype=np.int64)
        return cls(
            step=step, sample_ids=np.arange(len(tokens), dtype=np.int64), tokens=tokens, frames=fr
        )

    @property
    def n(self) -> int:
        return int(len(self.tokens))

    @property
    def spatial(self) -> np.ndarray:
        return self.tokens // self.frames

    @property
    def total_tokens(self) -> int:
        return int(self.tokens.sum())

    def subset(self, positions: Any) -> GlobalBatch:
        pos = np.asarray(positions, dtype=np.int64)
        return GlobalBatch(
            step=self.step,
            sample_ids=self.sample_ids[pos],
            tokens=self.tokens[pos],
            frames=self.frames[pos],
        )
