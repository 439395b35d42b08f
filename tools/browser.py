"""A report as a reviewer sees it: ``report.html`` rendered by headless Chromium.

`measure_page` loads the page at a given window size with a small script appended that, once the
page and its images have loaded, writes the rendered geometry (the verdict's and the forest
plot's position, every image's natural and displayed width, the page's scroll width) into the
DOM as JSON; Chromium's ``--dump-dom`` returns it. `screenshot` writes a PNG of the first screen.
Both run the browser as a subprocess on a copy of the page, so the report is never modified.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from dcp_bench.errors import DcpBenchError

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
PAGE_WIDTH = 1400  # the window a reviewer opens the report in
FIRST_SCREEN = 1000  # px of the page the first screen must answer in

_MEASURE = """
<script>
window.addEventListener('load', function () {
  var sy = window.scrollY, doc = document.documentElement;
  function box(el) {
    if (!el) return null;
    var r = el.getBoundingClientRect();
    return {top: r.top + sy, bottom: r.bottom + sy, left: r.left, right: r.right,
            width: r.width, height: r.height};
  }
  var imgs = Array.prototype.map.call(document.images, function (im) {
    var fig = im.closest('figure');
    return {id: fig ? fig.id : '', natural_width: im.naturalWidth, natural_height: im.naturalHeight,
            complete: im.complete, box: box(im)};
  });
  var wide = Array.prototype.filter.call(document.querySelectorAll('body *'), function (el) {
    var r = el.getBoundingClientRect();
    return r.right > doc.clientWidth + 1 && !el.closest('.scroll');
  }).slice(0, 20).map(function (el) { return el.tagName + (el.id ? '#' + el.id : ''); });
  var out = {client_width: doc.clientWidth, scroll_width: doc.scrollWidth,
             inner_width: window.innerWidth,
             page_height: doc.scrollHeight,
             verdict: box(document.getElementById('answer')),
             forest: box(document.querySelector('#fig-forest_headline img')),
             verdict_text: (document.getElementById('answer') || {}).innerText || '',
             images: imgs, overflowing: wide};
  var pre = document.createElement('pre');
  pre.id = 'dcp-bench-measurements';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>
"""


def find_chromium() -> str | None:
    """The path of a Chromium (or Chrome) on PATH, or ``$CHROMIUM`` when set; None when there is
    none."""
    env = os.environ.get("CHROMIUM")
    if env:
        return shutil.which(env) or (env if Path(env).is_file() else None)
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


def _run(chromium: str, args: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory(prefix="dcp-bench-chromium-") as profile:
        cmd = [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--mute-audio",
            "--no-first-run",
            "--disable-extensions",
            "--disable-dev-shm-usage",
            f"--user-data-dir={profile}",
            *args,
        ]
        try:
            return subprocess.run(
                cmd, capture_output=True, text=True, timeout=timeout_s, check=False
            )
        except subprocess.TimeoutExpired:
            raise DcpBenchError(f"{chromium} did not finish within {timeout_s:g} s") from None


def measure_page(
    page: str | os.PathLike[str],
    width: int = PAGE_WIDTH,
    height: int = FIRST_SCREEN,
    chromium: str | None = None,
    timeout_s: float = 120.0,
) -> dict[str, Any]:
    """The rendered geometry of ``page`` (an HTML file) in a ``width`` x ``height`` window: see the
    module docstring for the fields (positions in CSS px from the top of the page)."""
    browser = chromium or find_chromium()
    if browser is None:
        raise DcpBenchError(
            "no Chromium found (install Debian's `chromium`, or set CHROMIUM=/path/to/chrome)"
        )
    src = Path(page)
    text = src.read_text()
    body_end = text.rfind("</body>")
    probe = text[:body_end] + _MEASURE + text[body_end:] if body_end >= 0 else text + _MEASURE
    with tempfile.TemporaryDirectory(prefix="dcp-bench-page-") as tmp:
        copy = Path(tmp) / src.name
        copy.write_text(probe)
        res = _run(
            browser,
            [
                f"--window-size={width},{height}",
                "--virtual-time-budget=10000",
                "--dump-dom",
                copy.resolve().as_uri(),
            ],
            timeout_s,
        )
    m = re.search(r"<pre id=\"dcp-bench-measurements\">(.*?)</pre>", res.stdout, re.S)
    if m is None:
        raise DcpBenchError(
            f"{browser} returned no measurements of {src.name} (exit {res.returncode}): "
            + (res.stderr.strip().splitlines() or ["no output"])[-1]
        )
    return dict(json.loads(html.unescape(m.group(1))))


def screenshot(
    page: str | os.PathLike[str],
    out: str | os.PathLike[str],
    width: int = PAGE_WIDTH,
    height: int = FIRST_SCREEN,
    chromium: str | None = None,
    timeout_s: float = 120.0,
) -> Path:
    """A PNG of the first ``height`` px of ``page`` rendered ``width`` px wide, written to
    ``out``."""
    browser = chromium or find_chromium()
    if browser is None:
        raise DcpBenchError(
            "no Chromium found (install Debian's `chromium`, or set CHROMIUM=/path/to/chrome)"
        )
    target = Path(out).resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="dcp-bench-shot-") as tmp:
        shot = Path(tmp) / "shot.png"
        res = _run(
            browser,
            [
                f"--window-size={width},{height}",
                "--virtual-time-budget=10000",
                f"--screenshot={shot}",
                Path(page).resolve().as_uri(),
            ],
            timeout_s,
        )
        if not shot.is_file():
            raise DcpBenchError(
                f"{browser} wrote no screenshot of {page} (exit {res.returncode}): "
                + (res.stderr.strip().splitlines() or ["no output"])[-1]
            )
        tmp_target = target.with_name(target.name + ".tmp")
        shutil.copyfile(shot, tmp_target)
        os.replace(
            tmp_target, target
        )  # atomic: an earlier screenshot stays whole until this one is
    return target


def layout_problems(
    m: dict[str, Any], first_screen: int = FIRST_SCREEN, min_shown: float = 0.6
) -> list[str]:
    """What the rendered page (`measure_page`) does wrong, one line each; empty when it meets the
    rules: the verdict and the forest plot inside the first ``first_screen`` px, every image
    displayed at >= ``min_shown`` of its natural width or no wider than the page, every image
    loaded, nothing wider than the window (outside the tables' own scroll boxes)."""
    out = []
    for name in ("verdict", "forest"):
        b = m.get(name)
        if b is None:
            out.append(f"no {name} on the page")
        elif b["bottom"] > first_screen:
            out.append(
                f"the {name} ends at {b['bottom']:.0f} px, below the first {first_screen} px"
            )
    page = float(m["client_width"])
    for im in m["images"]:
        shown = float(im["box"]["width"]) if im.get("box") else 0.0
        nat = float(im["natural_width"])
        if not im["complete"] or nat == 0:
            out.append(f"image {im['id'] or '?'} did not load")
        elif shown < min_shown * nat and nat > page:
            out.append(
                f"image {im['id'] or '?'} is {nat:.0f} px wide, shown at {shown:.0f} px "
                f"({shown / nat:.0%} < {min_shown:.0%}) on a {page:.0f} px page"
            )
    if m["scroll_width"] > m["client_width"]:
        out.append(
            f"the page scrolls sideways: {m['scroll_width']} px of content in a "
            f"{m['client_width']} px window"
            + (f" ({', '.join(m['overflowing'])})" if m.get("overflowing") else "")
        )
    elif m.get("overflowing"):
        out.append("elements reach past the window: " + ", ".join(m["overflowing"]))
    return out
