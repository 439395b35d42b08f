"""A plain diffusers training loop: one process trains a small Wan video transformer (built from
its config, random weights) with the flow-matching loss on variable-length clips of random latents.

Run: python examples/diffusers_plain.py [steps]
Its DCP version is examples/diffusers_dcp.py; docs/integration.md shows the diff.
"""

from __future__ import annotations

import sys

import numpy as np
import torch
from diffusers import WanTransformer3DModel

from dcp_bench.batch import GlobalBatch

CONFIG = dict(patch_size=(1, 2, 2), num_attention_heads=4, attention_head_dim=16, in_channels=4, out_channels=4,
              text_dim=32, freq_dim=32, ffn_dim=128, num_layers=2, rope_max_seq_len=256)


def sample_clip(sample_id: int, frames: int, patches: int) -> tuple[torch.Tensor, ...]:
    """A clip's latents, noise, timestep and caption (random here; any dataset works)."""
    g = torch.Generator().manual_seed(sample_id)
    shape = (1, 4, frames, 2 * 2, 2 * patches // 2)  # patches per frame = 2 x (patches / 2)
    return (torch.randn(shape, generator=g), torch.randn(shape, generator=g),
            torch.randint(0, 1000, (1,), generator=g), torch.randn(1, 16, 32, generator=g))


def batches(steps: int, per_step: int = 6, seed: int = 0):
    """Global batches of clips: frames and patches per frame (tokens = frames x patches)."""
    rng = np.random.default_rng(seed)
    for step in range(steps):
        frames, patches = rng.integers(1, 33, size=per_step), 2 * rng.integers(2, 65, size=per_step)
        yield GlobalBatch(step=step, sample_ids=np.arange(step * per_step, (step + 1) * per_step),
                          tokens=frames * patches, frames=frames)


def train(steps: int = 4) -> list[float]:
    torch.manual_seed(0)
    model = WanTransformer3DModel(**CONFIG)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for batch in batches(steps):
        loss = torch.zeros(())
        for sample_id, tokens, frames in zip(batch.sample_ids, batch.tokens, batch.frames):
            x0, noise, t, caption = sample_clip(int(sample_id), int(frames), int(tokens // frames))
            s = t.float() / 1000
            pred = model(hidden_states=(1 - s) * x0 + s * noise, timestep=t, encoder_hidden_states=caption,
                         return_dict=False)[0]
            loss = loss + (pred - (noise - x0)).square().sum() / batch.total_tokens
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


if __name__ == "__main__":
    for step, loss in enumerate(train(int(sys.argv[1]) if len(sys.argv) > 1 else 4)):
        print(f"step {step}: loss {loss:.6f}")
