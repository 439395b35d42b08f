"""Wan's per-block activation terms (`dcp_bench.archs.wan`) against what the diffusers
``WanTransformer3DModel`` keeps for backward, trained as the video integration trains it
(`WanAdapter`: the library's blocks, fused SDPA self-attention): every tensor handed to autograd's
saved-tensor hooks in one block, once per storage, parameters excluded (the tracker of
`dcp_bench.runtime.memory_count`). A small config (no download), CPU, fp32, clips of different
lengths and frame counts: the per-token and per-clip terms are both exercised. The runtime has
no Wan module of its own, so `dcp-bench memory` refuses Wan (tests/test_archs_memory.py)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

import numpy as np  # noqa: E402

from dcp_bench.archs.wan import ARCH  # noqa: E402
from dcp_bench.runtime.attention import SINGLE, AttentionKernel  # noqa: E402
from dcp_bench.runtime.integrations.diffusers_video import WanAdapter, build_wan  # noqa: E402
from dcp_bench.runtime.memory_count import _Tracker  # noqa: E402

CONFIG = {
    "patch_size": (1, 2, 2), "num_attention_heads": 4, "attention_head_dim": 32,
    "in_channels": 4, "out_channels": 4, "text_dim": 64, "freq_dim": 256, "ffn_dim": 512,
    "num_layers": 2, "rope_max_seq_len": 1024,
}  # fmt: skip


def _count_block(tokens: list[int], frames: list[int]) -> tuple[float, WanAdapter]:
    """Bytes the second block keeps for backward over the clips (the first may keep shared
    inputs: the rotary tables, the caption features)."""
    model = build_wan(CONFIG, seed=0).train()
    kernel = AttentionKernel("sdpa", fused_only=True, notes=["memory count"])
    adapter = WanAdapter(model, caption_tokens=16, kernel=kernel)
    tracker = _Tracker({p.untyped_storage()._cdata for p in model.parameters()})
    handles = [
        block.register_forward_pre_hook(lambda m, a, i=i: tracker.set_unit(f"L{i}"))
        for i, block in enumerate(model.blocks)
    ]
    handles.append(model.norm_out.register_forward_pre_hook(lambda m, a: tracker.set_unit("out")))
    ids = np.arange(len(tokens))
    inputs = adapter.make_inputs(ids, np.asarray(tokens), np.asarray(frames), SINGLE, 0)
    try:
        with torch.autograd.graph.saved_tensors_hooks(tracker.pack, lambda t: t):
            adapter.loss_sum(inputs, SINGLE, 0)
    finally:
        for h in handles:
            h.remove()
    assert not tracker.square, f"attention took a non-fused path: {tracker.square[0]}"
    assert tracker.attention_nodes, "no fused attention node seen"
    return tracker.units["L1"], adapter


@pytest.mark.parametrize(("tokens", "frames"), [([96], [2]), ([96, 200], [2, 4])])
def test_block_terms_equal_the_diffusers_models_saved_tensors(
    tokens: list[int], frames: list[int]
) -> None:
    counted, adapter = _count_block(tokens, frames)
    spec = adapter.spec
    assert spec.arch == "wan" and spec.dtype == "fp32"
    terms = ARCH.activation_terms(spec, 4)
    predicted = sum(tokens) * sum(terms.layer_tok.values()) + len(tokens) * sum(
        terms.layer_sample.values()
    )
    assert counted > 0
    assert predicted == counted, f"counted {counted:.0f} bytes, priced {predicted:.0f}"
