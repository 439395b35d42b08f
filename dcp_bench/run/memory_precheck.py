"""Before a real run starts: does the memory its plans need fit on this machine?

`check_memory_fits` plans every step of the run as rank 0 will (same workload, seed, planner and
cost model), prices each plan with the simulator (the per-rank peak the run records beside its
measurement as ``predicted_peak_mem_gib``) and compares the largest node's total with what the
machine has: on CPU the memory the OS reports available now (``MemAvailable``; the ranks of a
node share it), on GPUs each rank's peak with the GPU's usable memory. A run that cannot fit is
refused with both numbers, before any process starts, instead of dying in an allocation. A step
the planner cannot plan (e.g. a sample that fits under the memory cap with no SP degree and
recompute setting) is refused too, with the planner's reason: the run would stop there, and so
is a plan that runs a micro-batch on an SP group whose size does not divide the model's attention
heads (Ulysses and DSP shard heads over the group; the heads of a ``model=hf`` spec are its
library config's), which the ranks would refuse only after launch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from dcp_bench.errors import DcpBenchError
from dcp_bench.plan import StepPlan
from dcp_bench.run.assemble import Assemble, assemble
from dcp_bench.run.deal import deal_steps
from dcp_bench.run.spec import RunSpec
from dcp_bench.sim import simulate_step

GIB = float(2**30)


class MemoryPrecheckError(DcpBenchError):
    """The run's predicted memory exceeds what this machine has."""


@dataclass(frozen=True)
class MemoryForecast:
    """The largest predicted need of a run: per rank, per node (ranks of a node summed), and the
    step it occurs at."""

    rank_peak_bytes: float
    node_peak_bytes: float
    step: int
    ranks_per_node: int
    steps_planned: int


def forecast_memory(spec: RunSpec, build: Assemble = assemble) -> MemoryForecast:
    """Plan and price every step of ``spec`` as the run will deal it (`dcp_bench.run.deal`: fresh
    batches, or the reference's epochs under ``run.unit=epoch``); `MemoryPrecheckError` when a
    step cannot be planned."""
    parts = build(spec)
    world = spec.world_size
    per_node = max(1, world // max(1, spec.train.nnodes))
    best = MemoryForecast(0.0, 0.0, 0, per_node, 0)
    planned = 0
    deals = deal_steps(spec, parts, world)
    while True:
        where = f"step {planned}" if spec.unit != "epoch" else f"the epoch after step {planned}"
        try:
            deal = next(deals, None)
            if deal is None:
                break
            where = deal.where
            plan = deal.plan_fn(deal.batch)
        except DcpBenchError as exc:
            raise MemoryPrecheckError(
                f"refusing to launch: {where} cannot be planned: {exc}"
            ) from None
        planned += 1
        _check_heads_divide(spec, plan, where)
        peak = np.asarray(simulate_step(plan, deal.batch, parts.cost).peak_mem_bytes, dtype=float)
        node = (
            float(peak.reshape(-1, per_node).sum(axis=1).max())
            if peak.size % per_node == 0
            else float(peak.sum())
        )
        if node > best.node_peak_bytes:
            best = MemoryForecast(float(peak.max()), node, deal.step, per_node, 0)
    return dataclasses.replace(best, steps_planned=planned)


def _check_heads_divide(spec: RunSpec, plan: StepPlan, where: str) -> None:
    heads = spec.model.heads
    sizes = sorted(
        {g.size for r in plan.rounds for g in r.groups if g.micro_batches and heads % g.size}
    )
    if sizes:
        raise MemoryPrecheckError(
            f"refusing to launch: the plan of {where} runs micro-batches on SP groups of "
            f"{', '.join(map(str, sizes))} ranks, which do not divide the {heads} attention heads "
            f"of model {spec.model.name}; use a method or world size whose SP degrees divide them"
        )


def available_memory_bytes() -> tuple[float, float] | None:
    """(available now, total) bytes of this machine's memory, from ``/proc/meminfo``; None
    without it."""
    try:
        info = {}
        with open("/proc/meminfo") as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                info[key] = float(rest.split()[0]) * 1024
        return info["MemAvailable"], info["MemTotal"]
    except (OSError, KeyError, ValueError, IndexError):
        return None


def check_memory_fits(
    spec: RunSpec,
    device: str,
    build: Assemble = assemble,
    available: tuple[float, float] | None = None,
) -> MemoryForecast:
    """Raise `MemoryPrecheckError` when the run cannot fit (see the module docstring);
    ``device`` is ``cpu`` or ``cuda``; ``available`` (bytes available, total) replaces this
    machine's ``/proc/meminfo``. Returns the forecast."""
    fc = forecast_memory(spec, build)
    if device == "cuda":
        usable = float(spec.cluster.gpu.usable_mem_bytes)
        if fc.rank_peak_bytes > usable:
            raise MemoryPrecheckError(
                f"refusing to launch: the plan of step {fc.step} needs "
                f"{fc.rank_peak_bytes / GIB:.2f} GiB on its busiest rank (predicted by the cost "
                f"model), more than the {usable / GIB:.2f} GiB a {spec.cluster.gpu.name} GPU can "
                "allocate; lower mem_cap_fraction, the batch or use more ranks"
            )
        return fc
    mem = available if available is not None else available_memory_bytes()
    if mem is None:
        return fc
    avail, total = mem
    if fc.node_peak_bytes > avail:
        raise MemoryPrecheckError(
            f"refusing to launch: the plan of step {fc.step} needs {fc.node_peak_bytes / GIB:.2f} "
            f"GiB on this machine ({fc.ranks_per_node} ranks, up to "
            f"{fc.rank_peak_bytes / GIB:.2f} GiB each, predicted by the cost model), more than "
            f"the {avail / GIB:.2f} GiB available now (of {total / GIB:.2f} GiB); lower "
            "workload.tokens_per_gpu, mem_cap_fraction or the ranks, or free memory"
        )
    return fc
