"""The reproduce config, typed: a YAML file (``dcp_bench/conf/reproduce/<preset>.yaml`` or
``config=PATH``) read into `ReproduceConfig` and its `ReproduceSection` s, then the command
line's ``key=value`` applied.

Every default is written once, in the dataclasses below; a YAML file that leaves a key out gets
it. A key the dataclasses do not know is a `ConfigError` naming it, where it stands
(``sections.claim.repeatz``) and the keys expected there; a value of the wrong type names the
type expected.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dcp_bench.errors import ConfigError
from dcp_bench.paths import CONF_DIR, REPO_ROOT
from dcp_bench.report.claim_spec import load_claim_set

# Command-line keys: `config` and `preset` choose the file, `sections` picks some of its
# sections; every other one replaces the YAML's top-level key of that name.
OVERRIDE_KEYS = (
    "config",
    "campaign",
    "root",
    "out",
    "claims",
    "budget_s",
    "report_reserve_s",
    "calibrate_s",
    "jobs",
    "repeats",
    "real",
    "sections",
    "retry_failed",
    "seed_base",
    "preset",
    "cluster",
    "nnodes",
    "rdzv_endpoint",
    "claim",
    "steps",
)
# Run keys a preset leaves open (e.g. `preset=real cluster=h200x32`): added to every grid when set.
GRID_KEYS = ("cluster", "nnodes", "rdzv_endpoint")
BOOLEANS = {
    "1": True,
    "true": True,
    "yes": True,
    "on": True,
    "0": False,
    "false": False,
    "no": False,
    "off": False,
}
# A field with this metadata is set by the loader or the command line, never by the YAML file.
NOT_IN_YAML = {"yaml": False}


@dataclass(frozen=True)
class ReproduceSection:
    """One section: sweep grids run in order, to the end unless a time budget is given."""

    name: str
    title: str = ""
    grids: tuple[tuple[str, ...], ...] = ()  # hydra overrides each; a,b = alternatives
    common: tuple[str, ...] | None = None  # added to every grid; None: the top's sim_common
    repeats: int | None = None  # seeds per cell; None: the top's repeats
    budget_s: float | None = None  # this section's own wall-clock cap; None: no cap of its own
    reserve_s: float = 20.0  # under a whole budget: kept for this section by every earlier one
    real: bool = False  # real (torch executor) runs of every grid as well
    simulate: bool = True  # simulated runs of every grid (false: a measured-only section)
    # Real CPU runs: profile this machine for the models of the section's real grids first
    # (a short, bounded `dcp-bench profile`), and price the section's runs with that calibration.
    calibrate: bool = False
    # The section runs only where this method has a config (dcp_bench/conf/method/NAME.yaml);
    # otherwise it is skipped and the report says "not judged: no method NAME".
    when_method: str | None = None

    def repeats_in(self, cfg: ReproduceConfig) -> int:
        return self.repeats if self.repeats is not None else cfg.repeats

    def common_in(self, cfg: ReproduceConfig) -> tuple[str, ...]:
        return self.common if self.common is not None else cfg.sim_common


@dataclass(frozen=True)
class ReproduceConfig:
    """The whole reproduction: where it writes, its optional budget, and its sections."""

    path: str = field(default="", metadata=NOT_IN_YAML)  # the YAML file read
    title: str = "dcp-bench: reproducing the DCP claim"
    campaign: str = "reproduce"
    root: str = "runs"
    out: str = "reports/reproduce"
    claims: str = "results/reference/claims.yaml"
    # The whole command's wall-clock bound, report included; None: no cut (every section runs to
    # its end, however long this machine takes).
    budget_s: float | None = None
    report_reserve_s: float = 60.0  # under a budget: kept for writing the report
    calibrate_s: float = 600.0  # the most a section's CPU calibration may take (all models)
    jobs: int = 2  # simulated runs in parallel (real runs always run alone)
    repeats: int = 5  # seeds seed_base .. seed_base + repeats - 1 of every grid
    real: bool = True  # run the sections marked real
    retry_failed: bool = False  # redo runs whose record is a failure
    seed_base: int = 0
    cluster: str | None = None  # GRID_KEYS: added to every grid when set
    nnodes: int | str | None = None
    rdzv_endpoint: str | None = None
    # `steps=N`: measured steps of every grid (run.steps=N, added last; None: the grids' own)
    steps: int | None = None
    # The claims (by name, `dcp-bench claims`) this config reproduces: `claim=NAME` picks it.
    claim_names: tuple[str, ...] = ()
    # Files the reproduction reads where they lie (a published length list): each must exist
    # before any run starts.
    required_files: tuple[str, ...] = ()
    sim_common: tuple[str, ...] = ()  # a section's common overrides unless it names its own
    epoch_common: tuple[str, ...] = ()  # a YAML anchor the sections name; read by none itself
    sections: tuple[ReproduceSection, ...] = ()
    only_sections: tuple[str, ...] = field(default=(), metadata=NOT_IN_YAML)  # sections=a,b

    def grid_keys(self) -> list[str]:
        """``key=value`` of every `GRID_KEYS` key set (and ``run.steps`` when ``steps`` is)."""
        keys = [f"{k}={getattr(self, k)}" for k in GRID_KEYS if getattr(self, k) is not None]
        return keys + ([f"run.steps={self.steps}"] if self.steps is not None else [])

    def chosen_sections(self) -> list[ReproduceSection]:
        """The sections to run (all, or those named by ``sections=``), in the file's order."""
        return [s for s in self.sections if not self.only_sections or s.name in self.only_sections]


# --------------------------------------------------------------------------------------------
# Reading the YAML


def _type_name(hint: Any) -> str:
    names = {
        str: "a string",
        int: "an integer",
        float: "a number",
        bool: "true or false",
        type(None): "null",
    }
    if hint in names:
        return names[hint]
    if typing.get_origin(hint) is tuple:
        return f"a list (each {_type_name(typing.get_args(hint)[0])})"
    return " or ".join(_type_name(a) for a in typing.get_args(hint))


def _typed(value: Any, hint: Any, where: str) -> Any:
    """``value`` as the type ``hint`` names, or a `ConfigError` naming ``where`` and the type."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        for option in typing.get_args(hint):
            try:
                return _typed(value, option, where)
            except ConfigError:
                continue
    elif origin is tuple and isinstance(value, list):
        item = typing.get_args(hint)[0]
        return tuple(_typed(v, item, f"{where}[{i}]") for i, v in enumerate(value))
    elif hint is type(None) and value is None:
        return None
    elif hint in (int, float) and isinstance(value, int) and not isinstance(value, bool):
        return hint(value)
    elif (
        hint is float
        and isinstance(value, float)
        or hint in (str, bool)
        and isinstance(value, hint)
    ):
        return value
    raise ConfigError(f"{where}: {value!r} ({type(value).__name__}): expected {_type_name(hint)}")


def _from_mapping(cls: type, data: Any, where: str, source: str) -> Any:
    """An instance of the dataclass ``cls`` from a YAML mapping; ``where`` is its path in the
    file."""
    hints = typing.get_type_hints(cls)
    keys = [f.name for f in dataclasses.fields(cls) if f.metadata.get("yaml", True)]
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"config={source!r}: {where or 'the file'}: expected a mapping of {', '.join(keys)}"
        )
    for key in data:
        if key not in keys:
            at = f"{where}.{key}" if where else str(key)
            raise ConfigError(
                f"config={source!r}: {at}: unknown key; expected one of {', '.join(keys)}"
            )
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        at = f"{where}.{f.name}" if where else f.name
        if f.name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ConfigError(f"config={source!r}: {at}: missing (a required key)")
            continue
        if f.name == "sections":
            values[f.name] = _sections(data[f.name], source)
        else:
            try:
                values[f.name] = _typed(data[f.name], hints[f.name], at)
            except ConfigError as exc:
                raise ConfigError(f"config={source!r}: {exc}") from None
    return cls(**values)


def _sections(data: Any, source: str) -> tuple[ReproduceSection, ...]:
    if not isinstance(data, list):
        raise ConfigError(f"config={source!r}: sections: expected a list of sections")
    out = []
    for index, item in enumerate(data):
        name = item.get("name") if isinstance(item, Mapping) else None
        where = f"sections.{name}" if isinstance(name, str) and name else f"sections[{index}]"
        out.append(_from_mapping(ReproduceSection, item, where, source))
    return tuple(out)


def read_reproduce_yaml(path: Path) -> ReproduceConfig:
    """The typed config of one reproduce YAML file (no command-line keys applied)."""
    if not path.is_file():
        raise ConfigError(
            f"config={str(path)!r}: reproduce config not found (expected a YAML file)"
        )
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"config={str(path)!r}: not valid YAML ({str(exc).splitlines()[0]})"
        ) from None
    if not isinstance(data, dict) or not isinstance(data.get("sections", []), list):
        raise ConfigError(f"config={str(path)!r}: expected a mapping with a list of sections")
    cfg: ReproduceConfig = _from_mapping(ReproduceConfig, data, "", str(path))
    return dataclasses.replace(cfg, path=str(path))


# --------------------------------------------------------------------------------------------
# The command line


# Upper bounds of the command line's numbers: far above any real reproduction, low enough that
# `repeats=1e20` is refused at once.
MAXIMA = {
    "repeats": 1_000,
    "jobs": 1_024,
    "seed_base": 2**32 - 1,
    "budget_s": 7 * 24 * 3600.0,
    "calibrate_s": 3600.0,
    "steps": 100_000,
}
# `budget_s=none` lifts a budget a config file sets: no wall-clock cut.
NO_BUDGET = ("none", "null", "off")


def _number(key: str, value: str, integer: bool, minimum: float) -> float:
    maximum = MAXIMA.get(key, float("inf"))
    expected = f"expected {'an integer' if integer else 'a finite number'} >= {minimum:g}" + (
        f" and at most {maximum:,g}" if maximum < float("inf") else ""
    )
    text = value.strip()
    if integer and not (text.isdigit() and text.isascii()):
        raise ConfigError(f"{key}={value!r}: {expected} (ASCII digits)")
    try:
        out = float(int(text)) if integer else float(text)
    except (ValueError, OverflowError):
        raise ConfigError(f"{key}={value!r}: {expected}") from None
    if not minimum <= out <= maximum or out == float("inf"):  # also refuses nan
        raise ConfigError(f"{key}={value!r}: {expected}")
    return out


def _override(cfg: ReproduceConfig, key: str, value: str) -> dict[str, Any]:
    """The fields one command-line ``key=value`` sets."""
    if key == "budget_s":
        if value.strip().lower() in NO_BUDGET:
            return {key: None}
        return {key: _number(key, value, integer=False, minimum=1.0)}
    if key == "calibrate_s":
        return {key: _number(key, value, integer=False, minimum=1.0)}
    if key == "report_reserve_s":
        return {key: _number(key, value, integer=False, minimum=0.0)}
    if key in ("jobs", "repeats", "steps"):
        return {key: int(_number(key, value, integer=True, minimum=1))}
    if key == "seed_base":
        return {key: int(_number(key, value, integer=True, minimum=0))}
    if key in ("real", "retry_failed"):
        if value.lower() not in BOOLEANS:
            raise ConfigError(f"{key}={value!r}: expected true or false")
        return {key: BOOLEANS[value.lower()]}
    if key == "sections":
        names = [s.name for s in cfg.sections]
        wanted = [s for s in value.split(",") if s]
        unknown = [s for s in wanted if s not in names]
        if not wanted or unknown:
            raise ConfigError(
                f"sections={value!r}: unknown section {(unknown or [''])[0]!r}; expected names "
                f"from {', '.join(names)} (comma-separated)"
            )
        return {"only_sections": tuple(wanted)}
    if not value:
        raise ConfigError(f"{key}=: expected a value")
    if key == "cluster":
        # hydra: loaded here, not with this module, which the CLI imports to build its help
        from dcp_bench.config import group_choices

        name = value.partition("@")[0]
        choices = group_choices("cluster")
        if name not in choices:
            raise ConfigError(
                f"cluster={value!r}: unknown cluster {name!r}; valid choices: {', '.join(choices)}"
            )
    return {key: value}


def load_reproduce_config(overrides: Sequence[str]) -> ReproduceConfig:
    """The reproduce config (``config=PATH``, ``preset=NAME`` or the packaged default) with the
    command line's ``key=value`` applied; every bad key or value is a `ConfigError` naming it."""
    kv: dict[str, str] = {}
    for ov in overrides:
        key, sep, value = ov.partition("=")
        if not sep or key not in OVERRIDE_KEYS:
            raise ConfigError(
                f"bad reproduce argument {ov!r}: expected key=value with key one of "
                f"{', '.join(OVERRIDE_KEYS)}"
            )
        kv[key] = value
    # preset=NAME: the packaged config dcp_bench/conf/reproduce/NAME.yaml (default: default)
    presets = sorted(
        p.stem for p in (CONF_DIR / "reproduce").glob("*.yaml") if not p.stem.endswith("_claims")
    )
    if "claim" in kv:
        # claim=NAME: the packaged config that reproduces that claim (its `claim_names`)
        if "preset" in kv or "config" in kv:
            raise ConfigError(
                f"claim={kv['claim']!r}: picks its own reproduce config; expected no preset= or "
                "config= beside it"
            )
        kv["preset"] = preset_for_claim(kv.pop("claim"))
    preset = kv.pop("preset", "default")
    if preset not in presets:
        raise ConfigError(
            f"preset={preset!r}: no such reproduce preset; expected one of {', '.join(presets)}"
        )
    cfg = read_reproduce_yaml(
        Path(kv.pop("config", str(CONF_DIR / "reproduce" / f"{preset}.yaml")))
    )
    for key, value in kv.items():
        cfg = dataclasses.replace(cfg, **_override(cfg, key, value))
    if cfg.budget_s is not None and cfg.report_reserve_s >= cfg.budget_s:
        # named by the key the user typed: budget_s=30 alone is a budget too small for the
        # report's reserve, not a bad report_reserve_s
        if "budget_s" in kv or "report_reserve_s" not in kv:
            raise ConfigError(
                f"budget_s={cfg.budget_s:g}: expected more than the {cfg.report_reserve_s:g} s "
                "kept for the report out of the whole budget (report_reserve_s, "
                f"{'given' if 'report_reserve_s' in kv else 'the config default'})"
            )
        raise ConfigError(
            f"report_reserve_s={cfg.report_reserve_s:g}: expected less than "
            f"budget_s={cfg.budget_s:g} (the time kept for the report out of the whole budget)"
        )
    for required in cfg.required_files:
        if not Path(required).is_file():
            raise ConfigError(
                f"{required}: not found; this reproduction reads it where it lies "
                f"(required_files of {cfg.path}; see docs/reproduce.md)"
            )
    return cfg


def claim_presets() -> dict[str, str]:
    """Claim name -> the packaged reproduce config that reproduces it (its ``claim_names``)."""
    out: dict[str, str] = {}
    for path in sorted((CONF_DIR / "reproduce").glob("*.yaml")):
        if path.stem.endswith("_claims"):
            continue
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError:
            continue
        for name in data.get("claim_names") or () if isinstance(data, dict) else ():
            out.setdefault(str(name), path.stem)
    return out


def preset_for_claim(name: str) -> str:
    """The preset of ``claim=name``; a `ConfigError` listing the known claims otherwise."""
    known = claim_presets()
    if name not in known:
        raise ConfigError(
            f"claim={name!r}: unknown claim; expected one of {', '.join(sorted(known))}"
        )
    return known[name]


# The keys every claim holds (what `dcp_bench.report.claims.load_claims` requires).
CLAIM_KEYS = ("id", "value", "tolerance", "context", "baseline", "method")


def find_claims(given: str) -> Path:
    """The claims file: as given, else (a relative path) in the repository, from any folder."""
    path = Path(given)
    if not path.is_file() and not path.is_absolute() and (REPO_ROOT / path).is_file():
        path = REPO_ROOT / path
    if not path.is_file():
        raise ConfigError(
            f"claims={given!r}: claims file not found here or in {REPO_ROOT} (expected "
            "results/reference/claims.yaml or a file like it)"
        )
    check_claims_file(path, given)
    return path


# A claims file is read whole before any run: one far larger than a claims list is refused unread.
CLAIMS_MAX_BYTES = 4 << 20


def check_claims_file(path: Path, given: str) -> None:
    """The claims file reads as a YAML mapping with a non-empty list of claims, each a mapping
    with the keys the report needs; checked before any run so a wrong file costs no sweep."""
    expected = "expected a YAML claims file like results/reference/claims.yaml"
    if path.stat().st_size > CLAIMS_MAX_BYTES:
        raise ConfigError(
            f"claims={given!r}: {path.stat().st_size:,} bytes (at most {CLAIMS_MAX_BYTES:,}); "
            f"{expected}"
        )
    try:
        data = yaml.safe_load(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"claims={given!r}: not UTF-8 text (byte {exc.start}); {expected}"
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"claims={given!r}: not valid YAML{where}; {expected}") from None
    if isinstance(data, dict) and ("claim_files" in data or "decide" in data):
        try:  # a claims list naming claim files, or one claim file (docs/claims.md)
            load_claim_set(path)
        except ConfigError as exc:
            raise ConfigError(f"claims={given!r}: {exc}") from None
        return
    claims = data.get("claims") if isinstance(data, dict) else None
    if not isinstance(claims, list) or not claims:
        raise ConfigError(f"claims={given!r}: no list of claims; {expected}")
    for index, claim in enumerate(claims):
        if not isinstance(claim, dict):
            raise ConfigError(f"claims={given!r}: claim {index + 1} is not a mapping; {expected}")
        missing = [k for k in CLAIM_KEYS if k not in claim]
        if missing:
            raise ConfigError(
                f"claims={given!r}: claim {claim.get('id', index + 1)!r} has no {missing[0]!r}; "
                f"{expected}"
            )
