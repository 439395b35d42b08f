"""Run ids of the committed reproduction stay findable, and a registered workload is one run
whichever way a config names the registry.

A run id carries the hash of the run's parsed spec, in which a registered workload is named by
the registry, not by the ``_target_`` spelling (the committed reproduction was made when configs
said ``dcp_bench.workload.load_workload``). The ids composed now, or the earlier ids the migration
table (`dcp_bench.run_ids`) maps them to, must be the committed ones."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dcp_bench.campaign.reproduce import calibration_profile
from dcp_bench.campaign.reproduce_config import load_reproduce_config
from dcp_bench.campaign.sweep import plan_sweep
from dcp_bench.config import load_config, to_container
from dcp_bench.run.spec import cell_hashes
from dcp_bench.run_ids import earlier_run_ids
from dcp_bench.workloads import LEGACY_REGISTRY_TARGET, REGISTRY_TARGET, make_workload

REPO = Path(__file__).resolve().parent.parent
COMMITTED = REPO / "reports" / "reproduce"
RUN_ID = re.compile(
    r"[A-Za-z0-9_.-]+__[A-Za-z0-9_.-]+__[A-Za-z0-9_.-]+__[A-Za-z0-9_.-]+__[0-9a-f]{12}__s[0-9]+"
)


def _committed_ids() -> set[str]:
    ids: set[str] = set()
    for path in (COMMITTED / "summary.json", COMMITTED / "tables" / "runs.csv"):
        ids.update(RUN_ID.findall(path.read_text()))
    return ids


def _composed_ids(section_name: str, executor: str) -> list[set[str]]:
    """The run ids `dcp-bench reproduce` composes for one section's first seed, as
    `dcp_bench.campaign.reproduce.plan_section` composes them (a calibrating section's runs are
    priced with this machine's calibration, `cost.profile`, as the committed report's were)."""
    cfg = load_reproduce_config([])
    section = next(s for s in cfg.sections if s.name == section_name)
    profile = calibration_profile(cfg, section)
    ids = []
    for grid in section.grids:
        base = [
            *section.common_in(cfg),
            *grid,
            "run.campaign=reproduce",
            "run.root=runs",
            *cfg.grid_keys(),
            *([f"cost.profile={profile}"] if profile else []),
            f"seed={cfg.seed_base}",
        ]
        for s in plan_sweep([*base, f"run.executor={executor}"], repeats=1, sweep=section_name):
            ids.append({s.run_id, *(old for old, _ in earlier_run_ids(s.run_id, s.config_hash))})
    return ids


@pytest.mark.parametrize(
    ("section", "executor"), [("real_cpu", "torch"), ("text", "sim"), ("paper_h200", "sim")]
)
def test_shipped_configs_compose_the_committed_run_ids(section: str, executor: str) -> None:
    ids = _composed_ids(section, executor)
    assert ids
    committed = _committed_ids()
    missing = sorted(min(found) for found in ids if not found & committed)
    assert not missing, f"run ids not in reports/reproduce: {missing}"


def _config(target: str | None) -> dict:
    cfg = to_container(load_config(["workload=sharegpt", "cluster=cpu", "model=tiny_llama"]))
    cfg["workload"].pop("_target_", None)
    if target:
        cfg["workload"]["_target_"] = target
    return cfg


def test_every_spelling_of_the_registry_hashes_alike_and_a_users_class_does_not() -> None:
    assert cell_hashes(_config(REGISTRY_TARGET)) == cell_hashes(_config(LEGACY_REGISTRY_TARGET))
    # no target at all is the registry too
    assert cell_hashes(_config(None)) == cell_hashes(_config(REGISTRY_TARGET))
    assert cell_hashes(_config("my_pkg.MyWorkload")) != cell_hashes(_config(REGISTRY_TARGET))


@pytest.mark.parametrize("target", [REGISTRY_TARGET, LEGACY_REGISTRY_TARGET, None])
def test_every_spelling_builds_the_same_registered_workload(target: str | None) -> None:
    node = {"name": "synthetic_fixed", "length": 777, **({"_target_": target} if target else {})}
    batch = make_workload(node, seed=5).global_batch(step=2, world_size=2)
    assert batch.tokens.tolist() == [777] * len(batch.tokens) and len(batch.tokens) >= 1
