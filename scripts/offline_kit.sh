#!/usr/bin/env bash
# The offline kit: builds, here (with network), the folder of wheels a GPU node without network needs
# beside its own image (Python 3.12, x86-64, torch preinstalled): this project as a wheel, and the
# runtime dependencies such an image lacks, for Python 3.12.
#
#   scripts/offline_kit.sh KIT_DIR                 # or: make kit KIT=KIT_DIR
#   scripts/offline_kit.sh --project-only KIT_DIR  # the project's wheel alone (no network needed)
#   scripts/offline_kit.sh --print KIT_DIR         # print the commands, run nothing
# On the node (no network):
#   python3 -m pip install --no-index --find-links KIT_DIR --no-deps KIT_DIR/*.whl
# scripts/gpu_check.sh names what is missing there and prints this command.
#
# The packages: dcp-bench's runtime dependencies (pyproject.toml) minus what the GPU image already
# holds (numpy, pandas, pyarrow, seaborn, matplotlib, tqdm, pyyaml, torch): hydra-core, omegaconf,
# antlr4-python3-runtime (4.9.3, the version omegaconf 2.3 pins, is published as a source archive
# only: it is built into a pure-Python wheel here) and highspy (a binary wheel for CPython 3.12).
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PYTHON:-python3}"
MODE=all
RUN=1
while [ $# -gt 1 ]; do
  case "$1" in
    --project-only) MODE=project ;;
    --print) RUN=0 ;;
    *) echo "offline_kit: unknown option $1; expected --project-only or --print" >&2; exit 2 ;;
  esac
  shift
done
if [ $# -ne 1 ]; then
  echo "usage: scripts/offline_kit.sh [--project-only] [--print] KIT_DIR" >&2
  exit 2
fi
KIT="$1"
PURE="hydra-core==1.3.8 omegaconf==2.3.1"  # the versions the test suite runs with
SOURCE_ONLY="antlr4-python3-runtime==4.9.3"
BINARY="highspy==1.16.0"
PLATFORMS="--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
cmds=("$PY -m pip wheel --no-deps --no-build-isolation --no-index -w $KIT $REPO")
if [ "$MODE" = all ]; then
  cmds+=("$PY -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation py -d $KIT $PURE")
  cmds+=("$PY -m pip wheel --no-deps -w $KIT $SOURCE_ONLY")
  cmds+=("$PY -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $PLATFORMS -d $KIT $BINARY")
fi
if [ "$RUN" = 0 ]; then
  printf '%s\n' "${cmds[@]}"
  exit 0
fi
mkdir -p "$KIT"
for c in "${cmds[@]}"; do
  echo "+ $c"
  $c
done
( cd "$KIT" && ls -1 *.whl > MANIFEST.txt )
echo "offline_kit: $(wc -l < "$KIT/MANIFEST.txt") wheels in $KIT (MANIFEST.txt); on the node:"
echo "  python3 -m pip install --no-index --find-links $KIT --no-deps $KIT/*.whl"
