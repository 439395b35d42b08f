"""megatron_hybrid_cp: the reference's CP-size rule, L^2 balance and fill-by-doubling behaviour,
and the per-workload tuning of its launch configuration (per-rank ceiling x recompute) checked
against brute force over the configuration space."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, replace

import numpy as np
import pytest
from test_baselines import ToyCost, real_cost, text_batch, toy

from baselines.megatron_hybrid_cp import (
    LaunchConfig,
    MegatronHybridCP,
    MegatronHybridCPTuned,
    candidate_configs,
    dynamic_cp_gpus_needed,
    dynamic_cp_micro_batch,
    gpus_needed,
    hybrid_cp_plan,
    largest_cp_group,
    max_tokens_per_rank_ladder,
    recompute_flags,
)
from baselines.scheduling import estimate_step_time, max_tokens_fitting_one_rank
from dcp_bench.batch import GlobalBatch
from dcp_bench.cost.specs import cluster_spec, model_spec
from dcp_bench.errors import ConfigError, InfeasibleError
from dcp_bench.plan import validate_plan
from dcp_bench.sim import simulate_step


def group_size_of(plan):
    return {p: g.size for _, g, mb in plan.micro_batches() for p in mb.samples}


def test_gpus_needed_is_next_power_of_two_of_length_over_budget():
    m = 8192
    cases = {
        1: 1,
        8192: 1,
        8193: 2,
        16384: 2,
        16385: 4,
        20000: 4,
        65536: 8,
        70000: 16,
        1_000_000: 128,
    }
    for L, cp in cases.items():
        assert gpus_needed(L, m) == cp
        # closed form of the reference: max(1, 2^ceil(log2(L / m)))
        assert cp == max(1, 2 ** int(np.ceil(np.log2(L / m))))


def test_each_sequence_runs_on_the_cp_size_it_needs_when_ranks_are_all_busy():
    cost = toy()
    # 2 sequences needing CP4 and 40 needing CP1: the first round fills all 32 ranks, so no
    # group is widened and every sequence runs at exactly its needed size
    lengths = [30000, 30000] + [6000] * 40
    batch = GlobalBatch.from_lengths(lengths)
    plan = MegatronHybridCP(max_tokens_per_rank=8192, pack_sequences=False).plan(batch, cost)
    validate_plan(plan, batch, cost)
    sizes = group_size_of(plan)
    assert plan.info["sequences_on_expanded_groups"] == 0
    assert all(sizes[p] == gpus_needed(lengths[p], 8192) for p in range(batch.n))
    # one sequence per micro-batch, as the schedule read runs each sub-sample alone
    assert all(len(mb.samples) == 1 for _, _, mb in plan.micro_batches())


def test_a_lone_sequence_is_widened_to_the_whole_world():
    cost = toy()
    batch = GlobalBatch.from_lengths([10000])
    plan = MegatronHybridCP(max_tokens_per_rank=8192).plan(batch, cost)
    validate_plan(plan, batch, cost)
    # needs CP2; the reference doubles the smallest group until no GPU is idle
    assert [g.size for g in plan.rounds[0].groups] == [32]


def test_round_loads_are_balanced_on_the_l2_estimate():
    cost = toy()
    batch = text_batch(400, seed=5)
    plan = MegatronHybridCP(max_tokens_per_rank=16384).plan(batch, cost)
    validate_plan(plan, batch, cost)
    # per-rank L^2/cp load of the first (full) round: its busiest rank is at most the mean plus
    # the largest single sequence load (greedy least-loaded assignment bound)
    rnd = plan.rounds[0]
    loads, items = [], []
    for g in rnd.groups:
        w = [int(batch.tokens[mb.samples[0]]) ** 2 / g.size for mb in g.micro_batches]
        loads += [sum(w)] * g.size
        items += w
    assert max(loads) <= sum(loads) / len(loads) + max(items) + 1e-6


def test_sequence_needing_more_than_the_world_is_infeasible():
    with pytest.raises(
        InfeasibleError, match=r"needs 64 context-parallel ranks at max_tokens_per_rank=1000"
    ):
        MegatronHybridCP(max_tokens_per_rank=1000).plan(GlobalBatch.from_lengths([50_000]), toy())


@pytest.mark.parametrize("model", ["llama3_8b", "stdit3_xl2"])
def test_default_tuned_plans_validate_on_the_shipped_cost_model(model):
    cost = real_cost(model)
    batch = text_batch(150, seed=2)
    plan = MegatronHybridCPTuned().plan(batch, cost)
    validate_plan(plan, batch, cost)
    assert sorted(plan.sample_positions()) == list(range(batch.n))


def test_packing_keeps_the_schedule_and_packs_within_the_per_rank_budget():
    cost, batch = toy(), text_batch(300, seed=7)
    plain = MegatronHybridCP(max_tokens_per_rank=16384, pack_sequences=False).plan(batch, cost)
    packed = MegatronHybridCP(max_tokens_per_rank=16384, pack_sequences=True).plan(batch, cost)
    validate_plan(packed, batch, cost)
    # same rounds and groups (the schedule does not depend on packing), fewer micro-batches
    assert group_size_of(plain) == group_size_of(packed)
    assert sum(1 for _ in packed.micro_batches()) < sum(1 for _ in plain.micro_batches())
    for _, g, mb in packed.micro_batches():
        toks = int(batch.tokens[list(mb.samples)].sum())
        assert len(mb.samples) == 1 or toks <= 16384 * g.size


# ------------------------------------------------------------- launch configuration tuning
#
# A toy cost whose memory is tight enough that the whole configuration space can be enumerated:
# a 4-layer model where one rank holds 4 tokens without recompute and 40 with every layer
# recomputed, on 8 ranks (so no sequence over 320 tokens can run at all).

TIGHT_LAYERS = 4
TIGHT_WORLD = 8


@dataclass
class LatencyToy(ToyCost):
    """`ToyCost` plus a fixed cost per micro-batch that grows with its group (collective
    latency), so that a larger per-rank ceiling (smaller groups, fuller packs) wins on some
    batches and a smaller one (more ranks per sequence, less recompute) on others."""

    launch_s: float = 1e-4

    def microbatch_cost(self, tokens, frames, sp, ckpt_layers, split="sequence"):
        c = super().microbatch_cost(tokens, frames, sp, ckpt_layers, split)
        return replace(c, comm_s=c.comm_s + self.launch_s * sp)


def tight_toy():
    cost = LatencyToy(model=model_spec("tiny_llama"), cluster=cluster_spec("h200x8"))
    cost.static_bytes = cost.memory_cap_bytes - 4 * cost.act_per_token
    return cost


def fits_one_rank(cost, tokens: int, ckpt: int) -> bool:
    mem = cost.microbatch_memory(np.array([tokens]), np.ones(1, np.int64), 1, ckpt)
    return bool(mem <= cost.memory_cap_bytes)


def simulated(plan, batch, cost) -> float:
    return simulate_step(plan, batch, cost).step_time_s


def brute_force(batch, cost):
    """Every (recompute, ceiling) configuration, planned and priced by the simulator:
    {(ckpt, m): step time or None}.

    Ceilings 1 .. max(longest, 64): above the longest sequence every sequence needs one rank, so
    the schedule and whether it runs no longer change (only the packing budget does), and 64 is
    past the most any rank holds (40), so every ceiling a user would try is in the grid."""
    out = {}
    for k in range(TIGHT_LAYERS + 1):
        for m in range(1, max(int(batch.tokens.max()), 64) + 1):
            try:
                plan = hybrid_cp_plan(batch, cost, LaunchConfig(m, k))
            except InfeasibleError:
                out[(k, m)] = None
                continue
            out[(k, m)] = simulated(plan, batch, cost)
    return out


def tight_batches():
    """Small batches around the feasibility edges: longest from a few tokens to past 320."""
    rng = np.random.default_rng(11)
    for i in range(24):
        n = int(rng.integers(1, 9))
        longest = int(
            np.exp(rng.uniform(np.log(2), np.log(360)))
        )  # log-uniform: every recompute depth
        short = rng.integers(1, max(2, longest // 4), n - 1)
        yield i, GlobalBatch.from_lengths([longest, *short.tolist()])


def test_tight_toy_has_the_intended_per_rank_limits():
    cost = tight_toy()
    limits = [
        max(m for m in range(1, 200) if fits_one_rank(cost, m, k)) for k in range(TIGHT_LAYERS + 1)
    ]
    assert limits == [4, 5, 7, 12, 40]


@pytest.mark.parametrize("i,batch", list(tight_batches()))
def test_tuned_planner_is_infeasible_exactly_when_no_configuration_runs_the_batch(i, batch):
    cost = tight_toy()
    grid = brute_force(batch, cost)
    feasible = {c: t for c, t in grid.items() if t is not None}
    if not feasible:
        longest = int(batch.tokens.max())
        with pytest.raises(
            InfeasibleError, match=rf"sample 0 \({longest} tokens\).*at most 320 tokens"
        ):
            MegatronHybridCPTuned().plan(batch, cost)
        return
    plan = MegatronHybridCPTuned().plan(batch, cost)
    validate_plan(plan, batch, cost)
    assert sorted(plan.sample_positions()) == list(range(batch.n))
    chosen = (plan.info["ckpt_layers"], plan.info["max_tokens_per_rank"])
    # the chosen configuration is one the brute force runs, at the price the brute force gives it
    assert grid[chosen] == pytest.approx(simulated(plan, batch, cost))


@pytest.mark.parametrize(
    "i,batch", [ib for ib in tight_batches() if int(ib[1].tokens.max()) <= 320]
)
def test_tuned_configuration_is_the_fastest_of_the_configurations_a_user_tries(i, batch):
    """Independent reference: the documented ceilings (the most one rank holds at each recompute
    depth, found here by linear scan; ceil(longest / world); powers of two between), each at
    every recompute depth, priced by brute force. The tuned plan is at least as fast as all of
    them on the simulator, so neither a ceiling nor the least-recompute choice per ceiling was
    missed, and the planner's own pricing agrees with the simulator's timeline."""
    cost = tight_toy()
    grid = brute_force(batch, cost)
    longest = int(batch.tokens.max())
    limits = [
        max(m for m in range(1, 200) if fits_one_rank(cost, m, k)) for k in range(TIGHT_LAYERS + 1)
    ]
    lo = -(-longest // TIGHT_WORLD)
    tried = {
        lo,
        *[m for m in limits if m >= lo],
        *[2**j for j in range(10) if lo <= 2**j <= limits[-1]],
    }
    priced = [grid[(k, m)] for m in tried for k in range(TIGHT_LAYERS + 1)]
    best = min(t for t in priced if t is not None)
    plan = MegatronHybridCPTuned().plan(batch, cost)
    assert simulated(plan, batch, cost) <= best * (1 + 1e-12)


def test_recompute_is_the_least_that_fits_the_ceiling():
    cost = tight_toy()
    batch = GlobalBatch.from_lengths([300, 20, 7, 3])  # needs ceil(300 / 8) = 38 tokens per rank
    plan = MegatronHybridCPTuned().plan(batch, cost)
    validate_plan(plan, batch, cost)
    m, k = plan.info["max_tokens_per_rank"], plan.info["ckpt_layers"]
    assert m >= 38 and fits_one_rank(cost, m, k)
    assert k == 0 or not fits_one_rank(cost, m, k - 1)
    assert plan.info["recompute"] == recompute_flags(k, TIGHT_LAYERS)


def test_pinned_recompute_that_cannot_hold_the_longest_sequence_is_infeasible():
    cost = tight_toy()
    batch = GlobalBatch.from_lengths([300, 20])
    with pytest.raises(
        InfeasibleError, match=r"sample 0 \(300 tokens\).*recompute none.*at most 32 tokens"
    ):
        MegatronHybridCPTuned(recompute="none").plan(batch, cost)
    plan = MegatronHybridCPTuned(recompute="block", recompute_num_layers=TIGHT_LAYERS).plan(
        batch, cost
    )
    validate_plan(plan, batch, cost)
    assert plan.info["ckpt_layers"] == TIGHT_LAYERS


def test_tuning_is_reused_and_redone_only_for_a_batch_the_configuration_cannot_run():
    cost = tight_toy()
    planner = MegatronHybridCPTuned(tune_batches=1)
    first = planner.plan(GlobalBatch.from_lengths([20, 9, 3]), cost)
    assert first.info["tune_s"] > 0 and not first.info["retuned"]
    again = planner.plan(GlobalBatch.from_lengths([18, 5]), cost)
    assert again.info["tuned_config"] == first.info["tuned_config"] and again.info["tune_s"] == 0.0
    # the first ceiling (chosen for 20 tokens) cannot place 300 tokens on 8 ranks
    assert first.info["max_tokens_per_rank"] * TIGHT_WORLD < 300
    longer = GlobalBatch.from_lengths([300, 4])
    plan = planner.plan(longer, cost)
    validate_plan(plan, longer, cost)
    # priced on the tuning batch and the one that failed
    assert plan.info["retuned"] and plan.info["tuned_on_batches"] == 2
    assert plan.info["max_tokens_per_rank"] * TIGHT_WORLD >= 300


def user_tries(longest: int, limits: list[int]) -> dict[int, int]:
    """The ceilings a user tries for ``longest`` tokens on the tight toy, each with the least
    recompute that holds it (independent of the planner: limits found by linear scan)."""
    lo = -(-longest // TIGHT_WORLD)
    ceilings = {
        lo,
        *[m for m in limits if m >= lo],
        *[2**j for j in range(10) if lo <= 2**j <= limits[-1]],
    }
    return {m: next(k for k in range(TIGHT_LAYERS + 1) if limits[k] >= m) for m in ceilings}


@pytest.mark.parametrize("shortlist", [1, 5])
def test_tuning_runs_over_the_first_batches_and_picks_the_summed_simulated_argmin(shortlist):
    """Three tuning batches (a short trial run): every configuration a user tries is priced on
    the first; the ``shortlist`` fastest there are priced on the other two, and the one with
    the least simulated time summed over the three is kept for later batches."""
    cost = tight_toy()
    # on these three the first batch alone and the last alone would pick another ceiling
    lengths = ([71, 16, 21, 14, 40, 30], [91, 53, 43, 38, 39], [32, 54, 20, 11, 34, 34, 11])
    batches = [GlobalBatch.from_lengths(L) for L in lengths]
    planner = MegatronHybridCPTuned(tune_batches=3, shortlist=shortlist)
    plans = [planner.plan(b, cost) for b in batches]
    assert [p.info["tuned_on_batches"] for p in plans] == [1, 2, 3]
    grids = [brute_force(b, cost) for b in batches]
    limits = [
        max(m for m in range(1, 200) if fits_one_rank(cost, m, k)) for k in range(TIGHT_LAYERS + 1)
    ]
    first = sorted(
        (grids[0][(k, m)], m)
        for m, k in user_tries(71, limits).items()
        if grids[0][(k, m)] is not None
    )
    kept = {m for _, m in first[:shortlist]}
    total = {
        m: sum(g[(k, m)] for g in grids)
        for m, k in user_tries(91, limits).items()
        if m in kept and all(g[(k, m)] is not None for g in grids)
    }
    assert total  # the shortlist runs all three here; else the tuning would widen to every ceiling
    chosen = plans[-1].info["max_tokens_per_rank"]
    assert total[chosen] == pytest.approx(min(total.values()), rel=1e-9)
    if shortlist == 1:  # the first batch's favourite, not the three-batch optimum
        assert chosen == first[0][1]
    later = planner.plan(GlobalBatch.from_lengths([100, 50, 3]), cost)
    assert (
        later.info["tuned_config"] == plans[-1].info["tuned_config"] and later.info["tune_s"] == 0.0
    )


def test_bad_recompute_settings_are_config_errors():
    with pytest.raises(ConfigError, match="needs recompute_num_layers"):
        MegatronHybridCP(recompute="block")
    with pytest.raises(ConfigError, match="for recompute=block only"):
        MegatronHybridCP(recompute="full", recompute_num_layers=4)
    with pytest.raises(ConfigError, match="recompute policy 'some'"):
        MegatronHybridCP(recompute="some")
    with pytest.raises(ConfigError, match="exceeds the model's 4 layers"):
        MegatronHybridCP(recompute="block", recompute_num_layers=5).plan(
            GlobalBatch.from_lengths([8]), tight_toy()
        )


def test_long_documents_run_at_8_h200_with_the_recompute_they_need():
    """The issue's case: Llama-3-8B on one H200 node holds about 10K tokens per rank without
    recompute, so a 197,532-token document cannot run on 8 ranks that way; the tuned launch
    raises the ceiling to what the document needs and recomputes just enough layers."""
    cost = real_cost("llama3_8b", "h200x8")
    batch = GlobalBatch.from_lengths([197_532, 40_000, 9000, 5000, 3000] + [800] * 40)
    with pytest.raises(InfeasibleError, match=r"sample 0 \(197532 tokens\)"):
        MegatronHybridCPTuned(recompute="none").plan(batch, cost)
    plan = MegatronHybridCPTuned().plan(batch, cost)
    validate_plan(plan, batch, cost)
    assert sorted(plan.sample_positions()) == list(range(batch.n))
    m, k = plan.info["max_tokens_per_rank"], plan.info["ckpt_layers"]
    assert m * 8 >= 197_532 and 0 < k < cost.model.num_layers
    assert not fits_one_rank(cost, m, k - 1) and fits_one_rank(cost, m, k)


def test_tuning_prices_plans_as_the_simulator_runs_them():
    """Several rounds on the analytical model: the executor lets ranks flow into the next round
    (no barrier), and the tuner's price is the simulator's step time, not the barrier bound."""
    cost = real_cost("llama3_8b", "h200x32")
    batch = text_batch(400, seed=5)
    plan = hybrid_cp_plan(
        batch, cost, LaunchConfig(8192, 8)
    )  # 8K tokens per rank fit the cap with 8 layers recomputed
    assert len(plan.rounds) > 1
    sim = simulated(plan, batch, cost)
    assert estimate_step_time(plan, batch, cost, round_barrier=False) == pytest.approx(
        sim, rel=1e-9
    )
    assert estimate_step_time(plan, batch, cost) > sim * (1 + 1e-6)


def test_tuned_launch_at_8_h200_is_the_simulated_fastest_of_those_tried():
    """A real ShareGPT batch (longest 49K tokens, so ceilings of 6.2K and up): the choice is the
    simulator's argmin over the candidates, each run as the reference runs it (a barrier between
    the schedule's groups)."""
    from dcp_bench.workloads import load_workload

    cost = real_cost("llama3_8b", "h200x8")
    batch = load_workload("sharegpt", tokens_per_gpu=32768).global_batch(
        0, 8, cost.model.max_seq_len
    )
    plan = MegatronHybridCPTuned().plan(batch, cost)
    ladder = max_tokens_per_rank_ladder(cost, cost.model.max_seq_len)
    tried = candidate_configs(
        int(batch.tokens.max()), 8, ladder, list(range(cost.model.num_layers + 1))
    )
    assert plan.info["candidates"] == len(tried) > 1
    planner = MegatronHybridCPTuned()
    times = [simulated(planner.fixed_plan(batch, cost, c), batch, cost) for c in tried]
    assert plan.round_barrier
    assert simulated(plan, batch, cost) == pytest.approx(min(times), rel=1e-9)


def test_round_barrier_is_the_references_and_can_be_lifted():
    """The reference waits for every rank between its groups (hybrid_cp_schedule.py:616): the
    plan carries the barrier, the simulator honours it, and lifting it never slows a plan."""
    from dcp_bench.workloads import load_workload

    cost = real_cost("llama3_8b", "h200x8")
    batch = load_workload("sharegpt", tokens_per_gpu=32768).global_batch(
        0, 8, cost.model.max_seq_len
    )
    with_barrier = MegatronHybridCPTuned().plan(batch, cost)
    assert with_barrier.round_barrier and len(with_barrier.rounds) > 1
    lifted = dataclasses.replace(with_barrier, round_barrier=False)
    assert simulated(lifted, batch, cost) <= simulated(with_barrier, batch, cost)
    assert not MegatronHybridCPTuned(round_barrier=False).plan(batch, cost).round_barrier


# ---------------------------------------------------------------- the launch flags (default)


def test_example_launch_cp_sizes_match_its_readme():
    # examples/dynamic_context_parallel/README.md (Megatron-LM 10ce7bc4): with
    # --max-seqlen-per-dp-cp-rank 2048, samples up to 2048 tokens use one rank, up to 4096 two,
    # up to 8192 four (its lognormal mock data stops at 8192)
    for L, cp in {128: 1, 2048: 1, 2049: 2, 4096: 2, 4097: 4, 8192: 4}.items():
        assert gpus_needed(L, 2048) == cp
    cost = toy("llama3_8b", "h200x8")
    lengths = [8192, 4096, 2048, 1000, 700, 300]
    batch = GlobalBatch.from_lengths(lengths)
    plan = MegatronHybridCP(max_tokens_per_rank=2048, pack_sequences=False).plan(batch, cost)
    validate_plan(plan, batch, cost)
    sizes = group_size_of(plan)
    assert all(sizes[p] >= gpus_needed(L, 2048) for p, L in enumerate(lengths))
    assert plan.info["launch_config"] == "max_seqlen_per_dp_cp_rank=2048 recompute=none"
    assert plan.info["tune_s"] == 0.0


def test_default_launch_is_the_documented_ceiling_without_recompute():
    # the example sets no recompute flags; max_seqlen_per_dp_cp_rank is "the maximum sequence
    # length each rank can handle without overflowing the memory" (model_parallel_config.py)
    cost = tight_toy()
    m = max_tokens_fitting_one_rank(cost, 0)
    assert fits_one_rank(cost, m, 0) and not fits_one_rank(cost, m + 1, 0)
    batch = GlobalBatch.from_lengths([4 * m, m, 1])
    plan = MegatronHybridCP().plan(batch, cost)
    validate_plan(plan, batch, cost)
    assert plan.info["max_tokens_per_rank"] == m and plan.info["ckpt_layers"] == 0
    # full recompute raises the ceiling; the flags, not a search, decide it
    full = MegatronHybridCP(recompute="full").plan(batch, cost)
    assert full.info["max_tokens_per_rank"] == max_tokens_fitting_one_rank(cost, TIGHT_LAYERS)
    assert full.info["recompute"] == "full/uniform/1"


def test_default_launch_that_cannot_place_the_longest_stops_like_megatron():
    cost = tight_toy()
    m = max_tokens_fitting_one_rank(cost, 0)
    too_long = GlobalBatch.from_lengths([m * TIGHT_WORLD + 1, 1])
    with pytest.raises(InfeasibleError, match="relaunch with more recompute"):
        MegatronHybridCP(recompute="none").plan(too_long, cost)
    # the default relaunches with full recompute (the user's fix), and stays there
    planner = MegatronHybridCP()
    full = max_tokens_fitting_one_rank(cost, TIGHT_LAYERS)
    if full * TIGHT_WORLD > m * TIGHT_WORLD + 1:
        plan = planner.plan(too_long, cost)
        assert (
            plan.info["recompute"] == "full/uniform/1" and plan.info["max_tokens_per_rank"] == full
        )
        short = planner.plan(GlobalBatch.from_lengths([1, 1]), cost)
        assert short.info["recompute"] == "full/uniform/1"
    # the tuned variant finds a launch with recompute that runs it, when one exists
    if max_tokens_fitting_one_rank(cost, TIGHT_LAYERS) * TIGHT_WORLD > m * TIGHT_WORLD + 1:
        plan = MegatronHybridCPTuned().plan(too_long, cost)
        assert plan.info["ckpt_layers"] > 0 and plan.info["tune_s"] > 0


def test_search_is_only_the_tuned_variant():
    with pytest.raises(ConfigError, match="megatron_hybrid_cp_tuned"):
        MegatronHybridCP(recompute="auto")
    assert MegatronHybridCPTuned().recompute == "auto"


def test_a_launch_the_scheduler_stops_is_relaunched_with_full_recompute():
    """The reference benchmark's zipf videos on 32 H200: the documented ceiling without
    recompute places the longest clip by length, but its per-sample memory does not fit the
    group the scheduler gives it; Megatron stops (hybrid_cp_schedule.py:369-370) and the user
    relaunches with full recompute, which then stays on for every later batch."""
    from baselines.megatron_hybrid_cp import MegatronHybridCP
    from dcp_bench.workloads import load_workload

    cost = real_cost("stdit3_xl2", "h200x32")
    wl = load_workload("videosys_zipf")
    batch = wl.global_batch(0, 32, cost.model.max_seq_len)
    pinned = MegatronHybridCP(recompute="none")
    with pytest.raises(InfeasibleError, match="relaunch with more recompute"):
        pinned.plan(batch, cost)
    planner = MegatronHybridCP()
    plan = planner.plan(batch, cost)
    validate_plan(plan, batch, cost)
    L = cost.model.num_layers
    assert all(mb.ckpt_layers == L for r in plan.rounds for g in r.groups for mb in g.micro_batches)
    nxt = wl.global_batch(1, 32, cost.model.max_seq_len)
    later = planner.plan(nxt, cost)
    assert all(
        mb.ckpt_layers == L for r in later.rounds for g in r.groups for mb in g.micro_batches
    )


# ------------------------------------- DefaultDynamicCPScheduler (Megatron-LM dev, d48bd6be)


def _groups(groups):
    return [(g.ranks, [p for p, _ in g.seqs]) for g in groups]


def test_dynamic_cp_micro_batches_by_hand():
    """`next_hdp_group_packing_aware` (data_schedule_utils.py:592-831) on 4 ranks with
    max_tokens_per_rank 100, worked by hand from the source's rules. Sequences (position,
    length): A=(0, 300), B=(1, 150), C=(2, 100), D=(3, 60), E=(4, 50).

    Micro-batch 1: cap = 300 x 100 x 1.05 = 31500. A needs 4 ranks (300/100 -> 4): ranks 0-3,
    75 tokens and 300^2/4 = 22500 per rank. B needs 2: no group of 2 and no free rank; the
    group of 4 would hold 75 + 37.5 > 100 tokens: left over. C at 4 ranks: 75 + 25 = 100 <= 100,
    busiest 22500 + 2500 = 25000 <= cap: joins A. D, E: 100 + 15 > 100: left over.
    Micro-batch 2: cap = 150 x 100 x 1.05 = 15750. B on ranks 0-1 (11250 each). D: a new group
    on free rank 2 (busiest 11250) wins over B's group (75 + 30 > 100) and a new pair (11250,
    not strictly less); E: B's group (75 + 25 = 100, busiest 12500) loses to a new group on
    rank 3 (busiest 11250); no rank is empty."""
    seqs = [(0, 300), (1, 150), (2, 100), (3, 60), (4, 50)]
    groups, left = dynamic_cp_micro_batch(seqs, 4, 100)
    assert _groups(groups) == [([0, 1, 2, 3], [0, 2])] and left == [(1, 150), (3, 60), (4, 50)]
    groups, left = dynamic_cp_micro_batch(left, 4, 100)
    assert _groups(groups) == [([0, 1], [1]), ([2], [3]), ([3], [4])] and left == []


def test_dynamic_cp_fills_an_empty_rank_by_doubling_the_smallest_group():
    """(0, 150) on ranks 0-1; (1, 40): a new group on rank 2 (busiest 11250 = cap-free tie
    goes to the first placement met, size 1); rank 3 stays empty, so the smallest group
    (size 1, rank 2) doubles to ranks 2-3 (data_schedule_utils.py:724-795)."""
    groups, left = dynamic_cp_micro_batch([(0, 150), (1, 40)], 4, 100)
    assert _groups(groups) == [([0, 1], [0]), ([2, 3], [1])] and left == []
    assert groups[1].per_rank_tokens == 20.0


def test_dynamic_cp_min_size_and_gpus_needed():
    # dcp_gpus_needed (data_schedule_utils.py:933-936): next power of two, at least min_cp_size
    assert [dynamic_cp_gpus_needed(L, 100) for L in (1, 100, 101, 300, 400, 401)] == [
        1, 1, 2, 4, 4, 8,
    ]  # fmt: skip
    assert dynamic_cp_gpus_needed(50, 100, min_cp_size=2) == 2
    groups, _ = dynamic_cp_micro_batch([(0, 50), (1, 50)], 4, 100, min_cp_size=2)
    assert all(g.size >= 2 for g in groups)


def test_dynamic_cp_whole_world_fallback_on_a_non_power_of_two_world():
    # 6 ranks: the group of 4 cannot double inside the world (4 + 4 > 6 would need 8, capped at
    # 6: 2 more ranks, end 3 + 2 = 5 < 6: it grows to 6 ranks, a size no plan layout holds)
    groups, left = dynamic_cp_micro_batch([(0, 400)], 6, 100)
    assert [g.size for g in groups] == [6] and left == []
    # capped at the largest aligned group (2 on 6 ranks: 4 does not divide 6) the sequence of
    # 400 tokens needs 4 ranks: refused, naming it
    with pytest.raises(InfeasibleError, match="sample 0 .400 tokens. needs 4 CP ranks"):
        dynamic_cp_micro_batch([(0, 400)], 6, 100, max_cp_size=2)


def test_dynamic_cp_scheduler_plans_validate_and_run_every_sample_once():
    cost = real_cost("llama3_8b")
    batch = text_batch(300, seed=3)
    planner = MegatronHybridCP(scheduler="default_dynamic_cp")
    plan = planner.plan(batch, cost)
    validate_plan(plan, batch, cost)
    assert sorted(plan.sample_positions()) == list(range(batch.n))
    assert plan.info["scheduler"] == "default_dynamic_cp" and plan.round_barrier
    # every round uses every rank (the fill step), each group one packed micro-batch of ring CP
    for rnd in plan.rounds:
        assert sum(g.size for g in rnd.groups) == cost.cluster.world_size
        for g in rnd.groups:
            assert len(g.micro_batches) == 1
            assert g.micro_batches[0].sp_kind == ("ring" if g.size > 1 else "ulysses")
    assert estimate_step_time(plan, batch, cost) == pytest.approx(
        simulate_step(plan, batch, cost).step_time_s, rel=1e-9
    )


def test_megatron_cp_runs_ring_attention_and_its_groups_are_not_limited_by_heads():
    cost = real_cost("llama3_8b")
    plan = MegatronHybridCP().plan(text_batch(200, seed=1), cost)
    kinds = {(g.size > 1, mb.sp_kind) for _, g, mb in plan.micro_batches()}
    assert kinds <= {(True, "ring"), (False, "ulysses")} and (True, "ring") in kinds
    assert plan.info["cp_attention"] == "ring"
    # a model whose 12 heads no group of 8 divides: Ulysses stops at 4, ring CP reaches 8
    from dcp_bench.cost import make_cost_model

    spec = replace(model_spec("llama3_8b"), heads=12, kv_heads=4)
    odd = make_cost_model(spec, "h200x8")
    assert odd.sp_degrees()[-1] == 4 and largest_cp_group(odd) == 8


def test_scheduler_flags_are_checked():
    with pytest.raises(ConfigError, match="scheduler='dp_balanced'"):
        MegatronHybridCP(scheduler="dp_balanced")
    with pytest.raises(ConfigError, match="min_cp_size=2 is a flag of scheduler=default_dyn"):
        MegatronHybridCP(min_cp_size=2)
    with pytest.raises(ConfigError, match="min_cp_size=3"):
        MegatronHybridCP(scheduler="default_dynamic_cp", min_cp_size=3)
    with pytest.raises(ConfigError, match="always packs"):
        MegatronHybridCP(scheduler="default_dynamic_cp", pack_sequences=False)
