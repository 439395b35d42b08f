"""The analytical cost model against closed forms written out independently here."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dcp_bench.cost import make_cost_model
from dcp_bench.cost.analytical import AnalyticalCostModel
from dcp_bench.cost.params import param_count
from dcp_bench.cost.specs import cluster_spec, model_spec
from dcp_bench.errors import ClusterError, ConfigError

LLAMA = model_spec("llama3_8b")
STDIT = model_spec("stdit3_xl2")


def llama_forward_flops(n: int, spec=LLAMA) -> float:
    """Forward FLOPs of one causal sequence of n tokens, term by term (2 FLOPs per MAC)."""
    h, f, kvd, V, L = (
        spec.hidden,
        spec.ffn_hidden,
        spec.kv_heads * spec.head_dim,
        spec.vocab,
        spec.num_layers,
    )
    qkv = 2 * n * h * (h + 2 * kvd)
    scores = 2 * n * n * h / 2  # QK^T over the causal half
    values = 2 * n * n * h / 2  # AV over the causal half
    out = 2 * n * h * h
    swiglu = 3 * 2 * n * h * f
    head = 2 * n * h * V
    return L * (qkv + out + swiglu) + L * (scores + values) + head


def test_one_sample_one_gpu_is_flops_over_rate():
    """One text sample on one GPU: forward = GEMM FLOPs / (peak x GEMM efficiency) + attention
    FLOPs / (peak x causal attention efficiency) + memory-bound bytes / bandwidth; backward = 2 x
    the forward's GEMMs and memory-bound kernels + attn_bwd_factor x its attention; no
    communication. GEMM efficiency: every layer GEMM (7 per layer, the mean width w multiply-adds
    per token) reaches half its ceiling at gemm_half_flops / (2 w) tokens."""
    cm = make_cost_model("llama3_8b", "h200x8")
    n = 8192
    h, f, L = LLAMA.hidden, LLAMA.ffn_hidden, LLAMA.num_layers
    kvd = LLAMA.kv_heads * LLAMA.head_dim
    attn = L * 2 * n * n * h / 2 * 2
    gemm = llama_forward_flops(n) - attn
    peak = 989e12
    w = (h * (h + 2 * kvd) + h * h + 3 * h * f) / 7
    half = cm.gemm_half_flops / (2 * w)
    gemm_eff = (790e12 / 989e12) * n / (n + half)
    attn_eff = cm.attn_eff_max * n / (n + cm.attn_causal_half_len)
    elementwise = (
        n * L * cm.elementwise_bytes_factor * (2 * (6 * h + 2 * 1024 + 4 * 14336) + 4 * 32) / 4.3e12
    )
    t_attn = attn / (peak * attn_eff)
    expected_fwd = gemm / (peak * gemm_eff) + t_attn + elementwise
    c = cm.microbatch_cost(np.array([n]), np.array([1]), sp=1, ckpt_layers=0)
    assert c.fwd_s == pytest.approx(expected_fwd, rel=1e-12)
    assert c.bwd_s == pytest.approx(
        2 * (expected_fwd - t_attn) + cm.attn_bwd_factor * t_attn, rel=1e-12
    )
    assert c.recompute_s == 0 and c.comm_s == 0
    # Model FLOPs: forward + 2 x forward, no recomputation.
    assert c.model_flops == pytest.approx(3 * llama_forward_flops(n), rel=1e-12)
    ck = cm.microbatch_cost(np.array([n]), np.array([1]), sp=1, ckpt_layers=L)
    assert ck.model_flops == pytest.approx(c.model_flops, rel=1e-12)
    # Recomputing every layer repeats the layers' forward (not the LM head).
    head_t = 2 * n * h * LLAMA.vocab / (peak * gemm_eff)
    assert ck.recompute_s == pytest.approx(expected_fwd - head_t, rel=1e-9)
    # The built-in assumptions (before calibration): 1,024-token GEMM half point, backward = 2 x
    # forward.
    old = make_cost_model("llama3_8b", "h200x8", use_config_constants=False)
    assert old.gemm_efficiency(1024) == pytest.approx(0.5 * 790 / 989)
    o = old.microbatch_cost(np.array([n]), np.array([1]), sp=1, ckpt_layers=0)
    assert o.bwd_s == pytest.approx(2 * o.fwd_s, rel=1e-12)


def test_gemm_half_point_scales_with_the_model_s_gemm_width():
    """The calibrated per-GEMM law: a narrow model (STDiT3, hidden 1152) needs as many more tokens
    per rank to reach the same GEMM efficiency as its GEMMs are narrower."""
    llama = make_cost_model("llama3_8b", "h200x32")
    stdit = make_cost_model("stdit3_xl2", "h200x32")
    h, f = STDIT.hidden, STDIT.ffn_hidden
    w_stdit = (6 * h * h + 2 * h * f) / 6
    assert stdit.gemm_macs_per_token == pytest.approx(w_stdit)
    n = 2048.0
    ratio = w_stdit / llama.gemm_macs_per_token
    assert stdit.gemm_efficiency(n) == pytest.approx(llama.gemm_efficiency(n * ratio), rel=1e-12)
    f1 = 2 * 512 * 4096 * 4096.0
    assert llama.gemm_efficiency_flops(f1) == pytest.approx(
        (790 / 989) * f1 / (f1 + llama.gemm_half_flops), rel=1e-12
    )


def test_stdit_attention_terms_closed_form():
    """STDiT attention: spatial T' S^2 and temporal S T'^2 terms plus cross-attention to the
    caption, non-causal: doubling the frames doubles the spatial term and quadruples the
    temporal."""
    cm = make_cost_model("stdit3_xl2", "h200x8")
    h, M, L = STDIT.hidden, STDIT.text_tokens, STDIT.num_layers
    for T, S in [(8, 900), (30, 3600)]:
        fl = cm.sample_flops(np.array([T * S]), np.array([T]))
        expected = L * (4 * T * S * S * h + 4 * S * T * T * h + 2 * 4 * T * S * M * h)
        assert fl["attn"][0] == pytest.approx(expected, rel=1e-12)


def a2a_time(cm, s: int, nbytes: float, collectives: int) -> float:
    """latency + bytes leaving the rank / (link bandwidth x all-to-all efficiency); the intra-node
    latency is the calibrated a2a_latency_s, the network's the cluster's."""
    cluster = cm.cluster
    intra = s <= cluster.gpus_per_node
    bw = (cluster.intra_node_bw if intra else cluster.inter_node_bw) * cm.a2a_eff
    lat = cm.a2a_latency_s if intra else cluster.inter_node_latency_s
    return collectives * lat + nbytes * (s - 1) / s / bw


@pytest.mark.parametrize("s", [2, 4, 8, 16])
def test_doubling_sp_halves_compute_and_adds_the_modelled_comm(s):
    """Compute per rank at 2s equals the same FLOPs over twice the ranks at the efficiency of the
    smaller per-rank share; the communication is exactly Ulysses' q/k/v/out all-to-all."""
    cm = make_cost_model("llama3_8b", "h200x32")
    n = 1 << 18
    tok, fr = np.array([n]), np.array([1])
    a = cm.microbatch_cost(tok, fr, s // 2, 0)
    b = cm.microbatch_cost(tok, fr, s, 0)
    gemm_a = cm.gemm_efficiency(n / (s // 2))
    gemm_b = cm.gemm_efficiency(n / s)
    fl = cm.sample_flops(tok, fr)
    gemm = fl["layer_gemm"][0] + fl["head_gemm"][0]
    attn_work = fl["attn_work"][0]
    elem = n * LLAMA.num_layers * cm._elem_tok_s
    assert a.fwd_s == pytest.approx(
        (gemm / (989e12 * gemm_a) + attn_work / 989e12 + elem) / (s // 2)
    )
    assert b.fwd_s == pytest.approx((gemm / (989e12 * gemm_b) + attn_work / 989e12 + elem) / s)
    # With a flat efficiency curve (no small-kernel penalty) compute halves exactly.
    flat = make_cost_model("llama3_8b", "h200x32", gemm_half_flops=0.0)
    fa, fb = flat.microbatch_cost(tok, fr, s // 2, 0), flat.microbatch_cost(tok, fr, s, 0)
    for part in ("fwd_s", "bwd_s"):
        assert getattr(fb, part) == pytest.approx(getattr(fa, part) / 2, rel=1e-12)
    assert fb.model_flops == pytest.approx(fa.model_flops, rel=1e-12)
    # Per layer: q and out (h wide) and k, v (max(kv_heads, s) heads), per rank n/s tokens.
    n_r, b16 = n / s, 2
    kv = max(LLAMA.kv_heads, s) * LLAMA.head_dim
    layer_bytes = n_r * b16 * (2 * LLAMA.hidden + 2 * kv)
    per_layer = a2a_time(cm, s, layer_bytes, 2)
    assert b.comm_s == pytest.approx(per_layer * 2 * LLAMA.num_layers, rel=1e-12)


def test_recompute_repeats_forward_comm():
    cm = make_cost_model("stdit3_xl2", "h200x32")
    tok, fr = np.array([30 * 3600]), np.array([30])
    c0 = cm.microbatch_cost(tok, fr, 8, 0)
    c8 = cm.microbatch_cost(tok, fr, 8, 8)
    L = STDIT.num_layers
    # DSP: two all-to-alls of the n/s x h activation per block pair and direction.
    per_layer = a2a_time(cm, 8, 30 * 3600 / 8 * 2 * 2 * STDIT.hidden, 2)
    assert c0.comm_s == pytest.approx(per_layer * 2 * L)
    assert c8.comm_s == pytest.approx(per_layer * (2 * L + 8))


def test_group_spanning_nodes_uses_the_network():
    cm = make_cost_model("llama3_8b", "h200x32")
    tok, fr = np.array([1 << 19]), np.array([1])
    c8 = cm.microbatch_cost(tok, fr, 8, 0)
    c16 = cm.microbatch_cost(tok, fr, 16, 0)
    assert not cm.spans_nodes(8) and cm.spans_nodes(16)
    # Half the bytes per rank, but a 9x slower link: the 16-way group communicates longer.
    assert c16.comm_s > c8.comm_s


def test_batch_split_deals_whole_samples_without_comm():
    """split='batch': each rank runs whole samples at sp=1; the group ends with its slowest rank."""
    cm = make_cost_model("stdit3_xl2", "h200x8")
    tok = np.array([4096, 4096, 1024, 1024])
    fr = np.ones(4, dtype=np.int64)
    c = cm.microbatch_cost(tok, fr, 2, 0, split="batch")
    assert c.comm_s == 0
    # Longest-first dealing: {4096, 1024} on each rank.
    one = cm.microbatch_cost(np.array([4096, 1024]), np.array([1, 1]), 1, 0)
    assert c.total_s == pytest.approx(one.total_s)
    assert c.mem_bytes == pytest.approx(one.mem_bytes)
    assert c.model_flops == pytest.approx(2 * one.model_flops)


def test_memory_formula_stored_and_checkpointed():
    """Activation bytes per rank = tokens/s x (stored layers x full + checkpointed layers x input,
    or with every layer checkpointed L-1 inputs + the layer being recomputed) + outer; static =
    params + grads + sharded Adam + workspace + one logits chunk. (What a layer keeps is checked
    against the count from the model itself in tests/test_memory_count.py.)"""
    cm = make_cost_model("llama3_8b", "h200x32")
    h, f, kvd, L = LLAMA.hidden, LLAMA.ffn_hidden, LLAMA.kv_heads * LLAMA.head_dim, LLAMA.num_layers
    # bf16: two RMSNorms (fp32 input, bf16 output, fp32 rsqrt), attention (normed input, q, k, v,
    # output, o-projection input, fp32 log-sum-exp per head), SwiGLU (normed input, 4 f-wide)
    full = 2 * (4 * h + 2 * h + 4) + 2 * (4 * h + 2 * kvd) + 4 * LLAMA.heads + 2 * h + 8 * f
    # ids, final norm, LM-head input + labels + log-sum-exp, RoPE cos/sin
    outer = 8 + (4 * h + 2 * h + 4) + (2 * h + 12) + 2 * 2 * LLAMA.head_dim
    n, s = 65536, 4
    for k in (0, 1, 16, L):
        layers = (L - k) * full + k * 2 * h if k < L else (L - 1) * 2 * h + full
        expected = n / s * (layers + outer)
        assert cm.sample_memory(np.array([n]), np.array([1]), s, k)[0] == pytest.approx(expected)
    P = param_count(LLAMA)
    W = 32
    # ZeRO 1 in bf16: bf16 parameters, the whole fp32 gradient accumulator plus its reduce-scattered
    # shard, fp32 master weights and AdamW moments sharded; the workspace; one chunk of logits
    static = 2 * P + 4 * P + 4 * P / W + 12 * P / W + 3 * 2**30 + 4096 * LLAMA.vocab * 6
    assert cm.static_memory_bytes() == pytest.approx(static)
    z3 = make_cost_model("llama3_8b", "h200x32", zero_stage=3)
    layer = 2 * h * h + 2 * h * kvd + 3 * h * f + 2 * h  # q, o; k, v; gate, up, down; two norms
    static3 = 4 * P / W + 12 * P / W + 2 * 2 * layer + 3 * 2**30 + 4096 * LLAMA.vocab * 6
    assert z3.static_memory_bytes() == pytest.approx(static3)
    # the gradient sync the runtime runs: fp32 reduce-scatter + bf16 all-gather (stage 1) moves
    # 1.5x the bytes of a bf16 all-reduce; FSDP stages move theirs inside every micro-batch
    ar = cm.allreduce_time(P * 2, W)
    assert cm.step_sync_breakdown()["grad_sync_s"] == pytest.approx(cm.allreduce_time(P * 3, W))
    assert (
        cm.step_sync_breakdown()["grad_sync_s"] > ar
        and z3.step_sync_breakdown()["grad_sync_s"] == 0
    )
    assert (
        z3.fsdp_pass_time() == pytest.approx(z3.allreduce_time(P * 4, W))
        and cm.fsdp_pass_time() == 0
    )


def test_step_sync_hierarchical_ring():
    """The built-in assumptions: ring phases serialised at 80% of the links, 10/25 us per hop."""
    cm = make_cost_model("llama3_8b", "h200x32", use_config_constants=False)
    # ZeRO 1: an fp32 reduce-scatter (4 B/param) and a bf16 all-gather (2 B/param), each half
    # of an all-reduce's traffic: an all-reduce of 3 B/param
    B = 3 * param_count(LLAMA)
    g, nodes = 8, 4
    expected = (
        2 * (g - 1) / g * B / (450e9 * 0.8)
        + 2 * (g - 1) * 10e-6
        + 2 * (nodes - 1) / nodes * (B / g) / (50e9 * 0.8)
        + 2 * (nodes - 1) * 25e-6
    )
    br = cm.step_sync_breakdown()
    assert br["grad_sync_s"] == pytest.approx(expected)
    assert br["optimizer_s"] == pytest.approx(param_count(LLAMA) / 32 * 32 / 4.3e12)
    one = make_cost_model(
        "llama3_8b", dataclasses.replace(cluster_spec("h200x8"), num_nodes=1, gpus_per_node=1)
    )
    assert one.step_sync_breakdown()["grad_sync_s"] == 0


def test_calibrated_all_reduce_overlaps_its_phases():
    """Calibrated: intra-node phase at allreduce_eff with the calibrated hop latency, the network
    phase at allreduce_inter_eff, allreduce_overlap of the shorter phase hidden."""
    cm = make_cost_model("llama3_8b", "h200x32")
    B = 3 * param_count(LLAMA)  # ZeRO 1's fp32 reduce-scatter + bf16 all-gather
    g, nodes = 8, 4
    intra = (
        2 * (g - 1) / g * B / (450e9 * cm.allreduce_eff) + 2 * (g - 1) * cm.allreduce_hop_latency_s
    )
    inter = (
        2 * (nodes - 1) / nodes * (B / g) / (50e9 * cm.allreduce_inter_eff)
        + 2 * (nodes - 1) * 25e-6
    )
    expected = intra + inter - cm.allreduce_overlap * min(intra, inter)
    assert cm.step_sync_breakdown()["grad_sync_s"] == pytest.approx(expected)
    assert cm.allreduce_time(B, 8) == pytest.approx(intra)


def test_scales_move_the_uncertain_constants():
    base = make_cost_model("llama3_8b", "h200x32")
    tok, fr = np.array([1 << 16]), np.array([1])
    ref = base.microbatch_cost(tok, fr, 8, 0)
    act = make_cost_model("llama3_8b", "h200x32", scales={"act_bytes": 2.0})
    assert act.sample_memory(tok, fr, 8, 0)[0] == pytest.approx(
        2 * base.sample_memory(tok, fr, 8, 0)[0]
    )
    a2a = make_cost_model("llama3_8b", "h200x32", scales={"a2a_eff": 0.5})
    lat = 2 * 2 * LLAMA.num_layers * base.a2a_latency_s
    assert a2a.microbatch_cost(tok, fr, 8, 0).comm_s - lat == pytest.approx(2 * (ref.comm_s - lat))
    elem = make_cost_model("llama3_8b", "h200x32", scales={"elementwise": 2.0})
    assert elem._elem_tok_s == pytest.approx(2 * base._elem_tok_s)
    slow_attn = make_cost_model("llama3_8b", "h200x32", scales={"attn_eff": 0.5})
    assert slow_attn.microbatch_cost(tok, fr, 8, 0).fwd_s > ref.fwd_s
    small = make_cost_model("llama3_8b", "h200x32", scales={"small_kernel_eff": 2.0})
    assert small.gemm_efficiency(512) > base.gemm_efficiency(512)
    with pytest.raises(ConfigError, match="unknown cost scale"):
        make_cost_model("llama3_8b", "h200x32", scales={"flops": 2.0})
    assert make_cost_model(
        "llama3_8b", "h200x32", mem_cap_fraction=0.5
    ).memory_cap_bytes == pytest.approx(0.5 * cluster_spec("h200x32").gpu.usable_mem_bytes)


def test_packed_share_never_exceeds_a_packed_microbatch():
    """A micro-batch takes at least the sum of its samples' packed shares (lower-bound basis)."""
    cm = make_cost_model("llama3_8b", "h200x32")
    rng = np.random.default_rng(0)
    for _ in range(20):
        tok = rng.integers(16, 20000, size=rng.integers(1, 30))
        fr = np.ones_like(tok)
        for s in (1, 4, 16):
            shares = cm.sample_time_packed(tok, fr, s, 3).sum()
            assert cm.microbatch_cost(tok, fr, s, 3).total_s >= shares * (1 - 1e-12)


def test_vectorised_costs_equal_one_by_one():
    cm = make_cost_model("stdit3_xl2", "h200x32")
    rng = np.random.default_rng(1)
    fr = rng.integers(1, 40, size=50)
    tok = fr * rng.integers(16, 3600, size=50)
    mb = np.sort(rng.integers(0, 12, size=50))
    mb = np.unique(mb, return_inverse=True)[1]
    m = mb.max() + 1
    sp = rng.choice([1, 2, 4, 8, 16], size=m)
    ck = rng.integers(0, 29, size=m)
    vec = cm.microbatch_costs(tok, fr, mb, sp, ck)
    for j in range(m):
        c = cm.microbatch_cost(tok[mb == j], fr[mb == j], int(sp[j]), int(ck[j]))
        assert vec["fwd_s"][j] == pytest.approx(c.fwd_s)
        assert vec["mem_bytes"][j] == pytest.approx(c.mem_bytes)
        assert vec["comm_s"][j] == pytest.approx(c.comm_s)


@settings(max_examples=50, deadline=None)
@given(
    n=st.integers(1, 1 << 20),
    extra=st.integers(1, 1 << 16),
    s=st.sampled_from([1, 2, 4, 8, 16, 32]),
    k=st.integers(0, 32),
)
def test_memory_and_time_grow_with_tokens(n, extra, s, k):
    cm = make_cost_model("llama3_8b", "h200x32")
    fr = np.array([1])
    assert (
        cm.sample_memory(np.array([n + extra]), fr, s, k)[0]
        > cm.sample_memory(np.array([n]), fr, s, k)[0]
    )
    assert (
        cm.sample_time(np.array([n + extra]), fr, s, k)[0]
        > cm.sample_time(np.array([n]), fr, s, k)[0]
    )


@settings(max_examples=50, deadline=None)
@given(n=st.integers(1, 1 << 20), s=st.sampled_from([1, 2, 4, 8]), k=st.integers(0, 31))
def test_checkpointing_trades_time_for_memory(n, s, k):
    cm = make_cost_model("llama3_8b", "h200x32")
    tok, fr = np.array([n]), np.array([1])
    assert cm.sample_memory(tok, fr, s, k + 1)[0] <= cm.sample_memory(tok, fr, s, k)[0]
    assert cm.sample_time(tok, fr, s, k + 1)[0] > cm.sample_time(tok, fr, s, k)[0]


def test_bad_inputs_name_the_choices():
    with pytest.raises(ClusterError, match="valid choices: .*h200x32"):
        make_cost_model("llama3_8b", "h300x32")
    with pytest.raises(ConfigError, match="valid choices: .*llama3_8b"):
        make_cost_model("llama4", "h200x32")
    with pytest.raises(ConfigError, match="unknown cost source"):
        make_cost_model("llama3_8b", "h200x32", source="guess")
    with pytest.raises(ConfigError, match="needs a profile"):
        make_cost_model("llama3_8b", "h200x32", source="profiled")
    with pytest.raises(ConfigError, match="not found"):
        make_cost_model(
            "tiny_llama", "cpu", source="profiled", profile="results/calibration/missing.json"
        )
    with pytest.raises(ConfigError, match="analytical source only"):
        make_cost_model(
            "tiny_llama", "cpu", source="profiled", profile="x.json", scales={"a2a_eff": 2}
        )
    cm = make_cost_model("llama3_8b", "h200x32")
    with pytest.raises(ConfigError, match="power of two"):
        cm.microbatch_cost(np.array([10]), np.array([1]), 3, 0)
    with pytest.raises(ConfigError, match="ckpt_layers"):
        cm.microbatch_cost(np.array([10]), np.array([1]), 1, 33)
    assert isinstance(make_cost_model("llama3_8b", "h200x32", source="auto"), AnalyticalCostModel)


def test_provenance_names_source_and_constants():
    d = make_cost_model("stdit3_xl2", "h200x32").describe()
    assert d["source"] == "analytical" and d["cluster"] == "h200x32" and d["model"] == "stdit3_xl2"
    assert d["gpu_sources"]["peak_flops"]
    # calibrated constants name where they came from; the rest are the built-in assumptions
    assert (
        d["constants"]["attn_eff_max"] == cluster_spec("h200x32").gpu.cost_constants["attn_eff_max"]
    )
    assert d["constant_sources"]["attn_eff_max"].startswith("gpu h200: calibrated")
    old = make_cost_model("stdit3_xl2", "h200x32", use_config_constants=False).describe()
    assert old["constants"]["attn_eff_max"] == 0.45
    assert old["constant_sources"]["attn_eff_max"] == "assumption (built-in default)"
    assert (
        make_cost_model("stdit3_xl2", "h200x32", attn_eff_max=0.5).describe()["constant_sources"][
            "attn_eff_max"
        ]
        == "passed to the cost model"
    )
