"""The planner interface shared by DCP and every baseline.

A planner is pure: it takes the sizes of one global batch and a cost model (which carries the
model and cluster specs and the memory cap) and returns a `StepPlan`. It imports no
torch.distributed and touches no GPU. A new method is a subclass plus a config file in
``dcp_bench/conf/method/`` whose ``_target_`` names it; core code never branches on a method name.
"""

from __future__ import annotations

import importlib
import inspect
from abc import ABC, abstractmethod
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
    if seed is not None and "seed" in _constructor_parameters(str(data["_target_"])):
        data["seed"] = seed
    planner = instantiate(data)
    if not isinstance(planner, Planner):
        raise ConfigError(f"method {name!r}: {data['_target_']} is not a dcp_bench Planner")
    if name:
        planner.name = name  # type: ignore[misc]
    return planner


def _constructor_parameters(target: str) -> set[str]:
    """Parameter names of the class a ``_target_`` names (empty when it cannot be imported: the
    instantiation that follows reports that)."""
    module, _, attr = target.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError, ValueError):
        return set()
    return set(inspect.signature(cls).parameters)
