"""The DCP version of examples/transformers_plain.py: the same transformers model, data and
optimizer, trained with Data-Centric Parallel on every rank of a torchrun job.

Run: torchrun --nproc-per-node 2 examples/transformers_dcp.py [steps]
docs/integration.md shows the diff against the plain loop and counts its lines.
"""

from __future__ import annotations

import sys

import numpy as np
import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM, LlamaConfig

from dcp_bench.api import DataCentricParallel
from dcp_bench.batch import GlobalBatch
from dcp_bench.runtime.integrations.transformers_lm import CausalLMAdapter
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


def train(steps: int = 4) -> list[float]:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(CONFIG)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    adapter = CausalLMAdapter(model, sample_tokens)
    dcp = DataCentricParallel(model, optimizer, batches(steps), method="dcp", cluster="cpu", adapter=adapter)
    for work in dcp:
        for mb in work:
            loss = dcp.loss_sum(mb) / work.tokens
            work.backward(loss)
        losses.append(dcp.step(work))
    return losses


if __name__ == "__main__":
    for step, loss in enumerate(train(int(sys.argv[1]) if len(sys.argv) > 1 else 4)):
        print(f"step {step}: loss {loss:.6f}")
