"""Small, closed-form stand-ins for a workload, a cost model, planners and a simulator, so the
runner and the report can be tested on their own (and fast). Each has an obvious reference:
step time = sum over rounds of the slowest group, plus a fixed sync time."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from dcp_bench.batch import GlobalBatch
from dcp_bench.config import instantiate
from dcp_bench.cost.base import CostModel, MicroBatchCost
from dcp_bench.errors import InfeasibleError
from dcp_bench.plan import Group, MicroBatch, Round, StepPlan
from dcp_bench.planners.base import Planner

HERE = Path(__file__).resolve().parent


class ToyWorkload:
    """Lengths drawn from a log-uniform law, deterministic in (seed, step); 4 samples per rank."""

    def __init__(self, name: str = "toy", seed: int = 0, lo: int = 64, hi: int = 8192) -> None:
        self.name, self.seed, self.lo, self.hi = name, seed, lo, hi

    def global_batch(self, step: int, world_size: int, max_seq_len: int | None = None) -> GlobalBatch:
        rng = np.random.default_rng([self.seed, step])
        n = 4 * world_size
        lengths = np.exp(rng.uniform(np.log(self.lo), np.log(self.hi), size=n)).astype(np.int64)
        if max_seq_len:
            lengths = np.minimum(lengths, max_seq_len)
        b = GlobalBatch.from_lengths(lengths, step=step)
        return GlobalBatch(step=step, sample_ids=b.sample_ids + 1_000_000 * self.seed + 1000 * step,
                           tokens=b.tokens, frames=b.frames)


@dataclass
class ToyCost(CostModel):
    """time = (a*T + b*T^2) / sp per rank; comm c*T/sp when sp > 1; recompute = forward share of
    the checkpointed layers; memory = static + act * T / sp (checkpointed layers keep 20%)."""

    a: float = 1e-6
    b: float = 1e-10
    c: float = 2e-7
    act: float = 1e5
    source: str = "toy"

    def microbatch_cost(self, tokens: Any, frames: Any, sp: int, ckpt_layers: int, split: str = "sequence") -> MicroBatchCost:
        t = np.asarray(tokens, dtype=float)
        work = float(np.sum(self.a * t + self.b * t * t)) / sp
        frac = ckpt_layers / self.model.num_layers
        comm = float(self.c * t.sum() / sp) if sp > 1 else 0.0
        mem = self.static_memory_bytes() + float(self.sample_memory(t, t, sp, ckpt_layers).sum())
        return MicroBatchCost(work / 3, 2 * work / 3, frac * work / 3, comm, mem, 6.0 * t.sum())

    def sample_time(self, tokens: Any, frames: Any, sp: int, ckpt_layers: int) -> np.ndarray:
        return np.array([self.microbatch_cost(np.array([t]), np.array([1]), sp, ckpt_layers).total_s
                         for t in np.atleast_1d(tokens)])

    def sample_memory(self, tokens: Any, frames: Any, sp: int, ckpt_layers: int) -> np.ndarray:
        frac = ckpt_layers / self.model.num_layers
        return self.act * np.asarray(tokens, dtype=float) / sp * (1.0 - 0.8 * frac)

    def static_memory_bytes(self) -> float:
        return 1e9

    def step_sync_time(self) -> float:
        return 0.01


class ToyPlanner(Planner):
    """``kind="static"``: fixed SP degree, samples dealt round-robin, full checkpointing.
    ``kind="greedy"``: every rank alone, longest-first onto the least-loaded rank, no ckpt.
    ``kind="fail"``: always infeasible. ``sleep_s`` slows planning (for kill tests)."""

    name = "toy"

    def __init__(self, mode: str = "fair", kind: str = "static", sp: int = 2, sleep_s: float = 0.0) -> None:
        super().__init__(mode)  # type: ignore[arg-type]
        self.kind, self.sp, self.sleep_s = kind, sp, sleep_s

    def plan(self, batch: GlobalBatch, cost: CostModel) -> StepPlan:
        if self.sleep_s:
            time.sleep(self.sleep_s)
        W = cost.cluster.world_size
        L = cost.model.num_layers
        if self.kind == "fail":
            raise InfeasibleError("toy planner: no plan fits")
        if self.kind == "static":
            n_groups = W // self.sp
            groups = [Group(start=g * self.sp, size=self.sp) for g in range(n_groups)]
            for i in range(batch.n):
                groups[i % n_groups].micro_batches.append(MicroBatch(samples=(i,), ckpt_layers=L))
        else:
            groups = [Group(start=r, size=1) for r in range(W)]
            load = np.zeros(W)
            t = cost.sample_time(batch.tokens, batch.frames, 1, 0)
            for i in np.argsort(-t, kind="stable"):
                r = int(np.argmin(load))
                groups[r].micro_batches.append(MicroBatch(samples=(int(i),), ckpt_layers=0))
                load[r] += t[i]
        groups = [g for g in groups if g.micro_batches]
        return StepPlan(world_size=W, rounds=[Round(groups=groups)], method=self.name, mode=self.mode)


def toy_simulate(plan: StepPlan, batch: GlobalBatch, cost: CostModel) -> SimpleNamespace:
    W = plan.world_size
    busy = np.zeros(W)
    peak = np.full(W, cost.static_memory_bytes())
    step = 0.0
    for rnd in plan.rounds:
        round_time = 0.0
        for g in rnd.groups:
            gt = 0.0
            for mb in g.micro_batches:
                pos = list(mb.samples)
                c = cost.microbatch_cost(batch.tokens[pos], batch.frames[pos], g.size, mb.ckpt_layers, mb.split)
                gt += c.total_s
                peak[g.start:g.start + g.size] = np.maximum(peak[g.start:g.start + g.size], c.mem_bytes)
            busy[g.start:g.start + g.size] += gt
            round_time = max(round_time, gt)
        step += round_time
    step += cost.step_sync_time()
    return SimpleNamespace(step_time_s=step, busy_s=busy, idle_s=step - busy,
                           imbalance=float(busy.max() / busy.mean()) if busy.mean() else 1.0,
                           comm_share=0.0, peak_mem_bytes=peak,
                           oom=bool(peak.max() > cost.memory_cap_bytes), mfu=0.3)


class ToyBackend:
    def workload(self, cfg: dict[str, Any]) -> Any:
        node = dict(cfg["workload"])
        node.pop("_target_", None)
        return ToyWorkload(**node)

    def cost_model(self, cfg: dict[str, Any], source: str | None = None) -> CostModel:
        scales = (cfg.get("cost") or {}).get("scales") or {}
        return ToyCost(model=instantiate(cfg["model"]), cluster=instantiate(cfg["cluster"]),
                       mem_cap_fraction=float(cfg.get("mem_cap_fraction", 0.7)),
                       act=1e5 * float(scales.get("act_bytes", 1.0)))

    def planner(self, cfg: dict[str, Any]) -> Planner:
        from dcp_bench.planners.base import make_planner

        return make_planner(cfg["method"])

    def simulate_step(self, plan: StepPlan, batch: GlobalBatch, cost: CostModel, cfg: dict[str, Any]) -> Any:
        return toy_simulate(plan, batch, cost)

    def lower_bound(self, batch: GlobalBatch, cost: CostModel) -> float:
        W = cost.cluster.world_size
        return float(cost.sample_time(batch.tokens, batch.frames, 1, 0).sum() / W)


def write_toy_conf(root: Path, sleep_s: float = 0.0) -> Path:
    """A user config folder with the toy workload and three toy methods."""
    (root / "method").mkdir(parents=True, exist_ok=True)
    (root / "workload").mkdir(parents=True, exist_ok=True)
    (root / "workload" / "toy.yaml").write_text(
        "name: toy\n_target_: runner_doubles.ToyWorkload\nseed: 0\nlo: 64\nhi: 8192\n")
    for kind in ("static", "greedy", "fail"):
        (root / "method" / f"toy_{kind}.yaml").write_text(
            f"name: toy_{kind}\n_target_: runner_doubles.ToyPlanner\nmode: fair\nkind: {kind}\n"
            f"sp: 2\nsleep_s: {sleep_s}\n")
    return root
