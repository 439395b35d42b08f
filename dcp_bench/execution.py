"""The executor interface: what runs a `StepPlan`, simulated or for real.

The one step loop (`dcp_bench.run.loop`) drives an `Executor` step by step: the executor plans
(the simulator calls the planner in-process; the torch executor plans on rank 0 and broadcasts
the plan so every rank runs the same one) and executes the plan, reporting a `StepOutcome`.
Executors never import a planner: they are handed a planning callable.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from dcp_bench.batch import GlobalBatch
    from dcp_bench.plan import StepPlan

PlanFn = Callable[["GlobalBatch"], "StepPlan"]


@dataclass
class StepOutcome:
    """One executed step. Times in seconds, memory in bytes, lists per rank.

    ``step_time_s`` is the time to execute the plan (micro-batches, gradient sync, optimizer),
    planning excluded: the loop charges planning by ``run.planner_clock``."""

    step_time_s: float
    busy_s: list[float]
    peak_mem_bytes: list[float]
    tokens: int  # tokens the plan trained on
    oom: bool = False  # some rank over the GPU's usable memory
    comm_share: float | None = None
    mfu: float | None = None
    model_flops: float | None = None
    loss: float | None = None  # measured runs: the step's global loss per token
    grad_norm: float | None = None
    finite: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def idle_s(self) -> list[float]:
        return [max(self.step_time_s - b, 0.0) for b in self.busy_s]

    @property
    def imbalance(self) -> float:
        """Idle share of all rank-seconds of the step."""
        n = len(self.busy_s)
        return sum(self.idle_s) / (n * self.step_time_s) if n and self.step_time_s > 0 else 0.0


class ExecutorInfo(Protocol):
    """What a run summary says of the executor: its size, whether its times are measured on real
    hardware (named by ``hardware``) or simulated, and further facts (e.g. parameter count)."""

    world_size: int
    measured: bool
    hardware: str
    info: dict[str, Any]


@dataclass
class ExecutorDescription:
    """An `ExecutorInfo` without an executor: a run that failed before its executor was built,
    or whose process died before writing its summary."""

    world_size: int
    measured: bool
    hardware: str
    info: dict[str, Any] = field(default_factory=dict)


class Executor(ExecutorInfo, Protocol):
    """Runs plans on ``world_size`` ranks; only ``writes_records`` executors (the simulator, rank
    0 of a real run) write run records."""

    writes_records: bool

    def agree(self, flag: bool) -> bool:
        """The writer rank's ``flag`` on every rank (a decision all ranks must share)."""
        ...

    def plan(self, batch: GlobalBatch, plan_fn: PlanFn) -> tuple[StepPlan, float]:
        """The plan of ``batch`` (the same on every rank) and the planner's wall time (s)."""
        ...

    def execute(self, plan: StepPlan, batch: GlobalBatch) -> StepOutcome:
        """Run ``plan`` over ``batch``."""
        ...
