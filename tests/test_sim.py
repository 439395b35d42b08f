"""The simulator against closed forms and a brute-force per-rank reference; the lower bound against
simulated plans."""

from __future__ import annotations

import dataclasses
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
from dcp_bench.sim import NoiseModel, lower_bound, sample_bounds, simulate_step

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
            fwd_s=t - comm, bwd_s=0.0, recompute_s=0.0, comm_s=comm,
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
        base, name=f"test{world}", num_nodes=max(1, world // gpus_per_node), gpus_per_node=min(world, gpus_per_node)
    )
    return LinearCost(model=model_spec("tiny_llama"), cluster=cluster)


def one_round(world, groups):
    return StepPlan(world, [Round([Group(s, z, [MicroBatch(tuple(m)) for m in mbs]) for s, z, mbs in groups])])


def test_one_group_closed_form():
    cost = linear_cost(1)
    batch = GlobalBatch.from_lengths([1000, 3000])
    res = simulate_step(one_round(1, [(0, 1, [[0], [1]])]), batch, cost)
    assert res.step_time_s == pytest.approx(4.0 + 0.5)
    assert res.busy_s.tolist() == pytest.approx([4.5]) and res.idle_s.tolist() == pytest.approx([0.0])
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
    plan = StepPlan(4, [
        Round([Group(0, 2, [MicroBatch((0,))]), Group(2, 2, [MicroBatch((1,))])]),  # 0.5 s and 1.5 s
        Round([Group(0, 2, [MicroBatch((2,))]), Group(2, 2, [MicroBatch((3,))])]),  # 1 s each
    ])
    flow = simulate_step(plan, batch, cost)
    barrier = simulate_step(plan, batch, cost, round_barrier=True)
    assert flow.compute_end_s == pytest.approx(2.5)  # ranks 2-3: 1.5 + 1
    assert barrier.compute_end_s == pytest.approx(2.5)
    # A group spanning both halves must wait for the slow half either way.
    plan.rounds[1] = Round([Group(0, 4, [MicroBatch((2, 3))])])
    assert simulate_step(plan, batch, cost).compute_end_s == pytest.approx(1.5 + 1.0)
    plan.rounds[1] = Round([Group(0, 2, [MicroBatch((2, 3))])])  # ranks 0-1 only: 2 s
    assert simulate_step(plan, batch, cost).compute_end_s == pytest.approx(0.5 + 2.0)
    assert simulate_step(plan, batch, cost, round_barrier=True).compute_end_s == pytest.approx(1.5 + 2.0)


def reference_timeline(plan: StepPlan, batch: GlobalBatch, cost: CostModel) -> tuple[float, list[float]]:
    """Brute force: walk the rounds, one micro-batch cost call at a time."""
    free = [0.0] * plan.world_size
    busy = [0.0] * plan.world_size
    for rnd in plan.rounds:
        for g in rnd.groups:
            d = 0.0
            for mb in g.micro_batches:
                sel = list(mb.samples)
                d += cost.microbatch_cost(batch.tokens[sel], batch.frames[sel], g.size, mb.ckpt_layers, mb.split).total_s
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
    frames = draw(st.lists(st.sampled_from([1, 2, 4, 15, 30]), min_size=n, max_size=n)) if model == "stdit3_xl2" else [1] * n
    batch = GlobalBatch.from_lengths(np.asarray(spatial) * np.asarray(frames), frames=frames)
    order = draw(st.permutations(list(range(n))))
    rounds: list[Round] = []
    i = 0
    while i < n:
        groups, rank = [], 0
        while rank < world and i < n:
            size = draw(st.sampled_from([s for s in (1, 2, 4, 8) if rank % s == 0 and rank + s <= world]))
            take = draw(st.integers(1, min(3, n - i)))
            mbs = [MicroBatch((p,), draw(st.sampled_from([0, layers // 2, layers]))) for p in order[i : i + take]]
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
    over_cap = int((cost.memory_cap_bytes - 1e9) / BYTES_PER_TOKEN) + 10  # over the cap, under usable
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
    slow = simulate_step(plan, batch, cost, noise=NoiseModel(seed=1, jitter_sigma=0.0, straggler_prob=1.0, straggler_slowdown=2.0))
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
    assert res.comm_share == pytest.approx(8 * cost.step_sync_breakdown()["grad_sync_s"] / res.busy_s.sum())
    with pytest.raises(ClusterError, match="plan for 8 ranks cannot run on cluster 'h200x32' of 32"):
        simulate_step(plan, batch, make_cost_model("stdit3_xl2", "h200x32"))


def test_simulator_runs_the_profiled_source(tmp_path):
    """Both sources behind one interface: with a profiled cost model (the base class's
    per-micro-batch loop) the timeline still equals the brute-force walk."""
    from test_profiling import cpu_cluster, synthetic_artifact

    from dcp_bench.cost.profile_artifact import dumps_artifact

    path = tmp_path / "tiny_llama.json"
    path.write_text(dumps_artifact(synthetic_artifact("tiny_llama", [128, 256, 1024, 2048], [1, 2, 4], 4)))
    cost = make_cost_model("tiny_llama", cpu_cluster(4), source="auto", profile=path)
    assert cost.source == "profiled"
    batch = GlobalBatch.from_lengths([300, 900, 2000, 64, 128, 512])
    plan = StepPlan(4, [
        Round([Group(0, 2, [MicroBatch((0, 1)), MicroBatch((2,), 4)]), Group(2, 1, [MicroBatch((3,))]), Group(3, 1, [MicroBatch((4,))])]),
        Round([Group(0, 4, [MicroBatch((5,))])]),
    ])
    res = simulate_step(plan, batch, cost)
    end, busy = reference_timeline(plan, batch, cost)
    assert res.step_time_s == pytest.approx(end + cost.step_sync_time())
    assert lower_bound(batch, cost) <= res.step_time_s


def test_auto_source_falls_back_when_the_cluster_profile_cannot_serve():
    cluster = dataclasses.replace(cluster_spec("cpu"), profile="results/calibration/missing.json")
    cost = make_cost_model("tiny_llama", cluster, source="auto")
    assert cost.source == "analytical" and "not found" in cost.describe()["auto_fallback"]
