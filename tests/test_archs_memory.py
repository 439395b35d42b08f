"""Each registered architecture's cost-model activation memory equals what the runtime's module
for it keeps for backward, counted (`dcp_bench.runtime.memory_count`, what `dcp-bench memory`
prints), unit by unit, with and without checkpointing. An architecture the runtime has no
module for is refused by the count on one line naming it (it is planned and simulated only)."""

from __future__ import annotations

from typing import Any

import pytest

from dcp_bench.archs import registered
from dcp_bench.cost import make_cost_model
from dcp_bench.cost.specs import ModelSpec, model_spec

torch = pytest.importorskip("torch")

from dcp_bench.errors import ConfigError  # noqa: E402
from dcp_bench.runtime.archs import RUNTIME  # noqa: E402
from dcp_bench.runtime.memory_count import compare_units, count_activations  # noqa: E402


def _small(arch: str) -> tuple[ModelSpec, list[int], list[int] | None]:
    """A small model of ``arch`` in fp32 and a micro-batch of two samples."""
    if arch == "llama":
        return model_spec("tiny_llama"), [96, 160], None
    if arch == "stdit":
        return model_spec("tiny_stdit"), [64, 256], [1, 4]
    if arch == "gpt":
        spec = model_spec(
            "tiny_gpt", arch="gpt", num_layers=2, hidden=256, heads=8, kv_heads=8,
            ffn_hidden=1024, vocab=1024, tie_embeddings=True, learned_positions=4096,
            norm="layernorm", mlp="gelu", linear_bias=True, dtype="fp32",
        )  # fmt: skip
        return spec, [96, 160], None
    if arch == "wan":
        spec = model_spec(
            "tiny_wan", arch="wan", num_layers=2, hidden=128, heads=4, kv_heads=4,
            ffn_hidden=512, patch=[1, 2, 2], text_tokens=16, text_dim=64, dtype="fp32",
        )  # fmt: skip
        return spec, [64, 256], [1, 4]
    raise AssertionError(f"no small model for architecture {arch!r}: add one here")


@pytest.mark.parametrize("ckpt", [False, True])
@pytest.mark.parametrize("arch", registered())
def test_cost_model_memory_equals_the_count(arch: str, ckpt: bool) -> None:
    spec, tokens, frames = _small(arch)
    assert spec.arch == arch
    if arch not in RUNTIME:
        with pytest.raises(ConfigError, match=f"architecture '{arch}'.*has no runtime model"):
            count_activations(spec, tokens, frames, checkpoint=ckpt, layers=2)
        return
    counted = count_activations(spec, tokens, frames, checkpoint=ckpt, layers=2)
    cost: Any = make_cost_model(spec, "h200x32", "analytical")
    k = spec.num_layers if ckpt else 0
    rows = compare_units(
        counted,
        cost.activation_breakdown(tokens, float(len(tokens)), 1, k, frames=frames),
        spec.num_layers,
    )
    assert rows["total"][0] > 0
    for unit, (c, m) in rows.items():
        assert m == pytest.approx(c, rel=1e-9), f"{arch} ckpt={ckpt} {unit}: counted {c} model {m}"
