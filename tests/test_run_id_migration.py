"""Run ids are hashed from the parsed run spec; the committed campaigns' records, written under the
earlier raw-config hash, stay findable through results/run_id_migration.json (`dcp_bench.run_ids`).
The record under tests/data/reproduce_v1 is a finished run of the reproduction campaign copied
unchanged (config.yaml, env.json, run.json, steps.jsonl)."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from dcp_bench.campaign.sweep import SUPERSEDED_DIR, pending, record_state
from dcp_bench.config import load_config, to_container
from dcp_bench.records import read_summary
from dcp_bench.report.tables import load_campaign
from dcp_bench.run.spec import parse_run_spec
from dcp_bench.run_ids import current_cell, earlier_run_ids

DATA = Path(__file__).parent / "data" / "reproduce_v1"
(OLD_RUN,) = [p for p in DATA.iterdir() if p.is_dir()]


def _campaign_with_old_run(tmp_path: Path) -> tuple[Path, Any]:
    """The committed record under its earlier id in a fresh root, and the spec a sweep of the
    same config builds today."""
    camp = tmp_path / "reproduce"
    shutil.copytree(OLD_RUN, camp / OLD_RUN.name)
    cfg = yaml.safe_load((OLD_RUN / "config.yaml").read_text())
    cfg["run"]["root"] = str(tmp_path)
    return camp, parse_run_spec(cfg)


def test_the_current_id_differs_and_the_table_names_the_earlier_one(tmp_path: Path) -> None:
    _, spec = _campaign_with_old_run(tmp_path)
    old = read_summary(OLD_RUN)
    assert old is not None
    assert spec.run_id != OLD_RUN.name  # hashed from the spec now, not from the raw config
    assert (OLD_RUN.name, old.config_hash) in earlier_run_ids(spec.run_id, spec.config_hash)
    assert current_cell(old.config_hash) == spec.config_hash


def test_a_finished_run_under_its_earlier_id_is_found_and_not_rerun(tmp_path: Path) -> None:
    camp, spec = _campaign_with_old_run(tmp_path)
    record, state = record_state(spec)
    assert record.name == OLD_RUN.name and state.state == "complete"
    todo, result = pending([spec], resume=True, retry_failed=False)
    assert todo == [] and result.skipped == [spec.run_id]
    assert not (camp / spec.run_id).exists()  # nothing written under the current id
    # the report reads the earlier record's hashes as the current ones, so it pairs with runs
    # recorded since
    c = load_campaign(tmp_path, "reproduce")
    assert list(c.runs["config_hash"]) == [spec.config_hash]
    assert list(c.runs["context_hash"]) == [spec.context_hash]
    assert set(c.steps["config_hash"]) == {spec.config_hash}


def test_an_earlier_run_of_another_seed_is_not_taken(tmp_path: Path) -> None:
    _, spec = _campaign_with_old_run(tmp_path)
    cfg = copy.deepcopy(dict(spec.config))
    other = parse_run_spec(cfg, seed=spec.seed + 1)
    _, state = record_state(other)
    assert state.state == "incomplete"
    todo, _ = pending([other], resume=True, retry_failed=False)
    assert todo == [other]


def test_a_budget_cut_earlier_record_is_redone_under_the_current_id(tmp_path: Path) -> None:
    camp, spec = _campaign_with_old_run(tmp_path)
    path = camp / OLD_RUN.name / "run.json"
    data = json.loads(path.read_text())
    data["status"], data["step_time_s"] = "timeout", None
    data["extra"]["limit"] = "budget"
    path.write_text(json.dumps(data))
    todo, _ = pending([spec], resume=True, retry_failed=False)
    assert todo == [spec]
    # moved out of the campaign, so the redone run is the cell's only record
    assert not (camp / OLD_RUN.name).exists()
    assert (camp / SUPERSEDED_DIR / OLD_RUN.name / "run.json").exists()


# keys the packaged config came to list at their default (the earlier HASH_OMITTED_AT_DEFAULT
# patched two of them into the raw-config hash)
@pytest.mark.parametrize(
    "path", [("cost", "scales", "elementwise"), ("run", "planner_time"), ("mem_cap_fraction",)]
)
def test_a_key_left_out_and_listed_at_its_default_are_one_run(path: tuple[str, ...]) -> None:
    cfg = to_container(
        load_config(["workload=sharegpt", "cluster=cpu", "model=tiny_llama", "method=dcp"])
    )
    left_out = copy.deepcopy(cfg)
    node = left_out
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    assert parse_run_spec(cfg).run_id == parse_run_spec(left_out).run_id


def test_provenance_text_changes_no_run_id() -> None:
    cfg = to_container(
        load_config(["workload=sharegpt", "cluster=cpu", "model=tiny_llama", "method=dcp"])
    )
    edited = copy.deepcopy(cfg)
    edited["cluster"]["sources"] = {"intra_node_bw": "a corrected citation"}
    assert parse_run_spec(cfg).run_id == parse_run_spec(edited).run_id
    edited["cluster"]["intra_node_bw"] = 2 * float(cfg["cluster"]["intra_node_bw"])
    assert parse_run_spec(cfg).run_id != parse_run_spec(edited).run_id


def test_a_planner_option_at_its_constructor_default_is_one_run() -> None:
    """A method config that comes to list an option at the planner's default (megatron_hybrid_cp's
    ``scheduler`` and ``min_cp_size``) keeps its runs' ids; another value is another run."""
    cfg = to_container(
        load_config(
            ["workload=sharegpt", "cluster=cpu", "model=tiny_llama", "method=megatron_hybrid_cp"]
        )
    )
    assert cfg["method"]["scheduler"] == "balanced_cp" and cfg["method"]["min_cp_size"] == 1
    older = copy.deepcopy(cfg)
    del older["method"]["scheduler"], older["method"]["min_cp_size"]
    assert parse_run_spec(cfg).run_id == parse_run_spec(older).run_id
    other = copy.deepcopy(cfg)
    other["method"]["min_cp_size"] = 2
    assert parse_run_spec(other).run_id != parse_run_spec(cfg).run_id
