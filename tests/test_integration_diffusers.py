"""A diffusers Wan video transformer trained with DCP equals the plain library model in one process.

The reference is the library's own model with its own attention processors, one clip per forward,
the flow-matching loss on the whole output. Against it, on 2 and 4 gloo ranks: hand-built plans
through the runtime's executor (one step with clips split over 1, 2 and 4 ranks, token counts
that need padding, recompute on and off), and every method's own plan through DataCentricParallel
(slow). fp32, relative error <= 1e-5.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("diffusers", reason="diffusers not installed: pip install -e '.[hf]'")

from integration_common import SEED, flat_grads, group_sizes, rel_l2, run_cases, runtime_methods  # noqa: E402

from dcp_bench.batch import GlobalBatch  # noqa: E402
from dcp_bench.errors import ConfigError  # noqa: E402
from dcp_bench.plan import Group, MicroBatch, Round, StepPlan  # noqa: E402
from dcp_bench.runtime.attention import SINGLE  # noqa: E402

METHODS = runtime_methods(
    sorted(
        p.stem
        for p in (Path(__file__).resolve().parents[1] / "dcp_bench" / "conf" / "method").glob(
            "*.yaml"
        )
    )
)
# A small Wan: 4 heads (SP up to 4), 2 blocks, the library's default patch (1, 2, 2).
CONFIG: dict[str, Any] = dict(
    patch_size=(1, 2, 2),
    num_attention_heads=4,
    attention_head_dim=16,
    in_channels=4,
    out_channels=4,
    text_dim=32,
    freq_dim=32,
    ffn_dim=128,
    num_layers=2,
    rope_max_seq_len=256,
)
# Clips: (latent frames, patches per frame); token counts 45, 18, 16, 42, 8, 30 (not all multiples
# of 4).
CLIPS = [(5, 9), (3, 6), (1, 16), (7, 6), (2, 4), (3, 10)]
VIDEO = GlobalBatch(
    step=0,
    sample_ids=np.arange(31, 31 + len(CLIPS), dtype=np.int64),
    tokens=np.array([f * s for f, s in CLIPS], dtype=np.int64),
    frames=np.array([f for f, _ in CLIPS], dtype=np.int64),
)


def build_plain(seed: int) -> Any:
    from dcp_bench.runtime.integrations.diffusers_video import build_wan

    return build_wan(CONFIG, seed=seed)


def build_adapted(seed: int) -> tuple[Any, Any]:
    from dcp_bench.runtime.integrations.diffusers_video import WanAdapter

    model = build_plain(seed)
    return model, WanAdapter(model)


_REF: dict[tuple[int, ...], tuple[float, torch.Tensor]] = {}


def reference(batch: GlobalBatch) -> tuple[float, torch.Tensor]:
    """Single process, the library's processors, one clip per forward, loss / batch tokens. The
    inputs are drawn by the adapter's make_inputs on one rank (the data, not the computation)."""
    from dcp_bench.runtime.integrations.diffusers_video import WanAdapter
    from dcp_bench.runtime.models import NUM_TIMESTEPS

    key = tuple(batch.sample_ids.tolist()) + tuple(batch.tokens.tolist())
    if key not in _REF:
        clips = WanAdapter(build_plain(SEED)).make_inputs(
            batch.sample_ids, batch.tokens, batch.frames, SINGLE, SEED
        )
        model = build_plain(SEED)
        total = 0.0
        for clip in clips:
            s = clip.timestep.float() / NUM_TIMESTEPS
            pred = model(
                hidden_states=(1 - s) * clip.latents + s * clip.noise,
                timestep=clip.timestep,
                encoder_hidden_states=clip.caption,
                return_dict=False,
            )[0]
            loss = (pred - (clip.noise - clip.latents)).square().sum() / batch.total_tokens
            loss.backward()
            total += float(loss.detach())
        _REF[key] = (total, flat_grads(model.parameters()))
    return _REF[key]


def _plan(
    world: int, rounds: list[list[tuple[int, int, list[tuple[tuple[int, ...], int]]]]]
) -> StepPlan:
    return StepPlan(
        world_size=world,
        rounds=[
            Round(
                groups=[
                    Group(
                        start=s,
                        size=z,
                        micro_batches=[MicroBatch(samples=m, ckpt_layers=c) for m, c in mbs],
                    )
                    for s, z, mbs in rnd
                ]
            )
            for rnd in rounds
        ],
    )


CASES4 = [
    (
        "sp4_sp2_sp1",
        VIDEO,
        _plan(
            4,
            [
                [(0, 4, [((0,), 0)])],
                [(0, 2, [((3, 1), 1)]), (2, 1, [((2,), 0)]), (3, 1, [((4, 5), 0)])],
            ],
        ),
    ),
    ("sp4_ckpt", VIDEO, _plan(4, [[(0, 4, [((0, 1, 2), 2), ((3, 4, 5), 0)])]])),
]
CASES2 = [
    (
        "sp2_then_single",
        VIDEO,
        _plan(2, [[(0, 2, [((0, 3), 0)])], [(0, 1, [((1, 2), 2)]), (1, 1, [((4, 5), 0)])]]),
    ),
    ("api-dcp", VIDEO, ("dcp", 0.066)),
]


def test_adapter_on_one_process_equals_the_library_model() -> None:
    model, adapter = build_adapted(SEED)
    inputs = adapter.make_inputs(VIDEO.sample_ids, VIDEO.tokens, VIDEO.frames, SINGLE, SEED)
    loss = adapter.loss_sum(inputs, SINGLE, ckpt_layers=1) / VIDEO.total_tokens
    loss.backward()
    ref_loss, ref_grads = reference(VIDEO)
    assert abs(float(loss.detach()) - ref_loss) <= 1e-5 * abs(ref_loss)
    assert rel_l2(flat_grads(model.parameters()), ref_grads) <= 1e-5
    # outside loss_sum the model is the library's: the hooks pass through
    assert type(model.attn_processors["blocks.0.attn2.processor"]).__module__.startswith(
        "diffusers"
    )


def test_models_the_adapter_cannot_serve_are_refused() -> None:
    from dcp_bench.runtime.integrations.diffusers_video import WanAdapter, build_wan

    with pytest.raises(ConfigError, match="not a diffusers WanTransformer3DModel"):
        WanAdapter(torch.nn.Linear(2, 2))
    with pytest.raises(ConfigError, match="image conditioning"):
        WanAdapter(build_wan({**CONFIG, "image_dim": 16, "added_kv_proj_dim": 64}))


def _check(results: list[list[dict[str, Any]]], cases: list[tuple[str, GlobalBatch, Any]]) -> None:
    for i, (label, batch, _) in enumerate(cases):
        ref_loss, ref_grads = reference(batch)
        for rank, per_rank in enumerate(results):
            got = per_rank[i]
            assert abs(got["loss"] - ref_loss) <= 1e-5 * abs(ref_loss), (
                label,
                rank,
                got["loss"],
                ref_loss,
            )
            assert rel_l2(got["grads"], ref_grads) <= 1e-5, (
                label,
                rank,
                rel_l2(got["grads"], ref_grads),
            )


@pytest.mark.dist
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_four_ranks_hand_plans_equal_single_process() -> None:
    assert group_sizes(CASES4[0][2]) == [1, 2, 4]
    _check(run_cases(4, build_adapted, CASES4), CASES4)


@pytest.mark.dist
def test_two_ranks_hand_plan_and_api_equal_single_process() -> None:
    _check(run_cases(2, build_adapted, CASES2), CASES2)


@pytest.mark.dist
@pytest.mark.slow
@pytest.mark.timeout(1800)  # every method on 2 or 4 ranks; minutes on a loaded 2-core machine
@pytest.mark.parametrize("world", [2, 4])
def test_every_method_equals_single_process(world: int) -> None:
    cases = [(m, VIDEO, (m, 0.066)) for m in METHODS]
    results = run_cases(world, build_adapted, cases)
    _check(results, cases)
    assert len({tuple(r["sizes"]) for r in results[0]}) >= 2  # the plans differ in SP degrees
