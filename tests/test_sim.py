"""The simulator against closed forms and a brute-force per-rank reference; the lower bound against
simulated plans."""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from dcp_bench.batch import GlobalBatch
from dcp_bench.cost import make_cost_model
from dcp_bench.cost.base import CostModel, MicroBatchCost
from dcp_bench.cost.specs import cluster_spec, model_spec
from dcp_bench.errors import ClusterError, InfeasibleError, PlanError
from dcp_bench.plan import Group, MicroBatch, Round, StepPlan, validate_plan
from dcp_bench.sim import (
    NoiseModel,
    lower_bound,
    sample_bounds,
    simulate_step,
)

SEC_PER_TOKEN = 1e-3
BYTES_PER_TOKEN = 1e6


@dataclass
class LinearCost(CostModel):
    """A cost double with exact arithmetic: a micro-batch takes tokens x 1 ms / sp (half of it
    communication when sp > 1), uses 1 MB per token per rank, and the sync takes 0.5 s."""

    source: str = "test-linear"

    def microbatch_cost(self, tokens, frames, sp, ckpt_layers, split="sequence"):
        t = float(np.sum(tokens)) * SEC_PER_TOKEN / sp
        comm = t / 2 if sp > 1 else 0.0
        return MicroBatchCost(
            fwd_s=t - comm,
            bwd_s=0.0,
            recompute_s=0.0,
            comm_s=comm,
            mem_bytes=self.static_memory_bytes() + float(np.sum(tokens)) * BYTES_PER_TOKEN / sp,
            model_flops=float(np.sum(tokens)) * 1e9,
        )

    def sample_time(self, tokens, frames, sp, ckpt_layers):
        return np.asarray(tokens, dtype=float) * SEC_PER_TOKEN / sp

    def sample_memory(self, tokens, frames, sp, ckpt_layers):
        return np.asarray(tokens, dtype=float) * BYTES_PER_TOKEN / sp

    def static_memory_bytes(self):
        return 1e9

    def step_sync_time(self):
        return 0.5


def linear_cost(world: int, gpus_per_node: int = 8) -> LinearCost:
    base = cluster_spec("h200x8")
    cluster = dataclasses.replace(
        base,
        name=f"test{world}",
        num_nodes=max(1, world // gpus_per_node),
        gpus_per_node=min(world, gpus_per_node),
    )
    return LinearCost(model=model_spec("tiny_llama"), cluster=cluster)


def one_round(world, groups):
    return StepPlan(
        world, [Round([Group(s, z, [MicroBatch(tuple(m)) for m in mbs]) for s, z, mbs in groups])]
    )


def test_one_group_closed_form():
    cost = linear_cost(1)
    batch = GlobalBatch.from_lengths([1000, 3000])
    res = simulate_step(one_round(1, [(0, 1, [[0], [1]])]), batch, cost)
    assert res.step_time_s == pytest.approx(4.0 + 0.5)
    assert res.busy_s.tolist() == pytest.approx([4.5]) and res.idle_s.tolist() == pytest.approx(
        [0.0]
    )
    assert res.imbalance == pytest.approx(0.0)
    assert res.mfu == pytest.approx(4000 * 1e9 / (4.5 * 1 * cost.cluster.gpu.peak_flops))
    assert res.peak_mem_bytes.tolist() == pytest.approx([1e9 + 3000 * 1e6])
    assert res.tokens == 4000 and not res.oom


def test_unequal_groups_idle_and_comm_share():
    cost = linear_cost(4)
    batch = GlobalBatch.from_lengths([4000, 1000, 1000])
    # Group of 2 ranks runs 4000 tokens in 2 s (1 s of it comm); two singles run 1 s each.
    res = simulate_step(one_round(4, [(0, 2, [[0]]), (2, 1, [[1]]), (3, 1, [[2]])]), batch, cost)
    assert res.step_time_s == pytest.approx(2.5)
    assert res.idle_s.tolist() == pytest.approx([0.0, 0.0, 1.0, 1.0])
    assert res.imbalance == pytest.approx(2.0 / (4 * 2.5))
    # comm: 1 s on each of 2 ranks; the double's sync counts as communication (no breakdown).
    busy = 2 * 2.5 + 2 * 1.5
    assert res.comm_share == pytest.approx((2 * 1.0 + 4 * 0.5) / busy)


def test_ranks_flow_into_the_next_round_unless_barriered():
    cost = linear_cost(4)
    batch = GlobalBatch.from_lengths([1000, 3000, 2000, 2000])
    plan = StepPlan(
        4,
        [
            Round(
                [Group(0, 2, [MicroBatch((0,))]), Group(2, 2, [MicroBatch((1,))])]
            ),  # 0.5 s and 1.5 s
            Round([Group(0, 2, [MicroBatch((2,))]), Group(2, 2, [MicroBatch((3,))])]),  # 1 s each
        ],
    )
    flow = simulate_step(plan, batch, cost)
    barrier = simulate_step(plan, batch, cost, round_barrier=True)
    assert flow.compute_end_s == pytest.approx(2.5)  # ranks 2-3: 1.5 + 1
    assert barrier.compute_end_s == pytest.approx(2.5)
    # A group spanning both halves must wait for the slow half either way.
    plan.rounds[1] = Round([Group(0, 4, [MicroBatch((2, 3))])])
    assert simulate_step(plan, batch, cost).compute_end_s == pytest.approx(1.5 + 1.0)
    plan.rounds[1] = Round([Group(0, 2, [MicroBatch((2, 3))])])  # ranks 0-1 only: 2 s
    assert simulate_step(plan, batch, cost).compute_end_s == pytest.approx(0.5 + 2.0)
    assert simulate_step(plan, batch, cost, round_barrier=True).compute_end_s == pytest.approx(
        1.5 + 2.0
    )


def reference_timeline(
    plan: StepPlan, batch: GlobalBatch, cost: CostModel
) -> tuple[float, list[float]]:
    """Brute force: walk the rounds, one micro-batch cost call at a time."""
    free = [0.0] * plan.world_size
    busy = [0.0] * plan.world_size
    for rnd in plan.rounds:
        for g in rnd.groups:
            d = 0.0
            for mb in g.micro_batches:
                sel = list(mb.samples)
                d += cost.microbatch_cost(
                    batch.tokens[sel], batch.frames[sel], g.size, mb.ckpt_layers, mb.split
                ).total_s
            start = max(free[r] for r in g.ranks)
            for r in g.ranks:
                free[r] = start + d
                busy[r] += d
    return max(free), busy


@st.composite
def random_plans(draw, world=8):
    model = draw(st.sampled_from(["llama3_8b", "stdit3_xl2"]))
    layers = model_spec(model).num_layers
    n = draw(st.integers(1, 40))
    longest = 60000 if model == "llama3_8b" else 3600  # STDiT: patches per frame, up to 720p
    spatial = draw(st.lists(st.integers(16, longest), min_size=n, max_size=n))
    frames = (
        draw(st.lists(st.sampled_from([1, 2, 4, 15, 30]), min_size=n, max_size=n))
        if model == "stdit3_xl2"
        else [1] * n
    )
    batch = GlobalBatch.from_lengths(np.asarray(spatial) * np.asarray(frames), frames=frames)
    order = draw(st.permutations(list(range(n))))
    rounds: list[Round] = []
    i = 0
    while i < n:
        groups, rank = [], 0
        while rank < world and i < n:
            size = draw(
                st.sampled_from([s for s in (1, 2, 4, 8) if rank % s == 0 and rank + s <= world])
            )
            take = draw(st.integers(1, min(3, n - i)))
            mbs = [
                MicroBatch((p,), draw(st.sampled_from([0, layers // 2, layers])))
                for p in order[i : i + take]
            ]
            groups.append(Group(rank, size, mbs))
            i += take
            rank += size
        rounds.append(Round(groups))
    return StepPlan(world, rounds), batch, model


@settings(max_examples=40, deadline=None)
@given(random_plans())
def test_timeline_matches_brute_force(plan_batch):
    plan, batch, model = plan_batch
    cost = make_cost_model(model, "h200x8")
    res = simulate_step(plan, batch, cost)
    end, busy = reference_timeline(plan, batch, cost)
    sync = cost.step_sync_time()
    assert res.step_time_s == pytest.approx(end + sync, rel=1e-9)
    assert res.busy_s.tolist() == pytest.approx([b + sync for b in busy], rel=1e-9)
    assert res.tokens == batch.total_tokens


@settings(max_examples=40, deadline=None)
@given(random_plans())
def test_lower_bound_below_every_valid_plan(plan_batch):
    plan, batch, model = plan_batch
    cost = make_cost_model(model, "h200x8")
    try:
        validate_plan(plan, batch, cost)
    except PlanError:
        assume(False)
    assert lower_bound(batch, cost) <= simulate_step(plan, batch, cost).step_time_s * (1 + 1e-12)


def test_lower_bound_closed_form_with_the_double():
    cost = linear_cost(8)
    batch = GlobalBatch.from_lengths([8000, 1000, 1000])
    # Every SP degree costs the same GPU-seconds; the longest sample is fastest on 8 ranks.
    assert lower_bound(batch, cost) == pytest.approx(max(10.0 / 8, 8.0 / 8) + 0.5)
    batch2 = GlobalBatch.from_lengths([80000, 100])
    assert lower_bound(batch2, cost, include_sync=False) == pytest.approx(max(80.1 / 8, 80.0 / 8))
    sb = sample_bounds(batch2, cost)
    assert sb.best_sp.tolist() == [8, 8]


def test_lower_bound_respects_the_memory_cap():
    cost = linear_cost(8)
    cap_tokens = (cost.memory_cap_bytes - 1e9) / BYTES_PER_TOKEN  # tokens per rank that fit
    too_long = int(cap_tokens * 8) + 8
    with pytest.raises(InfeasibleError, match="fit no SP degree"):
        lower_bound(GlobalBatch.from_lengths([too_long, 10]), cost)
    skipped = lower_bound(GlobalBatch.from_lengths([too_long, 10]), cost, infeasible="skip")
    assert skipped == pytest.approx(lower_bound(GlobalBatch.from_lengths([10]), cost))


@settings(max_examples=30, deadline=None)
@given(
    tokens=st.lists(st.integers(16, 1 << 19), min_size=1, max_size=60),
    model=st.sampled_from(["llama3_8b", "stdit3_xl2"]),
)
def test_more_gpus_never_raise_the_compute_bound(tokens, model):
    frames = np.ones(len(tokens), dtype=np.int64)
    batch = GlobalBatch(0, np.arange(len(tokens)), np.asarray(tokens, dtype=np.int64), frames)
    bounds = []
    for name in ("h200x8", "h200x16", "h200x32", "h200x64"):
        cost = make_cost_model(model, name)
        bounds.append(lower_bound(batch, cost, include_sync=False))
    assert all(b2 <= b1 * (1 + 1e-12) for b1, b2 in zip(bounds, bounds[1:]))


def test_oom_flag_uses_usable_memory_not_the_cap():
    cost = linear_cost(1)
    usable = cost.cluster.gpu.usable_mem_bytes
    over_cap = (
        int((cost.memory_cap_bytes - 1e9) / BYTES_PER_TOKEN) + 10
    )  # over the cap, under usable
    res = simulate_step(one_round(1, [(0, 1, [[0]])]), GlobalBatch.from_lengths([over_cap]), cost)
    assert not res.oom and res.peak_mem_bytes[0] > cost.memory_cap_bytes
    over = int((usable - 1e9) / BYTES_PER_TOKEN) + 10
    assert simulate_step(one_round(1, [(0, 1, [[0]])]), GlobalBatch.from_lengths([over]), cost).oom


def test_noise_is_seeded_and_slows_down():
    cost = make_cost_model("llama3_8b", "h200x8")
    batch = GlobalBatch.from_lengths([4096] * 16)
    plan = one_round(8, [(r, 1, [[2 * r], [2 * r + 1]]) for r in range(8)])
    clean = simulate_step(plan, batch, cost)
    a = simulate_step(plan, batch, cost, noise=NoiseModel(seed=1, jitter_sigma=0.05))
    b = simulate_step(plan, batch, cost, noise=NoiseModel(seed=1, jitter_sigma=0.05))
    c = simulate_step(plan, batch, cost, noise=NoiseModel(seed=2, jitter_sigma=0.05))
    assert a.step_time_s == b.step_time_s != c.step_time_s
    none = simulate_step(plan, batch, cost, noise=NoiseModel(seed=1, jitter_sigma=0.0))
    assert none.step_time_s == pytest.approx(clean.step_time_s)
    slow = simulate_step(
        plan,
        batch,
        cost,
        noise=NoiseModel(seed=1, jitter_sigma=0.0, straggler_prob=1.0, straggler_slowdown=2.0),
    )
    assert slow.compute_end_s == pytest.approx(2 * clean.compute_end_s)
    with pytest.raises(ValueError):
        NoiseModel(straggler_slowdown=0.5)
    # Draws follow the batch's step (planners may leave plan.step at 0).
    later = GlobalBatch(7, batch.sample_ids, batch.tokens, batch.frames)
    d = simulate_step(plan, later, cost, noise=NoiseModel(seed=1, jitter_sigma=0.05))
    assert d.step == 7 and d.step_time_s != a.step_time_s


def test_batch_split_and_world_mismatch():
    cost = make_cost_model("stdit3_xl2", "h200x8")
    batch = GlobalBatch.from_lengths([256] * 8)
    plan = StepPlan(8, [Round([Group(0, 8, [MicroBatch(tuple(range(8)), 0, "batch")])])])
    res = simulate_step(plan, batch, cost)
    one = cost.microbatch_cost(np.array([256]), np.array([1]), 1, 0)
    assert res.compute_end_s == pytest.approx(one.total_s)
    assert res.comm_share == pytest.approx(
        8 * cost.step_sync_breakdown()["grad_sync_s"] / res.busy_s.sum()
    )
    with pytest.raises(
        ClusterError, match="plan for 8 ranks cannot run on cluster 'h200x32' of 32"
    ):
        simulate_step(plan, batch, make_cost_model("stdit3_xl2", "h200x32"))


def test_simulator_runs_the_profiled_source(tmp_path):
    """Both sources behind one interface: with a profiled cost model (the base class's
    per-micro-batch loop) the timeline still equals the brute-force walk."""
    from test_profiling import cpu_cluster, synthetic_artifact

    from dcp_bench.cost.profile_artifact import dumps_artifact

    path = tmp_path / "tiny_llama.json"
    path.write_text(
        dumps_artifact(synthetic_artifact("tiny_llama", [128, 256, 1024, 2048], [1, 2, 4], 4))
    )
    cost = make_cost_model("tiny_llama", cpu_cluster(4), source="auto", profile=path)
    assert cost.source == "profiled"
    batch = GlobalBatch.from_lengths([300, 900, 2000, 64, 128, 512])
    plan = StepPlan(
        4,
        [
            Round(
                [
                    Group(0, 2, [MicroBatch((0, 1)), MicroBatch((2,), 4)]),
                    Group(2, 1, [MicroBatch((3,))]),
                    Group(3, 1, [MicroBatch((4,))]),
                ]
            ),
            Round([Group(0, 4, [MicroBatch((5,))])]),
        ],
    )
    res = simulate_step(plan, batch, cost)
    end, busy = reference_timeline(plan, batch, cost)
    assert res.step_time_s == pytest.approx(end + cost.step_sync_time())
    assert lower_bound(batch, cost) <= res.step_time_s


def test_auto_source_falls_back_when_the_cluster_profile_cannot_serve():
    cluster = dataclasses.replace(cluster_spec("cpu"), profile="results/calibration/missing.json")
    cost = make_cost_model("tiny_llama", cluster, source="auto")
    assert cost.source == "analytical" and "not found" in cost.describe()["auto_fallback"]


# ------------------------------------------------------------------------------------------------
# The capacity-aware lower bound against the optimum over every plan of small instances.


def set_partitions(items: list[int]):
    """Every partition of ``items`` into non-empty blocks."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in set_partitions(rest):
        yield [[first], *part]
        for i in range(len(part)):
            yield [*part[:i], [first, *part[i]], *part[i + 1 :]]


def fastest_microbatch(cost: CostModel, batch: GlobalBatch, members: tuple[int, ...], sp: int):
    """(duration, ckpt_layers) of the fastest setting of one sequence-split micro-batch on
    ``sp`` ranks among every checkpointed-layer count whose memory is under the cap; None when
    none fits. One `microbatch_cost` call per count, as the validator and simulator price it."""
    sel = list(members)
    best = None
    for k in range(cost.model.num_layers + 1):
        c = cost.microbatch_cost(batch.tokens[sel], batch.frames[sel], sp, k)
        if c.mem_bytes <= cost.memory_cap_bytes and (best is None or c.total_s < best[0]):
            best = (c.total_s, k)
    return best


def optimal_makespan(
    tasks: list[tuple[float, int]], world: int
) -> tuple[float, list[tuple[int, int]]]:
    """Exhaustive: every order of the tasks and every aligned block for each; a task starts when
    every rank of its block is free (the simulator's timeline with one group per round).
    Returns the least makespan and its (task, block start) sequence."""
    memo: dict[tuple[frozenset[int], tuple[float, ...]], tuple[float, list[tuple[int, int]]]] = {}

    def go(left: frozenset[int], free: tuple[float, ...]) -> tuple[float, list[tuple[int, int]]]:
        if not left:
            return max(free), []
        key = (left, free)
        if key in memo:
            return memo[key]
        best: tuple[float, list[tuple[int, int]]] = (float("inf"), [])
        for t in sorted(left):
            d, s = tasks[t]
            for b in range(0, world, s):
                start = max(free[b : b + s])
                end, seq = go(left - {t}, free[:b] + (start + d,) * s + free[b + s :])
                if end < best[0]:
                    best = (end, [(t, b), *seq])
        memo[key] = best
        return best

    return go(frozenset(range(len(tasks))), (0.0,) * world)


def brute_force_optimum(batch: GlobalBatch, cost: CostModel) -> tuple[float, StepPlan]:
    """The fastest plan of ``batch`` over every plan: every partition of the samples into
    micro-batches, every SP degree of each, its fastest feasible checkpointing (the makespan
    only grows with a micro-batch's duration) and every schedule. Plans with several
    micro-batches in one group run them back to back, as consecutive one-micro-batch groups do;
    a batch-split micro-batch is never faster than its ranks' single-rank micro-batches run
    side by side, which this search holds. Returns the step time (sync included) and the plan."""
    W = cost.cluster.world_size
    sps = cost.cluster.sp_degrees()
    memo: dict[tuple[tuple[int, ...], int], tuple[float, int] | None] = {}
    best: tuple[float, StepPlan | None] = (float("inf"), None)
    for part in set_partitions(list(range(batch.n))):
        blocks = [tuple(b) for b in part]
        options = []
        for b in blocks:
            opts = []
            for sp in sps:
                if (b, sp) not in memo:
                    memo[(b, sp)] = fastest_microbatch(cost, batch, b, sp)
                if memo[(b, sp)] is not None:
                    opts.append((sp, *memo[(b, sp)]))
            options.append(opts)
        for choice in itertools.product(*options):
            tasks = [(d, sp) for sp, d, _ in choice]
            end, seq = optimal_makespan(tasks, W)
            if end < best[0]:
                rounds = [
                    Round([Group(blk, choice[t][0], [MicroBatch(blocks[t], choice[t][2])])])
                    for t, blk in seq
                ]
                best = (end, StepPlan(W, rounds))
    assert best[1] is not None, "no feasible plan"
    return best[0] + cost.step_sync_time(), best[1]


def packed_share_bound(batch: GlobalBatch, cost: CostModel) -> float:
    """The bound before the capacity constraint: packed shares at the fewest checkpointed layers
    that fit, no per-micro-batch cost."""
    budget = cost.memory_cap_bytes - cost.static_memory_bytes()
    gpu = np.full(batch.n, np.inf)
    fast = np.full(batch.n, np.inf)
    for sp in cost.cluster.sp_degrees():
        for i in range(batch.n):
            t, f = batch.tokens[i : i + 1], batch.frames[i : i + 1]
            ks = [
                k
                for k in range(cost.model.num_layers + 1)
                if cost.sample_memory(t, f, sp, k)[0] <= budget
            ]
            if ks:
                share = float(cost.sample_time_packed(t, f, sp, ks[0])[0])
                gpu[i] = min(gpu[i], sp * share)
                fast[i] = min(fast[i], share)
    return max(gpu.sum() / cost.cluster.world_size, fast.max()) + cost.step_sync_time()


@dataclass
class CapacityToyCost(CostModel):
    """A closed-form cost with a fixed cost per micro-batch and a memory cap that limits its
    tokens: a micro-batch of tokens n_i on s ranks with k of L layers checkpointed takes
    ``over * (1 + [s > 1]) + sum_i (c * n_i + a * n_i^2) / s * (1 + k / (3 L))``; a sample's
    activations take ``mem_sample + n / s * (full_b * (L - k) + ckpt_b * k) / L`` per rank."""

    c: float = 1e-3
    a: float = 1e-8
    over: float = 0.4
    full_b: float = 1e6
    ckpt_b: float = 0.2e6
    mem_sample: float = 0.0
    static_b: float = 1e9
    source: str = "test-capacity-toy"

    def _work(self, tokens, sp, ckpt_layers):
        n = np.asarray(tokens, dtype=float)
        return (self.c * n + self.a * n * n) / sp * (1 + ckpt_layers / (3 * self.model.num_layers))

    def microbatch_overhead(self, sp, ckpt_layers):
        return self.over * (2.0 if sp > 1 else 1.0)

    def microbatch_cost(self, tokens, frames, sp, ckpt_layers, split="sequence"):
        t = float(self._work(tokens, sp, ckpt_layers).sum()) + self.microbatch_overhead(
            sp, ckpt_layers
        )
        mem = float(self.sample_memory(tokens, frames, sp, ckpt_layers).sum())
        return MicroBatchCost(
            fwd_s=t,
            bwd_s=0.0,
            recompute_s=0.0,
            comm_s=0.0,
            mem_bytes=self.static_b + mem,
            model_flops=float(np.sum(tokens)) * 1e9,
        )

    def sample_time(self, tokens, frames, sp, ckpt_layers):
        return self._work(tokens, sp, ckpt_layers) + self.microbatch_overhead(sp, ckpt_layers)

    def sample_time_packed(self, tokens, frames, sp, ckpt_layers):
        return self._work(tokens, sp, ckpt_layers)

    def sample_memory(self, tokens, frames, sp, ckpt_layers):
        L = self.model.num_layers
        per_tok = (self.full_b * (L - ckpt_layers) + self.ckpt_b * ckpt_layers) / L
        return self.mem_sample + np.asarray(tokens, dtype=float) / sp * per_tok

    def static_memory_bytes(self):
        return self.static_b

    def step_sync_time(self):
        return 0.25


def toy_cost(world: int, **kw) -> CapacityToyCost:
    base = cluster_spec("h200x8")
    cluster = dataclasses.replace(base, name=f"toy{world}", num_nodes=1, gpus_per_node=world)
    model = dataclasses.replace(model_spec("tiny_llama"), num_layers=2)
    return CapacityToyCost(model=model, cluster=cluster, **kw)


def test_toy_bound_is_exact_when_samples_fill_micro_batches():
    """Four samples of half a micro-batch's capacity on one rank: the optimum is two full
    micro-batches without recompute, 2 * over + the packed shares, and the bound says the same."""
    cost = toy_cost(1, a=0.0)
    cap_tokens = (cost.memory_cap_bytes - cost.static_b) / cost.full_b
    half = int(cap_tokens // 2)
    batch = GlobalBatch.from_lengths([half] * 4)
    opt, plan = brute_force_optimum(batch, cost)
    want = 2 * cost.over + 4 * cost.c * half + cost.step_sync_time()
    assert opt == pytest.approx(want)
    assert lower_bound(batch, cost) == pytest.approx(want)
    assert packed_share_bound(batch, cost) == pytest.approx(want - 2 * cost.over)


@pytest.mark.parametrize("seed", range(6))
def test_capacity_bound_below_the_toy_optimum(seed):
    """Random small batches on 2 and 4 ranks, with and without a per-sample memory constant:
    the bound never exceeds the best plan's step time, and never falls below the packed-share
    bound."""
    rng = np.random.default_rng(seed)
    world = [2, 4][seed % 2]
    cost = toy_cost(world, mem_sample=[0.0, 5e9][seed // 3])
    cap_tokens = (cost.memory_cap_bytes - cost.static_b) / cost.full_b
    n = 4 if world == 4 else 5
    batch = GlobalBatch.from_lengths(rng.integers(int(cap_tokens * 0.05), int(cap_tokens * 1.5), n))
    opt, plan = brute_force_optimum(batch, cost)
    validate_plan(plan, batch, cost)
    assert simulate_step(plan, batch, cost).step_time_s == pytest.approx(opt, rel=1e-12)
    bound = lower_bound(batch, cost)
    assert packed_share_bound(batch, cost) <= bound * (1 + 1e-12)
    assert bound <= opt * (1 + 1e-12)


@pytest.mark.parametrize(
    ("model", "lengths", "frames"),
    [
        ("llama3_8b", [3000, 4500, 6000, 9000], None),
        ("llama3_8b", [1200, 2500, 7000, 40_000], None),
        ("llama3_8b", [800, 900, 5000, 120_000], None),
        ("stdit3_xl2", [51 * 120, 51 * 240, 2 * 3600, 15 * 900], [51, 51, 2, 15]),
        ("stdit3_xl2", [30 * 1200, 1 * 256, 8 * 900, 51 * 3600], [30, 1, 8, 51]),
    ],
)
def test_capacity_bound_below_the_optimum_of_real_specs(model, lengths, frames):
    """Llama-3-8B and STDiT3-XL/2 on 4 H200s (analytical cost model), batches whose micro-batches
    hit the memory cap: the bound lies between the packed-share bound and the step time of the
    fastest plan (every partition, SP degree, checkpointing and schedule)."""
    cost = make_cost_model(model, cluster_spec("h200x8").resized(4))
    batch = GlobalBatch.from_lengths(lengths, frames=frames)
    opt, plan = brute_force_optimum(batch, cost)
    validate_plan(plan, batch, cost)
    assert simulate_step(plan, batch, cost).step_time_s == pytest.approx(opt, rel=1e-9)
    bound = lower_bound(batch, cost)
    old = packed_share_bound(batch, cost)
    assert old <= bound * (1 + 1e-12)
    assert bound <= opt * (1 + 1e-12)
    print(
        f"{model} {lengths}: optimum / bound {opt / bound:.4f}, optimum / packed-share bound "
        f"{opt / old:.4f}"
    )


@settings(max_examples=25, deadline=None)
@given(
    tokens=st.lists(st.integers(16, 1 << 18), min_size=1, max_size=60),
    model=st.sampled_from(["llama3_8b", "stdit3_xl2"]),
    cluster=st.sampled_from(["h200x8", "h200x32"]),
)
def test_capacity_bound_never_below_the_packed_share_bound(tokens, model, cluster):
    cost = make_cost_model(model, cluster)
    batch = GlobalBatch.from_lengths(tokens)
    assert packed_share_bound(batch, cost) <= lower_bound(batch, cost) * (1 + 1e-12)


def test_analytical_overhead_is_what_a_micro_batch_adds_to_its_shares():
    """Analytical model: a Llama micro-batch takes exactly its samples' packed shares plus
    `microbatch_overhead`; an STDiT one at least that (per-sample caption projections)."""
    rng = np.random.default_rng(5)
    for model in ("llama3_8b", "stdit3_xl2"):
        cost = make_cost_model(model, "h200x32")
        for _ in range(40):
            n = int(rng.integers(1, 12))
            fr = (
                np.ones(n, dtype=np.int64)
                if model == "llama3_8b"
                else rng.choice([1, 4, 15, 51], n)
            )
            tok = fr * rng.integers(16, 4000, n)
            sp = int(rng.choice([1, 2, 4, 8, 16, 32]))
            k = int(rng.integers(0, cost.model.num_layers + 1))
            total = cost.microbatch_cost(tok, fr, sp, k).total_s
            parts = float(cost.sample_time_packed(tok, fr, sp, k).sum()) + cost.microbatch_overhead(
                sp, k
            )
            if model == "llama3_8b":
                assert total == pytest.approx(parts, rel=1e-9)
            else:
                assert total >= parts * (1 - 1e-12)


@settings(max_examples=20, deadline=None)
@given(
    model=st.sampled_from(["llama3_8b", "stdit3_xl2"]),
    world=st.sampled_from([2, 4]),
    data=st.data(),
)
def test_capacity_bound_below_the_optimum_of_random_small_batches(model, world, data):
    """As above on random batches of 2 to 5 samples (text up to 64K tokens; video clips of 1 to
    51 latent frames at 256 to 3,600 patches)."""
    cost = make_cost_model(model, cluster_spec("h200x8").resized(world))
    n = data.draw(st.integers(2, 5 if world == 2 else 4))
    if model == "llama3_8b":
        frames = [1] * n
        tokens = data.draw(st.lists(st.integers(256, 65_536), min_size=n, max_size=n))
    else:
        frames = data.draw(st.lists(st.sampled_from([1, 2, 8, 15, 30, 51]), min_size=n, max_size=n))
        spatial = data.draw(
            st.lists(st.sampled_from([256, 900, 1200, 3600]), min_size=n, max_size=n)
        )
        tokens = [f * s for f, s in zip(frames, spatial)]
    batch = GlobalBatch.from_lengths(tokens, frames=frames)
    try:
        bound = lower_bound(batch, cost)
    except InfeasibleError:
        assume(False)
    opt, _ = brute_force_optimum(batch, cost)
    assert packed_share_bound(batch, cost) <= bound * (1 + 1e-12)
    assert bound <= opt * (1 + 1e-12)


@pytest.mark.parametrize("model", ["llama3_8b", "stdit3_xl2"])
def test_sample_bounds_are_the_least_over_every_setting(model):
    """`sample_bounds` (vectorised, only the lower hull of checkpoint counts evaluated) equals
    the least of its formula over every SP degree and every checkpointed-layer count that fits,
    evaluated one setting at a time."""
    cost = make_cost_model(model, "h200x16")
    rng = np.random.default_rng(11)
    frames = np.ones(30, dtype=np.int64) if model == "llama3_8b" else rng.choice([1, 8, 30, 51], 30)
    tokens = frames * (
        rng.integers(64, 200_000, 30) if model == "llama3_8b" else rng.choice([256, 900, 3600], 30)
    )
    batch = GlobalBatch.from_lengths(tokens, frames=frames)
    budget = cost.memory_cap_bytes - cost.static_memory_bytes()
    gpu = np.full(batch.n, np.inf)
    fast = np.full(batch.n, np.inf)
    for sp in cost.cluster.sp_degrees():
        cap = [cost.microbatch_token_capacity(sp, k) for k in range(cost.model.num_layers + 1)]
        for k in range(cost.model.num_layers + 1):
            o = cost.microbatch_overhead(sp, k)
            for i in range(batch.n):
                t, f = batch.tokens[i : i + 1], batch.frames[i : i + 1]
                if cost.sample_memory(t, f, sp, k)[0] > budget:
                    continue
                p = float(cost.sample_time_packed(t, f, sp, k)[0])
                gpu[i] = min(gpu[i], sp * (p + t[0] / sp / cap[k] * o))
                fast[i] = min(fast[i], p + o)
    sb = sample_bounds(batch, cost)
    assert sb.gpu_seconds == pytest.approx(gpu, rel=1e-12)
    assert sb.fastest_s == pytest.approx(fast, rel=1e-12)
