"""Architectures as plug-ins: one torch-free module per architecture (`base.Architecture`), found
by the name a model config's ``arch`` gives.

The built-in ones are modules of this package (`BUILTIN`). A model config may also name a module
of its own (``arch: my_arch`` or ``arch: my_package.my_arch``, importable from the folder
dcp-bench runs in or beside the user config folder): it is imported and its ``ARCH`` used, so a
new architecture is one module and one model YAML (docs/extending.md, "Add an architecture").
"""

from __future__ import annotations

import importlib

from dcp_bench.archs.base import Architecture
from dcp_bench.errors import ConfigError

# name -> module of the built-in architectures
BUILTIN: dict[str, str] = {
    "llama": "dcp_bench.archs.llama",
    "gpt": "dcp_bench.archs.gpt",
    "stdit": "dcp_bench.archs.stdit3",
    "wan": "dcp_bench.archs.wan",
}


def _load(module_name: str, name: str) -> Architecture:
    module = importlib.import_module(module_name)
    arch = getattr(module, "ARCH", None)
    if not isinstance(arch, Architecture):
        raise ConfigError(
            f"architecture {name!r}: module {module_name} defines no ARCH "
            "(an instance of dcp_bench.archs.base.Architecture)"
        )
    return arch


def get_arch(name: str) -> Architecture:
    """The architecture a model config's ``arch`` names: a built-in, or a module whose
    ``ARCH`` is named for it. Anything else is a one-line error naming the registered ones."""
    if not isinstance(name, str) or not name:
        raise ConfigError(
            f"architecture {name!r}; expected one of {', '.join(sorted(BUILTIN))} or a module "
            "defining ARCH"
        )
    if name in BUILTIN:
        return _load(BUILTIN[name], name)
    try:
        arch = _load(name, name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and name.startswith(exc.name):  # no such module: unknown name
            raise ConfigError(
                f"unknown architecture {name!r}; registered: {', '.join(sorted(BUILTIN))} (or "
                "a module of yours defining ARCH, importable from the folder dcp-bench runs in)"
            ) from None
        raise
    if arch.name != name:
        raise ConfigError(
            f"architecture {name!r}: its ARCH is named {arch.name!r}; expected the module "
            "path it is loaded from"
        )
    return arch


def arch_of(spec: object) -> Architecture:
    """The architecture of a model spec (its ``arch`` field)."""
    return get_arch(getattr(spec, "arch", ""))


def registered() -> list[str]:
    """Names of the built-in architectures."""
    return sorted(BUILTIN)


__all__ = ["BUILTIN", "Architecture", "arch_of", "get_arch", "registered"]
