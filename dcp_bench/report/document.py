"""A report as a list of blocks, rendered twice: Markdown (figures as PNG files beside it) and a
self-contained HTML page (figures embedded as base64 PNGs, no external resources).

Layout rules both renderings share: a table longer than `LONG_TABLE_ROWS` rows moves to the
appendix at the end (the text keeps a one-line link to it; in the HTML each appendix table is a
collapsible ``<details>`` that opens when linked to), every table sits in a box that scrolls
sideways rather than widening the page, headings and figures carry anchors (``#verdict``,
``#fig-<name>``), and images never display wider than the page."""

from __future__ import annotations

import base64
import html
import math
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from dcp_bench.files import atomic_write_bytes, atomic_write_text

LONG_TABLE_ROWS = 15  # longer tables go to the appendix


@dataclass
class Block:
    kind: str  # "h2" | "h3" | "p" | "callout" | "list" | "table" | "figure" | "code" | "tableref"
    content: Any
    caption: str = ""
    name: str = ""  # figure file name, or a table's / callout's anchor


def fmt(x: Any, digits: int = 3) -> str:
    """Numbers in tables: failures (inf) and missing values spelled out."""
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, (int,)) and not isinstance(x, bool):
        return str(x)
    if isinstance(x, float):
        if math.isnan(x):
            return "-"
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
        return f"{x:.{digits + 1}g}"
    return str(x)


@dataclass
class Document:
    title: str
    blocks: list[Block] = field(default_factory=list)
    appendix: list[Block] = field(
        default_factory=list
    )  # long tables, rendered after everything else

    def h2(self, text: str) -> None:
        self.blocks.append(Block("h2", text))

    def h3(self, text: str) -> None:
        self.blocks.append(Block("h3", text))

    def p(self, text: str) -> None:
        self.blocks.append(Block("p", text))

    def callout(self, text: str, anchor: str) -> None:
        """A boxed paragraph (the verdict) with an anchor: a blockquote in Markdown."""
        self.blocks.append(Block("callout", text, name=anchor))

    def bullets(self, items: list[str]) -> None:
        if items:
            self.blocks.append(Block("list", list(items)))

    def code(self, text: str) -> None:
        self.blocks.append(Block("code", text))

    def table(
        self,
        df: pd.DataFrame,
        caption: str = "",
        columns: list[str] | None = None,
        appendix: bool | None = None,
    ) -> None:
        """A table in place, or (``appendix``; by default when it has more than `LONG_TABLE_ROWS`
        rows) in the appendix with a link left in its place."""
        if df is None or df.empty:
            self.p(f"*{caption or 'table'}: no data.*")
            return
        cols = [c for c in (columns or list(df.columns)) if c in df.columns]
        block = Block("table", df[cols].copy(), caption=caption)
        if appendix if appendix is not None else len(df) > LONG_TABLE_ROWS:
            block.name = f"table-a{len(self.appendix) + 1}"
            self.appendix.append(block)
            self.blocks.append(Block("tableref", block))
        else:
            self.blocks.append(block)

    def figure(self, png: bytes | None, name: str, caption: str) -> None:
        if png is None:
            self.p(f"*Figure {name}: not enough data to draw it ({caption}).*")
            return
        self.blocks.append(Block("figure", png, caption=caption, name=name))

    # -- rendering ----------------------------------------------------------------------------

    def to_markdown(self, figure_dir: str = "figures") -> str:
        out = [f"# {self.title}", ""]
        blocks = [
            *self.blocks,
            *([Block("h2", APPENDIX_TITLE)] + self.appendix if self.appendix else []),
        ]
        for b in blocks:
            if b.kind in ("h2", "h3"):
                out += ["#" * int(b.kind[1]) + " " + b.content, ""]
            elif b.kind == "p":
                out += [b.content, ""]
            elif b.kind == "callout":
                out += [
                    f'<a id="{b.name}"></a>',
                    "",
                    *[f"> {line}" for line in str(b.content).splitlines()],
                    "",
                ]
            elif b.kind == "tableref":
                out += [_table_ref(b.content, f"#{b.content.name}"), ""]
            elif b.kind == "list":
                out += [f"- {x}" for x in b.content] + [""]
            elif b.kind == "code":
                out += ["```", b.content, "```", ""]
            elif b.kind == "table":
                df: pd.DataFrame = b.content
                if b.name:
                    out += [f'<a id="{b.name}"></a>', ""]
                if b.caption:
                    out += [f"**{b.caption}**", ""]
                out.append("| " + " | ".join(str(c) for c in df.columns) + " |")
                out.append("|" + "|".join("---" for _ in df.columns) + "|")
                for _, row in df.iterrows():
                    out.append("| " + " | ".join(fmt(v).replace("|", "/") for v in row) + " |")
                out.append("")
            elif b.kind == "figure":
                out += [f"![{b.caption}]({figure_dir}/{b.name}.png)", "", f"*{b.caption}*", ""]
        return "\n".join(out)

    def to_html(self) -> str:
        parts = [
            "<!DOCTYPE html><html><head><meta charset='utf-8'>",
            "<meta name='viewport' content='width=device-width, initial-scale=1'>",
            f"<title>{html.escape(self.title)}</title>",
            f"<style>{_CSS}</style></head><body>",
            f"<h1>{html.escape(self.title)}</h1>",
        ]
        seen: set[str] = {
            b.name for b in self.blocks if b.kind == "callout"
        }  # headings never reuse an anchor
        for b in self.blocks:
            parts.append(self._html_block(b, seen))
        if self.appendix:
            parts.append(f"<h2 id='appendix'>{html.escape(APPENDIX_TITLE)}</h2>")
            for b in self.appendix:
                rows = len(b.content)
                parts.append(
                    f"<details id='{b.name}'><summary>{_inline(b.caption or 'table')} ({rows} "
                    f"rows)</summary>{_html_table(b.content, '')}</details>"
                )
        parts.append(f"<script>{_OPEN_LINKED_DETAILS}</script>")
        parts.append("</body></html>")
        return "\n".join(parts)

    @staticmethod
    def _html_block(b: Block, seen: set[str]) -> str:
        if b.kind in ("h2", "h3"):
            anchor = _slug(str(b.content), seen)
            return f"<{b.kind} id='{anchor}'>{_inline(b.content)}</{b.kind}>"
        if b.kind == "p":
            return f"<p>{_inline(b.content)}</p>"
        if b.kind == "callout":
            body = "<br>".join(_inline(line) for line in str(b.content).splitlines())
            return f"<div class='callout' id='{html.escape(b.name)}'>{body}</div>"
        if b.kind == "tableref":
            return f"<p class='tableref'>{_inline(_table_ref(b.content, '#' + b.content.name))}</p>"
        if b.kind == "list":
            return "<ul>" + "".join(f"<li>{_inline(x)}</li>" for x in b.content) + "</ul>"
        if b.kind == "code":
            return f"<pre>{html.escape(b.content)}</pre>"
        if b.kind == "table":
            return _html_table(b.content, b.caption)
        if b.kind == "figure":
            data = base64.b64encode(b.content).decode()
            return (
                f"<figure id='fig-{html.escape(b.name)}'><img alt='{html.escape(b.caption)}' "
                f"src='data:image/png;base64,{data}'><figcaption>{_inline(b.caption)}</figcaption></figure>"
            )
        return ""

    def write(self, out_dir: str | Path) -> dict[str, Path]:
        """report.md (+ figures/*.png) and the self-contained report.html. The report owns
        ``figures/`` and ``tables/`` under ``out_dir``: their earlier files are removed first, so
        nothing from an earlier report is left beside this one."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        for owned in ("figures", "tables"):
            if (out / owned).is_dir():
                shutil.rmtree(out / owned)
        for b in self.blocks:
            if b.kind == "figure":
                atomic_write_bytes(out / "figures" / f"{b.name}.png", b.content)
        atomic_write_text(out / "report.md", self.to_markdown())
        atomic_write_text(out / "report.html", self.to_html())
        return {"md": out / "report.md", "html": out / "report.html"}


APPENDIX_TITLE = "Appendix: long tables"

# Page at most 1100 px wide; a table wider than its box scrolls inside it; an image never displays
# wider than the page (max-width) and keeps its aspect ratio.
_CSS = (
    "body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;line-height:1.4}"
    ".scroll{overflow-x:auto;max-width:100%}"
    "table{border-collapse:collapse;font-size:12px;margin:0.5em 0}"
    "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}th{background:#f3f3f3}"
    "td:first-child,th:first-child{text-align:left}"
    "img{max-width:100%;height:auto;display:block}figure{margin:0.8em 0}"
    "figcaption{font-size:12px;color:#444}pre{background:#f6f6f6;padding:0.5em;overflow-x:auto}"
    ".callout{border-left:4px solid #2a6f97;background:#f2f7fa;padding:0.6em 0.9em;margin:0.6em 0}"
    "details{margin:0.4em 0}summary{cursor:pointer;font-weight:bold}"
    ".tableref{font-size:13px;color:#333}code{overflow-wrap:anywhere}"
)
# A link to an appendix table opens its <details> (on load and on every in-page jump).
_OPEN_LINKED_DETAILS = (
    "function openLinked(){var h=decodeURIComponent(location.hash.slice(1));if(!h)return;var "
    "e=document.getElementById(h);if(e&&e.tagName==='DETAILS'){e.open=true;e.scrollIntoView();}}window.addEventListener('hashchange',openLinked);openLinked();"
)


def _slug(text: str, seen: set[str]) -> str:
    """A heading's anchor: lower-case words joined by '-', unique within the page."""
    base = re.sub(r"[^a-z0-9]+", "-", re.sub(r"[`*]", "", text.lower())).strip("-") or "section"
    anchor, n = base, 2
    while anchor in seen:
        anchor, n = f"{base}-{n}", n + 1
    seen.add(anchor)
    return anchor


def _table_ref(table: Block, href: str) -> str:
    return f"*{table.caption or 'Table'}*: {len(table.content)} rows, in the [appendix]({href})."


def _html_table(df: pd.DataFrame, caption: str) -> str:
    cap = f"<caption><b>{_inline(caption)}</b></caption>" if caption else ""
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in df.columns)
    rows = "".join(
        "<tr>" + "".join(f"<td>{html.escape(fmt(v))}</td>" for v in row) + "</tr>"
        for _, row in df.iterrows()
    )
    return (
        "<div "
        f"class='scroll'><table>{cap}<thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table></div>"
    )


def _inline(text: str) -> str:
    """Escape, then the Markdown inline forms the report uses: **bold**, `code`, *italic* and
    in-page links [text](#anchor)."""
    t = html.escape(str(text))
    t = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", t)
    t = re.sub(r"`(.+?)`", r"<code>\1</code>", t)
    t = re.sub(r"(?<![\w*])\*(?!\s)(.+?)(?<!\s)\*(?![\w*])", r"<i>\1</i>", t)
    t = re.sub(r"\[([^\]]+)\]\((#[A-Za-z0-9_.-]+)\)", r"<a href='\2'>\1</a>", t)
    return t
