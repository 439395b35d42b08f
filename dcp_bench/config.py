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
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from dcp_bench.errors import ConfigError, DcpBenchError
from dcp_bench.paths import CONF_DIR

GROUPS = ("workload", "method", "cluster", "model", "run")


CONF_PATH_ENV = "DCP_BENCH_CONF_PATH"
EXTRA_CONF_KEY = "extra_conf"


def extra_config_dirs(extra: Sequence[str | os.PathLike[str]] = ()) -> list[Path]:
    """User config folders: ``extra`` first, then those in ``$DCP_BENCH_CONF_PATH`` (``:``-separated)."""
    dirs = [Path(d) for d in extra]
    dirs += [Path(d) for d in os.environ.get(CONF_PATH_ENV, "").split(os.pathsep) if d]
    for d in dirs:
        if not d.is_dir():
            raise ConfigError(f"config folder {str(d)!r} does not exist; expected a folder laid "
                              "out like dcp_bench/conf (e.g. DIR/method/NAME.yaml)")
    return list(dict.fromkeys(d.resolve() for d in dirs))


def user_code_dirs(conf_dirs: Sequence[str | os.PathLike[str]] = ()) -> list[Path]:
    """Folders a user's code imports from: the current folder, then each user config folder and
    the folder holding it (``my_conf/`` beside ``my_methods/``), without repeats."""
    out: list[Path] = []
    for d in [Path.cwd(), *(x for c in conf_dirs for x in (Path(c).resolve(), Path(c).resolve().parent))]:
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
        if not n.isdigit() or int(n) < 1:
            raise ConfigError(f"cluster={value}: {n!r} is not a GPU count; expected cluster=NAME@N with N the "
                              "total number of GPUs (e.g. cluster=h200x8@12288)")
        out.append(f"{key}={name}")
        size = str(int(n))
    if size is not None:
        for ov in out:
            key, sep, value = ov.partition("=")
            if sep and key.lstrip("+~") in ("nproc", "run.nproc") and value.strip() != size:
                raise ConfigError(f"{key}={value} contradicts the cluster's size {size} (cluster=NAME@{size}); "
                                  "expected one of them, or the same number")
        out.append(f"run.nproc={size}")
    return out


def _check_overrides(overrides: Sequence[str], extra_dirs: Sequence[str | os.PathLike[str]] = ()) -> None:
    for ov in overrides:
        if "=" not in ov:
            raise ConfigError(f"bad override {ov!r}: expected key=value (e.g. workload=prolong)")
        key, value = ov.split("=", 1)
        key = key.lstrip("+~")
        if key in GROUPS:
            choices = group_choices(key, extra_dirs)
            if value not in choices:
                raise ConfigError(
                    f"unknown {key} {value!r}; valid choices: {', '.join(choices)}"
                )


def _root_default_groups(config_name: str) -> set[str]:
    import yaml

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
            return new + key[len(old):]
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
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

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
            cfg = compose(config_name=config_name, overrides=list(overrides), return_hydra_config=True)
    except (HydraException, OmegaConfBaseException) as exc:
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        hint = ""
        if "Could not override" in msg:
            key = msg.split("'")[1] if msg.count("'") >= 2 else "KEY"
            hint = (f" (the config defines no key {key}: check its spelling, or add one with a leading '+': "
                    f"+{key}=...)")
        raise ConfigError(f"bad config override: {msg}{hint}") from None
    choices = {g: str(c) for g, c in cfg.hydra.runtime.choices.items() if g in GROUPS and c is not None}
    with open_dict(cfg):
        del cfg["hydra"]
        cfg["names"] = choices
    return cfg


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
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate as hydra_instantiate

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
            what = "could not be imported" if isinstance(chain[0], ImportError) else "could not be built"
            raise ConfigError(f"_target_ {target!r} {what}: {type(root).__name__}: {_first_line(root)}") from None
        raise


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _missing_module_message(target: str, exc: ModuleNotFoundError) -> str:
    """One line: which module is missing for which target, and where Python looked for it."""
    module = exc.name or _first_line(exc)
    if module and target.startswith(module.split(".")[0] + ".") and not target.startswith(module + "."):
        # the target's own package imports but something inside it does not
        return f"_target_ {target!r} could not be imported: {_first_line(exc)}"
    installed = (sys.prefix, sys.base_prefix, sys.exec_prefix)
    searched = [p for p in dict.fromkeys(sys.path) if p and os.path.isdir(p) and not p.startswith(installed)]
    return (f"_target_ {target!r}: no module named {module!r}; searched {', '.join(searched) or '-'} and the "
            "installed packages (put the module in the folder dcp-bench runs in, or beside the config folder "
            "named by extra_conf=DIR)")
