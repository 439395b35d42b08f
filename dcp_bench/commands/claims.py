"""`dcp-bench claims`: list the claims a claims list (or one claim file) holds, as
`dcp_bench.report.claim_spec.load_claim_set` reads them (docs/claims.md).

    dcp-bench claims [claims=results/reference/claims.yaml] [--json]

Without ``claims=`` it lists the reproduction's claims list and then every other claim file in
``results/claims/`` (each says what judges it: `dcp-bench reproduce` for the list's claims,
`dcp-bench reproduce claim=NAME` for a claim a packaged reproduce config names).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

NAME = "claims"
HELP = (
    "list the claims dcp-bench judges (id, name, statement, claimed value, tolerance, source): "
    "`dcp-bench claims [claims=PATH] [--json]`; a claim file that does not load is refused, "
    "naming the bad key"
)
KEYS = ("claims",)
DEFAULT = "results/reference/claims.yaml"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("overrides", nargs="*", help=f"key=value, keys: {', '.join(KEYS)}")
    parser.add_argument("--json", action="store_true", help="print JSON")


def run(args: argparse.Namespace) -> int:
    from dcp_bench.campaign.reproduce_config import REPO_ROOT, claim_presets, find_claims
    from dcp_bench.errors import ConfigError
    from dcp_bench.report.claim_spec import load_claim_file, load_claim_set
    from dcp_bench.report.claims import tolerance_band

    given, explicit = DEFAULT, False
    for ov in args.overrides:
        key, sep, value = ov.partition("=")
        if not sep or key not in KEYS:
            raise ConfigError(
                f"bad claims argument {ov!r}: expected key=value with key one of {', '.join(KEYS)}"
            )
        given, explicit = value, True
    claim_set = load_claim_set(find_claims(given))
    listed = [(c, "dcp-bench reproduce") for c in claim_set.claims]
    if not explicit:
        seen = {c.id for c in claim_set.claims}
        presets = claim_presets()
        for f in sorted((REPO_ROOT / "results" / "claims").glob("*.yaml")):
            other = load_claim_file(f)
            if other.id not in seen:
                other = dataclasses.replace(other, path=str(f.relative_to(REPO_ROOT)))
                listed.append(
                    (
                        other,
                        f"dcp-bench reproduce claim={other.name}"
                        if other.name in presets
                        else f"not in {DEFAULT}: see the file's notes",
                    )
                )
    rows: list[dict[str, Any]] = []
    for c, judged_by in listed:
        lo, hi = tolerance_band(c.value, c.tolerance)
        rows.append(
            {
                "id": c.id,
                "name": c.name,
                "statement": c.statement,
                "claimed": c.value,
                "tolerance": c.tolerance,
                "band": [lo, hi],
                "source": c.source.text(),
                "file": c.path or claim_set.path,
                "judged_by": judged_by,
            }
        )
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for r in rows:
        lo, hi = r["band"]
        print(
            f"{r['id']} ({r['name']}): claimed {r['claimed']:g}x, tolerance {r['tolerance']:.0%} "
            f"(band [{lo:.2f}, {hi:.2f}])\n  {r['statement']}\n  source: {r['source']}\n"
            f"  file: {r['file']}\n  judged by: {r['judged_by']}"
        )
    return 0
