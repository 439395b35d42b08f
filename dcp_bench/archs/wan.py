"""Wan (Wan2.1 text-to-video): a video diffusion transformer whose every block attends over the
whole clip (full 3-D attention, non-causal, all frames x patches), then cross-attends to the
caption; ``num_layers`` counts blocks.

Structure (diffusers ``WanTransformer3DModel``, the model `dcp_bench.runtime.integrations.
diffusers_video` trains): per block a LayerNorm without affine weights and the adaLN modulation
(a 6 x hidden table), self-attention (q, k, v, out projections with bias; RMSNorm over the full
width of q and of k), a LayerNorm with affine weights before the cross-attention (q, k, v, out
projections with bias; the same q/k norms), a GELU MLP with bias, and a third LayerNorm without
weights. Around the blocks: a Conv3d patch embedding, the timestep MLP (256 -> hidden -> hidden),
its 6 x hidden projection, the caption MLP (text_dim -> hidden -> hidden), and the output
projection (hidden -> prod(patch) x in_channels) with a 2 x hidden modulation table.

Ulysses shards heads: q, k, v and the output change their sharded dimension each block.

The runtime has no Wan module of its own (the diffusers integration trains the library's): Wan is
planned and simulated, and `dcp-bench memory` does not count it. Its per-block activation terms
equal what the diffusers model keeps for backward through the adapter, counted in fp32
(`tests/test_archs_memory_wan.py`); the terms outside the blocks are the closed form as written.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np

from dcp_bench.archs.base import (
    FREQ_DIM,
    ActivationTerms,
    Architecture,
    AttentionPricing,
    GemmTerms,
    ParamBreakdown,
)
from dcp_bench.archs.base import linear_params as _linear


class Wan(Architecture):
    name: ClassVar[str] = "wan"
    video: ClassVar[bool] = True
    description: ClassVar[str] = "video DiT with full 3-D attention over each clip (Wan)"

    def param_breakdown(self, spec: Any) -> ParamBreakdown:
        h, f = spec.hidden, spec.ffn_hidden
        attn = 4 * _linear(h, h, True) + 2 * h  # q, k, v, out; q and k RMSNorm over h
        block = 2 * attn + 2 * h + _linear(h, f, True) + _linear(f, h, True) + 6 * h
        pv = math.prod(spec.patch)
        embedding = (
            spec.in_channels * pv * h
            + h  # patch embedding
            + _linear(FREQ_DIM, h, True)
            + _linear(h, h, True)  # timestep MLP
            + _linear(h, 6 * h, True)  # its modulation projection
            + _linear(spec.text_dim, h, True)
            + _linear(h, h, True)  # caption MLP
        )
        head = _linear(h, pv * spec.in_channels, True) + 2 * h
        return ParamBreakdown(embedding, block, spec.num_layers, head)

    def activation_terms(self, spec: Any, b: int) -> ActivationTerms:
        h, f, H, M = spec.hidden, spec.ffn_hidden, spec.heads, spec.text_tokens
        lse = 4.0 * H
        rms = 4.0 * h + 4.0 + b * h  # fp32 input, fp32 rsqrt per row, output
        C = spec.in_channels * math.prod(spec.patch)
        # Per block, as the diffusers WanTransformerBlock trained through the adapter keeps it
        # (counted: tests/test_archs_memory_wan.py, fp32): the three LayerNorms (norm1 and norm3
        # without weights, norm2 affine) each keep their input, fp32 mean and rstd per row and
        # their output; the modulated inputs of the self-attention and the MLP are new tensors.
        layer = {
            "norm_modulation": 3.0 * (2.0 * b * h + 8.0),
            # modulated input; q and k projections with their RMSNorms (`rms`); rotated q and k,
            # v; the kernel's output and log-sum-exp; the output projection's input and output
            # (kept by the gate)
            "self_attention": b * h + 2 * rms + 3.0 * b * h + b * h + lse + 2.0 * b * h,
            # q projection and its RMSNorm, the normed q times its weight (the kernel's q), the
            # kernel's output (the output projection reads it in place) and log-sum-exp
            "cross_attention": rms + b * h + b * h + lse,
            # modulated input, fc1 output, GELU output, fc2 output (kept by the gate)
            "mlp": b * h + 2.0 * b * f + b * h,
        }
        layer_sample = {k: 0.0 for k in layer}
        layer_sample["norm_modulation"] = 2.0 * b * h  # norm1's and norm3's (1 + scale)
        layer_sample["self_attention"] = 6.0 * b * h  # the block's six modulation vectors
        # the caption's k projection and RMSNorm, the normed k times its weight, v: per sample
        layer_sample["cross_attention"] = M * (rms + 2.0 * b * h)
        outer_tok = {
            "embeddings": C * b,
            "final_layer": 3.0 * b * h + 2.0 * b + 4.0 * C + 4.0,
        }
        outer_sample = {
            "embeddings": M * spec.text_dim * b + 2.0 * M * h * b + FREQ_DIM * b + 4.0 * h * b,
            "final_layer": b * h,
        }
        return ActivationTerms(
            layer,
            layer_sample,
            outer_tok,
            outer_sample,
            shared_tok=2.0 * (h // H) * b,  # the 3-D rotary tables
            shared_sample=M * h * b,  # the caption features
            checkpoint_input_tok=float(b * h),
            conditioning_held_tok=0.0,
            blocks_per_layer=1,
            conditioning_held_sample=6.0 * b * h,
        )

    def ema_param_tensors(self, spec: Any) -> int:
        """27 per block (8 attention weights and biases twice, 4 q/k norms, the affine norm's 2,
        the MLP's 4, the modulation table) and 15 outside."""
        return 27 * spec.num_layers + 15

    def gemm_terms(self, spec: Any, b: int) -> GemmTerms:
        h, f, M = spec.hidden, spec.ffn_hidden, spec.text_tokens
        pv = math.prod(spec.patch)
        # self q, k, v, out; cross q and out; MLP fc1 and fc2; modulation (~6 per element)
        block_tok = 2.0 * (4 * h * h + 2 * h * h + 2 * h * f) + 6.0 * h
        return GemmTerms(
            layer_tok=block_tok,
            layer_sample=2.0 * M * h * 2 * h,  # the cross-attention's caption k and v
            head_tok=2.0 * (spec.in_channels * pv * h + h * pv * spec.in_channels),
            head_sample=2.0 * M * (spec.text_dim * h + h * h),  # caption MLP
            # self-attention (norm input, modulated, q, k, v, normed q and k, output: 8h),
            # cross-attention (input, q, output: 3h), MLP (2h + 2f), gates/residuals (2h)
            act_full_tok=b * (15 * h + 2 * f) + 2 * 4.0 * spec.heads,
            gemms_per_layer=8,
            elementwise_flops_tok=6.0 * h,
        )

    def _calls(self, spec: Any, n: np.ndarray) -> list[tuple[Any, Any, Any]]:
        """(keys, FLOPs, rows) of each attention of one block: self over the whole clip,
        cross over the caption."""
        h, M = spec.hidden, float(max(spec.text_tokens, 1))
        return [
            (n, 4.0 * n * n * h, n),
            (np.full_like(n, M), 4.0 * n * spec.text_tokens * h, n),
        ]

    def attention_flops(
        self, spec: Any, n: np.ndarray, frames: Any, cm: AttentionPricing
    ) -> tuple[np.ndarray, np.ndarray]:
        L = spec.num_layers
        calls = self._calls(spec, n)
        attn = L * sum(fl for _, fl, _ in calls)
        work = L * sum(fl / cm.attention_efficiency(keys) for keys, fl, _ in calls)
        return np.asarray(attn, dtype=float), np.asarray(work, dtype=float)

    def short_attention_io(
        self,
        spec: Any,
        n: np.ndarray,
        frames: Any,
        cm: AttentionPricing,
        per_row: float,
        flop_rate: float,
        bwd: float,
        short_keys: int,
    ) -> np.ndarray:
        out = np.zeros_like(n)
        for keys, flops, rows in self._calls(spec, n):
            flop_t = bwd * flops / cm.attention_efficiency(keys) / flop_rate
            out += np.where(
                keys < short_keys, spec.num_layers * np.maximum(rows * per_row - flop_t, 0.0), 0.0
            )
        return out

    def a2a_bytes_per_layer(self, spec: Any, n_r: np.ndarray, sp: Any, b: int) -> np.ndarray:
        return n_r * b * 4 * spec.hidden  # q, k, v in; the output back

    def a2a_bytes_per_token(self, spec: Any, b: int) -> list[float]:
        return [spec.hidden * b] * 4

    def attention_pairs(self, tokens: np.ndarray, frames: np.ndarray) -> np.ndarray:
        """Full attention over the clip: n^2 pairs."""
        t = np.asarray(tokens, dtype=float)
        return t * t

    def bucket_key(self, tokens: int, frames: int) -> tuple[int, int]:
        """The exact latent shape (T', spatial)."""
        return (frames, tokens // frames)


ARCH = Wan()
