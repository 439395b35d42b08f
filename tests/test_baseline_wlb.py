"""wlb_llm: workload-balanced variable-length packing and the outlier-delay rule."""

from __future__ import annotations

import numpy as np
import pytest
from test_baselines import text_batch, toy

from baselines.wlb_llm import WLBLLM, workload_balanced_bins
from dcp_bench.batch import GlobalBatch
from dcp_bench.errors import ConfigError, InfeasibleError
from dcp_bench.plan import validate_plan


def test_bins_balance_workload_not_tokens():
    # one long sequence (quadratic workload) and many short ones: the long one's bin gets few
    # other tokens, so bins differ in tokens but not much in workload
    tokens = np.array([64000] + [2000] * 2000)
    work = 1e-6 * tokens + 1e-10 * tokens.astype(float) ** 2
    bins = workload_balanced_bins(work, tokens, np.zeros(len(tokens)), 8, 10**9, 1.0)
    assert bins is not None and sorted(i for b in bins for i in b) == list(range(len(tokens)))
    loads = [work[b].sum() for b in bins]
    # greedy list scheduling bound: the heaviest bin exceeds the mean by at most one item
    assert max(loads) <= np.mean(loads) + work.max() + 1e-12
    toks = [tokens[b].sum() for b in bins]
    assert max(toks) > 2 * min(toks)  # variable length: token counts differ widely


def test_bins_respect_token_capacity_or_report_none():
    tokens = np.array([5000, 5000, 5000])
    work = tokens.astype(float)
    assert workload_balanced_bins(work, tokens, np.zeros(3), 1, 12000, 1.0) is None
    bins = workload_balanced_bins(work, tokens, np.zeros(3), 2, 12000, 1.0)
    assert bins is not None and all(tokens[b].sum() <= 12000 for b in bins)


def test_fair_mode_runs_every_sample_and_balances_replicas():
    cost, batch = toy(), text_batch(400, seed=11)
    plan = WLBLLM(sp=4).plan(batch, cost)
    validate_plan(plan, batch, cost)
    assert plan.info["delayed_samples"] == []
    t = cost.sample_time(batch.tokens, batch.frames, 4, cost.model.num_layers)
    loads = [sum(t[p] for mb in g.micro_batches for p in mb.samples) for g in plan.rounds[0].groups]
    bin_loads = [sum(t[p] for p in mb.samples) for _, _, mb in plan.micro_batches()]
    assert max(loads) <= np.mean(loads) + max(bin_loads) + 1e-12
    for _, _, mb in plan.micro_batches():
        assert batch.tokens[list(mb.samples)].sum() <= plan.info["token_capacity"]


@pytest.mark.parametrize("n_outliers,delayed", [(3, 3), (9, 1), (16, 0)])
def test_paper_mode_delays_outliers_that_cannot_go_one_per_replica(n_outliers, delayed):
    cost = toy()
    lengths = [100_000 + i for i in range(n_outliers)] + [1000] * 600
    batch = GlobalBatch.from_lengths(lengths)
    plan = WLBLLM(mode="paper", sp=4).plan(batch, cost)  # 8 replicas
    validate_plan(plan, batch, cost)
    got = plan.info["delayed_samples"]
    assert len(got) == delayed
    # the shortest outliers wait; the released ones are spread one per replica per round
    assert got == sorted(range(delayed))
    used = set(plan.sample_positions())
    assert used.isdisjoint(got) and len(used) + delayed == batch.n


def test_bad_configuration_errors():
    with pytest.raises(ConfigError, match="sp=64 is larger than the world"):
        WLBLLM(sp=64).plan(text_batch(10), toy())
    with pytest.raises(InfeasibleError, match="token_capacity=4096 is below the sequence of 50000"):
        WLBLLM(sp=1, token_capacity=4096).plan(GlobalBatch.from_lengths([1000, 50_000]), toy())
