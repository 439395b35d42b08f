"""Ring attention (context parallelism) over packed variable-length documents.

Layout (the causal load balancing Megatron-Core's context parallelism uses,
``megatron/core/utils.py`` ``get_batch_on_this_cp_rank`` and
``transformer_engine/pytorch/attention.py`` ``AttnFuncWithCPAndKVP2P``): on a ring of ``r`` ranks
every document is padded to a multiple of ``2r`` and cut into ``2r`` equal chunks; ring rank
``i`` holds chunks ``i`` and ``2r-1-i`` of every document, packed document after document
(``ring_token_index``). Every rank then sees the same share of the causal triangle.

`ring_attention` runs ``r`` steps. At step ``s`` a rank holds the keys and values of ring rank
``src = i - s (mod r)`` and, per document, attends its queries to them:

- ``s = 0``: both local chunks against both (causal by position);
- ``src < i``: both query chunks against key chunk ``src`` only (every key precedes every query);
- ``src > i``: query chunk ``2r-1-i`` only against both key chunks (all visible),

so each later step is half a diagonal step. Partial results are merged by their log-sum-exp
(online softmax). Keys and values travel to the next ring rank with point-to-point sends
(``batch_isend_irecv``) posted *before* the step's compute, so on a GPU the transfer of step
``s+1``'s block overlaps step ``s``'s attention. The backward pass is a second ring: keys and
values go round again, and the gradients of the keys and values travel with them (accumulated
in fp32 by every rank they visit), arriving home after ``r`` hops; query gradients stay local.

Padding (a document's tail up to the multiple of ``2r``) is never attended and attends nothing:
its rows come out as zeros. Grouped-query attention: keys and values circulate with their KV
heads only.

The block kernel is plain matrix products in fp32 with an explicit mask, exact on every device,
run over tiles of query rows so that no score matrix exceeds `SCORE_TILE_ELEMENTS` entries
(memory stays bounded on long documents). It is not a fused kernel: on a GPU a fused attention
that returns the log-sum-exp (flash-attention's varlen forward and backward, as Transformer
Engine's context parallelism uses) would replace `_block_forward` and the backward's block
step; that is not wired here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

# Most entries of one score tile (heads x query rows x keys, fp32): 2^24 = 64 MiB, a few times
# that with the backward's temporaries.
SCORE_TILE_ELEMENTS = 1 << 24
KV_TAG = 71  # tags keep the key/value and gradient streams between one pair of ranks apart
DKV_TAG = 72


def ring_token_index(padded: int, ring_size: int, ring_rank: int) -> Tensor:
    """Positions (within the padded document) of the tokens ring rank ``ring_rank`` holds, in
    local order: chunk ``ring_rank`` then chunk ``2 ring_size - 1 - ring_rank`` (``padded`` a
    multiple of ``2 ring_size``)."""
    if padded % (2 * ring_size):
        raise ValueError(f"padded length {padded} is not a multiple of 2 x {ring_size}")
    c = padded // (2 * ring_size)
    first = torch.arange(ring_rank * c, (ring_rank + 1) * c)
    last = 2 * ring_size - 1 - ring_rank
    return torch.cat([first, torch.arange(last * c, (last + 1) * c)])


@dataclass(frozen=True)
class RingLayout:
    """How the local rows of a ring rank are laid out: per document, ``chunks[d]`` rows of chunk
    ``rank`` then ``chunks[d]`` rows of chunk ``2 size - 1 - rank``; ``valid[d]`` real tokens
    in the document. ``ranks``: the ring's global ranks in ring order (``ranks[rank]`` is this
    rank)."""

    chunks: tuple[int, ...]
    valid: tuple[int, ...]
    rank: int
    size: int
    ranks: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.ranks) != self.size or not 0 <= self.rank < self.size:
            raise ValueError(f"ring rank {self.rank} of {self.size} with ranks {self.ranks}")

    def rows(self) -> int:
        return 2 * sum(self.chunks)

    def positions(self, ring_rank: int, c: int) -> Tensor:
        """Document positions of ring rank ``ring_rank``'s local rows of a document of chunk
        size ``c``."""
        return ring_token_index(2 * self.size * c, self.size, ring_rank)


def _pieces(layout: RingLayout, src: int) -> list[tuple[slice, slice, Tensor, Tensor, int]]:
    """Per document, what this rank computes against ring rank ``src``'s block: (query rows,
    key rows (local rows of the packed sequence), their document positions, the document's real
    length); documents whose visible part is empty are left out."""
    out = []
    i, off = layout.rank, 0
    for c, valid in zip(layout.chunks, layout.valid):
        if src == i:
            qr, kr = (0, 2 * c), (0, 2 * c)
        elif src < i:
            qr, kr = (0, 2 * c), (0, c)
        else:
            qr, kr = (c, 2 * c), (0, 2 * c)
        qpos = layout.positions(i, c)[qr[0] : qr[1]]
        kpos = layout.positions(src, c)[kr[0] : kr[1]]
        if c > 0 and int(kpos.min()) < valid and int(qpos.min()) < valid:
            q_rows = slice(off + qr[0], off + qr[1])
            k_rows = slice(off + kr[0], off + kr[1])
            out.append((q_rows, k_rows, qpos, kpos, valid))
        off += 2 * c
    return out


def _tiles(
    pieces: list[tuple[slice, slice, Tensor, Tensor, int]], heads: int
) -> list[tuple[slice, slice, Tensor, Tensor, int]]:
    """The pieces cut into tiles of query rows so that one tile's score matrix holds at most
    `SCORE_TILE_ELEMENTS` entries (the block kernel's memory stays bounded on long documents);
    tiles of padding queries only are left out."""
    out = []
    for qrows, krows, qpos, kpos, valid in pieces:
        m = krows.stop - krows.start
        step = max(1, SCORE_TILE_ELEMENTS // max(1, heads * m))
        for a in range(0, qrows.stop - qrows.start, step):
            qp = qpos[a : a + step]
            if int(qp.min()) < valid:
                rows = slice(qrows.start + a, min(qrows.start + a + step, qrows.stop))
                out.append((rows, krows, qp, kpos, valid))
    return out


def _mask(qpos: Tensor, kpos: Tensor, valid: int, device: torch.device) -> Tensor | None:
    """Which (query, key) pairs are attended: causal, real keys, real queries; None when all."""
    if int(qpos.max()) < valid and int(kpos.max()) < valid and int(kpos.max()) <= int(qpos.min()):
        return None
    q, k = qpos.to(device)[:, None], kpos.to(device)[None, :]
    return (k <= q) & (k < valid) & (q < valid)


def _scores(q: Tensor, k: Tensor, mask: Tensor | None, scale: float) -> Tensor:
    """(H, n, m) fp32 scores of q (n, H, D) against k (m, H, D), masked pairs at -inf."""
    s = torch.einsum("nhd,mhd->hnm", q.float(), k.float()) * scale
    if mask is not None:
        s = s.masked_fill(~mask[None], float("-inf"))
    return s


def _probs(s: Tensor, lse: Tensor) -> Tensor:
    """exp(s - lse) with rows of no attended key (lse = -inf) at 0."""
    finite = torch.isfinite(lse)
    p = torch.exp(s - torch.where(finite, lse, torch.zeros_like(lse))[..., None])
    return torch.where(finite[..., None], p, torch.zeros_like(p))


def _block_forward(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float
) -> tuple[Tensor, Tensor]:
    """(out (n, H, D) fp32 normalised within the block, lse (H, n))."""
    s = _scores(q, k, mask, scale)
    lse = torch.logsumexp(s, dim=-1)
    out = torch.einsum("hnm,mhd->nhd", _probs(s, lse), v.float())
    return out, lse


def _merge(out: Tensor, lse: Tensor, o_b: Tensor, lse_b: Tensor) -> tuple[Tensor, Tensor]:
    """Online-softmax merge of two partial results (rows with -inf on both sides stay 0)."""
    new = torch.logaddexp(lse, lse_b)
    safe = torch.where(torch.isfinite(new), new, torch.zeros_like(new))
    a = torch.where(torch.isfinite(lse), torch.exp(lse - safe), torch.zeros_like(lse))
    b = torch.where(torch.isfinite(lse_b), torch.exp(lse_b - safe), torch.zeros_like(lse_b))
    return out * a.transpose(0, 1)[..., None] + o_b * b.transpose(0, 1)[..., None], new


def _repeat(x: Tensor, rep: int) -> Tensor:
    return x if rep == 1 else x.repeat_interleave(rep, dim=1)


def _fold(x: Tensor, rep: int) -> Tensor:
    """Sum the gradients of repeated KV heads back onto their KV head."""
    if rep == 1:
        return x
    m, h, d = x.shape
    return x.view(m, h // rep, rep, d).sum(2)


def _exchange(
    send: list[tuple[Tensor, int, int]], recv: list[tuple[Tensor, int, int]], group: Any
) -> list[Any]:
    """Post sends (tensor, global peer, tag) and receives; returns the requests to wait on."""
    ops = [dist.P2POp(dist.isend, t, peer, group=group, tag=tag) for t, peer, tag in send]
    ops += [dist.P2POp(dist.irecv, t, peer, group=group, tag=tag) for t, peer, tag in recv]
    return dist.batch_isend_irecv(ops) if ops else []


def _wait(reqs: list[Any]) -> None:
    for req in reqs:
        req.wait()


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, q: Tensor, k: Tensor, v: Tensor, layout: RingLayout, group: Any
    ) -> Tensor:
        heads, kv_heads, dim = q.shape[1], k.shape[1], q.shape[2]
        rep, scale = heads // kv_heads, 1.0 / math.sqrt(dim)
        n = q.shape[0]
        out = torch.zeros(n, heads, dim, dtype=torch.float32, device=q.device)
        lse = torch.full((heads, n), float("-inf"), dtype=torch.float32, device=q.device)
        nxt = layout.ranks[(layout.rank + 1) % layout.size]
        prv = layout.ranks[(layout.rank - 1) % layout.size]
        kv = torch.cat([k, v], dim=1).contiguous()
        for s in range(layout.size):
            reqs: list[Any] = []
            if s + 1 < layout.size:
                incoming = torch.empty_like(kv)
                reqs = _exchange([(kv, nxt, KV_TAG)], [(incoming, prv, KV_TAG)], group)
            src = (layout.rank - s) % layout.size
            kb, vb = kv[:, :kv_heads], kv[:, kv_heads:]
            for qrows, krows, qpos, kpos, valid in _tiles(_pieces(layout, src), heads):
                mask = _mask(qpos, kpos, valid, q.device)
                o_b, lse_b = _block_forward(
                    q[qrows], _repeat(kb[krows], rep), _repeat(vb[krows], rep), mask, scale
                )
                out[qrows], lse[:, qrows] = _merge(out[qrows], lse[:, qrows], o_b, lse_b)
            _wait(reqs)
            if reqs:
                kv = incoming
        result = out.to(q.dtype)
        # kept as flash attention keeps it: the output in the input dtype and the fp32 lse
        ctx.save_for_backward(q, k, v, result, lse)
        ctx.layout, ctx.group = layout, group
        return result

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        q, k, v, out, lse = ctx.saved_tensors
        layout: RingLayout = ctx.layout
        group = ctx.group
        heads, kv_heads, dim = q.shape[1], k.shape[1], q.shape[2]
        rep, scale = heads // kv_heads, 1.0 / math.sqrt(dim)
        g = grad.float()
        delta = (g * out.float()).sum(-1).transpose(0, 1)  # (H, n): rowsum(dO * O)
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        kv = torch.cat([k, v], dim=1).contiguous()
        dkv = torch.zeros(kv.shape, dtype=torch.float32, device=q.device)
        nxt = layout.ranks[(layout.rank + 1) % layout.size]
        prv = layout.ranks[(layout.rank - 1) % layout.size]
        for s in range(layout.size):
            reqs: list[Any] = []
            if s + 1 < layout.size:
                incoming = torch.empty_like(kv)
                reqs = _exchange([(kv, nxt, KV_TAG)], [(incoming, prv, KV_TAG)], group)
            src = (layout.rank - s) % layout.size
            kb, vb = kv[:, :kv_heads], kv[:, kv_heads:]
            for qrows, krows, qpos, kpos, valid in _tiles(_pieces(layout, src), heads):
                mask = _mask(qpos, kpos, valid, q.device)
                kr_rep, vr_rep = _repeat(kb[krows], rep), _repeat(vb[krows], rep)
                p = _probs(_scores(q[qrows], kr_rep, mask, scale), lse[:, qrows])
                g_b = g[qrows]
                dv = torch.einsum("hnm,nhd->mhd", p, g_b)
                dp = torch.einsum("nhd,mhd->hnm", g_b, vr_rep.float())
                ds = p * (dp - delta[:, qrows][..., None]) * scale
                dq[qrows] += torch.einsum("hnm,mhd->nhd", ds, kr_rep.float())
                dk = torch.einsum("hnm,nhd->mhd", ds, q[qrows].float())
                dkv[krows, :kv_heads] += _fold(dk, rep)
                dkv[krows, kv_heads:] += _fold(dv, rep)
            if layout.size == 1:
                break
            # The accumulated gradient of ``src``'s keys and values moves on with them; after the
            # last step it goes one more hop, home to its owner.
            incoming_d = torch.empty_like(dkv)
            dreqs = _exchange([(dkv, nxt, DKV_TAG)], [(incoming_d, prv, DKV_TAG)], group)
            _wait(reqs)
            _wait(dreqs)
            if reqs:
                kv = incoming
            dkv = incoming_d
        dk_out, dv_out = dkv[:, :kv_heads], dkv[:, kv_heads:]
        return dq.to(q.dtype), dk_out.to(k.dtype), dv_out.to(v.dtype), None, None


def ring_attention(
    q: Tensor, k: Tensor, v: Tensor, layout: RingLayout, group: Any = None
) -> Tensor:
    """Causal attention of packed documents laid out as `RingLayout` says, over the ring.

    q: (T, H, D), k and v: (T, KV, D) with KV dividing H, T = ``layout.rows()``; returns
    (T, H, D) in q's dtype. ``group``: the process group the point-to-point ops run on (peers
    are global ranks; None: the default group). A ring of one rank needs no communication.
    """
    if q.shape[0] != layout.rows():
        raise ValueError(f"{q.shape[0]} query rows for a ring layout of {layout.rows()}")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"{k.shape[1]} KV heads do not divide {q.shape[1]} query heads")
    return _RingAttention.apply(q, k, v, layout, group)


def ring_layout(
    padded: Sequence[int], valid: Sequence[int], rank: int, ranks: Sequence[int]
) -> RingLayout:
    """The `RingLayout` of documents padded to ``padded`` (multiples of 2 x ring size)."""
    size = len(ranks)
    return RingLayout(
        chunks=tuple(int(p) // (2 * size) for p in padded),
        valid=tuple(int(x) for x in valid),
        rank=rank,
        size=size,
        ranks=tuple(int(x) for x in ranks),
    )
