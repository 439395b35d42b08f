"""Open-Sora v1.2 STDiT3: a video diffusion transformer of spatial + temporal block pairs
(``num_layers`` counts pairs), priced exactly as the cost model always priced it.

Per block (spatial and temporal alike): a qkv projection and an output projection with bias,
per-head RMSNorm on q and k, a cross-attention to the caption (q, kv, out projections with bias),
a GELU MLP with bias, and a 6 x hidden adaLN-single modulation table; LayerNorms without affine
weights. Around the blocks: a Conv3d patch embedding, timestep and fps embedders (256 -> hidden
-> hidden MLPs), the 6 x hidden ``t_block`` projection, the caption MLP (text_dim -> hidden ->
hidden) and the final layer (hidden -> prod(patch) * 2 * in_channels: the noise and its variance,
plus a 2 x hidden modulation table). Spatial attention runs within each frame, temporal attention
across frames at each patch; DSP switches the sharded dimension between them.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np

from dcp_bench.archs.base import (
    FREQ_DIM,
    FUSED_ATTENTION_MIN_LEN,
    ActivationTerms,
    Architecture,
    AttentionPricing,
    GemmTerms,
    ParamBreakdown,
)
from dcp_bench.archs.base import linear_params as _linear

# Width of the sinusoidal timestep / fps features fed to the STDiT embedders (Open-Sora: 256).
STDIT_FREQ_EMBED = 256


class STDiT3(Architecture):
    name: ClassVar[str] = "stdit"
    video: ClassVar[bool] = True
    description: ClassVar[str] = "2-D video DiT, spatial + temporal block pairs (STDiT3)"

    def param_breakdown(self, spec: Any) -> ParamBreakdown:
        h, hd = spec.hidden, self.head_dim(spec)
        # one block; a layer unit is a spatial + temporal pair.
        self_attn = _linear(h, 3 * h, True) + _linear(h, h, True) + 2 * hd  # + q/k RMSNorm
        cross_attn = _linear(h, h, True) + _linear(h, 2 * h, True) + _linear(h, h, True)
        mlp = _linear(h, spec.ffn_hidden, True) + _linear(spec.ffn_hidden, h, True)
        block = self_attn + cross_attn + mlp + 6 * h
        pt, ph, pw = spec.patch
        patch_vol = pt * ph * pw
        x_embed = spec.in_channels * patch_vol * h + h
        t_embed = _linear(STDIT_FREQ_EMBED, h, True) + _linear(h, h, True)
        fps_embed = t_embed
        t_block = _linear(h, 6 * h, True)
        y_embed = _linear(spec.text_dim, h, True) + _linear(h, h, True)
        embedding = x_embed + t_embed + fps_embed + t_block + y_embed
        head = _linear(h, patch_vol * 2 * spec.in_channels, True) + 2 * h
        return ParamBreakdown(embedding, 2 * block, spec.num_layers, head)

    def activation_terms(self, spec: Any, b: int) -> ActivationTerms:
        h, f, H = spec.hidden, spec.ffn_hidden, spec.heads
        lse = 4.0 * H  # flash attention's fp32 log-sum-exp per head and query row
        M, D = spec.text_tokens, spec.text_dim
        C = spec.in_channels * math.prod(spec.patch)
        if spec.qk_norm == "fused":
            # apex-style: a contiguous copy of the strided q (k) view and an fp32 rstd per head, row
            qk_norm = 2 * (b * h + 4.0 * H)
        else:
            # the reference's fallback: an fp32 copy of q (k) (4h), the fp32 rsqrt per head and
            # row, and the output cast (bh), each for q and k
            qk_norm = 2 * (4.0 * h + 4.0 * H + b * h)
        # self-attention per row by path: the modulated input (qkv projection), the projection
        # input (the packed output) and output (kept by the gate) on every path; with attention
        # the q/k norms, then on the fused path the stacked normed q/k/v the kernel reads (3bh),
        # its output and log-sum-exp; on the math path the scaled q and the contiguous copies of
        # k and v its batched matmuls keep (3bh), its l x l scores in ``score_tok``
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
            # input (q projection), q, the kernel's output and log-sum-exp, the output
            # projection's input
            "cross_attention": 4.0 * b * h + lse,
            # normed input, fc1 output, GELU output, fc2 output (gated)
            "mlp": 2.0 * b * h + 2.0 * b * f,
        }
        block_sample = {k: 0.0 for k in block}
        # (1 + scale) of the two modulations, one per sample
        block_sample["norm_modulation"] = 2.0 * b * h
        # the block's six modulation vectors (t_mod + scale_shift_table), one per sample, kept
        # by the gates
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
            # LayerNorm input, mean/rstd, output, modulated input; the fp32 difference of the
            # noise prediction and the target, the fp32 loss weight
            "final_layer": 3.0 * b * h + 2.0 * b + 4.0 * C + 4.0,
        }
        outer_sample = {
            # the caption in the compute dtype (caption MLP input), the MLP's hidden and GELU
            # outputs; the timestep and fps MLPs (input, hidden, GELU), their sum and its SiLU
            "embeddings": M * D * b
            + 2.0 * M * h * b
            + 2 * (FREQ_DIM * b + 2.0 * h * b)
            + 2.0 * h * b,
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

    def reference_block_inputs(self, spec: Any, b: int) -> tuple[float, float]:
        """Each of the pair's two blocks is called with the hidden states, the caption features
        (M x h per sample) and the two 6h timestep modulations (VideoSys 4cce477
        `open_sora_transformer_3d.py:612-613`)."""
        h = spec.hidden
        per_block_sample = b * (spec.text_tokens * h + 2 * 6.0 * h)
        return 2.0 * b * h, 2.0 * per_block_sample

    def ema_param_tensors(self, spec: Any) -> int:
        """16 per block (qkv weight/bias, q and k norm weights, proj weight/bias, cross q, kv,
        proj weights/biases, MLP fc1/fc2 weights/biases, scale_shift_table), two blocks per layer
        unit, and 20 outside the blocks (`open_sora_transformer_3d.py`)."""
        return 16 * 2 * spec.num_layers + 20

    def gemm_terms(self, spec: Any, b: int) -> GemmTerms:
        h, f, M = spec.hidden, spec.ffn_hidden, spec.text_tokens
        # One STDiT block: qkv + out projections, cross-attention q + out projections, MLP
        # (two GEMMs), adaLN modulation (shift/scale on two sub-layers, two gates: ~6 per
        # element); a layer unit is a spatial + temporal pair.
        block_tok = 2.0 * (3 * h * h + h * h + 2 * h * h + 2 * h * f) + 6.0 * h
        pv = spec.patch[0] * spec.patch[1] * spec.patch[2]
        return GemmTerms(
            layer_tok=2 * block_tok,
            # Cross-attention k/v projections of the M caption tokens, per sample and block.
            layer_sample=2 * (2.0 * M * h * 2 * h),
            head_tok=2.0 * (spec.in_channels * pv * h + h * pv * 2 * spec.in_channels),
            head_sample=2.0 * M * (spec.text_dim * h + h * h),  # caption MLP
            # Bytes per token per block pair the memory-bound kernels' traffic scales with:
            # self-attention (norm input, modulated, q, k, v, normed q and k, output: 8h),
            # cross-attention (input, q, output: 3h), MLP (norm input, modulated, fc1 out, GELU
            # out: 2h + 2f), gates/residuals (2h).
            act_full_tok=2 * (b * (15 * h + 2 * f) + 2 * 4.0 * spec.heads),
            gemms_per_layer=12,  # per block: qkv, proj, cross q and out, fc1, fc2; x2 blocks
            # the pair's 12h adaLN modulation FLOPs per token are elementwise, not GEMMs
            elementwise_flops_tok=12.0 * h,
        )

    def attention_flops(
        self, spec: Any, n: np.ndarray, frames: Any, cm: AttentionPricing
    ) -> tuple[np.ndarray, np.ndarray]:
        L = spec.num_layers
        T = np.asarray(frames, dtype=float)
        S = n / T
        h, M = spec.hidden, spec.text_tokens
        # per frame, full (non-causal) attention over S; per patch, attention over T'. A
        # length-1 sequence attends to nothing (the reference returns v: no FLOPs).
        spatial = np.where(S > 1, 4.0 * T * S * S * h, 0.0)
        temporal = np.where(T > 1, 4.0 * S * T * T * h, 0.0)
        cross = 2 * 4.0 * n * M * h  # both blocks attend to the M caption tokens
        attn = L * (spatial + temporal + cross)
        work = L * (
            cm.self_attention_work(spatial, S, n)
            + cm.self_attention_work(temporal, T, n)
            + cross / cm.attention_efficiency(float(max(M, 1)))
        )
        return attn, work

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
        L, h = spec.num_layers, spec.hidden
        T = np.asarray(frames, dtype=float)
        S = n / T
        out = np.zeros_like(n)
        M = float(max(spec.text_tokens, 1))
        for length, flops, rows in (
            (S, 4.0 * T * S * S * h, n),  # spatial: T calls over S keys
            (T, 4.0 * S * T * T * h, n),  # temporal: S calls over T keys
            (np.full_like(n, M), 2 * 4.0 * n * M * h, 2 * n),  # cross, in both blocks
        ):
            flop_t = bwd * flops / cm.attention_efficiency(length) / flop_rate
            io_t = rows * per_row
            # the fused kernel's lengths only: length 1 is free, the math path under
            # FUSED_ATTENTION_MIN_LEN is priced on its own traffic (`self_attention_work`)
            short = (length < short_keys) & (length >= FUSED_ATTENTION_MIN_LEN)
            out += np.where(short, L * np.maximum(io_t - flop_t, 0.0), 0.0)
        return out

    def a2a_bytes_per_layer(self, spec: Any, n_r: np.ndarray, sp: Any, b: int) -> np.ndarray:
        # DSP: the whole activation changes its sharded dimension twice per block pair.
        return n_r * b * 2 * spec.hidden

    def a2a_bytes_per_token(self, spec: Any, b: int) -> list[float]:
        # DSP: a block pair switches the sharded dimension before the temporal block and back
        return [spec.hidden * b, spec.hidden * b]

    def attention_pairs(self, tokens: np.ndarray, frames: np.ndarray) -> np.ndarray:
        """Spatially within each frame (F * S^2) and temporally across frames at each position
        (S * F^2)."""
        t = np.asarray(tokens, dtype=float)
        f = np.asarray(frames, dtype=float)
        s = t / f
        return f * s * s + s * f * f

    def bucket_key(self, tokens: int, frames: int) -> tuple[int, int]:
        """The exact latent shape (T', spatial), as the reference's (resolution, frame count)
        buckets are."""
        return (frames, tokens // frames)


ARCH = STDiT3()
