"""The analytical price of ring and hybrid (Ulysses x ring) sequence parallelism, checked against
the closed form written out here: r - 1 point-to-point K/V steps per layer and pass, each hidden
under one step of attention compute, only the unhidden part charged as communication."""

from __future__ import annotations

import numpy as np
import pytest

from dcp_bench.batch import GlobalBatch
from dcp_bench.cost import make_cost_model
from dcp_bench.cost.analytical import AnalyticalCostModel
from dcp_bench.cost.specs import model_spec
from dcp_bench.errors import ConfigError
from dcp_bench.plan import Group, MicroBatch, Round, StepPlan
from dcp_bench.sim import simulate_step

LLAMA = model_spec("llama3_8b")


def analytical(model: str, cluster: str) -> AnalyticalCostModel:
    cm = make_cost_model(model, cluster, "analytical")
    assert isinstance(cm, AnalyticalCostModel)
    return cm


TOK, FR = np.array([1 << 20]), np.array([1])


def closed_form_ring_comm(cm: AnalyticalCostModel, n: int, s: int, u: int, k: int = 0) -> float:
    """Exposed ring communication of one sample of ``n`` tokens on ``s`` ranks, Ulysses part
    ``u``, ``k`` recomputed layers, from the model's sizes and the cluster's link."""
    c, L, r = cm.cluster, LLAMA.num_layers, s // u
    # attention compute per layer and rank: causal FLOPs 2 n^2 h over s ranks at the efficiency
    # of full blocks of n / r keys
    eff = float(cm.attention_efficiency(n / r, causal=False))
    a = 2.0 * n * n * LLAMA.hidden / eff / s / 989e12
    b = cm._attn_bwd * a
    kv_width = max(LLAMA.kv_heads, u) / u * LLAMA.head_dim
    step_bytes = n / r * 2 * 2 * kv_width  # K and V, bf16, of the ring rank's n / r tokens
    spans = s > c.gpus_per_node
    bw = (c.inter_node_bw if spans else c.intra_node_bw) * cm._a2a
    lat = c.inter_node_latency_s if spans else float(cm.a2a_latency_s or 0.0)
    step = lat + step_bytes / bw
    fwd = (r - 1) * max(a / r, step) + a / r
    bwd = (r - 1) * max(b / r, 2 * step) + b / r + step
    return L * (fwd - a + bwd - b) + k * (fwd - a)


@pytest.mark.parametrize(("s", "k"), [(2, 0), (3, 0), (8, 4), (24, 0), (16, 32)])
def test_ring_comm_is_the_unhidden_part_of_the_p2p_steps(s: int, k: int) -> None:
    cm = analytical("llama3_8b", "h200x32")
    got = cm.microbatch_cost(TOK, FR, s, k, sp_kind="ring")
    assert got.comm_s == pytest.approx(closed_form_ring_comm(cm, int(TOK[0]), s, 1, k), rel=1e-9)


def test_compute_bound_ring_exposes_only_the_last_gradient_hop() -> None:
    """Long sequences: every K/V step hides under its attention step; what remains per layer is
    the gradients' final hop home."""
    cm = analytical("llama3_8b", "h200x32")
    n, s = 1 << 20, 4
    got = cm.microbatch_cost(np.array([n]), FR, s, 0, sp_kind="ring")
    step = float(cm.a2a_latency_s or 0.0) + n / s * 2 * 2 * LLAMA.kv_heads * LLAMA.head_dim / (
        cm.cluster.intra_node_bw * cm._a2a
    )
    assert got.comm_s == pytest.approx(LLAMA.num_layers * step, rel=1e-9)


def test_comm_bound_ring_pays_the_steps() -> None:
    """Short sequences: the transfers outlast the compute; the pass takes (r-1) steps plus the
    last step's compute, and the exposed part grows with the ring."""
    cm = analytical("llama3_8b", "h200x32")
    tok = np.array([4096])
    comms = [cm.microbatch_cost(tok, FR, s, 0, sp_kind="ring").comm_s for s in (2, 4, 8)]
    assert comms[0] < comms[1] < comms[2]
    for s, got in zip((2, 4, 8), comms):
        assert got == pytest.approx(closed_form_ring_comm(cm, 4096, s, 1), rel=1e-9)


def test_hybrid_adds_the_ulysses_all_to_alls_of_its_sub_group() -> None:
    cm = analytical("llama3_8b", "h200x32")
    n, s, u = int(TOK[0]), 16, 4
    got = cm.microbatch_cost(TOK, FR, s, 0, sp_kind="hybrid", ulysses_degree=u)
    n_r = n / s
    layer_bytes = n_r * 2 * (2 * LLAMA.hidden + 2 * max(LLAMA.kv_heads, u) * LLAMA.head_dim)
    a2a = 2 * float(cm.a2a_latency_s or 0.0) + layer_bytes * (u - 1) / u / (
        cm.cluster.intra_node_bw * cm._a2a
    )
    expected = a2a * 2 * LLAMA.num_layers + closed_form_ring_comm(cm, n, s, u)
    assert got.comm_s == pytest.approx(expected, rel=1e-9)


def test_ulysses_prices_are_unchanged_and_ring_needs_no_power_of_two() -> None:
    cm = analytical("llama3_8b", "h200x32")
    base = cm.microbatch_cost(TOK, FR, 8, 2)
    assert cm.microbatch_cost(TOK, FR, 8, 2, sp_kind="ulysses") == base
    vec = cm.microbatch_costs(TOK, FR, np.zeros(1, dtype=np.int64), np.array([8]), np.array([2]))
    same = cm.microbatch_costs(
        TOK, FR, np.zeros(1, dtype=np.int64), np.array([8]), np.array([2]), ulysses=np.array([8])
    )
    for key in vec:
        assert same[key][0] == vec[key][0]
    with pytest.raises(ConfigError):
        cm.microbatch_cost(TOK, FR, 24, 0)  # Ulysses at 24: not a power of two
    assert cm.microbatch_cost(TOK, FR, 24, 0, sp_kind="ring").comm_s > 0
    # memory per rank is the same activation share under every kind
    ring = cm.microbatch_cost(TOK, FR, 8, 2, sp_kind="ring")
    assert ring.mem_bytes == base.mem_bytes
    with pytest.raises(ConfigError):
        analytical("stdit3_xl2", "h200x32").microbatch_cost(
            np.array([3600]), np.array([4]), 4, 0, sp_kind="ring"
        )


def test_a_million_tokens_fit_24_gpus_with_ring() -> None:
    cm = analytical("llama3_8b", "h200x8")
    doc = np.array([1_048_576])
    assert cm.microbatch_cost(doc, FR, 8, 32).mem_bytes > cm.memory_cap_bytes
    assert cm.microbatch_cost(doc, FR, 24, 32, sp_kind="ring").mem_bytes < cm.memory_cap_bytes


def test_simulator_prices_each_micro_batch_by_its_kind() -> None:
    cm = analytical("llama3_8b", "h200x8")
    batch = GlobalBatch(
        step=0,
        sample_ids=np.arange(2, dtype=np.int64),
        tokens=np.array([65536, 65536], dtype=np.int64),
        frames=np.ones(2, dtype=np.int64),
    )

    def plan(kind: str, u: int = 0) -> StepPlan:
        mbs = [MicroBatch(samples=(i,), sp_kind=kind, ulysses_degree=u) for i in range(2)]  # type: ignore[arg-type]
        return StepPlan(world_size=8, rounds=[Round(groups=[Group(0, 8, mbs)])])

    for kind, u in (("ulysses", 0), ("ring", 0), ("hybrid", 2)):
        sim = simulate_step(plan(kind, u), batch, cm)
        one = cm.microbatch_cost(
            batch.tokens[:1], batch.frames[:1], 8, 0, sp_kind=kind, ulysses_degree=u
        )
        assert sim.step_time_s == pytest.approx(2 * one.total_s + cm.step_sync_time(), rel=1e-9), (
            kind
        )


def test_profiled_source_prices_rings_with_the_analytical_transfers() -> None:
    """The measured compute of the nearest SP degree, the Ulysses part's all-to-alls only, and
    the ring's unhidden point-to-point time from the analytical model (recorded as a fallback)."""
    from dcp_bench.cost.profiled import ProfiledCostModel

    cm = make_cost_model("tiny_llama", "cpu", "profiled")
    assert isinstance(cm, ProfiledCostModel)
    tok, fr = np.array([900, 300]), np.ones(2, dtype=np.int64)
    uly = cm.microbatch_cost(tok, fr, 4, 1)
    ring = cm.microbatch_cost(tok, fr, 4, 1, sp_kind="ring")
    hyb = cm.microbatch_cost(tok, fr, 4, 1, sp_kind="hybrid", ulysses_degree=2)
    for c in (ring, hyb):
        assert (c.fwd_s, c.bwd_s, c.recompute_s, c.mem_bytes) == (
            uly.fwd_s,
            uly.bwd_s,
            uly.recompute_s,
            uly.mem_bytes,
        )
    exposed = cm.analytical.ring_exposed_comm(tok, 4, 1, 1)
    assert exposed > 0
    # the ring has no all-to-all: its communication is the exposed ring time (plus ZeRO passes)
    base = cm.microbatch_cost(tok, fr, 1, 1).comm_s
    assert ring.comm_s == pytest.approx(base + exposed, rel=1e-9)
    assert hyb.comm_s > ring.comm_s - exposed
    assert any("ring attention" in f for f in cm.fallbacks)
    # the vectorised path takes the kind per micro-batch
    vec = cm.microbatch_costs(
        tok, fr, np.array([0, 1]), np.array([4, 4]), np.array([1, 1]), ulysses=np.array([1, 4])
    )
    one = cm.microbatch_cost(tok[:1], fr[:1], 4, 1, sp_kind="ring")
    assert vec["comm_s"][0] == pytest.approx(one.comm_s, rel=1e-12)
