"""`dcp-bench report`: a campaign's run records -> reports/<campaign>/ (report.md, report.html,
CSV tables, figures, summary.json). The command parses its key=value arguments and calls
`dcp_bench.report.campaign_report.report_campaign`."""

from __future__ import annotations

import argparse
import shlex
import sys

NAME = "report"
HELP = (
    "write reports/<campaign>/report.md + self-contained report.html, CSV tables and figures from "
    "run records: `dcp-bench report campaign=NAME [root=runs] [out=DIR] [claims=PATH] "
    "[baselines=a,b] [baseline_pairs=true]`. It opens with the campaign's methods against its "
    "baselines (or with the claims' verdict when the campaign holds a claim's runs); unreadable "
    "records are skipped and named"
)
KEYS = ("campaign", "root", "out", "claims", "baselines", "baseline_pairs", "n_boot")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("overrides", nargs="*", help=f"key=value, keys: {', '.join(KEYS)}")


def parse_keys(overrides: list[str]) -> dict[str, str]:
    from dcp_bench.errors import ConfigError

    out: dict[str, str] = {}
    for ov in overrides:
        key, sep, value = ov.partition("=")
        if not sep or key not in KEYS:
            raise ConfigError(
                f"bad report argument {ov!r}: expected key=value with key one of {', '.join(KEYS)}"
            )
        out[key] = value
    return out


# Bootstrap resamples: at least one, and few enough to finish (each is a resample of every cell).
N_BOOT_MAX = 1_000_000


def _n_boot(value: str) -> int:
    from dcp_bench.errors import ConfigError

    try:
        n = int(value)
    except ValueError:
        n = 0
    if not 1 <= n <= N_BOOT_MAX:
        raise ConfigError(f"n_boot={value!r}: expected an integer from 1 to {N_BOOT_MAX}")
    return n


def run(args: argparse.Namespace) -> int:
    from dcp_bench.errors import ConfigError

    kv = parse_keys(list(args.overrides))
    campaign = kv.get("campaign", "default")
    pairs = kv.get("baseline_pairs", "false").lower()
    if pairs not in ("true", "false"):
        raise ConfigError(f"baseline_pairs={kv['baseline_pairs']!r}: expected true or false")
    n_boot = _n_boot(kv.get("n_boot", "2000"))
    # pandas and the figures load once the arguments are known good
    from dcp_bench.report.campaign_report import report_campaign

    summary = report_campaign(
        campaign=campaign,
        root=kv.get("root", "runs"),
        out=kv.get("out"),
        claims=kv.get("claims"),
        baselines=kv["baselines"].split(",") if kv.get("baselines") else None,
        baseline_pairs=pairs == "true",
        n_boot=n_boot,
        command="dcp-bench report " + " ".join(shlex.quote(a) for a in sys.argv[2:])
        if len(sys.argv) > 2
        else None,
    )
    for c in summary["claims"]:
        if c["verdict"] == "no data":
            continue
        lo, hi = c["ci95"]
        val = c["reproduced_value"]
        ci = "-" if lo is None else f"[{lo:.2f}, {hi:.2f}]"
        print(
            f"{c['id']}: {c['verdict']} (claimed {c['claimed']}x, measured "
            f"{'-' if val is None else f'{val:.2f}x'}, 95% CI {ci})"
        )
    own = summary["method_vs_baseline"]
    for r in own[:12]:
        value = "-" if r["speedup"] is None or "failed" in r["outcome"] else f"{r['speedup']:.2f}x"
        print(
            f"{r['method']} over {r['baseline']} on {r['workload']} ({r['cluster']}, "
            f"{r['model']}): {value}, {r['outcome']}{'; ' + r['flags'] if r['flags'] else ''}"
        )
    if len(own) > 12:
        print(f"... and {len(own) - 12} more comparisons in the report")
    for bad in summary["skipped_records"]:
        print(f"skipped unreadable record {bad['run_id']}: {bad['why']}", file=sys.stderr)
    print(f"report: {summary['report']['md']} and {summary['report']['html']}")
    return 0
