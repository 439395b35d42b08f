"""How well a profile predicts sizes it was not fitted on.

For every (nproc, SP degree) table of an artifact, the per-layer time law is fitted on the grid
points whose tokens-per-rank are *not* held out, and each held-out point's forward + backward
time is predicted and compared with its measured median. ``python -m
dcp_bench.profiling.holdout PROFILE.json`` prints the table for leave-one-size-out
cross-validation over the interior sizes; ``... PROFILE.json 256 512`` holds those sizes out
together.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import numpy as np

from dcp_bench.cost.profile_artifact import load_artifact
from dcp_bench.cost.profile_fit import layer_features
from dcp_bench.cost.profiled import fit_layer_tables


def interior_tokens(artifact: dict[str, Any]) -> list[int]:
    """The grid's tokens-per-rank values other than the smallest and the largest (held out by
    default: interpolation is what the planners ask of a profile)."""
    grid = sorted(set(int(t) for t in artifact["settings"]["grid"]["tokens_per_rank"]))
    return grid[1:-1]


def holdout_errors(artifact: dict[str, Any], held_out: list[int]) -> list[dict[str, Any]]:
    """One row per held-out point: measured and predicted fwd+bwd seconds, relative error."""
    rows = []
    points = [p for p in artifact["layers"] if not p.get("oom")]
    tables = sorted({(int(p["nproc"]), int(p["sp"])) for p in points})
    for nproc, sp in tables:
        mine = [p for p in points if int(p["nproc"]) == nproc and int(p["sp"]) == sp]
        # grid points are named by their target tokens per rank (padding may add a few rows)
        target = {id(p): int(p["tokens_per_rank"]) // 1 for p in mine}
        train = [p for p in mine if not any(_near(target[id(p)], h, sp) for h in held_out)]
        test = [p for p in mine if any(_near(target[id(p)], h, sp) for h in held_out)]
        if not test or len(train) < 3:
            continue
        tab = fit_layer_tables(train)
        for p in test:
            x = layer_features(
                np.array([p["tokens_per_rank"]]),
                np.array([p["pairs_per_rank"]]),
                np.array([float(p.get("n_samples", 1))]),
            )
            pred = float(tab.time["fwd"].predict(x)[0] + tab.time["bwd"].predict(x)[0])
            meas = float(p["fwd_s"]["median"] + p["bwd_s"]["median"])
            rows.append(
                {
                    "nproc": nproc,
                    "sp": sp,
                    "shape": p["shape"],
                    "n_samples": int(p.get("n_samples", 1)),
                    "tokens_per_rank": int(p["tokens_per_rank"]),
                    "measured_s": meas,
                    "predicted_s": pred,
                    "rel_err": abs(pred - meas) / meas,
                }
            )
    return rows


def leave_one_size_out(artifact: dict[str, Any]) -> list[dict[str, Any]]:
    """Cross-validation over sizes: each interior grid size in turn is held out, the law fitted on
    all other sizes, and the held-out points predicted."""
    rows: list[dict[str, Any]] = []
    for size in interior_tokens(artifact):
        rows += holdout_errors(artifact, [size])
    return rows


def _near(tokens_per_rank: int, target: int, sp: int) -> bool:
    # Ulysses pads each sample to a multiple of the SP degree: at most sp-1 rows per sample
    return target <= tokens_per_rank < target + 4 * sp


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print("usage: python -m dcp_bench.profiling.holdout PROFILE.json [TOKENS_PER_RANK ...]")
        return 2
    art = load_artifact(args[0])
    held = [int(a) for a in args[1:]]
    # default: leave one interior size out at a time; with sizes given, hold them all out at once
    rows = holdout_errors(art, held) if held else leave_one_size_out(art)
    for r in rows:
        print(
            f"nproc {r['nproc']} sp {r['sp']} {r['shape']:6s} x{r['n_samples']:<3d} "
            f"{r['tokens_per_rank']:6d} tok/rank: measured {r['measured_s'] * 1e3:8.1f} ms  "
            f"predicted {r['predicted_s'] * 1e3:8.1f} ms  error {100 * r['rel_err']:5.1f}%"
        )
    errs = [r["rel_err"] for r in rows]
    if errs:
        print(
            json.dumps(
                {
                    "held_out_tokens": held or "each interior size in turn",
                    "points": len(errs),
                    "median_rel_err": float(np.median(errs)),
                    "max_rel_err": float(max(errs)),
                }
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
