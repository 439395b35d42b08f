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
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist

from dcp_bench.batch import GlobalBatch
from dcp_bench.plan import MicroBatch, StepPlan
from dcp_bench.runtime.attention import SINGLE, SPContext
from dcp_bench.runtime.groups import ProcessGroupPool
from dcp_bench.runtime.measure import (
    BusyTimer,
    SavedTensorMeter,
    cuda_peak_bytes,
    reset_peak,
    static_bytes,
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
    plan: StepPlan, batch: GlobalBatch, rank: int, pool: ProcessGroupPool
) -> Iterator[tuple[int, MicroBatch, SPContext, list[int]]]:
    """This rank's share of a plan in execution order: (round, micro-batch, SP context, sample
    positions). Batch-split micro-batches (and groups of one rank) deal whole samples to the
    group's ranks and run each rank's share without sequence parallelism; a rank dealt nothing
    skips the micro-batch."""
    for r in range(len(plan.rounds)):
        group = plan.group_for_rank(r, rank)
        if group is None:
            continue
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
    # Every parameter gets a zero gradient buffer, so ranks idle in every round (or parameters
    # unused by a micro-batch) still contribute zeros to the one all-reduce.
    grads: list[torch.Tensor] = []
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        else:
            p.grad.zero_()
        grads.append(p.grad)
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
    # The all-reduce waits for the slowest rank, so it stays outside busy time. Gradients go in
    # flat buckets (one for a small model; bounded memory for real sizes), the loss in fp32.
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
    dist.all_reduce(local_loss, op=dist.ReduceOp.SUM)
    loss_value = float(local_loss)
    grad_norm = float(sq_norm.sqrt())
    finite = math.isfinite(loss_value) and math.isfinite(grad_norm)
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
