"""`ProfiledCostModel`: the cost model whose numbers come from a measured profile artifact.

It reads the artifact `dcp-bench profile` writes (`dcp_bench.cost.profile_artifact`) and fits, per
SP degree, the per-layer forward, backward and recompute time as ``a + b*T + c*P`` (T: tokens per
rank, P: attention query-key pairs per rank, so packed micro-batches and long single samples share
one law), activation bytes per layer as ``b*T``, the rest of the model (embedding, head, loss) as
``a + b*T``, and every collective as ``latency + bytes/bandwidth``. Measurements taken with the
same number of processes as the cluster's world size are preferred (ranks share the machine's
cores, so timings depend on how many run at once).

Provenance (`describe`) names the profile by path and SHA-256, what profiling cost (wall time),
and the fits' errors; run records copy it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from dcp_bench.cost.base import CostModel, MicroBatchCost
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
)
from dcp_bench.errors import ConfigError
from dcp_bench.files import sha256_file

PHASES = ("fwd", "bwd", "recompute")


@dataclass(frozen=True)
class LayerTables:
    """The fits for one SP degree."""

    time: dict[str, LinearFit]  # phase -> per-layer time law
    act_bytes_per_token: float  # autograd-saved bytes per token per rank, one layer
    ckpt_bytes_per_token: float  # the same with the layer checkpointed


def fit_layer_tables(points: list[dict[str, Any]]) -> LayerTables:
    """Fit one SP degree's grid points (all with the same ``sp`` and ``nproc``)."""
    x = layer_features(
        np.array([p["tokens_per_rank"] for p in points]),
        np.array([p["pairs_per_rank"] for p in points]),
    )
    fwd = np.array([p["fwd_s"]["median"] for p in points])
    bwd = np.array([p["bwd_s"]["median"] for p in points])
    bwd_ckpt = np.array([p["bwd_ckpt_s"]["median"] for p in points])
    # recompute = the extra backward time checkpointing costs; noise can make it dip below zero
    # at tiny sizes, where it is then treated as free
    recompute = np.maximum(bwd_ckpt - bwd, 1e-9)
    tpr = np.array([p["tokens_per_rank"] for p in points], dtype=float)
    act = np.array([p["act_bytes"] for p in points], dtype=float)
    ckpt = np.array([p["ckpt_bytes"] for p in points], dtype=float)
    return LayerTables(
        time={
            "fwd": fit_nonnegative(x, fwd),
            "bwd": fit_nonnegative(x, bwd),
            "recompute": fit_nonnegative(x, recompute),
        },
        act_bytes_per_token=float(act.sum() / tpr.sum()),
        ckpt_bytes_per_token=float(ckpt.sum() / tpr.sum()),
    )


def _pick_nproc(available: set[int], world: int) -> int:
    if world in available:
        return world
    below = [n for n in available if n <= world]
    return max(below) if below else min(available)


@dataclass
class ProfiledCostModel(CostModel):
    """A `CostModel` built from a profile artifact (``profile``: its path, or a folder holding
    ``<model name>.json``; relative paths are taken from the repository root). Defaults to the
    cluster config's ``profile`` field."""

    profile: str | None = None
    source: str = "profiled"

    def __post_init__(self) -> None:
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
                    f"`dcp-bench profile model={self.model.name} out={path}/{self.model.name}.json` "
                    "or use the analytical cost source"
                )
            path = f"{str(path).rstrip('/')}/{self.model.name}.json"
            resolved = resolved / f"{self.model.name}.json"
        self.artifact = load_artifact(resolved)
        art_model = self.artifact["model"].get("name")
        if art_model != self.model.name:
            raise ConfigError(
                f"profile {str(path)!r} was measured for model {art_model!r}, not {self.model.name!r}; "
                f"profile {self.model.name} first (`dcp-bench profile model={self.model.name}`)"
            )
        self.profile = str(path)
        layers = [p for p in self.artifact["layers"] if not p.get("oom")]
        if not layers:
            raise ConfigError(f"profile {str(path)!r} holds no layer measurements")
        self.nproc = _pick_nproc({int(p["nproc"]) for p in layers}, self.cluster.world_size)
        mine = [p for p in layers if int(p["nproc"]) == self.nproc]
        self.tables: dict[int, LayerTables] = {}
        for sp in sorted({int(p["sp"]) for p in mine}):
            self.tables[sp] = fit_layer_tables([p for p in mine if int(p["sp"]) == sp])
        outer = [
            p for p in self.artifact.get("outer", []) if int(p["nproc"]) == self.nproc and not p.get("oom")
        ]
        self.outer: dict[str, LinearFit] = {}
        if outer:
            xo = layer_features(np.array([p["tokens_per_rank"] for p in outer]), np.zeros(len(outer)))
            for phase in ("fwd", "bwd"):
                self.outer[phase] = fit_nonnegative(xo, np.array([p[f"{phase}_s"]["median"] for p in outer]))
            tpr = np.array([p["tokens_per_rank"] for p in outer], dtype=float)
            self.outer_bytes_per_token = float(
                np.array([p["act_bytes"] for p in outer], dtype=float).sum() / tpr.sum()
            )
        else:
            self.outer_bytes_per_token = 0.0
        self.collectives: dict[tuple[str, int], LinearFit] = {}
        coll = self.artifact["collectives"]
        procs = {int(p["nproc"]) for p in coll}
        if procs:
            cn = _pick_nproc(procs, self.cluster.world_size)
            for op, g in sorted({(p["op"], int(p["group_size"])) for p in coll if int(p["nproc"]) == cn}):
                pts = [p for p in coll if p["op"] == op and int(p["group_size"]) == g and int(p["nproc"]) == cn]
                self.collectives[(op, g)] = fit_nonnegative(
                    collective_features(np.array([p["bytes"] for p in pts])),
                    np.array([p["time_s"]["median"] for p in pts]),
                )
        static = self.artifact["static"]
        self.params = int(static["params"])
        self.param_bytes = float(static["param_bytes"])
        self.optimizer_step_s = float(static.get("optimizer_step_s", 0.0))
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
        }
        # the same, grouped as run records store it (RunSummary.profile)
        self.provenance["profile"] = {
            "path": self.profile,
            "sha256": self.provenance["profile_sha256"],
            "wall_s": self.provenance["profile_wall_s"],
            "hardware": self.provenance["profile_hardware"],
        }

    # --- fits -------------------------------------------------------------------------------

    def fit_max_rel_err(self) -> dict[str, float]:
        """Largest in-sample relative error of each fit, by name (e.g. ``sp2.fwd``)."""
        out: dict[str, float] = {}
        for sp, tab in self.tables.items():
            for phase, fit in tab.time.items():
                out[f"sp{sp}.{phase}"] = round(fit.max_rel_err, 4)
        for (op, g), fit in self.collectives.items():
            out[f"{op}.g{g}"] = round(fit.max_rel_err, 4)
        return out

    def _table(self, sp: int) -> LayerTables:
        if sp in self.tables:
            return self.tables[sp]
        # beyond the measured degrees the per-rank law of the nearest measured degree is used:
        # its features are already per rank, only the all-to-all share grows
        nearest = min(self.tables, key=lambda s: (abs(np.log2(s) - np.log2(sp)), -s))
        return self.tables[nearest]

    def collective_time(self, op: str, group_size: int, nbytes: float) -> float:
        """Predicted time of one collective (``all_to_all`` or ``all_reduce``) of ``nbytes`` per
        rank over ``group_size`` ranks."""
        if group_size <= 1:
            return 0.0
        if (op, group_size) in self.collectives:
            fit = self.collectives[(op, group_size)]
        else:
            sizes = [g for (o, g) in self.collectives if o == op]
            if not sizes:
                return 0.0
            fit = self.collectives[(op, min(sizes, key=lambda g: abs(g - group_size)))]
        return float(fit.predict(collective_features(np.array([nbytes])))[0])

    def _a2a_bytes_per_token(self) -> list[float]:
        """Bytes per local token of each all-to-all one layer issues in its forward pass (the
        backward pass mirrors them)."""
        m, b = self.model, self.model.dtype_bytes
        if m.arch == "llama":  # q, k, v in; attention output back
            kv = m.kv_heads * m.head_dim
            return [m.hidden * b, kv * b, kv * b, m.hidden * b]
        # DSP: a block pair switches the sharded dimension before the temporal block and back
        return [m.hidden * b, m.hidden * b]

    # --- CostModel --------------------------------------------------------------------------

    def _layer_time(self, tab: LayerTables, phase: str, tpr: np.ndarray, ppr: np.ndarray) -> np.ndarray:
        return tab.time[phase].predict(layer_features(tpr, ppr))

    def _outer_time(self, phase: str, tpr: np.ndarray) -> np.ndarray:
        if phase not in self.outer:
            return np.zeros_like(tpr, dtype=float)
        return self.outer[phase].predict(layer_features(tpr, np.zeros_like(tpr, dtype=float)))

    def _comm_per_layer(self, sp: int, tpr: np.ndarray) -> np.ndarray:
        """All-to-all time of one layer, forward + backward, from the collective fit."""
        if sp <= 1:
            return np.zeros_like(tpr, dtype=float)
        total = np.zeros_like(tpr, dtype=float)
        for per_token in self._a2a_bytes_per_token():
            fit = self.collectives.get(("all_to_all", sp))
            if fit is None:
                total += np.array([self.collective_time("all_to_all", sp, t * per_token) for t in tpr])
            else:
                total += fit.predict(collective_features(tpr * per_token))
        return 2.0 * total

    def _sequence_costs(
        self, tpr: np.ndarray, ppr: np.ndarray, sp: int, ckpt_layers: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(fwd, bwd, recompute, comm) seconds for micro-batches with the given per-rank sizes."""
        L = self.model.num_layers
        tab = self._table(sp)
        fwd_l = self._layer_time(tab, "fwd", tpr, ppr)
        bwd_l = self._layer_time(tab, "bwd", tpr, ppr)
        rec_l = self._layer_time(tab, "recompute", tpr, ppr)
        # measured layer times at sp > 1 include the layer's all-to-alls; report that share as
        # communication so totals stay equal to what was measured
        comm_l = np.minimum(self._comm_per_layer(sp, tpr), 0.9 * (fwd_l + bwd_l))
        share = np.where(fwd_l + bwd_l > 0, comm_l / np.maximum(fwd_l + bwd_l, 1e-30), 0.0)
        fwd = L * fwd_l * (1 - share) + self._outer_time("fwd", tpr)
        bwd = L * bwd_l * (1 - share) + self._outer_time("bwd", tpr)
        return fwd, bwd, ckpt_layers * rec_l, L * comm_l

    def _activation_bytes(self, tpr: np.ndarray, sp: int, ckpt_layers: int) -> np.ndarray:
        L = self.model.num_layers
        tab = self._table(sp)
        k = min(max(ckpt_layers, 0), L)
        per_layer = tab.act_bytes_per_token * tpr
        mem = (L - k) * per_layer + k * tab.ckpt_bytes_per_token * tpr + self.outer_bytes_per_token * tpr
        # recomputing a checkpointed layer materialises its activations once more
        return mem + (per_layer if k > 0 else 0.0)

    def microbatch_cost(
        self,
        tokens: np.ndarray,
        frames: np.ndarray,
        sp: int,
        ckpt_layers: int,
        split: str = "sequence",
    ) -> MicroBatchCost:
        tokens = np.asarray(tokens, dtype=float)
        frames = np.asarray(frames, dtype=float)
        flops = self.model_flops(tokens, frames)
        if split == "batch" and sp > 1:
            # whole samples dealt to the group's ranks (longest first to the least loaded); the
            # group finishes with its slowest rank
            alone = self.sample_time(tokens, frames, 1, ckpt_layers)
            loads = np.zeros(sp)
            owner = np.zeros(len(tokens), dtype=int)
            for i in np.argsort(-alone, kind="stable"):
                r = int(np.argmin(loads))
                loads[r] += alone[i]
                owner[i] = r
            slow = int(np.argmax(loads))
            sel = owner == slow
            sub = self.microbatch_cost(tokens[sel], frames[sel], 1, ckpt_layers)
            mem = max(
                float(self._activation_bytes(np.array([tokens[owner == r].sum()]), 1, ckpt_layers)[0])
                for r in range(sp)
            )
            return MicroBatchCost(
                sub.fwd_s, sub.bwd_s, sub.recompute_s, sub.comm_s,
                mem + self.static_memory_bytes(), flops,
            )
        if split not in ("sequence", "batch"):
            raise ValueError(f"split must be 'sequence' or 'batch', got {split!r}")
        tpr = np.array([tokens.sum() / sp])
        ppr = np.array([attention_pairs(tokens, frames, self.model.arch).sum() / sp])
        fwd, bwd, rec, comm = self._sequence_costs(tpr, ppr, sp, ckpt_layers)
        mem = float(self._activation_bytes(tpr, sp, ckpt_layers)[0]) + self.static_memory_bytes()
        return MicroBatchCost(float(fwd[0]), float(bwd[0]), float(rec[0]), float(comm[0]), mem, flops)

    def sample_time(self, tokens: np.ndarray, frames: np.ndarray, sp: int, ckpt_layers: int) -> np.ndarray:
        tokens = np.asarray(tokens, dtype=float)
        tpr = tokens / sp
        ppr = attention_pairs(tokens, np.asarray(frames, dtype=float), self.model.arch) / sp
        fwd, bwd, rec, comm = self._sequence_costs(tpr, ppr, sp, ckpt_layers)
        return fwd + bwd + rec + comm

    def sample_memory(self, tokens: np.ndarray, frames: np.ndarray, sp: int, ckpt_layers: int) -> np.ndarray:
        del frames
        return self._activation_bytes(np.asarray(tokens, dtype=float) / sp, sp, ckpt_layers)

    def static_memory_bytes(self) -> float:
        """Parameters, gradients and AdamW state of the profiled parameter count, plus the
        cluster's per-device workspace allowance (not measured by the profiler)."""
        # parameters + gradients (same dtype) + Adam's two fp32 moments, plus an fp32 master
        # copy when the model trains in 16-bit
        master = 4.0 * self.params if self.model.dtype != "fp32" else 0.0
        workspace = float(getattr(self.cluster.gpu, "workspace_bytes", 0.0))
        return 2.0 * self.param_bytes + 8.0 * self.params + master + workspace

    def step_sync_time(self) -> float:
        world = self.cluster.world_size
        grad_bytes = self.param_bytes
        return self.collective_time("all_reduce", world, grad_bytes) + self.optimizer_step_s

    def model_flops(self, tokens: np.ndarray, frames: np.ndarray) -> float:
        """Model FLOPs (forward + backward = 3x forward) of the samples: 2 per parameter per token
        for the dense layers plus the attention's 4 * head width per query-key pair per head."""
        m = self.model
        pairs = attention_pairs(tokens, frames, m.arch).sum()
        dense = 2.0 * self.params * float(np.sum(tokens))
        attn = 4.0 * m.hidden * pairs * m.num_layers
        return 3.0 * (dense + attn)
