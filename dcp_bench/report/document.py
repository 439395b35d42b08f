"""A report as a list of blocks, rendered twice: Markdown (figures as PNG files beside it) and a
self-contained HTML page (figures embedded as base64 PNGs, no external resources)."""

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


@dataclass
class Block:
    kind: str  # "h1" | "h2" | "h3" | "p" | "list" | "table" | "figure" | "code"
    content: Any
    caption: str = ""
    name: str = ""


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

    def h2(self, text: str) -> None:
        self.blocks.append(Block("h2", text))

    def h3(self, text: str) -> None:
        self.blocks.append(Block("h3", text))

    def p(self, text: str) -> None:
        self.blocks.append(Block("p", text))

    def bullets(self, items: list[str]) -> None:
        if items:
            self.blocks.append(Block("list", list(items)))

    def code(self, text: str) -> None:
        self.blocks.append(Block("code", text))

    def table(self, df: pd.DataFrame, caption: str = "", columns: list[str] | None = None) -> None:
        if df is None or df.empty:
            self.p(f"*{caption or 'table'}: no data.*")
            return
        cols = [c for c in (columns or list(df.columns)) if c in df.columns]
        self.blocks.append(Block("table", df[cols].copy(), caption=caption))

    def figure(self, png: bytes | None, name: str, caption: str) -> None:
        if png is None:
            self.p(f"*Figure {name}: not enough data to draw it ({caption}).*")
            return
        self.blocks.append(Block("figure", png, caption=caption, name=name))

    # -- rendering ----------------------------------------------------------------------------

    def to_markdown(self, figure_dir: str = "figures") -> str:
        out = [f"# {self.title}", ""]
        for b in self.blocks:
            if b.kind in ("h2", "h3"):
                out += ["#" * int(b.kind[1]) + " " + b.content, ""]
            elif b.kind == "p":
                out += [b.content, ""]
            elif b.kind == "list":
                out += [f"- {x}" for x in b.content] + [""]
            elif b.kind == "code":
                out += ["```", b.content, "```", ""]
            elif b.kind == "table":
                df: pd.DataFrame = b.content
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
            f"<title>{html.escape(self.title)}</title>",
            "<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;"
            "line-height:1.4}table{border-collapse:collapse;font-size:12px;margin:0.5em 0}"
            "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}th{background:#f3f3f3}"
            "td:first-child,th:first-child{text-align:left}img{max-width:100%}"
            "figcaption{font-size:12px;color:#444}pre{background:#f6f6f6;padding:0.5em;"
            "overflow-x:auto}</style></head><body>",
            f"<h1>{html.escape(self.title)}</h1>",
        ]
        for b in self.blocks:
            if b.kind in ("h2", "h3"):
                parts.append(f"<{b.kind}>{_inline(b.content)}</{b.kind}>")
            elif b.kind == "p":
                parts.append(f"<p>{_inline(b.content)}</p>")
            elif b.kind == "list":
                parts.append("<ul>" + "".join(f"<li>{_inline(x)}</li>" for x in b.content) + "</ul>")
            elif b.kind == "code":
                parts.append(f"<pre>{html.escape(b.content)}</pre>")
            elif b.kind == "table":
                df = b.content
                cap = f"<caption><b>{_inline(b.caption)}</b></caption>" if b.caption else ""
                head = "".join(f"<th>{html.escape(str(c))}</th>" for c in df.columns)
                rows = "".join(
                    "<tr>" + "".join(f"<td>{html.escape(fmt(v))}</td>" for v in row) + "</tr>"
                    for _, row in df.iterrows()
                )
                parts.append(f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>")
            elif b.kind == "figure":
                data = base64.b64encode(b.content).decode()
                parts.append(
                    f"<figure><img alt='{html.escape(b.caption)}' src='data:image/png;base64,{data}'>"
                    f"<figcaption>{_inline(b.caption)}</figcaption></figure>"
                )
        parts.append("</body></html>")
        return "\n".join(parts)

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


def _inline(text: str) -> str:
    """Escape, then the two Markdown inline forms the report uses: **bold** and `code`."""
    t = html.escape(str(text))
    t = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", t)
    t = re.sub(r"`(.+?)`", r"<code>\1</code>", t)
    t = re.sub(r"(?<![\w*])\*(?!\s)(.+?)(?<!\s)\*(?![\w*])", r"<i>\1</i>", t)
    return t
