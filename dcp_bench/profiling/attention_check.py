"""Element-wise check of a packed-attention kernel against an exact fp32 reference.

The reference computes causal packed attention and its gradients in fp32 by the textbook formulas,
a block of query rows at a time (so 64K-token segments fit in a few GiB):
``P = softmax(Q K^T / sqrt(d))`` over the keys at or before each query, ``O = P V``;
with ``dO`` given, ``dV = P^T dO``, ``dS = P * (dO V^T - rowsum(dO * O))``, ``dQ = dS K / sqrt(d)``,
``dK = dS^T Q / sqrt(d)``; grouped-query heads are expanded to the query heads and their gradients
summed back. It shares no code with the kernels it checks.

The tolerance calibrates itself, per tensor: the same blockwise formulas run in the kernel's own
dtype show what rounding to that dtype costs; the kernel passes when its largest element-wise error
(relative to the reference's largest magnitude) is at most ``SLACK`` times that, or under the
dtype's floor. A kernel that drops the causal mask, crosses a segment boundary, drops a head group
or returns zeros is off by O(1) and fails.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch
from torch import Tensor

SLACK = 4.0
# Relative error a kernel may always have, whatever the low-precision math shows.
FLOOR = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 1e-2}
BLOCK_ROWS = 256


def reference_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    dout: Tensor,
    seg_lens: list[int],
    dtype: torch.dtype = torch.float32,
    block: int = BLOCK_ROWS,
) -> dict[str, Tensor]:
    """Causal packed attention and its gradients (see the module docstring) computed in ``dtype``:
    {"out", "dq", "dk", "dv"} in ``dtype``, shaped like the inputs."""
    T, H, D = q.shape
    KV = k.shape[1]
    rep = H // KV
    scale = 1.0 / math.sqrt(D)
    q, k, v, dout = (t.detach().to(dtype) for t in (q, k, v, dout))
    k_full = k.repeat_interleave(rep, dim=1)
    v_full = v.repeat_interleave(rep, dim=1)
    out = torch.zeros(T, H, D, dtype=dtype, device=q.device)
    dq = torch.zeros_like(out)
    dk_full = torch.zeros_like(out)
    dv_full = torch.zeros_like(out)
    start = 0
    for n in seg_lens:
        for lo in range(0, n, block):
            hi = min(n, lo + block)
            rows = slice(start + lo, start + hi)
            keys = slice(start, start + hi)  # causal: no key after the block's last query
            qb, kb, vb, gb = q[rows], k_full[keys], v_full[keys], dout[rows]
            s = torch.einsum("qhd,khd->hqk", qb, kb) * scale
            qpos = torch.arange(lo, hi, device=q.device)[:, None]
            kpos = torch.arange(0, hi, device=q.device)[None, :]
            s = s.masked_fill((kpos > qpos)[None], float("-inf"))
            p = torch.softmax(s, dim=-1)
            ob = torch.einsum("hqk,khd->qhd", p, vb)
            out[rows] = ob
            dv_full[keys] += torch.einsum("hqk,qhd->khd", p, gb)
            dp = torch.einsum("qhd,khd->hqk", gb, vb)
            row_dot = (gb * ob).sum(-1).transpose(0, 1)  # (h, q)
            ds = p * (dp - row_dot[..., None])
            dq[rows] = torch.einsum("hqk,khd->qhd", ds, kb) * scale
            dk_full[keys] += torch.einsum("hqk,qhd->khd", ds, qb) * scale
            del s, p, dp, ds
        start += n
    dk = dk_full.view(T, KV, rep, D).sum(2)
    dv = dv_full.view(T, KV, rep, D).sum(2)
    return {"out": out, "dq": dq, "dk": dk, "dv": dv}


def _rel_max_err(got: Tensor, ref: Tensor) -> float:
    scale = float(ref.abs().max())
    return float((got.float() - ref.float()).abs().max()) / (scale if scale > 0 else 1.0)


def check_kernel(
    kernel: Any,
    tokens: int,
    heads: tuple[int, int, int],
    device: torch.device,
    dtype: torch.dtype,
    seed: int = 0,
) -> dict[str, Any]:
    """``kernel`` (an `AttentionKernel` or any callable with its signature) on causal packed
    attention of ``tokens`` tokens in three segments (1/4, 1/4, 1/2), inputs drawn in fp32 and
    rounded to ``dtype``: per tensor (output, dq, dk, dv) the kernel's error, the low-precision
    math's error, the tolerance, and whether it passed."""
    H, KV, D = heads
    lens = [tokens // 4, tokens // 4, tokens - 2 * (tokens // 4)]
    g = torch.Generator(device="cpu").manual_seed(seed + tokens)
    q, k, v = (torch.randn(tokens, h, D, generator=g).to(device, dtype) for h in (H, KV, KV))
    dout = torch.randn(tokens, H, D, generator=g).to(device, dtype)
    t0 = time.perf_counter()
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    out = kernel(qg, kg, vg, lens, lens, True)
    out.backward(dout)
    got = {"out": out.detach(), "dq": qg.grad, "dk": kg.grad, "dv": vg.grad}
    del out, qg, kg, vg
    ref = reference_attention(q, k, v, dout, lens, torch.float32)
    low = reference_attention(q, k, v, dout, lens, dtype) if dtype != torch.float32 else None
    tensors = {}
    ok = True
    for name in ("out", "dq", "dk", "dv"):
        err = _rel_max_err(got[name], ref[name])
        low_err = _rel_max_err(low[name], ref[name]) if low is not None else 0.0
        tol = max(SLACK * low_err, FLOOR.get(dtype, 1e-2))
        finite = bool(torch.isfinite(got[name]).all())
        passed = finite and err <= tol
        ok = ok and passed
        tensors[name] = {
            "max_rel_err": err,
            "low_precision_math_err": low_err,
            "tolerance": tol,
            "passed": passed,
        }
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return {
        "tokens": tokens,
        "segments": lens,
        "dtype": str(dtype).replace("torch.", ""),
        "passed": ok,
        "tensors": tensors,
        "wall_s": round(time.perf_counter() - t0, 3),
    }


__all__ = ["check_kernel", "reference_attention"]
