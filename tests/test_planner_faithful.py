"""Faithful DCP against independent references: the profile's choice against exhaustive search,
accumulation steps against a brute-force search, intra's tolerance, PAC against full recompute."""

from __future__ import annotations

import itertools

import numpy as np
from test_planner_doubles import quad_cost

from dcp_bench.batch import GlobalBatch
from dcp_bench.plan import validate_plan
from dcp_bench.planners.dcp_faithful import (
    DCPInterPACPlanner,
    DCPInterPlanner,
    DCPIntraPlanner,
    accumulation_steps,
)
from dcp_bench.planners.settings import bucket_keys, profile_bucket


def test_profile_choice_is_best_samples_per_gpu_second() -> None:
    """Against exhaustive search over intra-node SP degrees and power-of-two batch sizes with
    every layer checkpointed: the profile's (sp, bs) has the most samples per GPU-second."""
    cost = quad_cost(16)
    L = cost.model.num_layers
    for tokens in (2000, 30_000, 200_000):
        got = profile_bucket(cost, tokens, 1, pac=False)
        assert got is not None
        best = 0.0
        for sp, bs in itertools.product((1, 2, 4, 8), [2**i for i in range(13)]):
            c = cost.microbatch_cost(np.full(bs, tokens), np.ones(bs, dtype=np.int64), sp, L)
            if c.mem_bytes <= cost.memory_cap_bytes:
                best = max(best, bs / (sp * c.total_s))
        assert np.isclose(got.samples_per_gpu_second, best)


def test_pac_keeps_layers_only_where_memory_allows() -> None:
    """PAC never checkpoints more than full recompute and is never slower per sample; short
    buckets keep every layer, the longest recompute."""
    cost = quad_cost(8)
    short = profile_bucket(cost, 500, 1, pac=True)
    long = profile_bucket(cost, 600_000, 1, pac=True)
    full = profile_bucket(cost, 600_000, 1, pac=False)
    assert short is not None and long is not None and full is not None
    assert short.ckpt_layers == 0
    assert long.ckpt_layers > 0
    assert long.samples_per_gpu_second >= full.samples_per_gpu_second * (1 - 1e-12)


def test_accumulation_steps_match_brute_force() -> None:
    """The chosen step counts minimise the reference's mismatch score over all candidates."""
    rng = np.random.default_rng(1)
    for _ in range(20):
        times = rng.uniform(0.1, 3.0, int(rng.integers(1, 5))).tolist()
        lo, hi = 1, 3
        steps = accumulation_steps(times, lo, hi)
        assert all(lo <= k <= hi for k in steps)

        def score(ks: tuple[int, ...], target: float, times: list[float] = times) -> float:
            return sum(
                1.2 * (t * k - target) if t * k > target else target - t * k
                for t, k in zip(times, ks)
            )

        targets = [
            t * m for t in times for m in range(lo, hi + 1) if t * m <= max(times) * hi + 1e-12
        ]
        best = min(
            min(score(ks, tg) for ks in itertools.product(range(lo, hi + 1), repeat=len(times)))
            for tg in targets
        )
        got = min(score(tuple(steps), tg) for tg in targets)
        assert got <= best + 1e-9


def test_text_buckets_are_log_spaced_and_cover_their_members() -> None:
    tokens = np.array([10, 11, 100, 1000, 1500, 70_000])
    inv, rep, frames = bucket_keys(tokens, np.ones_like(tokens), per_octave=2)
    assert np.all(rep[inv] >= tokens)
    assert np.all(frames == 1)
    assert inv[0] == inv[1] and len(set(inv.tolist())) == 5


def test_intra_runs_one_micro_batch_per_group_and_inter_accumulates() -> None:
    """DCP-intra balances by batch size and SP degree only (one micro-batch per group and
    round); DCP-inter gives groups their own micro-step counts within the bounds."""
    cost = quad_cost(16)
    rng = np.random.default_rng(4)
    batch = GlobalBatch.from_lengths(rng.integers(100, 100_000, 120))
    intra = DCPIntraPlanner().plan(batch, cost)
    validate_plan(intra, batch, cost)
    assert all(len(g.micro_batches) == 1 for r in intra.rounds for g in r.groups)
    inter = DCPInterPlanner(max_steps=3).plan(batch, cost)
    validate_plan(inter, batch, cost)
    counts = [len(g.micro_batches) for r in inter.rounds for g in r.groups]
    assert max(counts) <= 3 and min(counts) >= 1


def test_inter_pac_no_slower_than_inter_in_reference_executor() -> None:
    """PAC only removes recompute: the same schedule shape with fewer checkpointed layers."""
    cost = quad_cost(8)
    rng = np.random.default_rng(5)
    batch = GlobalBatch.from_lengths(rng.integers(100, 50_000, 64))
    a = DCPInterPlanner().plan(batch, cost)
    b = DCPInterPACPlanner().plan(batch, cost)
    for p in (a, b):
        validate_plan(p, batch, cost)
    ck_a = [mb.ckpt_layers for _, _, mb in a.micro_batches()]
    ck_b = [mb.ckpt_layers for _, _, mb in b.micro_batches()]
    assert max(ck_b) <= max(ck_a) == cost.model.num_layers
