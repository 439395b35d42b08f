"""Baselines: plans validate, and each pins a documented behaviour of the system it reproduces.

`ToyCost` is a small closed-form cost model (linear + quadratic time, linear memory) so the
expected plans can be computed by hand; the shipped analytical model is used where it exists.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from baselines.bucket_static import BucketStatic, bucket_key, damp_batch_sizes
from baselines.packed_static import CP_COMM_TYPES, PackedStatic, packed_static_plan
from baselines.scheduling import (
    estimate_step_time,
    largest_batch_size,
    lpt_assign,
    pack_under_budget,
)
from baselines.static_tuned import StaticTuned
from dcp_bench.batch import GlobalBatch
from dcp_bench.cost.base import CostModel, MicroBatchCost
from dcp_bench.cost.specs import cluster_spec, model_spec
from dcp_bench.errors import ConfigError, InfeasibleError
from dcp_bench.plan import validate_plan

GiB = 2**30


@dataclass
class ToyCost(CostModel):
    """time(L, sp) = (a L + b L^2) / sp + comm L / sp (sp > 1); recompute = ckpt/layers of the
    forward (a third of the compute); memory = static + act_per_token * L / sp, scaled down by
    checkpointing. Text and video alike (frames only decide the split)."""

    a: float = 1e-6
    b: float = 1e-11
    comm: float = 2e-7
    act_per_token: float = 2e5
    act_ckpt_per_token: float = 2e4
    static_bytes: float = 20 * GiB
    source: str = "toy"

    def _compute(self, tokens: np.ndarray) -> np.ndarray:
        L = tokens.astype(np.float64)
        return self.a * L + self.b * L * L

    def _act(self, tokens: np.ndarray, ckpt: int) -> np.ndarray:
        frac = ckpt / self.model.num_layers
        per_tok = self.act_per_token * (1 - frac) + self.act_ckpt_per_token * frac
        return per_tok * tokens.astype(np.float64)

    def microbatch_cost(self, tokens, frames, sp, ckpt_layers, split="sequence"):
        comp = float(self._compute(tokens).sum())
        frac = ckpt_layers / self.model.num_layers
        if split == "batch":
            # whole samples dealt to ranks: the busiest rank holds ceil(n/sp) of the largest
            k = -(-len(tokens) // sp)
            top = np.sort(tokens)[::-1][:k]
            per_rank = float(self._compute(top).sum())
            mem = float(self._act(top, ckpt_layers).sum())
            comm = 0.0
        else:
            per_rank = comp / sp
            mem = float(self._act(tokens, ckpt_layers).sum()) / sp
            comm = self.comm * float(tokens.sum()) / sp if sp > 1 else 0.0
        return MicroBatchCost(
            fwd_s=per_rank / 3,
            bwd_s=2 * per_rank / 3,
            recompute_s=frac * per_rank / 3,
            comm_s=comm,
            mem_bytes=self.static_bytes + mem,
            model_flops=comp * 1e15,
        )

    def sample_time(self, tokens, frames, sp, ckpt_layers):
        frac = ckpt_layers / self.model.num_layers
        comm = self.comm * tokens / sp if sp > 1 else 0.0 * tokens
        return self._compute(tokens) / sp * (1 + frac / 3) + comm

    def sample_memory(self, tokens, frames, sp, ckpt_layers):
        return self._act(tokens, ckpt_layers) / sp

    def static_memory_bytes(self):
        return self.static_bytes

    def step_sync_time(self):
        return 0.05


def toy(model: str = "llama3_8b", cluster: str = "h200x32") -> ToyCost:
    return ToyCost(model=model_spec(model), cluster=cluster_spec(cluster))


def real_cost(model: str, cluster: str = "h200x32") -> CostModel:
    """The shipped analytical cost model when it is installed, else the toy one."""
    try:
        from dcp_bench.cost import make_cost_model  # type: ignore[attr-defined]
    except ImportError:
        return toy(model, cluster)
    return make_cost_model(model, cluster)


def text_batch(n: int = 200, seed: int = 0, scale: float = 1.0) -> GlobalBatch:
    rng = np.random.default_rng(seed)
    L = np.clip(rng.lognormal(8.0, 1.3, n) * scale, 16, 262144).astype(np.int64)
    return GlobalBatch.from_lengths(L)


def video_batch(n: int = 120, seed: int = 0) -> GlobalBatch:
    """Open-Sora-like shapes: images (T'=1) and clips at a few resolutions / frame counts."""
    rng = np.random.default_rng(seed)
    spatial = rng.choice([256, 920, 3600], n)  # 256x256 / 480p / 720p latent patches
    frames = rng.choice([1, 17, 34, 51, 120], n, p=[0.3, 0.3, 0.2, 0.15, 0.05])
    return GlobalBatch.from_lengths(spatial * frames, frames=frames)


# ---------------------------------------------------------------- shared scheduling helpers


def test_largest_batch_size_matches_linear_scan():
    cost = toy()
    for L in (1000, 30000, 200000):
        for sp in (1, 4):
            want = 0
            for bs in range(1, 200):
                t = np.full(bs, L)
                if (
                    cost.microbatch_memory(t, np.ones(bs, np.int64), sp, 32, "sequence")
                    > cost.memory_cap_bytes
                ):
                    break
                want = bs
            assert largest_batch_size(L, 1, cost, sp, 32, "sequence", 199) == want


def test_lpt_assign_is_a_partition_within_the_list_scheduling_bound():
    rng = np.random.default_rng(1)
    costs = rng.uniform(1, 10, 50).tolist()
    bins = lpt_assign(costs, 7)
    assert sorted(i for b in bins for i in b) == list(range(50))
    loads = [sum(costs[i] for i in b) for b in bins]
    # greedy list scheduling: the busiest bin exceeds the mean by at most one item
    assert max(loads) <= sum(costs) / 7 + max(costs) + 1e-9
    # and on a tiny instance LPT is within 4/3 of the brute-force optimum (Graham's bound)
    small = [7.0, 5.0, 4.0, 4.0, 3.0, 3.0]
    best = min(
        max(
            sum(small[i] for i in range(6) if (code >> i) & 1),
            sum(small[i] for i in range(6) if not (code >> i) & 1),
        )
        for code in range(64)
    )
    got = max(sum(small[i] for i in b) for b in lpt_assign(small, 2))
    assert best <= got <= (4 / 3 - 1 / 6) * best + 1e-9


def test_pack_under_budget_respects_budget_and_memory():
    cost, batch = toy(), text_batch(300)
    mbs = pack_under_budget(batch, range(batch.n), cost, 4, 32, 300_000)
    assert sorted(p for mb in mbs for p in mb) == list(range(batch.n))
    for mb in mbs:
        assert batch.tokens[list(mb)].sum() <= 300_000
        assert (
            cost.microbatch_memory(batch.tokens[list(mb)], batch.frames[list(mb)], 4, 32)
            <= cost.memory_cap_bytes
        )


def test_pack_under_budget_rejects_sequence_longer_than_budget():
    cost = toy()
    batch = GlobalBatch.from_lengths([1000, 50_000])
    with pytest.raises(InfeasibleError, match="token budget 20000 is below the sequence of 50000"):
        pack_under_budget(batch, range(2), cost, 1, 32, 20_000)


# ---------------------------------------------------------------- bucket_static


def test_bucket_keys_follow_the_reference_buckets():
    assert bucket_key(17 * 920, 17, "stdit") == (17, 920)
    assert bucket_key(3600, 1, "stdit") == (1, 3600)
    assert bucket_key(3000, 1, "llama") == (1, 4096)
    assert bucket_key(4096, 1, "llama") == (1, 4096)


def test_damping_rule_of_the_reference_benchmark():
    bs = {(1, 1): 40, (2, 2): 10, (3, 3): 8, (4, 4): 3}
    times = {(1, 1): 1.0, (2, 2): 2.0, (3, 3): 4.0, (4, 4): 8.0}
    # t_med = 3.0: buckets faster keep bs; slower get floor(bs * 3/t), at least 1
    assert damp_batch_sizes(bs, times) == {(1, 1): 40, (2, 2): 10, (3, 3): 6, (4, 4): 1}


@pytest.mark.parametrize("model,batch_fn", [("llama3_8b", text_batch), ("stdit3_xl2", video_batch)])
def test_bucket_static_fair_runs_every_sample_once_at_one_sp(model, batch_fn):
    cost, batch = toy(model), batch_fn()
    plan = BucketStatic().plan(batch, cost)
    validate_plan(plan, batch, cost)
    sizes = {g.size for r in plan.rounds for g in r.groups}
    assert sizes == {plan.info["sp"]} and len(plan.rounds) == 1
    # default sp: the smallest degree at which the longest sample fits
    longest = int(np.argmax(batch.tokens))
    sp = plan.info["sp"]
    t, f = batch.tokens[[longest]], batch.frames[[longest]]
    assert cost.microbatch_memory(t, f, sp, cost.model.num_layers) <= cost.memory_cap_bytes
    if sp > 1:
        assert cost.microbatch_memory(t, f, sp // 2, cost.model.num_layers) > cost.memory_cap_bytes
    # every micro-batch holds one bucket, full checkpointing
    for _, _, mb in plan.micro_batches():
        keys = {
            bucket_key(int(batch.tokens[p]), int(batch.frames[p]), cost.model.arch)
            for p in mb.samples
        }
        assert len(keys) == 1 and mb.ckpt_layers == cost.model.num_layers


def test_bucket_static_images_split_along_the_batch():
    cost, batch = toy("stdit3_xl2"), video_batch()
    plan = BucketStatic(sp=4).plan(batch, cost)
    for _, _, mb in plan.micro_batches():
        is_image = all(batch.frames[p] == 1 for p in mb.samples)
        assert mb.split == ("batch" if is_image else "sequence")


def test_bucket_static_paper_mode_deals_one_bucket_per_replica_and_drops_the_rest():
    cost, batch = toy("stdit3_xl2"), video_batch(300)
    planner = BucketStatic(mode="paper", sp=4, max_batch_size=64)
    plan = planner.plan(batch, cost)
    validate_plan(plan, batch, cost)
    dp = 32 // 4
    k = plan.info["reference_steps"]
    assert (
        all(len(g.micro_batches) == k for g in plan.rounds[0].groups)
        and len(plan.rounds[0].groups) == dp
    )
    used = len(plan.sample_positions())
    assert used + plan.info["dropped_samples"] == batch.n
    # batch size per bucket: the damped largest-that-fits value (bounded by the bucket's samples)
    bsz = plan.info["bucket_batch_sizes"]
    for _, _, mb in plan.micro_batches():
        p = mb.samples[0]
        key = bucket_key(int(batch.tokens[p]), int(batch.frames[p]), "stdit")
        assert len(mb.samples) <= bsz[f"{key[0]}x{key[1]}"]


def test_bucket_static_paper_mode_skips_buckets_that_do_not_fit():
    cost = toy("stdit3_xl2")
    cost.act_ckpt_per_token = 2e5  # checkpointing saves nothing here: 120x3600 cannot fit sp=1
    huge = 120 * 3600
    batch = GlobalBatch.from_lengths([256 * 17] * 20 + [huge], frames=[17] * 20 + [120])
    plan = BucketStatic(mode="paper", sp=1).plan(batch, cost)
    validate_plan(plan, batch, cost)
    assert plan.info["skipped_buckets"] == ["120x3600"]
    assert 20 not in plan.sample_positions()
    with pytest.raises(InfeasibleError, match="does not fit at batch size 1"):
        BucketStatic(mode="fair", sp=1).plan(batch, cost)


def test_bucket_static_bad_sp_is_a_config_error():
    cost, batch = toy(), text_batch(20)
    with pytest.raises(ConfigError, match="sp=64 is larger than the world"):
        BucketStatic(sp=64).plan(batch, cost)
    with pytest.raises(ConfigError, match="sp=3 is not a power of two"):
        BucketStatic(sp=3).plan(batch, cost)


def test_estimate_step_time_is_slowest_group_plus_sync():
    cost = toy()
    batch = GlobalBatch.from_lengths([1000, 2000, 3000])
    plan = BucketStatic(sp=8).plan(batch, cost)
    per_group = []
    for g in plan.rounds[0].groups:
        per_group.append(
            sum(
                cost.microbatch_cost(
                    batch.tokens[list(mb.samples)],
                    batch.frames[list(mb.samples)],
                    8,
                    mb.ckpt_layers,
                ).total_s
                for mb in g.micro_batches
            )
        )
    assert estimate_step_time(plan, batch, cost) == pytest.approx(max(per_group) + 0.05)


# ---------------------------------------------------------------- packed_static / static_tuned


@pytest.mark.parametrize("model,batch_fn", [("llama3_8b", text_batch), ("stdit3_xl2", video_batch)])
def test_packed_static_balances_replicas_within_the_lpt_bound(model, batch_fn):
    cost, batch = toy(model), batch_fn(400)
    plan = PackedStatic(sp=2, token_budget=500_000).plan(batch, cost)
    validate_plan(plan, batch, cost)
    t = cost.sample_time(batch.tokens, batch.frames, 2, cost.model.num_layers)
    loads = [sum(t[p] for mb in g.micro_batches for p in mb.samples) for g in plan.rounds[0].groups]
    # greedy list scheduling: the busiest replica exceeds the mean by at most one item
    assert max(loads) <= sum(t) / len(loads) + max(t) + 1e-12
    for _, _, mb in plan.micro_batches():
        assert batch.tokens[list(mb.samples)].sum() <= 500_000


def test_packed_static_bad_sp_is_a_config_error():
    with pytest.raises(ConfigError, match="sp=64 is larger than the world"):
        PackedStatic(sp=64).plan(text_batch(10), toy())
    with pytest.raises(ConfigError, match="sp=6 is not a power of two"):
        PackedStatic(sp=6).plan(text_batch(10), toy())


def test_packed_static_budget_below_longest_sequence_is_infeasible():
    cost, batch = toy(), GlobalBatch.from_lengths([4096, 100_000])
    with pytest.raises(InfeasibleError, match="token budget 8192 is below the sequence of 100000"):
        PackedStatic(sp=4, token_budget=8192).plan(batch, cost)


def test_static_tuned_picks_the_grid_argmin_and_reuses_it():
    cost, batch = toy(), text_batch(150, seed=3)
    planner = StaticTuned()
    plan = planner.plan(batch, cost)
    validate_plan(plan, batch, cost)
    # independent exhaustive scoring of the same grid
    best = None
    longest = int(batch.tokens.max())
    for sp in (1, 2, 4, 8, 16, 32):
        for rec, ckpt in (("full", 32), ("selective", 16), ("none", 0)):
            for budget in (longest, 2 * longest, 4 * longest, 8 * longest, None):
                try:
                    p = packed_static_plan(batch, cost, sp, ckpt, budget)
                except InfeasibleError:
                    continue
                t = estimate_step_time(p, batch, cost)
                if best is None or t < best[0]:
                    best = (t, f"sp={sp} recompute={rec} token_budget={budget}")
    assert plan.info["tuned_config"] == best[1]
    assert estimate_step_time(plan, batch, cost) == pytest.approx(best[0])
    plan2 = planner.plan(text_batch(150, seed=4), cost)
    assert plan2.info["tuned_config"] == best[1] and plan2.info["tuned_on_batches"] == 1


def test_static_tuned_rejects_sp_choice_beyond_the_world():
    with pytest.raises(ConfigError, match="sp=64 in sp_choices is larger than the world"):
        StaticTuned(sp_choices=[8, 64]).plan(text_batch(10), toy())


def test_static_tuned_budget_follows_a_longer_sequence_without_a_new_search():
    """The token budget is a multiple of the longest sequence: a later, longer sequence gets the
    budget the tuned multiple gives it, with no new search (the tuned SP degree and recompute
    still run it)."""
    cost = toy()
    planner = StaticTuned(sp_choices=[1], recompute_choices=["full"], budget_multiples=[1])
    first = planner.plan(GlobalBatch.from_lengths([4000] * 64), cost)
    assert first.info["tuned_config"] == "sp=1 recompute=full token_budget=4000"
    later = GlobalBatch.from_lengths([4000] * 63 + [30000], step=1)
    plan = planner.plan(later, cost)
    validate_plan(plan, later, cost)
    assert (
        not plan.info["retuned"]
        and plan.info["tuned_on_batches"] == 1
        and plan.info["tune_s"] == 0.0
    )
    assert plan.info["budget_multiple"] == 1 and plan.info["token_budget"] == 30000
    assert plan.info["tuned_config"] == "sp=1 recompute=full token_budget=4000"
    for _, _, mb in plan.micro_batches():
        assert later.tokens[list(mb.samples)].sum() <= 30000
    assert first.info["tune_s"] > 0


def test_static_tuned_retunes_when_a_later_batch_cannot_run():
    """A later sequence the tuned SP degree cannot hold even fully recomputed: a new search over
    every batch that needed one, which picks a larger degree."""
    cost = toy()
    planner = StaticTuned(recompute_choices=["full"], budget_multiples=[None])
    first = planner.plan(GlobalBatch.from_lengths([4000] * 64), cost)
    assert first.info["tuned_config"].startswith("sp=1 ")
    budget = cost.memory_cap_bytes - cost.static_memory_bytes()
    L = cost.model.num_layers

    def fits(n: int, sp: int) -> bool:
        return bool(cost.sample_memory(np.array([n]), np.array([1]), sp, L)[0] <= budget)

    too_long = next(n for n in (4000 * 2**i for i in range(1, 20)) if not fits(n, 1))
    assert fits(too_long, cost.cluster.world_size)
    later = GlobalBatch.from_lengths([4000] * 63 + [too_long], step=1)
    plan = planner.plan(later, cost)
    validate_plan(plan, later, cost)
    assert plan.info["retuned"] and plan.info["tuned_on_batches"] == 2 and plan.info["tune_s"] > 0
    assert not plan.info["tuned_config"].startswith("sp=1 ")


def test_packed_static_default_recompute_is_selective_then_full_when_it_cannot_hold():
    from baselines.scheduling import (
        largest_fitting,
        recompute_holding_longest,
        smallest_fitting_sp,
    )

    cost = toy()
    L = cost.model.num_layers
    W = cost.cluster.world_size
    # the longest sequence selective recompute holds on the world's largest group
    n_sel = largest_fitting(lambda n: smallest_fitting_sp(n, 1, cost, L // 2, W) is not None, 2**28)
    assert 0 < n_sel < 2**28
    short = GlobalBatch.from_lengths([n_sel, 1000])
    planner = PackedStatic()
    assert planner.plan(short, cost).info["recompute"] == "selective"
    too_long = GlobalBatch.from_lengths([n_sel + 1, 1000])
    assert smallest_fitting_sp(n_sel + 1, 1, cost, L, W) is not None  # full recompute holds it
    assert recompute_holding_longest(too_long, cost, "selective") == "full"
    assert planner.plan(too_long, cost).info["recompute"] == "full"
    # the fallback stays for the rest of the run
    assert planner.plan(short, cost).info["recompute"] == "full"
    # a pinned setting is never changed
    with pytest.raises(InfeasibleError):
        PackedStatic(recompute="selective").plan(too_long, cost)


def test_dp_balanced_packing_is_megatrons_in_order_round_robin():
    # data_schedule.py:437-489 (Megatron-LM d98e8a64), worked by hand: lengths 5, 4, 3, 6, 2
    # with 8 tokens per pack: next-fit in order gives [5] [4, 3] [6, 2]; 3 packs are not a
    # multiple of dp = 2, so the last sample of the last multi-sample pack (2) moves to its own
    # pack: [5] [4, 3] [6] [2]; pack q goes to replica q % 2
    from baselines.packed_static import dp_balanced_packs

    cost = toy()  # 32 ranks; sp=16 -> dp=2
    batch = GlobalBatch.from_lengths([5, 4, 3, 6, 2])
    assert dp_balanced_packs(batch, cost, 16, 0, 8, 2) == [[(0,), (3,)], [(1, 2), (4,)]]
    plan = PackedStatic(sp=16, token_budget=8, packing="dp_balanced").plan(batch, cost)
    validate_plan(plan, batch, cost)
    assert [[mb.samples for mb in g.micro_batches] for g in plan.rounds[0].groups] == [
        [(0,), (3,)],
        [(1, 2), (4,)],
    ]
    with pytest.raises(ConfigError, match="packing"):
        PackedStatic(packing="ffd")


def test_packed_static_cp_comm_types_are_megatrons():
    """Megatron's ``--cp-comm-type`` (arguments.py:3221, transformer_config.py:1030-1040 at
    d98e8a64): ``p2p`` a ring over the CP group, ``a2a`` the Ulysses all-to-all, ``a2a+p2p``
    all-to-all inside the first level (here a node) and the ring across. The plans hold the same
    micro-batches and differ only in how their attention spans the group."""
    cost, batch = real_cost("llama3_8b"), text_batch(200, seed=4, scale=0.25)  # 8-GPU nodes
    plans = {c: PackedStatic(sp=16, cp_comm_type=c).plan(batch, cost) for c in CP_COMM_TYPES}
    kinds = {c: {(mb.sp_kind, mb.ulysses_degree) for _, _, mb in p.micro_batches()}
             for c, p in plans.items()}  # fmt: skip
    assert kinds == {"p2p": {("ring", 0)}, "a2a": {("ulysses", 0)}, "a2a+p2p": {("hybrid", 8)}}
    for p in plans.values():
        validate_plan(p, batch, cost)
        assert [mb.samples for _, _, mb in p.micro_batches()] == [
            mb.samples for _, _, mb in plans["a2a"].micro_batches()
        ]
    assert PackedStatic().cp_comm_type == "a2a+p2p"
    # inside one node the hierarchy has one level: Ulysses
    inside = PackedStatic(sp=8).plan(batch, cost)
    assert {mb.sp_kind for _, _, mb in inside.micro_batches()} == {"ulysses"}
    with pytest.raises(ConfigError, match="cp_comm_type='all_gather'"):
        PackedStatic(cp_comm_type="all_gather")
