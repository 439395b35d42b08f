"""Config composition: hydra's compose API over the packaged config root `dcp_bench/conf`.

The CLI takes hydra-style `key=value` overrides, e.g. `workload=prolong method=dcp cluster=h200x32`.
Config groups: workload, method, cluster, model, run. Each group file names the object it builds
with `_target_` (see `instantiate`).

Users add configs without editing the package: the override ``extra_conf=DIR[:DIR...]`` (or the
environment variable ``DCP_BENCH_CONF_PATH``) names folders laid out like ``dcp_bench/conf``
(``DIR/method/my_planner.yaml``, ``DIR/workload/my_lengths.yaml``); their choices join the
packaged ones.

Code a user config names (a planner class in ``_target_``) imports from the current folder, from
each user config folder and from the folder holding it (`enable_user_code`); child processes
(torchrun ranks, forked sweep runs) get the same folders through ``PYTHONPATH``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from hydra import compose, initialize_config_dir
from hydra.errors import HydraException, InstantiationException
from hydra.utils import instantiate as hydra_instantiate
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from dcp_bench.errors import ConfigError, DcpBenchError
from dcp_bench.paths import CONF_DIR

GROUPS = ("workload", "method", "cluster", "model", "run")


# ------------------------------------------------------------------------------------------------
# Defaults: declared once, here. The packaged config (conf/config.yaml, conf/run/default.yaml)
# lists the same values for its readers; tests/test_defaults.py keeps them equal. Every reader
# (the run parser, the cost model, the sweep, the report) takes them from these tables, and each
# value is validated by the one check below.


@dataclass(frozen=True)
class Parameter:
    """A top-level numeric parameter of a run: its default, its valid range (``lo`` and ``hi``
    included) and what it means. `check` is its one validation."""

    key: str
    default: float
    lo: float
    hi: float
    meaning: str

    def check(self, value: Any) -> float:
        """``value`` as a float, or `ConfigError` naming the key, the value and the range."""
        expected = f"expected a number in [{self.lo}, {self.hi}]"
        if isinstance(value, bool):
            raise ConfigError(f"{self.key}={value!r}: {expected}")
        try:
            out = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{self.key}={value!r}: {expected}") from None
        if not (math.isfinite(out) and self.lo <= out <= self.hi):
            raise ConfigError(f"{self.key}={value!r}: {expected}")
        return out


MEM_CAP_FRACTION = Parameter(
    "mem_cap_fraction",
    0.7,
    1e-6,
    1.0,
    "the per-GPU memory cap every planner must respect, as a share of usable GPU memory (the DCP "
    "reference uses 0.7)",
)
# The parameters that shape a run's cell (a run records which it sets away from their default:
# `dcp_bench.summary_schema.RunContext.away_from_default`).
PARAMETERS: dict[str, Parameter] = {p.key: p for p in (MEM_CAP_FRACTION,)}
SEED_DEFAULT = 0
# What a key the ``run`` group leaves out means (the train, noise and cost groups' defaults are
# their settings classes' field defaults, `dcp_bench.run.spec`; the cost scales' are
# `dcp_bench.cost.analytical.SCALE_DEFAULTS`).
RUN_DEFAULTS: dict[str, Any] = {
    "unit": "auto",
    "epochs": 1,
    "steps": 20,
    "warmup_steps": 2,
    "repeats": 5,
    "root": "runs",
    "campaign": "default",
    "executor": "sim",
    "nproc": None,
    "timeout_s": None,
    "kill_grace_s": None,
    "planner_clock": "overlap",
    "planner_time": "auto",
}


def away_from_default(cfg: Mapping[str, Any]) -> tuple[str, ...]:
    """The `PARAMETERS` a resolved config sets to another value than their default (validated)."""
    return tuple(
        key
        for key, p in PARAMETERS.items()
        if not math.isclose(p.check(cfg.get(key, p.default)), p.default)
    )


CONF_PATH_ENV = "DCP_BENCH_CONF_PATH"
EXTRA_CONF_KEY = "extra_conf"


def extra_config_dirs(extra: Sequence[str | os.PathLike[str]] = ()) -> list[Path]:
    """User config folders: ``extra`` first, then those in ``$DCP_BENCH_CONF_PATH``
    (``:``-separated)."""
    dirs = [Path(d) for d in extra]
    dirs += [Path(d) for d in os.environ.get(CONF_PATH_ENV, "").split(os.pathsep) if d]
    for d in dirs:
        if not d.is_dir():
            what = "is a file, not a folder" if d.exists() else "does not exist"
            raise ConfigError(
                f"config folder {str(d)!r} {what}; expected a folder laid "
                "out like dcp_bench/conf (e.g. DIR/method/NAME.yaml)"
            )
    return list(dict.fromkeys(d.resolve() for d in dirs))


def user_code_dirs(conf_dirs: Sequence[str | os.PathLike[str]] = ()) -> list[Path]:
    """Folders a user's code imports from: the current folder, then each user config folder and
    the folder holding it (``my_conf/`` beside ``my_methods/``), without repeats."""
    out: list[Path] = []
    for d in [
        Path.cwd(),
        *(x for c in conf_dirs for x in (Path(c).resolve(), Path(c).resolve().parent)),
    ]:
        if d not in out:
            out.append(d)
    return out


def enable_user_code(conf_dirs: Sequence[str | os.PathLike[str]] = ()) -> list[Path]:
    """Make the `user_code_dirs` importable here (appended to ``sys.path``, after the installed
    packages, so they never shadow one) and in every child process this one starts (added to
    ``PYTHONPATH``: torchrun ranks and sweep runs build the same planner classes). Returns the
    folders."""
    dirs = user_code_dirs(conf_dirs)
    for d in dirs:
        if str(d) not in sys.path:
            sys.path.append(str(d))
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    missing = [str(d) for d in dirs if str(d) not in inherited]
    if missing:
        os.environ["PYTHONPATH"] = os.pathsep.join([*inherited, *missing])
    return dirs


def group_choices(group: str, extra_dirs: Sequence[str | os.PathLike[str]] = ()) -> list[str]:
    """Names of the configs available in a config group (packaged and user folders)."""
    folder = CONF_DIR / group
    if not folder.is_dir():
        raise ConfigError(f"unknown config group {group!r}; expected one of {', '.join(GROUPS)}")
    names = {p.stem for p in folder.glob("*.yaml")}
    for d in extra_config_dirs(extra_dirs):
        names |= {p.stem for p in (d / group).glob("*.yaml")}
    return sorted(names)


def _split_extra_conf(overrides: Sequence[str]) -> tuple[list[str], list[str]]:
    """Separate ``extra_conf=DIR[:DIR]`` overrides (not config keys) from the rest."""
    rest, dirs = [], []
    for ov in overrides:
        if ov.split("=", 1)[0].lstrip("+~") == EXTRA_CONF_KEY and "=" in ov:
            dirs += [d for d in ov.split("=", 1)[1].split(os.pathsep) if d]
        else:
            rest.append(ov)
    return rest, dirs


def expand_cluster_size(overrides: Sequence[str]) -> list[str]:
    """``cluster=NAME@N`` -> ``cluster=NAME run.nproc=N``: the named cluster's hardware with N GPUs
    in all (the world size, not the node count): N up to one node's GPUs is one node of N, a
    larger N must be a whole number of that cluster's nodes (``h200x8@12288`` = 1,536 nodes of 8).
    A different ``nproc`` beside it is refused."""
    out: list[str] = []
    size: str | None = None
    for ov in overrides:
        key, sep, value = ov.partition("=")
        if not (sep and key.lstrip("+~") == "cluster" and "@" in value):
            out.append(ov)
            continue
        name, _, n = value.partition("@")
        if not (n.isdigit() and n.isascii()) or int(n) < 1:
            raise ConfigError(
                f"cluster={value}: {n!r} is not a GPU count; expected cluster=NAME@N with N the "
                "total number of GPUs (e.g. cluster=h200x8@12288)"
            )
        out.append(f"{key}={name}")
        size = str(int(n))
    if size is not None:
        for ov in out:
            key, sep, value = ov.partition("=")
            if sep and key.lstrip("+~") in ("nproc", "run.nproc") and value.strip() != size:
                raise ConfigError(
                    f"{key}={value} contradicts the cluster's size {size} (cluster=NAME@{size}); "
                    "expected one of them, or the same number"
                )
        out.append(f"run.nproc={size}")
    return out


def _check_overrides(
    overrides: Sequence[str], extra_dirs: Sequence[str | os.PathLike[str]] = ()
) -> None:
    for ov in overrides:
        if "=" not in ov:
            raise ConfigError(f"bad override {ov!r}: expected key=value (e.g. workload=prolong)")
        key, value = ov.split("=", 1)
        key = key.lstrip("+~")
        if key in GROUPS:
            choices = group_choices(key, extra_dirs)
            if value not in choices:
                raise ConfigError(f"unknown {key} {value!r}; valid choices: {', '.join(choices)}")


def _root_default_groups(config_name: str) -> set[str]:
    path = CONF_DIR / f"{config_name}.yaml"
    if not path.exists():
        return set()
    defaults = (yaml.safe_load(path.read_text()) or {}).get("defaults", [])
    return {k for d in defaults if isinstance(d, dict) for k in d}


def _append_missing_groups(overrides: Sequence[str], config_name: str) -> list[str]:
    """``method=x`` for a group the root's defaults list does not name means ``+method=x``
    (hydra would refuse it), so users write the same override either way."""
    present = _root_default_groups(config_name)
    out = []
    for ov in overrides:
        key = ov.split("=", 1)[0]
        out.append(f"+{ov}" if key in GROUPS and key not in present else ov)
    return out


# Top-level shortcuts every command accepts for keys that live deeper in the config: one meaning
# per key in every command (``steps`` is always the number of measured steps).
SHORTCUTS: dict[str, str] = {
    "steps": "run.steps",
    "warmup_steps": "run.warmup_steps",
    "repeats": "run.repeats",
    "campaign": "run.campaign",
    "root": "run.root",
    "executor": "run.executor",
    "nproc": "run.nproc",
    "timeout_s": "run.timeout_s",
    "planner_clock": "run.planner_clock",
    "planner_time": "run.planner_time",
    "lr": "train.lr",
    "grad_clip": "train.grad_clip",
    "threads": "train.threads",
    "backend": "train.backend",
    "device": "train.device",
    "nnodes": "train.nnodes",
    "rdzv_endpoint": "train.rdzv_endpoint",
}

# Spellings that used to mean something else or live elsewhere, refused with the one that works.
RENAMED: dict[str, str] = {
    "lengths_file": "workload.lengths_file",
    "run_timeout_s": "run.timeout_s (or timeout_s)",
    "run.planner_on_clock": "run.planner_clock=serial|overlap|off",
    "workload.seed": "seed (one seed picks the batches, the noise and the model initialisation)",
    "method.seed": "seed (one seed picks the batches, the noise and the model initialisation)",
}
RENAMED_PREFIXES: dict[str, str] = {"noise.": "run.noise.", "sim.noise.": "run.noise."}


def _renamed(key: str) -> str | None:
    if key in RENAMED:
        return RENAMED[key]
    for old, new in RENAMED_PREFIXES.items():
        if key.startswith(old):
            return new + key[len(old) :]
    return None


def expand_shortcuts(overrides: Sequence[str]) -> list[str]:
    """``steps=N`` -> ``run.steps=N`` (and the other `SHORTCUTS`); renamed keys are refused with
    the spelling that replaced them."""
    out = []
    for ov in overrides:
        key, sep, value = ov.partition("=")
        bare = key.lstrip("+~")
        if sep and bare in SHORTCUTS:
            out.append(f"{key[: len(key) - len(bare)]}{SHORTCUTS[bare]}={value}")
            continue
        renamed = _renamed(bare) if sep else None
        if renamed:
            raise ConfigError(f"{bare}={value}: this key is spelled {renamed}")
        out.append(ov)
    return out


def load_config(overrides: Sequence[str] = (), config_name: str = "config") -> DictConfig:
    """Compose the config with overrides; bad group values raise `ConfigError` naming the choices.

    The result holds a ``names`` node: the config file chosen in each group (``workload: my_corpus``
    for a user's file), which records and reports use to name a run's parts."""
    overrides, extra = _split_extra_conf(overrides)
    dirs = extra_config_dirs(extra)
    enable_user_code(dirs)
    overrides = expand_cluster_size(expand_shortcuts(overrides))
    _check_overrides(overrides, dirs)
    overrides = _append_missing_groups(overrides, config_name)
    if dirs:  # hydra looks up config groups in these folders after the packaged root
        overrides = [*overrides, "hydra.searchpath=[" + ",".join(f"file://{d}" for d in dirs) + "]"]
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(
                config_name=config_name, overrides=list(overrides), return_hydra_config=True
            )
    except yaml.YAMLError as exc:
        raise ConfigError(_yaml_error_line(exc)) from None
    except (HydraException, OmegaConfBaseException) as exc:
        if isinstance(exc.__cause__ or exc.__context__, yaml.YAMLError):
            raise ConfigError(_yaml_error_line(exc.__cause__ or exc.__context__)) from None  # type: ignore[arg-type]
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if "LexerNoViableAlt" in msg or "token recognition error" in msg:
            bad = msg.split(":", 1)[-1].strip()
            raise ConfigError(
                f"bad override {bad!r}: characters hydra's grammar does not take unquoted; "
                "expected letters, digits and _-./: or a quoted value (key='value')"
            ) from None
        hint = ""
        if "Could not override" in msg:
            key = msg.split("'")[1] if msg.count("'") >= 2 else "KEY"
            hint = (
                f" (the config defines no key {key}: check its spelling, or add one with a "
                f"leading '+': +{key}=...)"
            )
        raise ConfigError(f"bad config override: {msg}{hint}") from None
    choices = {
        g: str(c) for g, c in cfg.hydra.runtime.choices.items() if g in GROUPS and c is not None
    }
    _refuse_shadowed(choices, dirs)
    with open_dict(cfg):
        del cfg["hydra"]
        cfg["names"] = choices
    _refuse_collections(cfg, overrides, config_name)
    return cfg


def _yaml_error_line(exc: Any) -> str:
    """One line for a YAML file that does not parse: the file, its line and column, the problem."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).strip().splitlines()[0]
    where = (
        f"{mark.name}: line {mark.line + 1} column {mark.column + 1}"
        if mark is not None
        else "a config file"
    )
    return f"{where}: not valid YAML ({problem})"


def _refuse_shadowed(choices: Mapping[str, str], dirs: Sequence[Path]) -> None:
    """A user config file with the name of a packaged one in the same group would be silently
    ignored (hydra finds the packaged file first): refused, naming both files."""
    for group, name in choices.items():
        packaged = CONF_DIR / group / f"{name}.yaml"
        for d in dirs:
            mine = d / group / f"{name}.yaml"
            if packaged.exists() and mine.exists():
                raise ConfigError(
                    f"{group}={name}: the user config {mine} has the name of the packaged "
                    f"{packaged}, which takes precedence; rename the user file (user configs "
                    "add choices, they never replace packaged ones)"
                )


# Keys that default to null but take one value (a path, a number, a name): a YAML mapping or list
# given for one is refused like one for a key whose default is a single value. Keys that default
# to null and take a collection (e.g. ``method.sp_rule``) are not listed.
SCALAR_KEYS = frozenset(
    {
        "workload.lengths_file",
        "workload.column",
        "workload.max_len",
        "workload.samples_per_step",
        "workload.tokenizer",
        "workload.source",
        "workload.licence",
        "workload.description",
        "run.nproc",
        "run.timeout_s",
        "run.kill_grace_s",
        "cost.profile",
        "cost.planner_source",
        "cost.zero_stage",
        "train.rdzv_endpoint",
        "method.sp",
        "method.token_budget",
        "method.token_capacity",
        "method.s_max",
        "method.context_window",
        "method.micro_batches_per_replica",
        "method.max_tokens_per_rank",
        "method.recompute_num_layers",
    }
)


def _refuse_collections(cfg: DictConfig, overrides: Sequence[str], config_name: str) -> None:
    """A YAML mapping or list given (``key='{a: 1}'``, ``key=[1,2]``) for a key that takes one
    value — its default is a single value, or it is one of `SCALAR_KEYS` — is a `ConfigError`
    naming the key; a key whose default is a collection takes one."""
    given = []
    for ov in overrides:
        key, sep, value = ov.partition("=")
        key = key.lstrip("+~")
        if not sep or key in GROUPS or key.startswith("hydra."):
            continue
        if isinstance(OmegaConf.select(cfg, key, default=None), (DictConfig, ListConfig)):
            given.append((key, value))
    if not given:
        return
    keys = {k for k, _ in given}
    groups_only = [ov for ov in overrides if ov.partition("=")[0].lstrip("+~") not in keys]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        base = compose(config_name=config_name, overrides=groups_only)
    for key, value in given:
        default = OmegaConf.select(base, key, default=None, throw_on_missing=False)
        single = default is not None and not isinstance(default, (DictConfig, ListConfig))
        if single or (default is None and key in SCALAR_KEYS):
            kind = "mapping" if isinstance(OmegaConf.select(cfg, key), DictConfig) else "list"
            raise ConfigError(
                f"{key}={value}: a YAML {kind}, but {key} takes a single value (a number, "
                "a name or a path; quote it if it is one)"
            )


def to_container(cfg: DictConfig | Mapping[str, Any]) -> dict[str, Any]:
    """A config node as a plain, resolved dict (string keys); plain mappings are copied."""
    if isinstance(cfg, DictConfig):
        out = OmegaConf.to_container(cfg, resolve=True)
        assert isinstance(out, dict)
        return {str(k): v for k, v in out.items()}
    return {str(k): v for k, v in dict(cfg).items()}


def config_hash(cfg: DictConfig | dict[str, Any], exclude: Sequence[str] = ()) -> str:
    """A short, stable hash of a resolved config (keys in `exclude` left out, e.g. `seed`)."""
    data = to_container(cfg)
    for key in exclude:
        data.pop(key, None)
    blob = json.dumps(data, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def instantiate(node: DictConfig | dict[str, Any], **kwargs: Any) -> Any:
    """Build the object a config node names with `_target_`. A `DcpBenchError` raised by the
    target's constructor propagates as itself (hydra would wrap it); a target that does not
    import, or a constructor that refuses its arguments, is a one-line `ConfigError` naming the
    target (and, for a missing module, the folders searched), so the CLI prints it on one line."""
    try:
        return hydra_instantiate(node, **kwargs)
    except InstantiationException as exc:
        chain: list[BaseException] = []
        cause: BaseException | None = exc.__cause__
        while cause is not None:
            if isinstance(cause, DcpBenchError):
                raise cause from None
            chain.append(cause)
            cause = cause.__cause__
        target = str((node.get("_target_") if hasattr(node, "get") else None) or "?")
        missing = [c for c in chain if isinstance(c, ModuleNotFoundError)]
        if missing:
            raise ConfigError(_missing_module_message(target, missing[-1])) from None
        if chain:
            root = chain[-1]
            what = (
                "could not be imported"
                if isinstance(chain[0], ImportError)
                else "could not be built"
            )
            raise ConfigError(
                f"_target_ {target!r} {what}: {type(root).__name__}: {_first_line(root)}"
            ) from None
        raise


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _missing_module_message(target: str, exc: ModuleNotFoundError) -> str:
    """One line: which module is missing for which target, and where Python looked for it."""
    module = exc.name or _first_line(exc)
    if (
        module
        and target.startswith(module.split(".")[0] + ".")
        and not target.startswith(module + ".")
    ):
        # the target's own package imports but something inside it does not
        return f"_target_ {target!r} could not be imported: {_first_line(exc)}"
    installed = (sys.prefix, sys.base_prefix, sys.exec_prefix)
    searched = [
        p for p in dict.fromkeys(sys.path) if p and os.path.isdir(p) and not p.startswith(installed)
    ]
    return (
        f"_target_ {target!r}: no module named {module!r}; searched {', '.join(searched) or '-'} "
        "and the installed packages (put the module in the folder dcp-bench runs in, or beside "
        "the config folder named by extra_conf=DIR)"
    )
