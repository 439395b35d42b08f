"""Shared pieces of the library-integration tests (transformers, diffusers): a gloo worker that
runs cases through the runtime's executor (hand-built plans) and through DataCentricParallel
(every method's own plan), and what it records."""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

from dcp_bench.batch import GlobalBatch
from dcp_bench.plan import StepPlan

SEED = 7


def flat_grads(params: Any) -> torch.Tensor:
    return torch.cat(
        [(torch.zeros_like(p) if p.grad is None else p.grad).reshape(-1) for p in params]
    )


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b))


class GradCapture(torch.optim.Optimizer):
    """An optimizer that changes nothing and keeps the (all-reduced) gradients it was stepped
    with."""

    def __init__(self, params: Any) -> None:
        super().__init__(list(params), {})
        self.grads: torch.Tensor | None = None

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        self.grads = flat_grads(p for g in self.param_groups for p in g["params"]).clone()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def group_sizes(plan: StepPlan) -> list[int]:
    return sorted({g.size for r in plan.rounds for g in r.groups if g.micro_batches})


def _worker(
    rank: int,
    world: int,
    port: int,
    out_dir: str,
    build: Callable[[int], Any],
    cases: list[tuple[str, GlobalBatch, Any]],
) -> None:
    """``build(seed)`` -> (library model, adapter). A case runs a hand-built `StepPlan` through the
    runtime's executor, or ``(method, cost overrides)`` through DataCentricParallel."""
    import torch.distributed as dist

    from dcp_bench.api import DataCentricParallel
    from dcp_bench.cost import make_cost_model
    from dcp_bench.cost.specs import cluster_spec
    from dcp_bench.runtime.executor import execute_step
    from dcp_bench.runtime.groups import ProcessGroupPool
    from dcp_bench.runtime.integrations.models import AdaptedModel

    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        results = []
        pool = ProcessGroupPool(timeout_s=120)
        for _, batch, how in cases:
            model, adapter = build(SEED)
            if isinstance(how, StepPlan):
                res = execute_step(how, batch, AdaptedModel(model, adapter), None, pool, seed=SEED)
                results.append(
                    {
                        "loss": res.loss,
                        "grads": flat_grads(model.parameters()),
                        "sizes": group_sizes(how),
                    }
                )
                continue
            method, cap = how
            cost = make_cost_model(
                adapter.spec, cluster_spec("cpu").resized(world), mem_cap_fraction=cap
            )
            capture = GradCapture(model.parameters())
            dcp = DataCentricParallel(
                model, capture, [batch], method=method, cost=cost, seed=SEED, adapter=adapter
            )
            work = next(iter(dcp))
            for mb in work:
                work.backward(dcp.loss_sum(mb) / work.tokens)
            loss = dcp.step(work)
            results.append(
                {
                    "loss": loss,
                    "grads": capture.grads,
                    "sizes": group_sizes(work.plan),
                    "ckpt": sorted({mb.ckpt_layers for _, _, mb in work.plan.micro_batches()}),
                }
            )
        torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def run_cases(
    world: int, build: Callable[[int], Any], cases: list[tuple[str, GlobalBatch, Any]]
) -> list[list[dict[str, Any]]]:
    """Every case on one set of ``world`` spawned gloo processes; results per rank, per case."""
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(world, free_port(), tmp, build, cases), nprocs=world, join=True)
        return [torch.load(Path(tmp) / f"rank{r}.pt") for r in range(world)]


def runtime_methods(names: list[str]) -> list[str]:
    """The method configs among ``names`` whose plans the runtime runs (a planner marked
    ``simulated_only``, e.g. Megatron-LM's tensor and pipeline parallelism, is left out)."""
    from dcp_bench.config import load_config, to_container
    from dcp_bench.planners.base import make_planner

    out = []
    for name in names:
        node = dict(to_container(load_config([f"method={name}"]))["method"])
        if not make_planner(node).simulated_only:
            out.append(name)
    return out
