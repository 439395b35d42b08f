"""The claim verdict against its tolerance band, said in words, and the memory-decisions tables."""

from __future__ import annotations

import math

import pytest

from dcp_bench.report.claims import SIMULATED_BASIS, ClaimResult, PairResult, verdict, verdict_words
from dcp_bench.report.memory import accounting_table, bucket_settings_table


@pytest.mark.parametrize(
    "lo,hi,expect",
    [
        (2.60, 3.10, "reproduced"),  # inside [2.504, 3.312]
        (2.20, 2.45, "not reproduced"),  # wholly below
        (3.40, 3.60, "not reproduced"),  # wholly above
        (2.40, 2.70, "undecided"),  # straddles the lower edge
        (3.20, 3.50, "undecided"),  # straddles the upper edge
        (2.00, 3.60, "undecided"),  # wider than the band
        (math.nan, 2.7, "no data"),
    ],
)
def test_verdict_needs_the_whole_ci_inside_the_band(lo: float, hi: float, expect: str) -> None:
    assert verdict(2.88, 0.15, lo, hi) == expect


def test_verdict_words_say_where_the_ci_lies() -> None:
    assert "below" in verdict_words("not reproduced", 2.88, 0.15, 2.0, 2.1)
    assert "above" in verdict_words("not reproduced", 2.88, 0.15, 3.5, 3.6)
    assert "straddles" in verdict_words("undecided", 2.88, 0.15, 2.4, 2.7)
    assert verdict_words("reproduced", 2.88, 0.15, 2.6, 3.0).startswith(
        "reproduced: the whole 95% CI"
    )


def _result() -> ClaimResult:
    pr = PairResult(
        "videosys_zipf", "bucket_static", "dcp_inter_pac", 2.0, 1.9, 2.1, 5, "throughput", "b", "m"
    )
    r = ClaimResult("c", "claim", 2.88, 0.15, pr, "not reproduced")
    r.accounting = {
        "baseline": {
            "dataset_samples": 100,
            "trained_samples_median": 100.0,
            "trained_fraction": 1.0,
            "dropped_samples": {"ejected": 0},
            "profile": {
                "1x256": {"sp": 1, "bs": 8, "ckpt_layers": 28, "time_s": 0.1},
                "120x3600": None,
            },
        },
        "method": {
            "dataset_samples": 100,
            "trained_samples_median": 70.0,
            "trained_fraction": 0.7,
            "dropped_samples": {"ejected": 30},
            "profile": {},
        },
    }
    r.imbalance = {"baseline": 0.5, "method": 0.1}
    return r


def test_summary_row_carries_band_fractions_imbalance_and_basis() -> None:
    r = _result()
    r.model_band_low, r.model_band_high = 1.8, 2.3
    s = r.to_summary()
    assert s["model_band_low"] == 1.8 and s["model_band_high"] == 2.3
    r.trained_fraction = {"method": 0.7, "baseline": 1.0}
    assert r.to_summary()["trained_fraction"] == {"method": 0.7, "baseline": 1.0}
    assert s["imbalance"] == {"baseline": 0.5, "method": 0.1}
    assert s["basis"] == SIMULATED_BASIS and "not validated on a GPU" in s["basis"]
    assert s["verdict"] in ("reproduced", "not reproduced", "undecided", "no data")


def test_memory_decision_tables() -> None:
    r = _result()
    acc = accounting_table(r)
    assert list(acc["side"]) == ["baseline", "method"]
    assert list(acc["trained_fraction"]) == [1.0, 0.7]
    assert list(acc["dropped_ejected"]) == [0, 30]
    buckets = bucket_settings_table(r.accounting["baseline"])
    by = buckets.set_index("bucket")
    assert by.loc["1x256", "batch_size"] == 8 and by.loc["1x256", "ckpt_layers"] == 28
    assert "unprofiled" in by.loc["120x3600", "note"]
