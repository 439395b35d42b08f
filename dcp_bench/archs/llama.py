"""The Llama family: 1-D causal decoders (Llama, Mistral, Qwen2, Qwen3, Gemma, OLMo2, Phi3,
Granite, GPT-NeoX as `dcp_bench.cost.library_specs` maps their transformers configs).

A decoder layer: q/k/v/o projections (k and v with ``kv_heads * head_dim`` outputs: grouped-query
attention; ``head_dim`` may differ from hidden / heads, Gemma, Qwen3), optional per-head or
full-width q/k norms (Qwen3, Gemma3; OLMo2), a gated MLP (gate, up, down: SwiGLU or GeGLU) or a
plain GELU MLP (GPT-NeoX), RMSNorm or LayerNorm (with bias), ``norms_per_layer`` of them, and
biases as the config says. Around the layers: the token embedding, a final norm and an LM head
that is a separate matrix unless the embeddings are tied.

A plain Llama (the defaults of every option) is priced exactly as before this module existed:
the expressions below keep their order so that its numbers stay bit-identical.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from dcp_bench.archs.base import (
    ActivationTerms,
    Architecture,
    AttentionPricing,
    GemmTerms,
    ParamBreakdown,
)
from dcp_bench.archs.base import linear_params as _linear


def _opt(spec: Any, name: str, default: Any) -> Any:
    return getattr(spec, name, default)


class Decoder(Architecture):
    """A 1-D causal decoder priced from its spec's decoder options (`ModelSpec` fields
    ``head_dim_override``, ``qk_head_norm``, ``norm``, ``mlp``, ``linear_bias``,
    ``norms_per_layer``)."""

    name: ClassVar[str] = "llama"
    text_sp_kinds: ClassVar[bool] = True
    description: ClassVar[str] = "1-D causal decoder (Llama family)"

    def head_dim(self, spec: Any) -> int:
        override = int(_opt(spec, "head_dim_override", 0))
        return override if override else int(spec.hidden // spec.heads)

    # --- options -------------------------------------------------------------------------------

    def _gated(self, spec: Any) -> bool:
        return _opt(spec, "mlp", "swiglu") in ("swiglu", "geglu")

    def _bias(self, spec: Any) -> bool:
        return bool(_opt(spec, "linear_bias", False))

    def _family(self, spec: Any) -> TransformersFamily | None:
        """The transformers family of a ``model=hf`` spec (None: the runtime's own decoder)."""
        if _opt(spec, "library", "") != "transformers":
            return None
        return TRANSFORMERS_FAMILIES.get(str(_opt(spec, "library_config", {}).get("model_type")))

    def _layernorm(self, spec: Any) -> bool:
        return _opt(spec, "norm", "rmsnorm") == "layernorm"

    def _norm_params(self, spec: Any, width: int) -> int:
        return 2 * width if self._layernorm(spec) else width

    def _qk_norm_params(self, spec: Any) -> int:
        kind = _opt(spec, "qk_head_norm", "")
        hd = self.head_dim(spec)
        if kind == "head":
            return 2 * self._norm_params(spec, hd)
        if kind == "full":
            return self._norm_params(spec, spec.heads * hd) + self._norm_params(
                spec, spec.kv_heads * hd
            )
        return 0

    # --- parameters ----------------------------------------------------------------------------

    def param_breakdown(self, spec: Any) -> ParamBreakdown:
        h, hd = spec.hidden, self.head_dim(spec)
        kv = spec.kv_heads * hd
        q = spec.heads * hd
        bias = self._bias(spec)
        qkv_bias = bool(spec.qkv_bias) or bias
        attn = _linear(h, q, qkv_bias) + 2 * _linear(h, kv, qkv_bias) + _linear(q, h, bias)
        if self._gated(spec):
            mlp = 2 * _linear(h, spec.ffn_hidden, bias) + _linear(spec.ffn_hidden, h, bias)
        else:
            mlp = _linear(h, spec.ffn_hidden, bias) + _linear(spec.ffn_hidden, h, bias)
        norms = self.norms_per_layer(spec) * self._norm_params(spec, h)
        per_layer = attn + mlp + norms + self._qk_norm_params(spec)
        embedding = spec.vocab * h + self.position_params(spec)
        # final norm (+ LM head)
        head = self._norm_params(spec, h) + (0 if spec.tie_embeddings else spec.vocab * h)
        return ParamBreakdown(embedding, per_layer, spec.num_layers, head)

    def norms_per_layer(self, spec: Any) -> int:
        return int(_opt(spec, "norms_per_layer", 2))

    def position_params(self, spec: Any) -> int:
        """Learned position embeddings (none: rotary positions)."""
        return 0

    # --- activation memory ---------------------------------------------------------------------

    def activation_terms(self, spec: Any, b: int) -> ActivationTerms:
        h, f, H = spec.hidden, spec.ffn_hidden, spec.heads
        hd = self.head_dim(spec)
        lse = 4.0 * H  # flash attention's fp32 log-sum-exp per head and query row
        kvd = spec.kv_heads * hd
        if self._layernorm(spec):
            norm = b * h + 8.0  # input, fp32 mean and rstd per row
        else:
            norm = 4.0 * h + b * h + 4.0  # fp32 input, output in the compute dtype, fp32 rsqrt
        family = self._family(spec)
        weight_fp32 = family is not None and family.norm_weight_fp32 and not self._layernorm(spec)
        if weight_fp32:
            # the weight multiplies the fp32 normed rows before the cast (GemmaRMSNorm's
            # ``output * (1.0 + self.weight.float())``, Olmo2RMSNorm's ``self.weight *
            # hidden_states`` then ``.to(input_dtype)``): fp32 input, fp32 rsqrt, fp32 normed
            norm = 8.0 * h + 4.0
        q = H * hd
        # normed input (q/k/v projections), q, k, v (rotated, GQA: KV heads only), the kernel's
        # output and log-sum-exp, the o-projection input (the packed output)
        attention = b * (4.0 * h + 2 * kvd) + lse if q == h else b * (h + 3.0 * q + 2 * kvd) + lse
        qk_norm = _opt(spec, "qk_head_norm", "")
        if qk_norm:
            # RMSNorm of q and of k: fp32 input and output, an fp32 rsqrt per head (or row)
            rows = 4.0 * (H + spec.kv_heads) if qk_norm == "head" else 8.0
            attention += (8.0 if weight_fp32 else 4.0 + b) * (q + kvd) + rows
        norms = self.norms_per_layer(spec) * norm
        if family is not None and family.fused_qkv:
            # v is a view of the fused q/k/v projection's output (transformers Phi3Attention:
            # ``qkv = self.qkv_proj(...)``, value_states sliced from it; GPTNeoXAttention:
            # ``query_key_value``): the kernel's saved v keeps the whole q + 2 kv wide storage
            attention += b * (q + kvd)
        if family is not None and family.parallel_residual:
            # attention and MLP norms read the same layer input (GPTNeoXLayer with
            # use_parallel_residual): it is kept once
            norms -= b * h
        if self._gated(spec):
            # normed input (gate/up projections), gate, up, silu(gate), silu(gate) * up
            mlp = b * h + 4.0 * b * f
        else:
            # normed input (fc1), fc1 output, GELU output (fc2 input)
            mlp = b * h + 2.0 * b * f
        layer = {"norms": norms, "attention": attention, "mlp": mlp}
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
            shared_tok=2.0 * hd * b,  # RoPE cos and sin per row
            shared_sample=0.0,
            checkpoint_input_tok=float(b * h),
            conditioning_held_tok=0.0,
            blocks_per_layer=1,
        )

    def logits_vocab(self, spec: Any) -> int:
        return int(spec.vocab)

    def ema_param_tensors(self, spec: Any) -> int:
        """9 per layer (q, k, v, o, gate, up, down, two norms) and 3 outside (embedding, final
        norm, LM head)."""
        return 9 * spec.num_layers + 3

    # --- time ----------------------------------------------------------------------------------

    def gemm_terms(self, spec: Any, b: int) -> GemmTerms:
        h, f = spec.hidden, spec.ffn_hidden
        hd = self.head_dim(spec)
        kvd = spec.kv_heads * hd
        if hd * spec.heads == h and self._gated(spec):
            # q, k, v, o projections and the SwiGLU MLP (gate, up, down): 2 FLOPs per MAC.
            layer = 2.0 * (h * (h + 2 * kvd) + h * h + 3 * h * f)
            gemms = 7
        else:
            q = spec.heads * hd
            mlp = (3 if self._gated(spec) else 2) * h * f
            layer = 2.0 * (h * (q + 2 * kvd) + q * h + mlp)
            gemms = 7 if self._gated(spec) else 6
        # Bytes per token per layer the memory-bound kernels' traffic scales with (the
        # elementwise term's basis, as calibrated): norm-1 input, qkv input, q, k, v,
        # attention output, norm-2 input, MLP input (6h + 2 kvd), gate, up, silu(gate),
        # gate*up (4f) in the model dtype, and flash-attention's fp32 log-sum-exp per head.
        # The memory charged is `activation_terms` (what the models keep, counted).
        act = b * (6 * h + 2 * kvd + 4 * f) + 4.0 * spec.heads
        return GemmTerms(layer, 0.0, 2.0 * h * spec.vocab, 0.0, act, gemms)

    def _attn_width(self, spec: Any) -> int:
        return int(spec.heads * self.head_dim(spec))

    def attention_flops(
        self, spec: Any, n: np.ndarray, frames: Any, cm: AttentionPricing
    ) -> tuple[np.ndarray, np.ndarray]:
        # QK^T and AV over the causal half of the n x n scores: 2 * (2 n^2 h) / 2.
        a = 2.0 * n * n * self._attn_width(spec)
        L = spec.num_layers
        attn = L * a
        return attn, attn / cm.attention_efficiency(n, causal=True)

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
        h, L = self._attn_width(spec), spec.num_layers
        short = n < short_keys
        flop_t = bwd * 2.0 * n * n * h / cm.attention_efficiency(n, causal=True) / flop_rate
        io_t = n * per_row
        return np.where(short, L * np.maximum(io_t - flop_t, 0.0), 0.0)

    def a2a_bytes_per_layer(self, spec: Any, n_r: np.ndarray, sp: Any, b: int) -> np.ndarray:
        # q and output: h wide; k and v: kv_heads * head_dim, repeated up to s heads when the
        # group is larger than the number of KV heads (each rank needs at least one).
        hd = self.head_dim(spec)
        kv = np.maximum(spec.kv_heads, np.asarray(sp)) * hd
        return n_r * b * (2 * self._attn_width(spec) + 2 * kv)

    def a2a_bytes_per_token(self, spec: Any, b: int) -> list[float]:
        # q, k, v in; attention output back
        kv = spec.kv_heads * self.head_dim(spec)
        q = self._attn_width(spec)
        return [q * b, kv * b, kv * b, q * b]

    # --- sizes ---------------------------------------------------------------------------------

    def attention_pairs(self, tokens: np.ndarray, frames: np.ndarray) -> np.ndarray:
        """Causal 1-D attention attends L^2 / 2 pairs."""
        t = np.asarray(tokens, dtype=float)
        return t * t / 2.0

    def bucket_key(self, tokens: int, frames: int) -> tuple[int, int]:
        """The next power of two of the length."""
        return (1, 1 << max(0, (tokens - 1).bit_length()))


ARCH = Decoder()


@dataclass(frozen=True)
class TransformersFamily:
    """How a transformers decoder family's config maps onto a `Decoder` spec.

    ``defaults``: the family's config class defaults for the keys read here when a config omits
    them (transformers 5.x; `tests/test_archs.py` checks them against the config classes).
    ``norm``, ``mlp``, ``qk_head_norm``, ``norms_per_layer``: the layer's structure.
    ``qkv_bias``: q, k and v always carry a bias (Qwen2). ``bias_key``: the config key that puts
    a bias on every linear layer (GPT-NeoX's ``attention_bias`` with its always-biased MLP,
    Starcoder2's ``use_bias``); a family without one prices ``attention_bias`` and ``mlp_bias``
    False only. ``parallel_residual``: attention and MLP read the same input (GPT-NeoX's
    ``use_parallel_residual``): the same parameters and kept tensors as sequential layers."""

    defaults: dict[str, Any] = field(default_factory=dict)
    norm: str = "rmsnorm"
    mlp: str = "swiglu"
    qk_head_norm: str = ""
    norms_per_layer: int = 2
    qkv_bias: bool = False
    bias_key: str = ""
    parallel_residual: bool = False
    unpriced: str = ""  # why the cost model cannot price this family ("": it can)
    grouped_query: bool = True  # reads num_key_value_heads (GPT-NeoX: multi-head only)
    fused_qkv: bool = False  # one q/k/v projection whose output v is a view of (Phi3, GPT-NeoX)
    norm_weight_fp32: bool = False  # RMSNorm applies its weight in fp32 (Gemma, OLMo2)


_GEMMA = {"head_dim": 256, "tie_word_embeddings": True}
# model_type -> family; the transformers adapter trains exactly these (its model-type whitelist,
# `dcp_bench.runtime.integrations.transformers_lm.MODEL_TYPES`).
TRANSFORMERS_FAMILIES: dict[str, TransformersFamily] = {
    "llama": TransformersFamily(),
    "mistral": TransformersFamily(),
    "qwen2": TransformersFamily(defaults={"num_key_value_heads": 32}, qkv_bias=True),
    "qwen3": TransformersFamily(
        defaults={"head_dim": 128, "num_key_value_heads": 32}, qk_head_norm="head"
    ),
    "gemma": TransformersFamily(
        defaults={**_GEMMA, "num_key_value_heads": 16}, mlp="geglu", norm_weight_fp32=True
    ),
    "gemma2": TransformersFamily(
        defaults={**_GEMMA, "num_key_value_heads": 4},
        mlp="geglu",
        norms_per_layer=4,
        norm_weight_fp32=True,
    ),
    "gemma3_text": TransformersFamily(
        defaults={**_GEMMA, "num_key_value_heads": 4},
        mlp="geglu",
        norms_per_layer=4,
        qk_head_norm="head",
        norm_weight_fp32=True,
    ),
    "olmo2": TransformersFamily(qk_head_norm="full", norm_weight_fp32=True),
    "phi3": TransformersFamily(fused_qkv=True),
    "granite": TransformersFamily(),
    "gpt_neox": TransformersFamily(
        defaults={"attention_bias": True},
        norm="layernorm",
        mlp="gelu",
        bias_key="attention_bias",
        parallel_residual=True,
        grouped_query=False,
        fused_qkv=True,
    ),
    "starcoder2": TransformersFamily(
        defaults={"num_key_value_heads": 2, "tie_word_embeddings": True, "use_bias": True},
        norm="layernorm",
        mlp="gelu",
        bias_key="use_bias",
    ),
    # trains through the adapter (equal gradients, tests/test_integration_attention_args.py);
    # not priced
    "gpt_oss": TransformersFamily(unpriced="its mixture-of-experts layers"),
}
