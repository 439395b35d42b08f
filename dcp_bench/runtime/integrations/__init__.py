"""Adapters that train other libraries' models with Data-Centric Parallel, through those
libraries' public extension points only (no copied model code, no patched internals):

- `dcp_bench.runtime.integrations.transformers_lm`: decoder-only causal LMs of ``transformers``
  (the families of ``MODEL_TYPES``: Llama, Mistral, Qwen2/3, Gemma 1-3, GPT-OSS, ...): Ulysses
  attention registered with ``AttentionInterface`` (every attention argument honoured or refused
  by name), packed variable-length samples, checkpointing through the model's own switch.
- `dcp_bench.runtime.integrations.diffusers_video`: the Wan video transformer of ``diffusers``:
  Ulysses attention as an attention processor, the token sequence split and gathered by torch
  module hooks, the diffusion loss on random latents.

Each library is optional (``pip install -e ".[hf]"``); `require` names the missing one.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from dcp_bench.errors import ConfigError

MINIMUM = {"transformers": "5.0", "diffusers": "0.40"}


def require(library: str) -> ModuleType:
    """The imported library, or a `ConfigError` that says how to install it."""
    try:
        return importlib.import_module(library)
    except ImportError:
        raise ConfigError(
            f'{library} is not installed: pip install -e ".[hf]" (or pip install '
            f'"{library}>={MINIMUM[library]}")'
        ) from None
