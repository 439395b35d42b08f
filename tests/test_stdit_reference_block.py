"""The runtime's STDiT3 block against the reference's (VideoSys ``NUS-HPC-AI-Lab/VideoSys`` at
4cce477, ``videosys/models/transformers/open_sora_transformer_3d.py`` ``STDiT3Block``,
``videosys/models/modules/attentions.py`` ``OpenSoraAttention`` and
``OpenSoraMultiHeadCrossAttention``, ``videosys/models/modules/normalization.py``): one timestep
modulation per sample, the attention's length branches, the q/k norm option, and the bytes a block
pair keeps for the backward, computed here independently from the reference's ops."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dcp_bench.cost import make_cost_model
from dcp_bench.cost.specs import ModelSpec, model_spec
from dcp_bench.errors import ConfigError
from dcp_bench.runtime.attention import SINGLE, dense_attention
from dcp_bench.runtime.memory_count import count_activations
from dcp_bench.runtime.models import (
    FusedRMSNorm,
    ReferenceRMSNorm,
    STDiTModel,
    build_model,
    math_attention,
    per_sample,
)

FLASH_MIN = 30  # attentions.py:58 ``use_flash_attn = N >= 30``


def reference_block_row(length: int, spec: ModelSpec, qk_norm: str) -> float:
    """Bytes one row keeps in one reference STDiT3 block, bf16 on a GPU, flash attention enabled,
    no x_mask, no PAB, dropout and drop-path 0, sequence parallelism 1; ``length``: the block's
    self-attention sequence length."""
    b, h, H, f = 2.0, spec.hidden, spec.heads, spec.ffn_hidden
    # norm1 / norm2 (open_sora_transformer_3d.py:196, :260): nn.LayerNorm keeps its input and an
    # fp32 mean and rstd per row; t2i_modulate (:47-48, :197, :261) multiplies the normed output by
    # (1 + scale), keeping it (the (B, 1, C) factor is per sample)
    norms = 2 * (b * h + 8.0 + b * h)
    if qk_norm == "reference":
        # LlamaRMSNorm (normalization.py:28-33): the fp32 copy (kept by pow and the multiply),
        # the fp32 rsqrt per row, the cast back (kept by the weight multiply); q and k
        qk = 2 * (4.0 * h + 4.0 * H + b * h)
    else:
        # apex FusedRMSNorm: its input made contiguous (q and k are strided views of the qkv
        # output) and the fp32 inverse rms per row
        qk = 2 * (b * h + 4.0 * H)
    qkv_in = b * h  # self.qkv keeps the modulated input (attentions.py:59)
    gated = b * h  # gate_msa * x_m keeps the projection's output (open_sora_transformer_3d.py:219)
    if length == 1:
        # attentions.py:65-66: x = v, no q/k norm; the (B, 1, C) reshape of v's transpose is a view
        # of the qkv output, so self.proj keeps all of it (3h)
        attn = qkv_in + 3.0 * b * h + gated
    elif length < FLASH_MIN:
        # native_attention (attentions.py:111-120): q * scale, q @ k^T keeps the scaled q and k
        # (a view of the normed k), the fp32 softmax output and its cast (kept by attn @ v), the
        # contiguous copy of v the batched matmul takes; the output's transpose is copied before
        # self.proj (attentions.py:103-107)
        attn = qkv_in + qk + 3.0 * b * h + (4.0 + b) * H * length + b * h + gated
    else:
        # flash_attn_func (attentions.py:80-94) keeps the normed q and k, v (a view of the qkv
        # output: all 3h), its output (self.proj's input) and the fp32 log-sum-exp per head
        attn = qkv_in + qk + 2 * b * h + 3.0 * b * h + b * h + 4.0 * H + gated
    # cross-attention, flash varlen (attentions.py:152-185, :240-257): q_linear's input, q, the
    # output (self.proj's input), the log-sum-exp; the projection's output is only added
    cross = 3.0 * b * h + 4.0 * H
    # timm Mlp with GELU(tanh): fc1 input, fc1 output, GELU output; the gated fc2 output
    mlp = b * h + 2.0 * b * f + b * h
    return norms + attn + cross + mlp


def reference_block_sample(spec: ModelSpec) -> float:
    """Bytes per sample and block: the (B, 6, C) modulation (scale_shift_table + t, :177-179),
    kept by the gates; the two (1 + scale) factors; the caption's keys and values."""
    b, h, M = 2.0, spec.hidden, spec.text_tokens
    return 6.0 * b * h + 2.0 * b * h + M * 2.0 * h * b


CASES = [
    ([256], [1]),  # one image: spatial on the fused path, temporal length 1
    ([256] * 4, [1] * 4),  # four images packed
    ([4096], [4]),  # a short video: temporal on the math path (4 frames)
    ([256, 2048], [1, 8]),  # an image and a video packed: every path in one micro-batch
    ([8192], [32]),  # a long video: both on the fused path
]


@pytest.mark.parametrize("qk_norm", ["reference", "fused"])
@pytest.mark.parametrize("tokens,frames", CASES)
def test_counted_block_pair_is_within_2pct_of_the_reference_block(
    tokens: list[int], frames: list[int], qk_norm: str
) -> None:
    spec = dataclasses.replace(model_spec("stdit3_xl2"), qk_norm=qk_norm)
    counted = count_activations(spec, tokens, frames, checkpoint=False, layers=2)
    pair = sum(counted.layer_units(1).values())  # the last pair: nothing shared is first seen
    ref = 0.0
    for n, t in zip(tokens, frames):
        s = n // t
        ref += n * (reference_block_row(s, spec, qk_norm) + reference_block_row(t, spec, qk_norm))
        ref += 2 * reference_block_sample(spec)
    assert abs(pair / ref - 1) <= 0.02, (tokens, frames, qk_norm, pair, ref, pair / ref - 1)


def test_the_cost_option_names_the_norm_and_changes_the_bytes() -> None:
    base = model_spec("stdit3_xl2")
    with pytest.raises(ConfigError, match="qk_norm"):
        dataclasses.replace(base, qk_norm="apex")
    ref = count_activations(base, [4096], [4], layers=1)
    fused = count_activations(dataclasses.replace(base, qk_norm="fused"), [4096], [4], layers=1)
    # both blocks attend (256 patches, 4 frames): the reference norm's fp32 copy (4h) and its
    # fp32 rsqrt (4H) against the fused norm's input copy (bh); outputs as they are
    h, H = base.hidden, base.heads
    per_row = 2 * (4 * h + 4 * H + 2 * h) - 2 * (2 * h + 4 * H)
    assert ref.total - fused.total == 2 * 4096 * per_row
    cost_ref = make_cost_model(base, "h200x32", "analytical")
    cost_fused = make_cost_model(
        dataclasses.replace(base, qk_norm="fused"), "h200x32", "analytical"
    )
    args = (np.array([4096.0]), np.array([4.0]), 1, 0)
    diff = cost_ref.sample_memory(*args)[0] - cost_fused.sample_memory(*args)[0]
    assert diff == pytest.approx(base.num_layers * 2 * 4096 * per_row, rel=1e-9)


def test_fused_norm_equals_the_reference_norm_with_gradients() -> None:
    torch.manual_seed(0)
    # fp32 (both compute in fp32); strided, as q is a view of the qkv output
    x = torch.randn(5, 7, 3, 16)[:, :, 0]
    grads = []
    outs = []
    for cls in (ReferenceRMSNorm, FusedRMSNorm):
        norm = cls(16)
        with torch.no_grad():
            norm.weight.copy_(torch.linspace(0.5, 1.5, 16))
        xi = x.detach().clone().requires_grad_(True)
        y = norm(xi)
        (y * torch.arange(16.0)).sum().backward()
        outs.append(y.detach())
        grads.append((xi.grad, norm.weight.grad))
    torch.testing.assert_close(outs[0], outs[1])
    torch.testing.assert_close(grads[0][0], grads[1][0])
    torch.testing.assert_close(grads[0][1], grads[1][1])


@pytest.mark.parametrize("counts", [[3, 3, 3], [2, 5, 1]])
def test_per_sample_modulation_equals_per_row_vectors_with_gradients(counts: list[int]) -> None:
    """Broadcasting one vector per sample is the per-row version without materialising the rows:
    same values and gradients, equal or unequal samples."""
    torch.manual_seed(1)
    n, h = len(counts), 4
    x = torch.randn(sum(counts), h, dtype=torch.float64, requires_grad=True)
    shift = torch.randn(n, h, dtype=torch.float64, requires_grad=True)
    scale = torch.randn(n, h, dtype=torch.float64, requires_grad=True)
    rows = torch.repeat_interleave(torch.arange(n), torch.tensor(counts))
    w = torch.randn(sum(counts), h, dtype=torch.float64)
    got = per_sample(lambda r, a, c: r * (1 + c) + a, x, counts, shift, scale)
    want = x * (1 + scale[rows]) + shift[rows]
    torch.testing.assert_close(got, want)
    g1 = torch.autograd.grad((got * w).sum(), (x, shift, scale))
    g2 = torch.autograd.grad((want * w).sum(), (x, shift, scale))
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b)


def test_math_path_equals_attention_with_gradients() -> None:
    torch.manual_seed(2)
    # fp32: the math path's softmax runs in fp32, as the reference's
    q, k, v = (torch.randn(3, 4, 7, 8, requires_grad=True) for _ in range(3))
    got = math_attention(q, k, v)
    want = dense_attention(q, k, v)
    torch.testing.assert_close(got, want)
    g1 = torch.autograd.grad(got.square().sum(), (q, k, v))
    g2 = torch.autograd.grad(want.square().sum(), (q, k, v))
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b)


def test_an_image_temporal_block_returns_v() -> None:
    """Length 1 (an image's temporal attention): the self-attention is proj(v), q and k unused."""
    spec = model_spec("tiny_stdit")
    model = build_model(spec, seed=0, dtype=torch.float64)
    assert isinstance(model, STDiTModel)
    block: Any = model.pairs[0].temporal
    shard = model.make_inputs(np.arange(2), np.array([64, 64]), np.array([1, 1]), SINGLE, 0)
    x = torch.randn(128, spec.hidden, dtype=torch.float64, requires_grad=True)
    out = block._self_attention(x, shard, SINGLE)
    v = F.linear(x, block.qkv.weight, block.qkv.bias)[:, 2 * spec.hidden :]
    torch.testing.assert_close(out, block.proj(v))
    out.sum().backward()
    assert block.q_norm.weight.grad is None and block.k_norm.weight.grad is None
    # through the whole model the unused q/k norms get zero gradients, not none (every rank of a
    # sharded run reduces the same parameters), and the spatial ones real gradients
    model.zero_grad(set_to_none=True)
    model(shard, SINGLE).backward()
    pairs: Any = model.pairs
    for pair in pairs:
        for norm in (pair.temporal.q_norm, pair.temporal.k_norm):
            assert norm.weight.grad is not None and not norm.weight.grad.any()
        assert pair.spatial.q_norm.weight.grad.abs().sum() > 0


def test_image_attention_is_free_and_short_attention_is_memory_bound() -> None:
    cost: Any = make_cost_model("stdit3_xl2", "h100x32", "analytical")
    spec, L = cost.model, cost.model.num_layers
    fl = cost.sample_flops(np.array([1024.0]), np.array([1.0]))
    h, M = spec.hidden, spec.text_tokens
    # an image: spatial attention over its 1024 patches and cross-attention, no temporal FLOPs
    assert fl["attn"][0] == pytest.approx(L * (4.0 * 1024**2 * h + 2 * 4.0 * 1024 * M * h))
    # 16 frames (math path) scale with the bandwidth, 64 frames (fused) do not
    for frames, bound in ((16.0, True), (64.0, False)):
        n, T = np.array([256.0 * frames]), np.array([frames])
        flops = 4.0 * 256 * frames**2 * h * np.ones(1)
        w1 = cost.self_attention_work(flops, T, n)[0]
        gpu = cost.cluster.gpu
        fast = dataclasses.replace(
            cost.cluster, gpu=dataclasses.replace(gpu, measured_mem_bw=2 * gpu.measured_mem_bw)
        )
        fast_cost: Any = make_cost_model(spec, fast, "analytical")
        w2 = fast_cost.self_attention_work(flops, T, n)[0]
        assert (w2 == pytest.approx(w1 / 2)) if bound else (w2 == pytest.approx(w1))
