"""The GPU check's measurements at the claim's own shapes, and what it fits from them.

Phases of `tools.gpu_check` after the calibration profiles, each with its own
deadline and each writing its results as soon as it has them:

- ``buckets`` (``stdit_buckets.json``): STDiT3-XL/2 (all 28 block pairs, bf16, one rank) on
  micro-batches of the reference dataset's buckets (`dcp_bench.workloads.image_buckets` and
  `video_buckets`: 144p images to 720p x 408 frames), at SP 1, with the reference profiler's
  power-of-two batch-size search (`dcp_bench.reference.trial_search.baseline_search`: 1, 2, 4, ...,
  the first failure ends it) under the 0.7 memory cap, once without and once with full
  activation checkpointing. A trial's time is one measured forward+backward (after a warm-up
  when the first run is short); its memory is the allocator's peak above the state
  (``torch.cuda.max_memory_allocated``) and, in the same run, the bytes autograd saved
  (`dcp_bench.runtime.step_meter.SavedTensorMeter`). It fits when it ran out of no memory and its
  activation peak plus what a rank of the claim's cluster holds (`train_policy.static_state_bytes`
  at the claim's world size and ZeRO stage) is under 0.7 of the device's memory. Buckets are
  visited ends first, then midpoints (0, n-1, n/2, n/4, 3n/4, ...), so a budget that ends early
  still spans the smallest images to the longest videos.
- ``floor``: the per-layer launch/dispatch floor: forward+backward of a 2-layer minus a 1-layer
  model at tiny micro-batches (16-256 tokens), median of repetitions, per model.
- ``fit`` (``h200_constants.yaml``, plain names; ``cpu_constants.yaml`` on the dry run): the
  analytical cost model's GEMM and attention efficiency constants (``gemm_half_flops``,
  ``attn_eff_max``, ``attn_half_len``) chosen on a grid to minimise the median relative error
  of its micro-batch times against the measured bucket trials; the small-work floor per layer;
  the allocator term (measured peak = ``allocator_factor`` x saved bytes + ``allocator_offset``,
  least squares over the trials). Before/after errors are recorded.
- ``claim`` (``claim.tar.gz``): `dcp-bench reproduce sections=claim` on the GPU-calibrated models
  (the profiled cost model on the calibration's STDiT profile, and the analytical model with the
  fitted constants), its report packed into one file.

On the CPU dry run (``--device cpu --tiny``) the same code runs the tiny STDiT on scaled-down
buckets (spatial patches / 64, latent frames / 8) with a stated 16 MiB device, the saved-tensor
count as its memory, and the claim section on the analytical model with the constants fitted to the
tiny model; its numbers test the pipeline, not the hardware.
"""

from __future__ import annotations

import dataclasses
import gc
import itertools
import json
import math
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from dcp_bench.archs import arch_of
from dcp_bench.cost import make_cost_model
from dcp_bench.cost.params import param_breakdown
from dcp_bench.cost.specs import cluster_spec, model_spec
from dcp_bench.files import atomic_write_json, atomic_write_text
from dcp_bench.paths import CONF_DIR, REPO_ROOT
from dcp_bench.reference.trial_search import Trial, baseline_search
from dcp_bench.runtime.attention import SINGLE
from dcp_bench.runtime.models import build_model
from dcp_bench.runtime.step_meter import SavedTensorMeter
from dcp_bench.runtime.training import FlatState, build_training_state
from dcp_bench.train_policy import DEFAULT_ZERO_STAGE, precision_policy, static_state_bytes
from dcp_bench.workloads import image_buckets, video_buckets

MEM_CAP_FRACTION = 0.7  # the reference profiler's cap
CLAIM_CLUSTER = "h200x32"
TINY_DEVICE_BYTES = 16 * 2**20  # the dry run's stated device memory
FLOOR_TOKENS = (16, 64, 256)
# gemm_half_flops, not gemm_half_tokens: the H100/H200 configs set gemm_half_flops, which takes
# precedence over gemm_half_tokens, so only it moves the model there.
FIT_GRID = {
    "gemm_half_flops": (3e8, 1e9, 2e9, 4.72e9, 1e10, 3e10),
    "attn_eff_max": (0.3, 0.4, 0.45, 0.5, 0.6, 0.7),
    "attn_half_len": (128.0, 256.0, 512.0, 1024.0, 2048.0),
}


class BudgetSpent(Exception):
    """A phase's deadline passed before its next trial."""


@dataclasses.dataclass
class MeasureRun:
    """What the phases share: the output folder, the device, the check's JSON (``check``) and how
    to write it, and the notes for the summary."""

    out: Path
    device: Any
    tiny: bool
    check: dict[str, Any]
    write: Any
    notes: list[str]

    @property
    def stdit(self) -> str:
        return "tiny_stdit" if self.tiny else "stdit3_xl2"

    @property
    def llama(self) -> str:
        return "tiny_llama" if self.tiny else "llama3_8b"


# ------------------------------------------------------------------------------------------------
# Buckets


def reference_buckets(tiny: bool) -> list[dict[str, Any]]:
    """The reference dataset's 25 buckets (5 image, 20 video), by tokens; tiny: scaled down."""
    rows = []
    for b in image_buckets() + video_buckets():
        frames, spatial = b.latent_frames, b.spatial
        if tiny:
            frames, spatial = max(1, frames // 8), max(2, spatial // 64)
        rows.append(
            {"bucket": b.label, "frames": frames, "spatial": spatial, "tokens": frames * spatial}
        )
    return sorted(rows, key=lambda r: (r["tokens"], r["frames"]))


def ends_first(n: int) -> list[int]:
    """0, n-1, then midpoints of ever finer halves: every prefix spans the whole range."""
    if n <= 0:
        return []
    order = [0] + ([n - 1] if n > 1 else [])
    seen = set(order)
    intervals = [(0, n - 1)]
    while intervals:
        nxt = []
        for lo, hi in intervals:
            if hi - lo < 2:
                continue
            mid = (lo + hi) // 2
            if mid not in seen:
                seen.add(mid)
                order.append(mid)
            nxt += [(lo, mid), (mid, hi)]
        intervals = nxt
    return order


def device_memory_bytes(device: Any, tiny: bool) -> int:
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    return TINY_DEVICE_BYTES


def claim_rank_state_bytes(model: str) -> float:
    """Bytes a rank of the claim's cluster holds for parameters, gradients and optimizer states
    (the runtime's policy at the default ZeRO stage over the cluster's world)."""
    spec = model_spec(model)
    c = cluster_spec(CLAIM_CLUSTER)
    pb = param_breakdown(spec)
    return float(
        sum(
            static_state_bytes(
                pb.total,
                pb.per_layer,
                c.num_nodes * c.gpus_per_node,
                DEFAULT_ZERO_STAGE,
                precision_policy(spec.dtype),
            ).values()
        )
    )


class TrialRunner:
    """Runs one micro-batch of ``bs`` copies of a bucket's shape on the model and measures it."""

    def __init__(self, name: str, device: Any, tiny: bool) -> None:
        self.spec = model_spec(name)
        self.device = device
        self.state = build_training_state(self.spec, 0, device, lr=1e-4, zero_stage=0)
        assert isinstance(self.state, FlatState)
        self.capacity = device_memory_bytes(device, tiny)
        self.rank_state = float(self.state.static_bytes()) if tiny else claim_rank_state_bytes(name)
        self.cap = MEM_CAP_FRACTION * self.capacity

    def _run_once(self, frames: int, spatial: int, bs: int, ckpt: int) -> tuple[float, int, int]:
        model = self.state.model
        cuda = self.device.type == "cuda"
        ids = np.arange(bs)
        tokens = np.full(bs, frames * spatial, dtype=np.int64)
        fr = np.full(bs, frames, dtype=np.int64)
        self.state.begin_step()
        meter = SavedTensorMeter(model)
        if cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            base = torch.cuda.memory_allocated(self.device)
        t0 = time.perf_counter()
        inputs = model.make_inputs(ids, tokens, fr, SINGLE, 0)
        with meter.active():
            loss = model.loss_sum(inputs, SINGLE, ckpt) / float(tokens.sum())
        loss.backward()
        del loss, inputs
        if cuda:
            torch.cuda.synchronize(self.device)
        elapsed = time.perf_counter() - t0
        peak = (
            int(torch.cuda.max_memory_allocated(self.device) - base) if cuda else int(meter.bytes)
        )
        return elapsed, peak, int(meter.bytes)

    def trial(self, frames: int, spatial: int, bs: int, ckpt: int) -> dict[str, Any]:
        row: dict[str, Any] = {"bs": bs, "ckpt_layers": ckpt, "tokens": frames * spatial * bs}
        oom = False
        try:
            t, peak, saved = self._run_once(frames, spatial, bs, ckpt)
            reps = 1
            if t < 1.0:  # the first run warmed up kernels and the allocator: time a second one
                t, peak, saved = self._run_once(frames, spatial, bs, ckpt)
                reps = 2
        except torch.cuda.OutOfMemoryError:
            oom = True
        if oom:  # released outside the handler: the exception's frames hold the graph until then
            self._release()
            row.update(oom=True, fits=False)
            return row
        total = peak + self.rank_state
        row.update(
            oom=False,
            time_s=t,
            runs=reps,
            activation_peak_bytes=peak,
            saved_bytes=saved,
            rank_total_bytes=total,
            fits=bool(total <= self.cap),
        )
        self._release()
        return row

    def _release(self) -> None:
        self.state.begin_step()
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def bucket_phase(run: MeasureRun, deadline: float) -> None:
    buckets = reference_buckets(run.tiny)
    runner = TrialRunner(run.stdit, run.device, run.tiny)
    L = runner.spec.num_layers
    result: dict[str, Any] = {
        "model": run.stdit,
        "sp": 1,
        "mem_cap_fraction": MEM_CAP_FRACTION,
        "device_bytes": runner.capacity,
        "cap_bytes": runner.cap,
        "rank_state_bytes": runner.rank_state,
        "rank_state": "tiny: the one-rank state as held"
        if run.tiny
        else f"{CLAIM_CLUSTER} rank at the default ZeRO stage (train_policy.static_state_bytes)",
        "memory": "allocator peak above the state (torch.cuda.max_memory_allocated)"
        if run.device.type == "cuda"
        else "bytes autograd saved (CPU: no allocator peak)",
        "search": "dcp_bench.reference.trial_search.baseline_search at SP 1",
        "buckets": [],
        "not_reached": [],
    }
    path = run.out / "stdit_buckets.json"
    run.check["buckets"] = {"file": path.name, "buckets": 0, "trials": 0}

    def save() -> None:
        atomic_write_json(path, result)
        run.check["buckets"].update(
            buckets=len(result["buckets"]),
            trials=sum(len(b["trials"]) for b in result["buckets"]),
            not_reached=len(result["not_reached"]),
        )
        run.write()

    save()
    order = ends_first(len(buckets))
    for n, i in enumerate(order):
        b = buckets[i]
        entry: dict[str, Any] = {**b, "trials": [], "chosen": {}}
        result["buckets"].append(entry)
        try:
            for ckpt in (0, L):
                last = [0.0]

                def measure(
                    sp: int,
                    bs: int,
                    b: dict[str, Any] = b,
                    ckpt: int = ckpt,
                    last: list[float] = last,
                    entry: dict[str, Any] = entry,
                ) -> Trial:
                    if time.time() + 2.5 * last[0] > deadline:
                        raise BudgetSpent
                    t0 = time.time()
                    row = runner.trial(b["frames"], b["spatial"], bs, ckpt)
                    last[0] = time.time() - t0
                    entry["trials"].append(row)
                    save()
                    return Trial(
                        row["fits"],
                        row.get("time_s", 0.0),
                        row.get("activation_peak_bytes", 0.0),
                        ckpt,
                    )

                prof = baseline_search(measure, 1)
                entry["chosen"]["ckpt" if ckpt else "no_ckpt"] = (
                    None if prof is None else {"bs": prof.bs, "time_s": prof.time_s}
                )
                save()
        except BudgetSpent:
            entry["stopped"] = "the phase's time budget was spent"
            result["not_reached"] = [buckets[j]["bucket"] for j in order[n + 1 :]]
            save()
            break
    print(
        f"  buckets: {len(result['buckets'])} of {len(buckets)} searched, "
        f"{sum(len(b['trials']) for b in result['buckets'])} trials",
        file=sys.stderr,
        flush=True,
    )


# ------------------------------------------------------------------------------------------------
# Launch floor


def _layer_time(name: str, layers: int, tokens: int, device: Any, reps: int) -> float:
    spec = dataclasses.replace(model_spec(name), num_layers=layers)
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    model = build_model(spec, seed=0, device=device, dtype=dtype)
    video = arch_of(spec).video
    frames = np.array([2 if video else 1])
    inputs = model.make_inputs(np.array([0]), np.array([tokens]), frames, SINGLE, 0)
    times = []
    for rep in range(reps + 2):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        model.loss_sum(inputs, SINGLE, 0).backward()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if rep >= 2:
            times.append(time.perf_counter() - t0)
        model.zero_grad(set_to_none=True)
    del model
    return statistics.median(times)


def floor_phase(run: MeasureRun, deadline: float) -> None:
    reps = 3 if run.tiny else 10
    rows: list[dict[str, Any]] = []
    run.check["floor"] = {
        "method": "forward+backward of a 2-layer minus a 1-layer model, one sample, median of "
        f"{reps} after 2 warm-ups",
        "rows": rows,
    }
    for name in (run.llama, run.stdit):
        for tokens in FLOOR_TOKENS:
            if time.time() > deadline:
                run.check["floor"]["stopped"] = "the phase's time budget was spent"
                run.write()
                return
            t1 = _layer_time(name, 1, tokens, run.device, reps)
            t2 = _layer_time(name, 2, tokens, run.device, reps)
            rows.append(
                {
                    "model": name,
                    "tokens": tokens,
                    "one_layer_model_s": t1,
                    "two_layer_model_s": t2,
                    "per_layer_s": max(t2 - t1, 0.0),
                }
            )
            run.write()


# ------------------------------------------------------------------------------------------------
# Fit


def _bucket_rows(run: MeasureRun) -> list[dict[str, Any]]:
    path = run.out / "stdit_buckets.json"
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    return [
        {**t, "frames": b["frames"], "spatial": b["spatial"]}
        for b in data["buckets"]
        for t in b["trials"]
        if not t.get("oom") and t.get("time_s")
    ]


def _median_rel_err(cost: Any, rows: list[dict[str, Any]]) -> float:
    errs = []
    for r in rows:
        t = np.full(r["bs"], r["frames"] * r["spatial"], dtype=np.int64)
        f = np.full(r["bs"], r["frames"], dtype=np.int64)
        pred = float(cost.microbatch_cost(t, f, 1, r["ckpt_layers"]).total_s)
        errs.append(abs(pred - r["time_s"]) / r["time_s"])
    return float(np.median(errs)) if errs else math.nan


def fit_constants(model: str, cluster: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The constants with the least median relative error of the analytical model's micro-batch
    time against ``rows`` (measured trials), and the error before and after: the points of
    `FIT_GRID` and the model's current constants (a search that left out where it starts could
    report a fit worse than none; the CPU models' GEMMs, for one, lie below the grid's smallest
    small-GEMM term)."""
    base = make_cost_model(model, cluster, "analytical")
    before = _median_rel_err(base, rows)
    current = {k: getattr(base, k) for k in FIT_GRID}
    best: tuple[float, dict[str, Any]] = (before, current)
    for values in itertools.product(*FIT_GRID.values()):
        consts: dict[str, Any] = dict(zip(FIT_GRID, values))
        err = _median_rel_err(make_cost_model(model, cluster, "analytical", **consts), rows)
        if err < best[0]:
            best = (err, consts)
    return {
        "cost_constants": best[1],
        "kept_current": best[1] is current,
        "median_rel_err_before": before,
        "median_rel_err_after": best[0],
        "points": len(rows),
        "grid": {k: list(v) for k, v in FIT_GRID.items()},
    }


def fit_allocator(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """peak = factor * saved + offset by least squares over the trials (None with < 2 points)."""
    pts = [(r["saved_bytes"], r["activation_peak_bytes"]) for r in rows if r.get("saved_bytes")]
    if len(pts) < 2:
        return None
    x = np.array([p[0] for p in pts], dtype=float)
    y = np.array([p[1] for p in pts], dtype=float)
    a = np.vstack([x, np.ones_like(x)]).T
    (factor, offset), *_ = np.linalg.lstsq(a, y, rcond=None)
    rel = np.abs(a @ np.array([factor, offset]) - y) / np.maximum(y, 1.0)
    return {
        "allocator_factor": float(factor),
        "allocator_offset_bytes": float(offset),
        "points": len(pts),
        "max_rel_err": float(rel.max()),
    }


def fit_phase(run: MeasureRun, deadline: float) -> None:
    rows = _bucket_rows(run)
    cluster = "cpu" if run.tiny else "h200x8"
    fit: dict[str, Any] = {
        "model": run.stdit,
        "cluster": cluster,
        "device": run.check.get("env", {}).get("gpu_model") or "cpu",
        "commit": run.check.get("env", {}).get("git_sha"),
        "measured": (
            "stdit_buckets.json trials (time: one forward+backward; memory: allocator peak)"
        ),
    }
    if rows:
        fit.update(fit_constants(run.stdit, cluster, rows))
    else:
        run.notes.append("fit: no measured bucket trial; no time constants fitted")
    floor = run.check.get("floor", {}).get("rows", [])
    if floor:
        fit["small_work_floor_s_per_layer"] = {
            name: statistics.median([r["per_layer_s"] for r in floor if r["model"] == name])
            for name in sorted({r["model"] for r in floor})
        }
    alloc = fit_allocator(rows)
    if alloc:
        fit["allocator"] = alloc
    name = "cpu_constants.yaml" if run.tiny else "h200_constants.yaml"
    text = (
        "# Constants fitted by scripts/gpu_check.sh from its own measurements "
        "(tools/gpu_measure.py).\n# cost_constants: keys of the analytical cost "
        "model (a cluster or GPU config's cost_constants).\n" + yaml.safe_dump(fit, sort_keys=True)
    )
    atomic_write_text(run.out / name, text)
    run.check["fit"] = {"file": name, **{k: v for k, v in fit.items() if k != "grid"}}
    run.write()


# ------------------------------------------------------------------------------------------------
# The claim on the calibrated models


def claim_config(run: MeasureRun, base: Path, dest: Path) -> Path:
    """A reproduce config holding the packaged claim section, its grids run on the profiled
    model (the calibration's STDiT profile) and on the analytical model with the fitted
    constants."""
    cfg = yaml.safe_load(base.read_text())
    section = next(s for s in cfg["sections"] if s.get("name") == "claim")
    grids = []
    profile = run.out / f"{run.stdit}.json"
    consts = (run.check.get("fit") or {}).get("cost_constants") or {}
    for grid in section["grids"]:
        # the profile serves only the model it measured (the dry run's tiny STDiT does not price
        # the claim's STDiT3-XL/2)
        if profile.exists() and f"model={run.stdit}" in grid:
            grids.append([*grid, "cost.source=profiled", f"cost.profile={profile.resolve()}"])
        if consts:
            grids.append(
                [
                    *grid,
                    "cost.source=analytical",
                    *[
                        f"++cluster.cost_constants.{k}={'null' if v is None else v}"
                        for k, v in consts.items()
                    ],
                ]
            )
    if not grids:
        raise RuntimeError(
            "no calibrated model to run the claim on (no STDiT profile and no fitted constants)"
        )
    section = {**section, "grids": grids}
    cfg["sections"] = [section]
    path = dest / "claim.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def claim_phase(run: MeasureRun, deadline: float) -> None:
    budget = deadline - time.time()
    if budget < 20:
        raise RuntimeError(f"{budget:.0f} s left: too little for the claim section")
    with tempfile.TemporaryDirectory(prefix="dcp-claim-") as tmp:
        root = Path(tmp)
        cfg = claim_config(run, CONF_DIR / "reproduce" / "default.yaml", root)
        cmd = [
            sys.executable,
            "-m",
            "dcp_bench.cli",
            "reproduce",
            f"config={cfg}",
            "sections=claim",
            f"root={root / 'r'}",
            f"out={root / 'report'}",
            f"budget_s={max(budget - 10, 15):.0f}",
            f"report_reserve_s={min(30, max(budget / 4, 5)):.0f}",
            "--no-progress",
        ]
        proc = subprocess.run(
            cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=max(budget, 1.0)
        )
        (root / "report").mkdir(exist_ok=True)
        (root / "report" / "claim_console.log").write_text(
            proc.stdout[-20000:] + proc.stderr[-20000:]
        )
        tmp_tar = run.out / ".claim.tar.gz.tmp"
        with tarfile.open(tmp_tar, "w:gz") as tar:
            tar.add(root / "report", arcname="claim")
        tmp_tar.replace(run.out / "claim.tar.gz")
        summary = root / "report" / "summary.json"
        verdicts = {}
        if summary.exists():
            data = json.loads(summary.read_text())
            verdicts = {k: data[k] for k in ("verdict", "claims", "headline") if k in data}
    run.check["claim"] = {
        "file": "claim.tar.gz",
        "exit_status": proc.returncode,
        "command": " ".join(cmd[1:]),
        "summary": verdicts,
    }
    run.write()
    if proc.returncode != 0:
        run.notes.append(
            f"claim: reproduce exited {proc.returncode}: {(proc.stderr or proc.stdout)[-300:]}"
        )


# ------------------------------------------------------------------------------------------------


def summary_lines(report: dict[str, Any]) -> list[str]:
    """Markdown lines for the summary: buckets searched, the floor, the fit and the claim."""
    lines: list[str] = []
    b = report.get("buckets")
    if b:
        lines += [
            "",
            "## STDiT buckets (SP 1, power-of-two batch search under the 0.7 cap)",
            "",
            f"- `{b['file']}`: {b['buckets']} buckets searched, {b['trials']} trials, "
            f"{b.get('not_reached', 0)} not reached",
        ]
    f = report.get("floor")
    if f and f.get("rows"):
        lines += [
            "",
            "## Per-layer small-work floor",
            "",
            "| model | tokens | per layer s |",
            "|---|---|---|",
        ]
        lines += [f"| {r['model']} | {r['tokens']} | {r['per_layer_s']:.2e} |" for r in f["rows"]]
    fit = report.get("fit")
    if fit:
        lines += ["", f"## Fitted constants (`{fit['file']}`)", ""]
        if "cost_constants" in fit:
            lines.append(
                f"- {fit['cost_constants']}: median relative error of micro-batch time "
                f"{fit['median_rel_err_before']:.1%} before, {fit['median_rel_err_after']:.1%} "
                f"after ({fit['points']} trials)"
            )
        if "small_work_floor_s_per_layer" in fit:
            lines.append(f"- small-work floor per layer: {fit['small_work_floor_s_per_layer']}")
        if "allocator" in fit:
            lines.append(f"- allocator: {fit['allocator']}")
    c = report.get("claim")
    if c:
        lines += [
            "",
            f"## The claim on the calibrated models (`{c['file']}`)",
            "",
            f"- reproduce exit status {c['exit_status']}; {c.get('summary') or 'no summary'}",
        ]
    return lines


__all__ = [
    "MeasureRun",
    "bucket_phase",
    "claim_phase",
    "ends_first",
    "fit_phase",
    "floor_phase",
    "reference_buckets",
    "summary_lines",
]
