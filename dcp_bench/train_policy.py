"""What a training rank holds, and in which dtype: the one source the runtime and the cost models
both read.

Mixed precision as large-model trainers run it (Megatron-LM's distributed optimizer, FSDP2's
``MixedPrecisionPolicy``): the forward and backward compute in the model's dtype (bf16 for the
real sizes), while the optimizer keeps fp32 master weights and fp32 AdamW moments, and gradients
are accumulated over micro-batches and reduced across ranks in fp32. A model whose dtype is fp32
(the CPU test models) needs no separate master copy: the parameters are the master weights.

ZeRO stages (over the data-parallel world: every rank holds a model replica, sequence parallelism
shards activations, not weights), as the runtime implements them
(``dcp_bench/runtime/training.py``):

- 0: everything replicated; one fp32 all-reduce of the gradients per step;
- 1: fp32 master weights and AdamW moments sharded; one fp32 reduce-scatter of the gradients and
  one all-gather of the updated compute-dtype parameters per step (no collective inside a
  micro-batch, so ranks may run different numbers of micro-batches);
- 2 and 3: FSDP2 (``fully_shard``) per layer: parameters stored as fp32 shards and all-gathered in
  the compute dtype layer by layer (stage 3 frees them after each layer's forward, stage 2 keeps
  them until the backward), gradients reduce-scattered in fp32 after every micro-batch's backward.
  Those collectives span the world inside every micro-batch, so every rank runs the same number
  of micro-batches per plan round (ranks with fewer run empty ones): the runtime's "lockstep".

Nothing here imports torch: the planners and cost models read it too.
"""

from __future__ import annotations

from dataclasses import dataclass

from dcp_bench.errors import ConfigError

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}

# ZeRO stage of a run that names none (``cost.zero_stage``): optimizer states sharded, the
# DeepSpeed / Open-Sora default, and the stage at which ranks need not run in lockstep.
DEFAULT_ZERO_STAGE = 1
ZERO_STAGES = (0, 1, 2, 3)

# The LM loss is computed over this many tokens per rank at a time, so at most one chunk of
# logits lives at once (forward and backward).
LOGITS_CHUNK_TOKENS = 4096

# Gathered layers an FSDP rank holds at once beside its shards: the layer in use and the one
# prefetched.
GATHERED_LAYERS = 2


@dataclass(frozen=True)
class PrecisionPolicy:
    """The dtype of every training state and collective (names: fp32, bf16, fp16)."""

    compute: str  # parameters as forward/backward see them, activations, SP all-to-alls
    master: str = "fp32"  # the optimizer's copy of the weights
    grad: str = "fp32"  # gradient accumulation over micro-batches and the cross-rank reduction
    optimizer_state: str = "fp32"  # AdamW's two moments

    def __post_init__(self) -> None:
        for name in ("compute", "master", "grad", "optimizer_state"):
            value = getattr(self, name)
            if value not in DTYPE_BYTES:
                raise ConfigError(
                    f"precision {name}={value!r}; expected one of {', '.join(DTYPE_BYTES)}"
                )

    @property
    def separate_master(self) -> bool:
        """Whether the optimizer keeps its own copy of the weights (compute dtype != master)."""
        return self.compute != self.master

    def bytes(self, part: str) -> int:
        """Bytes per element of ``part`` (compute, master, grad, optimizer_state)."""
        return DTYPE_BYTES[getattr(self, part)]


def precision_policy(model_dtype: str) -> PrecisionPolicy:
    """The policy of a model whose ``ModelSpec.dtype`` (the compute dtype) is ``model_dtype``."""
    if model_dtype not in DTYPE_BYTES:
        raise ConfigError(f"model dtype {model_dtype!r}; expected one of {', '.join(DTYPE_BYTES)}")
    return PrecisionPolicy(compute=model_dtype)


def check_zero_stage(stage: int) -> int:
    if stage not in ZERO_STAGES:
        raise ConfigError(
            f"zero_stage={stage!r}; expected one of {', '.join(map(str, ZERO_STAGES))}"
        )
    return stage


def lockstep(zero_stage: int) -> bool:
    """Whether this stage needs a collective over the world inside every micro-batch (FSDP)."""
    return check_zero_stage(zero_stage) >= 2


def static_state_bytes(
    params: int, layer_params: int, world: int, zero_stage: int, policy: PrecisionPolicy
) -> dict[str, float]:
    """Bytes per rank of parameters, gradients and optimizer states as the runtime holds them.

    - ``params``: the parameters the forward reads (stage <= 1: the whole model in the compute
      dtype; stage 2: the whole model in the compute dtype while a micro-batch runs, plus nothing
      else since the fp32 shard is counted as master; stage 3: the fp32 shards are the parameters,
      counted as master);
    - ``grads``: the fp32 gradient accumulator (stages 0-1: whole; 2-3: a shard);
    - ``optimizer``: the master weights (when separate, or the fp32 shards under FSDP) and the two
      AdamW moments, sharded from stage 1;
    - ``params_gathered`` (stage 3): the gathered layers in use (`GATHERED_LAYERS`).
    """
    check_zero_stage(zero_stage)
    W = max(1, int(world))
    P = float(params)
    c, m, g, o = (policy.bytes(k) for k in ("compute", "master", "grad", "optimizer_state"))
    if zero_stage <= 1:
        shard = W if zero_stage == 1 else 1
        master = m if policy.separate_master or zero_stage == 1 else 0
        # With fp32 compute and stage 0 the parameters are the master weights and the gradient
        # accumulator is the parameters' own .grad.
        out = {"params": P * c, "grads": P * g, "optimizer": P * (master + 2 * o) / shard}
        if zero_stage == 1:
            out["grads"] += P * g / W  # the reduce-scatter's output shard
        return out
    # FSDP: the sharded parameters are the fp32 master weights.
    out = {"params": 0.0, "grads": P * g / W, "optimizer": P * (m + 2 * o) / W}
    if zero_stage == 2:
        out["params"] = P * c
    else:
        out["params_gathered"] = GATHERED_LAYERS * float(layer_params) * c
    return out


def grad_sync_bytes(params: int, zero_stage: int, policy: PrecisionPolicy) -> float:
    """Bytes per rank of the once-per-step gradient synchronisation, before the ring's (W-1)/W
    share: stage 0, one fp32 all-reduce (2 x the gradient bytes); stage 1, one fp32 reduce-scatter
    of the gradients plus one all-gather of the compute-dtype parameters; stages 2-3, none (their
    collectives run in every micro-batch: `fsdp_pass_bytes`)."""
    check_zero_stage(zero_stage)
    P = float(params)
    if zero_stage == 0:
        return 2.0 * P * policy.bytes("grad")
    if zero_stage == 1:
        return P * (policy.bytes("grad") + policy.bytes("compute"))
    return 0.0


def fsdp_pass_bytes(params: int, zero_stage: int, policy: PrecisionPolicy) -> float:
    """Bytes per rank FSDP moves in every micro-batch pass (stages 2-3), before the (W-1)/W
    share: the compute-dtype parameter all-gather (stage 3 gathers again for the backward) and the
    fp32 gradient reduce-scatter. 0 for stages 0-1."""
    check_zero_stage(zero_stage)
    if zero_stage <= 1:
        return 0.0
    gathers = 2 if zero_stage == 3 else 1
    return float(params) * (gathers * policy.bytes("compute") + policy.bytes("grad"))


def logits_chunk_bytes(chunk_tokens: int, vocab: int, policy: PrecisionPolicy) -> float:
    """Peak bytes of one chunk of the chunked LM loss: the compute-dtype logits and their fp32
    copy (the softmax is taken in place in the fp32 copy)."""
    return float(chunk_tokens) * float(vocab) * (policy.bytes("compute") + 4)
