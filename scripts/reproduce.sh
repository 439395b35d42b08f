#!/bin/sh
# `make reproduce` with the CLI's own exit status: GNU make exits 2 for any failing recipe (its
# message "Error N" names the recipe's status), so a caller that tells exit statuses apart (0 done,
# 2 bad input, 4 an incomplete reproduction: dcp_bench/cli.py) runs this instead. Arguments are
# passed to `dcp-bench reproduce` (e.g. `scripts/reproduce.sh budget_s=600`).
set -u
cd "$(dirname "$0")/.." || exit 2
VENV="${VENV:-.venv}"
make -s setup VENV="$VENV" || exit $?
exec "$VENV/bin/dcp-bench" reproduce "$@"
