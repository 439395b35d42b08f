"""A plain training loop: one process trains the tiny Llama on variable-length batches.

Run: python examples/train_plain.py [steps]
Its DCP version is examples/train_dcp.py; docs/integration.md shows the diff.
"""

from __future__ import annotations

import sys

import numpy as np
import torch

from dcp_bench.batch import GlobalBatch
from dcp_bench.cost.specs import model_spec
from dcp_bench.runtime.attention import SINGLE
from dcp_bench.runtime.models import build_model


def batches(steps: int, per_step: int = 8, seed: int = 0):
    """Global batches of variable-length samples (lengths and ids; the model makes the content)."""
    rng = np.random.default_rng(seed)
    for step in range(steps):
        lengths = rng.integers(16, 600, size=per_step)
        yield GlobalBatch.from_lengths(lengths, step=step)


def train(steps: int = 4) -> list[float]:
    torch.manual_seed(0)
    model = build_model(model_spec("tiny_llama"), seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for batch in batches(steps):
        inputs = model.make_inputs(batch.sample_ids, batch.tokens, batch.frames, SINGLE, 0)
        loss = model.loss_sum(inputs, SINGLE) / batch.total_tokens
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


if __name__ == "__main__":
    for step, loss in enumerate(train(int(sys.argv[1]) if len(sys.argv) > 1 else 4)):
        print(f"step {step}: loss {loss:.6f}")
