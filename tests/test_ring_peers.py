"""The peers on whole-node ring groups: Megatron-Core's CP group sizes (hybrid CP: the powers of
two below the world and the world itself; a fixed CP size: any divisor of the world), so a
1M-token document runs on 3 nodes of 8 GPUs under `megatron_hybrid_cp` (when its scheduler
reaches the whole world), `packed_static` and `wlb_llm` (a CP size of 24). Hand-worked cases."""

from __future__ import annotations

import numpy as np
import pytest

from baselines.megatron_hybrid_cp import (
    MegatronHybridCP,
    gpus_needed,
    megatron_cp_group_sizes,
)
from baselines.packed_static import PackedStatic, ring_cp_degrees
from baselines.scheduling import whole_cp_degrees
from baselines.wlb_llm import WLBLLM
from dcp_bench.batch import GlobalBatch
from dcp_bench.cost import make_cost_model
from dcp_bench.cost.specs import cluster_spec
from dcp_bench.errors import ConfigError, InfeasibleError
from dcp_bench.plan import validate_plan
from dcp_bench.sim import lower_bound, simulate_step

MILLION = 1_048_576


def _cost(world: int, model: str = "llama3_8b"):
    return make_cost_model(model, cluster_spec("h200x8").resized(world))


def _long_batch() -> GlobalBatch:
    rng = np.random.default_rng(0)
    return GlobalBatch.from_lengths(np.r_[MILLION, rng.integers(1_000, 60_000, 120)])


def _checked(plan, batch, cost) -> float:
    validate_plan(plan, batch, cost)
    assert sorted(plan.sample_positions()) == list(range(batch.n))
    res = simulate_step(plan, batch, cost)
    assert np.isfinite(res.step_time_s) and not res.oom
    assert res.step_time_s >= lower_bound(batch, cost) * (1 - 1e-12)
    return float(res.step_time_s)


def test_megatron_cp_group_sizes_hand_worked() -> None:
    """`create_hybrid_dp_cp_groups` builds 2^i for i = 1 .. floor(log2 W) - 1; the whole DPxCP
    group is the world. 24: floor(log2 24) = 4, so 2, 4, 8, and 24; 8: 2, 4 and 8; 96: 2 .. 32
    and 96 (64 does not divide 96); 40: 16 does not divide 40, so 2, 4, 8 and 40."""
    assert megatron_cp_group_sizes(24) == [1, 2, 4, 8, 24]
    assert megatron_cp_group_sizes(8) == [1, 2, 4, 8]
    assert megatron_cp_group_sizes(96) == [1, 2, 4, 8, 16, 32, 96]
    assert megatron_cp_group_sizes(40) == [1, 2, 4, 8, 40]
    assert megatron_cp_group_sizes(1) == [1]


def test_fixed_cp_degrees_beyond_the_powers_of_two() -> None:
    """Divisors of the world that are no power of two and keep to node boundaries (nodes of 8):
    24 GPUs: 3, 6 and 12 cross nodes, so 24 only; 96: 24, 48, 96; 40: 5, 10, 20 cross nodes,
    so 40. One node of 6 GPUs: rings of 3 and 6 (a2a+p2p: none, no group spans nodes). Video
    models (no ring pricing): none."""
    assert whole_cp_degrees(_cost(24), hierarchical=True) == [24]
    assert whole_cp_degrees(_cost(24), hierarchical=False) == [24]
    assert whole_cp_degrees(_cost(96), hierarchical=False) == [24, 48, 96]
    assert whole_cp_degrees(_cost(40), hierarchical=True) == [40]
    assert whole_cp_degrees(_cost(6), hierarchical=False) == [3, 6]
    assert whole_cp_degrees(_cost(6), hierarchical=True) == []
    assert whole_cp_degrees(_cost(24, "stdit3_xl2"), hierarchical=False) == []
    assert ring_cp_degrees(_cost(24), "a2a") == []


def test_megatron_runs_a_million_token_document_on_the_whole_world() -> None:
    """One 1,048,576-token document, 24 GPUs, the example launch (full recompute, the ceiling
    one GPU holds: 89,800 tokens). It needs 2^ceil(log2(1048576 / 89800)) = 2^ceil(3.68) = 16
    ranks (8 x 89,800 = 718,400 < 1,048,576 <= 16 x 89,800): a group of 16 on ranks 0-15, 8
    ranks idle; both schedulers grow the smallest group to min(2 x 16, 24) = 24, the whole
    world, which Megatron-Core has (its DP-with-CP group). One round, one ring of 24."""
    cost = _cost(24)
    batch = GlobalBatch.from_lengths([MILLION])
    for scheduler in ("balanced_cp", "default_dynamic_cp"):
        plan = MegatronHybridCP(scheduler=scheduler).plan(batch, cost)
        m = plan.info["max_tokens_per_rank"]
        assert gpus_needed(MILLION, m) == 16
        assert [[(g.start, g.size) for g in r.groups] for r in plan.rounds] == [[(0, 24)]]
        (mb,) = plan.rounds[0].groups[0].micro_batches
        assert (mb.samples, mb.sp_kind) == ((0,), "ring")
        _checked(plan, batch, cost)


def test_megatron_refuses_a_group_it_has_no_process_group_for() -> None:
    """The document on ranks 0-15 and a 4,096-token one on a rank of its own: the smallest group
    (1) doubles to 2, 4, 8 and fills ranks 16-23, so the 16 stays, a size Megatron-Core builds
    no process group for on 24 ranks (2, 4, 8 and 24 only): refused, naming it."""
    cost = _cost(24)
    batch = GlobalBatch.from_lengths([MILLION, 4096])
    for scheduler in ("balanced_cp", "default_dynamic_cp"):
        with pytest.raises(
            InfeasibleError, match=r"CP group of 16 ranks on 24 ranks for sample 0 .*1, 2, 4, 8, 24"
        ):
            MegatronHybridCP(scheduler=scheduler).plan(batch, cost)


@pytest.mark.parametrize(
    ("make", "kind", "uly"),
    [
        (lambda: PackedStatic(), "hybrid", 8),
        (lambda: PackedStatic(cp_comm_type="p2p"), "ring", 0),
        (lambda: WLBLLM(), "hybrid", 8),
    ],
)
def test_fixed_cp_peers_take_a_cp_size_of_24(make, kind, uly) -> None:
    """No power of two up to 8 holds the document (SP 8 at most ~718K tokens), 16 does not
    divide 24, so the fixed CP size is 24, the one group of the round: Ulysses 8 inside each
    node and the ring across (a2a+p2p, WLB-LLM's hybrid layout) or one ring (p2p)."""
    cost = _cost(24)
    batch = _long_batch()
    plan = make().plan(batch, cost)
    assert plan.info["sp"] == 24
    groups = [(g.start, g.size) for r in plan.rounds for g in r.groups]
    assert set(groups) == {(0, 24)}
    home = [mb for _, _, mb in plan.micro_batches() if 0 in mb.samples]
    assert [(mb.sp_kind, mb.ulysses_degree) for mb in home] == [(kind, uly)]
    _checked(plan, batch, cost)


def test_fixed_cp_sizes_a_user_sets() -> None:
    """sp=24 is a CP size Megatron runs on 24 GPUs; sp=12 crosses a node boundary and sp=16
    does not divide the world: refused with the degrees that are allowed."""
    cost = _cost(24)
    batch = GlobalBatch.from_lengths([MILLION, 30_000])
    assert PackedStatic(sp=24).plan(batch, cost).info["sp"] == 24
    with pytest.raises(ConfigError, match=r"sp=12 is not a power of two .*or one of 24"):
        PackedStatic(sp=12, cp_comm_type="p2p").plan(batch, cost)
    with pytest.raises(ConfigError, match="sp=16 does not divide the world size 24"):
        WLBLLM(sp=16).plan(batch, cost)


def test_a_cp_size_of_24_comes_after_the_recompute_fallback() -> None:
    """A 200,000-token document on 24 GPUs. Selective recompute (16 of 32 layers) holds at most
    101,608 tokens at CP 8, 304,826 at CP 24; full recompute ~89,800 per rank: 179,600 at CP 2,
    359,200 at CP 4. The plan stays what it was before CP sizes of 24 existed: the user's
    fallback to full recompute at CP 4, not selective at 24."""
    cost = _cost(24)
    batch = GlobalBatch.from_lengths([200_000, 30_000, 20_000])
    for planner in (PackedStatic(), WLBLLM()):
        plan = planner.plan(batch, cost)
        assert (plan.info["sp"], plan.info["recompute"]) == (4, "full")
        _checked(plan, batch, cost)


def test_option_check_lets_ring_peers_name_any_cp_size_and_keeps_bucket_static_to_powers():
    """`method.sp=24` reaches packed_static and wlb_llm (their plans check it against the world);
    the reference baseline's Ulysses degree stays a power of two at parse time."""
    from dcp_bench.errors import ConfigError
    from dcp_bench.planners.base import check_planner_options

    for target in ("baselines.packed_static.PackedStatic", "baselines.wlb_llm.WLBLLM"):
        check_planner_options({"_target_": target, "sp": 24})
    with pytest.raises(ConfigError, match=r"method.sp=24 .*expected a power of two"):
        check_planner_options({"_target_": "baselines.bucket_static.BucketStatic", "sp": 24})
