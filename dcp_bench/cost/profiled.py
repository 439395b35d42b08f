"""`ProfiledCostModel`: the cost model whose numbers come from a measured profile artifact.

It reads the artifact `dcp-bench profile` writes (`dcp_bench.cost.profile_artifact`) and fits, per
SP degree, the per-layer forward, backward and recompute time as ``a + b*T + c*P + d*N`` (T:
tokens per rank, P: attention query-key pairs per rank, N: samples in the micro-batch, so packed
micro-batches of many short samples and long single samples share one law), activation bytes per
layer as ``b*T + c*P + d*N``, the rest of the model (embedding, head, loss) and the building of a
micro-batch's inputs as ``a + b*T + d*N``, and every collective as ``latency + bytes/bandwidth``.
On CPU, memory is what the process holds: the measured process baseline as workspace, and the
activations times the measured ``resident_factor`` (the resident set's growth per byte autograd
saves: glibc's allocator keeps freed blocks, and ops allocate temporaries).
Measurements taken with the same number of processes as the cluster's world size are preferred
(ranks share the machine's cores, so timings depend on how many run at once).

What the profile did not measure comes from the analytical model of the same model and cluster
(with the cluster's calibrated constants), never from a guess: collectives of a group size or an
operation the profile lacks (a one-GPU profile measures none; a one-node profile none across
nodes), and the gradient sync of a world the profile did not run. `describe()["fallbacks"]` lists
them.

Provenance (`describe`) names the profile by path and SHA-256, what profiling cost (wall time),
the fits' errors and the fallbacks; run records copy it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from dcp_bench.archs import arch_of
from dcp_bench.cost.activations import activation_terms
from dcp_bench.cost.analytical import AnalyticalCostModel
from dcp_bench.cost.base import CostModel, MicroBatchCost, deal_by_tokens
from dcp_bench.cost.profile_artifact import (
    attention_pairs,
    load_artifact,
    resolve_profile_path,
)
from dcp_bench.cost.profile_fit import (
    LinearFit,
    collective_features,
    fit_nonnegative,
    layer_features,
    memory_features,
)
from dcp_bench.errors import ConfigError
from dcp_bench.files import sha256_file
from dcp_bench.layout import ulysses_span
from dcp_bench.train_policy import (
    DEFAULT_ZERO_STAGE,
    check_zero_stage,
    grad_sync_bytes,
    precision_policy,
    static_state_bytes,
)

# The ZeRO stage of a step overhead measured before profiles recorded one: the profiler timed an
# all-reduce of every gradient, clipping and a full AdamW step, which is stage 0's step.
LEGACY_STEP_ZERO_STAGE = 0

PHASES = ("fwd", "bwd", "recompute")


@dataclass(frozen=True)
class LayerTables:
    """The fits for one SP degree."""

    time: dict[str, LinearFit]  # phase -> per-layer time law
    act: LinearFit  # autograd-saved bytes of one layer (features: memory_features)
    ckpt_bytes_per_token: float  # the same with the layer checkpointed (its input only)

    @property
    def act_bytes_per_token(self) -> float:
        """The per-token coefficient of the activation law (kept for callers of older versions)."""
        return float(self.act.coef[0])


def _samples(p: dict[str, Any]) -> int:
    return int(p.get("n_samples", len(p.get("sample_tokens", [0]))))


def fit_layer_tables(points: list[dict[str, Any]]) -> LayerTables:
    """Fit one SP degree's grid points (all with the same ``sp`` and ``nproc``)."""
    tpr = np.array([p["tokens_per_rank"] for p in points], dtype=float)
    ppr = np.array([p["pairs_per_rank"] for p in points], dtype=float)
    n = np.array([_samples(p) for p in points], dtype=float)
    x = layer_features(tpr, ppr, n)
    fwd = np.array([p["fwd_s"]["median"] for p in points])
    bwd = np.array([p["bwd_s"]["median"] for p in points])
    bwd_ckpt = np.array([p["bwd_ckpt_s"]["median"] for p in points])
    # recompute = the extra backward time checkpointing costs; noise can make it dip below zero
    # at tiny sizes, where it is then treated as free
    recompute = np.maximum(bwd_ckpt - bwd, 1e-9)
    act = np.array([p["act_bytes"] for p in points], dtype=float)
    ckpt = np.array([p["ckpt_bytes"] for p in points], dtype=float)
    time = {
        "fwd": fit_nonnegative(x, fwd),
        "bwd": fit_nonnegative(x, bwd),
        "recompute": fit_nonnegative(x, recompute),
    }
    # the forward of a checkpointed layer (its saved-tensor hooks, the RNG state): measured by
    # profiles from the version that times it (`profiling.module_timing`); older ones price a
    # checkpointed layer's forward as the plain forward (`describe()["checkpointed_forward"]`)
    if all("fwd_ckpt_s" in p for p in points):
        time["fwd_ckpt"] = fit_nonnegative(x, np.array([p["fwd_ckpt_s"]["median"] for p in points]))
    return LayerTables(
        time=time,
        act=fit_nonnegative(memory_features(tpr, ppr, n), np.maximum(act, 1.0)),
        ckpt_bytes_per_token=float(ckpt.sum() / tpr.sum()),
    )


def _pick_nproc(available: set[int], world: int) -> int:
    if world in available:
        return world
    below = [n for n in available if n <= world]
    return max(below) if below else min(available)


def _drop_intercept(x: np.ndarray) -> np.ndarray:
    """Features with the constant column zeroed: a sample's share of a packed micro-batch."""
    out = np.array(x, dtype=float)
    out[..., 0] = 0.0
    return out


@dataclass
class ProfiledCostModel(CostModel):
    """A `CostModel` built from a profile artifact (``profile``: its path, or a folder holding
    ``<model name>.json``; relative paths are taken from the repository root). Defaults to the
    cluster config's ``profile`` field."""

    prices_ring: ClassVar[bool] = True

    profile: str | None = None
    source: str = "profiled"
    # ZeRO stage of the training states (`dcp_bench.train_policy`): what static memory holds.
    zero_stage: int = DEFAULT_ZERO_STAGE

    def __post_init__(self) -> None:
        check_zero_stage(self.zero_stage)
        path = self.profile or self.cluster.profile
        if not path:
            raise ConfigError(
                f"cluster {self.cluster.name!r} names no profile; pass profile=PATH or set "
                "`profile:` in its cluster config (make one with `dcp-bench profile`)"
            )
        resolved = resolve_profile_path(path)
        if resolved.is_dir():  # a calibration folder holds one artifact per model
            if not (resolved / f"{self.model.name}.json").exists():
                raise ConfigError(
                    f"profile folder {str(path)!r} has no {self.model.name}.json; measure it with "
                    f"`dcp-bench profile model={self.model.name} "
                    f"out={path}/{self.model.name}.json` or use the analytical cost source"
                )
            path = f"{str(path).rstrip('/')}/{self.model.name}.json"
            resolved = resolved / f"{self.model.name}.json"
        self.artifact = load_artifact(resolved)
        art_model = self.artifact["model"].get("name")
        if art_model != self.model.name:
            raise ConfigError(
                f"profile {str(path)!r} was measured for model {art_model!r}, not "
                f"{self.model.name!r}; profile {self.model.name} first (`dcp-bench profile "
                f"model={self.model.name}`)"
            )
        self.profile = str(path)
        layers = [p for p in self.artifact["layers"] if not p.get("oom")]
        if not layers:
            raise ConfigError(f"profile {str(path)!r} holds no layer measurements")
        # what the profile did not measure (see the module docstring)
        self.analytical = AnalyticalCostModel(
            model=self.model,
            cluster=self.cluster,
            mem_cap_fraction=self.mem_cap_fraction,
            zero_stage=self.zero_stage,
        )
        self.fallbacks: set[str] = set()
        # the structure of what a checkpointed layer keeps, in the profile's dtype
        prof_dtype = str(self.artifact.get("settings", {}).get("dtype") or self.model.dtype)
        self._act_terms = activation_terms(
            self.model, {"fp32": 4, "bf16": 2, "fp16": 2}.get(prof_dtype)
        )
        self.nproc = _pick_nproc({int(p["nproc"]) for p in layers}, self.cluster.world_size)
        mine = [p for p in layers if int(p["nproc"]) == self.nproc]
        self.tables: dict[int, LayerTables] = {}
        for sp in sorted({int(p["sp"]) for p in mine}):
            self.tables[sp] = fit_layer_tables([p for p in mine if int(p["sp"]) == sp])
        self._fit_outer()
        self._fit_collectives()
        static = self.artifact["static"]
        self.params = int(static["params"])
        self.param_bytes = float(static["param_bytes"])
        self.layer_params = int(static.get("layer_params") or self.analytical._layer_params)
        self.optimizer_step_s = float(static.get("optimizer_step_s", 0.0))
        steps = {int(s["nproc"]): s for s in self.artifact.get("steps", [])}
        self.step_entry: dict[str, Any] | None = steps.get(self.nproc)
        # the ZeRO stage whose training step the step overhead timed
        self.step_zero_stage = int(
            (self.step_entry or {}).get("zero_stage", LEGACY_STEP_ZERO_STAGE)
        )
        # resident bytes per saved activation byte and the step's own resident buffers, measured
        # on CPU (1 and 0: the saved bytes)
        entry = self.step_entry or {}
        # the largest factor any world size measured: it describes the machine's allocator, and
        # repeated measurements of it vary by ~15%; planning under a cap needs the safe side
        self.resident_factor = max(
            [1.0, *(float(s.get("resident_factor") or 1.0) for s in steps.values())]
        )
        self.resident_fixed_bytes = max(0.0, float(entry.get("resident_fixed_bytes") or 0.0))
        self._record_provenance(resolved)

    def _record_provenance(self, resolved: Path) -> None:
        """What run records copy: the profile by path and hash, what it cost, the fits' errors."""
        self.provenance = {
            **self.provenance,
            "profile_path": self.profile,
            "profile_sha256": sha256_file(resolved),
            "profile_hardware": self.artifact.get("hardware", {}).get("cpu_model")
            if not self.artifact.get("hardware", {}).get("gpu_model")
            else self.artifact["hardware"]["gpu_model"],
            "profile_device": self.artifact.get("settings", {}).get("device"),
            "profile_wall_s": self.artifact.get("cost", {}).get("wall_s"),
            "profile_nproc_used": self.nproc,
            "fit_max_rel_err": self.fit_max_rel_err(),
            "workspace_bytes": self.workspace_bytes(),
            "workspace_source": self._workspace_source(),
            "resident_factor": self.resident_factor,
            "resident_fixed_bytes": self.resident_fixed_bytes,
            "zero_stage": self.zero_stage,
            "profile_step_zero_stage": self.step_zero_stage,
            "checkpointed_forward": "measured (fwd_ckpt_s)"
            if all("fwd_ckpt" in t.time for t in self.tables.values())
            else "not measured by this profile: priced as the plain forward",
        }
        # the same, grouped as run records store it (RunSummary.profile)
        self.provenance["profile"] = {
            "path": self.profile,
            "sha256": self.provenance["profile_sha256"],
            "wall_s": self.provenance["profile_wall_s"],
            "hardware": self.provenance["profile_hardware"],
        }

    def describe(self) -> dict[str, Any]:
        """Provenance, with the quantities the analytical model supplied so far (``fallbacks``)."""
        out = super().describe()
        out["fallbacks"] = sorted(self.fallbacks)
        if self.fallbacks:
            out["fallback_constants"] = self.analytical.provenance.get("constants")
        return out

    # --- fits -------------------------------------------------------------------------------

    def _fit_outer(self) -> None:
        outer = [
            p
            for p in self.artifact.get("outer", [])
            if int(p["nproc"]) == self.nproc and not p.get("oom")
        ]
        self.outer: dict[str, LinearFit] = {}
        self.outer_act: LinearFit | None = None
        if not outer:
            return
        tpr = np.array([p["tokens_per_rank"] for p in outer], dtype=float)
        n = np.array([int(p.get("n_samples", 1)) for p in outer], dtype=float)
        xo = layer_features(tpr, np.zeros(len(outer)), n)
        for phase in ("fwd", "bwd", "inputs"):
            if all(f"{phase}_s" in p for p in outer):
                self.outer[phase] = fit_nonnegative(
                    xo, np.array([p[f"{phase}_s"]["median"] for p in outer])
                )
        act = np.maximum(np.array([p["act_bytes"] for p in outer], dtype=float), 1.0)
        self.outer_act = fit_nonnegative(memory_features(tpr, np.zeros(len(outer)), n), act)

    def _fit_collectives(self) -> None:
        self.collectives: dict[tuple[str, int], LinearFit] = {}
        coll = self.artifact["collectives"]
        procs = {int(p["nproc"]) for p in coll}
        if not procs:
            return
        cn = _pick_nproc(procs, self.cluster.world_size)
        for op, g in sorted(
            {(p["op"], int(p["group_size"])) for p in coll if int(p["nproc"]) == cn}
        ):
            pts = [
                p
                for p in coll
                if p["op"] == op and int(p["group_size"]) == g and int(p["nproc"]) == cn
            ]
            self.collectives[(op, g)] = fit_nonnegative(
                collective_features(np.array([p["bytes"] for p in pts])),
                np.array([p["time_s"]["median"] for p in pts]),
            )

    def fit_max_rel_err(self) -> dict[str, float]:
        """Largest in-sample relative error of each fit, by name (e.g. ``sp2.fwd``)."""
        out: dict[str, float] = {}
        for sp, tab in self.tables.items():
            for phase, fit in tab.time.items():
                out[f"sp{sp}.{phase}"] = round(fit.max_rel_err, 4)
            out[f"sp{sp}.act_bytes"] = round(tab.act.max_rel_err, 4)
        for phase, fit in self.outer.items():
            out[f"outer.{phase}"] = round(fit.max_rel_err, 4)
        for (op, g), fit in self.collectives.items():
            out[f"{op}.g{g}"] = round(fit.max_rel_err, 4)
        return out

    def _table(self, sp: int) -> tuple[int, LayerTables]:
        """The measured SP degree whose per-rank law serves ``sp`` (itself when measured; else
        the nearest: its features are per rank, only the all-to-all share differs, and that is
        swapped in `_sequence_costs`)."""
        if sp in self.tables:
            return sp, self.tables[sp]
        nearest = min(self.tables, key=lambda s: (abs(np.log2(s) - np.log2(sp)), -s))
        return nearest, self.tables[nearest]

    def collective_time(self, op: str, group_size: int, nbytes: np.ndarray | float) -> np.ndarray:
        """Predicted time of one collective (``all_to_all`` or ``all_reduce``) of ``nbytes`` per
        rank over an aligned group of ``group_size`` ranks: the profile's fit when it measured
        that operation and group size, else the analytical model's price (recorded as a
        fallback)."""
        b = np.atleast_1d(np.asarray(nbytes, dtype=float))
        if group_size <= 1:
            return np.zeros_like(b)
        fit = self.collectives.get((op, group_size))
        if fit is not None:
            return fit.predict(collective_features(b))
        self.fallbacks.add(f"{op} over {group_size} ranks: analytical")
        g = np.full(len(b), group_size)
        if op == "all_to_all":
            return self.analytical.a2a_time(b, g, collectives=1)
        return np.array([self.analytical.allreduce_time(float(x), group_size) for x in b])

    def _a2a_bytes_per_token(self) -> list[float]:
        """Bytes per local token of each all-to-all one layer issues in its forward pass (the
        backward pass mirrors them)."""
        return arch_of(self.model).a2a_bytes_per_token(self.model, self.model.dtype_bytes)

    # --- CostModel --------------------------------------------------------------------------

    def _outer_time(self, phase: str, x: np.ndarray) -> np.ndarray:
        if phase not in self.outer:
            return np.zeros(len(x), dtype=float)
        return self.outer[phase].predict(x)

    def _comm_per_layer(self, sp: int, tpr: np.ndarray) -> np.ndarray:
        """All-to-all time of one layer, forward + backward."""
        if sp <= 1:
            return np.zeros_like(tpr, dtype=float)
        total = np.zeros_like(tpr, dtype=float)
        for per_token in self._a2a_bytes_per_token():
            total += self.collective_time("all_to_all", sp, tpr * per_token)
        return 2.0 * total

    def _sequence_costs(
        self,
        tpr: np.ndarray,
        ppr: np.ndarray,
        n: np.ndarray,
        sp: int,
        ckpt_layers: int,
        packed_share: bool = False,
        ulysses: int | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(fwd, bwd, recompute, comm) seconds for micro-batches with the given per-rank sizes.
        ``packed_share``: without the per-micro-batch constants (see `sample_time_packed`).
        ``ulysses``: the ranks the all-to-alls span (None: ``sp``; ring and hybrid SP have
        fewer, see `microbatch_cost`)."""
        a2a = sp if ulysses is None else ulysses
        L = self.model.num_layers
        sp_t, tab = self._table(sp)
        x = layer_features(tpr, ppr, n)
        xo = layer_features(tpr, np.zeros_like(tpr), n)
        if packed_share:
            x, xo = _drop_intercept(x), _drop_intercept(xo)
        fwd_l = tab.time["fwd"].predict(x)
        bwd_l = tab.time["bwd"].predict(x)
        rec_l = tab.time["recompute"].predict(x)
        # layer times measured at sp_t > 1 include that degree's all-to-alls: take them out
        # (never below a tenth of the measurement) and price the all-to-alls of this degree
        inside = np.minimum(self._comm_per_layer(sp_t, tpr), 0.9 * (fwd_l + bwd_l))
        keep = np.where(fwd_l + bwd_l > 0, 1.0 - inside / np.maximum(fwd_l + bwd_l, 1e-30), 1.0)
        comm_l = self._comm_per_layer(a2a, tpr)
        if packed_share and a2a > 1:  # bytes only: latencies are shared by a micro-batch's samples
            comm_l = comm_l - self._comm_per_layer(a2a, np.zeros_like(tpr))
        k = min(max(int(ckpt_layers), 0), L)
        if k and "fwd_ckpt" in tab.time:
            # the k checkpointed layers run their forward under checkpointing (measured)
            layers_fwd = ((L - k) * fwd_l + k * tab.time["fwd_ckpt"].predict(x)) * keep
        else:
            layers_fwd = L * fwd_l * keep
        fwd = layers_fwd + self._outer_time("fwd", xo) + self._outer_time("inputs", xo)
        bwd = L * bwd_l * keep + self._outer_time("bwd", xo)
        # recompute is measured (checkpointed minus plain backward) with its all-to-alls inside
        return fwd, bwd, ckpt_layers * rec_l, L * comm_l

    def _activation_bytes(
        self,
        tpr: np.ndarray,
        ppr: np.ndarray,
        n: np.ndarray,
        sp: int,
        ckpt_layers: int,
        resident: bool = True,
        peak: bool = True,
    ) -> np.ndarray:
        """Bytes the models keep for the backward per rank (the measured per-layer and outer laws;
        a checkpointed layer keeps its checkpointed blocks' inputs, `activation_terms`), times the
        measured ``resident_factor`` unless ``resident`` is False (that factor is the CPU
        allocator's share); ``peak``: with every layer checkpointed, add the block a
        recomputation materialises (False: what is kept, as `memory_count` counts it)."""
        L = self.model.num_layers
        _, tab = self._table(sp)
        k = min(max(ckpt_layers, 0), L)
        terms = self._act_terms
        per_layer = tab.act.predict(memory_features(tpr, ppr, n))
        outer = (
            self.outer_act.predict(memory_features(tpr, np.zeros_like(tpr), n))
            if self.outer_act
            else 0.0
        )
        # the profile measures one checkpoint input (the layer's); STDiT checkpoints its two
        # blocks separately (runtime.models.STDiTPair), each keeping its input
        mem = (
            (L - k) * per_layer
            + k * terms.blocks_per_layer * tab.ckpt_bytes_per_token * tpr
            + outer
        )
        if k > 0:  # the conditioning every checkpointed unit holds (not in the outer law)
            mem = mem + terms.conditioning_held_tok * tpr + terms.conditioning_held_sample * n
        if (
            peak and k == L and L > 0
        ):  # recomputing one checkpointed block materialises its activations
            mem = mem + per_layer / terms.blocks_per_layer
        return mem * (self.resident_factor if resident else 1.0)

    def checkpointed_layer_bytes(self, tokens_per_rank: float, sp: int) -> float:
        _, tab = self._table(sp)
        return float(
            self._act_terms.blocks_per_layer
            * tab.ckpt_bytes_per_token
            * tokens_per_rank
            * self.resident_factor
        )

    def _sizes(
        self, tokens: np.ndarray, frames: np.ndarray, sp: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per-rank (tokens, pairs, samples) of one micro-batch holding all of ``tokens``."""
        tpr = np.array([tokens.sum() / sp])
        ppr = np.array([attention_pairs(tokens, frames, self.model.arch).sum() / sp])
        return tpr, ppr, np.array([float(len(tokens))])

    def microbatch_cost(
        self,
        tokens: np.ndarray,
        frames: np.ndarray,
        sp: int,
        ckpt_layers: int,
        split: str = "sequence",
        sp_kind: str = "ulysses",
        ulysses_degree: int = 0,
    ) -> MicroBatchCost:
        """See `CostModel.microbatch_cost`. Ring and hybrid SP (``sp_kind``): the measured
        per-rank compute of the nearest measured SP degree, the all-to-alls of the Ulysses part
        only, and the ring's point-to-point steps as the analytical model prices them (overlap
        included; the profile measures no point-to-point: recorded as a fallback)."""
        tokens = np.atleast_1d(np.asarray(tokens, dtype=float))
        frames = np.atleast_1d(np.asarray(frames, dtype=float))
        flops = self.model_flops(tokens, frames)
        u = ulysses_span(sp_kind, ulysses_degree, sp)
        if u != sp and not arch_of(self.model).text_sp_kinds:
            raise ConfigError(f"sp_kind={sp_kind!r} prices text models; video runs DSP (ulysses)")
        if split not in ("sequence", "batch"):
            raise ConfigError(f"split={split!r}; expected 'sequence' or 'batch'")
        if split == "batch" and sp > 1:
            # whole samples dealt to the group's ranks as the runtime deals them (by tokens,
            # largest first to the least loaded); the group finishes with its slowest rank
            owner = deal_by_tokens(tokens, sp)
            parts = [
                self.microbatch_cost(tokens[owner == r], frames[owner == r], 1, ckpt_layers)
                for r in range(sp)
                if np.any(owner == r)
            ]
            slow = max(parts, key=lambda c: c.total_s)
            mem = max(c.mem_bytes for c in parts)
            ss_only = {t.name for t in self.time_terms if t.sequence_split_only}
            return MicroBatchCost.from_terms(
                {
                    **{k: 0.0 if k in ss_only else v for k, v in slow.times().items()},
                    "mem_bytes": mem,
                    "model_flops": flops,
                }
            )
        tpr, ppr, n = self._sizes(tokens, frames, sp)
        fwd, bwd, rec, comm = self._sequence_costs(tpr, ppr, n, sp, ckpt_layers, ulysses=u)
        if u != sp:
            self.fallbacks.add("ring attention point-to-point steps: analytical")
            comm = comm + self.analytical.ring_exposed_comm(tokens, sp, u, ckpt_layers)
        mem = (
            float(self._activation_bytes(tpr, ppr, n, sp, ckpt_layers)[0])
            + self.static_memory_bytes()
        )
        own = {
            "fwd_s": fwd,
            "bwd_s": bwd,
            "recompute_s": rec,
            "comm_s": comm,
            "mem_bytes": np.array([mem]),
            "model_flops": np.array([flops]),
        }
        c = self.with_added_costs(
            own,
            tokens,
            frames,
            np.zeros(len(tokens), dtype=np.int64),
            np.array([sp]),
            np.array([ckpt_layers]),
        )
        return MicroBatchCost.from_terms({k: float(v[0]) for k, v in c.items()})

    def sample_time(
        self, tokens: np.ndarray, frames: np.ndarray, sp: int, ckpt_layers: int
    ) -> np.ndarray:
        tokens = np.asarray(tokens, dtype=float)
        tpr = tokens / sp
        ppr = attention_pairs(tokens, np.asarray(frames, dtype=float), self.model.arch) / sp
        fwd, bwd, rec, comm = self._sequence_costs(tpr, ppr, np.ones_like(tpr), sp, ckpt_layers)
        n = len(tokens)
        own = {"fwd_s": fwd, "bwd_s": bwd, "recompute_s": rec, "comm_s": comm}
        return self.total_time(
            self.with_added_costs(
                own,
                tokens,
                np.asarray(frames),
                np.arange(n),
                np.full(n, sp),
                np.full(n, ckpt_layers),
            )
        )

    def sample_time_packed(
        self, tokens: np.ndarray, frames: np.ndarray, sp: int, ckpt_layers: int
    ) -> np.ndarray:
        """Each sample's share of a packed micro-batch: its per-token, per-pair and per-sample
        terms, without the constants a micro-batch pays once (the laws' intercepts and the
        collectives' latencies)."""
        tokens = np.asarray(tokens, dtype=float)
        tpr = tokens / sp
        ppr = attention_pairs(tokens, np.asarray(frames, dtype=float), self.model.arch) / sp
        fwd, bwd, rec, comm = self._sequence_costs(
            tpr, ppr, np.ones_like(tpr), sp, ckpt_layers, packed_share=True
        )
        return fwd + bwd + rec + comm

    def sample_memory(
        self, tokens: np.ndarray, frames: np.ndarray, sp: int, ckpt_layers: int
    ) -> np.ndarray:
        tokens = np.asarray(tokens, dtype=float)
        ppr = attention_pairs(tokens, np.asarray(frames, dtype=float), self.model.arch) / sp
        return self._activation_bytes(tokens / sp, ppr, np.ones_like(tokens), sp, ckpt_layers)

    def workspace_bytes(self) -> float:
        """Memory a rank holds besides parameters, gradients, optimizer state and activations:
        the profile's measured process baseline when it has one for this world (CPU), else the
        GPU spec's allowance."""
        if (
            self.step_entry is not None
            and self.step_entry.get("process_baseline_bytes") is not None
        ):
            return float(self.step_entry["process_baseline_bytes"])
        return float(getattr(self.cluster.gpu, "workspace_bytes", 0.0))

    def _workspace_source(self) -> str:
        if (
            self.step_entry is not None
            and self.step_entry.get("process_baseline_bytes") is not None
        ):
            return f"profile: measured process baseline ({self.nproc} ranks)"
        return f"gpu spec {self.cluster.gpu.name}: workspace_bytes"

    def static_memory_bytes(self) -> float:
        """Parameters, gradients and AdamW state of the profiled parameter count as the runtime
        holds them at ``zero_stage`` (`dcp_bench.train_policy.static_state_bytes`), plus the
        workspace (`workspace_bytes`) and, on CPU, the step's own resident buffers (measured)."""
        states = static_state_bytes(
            self.params,
            self.layer_params,
            self.cluster.world_size,
            self.zero_stage,
            precision_policy(self.model.dtype),
        )
        return float(sum(states.values())) + self.workspace_bytes() + self.resident_fixed_bytes

    def step_sync_time(self) -> float:
        """Once per step: the gradient synchronisation, clipping and optimizer step of the runtime
        at ``zero_stage``. When the profile ran this world size, its measured step overhead
        (``TrainingState.finish_step`` of the whole model); measured at another ZeRO stage (an
        artifact without ``zero_stage`` measured stage 0), that measurement with the measured
        stage's gradient sync and optimizer share swapped for this stage's (`_stage_sync_time`,
        `_optimizer_share`; the rest, norms and clipping, as measured), named as a fallback.
        Else this stage's gradient sync (measured all-reduce law or analytical) plus its share of
        the optimizer step."""
        if (
            self.step_entry is not None
            and "step_overhead_s" in self.step_entry
            and self.nproc == self.cluster.world_size
        ):
            measured = float(self.step_entry["step_overhead_s"]["median"])
            if self.step_zero_stage == self.zero_stage:
                return measured
            self.fallbacks.add(
                f"step overhead measured at ZeRO stage {self.step_zero_stage}, priced for stage "
                f"{self.zero_stage}: gradient sync and optimizer share swapped"
            )
            rest = (
                measured
                - self._stage_sync_time(self.step_zero_stage)
                - self._optimizer_share(self.step_zero_stage)
            )
            return (
                max(rest, 0.0)
                + self._stage_sync_time(self.zero_stage)
                + self._optimizer_share(self.zero_stage)
            )
        return self._stage_sync_time(self.zero_stage) + self._optimizer_share(self.zero_stage)

    def _stage_sync_time(self, stage: int) -> float:
        """The once-per-step gradient synchronisation of ZeRO ``stage`` over the world
        (`dcp_bench.train_policy.grad_sync_bytes`: stage 0 an fp32 all-reduce, stage 1 a
        reduce-scatter plus an all-gather, which move what an all-reduce of half those bytes
        moves; none for stages 2-3, whose collectives run inside every micro-batch)."""
        nbytes = grad_sync_bytes(self.params, stage, precision_policy(self.model.dtype))
        if not nbytes:
            return 0.0
        return float(self.collective_time("all_reduce", self.cluster.world_size, nbytes / 2)[0])

    def _optimizer_share(self, stage: int) -> float:
        """This rank's AdamW step at ZeRO ``stage``: the whole model's (``optimizer_step_s``,
        elementwise) on a 1/world shard from stage 1."""
        return self.optimizer_step_s / (self.cluster.world_size if stage >= 1 else 1)

    def model_flops(self, tokens: np.ndarray, frames: np.ndarray) -> float:
        """Model FLOPs (forward + backward = 3x forward) of the samples: 2 per parameter per token
        for the dense layers plus the attention's 4 * head width per query-key pair per head."""
        m = self.model
        pairs = attention_pairs(tokens, frames, m.arch).sum()
        dense = 2.0 * self.params * float(np.sum(tokens))
        attn = 4.0 * m.hidden * pairs * m.num_layers
        return 3.0 * (dense + attn)
