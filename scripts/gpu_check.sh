#!/usr/bin/env bash
# The one-command GPU check: one 10-minute command on one GPU (570 s limit, phases with their own
# deadlines), at most 8 files into DIR, nothing into the repository
# (tools/gpu_check.py says what each file holds):
#   check.json llama3_8b.json stdit3_xl2.json stdit_buckets.json h200_constants.yaml claim.tar.gz
#   summary.md gpu_check.log
#
#   scripts/gpu_check.sh --out DIR [--commit SHA]        # on a GPU node (--commit: a tree without .git)
#   scripts/gpu_check.sh --device cpu --tiny --out DIR   # the CPU dry run (test suite)
#
# The interpreter: $PYTHON when set, else the first of python3 on the PATH and the repository's
# .venv that imports torch and every package the check needs (else the first that imports torch,
# with what it lacks and the command that installs it). It is named in the log and in check.json.
# Needs Python >= 3.10 with torch >= 2.4 (CUDA build on the GPU node), numpy, pyyaml, omegaconf,
# antlr4-python3-runtime; the claim phase also hydra-core, pandas, pyarrow, seaborn, matplotlib,
# tqdm, highspy. No network: carry the offline kit (`make kit`, docs/profiling.md "Offline kit").
# The repository is used in place (PYTHONPATH), not installed.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
OUT=""
prev=""
for arg in "$@"; do
  if [ "$prev" = "--out" ]; then OUT="$arg"; fi
  prev="$arg"
done
if [ -z "$OUT" ]; then
  echo "usage: scripts/gpu_check.sh --out DIR [--device cpu --tiny] [--commit SHA]" >&2
  exit 2
fi
mkdir -p "$OUT"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
# What each candidate lacks: "" = nothing, "torch" = no torch (unusable), else the missing packages.
missing_of() {
  "$1" - 2>/dev/null <<'PYCHECK' || echo "torch"
import importlib.util
need = {"torch": "torch", "numpy": "numpy", "yaml": "pyyaml", "omegaconf": "omegaconf",
        "antlr4": "antlr4-python3-runtime", "hydra": "hydra-core", "pandas": "pandas", "pyarrow": "pyarrow",
        "seaborn": "seaborn", "matplotlib": "matplotlib", "tqdm": "tqdm", "highspy": "highspy"}
miss = [pkg for mod, pkg in need.items() if importlib.util.find_spec(mod) is None]
print("torch" if "torch" in miss else " ".join(miss))
PYCHECK
}
PY=""
LACKS=""
if [ -n "${PYTHON:-}" ]; then
  PY="$PYTHON"
  LACKS="$(missing_of "$PY")"
else
  for cand in python3 "$REPO/.venv/bin/python"; do
    command -v "$cand" >/dev/null 2>&1 || continue
    lacks="$(missing_of "$cand")"
    if [ "$lacks" = "torch" ]; then continue; fi
    if [ -z "$PY" ] || { [ -n "$LACKS" ] && [ -z "$lacks" ]; }; then PY="$cand"; LACKS="$lacks"; fi
    if [ -z "$LACKS" ]; then break; fi
  done
fi
if [ -z "$PY" ] || [ "$LACKS" = "torch" ]; then
  echo "gpu_check: no Python with torch found (tried: ${PYTHON:-python3 $REPO/.venv/bin/python}); set PYTHON=/path/to/python" >&2
  exit 2
fi
echo "gpu_check: interpreter $(command -v "$PY" || echo "$PY") ($("$PY" -c 'import sys, torch; print(f"Python {sys.version.split()[0]}, torch {torch.__version__}")'))" | tee "$OUT/gpu_check.log"
if [ -n "$LACKS" ]; then
  echo "gpu_check: missing Python packages: $LACKS" | tee -a "$OUT/gpu_check.log"
  echo "gpu_check: fix (offline, with the kit carried beside the repository; docs/profiling.md, Offline kit):" | tee -a "$OUT/gpu_check.log"
  echo "  $PY -m pip install --no-index --find-links KIT_DIR $LACKS" | tee -a "$OUT/gpu_check.log"
  case " $LACKS " in
    *" numpy "*|*" pyyaml "*|*" omegaconf "*|*" antlr4-python3-runtime "*)
      echo "gpu_check: the check cannot run without numpy, pyyaml, omegaconf and antlr4-python3-runtime" | tee -a "$OUT/gpu_check.log"
      exit 2 ;;
  esac
  echo "gpu_check: going on; the phases that need them record why they did not run" | tee -a "$OUT/gpu_check.log"
fi
if [ ! -e "$REPO/.git" ] && [ -z "${DCP_BENCH_COMMIT:-}" ] && [[ " $* " != *" --commit "* ]]; then
  echo "gpu_check: note: $REPO has no .git and no --commit was given: the commit is recorded as unknown" | tee -a "$OUT/gpu_check.log"
fi
set +e
timeout 570 "$PY" -m tools.gpu_check "$@" 2>&1 | tee -a "$OUT/gpu_check.log"
status=${PIPESTATUS[0]}
set -e
if [ "$status" = 124 ]; then echo "gpu_check: stopped at the 570 s limit; every finished measurement is in $OUT" | tee -a "$OUT/gpu_check.log"; fi
exit "$status"
