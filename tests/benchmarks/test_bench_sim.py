"""Simulator speed (pytest-benchmark; `make bench`). Goals from the issue, checked by reading the
benchmark table, never asserted: 200 steps of a 32-GPU plan with 500+ samples per step in under
2 s; one step of 1,024 GPUs and 16,384 samples in under 1 s."""

from __future__ import annotations

import dataclasses

import numpy as np

from dcp_bench.batch import GlobalBatch
from dcp_bench.cost import make_cost_model
from dcp_bench.cost.specs import cluster_spec
from dcp_bench.plan import Group, MicroBatch, Round, StepPlan, validate_plan
from dcp_bench.sim import lower_bound, simulate_step


def mixed_plan(
    batch: GlobalBatch, world: int, rng: np.random.Generator, layers: int = 32
) -> StepPlan:
    """A valid plan of groups of sizes 1..8 tiling the world; samples dealt longest-first to the
    group with the least tokens per rank, packed into micro-batches of at most 12K tokens per rank,
    half or all layers checkpointed (all of them above 8K tokens per rank: under the cap)."""
    sizes, start = [], 0
    while start < world:
        s = int(rng.choice([1, 2, 4, 8]))
        while start % s or start + s > world:
            s //= 2
        sizes.append((start, s))
        start += s
    load = np.zeros(len(sizes))
    members: list[list[int]] = [[] for _ in sizes]
    for i in np.argsort(-batch.tokens):
        g = int(np.argmin(load))
        members[g].append(int(i))
        load[g] += batch.tokens[i] / sizes[g][1]

    def ckpt(samples: list[int], s: int) -> int:
        half = int(rng.choice([layers // 2, layers]))
        return layers if batch.tokens[samples].sum() > 8192 * s else half

    groups = []
    for (st, s), mem in zip(sizes, members):
        mbs: list[MicroBatch] = []
        cur: list[int] = []
        for i in mem:
            if cur and batch.tokens[cur].sum() + batch.tokens[i] > 12288 * s:
                mbs.append(MicroBatch(tuple(cur), ckpt(cur, s)))
                cur = []
            cur.append(i)
        if cur:
            mbs.append(MicroBatch(tuple(cur), ckpt(cur, s)))
        if mbs:
            groups.append(Group(st, s, mbs))
    return StepPlan(world, [Round(groups)])


def test_bench_200_steps_32_gpus(benchmark):
    cost = make_cost_model("llama3_8b", "h200x32")
    rng = np.random.default_rng(0)
    cases = []
    for step in range(200):
        batch = GlobalBatch.from_lengths(rng.integers(64, 16384, size=520), step=step)
        cases.append((mixed_plan(batch, 32, rng), batch))
    validate_plan(*cases[0], cost)

    def run() -> float:
        return sum(simulate_step(p, b, cost).step_time_s for p, b in cases)

    assert benchmark(run) > 0


def test_bench_one_step_1024_gpus_16k_samples(benchmark):
    cluster = dataclasses.replace(cluster_spec("h200x64"), name="h200x1024", num_nodes=128)
    cost = make_cost_model("llama3_8b", cluster)
    rng = np.random.default_rng(1)
    batch = GlobalBatch.from_lengths(rng.integers(64, 16384, size=16384))
    plan = mixed_plan(batch, 1024, rng)
    validate_plan(plan, batch, cost)
    assert benchmark(simulate_step, plan, batch, cost).tokens == batch.total_tokens


def test_bench_lower_bound_16k_samples(benchmark):
    cluster = dataclasses.replace(cluster_spec("h200x64"), name="h200x1024", num_nodes=128)
    cost = make_cost_model("stdit3_xl2", cluster)
    rng = np.random.default_rng(2)
    frames = rng.integers(1, 60, size=16384)
    batch = GlobalBatch(0, np.arange(16384), frames * rng.integers(64, 3600, size=16384), frames)
    assert benchmark(lower_bound, batch, cost) > 0
