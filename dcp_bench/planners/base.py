"""The planner interface shared by DCP and every baseline.

A planner is pure: it takes the sizes of one global batch and a cost model (which carries the
model and cluster specs and the memory cap) and returns a `StepPlan`. It imports no
torch.distributed and touches no GPU. A new method is a subclass plus a config file in
``dcp_bench/conf/method/`` whose ``_target_`` names it; core code never branches on a method name.
"""

from __future__ import annotations

import importlib
import inspect
import math
import types
import typing
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from dcp_bench.config import instantiate, to_container
from dcp_bench.errors import ConfigError
from dcp_bench.plan import Mode, StepPlan

if TYPE_CHECKING:
    from dcp_bench.batch import GlobalBatch
    from dcp_bench.cost.base import CostModel


class Planner(ABC):
    """Base class for methods. Subclasses set ``name`` and implement `plan`."""

    name: ClassVar[str] = "planner"
    #: The system a peer reproduces and its defaults, with their sources (the report's method
    #: glossary shows it; empty for the suite's own methods).
    source: ClassVar[str] = ""
    # Constructor options checked before any run (`check_planner_options`), besides their
    # annotated types: the smallest value of an integer option (an unlisted one: >= 0), and the
    # options that name an SP degree (null or a power of two, unless the planner runs ring groups
    # of any size dividing the world: `SP_POWER_OF_TWO` False, checked against the cluster when
    # it plans).
    OPTION_MINIMA: ClassVar[Mapping[str, int]] = {}
    SP_OPTIONS: ClassVar[tuple[str, ...]] = ()
    SP_POWER_OF_TWO: ClassVar[bool] = True
    # Whether its plans run on the simulator only: the runtime refuses them (Megatron-style
    # tensor and pipeline parallelism, `dcp_bench.plan.StepPlan.model_parallel`).
    simulated_only: ClassVar[bool] = False

    def __init__(self, mode: Mode = "fair") -> None:
        if mode not in ("fair", "paper"):
            raise ValueError(f"mode must be 'fair' or 'paper', got {mode!r}")
        self.mode: Mode = mode

    @abstractmethod
    def plan(self, batch: GlobalBatch, cost: CostModel) -> StepPlan:
        """Plan one optimizer step over ``batch`` on ``cost.cluster``."""

    def label(self) -> str:
        """Name shown in reports; paper-mode runs are labelled as such."""
        return method_label(self.name, self.mode)


def method_label(name: str, mode: str = "fair") -> str:
    """A method's name in records and reports: paper-mode runs say so."""
    return f"{name} (paper mode)" if mode == "paper" else name


def make_planner(node: Any, seed: int | None = None) -> Planner:
    """Build the planner a ``method`` config node names. The node holds ``name`` (the method's
    name, shown in records and reports), ``_target_`` (the class) and its constructor arguments.
    A planner whose constructor takes ``seed`` (e.g. one that deals at random) gets the run's."""
    data = to_container(node)
    name = data.pop("name", None)
    if "_target_" not in data:
        raise ConfigError(f"method config {name!r} has no _target_ naming its planner class")
    check_planner_options(data)
    if seed is not None and "seed" in _constructor_parameters(str(data["_target_"])):
        data["seed"] = seed
    planner = instantiate(data)
    if not isinstance(planner, Planner):
        raise ConfigError(f"method {name!r}: {data['_target_']} is not a dcp_bench Planner")
    if name:
        planner.name = name  # type: ignore[misc]
    return planner


def _scalar_kinds(hint: Any) -> set[Any] | None:
    """The scalar types an annotation allows (int, float, bool, None), or None when it allows
    anything else too (text, lists, a literal, a callable): such an option is left to the
    planner."""
    args = (
        typing.get_args(hint)
        if typing.get_origin(hint) in (typing.Union, types.UnionType)
        else (hint,)
    )
    kinds = {type(None) if a is type(None) else a for a in args}
    return kinds if kinds <= {int, float, bool, type(None)} else None


def check_planner_options(node: Mapping[str, Any]) -> None:
    """The options of a ``method`` config node against its planner's constructor, before any
    run: an option annotated ``int`` takes an integer (not a bool, a decimal or text) of at least
    the class's `Planner.OPTION_MINIMA` (0 unless listed), ``float`` a finite number, ``bool``
    true or false, ``| None`` also null; an SP degree (`Planner.SP_OPTIONS`) is a power of two
    where the class says so (`Planner.SP_POWER_OF_TWO`). A
    `ConfigError` names ``method.KEY``, the value and what was expected. A target that cannot be
    imported is left to the instantiation, which reports it."""
    target = str(node.get("_target_", ""))
    module, _, attr = target.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), attr)
        params = inspect.signature(cls).parameters
        hints = typing.get_type_hints(cls.__init__)
    except Exception:  # the instantiation that follows reports an import error on one line
        return
    minima = getattr(cls, "OPTION_MINIMA", {})
    sp_options = getattr(cls, "SP_OPTIONS", ())
    power_of_two = getattr(cls, "SP_POWER_OF_TWO", True)
    method = node.get("name", attr)
    for key, value in node.items():
        if key in ("_target_", "name", "mode") or key not in params or key not in hints:
            continue
        kinds = _scalar_kinds(hints[key])
        if kinds is None:
            continue
        where = f"method.{key}={value!r} (method {method!r})"
        null = " or null" if type(None) in kinds else ""
        if value is None:
            if type(None) not in kinds:
                raise ConfigError(f"{where}: expected a value, not null")
            continue
        if bool in kinds and int not in kinds:
            if not isinstance(value, bool):
                raise ConfigError(f"{where}: expected true or false{null}")
        elif int in kinds and float not in kinds:
            low = int(minima.get(key, 1 if key in sp_options else 0))
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"{where}: expected an integer >= {low}{null}")
            if key in sp_options and power_of_two and value & (value - 1):
                raise ConfigError(f"{where}: expected a power of two (1, 2, 4, ...){null}")
        elif float in kinds:
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not number or not math.isfinite(value):
                raise ConfigError(f"{where}: expected a finite number{null}")


def _constructor_parameters(target: str) -> set[str]:
    """Parameter names of the class a ``_target_`` names (empty when it cannot be imported: the
    instantiation that follows reports that)."""
    module, _, attr = target.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError, ValueError):
        return set()
    return set(inspect.signature(cls).parameters)
