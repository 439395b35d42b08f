"""Runtime models of other libraries: the one ``model=hf`` trains (built from the spec's library
config), and a user's own library model behind its adapter (the integration API)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.distributed.fsdp import FSDPModule

from dcp_bench.cost.specs import ModelSpec
from dcp_bench.errors import ConfigError
from dcp_bench.runtime.attention import SINGLE, SPContext
from dcp_bench.runtime.integrations.diffusers_video import WanAdapter
from dcp_bench.runtime.integrations.transformers_lm import CausalLMAdapter, TransformersCausalLM
from dcp_bench.runtime.models import RuntimeModel


def library_empty_model(spec: ModelSpec) -> RuntimeModel | None:
    """The `RuntimeModel` that trains ``spec``'s library model, on the meta device (materialise it
    with ``build_model(spec, ..., empty=...)``); None for the runtime's own models."""
    if not spec.library:
        return None
    if spec.library == "transformers":
        with torch.device("meta"):
            return TransformersCausalLM(spec)
    raise ConfigError(f"model {spec.name!r}: library {spec.library!r}; expected transformers")


def adapter_for(model: nn.Module) -> Any | None:
    """The adapter of a library model DataCentricParallel recognises (a transformers causal LM, a
    diffusers Wan transformer), or None. Its own checks raise `ConfigError` for a model of a
    known library that it cannot serve."""
    modules = {c.__module__.split(".", 1)[0] for c in type(model).__mro__}
    if "transformers" in modules:
        return CausalLMAdapter(model)
    if "diffusers" in modules:
        return WanAdapter(model)
    return None


class AdaptedModel(RuntimeModel):
    """A library model and its adapter as the runtime's executor runs them: ``make_inputs`` and
    the loss (``forward``) are the adapter's; the parameters are the model's."""

    def __init__(self, model: nn.Module, adapter: Any) -> None:
        sharded = [n for n, m in model.named_modules() if isinstance(m, FSDPModule)]
        if sharded:
            raise ConfigError(
                f"{type(model).__name__} is sharded with fully_shard (FSDP2) at "
                f"{sharded[0] or 'its root'!r}; DataCentricParallel all-reduces whole gradients "
                "once per step, so pass the unsharded model, or train with FSDP2 through the "
                "runtime (dcp-bench train model=hf cost.zero_stage=3)"
            )
        super().__init__()
        self.inner = model
        self.adapter = adapter
        self.spec = adapter.spec

    def init_rule(self, name: str) -> tuple[str, float]:
        raise NotImplementedError("an adapted model keeps the weights its owner gave it")

    def make_inputs(
        self, sample_ids: Any, tokens: Any, frames: Any, sp: SPContext, seed: int
    ) -> Any:
        return self.adapter.make_inputs(sample_ids, tokens, frames, sp, seed)

    def forward(self, inputs: Any, sp: SPContext = SINGLE, ckpt_layers: int = 0) -> Tensor:
        return self.adapter.loss_sum(inputs, sp, ckpt_layers)
