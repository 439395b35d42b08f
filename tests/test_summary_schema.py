"""Run summaries are typed and versioned (`dcp_bench.summary_schema`): a summary written by the
loop reads back equal, and a version-1 summary (one untyped ``extra`` mapping) is migrated once
on read without losing or changing a value. The version-1 files under tests/data/summaries_v1 are
committed records, copied unchanged: results/cpu_train/dcp-s0 (a CPU training run written before
runs recorded their context) and two runs of the reproduction campaign (a measured torch run and
a simulated epoch-unit run)."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from dcp_bench.config import MEM_CAP_FRACTION, load_config, to_container
from dcp_bench.errors import ConfigError
from dcp_bench.records import RunSummary, read_summary
from dcp_bench.run.simulated import run_simulated
from dcp_bench.run.spec import parse_run_spec
from dcp_bench.summary_schema import (
    SUMMARY_SCHEMA_VERSION,
    CostDescription,
    RunContext,
    migrate_v1,
)

DATA = Path(__file__).parent / "data" / "summaries_v1"
V1_FILES = sorted(DATA.glob("*.json"))


def _v1(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / f"{name}.json").read_text())
    return data


def _as_v1_extra(s: RunSummary) -> dict[str, Any]:
    """The version-1 ``extra`` a version-2 summary stands for, written out key by key from the
    version-1 writer's layout (the reference the migration is checked against)."""
    out: dict[str, Any] = dict(s.executor_info)
    if s.world_size is not None:
        out["world_size"] = s.world_size
    if s.context is not None:
        c = s.context
        out.update(
            label=c.label,
            mode=c.mode,
            context_hash=c.context_hash,
            sweep=c.sweep,
            overrides=list(c.overrides),
            target=c.target,
            scales=c.scales,
            mem_cap_fraction=c.mem_cap_fraction,
            planner_clock=c.planner_clock,
            planner_time=c.planner_time,
            noise=None if c.noise is None else dataclasses.asdict(c.noise),
        )
        if c.workload is not None:
            out["workload"] = dataclasses.asdict(c.workload)
        if c.limit is not None:
            out["limit"] = c.limit
    if s.cost_description is not None:
        out["cost"] = s.cost_description.as_flat()
    if s.outcome is not None:
        out.update(dataclasses.asdict(s.outcome))
    if s.training is not None:
        out.update({k: list(v) for k, v in dataclasses.asdict(s.training).items()})
    if s.epochs is not None:
        epochs = dataclasses.asdict(s.epochs)
        epochs["epoch_info"] = list(epochs["epoch_info"])
        out.update(unit="epoch", **epochs)
    if s.planning is not None:
        out.update(dataclasses.asdict(s.planning))
    if s.predictions is not None:
        out["predicted_step_time_s"] = s.predictions.step_time_s
        out["predicted_peak_mem_gib"] = s.predictions.peak_mem_gib
    out.update(s.notes)
    return out


@pytest.mark.parametrize("path", V1_FILES, ids=[p.stem for p in V1_FILES])
def test_v1_summaries_migrate_without_loss(path: Path) -> None:
    raw = json.loads(path.read_text())
    assert raw["schema_version"] == 1
    s = RunSummary.from_dict(copy.deepcopy(raw))
    assert s.schema_version == SUMMARY_SCHEMA_VERSION
    assert _as_v1_extra(s) == raw["extra"]
    for key, value in raw.items():  # the headline fields are read as they were written
        if key not in ("extra", "schema_version"):
            assert getattr(s, key) == value, key


def test_v1_epoch_run_reads_typed() -> None:
    raw = _v1("reproduce_sim_epoch")
    extra = raw["extra"]
    s = RunSummary.from_dict(raw)
    assert isinstance(s.context, RunContext)
    assert s.context.label == extra["label"] == "dcp_intra (paper mode)"
    assert s.context.away_from_default == ()  # cap 0.7, the default of every version-1 run
    assert s.epochs is not None and s.epochs.epochs_done == extra["epochs_done"]
    assert s.epochs.epoch_info == tuple(extra["epoch_info"])
    assert s.predictions is None  # a simulated run: no prediction beside a measurement
    assert isinstance(s.cost_description, CostDescription)
    assert s.cost_description.source == extra["cost"]["source"]


def test_v1_measured_run_keeps_predictions_and_executor_facts() -> None:
    raw = _v1("reproduce_torch_measured")
    s = RunSummary.from_dict(raw)
    assert s.predictions is not None
    assert s.predictions.step_time_s == raw["extra"]["predicted_step_time_s"]
    assert s.executor_info["memory_measure"] == raw["extra"]["memory_measure"]
    assert s.epochs is None


def test_v1_without_context_is_read_from_what_it_has() -> None:
    raw = _v1("cpu_train_dcp_s0")
    s = RunSummary.from_dict(raw)
    assert s.context is None and s.planning is None
    assert s.training is not None and list(s.training.losses) == raw["extra"]["losses"]
    assert s.world_size == raw["extra"]["world_size"]


def test_missing_version_is_version_1_and_a_cut_run_is_recognised() -> None:
    raw = _v1("reproduce_sim_epoch")
    del raw["schema_version"]
    raw["status"], raw["step_time_s"] = "timeout", None
    raw["extra"]["limit"] = "budget"
    s = RunSummary.from_dict(raw)
    assert s.context is not None and s.context.limit == "budget" and s.cut_by_budget


def test_a_cap_away_from_the_v1_default_is_recorded() -> None:
    raw = _v1("reproduce_sim_epoch")
    raw["extra"]["mem_cap_fraction"] = 0.35
    s = RunSummary.from_dict(raw)
    assert s.context is not None and s.context.away_from_default == ("mem_cap_fraction",)


def test_bad_typed_field_is_named() -> None:
    data = migrate_v1(_v1("reproduce_sim_epoch"))
    data["planning"]["retunes"] = "many"
    with pytest.raises(TypeError, match=r"'planning\.retunes' is 'many'.*expected an integer"):
        RunSummary.from_dict(data)
    data = migrate_v1(_v1("reproduce_sim_epoch"))
    del data["context"]["label"]
    with pytest.raises(TypeError, match=r"'context\.label' is missing"):
        RunSummary.from_dict(data)


def test_newer_summary_version_is_refused() -> None:
    data = migrate_v1(_v1("reproduce_sim_epoch"))
    data["schema_version"] = SUMMARY_SCHEMA_VERSION + 1
    with pytest.raises(ValueError, match="newer"):
        RunSummary.from_dict(data)


def _spec(*overrides: str) -> Any:
    cfg = to_container(
        load_config(
            [
                "workload=sharegpt",
                "cluster=cpu",
                "model=tiny_llama",
                "method=bucket_static",
                "steps=2",
                "warmup_steps=1",
                *overrides,
            ]
        )
    )
    return parse_run_spec(cfg)


def test_written_summary_reads_back_equal(tmp_path: Path) -> None:
    spec = _spec(f"run.root={tmp_path}", "mem_cap_fraction=0.5")
    written = run_simulated(spec)
    assert written.status == "ok", written.error
    again = read_summary(tmp_path / spec.campaign / spec.run_id)
    assert again == written
    raw = json.loads((tmp_path / spec.campaign / spec.run_id / "run.json").read_text())
    assert raw["schema_version"] == SUMMARY_SCHEMA_VERSION and "extra" not in raw
    assert written.context is not None
    assert written.context.mem_cap_fraction == 0.5
    assert written.context.away_from_default == ("mem_cap_fraction",)
    assert written.planning is not None and written.outcome is not None
    assert written.world_size == spec.world_size


def test_mem_cap_fraction_default_and_check_are_the_tables() -> None:
    cfg = to_container(load_config([]))
    assert cfg["mem_cap_fraction"] == MEM_CAP_FRACTION.default  # the YAML lists the table's value
    assert _spec().mem_cap_fraction == MEM_CAP_FRACTION.default
    assert _spec().away_from_default == ()
    for bad in ("0", "1.5", "abc"):
        with pytest.raises(ConfigError, match=rf"mem_cap_fraction={bad!r}|mem_cap_fraction={bad}"):
            _spec(f"mem_cap_fraction={bad}")


def test_a_v1_extra_that_is_not_an_object_is_named() -> None:
    raw = _v1("reproduce_sim_epoch")
    raw["extra"] = "oops"
    with pytest.raises(TypeError, match=r"field 'extra' is 'oops'; expected an object"):
        RunSummary.from_dict(raw)
