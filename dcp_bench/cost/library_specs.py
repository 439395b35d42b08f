"""Model specs derived from another library's own config (``model=hf``), so the cost model prices
the model that ``train`` builds.

A ``transformers`` decoder config (the ``config.json`` of a Hub model, or its keys) maps to the
``llama`` architecture of the cost model: hidden size, decoder layers, query and KV heads, FFN
width, vocabulary, tied embeddings, and Qwen2's q/k/v bias. Only the decoder families whose layer
structure is that architecture's (RMSNorm, rotary positions, grouped-query attention, SwiGLU MLP,
no extra per-layer parameters) are accepted; any other ``model_type`` or a layer option the cost
model does not price is refused by name. Torch-free: the library is not imported here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dcp_bench.errors import ConfigError

# model_type -> q/k/v projections carry a bias. These families share the llama layer structure.
TRANSFORMERS_DECODERS: dict[str, bool] = {"llama": False, "mistral": False, "qwen2": True}
LIBRARIES = ("transformers",)
# Layer options that would change what the cost model prices (key, value that is priced).
_PRICED_AS: dict[str, Any] = {
    "attention_bias": False,
    "mlp_bias": False,
    "use_sliding_window": False,
}


def read_library_config(
    config: Mapping[str, Any] | None, config_file: str | None
) -> dict[str, Any]:
    """The library config: the JSON file when ``config_file`` is given, else the ``config`` keys."""
    if config_file:
        path = Path(str(config_file)).expanduser()
        try:
            data = json.loads(path.read_text())
        except OSError as exc:
            raise ConfigError(
                f"model.config_file={config_file}: cannot read it ({exc.strerror}); "
                "expected a transformers config.json"
            ) from None
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"model.config_file={config_file}: not JSON ({exc.msg} at line {exc.lineno}); "
                "expected a transformers config.json"
            ) from None
        if not isinstance(data, dict):
            raise ConfigError(
                f"model.config_file={config_file}: a JSON {type(data).__name__}; expected an object"
            )
        return data
    if not config:
        raise ConfigError("model=hf: neither model.config keys nor model.config_file=PATH given")
    return {str(k): v for k, v in dict(config).items()}


def _int_key(cfg: Mapping[str, Any], key: str, default: int | None = None) -> int:
    value = cfg.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"model config {key}={value!r}; expected a positive integer")
    return value


def transformers_spec_fields(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """`ModelSpec` fields of a transformers decoder config (see the module docstring)."""
    model_type = cfg.get("model_type")
    if model_type not in TRANSFORMERS_DECODERS:
        raise ConfigError(
            f"model config model_type={model_type!r}; expected one of "
            f"{', '.join(TRANSFORMERS_DECODERS)} (decoders the cost model prices as llama)"
        )
    for key, priced in _PRICED_AS.items():
        if key in cfg and cfg[key] not in (priced, None):
            raise ConfigError(
                f"model config {key}={cfg[key]!r}: the cost model prices {key}={priced} only"
            )
    hidden = _int_key(cfg, "hidden_size")
    heads = _int_key(cfg, "num_attention_heads")
    kv_heads = _int_key(cfg, "num_key_value_heads", heads)
    head_dim = cfg.get("head_dim")
    if head_dim is not None and head_dim * heads != hidden:
        raise ConfigError(
            f"model config head_dim={head_dim} with {heads} heads and hidden_size={hidden}: "
            "the cost model needs head_dim = hidden_size / num_attention_heads"
        )
    if hidden % heads:
        raise ConfigError(
            f"model config num_attention_heads={heads} with hidden_size={hidden}: expected a "
            f"number of heads that divides hidden_size exactly ({hidden} / {heads} = "
            f"{hidden / heads:g} is not a whole head size)"
        )
    if heads % kv_heads:
        raise ConfigError(
            f"model config num_key_value_heads={kv_heads} with num_attention_heads={heads}: "
            "expected a number of key-value heads that divides num_attention_heads exactly"
        )
    return {
        "arch": "llama",
        "num_layers": _int_key(cfg, "num_hidden_layers"),
        "hidden": hidden,
        "heads": heads,
        "kv_heads": kv_heads,
        "ffn_hidden": _int_key(cfg, "intermediate_size"),
        "vocab": _int_key(cfg, "vocab_size"),
        "tie_embeddings": bool(cfg.get("tie_word_embeddings", False)),
        "qkv_bias": TRANSFORMERS_DECODERS[str(model_type)],
    }


def library_spec_fields(data: Mapping[str, Any]) -> dict[str, Any]:
    """The `ModelSpec` fields of a ``model=hf`` config node: ``name``, ``library`` (transformers),
    ``config`` (the library config's keys) or ``config_file`` (its JSON), and optionally ``dtype``,
    ``max_seq_len`` (default: the config's ``max_position_embeddings``) and ``sources``."""
    known = {"name", "library", "config", "config_file", "dtype", "max_seq_len", "sources"}
    unknown = set(data) - known
    if unknown:
        raise ConfigError(f"model config: unknown keys {sorted(unknown)}; expected {sorted(known)}")
    library = str(data.get("library", "transformers"))
    if library not in LIBRARIES:
        raise ConfigError(f"model.library={library!r}; expected one of {', '.join(LIBRARIES)}")
    cfg = read_library_config(data.get("config"), data.get("config_file"))
    fields = transformers_spec_fields(cfg)
    max_seq_len = data.get("max_seq_len") or cfg.get("max_position_embeddings") or 1 << 20
    sources = {str(k): str(v) for k, v in dict(data.get("sources") or {}).items()}
    sources.setdefault(
        "architecture",
        f"{library} {cfg['model_type']} config"
        + (f" {data['config_file']}" if data.get("config_file") else " (model.config keys)"),
    )
    return dict(
        name=str(data["name"]),
        max_seq_len=int(max_seq_len),
        dtype=str(data.get("dtype", "bf16")),
        sources=sources,
        library=library,
        library_config=cfg,
        **fields,
    )
