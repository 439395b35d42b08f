"""Ring and hybrid groups in plans: `dcp` places a sequence no Ulysses group holds on a ring or
hybrid group the runtime can run, the validator accepts exactly the groups the runtime can run
(hand-worked cases), and the lower bound covers them (`dcp` never beats it)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dcp_bench.batch import GlobalBatch
from dcp_bench.cost import make_cost_model
from dcp_bench.cost.specs import cluster_spec, model_spec
from dcp_bench.errors import InfeasibleError, PlanError
from dcp_bench.layout import ring_group_settings
from dcp_bench.plan import Group, MicroBatch, Round, StepPlan, plan_offences, validate_plan
from dcp_bench.planners.dcp import DCPPlanner
from dcp_bench.planners.settings import build_shape_table, raise_if_infeasible
from dcp_bench.sim import lower_bound, simulate_step


def _cost(world: int, model: str = "llama3_8b"):
    return make_cost_model(model, cluster_spec("h200x8").resized(world))


def _plan(world: int, groups: list[tuple[int, int, list[MicroBatch]]]) -> StepPlan:
    return StepPlan(
        world_size=world,
        rounds=[Round(groups=[Group(start=s, size=n, micro_batches=m) for s, n, m in groups])],
    )


def test_ring_settings_of_three_nodes_and_of_a_twelve_head_model() -> None:
    """Hand-worked: 3 nodes of 8 have aligned degrees 1-8 (Llama-3-8B runs Ulysses on all), so
    the ring groups are whole nodes beyond 8: 16 and 24 GPUs, Ulysses 8 inside each node. A
    12-head model on 32 GPUs runs Ulysses at 1, 2, 4; the aligned 8, 16 and 32 become hybrid
    groups of Ulysses 4 (the largest runnable degree dividing them)."""
    assert ring_group_settings(24, 8, [1, 2, 4, 8]) == [(16, 8), (24, 8)]
    assert ring_group_settings(32, 8, [1, 2, 4]) == [(8, 4), (16, 4), (32, 4)]
    assert ring_group_settings(8, 8, [1, 2, 4, 8]) == []
    assert _cost(24).ring_settings() == [(16, 8), (24, 8)]
    # video (DSP) has no ring pricing: no ring groups
    assert _cost(24, "stdit3_xl2").ring_settings() == []


def test_a_million_token_document_on_24_gpus() -> None:
    """A 1,048,576-token document fits no Ulysses group of 3 nodes (at most 8 GPUs, ~718K
    tokens): `dcp` puts it on a hybrid group of whole nodes (Ulysses 8 inside a node, ring
    across), the plan validates, and its simulated step is finite, not over memory, and no
    faster than the lower bound, which covers the same groups."""
    cost = _cost(24)
    rng = np.random.default_rng(0)
    batch = GlobalBatch.from_lengths(np.r_[1_048_576, rng.integers(1_000, 60_000, 120)])
    plan = DCPPlanner().plan(batch, cost)
    validate_plan(plan, batch, cost)
    assert sorted(plan.sample_positions()) == list(range(batch.n))
    home = [(g, mb) for _, g, mb in plan.micro_batches() if 0 in mb.samples]
    assert len(home) == 1
    g, mb = home[0]
    assert g.size in (16, 24) and g.start % 8 == 0
    assert (mb.sp_kind, mb.ulysses_degree) == ("hybrid", 8)
    res = simulate_step(plan, batch, cost)
    assert np.isfinite(res.step_time_s) and not res.oom
    assert res.step_time_s >= lower_bound(batch, cost) * (1 - 1e-12)
    # before ring groups the same batch was infeasible on the Ulysses degrees alone
    with pytest.raises(InfeasibleError, match="fits none of the runnable SP degrees"):
        table = build_shape_table(batch.tokens, batch.frames, cost, packed=True)
        raise_if_infeasible(table, batch.tokens, batch.frames, cost)


def test_validator_accepts_ring_groups_the_runtime_runs() -> None:
    """Hand-worked, world of 8 ranks, no cost model: a ring needs only point-to-point sends, so
    a ring group of 3 ranks from rank 1 is fine; a hybrid of 6 ranks from rank 2 with Ulysses 2
    has sub-groups {2,3}, {4,5}, {6,7}, aligned blocks of the pool."""
    batch = GlobalBatch.from_lengths([100, 200, 300])
    plan = _plan(
        8,
        [(0, 1, [MicroBatch(samples=(0,))]), (1, 3, [MicroBatch(samples=(1,), sp_kind="ring")])],
    )
    hybrid = MicroBatch(samples=(2,), sp_kind="hybrid", ulysses_degree=2)
    plan.rounds.append(Round(groups=[Group(start=2, size=6, micro_batches=[hybrid])]))
    assert plan_offences(plan, batch) == []
    validate_plan(plan, batch)


@pytest.mark.parametrize(
    ("start", "size", "mb", "expected"),
    [
        # Ulysses needs an aligned power-of-two block (its all-to-all's process group)
        (0, 3, MicroBatch(samples=(0,)), "group size must be a power of two"),
        (2, 4, MicroBatch(samples=(0,)), "group not aligned"),
        # hybrid sub-groups {1,2}, {3,4}: not aligned blocks of the pool
        (1, 4, MicroBatch(samples=(0,), sp_kind="hybrid", ulysses_degree=2), "are not aligned"),
        # a Ulysses degree not dividing the group
        (0, 6, MicroBatch(samples=(0,), sp_kind="hybrid", ulysses_degree=4), "dividing the group"),
        # a batch-split micro-batch needs an aligned group too
        (0, 3, MicroBatch(samples=(0,), split="batch"), "group size must be a power of two"),
    ],
)
def test_validator_refuses_groups_the_runtime_cannot_run(start, size, mb, expected) -> None:
    batch = GlobalBatch.from_lengths([100])
    plan = _plan(8, [(start, size, [mb])])
    with pytest.raises(PlanError, match=expected):
        validate_plan(plan, batch)


def test_validator_with_a_cost_model_on_three_nodes() -> None:
    """24 GPUs in nodes of 8 (Llama-3-8B, 32 heads): a hybrid group of all 24 (Ulysses 8) is
    valid; a ring of 12 from rank 4 crosses node boundaries; a hybrid with Ulysses 16 does not
    divide the world of 24 (no such sub-group in the pool); a Ulysses group of 24 is refused."""
    cost = _cost(24)
    batch = GlobalBatch.from_lengths([500_000])
    hybrid = MicroBatch(samples=(0,), ckpt_layers=32, sp_kind="hybrid", ulysses_degree=8)
    ok = _plan(24, [(0, 24, [hybrid])])
    validate_plan(ok, batch, cost)
    for groups, expected in [
        ([(8, 12, [MicroBatch(samples=(0,), sp_kind="ring")])], "crosses a node boundary"),
        (
            [(0, 16, [MicroBatch(samples=(0,), sp_kind="hybrid", ulysses_degree=16)])],
            "not a power of two dividing the world size 24",
        ),
        ([(0, 24, [MicroBatch(samples=(0,))])], "group size must be a power of two"),
    ]:
        with pytest.raises(PlanError, match=expected):
            validate_plan(_plan(24, groups), batch, cost)


def test_validator_refuses_a_hybrid_degree_the_heads_do_not_divide() -> None:
    """A 12-head decoder: hybrid with Ulysses 8 shards 12 heads over 8 ranks: refused; Ulysses
    4 inside a ring of 2 (8 ranks) is fine."""
    config = {
        "model_type": "qwen2",
        "hidden_size": 1536,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "intermediate_size": 8960,
        "vocab_size": 151936,
        "max_position_embeddings": 1 << 20,
    }
    model = model_spec("hf", library="transformers", config=config, dtype="bf16")
    cost = make_cost_model(model, cluster_spec("h200x8"))
    batch = GlobalBatch.from_lengths([50_000])
    bad = _plan(8, [(0, 8, [MicroBatch(samples=(0,), sp_kind="hybrid", ulysses_degree=8)])])
    with pytest.raises(PlanError, match="the model cannot run it"):
        validate_plan(bad, batch, cost)
    # ulysses_degree must be < the group size, so 8 on 8 ranks is refused either way; 4 works
    good = _plan(8, [(0, 8, [MicroBatch(samples=(0,), sp_kind="hybrid", ulysses_degree=4)])])
    validate_plan(good, batch, cost)


def test_ring_packed_shares_bound_ring_micro_batches() -> None:
    """The bound's ingredient for ring and hybrid groups: a micro-batch's time is at least the
    sum of its samples' packed shares plus the Ulysses part's fixed cost, for random packed
    micro-batches at every ring setting of 3 and 12 nodes."""
    rng = np.random.default_rng(1)
    for world in (24, 96):
        cost = _cost(world)
        for sp, u in cost.ring_settings():
            for k in (0, 7, 32):
                tok = rng.integers(2_000, 400_000, 4)
                fr = np.ones(4, dtype=np.int64)
                c = cost.microbatch_costs(
                    tok,
                    fr,
                    np.zeros(4, dtype=np.int64),
                    np.array([sp]),
                    np.array([k]),
                    ulysses=np.array([u]),
                )
                t = float(cost.total_time(c)[0])
                low = float(cost.ring_packed_share(tok, fr, sp, u, k).sum())
                low += cost.microbatch_overhead(u, k)
                assert t >= low * (1 - 1e-12), (world, sp, u, k)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lengths=st.lists(st.integers(64, 1_200_000), min_size=1, max_size=40),
    world=st.sampled_from([16, 24, 40]),
)
def test_dcp_never_beats_its_bound_with_ring_groups(lengths, world) -> None:
    """Random corpora with long documents on 2, 3 and 5 nodes: every `dcp` plan validates and
    its simulated step is at least the lower bound (which covers ring and hybrid groups)."""
    cost = _cost(world)
    batch = GlobalBatch.from_lengths(lengths)
    try:
        plan = DCPPlanner().plan(batch, cost)
    except InfeasibleError:
        with pytest.raises(InfeasibleError):
            lower_bound(batch, cost)
        return
    validate_plan(plan, batch, cost)
    assert simulate_step(plan, batch, cost).step_time_s >= lower_bound(batch, cost) * (1 - 1e-12)


def test_one_sample_bound_hand_worked() -> None:
    """One sample with two settings on 4 ranks: alone on 1 rank (10 s, 10 GPU-s) or on all 4
    (4 s, 16 GPU-s); the others need 20 GPU-s. On 1 rank the step takes max(10, 30 / 4) = 10;
    on 4 ranks max(4, 36 / 4) = 9: no plan beats 9, while max(work / W, fastest) gives only
    max(30 / 4, 4) = 7.5."""
    from dcp_bench.sim import SampleBounds, one_sample_bound

    sb = SampleBounds(
        gpu_seconds=np.array([10.0]),
        fastest_s=np.array([4.0]),
        best_sp=np.array([4]),
        setting_time=np.array([[10.0, 4.0]]),
        setting_gpu_seconds=np.array([[10.0, 16.0]]),
        shape_of=np.array([0]),
    )
    assert one_sample_bound(sb, 0, 20.0, 4) == pytest.approx(9.0)


def test_whole_node_groups_are_placed_first_on_the_nodes_free_earliest() -> None:
    """Hand-worked, 3 nodes of 8: a 16-rank task of 5 s goes to ranks 0-15 at 0; a second one
    of 3 s sees nodes 0-1 and 1-2 both free at 5 and takes the lower start (0) at 5; the two
    one-rank tasks go to the idle ranks 16 and 17 at 0; a 24-rank task (the whole world) then
    waits for everyone."""
    from dcp_bench.planners.dcp import list_schedule

    times = np.array([5.0, 3.0, 2.0, 1.0])
    sizes = np.array([16, 16, 1, 1])
    s = list_schedule(times, sizes, 24, "size", node=8)
    assert s.block_start.tolist() == [0, 0, 16, 17]
    assert s.start.tolist() == [0.0, 5.0, 0.0, 0.0]
    assert s.makespan == 8.0
    s = list_schedule(np.array([5.0, 4.0, 2.0]), np.array([16, 24, 8]), 24, "size", node=8)
    # longest whole-node task first: 16 at 0 (0-15), then 24 at 5 (it waits for ranks 0-15);
    # the aligned 8 follows the whole-node tasks: every block is free at 9, the lowest is 0
    assert s.block_start.tolist() == [0, 0, 0] and s.start.tolist() == [0.0, 5.0, 9.0]
