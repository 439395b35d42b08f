"""The cost scales' keys and defaults have one source (`SCALE_DEFAULTS`), the packaged config lists
all of them, and a scale left out or listed at its default is one run: run ids hash the parsed
spec. The ids of the committed reproduction (reports/reproduce/tables/runs.csv) are planned again
from its config and found, under their current id or the earlier one the migration table
(`dcp_bench.run_ids`) names."""

from __future__ import annotations

import copy
import json

import pandas as pd
import pytest

from dcp_bench.campaign.reproduce import plan_section
from dcp_bench.campaign.reproduce_config import load_reproduce_config
from dcp_bench.config import load_config, to_container
from dcp_bench.cost import make_cost_model
from dcp_bench.cost.analytical import SCALE_DEFAULTS, SCALE_KEYS
from dcp_bench.paths import REPO_ROOT
from dcp_bench.run.spec import cell_hashes
from dcp_bench.run_ids import earlier_run_ids


def test_the_config_lists_every_scale_at_its_one_default() -> None:
    cfg = to_container(load_config([]))
    assert cfg["cost"]["scales"] == SCALE_DEFAULTS
    assert tuple(SCALE_DEFAULTS) == SCALE_KEYS
    # a model built without scales and one built with every default price alike
    plain = make_cost_model("llama3_8b", "h200x8")
    listed = make_cost_model("llama3_8b", "h200x8", scales=dict(SCALE_DEFAULTS))
    assert plain.provenance["scales"] == listed.provenance["scales"] == SCALE_DEFAULTS
    assert plain.sample_time([4096], [1], 2, 3) == listed.sample_time([4096], [1], 2, 3)


def test_a_scale_at_its_default_hashes_as_the_scale_left_out() -> None:
    """The hash of a config with ``elementwise: 1.0`` is the hash of the same config without the
    key; another value is another run."""
    cfg = to_container(load_config(["method=dcp", "workload=sharegpt"]))
    without = copy.deepcopy(cfg)
    del without["cost"]["scales"]["elementwise"]
    assert cell_hashes(cfg) == cell_hashes(without)
    halved = copy.deepcopy(cfg)
    halved["cost"]["scales"]["elementwise"] = 0.5
    assert cell_hashes(halved) != cell_hashes(cfg)
    # every scale alike: the spec holds the factors that differ from 1
    no_act = copy.deepcopy(cfg)
    del no_act["cost"]["scales"]["act_bytes"]
    assert cell_hashes(no_act) == cell_hashes(cfg)


@pytest.mark.parametrize("section", ["claim", "sensitivity"])
def test_committed_reproduce_run_ids_are_unchanged(section: str) -> None:
    """The runs `dcp-bench reproduce` plans for a section (the headline and the sensitivity
    sweep, ``elementwise`` halved and doubled among them) have the ids its committed report
    lists."""
    committed = pd.read_csv(REPO_ROOT / "reports" / "reproduce" / "tables" / "runs.csv")
    cfg = load_reproduce_config([])
    sec = next(s for s in cfg.sections if s.name == section)
    sim_specs, _ = plan_section(cfg, sec)
    ids = {s.run_id for s in sim_specs} | {
        old for s in sim_specs for old, _ in earlier_run_ids(s.run_id, s.config_hash)
    }
    listed = set(committed.loc[committed["sweep"] == section, "run_id"])
    assert listed and listed <= ids
    if section == "sensitivity":
        assert any(
            "elementwise" in json.loads(s)
            for s in committed.loc[committed["run_id"].isin(ids), "scales"]
        )
