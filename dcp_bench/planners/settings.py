"""Per-shape and per-bucket run settings from the cost model, under the memory cap.

Two consumers:

* `ShapeTable` (our planner `dcp`): for every *distinct* sample shape of a batch and every SP
  degree, the fewest checkpointed layers that fit the memory cap and the resulting time. Built
  with a handful of vectorised cost-model calls per SP degree.
* `BucketSettings` (faithful DCP): the reference profile. Per size bucket, for each SP degree
  (inside a node first, across nodes only when nothing fits) the batch sizes 1, 2, 4, ... that
  fit the cap; the chosen (sp, bs) maximises samples per GPU-second. With PAC the memory left
  under the cap buys not-checkpointing layers.

Checkpointing is "the first ``k`` layers recompute" (``MicroBatch.ckpt_layers``). All layers of a
model are identical, so the PAC knapsack over layers (weight: extra activation bytes of keeping a
layer, value: its saved recompute time) has an exact greedy optimum: keep as many layers as the
memory left affords, i.e. the smallest ``k`` that fits. `fewest_ckpt_layers` computes it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dcp_bench.cost.base import CostModel
from dcp_bench.errors import InfeasibleError

SP = int | np.ndarray  # one SP degree for every sample, or one per sample


def _at(sp: SP, idx: np.ndarray) -> SP:
    """``sp`` for the samples ``idx`` (a per-sample array is indexed, one degree is kept)."""
    return sp if np.ndim(sp) == 0 else np.asarray(sp)[idx]


def _memory(cost: CostModel, t: np.ndarray, f: np.ndarray, sp: SP, k: int) -> np.ndarray:
    if np.ndim(sp) == 0:
        return np.asarray(cost.sample_memory(t, f, int(sp), k), dtype=float)
    return np.asarray(cost.sample_memory_many(t, f, np.asarray(sp), np.full(len(t), k)), float)


def _time(
    cost: CostModel, t: np.ndarray, f: np.ndarray, sp: SP, k: int, packed: bool
) -> np.ndarray:
    if np.ndim(sp) == 0:
        fn = cost.sample_time_packed if packed else cost.sample_time
        return np.asarray(fn(t, f, int(sp), k), dtype=float)
    many = cost.sample_time_packed_many if packed else cost.sample_time_many
    return np.asarray(many(t, f, np.asarray(sp), np.full(len(t), k)), dtype=float)


def fewest_ckpt_layers(
    cost: CostModel, tokens: np.ndarray, frames: np.ndarray, sp: SP, budget: np.ndarray | float
) -> np.ndarray:
    """Vectorised: the smallest ``k`` (layers checkpointed) with activation memory <= ``budget``
    per sample, or -1 where even ``k = num_layers`` does not fit (see `ckpt_and_memory`)."""
    return ckpt_and_memory(cost, tokens, frames, sp, budget)[0]


def ckpt_and_memory(
    cost: CostModel, tokens: np.ndarray, frames: np.ndarray, sp: SP, budget: np.ndarray | float
) -> tuple[np.ndarray, np.ndarray]:
    """Vectorised: the smallest ``k`` (layers checkpointed) with activation memory <= ``budget``
    per sample, or -1 where even ``k = num_layers`` does not fit; and the memory without
    checkpointing. ``sp``: one SP degree, or one per sample (the batched cost-model calls).

    Memory is non-increasing in ``k``. Between ``k = 1`` and ``k = num_layers - 1`` it is
    usually affine (the end points may differ by a recompute peak); when a midpoint check
    confirms it, a closed form gives the answer; otherwise every ``k`` is evaluated.
    """
    L = cost.model.num_layers
    budget = np.broadcast_to(np.asarray(budget, dtype=float), tokens.shape)
    k = np.full(tokens.shape, -1, dtype=np.int64)
    m0 = _memory(cost, tokens, frames, sp, 0)
    k[m0 <= budget] = 0
    todo = m0 > budget
    if not todo.any() or L == 0:
        return k, m0
    idx = np.flatnonzero(todo)
    t, f, bud, s = tokens[idx], frames[idx], budget[idx], _at(sp, idx)
    mL = _memory(cost, t, f, s, L)
    fits = mL <= bud
    if not fits.any():
        return k, m0
    idx, t, f, bud, mL, s = idx[fits], t[fits], f[fits], bud[fits], mL[fits], _at(s, fits)
    sub = np.full(len(idx), -1, dtype=np.int64)
    m1 = _memory(cost, t, f, s, 1)
    affine = L <= 2
    if L > 2:
        # Segment [1, L-1] (k = 0 may differ by the recomputed layer, k = L by the recompute
        # peak): affine when the midpoint agrees.
        mT = _memory(cost, t, f, s, L - 1)
        mid = L // 2
        m_mid = _memory(cost, t, f, s, mid)
        affine = bool(np.allclose(m_mid, m1 + (mT - m1) * (mid - 1) / (L - 2), rtol=1e-9, atol=1.0))
    if affine and L > 2:
        per_layer = (m1 - mT) / (L - 2)  # bytes saved by checkpointing one more layer
        need = 1 + np.ceil((m1 - bud) / np.maximum(per_layer, 1e-300) - 1e-9)
        sub = np.clip(need, 1, L - 1).astype(np.int64)
        sub[m1 <= bud] = 1
        sub[mT > bud] = L  # only full recompute fits (mL <= bud is known)
    else:
        for kk in range(1, L + 1):
            open_ = sub < 0
            if not open_.any():
                break
            mem = _memory(cost, t[open_], f[open_], _at(s, open_), kk)
            sub[np.flatnonzero(open_)[mem <= bud[open_]]] = kk
    k[idx] = sub
    return k, m0


def time_at_ckpt(
    cost: CostModel,
    tokens: np.ndarray,
    frames: np.ndarray,
    sp: SP,
    k: np.ndarray,
    packed: bool = False,
) -> np.ndarray:
    """Vectorised per-sample time with a per-sample checkpoint count ``k`` (>= 0); with
    ``packed`` the sample's share of a well-filled micro-batch (`CostModel.sample_time_packed`)
    instead of its time alone. ``sp``: one SP degree, or one per sample.

    Recompute time is one extra forward of each checkpointed layer, affine in ``k``; checked at
    the midpoint like memory, with an exact per-``k`` fallback.
    """
    L = cost.model.num_layers
    t0 = _time(cost, tokens, frames, sp, 0, packed)
    if not np.any(k > 0):
        return t0
    tL = _time(cost, tokens, frames, sp, L, packed)
    out = t0 + (tL - t0) * k / L
    probe = (k > 0) & (k < L)
    if probe.any():
        kk = int(np.median(k[probe]))
        exact = _time(cost, tokens[probe], frames[probe], _at(sp, probe), kk, packed)
        guess = t0[probe] + (tL[probe] - t0[probe]) * kk / L
        if not np.allclose(exact, guess, rtol=1e-9, atol=1e-12):
            for kv in np.unique(k[probe]):
                sel = k == kv
                out[sel] = _time(cost, tokens[sel], frames[sel], _at(sp, sel), int(kv), packed)
    return out


@dataclass
class ShapeTable:
    """Settings of every distinct (tokens, frames) shape of a batch at every SP degree.

    ``ckpt[i, j]`` is the fewest checkpointed layers for shape ``i`` at ``sps[j]`` (-1: does not
    fit), ``time[i, j]`` its time run alone (inf when it does not fit), ``mem[i, j]`` its
    activation bytes per rank at that setting.
    """

    tokens: np.ndarray  # (m,)
    frames: np.ndarray  # (m,)
    inverse: np.ndarray  # (n,): sample position -> shape index
    sps: np.ndarray  # (k,)
    ckpt: np.ndarray  # (m, k) int
    time: np.ndarray  # (m, k) float
    mem: np.ndarray  # (m, k) float
    # (k,): each column's Ulysses span: its size for Ulysses, less for a ring or hybrid group
    # (`CostModel.ring_settings`); None: every column is Ulysses.
    ulysses: np.ndarray | None = None

    def is_ring(self) -> np.ndarray:
        """(k,): whether each column is a ring or hybrid group."""
        if self.ulysses is None:
            return np.zeros(len(self.sps), dtype=bool)
        return self.ulysses != self.sps

    @property
    def gpu_seconds(self) -> np.ndarray:
        return self.time * self.sps[None, :]


def build_shape_table(
    tokens: np.ndarray,
    frames: np.ndarray,
    cost: CostModel,
    packed: bool = False,
    ring: bool = False,
) -> ShapeTable:
    """Evaluate every distinct shape at every SP degree the model can run on the cluster
    (`CostModel.sp_degrees`; a few vectorised calls each).

    ``packed``: the time a sample costs when micro-batches are packed: its packed share (see
    `time_at_ckpt`) where it can share a micro-batch with others (no recompute and at most half
    the memory budget), its time alone otherwise (a micro-batch it fills mostly by itself pays
    the fixed small-kernel costs alone).

    ``ring``: also the ring and hybrid groups (`CostModel.ring_settings`) as further columns,
    for the shapes that may need them (`add_ring_columns`)."""
    table = _ulysses_shape_table(tokens, frames, cost, packed)
    if ring and cost.ring_settings():
        table = add_ring_columns(table, cost)
    return table


# Ring and hybrid columns are priced for shapes whose fastest Ulysses time is at least this share
# of the slowest shape's (or that fit no Ulysses degree): short samples gain nothing from a group
# wider than the heads allow (a ring's transfers make it dearer), while long ones may (a wider
# group needs less recompute). On a 3-node step with documents up to 175K tokens, 0.1 gave the
# same plan as pricing every shape; 0.25 and more left dcp 1.8-3% further from the bound.
RING_SHAPE_SHARE = 0.1


def add_ring_columns(table: ShapeTable, cost: CostModel) -> ShapeTable:
    """``table`` with one column per ring or hybrid group (`CostModel.ring_settings`), sorted by
    size after the Ulysses columns (every ring size exceeds every Ulysses degree or lies between
    aligned ones; columns stay ascending by size). A shape gets its fewest checkpointed layers
    (memory depends on the tokens per rank only) and its time alone on that group, priced as a
    ring or hybrid micro-batch (`CostModel.microbatch_costs` with ``ulysses``); shapes far from
    the longest (`RING_SHAPE_SHARE`) are left unfit (inf) there."""
    settings = cost.ring_settings()
    fastest = table.time.min(axis=1)
    top = float(fastest.max()) if len(fastest) else 0.0
    need = np.flatnonzero(~np.isfinite(fastest) | (fastest >= RING_SHAPE_SHARE * top))
    m, r = len(table.tokens), len(settings)
    ckpt = np.full((m, r), -1, dtype=np.int64)
    time = np.full((m, r), np.inf)
    mem = np.full((m, r), np.inf)
    if len(need):
        budget = cost.memory_cap_bytes - cost.static_memory_bytes()
        sizes = np.asarray([s for s, _ in settings], dtype=np.int64)
        spans = np.asarray([u for _, u in settings], dtype=np.int64)
        t, f = np.repeat(table.tokens[need], r), np.repeat(table.frames[need], r)
        gs, gu = np.tile(sizes, len(need)), np.tile(spans, len(need))
        gk, gm0 = ckpt_and_memory(cost, t, f, gs, budget)
        ok = np.flatnonzero(gk >= 0)
        gt = np.full(len(t), np.inf)
        if len(ok):
            c = cost.microbatch_costs(
                t[ok], f[ok], np.arange(len(ok)), gs[ok], gk[ok], ulysses=gu[ok]
            )
            gt[ok] = cost.total_time(c)
        ckpt[need] = gk.reshape(len(need), r)
        time[need] = gt.reshape(len(need), r)
        mem[need] = np.where(gk >= 0, gm0, np.inf).reshape(len(need), r)
    sps = np.concatenate([table.sps, [s for s, _ in settings]]).astype(np.int64)
    uly = np.concatenate([table.sps, [u for _, u in settings]]).astype(np.int64)
    order = np.argsort(sps, kind="stable")
    return ShapeTable(
        table.tokens,
        table.frames,
        table.inverse,
        sps[order],
        np.concatenate([table.ckpt, ckpt], axis=1)[:, order],
        np.concatenate([table.time, time], axis=1)[:, order],
        np.concatenate([table.mem, mem], axis=1)[:, order],
        uly[order],
    )


def _ulysses_shape_table(
    tokens: np.ndarray, frames: np.ndarray, cost: CostModel, packed: bool
) -> ShapeTable:
    """`build_shape_table`'s Ulysses columns."""
    key = tokens.astype(np.int64) * (1 << 20) + frames.astype(np.int64)
    uniq, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    ut, uf = tokens[first], frames[first]
    sps = np.asarray(cost.sp_degrees(), dtype=np.int64)
    m, kk = len(ut), len(sps)
    budget = cost.memory_cap_bytes - cost.static_memory_bytes()
    # The whole (shape x degree) grid at once, row-major (shape i at degree j is i * kk + j):
    # a handful of batched cost-model calls instead of a handful per degree. A shape that fits
    # at some degree without checkpointing never needs a larger one for memory; it is still
    # evaluated everywhere so the scheduler may raise its degree.
    gt, gf, gs = np.repeat(ut, kk), np.repeat(uf, kk), np.tile(sps, m)
    gk, gm0 = ckpt_and_memory(cost, gt, gf, gs, budget)
    ok = gk >= 0
    gtime = np.full(m * kk, np.inf)
    gmem = np.full(m * kk, np.inf)
    if ok.any():
        gtime[ok] = time_at_ckpt(cost, gt[ok], gf[ok], gs[ok], gk[ok], packed)
        # Memory without checkpointing decides packing (only k = 0 samples are packed).
        gmem[ok] = gm0[ok]
        if packed:
            alone = ok & ((gk > 0) | (gmem > budget / 2))
            if alone.any():
                gtime[alone] = time_at_ckpt(cost, gt[alone], gf[alone], gs[alone], gk[alone], False)
    ckpt = np.where(ok, gk, -1).reshape(m, kk)
    time = gtime.reshape(m, kk)
    mem = gmem.reshape(m, kk)
    return ShapeTable(ut, uf, inverse.astype(np.int64), sps, ckpt, time, mem)


def largest_fitting_length(cost: CostModel, frames: int = 1, sp: int | None = None) -> int:
    """The longest sample (tokens) that fits the cap at the largest SP degree the model can run
    with full recompute: what an infeasibility error reports. Video keeps the frame count and
    grows the spatial size; text (frames=1) grows the length."""
    sp = cost.sp_degrees()[-1] if sp is None else sp
    L = cost.model.num_layers
    budget = cost.memory_cap_bytes - cost.static_memory_bytes()

    def fits(n_tokens: int) -> bool:
        t = np.asarray([n_tokens], dtype=np.int64)
        f = np.asarray([frames], dtype=np.int64)
        return bool(cost.sample_memory(t, f, sp, L)[0] <= budget)

    step = frames
    if not fits(step):
        return 0
    lo, hi = 1, 2
    while fits(hi * step) and hi < (1 << 40):
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid * step):
            lo = mid
        else:
            hi = mid
    return lo * step


def raise_if_infeasible(
    table: ShapeTable, batch_tokens: np.ndarray, batch_frames: np.ndarray, cost: CostModel
) -> None:
    """`InfeasibleError` for the first sample that fits no SP degree even with full recompute."""
    bad = np.flatnonzero((table.ckpt < 0).all(axis=1))
    if len(bad) == 0:
        return
    i = int(bad[np.argmax(table.tokens[bad])])
    t, f = int(table.tokens[i]), int(table.frames[i])
    limit = largest_fitting_length(cost, frames=f, sp=int(table.sps.max()))
    shape = f"{t} tokens ({f} frames x {t // f})" if f > 1 else f"{t} tokens"
    rings = (
        ""
        if table.ulysses is None or not table.is_ring().any()
        else " nor the ring or hybrid groups of "
        + ", ".join(str(int(x)) for x in table.sps[table.is_ring()])
        + " GPUs"
    )
    raise InfeasibleError(
        f"a sample of {shape} fits none of the runnable SP degrees "
        f"{cost.describe_sp_degrees()}{rings} even with all {cost.model.num_layers} layers "
        "recomputed "
        f"(memory cap {cost.memory_cap_bytes / 2**30:.1f} GiB); the largest that fits is "
        f"{limit} tokens" + (f" at {f} frames" if f > 1 else "")
    )


# ---------------------------------------------------------------------------------------------
# Faithful DCP: size buckets and their profiled (sp, bs, ckpt) setting.


@dataclass(frozen=True)
class BucketSetting:
    """One bucket's profiled setting: SP degree, batch size (samples per micro-batch),
    checkpointed layers, and the time of one full micro-batch of the bucket's shape."""

    tokens: int  # representative (largest) shape of the bucket
    frames: int
    sp: int
    bs: int
    ckpt_layers: int
    time_s: float

    @property
    def samples_per_gpu_second(self) -> float:
        return self.bs / (self.sp * self.time_s)


def bucket_keys(
    tokens: np.ndarray, frames: np.ndarray, per_octave: int = 2
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Bucket every sample. Video (any sample with frames > 1): the distinct (T', S) shapes, as
    the reference's resolution x frame-count grid. Text: log-spaced length buckets, ``per_octave``
    a factor of two; a bucket's representative is its upper edge (what a profile would measure).

    Returns (bucket index per sample, representative tokens, representative frames).
    """
    if len(tokens) == 0:
        e = np.zeros(0, dtype=np.int64)
        return e, e, e
    if np.any(frames > 1):
        key = tokens.astype(np.int64) * (1 << 20) + frames.astype(np.int64)
        uniq, first, inv = np.unique(key, return_index=True, return_inverse=True)
        return inv.astype(np.int64), tokens[first].astype(np.int64), frames[first].astype(np.int64)
    edge_index = np.ceil(np.log2(np.maximum(tokens, 1)) * per_octave - 1e-9).astype(np.int64)
    uniq, inv = np.unique(edge_index, return_inverse=True)
    rep = np.floor(2.0 ** (uniq / per_octave) + 1e-6).astype(np.int64)
    # The edge may round below the longest member; never let a member exceed its representative.
    longest = np.zeros(len(uniq), dtype=np.int64)
    np.maximum.at(longest, inv, tokens.astype(np.int64))
    rep = np.maximum(rep, longest)
    return inv.astype(np.int64), rep, np.ones(len(uniq), dtype=np.int64)


def profile_bucket(
    cost: CostModel,
    tokens: int,
    frames: int,
    pac: bool,
    max_bs: int = 1 << 12,
    cross_node: bool = True,
) -> BucketSetting | None:
    """The reference profile of one bucket: SP degrees inside a node first (across nodes only
    when nothing fits inside one), batch sizes 1, 2, 4, ... that fit the cap; without PAC every
    layer is checkpointed, with PAC the fewest layers that fit. Returns the (sp, bs) with the
    most samples per GPU-second, or None when the bucket fits nowhere (the reference skips it).
    """
    L = cost.model.num_layers
    budget = cost.memory_cap_bytes - cost.static_memory_bytes()
    gpn = cost.cluster.gpus_per_node
    all_sps = cost.sp_degrees()
    inside = [s for s in all_sps if s <= gpn]
    outside = [s for s in all_sps if s > gpn]
    t1 = np.asarray([tokens], dtype=np.int64)
    f1 = np.asarray([frames], dtype=np.int64)
    for sps in (inside, outside if cross_node else []):
        best: BucketSetting | None = None
        for sp in sps:
            one_full = float(cost.sample_memory(t1, f1, sp, L)[0])
            if one_full > budget:
                continue
            bs = 1
            while bs <= max_bs and bs * one_full <= budget:
                if pac:
                    k = int(fewest_ckpt_layers(cost, np.repeat(t1, 1), f1, sp, budget / bs)[0])
                else:
                    k = L
                tk = np.repeat(t1, bs)
                fk = np.repeat(f1, bs)
                c = cost.microbatch_cost(tk, fk, sp, k)
                if c.mem_bytes > cost.memory_cap_bytes:
                    break
                cand = BucketSetting(tokens, frames, sp, bs, k, c.total_s)
                if best is None or cand.samples_per_gpu_second > best.samples_per_gpu_second * (
                    1 + 1e-12
                ):
                    best = cand
                bs *= 2
        if best is not None:
            return best
    return None


__all__ = [
    "BucketSetting",
    "ShapeTable",
    "bucket_keys",
    "build_shape_table",
    "ckpt_and_memory",
    "fewest_ckpt_layers",
    "largest_fitting_length",
    "profile_bucket",
    "raise_if_infeasible",
    "time_at_ckpt",
]
