"""What the runtime's models keep for the backward, per unit, in closed form.

Each term is the bytes the ops of one unit of `dcp_bench.runtime.models` save for their backward
(one entry per saved storage, as ``torch.autograd.graph.saved_tensors_hooks`` sees them), written
out op by op below; `dcp_bench.runtime.memory_count` counts the same from the models themselves and
``tests/test_memory_count.py`` holds the two within 5% for every unit, checkpoint setting and
model (docs/cost_model.md, "Activation memory").

Notation: ``b`` bytes of the compute dtype, ``h`` hidden, ``f`` MLP width, ``H`` heads, ``hd``
head dim, ``kvd`` = KV heads x hd, ``M`` caption tokens, ``D`` caption width, ``C`` latent patch
width (in_channels x patch volume). A fused attention kernel keeps q, k, v, its output and an fp32
log-sum-exp per head and query row (4H bytes per token), never the score matrix. RMSNorm computes
in fp32: it keeps its fp32 input (4h) and its output in the compute dtype (bh).

STDiT3's self-attention branches on its sequence length ``l`` as the reference's does (VideoSys
``videosys/models/modules/attentions.py:57-66``, runtime.models.STDiTBlock): ``l == 1`` keeps
no attention state (the output is v), ``l < FUSED_ATTENTION_MIN_LEN`` runs the unfused math path
(it keeps the l x l scores per head: fp32 softmax and its cast, ``(4 + b) H l`` per row), longer
sequences the fused kernel; `ActivationTerms.layer_tok_at` prices a sample by its lengths
(spatial S patches, temporal T' frames), ``layer_tok`` is the fused path of both. The six
modulation vectors of a block are one per sample (``t2i_modulate``), so the modulation is a
per-sample term.
"""

from __future__ import annotations

from dcp_bench.archs import arch_of
from dcp_bench.archs.base import FREQ_DIM, FUSED_ATTENTION_MIN_LEN, QK_NORMS, ActivationTerms
from dcp_bench.cost.specs import ModelSpec


def dtype_bytes(spec: ModelSpec) -> int:
    return int(spec.dtype_bytes)


def activation_terms(spec: ModelSpec, b: int | None = None) -> ActivationTerms:
    """The closed-form terms of ``spec`` in a compute dtype of ``b`` bytes (default the spec's),
    as its architecture states them (`dcp_bench.archs`)."""
    return arch_of(spec).activation_terms(spec, int(b if b is not None else spec.dtype_bytes))


def kept_bytes(
    terms: ActivationTerms,
    num_layers: int,
    tokens: float,
    samples: float,
    ckpt_layers: int,
    peak: bool = True,
) -> float:
    """Bytes kept for the backward by one micro-batch of ``tokens`` per rank over ``samples``
    samples, with ``ckpt_layers`` of ``num_layers`` layer units checkpointed. ``peak``: add what
    recomputing one checkpointed block materialises on top when every layer is checkpointed
    (otherwise the stored layers above are freed before the first recomputation). Every
    attention on its fused path (``layer_tok``; `ActivationTerms.layer_tok_at` by length)."""
    L, k = num_layers, min(max(ckpt_layers, 0), num_layers)
    full = tokens * terms.full_tok + samples * terms.full_sample
    inp = tokens * terms.checkpoint_input_tok
    out = (L - k) * full + k * inp
    out += tokens * sum(terms.outer_tok.values()) + samples * sum(terms.outer_sample.values())
    out += tokens * terms.shared_tok + samples * terms.shared_sample
    if k > 0:
        out += tokens * terms.conditioning_held_tok + samples * terms.conditioning_held_sample
    if peak and k == L and L > 0:
        nb = terms.blocks_per_layer
        out += full / nb - inp / nb
    return float(out)


def reference_block_inputs(spec: ModelSpec, b: int | None = None) -> tuple[float, float]:
    """Bytes per token and per sample of the tensors that require grad among the inputs of one
    layer unit's blocks, as the reference profiler sums them into ``input_memory`` and charges
    them to every layer it did not run (VideoSys 4cce477 `videosys/core/dcp/recompute.py:87`;
    `profiler.py:785-797`). STDiT3 calls each of its two blocks with the hidden states ``x``, the
    caption features ``y`` (M x h per sample, unsplit by SP) and the two (6h) timestep
    modulations ``t_mlp`` and ``t0_mlp`` (`open_sora_transformer_3d.py:612-613`; ``t0_mlp`` exists
    because the benchmark configs set ``mask_ratios``, `train.py:150`, `:350-353`); the real run
    keeps the caption and the modulations once, not per block. A decoder layer takes its hidden
    states."""
    return arch_of(spec).reference_block_inputs(spec, int(b if b is not None else spec.dtype_bytes))


__all__ = [
    "FREQ_DIM",
    "FUSED_ATTENTION_MIN_LEN",
    "QK_NORMS",
    "ActivationTerms",
    "activation_terms",
    "kept_bytes",
    "reference_block_inputs",
]
