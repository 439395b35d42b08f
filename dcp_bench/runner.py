"""The runner: sweeps of methods x workloads x clusters x models x repeats, in simulation or for
real, written as run records (`dcp_bench.records`).

A sweep is a list of hydra-style overrides where a value may list alternatives separated by
commas (``method=dcp,bucket_static cluster=h200x8,h200x32``): the grid is their product, and
every grid point (a *cell*) runs ``run.repeats`` times with seeds ``seed, seed+1, ...``. The same
seed gives the same global batches to every method, so repeats pair across methods.

Resumable: a run's id is a pure function of its cell's config hash and its seed, and a run folder
is complete once ``run.json`` exists (written last, atomically). A rerun of the same sweep skips
complete runs and redoes incomplete ones (a killed run leaves a folder without ``run.json``).

Measurement rules: warm-up steps run and are recorded (``warmup: true``) but excluded from every
summary; planner time is measured on this machine and charged to the step by ``run.planner_clock``
(`charge_planner`; default ``overlap``: planning of the next step hides behind this step only as
far as it is faster); a failed run (OOM, timeout, non-finite loss, error) is recorded with
its status and no step time, and statistics count it as infinitely slow.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import itertools
import math
import os
import re
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from dcp_bench.config import config_hash, load_config, to_container
from dcp_bench.errors import ConfigError, DcpBenchError
from dcp_bench.plan import validate_plan
from dcp_bench.records import RunSummary, RunWriter, StepRecord, is_complete

if TYPE_CHECKING:
    from dcp_bench.batch import GlobalBatch
    from dcp_bench.cost.base import CostModel
    from dcp_bench.plan import StepPlan
    from dcp_bench.planners.base import Planner

# Keys that say where or how often a run is recorded, not what it measures: left out of the cell
# hash so that moving a campaign or adding repeats keeps run ids stable.
BOOKKEEPING_KEYS = ("root", "campaign", "repeats", "jobs", "progress", "timeout_s", "kill_grace_s")
GROUP_KEYS = ("workload", "method", "cluster", "model")


# --------------------------------------------------------------------------------------------
# The grid


def split_alternatives(value: str) -> list[str]:
    """Split ``a,b,c`` on commas outside brackets and quotes (``[1,2]`` stays one value)."""
    out: list[str] = []
    cur: list[str] = []
    depth, quote = 0, ""
    for ch in value:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
            continue
        cur.append(ch)
    out.append("".join(cur))
    return [v.strip() for v in out]


def expand_grid(overrides: Sequence[str]) -> list[list[str]]:
    """The product of the alternatives of every override, in the order given."""
    axes: list[list[str]] = []
    for ov in overrides:
        if "=" not in ov:
            raise ConfigError(f"bad override {ov!r}: expected key=value (e.g. method=dcp,bucket_static)")
        key, value = ov.split("=", 1)
        axes.append([f"{key}={v}" for v in split_alternatives(value)])
    return [list(p) for p in itertools.product(*axes)]


@dataclass(frozen=True)
class RunSpec:
    """One run of a sweep: a cell (config without seed) and a seed."""

    cell_overrides: tuple[str, ...]
    seed: int
    config: dict[str, Any]  # resolved, seed included
    config_hash: str  # the cell: config without seed and bookkeeping
    context_hash: str  # the comparison group: the cell without the method
    run_id: str
    label: str  # method name, "(paper mode)" appended in paper mode
    sweep: str = ""
    workload: str = ""  # the workload's config name (a user's `my_corpus`, not its loader `lengths_file`)

    @property
    def method(self) -> str:
        return str(self.config.get("method", {}).get("name", "method"))


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "x"


def _hashable_config(cfg: dict[str, Any]) -> dict[str, Any]:
    data = copy.deepcopy(cfg)
    data.pop("seed", None)
    if isinstance(data.get("workload"), dict):
        data["workload"].pop("seed", None)
    run = data.get("run")
    if isinstance(run, dict):
        for key in BOOKKEEPING_KEYS:
            run.pop(key, None)
    return data


def _name_of(cfg: dict[str, Any], group: str) -> str:
    node = cfg.get(group)
    if isinstance(node, dict):
        return str(node.get("name", group))
    return str(node) if node is not None else group


def method_label(cfg: dict[str, Any]) -> str:
    method = cfg.get("method") or {}
    name = str(method.get("name", "method"))
    return f"{name} (paper mode)" if method.get("mode") == "paper" else name


def with_seed(cfg: dict[str, Any], seed: int) -> dict[str, Any]:
    """The config with its seed set, the workload's seed included (it picks the global batches)."""
    out = copy.deepcopy(cfg)
    out["seed"] = seed
    if isinstance(out.get("workload"), dict):
        out["workload"]["seed"] = seed
    return out


def plan_sweep(
    overrides: Sequence[str],
    repeats: int | None = None,
    sweep: str = "",
    compose: Callable[[Sequence[str]], Any] = load_config,
) -> list[RunSpec]:
    """Every run of the grid the overrides describe, in a stable order (cells, then seeds)."""
    specs: list[RunSpec] = []
    for cell in expand_grid(overrides):
        cfg = to_container(compose(cell))
        n = int(repeats if repeats is not None else cfg.get("run", {}).get("repeats", 5))
        if n < 1:
            raise ConfigError(f"run.repeats must be >= 1, got {n}")
        base = _hashable_config(cfg)
        cell_hash = config_hash(base)
        context = {k: v for k, v in base.items() if k != "method"}
        ctx_hash = config_hash(context)
        # A workload config is named by its file (`workload=my_corpus`); its `name` key names the
        # loader, which several configs may share.
        chosen = [ov.split("=", 1)[1] for ov in cell if ov.split("=", 1)[0].lstrip("+~") == "workload"]
        workload_name = chosen[-1] if chosen else _name_of(cfg, "workload")
        label = method_label(cfg)
        mode = "-paper" if (cfg.get("method") or {}).get("mode") == "paper" else ""
        stem = "__".join(
            _slug(s)
            for s in (
                _name_of(cfg, "method") + mode,
                workload_name,
                _name_of(cfg, "cluster"),
                _name_of(cfg, "model"),
                cell_hash,
            )
        )
        seed0 = int(cfg.get("seed", 0))
        for r in range(n):
            seed = seed0 + r
            specs.append(
                RunSpec(
                    cell_overrides=tuple(cell),
                    seed=seed,
                    config=with_seed(cfg, seed),
                    config_hash=cell_hash,
                    context_hash=ctx_hash,
                    run_id=f"{stem}__s{seed}",
                    label=label,
                    sweep=sweep,
                    workload=workload_name,
                )
            )
    return specs


# --------------------------------------------------------------------------------------------
# Executors


class SimBackend(Protocol):
    """What a simulated run needs; the default binds the real workload, cost model, planner and
    simulator modules, tests may bind small doubles."""

    def workload(self, cfg: dict[str, Any]) -> Any: ...

    def cost_model(self, cfg: dict[str, Any], source: str | None = None) -> CostModel: ...

    def planner(self, cfg: dict[str, Any]) -> Planner: ...

    def simulate_step(self, plan: StepPlan, batch: GlobalBatch, cost: CostModel, cfg: dict[str, Any]) -> Any: ...

    def lower_bound(self, batch: GlobalBatch, cost: CostModel) -> float: ...


class DefaultSimBackend:
    """Binds `dcp_bench.workload`, `dcp_bench.cost.make_cost_model`, `make_planner` and
    `dcp_bench.sim`. Config: ``workload``, ``model``, ``cluster``, ``method``,
    ``mem_cap_fraction`` and an optional ``cost`` node {source, scales, profile}."""

    def workload(self, cfg: dict[str, Any]) -> Any:
        from dcp_bench.workload import make_workload

        return make_workload(cfg["workload"])

    def cost_model(self, cfg: dict[str, Any], source: str | None = None) -> CostModel:
        """The simulator's cost model (``cost.source``, default auto), or with ``source`` given
        another source of the same model (``cost.planner_source``: what the planners see)."""
        from dcp_bench.config import instantiate
        from dcp_bench.cost import make_cost_model

        cost_cfg = dict(cfg.get("cost") or {})
        model = instantiate(cfg["model"])
        cluster = instantiate(cfg["cluster"])
        kwargs: dict[str, Any] = {
            "source": source or cost_cfg.get("source", "auto"),
            "mem_cap_fraction": float(cfg.get("mem_cap_fraction", 0.7)),
        }
        if cost_cfg.get("profile"):
            kwargs["profile"] = cost_cfg["profile"]
        if cost_cfg.get("scales") and kwargs["source"] != "profiled":
            kwargs["scales"] = {k: float(v) for k, v in cost_cfg["scales"].items()}
        return make_cost_model(model, cluster, **kwargs)  # type: ignore[no-any-return]

    def planner(self, cfg: dict[str, Any]) -> Planner:
        from dcp_bench.planners.base import make_planner

        return make_planner(cfg["method"])

    def simulate_step(self, plan: StepPlan, batch: GlobalBatch, cost: CostModel, cfg: dict[str, Any]) -> Any:
        """``sim.noise`` (optional: jitter_sigma, straggler_prob, straggler_slowdown) adds seeded
        run-to-run variation, seeded by the run's seed."""
        from dcp_bench.sim import NoiseModel, simulate_step

        noise_cfg = (cfg.get("sim") or {}).get("noise")
        noise = NoiseModel(seed=int(cfg.get("seed", 0)), **dict(noise_cfg)) if noise_cfg else None
        return simulate_step(plan, batch, cost, noise=noise)

    def lower_bound(self, batch: GlobalBatch, cost: CostModel) -> float:
        from dcp_bench.sim import lower_bound

        # "skip": a sample no setting fits is the planners' problem (they fail or drop it), not
        # the bound's.
        return float(lower_bound(batch, cost, infeasible="skip"))


@dataclass
class StepAccount:
    """Where one step's time goes, averaged over ranks (seconds): forward+backward compute,
    recomputation, sequence-parallel communication, gradient sync + optimizer, and the rest of the
    step time (ranks waiting for the slowest: imbalance)."""

    compute_s: float
    recompute_s: float
    comm_s: float
    sync_s: float
    idle_s: float
    sp_samples: dict[int, int] = field(default_factory=dict)  # SP degree -> samples
    ckpt_samples: dict[str, int] = field(default_factory=dict)  # checkpointed fraction -> samples
    sp_tokens: dict[int, int] = field(default_factory=dict)  # SP degree -> tokens
    ckpt_tokens: dict[str, int] = field(default_factory=dict)  # checkpointed fraction -> tokens


def account_step(plan: StepPlan, batch: GlobalBatch, cost: CostModel, step_time_s: float) -> StepAccount:
    """Attribute a simulated step's time to its parts using the cost model's per-micro-batch
    costs; the idle part is the remainder, so the parts add up to the step time exactly."""
    W = plan.world_size
    compute = np.zeros(W)
    recompute = np.zeros(W)
    comm = np.zeros(W)
    sp_hist: dict[int, int] = {}
    ckpt_hist: dict[str, int] = {}
    sp_tok: dict[int, int] = {}
    ckpt_tok: dict[str, int] = {}
    layers = max(1, int(cost.model.num_layers))
    for _, group, mb in plan.micro_batches():
        pos = list(mb.samples)
        c = cost.microbatch_cost(batch.tokens[pos], batch.frames[pos], group.size, mb.ckpt_layers, mb.split)
        sl = slice(group.start, group.start + group.size)
        compute[sl] += c.fwd_s + c.bwd_s
        recompute[sl] += c.recompute_s
        comm[sl] += c.comm_s
        sp_hist[group.size] = sp_hist.get(group.size, 0) + len(pos)
        frac = f"{mb.ckpt_layers / layers:.2f}"
        ckpt_hist[frac] = ckpt_hist.get(frac, 0) + len(pos)
        n_tok = int(batch.tokens[pos].sum())
        sp_tok[group.size] = sp_tok.get(group.size, 0) + n_tok
        ckpt_tok[frac] = ckpt_tok.get(frac, 0) + n_tok
    sync = float(cost.step_sync_time())
    parts = float(compute.mean() + recompute.mean() + comm.mean()) + sync
    return StepAccount(
        compute_s=float(compute.mean()),
        recompute_s=float(recompute.mean()),
        comm_s=float(comm.mean()),
        sync_s=sync,
        idle_s=float(step_time_s - parts),
        sp_samples=sp_hist,
        ckpt_samples=ckpt_hist,
        sp_tokens=sp_tok,
        ckpt_tokens=ckpt_tok,
    )


PLANNER_CLOCKS = ("overlap", "serial", "off")


def charge_planner(step_s: float, planner_s: float, clock: str) -> float:
    """The step time with planning charged. ``serial``: the planner runs between steps (step +
    planner). ``overlap``: the next step is planned on the host while this one runs, as data
    loaders do, so planning costs time only when it is slower than the step (max of the two).
    ``off``: planning is free (for studies of the plan alone)."""
    if clock == "serial":
        return step_s + planner_s
    if clock == "overlap":
        return max(step_s, planner_s)
    return step_s


class RunTimeout(DcpBenchError):
    """A run took longer than ``run.timeout_s``."""


def _get(obj: Any, name: str, default: Any = None) -> Any:
    return getattr(obj, name, default) if not isinstance(obj, dict) else obj.get(name, default)


def _summarise(
    spec: RunSpec,
    campaign: str,
    steps: list[StepRecord],
    status: str,
    executor: str,
    started: float,
    error: str | None = None,
    extra: dict[str, Any] | None = None,
    hardware: str | None = None,
    cost_source: str | None = None,
    profile: dict[str, Any] | None = None,
) -> RunSummary:
    cfg = spec.config
    measured = [s for s in steps if not s.warmup and s.step_time_s is not None]
    ok = status == "ok" and bool(measured)

    def med(values: Iterable[float | None]) -> float | None:
        vals = [v for v in values if v is not None and math.isfinite(v)]
        return float(np.median(vals)) if vals else None

    total_time = sum(s.step_time_s or 0.0 for s in measured)
    total_tokens = sum(s.tokens for s in measured)
    total_samples = sum(s.samples for s in measured)
    return RunSummary(
        run_id=spec.run_id,
        campaign=campaign,
        status=status if (ok or status != "ok") else "error",  # type: ignore[arg-type]
        executor=executor,
        method=spec.method,
        workload=spec.workload or _name_of(cfg, "workload"),
        cluster=_name_of(cfg, "cluster"),
        model=_name_of(cfg, "model"),
        seed=spec.seed,
        config_hash=spec.config_hash,
        n_steps=len(measured),
        n_warmup=sum(1 for s in steps if s.warmup),
        step_time_s=med(s.step_time_s for s in measured) if ok else None,
        lower_bound_s=med(s.lower_bound_s for s in measured),
        imbalance=med(s.imbalance for s in measured),
        peak_mem_gib=max((s.peak_mem_gib for s in steps if s.peak_mem_gib is not None), default=None),
        mfu=med(s.mfu for s in measured) if ok else None,
        planner_ms=med(s.planner_ms for s in measured),
        tokens_per_s=(total_tokens / total_time) if ok and total_time > 0 else None,
        oom_steps=sum(1 for s in steps if s.oom),
        hardware=hardware,
        cost_source=cost_source,
        profile=profile,
        error=error if (ok or status != "ok") else (error or "no measured steps"),
        started_at=started,
        finished_at=time.time(),
        extra={
            "label": spec.label,
            "mode": (cfg.get("method") or {}).get("mode", "fair"),
            "context_hash": spec.context_hash,
            "sweep": spec.sweep,
            "overrides": list(spec.cell_overrides),
            "target": (cfg.get("method") or {}).get("_target_"),
            "scales": dict((cfg.get("cost") or {}).get("scales") or {}),
            "mem_cap_fraction": cfg.get("mem_cap_fraction"),
            "samples_per_s": (total_samples / total_time) if ok and total_time > 0 else None,
            **(extra or {}),
        },
    )


def run_simulated(
    spec: RunSpec,
    root: str | os.PathLike[str],
    campaign: str,
    backend: SimBackend | None = None,
    env: dict[str, Any] | None = None,
) -> RunSummary:
    """Run one simulated run and write its record. Failures become a status, never an exception
    (except KeyboardInterrupt, which leaves the run incomplete for a later resume)."""
    from dcp_bench.config import instantiate

    backend = backend or DefaultSimBackend()
    cfg = spec.config
    run_cfg = cfg.get("run") or {}
    n_warm = int(run_cfg.get("warmup_steps", 0))
    n_steps = int(run_cfg.get("steps", 1))
    timeout = float(run_cfg.get("timeout_s", 0) or 0)
    planner_clock = str(run_cfg.get("planner_clock", "overlap"))
    if planner_clock not in PLANNER_CLOCKS:
        raise ConfigError(f"run.planner_clock={planner_clock!r}; expected one of {', '.join(PLANNER_CLOCKS)}")
    writer = RunWriter(root, campaign, spec.run_id, config=cfg, env=env)
    started = time.time()
    steps: list[StepRecord] = []
    status, error = "ok", None
    cost_source: str | None = None
    cost_desc: dict[str, Any] = {}
    cluster_name = _name_of(cfg, "cluster")
    world = 0
    try:
        cluster = instantiate(cfg["cluster"])
        world = int(cluster.world_size)
        model = instantiate(cfg["model"])
        workload = backend.workload(cfg)
        cost = backend.cost_model(cfg)
        # Planners may see another source than the simulator (``cost.planner_source``): e.g. to
        # replay what a real run planned with while simulating with measured costs.
        planner_source = (cfg.get("cost") or {}).get("planner_source")
        plan_cost = backend.cost_model(cfg, source=planner_source) if planner_source else cost
        cost_source = str(getattr(cost, "source", "unknown"))
        cost_desc = dict(cost.describe()) if hasattr(cost, "describe") else {}
        planner = backend.planner(cfg)
        for step in range(n_warm + n_steps):
            if timeout and time.time() - started > timeout:
                raise RunTimeout(f"run exceeded run.timeout_s={timeout:g} at step {step}")
            batch = workload.global_batch(step, world, model.max_seq_len)
            t0 = time.perf_counter()
            plan = planner.plan(batch, plan_cost)
            planner_s = time.perf_counter() - t0
            validate_plan(plan, batch)
            res = backend.simulate_step(plan, batch, cost, cfg)
            sim_time = float(_get(res, "step_time_s"))
            step_time = charge_planner(sim_time, planner_s, planner_clock)
            acct = account_step(plan, batch, cost, sim_time)
            used = plan.sample_positions()
            peak = _get(res, "peak_mem_bytes")
            peak_ranks = [float(x) / 2**30 for x in np.atleast_1d(peak)] if peak is not None else None
            oom = bool(_get(res, "oom", False))
            rec = StepRecord(
                step=step,
                step_time_s=step_time,
                warmup=step < n_warm,
                planner_ms=planner_s * 1e3,
                tokens=int(batch.tokens[used].sum()) if used else 0,
                samples=len(used),
                samples_dropped=batch.n - len(set(used)) + int(batch.dropped),
                samples_truncated=int(batch.truncated),
                lower_bound_s=float(backend.lower_bound(batch, cost)),
                imbalance=_opt_float(_get(res, "imbalance")),
                comm_share=_opt_float(_get(res, "comm_share")),
                mfu=_opt_float(_get(res, "mfu")),
                peak_mem_gib=max(peak_ranks) if peak_ranks else None,
                peak_mem_per_rank_gib=peak_ranks,
                busy_s=_opt_list(_get(res, "busy_s")),
                idle_s=_opt_list(_get(res, "idle_s")),
                oom=oom,
                extra={
                    "sim_step_time_s": sim_time,
                    "compute_s": acct.compute_s,
                    "recompute_s": acct.recompute_s,
                    "comm_s": acct.comm_s,
                    "sync_s": acct.sync_s,
                    "idle_s": acct.idle_s,
                    "sp_samples": {str(k): v for k, v in acct.sp_samples.items()},
                    "ckpt_samples": acct.ckpt_samples,
                    "sp_tokens": {str(k): v for k, v in acct.sp_tokens.items()},
                    "ckpt_tokens": acct.ckpt_tokens,
                    "rounds": len(plan.rounds),
                    "mem_cap_gib": float(cost.memory_cap_bytes) / 2**30,
                },
            )
            steps.append(rec)
            writer.add_step(rec)
            if oom:
                raise _Oom(f"step {step}: predicted peak memory over the cap")
    except _Oom as exc:
        status, error = "oom", str(exc)
    except RunTimeout as exc:
        status, error = "timeout", str(exc)
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # any failure is a recorded outcome of the run, never dropped
        status = "error"
        error = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
        if not isinstance(exc, DcpBenchError):
            error += " @ " + traceback.format_exc().strip().splitlines()[-3].strip()[:200]
    summary = _summarise(
        spec,
        campaign,
        steps,
        status,
        "sim",
        started,
        error=error,
        extra={"world_size": world, "cost": cost_desc},
        hardware=f"simulated {cluster_name}",
        cost_source=cost_source,
        profile=cost_desc.get("profile") if isinstance(cost_desc.get("profile"), dict) else None,
    )
    return writer.finish(summary)


class _Oom(Exception):
    pass


def _opt_float(x: Any) -> float | None:
    if x is None:
        return None
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _opt_list(x: Any) -> list[float] | None:
    if x is None:
        return None
    return [float(v) for v in np.atleast_1d(np.asarray(x, dtype=float))]


def run_torch(
    spec: RunSpec,
    root: str | os.PathLike[str],
    campaign: str,
    backend: Any = None,
    env: dict[str, Any] | None = None,
) -> RunSummary:
    """Run one real run under torchrun (`dcp_bench.runtime.launch.launch_train`: gloo on CPU,
    NCCL on GPUs) into the same run folder, then rewrite its summary with the sweep's cell
    identity (config hash, comparison context, label) so real and simulated runs share one
    results store. A launch failure is recorded as status ``error``."""
    from dcp_bench.config import instantiate
    from dcp_bench.records import atomic_write_json, read_steps
    from dcp_bench.runtime.launch import TrainSettings, launch_train

    del backend, env  # the launcher writes its own env.json on rank 0
    cfg = spec.config
    run_cfg = cfg.get("run") or {}
    n_warm = int(run_cfg.get("warmup_steps", 0))
    n_steps = int(run_cfg.get("steps", 1))
    timeout = float(run_cfg.get("timeout_s", 0) or 0) or None
    cluster = instantiate(cfg["cluster"])
    settings = TrainSettings(
        nproc=int(run_cfg.get("nproc", cluster.world_size)),
        steps=n_warm + n_steps,
        warmup_steps=n_warm,
        seed=spec.seed,
        root=str(root),
        campaign=campaign,
        run_id=spec.run_id,
        run_timeout_s=timeout,
        threads=int(run_cfg.get("threads", 1)),
    )
    started = time.time()
    status, error, launched = "ok", None, {}
    try:
        launched = launch_train(cfg, settings)
        status = str(launched.get("status", "error"))
        error = launched.get("error")
    except DcpBenchError as exc:
        status, error = ("timeout" if "run_timeout_s" in str(exc) else "error"), str(exc)[:500]
    run_dir = Path(root) / campaign / spec.run_id
    steps = read_steps(run_dir) if run_dir.exists() else []
    summary = _summarise(
        spec, campaign, steps, status, "torch", started, error=error,
        extra={"world_size": settings.nproc, "torch_summary": {k: launched.get(k) for k in ("hardware", "step_time_s")},
               **{k: v for k, v in (launched.get("extra") or {}).items() if k in ("losses", "param_count", "memory_measure", "threads")}},
        hardware=launched.get("hardware") or f"{settings.nproc} local ranks",
    )
    if not run_dir.exists():
        RunWriter(root, campaign, spec.run_id, config=cfg)
    atomic_write_json(run_dir / "run.json", dataclasses.asdict(summary))
    return summary


# --------------------------------------------------------------------------------------------
# Sweeps


@dataclass
class SweepResult:
    ran: list[RunSummary] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    unrun: list[str] = field(default_factory=list)  # left out by the deadline

    @property
    def failed(self) -> list[RunSummary]:
        return [s for s in self.ran if s.status != "ok"]


def _run_one(
    spec: RunSpec, root: str, campaign: str, backend: SimBackend | None, env: dict[str, Any] | None
) -> RunSummary:
    # Pin threads in workers so parallel runs do not oversubscribe the cores.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    return run_simulated(spec, root, campaign, backend=backend, env=env)


def _child(run_fn: Callable[..., RunSummary], spec: RunSpec, root: str, campaign: str,
           backend: Any, env: dict[str, Any] | None) -> None:
    with contextlib.suppress(KeyboardInterrupt):
        run_fn(spec, root, campaign, backend, env)


def _hard_limit(spec: RunSpec) -> float | None:
    """Seconds after which a run's process is killed: its ``run.timeout_s`` plus a grace period
    (the run checks its own limit between steps; this catches a step that never returns)."""
    run = spec.config.get("run") or {}
    t = float(run.get("timeout_s", 0) or 0)
    grace = run.get("kill_grace_s")
    return t + (float(grace) if grace is not None else max(10.0, 0.25 * t)) if t > 0 else None


def _record_killed(spec: RunSpec, root: str, campaign: str, started: float, limit: float, executor: str) -> RunSummary:
    from dcp_bench.records import atomic_write_json, read_steps

    run_dir = Path(root) / campaign / spec.run_id
    if not run_dir.exists():
        RunWriter(root, campaign, spec.run_id, config=spec.config)
    steps = read_steps(run_dir)
    summary = _summarise(spec, campaign, steps, "timeout", executor, started,
                         error=f"killed after {limit:.0f} s (run.timeout_s plus grace) inside step {len(steps)}")
    atomic_write_json(run_dir / "run.json", dataclasses.asdict(summary))
    return summary


def run_sweep(
    specs: Sequence[RunSpec],
    root: str | os.PathLike[str],
    campaign: str,
    backend: SimBackend | None = None,
    resume: bool = True,
    jobs: int = 1,
    progress: bool = True,
    env: dict[str, Any] | None = None,
    executor: Callable[..., RunSummary] | None = None,
    deadline: float | None = None,
    isolate: bool = True,
) -> SweepResult:
    """Run every spec whose run folder is not complete (all of them with ``resume=False``).

    Each run executes in its own forked process (``isolate``; up to ``jobs`` at a time), killed
    when it overruns ``run.timeout_s`` plus a grace period and then recorded as ``timeout``:
    one stuck step cannot stall a sweep. ``executor`` replaces the simulated executor
    (`run_torch` for real runs). ``deadline`` (a `time.time()` value): runs not started by then
    are left out and listed in ``SweepResult.unrun``. Runs start seed by seed (every cell's first
    repeat, then every cell's second ...), so a deadline leaves the cells with balanced, paired
    repeats.
    """
    import multiprocessing as mp

    from tqdm import tqdm

    from dcp_bench.records import read_summary

    root = str(root)
    result = SweepResult()
    todo: list[RunSpec] = []
    for spec in specs:
        if resume and is_complete(Path(root) / campaign / spec.run_id):
            result.skipped.append(spec.run_id)
        else:
            todo.append(spec)
    if env is None:
        from dcp_bench.envinfo import collect_env

        env = collect_env()
    order = {s.run_id: i for i, s in enumerate(todo)}
    seeds = sorted({s.seed for s in todo})
    rank = {sd: i for i, sd in enumerate(seeds)}
    todo.sort(key=lambda s: (rank[s.seed], order[s.run_id]))
    run_fn = executor or _run_one
    executor_name = "torch" if executor is not None and executor.__name__ == "run_torch" else "sim"
    bar = tqdm(total=len(todo), desc=f"{campaign}", unit="run", disable=not progress, leave=False)

    def late() -> bool:
        return deadline is not None and time.time() > deadline

    def done(summary: RunSummary) -> None:
        result.ran.append(summary)
        bar.set_postfix_str(f"{summary.method}: {summary.status}", refresh=False)
        bar.update(1)

    try:
        if not isolate:
            for i, spec in enumerate(todo):
                if late():
                    result.unrun += [s.run_id for s in todo[i:]]
                    break
                done(run_fn(spec, root, campaign, backend, env))
            return result
        ctx = mp.get_context("fork")
        active: dict[str, tuple[Any, RunSpec, float]] = {}
        queue = list(todo)
        try:
            while queue or active:
                while queue and len(active) < max(1, jobs) and not late():
                    spec = queue.pop(0)
                    proc = ctx.Process(target=_child, args=(run_fn, spec, root, campaign, backend, env), daemon=False)
                    proc.start()
                    active[spec.run_id] = (proc, spec, time.time())
                if queue and late():
                    result.unrun += [s.run_id for s in queue]
                    queue = []
                for run_id, (proc, spec, started) in list(active.items()):
                    limit = _hard_limit(spec)
                    if proc.is_alive() and limit is not None and time.time() - started > limit:
                        proc.kill()
                        proc.join()
                        active.pop(run_id)
                        done(_record_killed(spec, root, campaign, started, limit, executor_name))
                    elif not proc.is_alive():
                        proc.join()
                        active.pop(run_id)
                        summary = read_summary(Path(root) / campaign / run_id)
                        if summary is None:  # the child died without a summary (e.g. killed by the OS)
                            summary = _record_killed(spec, root, campaign, started, time.time() - started, executor_name)
                            summary = dataclasses.replace(summary, status="error",
                                                          error=f"run process exited with code {proc.exitcode} before writing its summary")
                            from dcp_bench.records import atomic_write_json

                            atomic_write_json(Path(root) / campaign / run_id / "run.json", dataclasses.asdict(summary))
                        done(summary)
                if active:
                    time.sleep(0.02)
        finally:
            for proc, _, _ in active.values():  # interrupted: stop our own children, leave runs incomplete
                if proc.is_alive():
                    proc.kill()
                    proc.join()
    finally:
        bar.close()
    return result
