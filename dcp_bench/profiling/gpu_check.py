"""The one-command GPU check (``scripts/gpu_check.sh --out DIR``): under 8 minutes on one GPU, at
most 8 files into DIR, nothing into the repository.

1. ``env.json``: the system (GPU, driver, CUDA, torch, flash-attn or not, git commit).
2. ``kernel.json``: the packed-attention kernel the runtime selected on this device and why
   (`dcp_bench.runtime.attention.select_attention_kernel`), and forward+backward time and TFLOP/s
   of causal packed attention at Llama-3-8B's heads (32 query / 8 KV, head dim 128, bf16) from 4K
   to 128K tokens, for the selected kernel and for fused per-segment SDPA.
3. ``smoke.json``: a CUDA smoke test of the runtime on one rank in bf16: a Llama-3-8B layer (with
   its embedding, full-vocabulary chunked LM loss) and an STDiT3-XL/2 block pair, each trained
   for 3 steps at 4K, 16K and 64K tokens by the real executor (`execute_step` on a 1-rank process
   group, ZeRO stage 0: fp32 master weights, fp32 gradient accumulation). Before each step the
   loss is also evaluated with fused per-segment SDPA (when another kernel was selected) and by
   an fp32 copy of the master weights (the reference); after it, the measured peak memory
   (``torch.cuda.max_memory_allocated``) beside the analytical cost model's prediction for the
   same micro-batch, and the state's bytes beside `dcp_bench.train_policy.static_state_bytes`.
4. ``llama3_8b.json``, ``stdit3_xl2.json``: the calibration profiles
   (`dcp_bench.profiling.gpu_calibrate`), in the time left.
5. ``summary.md``: the numbers above in a few tables (MFU of a Llama-3-8B layer at 32K from the
   calibration, attention TFLOP/s against length, measured against predicted memory) and a
   pass/fail line per check; ``gpu_check.log``: the console output (written by the shell script).

``--device cpu --tiny``: the same code on the CPU test models at small sizes in fp32 (the test
suite's dry run). Exit status 0 when every smoke step was finite and its losses agreed with the
reference, 1 otherwise (the files are written either way).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from dcp_bench.files import atomic_write_json, atomic_write_text

FILES = ("env.json", "kernel.json", "smoke.json", "summary.md", "gpu_check.log")
MAX_FILES = 8
# Loss agreement: bf16 against the fp32 reference, and two bf16 kernels against each other (the
# kernels' own accumulation orders differ); fp32 everywhere on the CPU dry run.
TOL_BF16_VS_FP32 = 2e-2
TOL_KERNELS_BF16 = 1e-2
TOL_FP32 = 1e-5


# ------------------------------------------------------------------------------------------------
# Settings of the full check and of its CPU dry run


@dataclasses.dataclass(frozen=True)
class CheckSizes:
    """What the check runs: models, attention lengths, the smoke steps' samples."""

    llama: str
    stdit: str
    attention_lengths: tuple[int, ...]
    attention_heads: tuple[int, int, int]  # query heads, KV heads, head dim
    text_steps: tuple[tuple[int, ...], ...]  # per step: sample lengths
    video_steps: tuple[tuple[tuple[int, int], ...], ...]  # per step: (frames, patches per frame)
    reps: int


FULL = CheckSizes(
    llama="llama3_8b",
    stdit="stdit3_xl2",
    attention_lengths=(4096, 16384, 32768, 65536, 131072),
    attention_heads=(32, 8, 128),
    text_steps=((2048, 1024, 512, 512), (8192, 4096, 4096), (65536,)),
    video_steps=(((1, 3600),), ((3, 3600), (1, 3600)), ((18, 3600),)),  # 3.6K, 14.4K, 64.8K
    reps=3,
)
TINY = CheckSizes(
    llama="tiny_llama",
    stdit="tiny_stdit",
    attention_lengths=(256, 1024),
    attention_heads=(8, 4, 32),
    text_steps=((128, 64, 32, 32), (256, 128), (512,)),
    video_steps=(((2, 64),), ((3, 64), (1, 64)), ((8, 64),)),
    reps=1,
)


# ------------------------------------------------------------------------------------------------
# Attention kernels


def _timed(fn: Any, device: Any, reps: int) -> float:
    import torch

    times = []
    for rep in range(reps + 1):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize(device)
            elapsed = start.elapsed_time(end) / 1e3
        else:
            t0 = time.perf_counter()
            fn()
            elapsed = time.perf_counter() - t0
        if rep:  # the first run warms up (kernel selection, allocator)
            times.append(elapsed)
    return statistics.median(times)


def _time_kernel(kernel: Any, qkv: tuple[Any, Any, Any], lens: list[int], device: Any, reps: int) -> float:
    """Median forward+backward time of causal packed attention by ``kernel``."""

    def step() -> None:
        for t in qkv:
            t.grad = None
        kernel(*qkv, lens, lens, True).float().square().mean().backward()

    return _timed(step, device, reps)


def attention_report(device: Any, dtype: Any, sizes: CheckSizes) -> dict[str, Any]:
    """The selected kernel and its attention throughput against length (see the module doc)."""
    import torch

    from dcp_bench.runtime.attention import AttentionKernel, select_attention_kernel

    H, KV, D = sizes.attention_heads
    kernel = select_attention_kernel(device, dtype, D)
    kernels = [kernel] if kernel.name == "sdpa" else [kernel, AttentionKernel("sdpa", fused_only=device.type == "cuda")]
    rows = []
    for n in sizes.attention_lengths:
        lens = [n // 4, n // 4, n // 2]  # three packed documents
        g = torch.Generator(device=device).manual_seed(n)
        q, k, v = (torch.randn(n, h, D, generator=g, device=device, dtype=dtype).requires_grad_() for h in (H, KV, KV))
        # causal: QK^T and AV over half the score matrix, 2 FLOPs per MAC; backward 2.5 x forward
        flops = 3.5 * sum(2.0 * m * m * H * D for m in lens)
        for kern in kernels:
            try:
                s = _time_kernel(kern, (q, k, v), lens, device, sizes.reps)
                rows.append({"kernel": kern.name, "tokens": n, "segments": lens, "fwd_bwd_s": s,
                             "tflop_per_s": flops / s / 1e12})
            except Exception as exc:
                rows.append({"kernel": kern.name, "tokens": n, "segments": lens,
                             "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
            if device.type == "cuda":
                torch.cuda.empty_cache()
        del q, k, v
    return {"selected": kernel.describe(), "heads": {"query": H, "kv": KV, "head_dim": D},
            "dtype": str(dtype).replace("torch.", ""), "throughput": rows,
            "flop_convention": "causal: 2 n^2 H D per forward (QK^T + AV on half the scores), backward 2.5x"}


# ------------------------------------------------------------------------------------------------
# Smoke test of the runtime


def _step_plan(n: int) -> Any:
    from dcp_bench.plan import Group, MicroBatch, Round, StepPlan

    return StepPlan(world_size=1, rounds=[Round(groups=[Group(start=0, size=1, micro_batches=[
        MicroBatch(samples=tuple(range(n)), ckpt_layers=0)])])], mode="fair")


def _eval_loss(model: Any, batch: Any, seed: int, kernel: Any) -> float:
    import torch

    from dcp_bench.runtime.attention import SINGLE

    saved = model.attention
    model.set_attention(kernel)
    try:
        with torch.no_grad():
            inputs = model.make_inputs(batch.sample_ids, batch.tokens, batch.frames, SINGLE, seed)
            return float(model.loss_sum(inputs, SINGLE, 0)) / batch.total_tokens
    finally:
        model.set_attention(saved)


def smoke_model(name: str, steps: list[Any], device: Any, pool: Any, cluster: str, seed: int = 0) -> dict[str, Any]:
    """Train a one-layer ``name`` for ``len(steps)`` steps (see the module docstring)."""
    import torch

    from dcp_bench.cost import make_cost_model
    from dcp_bench.cost.params import param_breakdown
    from dcp_bench.cost.specs import model_spec
    from dcp_bench.runtime.attention import AttentionKernel
    from dcp_bench.runtime.executor import execute_step
    from dcp_bench.runtime.models import build_model
    from dcp_bench.runtime.training import FlatState, build_training_state
    from dcp_bench.train_policy import static_state_bytes

    spec = dataclasses.replace(model_spec(name), num_layers=1)
    state = build_training_state(spec, seed, device, lr=1e-4, zero_stage=0)
    assert isinstance(state, FlatState)
    model = state.model
    cuda = device.type == "cuda"
    sdpa = AttentionKernel("sdpa", fused_only=cuda)
    # The reference: the fp32 master weights in an fp32 model, fused SDPA (efficient kernel on
    # CUDA: flash takes no fp32).
    reference = build_model(spec, seed=seed, device=device, dtype=torch.float32)
    reference.set_attention(sdpa)
    cost = make_cost_model(spec, cluster, source="analytical", zero_stage=0, mem_cap_fraction=1.0)
    pb = param_breakdown(spec)
    policy_bytes = static_state_bytes(pb.total, pb.per_layer, 1, 0, state.policy)  # type: ignore[arg-type]
    out: dict[str, Any] = {
        "model": spec.name, "layers": 1, "params": pb.total, "attention": model.attention.describe(),
        "precision": state.describe()["precision"], "zero_stage": 0, "steps": [],
    }
    for i, batch in enumerate(steps):
        with torch.no_grad():
            # the reference's parameters become views of the fp32 master weights (no copy)
            torch.nn.utils.vector_to_parameters(state.master[: state.numel], reference.parameters())
        losses = {"reference_fp32": _eval_loss(reference, batch, seed, sdpa)}
        if model.attention.name != "sdpa":
            losses["sdpa_" + str(state.policy.compute)] = _eval_loss(model, batch, seed, sdpa)  # type: ignore[union-attr]
        res = execute_step(_step_plan(batch.n), batch, state, None, pool, seed=seed, grad_clip=1.0)
        losses["runtime"] = res.loss
        mb = cost.microbatch_cost(batch.tokens, batch.frames, 1, 0)
        static = cost.static_memory_breakdown()  # type: ignore[attr-defined]
        flops = mb.model_flops
        peak_flops = datasheet_peak_flops(torch.cuda.get_device_name(device)) if cuda else float("nan")
        out["steps"].append({
            "step": i, "tokens": int(batch.total_tokens), "samples": batch.tokens.tolist(),
            "frames": batch.frames.tolist(), "losses": losses, "finite": res.finite, "grad_norm": res.grad_norm,
            "busy_s": res.busy_s, "tokens_per_s": batch.total_tokens / res.busy_s if res.busy_s else None,
            "model_tflop_per_s": flops / res.busy_s / 1e12 if res.busy_s else None,
            "mfu": flops / res.busy_s / peak_flops if res.busy_s and cuda else None,
            "memory": {
                "measured_peak_bytes": res.peak_mem_bytes,
                "measure": "torch.cuda.max_memory_allocated" if cuda else "cpu lower bound (static + saved tensors)",
                "predicted_bytes": mb.mem_bytes,
                "predicted_workspace_bytes": static.get("workspace", 0.0),
                "predicted_without_workspace_bytes": mb.mem_bytes - static.get("workspace", 0.0),
                "predicted_static_breakdown": static,
                "state_bytes": state.static_bytes(),
                "policy_state_bytes": policy_bytes,
            },
        })
        print(f"  smoke {spec.name} step {i}: {batch.total_tokens} tokens, losses "
              + ", ".join(f"{k} {v:.5f}" for k, v in losses.items())
              + f", peak {res.peak_mem_bytes / 2**30:.2f} GiB (predicted {mb.mem_bytes / 2**30:.2f} GiB)",
              file=sys.stderr, flush=True)
        if cuda:
            torch.cuda.empty_cache()
    return out


def smoke_verdict(smoke: dict[str, Any], fp32: bool) -> list[str]:
    """Problems found in a smoke result (empty: passed)."""
    problems = []
    for model in smoke["models"]:
        for st in model["steps"]:
            losses = st["losses"]
            where = f"{model['model']} step {st['step']}"
            if not st["finite"] or not all(math.isfinite(v) for v in losses.values()):
                problems.append(f"{where}: non-finite loss or gradient {losses}")
                continue
            ref = losses["reference_fp32"]
            tol = TOL_FP32 if fp32 else TOL_BF16_VS_FP32
            for key, val in losses.items():
                if key == "reference_fp32":
                    continue
                # the runtime's loss is before its update, so it compares with the reference too
                if abs(val - ref) > tol * abs(ref):
                    problems.append(f"{where}: {key} loss {val:.6f} vs fp32 reference {ref:.6f} (tolerance {tol:g})")
            if "runtime" in losses and len(losses) == 3:
                other = next(v for k, v in losses.items() if k.startswith("sdpa_"))
                tol_k = TOL_FP32 if fp32 else TOL_KERNELS_BF16
                if abs(losses["runtime"] - other) > tol_k * abs(other):
                    problems.append(f"{where}: selected kernel {losses['runtime']:.6f} vs SDPA {other:.6f}")
    return problems


def run_smoke(device: Any, sizes: CheckSizes, cluster: str) -> dict[str, Any]:
    """Both models' smoke runs on a one-rank process group."""
    import torch
    import torch.distributed as dist

    from dcp_bench.batch import GlobalBatch
    from dcp_bench.runtime.groups import ProcessGroupPool

    text = [GlobalBatch(step=i, sample_ids=np.arange(100 * i, 100 * i + len(s)), tokens=np.array(s, dtype=np.int64),
                        frames=np.ones(len(s), dtype=np.int64)) for i, s in enumerate(sizes.text_steps)]
    video = [GlobalBatch(step=i, sample_ids=np.arange(100 * i, 100 * i + len(s)),
                         tokens=np.array([f * p for f, p in s], dtype=np.int64),
                         frames=np.array([f for f, _ in s], dtype=np.int64)) for i, s in enumerate(sizes.video_steps)]
    with tempfile.TemporaryDirectory(prefix="dcp-gpu-check-") as tmp:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method=f"file://{tmp}/pg",
                                rank=0, world_size=1)
        try:
            pool = ProcessGroupPool(timeout_s=300)
            models = []
            for name, steps in ((sizes.llama, text), (sizes.stdit, video)):
                try:
                    models.append(smoke_model(name, steps, device, pool, cluster))
                except Exception as exc:  # recorded: the other model and the calibration still run
                    models.append({"model": name, "error": f"{type(exc).__name__}: {str(exc)[:500]}", "steps": []})
                    print(f"  smoke {name}: FAILED {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
                if device.type == "cuda":
                    torch.cuda.empty_cache()
        finally:
            dist.destroy_process_group()
    return {"models": models}


# ------------------------------------------------------------------------------------------------
# Summary


def layer_mfu(artifact: dict[str, Any], tokens: int, peak_flops: float) -> dict[str, Any] | None:
    """Model FLOP/s of one Llama layer at ``tokens`` (single sample) from a calibration artifact:
    3 x the forward FLOPs (GEMMs + causal attention) over forward + backward time."""
    from dcp_bench.cost.specs import ModelSpec

    spec = ModelSpec(**{**artifact["model"], "patch": tuple(artifact["model"]["patch"])})
    for p in artifact["layers"]:
        if p.get("oom") or p["shape"] != "single" or p["tokens_per_rank"] != tokens:
            continue
        h, f, kvd = spec.hidden, spec.ffn_hidden, spec.kv_heads * spec.head_dim
        fwd = 2.0 * tokens * (h * (h + 2 * kvd) + h * h + 3 * h * f) + 2.0 * tokens * tokens * h
        t = p["fwd_s"]["median"] + p["bwd_s"]["median"]
        return {"tokens": tokens, "fwd_bwd_s": t, "model_tflop_per_s": 3 * fwd / t / 1e12,
                "mfu": 3 * fwd / t / peak_flops}
    return None


def datasheet_peak_flops(device_name: str) -> float:
    """Dense bf16 peak of the GPU the device name says (`dcp_bench/conf/gpu`), NaN if unknown."""
    from dcp_bench.cost.specs import gpu_spec

    for key in ("h200", "h100"):
        if key in device_name.lower():
            return float(gpu_spec(key).peak_flops)
    return float("nan")


def summary_markdown(report: dict[str, Any]) -> str:
    lines = ["# dcp-bench GPU check", "", f"{report['device']} ({report['dtype']}), torch {report['torch']}, "
             f"{report['wall_s']:.0f} s. Verdict: **{'PASS' if not report['problems'] else 'FAIL'}**", ""]
    for p in report["problems"]:
        lines.append(f"- problem: {p}")
    k = report.get("kernel")
    if k:
        lines += ["", f"## Attention kernel: `{k['selected']['kernel']}`", ""]
        lines += [f"- {n}" for n in k["selected"]["notes"]]
        lines += ["", "| kernel | tokens | fwd+bwd s | TFLOP/s |", "|---|---|---|---|"]
        for r in k["throughput"]:
            lines.append(f"| {r['kernel']} | {r['tokens']} | {r.get('fwd_bwd_s', float('nan')):.4f} | "
                         f"{r.get('tflop_per_s', float('nan')):.3g} |" if "error" not in r
                         else f"| {r['kernel']} | {r['tokens']} | error | {r['error'][:80]} |")
    smoke = report.get("smoke")
    if smoke:
        lines += ["", "## Smoke test (one rank, one layer, 3 steps)", "",
                  "| model | step | tokens | losses | measured peak GiB | predicted GiB (w/o workspace) | MFU |",
                  "|---|---|---|---|---|---|---|"]
        for m in smoke["models"]:
            if m.get("error"):
                lines.append(f"| {m['model']} | - | - | error: {m['error'][:100]} | | | |")
            for st in m["steps"]:
                mem = st["memory"]
                losses = ", ".join(f"{a} {b:.4f}" for a, b in st["losses"].items())
                mfu = "-" if st["mfu"] is None else f"{st['mfu']:.2f}"
                lines.append(f"| {m['model']} | {st['step']} | {st['tokens']} | {losses} | "
                             f"{mem['measured_peak_bytes'] / 2**30:.2f} | "
                             f"{mem['predicted_without_workspace_bytes'] / 2**30:.2f} | {mfu} |")
    for name, info in report.get("calibration", {}).items():
        lines += ["", f"## Calibration: {name}", "", f"- file: `{info['file']}` (sha256 {info['sha256'][:16]}...)",
                  f"- points measured: {info['points']}, out of memory: {info['oom']}, failed or skipped: {info['failures']}"]
        if info.get("layer_mfu"):
            m = info["layer_mfu"]
            lines.append(f"- one layer at {m['tokens']} tokens: fwd+bwd {m['fwd_bwd_s']:.3f} s, "
                         f"{m['model_tflop_per_s']:.0f} model TFLOP/s, MFU {m['mfu']:.2f}")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder for the check's files (at most 8)")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--tiny", action="store_true", help="the CPU dry run: tiny models, small sizes, fp32")
    parser.add_argument("--budget-s", type=float, default=440.0, help="seconds for the whole check (default 440)")
    parser.add_argument("--no-calibration", action="store_true", help="skip the calibration profiles")
    args = parser.parse_args(argv)
    started = time.time()
    import torch

    from dcp_bench.envinfo import collect_env

    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device; use --device cpu --tiny for the dry run", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    sizes = TINY if args.tiny else FULL
    dtype = torch.float32 if args.tiny or device.type == "cpu" else torch.bfloat16
    # the cluster whose GPU prices the smoke steps' memory (the GPU's capacity plays no part)
    cluster = "cpu" if device.type == "cpu" else "h200x8"
    env = collect_env()
    atomic_write_json(out / "env.json", env)
    report: dict[str, Any] = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                              "dtype": str(dtype).replace("torch.", ""), "torch": torch.__version__,
                              "problems": [], "calibration": {}}

    def write_summary() -> None:
        report["wall_s"] = time.time() - started
        atomic_write_text(out / "summary.md", summary_markdown(report))

    print("gpu_check: attention kernels", file=sys.stderr, flush=True)
    report["kernel"] = attention_report(device, dtype, sizes)
    atomic_write_json(out / "kernel.json", report["kernel"])
    write_summary()
    print("gpu_check: smoke test of the runtime", file=sys.stderr, flush=True)
    smoke = run_smoke(device, sizes, cluster)
    atomic_write_json(out / "smoke.json", smoke)
    report["smoke"] = smoke
    report["problems"] += [f"{m['model']}: {m['error']}" for m in smoke["models"] if m.get("error")]
    report["problems"] += smoke_verdict(smoke, fp32=dtype == torch.float32)
    write_summary()
    if not args.no_calibration:
        from dcp_bench.files import sha256_file
        from dcp_bench.profiling.gpu_calibrate import calibrate

        budget = args.budget_s - (time.time() - started) - 10.0
        cmd = "scripts/gpu_check.sh" + (" --device cpu --tiny" if args.tiny else "")
        try:
            paths = calibrate(out, args.device, args.tiny, sizes.reps, max(budget, 1.0), cmd)
        except Exception as exc:
            report["problems"].append(f"calibration: {type(exc).__name__}: {str(exc)[:300]}")
            paths = []
        for path in paths:
            art = json.loads(path.read_text())
            points = [p for p in art["layers"] if not p.get("oom")]
            info: dict[str, Any] = {"file": path.name, "sha256": sha256_file(path), "points": len(points),
                                    "oom": sum(1 for p in art["layers"] if p.get("oom")),
                                    "failures": len(art.get("failures", []))}
            if art["model"]["arch"] == "llama":
                info["layer_mfu"] = layer_mfu(art, 32768, datasheet_peak_flops(report["device"]))
            report["calibration"][art["model"]["name"]] = info
    write_summary()
    written = sorted(p.name for p in out.iterdir())
    if len(written) > MAX_FILES:
        report["problems"].append(f"{len(written)} files in {out} (at most {MAX_FILES}): {written}")
        write_summary()
    print(f"gpu_check: {'PASS' if not report['problems'] else 'FAIL'} in {time.time() - started:.0f} s; "
          f"files in {out}: {', '.join(written)}", flush=True)
    for p in report["problems"]:
        print(f"gpu_check: problem: {p}", flush=True)
    return 0 if not report["problems"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
