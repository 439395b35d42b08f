"""Model specs derived from another library's own config (``model=hf``), so the cost model prices
the model that ``train`` builds.

A ``transformers`` decoder config (the ``config.json`` of a Hub model, or its keys) maps to the
``llama`` decoder architecture of the cost model (`dcp_bench.archs.llama`): hidden size, decoder
layers, query and KV heads, the head width, FFN width, vocabulary, tied embeddings, biases, q/k
norms, the norm and MLP kind. The families are those registered in
`dcp_bench.archs.llama.TRANSFORMERS_FAMILIES` (Llama, Mistral, Qwen2, Qwen3, Gemma, Gemma2,
Gemma3, OLMo2, Phi3, Granite, GPT-NeoX, Starcoder2); any other ``model_type`` or a layer option
the cost model does not price is refused by name. Torch-free: the library is not imported here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dcp_bench.archs.llama import TRANSFORMERS_FAMILIES
from dcp_bench.errors import ConfigError

LIBRARIES = ("transformers",)
# Layer options that would change what the cost model prices (key, value that is priced), for
# families without a key that biases every linear layer (``TransformersFamily.bias_key``).
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
    family = TRANSFORMERS_FAMILIES.get(str(model_type))
    if family is None:
        raise ConfigError(
            f"model config model_type={model_type!r}; expected one of "
            f"{', '.join(TRANSFORMERS_FAMILIES)} (decoder families registered in dcp_bench.archs)"
        )
    if family.unpriced:
        raise ConfigError(
            f"model config model_type={model_type!r}: the cost model cannot price "
            f"{family.unpriced}; expected one of "
            f"{', '.join(k for k, f in TRANSFORMERS_FAMILIES.items() if not f.unpriced)}"
        )
    cfg = {**family.defaults, **{k: v for k, v in cfg.items() if v is not None}}
    for key, priced in _PRICED_AS.items():
        if key == family.bias_key:
            continue
        if key in cfg and cfg[key] not in (priced, None):
            raise ConfigError(
                f"model config {key}={cfg[key]!r}: the cost model prices {key}={priced} only "
                f"for model_type {model_type!r}"
            )
    linear_bias = False
    if family.bias_key:
        linear_bias = bool(cfg.get(family.bias_key, False))
        if not linear_bias:
            raise ConfigError(
                f"model config {family.bias_key}=False: the cost model prices {model_type!r} "
                "with a bias on every linear layer only"
            )
    hidden = _int_key(cfg, "hidden_size")
    heads = _int_key(cfg, "num_attention_heads")
    kv_heads = _int_key(cfg, "num_key_value_heads", heads) if family.grouped_query else heads
    head_dim = cfg.get("head_dim")
    if head_dim is not None:
        head_dim = _int_key(cfg, "head_dim")
    elif hidden % heads:
        raise ConfigError(
            f"model config num_attention_heads={heads} with hidden_size={hidden}: expected a "
            f"number of heads that divides hidden_size exactly ({hidden} / {heads} = "
            f"{hidden / heads:g} is not a whole head size) or a head_dim"
        )
    if heads % kv_heads:
        raise ConfigError(
            f"model config num_key_value_heads={kv_heads} with num_attention_heads={heads}: "
            "expected a number of key-value heads that divides num_attention_heads exactly"
        )
    fields: dict[str, Any] = {
        "arch": "llama",
        "num_layers": _int_key(cfg, "num_hidden_layers"),
        "hidden": hidden,
        "heads": heads,
        "kv_heads": kv_heads,
        "ffn_hidden": _int_key(cfg, "intermediate_size"),
        "vocab": _int_key(cfg, "vocab_size"),
        "tie_embeddings": bool(cfg.get("tie_word_embeddings", False)),
        "qkv_bias": family.qkv_bias,
    }
    # the decoder options a plain Llama leaves at their defaults (so its fields stay as before)
    options: dict[str, Any] = {
        "head_dim_override": head_dim if head_dim and head_dim * heads != hidden else 0,
        "qk_head_norm": family.qk_head_norm,
        "norm": family.norm,
        "mlp": family.mlp,
        "linear_bias": linear_bias,
        "norms_per_layer": family.norms_per_layer,
    }
    defaults = {"head_dim_override": 0, "qk_head_norm": "", "norm": "rmsnorm", "mlp": "swiglu"}
    defaults.update({"linear_bias": False, "norms_per_layer": 2})
    fields.update({k: v for k, v in options.items() if v != defaults[k]})
    return fields


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
