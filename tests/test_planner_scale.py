"""The planner's fast paths give the plans of their plain forms, checked against independent
references: LPT against a heap of (free time, rank), the list schedule against a direct
task-by-task search over aligned blocks, the vectorised packing against the one-group loop."""

from __future__ import annotations

import heapq

import numpy as np
import pytest

from dcp_bench.batch import GlobalBatch
from dcp_bench.cost import make_cost_model
from dcp_bench.cost.base import CostModel
from dcp_bench.cost.specs import cluster_spec
from dcp_bench.layout import aligned_sp_degrees
from dcp_bench.planners.dcp import DCPPlanner, list_schedule, lpt
from dcp_bench.workloads import load_workload


def heap_lpt(times: np.ndarray, free: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    heap = [(float(free[r]), r) for r in range(len(free))]
    heapq.heapify(heap)
    ranks, starts = [], []
    for t in times.tolist():
        f, r = heap[0]
        heapq.heapreplace(heap, (f + t, r))
        ranks.append(r)
        starts.append(f)
    out = np.empty(len(free))
    for f, r in heap:
        out[r] = f
    return np.asarray(ranks), np.asarray(starts), out


@pytest.mark.parametrize("case", range(24))
def test_batched_lpt_is_the_heap(case: int) -> None:
    rng = np.random.default_rng(case)
    W = [256, 300, 1024, 3072][case % 4]
    n = int(rng.integers(1, 6 * W))
    free = [
        np.zeros(W),
        rng.uniform(0, 10, W),
        np.round(rng.uniform(0, 3, W), 1),
        np.where(rng.random(W) < 0.5, 0.0, rng.uniform(0, 100, W)),
    ][(case // 4) % 4]
    times = np.sort(np.round(rng.lognormal(0, 1.5, n), int(rng.integers(1, 6))))[::-1].copy()
    want = heap_lpt(times, free)
    got_free = free.copy()
    ranks, starts = lpt(times, got_free)
    assert (
        np.array_equal(ranks, want[0])
        and np.array_equal(starts, want[1])
        and np.array_equal(got_free, want[2])
    )


def direct_schedule(
    times: np.ndarray, sizes: np.ndarray, W: int, order: str
) -> tuple[np.ndarray, np.ndarray]:
    """Task by task: a multi-rank task goes to the aligned block of its size whose ranks are all
    free earliest (lowest block on ties); single-rank tasks after them, longest first, to the
    rank free earliest (lowest rank on ties)."""
    free = np.zeros(W)
    bstart = np.zeros(len(times), dtype=np.int64)
    start = np.zeros(len(times))
    big = np.flatnonzero(sizes > 1)
    key = (
        np.lexsort((-times[big], -sizes[big]))
        if order == "size"
        else np.argsort(-times[big], kind="stable")
    )
    for i in big[key].tolist():
        s = int(sizes[i])
        ready = free.reshape(-1, s).max(axis=1)
        b = int(ready.argmin())
        start[i] = ready[b]
        bstart[i] = b * s
        free[b * s : (b + 1) * s] = ready[b] + times[i]
    for i in np.flatnonzero(sizes == 1)[np.argsort(-times[sizes == 1], kind="stable")].tolist():
        r = int(free.argmin())
        start[i], bstart[i] = free[r], r
        free[r] += times[i]
    return bstart, start


@pytest.mark.parametrize("world", [24, 96, 256, 384])
@pytest.mark.parametrize("order", ["size", "time"])
def test_list_schedule_is_the_direct_search(world: int, order: str) -> None:
    rng = np.random.default_rng(world)
    degrees = np.asarray(aligned_sp_degrees(world))
    n = 6 * world
    sizes = rng.choice(
        degrees, n, p=np.r_[0.7, np.full(len(degrees) - 1, 0.3 / (len(degrees) - 1))]
    )
    times = np.round(rng.lognormal(0, 1.0, n), 3)
    sched = list_schedule(times, sizes, world, order)
    bstart, start = direct_schedule(times, sizes, world, order)
    assert np.array_equal(sched.block_start, bstart) and np.array_equal(sched.start, start)


def _batches() -> list[tuple[object, GlobalBatch]]:
    out = []
    rng = np.random.default_rng(3)
    for world in (24, 96, 1024):
        cost = make_cost_model("llama3_8b", cluster_spec("h200x8").resized(world))
        for wl in ("prolong", "sharegpt"):
            out.append((cost, load_workload(wl).global_batch(0, world, cost.model.max_seq_len)))
        lengths = np.minimum(rng.lognormal(8.5, 1.4, 12 * world).astype(np.int64) + 16, 131_072)
        out.append((cost, GlobalBatch.from_lengths(lengths)))
    return out


def test_vectorised_packing_gives_the_loop_plans() -> None:
    for cost, batch in _batches():
        loop = DCPPlanner()
        loop.vector_pack_max = 0  # every group through the one-group loop
        a, b = loop.plan(batch, cost), DCPPlanner().plan(batch, cost)  # type: ignore[arg-type]
        a.info.clear()
        b.info.clear()
        assert a.to_dict() == b.to_dict()


def per_degree_table(
    batch: GlobalBatch, cost: CostModel, packed: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The shape table as it was built before the batched cost-model calls: degree by degree,
    each with the per-setting cost-model methods."""
    from dcp_bench.planners.settings import ckpt_and_memory, time_at_ckpt

    key = batch.tokens.astype(np.int64) * (1 << 20) + batch.frames.astype(np.int64)
    _, first = np.unique(key, return_index=True)
    ut, uf = batch.tokens[first], batch.frames[first]
    sps = cost.sp_degrees()
    ckpt = np.full((len(ut), len(sps)), -1, dtype=np.int64)
    time = np.full((len(ut), len(sps)), np.inf)
    mem = np.full((len(ut), len(sps)), np.inf)
    budget = cost.memory_cap_bytes - cost.static_memory_bytes()
    for j, sp in enumerate(sps):
        k, m0 = ckpt_and_memory(cost, ut, uf, int(sp), budget)
        ok = k >= 0
        if ok.any():
            ckpt[ok, j] = k[ok]
            time[ok, j] = time_at_ckpt(cost, ut[ok], uf[ok], int(sp), k[ok], packed)
            mem[ok, j] = m0[ok]
            if packed:
                alone = ok & ((k > 0) | (mem[:, j] > budget / 2))
                if alone.any():
                    time[alone, j] = time_at_ckpt(
                        cost, ut[alone], uf[alone], int(sp), k[alone], False
                    )
    return ckpt, time, mem


@pytest.mark.parametrize(
    ("model", "cluster", "workload"),
    [
        ("llama3_8b", "h200x32", "prolong"),
        ("llama3_8b", "h200x8", "wikipedia"),
        ("llama2_7b", "h200x64", "sharegpt"),
        ("stdit3_xl2", "h200x32", "videosys_zipf"),
    ],
)
@pytest.mark.parametrize("packed", [False, True])
def test_batched_shape_table_is_the_per_degree_table(
    model: str, cluster: str, workload: str, packed: bool
) -> None:
    """Every shape at every degree priced in a few batched calls equals the per-degree table bit
    for bit (same checkpoint counts, times and memory), so the plans are the same."""
    from dcp_bench.planners.settings import build_shape_table

    cost = make_cost_model(model, cluster)
    wl = load_workload(workload, seed=0)
    batch = wl.global_batch(0, cost.cluster.world_size, cost.model.max_seq_len)
    table = build_shape_table(batch.tokens, batch.frames, cost, packed=packed)
    ckpt, time, mem = per_degree_table(batch, cost, packed)
    assert np.array_equal(table.ckpt, ckpt)
    assert np.array_equal(table.time, time)
    assert np.array_equal(table.mem, mem)
