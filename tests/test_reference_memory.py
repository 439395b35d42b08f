"""The reference profiler's memory belief (`dcp_bench.reference.trial_search`): a trial fits when
the reference's own ``pred_full_mem`` is under the cap (VideoSys 4cce477 `profiler.py:785-797`),
checked against sizes worked out by hand from the reference's tensors."""

from __future__ import annotations

import numpy as np
import pytest

from dcp_bench.cost import make_cost_model
from dcp_bench.cost.params import param_breakdown
from dcp_bench.errors import ConfigError
from dcp_bench.reference.trial_search import (
    GIB,
    cost_measure,
    reference_pac_layers,
    reference_predicted_memory,
    unit_grad_bytes,
)

# STDiT3-XL/2: 28 layer units of a spatial and a temporal block, hidden 1152, 300 caption tokens,
# bf16 (2 bytes). Each block is called with y (300 x 1152), t_mlp and t0_mlp (6 x 1152 each) per
# sample, all requiring grad (open_sora_transformer_3d.py:612-613): per layer not run, per sample
# 2 blocks x 2 bytes x (300 x 1152 + 2 x 6 x 1152) = 1,437,696 bytes, over 26 layers 37.38 MB.
HAND_PER_SAMPLE_EXTRA = 26 * 2 * 2 * (300 * 1152 + 2 * 6 * 1152)


@pytest.fixture(scope="module")
def cost():  # type: ignore[no-untyped-def]
    return make_cost_model("stdit3_xl2", "h100x32")


def _pred(cost, bs: int, tokens: int = 144, sp: int = 4, unit_grad: bool = False) -> float:  # type: ignore[no-untyped-def]
    t = np.full(bs, tokens, dtype=np.int64)
    f = np.ones(bs, dtype=np.int64)
    return reference_predicted_memory(cost, t, f, sp, unit_grad=unit_grad)


def _counted(cost, bs: int, tokens: int = 144, sp: int = 4) -> float:  # type: ignore[no-untyped-def]
    t = np.full(bs, tokens, dtype=np.int64)
    f = np.ones(bs, dtype=np.int64)
    return cost.microbatch_memory(t, f, sp, cost.model.num_layers)


def test_the_prediction_charges_every_layer_the_caption_and_modulations_again(cost) -> None:  # type: ignore[no-untyped-def]
    # the hidden-state inputs the prediction adds are the checkpoints the counted memory keeps,
    # so what one more sample adds beyond the counted memory is the per-sample inputs by hand
    extra = (_pred(cost, 2) - _pred(cost, 1)) - (_counted(cost, 2) - _counted(cost, 1))
    assert extra == pytest.approx(HAND_PER_SAMPLE_EXTRA, rel=1e-9)
    assert 37.0e6 < extra < 37.5e6  # "about 37 MB per sample per rank"


def test_the_unit_grad_is_added_per_layer_for_accumulating_methods(cost) -> None:  # type: ignore[no-untyped-def]
    per_layer = param_breakdown(cost.model).per_layer
    assert unit_grad_bytes(cost) == per_layer * 2
    diff = _pred(cost, 3, unit_grad=True) - _pred(cost, 3, unit_grad=False)
    assert diff == pytest.approx(26 * per_layer * 2, rel=1e-12)


def test_the_prediction_decides_the_fit_and_the_counted_memory_is_recorded(cost) -> None:  # type: ignore[no-untyped-def]
    cap = cost.memory_cap_bytes
    ref = cost_measure(cost, 144, 1, pac=False)
    counted = cost_measure(cost, 144, 1, pac=False, memory="counted")

    # the largest power-of-two batch each belief admits
    def largest(measure) -> int:  # type: ignore[no-untyped-def]
        bs = 1
        while measure(4, bs * 2).fits:
            bs *= 2
        return bs

    b_ref, b_cnt = largest(ref), largest(counted)
    assert b_ref < b_cnt  # the belief is pessimistic for many-sample image buckets
    trial = ref(4, b_ref * 2)
    assert not trial.fits and trial.pred_mem_bytes > cap >= trial.mem_bytes
    ok = ref(4, b_ref)
    assert ok.fits and ok.mem_bytes == pytest.approx(_counted(cost, b_ref))
    assert ok.pred_mem_bytes == pytest.approx(_pred(cost, b_ref))
    with pytest.raises(ConfigError, match="profile memory 'true'"):
        cost_measure(cost, 144, 1, pac=False, memory="true")


def test_pac_knapsack_spends_whole_gib_of_what_the_prediction_leaves(cost) -> None:  # type: ignore[no-untyped-def]
    t = np.full(2, 8 * 3600, dtype=np.int64)
    f = np.full(2, 8, dtype=np.int64)
    L = cost.model.num_layers
    for left_gib in (0.5, 3.7, 12.2, 40.0):
        k, spent = reference_pac_layers(cost, t, f, 4, "sequence", left_gib * GIB)
        assert 0 <= L - k <= L
        assert spent <= np.floor(left_gib) * GIB
        if k > 0:  # one more kept layer would not be affordable
            stored = cost.microbatch_memory(t, f, 4, L - 2) - cost.microbatch_memory(t, f, 4, L - 1)
            per_block = (stored + cost.checkpointed_layer_bytes(float(t.sum()) / 4, 4)) / 2
            n = L - k + 1
            assert 2 * np.ceil(per_block * n / GIB) > np.floor(left_gib)
    assert reference_pac_layers(cost, t, f, 4, "sequence", 0.9 * GIB) == (L, 0.0)


def test_reference_imbalance_by_hand() -> None:
    from dcp_bench.reference.epoch import reference_imbalance
    from dcp_bench.reference.samplers import EpochDeal, GroupWork

    # iteration 1: a 4-rank group 2 micro-batches of 1.0 s, two 2-rank groups of 3.0 s and 1.0 s:
    #   rank times 2,2,2,2,3,3,1,1 -> slowest 3, idle (1x4 + 0x2 + 2x2) / 8 = 1.0
    # iteration 2: two 4-rank groups of 2.0 s: idle 0, slowest 2
    # epoch: (1.0 + 0) / (3 + 2) = 0.2 (sampler.py:259-271, the total at :1081-1084)
    it1 = [
        GroupWork("a", 4, [1, 1], time_s=1.0),
        GroupWork("b", 2, [1], time_s=3.0),
        GroupWork("c", 2, [1], time_s=1.0),
    ]
    it2 = [GroupWork("d", 4, [1], time_s=2.0), GroupWork("e", 4, [1, 1], time_s=1.0)]
    assert reference_imbalance(EpochDeal([it1, it2], 10, {})) == pytest.approx(0.2)
    assert reference_imbalance(EpochDeal([], 0, {})) is None
