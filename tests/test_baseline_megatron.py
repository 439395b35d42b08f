"""megatron_hybrid_cp: the reference's CP-size rule, L^2 balance and fill-by-doubling behaviour."""

from __future__ import annotations

import numpy as np
import pytest
from test_baselines import real_cost, text_batch, toy

from baselines.megatron_hybrid_cp import MegatronHybridCP, gpus_needed
from dcp_bench.batch import GlobalBatch
from dcp_bench.errors import InfeasibleError
from dcp_bench.plan import validate_plan


def group_size_of(plan):
    return {p: g.size for _, g, mb in plan.micro_batches() for p in mb.samples}


def test_gpus_needed_is_next_power_of_two_of_length_over_budget():
    m = 8192
    cases = {1: 1, 8192: 1, 8193: 2, 16384: 2, 16385: 4, 20000: 4, 65536: 8, 70000: 16, 1_000_000: 128}
    for L, cp in cases.items():
        assert gpus_needed(L, m) == cp
        # closed form of the reference: max(1, 2^ceil(log2(L / m)))
        assert cp == max(1, 2 ** int(np.ceil(np.log2(L / m))))


def test_each_sequence_runs_on_the_cp_size_it_needs_when_ranks_are_all_busy():
    cost = toy()
    # 2 sequences needing CP4 and 40 needing CP1: the first round fills all 32 ranks, so no
    # group is widened and every sequence runs at exactly its needed size
    lengths = [30000, 30000] + [6000] * 40
    batch = GlobalBatch.from_lengths(lengths)
    plan = MegatronHybridCP(max_tokens_per_rank=8192, pack_sequences=False).plan(batch, cost)
    validate_plan(plan, batch, cost)
    sizes = group_size_of(plan)
    assert plan.info["sequences_on_expanded_groups"] == 0
    assert all(sizes[p] == gpus_needed(lengths[p], 8192) for p in range(batch.n))
    # one sequence per micro-batch, as the schedule read runs each sub-sample alone
    assert all(len(mb.samples) == 1 for _, _, mb in plan.micro_batches())


def test_a_lone_sequence_is_widened_to_the_whole_world():
    cost = toy()
    batch = GlobalBatch.from_lengths([10000])
    plan = MegatronHybridCP(max_tokens_per_rank=8192).plan(batch, cost)
    validate_plan(plan, batch, cost)
    # needs CP2; the reference doubles the smallest group until no GPU is idle
    assert [g.size for g in plan.rounds[0].groups] == [32]


def test_round_loads_are_balanced_on_the_l2_estimate():
    cost = toy()
    batch = text_batch(400, seed=5)
    plan = MegatronHybridCP(max_tokens_per_rank=16384).plan(batch, cost)
    validate_plan(plan, batch, cost)
    # per-rank L^2/cp load of the first (full) round: its busiest rank is at most the mean plus
    # the largest single sequence load (greedy least-loaded assignment bound)
    rnd = plan.rounds[0]
    loads, items = [], []
    for g in rnd.groups:
        w = [int(batch.tokens[mb.samples[0]]) ** 2 / g.size for mb in g.micro_batches]
        loads += [sum(w)] * g.size
        items += w
    assert max(loads) <= sum(loads) / len(loads) + max(items) + 1e-6


def test_sequence_needing_more_than_the_world_is_infeasible():
    with pytest.raises(InfeasibleError, match=r"needs 64 context-parallel ranks at max_tokens_per_rank=1000"):
        MegatronHybridCP(max_tokens_per_rank=1000).plan(GlobalBatch.from_lengths([50_000]), toy())


@pytest.mark.parametrize("model", ["llama3_8b", "stdit3_xl2"])
def test_default_budget_plans_validate_on_the_shipped_cost_model(model):
    cost = real_cost(model)
    batch = text_batch(150, seed=2)
    plan = MegatronHybridCP().plan(batch, cost)
    validate_plan(plan, batch, cost)


def test_packing_keeps_the_schedule_and_packs_within_the_per_rank_budget():
    cost, batch = toy(), text_batch(300, seed=7)
    plain = MegatronHybridCP(max_tokens_per_rank=16384, pack_sequences=False).plan(batch, cost)
    packed = MegatronHybridCP(max_tokens_per_rank=16384, pack_sequences=True).plan(batch, cost)
    validate_plan(packed, batch, cost)
    # same rounds and groups (the schedule does not depend on packing), fewer micro-batches
    assert group_size_of(plain) == group_size_of(packed)
    assert sum(1 for _ in packed.micro_batches()) < sum(1 for _ in plain.micro_batches())
    for _, g, mb in packed.micro_batches():
        toks = int(batch.tokens[list(mb.samples)].sum())
        assert len(mb.samples) == 1 or toks <= 16384 * g.size
