"""Worlds of any number of nodes: 3, 6 and 12 nodes of 8 GPUs (simulated) and 3 / 6 gloo ranks.

Aligned SP groups of a world of W = m * 2^k ranks (m odd) have the power-of-two degrees up to
2^k; they nest (deadlock-free rounds), stay inside one node or take whole nodes, and every
method plans valid steps on such worlds. ``cluster=NAME@N`` sets the world size in GPUs.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dcp_bench.batch import GlobalBatch
from dcp_bench.config import expand_cluster_size, load_config, to_container
from dcp_bench.cost import make_cost_model
from dcp_bench.cost.specs import cluster_spec
from dcp_bench.errors import ClusterError, ConfigError, PlanError
from dcp_bench.layout import aligned_blocks, aligned_sp_degrees, spans_nodes_cleanly
from dcp_bench.plan import Group, MicroBatch, Round, StepPlan, validate_plan
from dcp_bench.run.spec import parse_run_spec

ROOT = Path(__file__).resolve().parents[1]
METHODS = sorted(p.stem for p in (ROOT / "dcp_bench" / "conf" / "method").glob("*.yaml"))


def _odd_part(n: int) -> int:
    while n % 2 == 0:
        n //= 2
    return n


@pytest.mark.parametrize("world", [1, 3, 5, 6, 12, 24, 40, 48, 96, 12_288])
def test_degrees_are_the_powers_of_two_dividing_the_world(world: int) -> None:
    """Independent reference: the largest degree is world / (its odd part)."""
    degrees = aligned_sp_degrees(world)
    assert degrees == [2**i for i in range(len(degrees))]
    assert degrees[-1] == world // _odd_part(world)


@pytest.mark.parametrize("world", [3, 6, 12, 24, 48])
def test_aligned_blocks_tile_each_degree_and_nest(world: int) -> None:
    blocks = aligned_blocks(world)
    by_size: dict[int, list[tuple[int, ...]]] = {}
    for b in blocks:
        by_size.setdefault(len(b), []).append(b)
    for size, bs in by_size.items():
        assert sorted(r for b in bs for r in b) == list(range(world))  # each degree tiles the world
        assert all(b[0] % size == 0 for b in bs)
    assert sorted(by_size) == aligned_sp_degrees(world)
    # Laminar: two blocks are nested or disjoint, so no two ranks meet in opposite orders.
    for a, b in itertools.combinations(blocks, 2):
        sa, sb = set(a), set(b)
        assert not (sa & sb) or sa <= sb or sb <= sa
    assert len(blocks) == sum(world // d for d in aligned_sp_degrees(world))


@pytest.mark.parametrize("nodes", [3, 6, 12, 1536])
def test_cluster_of_any_node_count(nodes: int) -> None:
    c = cluster_spec("h200x8").resized(8 * nodes)
    assert (c.num_nodes, c.gpus_per_node, c.world_size) == (nodes, 8, 8 * nodes)
    assert c.name == f"h200x8@{8 * nodes}"
    # every degree tiles the world and respects node boundaries
    for d in c.sp_degrees():
        assert all(spans_nodes_cleanly(s, d, 8) for s in range(0, c.world_size, d))


def test_impossible_shapes_are_one_line_errors() -> None:
    with pytest.raises(ClusterError, match="20 GPUs do not fill whole nodes of 8"):
        cluster_spec("h200x8").resized(20)
    with pytest.raises(ClusterError, match="gpus_per_node=6 on 2 nodes"):
        cluster_spec(
            "h200x8",
            gpu="h200",
            num_nodes=2,
            gpus_per_node=6,
            intra_node_bw=1.0,
            inter_node_bw=1.0,
            intra_node_latency_s=0.0,
            inter_node_latency_s=0.0,
        )
    # one node of any size is fine (a 6-rank gloo machine)
    assert cluster_spec("cpu").resized(6).sp_degrees() == [1, 2]


def test_cluster_size_override() -> None:
    assert expand_cluster_size(["cluster=h200x8@12288", "steps=2"]) == [
        "cluster=h200x8",
        "steps=2",
        "run.nproc=12288",
    ]
    assert expand_cluster_size(["cluster=h200x8"]) == ["cluster=h200x8"]
    with pytest.raises(ConfigError, match="'x' is not a GPU count"):
        expand_cluster_size(["cluster=h200x8@x"])
    with pytest.raises(ConfigError, match="run.nproc=16 contradicts"):
        expand_cluster_size(["cluster=h200x8@24", "run.nproc=16"])
    spec = parse_run_spec(
        to_container(load_config(["cluster=h200x8@96", "workload=prolong", "model=llama3_8b"]))
    )
    assert (
        spec.cluster.world_size == 96
        and spec.cluster.num_nodes == 12
        and spec.cluster.name == "h200x8@96"
    )
    with pytest.raises(ConfigError, match=r"nproc.*=20: .*20 GPUs do not fill whole nodes"):
        parse_run_spec(to_container(load_config(["cluster=h200x8@20"])))


def test_cli_names_the_impossible_size_in_one_line() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "dcp_bench.cli",
            "plan",
            "cluster=h200x8@20",
            "workload=prolong",
            "model=llama3_8b",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "20" in lines[0] and "whole nodes of 8" in lines[0]


def test_validator_refuses_groups_that_do_not_divide_the_world_or_straddle_nodes() -> None:
    cost = make_cost_model("llama3_8b", cluster_spec("h200x8").resized(24))
    batch = GlobalBatch.from_lengths([1000, 2000])
    ok = StepPlan(
        world_size=24,
        rounds=[
            Round(
                groups=[
                    Group(start=8, size=8, micro_batches=[MicroBatch(samples=(0,), ckpt_layers=0)]),
                    Group(
                        start=16, size=4, micro_batches=[MicroBatch(samples=(1,), ckpt_layers=0)]
                    ),
                ]
            )
        ],
    )
    validate_plan(ok, batch, cost)
    sixteen = StepPlan(
        world_size=24,
        rounds=[
            Round(
                groups=[
                    Group(
                        start=0, size=16, micro_batches=[MicroBatch(samples=(0, 1), ckpt_layers=0)]
                    )
                ]
            )
        ],
    )
    with pytest.raises(PlanError, match="must divide the world size 24"):
        validate_plan(sixteen, batch, cost)
    # 3 nodes of 2 GPUs: a pair lies inside one node when aligned
    cost2 = make_cost_model(
        "llama3_8b",
        cluster_spec(
            "h200x8",
            gpu="h200",
            num_nodes=3,
            gpus_per_node=2,
            intra_node_bw=1e11,
            inter_node_bw=1e10,
            intra_node_latency_s=1e-5,
            inter_node_latency_s=1e-5,
        ),
    )
    assert (
        not spans_nodes_cleanly(1, 2, 2)
        and spans_nodes_cleanly(2, 2, 2)
        and not spans_nodes_cleanly(2, 4, 4)
    )
    pairs = StepPlan(
        world_size=6,
        rounds=[
            Round(
                groups=[
                    Group(
                        start=2, size=2, micro_batches=[MicroBatch(samples=(0, 1), ckpt_layers=0)]
                    )
                ]
            )
        ],
    )
    validate_plan(pairs, batch, cost2)


def _small_text_batch(world: int) -> GlobalBatch:
    from dcp_bench.workloads import load_workload

    # prolong lengths, fewer tokens per GPU so every method plans in well under a second
    wl = load_workload("prolong", tokens_per_gpu=20_000)
    return wl.global_batch(0, world, max_seq_len=131_072)


@pytest.mark.parametrize(
    ("method", "nodes"),
    [
        # FlexSP's MILP at 48 and 96 GPUs takes tens of seconds a plan: the slow suite's
        pytest.param(m, n, marks=[pytest.mark.slow] if m == "flexsp_milp_solver" and n > 3 else [])
        for m in METHODS
        for n in (3, 6, 12)
    ],
)
def test_every_method_plans_valid_steps_on_any_node_count(method: str, nodes: int) -> None:
    from dcp_bench.planners.base import make_planner
    from dcp_bench.sim import lower_bound, simulate_step

    if method == "flexsp_milp" and nodes > 3:
        pytest.skip("the MILP's solve time grows with the world; 3 nodes cover its layout")
    world = 8 * nodes
    cost = make_cost_model("llama3_8b", cluster_spec("h200x8").resized(world))
    batch = _small_text_batch(world)
    node = dict(to_container(load_config([f"method={method}"]))["method"])
    planner = make_planner(node)
    plan = planner.plan(batch, cost)
    assert plan.world_size == world
    validate_plan(plan, batch, cost)
    if plan.mode == "fair":
        assert sorted(plan.sample_positions()) == list(range(batch.n))
    assert simulate_step(plan, batch, cost).step_time_s >= lower_bound(batch, cost) * (1 - 1e-12)


@pytest.mark.parametrize("workload", ["prolong", "wikipedia", "sharegpt", "debian_docs"])
def test_dcp_within_one_percent_of_the_bound_on_three_nodes(workload: str) -> None:
    """24 H200s (3 nodes, degrees up to 8): dcp stays within 1.01x of the lower bound, as on
    power-of-two worlds (the bound is at most the best plan, tests/test_sim.py)."""
    from dcp_bench.planners.dcp import DCPPlanner
    from dcp_bench.sim import lower_bound, simulate_step
    from dcp_bench.workloads import load_workload

    cost = make_cost_model("llama3_8b", cluster_spec("h200x8").resized(24))
    batch = load_workload(workload).global_batch(0, 24, cost.model.max_seq_len)
    plan = DCPPlanner().plan(batch, cost)
    validate_plan(plan, batch, cost)
    ratio = simulate_step(plan, batch, cost).step_time_s / lower_bound(batch, cost)
    assert 1.0 <= ratio <= 1.01, ratio


# ------------------------------------------------------------------------------------------------
# gloo: 3 and 6 ranks on one machine, gradients against single-process training.


def _world_worker(
    rank: int, world: int, port: int, out_dir: str, cases: list[tuple[Any, ...]]
) -> None:
    import torch
    import torch.distributed as dist
    from test_runtime_dist import SEED, flat_grads

    from dcp_bench.cost.specs import model_spec
    from dcp_bench.runtime.executor import execute_step
    from dcp_bench.runtime.groups import ProcessGroupPool
    from dcp_bench.runtime.models import build_model

    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        pool = ProcessGroupPool(timeout_s=120)
        results = []
        for model_name, batch, plan in cases:
            model = build_model(model_spec(model_name), seed=SEED)
            res = execute_step(plan, batch, model, None, pool, seed=SEED)
            results.append({"loss": res.loss, "grads": flat_grads(model), "groups": len(pool)})
        torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _dcp_plan(world: int, batch: GlobalBatch) -> StepPlan:
    from dcp_bench.planners.dcp import DCPPlanner

    # A low cap on the CPU cluster, so the longest samples need a pair of ranks.
    cost = make_cost_model("tiny_llama", cluster_spec("cpu").resized(world), mem_cap_fraction=0.068)
    plan = DCPPlanner().plan(batch, cost)
    validate_plan(plan, batch, cost)
    return plan


@pytest.mark.dist
@pytest.mark.slow  # 3 then 6 gloo processes on 2 cores (~1 minute)
@pytest.mark.parametrize("world", [3, 6])
def test_odd_worlds_train_like_one_process(world: int) -> None:
    import torch
    import torch.multiprocessing as mp
    from test_runtime_dist import _free_port, reference, rel_l2

    lengths = [37, 121, 64, 9, 203, 50, 18, 90, 140, 33, 75, 12][: 2 * world]
    batch = GlobalBatch(
        step=0,
        sample_ids=np.arange(100, 100 + len(lengths)),
        tokens=np.asarray(lengths),
        frames=np.ones(len(lengths), dtype=np.int64),
    )
    mbs = [MicroBatch(samples=(i,), ckpt_layers=0) for i in range(batch.n)]
    if world == 6:  # pairs and singletons in one round, then the pairs regrouped
        hand = StepPlan(
            world_size=6,
            rounds=[
                Round(
                    groups=[
                        Group(0, 2, [mbs[4]]),
                        Group(2, 1, [mbs[0], mbs[1]]),
                        Group(3, 1, [mbs[2]]),
                        Group(4, 2, [mbs[3], mbs[5]]),
                    ]
                ),
                Round(
                    groups=[
                        Group(0, 2, [mbs[6], mbs[7]]),
                        Group(2, 2, [mbs[8], mbs[9]]),
                        Group(4, 1, [mbs[10]]),
                        Group(5, 1, [mbs[11]]),
                    ]
                ),
            ],
        )
    else:
        hand = StepPlan(
            world_size=3, rounds=[Round(groups=[Group(r, 1, mbs[r::3]) for r in range(3)])]
        )
    validate_plan(hand, batch)
    planned = _dcp_plan(world, batch)
    if world == 6:  # the planner's own plan uses the pairs of a 6-rank world
        assert any(g.size == 2 for rnd in planned.rounds for g in rnd.groups)
    cases = [("tiny_llama", batch, hand), ("tiny_llama", batch, planned)]
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_world_worker, args=(world, _free_port(), tmp, cases), nprocs=world, join=True)
        results = [torch.load(Path(tmp) / f"rank{r}.pt") for r in range(world)]
    ref_loss, ref_grads = reference("tiny_llama", batch, f"world{world}")
    for c in range(len(cases)):
        for r in range(world):
            assert results[r][c]["groups"] == sum(world // d for d in aligned_sp_degrees(world))
            assert results[r][c]["loss"] == pytest.approx(ref_loss, rel=1e-5)
            assert rel_l2(results[r][c]["grads"], ref_grads) < 1e-5


@pytest.mark.parametrize("method", METHODS)
def test_every_method_plans_valid_steps_on_six_ranks_of_one_machine(method: str) -> None:
    """6 gloo ranks (one node of 6: pairs, no groups of 4) with a low cap, so plans need pairs."""
    from dcp_bench.planners.base import make_planner
    from dcp_bench.workloads import load_workload

    cost = make_cost_model("tiny_llama", cluster_spec("cpu").resized(6), mem_cap_fraction=0.068)
    batch = load_workload("wikipedia", length_scale=8, tokens_per_gpu=6144).global_batch(
        0, 6, cost.model.max_seq_len
    )
    plan = make_planner(dict(to_container(load_config([f"method={method}"]))["method"])).plan(
        batch, cost
    )
    validate_plan(plan, batch, cost)
    assert all(g.size in (1, 2) for rnd in plan.rounds for g in rnd.groups)
