"""Single-process checks of the runtime models and attention: parameter counts equal the analytical
counts, packed varlen attention equals a per-sequence reference, inputs are deterministic, and
activation checkpointing leaves loss and gradients unchanged."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dcp_bench.cost.params import param_count as analytical_param_count
from dcp_bench.cost.specs import model_spec
from dcp_bench.errors import ConfigError
from dcp_bench.runtime.attention import SINGLE, SPContext, check_heads, varlen_attention
from dcp_bench.runtime.models import LlamaModel, STDiTModel, build_model, param_count


def flat_grads(model: torch.nn.Module) -> torch.Tensor:
    """All gradients in parameter order (zeros for a parameter without one)."""
    return torch.cat([(torch.zeros_like(p) if p.grad is None else p.grad).reshape(-1) for p in model.parameters()])


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
                scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
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
        model.make_inputs(np.array([4]), np.array([13]), np.ones(1), SPContext(4, r, group=object()), seed=1)
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
        inputs = model.make_inputs(np.array([1, 2]), np.array([24, 12]), np.array([4, 2]) if spec.arch == "stdit" else np.ones(2), SINGLE, seed=0)
        loss = model.loss_sum(inputs, SINGLE, ckpt)
        loss.backward()
        out.append((loss.detach(), flat_grads(model)))
    assert torch.equal(out[0][0], out[1][0])
    torch.testing.assert_close(out[0][1], out[1][1], rtol=0, atol=0)
