"""The external validation set: published H100/H200 measurements against the analytical model.

`load_published` reads ``results/validation/published.yaml`` (every row's source, configuration,
published figure and certainty); `predict` prices one row with the analytical model under a set
of constants; `calibrate` fits the uncertain constants on the rows of the fit half, block by
block, each block on the rows its constants govern; `validation_table` lays out every row before
and after, and `summary` the errors on the held-out half. ``dcp-bench validate`` drives it.

Error of a row = model / published - 1 (every published quantity is a rate: larger is faster), so
+50% means the model is 1.5x optimistic. Fits minimise the mean squared log ratio (symmetric in
over- and under-prediction) over a grid refined around its best point: deterministic, no
optimiser dependency.

Rows marked ``priced: false`` measure what the model cannot price (FP8 GEMMs, torch.compile, ring
context parallelism, other attention kernels): they are priced anyway and shown with their ratio,
but neither fitted nor counted in the errors.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from dcp_bench.cost.analytical import AnalyticalCostModel
from dcp_bench.cost.specs import ClusterSpec, ModelSpec, cluster_spec, model_spec
from dcp_bench.errors import ConfigError

KINDS = ("gemm_peak", "gemm", "attention", "training", "sp_attention", "alltoall", "allreduce")
# flash attention's own FLOP count for the backward pass, relative to the forward
FA_BWD_FLOPS_RATIO = 2.5
DEFAULT_GPU_CLUSTER = {"h100": "h100x32", "h200": "h200x32"}


@dataclass(frozen=True)
class Row:
    """One published measurement (see results/validation/published.yaml for the fields)."""

    id: str
    series: str
    source: str
    kind: str
    unit: str
    published: float
    certainty: str
    precision: str
    power: str
    gpu: str
    config: Mapping[str, Any]
    unpriced: tuple[str, ...] = ()
    note: str = ""
    priced: bool = True
    reason: str = ""
    split: str = "alternate"  # how the row joins the fit or held-out half: `SPLIT_RULES`


@dataclass(frozen=True)
class Published:
    sources: Mapping[str, Mapping[str, Any]]
    rows: tuple[Row, ...]
    path: str


def load_published(path: str | Path) -> Published:
    """Read and check the validation set; errors name the row and what is wrong."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"validation set {str(p)!r} not found")
    data = yaml.safe_load(p.read_text()) or {}
    sources = data.get("sources") or {}
    rows: list[Row] = []
    names = {f.name for f in dataclasses.fields(Row)}
    for raw in data.get("rows") or []:
        unknown = set(raw) - names
        if unknown:
            raise ConfigError(f"validation row {raw.get('id')!r}: unknown fields {sorted(unknown)}")
        row = Row(
            **{
                **raw,
                "published": float(raw["published"]),
                "unpriced": tuple(raw.get("unpriced") or ()),
                "config": dict(raw.get("config") or {}),
            }
        )
        if row.kind not in KINDS:
            raise ConfigError(
                f"validation row {row.id!r}: kind {row.kind!r}; expected one of {', '.join(KINDS)}"
            )
        if row.source not in sources:
            raise ConfigError(
                f"validation row {row.id!r}: source {row.source!r} is not in `sources`"
            )
        if not row.published > 0:
            raise ConfigError(f"validation row {row.id!r}: published {row.published} must be > 0")
        if not row.priced and not row.reason:
            raise ConfigError(f"validation row {row.id!r}: priced: false needs a reason")
        if row.split not in SPLIT_RULES:
            raise ConfigError(
                f"validation row {row.id!r}: split {row.split!r}; expected one of "
                f"{', '.join(SPLIT_RULES)}"
            )
        rows.append(row)
    ids = [r.id for r in rows]
    dup = {i for i in ids if ids.count(i) > 1}
    if dup:
        raise ConfigError(f"validation set {str(p)!r}: duplicate row ids {sorted(dup)}")
    return Published(sources=sources, rows=tuple(rows), path=str(p))


# How a priced row joins a half (its ``split`` field), decided before any fitting:
# - alternate: within its series, in the order listed, the 1st, 3rd, ... fitted, 2nd, 4th, ... held
# out;
# - seeded: held out when the SHA-256 of "SPLIT_SEED:row id" is odd, else fitted (a large table
# added
#   at once, e.g. the GEMM shapes under 1 GFLOP, is split independently of its listing order);
# - holdout: always held out (whole-model rows from sources the fit never sees).
SPLIT_RULES = ("alternate", "seeded", "holdout")
SPLIT_SEED = 22


def seeded_half(row_id: str, seed: int = SPLIT_SEED) -> str:
    """``fit`` or ``holdout`` for a row of a seeded series (see `SPLIT_RULES`)."""
    digest = hashlib.sha256(f"{seed}:{row_id}".encode()).digest()
    return "holdout" if digest[-1] % 2 else "fit"


def split(rows: Iterable[Row]) -> dict[str, str]:
    """``fit``, ``holdout`` or ``reference`` per row id by each row's rule (`SPLIT_RULES`);
    unpriced rows are references."""
    out: dict[str, str] = {}
    seen: dict[str, int] = {}
    for r in rows:
        if not r.priced:
            out[r.id] = "reference"
            continue
        if r.split == "holdout":
            out[r.id] = "holdout"
            continue
        if r.split == "seeded":
            out[r.id] = seeded_half(r.id)
            continue
        i = seen.get(r.series, 0)
        seen[r.series] = i + 1
        out[r.id] = "fit" if i % 2 == 0 else "holdout"
    return out


# ------------------------------------------------------------------------------------ pricing


@functools.cache
def _cluster_base(name: str) -> ClusterSpec:
    return cluster_spec(name)


@functools.cache
def _model(name: str) -> ModelSpec:
    return model_spec(name)


def _cluster(row: Row) -> ClusterSpec:
    cfg = row.config
    base = _cluster_base(str(cfg.get("cluster") or DEFAULT_GPU_CLUSTER[row.gpu]))
    ranks = cfg.get("ranks")
    c = base.resized(int(ranks)) if ranks else base
    if cfg.get("cluster_overrides"):
        over: dict[str, Any] = {k: float(v) for k, v in cfg["cluster_overrides"].items()}
        c = dataclasses.replace(c, **over)
    if cfg.get("gpu_overrides"):
        gover: dict[str, Any] = {k: float(v) for k, v in cfg["gpu_overrides"].items()}
        c = dataclasses.replace(c, gpu=dataclasses.replace(c.gpu, **gover))
    return c


def cost_model(
    row: Row, constants: Mapping[str, float] | None, use_config: bool
) -> AnalyticalCostModel:
    """The analytical model a row is priced with: its model (llama3_8b for kernel rows) on its
    cluster, with ``constants`` passed explicitly and, with ``use_config``, the configs'
    calibrated constants for the rest (else the built-in assumptions)."""
    cfg = row.config
    options: dict[str, Any] = dict(constants or {})
    if "zero_stage" in cfg:
        options["zero_stage"] = int(cfg["zero_stage"])
    return AnalyticalCostModel(
        model=_model(str(cfg.get("model", "llama3_8b"))),
        cluster=_cluster(row),
        use_config_constants=use_config,
        **options,
    )


def predict(
    row: Row, constants: Mapping[str, float] | None = None, use_config: bool = True
) -> float:
    """The model's figure for ``row``, in the row's unit."""
    cfg = row.config
    cm = cost_model(row, constants, use_config)
    peak = cm.cluster.gpu.peak_flops
    if row.kind == "gemm_peak":
        return cm.cluster.gpu.matmul_flops / 1e12
    if row.kind == "gemm":
        b, m, n, k = (int(cfg.get("b", 1)), int(cfg["m"]), int(cfg["n"]), int(cfg["k"]))
        if cm.gemm_half_flops is None:  # the row-count law: efficiency of b*m rows
            eff = float(cm.gemm_efficiency(b * m))
        else:
            eff = float(cm.gemm_efficiency_flops(2.0 * b * m * n * k))
        return eff * peak / 1e12
    if row.kind == "attention":
        eff = float(
            cm.attention_efficiency(float(cfg["seqlen"]), causal=bool(cfg.get("causal", False)))
        )
        rate = eff * peak / 1e12
        if cfg.get("direction", "fwd") == "bwd":
            return rate * FA_BWD_FLOPS_RATIO / float(cm.attn_bwd_factor or 1.0)
        return rate
    if row.kind == "training":
        sp = int(cfg.get("sp", 1))
        per_mb = int(cfg.get("samples_per_microbatch", 1))
        n_mb = int(cfg.get("microbatches", 1))
        tokens = np.full(per_mb, int(cfg["sample_tokens"]))
        c = cm.microbatch_cost(
            tokens, np.ones(per_mb, dtype=np.int64), sp, int(cfg.get("ckpt_layers", 0))
        )
        step = n_mb * c.total_s + cm.step_sync_time()
        return n_mb * float(tokens.sum()) / sp / step
    if row.kind == "sp_attention":
        L, sp = float(cfg["seqlen"]), int(cfg["sp"])
        h = cm.model.hidden
        fwd = 2.0 * L * L * h / (sp * peak * float(cm.attention_efficiency(L, causal=True)))
        bwd = float(cm.attn_bwd_factor or 0.0) * fwd
        n_r = np.array([L / sp])
        comm = 2.0 * float(
            cm.a2a_time(cm.a2a_bytes_per_layer(n_r, np.array([sp])), np.array([sp]), 2)[0]
        )
        return 1.0 / (fwd + bwd + comm)
    if row.kind == "alltoall":
        nbytes = float(cfg["bytes"])
        t = float(cm.a2a_time(np.array([nbytes]), np.array([int(cfg["group"])]), 1)[0])
        return nbytes / t / 1e9
    if row.kind == "allreduce":
        nbytes, ranks = float(cfg["bytes"]), int(cfg.get("ranks", cm.cluster.world_size))
        t = cm.allreduce_time(nbytes, ranks)
        algbw = nbytes / t / 1e9
        return algbw * (
            2.0 * (ranks - 1) / ranks if cfg.get("measure", "busbw") == "busbw" else 1.0
        )
    raise ConfigError(f"validation row {row.id!r}: kind {row.kind!r} has no pricing")


# --------------------------------------------------------------------------------- calibration


@dataclass(frozen=True)
class Block:
    """Constants fitted together, on the fit-half rows ``selects`` picks; ``grid`` gives each
    constant's search range (low, high, log-spaced?)."""

    name: str
    grid: Mapping[str, tuple[float, float, bool]]
    selects: Callable[[Row], bool]
    rows_text: str  # what the rows are, for the report


def _ranks(r: Row) -> int:
    return int(r.config.get("ranks", 8))


def _attn(direction: str, causal: bool | None) -> Callable[[Row], bool]:
    def sel(r: Row) -> bool:
        c = r.config
        return (
            r.kind == "attention"
            and c.get("direction", "fwd") == direction
            and (causal is None or bool(c.get("causal", False)) == causal)
        )

    return sel


# In fitting order: later blocks are fitted with the earlier ones' values in place.
BLOCKS: tuple[Block, ...] = (
    Block(
        "gemm",
        {"gemm_half_flops": (1e8, 1e11, True)},
        lambda r: r.kind == "gemm",
        "bf16 GEMMs over shapes (XLA sm_90 table)",
    ),
    Block(
        "attention",
        {"attn_eff_max": (0.15, 0.9, False), "attn_half_len": (1.0, 4096.0, True)},
        _attn("fwd", False),
        "FlashAttention-2 forward, non-causal, head dim 64 and 128",
    ),
    Block(
        "attention_causal",
        {"attn_causal_half_len": (1.0, 8192.0, True)},
        _attn("fwd", True),
        "FlashAttention-2 forward, causal",
    ),
    Block(
        "attention_bwd",
        {"attn_bwd_factor": (1.0, 6.0, False)},
        _attn("bwd", None),
        "FlashAttention-2 backward",
    ),
    Block(
        "alltoall",
        {"a2a_eff": (0.3, 1.5, False), "a2a_latency_s": (1e-6, 3e-4, True)},
        lambda r: r.kind == "alltoall",
        "NCCL all-to-all on one 8-GPU node, 1 MiB - 2 GiB",
    ),
    Block(
        "allreduce",
        {"allreduce_eff": (0.3, 1.5, False), "allreduce_hop_latency_s": (1e-7, 3e-5, True)},
        lambda r: r.kind == "allreduce" and _ranks(r) <= 8,
        "NCCL all-reduce on one 8-GPU node (H100, H200)",
    ),
    Block(
        "allreduce_inter",
        {"allreduce_inter_eff": (0.3, 1.0, False), "allreduce_overlap": (0.0, 1.0, False)},
        lambda r: r.kind == "allreduce" and _ranks(r) > 8,
        "NCCL all-reduce over two nodes",
    ),
    Block(
        "training",
        {"elementwise_bytes_factor": (0.0, 40.0, False)},
        lambda r: r.kind == "training",
        "bf16 eager whole-model training (torchtitan, 8 and 128 H100)",
    ),
)
# Constants held by the GPU configs (compute) and by the cluster configs (links).
GPU_CONSTANTS = (
    "gemm_half_flops",
    "attn_eff_max",
    "attn_half_len",
    "attn_causal_half_len",
    "attn_bwd_factor",
    "elementwise_bytes_factor",
)
LINK_CONSTANTS = (
    "a2a_eff",
    "a2a_latency_s",
    "allreduce_eff",
    "allreduce_hop_latency_s",
    "allreduce_inter_eff",
    "allreduce_overlap",
)


def _loss(rows: list[Row], consts: Mapping[str, float]) -> float:
    logs = [math.log(max(predict(r, consts, use_config=False), 1e-30) / r.published) for r in rows]
    return float(np.mean(np.square(logs)))


def _axis(lo: float, hi: float, log: bool, n: int) -> np.ndarray:
    return np.geomspace(lo, hi, n) if log else np.linspace(lo, hi, n)


def _fit_block(block: Block, rows: list[Row], fixed: Mapping[str, float]) -> dict[str, float]:
    """Grid search over the block's constants, then two finer grids around the best point."""
    names = list(block.grid)
    ranges = {k: block.grid[k] for k in names}
    n = 41 if len(names) == 1 else 21
    best: dict[str, float] = {}
    for _ in range(3):
        axes = [_axis(*ranges[k], n) for k in names]
        best_loss = math.inf
        for point in np.array(np.meshgrid(*axes, indexing="ij")).reshape(len(names), -1).T:
            trial = {**fixed, **dict(zip(names, (float(v) for v in point)))}
            loss = _loss(rows, trial)
            if loss < best_loss:
                best_loss, best = loss, dict(zip(names, (float(v) for v in point)))
        for k in names:  # zoom in: a fifth of the range around the best value, inside the bounds
            lo, hi, log = ranges[k]
            v = best[k]
            if log:
                w = (hi / lo) ** 0.1
                ranges[k] = (max(lo, v / w), min(hi, v * w), True)
            else:
                w = (hi - lo) * 0.1
                ranges[k] = (max(lo, v - w), min(hi, v + w), False)
    return best


def round_sig(x: float, digits: int = 3) -> float:
    """``x`` to ``digits`` significant digits (what the configs record)."""
    if x == 0 or not math.isfinite(x):
        return float(x)
    return float(f"{x:.{digits}g}")


def calibrate(published: Published) -> dict[str, Any]:
    """Fit every block on its fit-half rows in order; returns the constants (rounded to 3
    significant digits, as the configs record them) and, per block, the rows it used."""
    roles = split(published.rows)
    constants: dict[str, float] = {}
    blocks: list[dict[str, Any]] = []
    for block in BLOCKS:
        rows = [r for r in published.rows if roles[r.id] == "fit" and block.selects(r)]
        if not rows:
            continue
        fitted = {k: round_sig(v) for k, v in _fit_block(block, rows, constants).items()}
        constants.update(fitted)
        blocks.append(
            {
                "block": block.name,
                "constants": fitted,
                "fit_rows": [r.id for r in rows],
                "rows": block.rows_text,
                "fit_loss_rms_log": math.sqrt(_loss(rows, constants)),
            }
        )
    return {"constants": constants, "blocks": blocks}


# ------------------------------------------------------------------------------------ tables


def error_stats(errors: list[float]) -> dict[str, Any]:
    """Median and max |error| (model / published - 1) of a set of rows."""
    if not errors:
        return {"n": 0, "median_abs_error": None, "max_abs_error": None}
    a = np.abs(np.asarray(errors, dtype=float))
    return {
        "n": int(a.size),
        "median_abs_error": float(np.median(a)),
        "max_abs_error": float(a.max()),
    }


@dataclass
class TableRow:
    row: Row
    role: str
    before: float
    after: float
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def err_before(self) -> float:
        return self.before / self.row.published - 1.0

    @property
    def err_after(self) -> float:
        return self.after / self.row.published - 1.0


def validation_table(published: Published, after: Mapping[str, float] | None) -> list[TableRow]:
    """Every row priced with the built-in assumptions (before) and with ``after`` (the fitted
    constants; None: the configs' calibrated constants)."""
    roles = split(published.rows)
    out = []
    for r in published.rows:
        before = predict(r, None, use_config=False)
        now = predict(r, after, use_config=after is None)
        out.append(TableRow(row=r, role=roles[r.id], before=before, after=now))
    return out


def summary(table: list[TableRow]) -> dict[str, Any]:
    """Errors before and after, on the held-out half, the fit half, and all priced rows; the
    rows off by more than 2x after calibration with their stated reasons."""

    def pick(role: str | None) -> list[TableRow]:
        return [t for t in table if (t.role == role if role else t.role != "reference")]

    out: dict[str, Any] = {}
    for when in ("before", "after"):
        out[when] = {
            name: error_stats([getattr(t, f"err_{when}") for t in pick(role)])
            for name, role in (("holdout", "holdout"), ("fit", "fit"), ("priced", None))
        }
        out[when]["reference"] = error_stats([getattr(t, f"err_{when}") for t in pick("reference")])
    out["by_kind_holdout_after"] = {
        k: error_stats([t.err_after for t in table if t.role == "holdout" and t.row.kind == k])
        for k in sorted({t.row.kind for t in table})
    }
    out["off_by_more_than_2x_after"] = [
        {
            "id": t.row.id,
            "role": t.role,
            "ratio": t.after / t.row.published,
            "reason": t.row.reason or "; ".join(t.row.unpriced) or "none stated",
        }
        for t in table
        if not 0.5 <= t.after / t.row.published <= 2.0
    ]
    out["rows"] = {
        "total": len(table),
        "fit": len(pick("fit")),
        "holdout": len(pick("holdout")),
        "reference": len(pick("reference")),
    }
    return out
