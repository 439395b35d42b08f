"""The Llama-family activation terms (`dcp_bench.archs.llama`) for the transformers families
against what the library's own models keep for backward, trained as ``model=hf`` trains them
(`TransformersCausalLM`: the library model through `CausalLMAdapter`, fused SDPA): every tensor
handed to autograd's saved-tensor hooks in one decoder layer, once per storage, parameters
excluded (the tracker of `dcp_bench.runtime.memory_count`). Small configs of each family's
transformers config class, CPU, fp32 and bf16, two packed samples.

Equal to the byte, except two differences the per-token terms cannot hold, each asserted exactly:

- Gemma and Gemma2: ``GemmaRMSNorm`` saves ``1.0 + self.weight.float()`` (an fp32 vector of
  ``hidden``) for the weight multiply, per norm and per layer, whatever the number of tokens.
- GPT-NeoX in bf16: the CPU LayerNorm kernel keeps its mean and rstd per row in bf16 (2 + 2 bytes);
  the cost model prices fp32 (8 bytes, what the CUDA kernel keeps), 4 bytes more per norm and row.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import numpy as np  # noqa: E402

from dcp_bench.archs.llama import ARCH  # noqa: E402
from dcp_bench.cost.specs import ModelSpec, model_spec  # noqa: E402
from dcp_bench.runtime.attention import SINGLE, AttentionKernel  # noqa: E402
from dcp_bench.runtime.integrations.transformers_lm import TransformersCausalLM  # noqa: E402
from dcp_bench.runtime.memory_count import _Tracker  # noqa: E402

TOKENS = [96, 128]  # 224 rows: no activation of hidden 256 looks like a square score matrix
BASE = {
    "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 8,
    "num_key_value_heads": 4, "intermediate_size": 688, "vocab_size": 1024,
    "max_position_embeddings": 4096, "tie_word_embeddings": False,
    "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2,
}  # fmt: skip
FAMILIES = {
    "llama": {},
    "qwen3": {"head_dim": 64},  # per-head q/k RMSNorm, head_dim != hidden / heads
    "gemma": {"head_dim": 64},
    "gemma2": {"head_dim": 64, "final_logit_softcapping": None, "attn_logit_softcapping": None},
    "olmo2": {},  # full-width q/k norms, post-norms
    "phi3": {},  # fused qkv_proj and gate_up_proj
    "granite": {},
    "gpt_neox": {"attention_bias": True},  # LayerNorm, parallel residual, fused q/k/v
}
DTYPES = {"fp32": (torch.float32, 4), "bf16": (torch.bfloat16, 2)}


def _spec(family: str, dtype: str) -> ModelSpec:
    cfg = {**BASE, **FAMILIES[family], "model_type": family}
    if family == "gpt_neox":
        cfg.pop("num_key_value_heads")
    return model_spec("hf", library="transformers", config=cfg, dtype=dtype)


def _count_layer(spec: ModelSpec, dtype: str) -> float:
    """Bytes the second decoder layer keeps for backward (the first may keep shared inputs)."""
    torch.manual_seed(0)
    model = TransformersCausalLM(spec)
    model.lm.to(DTYPES[dtype][0]).train()
    model.set_attention(AttentionKernel("sdpa", fused_only=True, notes=["memory count"]))
    tracker = _Tracker({p.untyped_storage()._cdata for p in model.parameters()})
    body = model.lm.base_model
    handles = [
        layer.register_forward_pre_hook(lambda m, a, i=i: tracker.set_unit(f"L{i}"))
        for i, layer in enumerate(body.layers)
    ]
    final = getattr(body, "norm", None) or body.final_layer_norm
    handles.append(final.register_forward_pre_hook(lambda m, a: tracker.set_unit("final")))
    inputs = model.make_inputs(np.arange(len(TOKENS)), np.asarray(TOKENS), None, SINGLE, 0)
    try:
        with torch.autograd.graph.saved_tensors_hooks(tracker.pack, lambda t: t):
            model(inputs, SINGLE, 0)
    finally:
        for h in handles:
            h.remove()
    assert not tracker.square, f"attention took a non-fused path: {tracker.square[0]}"
    return tracker.units["L1"]


def _library_offset(family: str, dtype: str, spec: ModelSpec) -> float:
    """Counted minus priced bytes the module docstring names (0 for every other family)."""
    if family in ("gemma", "gemma2"):
        return 4.0 * spec.hidden * ARCH.norms_per_layer(spec)
    if family == "gpt_neox" and dtype == "bf16":
        return -4.0 * ARCH.norms_per_layer(spec) * sum(TOKENS)
    return 0.0


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_layer_terms_equal_the_library_models_saved_tensors(family: str, dtype: str) -> None:
    spec = _spec(family, dtype)
    counted = _count_layer(spec, dtype)
    terms = ARCH.activation_terms(spec, DTYPES[dtype][1])
    predicted = sum(TOKENS) * sum(terms.layer_tok.values())
    assert counted > 0
    assert predicted + _library_offset(family, dtype, spec) == counted, (
        f"{family} {dtype}: counted {counted:.0f} bytes, priced {predicted:.0f}"
    )
