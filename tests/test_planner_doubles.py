"""A closed-form cost model for planner tests: per layer a + b*T + c*T^2 (split over the SP group,
plus an all-to-all term when sp > 1), activation memory linear in tokens. With it the optimum of
tiny instances is computable by brute force. Imported by the other planner test modules."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dcp_bench.cost.base import CostModel, MicroBatchCost
from dcp_bench.cost.specs import ClusterSpec, ModelSpec, gpu_spec, model_spec


def make_cluster(world_size: int, gpus_per_node: int = 8) -> ClusterSpec:
    gpn = 1  # the largest power of two <= gpus_per_node dividing the world
    while gpn * 2 <= gpus_per_node and world_size % (gpn * 2) == 0:
        gpn *= 2
    return ClusterSpec(
        name=f"test{world_size}",
        gpu=gpu_spec("h200"),
        num_nodes=world_size // gpn,
        gpus_per_node=gpn,
        intra_node_bw=450e9,
        inter_node_bw=50e9,
        intra_node_latency_s=1e-5,
        inter_node_latency_s=2.5e-5,
    )


@dataclass
class QuadraticCost(CostModel):
    """Time per layer of a sample of T tokens on sp ranks: (a + b T + c T^2) / sp + comm, where
    comm = d T / sp when sp > 1 (doubled across nodes); each micro-batch also pays ``overhead``
    once. Forward is a third of compute, backward two thirds; a checkpointed layer recomputes its
    forward. Activation bytes per rank: T / sp * (full_b per kept layer, ckpt_b per checkpointed
    layer)."""

    a: float = 1e-4
    b: float = 1e-6
    c: float = 1e-11
    d: float = 2e-7
    overhead: float = 1e-3
    full_b: float = 2.0e6
    ckpt_b: float = 0.25e6
    static_b: float = 20e9
    source: str = "test-quadratic"

    def _layer_compute(self, tokens: np.ndarray, sp: int) -> np.ndarray:
        t = tokens.astype(float)
        return (self.a + self.b * t + self.c * t * t) / sp

    def _comm(self, tokens: np.ndarray, sp: int) -> np.ndarray:
        if sp == 1:
            return np.zeros(len(tokens))
        f = 2.0 if self.spans_nodes(sp) else 1.0
        return f * self.d * tokens.astype(float) / sp * self.model.num_layers

    def sample_time(self, tokens, frames, sp, ckpt_layers):  # type: ignore[override]
        tokens = np.asarray(tokens)
        comp = self._layer_compute(tokens, sp)
        L = self.model.num_layers
        return comp * L + comp / 3 * ckpt_layers + self._comm(tokens, sp) + self.overhead

    def sample_memory(self, tokens, frames, sp, ckpt_layers):  # type: ignore[override]
        t = np.asarray(tokens).astype(float) / sp
        L = self.model.num_layers
        return t * (self.full_b * (L - ckpt_layers) + self.ckpt_b * ckpt_layers)

    def static_memory_bytes(self) -> float:
        return self.static_b

    def step_sync_time(self) -> float:
        return 0.0

    def microbatch_cost(self, tokens, frames, sp, ckpt_layers, split="sequence"):  # type: ignore[override]
        tokens = np.asarray(tokens)
        comp = float(self._layer_compute(tokens, sp).sum())
        L = self.model.num_layers
        return MicroBatchCost(
            fwd_s=comp * L / 3 + self.overhead,
            bwd_s=comp * L * 2 / 3,
            recompute_s=comp / 3 * ckpt_layers,
            comm_s=float(self._comm(tokens, sp).sum()),
            mem_bytes=float(self.sample_memory(tokens, frames, sp, ckpt_layers).sum())
            + self.static_b,
            model_flops=float(6 * tokens.sum()),
        )


def quad_cost(
    world_size: int, model: str = "tiny_llama", mem_cap_fraction: float = 0.7, **kw
) -> QuadraticCost:
    spec: ModelSpec = model_spec(model)
    return QuadraticCost(
        model=spec, cluster=make_cluster(world_size), mem_cap_fraction=mem_cap_fraction, **kw
    )


def test_double_is_additive_and_affine_in_ckpt() -> None:
    """The double's closed form: packing adds costs (bar one overhead), memory is affine in k."""
    cost = quad_cost(4)
    t = np.array([100, 2000, 30000])
    f = np.ones(3, dtype=np.int64)
    mb = cost.microbatch_cost(t, f, 2, 3)
    alone = cost.sample_time(t, f, 2, 3)
    assert np.isclose(mb.total_s, alone.sum() - 2 * cost.overhead)
    L = cost.model.num_layers
    m = [cost.sample_memory(t, f, 2, k) for k in range(L + 1)]
    assert np.allclose(np.diff(m, axis=0), m[1] - m[0])
