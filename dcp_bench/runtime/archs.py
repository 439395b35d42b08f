"""The runtime side of the architecture registry (`dcp_bench.archs` is the torch-free side): for
each architecture the runtime can build, its module class and how the memory count
(`dcp_bench.runtime.memory_count`) maps the module's sub-modules to the cost model's activation
units. An architecture registered for pricing only (planned and simulated) has no entry here:
building or counting it is refused by name.

A plug-in architecture (``arch: package.module``) adds its runtime by naming a module in its
``ARCH.runtime_module``; that module defines ``RUNTIME``, a `RuntimeArch`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

from dcp_bench.archs import get_arch
from dcp_bench.cost.specs import DECODER_OPTION_DEFAULTS, ModelSpec
from dcp_bench.errors import ConfigError


@dataclass(frozen=True)
class RuntimeArch:
    """``model_class``: the `dcp_bench.runtime.models.RuntimeModel` subclass that builds a spec,
    as ``"module:Class"`` (resolved when used, so this registry sits below the modules it names).
    ``section_of``: the
    activation unit (a key of `ActivationTerms.layer_tok`, prefixed ``L{i}.``) whose backward
    state a sub-module's forward saves, from its dotted name's parts, or None. ``final_units``:
    the units after the layers, as (sub-module, unit set before it runs, unit set after it runs
    or None). ``checkpoint_units``: (unit, module) of each checkpointed block of the first
    ``layers`` layer units. ``supports``: why a spec cannot be built by ``build``, or None."""

    name: str
    model_class: str
    section_of: Callable[[list[str]], str | None]
    final_units: Callable[[nn.Module], list[tuple[nn.Module, str, str | None]]]
    checkpoint_units: Callable[[nn.Module, int], list[tuple[str, nn.Module]]]
    supports: Callable[[ModelSpec], str | None] = lambda spec: None

    def build(self, spec: ModelSpec) -> Any:
        """The `RuntimeModel` of ``spec`` (on whatever device context the caller holds)."""
        module, _, cls = self.model_class.partition(":")
        return getattr(importlib.import_module(module), cls)(spec)


# sub-module name (last component) -> section of a layer
_STDIT_SECTIONS = {
    "norm1": "norm_modulation",
    "norm2": "norm_modulation",
    "qkv": "self_attention",
    "q_norm": "self_attention",
    "k_norm": "self_attention",
    "proj": "self_attention",
    "cross_q": "cross_attention",
    "cross_kv": "cross_attention",
    "cross_proj": "cross_attention",
    "mlp": "mlp",
}
_LLAMA_SECTIONS = {
    "attn_norm": "norms",
    "mlp_norm": "norms",
    "q_proj": "attention",
    "k_proj": "attention",
    "v_proj": "attention",
    "o_proj": "attention",
    "gate_proj": "mlp",
    "up_proj": "mlp",
    "down_proj": "mlp",
}


_GPT_SECTIONS = {
    "attn_norm": "norms",
    "mlp_norm": "norms",
    "q_proj": "attention",
    "k_proj": "attention",
    "v_proj": "attention",
    "o_proj": "attention",
    "fc1": "mlp",
    "fc2": "mlp",
}


def _gpt_section(parts: list[str]) -> str | None:
    if len(parts) >= 3 and parts[0] == "layers" and parts[2] in _GPT_SECTIONS:
        return f"L{parts[1]}.{_GPT_SECTIONS[parts[2]]}"
    return None


def _stdit_section(parts: list[str]) -> str | None:
    if len(parts) >= 4 and parts[0] == "pairs" and parts[3] in _STDIT_SECTIONS:
        return f"L{parts[1]}.{parts[2]}.{_STDIT_SECTIONS[parts[3]]}"
    return None


def _llama_section(parts: list[str]) -> str | None:
    if len(parts) >= 3 and parts[0] == "layers" and parts[2] in _LLAMA_SECTIONS:
        return f"L{parts[1]}.{_LLAMA_SECTIONS[parts[2]]}"
    return None


def _stdit_checkpoints(model: Any, layers: int) -> list[tuple[str, nn.Module]]:
    out: list[tuple[str, nn.Module]] = []
    for i in range(layers):
        pair = model.pairs[i]
        out += [(f"L{i}.spatial", pair.spatial), (f"L{i}.temporal", pair.temporal)]
    return out


def _llama_checkpoints(model: Any, layers: int) -> list[tuple[str, nn.Module]]:
    return [(f"L{i}", model.layers[i]) for i in range(layers)]


_DECODER_DEFAULTS = DECODER_OPTION_DEFAULTS


def _llama_supports(spec: ModelSpec) -> str | None:
    """The runtime's own decoder is a plain Llama layer; other decoder options train through the
    transformers adapter (``model=hf``), not this module."""
    odd = {k: getattr(spec, k) for k, v in _DECODER_DEFAULTS.items() if getattr(spec, k) != v}
    if odd:
        return (
            f"the runtime's Llama module builds no decoder options {odd} (model {spec.name!r}); "
            "train such a model through model=hf (the transformers adapter)"
        )
    return None


RUNTIME: dict[str, RuntimeArch] = {
    "llama": RuntimeArch(
        "llama",
        "dcp_bench.runtime.models:LlamaModel",
        _llama_section,
        lambda m: [(m.norm, "final_norm", "loss")],  # type: ignore[list-item]
        _llama_checkpoints,
        _llama_supports,
    ),
    "gpt": RuntimeArch(
        "gpt",
        "dcp_bench.runtime.models:GPTModel",
        _gpt_section,
        lambda m: [(m.norm, "final_norm", "loss")],  # type: ignore[list-item]
        _llama_checkpoints,
    ),
    "stdit": RuntimeArch(
        "stdit",
        "dcp_bench.runtime.models:STDiTModel",
        _stdit_section,
        lambda m: [(m.final_norm, "final_layer", None)],  # type: ignore[list-item]
        _stdit_checkpoints,
    ),
}


def runtime_arch(spec: ModelSpec) -> RuntimeArch:
    """The runtime entry of ``spec``'s architecture; a one-line error when there is none or it
    cannot build this spec."""
    entry = RUNTIME.get(spec.arch)
    if entry is None:
        module = getattr(get_arch(spec.arch), "runtime_module", "")
        if not module:
            raise ConfigError(
                f"architecture {spec.arch!r} (model {spec.name!r}) has no runtime model; it "
                f"plans and simulates only. Runtime models: {', '.join(sorted(RUNTIME))}"
            )
        entry = getattr(importlib.import_module(module), "RUNTIME", None)
        if not isinstance(entry, RuntimeArch):
            raise ConfigError(
                f"architecture {spec.arch!r}: runtime module {module} defines no RUNTIME "
                "(a dcp_bench.runtime.archs.RuntimeArch)"
            )
    offence = entry.supports(spec)
    if offence:
        raise ConfigError(offence)
    return entry


__all__ = ["RUNTIME", "RuntimeArch", "runtime_arch"]
