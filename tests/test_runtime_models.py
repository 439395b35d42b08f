"""Single-process checks of the runtime models and attention: parameter counts equal the analytical
counts, packed varlen attention equals a per-sequence reference, inputs are deterministic, and
activation checkpointing leaves loss and gradients unchanged."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dcp_bench.cost.params import param_count as analytical_param_count
from dcp_bench.cost.specs import model_spec
from dcp_bench.errors import ConfigError
from dcp_bench.runtime.attention import (
    SINGLE,
    AttentionKernel,
    SPContext,
    check_heads,
    dense_attention,
    kv_heads_for_sp,
    repeat_kv,
    select_attention_kernel,
    varlen_attention,
)
from dcp_bench.runtime.lm_loss import IGNORE, chunked_cross_entropy_sum
from dcp_bench.runtime.models import LlamaModel, STDiTModel, build_model, param_count


def flat_grads(model: torch.nn.Module) -> torch.Tensor:
    """All gradients in parameter order (zeros for a parameter without one)."""
    return torch.cat(
        [
            (torch.zeros_like(p) if p.grad is None else p.grad).reshape(-1)
            for p in model.parameters()
        ]
    )


@pytest.mark.parametrize("name", ["tiny_llama", "tiny_stdit"])
def test_param_count_matches_analytical_tiny(name: str) -> None:
    spec = model_spec(name)
    assert param_count(build_model(spec)) == analytical_param_count(spec)


@pytest.mark.parametrize("name", ["llama3_8b", "llama2_7b", "stdit3_xl2"])
def test_param_count_matches_analytical_real_sizes(name: str) -> None:
    spec = model_spec(name)
    with torch.device("meta"):
        model = LlamaModel(spec) if spec.arch == "llama" else STDiTModel(spec)
    assert param_count(model) == analytical_param_count(spec)


def test_llama3_8b_has_about_8b_parameters() -> None:
    # Independent anchor: Meta's published size of Llama 3 8B is 8.03 B parameters.
    with torch.device("meta"):
        model = LlamaModel(model_spec("llama3_8b"))
    assert abs(param_count(model) - 8.03e9) < 0.01e9


def test_varlen_attention_matches_per_sequence_reference() -> None:
    g = torch.Generator().manual_seed(0)
    lens, valid = [5, 12, 1, 8], [5, 9, 1, 6]  # segments with trailing padding
    T, H, D = sum(lens), 4, 16
    q, k, v = (torch.randn(T, H, D, generator=g) for _ in range(3))
    for causal in (True, False):
        out = varlen_attention(q, k, v, lens, valid, causal)
        start = 0
        for seg, n in zip(lens, valid):
            # Reference: explicit softmax over the real tokens of this segment only.
            qs, ks, vs = q[start : start + n], k[start : start + n], v[start : start + n]
            scores = torch.einsum("ihd,jhd->hij", qs, ks) / math.sqrt(D)
            if causal:
                scores = scores.masked_fill(
                    torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf")
                )
            ref = torch.einsum("hij,jhd->ihd", F.softmax(scores, dim=-1), vs)
            torch.testing.assert_close(out[start : start + n], ref, rtol=1e-5, atol=1e-6)
            assert torch.all(out[start + n : start + seg] == 0)
            start += seg


def test_heads_must_divide_sp_degree() -> None:
    check_heads(8, 4)
    with pytest.raises(ConfigError, match="not divisible"):
        check_heads(6, 4)


def test_inputs_are_a_function_of_sample_id_and_shape() -> None:
    model = build_model(model_spec("tiny_llama"))
    a = model.make_inputs(np.array([5, 9]), np.array([30, 7]), np.ones(2), SINGLE, seed=3)
    b = model.make_inputs(np.array([9]), np.array([7]), np.ones(1), SINGLE, seed=3)
    assert torch.equal(a.input_ids[30:], b.input_ids)
    c = model.make_inputs(np.array([9]), np.array([7]), np.ones(1), SINGLE, seed=4)
    assert not torch.equal(b.input_ids, c.input_ids)


def test_sharded_inputs_partition_the_padded_sample() -> None:
    # Every real token lands on exactly one rank of an SP group, with its own label.
    model = build_model(model_spec("tiny_llama"))
    full = model.make_inputs(np.array([4]), np.array([13]), np.ones(1), SINGLE, seed=1)
    parts = [
        model.make_inputs(
            np.array([4]), np.array([13]), np.ones(1), SPContext(4, r, group=object()), seed=1
        )
        for r in range(4)
    ]
    ids = torch.cat([p.input_ids for p in parts])[:13]
    labels = torch.cat([p.labels for p in parts])
    assert torch.equal(ids, full.input_ids)
    assert torch.equal(labels[:13], full.labels) and torch.all(labels[13:] == -100)


@pytest.mark.parametrize("name", ["tiny_llama", "tiny_stdit"])
def test_checkpointing_leaves_loss_and_grads_unchanged(name: str) -> None:
    spec = model_spec(name)
    out = []
    for ckpt in (0, spec.num_layers):
        model = build_model(spec, seed=1)
        inputs = model.make_inputs(
            np.array([1, 2]),
            np.array([24, 12]),
            np.array([4, 2]) if spec.arch == "stdit" else np.ones(2),
            SINGLE,
            seed=0,
        )
        loss = model.loss_sum(inputs, SINGLE, ckpt)
        loss.backward()
        out.append((loss.detach(), flat_grads(model)))
    assert torch.equal(out[0][0], out[1][0])
    torch.testing.assert_close(out[0][1], out[1][1], rtol=0, atol=0)


# ------------------------------------------------------------------------------------------------
# The CUDA-ready paths, checked on CPU: 4-D SDPA with GQA, fused-only SDPA, kernel choice, the
# chunked LM loss, the meta-device build.


def _explicit_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool
) -> torch.Tensor:
    """Softmax attention written out, (n, H, D) inputs, k/v repeated to H heads by hand."""
    rep = q.shape[1] // k.shape[1]
    k = torch.stack([k[:, i // rep] for i in range(q.shape[1])], dim=1)
    v = torch.stack([v[:, i // rep] for i in range(q.shape[1])], dim=1)
    n, d = q.shape[0], q.shape[2]
    scores = torch.einsum("ihd,jhd->hij", q, k) / math.sqrt(d)
    if causal:
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return torch.einsum("hij,jhd->ihd", F.softmax(scores, dim=-1), v)


@pytest.mark.parametrize("fused_only", [False, True])
def test_gqa_varlen_attention_matches_per_sequence_reference(fused_only: bool) -> None:
    # K and V keep their 2 KV heads for 8 query heads; fused_only restricts SDPA to its fused
    # kernels (on CPU: the flash kernel), which take only 4-D inputs.
    g = torch.Generator().manual_seed(1)
    lens, valid = [17, 40, 3, 24], [17, 31, 2, 24]
    T, H, KV, D = sum(lens), 8, 2, 16
    q = torch.randn(T, H, D, generator=g)
    k, v = (torch.randn(T, KV, D, generator=g) for _ in range(2))
    kernel = AttentionKernel("sdpa", fused_only=fused_only)
    for causal in (True, False):
        out = varlen_attention(q, k, v, lens, valid, causal, kernel)
        start = 0
        for seg, n in zip(lens, valid):
            sl = slice(start, start + n)
            torch.testing.assert_close(
                out[sl], _explicit_attention(q[sl], k[sl], v[sl], causal), rtol=1e-5, atol=1e-5
            )
            assert torch.all(out[start + n : start + seg] == 0)
            start += seg


def test_gqa_attention_equals_the_repeated_version_with_gradients() -> None:
    g = torch.Generator().manual_seed(2)
    lens, valid = [30, 12], [25, 12]
    q = torch.randn(42, 8, 16, generator=g).requires_grad_()
    k = torch.randn(42, 4, 16, generator=g).requires_grad_()
    v = torch.randn(42, 4, 16, generator=g).requires_grad_()
    weights = torch.randn(42, 8, 16, generator=g)
    got = []
    for repeated in (False, True):
        for t in (q, k, v):
            t.grad = None
        # Reference: k and v repeated to every query head (what the runtime did before).
        kk, vv = (repeat_kv(k, 2, 1), repeat_kv(v, 2, 1)) if repeated else (k, v)
        out = varlen_attention(q, kk, vv, lens, valid, True)
        (out * weights).sum().backward()
        got.append((out.detach(), *[t.grad.clone() for t in (q, k, v)]))  # type: ignore[union-attr]
    for a, b in zip(*got):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert got[0][2].shape == k.shape  # KV gradients come back with the KV heads only


def test_three_d_sdpa_has_no_fused_kernel_but_the_runtime_path_does() -> None:
    # What the issue found: a 3-D call leaves SDPA only its math kernel (an n x n score matrix).
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(4, 64, 16)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]), pytest.raises(RuntimeError):
        F.scaled_dot_product_attention(q, q, q, is_causal=True)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        dense_attention(q[None], q[None, :2], q[None, :2], causal=True)  # 4-D, GQA: runs


@pytest.mark.parametrize("name", ["tiny_llama", "tiny_stdit"])
def test_models_train_on_fused_sdpa_kernels_only(name: str) -> None:
    # Every attention of both models (Llama varlen; STDiT spatial, temporal, cross) runs with
    # SDPA restricted to its fused kernels, and gives the unrestricted loss and gradients.
    spec = model_spec(name)
    out = []
    for fused in (False, True):
        model = build_model(spec, seed=3)
        model.set_attention(AttentionKernel("sdpa", fused_only=fused))
        frames = np.array([3, 2]) if spec.arch == "stdit" else np.ones(2)
        inputs = model.make_inputs(np.array([4, 5]), np.array([27, 14]), frames, SINGLE, seed=0)
        loss = model.loss_sum(inputs, SINGLE, 1)
        loss.backward()
        out.append((loss.detach(), flat_grads(model)))
    torch.testing.assert_close(out[0][0], out[1][0], rtol=1e-6, atol=0)
    torch.testing.assert_close(out[0][1], out[1][1], rtol=1e-5, atol=1e-7)


def test_kernel_choice_on_cpu_is_the_portable_one() -> None:
    kernel = select_attention_kernel(torch.device("cpu"), torch.float32, 32, prefer="flash_attn")
    assert kernel.name == "sdpa" and not kernel.fused_only
    assert any("no CPU kernel" in n for n in kernel.notes)
    with pytest.raises(ConfigError, match="attention="):
        select_attention_kernel(torch.device("cpu"), torch.float32, 32, prefer="magic")


@pytest.mark.parametrize("chunk", [1, 7, 64, 1000])
def test_chunked_lm_loss_equals_the_full_logits_loss(chunk: int) -> None:
    g = torch.Generator().manual_seed(4)
    T, hidden, vocab = 150, 32, 97
    h = torch.randn(T, hidden, generator=g).requires_grad_()
    w = (0.1 * torch.randn(vocab, hidden, generator=g)).requires_grad_()
    labels = torch.randint(0, vocab, (T,), generator=g)
    labels[::5] = IGNORE  # ignored rows (padding) count nothing
    loss = chunked_cross_entropy_sum(h, w, labels, chunk)
    loss.backward()
    got = (loss.detach(), h.grad.clone(), w.grad.clone())  # type: ignore[union-attr]
    h.grad = w.grad = None
    ref = F.cross_entropy((h @ w.t()).float(), labels, ignore_index=IGNORE, reduction="sum")
    ref.backward()
    torch.testing.assert_close(got[0], ref.detach(), rtol=1e-6, atol=0)
    # equal up to the order of the fp32 sums over chunks
    for mine, theirs in ((got[1], h.grad), (got[2], w.grad)):
        assert (
            float(torch.linalg.vector_norm(mine - theirs) / torch.linalg.vector_norm(theirs))
            <= 1e-6
        )


def test_llama_loss_is_chunked_and_equals_the_unchunked_model() -> None:
    spec = model_spec("tiny_llama")
    out = []
    for chunk in (10**9, 13):  # one chunk (= the full logits), then many
        model = build_model(spec, seed=2)
        assert isinstance(model, LlamaModel)
        model.loss_chunk_tokens = chunk
        inputs = model.make_inputs(np.array([1, 2]), np.array([40, 31]), np.ones(2), SINGLE, seed=0)
        loss = model.loss_sum(inputs)
        loss.backward()
        out.append((loss.detach(), flat_grads(model)))
    torch.testing.assert_close(out[0][0], out[1][0], rtol=1e-6, atol=0)
    assert (
        float(torch.linalg.vector_norm(out[0][1] - out[1][1]) / torch.linalg.vector_norm(out[0][1]))
        <= 1e-6
    )


def test_models_built_on_meta_then_initialised_are_deterministic() -> None:
    spec = model_spec("tiny_stdit")
    a, b = build_model(spec, seed=9), build_model(spec, seed=9)
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(pa, pb), name
    c = build_model(spec, seed=10)
    assert not torch.equal(next(a.parameters()), next(c.parameters()))
    # Each parameter has its own generator: the first layer of a deeper model starts the same.
    deeper = build_model(dataclasses.replace(spec, num_layers=spec.num_layers + 1), seed=9)
    da = dict(a.named_parameters())
    for name, p in deeper.named_parameters():
        if name.startswith(("x_embed", "t_embed", "pairs.0.")):
            assert torch.equal(p, da[name]), name
    # Initial values follow the rules: normal(0, 0.02) weights, zero biases, unit norm weights.
    w = dict(a.named_parameters())
    assert abs(float(w["pairs.0.spatial.qkv.weight"].detach().std()) - 0.02) < 0.002
    assert torch.all(w["pairs.0.spatial.qkv.bias"] == 0) and torch.all(
        w["pairs.0.spatial.q_norm.weight"] == 1
    )
    meta = build_model(spec, device="meta")
    assert all(p.device.type == "meta" for p in meta.parameters())


def test_ulysses_kv_bytes_match_the_cost_model() -> None:
    # The runtime exchanges q, k, v (KV heads as kv_heads_for_sp says) and the output per layer;
    # the analytical cost model prices the same bytes.
    from dcp_bench.cost import make_cost_model

    for name in ("llama3_8b", "tiny_llama"):
        spec = model_spec(name)
        cost = make_cost_model(name, "h200x32", source="analytical")
        for sp in (2, 4, 8):
            if spec.heads % sp:
                continue
            kv = kv_heads_for_sp(spec.heads, spec.kv_heads, sp)
            tokens = 1000
            runtime_bytes = (
                tokens * spec.head_dim * spec.dtype_bytes * ((spec.heads + 2 * kv) + spec.heads)
            )
            predicted = float(cost.a2a_bytes_per_layer(np.array([tokens]), np.array([sp]))[0])
            assert runtime_bytes == predicted, (name, sp)
    assert (
        kv_heads_for_sp(32, 8, 4) == 8
        and kv_heads_for_sp(32, 8, 16) == 16
        and kv_heads_for_sp(8, 4, 8) == 8
    )


@pytest.mark.parametrize("name", ["tiny_llama", "tiny_stdit"])
def test_models_train_in_bf16(name: str) -> None:
    # The CUDA compute dtype, on CPU: every input is cast where it meets a bf16 weight, and the
    # loss stays close to the fp32 model's.
    spec = model_spec(name)
    losses = []
    for dtype in (torch.float32, torch.bfloat16):
        model = build_model(spec, seed=3, dtype=dtype)
        frames = np.array([3, 2]) if spec.arch == "stdit" else np.ones(2)
        inputs = model.make_inputs(np.array([4, 5]), np.array([27, 14]), frames, SINGLE, seed=0)
        loss = model.loss_sum(inputs, SINGLE, 1)
        loss.backward()
        assert loss.dtype == torch.float32 and all(
            p.grad is not None and p.grad.dtype == dtype for p in model.parameters()
        )
        losses.append(float(loss))
    assert abs(losses[1] - losses[0]) <= 2e-2 * abs(losses[0])
