"""Attention kernels and the sequence-parallel exchanges that feed them.

- `AttentionKernel` / `select_attention_kernel`: packed variable-length self-attention. Each
  packed segment may end in padding (Ulysses pads a sample to a multiple of the SP degree); only
  the first ``valid`` tokens of a segment are attended and attend, padding rows come back as
  zeros. Keys and values may have fewer heads than queries (grouped-query attention: query head i
  reads KV head ``i // (H / KV)``). Kernels, best first on CUDA in 16-bit:
  ``flash_attn`` (flash-attn's varlen kernel, when importable), ``torch_varlen``
  (``torch.nn.attention.varlen.varlen_attn``, PyTorch's own flash varlen kernel: no extra
  package), ``sdpa`` (one ``scaled_dot_product_attention`` call per segment on 4-D (1, H, n, D)
  tensors with ``enable_gqa``). ``sdpa`` is the CPU kernel: measured there, the per-segment loop
  is the fastest exact choice (``scripts/attention_variants.py``; 3-D inputs leave SDPA only its
  math kernel, 2.5-5x slower and O(n^2) memory; a block-diagonal mask, padded batches and nested
  tensors are slower still). On CUDA the SDPA calls are restricted to the fused kernels (flash,
  memory-efficient, cuDNN), so a shape no fused kernel takes fails loudly instead of silently
  allocating an n x n fp32 score matrix.
- `dense_attention`: one 4-D SDPA call (STDiT's spatial, temporal and cross-attention).
- `SPContext`: the group a micro-batch runs on (no global "current group": it is passed down).
- `all_to_all`: `dist.all_to_all_single` as an autograd Function (its backward is the same
  exchange of the gradient, in the opposite direction).
- `ulysses_qkv_to_heads`: Ulysses' switch of q, k and v from sequence sharding to head sharding in
  one exchange, k and v with their KV heads only (repeated only when the group is larger than the
  number of KV heads: `kv_heads_for_sp`); `ulysses_seq_to_heads` / `ulysses_heads_to_seq` switch
  one tensor.
- `permuted_all_to_all`: a token re-sharding (used by DSP to switch a video sample between
  frame sharding and patch sharding).
"""

from __future__ import annotations

import contextlib
import inspect
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

try:
    from torch.nn.attention.varlen import varlen_attn
except ImportError:  # not in older torch releases; the torch_varlen kernel is then unavailable
    varlen_attn = None  # type: ignore[assignment]

from dcp_bench.errors import ConfigError
from dcp_bench.layout import SP_KINDS

KERNELS = ("sdpa", "torch_varlen", "flash_attn")


@dataclass(frozen=True)
class SPContext:
    """The sequence-parallel group a micro-batch runs on: ``size`` ranks, this rank's index in it,
    and the process group (None for a group of one).

    ``kind`` says how attention is split over the group (`SP_KINDS`):

    - ``ulysses``: all-to-all over heads across the whole group (``group``);
    - ``ring``: ring attention (`dcp_bench.runtime.ring`) across the whole group; ``ring_ranks``
      are the group's global ranks in ring order; no process group is needed beyond the
      default one (point-to-point only), so any number of ranks works;
    - ``hybrid``: Ulysses inside sub-groups of ``ulysses_size`` consecutive ranks
      (``ulysses_group``, this rank's sub-group), ring across the sub-groups: ``ring_ranks``
      are the global ranks with this rank's index in their sub-group, one per sub-group.
    """

    size: int = 1
    rank: int = 0
    group: Any = None
    kind: str = "ulysses"
    ulysses_size: int = 0
    ulysses_group: Any = None
    ring_ranks: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in SP_KINDS:
            raise ValueError(f"SP kind {self.kind!r}; expected one of {', '.join(SP_KINDS)}")
        if self.size > 1 and self.kind == "ulysses" and self.group is None:
            raise ValueError("an SP group of more than one rank needs a process group")
        if self.kind == "hybrid":
            u = self.ulysses_size
            if not 1 < u < self.size or self.size % u:
                raise ValueError(
                    f"hybrid SP on {self.size} ranks: the Ulysses size {u} must divide it and "
                    "lie strictly between 1 and the group size"
                )
            if self.ulysses_group is None:
                raise ValueError("hybrid SP needs the process group of its Ulysses sub-group")
        if self.kind != "ulysses" and len(self.ring_ranks) != self.ring_size:
            raise ValueError(
                f"{self.kind} SP on {self.size} ranks: {len(self.ring_ranks)} ring ranks given, "
                f"{self.ring_size} expected"
            )

    @property
    def ulysses_degree(self) -> int:
        """Ranks one head-sharding all-to-all spans (1 for pure ring)."""
        return {"ulysses": self.size, "ring": 1, "hybrid": self.ulysses_size}[self.kind]

    @property
    def ring_size(self) -> int:
        """Ranks of this rank's ring (1 for pure Ulysses)."""
        return self.size // self.ulysses_degree

    @property
    def ring_rank(self) -> int:
        """This rank's position on its ring."""
        return self.rank // self.ulysses_degree

    def ulysses_part(self) -> SPContext:
        """The context of the head-sharding exchange alone (SINGLE when there is none)."""
        if self.kind == "ulysses":
            return self
        if self.kind == "ring":
            return SINGLE
        return SPContext(
            size=self.ulysses_size, rank=self.rank % self.ulysses_size, group=self.ulysses_group
        )


SINGLE = SPContext()


# ------------------------------------------------------------------------------------------------
# Dense (one-call) attention


@contextlib.contextmanager
def _fused_only(on: bool) -> Iterator[None]:
    if not on:
        yield
        return
    backends = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]
    if hasattr(SDPBackend, "CUDNN_ATTENTION"):
        backends.append(SDPBackend.CUDNN_ATTENTION)
    with sdpa_kernel(backends):
        yield


def repeat_kv(x: Tensor, rep: int, dim: int) -> Tensor:
    """KV heads repeated ``rep`` times each (head i -> rows i*rep .. i*rep+rep-1) along ``dim``."""
    return x if rep == 1 else x.repeat_interleave(rep, dim=dim)


def dense_attention(
    q: Tensor, k: Tensor, v: Tensor, causal: bool = False, fused_only: bool = False
) -> Tensor:
    """SDPA on 4-D (B, H, S, D) tensors; k and v may have fewer heads (GQA). ``fused_only``
    restricts SDPA to its fused kernels (flash, memory-efficient, cuDNN): a call none of them
    takes is retried with k/v repeated to all heads (not every fused kernel takes GQA), then
    raises `ConfigError` naming the shapes."""
    gqa = k.shape[1] != q.shape[1]
    with _fused_only(fused_only):
        try:
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
        except RuntimeError as exc:
            if not fused_only:
                raise
            first = exc
        if gqa:
            rep = q.shape[1] // k.shape[1]
            with contextlib.suppress(RuntimeError):
                return F.scaled_dot_product_attention(
                    q, repeat_kv(k, rep, 1), repeat_kv(v, rep, 1), is_causal=causal
                )
    raise ConfigError(
        f"no fused SDPA kernel takes q {tuple(q.shape)} k {tuple(k.shape)} {q.dtype} on {q.device} "
        f"(causal={causal}): {first}; use bf16/fp16 and a head dim the flash kernel supports"
    )


# ------------------------------------------------------------------------------------------------
# Packed variable-length attention


def _segments_sdpa(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    seg_lens: list[int],
    valid: list[int],
    causal: bool,
    fused_only: bool,
) -> Tensor:
    outs: list[Tensor] = []
    start = 0
    for seg, n in zip(seg_lens, valid):
        if n > 0:
            qs, ks, vs = (t[start : start + n].transpose(0, 1).unsqueeze(0) for t in (q, k, v))
            outs.append(dense_attention(qs, ks, vs, causal, fused_only)[0].transpose(0, 1))
        if seg > n:
            outs.append(q.new_zeros((seg - n, q.shape[1], q.shape[2])))
        start += seg
    return torch.cat(outs, dim=0)


def _real_rows(
    seg_lens: list[int], valid: list[int], device: torch.device
) -> tuple[Tensor, Tensor, int]:
    """(indices of the real tokens in the packed rows, cumulative int32 offsets, longest)."""
    idx_parts = []
    start = 0
    for seg, n in zip(seg_lens, valid):
        idx_parts.append(torch.arange(start, start + n, device=device))
        start += seg
    idx = torch.cat(idx_parts)
    lens = torch.tensor(valid, device=device, dtype=torch.int32)
    cu = F.pad(torch.cumsum(lens, 0, dtype=torch.int32), (1, 0))
    return idx, cu, int(max(valid)) if valid else 0


def _flash_attn_func() -> Any:
    try:  # lazy: flash-attn is optional (the gpu extra) and loads CUDA code when imported
        from flash_attn import flash_attn_varlen_func  # type: ignore[import-not-found]
    except ImportError:
        return None
    return flash_attn_varlen_func


def _torch_varlen_func() -> Any:
    return varlen_attn


def _call_torch_varlen(
    fn: Any, q: Tensor, k: Tensor, v: Tensor, cu: Tensor, max_len: int, causal: bool
) -> Tensor:
    # The signature changed between releases: older ones take ``is_causal``, newer ones
    # ``window_size`` (causal = (-1, 0)) and ``enable_gqa``.
    params = inspect.signature(fn).parameters
    if "enable_gqa" in params:
        kwargs: dict[str, Any] = {"enable_gqa": k.shape[1] != q.shape[1]}
    else:
        rep = q.shape[1] // k.shape[1]
        k, v, kwargs = repeat_kv(k, rep, 1), repeat_kv(v, rep, 1), {}
    if "window_size" in params:
        kwargs["window_size"] = (-1, 0) if causal else (-1, -1)
    else:
        kwargs["is_causal"] = causal
    return fn(q, k, v, cu, cu, max_len, max_len, **kwargs)


@dataclass
class AttentionKernel:
    """Packed variable-length attention by one kernel (`KERNELS`); ``fused_only`` restricts the
    SDPA calls to fused kernels (the default on CUDA). ``notes`` say why this kernel was chosen
    (and why better ones were not)."""

    name: str = "sdpa"
    fused_only: bool = False
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.name not in KERNELS:
            raise ConfigError(
                f"attention kernel {self.name!r}; expected one of {', '.join(KERNELS)}"
            )

    def __call__(
        self, q: Tensor, k: Tensor, v: Tensor, seg_lens: list[int], valid: list[int], causal: bool
    ) -> Tensor:
        """q: (T, H, D), k and v: (T, KV, D) with KV dividing H, T = sum(seg_lens). Returns
        (T, H, D); no token attends across a segment boundary or to padding; padding rows are 0."""
        if self.name == "sdpa":
            return _segments_sdpa(q, k, v, seg_lens, valid, causal, self.fused_only)
        idx, cu, max_len = _real_rows(seg_lens, valid, q.device)
        qi, ki, vi = q.index_select(0, idx), k.index_select(0, idx), v.index_select(0, idx)
        if self.name == "flash_attn":
            o = _flash_attn_func()(qi, ki, vi, cu, cu, max_len, max_len, causal=causal)
        else:
            o = _call_torch_varlen(_torch_varlen_func(), qi, ki, vi, cu, max_len, causal)
        return q.new_zeros(q.shape).index_copy(0, idx, o)

    def describe(self) -> dict[str, Any]:
        return {"kernel": self.name, "fused_only": self.fused_only, "notes": list(self.notes)}


PORTABLE = AttentionKernel("sdpa")


def _probe(
    kernel: AttentionKernel, device: torch.device, dtype: torch.dtype, head_dim: int
) -> str | None:
    """None when ``kernel`` runs forward and backward on this device and agrees with the SDPA
    per-segment reference on a small GQA case; else what went wrong."""
    g = torch.Generator(device="cpu").manual_seed(0)
    lens, valid = [40, 24], [33, 24]
    t = sum(lens)
    q, k, v = (
        torch.randn(t, h, head_dim, generator=g).to(device, dtype).requires_grad_()
        for h in (4, 2, 2)
    )
    try:
        out = kernel(q, k, v, lens, valid, causal=True)
        out.float().square().sum().backward()
        with torch.no_grad():
            ref = _segments_sdpa(q.float(), k.float(), v.float(), lens, valid, True, False)
        err = float((out.float() - ref).abs().max())
    except Exception as exc:  # any failure means: not this kernel
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    return None if err <= tol else f"differs from the SDPA reference by {err:.3g}"


def select_attention_kernel(
    device: torch.device, dtype: torch.dtype, head_dim: int = 64, prefer: str = "auto"
) -> AttentionKernel:
    """The kernel a model on ``device`` in ``dtype`` uses: ``prefer`` (one of `KERNELS`) when it
    passes a probe, else the best that does (see the module docstring). CPU: always ``sdpa``."""
    if prefer != "auto" and prefer not in KERNELS:
        raise ConfigError(f"attention={prefer!r}; expected auto or one of {', '.join(KERNELS)}")
    cuda = device.type == "cuda"
    notes: list[str] = []
    if not cuda:
        if prefer not in ("auto", "sdpa"):
            notes.append(f"{prefer}: no CPU kernel")
        return AttentionKernel(
            "sdpa", fused_only=False, notes=notes + ["cpu: per-segment SDPA (4-D, enable_gqa)"]
        )
    order = ["flash_attn", "torch_varlen", "sdpa"] if prefer == "auto" else [prefer, "sdpa"]
    for name in order:
        if name == "sdpa":
            break
        if dtype not in (torch.float16, torch.bfloat16):
            notes.append(f"{name}: needs fp16/bf16, not {dtype}")
            continue
        if (_flash_attn_func() if name == "flash_attn" else _torch_varlen_func()) is None:
            notes.append(f"{name}: not importable")
            continue
        candidate = AttentionKernel(name, fused_only=True)
        problem = _probe(candidate, device, dtype, head_dim)
        if problem is None:
            candidate.notes = [*notes, f"{name}: probe passed (forward, backward, GQA, padding)"]
            return candidate
        notes.append(f"{name}: probe failed: {problem}")
    kernel = AttentionKernel("sdpa", fused_only=True)
    problem = _probe(kernel, device, dtype, head_dim)
    kernel.notes = [
        *notes,
        "sdpa: per-segment fused SDPA" + ("" if problem is None else f" (probe: {problem})"),
    ]
    return kernel


def varlen_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    seg_lens: list[int],
    valid: list[int],
    causal: bool,
    kernel: AttentionKernel = PORTABLE,
) -> Tensor:
    """Attention over packed segments by ``kernel`` (see `AttentionKernel.__call__`)."""
    return kernel(q, k, v, seg_lens, valid, causal)


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


def kv_heads_for_sp(heads: int, kv_heads: int, sp: int) -> int:
    """KV heads that Ulysses exchanges on a group of ``sp`` ranks: ``kv_heads`` when ``sp``
    divides it; else each KV head repeated up to lcm(kv_heads, sp) heads (every rank needs whole
    KV heads for its query heads), which divides ``heads`` whenever ``sp`` does."""
    check_heads(heads, sp)
    return kv_heads if kv_heads % sp == 0 else math.lcm(kv_heads, sp)


def ulysses_qkv_to_heads(
    q: Tensor, k: Tensor, v: Tensor, sp: SPContext, full_from_gathered: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """q (T_local, H, D), k and v (T_local, KV, D) sharded by sequence -> (T_full, H/sp, D) and
    (T_full, KV/sp, D) sharded by heads, in one all-to-all (rank j receives query heads
    [j H/sp, (j+1) H/sp) and KV heads [j KV/sp, (j+1) KV/sp): the KV heads of its query heads).
    KV must be divisible by sp (`kv_heads_for_sp`). ``full_from_gathered`` as in
    `ulysses_seq_to_heads`."""
    if sp.size == 1:
        return q, k, v
    P = sp.size
    t_loc, heads, dim = q.shape
    kv = k.shape[1]
    check_heads(heads, P)
    if kv % P:
        raise ConfigError(
            f"{kv} KV heads not divisible by the sequence-parallel degree {P}; repeat them first"
        )
    parts = [x.reshape(t_loc, P, x.shape[1] // P, dim) for x in (q, k, v)]
    send = torch.cat(parts, dim=2).transpose(0, 1)
    width = (heads + 2 * kv) // P
    got = all_to_all(send, sp).reshape(P * t_loc, width, dim).index_select(0, full_from_gathered)
    qh, kh, vh = got.split([heads // P, kv // P, kv // P], dim=1)
    return qh, kh, vh


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
