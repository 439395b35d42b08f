"""Run ids of the committed campaigns written before run ids were hashed from the typed run spec.

Until schema version 2 a run's cell hash was the hash of its raw config dict (with patches that
kept ids stable when the packaged config came to list a key at its default, or spelled the
workload registry another way). Run ids are now hashed from the parsed spec
(`dcp_bench.run.spec.run_identity`), so those runs have other ids than a sweep computes today.
``results/run_id_migration.json`` maps each earlier cell hash (and context hash) of the committed
campaigns to the current one, once; it is written by ``scripts/migrate_run_ids.py`` from the
records themselves. A sweep that finds no record under a run's id looks for one under its earlier
ids (`earlier_run_ids`) and keeps it; the report reads an earlier record's hashes as the current
ones (`current_cell`, `current_context`), so earlier and new runs of one comparison pair.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from dcp_bench.errors import DcpBenchError
from dcp_bench.paths import RESULTS_DIR

MIGRATION_TABLE = RESULTS_DIR / "run_id_migration.json"


@functools.cache
def _table(path: Path = MIGRATION_TABLE) -> dict[str, dict[str, str]]:
    if not path.exists():
        return {"cells": {}, "contexts": {}}
    try:
        data: Any = json.loads(path.read_text())
        cells, contexts = data["cells"], data["contexts"]
        if not (isinstance(cells, dict) and isinstance(contexts, dict)):
            raise TypeError("cells and contexts must be objects")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DcpBenchError(
            f"{path}: not a run id migration table ({exc}); expected an object with the "
            "objects cells and contexts (earlier hash -> current hash)"
        ) from None
    return {"cells": dict(cells), "contexts": dict(contexts)}


@functools.cache
def _earlier(path: Path = MIGRATION_TABLE) -> dict[str, tuple[str, ...]]:
    out: dict[str, list[str]] = {}
    for old, new in sorted(_table(path)["cells"].items()):
        out.setdefault(new, []).append(old)
    return {k: tuple(v) for k, v in out.items()}


def current_cell(config_hash: str, path: Path = MIGRATION_TABLE) -> str:
    """The current cell hash of a record's ``config_hash`` (itself when it is current)."""
    return _table(path)["cells"].get(config_hash, config_hash)


def current_context(context_hash: str, path: Path = MIGRATION_TABLE) -> str:
    """The current context hash of a record's ``context_hash`` (itself when it is current)."""
    return _table(path)["contexts"].get(context_hash, context_hash)


def earlier_run_ids(
    run_id: str, config_hash: str, path: Path = MIGRATION_TABLE
) -> list[tuple[str, str]]:
    """(earlier run id, its cell hash) pairs of a run whose current id is ``run_id``: the same
    name with an earlier cell hash in place of ``config_hash``. Empty when the table holds none."""
    stem, sep, seed = run_id.rpartition("__s")
    head, _, cell = stem.rpartition("__")
    if not sep or cell != config_hash:
        return []
    return [(f"{head}__{old}__s{seed}", old) for old in _earlier(path).get(config_hash, ())]
