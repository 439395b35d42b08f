"""Forward+backward time of the ways to run packed variable-length attention with PyTorch alone,
on this machine (CPU unless --device cuda), for causal text and non-causal video segments.

    .venv/bin/python scripts/attention_variants.py [--device cpu] [--tokens 4096 16384] [--reps 3]

Variants (all exact; each is checked against the per-segment loop before it is timed):
- ``loop_3d_repeat``: one SDPA call per segment on 3-D (H, n, D) tensors, k/v repeated to H heads
  (what the runtime did before: on CUDA it leaves SDPA only its math kernel);
- ``loop_4d_gqa``: one call per segment on 4-D (1, H, n, D), ``enable_gqa=True`` (k/v keep their
  KV heads);
- ``loop_4d_repeat``: as above with k/v repeated locally to H heads;
- ``padded_causal``: causal only: every segment right-padded to the longest, one (B, H, S, D)
  call with ``is_causal`` (padding keys are never attended by a real query under a causal mask);
- ``block_mask``: one call over the whole packed sequence with a block-diagonal boolean mask;
- ``nested``: non-causal only: a jagged nested tensor (causal nested SDPA has no kernel);
- ``varlen_attn`` (CUDA only): ``torch.nn.attention.varlen.varlen_attn``.
FlexAttention has no CPU backward in torch 2.13 and is not timed here.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor


def lengths(total: int, median: int, seed: int) -> list[int]:
    """Lognormal segment lengths (sigma 1) summing to ``total``: the shape of real text corpora."""
    g = torch.Generator().manual_seed(seed)
    out: list[int] = []
    while sum(out) < total:
        out.append(max(16, int(median * float(torch.exp(torch.randn(1, generator=g))))))
    out[-1] -= sum(out) - total
    return [n for n in out if n > 0]


def loop(
    q: Tensor, k: Tensor, v: Tensor, lens: list[int], causal: bool, four_d: bool, gqa: bool
) -> Tensor:
    rep = q.shape[1] // k.shape[1]
    if not gqa and rep > 1:
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    outs, start = [], 0
    for n in lens:
        qs, ks, vs = (t[start : start + n].transpose(0, 1) for t in (q, k, v))
        if four_d:
            o = F.scaled_dot_product_attention(
                qs[None], ks[None], vs[None], is_causal=causal, enable_gqa=gqa
            )[0]
        else:
            o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal)
        outs.append(o.transpose(0, 1))
        start += n
    return torch.cat(outs)


def padded_causal(q: Tensor, k: Tensor, v: Tensor, lens: list[int]) -> Tensor:
    m = max(lens)

    def pad(t: Tensor) -> Tensor:
        parts = torch.split(t, lens)
        return torch.stack([F.pad(p, (0, 0, 0, 0, 0, m - p.shape[0])) for p in parts]).transpose(
            1, 2
        )

    o = F.scaled_dot_product_attention(
        pad(q), pad(k), pad(v), is_causal=True, enable_gqa=True
    ).transpose(1, 2)
    return torch.cat([o[i, :n] for i, n in enumerate(lens)])


def block_mask(q: Tensor, k: Tensor, v: Tensor, lens: list[int], causal: bool) -> Tensor:
    doc = torch.repeat_interleave(
        torch.arange(len(lens), device=q.device), torch.tensor(lens, device=q.device)
    )
    mask = doc[:, None] == doc[None, :]
    if causal:
        mask &= torch.ones_like(mask).tril()
    o = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None],
        k.transpose(0, 1)[None],
        v.transpose(0, 1)[None],
        attn_mask=mask,
        enable_gqa=True,
    )
    return o[0].transpose(0, 1)


def nested(q: Tensor, k: Tensor, v: Tensor, lens: list[int]) -> Tensor:
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    offs = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], device=q.device)
    qn, kn, vn = (
        torch.nested.nested_tensor_from_jagged(t, offs).transpose(1, 2) for t in (q, k, v)
    )
    return F.scaled_dot_product_attention(qn, kn, vn).transpose(1, 2).values()


def varlen(q: Tensor, k: Tensor, v: Tensor, lens: list[int], causal: bool) -> Tensor:
    from torch.nn.attention.varlen import varlen_attn

    cu = F.pad(
        torch.tensor(lens, device=q.device, dtype=torch.int32).cumsum(0, dtype=torch.int32), (1, 0)
    )
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    return varlen_attn(
        q, k, v, cu, cu, max(lens), max(lens), window_size=(-1, 0) if causal else (-1, -1)
    )


def make_variants(
    q: Tensor, k: Tensor, v: Tensor, lens: list[int], causal: bool, device: torch.device
) -> dict[str, Callable[[], Tensor]]:
    variants: dict[str, Callable[[], Tensor]] = {
        "loop_3d_repeat": lambda: loop(q, k, v, lens, causal, False, False),
        "loop_4d_gqa": lambda: loop(q, k, v, lens, causal, True, True),
        "loop_4d_repeat": lambda: loop(q, k, v, lens, causal, True, False),
        "block_mask": lambda: block_mask(q, k, v, lens, causal),
    }
    if causal:
        variants["padded_causal"] = lambda: padded_causal(q, k, v, lens)
    else:
        variants["nested"] = lambda: nested(q, k, v, lens)
    if device.type == "cuda":
        variants["varlen_attn"] = lambda: varlen(q, k, v, lens, causal)
    return variants


def timed(fn: Callable[[], Tensor], inputs: list[Tensor], reps: int, device: torch.device) -> float:
    times = []
    for rep in range(reps + 1):
        for t in inputs:
            t.grad = None
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn().float().square().sum().backward()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if rep:  # the first is warm-up
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--tokens", type=int, nargs="+", default=[4096, 16384])
    p.add_argument("--heads", default="8,4,32", help="query heads, kv heads, head dim")
    p.add_argument("--median-len", type=int, default=512)
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
    device = torch.device(args.device)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    H, KV, D = (int(x) for x in args.heads.split(","))
    print(
        f"device {device}, {args.dtype}, heads {H}/{KV}, head dim {D}, threads "
        f"{torch.get_num_threads()}, torch {torch.__version__}; median of {args.reps} fwd+bwd "
        "after 1 warm-up, seconds"
    )
    print("| kind | tokens | segments | variant | seconds | x fastest |")
    print("|---|---|---|---|---|---|")
    for kind in ("causal", "noncausal"):
        causal = kind == "causal"
        for total in args.tokens:
            lens = lengths(total, args.median_len, seed=total)
            g = torch.Generator().manual_seed(0)
            q = torch.randn(total, H, D, generator=g).to(device, dtype).requires_grad_()
            k = torch.randn(total, KV, D, generator=g).to(device, dtype).requires_grad_()
            v = torch.randn(total, KV, D, generator=g).to(device, dtype).requires_grad_()
            variants = make_variants(q, k, v, lens, causal, device)
            with torch.no_grad():
                ref = loop(q, k, v, lens, causal, False, False).float()
            rows = []
            for name, fn in variants.items():
                if name == "block_mask" and total > 8192:
                    rows.append((name, float("nan")))  # O(T^2) mask: skipped above 8K tokens
                    continue
                with torch.no_grad():
                    err = float((fn().float() - ref).abs().max())
                tol = 1e-4 if dtype == torch.float32 else 5e-2
                if err > tol:
                    raise SystemExit(f"{name} differs from the per-segment loop by {err}")
                rows.append((name, timed(fn, [q, k, v], args.reps, device)))
            best = min(s for _, s in rows if s == s)
            for name, s in rows:
                cell = "skipped (O(T^2) mask)" if s != s else f"{s:.3f}"
                ratio = "" if s != s else f"{s / best:.2f}"
                print(f"| {kind} | {total} | {len(lens)} | {name} | {cell} | {ratio} |", flush=True)


if __name__ == "__main__":
    main()
