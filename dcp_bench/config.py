"""Config composition: hydra's compose API over the packaged config root `dcp_bench/conf`.

The CLI takes hydra-style `key=value` overrides, e.g. `workload=prolong method=dcp cluster=h200x32`.
Config groups: workload, method, cluster, model, run. Each group file names the object it builds
with `_target_` (see `instantiate`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from omegaconf import DictConfig, OmegaConf

from dcp_bench.errors import ConfigError
from dcp_bench.paths import CONF_DIR

GROUPS = ("workload", "method", "cluster", "model", "run")


def group_choices(group: str) -> list[str]:
    """Names of the configs available in a config group."""
    folder = CONF_DIR / group
    if not folder.is_dir():
        raise ConfigError(f"unknown config group {group!r}; expected one of {', '.join(GROUPS)}")
    return sorted(p.stem for p in folder.glob("*.yaml"))


def _check_overrides(overrides: Sequence[str]) -> None:
    for ov in overrides:
        if "=" not in ov:
            raise ConfigError(f"bad override {ov!r}: expected key=value (e.g. workload=prolong)")
        key, value = ov.split("=", 1)
        key = key.lstrip("+~")
        if key in GROUPS:
            choices = group_choices(key)
            if value not in choices:
                raise ConfigError(
                    f"unknown {key} {value!r}; valid choices: {', '.join(choices)}"
                )


def load_config(overrides: Sequence[str] = (), config_name: str = "config") -> DictConfig:
    """Compose the config with overrides; bad group values raise `ConfigError` naming the choices."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    _check_overrides(overrides)
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
    """Build the object a config node names with `_target_`."""
    from hydra.utils import instantiate as hydra_instantiate

    return hydra_instantiate(node, **kwargs)
