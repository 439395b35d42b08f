#!/usr/bin/env python
"""Screenshots of a report's first screen as a reviewer opens it (headless Chromium, 1400 px wide,
the first 1,000 px), written beside the report, and the layout check of the rendered page.

    python scripts/report_screenshots.py                      # reports/reproduce/first_screen.png
    python scripts/report_screenshots.py reports/mine --full  # also full_page.png (the whole page)

``make report-screenshots`` runs the first form. It exits 1 when the rendered page breaks a layout
rule (the verdict or the forest plot below the first 1,000 px, an image shrunk below 60% of its
natural width while wider than the page, sideways overflow) and names each break; exit 2 when the
report or a browser is missing. Chromium: Debian's ``chromium`` package, or ``CHROMIUM=/path``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dcp_bench.errors import DcpBenchError
from dcp_bench.paths import REPORTS_DIR

# tools/ runs from the repository (it is not installed with the package)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tools.browser import (  # noqa: E402
    FIRST_SCREEN,
    PAGE_WIDTH,
    find_chromium,
    layout_problems,
    measure_page,
    screenshot,
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "report_dirs",
        nargs="*",
        default=[str(REPORTS_DIR / "reproduce")],
        help="folders holding report.html (default: reports/reproduce)",
    )
    ap.add_argument(
        "--full", action="store_true", help="also a screenshot of the whole page (full_page.png)"
    )
    args = ap.parse_args(argv)
    if find_chromium() is None:
        print(
            "error: no Chromium found (Debian: apt-get install chromium; or set "
            "CHROMIUM=/path/to/chrome)",
            file=sys.stderr,
        )
        return 2
    bad = 0
    for folder in map(Path, args.report_dirs):
        page = folder / "report.html"
        if not page.is_file():
            print(
                f"error: {page} not found (expected a report folder holding report.html)",
                file=sys.stderr,
            )
            return 2
        try:
            shot = screenshot(page, folder / "first_screen.png", PAGE_WIDTH, FIRST_SCREEN)
            m = measure_page(page)
            print(f"{shot}: first {FIRST_SCREEN} px at {PAGE_WIDTH} px wide")
            if args.full:
                height = int(max(FIRST_SCREEN, m["page_height"]))
                print(
                    f"{screenshot(page, folder / 'full_page.png', PAGE_WIDTH, height)}: the whole "
                    f"page ({height} px)"
                )
        except DcpBenchError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        problems = layout_problems(m)
        for p in problems:
            print(f"{page}: {p}", file=sys.stderr)
        if not problems:
            print(
                f"{page}: verdict at {m['verdict']['top']:.0f}-{m['verdict']['bottom']:.0f} px, "
                f"forest plot at {m['forest']['top']:.0f}-{m['forest']['bottom']:.0f} px, "
                f"{len(m['images'])} images fit, no overflow"
            )
        bad += bool(problems)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
