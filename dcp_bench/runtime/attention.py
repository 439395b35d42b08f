"""Attention kernels and the sequence-parallel exchanges that feed them.

- `varlen_attention`: packed variable-length self-attention. Each packed segment may end in
  padding (Ulysses pads a sample to a multiple of the SP degree); only the first ``valid`` tokens
  of a segment are attended and attend, padding rows come back as zeros. flash-attn's varlen
  kernel is used on CUDA (fp16/bf16) when importable; otherwise PyTorch SDPA in a loop over
  segments, which on CPU is exact and the fastest choice (a block-diagonal mask is O(T^2)).
- `SPContext`: the group a micro-batch runs on (no global "current group": it is passed down).
- `all_to_all`: `dist.all_to_all_single` as an autograd Function (its backward is the same
  exchange of the gradient, in the opposite direction).
- `ulysses_seq_to_heads` / `ulysses_heads_to_seq`: Ulysses' switch between sequence sharding and
  head sharding for packed, padded samples.
- `permuted_all_to_all`: a token re-sharding (used by DSP to switch a video sample between
  frame sharding and patch sharding).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from dcp_bench.errors import ConfigError


@dataclass(frozen=True)
class SPContext:
    """The sequence-parallel group a micro-batch runs on: ``size`` ranks, this rank's index in it,
    and the process group (None for a group of one)."""

    size: int = 1
    rank: int = 0
    group: Any = None

    def __post_init__(self) -> None:
        if self.size > 1 and self.group is None:
            raise ValueError("an SP group of more than one rank needs a process group")


SINGLE = SPContext()


def _flash_varlen() -> Any:
    try:
        from flash_attn import flash_attn_varlen_func  # type: ignore[import-not-found]
    except ImportError:
        return None
    return flash_attn_varlen_func


def varlen_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    seg_lens: list[int],
    valid: list[int],
    causal: bool,
) -> Tensor:
    """Attention over packed segments.

    q, k, v: (T, H, D) with T = sum(seg_lens) (k and v already expanded to H heads). Segment i
    holds ``seg_lens[i]`` rows of which the first ``valid[i]`` are real tokens. Returns (T, H, D);
    no token attends across a segment boundary or to padding; padding rows are zero.
    """
    if q.is_cuda and q.dtype in (torch.float16, torch.bfloat16):
        flash = _flash_varlen()
        if flash is not None:
            return _flash_path(flash, q, k, v, seg_lens, valid, causal)
    outs: list[Tensor] = []
    start = 0
    for seg, n in zip(seg_lens, valid):
        if n > 0:
            qs = q[start : start + n].transpose(0, 1)
            ks = k[start : start + n].transpose(0, 1)
            vs = v[start : start + n].transpose(0, 1)
            outs.append(F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal).transpose(0, 1))
        if seg > n:
            outs.append(q.new_zeros((seg - n, q.shape[1], q.shape[2])))
        start += seg
    return torch.cat(outs, dim=0)


def _flash_path(
    flash: Any, q: Tensor, k: Tensor, v: Tensor, seg_lens: list[int], valid: list[int], causal: bool
) -> Tensor:
    # Compact the real tokens, run the varlen kernel on cumulative offsets, scatter back.
    idx_parts = []
    start = 0
    for seg, n in zip(seg_lens, valid):
        idx_parts.append(torch.arange(start, start + n, device=q.device))
        start += seg
    idx = torch.cat(idx_parts)
    lens = torch.tensor(valid, device=q.device, dtype=torch.int32)
    cu = F.pad(torch.cumsum(lens, 0, dtype=torch.int32), (1, 0))
    max_len = int(max(valid)) if valid else 0
    o = flash(q[idx], k[idx], v[idx], cu, cu, max_len, max_len, causal=causal)
    out = q.new_zeros(q.shape)
    return out.index_copy(0, idx, o)


class _AllToAll(torch.autograd.Function):
    """``dist.all_to_all_single`` with equal splits along dim 0; its gradient is the same exchange
    run on the output gradient (chunk j came from rank j, so its gradient goes back to rank j)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, group: Any) -> Tensor:  # type: ignore[override]
        ctx.group = group
        x = x.contiguous()
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        grad = grad.contiguous()
        out = torch.empty_like(grad)
        dist.all_to_all_single(out, grad, group=ctx.group)
        return out, None


def all_to_all(x: Tensor, sp: SPContext) -> Tensor:
    """Exchange dim-0 chunk j of ``x`` with rank j of the group (differentiable)."""
    if sp.size == 1:
        return x
    return _AllToAll.apply(x, sp.group)


def check_heads(heads: int, sp: int) -> None:
    """Ulysses and DSP shard attention heads over the group: the head count must divide."""
    if heads % sp:
        raise ConfigError(
            f"attention heads {heads} not divisible by the sequence-parallel degree {sp}; "
            "use an SP degree that divides the head count"
        )


def ulysses_seq_to_heads(x: Tensor, sp: SPContext, full_from_gathered: Tensor) -> Tensor:
    """(T_local, H, D) sharded by sequence -> (T_full, H/sp, D) sharded by heads.

    ``full_from_gathered`` (T_full,) maps each position of the full packed sequence to its row in
    the gathered buffer (rank-major: rank j's local tokens at rows j*T_local ...).
    """
    if sp.size == 1:
        return x
    t_loc, heads, dim = x.shape
    check_heads(heads, sp.size)
    send = x.view(t_loc, sp.size, heads // sp.size, dim).transpose(0, 1)
    got = all_to_all(send, sp).reshape(sp.size * t_loc, heads // sp.size, dim)
    return got.index_select(0, full_from_gathered)


def ulysses_heads_to_seq(y: Tensor, sp: SPContext, gathered_from_full: Tensor) -> Tensor:
    """Inverse of `ulysses_seq_to_heads`: (T_full, H/sp, D) -> (T_local, H, D)."""
    if sp.size == 1:
        return y
    t_full, h, dim = y.shape
    t_loc = t_full // sp.size
    send = y.index_select(0, gathered_from_full).view(sp.size, t_loc, h, dim)
    got = all_to_all(send, sp)  # chunk j: head slice j of this rank's tokens
    return got.transpose(0, 1).reshape(t_loc, sp.size * h, dim)


def permuted_all_to_all(x: Tensor, sp: SPContext, send_order: Tensor, recv_order: Tensor) -> Tensor:
    """Re-shard tokens: rows ``send_order`` of ``x`` (N, C) are sent in sp equal chunks (chunk j to
    rank j); the received rows are put in layout order by ``recv_order``."""
    if sp.size == 1:
        return x
    n, c = x.shape
    send = x.index_select(0, send_order).view(sp.size, n // sp.size, c)
    got = all_to_all(send, sp).view(n, c)
    return got.index_select(0, recv_order)
