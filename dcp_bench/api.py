"""The integration API: Data-Centric Parallel inside your own training loop.

``DataCentricParallel`` takes the model, its optimizer, a source of global batches that knows
every sample's length, and a method name. Iterating it yields one `StepWork` per global batch:
this rank's micro-batches, each with its inputs, its sequence-parallel group and its recompute
setting. Your loop runs forward and backward on them; `DataCentricParallel.step` then does the
one gradient all-reduce and the one optimizer step::

    dcp = DataCentricParallel(model, optimizer, batches, method="dcp", cluster="cpu")
    for work in dcp:
        for mb in work:
            loss = dcp.loss_sum(mb) / work.tokens
            work.backward(loss)
        dcp.step(work)

``dcp.loss_sum(mb)`` is the loss hook: ``loss_fn(mb)`` when one was given, else the adapter's
``loss_sum``. A ``transformers`` causal LM (the families of ``transformers_lm.MODEL_TYPES``) or
a ``diffusers`` Wan video transformer is recognised and gets its adapter
(`dcp_bench.runtime.integrations`); any other model brings its own ``adapter`` (an object with
``make_inputs``, ``loss_sum`` and ``spec``) or is itself one:

What a model (or adapter) must provide (`dcp_bench.runtime.models.RuntimeModel`):
``make_inputs(sample_ids, tokens, frames, sp, seed)`` (this rank's shard of a packed micro-batch)
and ``loss_sum(inputs, sp, ckpt_layers)`` (the summed loss over its real tokens), with attention
that runs through the sequence-parallel exchanges of `dcp_bench.runtime.attention`
(``ulysses_seq_to_heads`` / ``ulysses_heads_to_seq`` around ``varlen_attention``;
``permuted_all_to_all`` for video). The runtime's Llama and STDiT models do.

Planning runs on rank 0 and the plan is broadcast, so every rank runs the same plan even if a
planner were not deterministic. The loss is normalised by the step's global token count, so the
summed gradient equals single-device training on the whole batch (fair mode).
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from dcp_bench.batch import GlobalBatch
from dcp_bench.config import load_config, to_container
from dcp_bench.cost.base import CostModel
from dcp_bench.cost.specs import ClusterSpec
from dcp_bench.errors import ConfigError, WorkloadError
from dcp_bench.plan import StepPlan
from dcp_bench.planners.base import make_planner
from dcp_bench.run.assemble import RunParts, build_cost_model
from dcp_bench.run.capabilities import StepWorkload
from dcp_bench.run.spec import parse_run_spec
from dcp_bench.runtime.attention import SPContext
from dcp_bench.runtime.executor import TorchExecutor, rank_work, step_token_count
from dcp_bench.runtime.groups import ProcessGroupPool
from dcp_bench.runtime.integrations.models import AdaptedModel, adapter_for

# Rank 0 logs each step's plan on one line at INFO (`StepWork.describe`): the SP degrees chosen.
_LOG = logging.getLogger(__name__)


@dataclass
class RankMicroBatch:
    """One micro-batch this rank runs: ``DataCentricParallel.loss_sum(mb)`` (or
    ``model.loss_sum(inputs, sp, ckpt_layers)`` for a runtime model)."""

    inputs: Any  # what model.make_inputs built: this rank's shard
    sp: SPContext  # the sequence-parallel group (SINGLE when the rank runs it alone)
    ckpt_layers: int  # the first ckpt_layers layers are activation-checkpointed
    positions: tuple[int, ...]  # the samples (positions in the global batch)
    round: int  # plan round: micro-batches of one round run before those of the next


@dataclass
class StepWork:
    """This rank's share of one optimizer step."""

    step: int
    batch: GlobalBatch
    plan: StepPlan
    tokens: int  # the loss normaliser: the step's global token count
    micro_batches: list[RankMicroBatch] = field(default_factory=list)
    planner_s: float = 0.0
    local_loss: float = 0.0  # sum of the losses passed to `backward` on this rank

    def __iter__(self) -> Iterator[RankMicroBatch]:
        """This rank's micro-batches in order; for a plan with ``round_barrier`` every rank waits
        at the end of each round (while iterating) until all ranks finish it."""
        if not self.plan.round_barrier:
            yield from self.micro_batches
            return
        last = len(self.plan.rounds) - 1
        for r in range(last + 1):
            yield from (mb for mb in self.micro_batches if mb.round == r)
            if r < last:
                dist.barrier()

    @property
    def sp_degrees(self) -> list[int]:
        """The sequence-parallel degrees the plan chose for this step (every rank's groups that
        run micro-batches; 1: a rank runs its samples alone)."""
        return sorted({g.size for r in self.plan.rounds for g in r.groups if g.micro_batches})

    def describe(self) -> str:
        """The step's plan on one line: samples, tokens, micro-batches per SP degree, recompute,
        planner time."""
        per_degree = Counter(
            g.size for r in self.plan.rounds for g in r.groups for _ in g.micro_batches
        )
        ckpt = sorted({mb.ckpt_layers for r in self.plan.rounds for g in r.groups
                       for mb in g.micro_batches})  # fmt: skip
        return (
            f"step {self.step}: {len(self.batch.tokens)} samples, {self.tokens} tokens; "
            f"SP degrees {self.sp_degrees} (micro-batches: "
            f"{', '.join(f'{n} at SP {d}' for d, n in sorted(per_degree.items()))}); "
            f"checkpointed layers {ckpt}; planned in {self.planner_s * 1e3:.0f} ms"
        )

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``, keeping its value for the step's global loss."""
        self.local_loss += float(loss.detach())
        loss.backward()


def has_sp_interface(model: Any) -> bool:
    """Whether ``model`` has ``make_inputs`` and ``loss_sum`` that take an ``sp`` group."""
    return all(
        callable(getattr(model, m, None))
        and "sp" in inspect.signature(getattr(model, m)).parameters
        for m in ("make_inputs", "loss_sum")
    )


def check_model(model: Any) -> None:
    """Raise `ConfigError` unless ``model`` (or an adapter) can run sequence-parallel
    micro-batches."""
    name = type(model).__name__
    missing = [m for m in ("make_inputs", "loss_sum") if not callable(getattr(model, m, None))]
    takes_sp = not missing and all(
        "sp" in inspect.signature(getattr(model, m)).parameters for m in ("make_inputs", "loss_sum")
    )
    if missing or not takes_sp:
        raise ConfigError(
            f"model {name} has no sequence-parallel interface ("
            + (f"missing {', '.join(missing)}" if missing else "make_inputs/loss_sum take no `sp`")
            + (
                "): implement dcp_bench.runtime.models.RuntimeModel - make_inputs(sample_ids, "
                "tokens, frames, sp, seed) and loss_sum(inputs, sp, ckpt_layers) - and route its "
                "attention through dcp_bench.runtime.attention (ulysses_seq_to_heads / "
                "ulysses_heads_to_seq around varlen_attention), or start from "
                "dcp_bench.runtime.models.build_model; a library model other than a transformers "
                "causal LM or a diffusers Wan transformer needs adapter=..."
            )
        )
    if not hasattr(model, "spec"):
        raise ConfigError(
            f"model {name} has no `spec` (a dcp_bench ModelSpec): the planner needs its layer "
            "count and sizes; set model.spec = dcp_bench.cost.specs.model_spec(...)"
        )


def _as_global_batch(item: Any, step: int) -> GlobalBatch:
    if isinstance(item, GlobalBatch):
        return item
    if isinstance(item, dict) and "lengths" in item:
        lengths = np.asarray(item["lengths"], dtype=np.int64)
        ids = np.asarray(item.get("sample_ids", np.arange(len(lengths))), dtype=np.int64)
        frames = np.asarray(item.get("frames", np.ones_like(lengths)), dtype=np.int64)
        return GlobalBatch(step=step, sample_ids=ids, tokens=lengths, frames=frames)
    raise WorkloadError(
        f"the data yielded a {type(item).__name__} without sample lengths: DataCentricParallel "
        "plans from lengths, so yield dcp_bench.batch.GlobalBatch objects or dicts with "
        "'lengths' (and optional 'sample_ids', 'frames'), or pass a dcp_bench Workload"
    )


def _batches(data: Any, world_size: int) -> Iterator[GlobalBatch]:
    if isinstance(data, StepWorkload):  # a dcp_bench Workload: endless, one batch per step
        step = 0
        while True:
            yield data.global_batch(step, world_size)
            step += 1
    if not isinstance(data, Iterable) or isinstance(data, (str, bytes)):
        raise WorkloadError(
            f"data of type {type(data).__name__} is neither a Workload nor an iterable of batches "
            "with sample lengths; pass a dcp_bench Workload or an iterable of GlobalBatch"
        )
    for step, item in enumerate(data):
        yield _as_global_batch(item, step)


class DataCentricParallel:
    """Plans every global batch with a DCP (or baseline) method and hands this rank its work.

    ``data``: a dcp_bench ``Workload`` or an iterable of ``GlobalBatch`` (or of dicts with
    ``lengths``); every rank must see the same batches. ``method``: a config name under
    ``dcp_bench/conf/method`` (``dcp``, ``dcp_inter``, ``dcp_intra``, ``dcp_inter_pac``, the
    baselines). ``cluster``: a cluster config name or spec describing the devices (its size is set
    to the running world); ``cost``: a ready cost model instead (else ``make_cost_model(model.spec,
    cluster, source="auto")``: the cluster's profile when it names one). Needs
    ``torch.distributed`` initialised (any world size, a power of two). ``adapter``: builds the
    inputs and the loss of a model that has no ``make_inputs``/``loss_sum`` of its own (recognised
    library models get theirs); ``loss_fn(mb)``: a loss hook that replaces the adapter's
    ``loss_sum`` in `loss_sum`.
    """

    def __init__(
        self,
        model: Any,
        optimizer: torch.optim.Optimizer | None,
        data: Any,
        method: str = "dcp",
        cluster: str | ClusterSpec = "cpu",
        cost: CostModel | None = None,
        seed: int = 0,
        grad_clip: float | None = None,
        method_overrides: list[str] | None = None,
        adapter: Any = None,
        loss_fn: Callable[[RankMicroBatch], torch.Tensor] | None = None,
    ) -> None:
        if adapter is None and not has_sp_interface(model):
            adapter = adapter_for(model)
        check_model(model if adapter is None else adapter)
        if not dist.is_initialized():
            raise ConfigError(
                "torch.distributed is not initialised: call dist.init_process_group (e.g. under "
                "torchrun) before building DataCentricParallel"
            )
        self.model = model
        self.adapter = model if adapter is None else adapter
        self.loss_fn = loss_fn
        self.optimizer = optimizer
        self.seed = seed
        self.grad_clip = grad_clip
        self.pool = ProcessGroupPool()
        self.world_size = self.pool.world_size
        self.rank = self.pool.rank
        # The same run path as every command: a config composed and parsed into a RunSpec, the
        # cost model and the planner built by the assembly, the runtime's executor planning on
        # rank 0 and broadcasting.
        overrides = [
            f"method={method}",
            f"seed={seed}",
            f"run.nproc={self.world_size}",
            *(method_overrides or []),
        ]
        if isinstance(cluster, str):
            overrides.append(f"cluster={cluster}")
        spec = parse_run_spec(to_container(load_config(overrides)))
        spec = dataclasses.replace(
            spec,
            model=self.adapter.spec,
            cluster=cluster.resized(self.world_size)
            if isinstance(cluster, ClusterSpec)
            else spec.cluster,
        )
        if cost is None:
            cost = build_cost_model(spec)
        elif cost.cluster.world_size != self.world_size:
            raise ConfigError(
                f"cost model for {cost.cluster.world_size} ranks used on a world of "
                f"{self.world_size}"
            )
        self.cost = cost
        self.planner = make_planner(spec.method, seed=seed)
        self._parts = RunParts(workload=data, cost=cost, plan_cost=cost, planner=self.planner)
        runtime_model = model if adapter is None else AdaptedModel(model, adapter)
        self._executor = TorchExecutor(
            runtime_model, optimizer, self.pool, seed=seed, grad_clip=grad_clip
        )
        self._data = _batches(data, self.world_size)

    def plan(self, batch: GlobalBatch) -> StepPlan:
        """Rank 0 plans and validates; every rank receives the same plan."""
        plan, _ = self._executor.plan(batch, self._parts.plan_step)
        return plan

    def work(self, batch: GlobalBatch) -> StepWork:
        """Plan ``batch`` and build this rank's micro-batches (inputs included)."""
        t0 = time.perf_counter()
        plan = self.plan(batch)
        planner_s = time.perf_counter() - t0
        out = StepWork(
            step=batch.step,
            batch=batch,
            plan=plan,
            tokens=step_token_count(plan, batch),
            planner_s=planner_s,
        )
        if self.rank == 0:
            _LOG.info("%s", out.describe(), extra={"sp_degrees": out.sp_degrees})
        for r, mb, ctx, positions in rank_work(plan, batch, self.rank, self.pool):
            pos = np.asarray(positions, dtype=np.int64)
            inputs = self.adapter.make_inputs(
                batch.sample_ids[pos], batch.tokens[pos], batch.frames[pos], ctx, self.seed
            )
            out.micro_batches.append(
                RankMicroBatch(inputs, ctx, mb.ckpt_layers, tuple(positions), r)
            )
        return out

    def loss_sum(self, mb: RankMicroBatch) -> torch.Tensor:
        """The summed loss of ``mb`` over this rank's real tokens (divide it by ``work.tokens``):
        ``loss_fn(mb)`` when one was given, else the adapter's (or the model's) ``loss_sum``."""
        if self.loss_fn is not None:
            return self.loss_fn(mb)
        return self.adapter.loss_sum(mb.inputs, mb.sp, mb.ckpt_layers)

    def __iter__(self) -> Iterator[StepWork]:
        for batch in self._data:
            yield self.work(batch)

    def steps(self, n: int) -> Iterator[StepWork]:
        """At most ``n`` steps of work."""
        for i, work in enumerate(self):
            if i >= n:
                return
            yield work

    def step(self, work: StepWork) -> float:
        """The runtime's own step (`dcp_bench.runtime.training.UserOptimizerState.finish_step`, the
        one the benchmark's executor runs): one all-reduce of every gradient and of the loss (ranks
        without work contribute zeros), the optimizer step (skipped when a gradient or the loss is
        not finite); then the gradients are released. Returns the step's global loss: the sum over
        ranks of the losses given to `StepWork.backward`."""
        state = self._executor.state
        params = [p for p in self.model.parameters() if p.requires_grad]
        local = torch.tensor(work.local_loss, dtype=torch.float32, device=params[0].device)
        total, _, _ = state.finish_step(local, self.grad_clip)
        for p in params:
            p.grad = None
        return total
