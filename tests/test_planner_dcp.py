"""Properties of the planners against independent references: the plan validator, a brute-force
optimum on tiny instances, closed-form settings, and the infeasibility message."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_planner_doubles import quad_cost

from dcp_bench.batch import GlobalBatch
from dcp_bench.errors import ConfigError, InfeasibleError
from dcp_bench.plan import StepPlan, validate_plan
from dcp_bench.planners.dcp import DCPPlanner, list_schedule
from dcp_bench.planners.dcp_faithful import DCPInterPACPlanner, DCPInterPlanner, DCPIntraPlanner
from dcp_bench.planners.settings import (
    build_shape_table,
    fewest_ckpt_layers,
    largest_fitting_length,
)

PLANNERS = [DCPPlanner, DCPIntraPlanner, DCPInterPlanner, DCPInterPACPlanner]


def dataflow_makespan(plan: StepPlan, batch: GlobalBatch, cost) -> float:
    """Reference executor: a group starts when all its ranks are free, runs its micro-batches
    back to back (each priced by `microbatch_cost`); rounds in order."""
    free = np.zeros(plan.world_size)
    for rnd in plan.rounds:
        for g in rnd.groups:
            t = free[g.start : g.start + g.size].max()
            for mb in g.micro_batches:
                sub = batch.subset(list(mb.samples))
                t += cost.microbatch_cost(
                    sub.tokens, sub.frames, g.size, mb.ckpt_layers, mb.split
                ).total_s
            free[g.start : g.start + g.size] = t
    return float(free.max())


def feasible_everywhere(cost, lengths) -> bool:
    limit = largest_fitting_length(cost)
    return max(lengths) <= limit


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lengths=st.lists(st.integers(1, 400_000), min_size=0, max_size=80),
    world=st.integers(1, 64),
    cap=st.floats(0.3, 1.0),
    which=st.integers(0, len(PLANNERS) - 1),
)
def test_every_plan_validates_and_covers_each_sample_once(lengths, world, cap, which) -> None:
    """Random lengths, worlds 1..64 and memory caps: every plan passes the validator (groups
    aligned, disjoint, memory under the cap) and, in fair mode, holds every sample once; a batch
    with a sample over the largest fitting length raises InfeasibleError instead."""
    cost = quad_cost(world, mem_cap_fraction=cap)
    batch = GlobalBatch.from_lengths(lengths)
    planner = PLANNERS[which]()
    if lengths and not feasible_everywhere(cost, lengths):
        with pytest.raises(InfeasibleError):
            planner.plan(batch, cost)
        return
    plan = planner.plan(batch, cost)
    validate_plan(plan, batch, cost)
    assert sorted(plan.sample_positions()) == list(range(batch.n))


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 200_000), min_size=1, max_size=60),
    world=st.sampled_from([4, 8, 16, 32]),
    which=st.integers(1, 3),
)
def test_paper_mode_never_repeats_and_reports_what_it_saw(lengths, world, which) -> None:
    """Paper mode may leave samples out, never repeats one, and records how many it saw."""
    cost = quad_cost(world)
    if not feasible_everywhere(cost, lengths):
        return
    batch = GlobalBatch.from_lengths(lengths)
    plan = PLANNERS[which](mode="paper").plan(batch, cost)
    validate_plan(plan, batch, cost)
    seen = plan.sample_positions()
    assert len(seen) == len(set(seen)) == plan.info["samples_seen"]
    assert (
        plan.info["samples_seen"] + plan.info["samples_skipped"] + plan.info["samples_deferred"]
        == batch.n
    )
    assert plan.mode == "paper" and "paper mode" in plan.info["label"]


def brute_force_one_round(times_by_size: dict[int, np.ndarray], world: int) -> float:
    """The optimum over every one-round plan: every buddy partition of the world into aligned
    groups, every assignment of the samples to its groups (a group's load: the sum of its
    samples' times at the group's size)."""
    n = len(next(iter(times_by_size.values())))
    best = np.inf
    for part in buddy_partitions(0, world):
        sizes = [s for _, s in part]
        G = len(sizes)
        # cost[g, i]: sample i on group g
        c = np.stack([times_by_size[s] for s in sizes])
        assign = np.array(list(itertools.product(range(G), repeat=n)))  # (G^n, n)
        per = c[assign, np.arange(n)[None, :]]  # (G^n, n)
        loads = np.zeros((len(assign), G))
        for g in range(G):
            loads[:, g] = np.where(assign == g, per, 0.0).sum(axis=1)
        best = min(best, float(loads.max(axis=1).min()))
    return best


def buddy_partitions(start: int, size: int) -> list[list[tuple[int, int]]]:
    """All partitions of the aligned block [start, start+size) into aligned power-of-two blocks."""
    out = [[(start, size)]]
    if size > 1:
        half = size // 2
        for left in buddy_partitions(start, half):
            for right in buddy_partitions(start + half, half):
                out.append(left + right)
    return out


def test_brute_force_optimality_on_tiny_instances() -> None:
    """<= 8 sequences on 4 GPUs with an additive closed-form cost (no per-micro-batch overhead,
    so packing is neutral): our plan's makespan (reference executor) against the best one-round
    plan found by exhaustive search. The worst gap over 40 random instances must stay under 3%
    (measured: 0.0%; the report states it)."""
    rng = np.random.default_rng(7)
    world = 4
    cost = quad_cost(world, overhead=0.0)
    gaps = []
    for _ in range(40):
        n = int(rng.integers(2, 9))
        lengths = rng.choice([512, 2048, 8192, 30_000, 60_000, 120_000], size=n).tolist()
        lengths += rng.integers(1, 200_000, int(rng.integers(0, 2))).tolist()
        lengths = lengths[:8]
        batch = GlobalBatch.from_lengths(lengths)
        table = build_shape_table(batch.tokens, batch.frames, cost)
        times = {int(s): table.time[table.inverse, j] for j, s in enumerate(table.sps)}
        opt = brute_force_one_round(times, world)
        plan = DCPPlanner().plan(batch, cost)
        validate_plan(plan, batch, cost)
        ours = dataflow_makespan(plan, batch, cost)
        gaps.append(ours / opt - 1)
    worst = max(gaps)
    print(
        f"gap to the one-round brute-force optimum: worst {worst:+.2%}, mean "
        f"{np.mean(gaps):+.2%}, best {min(gaps):+.2%}"
    )
    assert worst < 0.03


def test_list_schedule_matches_lpt_on_single_rank_tasks() -> None:
    """With only size-1 tasks the scheduler is LPT: compare with an independent LPT loop."""
    rng = np.random.default_rng(3)
    times = rng.uniform(0.1, 5.0, 200)
    s = list_schedule(times, np.ones(200, dtype=np.int64), 8, "time")
    load = np.zeros(8)
    for t in sorted(times, reverse=True):
        load[np.argmin(load)] += t
    assert np.isclose(s.makespan, load.max())


def test_fewest_ckpt_layers_matches_exhaustive_search() -> None:
    """The closed-form k equals the smallest k found by trying every k."""
    cost = quad_cost(8)
    tokens = np.array([1000, 10_000, 40_000, 100_000, 300_000, 2_000_000])
    frames = np.ones_like(tokens)
    budget = cost.memory_cap_bytes - cost.static_memory_bytes()
    L = cost.model.num_layers
    for sp in (1, 2, 8):
        got = fewest_ckpt_layers(cost, tokens, frames, sp, budget)
        for i, t in enumerate(tokens):
            ks = [
                k
                for k in range(L + 1)
                if cost.sample_memory(np.array([t]), frames[:1], sp, k)[0] <= budget
            ]
            assert got[i] == (ks[0] if ks else -1)


def test_infeasible_sequence_error_names_length_and_limit() -> None:
    """A sequence that fits no SP degree even with full recompute: InfeasibleError naming its
    length and the largest length that fits (which itself fits, one token more does not)."""
    cost = quad_cost(8)
    limit = largest_fitting_length(cost)
    L = cost.model.num_layers
    budget = cost.memory_cap_bytes - cost.static_memory_bytes()
    assert cost.sample_memory(np.array([limit]), np.array([1]), 8, L)[0] <= budget
    assert cost.sample_memory(np.array([limit + 1]), np.array([1]), 8, L)[0] > budget
    batch = GlobalBatch.from_lengths([100, limit + 1])
    for planner in (DCPPlanner(), DCPInterPACPlanner()):
        with pytest.raises(InfeasibleError) as err:
            planner.plan(batch, cost)
        msg = str(err.value)
        assert str(limit + 1) in msg and str(limit) in msg


def test_dcp_reaches_lower_bound_estimate_on_many_short_samples() -> None:
    """Many independent samples: the plan's makespan is within 5% of max(work / W, longest)."""
    rng = np.random.default_rng(0)
    cost = quad_cost(16)
    lengths = rng.integers(100, 20_000, 400)
    batch = GlobalBatch.from_lengths(lengths)
    plan = DCPPlanner().plan(batch, cost)
    table = build_shape_table(batch.tokens, batch.frames, cost)
    counts = np.bincount(table.inverse)
    lb = max(
        float((table.gpu_seconds.min(axis=1) * counts).sum()) / 16,
        float(table.time.min(axis=1).max()),
    )
    assert dataflow_makespan(plan, batch, cost) <= 1.05 * lb


def test_dcp_is_deterministic_and_fair_only() -> None:
    cost = quad_cost(8)
    batch = GlobalBatch.from_lengths([5, 50_000, 300, 120_000, 7000])
    a, b = DCPPlanner().plan(batch, cost), DCPPlanner().plan(batch, cost)
    assert a.to_json() == b.to_json()
    with pytest.raises(ConfigError, match="fair mode only"):
        DCPPlanner(mode="paper")


def test_predicted_step_time_matches_the_simulator() -> None:
    """The planner's own pricing of a plan equals the simulator's compute time (no noise)."""
    from dcp_bench.cost import make_cost_model
    from dcp_bench.planners.dcp import predicted_step_time
    from dcp_bench.sim import simulate_step

    cost = make_cost_model("llama3_8b", "h200x8")
    rng = np.random.default_rng(2)
    batch = GlobalBatch.from_lengths(
        np.minimum(rng.lognormal(8.5, 1.3, 60).astype(int) + 16, 200_000)
    )
    plan = DCPPlanner().plan(batch, cost)
    validate_plan(plan, batch, cost)
    sim = simulate_step(plan, batch, cost)
    assert np.isclose(predicted_step_time(plan, batch, cost), sim.compute_end_s, rtol=1e-9)


def test_dcp_never_slower_than_faithful_dcp() -> None:
    """On random batches and worlds (closed-form cost, reference executor), `dcp` is never
    slower than DCP-intra, DCP-inter or DCP-inter+PAC."""
    rng = np.random.default_rng(0)
    for _ in range(30):
        world = int(rng.choice([1, 2, 4, 8, 16, 32]))
        cost = quad_cost(world)
        lengths = np.minimum(
            rng.lognormal(8, 1.5, int(rng.integers(1, 150))).astype(int) + 1,
            largest_fitting_length(cost),
        )
        batch = GlobalBatch.from_lengths(lengths)
        ours = dataflow_makespan(DCPPlanner().plan(batch, cost), batch, cost)
        for planner in (DCPIntraPlanner(), DCPInterPlanner(), DCPInterPACPlanner()):
            assert ours <= dataflow_makespan(planner.plan(batch, cost), batch, cost) * (1 + 1e-9)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lengths=st.lists(st.integers(16, 300_000), min_size=1, max_size=120),
    cluster=st.sampled_from(["h200x8", "h200x16", "h200x32"]),
    model=st.sampled_from(["llama3_8b", "stdit3_xl2"]),
)
def test_dcp_plans_validate_under_the_analytical_model(lengths, cluster, model) -> None:
    """Random batches on the analytical model (fixed costs per micro-batch, memory-limited
    micro-batches): every plan validates, holds every sample once, and its simulated step time
    is at least the lower bound."""
    from dcp_bench.cost import make_cost_model
    from dcp_bench.sim import lower_bound, simulate_step

    cost = make_cost_model(model, cluster)
    batch = GlobalBatch.from_lengths(lengths)
    try:
        plan = DCPPlanner().plan(batch, cost)
    except InfeasibleError:
        return
    validate_plan(plan, batch, cost)
    assert sorted(plan.sample_positions()) == list(range(batch.n))
    assert simulate_step(plan, batch, cost).step_time_s >= lower_bound(batch, cost) * (1 - 1e-12)


SHIPPED = [
    "debian_docs",
    "prolong",
    "sharegpt",
    "wikipedia",
    "synthetic_fixed",
    "synthetic_uniform",
    "synthetic_lognormal",
    "videosys_zipf",
    "videosys_balanced",
    "videosys_long",
    "opensora_v12_stage1",
]


@pytest.mark.parametrize("workload", SHIPPED)
def test_dcp_within_five_percent_of_the_bound_on_shipped_workloads(workload) -> None:
    """The first global batch of every shipped workload on 8 H200s (text on Llama-3-8B, video on
    STDiT3-XL/2; analytical model, no noise): `dcp`'s simulated step time is at most 1.05 x the
    capacity-aware lower bound, which is itself at most the best plan's (tests/test_sim.py)."""
    from dcp_bench.cost import make_cost_model
    from dcp_bench.sim import lower_bound, simulate_step
    from dcp_bench.workloads import load_workload

    wl = load_workload(workload)
    cost = make_cost_model("stdit3_xl2" if wl.kind == "video" else "llama3_8b", "h200x8")
    batch = wl.global_batch(0, 8, cost.model.max_seq_len)
    plan = DCPPlanner().plan(batch, cost)
    validate_plan(plan, batch, cost)
    ratio = simulate_step(plan, batch, cost).step_time_s / lower_bound(batch, cost)
    print(f"{workload}: dcp / bound {ratio:.4f}")
    assert 1.0 <= ratio <= 1.05


def test_a_sample_that_fits_one_rank_stays_on_one_rank() -> None:
    """Llama-3-8B on 8 H200s: samples of 60-90% of a micro-batch's token capacity among many
    short ones run on a single rank, where short samples fill the rest of their micro-batch,
    rather than on two ranks paying the all-to-all (what their packed share alone would suggest)."""
    from dcp_bench.cost import make_cost_model

    cost = make_cost_model("llama3_8b", "h200x8")
    cap = cost.microbatch_token_capacity(1, 0)
    rng = np.random.default_rng(4)
    big = (cap * rng.uniform(0.6, 0.9, 12)).astype(int)
    batch = GlobalBatch.from_lengths(np.concatenate([big, rng.integers(100, 1500, 600)]))
    plan = DCPPlanner().plan(batch, cost)
    validate_plan(plan, batch, cost)
    size_of = {s: g.size for _, g, mb in plan.micro_batches() for s in mb.samples}
    assert all(size_of[i] == 1 for i in range(len(big)))
