"""The cluster simulator: runs a `StepPlan` on a cluster through a cost model, and bounds a batch.

Timeline. Every rank works through its groups in round order. A group's task (its micro-batches,
one after another) starts when all of its ranks are free and occupies them all until it ends. Ranks
flow into their next round as soon as their own group is free; no global barrier separates rounds
(``round_barrier=True`` adds one). This is safe, i.e. it is what a deadlock-free executor does: a
group waits only for its own members, and each member reaches the group after finishing its tasks
of earlier rounds, so every wait points from a later round to an earlier one and no cycle of waits
can form. After the last task, every rank takes part in the gradient synchronisation and the
optimizer step (`CostModel.step_sync_time`), which starts when the slowest rank is done.

Speed: costs are computed for all sequence-split micro-batches of a step in one vectorised call
(`CostModel.microbatch_costs`); the timeline is one pass over the groups.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from dcp_bench.errors import ClusterError, InfeasibleError

if TYPE_CHECKING:
    from dcp_bench.batch import GlobalBatch
    from dcp_bench.cost.base import CostModel
    from dcp_bench.plan import StepPlan


@dataclass(frozen=True)
class NoiseModel:
    """Seeded run-to-run variation for variance studies.

    Each micro-batch's time on each rank of its group is multiplied by a lognormal factor
    ``exp(N(0, jitter_sigma))`` (kernel-time jitter); the group waits for its slowest rank. With
    probability ``straggler_prob`` a rank is a straggler for the whole step, running
    ``straggler_slowdown`` times slower (thermal throttling, a noisy neighbour). The draws depend
    only on (seed, step), so a step replays identically.
    """

    seed: int = 0
    jitter_sigma: float = 0.03
    straggler_prob: float = 0.0
    straggler_slowdown: float = 1.5

    def __post_init__(self) -> None:
        if self.jitter_sigma < 0 or not 0 <= self.straggler_prob <= 1 or self.straggler_slowdown < 1:
            raise ValueError(
                f"NoiseModel: need jitter_sigma >= 0, 0 <= straggler_prob <= 1, straggler_slowdown >= 1; "
                f"got {self.jitter_sigma}, {self.straggler_prob}, {self.straggler_slowdown}"
            )

    def rng(self, step: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, step])


@dataclass
class SimStepResult:
    """One simulated optimizer step. Times in seconds, memory in bytes, arrays per rank."""

    step: int
    step_time_s: float
    busy_s: np.ndarray  # micro-batch work + gradient sync + optimizer
    idle_s: np.ndarray  # step_time_s - busy_s
    imbalance: float  # idle share of all rank-seconds
    comm_share: float  # communication share of busy rank-seconds (SP all-to-all + grad sync)
    peak_mem_bytes: np.ndarray
    oom: bool  # some micro-batch over the GPU's usable memory (not the planner's cap)
    mfu: float
    model_flops: float
    tokens: int
    compute_end_s: float  # when the last rank finished its micro-batches
    sync_s: float
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def peak_mem_gib(self) -> float:
        return float(self.peak_mem_bytes.max()) / 2**30 if len(self.peak_mem_bytes) else 0.0

    def record_fields(self) -> dict[str, Any]:
        """The fields of a `dcp_bench.records.StepRecord` this result fills."""
        return {
            "step_time_s": self.step_time_s,
            "imbalance": self.imbalance,
            "comm_share": self.comm_share,
            "mfu": self.mfu,
            "peak_mem_gib": self.peak_mem_gib,
            "peak_mem_per_rank_gib": (self.peak_mem_bytes / 2**30).round(4).tolist(),
            "busy_s": self.busy_s.round(6).tolist(),
            "idle_s": self.idle_s.round(6).tolist(),
            "oom": self.oom,
            "tokens": self.tokens,
        }


def _sync_comm_s(cost: CostModel, sync_s: float) -> float:
    breakdown = getattr(cost, "step_sync_breakdown", None)
    if breakdown is None:
        return sync_s  # no breakdown: the whole sync counts as communication
    return float(breakdown().get("grad_sync_s", sync_s))


def simulate_step(
    plan: StepPlan,
    batch: GlobalBatch,
    cost: CostModel,
    noise: NoiseModel | None = None,
    round_barrier: bool = False,
) -> SimStepResult:
    """Simulate one step of ``plan`` over ``batch`` on ``cost.cluster`` (see the module docstring).
    The plan is not validated here (the runner validates it once)."""
    W = plan.world_size
    if cost.cluster.world_size != W:
        raise ClusterError(
            f"plan for {W} ranks cannot run on cluster {cost.cluster.name!r} of "
            f"{cost.cluster.world_size} ranks"
        )
    # Flatten the plan: one entry per group task, one per micro-batch.
    g_start: list[int] = []
    g_size: list[int] = []
    g_round: list[int] = []
    mb_group: list[int] = []
    seq_pos: list[tuple[int, ...]] = []
    seq_mb: list[int] = []
    seq_sp: list[int] = []
    seq_ckpt: list[int] = []
    batch_split: list[tuple[int, tuple[int, ...], int, int]] = []  # (mb, samples, size, ckpt)
    n_mb = 0
    for r, rnd in enumerate(plan.rounds):
        for g in rnd.groups:
            gid = len(g_start)
            g_start.append(g.start)
            g_size.append(g.size)
            g_round.append(r)
            for mb in g.micro_batches:
                mb_group.append(gid)
                if mb.split == "batch" and g.size > 1:
                    batch_split.append((n_mb, mb.samples, g.size, mb.ckpt_layers))
                else:
                    seq_pos.append(mb.samples)
                    seq_mb.append(n_mb)
                    seq_sp.append(g.size)
                    seq_ckpt.append(mb.ckpt_layers)
                n_mb += 1
    n_groups = len(g_start)
    dur = np.zeros(n_mb)
    comm = np.zeros(n_mb)
    mem = np.zeros(n_mb)
    flops = 0.0
    tokens = 0
    if seq_mb:
        lens = np.fromiter((len(p) for p in seq_pos), dtype=np.int64, count=len(seq_pos))
        pos = np.fromiter((s for p in seq_pos for s in p), dtype=np.int64, count=int(lens.sum()))
        local = np.repeat(np.arange(len(seq_pos)), lens)
        c = cost.microbatch_costs(
            batch.tokens[pos], batch.frames[pos], local, np.asarray(seq_sp), np.asarray(seq_ckpt)
        )
        idx = np.asarray(seq_mb)
        dur[idx] = c["fwd_s"] + c["bwd_s"] + c["recompute_s"] + c["comm_s"]
        comm[idx] = c["comm_s"]
        mem[idx] = c["mem_bytes"]
        flops += float(c["model_flops"].sum())
        tokens += int(batch.tokens[pos].sum())
    for j, samples, size, ckpt in batch_split:
        sel = np.asarray(samples, dtype=np.int64)
        mc = cost.microbatch_cost(batch.tokens[sel], batch.frames[sel], size, ckpt, "batch")
        dur[j], comm[j], mem[j] = mc.total_s, mc.comm_s, mc.mem_bytes
        flops += mc.model_flops
        tokens += int(batch.tokens[sel].sum())

    starts = np.asarray(g_start, dtype=np.int64)
    sizes = np.asarray(g_size, dtype=np.int64)
    groups = np.asarray(mb_group, dtype=np.int64)
    if noise is not None and n_mb:
        rng = noise.rng(batch.step)  # the batch knows its step even if a planner leaves plan.step at 0
        # Kernel jitter: the group waits for the slowest of its ranks on every micro-batch.
        mb_sizes = sizes[groups]
        draws = rng.standard_normal(int(mb_sizes.sum()))
        offsets = np.concatenate(([0], np.cumsum(mb_sizes)[:-1]))
        dur = dur * np.exp(noise.jitter_sigma * np.maximum.reduceat(draws, offsets))
        slow = np.where(rng.random(W) < noise.straggler_prob, noise.straggler_slowdown, 1.0)
        if np.any(slow > 1):
            # The slowdown of a group is its slowest member's, for every micro-batch it runs.
            cum = np.concatenate(([0.0], np.cumsum(slow > 1)))
            has_straggler = cum[starts + sizes] - cum[starts] > 0
            dur = dur * np.where(has_straggler[groups], noise.straggler_slowdown, 1.0)
    g_dur = np.bincount(groups, weights=dur, minlength=n_groups)
    g_comm = np.bincount(groups, weights=comm, minlength=n_groups)
    g_mem = np.zeros(n_groups)
    np.maximum.at(g_mem, groups, mem)

    # Timeline: groups in round order; a group starts when its slowest member is free.
    free = np.zeros(W)
    current_round = -1
    for gid in range(n_groups):
        if round_barrier and g_round[gid] != current_round:
            free[:] = free.max()
            current_round = g_round[gid]
        a, b = g_start[gid], g_start[gid] + g_size[gid]
        free[a:b] = free[a:b].max() + g_dur[gid]
    compute_end = float(free.max()) if W else 0.0

    # Per-rank sums over the groups a rank belongs to (difference arrays over rank ranges).
    def per_rank_sum(values: np.ndarray) -> np.ndarray:
        diff = np.zeros(W + 1)
        np.add.at(diff, starts, values)
        np.add.at(diff, starts + sizes, -values)
        return np.cumsum(diff[:-1])

    static = cost.static_memory_bytes()
    peak = np.full(W, static)
    for big in np.flatnonzero(g_mem > static).tolist():
        a, b = g_start[big], g_start[big] + g_size[big]
        peak[a:b] = np.maximum(peak[a:b], g_mem[big])
    sync = cost.step_sync_time()
    sync_comm = _sync_comm_s(cost, sync)
    step_time = compute_end + sync
    busy = per_rank_sum(g_dur) + sync
    idle = step_time - busy
    total_busy = float(busy.sum())
    comm_total = float(per_rank_sum(g_comm).sum()) + W * sync_comm
    peak_flops = cost.cluster.gpu.peak_flops
    return SimStepResult(
        step=batch.step,
        step_time_s=step_time,
        busy_s=busy,
        idle_s=idle,
        imbalance=float(idle.sum() / (W * step_time)) if step_time > 0 else 0.0,
        comm_share=comm_total / total_busy if total_busy > 0 else 0.0,
        peak_mem_bytes=peak,
        oom=bool(np.any(peak > cost.cluster.gpu.usable_mem_bytes)),
        mfu=flops / (step_time * W * peak_flops) if step_time > 0 else 0.0,
        model_flops=flops,
        tokens=tokens,
        compute_end_s=compute_end,
        sync_s=sync,
        info={"rounds": len(plan.rounds), "groups": n_groups, "micro_batches": n_mb},
    )


@dataclass(frozen=True)
class SampleBounds:
    """Per-sample ingredients of the lower bound: the cheapest feasible GPU-seconds and the
    fastest feasible time of each sample (inf where no SP degree fits it under the cap)."""

    gpu_seconds: np.ndarray
    fastest_s: np.ndarray
    best_sp: np.ndarray  # SP degree of the fastest feasible setting (0 = infeasible)

    @property
    def infeasible(self) -> np.ndarray:
        return ~np.isfinite(self.fastest_s)


def min_feasible_ckpt(
    cost: CostModel, tokens: np.ndarray, frames: np.ndarray, sp: int
) -> np.ndarray:
    """Per sample, the fewest checkpointed layers at which it alone fits the memory cap on an SP
    group of ``sp`` ranks; -1 where even full checkpointing does not fit. Assumes memory falls and
    time rises with the checkpointed layer count (true of both cost sources), so the fewest is
    also the fastest feasible setting."""
    cap = cost.memory_cap_bytes - cost.static_memory_bytes()
    out = np.full(len(tokens), -1, dtype=np.int64)
    todo = np.arange(len(tokens))
    for k in range(cost.model.num_layers + 1):
        if not len(todo):
            break
        fits = cost.sample_memory(tokens[todo], frames[todo], sp, k) <= cap
        out[todo[fits]] = k
        todo = todo[~fits]
    return out


def sample_bounds(batch: GlobalBatch, cost: CostModel) -> SampleBounds:
    """Cheapest feasible GPU-seconds and fastest feasible time of every sample of ``batch``, over
    every SP degree the cluster's aligned layout offers and the fewest checkpointed layers that
    fit. Times are packed shares (`CostModel.sample_time_packed`), which no micro-batch beats."""
    n = batch.n
    gpu_s = np.full(n, np.inf)
    fastest = np.full(n, np.inf)
    best_sp = np.zeros(n, dtype=np.int64)
    for sp in cost.cluster.sp_degrees():
        k = min_feasible_ckpt(cost, batch.tokens, batch.frames, sp)
        t = np.full(n, np.inf)
        for kv in np.unique(k[k >= 0]):
            sel = np.flatnonzero(k == kv)
            t[sel] = cost.sample_time_packed(batch.tokens[sel], batch.frames[sel], sp, int(kv))
        gpu_s = np.minimum(gpu_s, sp * t)
        better = t < fastest
        best_sp[better] = sp
        fastest = np.where(better, t, fastest)
    return SampleBounds(gpu_seconds=gpu_s, fastest_s=fastest, best_sp=best_sp)


def lower_bound(
    batch: GlobalBatch,
    cost: CostModel,
    include_sync: bool = True,
    infeasible: str = "raise",
) -> float:
    """A step time no valid plan of ``batch`` beats on ``cost.cluster``:
    max(sum of cheapest feasible GPU-seconds / world size, slowest sample at its fastest feasible
    setting) + gradient sync + optimizer. ``infeasible``: ``"raise"`` (`InfeasibleError` when a
    sample fits no SP degree even fully checkpointed) or ``"skip"`` (bound the feasible ones, as a
    plan that drops such samples would)."""
    if batch.n == 0:
        return cost.step_sync_time() if include_sync else 0.0
    sb = sample_bounds(batch, cost)
    bad = sb.infeasible
    if infeasible not in ("raise", "skip"):
        raise ValueError(f"infeasible={infeasible!r}; expected 'raise' or 'skip'")
    if np.any(bad) and infeasible == "raise":
        i = int(np.flatnonzero(bad)[0])
        raise InfeasibleError(
            f"{int(bad.sum())} sample(s) fit no SP degree under the memory cap "
            f"({cost.memory_cap_bytes / 2**30:.1f} GiB per rank, every layer checkpointed, up to "
            f"sp={cost.cluster.sp_degrees()[-1]}); e.g. position {i} with {int(batch.tokens[i])} tokens"
        )
    ok = ~bad
    W = cost.cluster.world_size
    work = float(sb.gpu_seconds[ok].sum()) / W
    longest = float(sb.fastest_s[ok].max()) if np.any(ok) else 0.0
    bound = max(work, longest)
    if not math.isfinite(bound):
        raise InfeasibleError("lower bound is not finite")
    return bound + (cost.step_sync_time() if include_sync else 0.0)


# ------------------------------------------------------------------------------------------------
# A whole simulated run from a config (what `dcp-bench simulate` prints). Workloads and planners
# are imported inside the functions: the simulator itself depends only on plans and cost models.


def cost_model_from_config(cfg: Any) -> CostModel:
    """The cost model a composed config names: ``cfg.model``, ``cfg.cluster``,
    ``cfg.mem_cap_fraction`` and an optional ``cfg.cost`` node {source (default auto), profile,
    scales, and constructor options such as zero_stage}."""
    from dcp_bench.cost import make_cost_model

    node = _plain(cfg.get("cost")) if cfg.get("cost") is not None else {}
    source = str(node.pop("source", "auto"))
    profile = node.pop("profile", None)
    scales = {str(k): float(v) for k, v in (node.pop("scales", None) or {}).items()}
    return make_cost_model(
        cfg["model"], cfg["cluster"], source=source,
        mem_cap_fraction=float(cfg.get("mem_cap_fraction", 0.7)), profile=profile, scales=scales or None,
        **node,
    )


def _plain(node: Any) -> dict[str, Any]:
    from omegaconf import DictConfig, OmegaConf

    if isinstance(node, DictConfig):
        out = OmegaConf.to_container(node, resolve=True)
        assert isinstance(out, dict)
        return {str(k): v for k, v in out.items()}
    return dict(node)


def _median(values: list[float]) -> float | None:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    return float(np.median(vals)) if vals else None


def simulate_run(cfg: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Simulate ``cfg.run.warmup_steps + cfg.run.steps`` steps of ``cfg.method`` on
    ``cfg.workload`` x ``cfg.cluster`` x ``cfg.model``.

    Returns (summary, per-step records). Per step: the planner's wall time on this machine, the
    plan (validated structurally), the simulated step, and the batch's lower bound. The summary
    holds the medians over non-warm-up steps (``step_time_s`` = simulated step time plus planner
    time unless ``run.planner_on_clock=false``; ``sim_step_time_s`` without it), the OOM and
    over-cap step counts, the resolved config and the cost model's provenance. Everything is
    labelled ``simulated``. An optional ``cfg.noise`` node configures a `NoiseModel` (seed
    defaults to ``cfg.seed``).
    """
    import time

    from dcp_bench.config import to_container
    from dcp_bench.cost import resolve_cluster, resolve_model
    from dcp_bench.plan import validate_plan
    from dcp_bench.planners.base import make_planner
    from dcp_bench.workload import make_workload

    run = cfg.get("run") or {}
    n_warm = int(run.get("warmup_steps", 0))
    n_steps = int(run.get("steps", 1))
    on_clock = bool(run.get("planner_on_clock", True))
    if n_steps < 1 or n_warm < 0:
        from dcp_bench.errors import ConfigError

        raise ConfigError(f"run.steps={n_steps} must be >= 1 and run.warmup_steps={n_warm} >= 0")
    seed = int(cfg.get("seed", 0))
    cluster, model = resolve_cluster(cfg["cluster"]), resolve_model(cfg["model"])
    cost = cost_model_from_config(cfg)
    workload = make_workload(cfg["workload"])
    planner = make_planner(cfg["method"])
    noise = None
    if cfg.get("noise") is not None:
        params = _plain(cfg["noise"])
        params.setdefault("seed", seed)
        noise = NoiseModel(**params)
    W = cluster.world_size
    records: list[dict[str, Any]] = []
    for step in range(n_warm + n_steps):
        batch = workload.global_batch(step, W, model.max_seq_len)
        t0 = time.perf_counter()
        plan = planner.plan(batch, cost)
        planner_s = time.perf_counter() - t0
        validate_plan(plan, batch)
        res = simulate_step(plan, batch, cost, noise=noise)
        lb = lower_bound(batch, cost, infeasible="skip" if plan.mode == "paper" else "raise")
        used = plan.sample_positions()
        records.append({
            "step": step,
            "warmup": step < n_warm,
            **res.record_fields(),
            "step_time_s": res.step_time_s + (planner_s if on_clock else 0.0),
            "sim_step_time_s": res.step_time_s,
            "planner_ms": planner_s * 1e3,
            "lower_bound_s": lb,
            "samples": len(used),
            "samples_dropped": batch.n - len(set(used)) + int(batch.dropped),
            "samples_truncated": int(batch.truncated),
            "over_cap": bool(res.peak_mem_bytes.max() > cost.memory_cap_bytes),
            "model_flops": res.model_flops,
            "rounds": len(plan.rounds),
        })
    measured = [r for r in records if not r["warmup"]]

    def med(key: str) -> float | None:
        return _median([float(r[key]) for r in measured])

    step_med = med("step_time_s")
    tokens = sum(r["tokens"] for r in measured)
    total_time = sum(r["step_time_s"] for r in measured)
    summary: dict[str, Any] = {
        "label": "simulated",
        "method": planner.label(),
        "workload": str((cfg["workload"] or {}).get("name", "")),
        "cluster": cluster.name,
        "model": model.name,
        "world_size": W,
        "seed": seed,
        "steps": n_steps,
        "warmup_steps": n_warm,
        "step_time_s": step_med,
        "sim_step_time_s": med("sim_step_time_s"),
        "lower_bound_s": med("lower_bound_s"),
        "imbalance": med("imbalance"),
        "comm_share": med("comm_share"),
        "peak_mem_gib": med("peak_mem_gib"),
        "oom_steps": sum(bool(r["oom"]) for r in measured),
        "over_cap_steps": sum(bool(r["over_cap"]) for r in measured),
        "mfu": med("mfu"),
        "planner_ms": med("planner_ms"),
        "tokens_per_s": tokens / total_time if total_time > 0 else None,
        "planner_on_clock": on_clock,
        "noise": dataclasses.asdict(noise) if noise else None,
        "cost_model": cost.describe(),
        "config": to_container(cfg) if not isinstance(cfg, dict) else cfg,
    }
    return summary, records
