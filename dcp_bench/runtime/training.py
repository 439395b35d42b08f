"""How a rank holds its parameters, gradients and optimizer states: `TrainingState`.

The policy (dtypes, what each ZeRO stage shards) is `dcp_bench.train_policy`, which the cost
models read too; this module implements it with torch.distributed over the data-parallel world
(every rank: sequence parallelism shards activations, never weights), orthogonal to the per-step
SP groups of a plan.

- `FlatState` (ZeRO stages 0 and 1): the model's parameters are views into one flat buffer in the
  compute dtype; a post-accumulate-grad hook adds every parameter's gradient into one flat fp32
  accumulator and frees it, so micro-batches accumulate in fp32 whatever the compute dtype. At the
  end of the step: stage 0 all-reduces the accumulator (fp32) and steps AdamW on fp32 master
  weights (the parameters themselves when they are fp32); stage 1 reduce-scatters it (fp32), each
  rank steps AdamW on its shard of the fp32 master weights, and the updated shards are
  all-gathered into the compute-dtype parameters. No collective runs inside a micro-batch, so
  ranks may run different numbers of micro-batches (DCP-inter's unequal groups).
- `FSDPState` (stages 2 and 3): FSDP2 (``fully_shard``) on every layer and on the root (a
  library model's layers: its ``fsdp_units()``, e.g. the decoder layers of ``model=hf``), with
  ``MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=fp32)``: fp32 parameter shards are the
  master weights, gathered in the compute dtype for each layer (stage 3 frees them after the
  layer's forward and gathers again for its backward; stage 2 keeps them), gradients
  reduce-scattered in fp32 (summed, not averaged) after every micro-batch's backward. These
  collectives span the world inside every micro-batch, so such a state is ``lockstep``: the
  executor makes every rank run the same number of micro-batch passes per plan round (a rank
  with fewer runs empty passes: one token, zero loss weight).
- `UserOptimizerState`: a model and an optimizer the caller built (the integration API, tests):
  gradients accumulate in the parameters' ``.grad``, one SUM all-reduce, the caller's optimizer.

Every state's step sums the micro-batch gradients over ranks (the loss is already normalised by
the step's global token count), so a step equals single-device training on the whole batch.
"""

from __future__ import annotations

import math
import weakref
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from dcp_bench.cost.specs import ModelSpec
from dcp_bench.errors import ConfigError
from dcp_bench.runtime.attention import select_attention_kernel
from dcp_bench.runtime.device import DTYPES, compute_dtype
from dcp_bench.runtime.integrations.models import library_empty_model
from dcp_bench.runtime.models import RuntimeModel, build_empty_model, build_model
from dcp_bench.train_policy import (
    DEFAULT_ZERO_STAGE,
    PrecisionPolicy,
    check_zero_stage,
    lockstep,
    precision_policy,
)


def _all_gather_flat(out: Tensor, shard: Tensor) -> None:
    # all_gather_single replaces all_gather_into_tensor in newer releases; both are public.
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    fn(out, shard)


def _reduce_scatter_flat(out: Tensor, full: Tensor) -> None:
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    fn(out, full, op=dist.ReduceOp.SUM)


def _clip_coef(grad_norm: float, grad_clip: float | None) -> float:
    """The factor ``torch.nn.utils.clip_grad_norm_`` scales gradients by (1 when not clipping)."""
    if grad_clip is None or not math.isfinite(grad_norm):
        return 1.0
    return min(1.0, grad_clip / (grad_norm + 1e-6))


def _sq_norm(t: Tensor, chunk: int = 1 << 24) -> Tensor:
    """Sum of squares of ``t`` in fp64, a chunk at a time: an fp32 norm over millions of elements
    can be off by 1e-4 (measured on CPU), and a whole fp64 copy of 8B gradients would not fit."""
    flat = t.reshape(-1)
    out = torch.zeros((), dtype=torch.float64, device=t.device)
    for s in range(0, flat.numel(), chunk):
        out += flat[s : s + chunk].double().pow(2).sum()
    return out


def _global_loss(local_loss: Tensor) -> float:
    loss = local_loss.detach().float().reshape(())
    dist.all_reduce(loss, op=dist.ReduceOp.SUM)
    return float(loss)


class TrainingState(ABC):
    """A model and everything the optimizer keeps for it, on this rank."""

    model: RuntimeModel
    zero_stage: int = 0
    policy: PrecisionPolicy | None = None
    lockstep: bool = False  # every rank runs the same number of micro-batch passes per round

    @abstractmethod
    def begin_step(self) -> None:
        """Reset the gradient accumulators before a step's first micro-batch."""

    @abstractmethod
    def finish_step(
        self, local_loss: Tensor, grad_clip: float | None, update: bool = True
    ) -> tuple[float, float, bool]:
        """Reduce the gradients over the world, clip, and (``update``) step the optimizer unless
        the loss or the gradient norm is not finite. Returns (global loss, gradient norm before
        clipping, finite). Collective: every rank calls it once per step."""

    @abstractmethod
    def gradients(self) -> Tensor:
        """The step's reduced gradient of every parameter, flat, in fp32, in parameter order
        (gathered from the shards when sharded: collective)."""

    @abstractmethod
    def static_bytes(self) -> int:
        """Bytes this rank holds in parameters, gradient accumulators and optimizer states."""

    def describe(self) -> dict[str, Any]:
        policy = self.policy
        return {
            "zero_stage": self.zero_stage,
            "lockstep": self.lockstep,
            "precision": None
            if policy is None
            else {
                "compute": policy.compute,
                "master": policy.master,
                "grad": policy.grad,
                "optimizer_state": policy.optimizer_state,
            },
            # a caller's own model (the integration API) may carry no kernel of ours
            "attention": self.model.attention.describe()
            if hasattr(self.model, "attention")
            else None,
        }


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


def flat_slice(params: Sequence[Tensor], lo: int, hi: int, dtype: torch.dtype) -> Tensor:
    """Elements [lo, hi) of the parameters flattened in order and zero-padded, as a new tensor
    of ``dtype`` (built piece by piece: never the whole flat vector at once)."""
    out = torch.zeros(hi - lo, dtype=dtype, device=params[0].device)
    off = 0
    with torch.no_grad():
        for p in params:
            n = p.numel()
            a, b = max(lo, off), min(hi, off + n)
            if a < b:
                out[a - lo : b - lo] = p.detach().reshape(-1)[a - off : b - off]
            off += n
    return out


def _tensor_bytes(tensors: Sequence[Any]) -> int:
    return int(sum(t.numel() * t.element_size() for t in tensors if isinstance(t, Tensor)))


def optimizer_state_bytes(optimizer: torch.optim.Optimizer | None) -> int:
    """Bytes of this rank's optimizer state tensors (AdamW: its two moments and step counts; a
    sharded state counts its local shard)."""
    if optimizer is None:
        return 0
    out = 0
    for st in optimizer.state.values():
        for v in st.values():
            if isinstance(v, Tensor):
                local = v.to_local() if hasattr(v, "to_local") else v
                out += local.numel() * local.element_size()
    return out


class UserOptimizerState(TrainingState):
    """A caller's model and optimizer (or none): ``.grad`` accumulation, one all-reduce in the
    gradients' dtype (`dcp_bench.runtime.executor.sync_gradients`), the caller's optimizer."""

    def __init__(
        self,
        model: RuntimeModel,
        optimizer: torch.optim.Optimizer | None,
        bucket_elements: int = 1 << 26,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.bucket_elements = bucket_elements
        self.params = [p for p in model.parameters() if p.requires_grad]

    def begin_step(self) -> None:
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            else:
                p.grad.zero_()

    def finish_step(
        self, local_loss: Tensor, grad_clip: float | None, update: bool = True
    ) -> tuple[float, float, bool]:
        for p in self.params:  # a parameter no micro-batch reached (or no `begin_step`) adds zeros
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in self.params if p.grad is not None]
        loss, norm, finite = sync_gradients(self.params, grads, local_loss, self.bucket_elements)
        if finite and update and self.optimizer is not None:
            if grad_clip is not None:
                torch.nn.utils.clip_grad_norm_(self.params, grad_clip)
            self.optimizer.step()
        return loss, norm, finite

    def gradients(self) -> Tensor:
        return torch.cat(
            [
                (torch.zeros_like(p) if p.grad is None else p.grad).reshape(-1).float()
                for p in self.params
            ]
        )

    def static_bytes(self) -> int:
        return 2 * _tensor_bytes(self.params) + optimizer_state_bytes(self.optimizer)


class FlatState(TrainingState):
    """ZeRO stage 0 or 1 over flat buffers (see the module docstring)."""

    def __init__(
        self,
        model: RuntimeModel,
        zero_stage: int,
        policy: PrecisionPolicy,
        lr: float,
        master: Tensor | None = None,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ) -> None:
        """``model``: parameters in the compute dtype; ``master``: this rank's slice of the
        flat fp32 weights (the whole for stage 0, elements [r S, (r+1) S) of the zero-padded
        flat vector for stage 1 with S = ceil(P / W)) when they are more precise than the
        parameters (a 16-bit model); None: taken from the parameters."""
        if zero_stage not in (0, 1):
            raise ConfigError(f"FlatState implements ZeRO stages 0 and 1, not {zero_stage}")
        self.model = model
        self.zero_stage = zero_stage
        self.policy = policy
        self.lockstep = False
        self.world = dist.get_world_size() if zero_stage == 1 else 1
        self.rank = dist.get_rank() if zero_stage == 1 else 0
        self.params = [p for p in model.parameters() if p.requires_grad]
        device = self.params[0].device
        self.numel = sum(p.numel() for p in self.params)
        self.shard = -(-self.numel // self.world)
        padded = self.shard * self.world
        compute = self.params[0].dtype
        # The parameters become views into one flat buffer (padded to whole shards), so the
        # updated shards can be gathered straight into them.
        self.flat = flat_slice(self.params, 0, padded, compute)
        torch.nn.utils.vector_to_parameters(self.flat[: self.numel], self.params)
        grad_dtype = DTYPES[policy.grad]
        self.main_grad = torch.zeros(padded, dtype=grad_dtype, device=device)
        off = 0
        for p in self.params:
            p.register_post_accumulate_grad_hook(self._accumulate_into(off))
            off += p.numel()
        # What the optimizer steps: a flat fp32 tensor whose .grad is the reduced gradient.
        lo, hi = self.rank * self.shard, (self.rank + 1) * self.shard
        if zero_stage == 0 and not policy.separate_master:
            self.master = self.flat  # the parameters are the master weights
        elif master is not None:
            if master.numel() != hi - lo:
                raise ValueError(f"master shard of {master.numel()} elements; expected {hi - lo}")
            self.master = master.to(DTYPES[policy.master])
        else:
            self.master = flat_slice(self.params, lo, hi, DTYPES[policy.master])
        self.grad_shard = (
            self.main_grad
            if zero_stage == 0
            else torch.zeros(self.shard, dtype=grad_dtype, device=device)
        )
        self.master.grad = self.grad_shard
        self.optimizer = torch.optim.AdamW(
            [self.master], lr=lr, betas=betas, eps=eps, weight_decay=weight_decay
        )

    def _accumulate_into(self, offset: int) -> Any:
        # The hook lives in the parameter's autograd metadata, which Python's garbage collector
        # cannot see: a strong reference to the state from there is a cycle nothing collects
        # (state -> parameters -> hook -> state), so every state built would stay allocated.
        # A weak reference breaks it.
        state = weakref.ref(self)

        def hook(p: Tensor) -> None:
            owner = state()
            if owner is not None and p.grad is not None:
                owner.main_grad[offset : offset + p.numel()].add_(p.grad.reshape(-1))
                p.grad = None

        return hook

    def begin_step(self) -> None:
        self.main_grad.zero_()

    def finish_step(
        self, local_loss: Tensor, grad_clip: float | None, update: bool = True
    ) -> tuple[float, float, bool]:
        if self.zero_stage == 0:
            if dist.is_initialized() and dist.get_world_size() > 1:
                dist.all_reduce(self.main_grad, op=dist.ReduceOp.SUM)
            sq = float(_sq_norm(self.main_grad))
        else:
            _reduce_scatter_flat(self.grad_shard, self.main_grad)
            sq_t = _sq_norm(self.grad_shard).reshape(1)
            dist.all_reduce(sq_t, op=dist.ReduceOp.SUM)
            sq = float(sq_t)
        loss = _global_loss(local_loss) if dist.is_initialized() else float(local_loss)
        norm = math.sqrt(sq)
        finite = math.isfinite(loss) and math.isfinite(norm)
        if finite and update:
            coef = _clip_coef(norm, grad_clip)
            if coef < 1.0:
                self.grad_shard.mul_(coef)
            self.optimizer.step()
            self._publish()
        return loss, norm, finite

    def _publish(self) -> None:
        """The updated master weights into the compute-dtype parameters."""
        if self.master is self.flat:
            return
        if self.zero_stage == 0:
            self.flat.copy_(self.master)
            return
        _all_gather_flat(self.flat, self.master.detach().to(self.flat.dtype))

    def gradients(self) -> Tensor:
        if self.zero_stage == 0:
            return self.main_grad[: self.numel].float().clone()
        full = torch.empty(
            self.shard * self.world, dtype=self.grad_shard.dtype, device=self.grad_shard.device
        )
        _all_gather_flat(full, self.grad_shard)
        return full[: self.numel].float()

    def static_bytes(self) -> int:
        held = [self.flat, self.main_grad]
        if self.master is not self.flat:
            held.append(self.master)
        if self.grad_shard is not self.main_grad:
            held.append(self.grad_shard)
        return _tensor_bytes(held) + optimizer_state_bytes(self.optimizer)


class FSDPState(TrainingState):
    """ZeRO stage 2 or 3 by FSDP2 (see the module docstring). Build it with
    `build_training_state`: the model must be sharded before its weights are materialised."""

    def __init__(
        self,
        model: RuntimeModel,
        zero_stage: int,
        policy: PrecisionPolicy,
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ) -> None:
        self.model = model
        self.zero_stage = zero_stage
        self.policy = policy
        self.lockstep = True
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            self.params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay
        )

    def begin_step(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def _local_grads(self) -> list[Tensor]:
        out = []
        for p in self.params:
            if p.grad is not None:
                g = p.grad
                out.append(g.to_local() if hasattr(g, "to_local") else g)
        return out

    def finish_step(
        self, local_loss: Tensor, grad_clip: float | None, update: bool = True
    ) -> tuple[float, float, bool]:
        # FSDP reduce-scattered every micro-batch's gradients already (summed over the world).
        grads = self._local_grads()
        device = local_loss.device
        sq_t = torch.zeros(1, dtype=torch.float64, device=device)
        for g in grads:
            sq_t += _sq_norm(g)
        dist.all_reduce(sq_t, op=dist.ReduceOp.SUM)
        loss = _global_loss(local_loss)
        norm = math.sqrt(float(sq_t))
        finite = math.isfinite(loss) and math.isfinite(norm)
        if finite and update:
            coef = _clip_coef(norm, grad_clip)
            if coef < 1.0:
                for g in grads:
                    g.mul_(coef)
            self.optimizer.step()
        return loss, norm, finite

    def gradients(self) -> Tensor:
        parts = []
        for p in self.params:
            g = p.grad
            if g is None:
                parts.append(
                    torch.zeros(p.numel(), dtype=torch.float32, device=self.model.device())
                )
                continue
            full = g.full_tensor() if hasattr(g, "full_tensor") else g
            parts.append(full.reshape(-1).float())
        return torch.cat(parts)

    def static_bytes(self) -> int:
        local = [p.to_local() if hasattr(p, "to_local") else p for p in self.params]
        return (
            _tensor_bytes(local)
            + _tensor_bytes(self._local_grads())
            + optimizer_state_bytes(self.optimizer)
        )


def _shard_fsdp(
    model: RuntimeModel, zero_stage: int, policy: PrecisionPolicy, device: torch.device
) -> None:
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    mp = MixedPrecisionPolicy(
        param_dtype=DTYPES[policy.compute],
        reduce_dtype=DTYPES[policy.grad],
        cast_forward_inputs=False,
    )
    fsdp_units = getattr(model, "fsdp_units", None)
    if callable(fsdp_units):
        units = list(fsdp_units())  # a library model: its own blocks
    else:
        units = list(getattr(model, "layers", None) or getattr(model, "pairs", None) or [])
    for unit in units:
        fully_shard(unit, mesh=mesh, mp_policy=mp, reshard_after_forward=zero_stage == 3)
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=zero_stage == 3)
    for module in (*units, model):
        # Sum over ranks: every micro-batch's loss is already divided by the step's token count.
        module.set_gradient_divide_factor(1.0)  # type: ignore[operator]
        if hasattr(module, "set_force_sum_reduction_for_comms"):
            # a plain SUM (gloo has no pre-multiplied sum; the factor is 1 anyway)
            module.set_force_sum_reduction_for_comms(True)


def build_training_state(
    spec: ModelSpec,
    seed: int,
    device: torch.device,
    lr: float,
    zero_stage: int | None = None,
    attention: str = "auto",
    weight_decay: float = 0.0,
    compute: torch.dtype | None = None,
) -> TrainingState:
    """The model of ``spec`` on ``device`` with its training states for ZeRO stage
    ``zero_stage`` (`dcp_bench.train_policy.DEFAULT_ZERO_STAGE` when None), in the precision
    policy of its compute dtype (`compute_dtype`: the spec's dtype on CUDA, fp32 on CPU). The
    weights are those of ``build_model(spec, seed)`` on every rank and for every stage.
    Stages 1-3 need torch.distributed initialised (their world is every rank). ``compute``
    overrides the compute dtype (bf16 on the CPU checks the mixed-precision path there)."""
    stage = check_zero_stage(DEFAULT_ZERO_STAGE if zero_stage is None else zero_stage)
    dtype = compute or compute_dtype(spec, device)
    name = {v: k for k, v in DTYPES.items()}[dtype]
    policy = precision_policy(name)
    if stage >= 1 and not dist.is_initialized():
        raise ConfigError(
            f"ZeRO stage {stage} shards over the world: initialise torch.distributed first"
        )
    if lockstep(stage):
        if spec.tie_embeddings and not spec.library:
            # the sharded model is materialised shard by shard: a tie would be lost silently
            raise ConfigError(
                f"model {spec.name!r}: tied embeddings under ZeRO stage {stage} (sharded "
                "parameters) are not supported by the runtime's own modules; use stage 0 or 1"
            )
        model = library_empty_model(spec) or build_empty_model(spec)
        _shard_fsdp(model, stage, policy, device)
        model = model.to_empty(device=device)
        model.init_weights(seed)  # fp32 shards: the master weights
        model.set_attention(select_attention_kernel(device, dtype, spec.head_dim, attention))
        return FSDPState(model, stage, policy, lr, weight_decay=weight_decay)
    # fp32 first: the master weights, then the compute-dtype model rounded from them.
    model = build_model(
        spec,
        seed=seed,
        device=device,
        dtype=torch.float32,
        attention=attention,
        empty=library_empty_model(spec),
    )
    master = None
    if dtype != torch.float32:
        params = list(model.parameters())
        world, rank = (dist.get_world_size(), dist.get_rank()) if stage == 1 else (1, 0)
        shard = -(-sum(p.numel() for p in params) // world)
        master = flat_slice(
            params, rank * shard, (rank + 1) * shard, torch.float32
        )  # this rank's fp32 slice
        del params
        model = model.to(dtype=dtype)
        model.set_attention(select_attention_kernel(device, dtype, spec.head_dim, attention))
    return FlatState(model, stage, policy, lr, master=master, weight_decay=weight_decay)
