"""Architectures as plug-ins (`dcp_bench.archs`): the registry, the architectures' parameter
counts against the libraries' own modules, the transformers family table against the library's
config classes, and the published GPT sizes against their closed form."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from dcp_bench.archs import BUILTIN, get_arch, registered
from dcp_bench.archs.base import Architecture
from dcp_bench.archs.llama import TRANSFORMERS_FAMILIES
from dcp_bench.cost import make_cost_model
from dcp_bench.cost.params import param_count
from dcp_bench.cost.specs import ModelSpec, model_spec
from dcp_bench.errors import ConfigError


def test_every_registered_architecture_loads_and_is_named_for_its_key() -> None:
    assert registered() == ["gpt", "llama", "stdit", "wan"]
    for name in BUILTIN:
        arch = get_arch(name)
        assert isinstance(arch, Architecture) and arch.name == name


def test_an_unknown_architecture_is_one_line_naming_the_registered_ones() -> None:
    with pytest.raises(ConfigError) as err:
        model_spec("x", arch="mamba", num_layers=1, hidden=8, heads=2, kv_heads=2, ffn_hidden=8)
    msg = str(err.value)
    assert "\n" not in msg and "'mamba'" in msg
    assert "registered: gpt, llama, stdit, wan" in msg
    with pytest.raises(ConfigError, match="unknown architecture 'no_such_package.arch'"):
        get_arch("no_such_package.arch")
    with pytest.raises(ConfigError, match="defines no ARCH"):
        get_arch("dcp_bench.archs.base")


def test_gpt_sizes_follow_the_gpt2_closed_form() -> None:
    # 12 L h^2 + 13 L h (two LayerNorms, four biased linears of a 4h MLP and attention) plus the
    # tied token table, the 2048-row position table and the final LayerNorm
    for name, layers, h in (("gpt_7b", 32, 4096), ("gpt_13b", 40, 5120), ("gpt_30b", 60, 6656)):
        spec = model_spec(name)
        assert spec.head_dim * spec.heads == h and spec.ffn_hidden == 4 * h
        want = 12 * layers * h * h + 13 * layers * h + 50257 * h + 2048 * h + 2 * h
        assert param_count(spec) == want, name


def test_gpt_counts_the_parameters_of_the_library_gpt2() -> None:
    torch = pytest.importorskip("torch")
    tf = pytest.importorskip("transformers")
    spec = dataclasses.replace(
        model_spec("gpt_7b"), num_layers=2, hidden=64, heads=4, kv_heads=4, ffn_hidden=256
    )
    spec = dataclasses.replace(spec, vocab=100, learned_positions=128)
    cfg = tf.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=100, n_positions=128)
    with torch.device("meta"):
        model = tf.GPT2LMHeadModel(cfg)
    assert sum(p.numel() for p in model.parameters()) == param_count(spec)


def test_gpt_refuses_options_it_does_not_have() -> None:
    with pytest.raises(ConfigError, match="model.norm='rmsnorm'.*GPT has norm='layernorm'"):
        model_spec(
            "g", arch="gpt", num_layers=1, hidden=8, heads=2, kv_heads=2, ffn_hidden=32,
            vocab=16, learned_positions=8, mlp="gelu", linear_bias=True,
        )  # fmt: skip


def test_wan_counts_the_parameters_of_the_diffusers_model() -> None:
    torch = pytest.importorskip("torch")
    diffusers = pytest.importorskip("diffusers")
    from dcp_bench.runtime.integrations.diffusers_video import spec_of

    cfg = dict(
        patch_size=(1, 2, 2), num_attention_heads=4, attention_head_dim=16, in_channels=4,
        out_channels=4, text_dim=32, freq_dim=256, ffn_dim=128, num_layers=2,
        cross_attn_norm=True, qk_norm="rms_norm_across_heads", rope_max_seq_len=1024,
    )  # fmt: skip
    with torch.device("meta"):
        model = diffusers.WanTransformer3DModel(**cfg)
    spec = spec_of(model)
    assert spec.arch == "wan" and spec.num_layers == 2
    assert sum(p.numel() for p in model.parameters()) == param_count(spec)


def test_wan_attends_over_the_whole_clip() -> None:
    # one 8-frame clip of 64 patches per frame: full attention is (8*64)^2 pairs, against
    # 8*64^2 + 64*8^2 for STDiT3's spatial and temporal blocks (hand-worked)
    n, f = np.array([512.0]), np.array([8.0])
    assert get_arch("wan").attention_pairs(n, f)[0] == 512.0**2
    assert get_arch("stdit").attention_pairs(n, f)[0] == 8 * 64**2 + 64 * 8**2
    wan = ModelSpec(
        "w", "wan", 2, 64, 4, 4, 128, in_channels=4, patch=(1, 2, 2), text_tokens=8, text_dim=32
    )
    cost = make_cost_model(wan, "h200x8", "analytical")
    fl = cost.sample_flops(n, f)  # type: ignore[attr-defined]
    # self-attention 4 n^2 h and cross-attention 4 n M h per block, 2 blocks
    assert fl["attn"][0] == pytest.approx(2 * (4 * 512**2 * 64 + 4 * 512 * 8 * 64))


def _family_config(model_type: str, **extra: object) -> dict[str, object]:
    return {
        "model_type": model_type,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "vocab_size": 256,
        # token ids inside the small vocabulary (Phi3's default pad id is 32000)
        "pad_token_id": 0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        **extra,
    }


PRICED = [k for k, f in TRANSFORMERS_FAMILIES.items() if not f.unpriced]


@pytest.mark.parametrize("model_type", PRICED)
def test_family_defaults_are_the_library_config_defaults(model_type: str) -> None:
    tf = pytest.importorskip("transformers")
    cfg = tf.AutoConfig.for_model(model_type, hidden_size=64, num_attention_heads=4)
    for key, value in TRANSFORMERS_FAMILIES[model_type].defaults.items():
        assert getattr(cfg, key) == value, (model_type, key)


@pytest.mark.parametrize("model_type", PRICED)
@pytest.mark.parametrize("head_dim", [None, 24])
def test_every_priced_family_counts_the_library_models_parameters(
    model_type: str, head_dim: int | None
) -> None:
    # independent: the library's own module tree vs the architecture's closed-form count
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from dcp_bench.runtime.integrations.transformers_lm import build_causal_lm

    if head_dim is not None and model_type == "gpt_neox":
        pytest.skip("GPT-NeoX has no head_dim key (head width = hidden / heads)")
    extra = {} if head_dim is None else {"head_dim": head_dim}
    spec = model_spec("hf", library="transformers", config=_family_config(model_type, **extra))
    with torch.device("meta"):
        model = build_causal_lm(spec)
    assert sum(p.numel() for p in model.parameters()) == param_count(spec), model_type


def test_an_unpriced_or_unknown_family_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="model_type='gpt_oss'.*mixture-of-experts"):
        model_spec("hf", library="transformers", config=_family_config("gpt_oss"))
    with pytest.raises(ConfigError, match="model_type='mamba'.*registered in dcp_bench.archs"):
        model_spec("hf", library="transformers", config=_family_config("mamba"))
    with pytest.raises(ConfigError, match="use_bias=False"):
        cfg = _family_config("starcoder2", use_bias=False)
        model_spec("hf", library="transformers", config=cfg)


def test_the_adapter_whitelist_is_the_registered_families() -> None:
    pytest.importorskip("torch")
    from dcp_bench.runtime.integrations.transformers_lm import MODEL_TYPES

    assert set(MODEL_TYPES) == set(TRANSFORMERS_FAMILIES)
