#!/usr/bin/env python
"""The held-out-style peer table: four text corpora at 24 and 96 GPUs (h200x8@24, h200x8@96),
Llama-3-8B, every method at its defaults: step time over the lower bound and failures, one seed,
one warm-up and one measured step per cell (simulated, analytical cost model). With
``--before CSV`` (the same table from an earlier commit) it prints both side by side.

    python scripts/heldout_table.py                        # sweep + table (runs/heldout)
    python scripts/heldout_table.py --no-run --before before.csv

The "before" table of a commit is this script's sweep run there through scripts/peer_table.py
(which this script drives), e.g. for main at 8e87985:

    git worktree add /tmp/base 8e87985 && cd /tmp/base && PYTHONPATH=. python \\
        scripts/peer_table.py --workloads prolong wikipedia debian_docs sharegpt \\
        --clusters h200x8@24 h200x8@96 --steps 1 --warmup 1 --campaign before --csv before.csv
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd

sys.path.insert(0, __file__.rsplit("/", 1)[0])  # scripts/ (peer_table)

import peer_table  # noqa: E402

WORKLOADS = ["prolong", "wikipedia", "debian_docs", "sharegpt"]
CLUSTERS = ["h200x8@24", "h200x8@96"]
EXTRA_METHODS = ["megatron_hybrid_cp_tuned", "megatron_hybrid_cp_full", "wlb_llm_no_delay"]


def cell(row: pd.Series) -> str:
    """``ratio`` or ``ratio (k failed)`` or ``failed: infeasible`` for one method's cell."""
    fails = {k: int(row.get(k, 0) or 0) for k in ("oom", "infeasible", "timeout", "error")}
    failed = ", ".join(f"{v} {k}" for k, v in fails.items() if v)
    ratio = row.get("step_over_bound")
    if ratio is None or pd.isna(ratio):
        return f"failed: {failed}" if failed else "-"
    return f"{ratio:.3f}" + (f" ({failed})" if failed else "")


def side_by_side(after: pd.DataFrame, before: pd.DataFrame | None) -> str:
    """Markdown: one row per workload and GPU count, one column per method, ``before -> after``
    where a before table is given."""
    methods = list(dict.fromkeys(after["method"]))
    if before is not None:
        methods += [m for m in dict.fromkeys(before["method"]) if m not in methods]
    key = ["workload", "world_size"]
    out = ["| workload | GPUs | " + " | ".join(methods) + " |"]
    out.append("|---|---|" + "---|" * len(methods))
    for (w, n), df in after.groupby(key, sort=True):
        cells = []
        for m in methods:
            a = df[df["method"] == m]
            now = cell(a.iloc[0]) if len(a) else "-"
            if before is not None:
                b = before[(before["workload"] == w) & (before["world_size"] == n)]
                b = b[b["method"] == m]
                was = cell(b.iloc[0]) if len(b) else "-"
                now = f"{was} → {now}"
            cells.append(now)
        out.append(f"| {w} | {n} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--workloads", nargs="+", default=WORKLOADS)
    ap.add_argument("--clusters", nargs="+", default=CLUSTERS)
    ap.add_argument("--methods", nargs="+", default=None, help="default: every peer-table method")
    ap.add_argument("--campaign", default="heldout")
    ap.add_argument("--root", default="runs")
    ap.add_argument("--csv", default="heldout.csv")
    ap.add_argument("--before", default=None, help="the same table's CSV from another commit")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--no-run", action="store_true")
    args = ap.parse_args(argv)
    methods = args.methods or [*peer_table.METHODS, *EXTRA_METHODS]
    peer_argv = [
        "--workloads", *args.workloads,
        "--clusters", *args.clusters,
        "--methods", *methods,
        "--steps", "1", "--warmup", "1", "--timeout", "600",
        "--campaign", args.campaign, "--root", args.root, "--csv", args.csv,
        "--jobs", str(args.jobs),
    ]  # fmt: skip
    if args.no_run:
        peer_argv.append("--no-run")
    peer_table.main(peer_argv)
    after = pd.read_csv(args.csv)
    before = pd.read_csv(args.before) if args.before else None
    print("\n## Step time / lower bound" + (" (before → after)" if before is not None else ""))
    print(side_by_side(after, before))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
