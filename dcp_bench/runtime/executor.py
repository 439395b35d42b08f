"""`execute_step`: run one `StepPlan` on this rank, then one gradient synchronisation and one
optimizer step.

For each round, the rank finds its group (idle if none), and runs that group's micro-batches in
order with the group's SP degree and each micro-batch's ``ckpt_layers``. ``split="sequence"`` shards
every sample over the group (Ulysses for text, DSP for video; ring or hybrid Ulysses x ring
attention for text when the micro-batch's ``sp_kind`` says so); ``split="batch"`` deals whole
samples to the group's ranks (largest first to the least-loaded rank), each running its share alone.
Every micro-batch's loss is its sum over real tokens divided by the step's global token count (fair
mode: every token of the batch; paper mode: the tokens the plan covers), so the summed gradient
equals single-device training on the whole batch whatever the plan. How gradients accumulate and are
summed over the world, and where the optimizer states live, is the rank's
`dcp_bench.runtime.training.TrainingState` (ZeRO stage 0-3, fp32 accumulation and reduction; ranks
idle in a round contribute zeros). A lockstep state (FSDP: collectives over the world inside every
micro-batch) makes every rank run the same number of micro-batch passes per round: a rank with fewer
runs empty passes (one token, zero loss weight). A non-finite loss skips the optimizer step and is
reported.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from dcp_bench.batch import GlobalBatch
from dcp_bench.errors import ConfigError, DcpBenchError
from dcp_bench.execution import PlanFn, StepOutcome
from dcp_bench.plan import MicroBatch, StepPlan
from dcp_bench.runtime.attention import SINGLE, SPContext
from dcp_bench.runtime.groups import ProcessGroupPool
from dcp_bench.runtime.models import RuntimeModel
from dcp_bench.runtime.step_meter import (
    BusyTimer,
    PhaseClock,
    SavedTensorMeter,
    describe_memory_measure,
    load_average_1m,
    peak_bytes,
    reset_peak,
    synchronize,
)
from dcp_bench.runtime.training import TrainingState, UserOptimizerState
from dcp_bench.runtime.training import sync_gradients as sync_gradients  # the API's import path
from dcp_bench.runtime.training import zeroed_grads as zeroed_grads


@dataclass
class StepResult:
    """What one rank measured in one step (loss and grad norm are global, identical on all
    ranks)."""

    loss: float  # global mean loss per token of the step
    grad_norm: float
    tokens: int  # the normaliser: tokens the step trained on
    samples: int
    samples_dropped: int
    busy_s: float  # this rank: compute + SP communication of its micro-batches
    peak_mem_bytes: int  # this rank (see dcp_bench.runtime.step_meter)
    micro_batches: int  # run by this rank
    finite: bool = True
    extra: dict[str, float] = field(default_factory=dict)
    # this rank's wall seconds per phase of the step (`PhaseClock.PHASES`)
    phase_s: dict[str, float] = field(default_factory=dict)


def deal_samples(positions: list[int], tokens: np.ndarray, size: int) -> list[list[int]]:
    """Whole samples to ``size`` ranks: largest first, each to the least-loaded rank (ties to the
    lowest rank); each rank keeps its samples in plan order."""
    load = [0] * size
    owner: dict[int, int] = {}
    for pos in sorted(positions, key=lambda p: (-int(tokens[p]), p)):
        r = min(range(size), key=lambda i: (load[i], i))
        owner[pos] = r
        load[r] += int(tokens[pos])
    return [[p for p in positions if owner[p] == r] for r in range(size)]


def rank_work(
    plan: StepPlan, batch: GlobalBatch, rank: int, pool: ProcessGroupPool
) -> Iterator[tuple[int, MicroBatch, SPContext, list[int]]]:
    """This rank's share of a plan in execution order: (round, micro-batch, SP context, sample
    positions). Batch-split micro-batches (and groups of one rank) deal whole samples to the
    group's ranks and run each rank's share without sequence parallelism; a rank dealt nothing
    skips the micro-batch. (A plan's ``round_barrier`` is the runner's to honour between rounds:
    `execute_step` and the integration API's `StepWork` do.)"""
    for r in range(len(plan.rounds)):
        group = plan.group_for_rank(r, rank)
        if group is not None:
            for mb in group.micro_batches:
                positions = list(mb.samples)
                if mb.split == "batch" or group.size == 1:
                    positions = deal_samples(positions, batch.tokens, group.size)[
                        rank - group.start
                    ]
                    if not positions:
                        continue
                    yield r, mb, SINGLE, positions
                    continue
                ctx = pool.context(group.start, group.size, mb.sp_kind, mb.ulysses_degree)
                yield r, mb, ctx, positions


def round_pass_counts(plan: StepPlan, batch: GlobalBatch) -> list[list[int]]:
    """Micro-batch passes per round and rank, as `rank_work` yields them (a rank dealt no sample
    of a batch-split micro-batch runs no pass for it)."""
    out = []
    for rnd in plan.rounds:
        counts = [0] * plan.world_size
        for group in rnd.groups:
            for mb in group.micro_batches:
                if mb.split == "batch" or group.size == 1:
                    dealt = deal_samples(list(mb.samples), batch.tokens, group.size)
                    for i, share in enumerate(dealt):
                        counts[group.start + i] += 1 if share else 0
                else:
                    for i in range(group.size):
                        counts[group.start + i] += 1
        out.append(counts)
    return out


def empty_pass(model: RuntimeModel, seed: int) -> None:
    """A forward and backward on one token with zero loss weight: the collectives of a lockstep
    state without any gradient."""
    inputs = model.make_inputs(np.array([0]), np.array([1]), np.array([1]), SINGLE, seed)
    (model.loss_sum(inputs, SINGLE, 0) * 0.0).backward()


def step_token_count(plan: StepPlan, batch: GlobalBatch) -> int:
    """The loss normaliser: all tokens of the batch in fair mode, the covered tokens in paper
    mode."""
    if plan.mode == "fair":
        return batch.total_tokens
    return int(sum(int(batch.tokens[p]) for p in plan.sample_positions()))


def _training_state(
    model: RuntimeModel | TrainingState,
    optimizer: torch.optim.Optimizer | None,
    bucket_elements: int,
) -> TrainingState:
    """``model`` itself when it is a `TrainingState` (which brings its own optimizer), else the
    bare model with the caller's ``optimizer`` (`UserOptimizerState`)."""
    if isinstance(model, TrainingState):
        if optimizer is not None:
            raise ValueError("a TrainingState brings its own optimizer; pass optimizer=None")
        return model
    return UserOptimizerState(model, optimizer, bucket_elements)


def execute_step(
    plan: StepPlan,
    batch: GlobalBatch,
    model: RuntimeModel | TrainingState,
    optimizer: torch.optim.Optimizer | None,
    pool: ProcessGroupPool,
    seed: int = 0,
    grad_clip: float | None = None,
    measure_memory: bool = True,
    bucket_elements: int = 1 << 26,
    update: bool = True,
) -> StepResult:
    """Run ``plan`` on this rank (see the module docstring). ``model``: a `TrainingState`, or a
    bare model with the caller's ``optimizer`` (`UserOptimizerState`; ``optimizer=None`` leaves
    the all-reduced gradients in ``.grad`` without stepping). ``update=False`` reduces the
    gradients without an optimizer step (tests read them with ``state.gradients()``)."""
    if plan.world_size != pool.world_size:
        raise ValueError(f"plan for {plan.world_size} ranks run on a world of {pool.world_size}")
    if plan.model_parallel is not None:
        mp = plan.model_parallel
        raise ConfigError(
            f"the runtime runs no tensor or pipeline parallelism (plan model_parallel tp={mp.tp}, "
            f"pp={mp.pp}); such plans run on the simulator only"
        )
    state = _training_state(model, optimizer, bucket_elements)
    net = state.model
    device = net.device()
    rank = pool.rank
    state.begin_step()
    norm = step_token_count(plan, batch)
    busy = BusyTimer(device)
    try:
        meter = SavedTensorMeter(net)
    except RuntimeError:
        # Sharded (DTensor) parameters have no storage the meter can read: the CPU estimate is
        # then the static part alone (CUDA measures the allocator's peak either way).
        measure_memory = False
    reset_peak(device)
    max_saved = 0
    local_loss = torch.zeros((), dtype=torch.float32, device=device)
    n_mb = n_empty = 0
    work = list(rank_work(plan, batch, rank, pool))
    passes = round_pass_counts(plan, batch) if state.lockstep else None
    phases = PhaseClock(device)
    for r in range(len(plan.rounds)):
        mine = [w for w in work if w[0] == r]
        for _, mb, ctx, positions in mine:
            pos = np.asarray(positions, dtype=np.int64)
            with phases.span("inputs"):
                inputs = net.make_inputs(
                    batch.sample_ids[pos], batch.tokens[pos], batch.frames[pos], ctx, seed
                )
            with busy.span():
                with phases.span("forward"):
                    if measure_memory:
                        with meter.active():
                            loss = net.loss_sum(inputs, ctx, mb.ckpt_layers) / norm
                        max_saved = max(max_saved, meter.bytes)
                    else:
                        loss = net.loss_sum(inputs, ctx, mb.ckpt_layers) / norm
                with phases.span("backward"):
                    loss.backward()
            local_loss += loss.detach().float()
            n_mb += 1
        if passes is not None:
            for _ in range(max(passes[r]) - len(mine)):
                with busy.span():
                    empty_pass(net, seed)
                n_empty += 1
        if plan.round_barrier and r + 1 < len(plan.rounds):
            dist.barrier()  # the plan's barrier at the end of every round (every rank, idle or not)
    # The gradient reduction waits for the slowest rank, so it stays outside busy time.
    with phases.span("finish"):
        loss_value, grad_norm, finite = state.finish_step(local_loss, grad_clip, update)
    peak = peak_bytes(device)
    if peak is None:
        peak = state.static_bytes() + max_saved
    covered = len(plan.sample_positions())
    return StepResult(
        loss=loss_value,
        grad_norm=grad_norm,
        tokens=norm,
        samples=covered,
        samples_dropped=batch.n - covered,
        busy_s=busy.seconds,
        peak_mem_bytes=int(peak),
        micro_batches=n_mb,
        finite=finite,
        extra={"empty_passes": float(n_empty)} if state.lockstep else {},
        phase_s=phases.seconds(),
    )


def gather_floats(values: list[float], device: torch.device | None = None) -> list[list[float]]:
    """All ranks' lists of floats (same length on every rank), rank-major."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    out = [torch.zeros_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return [o.tolist() for o in out]


class PlanningFailed(DcpBenchError):
    """The planner (run on rank 0) failed; every rank raises this with rank 0's message."""


class TorchExecutor:
    """Real training as an `dcp_bench.execution.Executor`, one instance per rank (under torchrun).

    ``plan``: rank 0 plans (its wall time measured) and broadcasts the plan, so every rank runs
    the same plan even for planners with time limits; a planner failure is broadcast too, so all
    ranks stop together. ``execute``: barrier, `execute_step`, barrier: the measured step time is
    the slowest rank's; per-rank busy time and peak memory are gathered to every rank.
    """

    measured = True

    def __init__(
        self,
        model: RuntimeModel | TrainingState,
        optimizer: torch.optim.Optimizer | None,
        pool: ProcessGroupPool,
        seed: int = 0,
        grad_clip: float | None = None,
        fail_rank: int = -1,
        fail_step: int = 0,
        backend: str = "",
    ) -> None:
        self.state = (
            model if isinstance(model, TrainingState) else UserOptimizerState(model, optimizer)
        )
        self.model = self.state.model
        self.optimizer = optimizer
        self.pool = pool
        self.seed = seed
        self.grad_clip = grad_clip
        self.fail_rank = fail_rank
        self.fail_step = fail_step
        self.device = self.model.device()
        self.world_size = pool.world_size
        self.rank = pool.rank
        self.writes_records = self.rank == 0
        name = (
            f"cuda {torch.cuda.get_device_name(self.device)}"
            if self.device.type == "cuda"
            else "cpu"
        )
        self.hardware = f"{self.world_size} x {name} ranks ({backend or dist.get_backend()})"
        self.info: dict[str, Any] = {
            "param_count": sum(p.numel() for p in self.model.parameters()),
            "memory_measure": describe_memory_measure(self.device),
            "threads": torch.get_num_threads(),
            "step_clock": "cuda events (default stream), after a barrier"
            if self.device.type == "cuda"
            else "wall clock between barriers",
            **self.state.describe(),
        }

    def agree(self, flag: bool) -> bool:
        box = [bool(flag)]
        dist.broadcast_object_list(box, src=0)
        return bool(box[0])

    def plan(self, batch: GlobalBatch, plan_fn: PlanFn) -> tuple[StepPlan, float]:
        payload: list[Any] = [None, 0.0, None]
        if self.rank == 0:
            t0 = time.perf_counter()
            try:
                payload = [plan_fn(batch).to_dict(), time.perf_counter() - t0, None]
            except Exception as exc:  # every rank must hear of it, or the others wait forever
                payload = [None, time.perf_counter() - t0, f"{type(exc).__name__}: {exc}"]
        dist.broadcast_object_list(payload, src=0)
        if payload[2] is not None:
            raise PlanningFailed(f"step {batch.step}: {payload[2]}")
        return StepPlan.from_dict(payload[0]), float(payload[1])

    def execute(self, plan: StepPlan, batch: GlobalBatch) -> StepOutcome:
        if batch.step == self.fail_step and self.rank == self.fail_rank:
            raise RuntimeError(f"injected failure on rank {self.rank} at step {batch.step}")
        dist.barrier()
        cuda = self.device.type == "cuda"
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        res = execute_step(
            plan, batch, self.state, None, self.pool, seed=self.seed, grad_clip=self.grad_clip
        )
        if cuda:
            end.record()
        synchronize(self.device)
        dist.barrier()
        wall = time.perf_counter() - t0
        # On CUDA the step is timed by events on the default stream (the GPU's own clock); the
        # slowest rank's time is the step's, gathered below.
        step_time = start.elapsed_time(end) / 1e3 if cuda else wall
        phase_values = [res.phase_s.get(k, 0.0) for k in PhaseClock.PHASES]
        per_rank = gather_floats(
            [res.busy_s, float(res.peak_mem_bytes), step_time, *phase_values], device=self.device
        )
        # per phase, every rank's seconds (`PhaseClock`): what the cost model's terms price
        phase_extra = {
            f"phase_{k}_s": [round(r[3 + i], 6) for r in per_rank]
            for i, k in enumerate(PhaseClock.PHASES)
        }
        return StepOutcome(
            step_time_s=max(r[2] for r in per_rank),
            busy_s=[r[0] for r in per_rank],
            peak_mem_bytes=[r[1] for r in per_rank],
            tokens=res.tokens,
            loss=res.loss,
            grad_norm=res.grad_norm,
            finite=res.finite,
            extra={
                "rank_micro_batches": res.micro_batches,
                "wall_step_s": wall,
                "load_avg_1m": load_average_1m(),
                **phase_extra,
                **res.extra,
            },
        )
