"""Run ids survive the move of `dcp_bench.workload` to the `dcp_bench.workloads` package.

A run id carries the hash of the run's config, which holds the workload node's ``_target_``. The
shipped configs now name the registry ``dcp_bench.workloads.load_workload``; the committed
reproduction (reports/reproduce, resumed by run id) was made when they said
``dcp_bench.workload.load_workload``. The ids composed now must be the committed ones."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dcp_bench.campaign.reproduce_config import load_reproduce_config
from dcp_bench.campaign.sweep import plan_sweep
from dcp_bench.run.spec import cell_hashes
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


def _composed_ids(section_name: str, executor: str) -> list[str]:
    """The run ids `dcp-bench reproduce` composes for one section's first seed, as
    `dcp_bench.campaign.reproduce.plan_section` composes them."""
    cfg = load_reproduce_config([])
    section = next(s for s in cfg.sections if s.name == section_name)
    ids = []
    for grid in section.grids:
        base = [
            *section.common_in(cfg),
            *grid,
            "run.campaign=reproduce",
            "run.root=runs",
            *cfg.grid_keys(),
            f"seed={cfg.seed_base}",
        ]
        ids += [
            s.run_id
            for s in plan_sweep([*base, f"run.executor={executor}"], repeats=1, sweep=section_name)
        ]
    return ids


@pytest.mark.parametrize(
    ("section", "executor"), [("real_cpu", "torch"), ("text", "sim"), ("paper_h200", "sim")]
)
def test_shipped_configs_compose_the_committed_run_ids(section: str, executor: str) -> None:
    ids = _composed_ids(section, executor)
    assert ids
    missing = sorted(set(ids) - _committed_ids())
    assert not missing, f"run ids not in reports/reproduce: {missing}"


def _config(target: str | None) -> dict:
    workload = {"name": "sharegpt", "length_scale": 8, **({"_target_": target} if target else {})}
    return {
        "seed": 3,
        "workload": workload,
        "method": {"_target_": "m.P", "name": "p"},
        "run": {"steps": 2},
    }


def test_both_spellings_of_the_registry_hash_alike_and_a_users_class_does_not() -> None:
    assert cell_hashes(_config(REGISTRY_TARGET)) == cell_hashes(_config(LEGACY_REGISTRY_TARGET))
    assert cell_hashes(_config("my_pkg.MyWorkload")) != cell_hashes(_config(LEGACY_REGISTRY_TARGET))
    # No target at all is a registered workload too, but a config that says so hashes as written.
    assert cell_hashes(_config(None)) != cell_hashes(_config(LEGACY_REGISTRY_TARGET))


@pytest.mark.parametrize("target", [REGISTRY_TARGET, LEGACY_REGISTRY_TARGET, None])
def test_every_spelling_builds_the_same_registered_workload(target: str | None) -> None:
    node = {"name": "synthetic_fixed", "length": 777, **({"_target_": target} if target else {})}
    batch = make_workload(node, seed=5).global_batch(step=2, world_size=2)
    assert batch.tokens.tolist() == [777] * len(batch.tokens) and len(batch.tokens) >= 1
