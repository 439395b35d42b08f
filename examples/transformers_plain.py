"""A plain transformers training loop: one process trains a Llama (built from its config, random
weights) on variable-length samples packed into one row per step.

Run: python examples/transformers_plain.py [steps]
Its DCP version is examples/transformers_dcp.py; docs/integration.md shows the diff.
"""

from __future__ import annotations

import sys

import numpy as np
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, LlamaConfig

from dcp_bench.batch import GlobalBatch
from dcp_bench.runtime.models import text_sample

CONFIG = LlamaConfig(vocab_size=1024, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                     num_attention_heads=8, num_key_value_heads=4)


def sample_tokens(sample_id: int, length: int) -> torch.Tensor:
    """A sample's length+1 token ids (inputs [:length], next-token targets [1:]); any dataset works."""
    return text_sample(0, sample_id, length, CONFIG.vocab_size)


def batches(steps: int, per_step: int = 8, seed: int = 0):
    """Global batches of variable-length samples (lengths and ids; sample_tokens gives the content)."""
    rng = np.random.default_rng(seed)
    for step in range(steps):
        lengths = rng.integers(16, 600, size=per_step)
        yield GlobalBatch.from_lengths(lengths, step=step)


def packed(batch: GlobalBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The batch as one packed row: input ids, position ids restarting per sample, targets."""
    seqs = [sample_tokens(int(s), int(n)) for s, n in zip(batch.sample_ids, batch.tokens)]
    ids = torch.cat([s[:-1] for s in seqs])[None]
    positions = torch.cat([torch.arange(len(s) - 1) for s in seqs])[None]
    return ids, positions, torch.cat([s[1:] for s in seqs])


def train(steps: int = 4) -> list[float]:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(CONFIG)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for batch in batches(steps):
        ids, positions, targets = packed(batch)
        # use_cache=False: without a cache the library masks packed samples apart by their position ids
        logits = model(input_ids=ids, position_ids=positions, use_cache=False).logits[0]
        loss = F.cross_entropy(logits.float(), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


if __name__ == "__main__":
    for step, loss in enumerate(train(int(sys.argv[1]) if len(sys.argv) > 1 else 4)):
        print(f"step {step}: loss {loss:.6f}")
