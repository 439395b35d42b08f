"""Small, closed-form stand-ins for a workload, a cost model and planners, so the runner and the
report can be tested on their own (and fast), through the real run path and simulator."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dcp_bench.batch import GlobalBatch
from dcp_bench.cost.base import CostModel, MicroBatchCost
from dcp_bench.errors import InfeasibleError
from dcp_bench.plan import Group, MicroBatch, Round, StepPlan
from dcp_bench.planners.base import Planner, make_planner
from dcp_bench.run.assemble import RunParts
from dcp_bench.run.spec import RunSpec
from dcp_bench.workloads import make_workload

HERE = Path(__file__).resolve().parent


class ToyWorkload:
    """Lengths drawn from a log-uniform law, deterministic in (seed, step); 4 samples per rank."""

    def __init__(self, name: str = "toy", seed: int = 0, lo: int = 64, hi: int = 8192) -> None:
        self.name, self.seed, self.lo, self.hi = name, seed, lo, hi

    def global_batch(
        self, step: int, world_size: int, max_seq_len: int | None = None
    ) -> GlobalBatch:
        rng = np.random.default_rng([self.seed, step])
        n = 4 * world_size
        lengths = np.exp(rng.uniform(np.log(self.lo), np.log(self.hi), size=n)).astype(np.int64)
        if max_seq_len:
            lengths = np.minimum(lengths, max_seq_len)
        b = GlobalBatch.from_lengths(lengths, step=step)
        return GlobalBatch(
            step=step,
            sample_ids=b.sample_ids + 1_000_000 * self.seed + 1000 * step,
            tokens=b.tokens,
            frames=b.frames,
        )


@dataclass
class ToyCost(CostModel):
    """time = (a*T + b*T^2) / sp per rank; comm c*T/sp when sp > 1; recompute = forward share of
    the checkpointed layers; memory = static + act * T / sp (checkpointed layers keep 20%)."""

    a: float = 1e-6
    b: float = 1e-10
    c: float = 2e-7
    act: float = 1e5
    slowdown: float = (
        1.0  # every time multiplied by this (a "measured" machine slower than predicted)
    )
    source: str = "toy"

    def microbatch_cost(
        self, tokens: Any, frames: Any, sp: int, ckpt_layers: int, split: str = "sequence"
    ) -> MicroBatchCost:
        t = np.asarray(tokens, dtype=float)
        work = self.slowdown * float(np.sum(self.a * t + self.b * t * t)) / sp
        frac = ckpt_layers / self.model.num_layers
        comm = self.slowdown * float(self.c * t.sum() / sp) if sp > 1 else 0.0
        mem = self.static_memory_bytes() + float(self.sample_memory(t, t, sp, ckpt_layers).sum())
        return MicroBatchCost(work / 3, 2 * work / 3, frac * work / 3, comm, mem, 6.0 * t.sum())

    def sample_time(self, tokens: Any, frames: Any, sp: int, ckpt_layers: int) -> np.ndarray:
        return np.array(
            [
                self.microbatch_cost(np.array([t]), np.array([1]), sp, ckpt_layers).total_s
                for t in np.atleast_1d(tokens)
            ]
        )

    def sample_memory(self, tokens: Any, frames: Any, sp: int, ckpt_layers: int) -> np.ndarray:
        frac = ckpt_layers / self.model.num_layers
        return self.act * np.asarray(tokens, dtype=float) / sp * (1.0 - 0.8 * frac)

    def static_memory_bytes(self) -> float:
        return 1e9

    def step_sync_time(self) -> float:
        return 0.01 * self.slowdown


class ToyPlanner(Planner):
    """``kind="static"``: fixed SP degree, samples dealt round-robin, full checkpointing.
    ``kind="greedy"``: every rank alone, longest-first onto the least-loaded rank, no ckpt.
    ``kind="fail"``: always infeasible. ``sleep_s`` slows planning (for kill tests).
    ``fail_flag``: a file whose existence makes planning fail (a failure the user can fix without
    changing the run's config, as a transient one would be)."""

    name = "toy"

    def __init__(
        self,
        mode: str = "fair",
        kind: str = "static",
        sp: int = 2,
        sleep_s: float = 0.0,
        fail_flag: str = "",
    ) -> None:
        super().__init__(mode)  # type: ignore[arg-type]
        self.kind, self.sp, self.sleep_s, self.fail_flag = kind, sp, sleep_s, fail_flag

    def plan(self, batch: GlobalBatch, cost: CostModel) -> StepPlan:
        if self.sleep_s:
            time.sleep(self.sleep_s)
        W = cost.cluster.world_size
        L = cost.model.num_layers
        if self.kind == "fail" or (self.fail_flag and Path(self.fail_flag).exists()):
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
        return StepPlan(
            world_size=W, rounds=[Round(groups=groups)], method=self.name, mode=self.mode
        )


def toy_assemble(spec: RunSpec, slowdown: float = 1.0) -> RunParts:
    """The real assembly with the closed-form `ToyCost` in place of the cost model."""
    cost = ToyCost(
        model=spec.model,
        cluster=spec.cluster,
        mem_cap_fraction=spec.mem_cap_fraction,
        act=1e5 * spec.cost.scale_map.get("act_bytes", 1.0),
        slowdown=slowdown,
    )
    return RunParts(
        workload=make_workload(spec.workload, seed=spec.seed),
        cost=cost,
        plan_cost=cost,
        planner=make_planner(spec.method, seed=spec.seed),
    )


def write_toy_conf(root: Path, sleep_s: float = 0.0, fail_flag: Path | None = None) -> Path:
    """A user config folder with the toy workload and three toy methods (four with
    ``fail_flag``: ``toy_flaky`` fails while that file exists)."""
    (root / "method").mkdir(parents=True, exist_ok=True)
    (root / "workload").mkdir(parents=True, exist_ok=True)
    (root / "workload" / "toy.yaml").write_text(
        "name: toy\n_target_: runner_doubles.ToyWorkload\nseed: 0\nlo: 64\nhi: 8192\n"
    )
    for kind in ("static", "greedy", "fail"):
        (root / "method" / f"toy_{kind}.yaml").write_text(
            f"name: toy_{kind}\n_target_: runner_doubles.ToyPlanner\nmode: fair\nkind: {kind}\n"
            f"sp: 2\nsleep_s: {sleep_s}\n"
        )
    if fail_flag is not None:
        (root / "method" / "toy_flaky.yaml").write_text(
            "name: toy_flaky\n_target_: runner_doubles.ToyPlanner\nmode: fair\nkind: static\n"
            f"sp: 2\nsleep_s: {sleep_s}\nfail_flag: {fail_flag}\n"
        )
    return root
