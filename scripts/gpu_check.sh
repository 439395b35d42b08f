#!/usr/bin/env bash
# The one-command GPU check: under 8 minutes on one GPU, at most 8 files into DIR, nothing into
# the repository (dcp_bench/profiling/gpu_check.py says what each file holds):
#   env.json kernel.json smoke.json llama3_8b.json stdit3_xl2.json summary.md gpu_check.log
#
#   scripts/gpu_check.sh --out DIR                       # on a GPU node
#   scripts/gpu_check.sh --device cpu --tiny --out DIR   # the CPU dry run (test suite)
#
# Needs Python >= 3.10 with torch >= 2.4 (CUDA build on the GPU node; 2.11+ tested against the
# public API), and numpy, pyyaml, omegaconf (+ antlr4-python3-runtime). flash-attn is optional
# (without it the runtime uses torch's own varlen flash kernel or fused SDPA). No network: on an
# air-gapped node install the pure-Python packages from wheels carried beside the repository
# (docs/profiling.md, "GPU check"). The repository is used in place (PYTHONPATH), not installed.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
OUT=""
prev=""
for arg in "$@"; do
  if [ "$prev" = "--out" ]; then OUT="$arg"; fi
  prev="$arg"
done
if [ -z "$OUT" ]; then
  echo "usage: scripts/gpu_check.sh --out DIR [--device cpu --tiny]" >&2
  exit 2
fi
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
if [ -z "${PYTHON:-}" ] && [ -x "$REPO/.venv/bin/python" ]; then PY="$REPO/.venv/bin/python"; fi
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
"$PY" - <<'PYCHECK'
import importlib.util, sys
missing = [m for m in ("torch", "numpy", "yaml", "omegaconf") if importlib.util.find_spec(m) is None]
if missing:
    names = {"yaml": "pyyaml", "omegaconf": "omegaconf antlr4-python3-runtime"}
    pkgs = " ".join(names.get(m, m) for m in missing)
    sys.exit(f"gpu_check: missing Python packages: {', '.join(missing)}; install them offline with "
             f"`pip install --no-index --find-links WHEELS_DIR {pkgs}` (docs/profiling.md, GPU check)")
PYCHECK
set +e
timeout 470 "$PY" -m dcp_bench.profiling.gpu_check "$@" 2>&1 | tee "$OUT/gpu_check.log"
status=${PIPESTATUS[0]}
set -e
if [ "$status" = 124 ]; then echo "gpu_check: stopped at the 470 s limit; the files written so far are in $OUT" | tee -a "$OUT/gpu_check.log"; fi
exit "$status"
