"""Tensor and pipeline parallelism in the analytical cost model and the simulator
(`dcp_bench.cost.megatron`), checked against hand-worked numbers: the tensor-parallel
collectives' bytes and time, the 1F1B bubble, a stage's activation and static memory; and the
identity: a layout of tp = pp = 1 prices exactly what the model prices without one."""

from __future__ import annotations

import numpy as np
import pytest

from dcp_bench.batch import GlobalBatch
from dcp_bench.cost import make_cost_model
from dcp_bench.cost.activations import activation_terms
from dcp_bench.cost.analytical import AnalyticalCostModel
from dcp_bench.cost.params import param_breakdown
from dcp_bench.errors import ConfigError, PlanError
from dcp_bench.layout import ModelParallel
from dcp_bench.plan import Group, MicroBatch, Round, StepPlan, validate_plan
from dcp_bench.sim import simulate_step

GiB = 2**30


def gpt7b(zero_stage: int = 1, cap: float = 1.0) -> AnalyticalCostModel:
    cm = make_cost_model(
        "gpt_7b", "a100x64", "analytical", mem_cap_fraction=cap, zero_stage=zero_stage
    )
    assert isinstance(cm, AnalyticalCostModel)
    return cm


def one(cm: AnalyticalCostModel, n: int, cp: int = 1, k: int = 0) -> dict[str, float]:
    c = cm.microbatch_costs(
        np.array([n]),
        np.ones(1, dtype=np.int64),
        np.zeros(1, dtype=np.int64),
        np.array([cp]),
        np.array([k]),
        ulysses=np.ones(1),
    )
    return {key: float(v[0]) for key, v in c.items()}


def test_tensor_parallel_collectives_hand_worked() -> None:
    """tp=2, one 8,192-token micro-batch, no recompute: per layer and pass 2 all-gathers + 2
    reduce-scatters of the 8192 x 4096 bf16 activation (64 MiB), each a ring step moving half of
    it at 300 GB/s x 0.8 plus one 10 us hop; 32 layers forward and backward."""
    cm = gpt7b()
    assert cm.allreduce_eff == 0.8 and cm.cluster.intra_node_bw == 300e9
    assert cm._ar_hop == 10e-6
    one_collective = 0.5 * 8192 * 4096 * 2 / (300e9 * 0.8) + 10e-6
    expected = 4 * one_collective * (2 * 32)
    got = one(cm.with_model_parallel(ModelParallel(tp=2)), 8192)["comm_s"]
    assert got == pytest.approx(expected, rel=1e-12)
    assert expected == pytest.approx(0.0383514, rel=1e-5)  # 256 x (139.81 + 10) us, by hand
    # full recompute runs every layer's forward collectives again: 3 passes instead of 2
    got_full = one(cm.with_model_parallel(ModelParallel(tp=2)), 8192, k=32)["comm_s"]
    assert got_full == pytest.approx(4 * one_collective * 96, rel=1e-12)


def test_pipeline_send_hand_worked() -> None:
    """pp=2 on 64 ranks: neighbouring stages are 32 ranks apart (other nodes), so each
    micro-batch sends its 8192 x 4096 bf16 activation forward and its gradient backward over
    the 6.25 GB/s inter-node link at the link efficiency 0.7, plus 25 us each."""
    cm = gpt7b()
    assert cm.a2a_eff == 0.7
    send = 25e-6 + 8192 * 4096 * 2 / (6.25e9 * 0.7)
    got = one(cm.with_model_parallel(ModelParallel(pp=2)), 8192)["comm_s"]
    assert got == pytest.approx(2 * send, rel=1e-12)


def test_compute_divides_by_tp_and_pp_at_saturation() -> None:
    """At GEMM saturation (a very long micro-batch) the forward GEMM time per rank divides by
    tp x pp; the LM head (on the last stage) divides by tp only."""
    cm = gpt7b()
    n = 1 << 22
    base = one(cm, n)["fwd_s"]
    quarter = one(cm.with_model_parallel(ModelParallel(tp=2, pp=2)), n)["fwd_s"]
    assert base / 4 < quarter < base / 2


def test_stage_memory_hand_worked() -> None:
    """tp=2, pp=2, no recompute: the first stage keeps 2 micro-batches in flight, each its 16
    layers (the runtime models' per-layer bytes per token) and the embedding's output, on half
    the tokens; the static memory is the stage's parameters / 2 with ZeRO-1 over the 16 ranks
    holding the same weights."""
    cm = gpt7b()
    mp = cm.with_model_parallel(ModelParallel(tp=2, pp=2))
    n = 65536
    t = activation_terms(cm.model)
    first = 2 * (16 * t.full_tok + t.outer_tok["embeddings"])
    last = 16 * t.full_tok + t.outer_tok["final_norm"] + t.outer_tok["loss"]
    assert first > last
    act = n / 2 * first
    pb = param_breakdown(cm.model)
    P = (16 * pb.per_layer + pb.embedding + pb.head) / 2
    # bf16 weights (2), fp32 gradients (4) and their reduce-scattered shard, fp32 master and two
    # moments (12) sharded over 16
    static = P * 2 + P * 4 + P * 4 / 16 + P * 12 / 16
    assert cm.logits_chunk_tokens == 4096
    logits = 4096 * cm.model.vocab * (2 + 4) / 2  # one chunk, vocabulary-parallel
    expected = act + static + cm.cluster.gpu.workspace_bytes + logits
    assert one(mp, n)["mem_bytes"] == pytest.approx(expected, rel=1e-12)
    # full recompute: each stage layer keeps its (sequence-parallel) input, 2 h bytes a token,
    # and the last recomputed layer materialises once more
    full = one(mp, n, k=32)["mem_bytes"] - static - cm.cluster.gpu.workspace_bytes - logits
    inp = t.checkpoint_input_tok
    per_tok = 16 * inp + (t.full_tok - inp)
    assert full == pytest.approx(n / 2 * 2 * (per_tok + t.outer_tok["embeddings"]), rel=1e-12)


def test_data_parallel_sync_over_the_stage_weights() -> None:
    """The gradient sync of tp=2, pp=2 reduces the stage's P/2 gradients over 16 ranks, 4 a node
    (stride 2): a hierarchical ring of 4 inside, 4 nodes across (ZeRO-1: fp32 reduce-scatter +
    bf16 all-gather, half an all-reduce each)."""
    cm = gpt7b()
    mp = cm.with_model_parallel(ModelParallel(tp=2, pp=2))
    pb = param_breakdown(cm.model)
    P = (16 * pb.per_layer + pb.embedding + pb.head) / 2
    nbytes = P * (4 + 2) / 2
    intra = 2 * 3 / 4 * nbytes / (300e9 * 0.8) + 2 * 3 * 10e-6
    inter = 2 * 3 / 4 * (nbytes / 4) / (6.25e9 * 0.8) + 2 * 3 * 25e-6
    assert mp.step_sync_breakdown()["grad_sync_s"] == pytest.approx(intra + inter, rel=1e-12)


def test_one_by_one_layout_prices_exactly_what_the_model_prices() -> None:
    """tp = pp = 1 (ZeRO as the model's): micro-batch costs of Ulysses, ring and hybrid
    micro-batches, static memory and the step sync are bit-identical."""
    for zero in (0, 1):
        cm = gpt7b(zero)
        mp = cm.with_model_parallel(ModelParallel(zero_stage=zero))
        rng = np.random.default_rng(0)
        tok = rng.integers(100, 60_000, size=40)
        fr = np.ones(40, dtype=np.int64)
        idx = np.repeat(np.arange(8), 5)
        sp = np.array([1, 2, 4, 8, 8, 16, 2, 1])
        k = np.array([0, 32, 0, 32, 16, 0, 32, 0])
        for uly in (None, np.array([1, 1, 1, 1, 8, 1, 2, 1])):
            a = cm.microbatch_costs(tok, fr, idx, sp, k, ulysses=uly)
            b = mp.microbatch_costs(tok, fr, idx, sp, k, ulysses=uly)
            assert a.keys() == b.keys()
            for key in a:
                assert np.array_equal(a[key], b[key]), key
        assert cm.static_memory_breakdown() == mp.static_memory_breakdown()
        assert cm.step_sync_breakdown() == mp.step_sync_breakdown()


def ring_plan(batch: GlobalBatch, size: int, mp: ModelParallel | None) -> StepPlan:
    W = 64
    groups = [
        Group(
            g * size,
            size,
            [MicroBatch((2 * g,), sp_kind="ring"), MicroBatch((2 * g + 1,), sp_kind="ring")],
        )
        for g in range(W // size)
    ]
    return StepPlan(world_size=W, rounds=[Round(groups)], model_parallel=mp)


def test_one_by_one_layout_simulates_the_same_step() -> None:
    cm = gpt7b(1)
    batch = GlobalBatch.from_lengths(np.random.default_rng(1).integers(1000, 40_000, 32))
    a = simulate_step(ring_plan(batch, 4, None), batch, cm)
    b = simulate_step(ring_plan(batch, 4, ModelParallel()), batch, cm)
    assert a.step_time_s == b.step_time_s
    assert np.array_equal(a.peak_mem_bytes, b.peak_mem_bytes)
    assert np.array_equal(a.busy_s, b.busy_s)
    assert a.account == b.account


def test_one_f_one_b_bubble_hand_worked() -> None:
    """pp=4, one replica of 4 stages x 4 CP ranks holding 4 equal micro-batches (16 replicas):
    the step's compute is (m + p - 1) = 7 micro-batch times (Narayanan et al. 2021, 2.2.1),
    the bubble (3 of them) is idle, not busy."""
    cm = gpt7b(1)
    layout = ModelParallel(pp=4)
    n_rep = 64 // 16
    batch = GlobalBatch.from_lengths([16_384] * (4 * n_rep))
    groups = [
        Group(r * 16, 16, [MicroBatch((4 * r + i,), sp_kind="ring") for i in range(4)])
        for r in range(n_rep)
    ]
    plan = StepPlan(world_size=64, rounds=[Round(groups)], model_parallel=layout)
    validate_plan(plan, batch, cm)
    t = one(cm.with_model_parallel(layout), 16_384, cp=4)
    t_mb = sum(v for key, v in t.items() if key.endswith("_s"))
    res = simulate_step(plan, batch, cm)
    assert res.compute_end_s == pytest.approx(7 * t_mb, rel=1e-12)
    assert res.busy_s[0] - res.sync_s == pytest.approx(4 * t_mb, rel=1e-12)


def test_plan_round_trips_with_its_layout_and_omits_none() -> None:
    batch = GlobalBatch.from_lengths([1000] * 32)
    plan = ring_plan(batch, 4, ModelParallel(tp=2, pp=2, selective=True))
    back = StepPlan.from_json(plan.to_json())
    assert back.model_parallel == plan.model_parallel
    assert "model_parallel" not in ring_plan(batch, 4, None).to_dict()


def test_refusals_are_one_line_errors() -> None:
    cm = gpt7b()
    with pytest.raises(ConfigError, match="tp=16: tensor parallelism stays inside a node of 8"):
        cm.with_model_parallel(ModelParallel(tp=16))
    with pytest.raises(ConfigError, match="pp=64: must divide the model's 32 layers"):
        cm.with_model_parallel(ModelParallel(pp=64))
    with pytest.raises(ConfigError, match="sequence_parallel=False"):
        cm.with_model_parallel(ModelParallel(tp=2, sequence_parallel=False))
    fitted = make_cost_model(
        "gpt_7b", "a100x64", source="flexsp_fitted", seq_limit_k=192, memory_limit_gb=30
    )
    with pytest.raises(
        ConfigError, match="flexsp_fitted cost model .* prices no tensor or pipeline"
    ):
        fitted.with_model_parallel(ModelParallel(tp=2))
    video = make_cost_model("tiny_stdit", "cpu", "analytical")
    with pytest.raises(ConfigError, match="text decoder models"):
        video.with_model_parallel(ModelParallel())
    # the validator names a group that is no tp x pp x cp replica
    batch = GlobalBatch.from_lengths([1000] * 32)
    bad = ring_plan(batch, 4, ModelParallel(tp=8))
    with pytest.raises(PlanError, match="needs a size tp x pp x"):
        validate_plan(bad, batch, cm)
