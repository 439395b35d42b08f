"""The typed parts of a run summary (``run.json``) and the one codec that writes and reads them.

A summary (`dcp_bench.records.RunSummary`) holds, beside its headline numbers, what the run was
(`RunContext`), the cost model that priced it (`CostDescription`), the rates and medians beyond
the headline (`RunOutcome`), a trained run's curves (`TrainingCurves`), the epoch unit's
accounting (`EpochAccounting`), what planning cost (`PlanningCost`) and, on a measured executor,
the cost model's predictions of the same plans (`Predictions`). Each is a frozen dataclass: the
loop writes them (`dcp_bench.run.loop`) and the report reads their fields, so a key renamed on
one side is a type error, not a silent fallback.

Versions: ``SUMMARY_SCHEMA_VERSION`` is written with every summary. Version 1 (or no version)
is the earlier layout, with all of these in one untyped ``extra`` mapping; `migrate_v1` turns it
into this layout once, when it is read (`decode_record`), so records on disk stay as written.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

SUMMARY_SCHEMA_VERSION = 2
STEP_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class NoiseRecord:
    """The simulator's seeded run-to-run variation (`dcp_bench.sim.NoiseModel`), when active."""

    jitter_sigma: float
    straggler_prob: float
    straggler_slowdown: float


@dataclass(frozen=True)
class WorkloadRecord:
    """What a documented workload says of itself: description and provenance (data file and its
    SHA-256, source, licence)."""

    description: str
    provenance: dict[str, Any]


@dataclass(frozen=True)
class RunContext:
    """What the run was: the method's label and mode, the comparison context it pairs in, how it
    was asked for, the cost-model variant and memory cap, and how planning time was charged."""

    label: str  # the method's name, "(paper mode)" appended in paper mode
    mode: str  # fair | paper
    context_hash: str  # the cell hash without the method: the runs a comparison pairs
    sweep: str
    overrides: tuple[str, ...]  # the command line's overrides
    target: str  # the planner class (``method._target_``)
    # the cost-model variant: the scales and the options that vary a term (not at their default)
    scales: dict[str, Any]
    mem_cap_fraction: float
    # the run's top-level parameters set away from their declared default
    # (`dcp_bench.config.PARAMETERS`): the report's "default" cells are those that set none
    away_from_default: tuple[str, ...]
    planner_clock: str
    planner_time: str
    noise: NoiseRecord | None  # None: no noise
    workload: WorkloadRecord | None  # None: a workload that documents nothing
    limit: str | None = None  # "budget": a sweep's deadline cut the run, not its own timeout_s


@dataclass(frozen=True)
class CostDescription:
    """The cost model that priced the run (`dcp_bench.cost.base.CostModel.describe`): source,
    model, cluster, memory cap, and the source's own provenance (profile path and hash, fit
    error, scales)."""

    source: str
    model: str
    cluster: str
    mem_cap_fraction: float
    provenance: dict[str, Any]

    def as_flat(self) -> dict[str, Any]:
        """The description as the cost model gives it (provenance keys beside the named ones)."""
        return {
            "source": self.source,
            "model": self.model,
            "cluster": self.cluster,
            "mem_cap_fraction": self.mem_cap_fraction,
            **self.provenance,
        }

    @classmethod
    def from_flat(cls, data: Mapping[str, Any]) -> CostDescription:
        named = ("source", "model", "cluster", "mem_cap_fraction")
        missing = [k for k in named if k not in data]
        if missing:
            raise TypeError(f"cost description without {', '.join(missing)}")
        return cls(
            source=str(data["source"]),
            model=str(data["model"]),
            cluster=str(data["cluster"]),
            mem_cap_fraction=float(data["mem_cap_fraction"]),
            provenance={k: v for k, v in data.items() if k not in named},
        )


@dataclass(frozen=True)
class RunOutcome:
    """Rates and medians over the measured steps beyond the summary's headline fields."""

    samples_per_s: float | None  # None unless the run finished ok with measured time
    comm_share: float | None
    executed_s: float | None  # the executed step time, before planning is charged
    over_cap_steps: int  # measured steps whose peak memory passed the cost model's cap
    lower_bound_physical_s: float | None  # the machine's bound (sim.BOUND_ASSUMPTIONS)


@dataclass(frozen=True)
class TrainingCurves:
    """Per step (warm-up included) of a run that computes a loss: loss, gradient norm, step
    time."""

    losses: tuple[float | None, ...]
    grad_norms: tuple[float | None, ...]
    step_times_s: tuple[float | None, ...]


@dataclass(frozen=True)
class EpochAccounting:
    """The epoch unit's accounting (``run.unit=epoch``): epochs asked and done, iterations,
    epoch time and tokens, each epoch's account of its samples, and the reference's latent-voxel
    throughput where the run counts it."""

    epochs: int
    epochs_done: int
    iterations: int
    epoch_time_s: float | None
    epoch_tokens: float
    epoch_info: tuple[dict[str, Any], ...]
    latent_tokens_per_s: float | None = None


@dataclass(frozen=True)
class PlanningCost:
    """What planning cost the run, warm-up steps included (`dcp_bench.run.loop.planning_cost`)."""

    offline_tune_total_s: float
    retunes: int
    planner_max_ms: float | None
    planner_over_budget_steps: int


@dataclass(frozen=True)
class Predictions:
    """A measured run's cost-model prediction of its own plans: the median step time and the
    largest peak memory."""

    step_time_s: float | None
    peak_mem_gib: float | None


# ------------------------------------------------------------------------------------------------
# Decoding: JSON values into the records' types, every mismatch named


def type_ok(value: Any, hint: Any) -> bool:
    """Whether a JSON value fits a scalar or container type hint (numbers for floats, no bools
    for numbers)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(type_ok(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is Any:
        return True
    if origin is Literal:
        return value in typing.get_args(hint)
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if origin is dict or hint is dict:
        return isinstance(value, dict)
    if origin in (list, tuple):
        args = [a for a in typing.get_args(hint) if a is not Ellipsis] or [Any]
        return isinstance(value, (list, tuple)) and all(type_ok(v, args[0]) for v in value)
    if dataclasses.is_dataclass(hint):
        return isinstance(value, dict)
    return True


def hint_text(hint: Any) -> str:
    """A type hint in words, for errors."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(hint_text(h) for h in typing.get_args(hint))
    if hint is type(None):
        return "null"
    if origin is Literal:
        return "one of " + ", ".join(map(str, typing.get_args(hint)))
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}
    if hint in names:
        return names[hint]
    if origin is dict or hint is dict or dataclasses.is_dataclass(hint):
        return "an object"
    if origin in (list, tuple):
        return (
            "a list of "
            + hint_text(typing.get_args(hint)[0]).removeprefix("a ").removeprefix("an ")
            + "s"
        )
    return str(hint)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _decode_value(value: Any, hint: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return None
        records = [a for a in args if isinstance(a, type) and dataclasses.is_dataclass(a)]
        if records and isinstance(value, dict):
            return decode_record(records[0], value, where)
    elif isinstance(hint, type) and dataclasses.is_dataclass(hint) and isinstance(value, dict):
        return decode_record(hint, value, where)
    if not type_ok(value, hint):
        raise TypeError(
            f"field {where!r} is {_shown(value)} ({type(value).__name__}); expected "
            f"{hint_text(hint)}"
        )
    if origin is tuple:
        return tuple(value)
    return value


def decode_record(cls: type, data: Mapping[str, Any], where: str = "") -> Any:
    """``cls`` (a record dataclass) from its JSON object: keys it does not know are left out,
    missing required keys and values of the wrong type raise `TypeError` naming the field."""
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        path = f"{where}.{f.name}" if where else f.name
        if f.name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise TypeError(f"field {path!r} is missing")
            continue
        kwargs[f.name] = _decode_value(data[f.name], hints[f.name], path)
    return cls(**kwargs)


# ------------------------------------------------------------------------------------------------
# Version 1 (one untyped ``extra`` mapping) -> version 2


# The keys of a version-1 ``extra`` that the typed records hold; the rest were the executor's own
# facts (``executor.info``: parameter count, memory measure, threads, ...) or what a launcher
# noted of a run's end (a signal), and are kept as such.
_V1_CONTEXT = (
    "label",
    "mode",
    "context_hash",
    "sweep",
    "overrides",
    "target",
    "scales",
    "mem_cap_fraction",
    "planner_clock",
    "planner_time",
    "noise",
)
_V1_OUTCOME = (
    "samples_per_s",
    "comm_share",
    "executed_s",
    "over_cap_steps",
    "lower_bound_physical_s",
)
_V1_CURVES = ("losses", "grad_norms", "step_times_s")
_V1_EPOCH = (
    "unit",
    "epochs",
    "epochs_done",
    "iterations",
    "epoch_time_s",
    "epoch_tokens",
    "epoch_info",
    "latent_tokens_per_s",
)
_V1_PLANNING = ("offline_tune_total_s", "retunes", "planner_max_ms", "planner_over_budget_steps")
_V1_PREDICTIONS = ("predicted_step_time_s", "predicted_peak_mem_gib")
_V1_NOTES = ("signal", "signal_name", "note", "limit")
# Version 1 wrote no record of which parameters a run set away from their default: the report
# compared the memory cap with this value, the default of every version-1 run.
V1_MEM_CAP_DEFAULT = 0.7


def migrate_v1(data: Mapping[str, Any]) -> dict[str, Any]:
    """A version-1 summary (or one without a version) in the version-2 layout: the ``extra``
    mapping split into the typed records, each present only where version 1 wrote its keys.
    Values are moved, never recomputed; a record version 1 wrote only in part is left out (its
    keys stay with the executor's facts) rather than filled with guesses."""
    out = {k: v for k, v in data.items() if k != "extra"}
    if not isinstance(data.get("extra") or {}, dict):
        raise TypeError(f"field 'extra' is {_shown(data.get('extra'))}; expected an object")
    extra = dict(data.get("extra") or {})
    claimed: set[str] = set()

    def take(keys: tuple[str, ...]) -> bool:
        if all(k in extra for k in keys):
            claimed.update(keys)
            return True
        return False

    out["world_size"] = extra.get("world_size")
    claimed.add("world_size")
    if take(_V1_CONTEXT):
        cap = extra["mem_cap_fraction"]
        scales = extra["scales"] or {}
        away = ["mem_cap_fraction"] if not _close(cap, V1_MEM_CAP_DEFAULT) else []
        workload = extra.get("workload")
        if isinstance(workload, dict):
            claimed.add("workload")
        out["context"] = {
            **{k: extra[k] for k in _V1_CONTEXT},
            "scales": scales,
            "away_from_default": away,
            "workload": workload if isinstance(workload, dict) else None,
            "limit": extra.get("limit"),
        }
        claimed.add("limit")
    if isinstance(extra.get("cost"), dict):
        claimed.add("cost")
        out["cost_description"] = (
            dataclasses.asdict(CostDescription.from_flat(extra["cost"])) if extra["cost"] else None
        )
    if take(_V1_OUTCOME):
        out["outcome"] = {k: extra[k] for k in _V1_OUTCOME}
    if take(_V1_CURVES):
        out["training"] = {k: extra[k] for k in _V1_CURVES}
    if extra.get("unit") == "epoch" and take(_V1_EPOCH[1:-1]):
        claimed.update(("unit", "latent_tokens_per_s"))
        out["epochs"] = {k: extra.get(k) for k in _V1_EPOCH[1:]}
    elif extra.get("unit") == "step":
        claimed.add("unit")
    if take(_V1_PLANNING):
        out["planning"] = {k: extra[k] for k in _V1_PLANNING}
    if take(_V1_PREDICTIONS):
        out["predictions"] = {
            "step_time_s": extra["predicted_step_time_s"],
            "peak_mem_gib": extra["predicted_peak_mem_gib"],
        }
    notes = {k: extra[k] for k in _V1_NOTES if k in extra and k not in claimed}
    claimed.update(notes)
    if notes:
        out["notes"] = notes
    out["executor_info"] = {k: v for k, v in extra.items() if k not in claimed}
    out["schema_version"] = SUMMARY_SCHEMA_VERSION
    return out


def _close(a: Any, b: float) -> bool:
    return isinstance(a, (int, float)) and math.isclose(float(a), b)


def summary_version(data: Mapping[str, Any]) -> int:
    """The schema version a summary object declares (1 when it declares none)."""
    version = data.get("schema_version", 1)
    if isinstance(version, bool) or not isinstance(version, int):
        raise TypeError(f"schema_version {version!r}: expected an integer")
    if version > SUMMARY_SCHEMA_VERSION:
        raise ValueError(
            f"record schema_version {version} is newer than this dcp-bench "
            f"({SUMMARY_SCHEMA_VERSION})"
        )
    return version


def upgrade_summary(data: Mapping[str, Any]) -> dict[str, Any]:
    """A summary object in the current layout, migrated once from an earlier version."""
    if summary_version(data) < SUMMARY_SCHEMA_VERSION:
        return migrate_v1(data)
    return dict(data)
