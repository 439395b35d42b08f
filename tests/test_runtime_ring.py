"""Ring and hybrid (Ulysses x ring) sequence parallelism: the loss and every parameter's gradient
of one global batch equal single-process training, on gloo at 2, 3 and 4 ranks; models whose
heads do not divide the group run with ring attention; packed documents of uneven lengths
(some shorter than the ring's chunks, so whole chunks are padding).

One spawn per world size runs every case of that world (spawning costs seconds per process).
"""

from __future__ import annotations

import dataclasses
import os
import socket
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from baselines.packed_static import PackedStatic
from baselines.wlb_llm import WLBLLM
from dcp_bench.batch import GlobalBatch
from dcp_bench.cost import make_cost_model
from dcp_bench.cost.specs import ModelSpec, cluster_spec
from dcp_bench.errors import PlanError
from dcp_bench.plan import Group, MicroBatch, Round, StepPlan, plan_offences
from dcp_bench.runtime.attention import SINGLE, SPContext
from dcp_bench.runtime.groups import ProcessGroupPool
from dcp_bench.runtime.models import build_model, sp_padded_length, sp_token_index
from dcp_bench.runtime.ring import ring_token_index

SEED = 5
# Four heads over two KV heads; and six heads over three KV heads, which 4 ranks do not divide.
HEADS4 = ModelSpec("ring_test_h4", "llama", 2, 64, 4, 2, 128, vocab=128, dtype="fp32")
HEADS6 = ModelSpec("ring_test_h6", "llama", 2, 96, 6, 3, 128, vocab=128, dtype="fp32")
BATCH = GlobalBatch(
    step=0,
    sample_ids=np.array([31, 32, 33, 34, 35, 36], dtype=np.int64),
    tokens=np.array([37, 121, 9, 64, 3, 50], dtype=np.int64),
    frames=np.ones(6, dtype=np.int64),
)
TOL = 1e-5  # fp32; measured errors are ~1e-7 (printed by the tests)


def mb(*samples: int, kind: str = "ring", u: int = 0, ckpt: int = 0) -> MicroBatch:
    return MicroBatch(
        samples=tuple(samples),
        ckpt_layers=ckpt,
        sp_kind=kind,  # type: ignore[arg-type]
        ulysses_degree=u,
    )


def plan(world: int, *groups: tuple[int, int, list[MicroBatch]]) -> StepPlan:
    return StepPlan(
        world_size=world,
        rounds=[Round(groups=[Group(start=s, size=z, micro_batches=m) for s, z, m in groups])],
    )


ALL = (0, 1, 2, 3, 4, 5)
# Peers' own plans on CP sizes that are no power of two (`whole_cp_degrees`): one node of 3
# GPUs, where packed_static (p2p) and wlb_llm (ring layout) take a user-set CP size of 3, a
# divisor of the world; two nodes of 2, where packed_static's a2a+p2p runs Ulysses 2 inside
# each node and the ring across.
THREE = make_cost_model(HEADS4, cluster_spec("h200x8").resized(3))
TWO_NODES = make_cost_model(
    HEADS4,
    dataclasses.replace(
        cluster_spec("h200x8").resized(4), name="h200x2@4", gpus_per_node=2, num_nodes=2
    ),
)
PEER_PLANS = {
    "packed_static-p2p-cp3": PackedStatic(sp=3, cp_comm_type="p2p").plan(BATCH, THREE),
    "wlb_llm-ring-cp3": WLBLLM(sp=3, cp_layout="ring").plan(BATCH, THREE),
    "packed_static-a2a+p2p-2x2": PackedStatic(sp=4).plan(BATCH, TWO_NODES),
}

# (label, model spec, plan) per world size
CASES: dict[int, list[tuple[str, ModelSpec, StepPlan]]] = {
    2: [
        ("ring2", HEADS4, plan(2, (0, 2, [mb(0, 1, 2), mb(3, 4, 5, ckpt=1)]))),
        ("ring2-h6", HEADS6, plan(2, (0, 2, [mb(*ALL)]))),
        # ring and Ulysses micro-batches on one group, accumulated into one step
        ("ring2+ulysses", HEADS4, plan(2, (0, 2, [mb(1, 3), mb(0, 2, 4, 5, kind="ulysses")]))),
    ],
    3: [
        # 4 heads, 3 ranks: Ulysses cannot run this group, ring can
        ("ring3", HEADS4, plan(3, (0, 3, [mb(0, 1, 2, 3), mb(4, 5, ckpt=2)]))),
        ("ring3-h6", HEADS6, plan(3, (0, 3, [mb(*ALL)]))),
        ("packed_static-p2p-cp3", HEADS4, PEER_PLANS["packed_static-p2p-cp3"]),
        ("wlb_llm-ring-cp3", HEADS4, PEER_PLANS["wlb_llm-ring-cp3"]),
    ],
    4: [
        ("ring4", HEADS4, plan(4, (0, 4, [mb(0, 1, 2), mb(3, 4, 5)]))),
        # 6 heads, 4 ranks: ring over all four
        ("ring4-h6", HEADS6, plan(4, (0, 4, [mb(*ALL, ckpt=1)]))),
        ("hybrid2x2", HEADS4, plan(4, (0, 4, [mb(0, 1, 2, kind="hybrid", u=2), mb(3, 4, 5)]))),
        # 6 heads: the Ulysses part (2) divides them, the group (4) does not
        ("hybrid2x2-h6", HEADS6, plan(4, (0, 4, [mb(*ALL, kind="hybrid", u=2, ckpt=2)]))),
        ("packed_static-a2a+p2p-2x2", HEADS4, PEER_PLANS["packed_static-a2a+p2p-2x2"]),
        (
            "ring2|ulysses2",
            HEADS4,
            plan(4, (0, 2, [mb(1, 2, 4)]), (2, 2, [mb(0, 3, 5, kind="ulysses")])),
        ),
    ],
}


def flat_grads(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat(
        [
            (torch.zeros_like(p) if p.grad is None else p.grad).reshape(-1)
            for p in model.parameters()
        ]
    )


def _worker(
    rank: int, world: int, port: int, out_dir: str, cases: list[tuple[str, ModelSpec, StepPlan]]
) -> None:
    import torch.distributed as dist

    from dcp_bench.runtime.executor import execute_step
    from dcp_bench.runtime.groups import ProcessGroupPool

    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        pool = ProcessGroupPool(timeout_s=60)
        results = []
        for _, spec, step_plan in cases:
            model = build_model(spec, seed=SEED)
            res = execute_step(step_plan, BATCH, model, None, pool, seed=SEED)
            results.append({"loss": res.loss, "grads": flat_grads(model), "mbs": res.micro_batches})
        torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(world: int) -> list[list[dict[str, Any]]]:
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(world, free_port(), tmp, CASES[world]), nprocs=world, join=True)
        return [torch.load(Path(tmp) / f"rank{r}.pt") for r in range(world)]


_REFERENCES: dict[str, tuple[float, torch.Tensor]] = {}


def reference(spec: ModelSpec) -> tuple[float, torch.Tensor]:
    """One process, one sample at a time, no padding, loss over the batch's tokens."""
    if spec.name not in _REFERENCES:
        model = build_model(spec, seed=SEED)
        total = 0.0
        for i in range(BATCH.n):
            sl = slice(i, i + 1)
            inputs = model.make_inputs(
                BATCH.sample_ids[sl], BATCH.tokens[sl], BATCH.frames[sl], SINGLE, SEED
            )
            loss = model.loss_sum(inputs) / BATCH.total_tokens
            loss.backward()
            total += float(loss.detach())
        _REFERENCES[spec.name] = (total, flat_grads(model))
    return _REFERENCES[spec.name]


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b))


_RESULTS: dict[int, list[list[dict[str, Any]]]] = {}


@pytest.fixture
def world_results(request: pytest.FixtureRequest) -> list[list[dict[str, Any]]]:
    """Every case of one world size, run once by one spawn of that many ranks (in a fixture: the
    test timeout does not cut a slow spawn short)."""
    world = int(request.param)
    if world not in _RESULTS:
        _RESULTS[world] = _run(world)
    return _RESULTS[world]


@pytest.mark.dist
@pytest.mark.parametrize(
    ("world_results", "world", "index"),
    [
        # 3 and 4 ranks (a spawn of each, ~30 s on 2 cores) run in the slow suite
        pytest.param(w, w, i, marks=[pytest.mark.slow] if w > 2 else [], id=f"{w}ranks-{c[0]}")
        for w, cases in CASES.items()
        for i, c in enumerate(cases)
    ],
    indirect=["world_results"],
)
def test_ring_and_hybrid_match_single_process(
    world_results: list[list[dict[str, Any]]], world: int, index: int
) -> None:
    label, spec, _ = CASES[world][index]
    ref_loss, ref_grads = reference(spec)
    for rank in range(world):
        got = world_results[rank][index]
        err = rel_l2(got["grads"], ref_grads)
        print(
            f"{label} rank {rank}: grad rel L2 {err:.2e}, loss {got['loss']:.8f} vs {ref_loss:.8f}"
        )
        assert got["mbs"] > 0  # every rank took part
        assert abs(got["loss"] - ref_loss) <= TOL * abs(ref_loss)
        assert err <= TOL
    for rank in range(1, world):
        assert torch.equal(world_results[rank][index]["grads"], world_results[0][index]["grads"])


# ------------------------------------------------------------------------------------------------
# Layouts (no processes)


@pytest.mark.parametrize("ring", [1, 2, 3, 4, 5])
def test_load_balanced_chunks_partition_and_balance(ring: int) -> None:
    padded = 2 * ring * 7
    held = [ring_token_index(padded, ring, i) for i in range(ring)]
    assert sorted(torch.cat(held).tolist()) == list(range(padded))
    # causal work: a token at position p attends p + 1 keys; every rank gets the same sum
    work = {int((h + 1).sum()) for h in held}
    assert len(work) == 1


@pytest.mark.parametrize(
    ("kind", "size", "u"), [("ring", 3, 0), ("hybrid", 4, 2), ("hybrid", 8, 4)]
)
def test_sp_token_index_partitions_every_sample(kind: str, size: int, u: int) -> None:
    ranks_of = {r: tuple(range(size // max(u, 1))) for r in range(size)}
    for length in (1, 5, 37, 64):
        got = []
        for r in range(size):
            ctx = SPContext(
                size=size,
                rank=r,
                group=object(),
                kind=kind,
                ulysses_size=u,
                ulysses_group=object() if u else None,
                ring_ranks=ranks_of[r],
            )
            padded = sp_padded_length(length, ctx)
            assert padded % (2 * size) == 0 and padded - length < 2 * size
            got.append(sp_token_index(padded, ctx))
        assert sorted(torch.cat(got).tolist()) == list(range(padded))
        assert len({g.numel() for g in got}) == 1


def test_sp_context_refuses_bad_shapes() -> None:
    with pytest.raises(ValueError, match="SP kind"):
        SPContext(size=2, rank=0, group=object(), kind="star")
    with pytest.raises(ValueError, match="Ulysses size"):
        SPContext(size=4, rank=0, kind="hybrid", ulysses_size=4, ulysses_group=object())
    with pytest.raises(ValueError, match="ring ranks"):
        SPContext(size=3, rank=0, kind="ring", ring_ranks=(0, 1))
    ctx = SPContext(
        size=8,
        rank=5,
        kind="hybrid",
        ulysses_size=2,
        ulysses_group=object(),
        ring_ranks=(1, 3, 5, 7),
    )
    assert (ctx.ulysses_degree, ctx.ring_size, ctx.ring_rank) == (2, 4, 2)
    assert ctx.ulysses_part().size == 2 and ctx.ulysses_part().rank == 1


def test_plan_carries_and_checks_sp_kind() -> None:
    p = plan(4, (0, 4, [mb(*ALL, kind="hybrid", u=2)]))
    again = StepPlan.from_json(p.to_json())
    assert again.rounds[0].groups[0].micro_batches[0] == p.rounds[0].groups[0].micro_batches[0]
    # old plans (no sp_kind) read as Ulysses
    data = p.to_dict()
    for key in ("sp_kind", "ulysses_degree"):
        del data["rounds"][0]["groups"][0]["micro_batches"][0][key]
    assert StepPlan.from_dict(data).rounds[0].groups[0].micro_batches[0].sp_kind == "ulysses"
    assert plan_offences(p, BATCH) == []
    for bad_u in (0, 1, 3, 4):
        offences = plan_offences(plan(4, (0, 4, [mb(*ALL, kind="hybrid", u=bad_u)])), BATCH)
        assert any("ulysses_degree" in o for o in offences), bad_u
    offences = plan_offences(plan(4, (0, 4, [mb(*ALL, kind="star")])), BATCH)
    assert any("unknown sp_kind" in o for o in offences)


def test_pool_free_ring_context_and_hybrid_ranks() -> None:
    """The rank layout a pool hands out, checked without processes on a stand-in pool."""
    pool = ProcessGroupPool.__new__(ProcessGroupPool)
    pool.world_size, pool.rank = 8, 6
    pool._groups = {(4, 5): "g45", (6, 7): "g67", (4, 5, 6, 7): "g4"}
    ring = pool.context(3, 5, "ring")  # any block: a ring needs no process group
    assert (ring.rank, ring.ring_ranks, ring.ring_rank) == (3, (3, 4, 5, 6, 7), 3)
    hyb = pool.context(4, 4, "hybrid", 2)
    assert hyb.ulysses_group == "g67" and hyb.ring_ranks == (4, 6) and hyb.ring_rank == 1
    with pytest.raises(PlanError):
        pool.context(4, 4, "hybrid", 4)


@pytest.mark.parametrize("tile", [1 << 24, 40])
def test_ring_kernel_on_one_rank_equals_packed_attention(
    monkeypatch: pytest.MonkeyPatch, tile: int
) -> None:
    """The ring's block kernel (online-softmax merge, its backward, GQA, padding, query tiles)
    against per-document SDPA, on a ring of one rank (no communication)."""
    from dcp_bench.runtime import ring as ring_module
    from dcp_bench.runtime.attention import PORTABLE

    monkeypatch.setattr(ring_module, "SCORE_TILE_ELEMENTS", tile)
    lens = [37, 5, 64, 1]
    padded = [sp_padded_length(n, SPContext(kind="ring", ring_ranks=(0,))) for n in lens]
    g = torch.Generator().manual_seed(3)
    t = sum(padded)
    q, k, v = (torch.randn(t, h, 8, generator=g, requires_grad=True) for h in (4, 2, 2))
    grad = torch.randn(t, 4, 8, generator=g)
    valid_rows = torch.cat([torch.arange(p) < n for p, n in zip(padded, lens)])
    layout = ring_module.ring_layout(padded, lens, 0, [0])
    out = ring_module.ring_attention(q, k, v, layout)
    got = torch.autograd.grad((out * grad).sum(), (q, k, v))
    ref = PORTABLE(q, k, v, padded, lens, causal=True)
    want = torch.autograd.grad((ref * grad).sum(), (q, k, v))
    assert rel_l2(out[valid_rows].detach(), ref[valid_rows].detach()) < 1e-6
    assert float(out[~valid_rows].detach().abs().max()) == 0.0
    for a, b in zip(got, want):
        assert rel_l2(a, b) < 1e-6


def test_ring_kernel_in_bf16_stays_near_fp32() -> None:
    """16-bit inputs: the kernel computes in fp32 and returns the input dtype (as the model's
    other kernels do); output and gradients within bf16 rounding of the fp32 result."""
    from dcp_bench.runtime import ring as ring_module

    lens = [33, 70]
    padded = [sp_padded_length(n, SPContext(kind="ring", ring_ranks=(0,))) for n in lens]
    g = torch.Generator().manual_seed(4)
    t = sum(padded)
    base = [torch.randn(t, h, 16, generator=g) for h in (4, 2, 2)]
    grad = torch.randn(t, 4, 16, generator=g)
    layout = ring_module.ring_layout(padded, lens, 0, [0])
    results = []
    for dtype in (torch.float32, torch.bfloat16):
        q, k, v = (x.to(dtype).requires_grad_() for x in base)
        out = ring_module.ring_attention(q, k, v, layout)
        assert out.dtype == dtype
        grads = torch.autograd.grad((out.float() * grad).sum(), (q, k, v))
        results.append([out.detach().float(), *(x.float() for x in grads)])
    for a, b in zip(results[1], results[0]):
        assert rel_l2(a, b) < 3e-2


def test_peer_plans_are_the_expected_rings() -> None:
    """The peers' plans the gloo runs execute, hand-worked: one group of every rank (CP 3 = the
    world; CP 4 = the world), every sample once, a ring of 3 (p2p / WLB-LLM's ring layout) and
    a hybrid of Ulysses 2 (the node) x ring 2; each valid for its cost model."""
    for label, cost, kind, u, world in (
        ("packed_static-p2p-cp3", THREE, "ring", 0, 3),
        ("wlb_llm-ring-cp3", THREE, "ring", 0, 3),
        ("packed_static-a2a+p2p-2x2", TWO_NODES, "hybrid", 2, 4),
    ):
        p = PEER_PLANS[label]
        assert p.world_size == world
        assert [(g.start, g.size) for r in p.rounds for g in r.groups] == [(0, world)]
        assert {(mb.sp_kind, mb.ulysses_degree) for _, _, mb in p.micro_batches()} == {(kind, u)}
        assert sorted(p.sample_positions()) == list(range(BATCH.n))
        assert plan_offences(p, BATCH, cost) == []
