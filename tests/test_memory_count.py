"""Activation memory: the count from the runtime's models (`dcp_bench.runtime.memory_count`) against
an independent count on real tensors, and the cost models against the count, unit by unit."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from dcp_bench.cost import make_cost_model
from dcp_bench.cost.specs import model_spec
from dcp_bench.errors import ConfigError
from dcp_bench.profiling.module_timing import saved_activation_bytes
from dcp_bench.runtime.attention import SINGLE
from dcp_bench.runtime.memory_count import compare_units, count_activations
from dcp_bench.runtime.models import build_model

TOL = 0.05
CALIBRATION = Path(__file__).resolve().parents[1] / "results" / "calibration" / "cpu"


def _real_saved_bytes(name: str, tokens: list[int], frames: list[int], ckpt_layers: int) -> int:
    """Bytes autograd saves in a real forward of the whole model (profiling's own counter: data
    pointers, real storages), parameters excluded."""
    spec = model_spec(name)
    model = build_model(spec, seed=0)
    inputs = model.make_inputs(
        np.arange(len(tokens)), np.array(tokens), np.array(frames), SINGLE, 0
    )
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    return saved_activation_bytes(
        lambda _: model(inputs, SINGLE, ckpt_layers), torch.zeros(1), params
    )


@pytest.mark.parametrize(
    "name,tokens,frames",
    [
        ("tiny_stdit", [64, 256], [1, 4]),
        ("tiny_llama", [96, 160], [1, 1]),
    ],
)
@pytest.mark.parametrize("ckpt", [False, True])
def test_fake_count_equals_a_real_forward(
    name: str, tokens: list[int], frames: list[int], ckpt: bool
) -> None:
    """The fake-tensor count of the whole model equals what a real fp32 forward saves."""
    spec = model_spec(name)
    counted = count_activations(spec, tokens, frames, checkpoint=ckpt, layers=spec.num_layers)
    real = _real_saved_bytes(name, tokens, frames, spec.num_layers if ckpt else 0)
    if ckpt and spec.arch == "llama":
        # the RoPE tables reach the checkpoints inside a tuple: held by the checkpoint's closure
        # (counted), not saved through the hooks (not seen by the real-tensor counter)
        real += 2 * sum(tokens) * spec.head_dim * 4
    assert counted.total == pytest.approx(real, rel=1e-9)


@pytest.mark.parametrize(
    "name,tokens,frames",
    [
        ("stdit3_xl2", [256], [1]),
        ("stdit3_xl2", [256, 256, 512], [1, 1, 2]),
        ("llama3_8b", [512], None),
        ("llama3_8b", [256, 512], None),
        ("tiny_stdit", [64, 256], [1, 4]),
        ("tiny_llama", [96, 160], None),
    ],
)
@pytest.mark.parametrize("ckpt", [False, True])
def test_analytical_memory_agrees_with_the_count_per_unit(
    name: str, tokens: list[int], frames: list[int] | None, ckpt: bool
) -> None:
    spec = model_spec(name)
    counted = count_activations(spec, tokens, frames, checkpoint=ckpt, layers=2)
    cost: Any = make_cost_model(spec, "h200x32", "analytical")
    k = spec.num_layers if ckpt else 0
    rows = compare_units(
        counted,
        cost.activation_breakdown(tokens, float(len(tokens)), 1, k, frames=frames),
        spec.num_layers,
    )
    assert "total" in rows and len(rows) >= (5 if ckpt else 6)
    for unit, (c, m) in rows.items():
        assert c > 0, unit
        assert abs(m / c - 1) <= TOL, f"{name} ckpt={ckpt} {unit}: counted {c:.0f} model {m:.0f}"
    # the cost model charges exactly its breakdown (one sample of all the tokens), plus one
    # recomputed block when every layer is checkpointed (the recomputation peak)
    n, f = float(sum(tokens)), float(sum(frames or [1]))
    charged = float(cost.sample_memory(np.array([n]), np.array([f]), 1, k)[0])
    kept = float(sum(cost.activation_breakdown([n], 1.0, 1, k, frames=[f]).values()))
    t = cost._act_terms  # type: ignore[attr-defined]
    full_tok = float(t.full_tok_at(n / f, f))  # the sample's attention paths
    peak = (
        ((full_tok - t.checkpoint_input_tok) * n + t.full_sample) / t.blocks_per_layer
        if ckpt
        else 0.0
    )
    assert charged == pytest.approx(kept + peak, rel=1e-12)


def test_caption_keys_and_values_are_recomputed_under_checkpointing() -> None:
    """STDiT3's caption K/V (M x 2h per sample and block) are kept without checkpointing and
    recomputed with it: with the same tokens, a second sample adds its K/V to every block of a
    stored layer, and under checkpointing only its embeddings, caption features and modulation."""
    spec = model_spec("stdit3_xl2")
    kv = spec.text_tokens * 2 * spec.hidden * 2  # bf16
    one = count_activations(spec, [512], [1], checkpoint=False, layers=2)
    two = count_activations(spec, [256, 256], [1, 1], checkpoint=False, layers=2)
    for block in ("spatial", "temporal"):
        unit = f"{block}.cross_attention"
        assert two.layer_units(1)[unit] - one.layer_units(1)[unit] == kv
    ck_one = count_activations(spec, [512], [1], checkpoint=True, layers=2)
    ck_two = count_activations(spec, [256, 256], [1, 1], checkpoint=True, layers=2)
    per_sample = ck_two.total - ck_one.total
    embeddings = two.units["embeddings"] - one.units["embeddings"]
    caption_features = spec.text_tokens * spec.hidden * 2
    # the timestep modulation the checkpoints hold (6h) and the final layer's (1 + scale) (h): one
    # per sample, as Open-Sora broadcasts them
    modulation = 7 * spec.hidden * 2
    assert per_sample == embeddings + caption_features + modulation
    assert per_sample < kv * 2 * spec.num_layers / 10


def test_attention_is_counted_as_a_fused_kernel_keeps_it() -> None:
    """A 16K-token Llama layer keeps O(n) bytes: the n x n scores (16 GB in fp32) never appear."""
    spec = model_spec("llama3_8b")
    a = count_activations(spec, [4096], None, layers=1)
    b = count_activations(spec, [16384], None, layers=1)
    assert any("FlashAttention" in n for n in b.attention_nodes)
    assert b.total == pytest.approx(4 * a.total, rel=1e-6)  # linear in tokens
    scores = spec.heads * 16384 * 16384 * 2  # one layer's bf16 score matrices
    assert b.units["L0.attention"] < scores / 20


def test_profiled_memory_agrees_with_the_count() -> None:
    """The profiled source (the committed CPU calibration of the tiny models, measured bytes)
    within 5% of the count, with and without checkpointing."""
    for name, tokens, frames in (("tiny_stdit", [1024], [4]), ("tiny_llama", [1024], [1])):
        spec = model_spec(name)
        cost = make_cost_model(name, "cpu", "profiled", profile=str(CALIBRATION))
        for k in (0, spec.num_layers):
            counted = count_activations(
                spec, tokens, frames, checkpoint=k > 0, layers=spec.num_layers
            )
            tpr, ppr, n = cost._sizes(np.array(tokens, float), np.array(frames, float), 1)  # type: ignore[attr-defined]
            model = float(cost._activation_bytes(tpr, ppr, n, 1, k, resident=False, peak=False)[0])  # type: ignore[attr-defined]
            assert abs(model / counted.total - 1) <= TOL, (name, k, model, counted.total)


def test_checkpointing_each_block_leaves_the_gradients_unchanged() -> None:
    spec = model_spec("tiny_stdit")
    grads = []
    for k in (0, spec.num_layers):
        model = build_model(spec, seed=3)
        inputs = model.make_inputs(np.arange(2), np.array([64, 128]), np.array([1, 2]), SINGLE, 5)
        loss = model(inputs, SINGLE, k)
        loss.backward()
        grads.append(
            (
                float(loss.detach()),
                [p.grad.clone() for p in model.parameters() if p.grad is not None],
            )
        )
    assert grads[0][0] == grads[1][0]
    for a, b in zip(grads[0][1], grads[1][1]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_bad_input_is_named() -> None:
    spec = model_spec("tiny_stdit")
    with pytest.raises(ConfigError, match="frames"):
        count_activations(spec, [65], [2])
    with pytest.raises(ConfigError, match="layers"):
        count_activations(spec, [64], [1], layers=0)
    with pytest.raises(ConfigError, match="dtype"):
        count_activations(dataclasses.replace(spec), [64], [1], dtype="int8")
