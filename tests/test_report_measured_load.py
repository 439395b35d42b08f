"""The simulator-against-measurement table says what load each measured cell ran at.

A measured step time on a machine shared with other work grows with the machine's load, a
simulated one does not, so the table carries each measured cell's median 1-minute load average
over its steps (`load_1m`, recorded by the torch executor) and the section's text its range.
"""

from __future__ import annotations

import math

import pandas as pd

from dcp_bench.report.data import validation_table
from dcp_bench.report.sections.measurement import _load_sentence
from dcp_bench.report.tables import Campaign


def _cells() -> pd.DataFrame:
    base = {"workload": "w", "model": "m", "cluster": "cpu", "params": "", "is_baseline": True}
    return pd.DataFrame(
        [
            {**base, "executor": "torch", "label": "a", "median_s": 2.0, "cv": 0.1,
             "config_hash": "t-a", "cost_source": None},
            {**base, "executor": "torch", "label": "b", "median_s": 1.0, "cv": 0.1,
             "config_hash": "t-b", "cost_source": None},
            {**base, "executor": "sim", "label": "a", "median_s": 2.2, "cv": 0.0,
             "config_hash": "s-a", "cost_source": "profiled"},
            {**base, "executor": "sim", "label": "b", "median_s": 0.9, "cv": 0.0,
             "config_hash": "s-b", "cost_source": "profiled"},
        ]
    )  # fmt: skip


def test_each_measured_cell_carries_its_median_load() -> None:
    steps = pd.DataFrame(
        [
            {"config_hash": "t-a", "load_1m": 2.0},
            {"config_hash": "t-a", "load_1m": 6.0},
            {"config_hash": "t-a", "load_1m": 3.0},
            {"config_hash": "t-b", "load_1m": None},  # a record from before the load was kept
            {"config_hash": "s-a", "load_1m": None},
        ]
    )
    v = validation_table(Campaign(name="c", runs=pd.DataFrame(), steps=steps), _cells())
    got = dict(zip(v["method"], v["load_1m"]))
    assert got["a"] == 3.0  # median of 2, 6, 3
    assert math.isnan(got["b"])
    assert dict(zip(v["method"], v["error"].round(6))) == {"a": 0.1, "b": -0.1}
    assert _load_sentence(v) == (
        " Measured at a 1-minute load average of 3.0-3.0 (`load_1m`, each cell's median over its "
        "steps): on a machine shared with other work a measured step time grows with the load, a "
        "simulated one does not."
    )


def test_no_load_no_sentence() -> None:
    steps = pd.DataFrame([{"config_hash": "t-a", "load_1m": None}])
    v = validation_table(Campaign(name="c", runs=pd.DataFrame(), steps=steps), _cells())
    assert _load_sentence(v) == ""
    assert _load_sentence(v.drop(columns=["load_1m"])) == ""
