"""Claims as data: one YAML file per claim (``results/claims/<name>.yaml``), read into typed
dataclasses and checked before anything runs. docs/claims.md is the schema's reference.

A claim file holds the statement, its source (publication and table or figure), the setup
(workload, cluster, model), the claimed value and tolerance, the two cells that decide it
(``decide``: baseline and method selectors), the published cells that validate the simulator
(``validation``: a systems file and the system in it), and optionally the claim's readings,
paper-mode table, comparisons, sensitivity and model band. A *claims list* file
(``results/reference/claims.yaml``) names claim files (``claim_files``) and may also hold claims
inline in the older form (``claims``: each with ``context``, ``baseline``, ``method``).

Every error is one line naming the file, where the bad key or value stands and what was expected.
The engine (`dcp_bench.report.claims`) reads a `ClaimSet` through `ClaimSet.as_dict`, the form
its selectors and sections use."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dcp_bench.errors import ConfigError
from dcp_bench.report.system_validation import load_systems

# the cost sources a claim may be judged under (dcp_bench.cost.SOURCES, less auto)
COST_SOURCES = ("analytical", "profiled", "flexsp_fitted")
CLAIM_FILE_VERSION = 1
CLAIMS_DIR_NAME = "claims"

# The keys of a claim file, required first.
CLAIM_REQUIRED = ("id", "statement", "source", "setup", "value", "tolerance", "decide")
CLAIM_OPTIONAL = (
    "version",
    "name",
    "metric",
    "validation",
    "statistics",
    "readings",
    "paper_table",
    "comparisons",
    "sensitivity",
    "model_band",
)
SOURCE_KEYS = ("publication", "location", "detail")
SETUP_KEYS = ("workload", "cluster", "model")
# optional: the cost sources the claim is judged under (the first decides; every one is shown)
SETUP_OPTIONAL = ("cost_sources",)
SELECTOR_KEYS = ("method", "mode", "unit", "params", "pick")
# how a selector picks among its matching cells: closest to the defaults (no pick), or the
# fastest cell whose every run succeeded (a baseline hand-tuned over the swept settings)
PICKS = ("fastest",)
DECIDE_KEYS = ("baseline", "method")
VALIDATION_KEYS = ("systems", "system")
METRICS = ("throughput", "step_time")
MODES = ("paper", "fair")
UNITS = ("epoch", "step")
READING_KEYS = ("question", "reading", "headline", "baseline", "method", "context", "note")
COMPARISON_KEYS = ("id", "title", "context", "baseline", "method")
PAPER_TABLE_KEYS = ("methods", "workloads", "clusters")
SENSITIVITY_KEYS = ("constants", "factors", "also")
MODEL_BAND_KEYS = ("variants",)
VARIANT_KEYS = ("scales", "mem_cap_fraction")
STATISTICS_KEYS = ("max_relative_half_width", "pair_by")
# what the CI resamples: paired seeds, or paired steps (the same step = the same data on both
# sides, for workloads whose steps are fixed iterations, the same for every seed)
PAIR_BY = ("seed", "step")
# The claims list: claim files and inline claims in the older form.
LIST_KEYS = (
    "version",
    "claim_files",
    "claims",
    "validation",
    "statistics",
    "readings",
    "paper_table",
    "comparisons",
    "sensitivity",
    "model_band",
)


@dataclass(frozen=True)
class ClaimSource:
    """Where the claim is made: the publication, the table / figure / section, and how the
    claim's setting was read from it."""

    publication: str
    location: str
    detail: str = ""

    def text(self) -> str:
        return "; ".join(x for x in (self.publication, self.location, self.detail) if x)


@dataclass(frozen=True)
class ClaimSpec:
    """One claim, checked. Selectors stay mappings (method, mode?, unit?, params?), as the
    engine matches them against run records; the sections are kept as the file gives them
    (checked for their keys)."""

    id: str
    name: str
    statement: str
    source: ClaimSource
    setup: dict[str, Any]
    value: float
    tolerance: float
    metric: str
    baseline: dict[str, Any]
    method: dict[str, Any]
    path: str = ""
    validation_file: str | None = None  # absolute path of the systems file
    validation_system: str | None = None
    statistics: dict[str, Any] = field(default_factory=dict)
    readings: list[dict[str, Any]] = field(default_factory=list)
    paper_table: dict[str, Any] = field(default_factory=dict)
    comparisons: list[dict[str, Any]] = field(default_factory=list)
    sensitivity: dict[str, Any] = field(default_factory=dict)
    model_band: dict[str, Any] = field(default_factory=dict)

    def engine_claim(self) -> dict[str, Any]:
        """The claim as the engine's selectors read it."""
        return {
            "id": self.id,
            "statement": self.statement,
            "source": self.source.text(),
            "value": self.value,
            "tolerance": self.tolerance,
            "metric": self.metric,
            "context": {k: v for k, v in self.setup.items() if k not in SETUP_OPTIONAL},
            "baseline": self.baseline,
            "method": self.method,
            **(
                {"cost_sources": list(self.setup["cost_sources"])}
                if self.setup.get("cost_sources")
                else {}
            ),
            **(
                {"pair_by": self.statistics["pair_by"]}
                if self.statistics.get("pair_by", "seed") != "seed"
                else {}
            ),
        }


@dataclass(frozen=True)
class ClaimSet:
    """The claims one report judges: claim files and inline claims, in file order."""

    claims: tuple[ClaimSpec, ...]
    path: str
    # the older inline form's shared sections (claims lists only)
    shared: dict[str, Any] = field(default_factory=dict)

    def by_name(self, name: str) -> ClaimSpec:
        for c in self.claims:
            if name in (c.name, c.id):
                return c
        raise ConfigError(
            f"claim={name!r}: no such claim in {self.path}; expected one of "
            f"{', '.join(c.name for c in self.claims)}"
        )

    def as_dict(self) -> dict[str, Any]:
        """The engine's view: ``claims`` (each with context, baseline, method), ``readings``,
        ``comparisons`` (each claim's, in order), and per claim its ``paper_table``,
        ``sensitivity`` and ``model_band`` (one mapping when one claim has it, else a list),
        ``statistics`` and ``_systems`` (the validating systems)."""
        out: dict[str, Any] = {k: v for k, v in self.shared.items()}
        out["claims"] = [c.engine_claim() for c in self.claims]
        readings = list(self.shared.get("readings") or [])
        comparisons = list(self.shared.get("comparisons") or [])
        per_claim: dict[str, list[dict[str, Any]]] = {}
        for key in ("paper_table", "sensitivity", "model_band"):
            shared = self.shared.get(key)
            per_claim[key] = [shared] if shared else []
        systems: list[Any] = list(self.shared.get("_systems") or [])
        seen_files: set[str] = set()
        for c in self.claims:
            readings += [{**rd, "claim": c.id} for rd in c.readings] if c.path else []
            pair_by = c.statistics.get("pair_by", "seed")
            comparisons += [
                {**cmp, "pair_by": pair_by} if pair_by != "seed" else cmp for cmp in c.comparisons
            ]
            for key in ("paper_table", "sensitivity", "model_band"):
                spec = getattr(c, key)
                if spec:
                    per_claim[key].append({"claim": c.id, **spec})
            if c.statistics and "statistics" not in out:
                out["statistics"] = dict(c.statistics)
            if c.validation_file and c.validation_file not in seen_files:
                seen_files.add(c.validation_file)
                systems += load_systems(c.validation_file)
        if readings:
            out["readings"] = readings
        if comparisons:
            out["comparisons"] = comparisons
        for key, specs in per_claim.items():
            if specs:
                out[key] = specs[0] if len(specs) == 1 else specs
        if systems:
            out["_systems"] = systems
        return out


def _where(path: Path | str, at: str) -> str:
    return f"{path}: {at}" if at else str(path)


def _mapping(value: Any, path: Path | str, at: str, keys: tuple[str, ...]) -> dict[str, Any]:
    """``value`` as a mapping whose keys are all in ``keys`` (else a one-line error)."""
    if not isinstance(value, dict):
        raise ConfigError(
            f"{_where(path, at)}: {type(value).__name__} {value!r}; expected a mapping with "
            f"keys {', '.join(keys)}"
        )
    for k in value:
        if k not in keys:
            raise ConfigError(
                f"{_where(path, f'{at}.{k}' if at else str(k))}: unknown key; expected one of "
                f"{', '.join(keys)}"
            )
    return dict(value)


def _number(value: Any, path: Path | str, at: str, lo: float, hi: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > lo:
        want = f"a number > {lo:g}" + (f" and <= {hi:g}" if hi is not None else "")
        raise ConfigError(f"{_where(path, at)}: {value!r}; expected {want}")
    if hi is not None and value > hi:
        raise ConfigError(f"{_where(path, at)}: {value!r}; expected a number > {lo:g}, <= {hi:g}")
    return float(value)


def _text(value: Any, path: Path | str, at: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{_where(path, at)}: {value!r}; expected non-empty text")
    return " ".join(value.split())


def check_selector(value: Any, path: Path | str, at: str) -> dict[str, Any]:
    """A method selector: {method, mode?, unit?, params?}."""
    sel = _mapping(value, path, at, SELECTOR_KEYS)
    if "method" not in sel:
        raise ConfigError(f"{_where(path, at)}: no 'method'; expected a method name")
    _text(sel["method"], path, f"{at}.method")
    if "mode" in sel and sel["mode"] not in MODES:
        raise ConfigError(
            f"{_where(path, at + '.mode')}: {sel['mode']!r}; expected one of {', '.join(MODES)}"
        )
    if "unit" in sel and sel["unit"] not in UNITS:
        raise ConfigError(
            f"{_where(path, at + '.unit')}: {sel['unit']!r}; expected one of {', '.join(UNITS)}"
        )
    if "params" in sel and not isinstance(sel["params"], dict):
        raise ConfigError(f"{_where(path, at + '.params')}: {sel['params']!r}; expected a mapping")
    if "pick" in sel and sel["pick"] not in PICKS:
        raise ConfigError(
            f"{_where(path, at + '.pick')}: {sel['pick']!r}; expected one of {', '.join(PICKS)}"
        )
    return sel


def _selectors(value: Any, path: Path | str, at: str) -> None:
    for i, s in enumerate(value if isinstance(value, list) else [value]):
        check_selector(s, path, f"{at}[{i}]" if isinstance(value, list) else at)


def _list(value: Any, path: Path | str, at: str) -> list[Any]:
    if not isinstance(value, list):
        raise ConfigError(f"{_where(path, at)}: {type(value).__name__}; expected a list")
    return value


def _check_sections(raw: dict[str, Any], path: Path | str, at: str = "") -> None:
    """The optional sections a claim (or a claims list, older form) may carry."""
    pre = f"{at}." if at else ""
    if "statistics" in raw:
        st = _mapping(raw["statistics"], path, f"{pre}statistics", STATISTICS_KEYS)
        if "max_relative_half_width" in st:
            _number(
                st["max_relative_half_width"], path, f"{pre}statistics.max_relative_half_width", 0
            )
        if st.get("pair_by", "seed") not in PAIR_BY:
            raise ConfigError(
                f"{_where(path, f'{pre}statistics.pair_by')}: {st['pair_by']!r}; expected one of "
                f"{', '.join(PAIR_BY)}"
            )
    for i, rd in enumerate(_list(raw.get("readings", []), path, f"{pre}readings")):
        keys = READING_KEYS + (("claim",) if not at else ())
        rd = _mapping(rd, path, f"{pre}readings[{i}]", keys)
        for side in ("baseline", "method"):
            if side in rd:
                _mapping(rd[side], path, f"{pre}readings[{i}].{side}", SELECTOR_KEYS)
    for i, comp in enumerate(_list(raw.get("comparisons", []), path, f"{pre}comparisons")):
        comp = _mapping(comp, path, f"{pre}comparisons[{i}]", COMPARISON_KEYS)
        for key in ("id", "context", "baseline", "method"):
            if key not in comp:
                raise ConfigError(f"{_where(path, f'{pre}comparisons[{i}]')}: no {key!r}")
        ctx = _mapping(
            comp["context"], path, f"{pre}comparisons[{i}].context", SETUP_KEYS + ("cost_source",)
        )
        if "cost_source" in ctx and ctx["cost_source"] not in COST_SOURCES:
            raise ConfigError(
                f"{_where(path, f'{pre}comparisons[{i}].context.cost_source')}: "
                f"{ctx['cost_source']!r}; expected one of {', '.join(COST_SOURCES)}"
            )
        _selectors(comp["baseline"], path, f"{pre}comparisons[{i}].baseline")
        _selectors(comp["method"], path, f"{pre}comparisons[{i}].method")
    extra = ("claim",) if not at else ()
    if "paper_table" in raw:
        pt = _mapping(raw["paper_table"], path, f"{pre}paper_table", PAPER_TABLE_KEYS + extra)
        _selectors(pt.get("methods", []), path, f"{pre}paper_table.methods")
    if "sensitivity" in raw:
        sens = _mapping(raw["sensitivity"], path, f"{pre}sensitivity", SENSITIVITY_KEYS + extra)
        for i, f in enumerate(
            _list(sens.get("factors", [0.5, 2.0]), path, f"{pre}sensitivity.factors")
        ):
            _number(f, path, f"{pre}sensitivity.factors[{i}]", 0)
    if "model_band" in raw:
        mb = _mapping(raw["model_band"], path, f"{pre}model_band", MODEL_BAND_KEYS + extra)
        for i, var in enumerate(_list(mb.get("variants", []), path, f"{pre}model_band.variants")):
            var = _mapping(var, path, f"{pre}model_band.variants[{i}]", VARIANT_KEYS)
            for k, v in (var.get("scales") or {}).items():
                _number(v, path, f"{pre}model_band.variants[{i}].scales.{k}", 0)
            if "mem_cap_fraction" in var:
                _number(
                    var["mem_cap_fraction"],
                    path,
                    f"{pre}model_band.variants[{i}].mem_cap_fraction",
                    0,
                    1,
                )


def _read_yaml(path: Path, what: str) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"{what} {str(path)!r} not found")
    try:
        data = yaml.safe_load(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start}); expected a {what}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}: not valid YAML{where}; expected a {what}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: {type(data).__name__}; expected a {what} (a YAML mapping)")
    return data


def load_claim_file(path: str | os.PathLike[str]) -> ClaimSpec:
    """One claim file (docs/claims.md), checked: every required key, no unknown key, numbers
    in range, selectors well formed, the validating system present and naming this claim."""
    path = Path(path)
    raw = _read_yaml(path, "claim file")
    for key in raw:
        if key not in CLAIM_REQUIRED + CLAIM_OPTIONAL:
            raise ConfigError(
                f"{path}: {key}: unknown key; expected one of "
                f"{', '.join(CLAIM_REQUIRED + CLAIM_OPTIONAL)}"
            )
    for key in CLAIM_REQUIRED:
        if key not in raw:
            raise ConfigError(f"{path}: no {key!r}; a claim file needs {', '.join(CLAIM_REQUIRED)}")
    version = raw.get("version", CLAIM_FILE_VERSION)
    if version != CLAIM_FILE_VERSION:
        raise ConfigError(f"{path}: version: {version!r}; expected {CLAIM_FILE_VERSION}")
    cid = _text(raw["id"], path, "id")
    src = _mapping(raw["source"], path, "source", SOURCE_KEYS)
    for key in ("publication", "location"):
        if key not in src:
            raise ConfigError(f"{path}: source: no {key!r}; expected {', '.join(SOURCE_KEYS)}")
    source = ClaimSource(
        _text(src["publication"], path, "source.publication"),
        _text(src["location"], path, "source.location"),
        _text(src["detail"], path, "source.detail") if "detail" in src else "",
    )
    setup = _mapping(raw["setup"], path, "setup", SETUP_KEYS + SETUP_OPTIONAL)
    for key in SETUP_KEYS:
        if key not in setup:
            raise ConfigError(f"{path}: setup: no {key!r}; expected {', '.join(SETUP_KEYS)}")
    if "cost_sources" in setup:
        sources = _list(setup["cost_sources"], path, "setup.cost_sources")
        if not sources or not all(s in COST_SOURCES for s in sources):
            raise ConfigError(
                f"{path}: setup.cost_sources: {sources!r}; expected a non-empty list from "
                f"{', '.join(COST_SOURCES)}"
            )
    metric = raw.get("metric", "throughput")
    if metric not in METRICS:
        raise ConfigError(f"{path}: metric: {metric!r}; expected one of {', '.join(METRICS)}")
    decide = _mapping(raw["decide"], path, "decide", DECIDE_KEYS)
    for key in DECIDE_KEYS:
        if key not in decide:
            raise ConfigError(f"{path}: decide: no {key!r}; expected baseline and method")
    baseline = check_selector(decide["baseline"], path, "decide.baseline")
    method = check_selector(decide["method"], path, "decide.method")
    _check_sections(raw, path, "claim")
    val_file = val_system = None
    if "validation" in raw:
        val = _mapping(raw["validation"], path, "validation", VALIDATION_KEYS)
        if "systems" not in val:
            raise ConfigError(f"{path}: validation: no 'systems'; expected a systems file path")
        val_file = str((path.parent / _text(val["systems"], path, "validation.systems")).resolve())
        val_system = _text(val["system"], path, "validation.system") if "system" in val else None
        _check_system(path, cid, val_file, val_system)
    return ClaimSpec(
        id=cid,
        name=_text(raw.get("name", path.stem), path, "name"),
        statement=_text(raw["statement"], path, "statement"),
        source=source,
        setup=setup,
        value=_number(raw["value"], path, "value", 0),
        tolerance=_number(raw["tolerance"], path, "tolerance", 0, 1),
        metric=str(metric),
        baseline=baseline,
        method=method,
        path=str(path),
        validation_file=val_file,
        validation_system=val_system,
        statistics=dict(raw.get("statistics") or {}),
        readings=list(raw.get("readings") or []),
        paper_table=dict(raw.get("paper_table") or {}),
        comparisons=list(raw.get("comparisons") or []),
        sensitivity=dict(raw.get("sensitivity") or {}),
        model_band=dict(raw.get("model_band") or {}),
    )


def _check_system(path: Path, claim_id: str, systems_file: str, system_id: str | None) -> None:
    """The validating system exists in its file and names this claim."""
    systems = load_systems(systems_file)
    named = [s for s in systems if s.claim == claim_id]
    if system_id is not None:
        match = [s for s in systems if s.id == system_id]
        if not match:
            raise ConfigError(
                f"{path}: validation.system: {system_id!r} not in {systems_file}; expected one "
                f"of {', '.join(s.id for s in systems)}"
            )
        if match[0].claim != claim_id:
            raise ConfigError(
                f"{path}: validation.system: {system_id!r} validates claim "
                f"{match[0].claim!r}; expected a system naming {claim_id!r}"
            )
    elif not named:
        raise ConfigError(
            f"{path}: validation: no system in {systems_file} names claim {claim_id!r}"
        )


def _inline_claim(raw: Any, path: Path, index: int) -> ClaimSpec:
    """A claim written inline in a claims list (the older form: context, baseline, method)."""
    at = f"claims[{index}]"
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: {at}: {type(raw).__name__}; expected a mapping")
    for key in ("id", "value", "tolerance", "context", "baseline", "method"):
        if key not in raw:
            raise ConfigError(f"claim {raw.get('id', '?')!r} in {path}: missing {key!r}")
    return ClaimSpec(
        id=str(raw["id"]),
        name=str(raw["id"]),
        statement=" ".join(str(raw.get("statement", "")).split()),
        source=ClaimSource(" ".join(str(raw.get("source", "")).split()), ""),
        setup=dict(raw["context"]),
        value=float(raw["value"]),
        tolerance=float(raw["tolerance"]),
        metric=str(raw.get("metric", "throughput")),
        baseline=dict(raw["baseline"]),
        method=dict(raw["method"]),
    )


def load_claim_set(path: str | os.PathLike[str]) -> ClaimSet:
    """A claim file (one claim) or a claims list (``claim_files`` and/or inline ``claims``; an
    empty list is a campaign report without claims; `dcp-bench reproduce` refuses it)."""
    path = Path(path)
    raw = _read_yaml(path, "claims file")
    if "decide" in raw or "setup" in raw:
        return ClaimSet((load_claim_file(path),), str(path))
    for key in raw:
        if key not in LIST_KEYS:
            raise ConfigError(
                f"{path}: {key}: unknown key; expected one of {', '.join(LIST_KEYS)} (a claims "
                "list) or a claim file's keys (docs/claims.md)"
            )
    claims: list[ClaimSpec] = []
    for i, name in enumerate(_list(raw.get("claim_files", []), path, "claim_files")):
        given = _text(name, path, f"claim_files[{i}]")
        claims.append(load_claim_file(os.path.normpath(path.parent / given)))
    for i, cl in enumerate(_list(raw.get("claims", []), path, "claims")):
        claims.append(_inline_claim(cl, path, i))
    ids = [c.id for c in claims]
    dup = next((i for i in ids if ids.count(i) > 1), None)
    if dup is not None:
        raise ConfigError(f"{path}: claim id {dup!r} appears twice; expected each claim once")
    _check_sections(raw, path)
    shared = {k: v for k, v in raw.items() if k not in ("claim_files", "claims", "version")}
    if raw.get("validation"):
        shared.pop("validation")
        shared["_systems"] = load_systems(path.parent / str(raw["validation"]))
    return ClaimSet(tuple(claims), str(path), shared)
