"""System-level validation: the simulator against published end-to-end measurements of the
systems it simulates (``results/validation/systems.yaml``), which the verdict rule rests on.

A published measurement validates; it never calibrates. Each system names the rows the publication
measured (a method selector and the published figure in the publication's unit) and the claim
whose comparison it checks. `validate_system` compares simulated per-seed figures with the
published ones, absolute and as speedups over the system's baseline; the claims engine's
`dcp_bench.report.claims.verdict_rule` lets a simulated verdict stand ("reproduced" / "not
reproduced") only when the simulator's error on the claimed comparison is within the claim's
tolerance, and otherwise says "undecided" with the reason in words.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from dcp_bench.errors import ConfigError

SYSTEM_KEYS = (
    "id",
    "system",
    "claim",
    "hardware",
    "source",
    "unit",
    "metric",
    "scale",
    "context",
    "overrides",
    "seeds",
    "baseline",
    "claimed_comparison",
    "rows",
)
# Optional: ``check_rows: true`` makes every simulated row's own figure part of the rule (within
# the claim's tolerance of the published one, plus ``reading_error`` in the publication's unit
# where the figure was read off a chart), beside the claimed comparison.
SYSTEM_OPTIONAL = ("check_rows", "reading_error")
ROW_KEYS = ("id", "label", "select", "published")
# mean_step_time_s: the mean of a run's measured step times (a publication's average iteration
# time), from the step records
METRICS = ("latent_tokens_per_s", "tokens_per_s", "step_time_s", "mean_step_time_s")
# The columns of a validated row, in the order every table of them shows them.
ROW_FIELDS = (
    "published",
    "simulated",
    "error",
    "published_speedup",
    "simulated_speedup",
    "speedup_error",
    "seeds",
)


@dataclass(frozen=True)
class SystemRow:
    """One published figure: the method as the publication ran it (a claims-file selector:
    method, mode, params) and its value in the publication's unit."""

    id: str
    label: str
    select: dict[str, Any]
    published: float


@dataclass(frozen=True)
class PublishedSystem:
    """A publication's end-to-end measurement of one system (module docstring)."""

    id: str
    system: str
    claim: str
    hardware: str
    source: str
    unit: str
    metric: str
    scale: float
    context: dict[str, str]
    overrides: tuple[str, ...]
    seeds: tuple[int, ...]
    baseline: str
    claimed_comparison: dict[str, str]
    rows: tuple[SystemRow, ...]
    check_rows: bool = False
    reading_error: float = 0.0

    def row(self, row_id: str) -> SystemRow:
        for r in self.rows:
            if r.id == row_id:
                return r
        raise ConfigError(
            f"system {self.id!r}: no row {row_id!r}; rows: {', '.join(r.id for r in self.rows)}"
        )

    def run_overrides(self, row: SystemRow, seed: int) -> list[str]:
        """The command-line overrides that simulate ``row`` as the publication ran it."""
        sel = row.select
        out = [f"{k}={v}" for k, v in self.context.items()]
        out += [f"method={sel['method']}"]
        if "mode" in sel:
            out.append(f"method.mode={sel['mode']}")
        out += [f"method.{k}={v}" for k, v in (sel.get("params") or {}).items()]
        return [*out, *self.overrides, f"seed={seed}"]


def _row(system: str, raw: Any) -> SystemRow:
    if not isinstance(raw, dict) or set(raw) != set(ROW_KEYS):
        got = sorted(raw) if isinstance(raw, dict) else type(raw).__name__
        raise ConfigError(f"system {system!r}: row {got}: expected the keys {', '.join(ROW_KEYS)}")
    sel = raw["select"]
    if not isinstance(sel, dict) or "method" not in sel:
        raise ConfigError(f"system {system!r}, row {raw['id']!r}: select needs a method")
    value = raw["published"]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(
            f"system {system!r}, row {raw['id']!r}: published={value!r}; expected a number > 0"
        )
    return SystemRow(str(raw["id"]), str(raw["label"]), dict(sel), float(value))


def load_systems(path: str | os.PathLike[str]) -> list[PublishedSystem]:
    """The systems file, checked: every key present, no unknown key, rows well formed, the
    baseline and the claimed comparison naming rows."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"systems file {str(path)!r} not found")
    data = yaml.safe_load(path.read_text()) or {}
    out = []
    for raw in data.get("systems") or []:
        sid = raw.get("id", "?") if isinstance(raw, dict) else "?"
        have = set(raw) - set(SYSTEM_OPTIONAL) if isinstance(raw, dict) else set()
        if not isinstance(raw, dict) or have != set(SYSTEM_KEYS):
            missing, unknown = set(SYSTEM_KEYS) - have, have - set(SYSTEM_KEYS)
            raise ConfigError(
                f"system {sid!r} in {path}: missing {sorted(missing)}, unknown {sorted(unknown)}"
            )
        if raw["metric"] not in METRICS:
            raise ConfigError(
                f"system {sid!r}: metric {raw['metric']!r}; expected one of {', '.join(METRICS)}"
            )
        rows = tuple(_row(sid, r) for r in raw["rows"])
        sys_ = PublishedSystem(
            str(sid),
            str(raw["system"]),
            str(raw["claim"]),
            str(raw["hardware"]),
            " ".join(str(raw["source"]).split()),
            str(raw["unit"]),
            str(raw["metric"]),
            float(raw["scale"]),
            {k: str(v) for k, v in dict(raw["context"]).items()},
            tuple(str(o) for o in raw["overrides"]),
            tuple(int(s) for s in raw["seeds"]),
            str(raw["baseline"]),
            {k: str(v) for k, v in dict(raw["claimed_comparison"]).items()},
            rows,
            check_rows=bool(raw.get("check_rows", False)),
            reading_error=float(raw.get("reading_error", 0.0)),
        )
        if not isinstance(raw.get("check_rows", False), bool) or not sys_.reading_error >= 0:
            raise ConfigError(
                f"system {sid!r}: check_rows={raw.get('check_rows')!r}, reading_error="
                f"{raw.get('reading_error')!r}; expected true or false and a number >= 0"
            )
        for rid in (sys_.baseline, *sys_.claimed_comparison.values()):
            sys_.row(rid)
        out.append(sys_)
    return out


def system_for_claim(systems: Sequence[PublishedSystem], claim_id: str) -> PublishedSystem | None:
    """The system whose published measurement validates ``claim_id`` (the first one naming it)."""
    return next((s for s in systems if s.claim == claim_id), None)


@dataclass
class SystemValidation:
    """A system's rows simulated against the publication; ``claimed_error`` is the simulator's
    error on the claimed comparison's speedup (simulated / published - 1), NaN when it could
    not be simulated."""

    system: PublishedSystem
    rows: list[dict[str, Any]] = field(default_factory=list)
    claimed_error: float = math.nan
    claimed_simulated: float = math.nan
    claimed_published: float = math.nan
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        s = self.system
        return {
            "id": s.id,
            "system": s.system,
            "claim": s.claim,
            "hardware": s.hardware,
            "source": s.source,
            "unit": s.unit,
            "context": s.context,
            "rows": self.rows,
            "claimed_comparison": {
                **s.claimed_comparison,
                "published_speedup": _clean(self.claimed_published),
                "simulated_speedup": _clean(self.claimed_simulated),
                "error": _clean(self.claimed_error),
            },
            "note": self.note,
        }


def _clean(x: float) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def _median_ratio(num: Mapping[int, float], den: Mapping[int, float]) -> float:
    seeds = sorted(set(num) & set(den))
    ratios = [num[s] / den[s] for s in seeds if den[s] and math.isfinite(num[s] / den[s])]
    return float(np.median(ratios)) if ratios else math.nan


def rows_missed(validation: SystemValidation, tolerance: float) -> list[dict[str, Any]]:
    """The simulated rows whose own figure misses the published one by more than ``tolerance``
    (relative) plus the system's ``reading_error`` (absolute); none unless ``check_rows``."""
    s = validation.system
    if not s.check_rows:
        return []
    out = []
    for row in validation.rows:
        sim, pub = row.get("simulated"), float(row["published"])
        if sim is not None and abs(float(sim) - pub) > tolerance * pub + s.reading_error:
            out.append(row)
    return out


def validate_system(
    system: PublishedSystem, simulated: Mapping[str, Mapping[int, float]], note: str = ""
) -> SystemValidation:
    """Compare per-seed simulated figures (``simulated[row id][seed]``, in the metric's own unit)
    with the publication: per row the median over seeds in the publication's unit and the
    speedup over the baseline (median of per-seed ratios; for a time metric the inverse ratio),
    each with its error (simulated / published - 1)."""
    base = system.row(system.baseline)
    time_metric = system.metric.endswith("_s") and not system.metric.endswith("per_s")
    out = SystemValidation(system, note=note)
    speed: dict[str, float] = {}
    for r in system.rows:
        per_seed = {int(k): float(v) for k, v in (simulated.get(r.id) or {}).items()}
        value = float(np.median(list(per_seed.values()))) * system.scale if per_seed else math.nan
        b = {int(k): float(v) for k, v in (simulated.get(base.id) or {}).items()}
        sim_sp = _median_ratio(b, per_seed) if time_metric else _median_ratio(per_seed, b)
        pub_sp = (base.published / r.published) if time_metric else (r.published / base.published)
        speed[r.id] = sim_sp
        out.rows.append(
            {
                "id": r.id,
                "label": r.label,
                "published": r.published,
                "simulated": _clean(value),
                "error": _clean(value / r.published - 1.0),
                "published_speedup": pub_sp,
                "simulated_speedup": _clean(sim_sp),
                "speedup_error": _clean(sim_sp / pub_sp - 1.0),
                "seeds": len(per_seed),
            }
        )
    cm = system.claimed_comparison
    m, b_ = system.row(cm["method"]), system.row(cm["baseline"])
    pub = (b_.published / m.published) if time_metric else (m.published / b_.published)
    if b_.id == base.id:
        sim = speed[m.id]
    else:
        sim = speed[m.id] / speed[b_.id]
    out.claimed_published, out.claimed_simulated = pub, sim
    out.claimed_error = sim / pub - 1.0
    return out


__all__ = [
    "ROW_FIELDS",
    "rows_missed",
    "PublishedSystem",
    "SystemRow",
    "SystemValidation",
    "load_systems",
    "system_for_claim",
    "validate_system",
]
