"""FlexSP's setup: its fitted cost model, its solver's rules in flexsp_milp, the DeepSpeed-Ulysses
baseline as FlexSP configured it, and its corpora, each against hand-worked cases."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from baselines.deepspeed_ulysses import (
    DeepSpeedUlysses,
    best_fit_decreasing,
    deal_into_microbatches,
)
from baselines.flexsp_milp import (
    FlexSPMILP,
    RoundModel,
    min_valid_chunks,
    round_slots,
    sort_consec_chunks,
)
from dcp_bench.batch import GlobalBatch
from dcp_bench.cost import make_cost_model
from dcp_bench.cost.specs import cluster_spec
from dcp_bench.errors import ConfigError, InfeasibleError, WorkloadError
from dcp_bench.plan import validate_plan
from dcp_bench.workloads.flexsp_corpus import read_flexsp_corpus

ONE = np.ones(2, dtype=np.int64)


def fitted(world: int = 64, **kw: object):
    cluster = cluster_spec("a100x64").resized(world)
    return make_cost_model("gpt_7b", cluster, source="flexsp_fitted", **kw)


# ---------------------------------------------------------------- FlexSP's fitted cost model


def test_fitted_cost_matches_hand_worked_group() -> None:
    # GPT-7B, sequences 4096 and 8192 on SP 8 (solver.py:73-99 by hand):
    # compute = (5.128e-6 * (4096^2 + 8192^2) + 0.1839576 * 12288) / 8 + 629.3563 = 965.686 ms
    # all-to-all = 4*2*32*4096*12288*2 / 2^20 / 8 MiB = 3072 MiB at 96.5 MiB/ms = 31.834 ms
    c = fitted().microbatch_cost(np.array([4096, 8192]), ONE, 8, 0)
    assert c.fwd_s == pytest.approx(0.965686, rel=1e-5)
    assert c.comm_s == pytest.approx(0.031834, rel=1e-4)
    assert c.total_s == pytest.approx(0.997520, rel=1e-5)
    # no all-to-all on one rank
    assert fitted().microbatch_cost(np.array([4096]), ONE[:1], 1, 0).comm_s == 0.0


def test_fitted_memory_gives_flexsp_token_capacity() -> None:
    # token_capacity (solver.py:69-70) at 30 GB, 64 GPUs, 192K (param size 7.1174 B, ZeRO-3):
    # (30 * 1024 - 7.1174469 * 16 / 64 * 1024) / 4.480441895 = 6449.8 tokens per GPU
    cost = fitted(seq_limit_k=192)
    assert cost.microbatch_token_capacity(1, 0) == pytest.approx(6449.795, rel=1e-6)
    # 384K uses the larger parameter size (solver.py:1068): fewer tokens fit
    assert fitted(seq_limit_k=384).microbatch_token_capacity(1, 0) < 6449


def test_fitted_cost_refuses_what_it_does_not_price() -> None:
    with pytest.raises(ConfigError, match="no constants for model 'llama2_7b'"):
        make_cost_model("llama2_7b", "a100x64", source="flexsp_fitted")
    with pytest.raises(ConfigError, match="scales and profile"):
        make_cost_model(
            "llama2_7b", "a100x64", source="flexsp_fitted", flexsp_model="gpt_7b",
            scales={"a2a_eff": 2.0},
        )  # fmt: skip
    with pytest.raises(ConfigError, match="split='batch'"):
        fitted().microbatch_cost(np.array([8]), ONE[:1], 1, 0, "batch")


# ---------------------------------------------------------------- FlexSP's chunking


def test_sort_consec_hand_worked() -> None:
    # longest first: 5 (p0), 4 (p2), 3 (p4), 2 (p3), 1 (p1); two chunks: [5,4] | [3,2,1] has
    # the smallest largest chunk (9; [5] | rest is 10)
    assert sort_consec_chunks(np.array([5, 1, 4, 2, 3]), 2) == [[0, 2], [4, 3, 1]]


def test_sort_consec_is_optimal_against_brute_force() -> None:
    rng = np.random.default_rng(3)
    for _ in range(30):
        n = int(rng.integers(2, 8))
        t = rng.integers(1, 50, size=n)
        k = int(rng.integers(1, n + 1))
        chunks = sort_consec_chunks(t, k)
        assert sorted(p for c in chunks for p in c) == list(range(n))
        assert all(chunks)
        got = max(int(t[c].sum()) for c in chunks)
        s = sorted(t.tolist(), reverse=True)
        best = min(
            max(sum(s[a:b]) for a, b in zip((0, *cuts), (*cuts, n)))
            for cuts in itertools.combinations(range(1, n), k - 1)
        )
        assert got == best


def test_min_valid_chunks_hand_worked() -> None:
    # 15 tokens, capacity 10: two chunks [6] | [5, 4] = 9 < 10
    assert min_valid_chunks(np.array([6, 5, 4]), 10) == 2
    # capacity 9: [5, 4] = 9 is not strictly under it (solver.py:580), so three
    assert min_valid_chunks(np.array([6, 5, 4]), 9) == 3


# ---------------------------------------------------------------- FlexSP's program rules


def test_prune_slots_hand_worked() -> None:
    # degrees 2, 4, 8 on 8 ranks; the longest sequence fits only at 4 (one of them): degrees
    # below 4 get (8 - 4 * 1) // 2 = 2 slots instead of 4 (solver.py:294-295)
    mem = np.array([[0.1, 0.05, 0.02], [2.0, 0.9, 0.4]])
    m = RoundModel([0, 1], [2, 4, 8], np.ones((2, 3)), mem, 1.0, 8, prune_slots=True)
    assert round_slots(m) == [0, 0, 1, 1, 2]
    m.prune_slots = False
    assert round_slots(m) == [0, 0, 0, 0, 1, 1, 2]


def test_flexsp_rules_use_the_whole_world_with_no_sp1() -> None:
    # two equal sequences on 8 ranks, no SP 1, every rank used and every group holding one:
    # (4, 4) is the only layout with two groups; one group of 8 is slower (compute is the same,
    # the all-to-all at 8 is slower: 96.5 vs 104.07 MiB/ms, solver.py:1105)
    cost = fitted(8)
    batch = GlobalBatch.from_lengths([8192, 8192])
    planner = FlexSPMILP(
        recompute="none", step_time_limit_s=5.0, min_sp=2, whole_world=True, prune_slots=True,
        chunking="sort_consec", mb_options=1,
    )  # fmt: skip
    plan = planner.plan(batch, cost)
    validate_plan(plan, batch, cost)
    groups = [(g.size, [mb.samples for mb in g.micro_batches]) for g in plan.rounds[0].groups]
    assert sorted(groups) == [(4, [(0,)]), (4, [(1,)])]
    assert plan.info["chunk_counts_tried"] == [1]


def test_flexsp_options_refused_with_the_bad_value() -> None:
    with pytest.raises(ConfigError, match="min_sp=3"):
        FlexSPMILP(min_sp=3)
    with pytest.raises(ConfigError, match="chunking='dp'"):
        FlexSPMILP(chunking="dp")
    with pytest.raises(ConfigError, match="mb_options=5 applies to chunking='sort_consec'"):
        FlexSPMILP(mb_options=5)


# ---------------------------------------------------------------- DeepSpeed-Ulysses


def test_best_fit_decreasing_hand_worked() -> None:
    # 7 opens bin 0 (room 3); 5 opens bin 1 (room 5); 4 -> bin 1 (room 1); 3 -> bin 0 (room 0);
    # 1 -> bin 1 (room 0)
    assert best_fit_decreasing([7, 5, 4, 3, 1], 10) == [[0, 3], [1, 2, 4]]
    with pytest.raises(InfeasibleError, match="sample 0 \\(11\\) is over the group capacity 10"):
        best_fit_decreasing([11], 10)


def test_microbatch_dealing_fills_then_evens_hand_worked() -> None:
    lengths = [7, 5, 4, 3, 1]
    bins = [[0, 3], [1, 2, 4]]
    # fill: the empty groups take the first sequence of the latest group holding two or more:
    # [[0, 3], [4], [1], [2]]; without evening that is the result
    assert deal_into_microbatches(bins, lengths, 4, 10, False) == [[[0, 3], [4], [1], [2]]]
    # evening (average 20 // 4 = 5): group 1 (1 token) takes 7 from group 0 -> [0, 4] (8);
    # group 3 (4 tokens) cannot take 7 (11 > 10), takes 1 -> [2, 4] (5)
    assert deal_into_microbatches(bins, lengths, 4, 10, True) == [[[3], [0], [1], [2, 4]]]


def test_deepspeed_plan_is_valid_and_follows_the_groups() -> None:
    cost = fitted(8)
    rng = np.random.default_rng(0)
    # at 8 GPUs ZeRO-3 leaves 3,603 tokens per GPU: 14,412 per group of 4
    batch = GlobalBatch.from_lengths(rng.integers(128, 9000, size=24))
    plan = DeepSpeedUlysses(sp=4).plan(batch, cost)
    validate_plan(plan, batch, cost)
    assert plan.round_barrier
    assert len(plan.rounds) > 1
    assert all(len(r.groups) == 2 and all(g.size == 4 for g in r.groups) for r in plan.rounds)
    cap = int(cost.microbatch_token_capacity(4, 0)) * 4
    for r in plan.rounds:
        for g in r.groups:
            assert sum(int(batch.tokens[p]) for mb in g.micro_batches for p in mb.samples) <= cap
    with pytest.raises(InfeasibleError, match="holds 20000 tokens, over its capacity 14412"):
        DeepSpeedUlysses(sp=4).plan(GlobalBatch.from_lengths([20000, 100, 100]), cost)


# ---------------------------------------------------------------- corpora


def test_flexsp_corpus_pads_and_drops_as_the_driver(tmp_path) -> None:
    # world 4: pad to multiples of 8, keep padded <= 1000 * 1 - 8 = 992 (solver.py:999-1000)
    f = tmp_path / "github.txt"
    f.write_text("1\n8\n9\n992\n993\n5000\n")
    c = read_flexsp_corpus("github", f, 1, 4)
    assert c.lengths.tolist() == [8, 8, 16, 992]
    assert (c.read, c.dropped) == (6, 2)
    b = c.batches(2, 1, 1)[0]
    assert b.tokens.tolist() == [16, 992] and b.sample_ids.tolist() == [2, 3]
    with pytest.raises(WorkloadError, match="iteration 2 needs lengths 4..5"):
        c.batches(2, 2, 1)
    w = tmp_path / "wikipedia.txt"
    w.write_text("1\n")
    with pytest.raises(WorkloadError, match="expected the published"):
        read_flexsp_corpus("wikipedia", w, 1, 4)


def test_fitted_parameter_size_interpolates_between_the_driver_s_lengths() -> None:
    # 288K is half way between 192K and 384K (solver.py:1112): 7.11745 + (7.84987 - 7.11745) / 2
    # = 7.48366 B parameters; ZeRO-3 states 16 bytes each over 64 GPUs = 1,915.82 MiB per GPU
    cost = fitted(seq_limit_k=288)
    assert cost.static_memory_bytes() / 2**20 == pytest.approx(1915.8164, rel=1e-6)
    # GPT-30B's constants (solver.py:1079-1087): one 1,000-token sequence on SP 1 takes
    # 15.4262e-6 * 1e6 + 0.8035742 * 1000 + 2789.3644 = 3608.365 ms
    big = make_cost_model("gpt_30b", "a100x64", source="flexsp_fitted")
    assert big.sample_time(np.array([1000]), ONE[:1], 1, 0)[0] == pytest.approx(3.608365, rel=1e-6)
