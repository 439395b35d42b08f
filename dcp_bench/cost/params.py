"""Parameter counts of the modelled architectures, layer by layer (each architecture's module in
`dcp_bench.archs` counts its own).

The counts follow the module structure the runtime builds (``dcp_bench/runtime/models.py``) and the
published architectures they mirror:

- ``llama``: token embedding (vocab x hidden), per decoder layer q/k/v/o projections without bias
  (k and v have ``kv_heads * head_dim`` outputs: grouped-query attention), a SwiGLU MLP (gate, up,
  down; no bias) and two RMSNorm weight vectors; a final RMSNorm; an LM head (vocab x hidden) that
  is a separate matrix unless ``tie_embeddings``; with ``qkv_bias`` (Qwen2) q, k and v have a bias.
- ``stdit`` (Open-Sora v1.2 STDiT3): per block (spatial and temporal alike) a qkv projection and an
  output projection with bias, per-head RMSNorm on q and k, a cross-attention (q, kv, out
  projections with bias), a GELU MLP with bias, and a 6 x hidden adaLN-single modulation table;
  LayerNorms without affine weights. Around the blocks: a Conv3d patch embedding, timestep and fps
  embedders (256 -> hidden -> hidden MLPs), the 6 x hidden ``t_block`` projection, the caption MLP
  (text_dim -> hidden -> hidden) and the final layer (hidden -> prod(patch) * 2 * in_channels, the
  model predicts the noise and its variance, plus a 2 x hidden modulation table).
"""

from __future__ import annotations

from dcp_bench.archs import arch_of
from dcp_bench.archs.base import ParamBreakdown
from dcp_bench.archs.stdit3 import STDIT_FREQ_EMBED
from dcp_bench.cost.specs import ModelSpec


def param_breakdown(spec: ModelSpec) -> ParamBreakdown:
    """Parameter counts of ``spec`` by part (its architecture's, `dcp_bench.archs`)."""
    return arch_of(spec).param_breakdown(spec)


def param_count(spec: ModelSpec) -> int:
    """Total trainable parameters of ``spec`` (equal to the runtime's torch module)."""
    return param_breakdown(spec).total


__all__ = ["STDIT_FREQ_EMBED", "ParamBreakdown", "param_breakdown", "param_count"]
