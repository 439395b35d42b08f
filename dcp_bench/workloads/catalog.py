"""The workload configs as the ``dcp-bench workloads`` command shows them: `list_workloads` (one
row per config, packaged or a user's), `load_named_workload` (one config with overrides, built
with the run's seed as every command builds it) and `batch_document` (one step's global batch as
JSON-ready data)."""

from __future__ import annotations

from typing import Any

from dcp_bench.batch import GlobalBatch
from dcp_bench.config import (
    EXTRA_CONF_KEY,
    SEED_DEFAULT,
    group_choices,
    load_config,
    to_container,
)
from dcp_bench.errors import ConfigError
from dcp_bench.workloads.registry import WORKLOADS, make_workload
from dcp_bench.workloads.workload import Workload


def _config_overrides(items: list[str]) -> list[str]:
    """Overrides as every command spells them; a bare workload parameter gets the one spelling."""
    out = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(
                f"bad override {item!r}: expected key=value (e.g. workload.length_scale=8)"
            )
        bare = key.lstrip("+~")
        if "." not in bare and bare not in ("seed", "extra_conf", "lengths_file"):
            raise ConfigError(
                f"{item}: workload parameters are spelled workload.{bare}={value} (the same key as "
                "in simulate, sweep and train)"
            )
        out.append(item)
    return out


def load_named_workload(name: str, overrides: list[str]) -> Workload:
    """The workload config ``name`` with overrides, built with the run's seed, as every command
    does."""
    cfg = to_container(load_config([f"workload={name}", *_config_overrides(overrides)]))
    return make_workload(cfg["workload"], seed=int(cfg.get("seed", SEED_DEFAULT)))


def list_workloads(overrides: list[str]) -> list[dict[str, Any]]:
    """One row per workload config: its name, kind, default model, version and description."""
    dirs = [ov.split("=", 1)[1] for ov in overrides if ov.split("=", 1)[0] == EXTRA_CONF_KEY]
    bad = [ov for ov in overrides if ov.split("=", 1)[0] != EXTRA_CONF_KEY]
    if bad:
        raise ConfigError(f"workloads list takes extra_conf=DIR only; got {bad[0]!r}")
    rows = []
    for name in group_choices("workload", dirs):
        node = to_container(load_config([*overrides, f"workload={name}"]))["workload"]
        entry = WORKLOADS.get(str(node.get("name")))
        rows.append(
            {
                "name": name,
                "kind": node.get("kind") or (entry.kind if entry else "?"),
                "default_model": entry.default_model if entry else "-",
                "version": str(node.get("version") or (entry.version if entry else "1")),
                "description": node.get("description") or (entry.description if entry else ""),
            }
        )
    return rows


def batch_document(name: str, batch: GlobalBatch, world_size: int) -> dict[str, Any]:
    """The global batch of one step of workload ``name`` as ``dcp-bench workloads batch`` prints
    it."""
    return {
        "workload": name, "step": batch.step, "world_size": world_size,
        "n": batch.n, "total_tokens": batch.total_tokens, "truncated": batch.truncated,
        "dropped": batch.dropped, "info": batch.info,
        "sample_ids": batch.sample_ids.tolist(), "tokens": batch.tokens.tolist(),
        "frames": batch.frames.tolist(),
    }  # fmt: skip
