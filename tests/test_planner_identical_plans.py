"""`dcp`'s plans stay the same when its planning gets faster: every cell below is planned and
its plan reduced to a fingerprint (SHA-256 of the rounds, groups and micro-batches as canonical
JSON: samples, ckpt_layers, split, sp_kind, ulysses_degree). The expected fingerprints were
recorded from the planner before its packing and object construction were reworked for speed;
a change to them is a change of plan and must be deliberate (then re-record with
``python tests/test_planner_identical_plans.py``)."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from dcp_bench.batch import GlobalBatch
from dcp_bench.cost import make_cost_model
from dcp_bench.cost.specs import cluster_spec
from dcp_bench.plan import StepPlan
from dcp_bench.planners.dcp import DCPPlanner


def fingerprint(plan: StepPlan) -> str:
    """SHA-256 of the plan's layout (world size, rounds, groups, micro-batches) as canonical
    JSON; ``info`` (timings, estimates) is left out."""
    layout = [
        [
            [
                g.start,
                g.size,
                [
                    [list(mb.samples), mb.ckpt_layers, mb.split, mb.sp_kind, mb.ulysses_degree]
                    for mb in g.micro_batches
                ],
            ]
            for g in rnd.groups
        ]
        for rnd in plan.rounds
    ]
    text = json.dumps([plan.world_size, layout], separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _cost(model: str, world: int):
    if world == 32:
        return make_cost_model(model, "h200x32")
    return make_cost_model(model, cluster_spec("h200x8").resized(world))


def _batch(cell: str, world: int, max_len: int) -> GlobalBatch:
    if cell == "million":
        rng = np.random.default_rng(0)
        return GlobalBatch.from_lengths(np.r_[1_048_576, rng.integers(1_000, 60_000, 120)])
    if cell == "lognormal512":
        rng = np.random.default_rng(0)
        lengths = rng.lognormal(8.5, 1.2, 512).astype(np.int64) + 16
        return GlobalBatch.from_lengths(np.minimum(lengths, 131_072))
    from dcp_bench.workloads import load_workload

    return load_workload(cell).global_batch(0, world, max_len)


CELLS = [
    ("llama3_8b", "prolong", 24),
    ("llama3_8b", "prolong", 96),
    ("llama3_8b", "prolong", 32),
    ("llama3_8b", "sharegpt", 24),
    ("llama3_8b", "sharegpt", 96),
    ("llama3_8b", "sharegpt", 32),
    ("llama3_8b", "wikipedia", 24),
    ("llama3_8b", "wikipedia", 96),
    ("llama3_8b", "wikipedia", 32),
    ("llama3_8b", "million", 24),
    ("llama3_8b", "lognormal512", 32),
    ("stdit3_xl2", "videosys_zipf", 32),
    ("llama3_8b", "prolong", 12288),
]

EXPECTED = {
    "llama3_8b/prolong@24": "fe5511feb1b1a62d",
    "llama3_8b/prolong@96": "72b6b2e2e04423a1",
    "llama3_8b/prolong@32": "49ea4075f634b49e",
    "llama3_8b/sharegpt@24": "7e4369c8a0885af0",
    "llama3_8b/sharegpt@96": "5246cdb34a9d987a",
    "llama3_8b/sharegpt@32": "4f97ab29e82a42e5",
    "llama3_8b/wikipedia@24": "52eabdeeb3e77fae",
    "llama3_8b/wikipedia@96": "341cf0572e16fe5e",
    "llama3_8b/wikipedia@32": "097a0a6d1b35c537",
    "llama3_8b/million@24": "cdf6b4f63ba5f4b2",
    "llama3_8b/lognormal512@32": "247764e6e3a61e94",
    "stdit3_xl2/videosys_zipf@32": "70fcf22b5a6947bd",
    "llama3_8b/prolong@12288": "dd8db08d515c6640",
}


def _plan_of(model: str, cell: str, world: int) -> StepPlan:
    cost = _cost(model, world)
    return DCPPlanner().plan(_batch(cell, world, cost.model.max_seq_len), cost)


@pytest.mark.parametrize(("model", "cell", "world"), CELLS)
def test_dcp_plan_is_unchanged(model: str, cell: str, world: int) -> None:
    plan = _plan_of(model, cell, world)
    assert fingerprint(plan) == EXPECTED[f"{model}/{cell}@{world}"]


def test_fingerprint_sees_every_field() -> None:
    """The fingerprint changes with each field of a micro-batch and with a group's place."""
    from dataclasses import replace

    from dcp_bench.plan import Group, MicroBatch, Round

    mb = MicroBatch(samples=(0, 1), ckpt_layers=0)

    def one(m: MicroBatch, start: int = 0) -> str:
        return fingerprint(StepPlan(world_size=4, rounds=[Round(groups=[Group(start, 2, [m])])]))

    base = one(mb)
    variants = [
        replace(mb, samples=(1, 0)),
        replace(mb, ckpt_layers=1),
        replace(mb, split="batch"),
        replace(mb, sp_kind="ring"),
        replace(mb, sp_kind="hybrid", ulysses_degree=2),
    ]
    prints = {one(v) for v in variants} | {one(mb, start=2)}
    assert base not in prints and len(prints) == len(variants) + 1


if __name__ == "__main__":
    for m, c, w in CELLS:
        print(f'    "{m}/{c}@{w}": "{fingerprint(_plan_of(m, c, w))}",')


def test_sort_by_keys_is_lexsort() -> None:
    """`sort_by_keys` orders as ``np.lexsort`` does (stable, first key primary), both where it
    packs the keys into one and where their ranges make it fall back to lexsort."""
    from dcp_bench.planners.dcp import sort_by_keys

    rng = np.random.default_rng(3)
    a, b, c = rng.integers(0, 5, 500), rng.integers(0, 3, 500), rng.integers(0, 7, 500)
    assert sort_by_keys(a, b, c).tolist() == np.lexsort((c, b, a)).tolist()
    big = rng.integers(0, 2**40, 500)
    assert sort_by_keys(a, big, big).tolist() == np.lexsort((big, big, a)).tolist()
    assert sort_by_keys(np.zeros(0, dtype=np.int64)).tolist() == []
    # ties keep the input order
    assert sort_by_keys(np.array([1, 0, 1, 0])).tolist() == [1, 3, 0, 2]


def test_sp_histogram_counts_as_unique_does() -> None:
    """`sp_histogram` equals counting the chosen degrees with ``np.unique`` (keys ascending)."""
    from dcp_bench.planners.dcp import sp_histogram

    rng = np.random.default_rng(4)
    sps = np.array([1, 2, 4, 8, 24, 16])
    choice = rng.integers(0, len(sps), 300)
    choice[choice == 2] = 1  # a degree nobody uses is left out
    want = {int(s): int(c) for s, c in zip(*np.unique(sps[choice], return_counts=True))}
    got = sp_histogram(sps, choice)
    assert got == want and list(got) == list(want)
