"""`dcp-bench validate`: the analytical cost model against published H100/H200 measurements.

The command parses its arguments and calls `dcp_bench.cost.validation_report.validate_cost_model`,
which reads the validation set (``results/validation/published.yaml``), prices every row with the
built-in assumptions (before) and with the constants the GPU and cluster configs carry (after),
fits the uncertain constants again on the fit half, and writes ``table.md``, ``table.csv`` and
``summary.json`` beside the set: every row with its source, configuration, published figure,
prediction and ratio, and the median and max |error| on the held-out half. ``--check`` exits 1
when the configs' constants differ from a fresh fit (the calibration is stale). Then the
system-level check (`dcp_bench.campaign.system_validation`): every published end-to-end
measurement of a simulated system (``results/validation/systems.yaml``) simulated and compared,
written to ``systems.md``, ``systems.csv`` and ``systems.json``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

NAME = "validate"
HELP = (
    "check the analytical cost model against published GPU measurements and refit its uncertain "
    "constants on half of them: `dcp-bench validate [--out results/validation] [--check]`"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--published",
        default=None,
        help="the validation set (default results/validation/published.yaml)",
    )
    parser.add_argument(
        "--out",
        default=None,
        help="folder for table.md, table.csv, summary.json (default: beside the set)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit 1 if the configs' constants differ from a fresh fit",
    )
    parser.add_argument("--json", action="store_true", help="print summary.json to stdout")
    parser.add_argument(
        "--no-systems",
        action="store_true",
        help="skip the system-level check (simulating results/validation/systems.yaml, ~30 s)",
    )


def run(args: argparse.Namespace) -> int:
    from dcp_bench.cost.validation_report import abs_pct, validate_cost_model
    from dcp_bench.files import check_output

    if args.out:  # before the fit: a place that cannot take the tables is refused first
        check_output(args.out, "--out")
        for name in ("table.md", "table.csv", "summary.json"):
            check_output(Path(args.out) / name, "--out", value=args.out, folder=False)

    result = validate_cost_model(
        Path(args.published) if args.published else None, Path(args.out) if args.out else None
    )
    summ, mismatches, out = result.summary, result.mismatches, result.out
    if args.json:
        print(json.dumps(result.doc, indent=1, sort_keys=True, default=str))
    else:
        h_b, h_a = summ["before"]["holdout"], summ["after"]["holdout"]
        print(
            f"{summ['rows']['total']} rows ({summ['rows']['fit']} fit, {summ['rows']['holdout']} "
            f"held out, {summ['rows']['reference']} reference); held-out median |error| "
            f"{abs_pct(h_b['median_abs_error'])} -> {abs_pct(h_a['median_abs_error'])}, max "
            f"{abs_pct(h_b['max_abs_error'])} -> {abs_pct(h_a['max_abs_error'])}"
        )
        print(
            "configs carry the fit"
            if not mismatches
            else "configs differ from the fit: " + "; ".join(mismatches)
        )
        print(f"wrote {out / 'table.md'}, {out / 'table.csv'}, {out / 'summary.json'}")
    if not args.no_systems:
        from dcp_bench.campaign.system_validation import validate_systems

        systems, sys_out = validate_systems(out=Path(args.out) if args.out else None)
        for v in systems:
            if not args.json:
                print(system_lines(v))
        if not args.json:
            print(
                f"wrote {sys_out / 'systems.md'}, {sys_out / 'systems.csv'}, "
                f"{sys_out / 'systems.json'}"
            )
    return 1 if args.check and mismatches else 0


def system_lines(v: Any) -> str:
    """One system's table as the terminal shows it: published vs simulated, absolute and as
    speedups, and the error on the claimed comparison."""
    s = v.system
    out = [f"system {s.id} ({s.hardware}; {s.unit}; simulated, analytical model):"]
    out.append(
        f"  {'row':<16} {'published':>9} {'simulated':>9} {'err':>6}   speedup pub/sim   err"
    )
    for r in v.rows:
        sim = "-" if r["simulated"] is None else f"{r['simulated']:.2f}"
        err = "-" if r["error"] is None else f"{r['error']:+.0%}"
        ssp = "-" if r["simulated_speedup"] is None else f"{r['simulated_speedup']:.2f}"
        serr = "-" if r["speedup_error"] is None else f"{r['speedup_error']:+.0%}"
        out.append(
            f"  {r['id']:<16} {r['published']:>9.2f} {sim:>9} {err:>6}   "
            f"{r['published_speedup']:.2f} / {ssp:<6}  {serr}"
        )
    cm = s.claimed_comparison
    out.append(
        f"  claimed comparison {cm['method']} over {cm['baseline']}: published "
        f"{v.claimed_published:.2f}x, simulated {v.claimed_simulated:.2f}x, error "
        f"{v.claimed_error:+.0%} (claim {s.claim})"
    )
    return "\n".join(out)
