"""The interface every architecture implements, and the plain records it returns.

An architecture owns what the cost model, the memory model, the planners and the simulator need
to know about a model's structure: parameter counts, GEMM widths, attention FLOPs and query-key
pairs, all-to-all bytes, activation terms, logits memory, size buckets, head counts and the
sequence-parallel degrees it allows. Torch-free: the runtime's modules for the same architecture
are registered separately (`dcp_bench.runtime.archs`).

A spec is passed as ``Any``: it is a `dcp_bench.cost.specs.ModelSpec` (a lower layer cannot name
the type), read through its public fields.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import numpy as np

# Attention over fewer keys runs the reference's unfused math path ("flash attn is not memory
# efficient for small sequences", VideoSys videosys/models/modules/attentions.py:57-58, :95-97).
FUSED_ATTENTION_MIN_LEN = 30
# The q/k RMSNorm implementations of STDiT3 (model.qk_norm): the reference's fallback
# LlamaRMSNorm (videosys/models/modules/normalization.py:9-33, used when apex is absent) and a
# fused one (apex FusedRMSNorm, normalization.py:11-13).
QK_NORMS = ("reference", "fused")
FREQ_DIM = 256  # the timestep embedder's sinusoidal width (runtime.models.STDiTModel.FREQ_DIM)


@dataclass(frozen=True)
class ParamBreakdown:
    """Parameter counts by part; ``per_layer`` is one unit of ``ModelSpec.num_layers`` (a decoder
    layer, or an STDiT spatial + temporal block pair)."""

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


def linear_params(fan_in: int, fan_out: int, bias: bool) -> int:
    return fan_in * fan_out + (fan_out if bias else 0)


@dataclass(frozen=True)
class ActivationTerms:
    """Bytes kept per token (``tok``) and per sample (``sample``), by unit.

    ``layer``: units of one layer unit (a decoder layer; an STDiT3 spatial + temporal pair:
    names prefixed ``spatial.`` / ``temporal.``), not checkpointed. ``checkpoint_input``: what one
    checkpointed layer unit keeps (its checkpointed blocks' inputs). ``outer``: the model outside
    its layers (embeddings, final layer, loss), kept whatever the checkpointing. ``shared``: inputs
    every layer reads, kept once (the first layer saves them, or the checkpoints hold them): the
    STDiT caption features, Llama's RoPE tables. ``conditioning_held``: inputs every checkpointed
    unit takes besides the hidden states (per token: Llama's RoPE tables), kept once while any
    unit is checkpointed. ``blocks_per_layer``: checkpoints per layer unit (recomputed one at a
    time). ``conditioning_held_sample``: the same per sample (the STDiT
    per-sample timestep modulation, 6h). ``attention_tok``: STDiT self-attention bytes per row by
    path, (length 1, math path without its scores, fused); ``score_tok``: the math path's score
    bytes per row and key (`layer_tok_at`)."""

    layer_tok: dict[str, float]
    layer_sample: dict[str, float]
    outer_tok: dict[str, float]
    outer_sample: dict[str, float]
    shared_tok: float
    shared_sample: float
    checkpoint_input_tok: float
    conditioning_held_tok: float
    blocks_per_layer: int
    conditioning_held_sample: float = 0.0
    attention_tok: tuple[float, float, float] | None = None
    score_tok: float = 0.0

    @property
    def full_tok(self) -> float:
        return float(sum(self.layer_tok.values()))

    def self_attention_tok(self, length: Any) -> Any:
        """STDiT self-attention bytes per row of sequences of ``length`` keys (array-like)."""
        assert self.attention_tok is not None
        one, math_base, fused = self.attention_tok
        n = np.asarray(length, dtype=float)
        short = math_base + self.score_tok * n
        return np.where(n <= 1, one, np.where(n < FUSED_ATTENTION_MIN_LEN, short, fused))

    def layer_tok_at(self, spatial: Any, temporal: Any) -> dict[str, Any]:
        """``layer_tok`` for samples of ``spatial`` patches per frame and ``temporal`` frames
        (array-likes): each block's self-attention on the path of its length. Without per-path
        terms (``attention_tok`` None): ``layer_tok``."""
        out: dict[str, Any] = dict(self.layer_tok)
        if self.attention_tok is not None:
            out["spatial.self_attention"] = self.self_attention_tok(spatial)
            out["temporal.self_attention"] = self.self_attention_tok(temporal)
        return out

    def full_tok_at(self, spatial: Any, temporal: Any) -> Any:
        """`full_tok` for samples of the given lengths (`layer_tok_at`)."""
        return sum(self.layer_tok_at(spatial, temporal).values())

    @property
    def full_sample(self) -> float:
        return float(sum(self.layer_sample.values()))


@dataclass(frozen=True)
class GemmTerms:
    """What the analytical cost model's GEMM and elementwise terms scale with.

    FLOPs (2 per multiply-add) per token and per sample of one layer unit (``layer_*``) and of the
    model outside its layers (``head_*``); ``act_full_tok``: bytes per token per layer unit the
    memory-bound kernels' traffic scales with (the elementwise term's basis, as calibrated);
    ``gemms_per_layer``: GEMM launches per layer unit; ``elementwise_flops_tok``: the part of
    ``layer_tok`` that is elementwise work, not GEMMs (left out of the mean GEMM width)."""

    layer_tok: float
    layer_sample: float
    head_tok: float
    head_sample: float
    act_full_tok: float
    gemms_per_layer: int
    elementwise_flops_tok: float = 0.0


class AttentionPricing(Protocol):
    """What an architecture's attention pricing needs from the analytical cost model."""

    def attention_efficiency(self, length: Any, causal: bool = False) -> Any: ...

    def self_attention_work(self, flops: Any, length: Any, rows: Any) -> Any: ...


class Architecture(ABC):
    """One model architecture, as the cost model, memory model, planners and simulator see it.

    ``name``: what a model config's ``arch`` says. ``video``: samples are (frames x patches)
    latents (the profiler's shapes, the reference video loop's host inputs and image dealing
    apply). ``text_sp_kinds``: ring and hybrid sequence parallelism are priced (1-D attention);
    otherwise only Ulysses-style head sharding. ``runtime_module``: for an architecture of
    another package, the module whose ``RUNTIME`` (a `dcp_bench.runtime.archs.RuntimeArch`)
    builds and counts it ("": the runtime registry's own entry, or none: planned and simulated
    only)."""

    name: ClassVar[str]
    video: ClassVar[bool] = False
    text_sp_kinds: ClassVar[bool] = False
    description: ClassVar[str] = ""
    runtime_module: ClassVar[str] = ""

    # --- shape -------------------------------------------------------------------------------

    def check(self, spec: Any) -> None:  # noqa: B027 - optional hook
        """Raise `dcp_bench.errors.ConfigError` on a spec this architecture cannot price."""

    def head_dim(self, spec: Any) -> int:
        """Width of one attention head."""
        return int(spec.hidden // spec.heads)

    def sp_degree_offence(self, spec: Any, sp: int) -> str | None:
        """Why ``spec`` cannot run a sequence-split micro-batch on ``sp`` ranks, or None.

        Ulysses (text) and DSP (video) shard the attention heads over the group, so ``sp`` must
        divide the query heads (`dcp_bench.runtime.attention.check_heads`). KV heads add no
        further rule: the runtime repeats them up to lcm(kv_heads, sp) (`kv_heads_for_sp`),
        which divides the query heads whenever ``sp`` does."""
        if sp > 1 and spec.heads % sp:
            return (
                f"SP degree {sp} does not divide the {spec.heads} attention heads of model "
                f"{spec.name!r} (Ulysses shards heads over the group)"
            )
        return None

    # --- parameters and memory -----------------------------------------------------------------

    @abstractmethod
    def param_breakdown(self, spec: Any) -> ParamBreakdown:
        """Parameter counts by part, equal to the runtime's module."""

    @abstractmethod
    def activation_terms(self, spec: Any, b: int) -> ActivationTerms:
        """Closed-form activation bytes in a compute dtype of ``b`` bytes (equal to what the
        runtime's modules keep for backward, `dcp_bench.runtime.memory_count`)."""

    def reference_block_inputs(self, spec: Any, b: int) -> tuple[float, float]:
        """Bytes per token and per sample of the inputs that require grad of one layer unit's
        blocks (the reference profiler's ``input_memory``). Default: the hidden states."""
        return float(b * spec.hidden), 0.0

    def logits_vocab(self, spec: Any) -> int:
        """Vocabulary of the LM head whose logits chunk the loss holds (0: no LM head)."""
        return 0

    def ema_param_tensors(self, spec: Any) -> int:
        """Trainable parameter tensors an EMA loop visits (the reference video loop)."""
        raise NotImplementedError(f"architecture {self.name!r} does not count its EMA tensors")

    # --- time ----------------------------------------------------------------------------------

    @abstractmethod
    def gemm_terms(self, spec: Any, b: int) -> GemmTerms:
        """GEMM FLOPs and elementwise bytes (see `GemmTerms`)."""

    @abstractmethod
    def attention_flops(
        self, spec: Any, n: np.ndarray, frames: Any, cm: AttentionPricing
    ) -> tuple[np.ndarray, np.ndarray]:
        """(attention FLOPs, their peak-equivalent work = FLOPs / efficiency) of one layer unit's
        forward, per sample of ``n`` tokens (and ``frames``)."""

    @abstractmethod
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
        """Seconds per layer unit by which memory-bound short attention calls exceed their
        FLOP-priced time (``per_row``: seconds of activation traffic per query row)."""

    @abstractmethod
    def a2a_bytes_per_layer(self, spec: Any, n_r: np.ndarray, sp: Any, b: int) -> np.ndarray:
        """Bytes each rank holds in the all-to-alls of one layer unit's forward."""

    @abstractmethod
    def a2a_bytes_per_token(self, spec: Any, b: int) -> list[float]:
        """Bytes per local token of each all-to-all one layer unit issues in its forward."""

    # --- sizes ---------------------------------------------------------------------------------

    @abstractmethod
    def attention_pairs(self, tokens: np.ndarray, frames: np.ndarray) -> np.ndarray:
        """Query-key pairs a sample's attention computes (the profile fit's quadratic feature)."""

    @abstractmethod
    def bucket_key(self, tokens: int, frames: int) -> tuple[int, int]:
        """The size bucket of a sample (the static bucketing baseline)."""
