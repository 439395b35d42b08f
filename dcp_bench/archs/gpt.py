"""GPT (GPT-2 / Megatron-LM style): a 1-D causal decoder with learned absolute positions,
LayerNorm (with bias) before attention and MLP, a plain GELU MLP of ``ffn_hidden`` (4 x hidden in
the published sizes), a bias on every linear layer, multi-head attention (``kv_heads`` = heads)
and an LM head tied to the token embedding.

The FlexSP evaluation trains this model through Galvatron (PKU-DAIR/Hetu-Galvatron, branch
flexsp, commit b4666892, ``galvatron/models/gpt_hf/meta_configs/gpt-{7b,13b,30b}.json`` read as
transformers ``GPT2Config``; ``config_utils.py:53,58``: FFN = 4 x hidden;
``GPTModel_hybrid_parallel.py:22``: ``wte`` and ``lm_head`` tied). The model configs are
``conf/model/gpt_{7b,13b,30b}.yaml``.

The runtime's module is `dcp_bench.runtime.models.GPTModel`; the activation terms below equal
what it keeps for backward, counted (`tests/test_archs_memory.py`, fp32): LayerNorm keeps its
input and an fp32 mean and rstd per row; the MLP its input, the fc1 output and the GELU output.
In bf16 the CPU count (`dcp-bench memory`) sees LayerNorm's mean and rstd in bf16, 4 bytes per
row and norm less than the fp32 statistics a CUDA LayerNorm keeps, which the terms charge (0.05%
of a gpt_7b layer).
"""

from __future__ import annotations

from typing import Any, ClassVar

from dcp_bench.archs.base import ActivationTerms, GemmTerms
from dcp_bench.archs.llama import Decoder
from dcp_bench.errors import ConfigError


class GPT(Decoder):
    name: ClassVar[str] = "gpt"
    description: ClassVar[str] = (
        "1-D causal decoder, GPT-2/Megatron style (learned positions, LayerNorm, GELU MLP, biases)"
    )

    def check(self, spec: Any) -> None:
        if spec.kv_heads != spec.heads:
            raise ConfigError(
                f"model {spec.name!r}: kv_heads {spec.kv_heads} with {spec.heads} heads; GPT "
                "has multi-head attention (kv_heads = heads)"
            )
        stated = {
            "norm": (spec.norm, "layernorm"),
            "mlp": (spec.mlp, "gelu"),
            "linear_bias": (spec.linear_bias, True),
            "qk_head_norm": (spec.qk_head_norm, ""),
            "head_dim_override": (spec.head_dim_override, 0),
        }
        for key, (value, want) in stated.items():
            if value != want:
                raise ConfigError(
                    f"model.{key}={value!r} (model {spec.name!r}): GPT has {key}={want!r}"
                )
        if int(getattr(spec, "learned_positions", 0)) < 1:
            raise ConfigError(
                f"model.learned_positions={getattr(spec, 'learned_positions', 0)!r} (model "
                f"{spec.name!r}): GPT needs its position table's rows (>= 1)"
            )

    def position_params(self, spec: Any) -> int:
        return int(spec.learned_positions) * int(spec.hidden)

    def activation_terms(self, spec: Any, b: int) -> ActivationTerms:
        h, f, H = spec.hidden, spec.ffn_hidden, spec.heads
        lse = 4.0 * H  # flash attention's fp32 log-sum-exp per head and query row
        norm = b * h + 8.0  # LayerNorm input, fp32 mean and rstd per row
        layer = {
            "norms": 2 * norm,
            # normed input (qkv projection), q, k, v, the kernel's output and log-sum-exp, the
            # output projection's input
            "attention": b * 6.0 * h + lse,
            # normed input (fc1), fc1 output, GELU output (fc2 input)
            "mlp": b * h + 2.0 * b * f,
        }
        outer_tok = {
            "embeddings": 16.0,  # int64 token ids and position ids (the embeddings' backward)
            "final_norm": norm,
            "loss": b * h + 8.0 + 4.0,  # LM-head input, int64 labels, fp32 log-sum-exp per row
        }
        return ActivationTerms(
            layer,
            {k: 0.0 for k in layer},
            outer_tok,
            {},
            shared_tok=0.0,
            shared_sample=0.0,
            checkpoint_input_tok=float(b * h),
            conditioning_held_tok=0.0,
            blocks_per_layer=1,
        )

    def gemm_terms(self, spec: Any, b: int) -> GemmTerms:
        h, f = spec.hidden, spec.ffn_hidden
        # qkv and output projections, fc1 and fc2: 2 FLOPs per MAC; 4 GEMMs (qkv fused)
        layer = 2.0 * (4 * h * h + 2 * h * f)
        # traffic basis as Llama's: norm inputs, qkv input, q, k, v, output, MLP input (8h),
        # fc1 and GELU outputs (2f), flash attention's fp32 log-sum-exp per head
        act = b * (8 * h + 2 * f) + 4.0 * spec.heads
        return GemmTerms(layer, 0.0, 2.0 * h * spec.vocab, 0.0, act, 4)

    def ema_param_tensors(self, spec: Any) -> int:
        """12 per layer (two LayerNorms, qkv, output projection, fc1, fc2: weight and bias each)
        and 4 outside (token and position embeddings, the final LayerNorm's weight and bias)."""
        return 12 * spec.num_layers + 4


ARCH = GPT()
