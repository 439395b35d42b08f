"""`execute_step`: run one `StepPlan` on this rank, then one gradient all-reduce and one optimizer
step.

For each round, the rank finds its group (idle if none), and runs that group's micro-batches in
order with the group's SP degree and each micro-batch's ``ckpt_layers``. ``split="sequence"``
shards every sample over the group (Ulysses for text, DSP for video); ``split="batch"`` deals
whole samples to the group's ranks (largest first to the least-loaded rank), each running its
share alone. Every micro-batch's loss is its sum over real tokens divided by the step's global
token count (fair mode: every token of the batch; paper mode: the tokens the plan covers), so the
summed gradient equals single-device training on the whole batch whatever the plan. Gradients
accumulate locally; then one SUM all-reduce over the world of all gradients plus the loss (ranks
idle in a round contribute zeros; gradients go in flat buckets, the loss beside them), and one
optimizer step. A non-finite loss skips the optimizer step and is reported.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from dcp_bench.batch import GlobalBatch
from dcp_bench.errors import DcpBenchError
from dcp_bench.execution import PlanFn, StepOutcome
from dcp_bench.plan import MicroBatch, StepPlan
from dcp_bench.runtime.attention import SINGLE, SPContext
from dcp_bench.runtime.groups import ProcessGroupPool
from dcp_bench.runtime.measure import (
    BusyTimer,
    SavedTensorMeter,
    cuda_peak_bytes,
    describe_memory_measure,
    reset_peak,
    static_bytes,
    synchronize,
)
from dcp_bench.runtime.models import RuntimeModel


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
    peak_mem_bytes: int  # this rank (see dcp_bench.runtime.measure)
    micro_batches: int  # run by this rank
    finite: bool = True
    extra: dict[str, float] = field(default_factory=dict)


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
    plan: StepPlan, batch: GlobalBatch, rank: int, pool: ProcessGroupPool, barrier: bool = True
) -> Iterator[tuple[int, MicroBatch, SPContext, list[int]]]:
    """This rank's share of a plan in execution order: (round, micro-batch, SP context, sample
    positions). Batch-split micro-batches (and groups of one rank) deal whole samples to the
    group's ranks and run each rank's share without sequence parallelism; a rank dealt nothing
    skips the micro-batch. When the plan has ``round_barrier`` (and ``barrier``), every rank,
    idle or not, waits at the end of each round until all ranks reach it."""
    for r in range(len(plan.rounds)):
        group = plan.group_for_rank(r, rank)
        if group is not None:
            sp = pool.context(group.start, group.size)
            for mb in group.micro_batches:
                positions = list(mb.samples)
                ctx = sp
                if mb.split == "batch" or group.size == 1:
                    positions = deal_samples(positions, batch.tokens, group.size)[sp.rank]
                    ctx = SINGLE
                    if not positions:
                        continue
                yield r, mb, ctx, positions
        if barrier and plan.round_barrier and r + 1 < len(plan.rounds):
            dist.barrier()


def step_token_count(plan: StepPlan, batch: GlobalBatch) -> int:
    """The loss normaliser: all tokens of the batch in fair mode, the covered tokens in paper mode."""
    if plan.mode == "fair":
        return batch.total_tokens
    return int(sum(int(batch.tokens[p]) for p in plan.sample_positions()))


def execute_step(
    plan: StepPlan,
    batch: GlobalBatch,
    model: RuntimeModel,
    optimizer: torch.optim.Optimizer | None,
    pool: ProcessGroupPool,
    seed: int = 0,
    grad_clip: float | None = None,
    measure_memory: bool = True,
    bucket_elements: int = 1 << 26,
) -> StepResult:
    """Run ``plan`` on this rank (see the module docstring). ``optimizer=None`` leaves the
    all-reduced gradients in ``.grad`` without stepping (used by tests)."""
    if plan.world_size != pool.world_size:
        raise ValueError(f"plan for {plan.world_size} ranks run on a world of {pool.world_size}")
    device = model.device()
    rank = pool.rank
    params = [p for p in model.parameters() if p.requires_grad]
    grads = zeroed_grads(params)
    norm = step_token_count(plan, batch)
    busy = BusyTimer(device)
    meter = SavedTensorMeter(model)
    reset_peak(device)
    max_saved = 0
    local_loss = torch.zeros((), dtype=torch.float32, device=device)
    n_mb = 0
    for _, mb, ctx, positions in rank_work(plan, batch, rank, pool):
        pos = np.asarray(positions, dtype=np.int64)
        inputs = model.make_inputs(batch.sample_ids[pos], batch.tokens[pos], batch.frames[pos], ctx, seed)
        with busy.span():
            if measure_memory:
                with meter.active():
                    loss = model.loss_sum(inputs, ctx, mb.ckpt_layers) / norm
                max_saved = max(max_saved, meter.bytes)
            else:
                loss = model.loss_sum(inputs, ctx, mb.ckpt_layers) / norm
            loss.backward()
        local_loss += loss.detach().float()
        n_mb += 1
    # The all-reduce waits for the slowest rank, so it stays outside busy time.
    loss_value, grad_norm, finite = sync_gradients(params, grads, local_loss, bucket_elements)
    if finite and optimizer is not None:
        if grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(params, grad_clip)
        optimizer.step()
    peak = cuda_peak_bytes(device)
    if peak is None:
        peak = static_bytes(model, optimizer) + max_saved
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
    )


def sync_gradients(
    params: Sequence[torch.Tensor],
    grads: list[torch.Tensor],
    local_loss: torch.Tensor,
    bucket_elements: int = 1 << 26,
) -> tuple[float, float, bool]:
    """One SUM all-reduce over the world of every gradient (written back into ``grads``) and of
    the loss: gradients in flat buckets in their own dtype (one bucket for a small model, bounded
    memory for real sizes), the loss in fp32. Returns (global loss, gradient norm, finite)."""
    device = local_loss.device
    sq_norm = torch.zeros((), dtype=torch.float64, device=device)
    for bucket in _buckets(grads, bucket_elements):
        flat = torch.cat([g.reshape(-1) for g in bucket])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for g in bucket:
            n = g.numel()
            g.copy_(flat[offset : offset + n].view_as(g))
            offset += n
        sq_norm += flat.double().pow(2).sum()
    loss = local_loss.detach().float().reshape(())
    dist.all_reduce(loss, op=dist.ReduceOp.SUM)
    loss_value = float(loss)
    grad_norm = float(sq_norm.sqrt())
    return loss_value, grad_norm, math.isfinite(loss_value) and math.isfinite(grad_norm)


def zeroed_grads(params: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """A zero gradient buffer on every parameter, so ranks idle in every round (or parameters a
    micro-batch does not use) still contribute zeros to the one all-reduce."""
    grads: list[torch.Tensor] = []
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        else:
            p.grad.zero_()
        grads.append(p.grad)
    return grads


def _buckets(tensors: list[torch.Tensor], max_elements: int) -> list[list[torch.Tensor]]:
    """Consecutive tensors grouped so each group has at most ``max_elements`` (or one tensor)."""
    out: list[list[torch.Tensor]] = [[]]
    size = 0
    for t in tensors:
        if out[-1] and size + t.numel() > max_elements:
            out.append([])
            size = 0
        out[-1].append(t)
        size += t.numel()
    return out if out[-1] else out[:-1]


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
        model: RuntimeModel,
        optimizer: torch.optim.Optimizer | None,
        pool: ProcessGroupPool,
        seed: int = 0,
        grad_clip: float | None = None,
        fail_rank: int = -1,
        fail_step: int = 0,
        backend: str = "",
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.pool = pool
        self.seed = seed
        self.grad_clip = grad_clip
        self.fail_rank = fail_rank
        self.fail_step = fail_step
        self.device = next(model.parameters()).device
        self.world_size = pool.world_size
        self.rank = pool.rank
        self.writes_records = self.rank == 0
        name = f"cuda {torch.cuda.get_device_name(self.device)}" if self.device.type == "cuda" else "cpu"
        self.hardware = f"{self.world_size} x {name} ranks ({backend or dist.get_backend()})"
        self.info: dict[str, Any] = {
            "param_count": sum(p.numel() for p in model.parameters()),
            "memory_measure": describe_memory_measure(self.device),
            "threads": torch.get_num_threads(),
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
        t0 = time.perf_counter()
        res = execute_step(plan, batch, self.model, self.optimizer, self.pool, seed=self.seed,
                           grad_clip=self.grad_clip)
        synchronize(self.device)
        dist.barrier()
        step_time = time.perf_counter() - t0
        per_rank = gather_floats([res.busy_s, float(res.peak_mem_bytes)], device=self.device)
        return StepOutcome(
            step_time_s=step_time,
            busy_s=[r[0] for r in per_rank],
            peak_mem_bytes=[r[1] for r in per_rank],
            tokens=res.tokens,
            loss=res.loss,
            grad_norm=res.grad_norm,
            finite=res.finite,
            extra={"rank_micro_batches": res.micro_batches},
        )
