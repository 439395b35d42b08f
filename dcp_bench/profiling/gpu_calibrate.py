"""GPU calibration on one device: matmul and copy ceilings, then per-layer time and memory of a
Llama-3-8B decoder layer and an STDiT3-XL/2 spatial+temporal block pair in bf16 from 1K to 128K
tokens, each written as a profile artifact (``<out>/<model>.json``).

Run through ``scripts/gpu_calibrate.sh`` (time-boxed to 8 minutes). ``--device cpu --tiny`` is a
dry run of the same code on the CPU test models (small sizes, fp32) used by the test suite.
Attention runs the runtime's kernels: PyTorch SDPA (its flash kernel on CUDA in bf16), or
flash-attn's varlen kernel when it is importable.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from dcp_bench.cost.profile_artifact import dumps_artifact
from dcp_bench.cost.specs import model_spec
from dcp_bench.files import atomic_write_text, sha256_file
from dcp_bench.paths import RESULTS_DIR
from dcp_bench.profiling.run import ProfileRequest, run_profile

FULL_TOKENS = [1024 << i for i in range(8)]  # 1K .. 128K
FULL_MODELS = ("llama3_8b", "stdit3_xl2")
TINY_TOKENS = [64, 128, 256]
TINY_MODELS = ("tiny_llama", "tiny_stdit")
# 720p latents with patch 2x2: 90 x 160 / 4 = 3,600 patches per latent frame
VIDEO_SPATIAL = 3600


def requests(device: str, tiny: bool, reps: int) -> list[ProfileRequest]:
    out = []
    for name in TINY_MODELS if tiny else FULL_MODELS:
        spec = model_spec(name)
        out.append(
            ProfileRequest(
                model=spec,
                tokens=TINY_TOKENS if tiny else FULL_TOKENS,
                sp=[1],
                shapes=["single", "packed"],
                nprocs=[1],
                reps=1 if tiny else reps,
                warmup=1,
                device=device,
                dtype="fp32" if tiny else "bf16",
                threads_per_rank=1 if tiny else (os.cpu_count() or 1),
                collectives=False,  # one device: no group to measure
                ceilings=True,
                # fp32 logits of 128K tokens x a 128K vocabulary would not fit beside the model
                outer_max_tokens=1 << 15,
                video_spatial=64 if tiny else VIDEO_SPATIAL,
            )
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--tiny", action="store_true", help="CPU dry run: tiny models, small sizes")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", default=str(RESULTS_DIR / "calibration" / "h200"))
    args = parser.parse_args(argv)
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("gpu_calibrate: no CUDA device; use --device cpu --tiny for a dry run", file=sys.stderr)
            return 2
    started = time.time()
    for req in requests(args.device, args.tiny, args.reps):
        cmd = f"scripts/gpu_calibrate.sh --device {args.device}{' --tiny' if args.tiny else ''}"
        print(f"calibrating {req.model.name} ({req.dtype}, {args.device})", file=sys.stderr, flush=True)
        artifact = run_profile(req, command=cmd)
        path = Path(args.out) / f"{req.model.name}.json"
        atomic_write_text(path, dumps_artifact(artifact))
        ceil = artifact["ceilings"]
        print(
            f"wrote {path} (sha256 {sha256_file(path)}): matmul "
            f"{max(c['flops_per_s'] for c in ceil['matmul']) / 1e12:.1f} TFLOP/s, copy "
            f"{max(c['bytes_per_s'] for c in ceil['copy']) / 1e9:.0f} GB/s, "
            f"{artifact['cost']['wall_s']:.0f} s",
            flush=True,
        )
    print(f"calibration done in {time.time() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
