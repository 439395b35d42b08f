"""`RunSpec`: one run, parsed once from a composed config into typed, validated, frozen settings.

Every command that runs something (``simulate``, ``sweep``, ``train``, ``reproduce``, the
integration API) turns its config into a `RunSpec` here and hands it to the one step loop
(`dcp_bench.run.loop`). A bad value fails here, naming its key and what was expected; nothing
below reads the raw config with defaults of its own.

A run's identity is a pure function of its config: ``config_hash`` hashes the config without the
seed and the bookkeeping keys (where records go, how many repeats), ``context_hash`` also without
the method (the runs a comparison pairs), and ``run_id`` names method, workload, cluster, model,
the cell hash and the seed, so a rerun of the same sweep finds its runs again.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import importlib
import inspect
import re
import traceback
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# The defaults of the ``run`` group and the top-level parameters: one table, `dcp_bench.config`.
from dcp_bench.config import (
    MEM_CAP_FRACTION,
    RUN_DEFAULTS,
    SEED_DEFAULT,
    away_from_default,
    config_hash,
)
from dcp_bench.cost import SOURCES, resolve_cluster, resolve_model
from dcp_bench.cost.analytical import SCALE_DEFAULTS, SCALE_KEYS
from dcp_bench.cost.specs import ClusterSpec, ModelSpec, model_identity
from dcp_bench.errors import ClusterError, ConfigError, DcpBenchError
from dcp_bench.planners.base import check_planner_options
from dcp_bench.reference import run_label
from dcp_bench.run.capabilities import EpochSampler, FixedDataset
from dcp_bench.train_policy import DEFAULT_ZERO_STAGE, ZERO_STAGES
from dcp_bench.workloads import REGISTRY_TARGETS, WORKLOADS

EXECUTORS = ("sim", "torch")
PLANNER_CLOCKS = ("overlap", "serial", "off")
# What planning time the step clock is charged (``run.planner_time``): ``cpu`` the planning call's
# process CPU time, ``wall`` its wall-clock time (other processes' load included), ``none``
# nothing; ``auto`` = ``none`` on the simulator (a simulated result depends only on its inputs,
# never on the host's load or speed) and ``cpu`` on measured runs. Both times are recorded on
# every step whatever is charged (docs/planners.md, "Planning time").
PLANNER_TIMES = ("auto", "cpu", "wall", "none")
UNITS = ("auto", "step", "epoch")  # auto: epoch in paper mode, step in fair mode

# Keys of the `run` group that say where or how often a run is recorded, not what it measures:
# left out of the cell hash, so moving a campaign or adding repeats keeps run ids stable.
BOOKKEEPING_KEYS = ("root", "campaign", "repeats", "jobs", "progress", "timeout_s", "kill_grace_s")


@dataclass(frozen=True)
class NoiseSettings:
    """Seeded run-to-run variation of the simulator (`dcp_bench.sim.NoiseModel`); all zero =
    none."""

    jitter_sigma: float = 0.0
    straggler_prob: float = 0.0
    straggler_slowdown: float = 1.5

    @property
    def active(self) -> bool:
        return self.jitter_sigma > 0 or self.straggler_prob > 0


@dataclass(frozen=True)
class CostSettings:
    """Which cost model prices plans (``source``) and which one planners see
    (``planner_source``)."""

    source: str = "auto"
    planner_source: str | None = None
    profile: str | None = None
    zero_stage: int | None = None
    scales: tuple[tuple[str, float], ...] = ()  # only the factors that differ from 1
    options: tuple[tuple[str, Any], ...] = ()  # further constructor options (``+cost.KEY=...``)

    @property
    def scale_map(self) -> dict[str, float]:
        return dict(self.scales)

    def constructor_options(self) -> dict[str, Any]:
        out = dict(self.options)
        if self.zero_stage is not None:
            out["zero_stage"] = self.zero_stage
        return out


@dataclass(frozen=True)
class TrainSettings:
    """Real training (executor ``torch``)."""

    lr: float = 1e-3
    grad_clip: float | None = 1.0
    backend: str = "auto"  # auto: nccl on CUDA, gloo otherwise
    device: str = "auto"  # auto | cpu | cuda
    threads: int = 1
    pg_timeout_s: float = 300.0
    fail_rank: int = -1  # fault injection: this rank raises ...
    fail_step: int = 0  # ... at the start of this step
    nnodes: int = 1  # nodes of a multi-node run (one torchrun per node, c10d rendezvous)
    rdzv_endpoint: str | None = None  # HOST:PORT of the rendezvous (multi-node)
    rdzv_id: str = "dcp-bench"  # the rendezvous id every node's torchrun shares

    @property
    def torchrun_args(self) -> tuple[str, ...]:
        """torchrun's rendezvous arguments: standalone on one node, c10d across nodes."""
        if self.nnodes == 1 and not self.rdzv_endpoint:
            return ("--standalone",)
        return (
            "--nnodes",
            str(self.nnodes),
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            str(self.rdzv_endpoint),
            "--rdzv-id",
            self.rdzv_id,
        )


class _Node(Mapping[str, Any]):
    """A typed config node that still reads as the node it was parsed from (``spec.method["x"]``,
    ``dict(spec.method)``), so builders that take a node (`make_planner`, `make_workload`) take it
    as it is."""

    node: Mapping[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.node[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.node)

    def __len__(self) -> int:
        return len(self.node)


@dataclass(frozen=True, eq=False)
class MethodSpec(_Node):
    """The ``method`` node: the method's ``name``, its planner class (``target``, the node's
    ``_target_``), its ``mode`` (fair | paper) and the whole node (constructor arguments)."""

    name: str
    target: str
    mode: str
    node: Mapping[str, Any]

    @property
    def options(self) -> dict[str, Any]:
        """The planner's constructor arguments (the node without ``name`` and ``_target_``)."""
        return {k: v for k, v in self.node.items() if k not in ("name", "_target_")}


@dataclass(frozen=True, eq=False)
class WorkloadSpec(_Node):
    """The ``workload`` node: its config ``name``, the class a user's workload names (``target``;
    None for a registered workload, built by `dcp_bench.workloads.load_workload`) and the whole
    node (parameters)."""

    name: str
    target: str | None
    node: Mapping[str, Any]

    @property
    def registered(self) -> bool:
        """A workload of the registry (`dcp_bench.workloads.WORKLOADS`), not a user's class."""
        return self.target is None or self.target in REGISTRY_TARGETS


def _method_spec(node: dict[str, Any]) -> MethodSpec:
    if not node.get("_target_"):
        raise ConfigError(
            f"method config {node.get('name')!r} has no _target_ naming its planner class"
        )
    mode = node.get("mode", "fair")
    if mode not in ("fair", "paper"):
        raise ConfigError(f"method.mode={mode!r}; expected fair or paper")
    check_planner_options(node)  # method.sp=abc is refused here, not in the run's first step
    return MethodSpec(
        name=str(node.get("name", "method")),
        target=str(node["_target_"]),
        mode=str(mode),
        node=node,
    )


def _workload_spec(node: dict[str, Any]) -> WorkloadSpec:
    target = node.get("_target_")
    return WorkloadSpec(
        name=str(node.get("name", "workload")),
        target=None if target is None else str(target),
        node=node,
    )


@dataclass(frozen=True)
class RunSpec:
    """One run: what to build (workload, method, cluster, model, cost) and how to run it."""

    config: Mapping[str, Any]  # the resolved config, seed included (written as config.yaml)
    seed: int
    workload: WorkloadSpec  # the workload node (built by the assembly with ``seed``)
    method: MethodSpec  # the method node (``name``, ``_target_``, constructor arguments)
    cluster: ClusterSpec  # resized to ``run.nproc`` ranks when that is set
    model: ModelSpec
    mem_cap_fraction: float
    # the top-level parameters set away from their declared default (`dcp_bench.config.PARAMETERS`)
    away_from_default: tuple[str, ...]
    cost: CostSettings
    steps: int  # measured steps (run.unit=step)
    warmup_steps: int
    planner_clock: str
    noise: NoiseSettings
    executor: str
    timeout_s: float | None
    kill_grace_s: float | None
    train: TrainSettings
    root: str
    campaign: str
    run_id: str
    config_hash: str
    context_hash: str
    label: str  # the method's name, "(paper mode)" appended in paper mode
    workload_name: str  # the workload's config name (a user's ``my_corpus``)
    sweep: str = ""
    overrides: tuple[str, ...] = ()
    names: Mapping[str, str] = field(default_factory=dict)
    unit: str = "step"  # step: steps of fresh global batches; epoch: the reference's epoch loop
    epochs: int = 1  # run.unit=epoch: measured epochs over the workload's fixed dataset
    limit_source: str = (
        ""  # what set timeout_s when not run.timeout_s (e.g. a section's time budget)
    )
    # The ZeRO stage of the runtime's training states (real runs) and of the cost model that
    # prices them: ``cost.zero_stage``, or the policy's default when that is null.
    zero_stage: int = DEFAULT_ZERO_STAGE
    # What planning time the step clock is charged: cpu | wall | none (``run.planner_time``,
    # ``auto`` resolved by the executor: none on the simulator, cpu on measured runs).
    planner_time: str = "none"

    @property
    def world_size(self) -> int:
        return self.cluster.world_size

    @property
    def method_name(self) -> str:
        return self.method.name

    @property
    def mode(self) -> str:
        return self.method.mode

    @property
    def total_steps(self) -> int:
        return self.warmup_steps + self.steps

    def hard_limit_s(self) -> float | None:
        """Seconds after which the run's whole process tree is killed: ``timeout_s`` plus a grace
        period (the loop checks ``timeout_s`` between steps; this catches a step that never
        returns)."""
        if self.timeout_s is None:
            return None
        grace = (
            self.kill_grace_s if self.kill_grace_s is not None else max(10.0, 0.25 * self.timeout_s)
        )
        return self.timeout_s + grace

    def with_timeout(
        self, timeout_s: float | None, source: str = "", kill_grace_s: float | None = None
    ) -> RunSpec:
        """The same run under another time limit, set by ``source`` (e.g. "the time budget"; empty:
        ``run.timeout_s``), optionally with another kill grace: identity unchanged."""
        grace = self.kill_grace_s if kill_grace_s is None else kill_grace_s
        return dataclasses.replace(
            self, timeout_s=timeout_s, limit_source=source, kill_grace_s=grace
        )

    def limit_text(self) -> str:
        """What limits the run's time, for messages: ``run.timeout_s=180`` or the budget that cut
        it."""
        if self.timeout_s is None:
            return "no time limit"
        if self.limit_source:
            return f"{self.limit_source} ({self.timeout_s:.0f} s left when the run started)"
        return f"run.timeout_s={self.timeout_s:g}"


# ------------------------------------------------------------------------------------------------
# Typed reads: every bad value names its key.


def _node(cfg: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = cfg.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{key}: expected a config group (a mapping), got {value!r}")
    return dict(value)


# Upper bounds of a run's sizes: far above any real run, low enough that an absurd value is refused
# at once rather than planned for minutes (or for ever).
MAX_STEPS = 100_000  # run.steps and run.warmup_steps, each
MAX_EPOCHS = 1_000
MAX_RANKS = 131_072  # run.nproc, cluster=NAME@N: 16,384 nodes of 8 GPUs
MAX_SEED = 2**32 - 1  # numpy's seed range


def _int(
    value: Any,
    key: str,
    minimum: int | None = None,
    allow_none: bool = False,
    maximum: int | None = None,
) -> Any:
    if value is None and allow_none:
        return None
    expected = "expected an integer" + (f" >= {minimum}" if minimum is not None else "")
    if maximum is not None:
        expected += f" and at most {maximum:,}"
    if isinstance(value, bool) or value is None:
        raise ConfigError(f"{key}={value!r}: {expected}")
    if isinstance(value, float):
        # `steps=1e3` and `steps=1000.0` reach here as floats: refused, not rounded
        raise ConfigError(
            f"{key}={value!r}: {expected}, written in digits (a decimal point or an exponent, "
            "as in 1e3, makes it a decimal number)"
        )
    if isinstance(value, str):
        text = value.strip()
        if not (text.lstrip("+-").isdigit() and text.isascii()):
            raise ConfigError(f"{key}={value!r}: {expected} (ASCII digits)")
        value = int(text)
    if not isinstance(value, int):
        raise ConfigError(f"{key}={value!r}: {expected}")
    if minimum is not None and value < minimum or maximum is not None and value > maximum:
        raise ConfigError(f"{key}={value}: {expected}")
    return value


def _float(
    value: Any,
    key: str,
    positive: bool = False,
    allow_none: bool = False,
    lo: float | None = None,
    hi: float | None = None,
) -> Any:
    if value is None and allow_none:
        return None
    if isinstance(value, bool):
        raise ConfigError(f"{key}={value!r}: expected a number")
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{key}={value!r}: expected a number") from None
    if out != out or out in (float("inf"), float("-inf")):
        raise ConfigError(f"{key}={value!r}: expected a finite number")
    if positive and not out > 0:
        raise ConfigError(f"{key}={value!r}: expected a number > 0")
    if lo is not None and out < lo or hi is not None and out > hi:
        raise ConfigError(f"{key}={value!r}: expected a number in [{lo}, {hi}]")
    return out


# A campaign is one folder under the root: one safe path component.
CAMPAIGN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def _campaign(value: Any) -> str:
    if (
        isinstance(value, bool)
        or not isinstance(value, (str, int))
        or not CAMPAIGN_NAME.fullmatch(str(value))
    ):
        raise ConfigError(
            f"run.campaign={value!r}: expected one folder name of 1 to 100 characters from "
            "A-Z a-z 0-9 . _ - (starting with a letter or digit)"
        )
    return str(value)


def _path(value: Any, key: str) -> str:
    if (
        isinstance(value, bool)
        or not isinstance(value, (str, int))
        or not str(value)
        or "\0" in str(value)
    ):
        raise ConfigError(f"{key}={value!r}: expected a folder path")
    return str(value)


def _choice(value: Any, key: str, choices: Sequence[str]) -> str:
    if str(value) not in choices:
        raise ConfigError(f"{key}={value!r}; expected one of {', '.join(choices)}")
    return str(value)


def _cost_settings(node: dict[str, Any]) -> CostSettings:
    node = dict(node)
    source = _choice(node.pop("source", "auto"), "cost.source", SOURCES)
    planner_source = node.pop("planner_source", None)
    if planner_source is not None:
        planner_source = _choice(planner_source, "cost.planner_source", SOURCES)
    profile = node.pop("profile", None)
    zero_stage = _int(node.pop("zero_stage", None), "cost.zero_stage", minimum=0, allow_none=True)
    if zero_stage is not None and zero_stage not in ZERO_STAGES:
        raise ConfigError(
            f"cost.zero_stage={zero_stage}: expected one of {', '.join(map(str, ZERO_STAGES))} or "
            "null"
        )
    raw_scales = node.pop("scales", None) or {}
    if not isinstance(raw_scales, Mapping):
        raise ConfigError(
            f"cost.scales={raw_scales!r}: expected a mapping of {', '.join(SCALE_KEYS)}"
        )
    scales = []
    for key, val in sorted(raw_scales.items()):
        if key not in SCALE_KEYS:
            raise ConfigError(
                f"cost.scales.{key}: unknown constant; expected one of {', '.join(SCALE_KEYS)}"
            )
        factor = _float(val, f"cost.scales.{key}", positive=True)
        if factor != SCALE_DEFAULTS[key]:
            scales.append((str(key), factor))
    return CostSettings(
        source=source,
        planner_source=planner_source,
        profile=str(profile) if profile else None,
        zero_stage=zero_stage,
        scales=tuple(scales),
        options=tuple(sorted(node.items())),
    )


def _train_settings(node: dict[str, Any]) -> TrainSettings:
    known = {f.name for f in dataclasses.fields(TrainSettings)}
    unknown = sorted(set(node) - known)
    if unknown:
        raise ConfigError(
            f"train.{unknown[0]}: unknown key; expected one of {', '.join(sorted(known))}"
        )
    d = TrainSettings()
    clip = node.get("grad_clip", d.grad_clip)
    nnodes = _int(node.get("nnodes", d.nnodes), "train.nnodes (nnodes)", minimum=1)
    endpoint = node.get("rdzv_endpoint")
    if nnodes > 1 and not endpoint:
        raise ConfigError(
            f"train.nnodes (nnodes)={nnodes}: a multi-node run needs rdzv_endpoint=HOST:PORT "
            "(the node that hosts the rendezvous)"
        )
    if endpoint is not None and not re.fullmatch(r"[A-Za-z0-9_.\-\[\]:]+:\d+", str(endpoint)):
        raise ConfigError(f"train.rdzv_endpoint (rdzv_endpoint)={endpoint!r}: expected HOST:PORT")
    return TrainSettings(
        lr=_float(node.get("lr", d.lr), "train.lr", positive=True),
        grad_clip=_float(clip, "train.grad_clip", positive=True, allow_none=True),
        backend=_choice(node.get("backend", d.backend), "train.backend", ("auto", "gloo", "nccl")),
        device=_choice(node.get("device", d.device), "train.device", ("auto", "cpu", "cuda")),
        threads=_int(node.get("threads", d.threads), "train.threads", minimum=1),
        pg_timeout_s=_float(
            node.get("pg_timeout_s", d.pg_timeout_s), "train.pg_timeout_s", positive=True
        ),
        fail_rank=_int(node.get("fail_rank", d.fail_rank), "train.fail_rank", minimum=-1),
        fail_step=_int(node.get("fail_step", d.fail_step), "train.fail_step", minimum=0),
        nnodes=nnodes,
        rdzv_endpoint=str(endpoint) if endpoint is not None else None,
        rdzv_id=str(node.get("rdzv_id", d.rdzv_id)),
    )


def _noise_settings(node: dict[str, Any]) -> NoiseSettings:
    d = NoiseSettings()
    return NoiseSettings(
        jitter_sigma=_float(
            node.get("jitter_sigma", d.jitter_sigma), "run.noise.jitter_sigma", lo=0.0, hi=10.0
        ),
        straggler_prob=_float(
            node.get("straggler_prob", d.straggler_prob), "run.noise.straggler_prob", lo=0.0, hi=1.0
        ),
        straggler_slowdown=_float(
            node.get("straggler_slowdown", d.straggler_slowdown),
            "run.noise.straggler_slowdown",
            lo=1.0,
            hi=1e6,
        ),
    )


def _resolve_group(node: Mapping[str, Any], group: str, resolve: Any) -> Any:
    try:
        return resolve(node)
    except DcpBenchError:
        raise
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{group} config {node.get('name', '?')!r}: {exc}") from None


def _class_of(target: Any) -> Any:
    """The class ``target`` names, or None when it does not import (its builder says why later);
    user code that raises anything else while importing is a `ConfigError` naming the file and
    line where it raised."""
    module, _, attr = str(target).rpartition(".")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError, ValueError):
        return None
    except Exception as exc:
        frames = traceback.extract_tb(exc.__traceback__)
        where = f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""
        text = (str(exc).strip().splitlines() or [""])[0]
        raise ConfigError(
            f"_target_ {target!r}: importing module {module!r} raised {type(exc).__name__}"
            f"{': ' + text if text else ''}{where}"
        ) from None


def _epoch_missing(method: MethodSpec, workload: WorkloadSpec) -> str:
    """Why the reference's epoch loop cannot run this method on this workload ("" when it can):
    the method's planner class needs an epoch sampler (`EpochSampler`), the workload a fixed
    dataset (`FixedDataset`; a registered workload, an entry with a dataset)."""
    cls = _class_of(method.target)
    if not isinstance(cls, type) or not issubclass(cls, EpochSampler):
        return f"method {method.get('name')!r} has no reference epoch sampler (plan_epoch)"
    if workload.registered:
        entry = WORKLOADS.get(str(workload.get("name")))
        if entry is None or entry.dataset is None:
            return f"workload {workload.get('name')!r} has no fixed dataset"
        return ""
    wcls = _class_of(workload.target)
    if not isinstance(wcls, type) or not issubclass(wcls, FixedDataset):
        return f"workload {workload.target!r} has no fixed dataset (epoch_dataset)"
    return ""


# ------------------------------------------------------------------------------------------------
# Identity


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "x"


# Provenance fields of the cluster, GPU and model specs: where a number comes from, not the number;
# left out of a run's identity, so a corrected citation changes no run id.
PROVENANCE_KEYS = ("sources",)


def _without_provenance(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _without_provenance(v) for k, v in data.items() if k not in PROVENANCE_KEYS}
    if isinstance(data, (list, tuple)):
        return [_without_provenance(v) for v in data]
    return data


def _method_identity(method: MethodSpec) -> dict[str, Any]:
    """The method node with its planner's constructor defaults filled in (plain values only), so a
    planner option the method config comes to list at its default changes no run id."""
    cls = _class_of(method.target)
    defaults: dict[str, Any] = {}
    if isinstance(cls, type):
        params: list[inspect.Parameter] = []
        with contextlib.suppress(TypeError, ValueError):  # a class without a signature
            params = list(inspect.signature(cls).parameters.values())
        plain = (type(None), bool, int, float, str)
        defaults = {
            p.name: p.default
            for p in params
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and isinstance(p.default, plain)
        }
    return {**defaults, **dict(method.node)}


def run_identity(
    *,
    workload: WorkloadSpec,
    method: MethodSpec,
    cluster: ClusterSpec,
    model: ModelSpec,
    mem_cap_fraction: float,
    cost: CostSettings,
    steps: int,
    warmup_steps: int,
    planner_clock: str,
    planner_time: str,
    noise: NoiseSettings,
    executor: str,
    train: TrainSettings,
    unit: str,
    epochs: int,
    names: Mapping[str, str],
) -> dict[str, Any]:
    """What a run measures, from its parsed settings (defaults filled in, so a key the config
    leaves out and the same key listed at its default are one run): the workload node (a
    registered workload named by its registry, whichever way a config spells it), the method node
    with its planner's constructor defaults, the resolved
    cluster and model without provenance text, the memory cap, the cost, loop, noise, executor
    and training settings, and the config's names. Not in it: the seed and where or how often a
    run is recorded (`BOOKKEEPING_KEYS`)."""
    node = dict(workload.node)
    if workload.registered:
        node.pop("_target_", None)
    return {
        "workload": {"registered": workload.registered, **node},
        "method": _method_identity(method),
        "cluster": _without_provenance(dataclasses.asdict(cluster)),
        "model": _without_provenance(model_identity(model)),
        "mem_cap_fraction": mem_cap_fraction,
        "cost": dataclasses.asdict(cost),
        "run": {
            "steps": steps,
            "warmup_steps": warmup_steps,
            "planner_clock": planner_clock,
            "planner_time": planner_time,
            "noise": dataclasses.asdict(noise),
            "executor": executor,
            "unit": unit,
            "epochs": epochs,
        },
        "train": dataclasses.asdict(train),
        "names": dict(names),
    }


def identity_hashes(identity: Mapping[str, Any]) -> tuple[str, str]:
    """(cell hash: the run's identity; context hash: also without the method), as hashed into
    run ids."""
    context = {k: v for k, v in identity.items() if k != "method"}
    context["names"] = {k: v for k, v in identity["names"].items() if k != "method"}
    return config_hash(dict(identity)), config_hash(context)


# ------------------------------------------------------------------------------------------------
# Parsing


def _check_run_keys(run: Mapping[str, Any]) -> None:
    known_run = {
        "steps",
        "warmup_steps",
        "repeats",
        "root",
        "campaign",
        "executor",
        "nproc",
        "timeout_s",
        "kill_grace_s",
        "planner_clock",
        "planner_time",
        "noise",
        "jobs",
        "progress",
        "unit",
        "epochs",
    }
    unknown = sorted(set(run) - known_run)
    if unknown:
        raise ConfigError(
            f"run.{unknown[0]}: unknown key; expected one of {', '.join(sorted(known_run))}"
        )


def _run_unit(run: Mapping[str, Any], method: MethodSpec, workload: WorkloadSpec) -> str:
    """``run.unit`` resolved: ``auto`` is the reference's epoch loop for a paper-mode method that
    has one on this workload, else steps; ``epoch`` where that loop cannot run is a
    `ConfigError`."""
    mode = method.mode
    unit = _choice(run.get("unit", RUN_DEFAULTS["unit"]), "run.unit", UNITS)
    missing = _epoch_missing(method, workload)
    if unit == "auto":
        unit = "epoch" if mode == "paper" and not missing else "step"
    if unit == "epoch" and mode != "paper":
        raise ConfigError(
            "run.unit=epoch runs the reference runtime's epoch loop, which is paper mode; "
            "expected method.mode=paper (or run.unit=step)"
        )
    if unit == "epoch" and missing:
        raise ConfigError(f"run.unit=epoch: {missing}; expected run.unit=step")
    return unit


def _resized(cluster: ClusterSpec, run: Mapping[str, Any]) -> ClusterSpec:
    """``cluster`` resized to ``run.nproc`` ranks when that is set."""
    nproc = _int(
        run.get("nproc"),
        "run.nproc (nproc, or cluster=NAME@N)",
        minimum=1,
        allow_none=True,
        maximum=MAX_RANKS,
    )
    if nproc is not None:
        try:
            cluster = cluster.resized(nproc)
        except ClusterError as exc:
            raise ConfigError(f"run.nproc (nproc, or cluster=NAME@N)={nproc}: {exc}") from None
    return cluster


def _check_ranks(cluster: ClusterSpec, train: TrainSettings, total_steps: int) -> None:
    """The run's ranks split evenly over its nodes, and an injected failure names a rank and a
    step (of ``total_steps``, warm-up included) the run has."""
    if cluster.world_size % train.nnodes:
        raise ConfigError(
            f"train.nnodes (nnodes)={train.nnodes}: the run's {cluster.world_size} ranks do not "
            "split evenly over the nodes"
        )
    if train.fail_rank >= cluster.world_size:
        raise ConfigError(
            f"train.fail_rank={train.fail_rank}: expected -1 (no injected failure) or a rank "
            f"< {cluster.world_size} (the run's world size)"
        )
    if train.fail_rank >= 0 and train.fail_step >= total_steps:
        raise ConfigError(
            f"train.fail_step={train.fail_step}: expected a step < {total_steps} "
            f"(warmup_steps + steps), or the injected failure never happens"
        )


def parse_run_spec(
    cfg: Mapping[str, Any],
    seed: int | None = None,
    sweep: str = "",
    overrides: Sequence[str] = (),
) -> RunSpec:
    """The `RunSpec` of a composed, resolved config (a plain dict: `dcp_bench.config.to_container`).
    ``seed`` replaces the config's seed (a sweep's repeats). Raises `ConfigError` naming the key of
    the first bad value."""
    resolved: dict[str, Any] = copy.deepcopy(dict(cfg))
    seed = _int(
        resolved.get("seed", SEED_DEFAULT) if seed is None else seed,
        "seed",
        minimum=0,
        maximum=MAX_SEED,
    )
    resolved["seed"] = seed
    cfg = resolved
    run = _node(cfg, "run")
    _check_run_keys(run)
    steps = _int(
        run.get("steps", RUN_DEFAULTS["steps"]), "run.steps (steps)", minimum=1, maximum=MAX_STEPS
    )
    warmup = _int(
        run.get("warmup_steps", RUN_DEFAULTS["warmup_steps"]),
        "run.warmup_steps (warmup_steps)",
        minimum=0,
        maximum=MAX_STEPS,
    )
    executor = _choice(run.get("executor", RUN_DEFAULTS["executor"]), "run.executor", EXECUTORS)
    clock = _choice(
        run.get("planner_clock", RUN_DEFAULTS["planner_clock"]), "run.planner_clock", PLANNER_CLOCKS
    )
    charged = _choice(
        run.get("planner_time", RUN_DEFAULTS["planner_time"]), "run.planner_time", PLANNER_TIMES
    )
    if charged == "auto":
        charged = "none" if executor == "sim" else "cpu"
    timeout = _float(run.get("timeout_s"), "run.timeout_s", positive=True, allow_none=True)
    grace = _float(run.get("kill_grace_s"), "run.kill_grace_s", lo=0.0, hi=1e9, allow_none=True)
    noise = _noise_settings(_node(run, "noise"))
    mem_cap = MEM_CAP_FRACTION.check(cfg.get(MEM_CAP_FRACTION.key, MEM_CAP_FRACTION.default))
    away = away_from_default(cfg)
    cost = _cost_settings(_node(cfg, "cost"))
    train = _train_settings(_node(cfg, "train"))

    workload = _workload_spec(_node(cfg, "workload"))
    method = _method_spec(_node(cfg, "method"))
    mode = method.mode
    unit = _run_unit(run, method, workload)
    epochs = _int(
        run.get("epochs", RUN_DEFAULTS["epochs"]), "run.epochs", minimum=1, maximum=MAX_EPOCHS
    )
    cluster = _resolve_group(_node(cfg, "cluster"), "cluster", resolve_cluster)
    model = _resolve_group(_node(cfg, "model"), "model", resolve_model)
    if getattr(model, "num_layers", 1) < 1:
        raise ConfigError(
            f"model.num_layers={model.num_layers} (model {model.name!r}): expected an integer >= 1"
        )
    cluster = _resized(cluster, run)
    _check_ranks(cluster, train, warmup + steps)

    names = {str(k): str(v) for k, v in _node(cfg, "names").items()}
    workload_name = names.get("workload") or workload.name
    cell, context = identity_hashes(
        run_identity(
            workload=workload,
            method=method,
            cluster=cluster,
            model=model,
            mem_cap_fraction=mem_cap,
            cost=cost,
            steps=steps,
            warmup_steps=warmup,
            planner_clock=clock,
            planner_time=charged,
            noise=noise,
            executor=executor,
            train=train,
            unit=unit,
            epochs=epochs,
            names=names,
        )
    )
    paper_tag = ("-paper-step" if unit == "step" else "-paper") if mode == "paper" else ""
    stem = "__".join(
        _slug(s)
        for s in (
            f"{method.name}{paper_tag}",
            workload_name,
            cluster.name,
            model.name,
            cell,
        )
    )
    return RunSpec(
        config=cfg,
        seed=seed,
        workload=workload,
        method=method,
        cluster=cluster,
        model=model,
        mem_cap_fraction=mem_cap,
        away_from_default=away,
        cost=cost,
        steps=steps,
        warmup_steps=warmup,
        planner_clock=clock,
        planner_time=charged,
        noise=noise,
        executor=executor,
        timeout_s=timeout,
        kill_grace_s=grace,
        train=train,
        root=_path(run.get("root", RUN_DEFAULTS["root"]), "run.root"),
        campaign=_campaign(run.get("campaign", RUN_DEFAULTS["campaign"])),
        run_id=f"{stem}__s{seed}",
        config_hash=cell,
        context_hash=context,
        label=run_label(method.name, mode, unit),
        workload_name=workload_name,
        sweep=sweep,
        overrides=tuple(overrides),
        names=names,
        unit=unit,
        epochs=epochs,
        zero_stage=DEFAULT_ZERO_STAGE if cost.zero_stage is None else cost.zero_stage,
    )


def cell_hashes(cfg: Mapping[str, Any]) -> tuple[str, str]:
    """(cell hash, context hash) of a composed, resolved config (`parse_run_spec`)."""
    spec = parse_run_spec(cfg)
    return spec.config_hash, spec.context_hash
