"""The runtime model of a spec derived from another library's config (``ModelSpec.library``)."""

from __future__ import annotations

from dcp_bench.cost.specs import ModelSpec
from dcp_bench.errors import ConfigError
from dcp_bench.runtime.models import RuntimeModel


def build_library_model(spec: ModelSpec) -> RuntimeModel:
    """The `RuntimeModel` that trains ``spec``'s library model (built under the ambient device)."""
    if spec.library == "transformers":
        from dcp_bench.runtime.integrations.transformers_lm import TransformersCausalLM

        return TransformersCausalLM(spec)
    raise ConfigError(f"model {spec.name!r}: library {spec.library!r}; expected transformers")
