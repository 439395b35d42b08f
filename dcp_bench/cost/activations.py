"""What the runtime's models keep for the backward, per unit, in closed form.

Each term is the bytes the ops of one unit of `dcp_bench.runtime.models` save for their backward
(one entry per saved storage, as ``torch.autograd.graph.saved_tensors_hooks`` sees them), written
out op by op below; `dcp_bench.runtime.memory_count` counts the same from the models themselves and
``tests/test_memory_count.py`` holds the two within 5% for every unit, checkpoint setting and
model (docs/cost_model.md, "Activation memory").

Notation: ``b`` bytes of the compute dtype, ``h`` hidden, ``f`` MLP width, ``H`` heads, ``hd``
head dim, ``kvd`` = KV heads x hd, ``M`` caption tokens, ``D`` caption width, ``C`` latent patch
width (in_channels x patch volume). A fused attention kernel keeps q, k, v, its output and an fp32
log-sum-exp per head and query row (4H bytes per token), never the score matrix. RMSNorm computes
in fp32: it keeps its fp32 input (4h) and its output in the compute dtype (bh).

STDiT3's self-attention branches on its sequence length ``l`` as the reference's does (VideoSys
``videosys/models/modules/attentions.py:57-66``, runtime.models.STDiTBlock): ``l == 1`` keeps
no attention state (the output is v), ``l < FUSED_ATTENTION_MIN_LEN`` runs the unfused math path
(it keeps the l x l scores per head: fp32 softmax and its cast, ``(4 + b) H l`` per row), longer
sequences the fused kernel; `ActivationTerms.layer_tok_at` prices a sample by its lengths
(spatial S patches, temporal T' frames), ``layer_tok`` is the fused path of both. The six
modulation vectors of a block are one per sample (``t2i_modulate``), so the modulation is a
per-sample term.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from dcp_bench.cost.specs import ModelSpec

FREQ_DIM = 256  # the timestep embedder's sinusoidal width (runtime.models.STDiTModel.FREQ_DIM)
# Attention over fewer keys runs the reference's unfused math path ("flash attn is not memory
# efficient for small sequences", VideoSys videosys/models/modules/attentions.py:57-58, :95-97).
FUSED_ATTENTION_MIN_LEN = 30
# The q/k RMSNorm implementations (model.qk_norm): the reference's fallback LlamaRMSNorm
# (videosys/models/modules/normalization.py:9-33, used when apex is absent) and a fused one
# (apex FusedRMSNorm, normalization.py:11-13).
QK_NORMS = ("reference", "fused")


@dataclass(frozen=True)
class ActivationTerms:
    """Bytes kept per token (``tok``) and per sample (``sample``), by unit.

    ``layer``: units of one layer unit (a Llama decoder layer; an STDiT3 spatial + temporal pair:
    names prefixed ``spatial.`` / ``temporal.``), not checkpointed. ``checkpoint_input``: what one
    checkpointed layer unit keeps (its checkpointed blocks' inputs). ``outer``: the model outside
    its layers (embeddings, final layer, loss), kept whatever the checkpointing. ``shared``: inputs
    every layer reads, kept once (the first layer saves them, or the checkpoints hold them): the
    STDiT caption features, Llama's RoPE tables. ``conditioning_held``: inputs every checkpointed
    unit takes besides the hidden states (per token: Llama's RoPE tables), kept once while any
    unit is checkpointed. ``blocks_per_layer``: checkpoints per layer unit (recomputed one at a
    time). ``conditioning_held_sample``: the same per sample (the STDiT
    per-sample timestep modulation, 6h). ``attention_tok``: STDiT self-attention bytes per row by
    path, (length 1, math path without its scores, fused); ``score_tok``: the math path's score
    bytes per row and key (`layer_tok_at`)."""

    layer_tok: dict[str, float]
    layer_sample: dict[str, float]
    outer_tok: dict[str, float]
    outer_sample: dict[str, float]
    shared_tok: float
    shared_sample: float
    checkpoint_input_tok: float
    conditioning_held_tok: float
    blocks_per_layer: int
    conditioning_held_sample: float = 0.0
    attention_tok: tuple[float, float, float] | None = None
    score_tok: float = 0.0

    @property
    def full_tok(self) -> float:
        return float(sum(self.layer_tok.values()))

    def self_attention_tok(self, length: Any) -> Any:
        """STDiT self-attention bytes per row of sequences of ``length`` keys (array-like)."""
        assert self.attention_tok is not None
        one, math_base, fused = self.attention_tok
        n = np.asarray(length, dtype=float)
        short = math_base + self.score_tok * n
        return np.where(n <= 1, one, np.where(n < FUSED_ATTENTION_MIN_LEN, short, fused))

    def layer_tok_at(self, spatial: Any, temporal: Any) -> dict[str, Any]:
        """``layer_tok`` for samples of ``spatial`` patches per frame and ``temporal`` frames
        (array-likes): each block's self-attention on the path of its length. Llama:
        ``layer_tok``."""
        out: dict[str, Any] = dict(self.layer_tok)
        if self.attention_tok is not None:
            out["spatial.self_attention"] = self.self_attention_tok(spatial)
            out["temporal.self_attention"] = self.self_attention_tok(temporal)
        return out

    def full_tok_at(self, spatial: Any, temporal: Any) -> Any:
        """`full_tok` for samples of the given lengths (`layer_tok_at`)."""
        return sum(self.layer_tok_at(spatial, temporal).values())

    @property
    def full_sample(self) -> float:
        return float(sum(self.layer_sample.values()))


def dtype_bytes(spec: ModelSpec) -> int:
    return int(spec.dtype_bytes)


def activation_terms(spec: ModelSpec, b: int | None = None) -> ActivationTerms:
    """The closed-form terms of ``spec`` in a compute dtype of ``b`` bytes (default the spec's)."""
    b = int(b if b is not None else spec.dtype_bytes)
    h, f, H = spec.hidden, spec.ffn_hidden, spec.heads
    lse = 4.0 * H  # flash attention's fp32 log-sum-exp per head and query row
    if spec.arch == "llama":
        kvd = spec.kv_heads * spec.head_dim
        norm = 4.0 * h + b * h + 4.0  # fp32 input, output in the compute dtype, fp32 rsqrt per row
        layer = {
            "norms": 2 * norm,
            # normed input (q/k/v projections), q, k, v (rotated, GQA: KV heads only), the kernel's
            # output and log-sum-exp, the o-projection input (the packed output)
            "attention": b * (4.0 * h + 2 * kvd) + lse,
            # normed input (gate/up projections), gate, up, silu(gate), silu(gate) * up
            "mlp": b * h + 4.0 * b * f,
        }
        outer_tok = {
            "embeddings": 8.0,  # the int64 token ids (the embedding's backward)
            "final_norm": norm,
            "loss": b * h + 8.0 + 4.0,  # LM-head input, int64 labels, fp32 log-sum-exp per row
        }
        return ActivationTerms(
            layer,
            {k: 0.0 for k in layer},
            outer_tok,
            {},
            shared_tok=2.0 * spec.head_dim * b,  # RoPE cos and sin per row
            shared_sample=0.0,
            checkpoint_input_tok=float(b * h),
            conditioning_held_tok=0.0,
            blocks_per_layer=1,
        )
    M, D = spec.text_tokens, spec.text_dim
    C = spec.in_channels * math.prod(spec.patch)
    if spec.qk_norm == "fused":
        # apex-style: a contiguous copy of the strided q (k) view and an fp32 rstd per head, row
        qk_norm = 2 * (b * h + 4.0 * H)
    else:
        # the reference's fallback: an fp32 copy of q (k) (4h), the fp32 rsqrt per head and row,
        # and the output cast (bh), each for q and k
        qk_norm = 2 * (4.0 * h + 4.0 * H + b * h)
    # self-attention per row by path: the modulated input (qkv projection), the projection input
    # (the packed output) and output (kept by the gate) on every path; with attention the q/k
    # norms, then on the fused path the stacked normed q/k/v the kernel reads (3bh), its output
    # and log-sum-exp; on the math path the scaled q and the contiguous copies of k and v its
    # batched matmuls keep (3bh), its l x l scores in ``score_tok``
    one = 3.0 * b * h
    math_base = one + qk_norm + 3.0 * b * h
    fused = one + qk_norm + 3.0 * b * h + b * h + lse
    # the softmax in fp32 and its cast to the compute dtype (one tensor in fp32)
    score = (4.0 + (b if b < 4 else 0)) * H
    block = {
        # LayerNorm input, its output and its mean / rstd per row in the compute dtype; twice
        # (before self-attention and before the MLP)
        "norm_modulation": 2 * (2.0 * b * h + 2.0 * b),
        "self_attention": fused,
        # input (q projection), q, the kernel's output and log-sum-exp, the output projection's
        # input
        "cross_attention": 4.0 * b * h + lse,
        # normed input, fc1 output, GELU output, fc2 output (gated)
        "mlp": 2.0 * b * h + 2.0 * b * f,
    }
    block_sample = {k: 0.0 for k in block}
    # (1 + scale) of the two modulations, one per sample
    block_sample["norm_modulation"] = 2.0 * b * h
    # the block's six modulation vectors (t_mod + scale_shift_table), one per sample, kept by the
    # gates
    block_sample["self_attention"] = 6.0 * b * h
    # the caption keys and values of this block: M x 2h per sample, on every rank of the group
    block_sample["cross_attention"] = M * 2.0 * h * b
    layer_tok = {f"{kind}.{k}": v for kind in ("spatial", "temporal") for k, v in block.items()}
    layer_sample = {
        f"{kind}.{k}": v for kind in ("spatial", "temporal") for k, v in block_sample.items()
    }
    outer_tok = {
        # latent patches in the compute dtype (x embedder input)
        "embeddings": C * b,
        # LayerNorm input, mean/rstd, output, modulated input; the fp32 difference of the noise
        # prediction and the target, the fp32 loss weight
        "final_layer": 3.0 * b * h + 2.0 * b + 4.0 * C + 4.0,
    }
    outer_sample = {
        # the caption in the compute dtype (caption MLP input), the MLP's hidden and GELU
        # outputs; the timestep and fps MLPs (input, hidden, GELU), their sum and its SiLU
        "embeddings": M * D * b + 2.0 * M * h * b + 2 * (FREQ_DIM * b + 2.0 * h * b) + 2.0 * h * b,
        # the final layer's (1 + scale), one per sample
        "final_layer": b * h,
    }
    return ActivationTerms(
        layer_tok,
        layer_sample,
        outer_tok,
        outer_sample,
        shared_tok=0.0,
        shared_sample=M * h * b,  # the caption features
        checkpoint_input_tok=2.0 * b * h,  # the spatial and the temporal block input
        conditioning_held_tok=0.0,
        blocks_per_layer=2,
        conditioning_held_sample=6.0 * b * h,  # t_mod (samples, 6, h)
        attention_tok=(one, math_base, fused),
        score_tok=score,
    )


def kept_bytes(
    terms: ActivationTerms,
    num_layers: int,
    tokens: float,
    samples: float,
    ckpt_layers: int,
    peak: bool = True,
) -> float:
    """Bytes kept for the backward by one micro-batch of ``tokens`` per rank over ``samples``
    samples, with ``ckpt_layers`` of ``num_layers`` layer units checkpointed. ``peak``: add what
    recomputing one checkpointed block materialises on top when every layer is checkpointed
    (otherwise the stored layers above are freed before the first recomputation). Every
    attention on its fused path (``layer_tok``; `ActivationTerms.layer_tok_at` by length)."""
    L, k = num_layers, min(max(ckpt_layers, 0), num_layers)
    full = tokens * terms.full_tok + samples * terms.full_sample
    inp = tokens * terms.checkpoint_input_tok
    out = (L - k) * full + k * inp
    out += tokens * sum(terms.outer_tok.values()) + samples * sum(terms.outer_sample.values())
    out += tokens * terms.shared_tok + samples * terms.shared_sample
    if k > 0:
        out += tokens * terms.conditioning_held_tok + samples * terms.conditioning_held_sample
    if peak and k == L and L > 0:
        nb = terms.blocks_per_layer
        out += full / nb - inp / nb
    return float(out)


def reference_block_inputs(spec: ModelSpec, b: int | None = None) -> tuple[float, float]:
    """Bytes per token and per sample of the tensors that require grad among the inputs of one
    layer unit's blocks, as the reference profiler sums them into ``input_memory`` and charges
    them to every layer it did not run (VideoSys 4cce477 `videosys/core/dcp/recompute.py:87`;
    `profiler.py:785-797`). STDiT3 calls each of its two blocks with the hidden states ``x``, the
    caption features ``y`` (M x h per sample, unsplit by SP) and the two (6h) timestep
    modulations ``t_mlp`` and ``t0_mlp`` (`open_sora_transformer_3d.py:612-613`; ``t0_mlp`` exists
    because the benchmark configs set ``mask_ratios``, `train.py:150`, `:350-353`); the real run
    keeps the caption and the modulations once, not per block. A decoder layer takes its hidden
    states."""
    b = int(b if b is not None else spec.dtype_bytes)
    h = spec.hidden
    if spec.arch == "llama":
        return float(b * h), 0.0
    per_block_sample = b * (spec.text_tokens * h + 2 * 6.0 * h)
    return 2.0 * b * h, 2.0 * per_block_sample


__all__ = [
    "FUSED_ATTENTION_MIN_LEN",
    "QK_NORMS",
    "ActivationTerms",
    "activation_terms",
    "kept_bytes",
    "reference_block_inputs",
]
