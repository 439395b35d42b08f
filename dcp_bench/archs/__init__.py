"""Architectures as plug-ins: one torch-free module per architecture (`base.Architecture`), found
by the name a model config's ``arch`` gives.

The built-in ones are the modules of this package that define ``ARCH``. A model config may also
name a module of its own (``arch: mypackage.my_arch``): it is imported and its ``ARCH`` used, so
a new architecture is one module and one model YAML (docs/extending.md, "Add an architecture").
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
    """The architecture a model config's ``arch`` names: a built-in, or a module path whose
    module defines ``ARCH``. Anything else is a one-line error naming the registered ones."""
    if not isinstance(name, str) or not name:
        raise ConfigError(
            f"architecture {name!r}; expected one of {', '.join(sorted(BUILTIN))} or a module "
            "path 'package.module' defining ARCH"
        )
    if name in BUILTIN:
        return _load(BUILTIN[name], name)
    if "." in name:
        try:
            arch = _load(name, name)
        except ModuleNotFoundError as exc:
            raise ConfigError(
                f"architecture {name!r}: module not found ({exc.name}); expected one of "
                f"{', '.join(sorted(BUILTIN))} or an importable module defining ARCH"
            ) from None
        if arch.name != name:
            raise ConfigError(
                f"architecture {name!r}: its ARCH is named {arch.name!r}; expected the module "
                "path it is loaded from"
            )
        return arch
    raise ConfigError(
        f"unknown architecture {name!r}; registered: {', '.join(sorted(BUILTIN))} (or a module "
        "path 'package.module' defining ARCH)"
    )


def arch_of(spec: object) -> Architecture:
    """The architecture of a model spec (its ``arch`` field)."""
    return get_arch(getattr(spec, "arch", ""))


def registered() -> list[str]:
    """Names of the built-in architectures."""
    return sorted(BUILTIN)


__all__ = ["BUILTIN", "Architecture", "arch_of", "get_arch", "registered"]
