"""Data-Centric Parallel for the Wan video transformer of ``diffusers`` (``WanTransformer3DModel``),
through public extension points only: the library's attention-processor interface
(``set_attn_processor``) and torch module hooks.

A Wan block attends over all F' x H' x W' latent patches of a clip at once (full 3-D attention),
then cross-attends to the caption. Ulysses sequence parallelism over a micro-batch's SP group of P
ranks:

- the token sequence of a clip is padded to a multiple of P and rank r keeps the r-th contiguous
  chunk: a forward pre-hook on the first block splits the hidden states, a forward hook on the
  rotary module splits the rotary tables (the model computes both for the whole clip);
- `UlyssesWanProcessor` (the self-attention processor of every block) projects q, k, v of the
  local tokens, applies the model's q/k norms and rotary tables, switches q, k, v to head sharding
  with the runtime's all-to-all (`dcp_bench.runtime.attention`), attends over the clip's real
  tokens (padding neither attends nor is attended) and switches back. Cross-attention keeps the
  library's own processor: local queries against the whole caption need no exchange;
- a forward hook on the output projection gathers the tokens again, so the model returns the
  whole clip (the gather's backward keeps this rank's rows: each rank's loss covers its own tokens).

The loss is the flow-matching loss Wan trains with, on random latents: x_t = (1 - s) x0 + s noise
with s = t / 1000, target noise - x0, the squared error summed over this rank's tokens (a token =
one latent patch, all its channels). Several clips in a micro-batch run one forward each (the model
takes one clip shape per call). Checkpointing: the model's own all-or-nothing switch
(``enable_gradient_checkpointing``, given a checkpoint function that restores the micro-batch for
the recompute): a partly recomputed micro-batch recomputes every block.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from dcp_bench.cost.specs import ModelSpec
from dcp_bench.errors import ConfigError
from dcp_bench.runtime.attention import (
    PORTABLE,
    SINGLE,
    AttentionKernel,
    SPContext,
    check_heads,
    ulysses_heads_to_seq,
    ulysses_qkv_to_heads,
    varlen_attention,
)
from dcp_bench.runtime.integrations import require
from dcp_bench.runtime.models import NUM_TIMESTEPS, sample_generator


@dataclass
class ClipShard:
    """One clip of a micro-batch as this rank runs it (inputs of the whole clip, its shard
    geometry)."""

    latents: Tensor  # (1, C, F, H, W)
    noise: Tensor
    timestep: Tensor  # (1,)
    caption: Tensor  # (1, L, text_dim)
    tokens: int  # F' H' W' latent patches
    padded: int  # tokens padded to a multiple of the SP degree


@dataclass
class _Active:
    sp: SPContext
    clip: ClipShard
    kernel: AttentionKernel

    @property
    def local(self) -> int:
        return self.clip.padded // self.sp.size

    def split(self, x: Tensor) -> Tensor:
        """(B, N, ...) -> this rank's chunk of the padded sequence."""
        pad = self.clip.padded - x.shape[1]
        if pad:
            x = torch.cat([x, x.new_zeros((x.shape[0], pad, *x.shape[2:]))], dim=1)
        r = self.sp.rank
        return x[:, r * self.local : (r + 1) * self.local]


class _GatherSeq(torch.autograd.Function):
    """All-gather of equal (N_local, ...) chunks along dim 0; backward keeps this rank's rows."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, sp: SPContext) -> Tensor:  # type: ignore[override]
        ctx.rank, ctx.n = sp.rank, x.shape[0]
        parts = [torch.empty_like(x) for _ in range(sp.size)]
        dist.all_gather(parts, x.contiguous(), group=sp.group)
        return torch.cat(parts, dim=0)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        return grad[ctx.rank * ctx.n : (ctx.rank + 1) * ctx.n].contiguous(), None


def _rotate_pairs(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary positions on (even, odd) channel pairs with the model's (cos, sin) tables, the layout
    Wan's tables are built for (checked against the library's processor by the tests)."""
    even, odd = x[..., 0::2], x[..., 1::2]
    c, s = cos[..., 0::2], sin[..., 1::2]
    return torch.stack((even * c - odd * s, even * s + odd * c), dim=-1).flatten(-2).type_as(x)


class UlyssesWanProcessor:
    """Self-attention processor of a Wan block: Ulysses over the adapter's current micro-batch."""

    def __init__(self, adapter: WanAdapter) -> None:
        self.adapter = adapter

    def __call__(
        self,
        attn: Any,
        hidden_states: Tensor,
        encoder_hidden_states: Tensor | None = None,
        attention_mask: Tensor | None = None,
        rotary_emb: tuple[Tensor, Tensor] | None = None,
    ) -> Tensor:
        active = self.adapter.active
        if active is None:
            raise ConfigError(
                "UlyssesWanProcessor ran without a DCP micro-batch: run the model through "
                "WanAdapter.loss_sum"
            )
        if encoder_hidden_states is not None or attention_mask is not None:
            raise ConfigError("UlyssesWanProcessor serves self-attention without a mask only")
        if hidden_states.shape[0] != 1:
            raise ConfigError(
                f"UlyssesWanProcessor: batch of {hidden_states.shape[0]} clips; expected 1 per call"
            )
        q, k, v = attn.to_q(hidden_states), attn.to_k(hidden_states), attn.to_v(hidden_states)
        q, k = attn.norm_q(q), attn.norm_k(k)
        q, k, v = (t.unflatten(2, (attn.heads, -1)) for t in (q, k, v))
        if rotary_emb is not None:
            q, k = _rotate_pairs(q, *rotary_emb), _rotate_pairs(k, *rotary_emb)
        q, k, v = q[0], k[0], v[0]
        sp, clip = active.sp, active.clip
        order = torch.arange(clip.padded, device=q.device)  # one clip: rank-major = sequence order
        q, k, v = ulysses_qkv_to_heads(q, k, v, sp, order)
        out = varlen_attention(
            q, k, v, [clip.padded], [clip.tokens], causal=False, kernel=active.kernel
        )
        out = ulysses_heads_to_seq(out, sp, order).flatten(1, 2)[None].type_as(hidden_states)
        return attn.to_out[1](attn.to_out[0](out))


def _grid(spatial: int) -> tuple[int, int]:
    """(H', W') patches of a frame of ``spatial`` patches: the most nearly square factorisation."""
    h = max(d for d in range(1, math.isqrt(spatial) + 1) if spatial % d == 0)
    return h, spatial // h


class WanAdapter:
    """A diffusers ``WanTransformer3DModel`` as DataCentricParallel runs it (see the module
    docstring). ``sample_clip(sample_id, frames, patches_per_frame)``: a sample's (latents (1, C,
    F, H, W), noise, timestep (1,), caption (1, L, text_dim)); when None, random ones drawn per
    (seed, sample id) with ``caption_tokens`` caption tokens. ``spec``: the cost model's spec
    (`spec_of`, priced as an STDiT-style video transformer when None)."""

    def __init__(
        self,
        model: Any,
        sample_clip: Callable[[int, int, int], tuple[Tensor, ...]] | None = None,
        spec: ModelSpec | None = None,
        caption_tokens: int = 16,
        kernel: AttentionKernel | None = None,
    ) -> None:
        diffusers = require("diffusers")
        name = type(model).__name__
        if not isinstance(model, diffusers.WanTransformer3DModel):
            raise ConfigError(
                f"{name} is not a diffusers WanTransformer3DModel; the video adapter serves Wan "
                "only"
            )
        cfg = model.config
        if cfg.image_dim is not None or cfg.added_kv_proj_dim is not None:
            raise ConfigError(
                f"{name}: image conditioning (image_dim / added_kv_proj_dim) is not supported"
            )
        blocks = list(model.blocks)
        if not blocks or any(getattr(b.attn1, "fused_projections", False) for b in blocks):
            raise ConfigError(
                f"{name}: no blocks, or fused q/k/v projections; expected separate to_q/to_k/to_v"
            )
        self.model: Any = model
        self.spec = spec if spec is not None else spec_of(model, caption_tokens=caption_tokens)
        self.caption_tokens = caption_tokens
        self.sample_clip = sample_clip
        self.kernel = kernel
        self.active: _Active | None = None
        self._checkpointing: bool | None = None
        processors = dict(model.attn_processors)
        mine = UlyssesWanProcessor(self)
        model.set_attn_processor(
            {k: (mine if k.endswith("attn1.processor") else p) for k, p in processors.items()}
        )
        model.rope.register_forward_hook(self._split_rope)
        blocks[0].register_forward_pre_hook(self._split_tokens)
        model.proj_out.register_forward_hook(self._gather_tokens)

    def _checkpoint(self, block: Callable[..., Any], *args: Any) -> Any:
        """The model's checkpoint function: the recompute (in backward, after `loss_sum` returned)
        runs with the micro-batch the forward ran with."""
        active = self.active

        def run(*inner: Any) -> Any:
            previous, self.active = self.active, active
            try:
                return block(*inner)
            finally:
                self.active = previous

        return checkpoint(run, *args, use_reentrant=False)

    # -- hooks (pass-through outside loss_sum)
    def _split_rope(self, module: nn.Module, args: Any, out: Any) -> Any:
        if self.active is None:
            return out
        return tuple(self.active.split(t) for t in out)

    def _split_tokens(self, module: nn.Module, args: tuple[Any, ...]) -> Any:
        if self.active is None:
            return None
        return (self.active.split(args[0]), *args[1:])

    def _gather_tokens(self, module: nn.Module, args: Any, out: Tensor) -> Any:
        active = self.active
        if active is None:
            return None
        full = out[0] if active.sp.size == 1 else _GatherSeq.apply(out[0], active.sp)
        return full[: active.clip.tokens][None]

    # -- the adapter interface
    def make_inputs(
        self, sample_ids: Any, tokens: Any, frames: Any, sp: SPContext, seed: int
    ) -> list[ClipShard]:
        """Every clip of the micro-batch (each rank of the group builds the same inputs; the hooks
        shard them): random latents, noise, timestep and caption drawn per (seed, sample id)."""
        cfg = self.model.config
        device = next(self.model.parameters()).device
        pt, ph, pw = cfg.patch_size
        out = []
        for sid, n, f in zip(
            np.asarray(sample_ids).tolist(),
            np.asarray(tokens).tolist(),
            np.asarray(frames).tolist(),
        ):
            if n % f:
                raise ConfigError(
                    f"sample {sid}: {n} tokens not a whole number of patches per frame over {f} "
                    "frames"
                )
            if self.sample_clip is not None:
                x0, noise, t, caption = self.sample_clip(sid, f, n // f)
                out.append(
                    ClipShard(
                        x0.to(device),
                        noise.to(device),
                        t.to(device),
                        caption.to(device),
                        int(n),
                        -(-int(n) // sp.size) * sp.size,
                    )
                )
                continue
            hh, ww = _grid(n // f)
            g = sample_generator(seed, sid)
            shape = (1, cfg.in_channels, f * pt, hh * ph, ww * pw)
            x0 = torch.randn(shape, generator=g)
            noise = torch.randn(shape, generator=g)
            t = torch.randint(0, NUM_TIMESTEPS, (1,), generator=g)
            caption = torch.randn(1, self.caption_tokens, cfg.text_dim, generator=g)
            out.append(
                ClipShard(
                    x0.to(device),
                    noise.to(device),
                    t.to(device),
                    caption.to(device),
                    int(n),
                    -(-int(n) // sp.size) * sp.size,
                )
            )
        return out

    def clip_loss(self, clip: ClipShard) -> Tensor:
        """The model's flow-matching squared error of one clip, per latent patch (F', H', W')."""
        s = clip.timestep.float() / NUM_TIMESTEPS
        x_t = (1 - s) * clip.latents + s * clip.noise
        pred = self.model(
            hidden_states=x_t,
            timestep=clip.timestep,
            encoder_hidden_states=clip.caption,
            return_dict=False,
        )[0]
        err = (
            (pred.float() - (clip.noise - clip.latents).float()).square().sum(dim=(0, 1))
        )  # (F, H, W)
        pt, ph, pw = self.model.config.patch_size
        f, h, w = err.shape
        return err.reshape(f // pt, pt, h // ph, ph, w // pw, pw).sum(dim=(1, 3, 5))

    def loss_sum(
        self, inputs: list[ClipShard], sp: SPContext = SINGLE, ckpt_layers: int = 0
    ) -> Tensor:
        """Summed loss over this rank's tokens of every clip (see the module docstring)."""
        if sp.kind != "ulysses":
            raise ConfigError(
                f"{sp.kind} sequence parallelism runs text models; a diffusers video model "
                "shards by heads (sp_kind=ulysses)"
            )
        if sp.size > 1:
            check_heads(int(self.model.config.num_attention_heads), sp.size)
        on = ckpt_layers > 0
        if on != self._checkpointing:
            if on:
                self.model.enable_gradient_checkpointing(
                    gradient_checkpointing_func=self._checkpoint
                )
            else:
                self.model.disable_gradient_checkpointing()
            self._checkpointing = on
        kernel = self.kernel or PORTABLE
        total = torch.zeros((), device=next(self.model.parameters()).device)
        for clip in inputs:
            self.active = _Active(sp, clip, kernel)
            try:
                per_token = self.clip_loss(clip).reshape(-1)
            finally:
                self.active = None
            lo = sp.rank * (clip.padded // sp.size)
            total = total + per_token[lo : min(lo + clip.padded // sp.size, clip.tokens)].sum()
        return total


def spec_of(model: Any, caption_tokens: int = 16, name: str = "wan") -> ModelSpec:
    """The cost model's spec of a Wan transformer: the ``wan`` architecture
    (`dcp_bench.archs.wan`: full 3-D attention over each clip, one unit per block)."""
    cfg = model.config
    heads, head_dim = int(cfg.num_attention_heads), int(cfg.attention_head_dim)
    return ModelSpec(
        name=name,
        arch="wan",
        num_layers=int(cfg.num_layers),
        hidden=heads * head_dim,
        heads=heads,
        kv_heads=heads,
        ffn_hidden=int(cfg.ffn_dim),
        in_channels=int(cfg.in_channels),
        patch=(int(cfg.patch_size[0]), int(cfg.patch_size[1]), int(cfg.patch_size[2])),
        text_tokens=caption_tokens,
        text_dim=int(cfg.text_dim),
        dtype="fp32",
        sources={"architecture": "diffusers WanTransformer3DModel config (arch wan)"},
    )


def build_wan(config: dict[str, Any], seed: int | None = None) -> Any:
    """A Wan transformer from its config keys (weights as the library initialises them; under
    ``torch.manual_seed(seed)`` when given)."""
    diffusers = require("diffusers")
    if seed is not None:
        torch.manual_seed(seed)
    return diffusers.WanTransformer3DModel(**config)
