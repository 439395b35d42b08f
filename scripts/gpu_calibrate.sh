#!/usr/bin/env bash
# GPU calibration on one device, time-boxed to 8 minutes: matmul and copy ceilings, then per-layer
# time and memory of a Llama-3-8B layer (1K..64K tokens) and an STDiT3-XL/2 block pair (1K..128K)
# in bf16, written as profile artifacts into the folder --out names (required), each rewritten after
# every point. scripts/gpu_check.sh runs this among its phases.
#   scripts/gpu_calibrate.sh --out DIR                      # on the GPU machine
#   scripts/gpu_calibrate.sh --device cpu --tiny --out DIR  # dry run of the same code on CPU
set -euo pipefail
cd "$(dirname "$0")/.."
PY=python3
if [ -x .venv/bin/python ]; then PY=.venv/bin/python; fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec timeout 480 "$PY" -m tools.gpu_calibrate --budget-s 440 "$@"
