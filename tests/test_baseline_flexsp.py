"""flexsp_milp: the HiGHS program finds the brute-force optimum on tiny instances; FlexSP's
bucketing DP finds the least padding; the reported gaps hold against the exact optimum; the step
wall-clock safety cap holds on a simulated clock and its hit is recorded; the node limit makes the
same batch plan the same on a quiet and a busy machine; plans validate and cover every sample
once."""

from __future__ import annotations

import itertools
import subprocess
import sys
import time
from dataclasses import dataclass

import numpy as np
import pytest
from test_baselines import ToyCost, real_cost, text_batch, toy, video_batch

from baselines import flexsp_milp
from baselines.flexsp_milp import (
    SOLVER_OVERRUN_S,
    FlexSPMILP,
    RoundModel,
    flexsp_buckets,
    mixed_layout,
    padding_partitions,
    round_lower_bound,
    solve_round_heuristic,
    solve_round_milp,
)
from dcp_bench.batch import GlobalBatch
from dcp_bench.cost.base import MicroBatchCost
from dcp_bench.cost.specs import cluster_spec, model_spec
from dcp_bench.errors import ConfigError
from dcp_bench.plan import validate_plan


def layouts(world: int):
    """Every multiset of power-of-two group sizes with total <= world."""
    sizes = [d for d in (1, 2, 4, 8, 16, 32) if d <= world]
    out = []

    def rec(start: int, left: int, cur: list[int]):
        if cur:
            out.append(tuple(cur))
        for i in range(start, len(sizes)):
            if sizes[i] <= left:
                rec(i, left - sizes[i], cur + [sizes[i]])

    rec(0, world, [])
    return out


def brute_force(model: RoundModel) -> float:
    """Min over layouts and assignments of the slowest group's time (its overhead plus its
    sequences' times), memory respected; layouts with an empty group are covered by smaller ones."""
    n, best = len(model.positions), float("inf")
    col = {d: i for i, d in enumerate(model.degrees)}
    over = model.group_overhead()
    for lay in layouts(model.world_size):
        if len(lay) > n:
            continue
        for assign in itertools.product(range(len(lay)), repeat=n):
            if len(set(assign)) < len(lay):
                continue
            loads = [float(over[col[d]]) for d in lay]
            mems = [0.0] * len(lay)
            for i, g in enumerate(assign):
                loads[g] += model.time[i, col[lay[g]]]
                mems[g] += model.mem[i, col[lay[g]]]
            if all(m <= model.room for m in mems):
                best = min(best, max(loads))
    return best


def small_cost(gpus: int, **kw) -> ToyCost:
    cluster = cluster_spec("h200x8")
    cluster = type(cluster)(
        **{**cluster.__dict__, "name": f"toy{gpus}", "num_nodes": 1, "gpus_per_node": gpus}
    )
    return ToyCost(
        model=model_spec("llama3_8b"), cluster=cluster, b=1e-10, act_ckpt_per_token=1.5e5, **kw
    )


@dataclass
class FixedCostToy(ToyCost):
    """A micro-batch also pays a fixed cost per SP group run (collective latencies): a packed
    group pays it once, a sequence run alone pays it whole."""

    fixed: float = 0.05

    def microbatch_cost(self, tokens, frames, sp, ckpt_layers, split="sequence"):
        c = super().microbatch_cost(tokens, frames, sp, ckpt_layers, split)
        return MicroBatchCost(
            c.fwd_s, c.bwd_s, c.recompute_s, c.comm_s + self.fixed, c.mem_bytes, c.model_flops
        )

    def sample_time(self, tokens, frames, sp, ckpt_layers):
        return super().sample_time(tokens, frames, sp, ckpt_layers) + self.fixed

    def sample_time_packed(self, tokens, frames, sp, ckpt_layers):
        return super().sample_time(tokens, frames, sp, ckpt_layers)


def tiny_model(seed: int, cost: ToyCost, n: int = 5) -> tuple[GlobalBatch, RoundModel]:
    rng = np.random.default_rng(seed)
    batch = GlobalBatch.from_lengths(rng.integers(1000, 500_000, size=n))
    model = FlexSPMILP().round_model(batch, list(range(batch.n)), cost, cost.model.num_layers)
    return batch, model


# ---------------------------------------------------------------- the program


@pytest.mark.parametrize("fixed", [0.0, 0.05])
@pytest.mark.parametrize("seed", range(6))
def test_milp_matches_brute_force_on_tiny_instances(seed, fixed):
    cost = (
        small_cost(4)
        if fixed == 0.0
        else FixedCostToy(**{**small_cost(4).__dict__, "fixed": fixed})
    )
    batch, model = tiny_model(seed, cost)
    # the cost model's fixed per-group cost is what the program charges once per group
    assert model.group_overhead() == pytest.approx(np.full(len(model.degrees), fixed), abs=1e-12)
    if not model.allowed()[:, -1].all():
        pytest.skip("instance has a sequence that fits nowhere")
    sol = solve_round_milp(model)
    want = brute_force(model)
    if want == float("inf"):  # the round does not fit the cluster at all
        assert sol is None
        return
    assert sol is not None and sol.status == "optimal"
    assert sol.objective == pytest.approx(want, rel=1e-5)
    assert sum(size for size, _ in sol.groups) <= model.world_size
    # the heuristic is never better than the optimum, and no layout beats the lower bound
    assert solve_round_heuristic(model).objective >= sol.objective * (1 - 1e-9)
    assert round_lower_bound(model) <= want * (1 + 1e-9)


@pytest.mark.parametrize("seed", range(4))
def test_plan_objective_is_within_its_stated_gap_of_the_optimum(seed):
    # Coarse buckets (2 for 5 sequences) make the program inexact, so the plan need not be
    # optimal; the gap it states to its lower bound must still cover its distance to the
    # brute-force optimum, and neither the objective nor the bound may cross that optimum.
    cost = small_cost(4)
    batch, model = tiny_model(seed, cost)
    want = brute_force(model)
    if want == float("inf"):
        pytest.skip("instance does not fit the cluster in one round")
    plan = FlexSPMILP(buckets=2, max_buckets=2, step_time_limit_s=5.0).plan(batch, cost)
    validate_plan(plan, batch, cost)
    assert sorted(plan.sample_positions()) == list(range(batch.n))
    info = plan.info
    assert info["rounds"] == 1 and info["buckets"] == [2]
    objective, lower, gap = info["objective_s"][0], info["lower_bound_s"][0], info["lb_gap"][0]
    assert objective >= want * (1 - 1e-9)
    assert lower <= want * (1 + 1e-9)
    assert (objective - want) / objective <= gap + 1e-9
    assert info["step_lb_gap"] == pytest.approx(gap)


@pytest.mark.parametrize("seed", range(3))
def test_highs_gap_covers_the_distance_to_the_exact_optimum(seed):
    # exact = the unbucketed program without a time limit; a run stopped early must state a
    # gap at least its incumbent's distance to that optimum, and a bound below it
    cost = small_cost(8)
    _, model = tiny_model(seed, cost, n=12)
    exact = solve_round_milp(model)
    assert exact is not None and exact.status == "optimal"
    for limit in (0.001, 0.01, 0.05):
        sol = solve_round_milp(model, time_limit_s=limit)
        if sol is None:  # stopped before any incumbent: nothing stated, nothing to check
            continue
        assert sol.objective >= exact.objective * (1 - 1e-6)
        assert sol.bound_s is not None and sol.bound_s <= exact.objective * (1 + 1e-6)
        assert sol.gap is not None
        assert (sol.objective - exact.objective) / sol.objective <= sol.gap + 1e-6


@pytest.mark.parametrize("comm", [0.05, 0.1])
def test_program_counts_every_used_group_against_the_world_without_memory(comm):
    # Sequences that need no activation memory: only the program's own link between a slot's
    # sequences and its "used" flag keeps the groups inside the world. With a per-sequence
    # sharding overhead, three equal sequences on 4 ranks run best on three single ranks (1.0);
    # three groups of 2 (0.5 + comm each) would be faster but need 6 ranks.
    degrees = [1, 2, 4]
    time_ = np.array([[1.0, 0.5 + comm, 0.25 + comm]] * 3)
    model = RoundModel([0, 1, 2], degrees, time_, np.zeros((3, 3)), 1.0, 4)
    sol = solve_round_milp(model)
    assert sol is not None and sol.status == "optimal"
    assert sum(size for size, _ in sol.groups) <= 4
    assert sorted(p for _, m in sol.groups for p in m) == [0, 1, 2]
    assert sol.objective == pytest.approx(brute_force(model), rel=1e-6)


def test_groups_stay_inside_the_world_for_tiny_sequences():
    # Regression: with the toy cost model, one token needs 3e-8 of a rank's free memory at SP 8,
    # below HiGHS's feasibility tolerance; the program linked a slot's sequences to its "used"
    # flag only through that memory row, so it placed sequences in slots it never counted
    # against the world (a size-8 group at ranks 32..39 of 32).
    cost, batch = toy("llama3_8b"), GlobalBatch.from_lengths([1, 4])
    plan = FlexSPMILP().plan(batch, cost)
    validate_plan(plan, batch, cost)
    for rnd in plan.rounds:
        assert sum(g.size for g in rnd.groups) <= cost.cluster.world_size


class ShardingOverheadToy(ToyCost):
    """Sequence parallelism costs a fixed per-token overhead that does not shrink with sp, so
    short sequences run best unsharded and only long ones should shard."""

    def sample_time(self, tokens, frames, sp, ckpt_layers):
        base = super().sample_time(tokens, frames, sp, ckpt_layers)
        return base + (self.comm * tokens if sp > 1 else 0.0 * tokens)


def test_flexsp_uses_heterogeneous_groups_for_mixed_lengths():
    cost = ShardingOverheadToy(
        model=model_spec("llama3_8b"), cluster=cluster_spec("h200x8"), comm=3e-7
    )
    # one long sequence and many short ones: the optimum shards only the long one
    batch = GlobalBatch.from_lengths([100_000] + [3000] * 100)
    model = FlexSPMILP().round_model(batch, list(range(batch.n)), cost, 32)
    sol = solve_round_milp(model)
    assert sol is not None and sol.status == "optimal"
    sizes = sorted(size for size, _ in sol.groups)
    assert len(set(sizes)) > 1 and sizes[0] == 1
    # and beats every homogeneous layout (the heuristic's search space) by a clear margin
    assert sol.objective < 0.9 * solve_round_heuristic(model).objective


def test_solver_prints_nothing_on_stdout():
    # HiGHS's banner would corrupt the JSON `dcp-bench plan` writes; a fresh process sees it
    import subprocess
    import sys

    code = (
        "from baselines.flexsp_milp import FlexSPMILP, RoundModel, solve_round_milp\nimport numpy "
        "as np\nm = RoundModel([0, 1], [1, 2], np.array([[1.0, 0.6], [2.0, 1.1]]), np.ones((2, "
        "2)), 10.0, 2)\nassert solve_round_milp(m, 5.0) is not None\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout == ""


def test_mixed_layout_puts_each_sequence_at_its_minimum_degree_within_the_world():
    cost = toy()
    batch = GlobalBatch.from_lengths([3_000_000, 2_000_000] + [4000] * 50 + [60000] * 10)
    model = FlexSPMILP().round_model(batch, list(range(batch.n)), cost, 32)
    sol = mixed_layout(model)
    assert sol is not None
    assert sum(size for size, _ in sol.groups) <= 32
    assert sorted(p for _, m in sol.groups for p in m) == list(range(batch.n))
    ok = model.allowed()
    for size, members in sol.groups:
        for p in members:
            d_min = model.degrees[int(np.flatnonzero(ok[p])[0])]
            assert size == d_min
            assert model.mem[members, model.degrees.index(size)].sum() <= model.room


# ---------------------------------------------------------------- bucketing


def least_padding(length: np.ndarray, count: np.ndarray, b: int) -> float:
    """Brute force: every way to cut the sorted lengths into b contiguous non-empty buckets."""
    U, best = len(length), float("inf")
    for cuts in itertools.combinations(range(1, U), b - 1):
        bounds = [0, *cuts, U]
        pad = sum(
            float(length[e - 1] * count[a:e].sum() - (length[a:e] * count[a:e]).sum())
            for a, e in zip(bounds[:-1], bounds[1:])
        )
        best = min(best, pad)
    return best


@pytest.mark.parametrize("seed", range(5))
def test_padding_dp_finds_the_least_padding(seed):
    rng = np.random.default_rng(seed)
    length = np.sort(rng.choice(np.arange(1, 10_000), size=8, replace=False)).astype(float)
    count = rng.integers(1, 5, size=8).astype(float)
    seen = 0
    for ranges in padding_partitions(length, count, 8):
        b = len(ranges)
        assert ranges[0][0] == 0 and ranges[-1][1] == 8
        assert all(a < e for a, e in ranges) and all(
            e == a2 for (_, e), (a2, _) in zip(ranges, ranges[1:])
        )
        pad = sum(
            float(length[e - 1] * count[a:e].sum() - (length[a:e] * count[a:e]).sum())
            for a, e in ranges
        )
        assert pad == pytest.approx(least_padding(length, count, b), rel=1e-12, abs=1e-9)
        seen += 1
    assert seen == 8


def test_buckets_partition_the_round_and_keep_equal_shapes_together():
    cost = toy()
    batch = text_batch(300, seed=3)
    model = FlexSPMILP().round_model(batch, list(range(batch.n)), cost, 32)
    buckets = flexsp_buckets(model, 16, 32)
    assert 16 <= len(buckets) <= 32
    assert sorted(i for b in buckets for i in b) == list(range(batch.n))
    where = {i: k for k, b in enumerate(buckets) for i in b}
    tokens = batch.tokens
    for i in range(batch.n):
        for j in range(i):
            if tokens[i] == tokens[j]:
                assert where[i] == where[j]
    # contiguous in length: a bucket's longest is shorter than the next bucket's shortest
    spans = sorted((tokens[b].min(), tokens[b].max()) for b in buckets)
    assert all(hi < lo for (_, hi), (lo, _) in zip(spans, spans[1:]))
    # FlexSP's rule: the padded footprint ends at most half way to the capacity, unless capped
    deg = np.asarray(model.degrees, float)
    padded = sum(len(b) * float(np.min(model.mem[b].max(axis=0) * deg)) for b in buckets)
    halfway = (model.footprint().sum() + model.world_size * model.room) / 2
    assert padded <= halfway or len(buckets) == 32


def test_few_shapes_get_one_bucket_each():
    batch = GlobalBatch.from_lengths([4000] * 30 + [9000] * 20 + [120_000] * 3)
    model = FlexSPMILP().round_model(batch, list(range(batch.n)), toy(), 32)
    buckets = flexsp_buckets(model, 16, 32)
    assert sorted(len(b) for b in buckets) == [3, 20, 30]


# ---------------------------------------------------------------- plans, budget and reporting


@pytest.mark.parametrize(
    "model_name,batch_fn", [("llama3_8b", text_batch), ("stdit3_xl2", video_batch)]
)
def test_flexsp_plans_validate_and_report_solver_stats(model_name, batch_fn):
    cost, batch = real_cost(model_name), batch_fn()
    plan = FlexSPMILP(step_time_limit_s=0.5).plan(batch, cost)
    validate_plan(plan, batch, cost)
    assert sorted(plan.sample_positions()) == list(range(batch.n))
    info = plan.info
    rounds = info["rounds"]
    assert len(plan.rounds) == rounds
    for key in (
        "status",
        "solver",
        "objective_s",
        "buckets",
        "time_limit_s",
        "solve_s",
        "mip_nodes",
        "mip_gap",
        "bound_s",
        "lower_bound_s",
        "lb_gap",
    ):
        assert len(info[key]) == rounds, key
    assert info["plan_s"] > 0
    for obj, lower, gap in zip(info["objective_s"], info["lower_bound_s"], info["lb_gap"]):
        assert 0 < lower <= obj and gap == pytest.approx((obj - lower) / obj)
    for status, gap in zip(info["status"], info["mip_gap"]):
        assert status == "optimal" or status.startswith("fallback") or gap is not None


class SimulatedClock:
    """A clock that moves only when told: the planner's budget runs on it."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def worst_case_solver(
    monkeypatch, clock: SimulatedClock, model_s: float, check_s: float
) -> list[float]:
    """HiGHS always runs its whole limit and overruns it by the most the planner allows for;
    evaluating the cost model for a round takes ``model_s`` before the solve and each check of
    a layout's packed time ``check_s`` after it. Returns the limits given to HiGHS."""
    limits: list[float] = []
    real_solve, real_model = flexsp_milp.solve_program, FlexSPMILP.round_model
    real_check = flexsp_milp.packed_round_time

    def solve(program, limit):
        limits.append(limit)
        real_solve(program, 0.001)  # a real (tiny) run, so the program has whatever it found
        clock.now += limit + SOLVER_OVERRUN_S
        return limit + SOLVER_OVERRUN_S

    def round_model(self, *args):
        clock.now += model_s
        return real_model(self, *args)

    def check(*args):
        clock.now += check_s
        return real_check(*args)

    monkeypatch.setattr(flexsp_milp, "solve_program", solve)
    monkeypatch.setattr(FlexSPMILP, "round_model", round_model)
    monkeypatch.setattr(flexsp_milp, "packed_round_time", check)
    return limits


@pytest.mark.parametrize(("model_s", "check_s"), [(0.0, 0.0), (0.1, 0.03)])
def test_step_stays_within_its_budget_when_the_solver_always_runs_out(
    monkeypatch, model_s, check_s
):
    cost = toy()
    batch = GlobalBatch.from_lengths(np.r_[np.full(400, 400_000), np.full(200, 20_000)])
    clock = SimulatedClock()
    limits = worst_case_solver(monkeypatch, clock, model_s, check_s)
    plan = FlexSPMILP(step_time_limit_s=2.0, clock=clock).plan(batch, cost)
    validate_plan(plan, batch, cost)
    assert sorted(plan.sample_positions()) == list(range(batch.n))
    info = plan.info
    assert info["rounds"] >= 2
    # every round gets its share of HiGHS time (none is starved by an earlier one) ...
    assert len(limits) == info["rounds"] and all(limit > 0 for limit in limits)
    assert info["time_limit_s"] == limits
    # ... and with the overrun the planner allows for, the step ends inside its budget (the 10%
    # tolerance of a real clock is for noise beyond this worst case)
    assert info["plan_s"] == clock.now
    assert clock.now <= 2.0
    # every solve stopped on its time limit: the plan depends on the host and says so
    assert info["safety_cap_hit"] and info["cap_hit_rounds"] == list(range(info["rounds"]))


def test_rounds_after_the_budget_is_spent_take_the_heuristic(monkeypatch):
    cost = toy()
    batch = GlobalBatch.from_lengths(np.r_[np.full(400, 400_000), np.full(200, 20_000)])
    clock = SimulatedClock()
    real_solve = flexsp_milp.solve_program

    def solve(program, limit):  # the first solve takes far longer than its limit
        real_solve(program, 0.001)
        clock.now += 10.0
        return 10.0

    monkeypatch.setattr(flexsp_milp, "solve_program", solve)
    plan = FlexSPMILP(step_time_limit_s=1.0, clock=clock).plan(batch, cost)
    validate_plan(plan, batch, cost)
    assert sorted(plan.sample_positions()) == list(range(batch.n))
    info = plan.info
    assert info["rounds"] >= 2
    assert info["time_limit_s"][0] > 0
    assert info["time_limit_s"][1:] == [0.0] * (info["rounds"] - 1)
    assert all(s == "fallback (no time left under the safety cap)" for s in info["status"][1:])
    assert info["safety_cap_hit"]
    assert info["cap_hit_rounds"][1:] == list(range(1, info["rounds"]))
    assert info["mip_nodes"][1:] == [None] * (info["rounds"] - 1)


def test_tiny_budget_still_plans_every_sample_once():
    cost, batch = toy(), text_batch(300, seed=9)
    plan = FlexSPMILP(step_time_limit_s=0.01, buckets=64, max_buckets=64).plan(batch, cost)
    validate_plan(plan, batch, cost)
    assert sorted(plan.sample_positions()) == list(range(batch.n))
    assert sum(plan.info["time_limit_s"]) <= 0.01


# ---------------------------------------------------------------- deterministic solver budget

# A busy loop that ends by itself (the test kills it sooner): never left spinning.
BUSY = "import time\nend = time.time() + 120\nwhile time.time() < end:\n    pass\n"

# What a plan measures about the host, not the plan: its wall-clock times.
MEASURED_INFO = ("plan_s", "solve_s", "time_limit_s")


def _plan_view(plan) -> tuple:
    info = {k: v for k, v in plan.info.items() if k not in MEASURED_INFO}
    return plan.rounds, info


def test_the_node_limit_bounds_the_search_and_is_recorded():
    """The default plan of a text batch: HiGHS stops on the node limit (the search is cut by
    deterministic work, not by the clock), far inside the wall-clock safety cap."""
    cost, batch = real_cost("llama3_8b"), text_batch(300, seed=4)
    plan = FlexSPMILP(mip_max_nodes=5).plan(batch, cost)
    validate_plan(plan, batch, cost)
    info = plan.info
    assert info["mip_max_nodes"] == 5
    assert info["safety_cap_hit"] is False and info["cap_hit_rounds"] == []
    nodes = [n for n in info["mip_nodes"] if n is not None]
    assert nodes and all(n <= 5 for n in nodes)
    assert 5 in nodes  # at least one round's search was cut by the node limit


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "10"])
def test_mip_max_nodes_must_be_a_positive_integer(bad):
    with pytest.raises(ConfigError, match=f"mip_max_nodes={bad!r}; expected an integer >= 1"):
        FlexSPMILP(mip_max_nodes=bad)


@pytest.mark.parametrize(
    "options",
    [
        pytest.param({"mip_max_nodes": 30}, id="flexsp_milp"),
        pytest.param(
            {
                "mip_max_nodes": 10,
                "min_sp": 2,
                "whole_world": True,
                "prune_slots": True,
                "chunking": "sort_consec",
                "mb_options": 3,
                "max_buckets": 64,
            },
            id="flexsp_milp_solver",
            marks=pytest.mark.slow,  # ~25 s of solving twice on 2 cores
        ),
    ],
)
def test_same_plan_on_a_quiet_and_a_busy_machine(options):
    """Issue 32: the plan depends only on its input. The same batch planned on a quiet machine and
    with a core kept busy by another process gives the same rounds, layouts, solver statuses,
    node counts and gaps; only the measured times may differ."""
    cost, batch = real_cost("llama3_8b"), text_batch(300, seed=4)
    quiet = FlexSPMILP(**options).plan(batch, cost)
    busy_proc = subprocess.Popen([sys.executable, "-c", BUSY])
    try:
        time.sleep(0.2)  # let it start spinning
        busy = FlexSPMILP(**options).plan(batch, cost)
    finally:
        busy_proc.kill()
        busy_proc.wait(timeout=30)
    assert not quiet.info["safety_cap_hit"] and not busy.info["safety_cap_hit"]
    # the solver ran and its node limit cut at least one search (the comparison is not vacuous)
    assert options["mip_max_nodes"] in quiet.info["mip_nodes"]
    assert _plan_view(quiet) == _plan_view(busy)


def test_flexsp_solver_rules_time_an_iteration_as_the_sum_of_round_maxima():
    """FlexSP's driver times an iteration as the sum of each micro-batch's slowest group
    (solver.py:1242 of Hetu-Galvatron b4666892): `flexsp_milp_solver` plans carry the round
    barrier and simulate to that sum; the generic `flexsp_milp` lets groups run ahead."""
    from dcp_bench.config import load_config, to_container
    from dcp_bench.planners.base import make_planner
    from dcp_bench.sim import simulate_step

    cost, batch = real_cost("llama3_8b"), text_batch(300, seed=4)

    def planner(name: str, **extra):
        node = to_container(load_config([f"method={name}"]))["method"]
        node.update(mip_max_nodes=5, **extra)
        return make_planner(node)

    plan = planner("flexsp_milp_solver", mb_options=1, recompute="none").plan(batch, cost)
    assert plan.round_barrier and len(plan.rounds) > 1
    got = simulate_step(plan, batch, cost)
    free = simulate_step(plan.__class__(**{**plan.__dict__, "round_barrier": False}), batch, cost)
    assert got.step_time_s == pytest.approx(
        simulate_step(plan, batch, cost, round_barrier=True).step_time_s
    )
    assert got.step_time_s > free.step_time_s  # the barrier matters for this batch
    assert not planner("flexsp_milp").plan(batch, cost).round_barrier
