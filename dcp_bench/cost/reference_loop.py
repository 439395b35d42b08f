"""What the reference's training loop pays besides the model's own work, per iteration and per
sample, and the memory-traffic floor of short attention: each a declared time term of the
analytical cost model (`AnalyticalCostModel`, ``loop="reference"`` for the reference's loop; the
attention floor always), with its basis cited.

Per iteration (after the micro-steps; VideoSys 4cce477 `examples/training/open_sora/train.py`):

* ``ema_s``: the EMA update, `train.py:374` -> `videosys/training/ema_distributed.py:7-28`: for
  every trainable parameter tensor, ``ema.mul_(decay).add_(fp32 fragment)`` on the rank's ZeRO-1
  shard (`train.py:228-246`: stage 1, bf16; `ema_sharding`, `:272`). Two eager kernels per tensor
  (`ema_param_tensors`) at ``op_dispatch_s`` each (the host cost of one eager PyTorch op and its
  launch; an assumption, 10 us, the order of the published 5-25 us per op), plus 12 bytes per
  shard element (read the EMA, read the fragment, write the EMA) at the measured memory bandwidth.
* ``loss_sync_s``: ``all_reduce_mean(iter_loss)`` and ``.item()`` (`train.py:377-378`): one
  all-reduce of a scalar over the world, priced by the calibrated all-reduce law (its hop
  latencies); the host read waits for it.

Per micro-batch:

* ``host_input_s``: the dummy dataset's tensors copied to the GPU (`train.py:328-345`,
  ``.to(device, dtype)``): per sample a fp32 caption ``torch.rand(1, 300, 4096)``, an int64 mask of
  300 and a fp32 latent of 4 channels x T' x H/8 x W/8 (`videosys/training/datasets/open_sora/
  datasets.py:430-435`), every rank of an SP group the whole micro-batch (the sampler deals each
  group's ranks the same samples, `sampler.py:924-926`), from pinned memory (`dataloader.py:31`)
  at the GPU's host link, ``host_to_device_bw`` (PCIe Gen5 x16: 64 GB/s each way, the H100/H200
  datasheets' 128 GB/s bidirectional). Generating the tensors runs in 8 loader workers
  (``num_workers: 8``, the benchmark configs) ahead of the loop, so it is not charged.

Always (physics, every mode):

* ``short_attn_s``: attention over fewer than 512 keys is bound by memory traffic, not FLOPs (the
  calibrated attention efficiency rests on published kernel timings from 512 keys up,
  results/validation/). Per attention call the forward reads q, k, v and writes its output and
  the backward reads q, k, v, the output and its gradient and writes three gradients (the roofline
  of FlashAttention's IO, Dao et al. 2022, Theorem 2, at lengths where the tile holds the whole
  sequence): 4 and 8 activation-sized tensors at the measured memory bandwidth. The term is what
  that floor adds above the FLOP-priced time of those calls (zero where FLOPs dominate).
"""

from __future__ import annotations

import numpy as np

from dcp_bench.archs import arch_of
from dcp_bench.cost.specs import ModelSpec

LOOPS = ("runtime", "reference")
SHORT_ATTENTION_KEYS = 512  # below this the attention efficiency law has no published anchor
OP_DISPATCH_S = 10e-6  # host cost of one eager op + launch (assumption; see the docstring)
HOST_TO_DEVICE_BW = 64.0e9  # PCIe Gen5 x16, each way (H100 / H200 SXM datasheets)
CAPTION_TOKENS, CAPTION_DIM = 300, 4096  # datasets.py:433: torch.rand(1, 300, 4096)
LATENT_CHANNELS = 4  # datasets.py:432
EMA_BYTES_PER_ELEMENT = 12.0  # read EMA (4) + read fp32 fragment (4) + write EMA (4)
ATTN_FWD_TENSORS, ATTN_BWD_TENSORS = 4.0, 8.0  # activation-sized tensors moved per call


def ema_param_tensors(spec: ModelSpec) -> int:
    """Trainable parameter tensors the EMA loop visits. STDiT3 (`open_sora_transformer_3d.py`):
    16 per block (qkv weight/bias, q and k norm weights, proj weight/bias, cross q, kv, proj
    weights/biases, MLP fc1/fc2 weights/biases, scale_shift_table), two blocks per layer unit, and
    20 outside the blocks (patch, timestep, fps and caption embedders, t_block, the final layer;
    ``pos_embed`` is skipped). A decoder (Llama family): 9 per layer and 3 outside."""
    return arch_of(spec).ema_param_tensors(spec)


def host_input_bytes(spec: ModelSpec, tokens: np.ndarray) -> np.ndarray:
    """Bytes per sample the reference's loop copies to the GPU (module docstring). ``tokens`` are
    patch tokens; a latent voxel count is tokens x the patch's spatial area."""
    if not arch_of(spec).video:
        return np.zeros(len(tokens))
    voxels = np.asarray(tokens, dtype=float) * spec.patch[1] * spec.patch[2]
    caption = CAPTION_TOKENS * CAPTION_DIM * 4.0 + CAPTION_TOKENS * 8.0
    return caption + voxels * LATENT_CHANNELS * 4.0


__all__ = [
    "HOST_TO_DEVICE_BW",
    "LOOPS",
    "OP_DISPATCH_S",
    "SHORT_ATTENTION_KEYS",
    "ema_param_tensors",
    "host_input_bytes",
]
