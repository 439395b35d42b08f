"""Why dcp-bench does not drive diffusers' own context parallelism (``enable_parallelism`` with a
``ContextParallelConfig``) on CPU: with the installed diffusers, its public entry point fails
before any parallel work on a machine without an accelerator. This test pins that failure (the
error and the diffusers source line), so a diffusers release that lifts it makes this test fail
and says the path can be built and checked on gloo (docs/integration.md, "diffusers' own context
parallelism").
"""

from __future__ import annotations

import traceback

import pytest
import torch
import torch.distributed as dist

diffusers = pytest.importorskip(
    "diffusers", reason="diffusers not installed: pip install -e '.[hf]'"
)

from integration_common import free_port  # noqa: E402

TINY_WAN = dict(
    patch_size=(1, 2, 2), num_attention_heads=4, attention_head_dim=8, in_channels=4,
    out_channels=4, text_dim=16, freq_dim=16, ffn_dim=32, num_layers=2, rope_max_seq_len=32,
)  # fmt: skip


@pytest.mark.skipif(torch.accelerator.device_count() > 0, reason="an accelerator is present")
def test_enable_parallelism_fails_without_an_accelerator() -> None:
    torch.manual_seed(0)
    model = diffusers.WanTransformer3DModel(**TINY_WAN)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    try:
        with pytest.raises(ZeroDivisionError) as info:
            model.enable_parallelism(config=diffusers.ContextParallelConfig(ulysses_degree=2))
    finally:
        dist.destroy_process_group()
    last = traceback.extract_tb(info.value.__traceback__)[-1]
    assert last.filename.endswith("diffusers/models/modeling_utils.py"), last.filename
    assert last.name == "_resolve_parallel_config"
    assert "torch.accelerator.device_count()" in (last.line or "")
    assert torch.accelerator.device_count() == 0
