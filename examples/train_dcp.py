"""The DCP version of examples/train_plain.py: the same model, data and optimizer, trained with
Data-Centric Parallel on every rank of a torchrun job (gloo on CPU, NCCL on GPUs).

Run: torchrun --nproc-per-node 2 examples/train_dcp.py [steps]
docs/integration.md shows the diff against the plain loop and counts its lines.
"""

from __future__ import annotations

import sys

import numpy as np
import torch
import torch.distributed as dist

from dcp_bench.api import DataCentricParallel
from dcp_bench.batch import GlobalBatch
from dcp_bench.cost.specs import model_spec
from dcp_bench.runtime.models import build_model


def batches(steps: int, per_step: int = 8, seed: int = 0):
    """Global batches of variable-length samples (lengths and ids; the model makes the content)."""
    rng = np.random.default_rng(seed)
    for step in range(steps):
        lengths = rng.integers(16, 600, size=per_step)
        yield GlobalBatch.from_lengths(lengths, step=step)


def train(steps: int = 4) -> list[float]:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = build_model(model_spec("tiny_llama"), seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    dcp = DataCentricParallel(model, optimizer, batches(steps), method="dcp", cluster="cpu")
    for work in dcp:
        for mb in work:
            loss = model.loss_sum(mb.inputs, mb.sp, mb.ckpt_layers) / work.tokens
            work.backward(loss)
        losses.append(dcp.step(work))
    return losses


if __name__ == "__main__":
    for step, loss in enumerate(train(int(sys.argv[1]) if len(sys.argv) > 1 else 4)):
        print(f"step {step}: loss {loss:.6f}")
