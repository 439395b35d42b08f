"""Data-Centric Parallel for decoder-only causal LMs of ``transformers`` (the families of
`MODEL_TYPES`), through the library's public extension points only.

- Attention: `ulysses_attention` is registered with ``transformers.AttentionInterface`` under
  `ATTENTION` and selected with ``model.set_attn_implementation``. The model computes q, k, v and
  applies its rotary positions as always; the function switches them from sequence sharding to
  head sharding over the micro-batch's SP group (the runtime's Ulysses exchange,
  `dcp_bench.runtime.attention`), runs packed variable-length causal attention, and switches back;
  a micro-batch on ring or hybrid SP runs ring attention (`dcp_bench.runtime.ring`) for its ring
  part instead (`dcp_bench.runtime.models.text_sp_attention`). Every keyword argument the library
  passes is honoured (scaling, soft-capping, sliding windows, sinks: `eager_varlen_attention`, on
  Ulysses SP) or refused by name (`check_attention_arguments`; soft-capping, windows and sinks on
  a ring too), and one probe forward at construction (`probe_attention`) checks every layer's
  before the first step.
  No attention mask is built: the library skips mask creation for a registered function without a
  mask function, and the packed segments come with the micro-batch.
- Packed samples: one micro-batch is one row of packed samples (batch size 1), with
  ``position_ids`` that restart at 0 for every sample, as the library's packed path expects;
  under Ulysses SP each rank holds a contiguous chunk of every sample (`make_text_shard`; under
  ring SP two load-balanced chunks), so its position
  ids continue where the previous rank's chunk ends and the rotary positions are those of the
  whole sample. The segment lengths (the cumulative lengths of the library's varlen path) travel
  to the attention function as keyword arguments of the forward call, which the library passes
  through to every attention call.
- Loss: the summed next-token cross-entropy over this rank's real tokens, from the decoder's
  hidden states and the model's output embedding, in chunks (`chunked_cross_entropy_sum`: no full
  logits). Models whose logits are more than ``hidden @ lm_head.T`` (soft-capping, scaling, a
  head bias) are refused.
- Activation checkpointing: the model's own switch (``activation_checkpointing_enable``, or
  ``gradient_checkpointing_enable`` on older releases). It is all-or-nothing, so a micro-batch the
  plan recomputes in part (``0 < ckpt_layers < layers``) recomputes every layer: more time, never
  more memory than planned.

`CausalLMAdapter` wraps a model the user built (the integration API); `TransformersCausalLM` is
the runtime model ``model=hf`` trains (built from the spec's library config).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from dcp_bench.archs.llama import TRANSFORMERS_FAMILIES
from dcp_bench.cost.specs import ModelSpec, model_spec
from dcp_bench.errors import ConfigError
from dcp_bench.runtime.attention import (
    PORTABLE,
    SINGLE,
    AttentionKernel,
    SPContext,
    check_heads,
    kv_heads_for_sp,
    repeat_kv,
    select_attention_kernel,
    ulysses_heads_to_seq,
    ulysses_qkv_to_heads,
    varlen_attention,
)
from dcp_bench.runtime.integrations import require
from dcp_bench.runtime.lm_loss import chunked_cross_entropy_sum
from dcp_bench.runtime.models import (
    RuntimeModel,
    TextShard,
    _local_rows,
    make_text_shard,
    text_sp_attention,
)
from dcp_bench.train_policy import LOGITS_CHUNK_TOKENS

ATTENTION = "dcp_ulysses"
# Config attributes that change the logits beyond hidden @ lm_head.T (Gemma, Cohere, Granite).
_LOGIT_OPTIONS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


# Keyword arguments transformers passes to an attention function that DCP implements (values
# checked in `check_attention_arguments`), and those that only carry the library's bookkeeping
# (rotary positions are already applied to q and k; the packing comes with the micro-batch; no
# cache is used). Any other argument with a value is refused by name: ignoring one silently
# changes the model (GPT-OSS's ``s_aux`` sinks once trained to zero gradient that way).
IMPLEMENTED_ARGUMENTS = ("scaling", "softcap", "sliding_window", "s_aux", "dropout", "is_causal")
BOOKKEEPING_ARGUMENTS = ("position_ids", "use_cache", "cache_position", "output_attentions")
# Decoder families registered in dcp_bench.archs (`TRANSFORMERS_FAMILIES`): every layer mixes
# tokens only through the attention function, and their attention arguments above were checked
# equal-gradient against the library's eager attention (tests/test_integration_attention_args.py).
# Others are refused: a family may mix tokens outside attention (state-space or convolution
# layers) or build masks DCP never sees.
MODEL_TYPES = tuple(TRANSFORMERS_FAMILIES)


def check_attention_arguments(name: str, kwargs: dict[str, Any]) -> None:
    """`ConfigError` naming the first attention argument in ``kwargs`` that `ulysses_attention`
    would not honour exactly (``name``: the attention module, for the message)."""
    for arg, value in kwargs.items():
        if arg.startswith("dcp_") or arg in BOOKKEEPING_ARGUMENTS:
            continue
        if arg == "dropout":
            if value:
                raise ConfigError(
                    f"{name}: attention argument dropout={value} (attention dropout in training) "
                    f"is not supported by {ATTENTION!r}; set config.attention_dropout=0"
                )
        elif arg == "is_causal":
            if value is False:
                raise ConfigError(
                    f"{name}: attention argument is_causal=False; {ATTENTION!r} serves "
                    "decoder-only (causal) attention"
                )
        elif arg == "attention_mask":
            if value is not None:
                raise ConfigError(
                    f"{name}: attention argument attention_mask (a mask the model built itself) "
                    f"is not supported by {ATTENTION!r}, which masks packed samples apart"
                )
        elif arg not in IMPLEMENTED_ARGUMENTS and value is not None and value is not False:
            raise ConfigError(
                f"{name}: attention argument {arg}={_short(value)} is not implemented by "
                f"{ATTENTION!r}; refusing rather than ignoring it (implemented: "
                f"{', '.join(IMPLEMENTED_ARGUMENTS)})"
            )


def _short(value: Any) -> str:
    if isinstance(value, Tensor):
        return f"<tensor {tuple(value.shape)}>"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def eager_varlen_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    seg_lens: list[int],
    valid: list[int],
    scale: float,
    softcap: float | None = None,
    window: int | None = None,
    sinks: Tensor | None = None,
) -> Tensor:
    """Causal attention over packed segments, computed as the library's eager attention does:
    q (T, H, D), k and v (T, KV, D) -> (T, H, D), padding rows 0. ``softcap``: scores become
    ``softcap * tanh(scores / softcap)``; ``window``: query i sees keys j with i - j < window;
    ``sinks`` (H,): one extra logit per head in the softmax whose probability is dropped."""
    heads, kv = q.shape[1], k.shape[1]
    outs: list[Tensor] = []
    start = 0
    for seg, n in zip(seg_lens, valid):
        if n > 0:
            qs = q[start : start + n].transpose(0, 1)
            ks, vs = (repeat_kv(t[start : start + n], heads // kv, 1) for t in (k, v))
            ks, vs = ks.transpose(0, 1), vs.transpose(0, 1)
            scores = torch.matmul(qs, ks.transpose(1, 2)) * scale
            if softcap is not None:
                scores = torch.tanh(scores / softcap) * softcap
            i = torch.arange(n, device=q.device)
            allowed = i[:, None] >= i[None, :]
            if window is not None:
                allowed &= (i[:, None] - i[None, :]) < window
            scores = scores.masked_fill(~allowed, float("-inf"))
            if sinks is not None:
                sink = sinks.to(scores.dtype).reshape(heads, 1, 1).expand(heads, n, 1)
                scores = torch.cat([scores, sink], dim=-1)
            probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
            if sinks is not None:
                probs = probs[..., :-1]
            outs.append(torch.matmul(probs, vs).transpose(0, 1))
        if seg > n:
            outs.append(q.new_zeros((seg - n, heads, q.shape[2])))
        start += seg
    return torch.cat(outs, dim=0)


def ulysses_attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """The attention function registered as `ATTENTION`: query (1, H, T_local, D), key and value
    (1, KV, T_local, D) of this rank's tokens, rotary positions applied -> (1, T_local, H, D).
    The micro-batch arrives as keyword arguments: ``dcp_shard`` (a `TextShard`), ``dcp_sp`` (its
    `SPContext`) and ``dcp_kernel`` (the packed-attention kernel). Scaling, soft-capping, sliding
    windows and attention sinks (``s_aux``) are honoured; any other argument is refused by name
    (`check_attention_arguments`)."""
    shard: TextShard | None = kwargs.get("dcp_shard")
    sp: SPContext = kwargs.get("dcp_sp", SINGLE)
    kernel: AttentionKernel = kwargs.get("dcp_kernel", PORTABLE)
    name = type(module).__name__
    if shard is None:
        raise ConfigError(
            f"attention {ATTENTION!r} of {name} ran without a DCP micro-batch: run the model "
            "through CausalLMAdapter.loss_sum (or set another attn_implementation)"
        )
    check_attention_arguments(
        name, {**kwargs, "dropout": dropout, "attention_mask": attention_mask}
    )
    if not getattr(module, "is_causal", True):
        raise ConfigError(f"{name} is not causal; {ATTENTION!r} serves decoder-only models")
    if "dcp_calls" in kwargs:
        kwargs["dcp_calls"].append(name)
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))
    heads, kv, dim = q.shape[1], k.shape[1], q.shape[2]
    sinks: Tensor | None = kwargs.get("s_aux")
    softcap = kwargs.get("softcap")
    window = kwargs.get("sliding_window")
    if window is not None and max(shard.valid, default=0) <= int(window):
        window = None  # no sample is longer than the window: full causal attention is the same
    if shard.ring is not None:
        # ring attention implements plain causal attention only: refuse the rest by name
        extra = [
            n
            for n, val in (("softcap", softcap), ("sliding_window", window), ("s_aux", sinks))
            if val is not None
        ]
        if extra:
            raise ConfigError(
                f"attention argument(s) {', '.join(extra)} of {name} are not implemented on ring "
                f"or hybrid sequence parallelism ({sp.kind}); use Ulysses SP for this model"
            )
        if scaling is not None and not math.isclose(scaling, dim**-0.5, rel_tol=1e-12):
            q = q * (scaling * math.sqrt(dim))  # the kernel scales by 1/sqrt(D)
        return text_sp_attention(q, k, v, shard, sp, kernel).unsqueeze(0), None
    if sp.size > 1:
        wanted = kv_heads_for_sp(heads, kv, sp.size)
        k, v = repeat_kv(k, wanted // kv, 1), repeat_kv(v, wanted // kv, 1)
        q, k, v = ulysses_qkv_to_heads(q, k, v, sp, shard.full_from_gathered)
        if sinks is not None:  # this rank now holds query heads [r H/sp, (r+1) H/sp)
            sinks = sinks.reshape(heads).chunk(sp.size)[sp.rank]
    if softcap is not None or window is not None or sinks is not None:
        scale = dim**-0.5 if scaling is None else float(scaling)
        out = eager_varlen_attention(
            q, k, v, shard.seg_lens, shard.valid, scale, softcap,
            None if window is None else int(window), sinks,
        )  # fmt: skip
    else:
        if scaling is not None and not math.isclose(scaling, dim**-0.5, rel_tol=1e-12):
            q = q * (scaling * math.sqrt(dim))  # the kernel scales by 1/sqrt(D)
        out = varlen_attention(q, k, v, shard.seg_lens, shard.valid, causal=True, kernel=kernel)
    return ulysses_heads_to_seq(out, sp, shard.gathered_from_full).unsqueeze(0), None


def prepare_causal_lm(model: Any) -> Any:
    """Register `ulysses_attention` and select it on ``model`` (in place); `ConfigError` naming the
    reason for a model it cannot serve."""
    tf = require("transformers")
    name = type(model).__name__
    if not isinstance(model, tf.PreTrainedModel):
        raise ConfigError(
            f"{name} is not a transformers PreTrainedModel; wrap it as a "
            "dcp_bench.runtime.models.RuntimeModel instead"
        )
    config = model.config
    if getattr(config, "is_encoder_decoder", False):
        raise ConfigError(f"{name} is an encoder-decoder; expected a decoder-only causal LM")
    if not getattr(model, "_supports_attention_backend", False):
        raise ConfigError(
            f"{name}: its attention does not go through transformers' AttentionInterface (the "
            "model class does not support attention backends), so Ulysses attention cannot reach "
            "it"
        )
    head = model.get_output_embeddings()
    if not isinstance(head, nn.Linear) or head.bias is not None:
        raise ConfigError(
            f"{name}: output embedding {type(head).__name__} "
            f"{'with a bias ' if getattr(head, 'bias', None) is not None else ''}"
            "; expected a bias-free nn.Linear LM head"
        )
    for option in _LOGIT_OPTIONS:
        if getattr(config, option, None) not in (None, 1, 1.0):
            raise ConfigError(
                f"{name}: config.{option}={getattr(config, option)} changes the logits; "
                "the chunked loss computes hidden @ lm_head.T only"
            )
    model_type = getattr(config, "model_type", None)
    if model_type not in MODEL_TYPES:
        raise ConfigError(
            f"{name}: model_type={model_type!r} is not among the families checked equal-gradient "
            f"under DCP ({', '.join(MODEL_TYPES)}); another family may mix tokens outside "
            "attention or pass attention arguments DCP does not implement"
        )
    tf.AttentionInterface.register(ATTENTION, ulysses_attention)
    model.set_attn_implementation(ATTENTION)
    if getattr(config, "_attn_implementation", None) != ATTENTION:
        raise ConfigError(f"{name}: set_attn_implementation({ATTENTION!r}) did not take effect")
    probe_attention(model)
    return model


def probe_attention(model: Any) -> None:
    """One forward of a 2-sample packed row (no gradient, training mode, RNG state kept) through
    `ulysses_attention`, so every attention argument every layer passes is checked before the
    first step; `ConfigError` naming a refused argument, or when not every layer's attention
    reached the registered function."""
    name = type(model).__name__
    layers = int(getattr(model.config, "num_hidden_layers", 0))
    calls: list[str] = []
    device = next(model.parameters()).device
    shard = make_text_shard(
        np.array([0, 1]), np.array([3, 2]), int(model.config.vocab_size), SINGLE, 0, device
    )
    was_training = model.training
    model.train()  # the library passes attention dropout only in training
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            model.base_model(
                input_ids=shard.input_ids[None],
                position_ids=shard.positions[None],
                use_cache=False,
                dcp_shard=shard,
                dcp_sp=SINGLE,
                dcp_kernel=PORTABLE,
                dcp_calls=calls,
            )
    finally:
        model.train(was_training)
    if len(calls) != layers:
        raise ConfigError(
            f"{name}: {len(calls)} of {layers} layers called attention {ATTENTION!r}; the others "
            "mix tokens in a way DCP does not shard"
        )


def set_checkpointing(model: Any, on: bool) -> None:
    """The model's own activation-checkpointing switch (non-reentrant checkpoints)."""
    if on:
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable({"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
    elif hasattr(model, "activation_checkpointing_disable"):
        model.activation_checkpointing_disable()
    else:
        model.gradient_checkpointing_disable()


def spec_of(model: Any, name: str | None = None, dtype: str = "bf16") -> ModelSpec:
    """The cost model's spec of a transformers model (from its config); `ConfigError` saying how
    to pass one for a family the adapter trains but the cost model does not price."""
    config = model.config.to_dict()
    try:
        return model_spec(
            name or str(config.get("model_type")),
            library="transformers",
            config=config,
            dtype=dtype,
        )
    except ConfigError as exc:
        raise ConfigError(
            f"{type(model).__name__}: no cost-model spec from its config ({exc}); pass "
            "CausalLMAdapter(..., spec=...) with a ModelSpec the planner prices it as, e.g. "
            "model_spec('hf', library='transformers', config={...the sizes, model_type='llama'})"
        ) from None


class CausalLMAdapter:
    """A transformers causal LM as DataCentricParallel runs it: ``make_inputs`` builds this rank's
    packed shard of a micro-batch, ``loss_sum`` its summed loss. ``sample_tokens(sample_id,
    length)``: the sample's length+1 token ids (inputs are the first ``length``, targets the last
    ``length``); synthetic ids seeded by (seed, sample id) when None. ``spec``: the cost model's
    spec (derived from the model's config when None)."""

    def __init__(
        self,
        model: Any,
        sample_tokens: Callable[[int, int], Tensor] | None = None,
        spec: ModelSpec | None = None,
        kernel: AttentionKernel | None = None,
        loss_chunk_tokens: int = LOGITS_CHUNK_TOKENS,
    ) -> None:
        self.model: Any = prepare_causal_lm(model)
        self.spec = spec if spec is not None else spec_of(model)
        self.sample_tokens = sample_tokens
        self.kernel = kernel
        self.loss_chunk_tokens = loss_chunk_tokens
        self._checkpointing: bool | None = None

    def _kernel(self, ref: Tensor) -> AttentionKernel:
        if self.kernel is None:
            self.kernel = select_attention_kernel(ref.device, ref.dtype, self.spec.head_dim)
        return self.kernel

    def make_inputs(
        self, sample_ids: Any, tokens: Any, frames: Any, sp: SPContext, seed: int
    ) -> TextShard:
        """This rank's shard of the packed micro-batch (`make_text_shard`): the samples' token ids
        from ``sample_tokens``, or synthetic ids drawn per (seed, sample id) as the runtime's own
        text model does."""
        del frames
        device = next(self.model.parameters()).device
        return make_text_shard(
            sample_ids,
            tokens,
            int(self.model.config.vocab_size),
            sp,
            seed,
            device,
            self.sample_tokens,
        )

    def loss_sum(self, inputs: TextShard, sp: SPContext = SINGLE, ckpt_layers: int = 0) -> Tensor:
        """Summed next-token loss over this rank's real tokens; every layer recomputed when the plan
        recomputes any (see the module docstring)."""
        if sp.ulysses_degree > 1:
            check_heads(int(self.model.config.num_attention_heads), sp.ulysses_degree)
        on = ckpt_layers > 0
        if on != self._checkpointing:
            set_checkpointing(self.model, on)
            self._checkpointing = on
        decoder = self.model.base_model
        head = self.model.get_output_embeddings()
        hidden = decoder(
            input_ids=inputs.input_ids[None],
            position_ids=inputs.positions[None],
            use_cache=False,
            dcp_shard=inputs,
            dcp_sp=sp,
            dcp_kernel=self._kernel(head.weight),
        ).last_hidden_state[0]
        return chunked_cross_entropy_sum(hidden, head.weight, inputs.labels, self.loss_chunk_tokens)


def build_causal_lm(spec: ModelSpec) -> Any:
    """The transformers model of a ``model=hf`` spec (weights as the library initialises them under
    the ambient RNG and device)."""
    tf = require("transformers")
    cfg = dict(spec.library_config)
    config = tf.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    return tf.AutoModelForCausalLM.from_config(config)


class TransformersCausalLM(RuntimeModel):
    """The runtime model of ``model=hf``: the library's causal LM built from the spec's config,
    trained through `CausalLMAdapter`. Weights: the library's own initialisation under
    ``torch.manual_seed(seed)`` on CPU, identical on every rank (and sharded rows under FSDP)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        self.lm = build_causal_lm(spec)
        self.adapter = CausalLMAdapter(self.lm, spec=spec)

    def init_rule(self, name: str) -> tuple[str, float]:
        raise NotImplementedError("weights come from the library's initialisation (init_weights)")

    def init_weights(self, seed: int) -> None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(seed))
            with torch.device("cpu"):
                ref = build_causal_lm(self.spec)
        ref_state = dict(ref.named_parameters()) | dict(ref.named_buffers())
        with torch.no_grad():
            for name, t in [*self.lm.named_parameters(), *self.lm.named_buffers()]:
                local = t.to_local() if hasattr(t, "to_local") else t
                full = ref_state[name].to(device=local.device, dtype=local.dtype)
                if local.shape != full.shape:
                    full = _local_rows(t, full)
                local.copy_(full)

    def set_attention(self, kernel: AttentionKernel) -> None:
        self._attention = kernel
        self.adapter.kernel = kernel

    def fsdp_units(self) -> list[nn.Module]:
        """The modules FSDP2 shards one by one (ZeRO stages 2 and 3,
        `dcp_bench.runtime.training`): the decoder layers, found by the classes the model names in
        its ``_no_split_modules`` (the library's list of blocks that must stay whole); the rest
        (embeddings, final norm, LM head) is sharded with the root."""
        names = set(getattr(self.lm, "_no_split_modules", None) or ())
        units = [m for m in self.lm.modules() if type(m).__name__ in names]
        layers = int(getattr(self.lm.config, "num_hidden_layers", 0))
        if len(units) != layers:
            raise ConfigError(
                f"{type(self.lm).__name__}: {len(units)} modules of its _no_split_modules "
                f"({', '.join(sorted(names)) or 'none'}) for {layers} layers; expected one per "
                "decoder layer to shard with FSDP2"
            )
        return units

    def make_inputs(
        self, sample_ids: Any, tokens: Any, frames: Any, sp: SPContext, seed: int
    ) -> TextShard:
        return self.adapter.make_inputs(
            np.asarray(sample_ids), np.asarray(tokens), frames, sp, seed
        )

    def forward(self, inputs: TextShard, sp: SPContext = SINGLE, ckpt_layers: int = 0) -> Tensor:
        return self.adapter.loss_sum(inputs, sp, ckpt_layers)
