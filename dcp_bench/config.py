"""Config composition: hydra's compose API over the packaged config root `dcp_bench/conf`.

The CLI takes hydra-style `key=value` overrides, e.g. `workload=prolong method=dcp cluster=h200x32`.
Config groups: workload, method, cluster, model, run. Each group file names the object it builds
with `_target_` (see `instantiate`).

Users add configs without editing the package: the override ``extra_conf=DIR[:DIR...]`` (or the
environment variable ``DCP_BENCH_CONF_PATH``) names folders laid out like ``dcp_bench/conf``
(``DIR/method/my_planner.yaml``, ``DIR/workload/my_lengths.yaml``); their choices join the
packaged ones.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

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
    return [d.resolve() for d in dirs]


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


def load_config(overrides: Sequence[str] = (), config_name: str = "config") -> DictConfig:
    """Compose the config with overrides; bad group values raise `ConfigError` naming the choices."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    overrides, extra = _split_extra_conf(overrides)
    dirs = extra_config_dirs(extra)
    _check_overrides(overrides, dirs)
    overrides = _append_missing_groups(overrides, config_name)
    if dirs:  # hydra looks up config groups in these folders after the packaged root
        overrides = [*overrides, "hydra.searchpath=[" + ",".join(f"file://{d}" for d in dirs) + "]"]
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name=config_name, overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as exc:
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"bad config override: {msg}") from None
    return cfg


def to_container(cfg: DictConfig) -> dict[str, Any]:
    out = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(out, dict)
    return out  # type: ignore[return-value]


def config_hash(cfg: DictConfig | dict[str, Any], exclude: Sequence[str] = ()) -> str:
    """A short, stable hash of a resolved config (keys in `exclude` left out, e.g. `seed`)."""
    data = to_container(cfg) if isinstance(cfg, DictConfig) else dict(cfg)
    for key in exclude:
        data.pop(key, None)
    blob = json.dumps(data, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def instantiate(node: DictConfig | dict[str, Any], **kwargs: Any) -> Any:
    """Build the object a config node names with `_target_`. A `DcpBenchError` raised by the
    target's constructor propagates as itself (hydra would wrap it), so the CLI prints it on one
    line."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate as hydra_instantiate

    try:
        return hydra_instantiate(node, **kwargs)
    except InstantiationException as exc:
        cause = exc.__cause__
        while cause is not None and not isinstance(cause, DcpBenchError):
            cause = cause.__cause__
        if cause is None:
            raise
        raise cause from None
