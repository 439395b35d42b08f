"""The two models the runtime trains, built from a `ModelSpec`, and their deterministic inputs.

- `LlamaModel` (arch "llama"): decoder with RMSNorm, RoPE, SwiGLU MLP, grouped-query attention,
  untied LM head, causal LM loss. One checkpointing unit = one decoder layer.
- `STDiTModel` (arch "stdit"): a video diffusion transformer in the STDiT3 style. Per block pair:
  a spatial block (self-attention over the S patches of each latent frame) and a temporal block
  (self-attention over the T' frames of each patch); each block also has cross-attention to the
  caption and an MLP. Timestep conditioning is adaLN-style as in STDiT3: a shared
  ``t_block`` maps the timestep embedding to 6 vectors (shift/scale/gate for attention and MLP),
  each block adds its own learned ``scale_shift_table``, one modulation per sample broadcast over
  its rows; an fps embedding is added to the timestep embedding; q and k get a per-head RMSNorm
  (``model.qk_norm``: the reference's fallback or a fused one); self-attention takes the
  reference's path for its length (`STDiTBlock`). Patches of ``in_channels`` latents with
  patch (1, 2, 2) are embedded by a linear layer (equal to a stride=kernel Conv3d); fixed sin-cos
  embeddings of the frame and patch index are added. The final layer predicts noise and variance
  (learned sigma, as STDiT3); the loss is the MSE between the predicted and the true noise on
  every real patch (the variance half gets no loss: no VLB term). One layer unit = one
  spatial+temporal pair; checkpointing it checkpoints each of its two blocks separately, as the
  reference does.

Inputs are synthetic but deterministic: every sample's content (token ids; latents, noise,
timestep and caption) is drawn from a torch Generator seeded by (seed, sample id), so every method
and every rank sees identical data for the same `GlobalBatch`; lengths come from the batch.

Weights: every parameter is initialised from its own generator, seeded by (seed, the parameter's
index in ``named_parameters()``) on the device it lives on, after the model was built on the meta
device (`build_model`), so every rank, any sharding of the parameters and the single-process
reference start from the same weights without building the model twice.

The losses run through ``forward`` (so module hooks, e.g. FSDP's, see every call); the Llama LM
loss is chunked (`dcp_bench.runtime.lm_loss`): no full logits are ever materialised.

Sequence parallelism: a micro-batch on an SP group of P ranks pads each text sample to a multiple
of P and gives rank r the r-th contiguous chunk of every sample (Ulysses); a video sample is
padded to (T'_p, S_p), multiples of P, and rank r holds frames [r T'_p/P, (r+1) T'_p/P) with all
patches (spatial phase) or all frames of patches [r S_p/P, ...) (temporal phase) (DSP). Padding is
never attended and carries zero loss weight. Loss values are *sums* over tokens; the executor
divides by the step's global token count.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from dcp_bench.cost.activations import FUSED_ATTENTION_MIN_LEN, QK_NORMS
from dcp_bench.cost.specs import ModelSpec
from dcp_bench.errors import ConfigError
from dcp_bench.runtime.archs import runtime_arch
from dcp_bench.runtime.attention import (
    PORTABLE,
    SINGLE,
    AttentionKernel,
    SPContext,
    check_heads,
    dense_attention,
    kv_heads_for_sp,
    permuted_all_to_all,
    repeat_kv,
    select_attention_kernel,
    ulysses_heads_to_seq,
    ulysses_qkv_to_heads,
)
from dcp_bench.runtime.lm_loss import IGNORE, chunked_cross_entropy_sum
from dcp_bench.runtime.ring import RingLayout, ring_attention, ring_layout, ring_token_index
from dcp_bench.train_policy import LOGITS_CHUNK_TOKENS

TOKEN_PERIOD = 16  # synthetic text repeats a random 16-token motif (learnable by induction)
NUM_TIMESTEPS = 1000
ROPE_THETA = 10000.0
FPS = 24.0  # the frame-rate condition of every synthetic clip (STDiT3 embeds fps like the timestep)


def sample_generator(seed: int, sample_id: int) -> torch.Generator:
    """The generator of one sample's content: a function of (seed, sample id) only."""
    g = torch.Generator()
    g.manual_seed((int(seed) * 1_000_003 + int(sample_id)) % (2**63 - 1))
    return g


def param_count(model: nn.Module) -> int:
    """Number of parameters (sum of numel over all parameters)."""
    return sum(p.numel() for p in model.parameters())


def _pad_to(n: int, p: int) -> int:
    return -(-n // p) * p


class RuntimeModel(nn.Module, ABC):
    """What the executor needs from a model: build this rank's inputs of a micro-batch, and the
    summed loss over its real tokens (``forward``; ``loss_sum`` calls it)."""

    spec: ModelSpec

    @abstractmethod
    def make_inputs(
        self, sample_ids: Any, tokens: Any, frames: Any, sp: SPContext, seed: int
    ) -> Any:
        """This rank's share of the packed micro-batch (samples in the given order)."""

    @abstractmethod
    def forward(self, inputs: Any, sp: SPContext = SINGLE, ckpt_layers: int = 0) -> Tensor:
        """Sum of the per-token losses over this rank's real tokens (a scalar)."""

    @abstractmethod
    def init_rule(self, name: str) -> tuple[str, float]:
        """How parameter ``name`` starts: ("normal", std), ("ones", 0) or ("zeros", 0)."""

    def loss_sum(self, inputs: Any, sp: SPContext = SINGLE, ckpt_layers: int = 0) -> Tensor:
        """Sum of the per-token losses over this rank's real tokens (a scalar), with the first
        ``ckpt_layers`` layers activation-checkpointed."""
        return self(inputs, sp, ckpt_layers)

    def device(self) -> torch.device:
        return next(self.parameters()).device

    def tie_weights(self) -> None:  # noqa: B027 - a model without shared parameters has none
        """Share the parameters the spec ties again (materialising a meta-device model with
        ``to_empty`` gives every module its own storage)."""

    @property
    def attention(self) -> AttentionKernel:
        """The packed-attention kernel every layer runs (`set_attention`)."""
        return getattr(self, "_attention", PORTABLE)

    def set_attention(self, kernel: AttentionKernel) -> None:
        """Make every attention of the model run ``kernel`` (and its SDPA restrictions)."""
        self._attention = kernel
        for m in self.modules():
            if isinstance(m, (LlamaLayer, GPTLayer, STDiTBlock)):
                m.attention = kernel

    def init_weights(self, seed: int) -> None:
        """Initialise every parameter (see the module docstring): parameter i from a generator on
        its device seeded by (seed, i). A sharded parameter (a DTensor, e.g. under FSDP) gets the
        rows of its local shard of the same full tensor."""
        with torch.no_grad():
            for index, (name, p) in enumerate(self.named_parameters()):
                kind, scale = self.init_rule(name)
                local = p.to_local() if hasattr(p, "to_local") else p
                full_shape = tuple(p.shape)
                if kind == "ones":
                    local.fill_(1.0)
                    continue
                if kind == "zeros":
                    local.zero_()
                    continue
                g = torch.Generator(device=local.device)
                g.manual_seed((int(seed) * 1_000_003 + index) % (2**63 - 1))
                full = torch.empty(full_shape, dtype=torch.float32, device=local.device).normal_(
                    0.0, scale, generator=g
                )
                if local.shape != full.shape:
                    full = _local_rows(p, full)
                local.copy_(full)


def _local_rows(p: Any, full: Tensor) -> Tensor:
    """The rows of ``full`` a dim-0-sharded DTensor ``p`` holds on this rank (FSDP2 shards dim 0
    as ``torch.chunk`` does)."""
    mesh = p.device_mesh
    rank, world = mesh.get_local_rank(), mesh.size()
    chunks = torch.chunk(full, world, dim=0)
    local = chunks[rank] if rank < len(chunks) else full[:0]
    if tuple(local.shape) != tuple(p.to_local().shape):
        raise RuntimeError(
            f"cannot place a parameter of shape {tuple(full.shape)} on shard {rank} of {world}: "
            f"local shape {tuple(p.to_local().shape)}"
        )
    return local


# ---------------------------------------------------------------------------------------------
# Llama-style decoder


@dataclass
class TextShard:
    """One rank's share of a packed text micro-batch."""

    input_ids: Tensor  # (T_local,)
    labels: Tensor  # (T_local,), IGNORE on padding
    positions: Tensor  # (T_local,), position within the sample
    seg_lens: list[int]  # padded length of each sample (the full packed sequence)
    valid: list[int]  # real length of each sample
    full_from_gathered: Tensor  # Ulysses index maps (empty when sp == 1)
    gathered_from_full: Tensor
    ring: RingLayout | None = None  # ring and hybrid SP: the ring layout of the local rows

    @property
    def loss_tokens(self) -> int:
        return int((self.labels != IGNORE).sum())


def text_sample(seed: int, sample_id: int, length: int, vocab: int) -> Tensor:
    """length+1 token ids: inputs are [:length], next-token targets [1:]."""
    g = sample_generator(seed, sample_id)
    motif = torch.randint(0, vocab, (TOKEN_PERIOD,), generator=g)
    ids = motif[torch.arange(length + 1) % TOKEN_PERIOD]
    noise = torch.randint(0, vocab, (length + 1,), generator=g)
    flip = torch.rand(length + 1, generator=g) < 0.1
    return torch.where(flip, noise, ids)


def sp_token_index(padded: int, sp: SPContext) -> Tensor:
    """Positions (within a sample padded to ``padded`` = `sp_padded_length`) of the tokens this
    rank holds, in local order. Ulysses: the rank's contiguous chunk. Ring: chunks ``i`` and
    ``2r-1-i`` of ``2r`` (`dcp_bench.runtime.ring.ring_token_index`). Hybrid: the ring rank's
    two chunks, cut in equal contiguous parts over its Ulysses sub-group."""
    u = sp.ulysses_degree
    if sp.kind == "ulysses":
        c = padded // u
        return torch.arange(sp.rank * c, (sp.rank + 1) * c)
    local = ring_token_index(padded, sp.ring_size, sp.ring_rank)
    c = local.numel() // u
    j = sp.rank % u
    return local[j * c : (j + 1) * c]


def sp_padded_length(length: int, sp: SPContext) -> int:
    """A sample's length padded for ``sp``: a multiple of the group size (Ulysses) or of twice
    the group size (ring and hybrid: 2 x ring size chunks, each cut over the Ulysses part)."""
    return _pad_to(length, sp.size if sp.kind == "ulysses" else 2 * sp.size)


def make_text_shard(
    sample_ids: Any,
    tokens: Any,
    vocab: int,
    sp: SPContext,
    seed: int,
    device: torch.device,
    sample_tokens: Any = None,
) -> TextShard:
    """``sample_tokens(sample_id, length)``: a sample's length+1 token ids (default
    `text_sample`). The rank's tokens of each sample are `sp_token_index`'s; the Ulysses index
    maps span the Ulysses part of ``sp`` (for hybrid SP: the ring rank's share of every
    sample)."""
    U = sp.ulysses_degree
    ids_parts, lab_parts, pos_parts = [], [], []
    seg_lens, valid, chunks = [], [], []
    for sid, length in zip(np.asarray(sample_ids).tolist(), np.asarray(tokens).tolist()):
        seq = (
            text_sample(seed, sid, length, vocab)
            if sample_tokens is None
            else sample_tokens(sid, length)
        )
        padded = sp_padded_length(length, sp)
        ids = torch.zeros(padded, dtype=torch.long)
        ids[:length] = seq[:length]
        lab = torch.full((padded,), IGNORE, dtype=torch.long)
        lab[:length] = seq[1:]
        mine = sp_token_index(padded, sp)
        ids_parts.append(ids[mine])
        lab_parts.append(lab[mine])
        pos_parts.append(mine)
        seg_lens.append(padded)
        valid.append(length)
        chunks.append(mine.numel())
    full_from_gathered = torch.empty(0, dtype=torch.long)
    gathered_from_full = torch.empty(0, dtype=torch.long)
    if U > 1:
        t_loc = sum(chunks)
        fmap = np.empty(t_loc * U, dtype=np.int64)
        full_off = local_off = 0
        for c in chunks:
            for j in range(U):
                fmap[full_off + j * c : full_off + (j + 1) * c] = (
                    j * t_loc + local_off + np.arange(c)
                )
            full_off += c * U
            local_off += c
        inv = np.empty_like(fmap)
        inv[fmap] = np.arange(len(fmap))
        full_from_gathered = torch.from_numpy(fmap).to(device)
        gathered_from_full = torch.from_numpy(inv).to(device)
    ring = None
    if sp.kind != "ulysses":
        ring = ring_layout(seg_lens, valid, sp.ring_rank, sp.ring_ranks)
    return TextShard(
        input_ids=torch.cat(ids_parts).to(device),
        labels=torch.cat(lab_parts).to(device),
        positions=torch.cat(pos_parts).to(device),
        seg_lens=seg_lens,
        valid=valid,
        full_from_gathered=full_from_gathered,
        gathered_from_full=gathered_from_full,
        ring=ring,
    )


def text_sp_attention(
    q: Tensor, k: Tensor, v: Tensor, shard: TextShard, sp: SPContext, kernel: AttentionKernel
) -> Tensor:
    """Causal attention of this rank's tokens of a packed text micro-batch under ``sp``: q
    (T_local, H, D), k and v (T_local, KV, D) -> (T_local, H, D).

    The Ulysses part (the whole group, or a hybrid's sub-group) switches q, k and v to head
    sharding by all-to-all; the ring part (ring or hybrid) then runs `ring_attention` over the
    ring's share of every sample; without a ring, ``kernel`` runs the packed attention."""
    uly = sp.ulysses_part()
    if uly.size > 1:
        # GQA: k and v travel with their KV heads only, repeated only when the group is
        # larger than the number of KV heads (each rank needs whole KV heads).
        heads, kv_heads = q.shape[1], k.shape[1]
        kv = kv_heads_for_sp(heads, kv_heads, uly.size)
        k, v = repeat_kv(k, kv // kv_heads, 1), repeat_kv(v, kv // kv_heads, 1)
        q, k, v = ulysses_qkv_to_heads(q, k, v, uly, shard.full_from_gathered)
    if shard.ring is not None:
        # A pure ring's sends run on its own group's communicator when the pool has one (an
        # aligned block); a hybrid's strided rings, and rings of other sizes, on the default one.
        o = ring_attention(q, k, v, shard.ring, sp.group if sp.kind == "ring" else None)
    else:
        o = kernel(q, k, v, shard.seg_lens, shard.valid, causal=True)
    return ulysses_heads_to_seq(o, uly, shard.gathered_from_full)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return out.type_as(x) * self.weight


def rope_tables(positions: Tensor, head_dim: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    inv_freq = 1.0 / (
        ROPE_THETA
        ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim)
    )
    ang = positions.float()[:, None] * inv_freq[None, :]
    ang = torch.cat([ang, ang], dim=-1)  # (T, head_dim)
    return ang.cos().to(dtype)[:, None, :], ang.sin().to(dtype)[:, None, :]


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class LlamaLayer(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        h, hd = spec.hidden, spec.head_dim
        self.heads, self.kv_heads, self.head_dim = spec.heads, spec.kv_heads, hd
        self.attention = PORTABLE
        self.attn_norm = RMSNorm(h)
        self.q_proj = nn.Linear(h, spec.heads * hd, bias=False)
        self.k_proj = nn.Linear(h, spec.kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(h, spec.kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(spec.heads * hd, h, bias=False)
        self.mlp_norm = RMSNorm(h)
        self.gate_proj = nn.Linear(h, spec.ffn_hidden, bias=False)
        self.up_proj = nn.Linear(h, spec.ffn_hidden, bias=False)
        self.down_proj = nn.Linear(spec.ffn_hidden, h, bias=False)

    def forward(
        self, x: Tensor, shard: TextShard, rope: tuple[Tensor, Tensor], sp: SPContext
    ) -> Tensor:
        t = x.shape[0]
        hn = self.attn_norm(x)
        q = self.q_proj(hn).view(t, self.heads, self.head_dim)
        k = self.k_proj(hn).view(t, self.kv_heads, self.head_dim)
        v = self.v_proj(hn).view(t, self.kv_heads, self.head_dim)
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        o = text_sp_attention(q, k, v, shard, sp, self.attention)
        x = x + self.o_proj(o.reshape(t, self.heads * self.head_dim))
        hn = self.mlp_norm(x)
        return x + self.down_proj(F.silu(self.gate_proj(hn)) * self.up_proj(hn))


class LlamaModel(RuntimeModel):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        if spec.vocab <= 0:
            raise ConfigError(f"model {spec.name!r}: a llama model needs vocab > 0")
        self.spec = spec
        self.embed = nn.Embedding(spec.vocab, spec.hidden)
        self.layers = nn.ModuleList(LlamaLayer(spec) for _ in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden)
        self.lm_head = nn.Linear(spec.hidden, spec.vocab, bias=False)
        self.tie_weights()
        self.loss_chunk_tokens = LOGITS_CHUNK_TOKENS

    def tie_weights(self) -> None:
        if self.spec.tie_embeddings:
            self.lm_head.weight = self.embed.weight

    def init_rule(self, name: str) -> tuple[str, float]:
        return ("ones", 0.0) if name.endswith("norm.weight") else ("normal", 0.02)

    def make_inputs(
        self, sample_ids: Any, tokens: Any, frames: Any, sp: SPContext, seed: int
    ) -> TextShard:
        del frames
        return make_text_shard(sample_ids, tokens, self.spec.vocab, sp, seed, self.device())

    def forward(self, inputs: TextShard, sp: SPContext = SINGLE, ckpt_layers: int = 0) -> Tensor:
        if sp.ulysses_degree > 1:
            check_heads(self.spec.heads, sp.ulysses_degree)
        x = self.embed(inputs.input_ids)
        rope = rope_tables(inputs.positions, self.spec.head_dim, x.dtype)
        for i, layer in enumerate(self.layers):
            if i < ckpt_layers:
                x = checkpoint(layer, x, inputs, rope, sp, use_reentrant=False)
            else:
                x = layer(x, inputs, rope, sp)
        return chunked_cross_entropy_sum(
            self.norm(x), self.lm_head.weight, inputs.labels, self.loss_chunk_tokens
        )


class GPTLayer(nn.Module):
    """A GPT-2 / Megatron decoder layer (`dcp_bench.archs.gpt`): LayerNorm, multi-head attention
    with biased projections, LayerNorm, a biased GELU MLP; no rotary positions."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        h, hd = spec.hidden, spec.head_dim
        self.heads, self.head_dim = spec.heads, hd
        self.attention = PORTABLE
        self.attn_norm = nn.LayerNorm(h)
        self.q_proj = nn.Linear(h, spec.heads * hd)
        self.k_proj = nn.Linear(h, spec.heads * hd)
        self.v_proj = nn.Linear(h, spec.heads * hd)
        self.o_proj = nn.Linear(spec.heads * hd, h)
        self.mlp_norm = nn.LayerNorm(h)
        self.fc1 = nn.Linear(h, spec.ffn_hidden)
        self.fc2 = nn.Linear(spec.ffn_hidden, h)

    def forward(self, x: Tensor, shard: TextShard, sp: SPContext) -> Tensor:
        t = x.shape[0]
        hn = self.attn_norm(x)
        q = self.q_proj(hn).view(t, self.heads, self.head_dim)
        k = self.k_proj(hn).view(t, self.heads, self.head_dim)
        v = self.v_proj(hn).view(t, self.heads, self.head_dim)
        o = text_sp_attention(q, k, v, shard, sp, self.attention)
        x = x + self.o_proj(o.reshape(t, self.heads * self.head_dim))
        return x + self.fc2(F.gelu(self.fc1(self.mlp_norm(x))))


class GPTModel(RuntimeModel):
    """GPT (`dcp_bench.archs.gpt`): token and learned position embeddings, GPT layers, a final
    LayerNorm and an LM head tied to the token embedding unless the spec unties it."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        if spec.vocab <= 0 or spec.learned_positions <= 0:
            raise ConfigError(
                f"model {spec.name!r}: a GPT model needs vocab > 0 and learned_positions > 0"
            )
        self.spec = spec
        self.embed = nn.Embedding(spec.vocab, spec.hidden)
        self.pos_embed = nn.Embedding(spec.learned_positions, spec.hidden)
        self.layers = nn.ModuleList(GPTLayer(spec) for _ in range(spec.num_layers))
        self.norm = nn.LayerNorm(spec.hidden)
        self.lm_head = nn.Linear(spec.hidden, spec.vocab, bias=False)
        self.tie_weights()
        self.loss_chunk_tokens = LOGITS_CHUNK_TOKENS

    def tie_weights(self) -> None:
        if self.spec.tie_embeddings:
            self.lm_head.weight = self.embed.weight

    def init_rule(self, name: str) -> tuple[str, float]:
        if name.endswith("norm.weight"):
            return ("ones", 0.0)
        return ("zeros", 0.0) if name.endswith(".bias") else ("normal", 0.02)

    def make_inputs(
        self, sample_ids: Any, tokens: Any, frames: Any, sp: SPContext, seed: int
    ) -> TextShard:
        del frames
        longest = int(np.max(tokens)) if len(tokens) else 0
        if longest > self.spec.learned_positions:
            raise ConfigError(
                f"model {self.spec.name!r}: a sample of {longest} tokens; its learned position "
                f"table has {self.spec.learned_positions} rows (model.learned_positions)"
            )
        return make_text_shard(sample_ids, tokens, self.spec.vocab, sp, seed, self.device())

    def forward(self, inputs: TextShard, sp: SPContext = SINGLE, ckpt_layers: int = 0) -> Tensor:
        if sp.ulysses_degree > 1:
            check_heads(self.spec.heads, sp.ulysses_degree)
        x = self.embed(inputs.input_ids) + self.pos_embed(inputs.positions)
        for i, layer in enumerate(self.layers):
            if i < ckpt_layers:
                x = checkpoint(layer, x, inputs, sp, use_reentrant=False)
            else:
                x = layer(x, inputs, sp)
        return chunked_cross_entropy_sum(
            self.norm(x), self.lm_head.weight, inputs.labels, self.loss_chunk_tokens
        )


# ---------------------------------------------------------------------------------------------
# STDiT-style video transformer


@dataclass
class VideoShard:
    """One rank's share of a packed video micro-batch, in the spatial (frame-sharded) layout."""

    x_t: Tensor  # (N_local, C*pt*ph*pw) noised latent patches
    target: Tensor  # (N_local, C*pt*ph*pw) the noise to predict
    weight: Tensor  # (N_local,) 1 on real patches, 0 on padding
    frame_idx: Tensor  # (N_local,) global frame index of each row
    patch_idx: Tensor  # (N_local,) patch index within the frame
    sample_of_row: Tensor  # (N_local,) which sample of the micro-batch a row belongs to
    timesteps: Tensor  # (n,)
    captions: Tensor  # (n, text_tokens, text_dim)
    frames: list[int]  # real T' per sample
    spatial: list[int]  # real S per sample
    frames_padded: list[int]
    spatial_padded: list[int]
    to_temporal: tuple[Tensor, Tensor]  # (send order, receive order), empty when sp == 1
    to_spatial: tuple[Tensor, Tensor]

    @property
    def loss_tokens(self) -> int:
        return int(self.weight.sum())

    def sample_rows(self, sp_size: int) -> list[int]:
        """Rows of each sample on this rank, the same in both layouts (T_p/P x S_p or T_p x S_p/P);
        from the shard's sizes rather than the row index (no device sync)."""
        return [fp * spd // sp_size for fp, spd in zip(self.frames_padded, self.spatial_padded)]


def video_sample(
    seed: int, sample_id: int, frames: int, spatial: int, spec: ModelSpec
) -> tuple[Tensor, Tensor, int, Tensor]:
    """(x0 patches (T', S, C*4), noise, timestep, caption (text_tokens, text_dim))."""
    g = sample_generator(seed, sample_id)
    width = spec.in_channels * math.prod(spec.patch)
    x0 = torch.randn(frames, spatial, width, generator=g)
    noise = torch.randn(frames, spatial, width, generator=g)
    t = int(torch.randint(0, NUM_TIMESTEPS, (1,), generator=g))
    caption = torch.randn(max(spec.text_tokens, 1), max(spec.text_dim, 1), generator=g)
    return x0, noise, t, caption


def _dsp_orders(
    tl: list[int], sp_pad: list[int], P: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Index maps between the spatial layout (per sample: tl local frames x S_p patches) and the
    temporal layout (per sample: T_p = tl*P frames x S_p/P patches), both frame-major, samples
    packed in order."""
    offs = np.concatenate([[0], np.cumsum([t * s for t, s in zip(tl, sp_pad)])])
    send_t, recv_t, send_s, recv_s = [], [], [], []
    chunk_q = np.concatenate([[0], np.cumsum([t * (s // P) for t, s in zip(tl, sp_pad)])])
    chunk = int(chunk_q[-1])
    for j in range(P):
        for i, (t, s) in enumerate(zip(tl, sp_pad)):
            sP = s // P
            a, c = np.meshgrid(np.arange(t), np.arange(sP), indexing="ij")
            # spatial -> temporal: rank j gets patches [j sP, (j+1) sP) of my frames.
            send_t.append(offs[i] + a * s + j * sP + c)
            # temporal -> spatial: rank j gets frames [j t, (j+1) t) of my patches.
            send_s.append(offs[i] + (j * t + a) * sP + c)
            buf = j * chunk + chunk_q[i] + a * sP + c
            # received from rank j: its local frames a (global j t + a) of my patch chunk ...
            recv_t.append(np.stack([offs[i] + (j * t + a) * sP + c, buf]))
            # ... or my frames a of its patch chunk j.
            recv_s.append(np.stack([offs[i] + a * s + j * sP + c, buf]))
    n = int(offs[-1])

    def order(parts: list[np.ndarray]) -> np.ndarray:
        pairs = np.concatenate([p.reshape(2, -1) for p in parts], axis=1)
        out = np.empty(n, dtype=np.int64)
        out[pairs[0]] = pairs[1]
        return out

    flat = lambda parts: np.concatenate([p.ravel() for p in parts]).astype(np.int64)  # noqa: E731
    return flat(send_t), order(recv_t), flat(send_s), order(recv_s)


def make_video_shard(
    sample_ids: Any,
    tokens: Any,
    frames: Any,
    spec: ModelSpec,
    sp: SPContext,
    seed: int,
    device: torch.device,
) -> VideoShard:
    P, r = sp.size, sp.rank
    width = spec.in_channels * math.prod(spec.patch)
    xs, tgts, ws, fis, pis, sors = [], [], [], [], [], []
    ts, caps = [], []
    fr_l, sp_l, frp_l, spp_l, tl_l = [], [], [], [], []
    for i, (sid, n, f) in enumerate(
        zip(
            np.asarray(sample_ids).tolist(),
            np.asarray(tokens).tolist(),
            np.asarray(frames).tolist(),
        )
    ):
        s = n // f
        x0, noise, t, cap = video_sample(seed, sid, f, s, spec)
        abar = math.cos(0.5 * math.pi * t / NUM_TIMESTEPS) ** 2
        x_t = math.sqrt(abar) * x0 + math.sqrt(1.0 - abar) * noise
        fp, spd = _pad_to(f, P), _pad_to(s, P)
        tl = fp // P
        xp = torch.zeros(fp, spd, width)
        xp[:f, :s] = x_t
        np_ = torch.zeros(fp, spd, width)
        np_[:f, :s] = noise
        w = torch.zeros(fp, spd)
        w[:f, :s] = 1.0
        rows = slice(r * tl, (r + 1) * tl)
        xs.append(xp[rows].reshape(-1, width))
        tgts.append(np_[rows].reshape(-1, width))
        ws.append(w[rows].reshape(-1))
        fis.append(torch.arange(r * tl, (r + 1) * tl).repeat_interleave(spd))
        pis.append(torch.arange(spd).repeat(tl))
        sors.append(torch.full((tl * spd,), i, dtype=torch.long))
        ts.append(t)
        caps.append(cap)
        fr_l.append(f)
        sp_l.append(s)
        frp_l.append(fp)
        spp_l.append(spd)
        tl_l.append(tl)
    empty = torch.empty(0, dtype=torch.long, device=device)
    to_t = to_s = (empty, empty)
    if P > 1:
        st, rt, ss, rs = _dsp_orders(tl_l, spp_l, P)
        to_t = (torch.from_numpy(st).to(device), torch.from_numpy(rt).to(device))
        to_s = (torch.from_numpy(ss).to(device), torch.from_numpy(rs).to(device))
    return VideoShard(
        x_t=torch.cat(xs).to(device),
        target=torch.cat(tgts).to(device),
        weight=torch.cat(ws).to(device),
        frame_idx=torch.cat(fis).to(device),
        patch_idx=torch.cat(pis).to(device),
        sample_of_row=torch.cat(sors).to(device),
        timesteps=torch.tensor(ts, dtype=torch.float32, device=device),
        captions=torch.stack(caps).to(device),
        frames=fr_l,
        spatial=sp_l,
        frames_padded=frp_l,
        spatial_padded=spp_l,
        to_temporal=to_t,
        to_spatial=to_s,
    )


def sincos_embedding(idx: Tensor, dim: int) -> Tensor:
    """Fixed sinusoidal embedding of integer (or real) positions, (N,) -> (N, dim)."""
    half = dim // 2
    freqs = torch.exp(
        -math.log(10000.0) * torch.arange(half, device=idx.device, dtype=torch.float32) / half
    )
    ang = idx.float()[:, None] * freqs[None, :]
    emb = torch.cat([ang.cos(), ang.sin()], dim=-1)
    if dim % 2:
        emb = F.pad(emb, (0, 1))
    return emb


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int, out: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, out)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


def per_sample(fn: Any, x: Tensor, counts: list[int], *vecs: Tensor) -> Tensor:
    """``fn(rows, *vectors)`` with sample i's row of each (n, h) vector broadcast over its
    ``counts[i]`` consecutive rows of ``x`` (N, h): one vector per sample, never one per row (as
    Open-Sora modulates: ``t2i_modulate`` with (B, 1, C) shift and scale). Samples of equal rows
    are one reshape; otherwise one segment per sample."""
    n = len(counts)
    if all(c == counts[0] for c in counts):
        out = fn(x.reshape(n, counts[0], x.shape[-1]), *(v[:, None] for v in vecs))
        return out.reshape(x.shape[0], -1)
    parts = torch.split(x, counts)
    return torch.cat([fn(p, *(v[i] for v in vecs)) for i, p in enumerate(parts)])


def _modulate(x: Tensor, shift: Tensor, scale: Tensor) -> Tensor:
    return x * (1 + scale) + shift


def _gate(x: Tensor, gate: Tensor) -> Tensor:
    return gate * x


def math_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """The reference's unfused attention on (B, H, n, D) tensors, op for op (VideoSys
    ``videosys/models/modules/attentions.py:111-120``): scaled q, the score matrix in the compute
    dtype, its fp32 softmax cast back, times v. Autograd keeps the scaled q, k and v (contiguous
    copies when they are strided views: the batched matmuls take them so), the fp32 softmax and
    its cast: the materialised n x n scores."""
    scores = (q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)
    return scores.float().softmax(dim=-1).to(q.dtype) @ v


class ReferenceRMSNorm(nn.Module):
    """The q/k norm the reference falls back to without apex (``LlamaRMSNorm``, VideoSys
    ``videosys/models/modules/normalization.py:9-33``): computes on an fp32 copy of its input,
    which autograd keeps (with the fp32 rsqrt per row and the output cast). The copy is made in
    every dtype (in fp32 too), so what is kept never aliases the qkv projection."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        xf = x.to(torch.float32, copy=True)
        out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return out.type_as(x) * self.weight


class _FusedRMSNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, eps: float) -> Tensor:
        xc = x.clone(memory_format=torch.contiguous_format)
        xf = xc.float()
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(xc, weight, rstd)
        return (xf * rstd).to(x.dtype) * weight

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor, None]:
        xc, weight, rstd = ctx.saved_tensors
        xhat = xc.float() * rstd
        gw = grad.float() * weight.float()
        dx = rstd * (gw - xhat * (gw * xhat).mean(-1, keepdim=True))
        dweight = (grad.float() * xhat.to(xc.dtype).float()).reshape(-1, xc.shape[-1]).sum(0)
        return dx.to(xc.dtype), dweight.to(weight.dtype), None


class FusedRMSNorm(ReferenceRMSNorm):
    """A fused q/k norm as apex's ``FusedRMSNorm`` keeps it (what the reference uses when apex is
    installed, ``normalization.py:11-13``): a contiguous copy of the input and an fp32 rstd per
    row, nothing in fp32 of the input's size; the backward recomputes the rest."""

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = _FusedRMSNormFn.apply(x, self.weight, self.eps)
        return out


def qk_norm_class(name: str) -> type[ReferenceRMSNorm]:
    """The q/k RMSNorm of ``model.qk_norm`` (`dcp_bench.cost.activations.QK_NORMS`)."""
    if name not in QK_NORMS:
        raise ConfigError(f"model.qk_norm={name!r}; expected one of {list(QK_NORMS)}")
    return ReferenceRMSNorm if name == "reference" else FusedRMSNorm


class STDiTBlock(nn.Module):
    """One spatial or temporal block: modulated self-attention, cross-attention, modulated MLP.

    As the reference's ``STDiT3Block`` (VideoSys ``open_sora_transformer_3d.py:162-286``): the
    block's six modulation vectors are one per sample (``t`` reshaped to (B, 6, C)), broadcast
    over the sample's rows; self-attention branches on the sequence length as
    ``OpenSoraAttention`` does (``attentions.py:57-66``): a length-1 sequence (an image's temporal
    attention) is its own v, with no q/k norm and no attention; fewer than
    `FUSED_ATTENTION_MIN_LEN` keys run the unfused math path (`math_attention`); longer ones the
    fused kernel."""

    def __init__(self, spec: ModelSpec, temporal: bool) -> None:
        super().__init__()
        h = spec.hidden
        self.temporal = temporal
        self.heads, self.head_dim = spec.heads, spec.head_dim
        self.attention = PORTABLE
        self.norm1 = nn.LayerNorm(h, elementwise_affine=False, eps=1e-6)
        self.qkv = nn.Linear(h, 3 * h)
        norm = qk_norm_class(spec.qk_norm)
        self.q_norm = norm(spec.head_dim, eps=1e-6)  # per-head q/k norm (STDiT3 qk_norm)
        self.k_norm = norm(spec.head_dim, eps=1e-6)
        self.proj = nn.Linear(h, h)
        self.cross_q = nn.Linear(h, h)
        self.cross_kv = nn.Linear(h, 2 * h)
        self.cross_proj = nn.Linear(h, h)
        self.norm2 = nn.LayerNorm(h, elementwise_affine=False, eps=1e-6)
        self.mlp = MLP(h, spec.ffn_hidden, h)
        self.scale_shift_table = nn.Parameter(torch.randn(6, h) / h**0.5)

    def _normed(self, rows: Tensor) -> Tensor:
        """(..., 3, H, D) q/k/v rows -> the same with q and k normed (one stacked tensor)."""
        return torch.stack(
            [self.q_norm(rows[..., 0, :, :]), self.k_norm(rows[..., 1, :, :]), rows[..., 2, :, :]],
            dim=-3,
        )

    def _self_attention(self, x: Tensor, shard: VideoShard, sp: SPContext) -> Tensor:
        n = x.shape[0]
        qkv = self.qkv(x).view(n, 3, self.heads, self.head_dim)
        P = sp.size
        lengths = shard.frames if self.temporal else shard.spatial
        # every sequence attends: norm q and k of all rows at once; else sample by sample, the
        # length-1 ones not at all (the reference norms only what it attends)
        normed_all = min(lengths) > 1
        if normed_all:
            qkv = self._normed(qkv)
        outs = []
        start = 0
        for length, fp, spd in zip(lengths, shard.frames_padded, shard.spatial_padded):
            if self.temporal:  # layout (T_p, S_p/P): attend over the real frames of each patch
                rows, cols = fp, spd // P
            else:  # layout (T_p/P, S_p): attend over the real patches of each frame
                rows, cols = fp // P, spd
            blk = qkv[start : start + rows * cols].view(rows, cols, 3, self.heads, self.head_dim)
            if self.temporal:
                blk = blk.transpose(0, 1)  # (cols, rows=frames, 3, H, D)
                seq_len = rows
            else:
                seq_len = cols
            blk = blk[:, :length]
            if length == 1:
                o = blk[:, :, 2]  # (B, 1, H, D): the reference returns v (attentions.py:65-66)
            else:
                if not normed_all:
                    blk = self._normed(blk)
                q, k, v = (blk[:, :, i].transpose(1, 2) for i in range(3))  # (B, H, len, D)
                if length < FUSED_ATTENTION_MIN_LEN:
                    o = math_attention(q, k, v)
                else:
                    o = dense_attention(q, k, v, fused_only=self.attention.fused_only)
                o = o.transpose(1, 2)  # (B, len, H, D)
            if seq_len > length:
                o = F.pad(o, (0, 0, 0, 0, 0, seq_len - length))
            if self.temporal:
                o = o.transpose(0, 1)
            outs.append(o.reshape(rows * cols, self.heads * self.head_dim))
            start += rows * cols
        return self.proj(torch.cat(outs, dim=0))

    def _cross_attention(
        self, x: Tensor, shard: VideoShard, caption_h: Tensor, sp: SPContext
    ) -> Tensor:
        n = x.shape[0]
        q = self.cross_q(x).view(n, self.heads, self.head_dim)
        kv = self.cross_kv(caption_h)  # (n_samples, L_text, 2h)
        outs = []
        start = 0
        for i, cnt in enumerate(shard.sample_rows(sp.size)):
            if cnt == 0:
                continue
            # 4-D (1, H, n, D): SDPA's fused kernels take no 3-D input
            qi = q[start : start + cnt].transpose(0, 1).unsqueeze(0)
            k, v = (
                t.transpose(0, 1).unsqueeze(0)
                for t in kv[i].view(-1, 2, self.heads, self.head_dim).unbind(1)
            )
            o = dense_attention(qi, k, v, fused_only=self.attention.fused_only)[0]
            outs.append(o.transpose(0, 1).reshape(cnt, -1))
            start += cnt
        return self.cross_proj(torch.cat(outs, dim=0))

    def forward(
        self, x: Tensor, shard: VideoShard, t_mod: Tensor, caption_h: Tensor, sp: SPContext
    ) -> Tensor:
        """``t_mod``: (samples, 6, h), one modulation per sample of the micro-batch."""
        mod = t_mod + self.scale_shift_table[None]  # (n, 6, h)
        if max(shard.frames if self.temporal else shard.spatial) <= 1:
            # no sequence attends (the length-1 branch): the q/k norms get zero gradients, not
            # none, so every rank of a sharded run reduces the same parameters
            mod = mod + 0.0 * (self.q_norm.weight.sum() + self.k_norm.weight.sum())
        shift_a, scale_a, gate_a, shift_m, scale_m, gate_m = mod.unbind(1)  # 6 x (n, h)
        counts = shard.sample_rows(sp.size)
        h = per_sample(_modulate, self.norm1(x), counts, shift_a, scale_a)
        x = x + per_sample(_gate, self._self_attention(h, shard, sp), counts, gate_a)
        x = x + self._cross_attention(x, shard, caption_h, sp)
        h = per_sample(_modulate, self.norm2(x), counts, shift_m, scale_m)
        return x + per_sample(_gate, self.mlp(h), counts, gate_m)


class STDiTPair(nn.Module):
    """One layer unit: a spatial block, the switch to patch sharding, a temporal block, the switch
    back (DSP). Checkpointed, each block is its own checkpoint (cross-attention inside it), as the
    reference checkpoints STDiT3 (VideoSys ``open_sora_transformer_3d.py:610-611``,
    ``core/dcp/recompute.py:141-151``): two block inputs are kept, the all-to-alls between them
    are not recomputed."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spatial = STDiTBlock(spec, temporal=False)
        self.temporal = STDiTBlock(spec, temporal=True)

    def forward(
        self,
        x: Tensor,
        shard: VideoShard,
        t_mod: Tensor,
        caption_h: Tensor,
        sp: SPContext,
        checkpointed: bool = False,
    ) -> Tensor:
        """``t_mod``: (samples, 6, h), the per-sample timestep modulation both blocks take."""
        if checkpointed:
            x = checkpoint(self.spatial, x, shard, t_mod, caption_h, sp, use_reentrant=False)
        else:
            x = self.spatial(x, shard, t_mod, caption_h, sp)
        x = permuted_all_to_all(x, sp, *shard.to_temporal)
        if checkpointed:
            x = checkpoint(self.temporal, x, shard, t_mod, caption_h, sp, use_reentrant=False)
        else:
            x = self.temporal(x, shard, t_mod, caption_h, sp)
        return permuted_all_to_all(x, sp, *shard.to_spatial)


class STDiTModel(RuntimeModel):
    FREQ_DIM = 256  # sinusoidal timestep features before the timestep MLP

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        h = spec.hidden
        width = spec.in_channels * math.prod(spec.patch)
        self.x_embed = nn.Linear(width, h)
        self.t_embed = MLP(self.FREQ_DIM, h, h)
        self.fps_embed = MLP(self.FREQ_DIM, h, h)
        self.t_block = nn.Linear(h, 6 * h)
        self.y_embed = MLP(max(spec.text_dim, 1), h, h)
        self.pairs = nn.ModuleList(STDiTPair(spec) for _ in range(spec.num_layers))
        self.final_norm = nn.LayerNorm(h, elementwise_affine=False, eps=1e-6)
        self.final_table = nn.Parameter(torch.randn(2, h) / h**0.5)
        # Noise and variance outputs as in STDiT3 (learned sigma); the loss uses the noise half.
        self.final_linear = nn.Linear(h, 2 * width)

    def init_rule(self, name: str) -> tuple[str, float]:
        if name.endswith(("scale_shift_table", "final_table")):
            return "normal", self.spec.hidden**-0.5
        if name.endswith("norm.weight"):  # the per-head q/k RMSNorms
            return "ones", 0.0
        return ("zeros", 0.0) if name.endswith(".bias") else ("normal", 0.02)

    def make_inputs(
        self, sample_ids: Any, tokens: Any, frames: Any, sp: SPContext, seed: int
    ) -> VideoShard:
        return make_video_shard(sample_ids, tokens, frames, self.spec, sp, seed, self.device())

    def forward(self, inputs: VideoShard, sp: SPContext = SINGLE, ckpt_layers: int = 0) -> Tensor:
        if sp.kind != "ulysses":
            raise ConfigError(
                f"{sp.kind} sequence parallelism runs text models; a video model shards by DSP "
                "(sp_kind=ulysses)"
            )
        if sp.size > 1:
            check_heads(self.spec.heads, sp.size)
        h = self.spec.hidden
        x = self.x_embed(inputs.x_t.to(self.x_embed.weight.dtype))  # latents come in fp32
        x = (
            x
            + sincos_embedding(inputs.frame_idx, h).to(x.dtype)
            + sincos_embedding(inputs.patch_idx, h).to(x.dtype)
        )
        t_emb = self.t_embed(
            sincos_embedding(inputs.timesteps, self.FREQ_DIM).to(x.dtype)
        )  # (n, h)
        fps = torch.full_like(inputs.timesteps, FPS)
        t_emb = t_emb + self.fps_embed(sincos_embedding(fps, self.FREQ_DIM).to(x.dtype))
        # one modulation per sample (the reference's t_mlp, (B, 6h)), broadcast over its rows in
        # every block, in both layouts (a sample's rows are consecutive in each)
        t_mod = self.t_block(F.silu(t_emb)).view(-1, 6, h)  # (n, 6, h)
        caption_h = self.y_embed(inputs.captions.to(x.dtype))
        for i, pair in enumerate(self.pairs):
            x = pair(x, inputs, t_mod, caption_h, sp, checkpointed=i < ckpt_layers)
        shift, scale = (self.final_table[None] + t_emb[:, None]).unbind(1)  # (n, h) each
        counts = inputs.sample_rows(sp.size)
        out = self.final_linear(per_sample(_modulate, self.final_norm(x), counts, shift, scale))
        noise_pred = out[:, : inputs.target.shape[1]]
        per_row = (noise_pred.float() - inputs.target.float()).pow(2).mean(-1)
        return (per_row * inputs.weight).sum()


def build_model(
    spec: ModelSpec,
    seed: int = 0,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    attention: str = "auto",
    empty: RuntimeModel | None = None,
) -> RuntimeModel:
    """The model a spec describes, built on the meta device, materialised on ``device`` and
    initialised from ``seed`` there (`RuntimeModel.init_weights`: identical on every rank and for
    any sharding), in ``dtype``, with the attention kernel `select_attention_kernel` picks for the
    device and dtype (``attention``: auto or a kernel name). ``device="meta"`` returns the
    unmaterialised model (parameter counts). ``empty``: the meta-device model to materialise
    instead of `build_empty_model`'s (another library's model,
    `dcp_bench.runtime.integrations.models.library_empty_model`)."""
    model = build_empty_model(spec) if empty is None else empty
    dev = torch.device(device)
    if dev.type == "meta":
        return model.to(dtype=dtype)
    model = model.to_empty(device=dev)
    model.tie_weights()
    model.init_weights(seed)  # in fp32, so a 16-bit model is its fp32 master weights rounded
    model = model.to(dtype=dtype)
    model.set_attention(select_attention_kernel(dev, dtype, spec.head_dim, attention))
    return model


def build_empty_model(spec: ModelSpec) -> RuntimeModel:
    """The model of ``spec`` on the meta device in fp32 (no memory, no initialisation)."""
    entry = runtime_arch(spec)  # the registry names the module class of each architecture
    with torch.device("meta"):
        model = entry.build(spec)
    assert isinstance(model, RuntimeModel), entry.model_class
    return model
