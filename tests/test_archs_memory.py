"""Each registered architecture's cost-model activation memory equals what the runtime's module
for it keeps for backward, counted (`dcp_bench.runtime.memory_count`, what `dcp-bench memory`
prints), unit by unit, with and without checkpointing. An architecture the runtime has no
module for is refused by the count on one line naming it (it is planned and simulated only)."""

from __future__ import annotations

from typing import Any

import pytest

from dcp_bench.archs import registered
from dcp_bench.cost import make_cost_model
from dcp_bench.cost.specs import ModelSpec, model_spec

torch = pytest.importorskip("torch")

from dcp_bench.errors import ConfigError  # noqa: E402
from dcp_bench.runtime.archs import RUNTIME  # noqa: E402
from dcp_bench.runtime.memory_count import compare_units, count_activations  # noqa: E402


def _small(arch: str) -> tuple[ModelSpec, list[int], list[int] | None]:
    """A small model of ``arch`` in fp32 and a micro-batch of two samples."""
    if arch == "llama":
        return model_spec("tiny_llama"), [96, 160], None
    if arch == "stdit":
        return model_spec("tiny_stdit"), [64, 256], [1, 4]
    if arch == "gpt":
        spec = model_spec(
            "tiny_gpt", arch="gpt", num_layers=2, hidden=256, heads=8, kv_heads=8,
            ffn_hidden=1024, vocab=1024, tie_embeddings=True, learned_positions=4096,
            norm="layernorm", mlp="gelu", linear_bias=True, dtype="fp32",
        )  # fmt: skip
        return spec, [96, 160], None
    if arch == "wan":
        spec = model_spec(
            "tiny_wan", arch="wan", num_layers=2, hidden=128, heads=4, kv_heads=4,
            ffn_hidden=512, patch=[1, 2, 2], text_tokens=16, text_dim=64, dtype="fp32",
        )  # fmt: skip
        return spec, [64, 256], [1, 4]
    raise AssertionError(f"no small model for architecture {arch!r}: add one here")


@pytest.mark.parametrize("ckpt", [False, True])
@pytest.mark.parametrize("arch", registered())
def test_cost_model_memory_equals_the_count(arch: str, ckpt: bool) -> None:
    spec, tokens, frames = _small(arch)
    assert spec.arch == arch
    if arch not in RUNTIME:
        with pytest.raises(ConfigError, match=f"architecture '{arch}'.*has no runtime model"):
            count_activations(spec, tokens, frames, checkpoint=ckpt, layers=2)
        return
    counted = count_activations(spec, tokens, frames, checkpoint=ckpt, layers=2)
    cost: Any = make_cost_model(spec, "h200x32", "analytical")
    k = spec.num_layers if ckpt else 0
    rows = compare_units(
        counted,
        cost.activation_breakdown(tokens, float(len(tokens)), 1, k, frames=frames),
        spec.num_layers,
    )
    assert rows["total"][0] > 0
    for unit, (c, m) in rows.items():
        assert m == pytest.approx(c, rel=1e-9), f"{arch} ckpt={ckpt} {unit}: counted {c} model {m}"


def test_gpt_module_equals_the_library_gpt2_with_the_same_weights() -> None:
    """The runtime's GPT (`GPTModel`) against transformers' GPT2LMHeadModel (exact GELU, no
    dropout) holding the same weights: the summed next-token loss over two packed samples and
    every gradient agree."""
    tf = pytest.importorskip("transformers")
    import numpy as np
    import torch.nn.functional as F

    from dcp_bench.runtime.attention import SINGLE
    from dcp_bench.runtime.models import build_model, text_sample

    spec, _, _ = _small("gpt")
    spec = model_spec(
        "tiny_gpt", **{**{f: getattr(spec, f) for f in ("arch", "vocab", "norm", "mlp")},
        "num_layers": 2, "hidden": 64, "heads": 4, "kv_heads": 4, "ffn_hidden": 256,
        "tie_embeddings": True, "learned_positions": 128, "linear_bias": True, "dtype": "fp32"},
    )  # fmt: skip
    ours = build_model(spec, seed=3)
    cfg = tf.GPT2Config(
        n_layer=2, n_embd=64, n_head=4, vocab_size=spec.vocab, n_positions=128,
        activation_function="gelu", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    ref = tf.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():
        ref.transformer.wte.weight.copy_(ours.embed.weight)
        ref.transformer.wpe.weight.copy_(ours.pos_embed.weight)
        ref.transformer.ln_f.weight.copy_(ours.norm.weight)
        ref.transformer.ln_f.bias.copy_(ours.norm.bias)
        for mine, block in zip(ours.layers, ref.transformer.h):
            block.ln_1.load_state_dict(mine.attn_norm.state_dict())
            block.ln_2.load_state_dict(mine.mlp_norm.state_dict())
            qkv = [mine.q_proj, mine.k_proj, mine.v_proj]
            block.attn.c_attn.weight.copy_(torch.cat([p.weight.T for p in qkv], dim=1))
            block.attn.c_attn.bias.copy_(torch.cat([p.bias for p in qkv]))
            block.attn.c_proj.weight.copy_(mine.o_proj.weight.T)
            block.attn.c_proj.bias.copy_(mine.o_proj.bias)
            block.mlp.c_fc.weight.copy_(mine.fc1.weight.T)
            block.mlp.c_fc.bias.copy_(mine.fc1.bias)
            block.mlp.c_proj.weight.copy_(mine.fc2.weight.T)
            block.mlp.c_proj.bias.copy_(mine.fc2.bias)
    ids, tokens = np.array([1, 2]), np.array([40, 25])
    loss = ours(ours.make_inputs(ids, tokens, None, SINGLE, 0), SINGLE, 0)
    loss.backward()
    ref_loss = torch.zeros(())
    for sid, n in zip(ids.tolist(), tokens.tolist()):
        seq = text_sample(0, sid, n, spec.vocab)
        logits = ref(input_ids=seq[:n][None], use_cache=False).logits[0]
        ref_loss = ref_loss + F.cross_entropy(logits.float(), seq[1:], reduction="sum")
    ref_loss.backward()
    assert float(loss.detach()) == pytest.approx(float(ref_loss.detach()), rel=1e-5)
    fc1 = ref.transformer.h[0].mlp.c_fc.weight.grad.T
    assert torch.allclose(ours.layers[0].fc1.weight.grad, fc1, atol=1e-5)
    assert torch.allclose(ours.embed.weight.grad, ref.transformer.wte.weight.grad, atol=1e-5)
    assert torch.allclose(ours.pos_embed.weight.grad, ref.transformer.wpe.weight.grad, atol=1e-5)
