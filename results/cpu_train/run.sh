#!/usr/bin/env bash
# CPU benchmark of the real runtime (not a test): 4 gloo ranks on one machine, tiny_llama (3.4 M
# parameters, fp32, 1 thread per rank), wikipedia document lengths divided by 4 (global batch
# ~4K tokens per step after scaling, longest sample ~1.3K tokens), memory cap 0.068 x 5 GiB per
# rank (0.34 GiB in the cost model, which counts 0.25 GiB of workspace: the static baselines must
# checkpoint every layer). 8 steps per run (first 2 warm-up), seeds 0..2.
# Run records: results/cpu_train/<method>-s<seed>/ (run.json, steps.jsonl, config.yaml, env.json).
set -euo pipefail
cd "$(dirname "$0")/../.."
methods=${METHODS:-"dcp bucket_static static_tuned"}
seeds=${SEEDS:-"0 1 2"}
for seed in $seeds; do
  for m in $methods; do
    dcp-bench train method="$m" workload=wikipedia workload.length_scale=4 workload.tokens_per_gpu=4096 \
      model=tiny_llama nproc=4 steps=8 warmup_steps=2 seed="$seed" mem_cap_fraction=0.068 \
      root=results campaign=cpu_train run_id="$m-s$seed" --json > "results/cpu_train/$m-s$seed.summary.json"
  done
done
python - <<'PY'
import json, statistics
from pathlib import Path
out = Path("results/cpu_train")
print(f"{'method':14s} {'seeds':>5s} {'median step s':>14s} {'per seed':>24s} {'peak GiB':>9s} {'planner ms':>10s}")
for m in ("dcp", "bucket_static", "static_tuned"):
    runs = [json.loads(p.read_text()) for p in sorted(out.glob(f"{m}-s*.summary.json"))]
    ok = [r for r in runs if r["status"] == "ok"]
    if not ok:
        continue
    per = [r["step_time_s"] for r in ok]
    print(f"{m:14s} {len(ok):5d} {statistics.median(per):14.2f} {' '.join(f'{x:.2f}' for x in per):>24s} "
          f"{max(r['peak_mem_gib'] for r in ok):9.3f} {statistics.median(r['planner_ms'] for r in ok):10.1f}")
PY
