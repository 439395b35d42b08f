"""Parameter counts of the modelled architectures, layer by layer.

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

from dataclasses import dataclass

from dcp_bench.cost.specs import ModelSpec

# Width of the sinusoidal timestep / fps features fed to the STDiT embedders (Open-Sora: 256).
STDIT_FREQ_EMBED = 256


@dataclass(frozen=True)
class ParamBreakdown:
    """Parameter counts by part; ``per_layer`` is one unit of ``ModelSpec.num_layers`` (a llama
    decoder layer, or an STDiT spatial + temporal block pair)."""

    embedding: int
    per_layer: int
    num_layers: int
    head: int  # LM head / final layer, plus final norms

    @property
    def layers(self) -> int:
        return self.per_layer * self.num_layers

    @property
    def total(self) -> int:
        return self.embedding + self.layers + self.head


def _linear(fan_in: int, fan_out: int, bias: bool) -> int:
    return fan_in * fan_out + (fan_out if bias else 0)


def param_breakdown(spec: ModelSpec) -> ParamBreakdown:
    """Parameter counts of ``spec`` by part (see the module docstring for the structure)."""
    h, hd = spec.hidden, spec.head_dim
    if spec.arch == "llama":
        kv = spec.kv_heads * hd
        attn = (
            _linear(h, h, spec.qkv_bias) + 2 * _linear(h, kv, spec.qkv_bias) + _linear(h, h, False)
        )
        mlp = 2 * _linear(h, spec.ffn_hidden, False) + _linear(spec.ffn_hidden, h, False)
        per_layer = attn + mlp + 2 * h  # two RMSNorm weights
        embedding = spec.vocab * h
        head = h + (0 if spec.tie_embeddings else spec.vocab * h)  # final norm (+ LM head)
        return ParamBreakdown(embedding, per_layer, spec.num_layers, head)
    # stdit: one block; a layer unit is a spatial + temporal pair.
    self_attn = _linear(h, 3 * h, True) + _linear(h, h, True) + 2 * hd  # + q/k RMSNorm
    cross_attn = _linear(h, h, True) + _linear(h, 2 * h, True) + _linear(h, h, True)
    mlp = _linear(h, spec.ffn_hidden, True) + _linear(spec.ffn_hidden, h, True)
    block = self_attn + cross_attn + mlp + 6 * h
    pt, ph, pw = spec.patch
    patch_vol = pt * ph * pw
    x_embed = spec.in_channels * patch_vol * h + h
    t_embed = _linear(STDIT_FREQ_EMBED, h, True) + _linear(h, h, True)
    fps_embed = t_embed
    t_block = _linear(h, 6 * h, True)
    y_embed = _linear(spec.text_dim, h, True) + _linear(h, h, True)
    embedding = x_embed + t_embed + fps_embed + t_block + y_embed
    head = _linear(h, patch_vol * 2 * spec.in_channels, True) + 2 * h
    return ParamBreakdown(embedding, 2 * block, spec.num_layers, head)


def param_count(spec: ModelSpec) -> int:
    """Total trainable parameters of ``spec`` (equal to the runtime's torch module)."""
    return param_breakdown(spec).total
