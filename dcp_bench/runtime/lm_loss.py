"""The language-model loss without its full logits: `chunked_cross_entropy_sum`.

A Llama-3-8B rank with 64K tokens would hold 64K x 128,256 logits (16 GB in bf16, 32 GB more for
their fp32 softmax, the same again for the gradient). Here the LM head and the cross-entropy run
over ``chunk_tokens`` rows at a time, in the forward and again in the backward (the logits of a
chunk are recomputed rather than kept: one extra LM-head GEMM per chunk), so at most one chunk of
logits lives at once: ``chunk_tokens x vocab x (compute bytes + 4)`` at the peak
(`dcp_bench.train_policy.logits_chunk_bytes`). The forward keeps only each row's log-sum-exp.

Numerics match ``F.cross_entropy(lm_head(h).float(), labels, reduction="sum")``: logits in the
compute dtype, softmax in fp32, the gradient of the logits cast back to the compute dtype before
the two GEMMs of the backward; the weight gradient is accumulated over chunks in fp32.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

IGNORE = -100


def _chunk_logits(h: Tensor, weight: Tensor) -> Tensor:
    return (h @ weight.t()).float()


class _ChunkedCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, h: Tensor, weight: Tensor, labels: Tensor, chunk: int) -> Tensor:  # type: ignore[override]
        rows = h.shape[0]
        lse = torch.empty(rows, dtype=torch.float32, device=h.device)
        total = torch.zeros((), dtype=torch.float32, device=h.device)
        for s in range(0, rows, chunk):
            e = min(rows, s + chunk)
            logits = _chunk_logits(h[s:e], weight)
            lab = labels[s:e]
            keep = lab != IGNORE
            target = logits.gather(1, lab.clamp(min=0)[:, None])[:, 0]
            peak = logits.max(dim=1).values
            # in place: exp(logits - max) in the fp32 buffer itself (no second chunk-sized buffer)
            chunk_lse = logits.sub_(peak[:, None]).exp_().sum(dim=1).log_().add_(peak)
            lse[s:e] = chunk_lse
            total += torch.where(keep, chunk_lse - target, torch.zeros_like(target)).sum()
            del logits
        ctx.save_for_backward(h, weight, labels, lse)
        ctx.chunk = chunk
        return total

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None, None, None]:  # type: ignore[override]
        h, weight, labels, lse = ctx.saved_tensors
        chunk = ctx.chunk
        grad_h = torch.empty_like(h) if ctx.needs_input_grad[0] else None
        grad_w = (
            torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
            if ctx.needs_input_grad[1]
            else None
        )
        rows = h.shape[0]
        for s in range(0, rows, chunk):
            e = min(rows, s + chunk)
            lab = labels[s:e]
            keep = (lab != IGNORE).to(torch.float32) * grad.float()
            # d loss / d logits = softmax - one_hot(label), per kept row, in place in the fp32 chunk
            p = _chunk_logits(h[s:e], weight).sub_(lse[s:e, None]).exp_()
            rows_idx = torch.arange(e - s, device=h.device)
            p[rows_idx, lab.clamp(min=0)] -= 1.0
            p.mul_(keep[:, None])
            d_logits = p.to(h.dtype)
            del p
            if grad_h is not None:
                grad_h[s:e] = d_logits @ weight
            if grad_w is not None:
                grad_w += (d_logits.t() @ h[s:e]).float()
        return grad_h, None if grad_w is None else grad_w.to(weight.dtype), None, None


def chunked_cross_entropy_sum(
    h: Tensor, weight: Tensor, labels: Tensor, chunk_tokens: int
) -> Tensor:
    """Sum over rows of the cross-entropy of ``h @ weight.T`` against ``labels`` (rows labelled
    `IGNORE` count nothing), ``chunk_tokens`` rows at a time (see the module docstring). h: (T,
    hidden), weight: (vocab, hidden), labels: (T,). Returns an fp32 scalar."""
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens={chunk_tokens}; expected >= 1")
    return _ChunkedCrossEntropy.apply(h, weight, labels, int(chunk_tokens))
