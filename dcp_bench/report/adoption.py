"""What adopting DCP costs, counted from the shipped examples: each plain training loop beside its
DCP version (``examples/``), the code lines that differ counted by a diff (docstrings, comments
and blank lines left out), and the "lines to adopt" table of the reproduce report, next to the
paper's "about 10 lines". The examples are run by the tests (``tests/test_api.py``,
``tests/test_integration_examples.py``), which check each DCP version trains like its plain loop.
"""

from __future__ import annotations

import ast
import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from dcp_bench.paths import REPO_ROOT

PAPER_LINES = 10  # the paper: DCP takes "about 10 lines of code" to adopt


@dataclass(frozen=True)
class Adoption:
    """One plain loop and its DCP version, and what else the user had to write."""

    model: str
    library: str
    plain: str  # repository-relative paths
    dcp: str
    also_written: str


EXAMPLES = (
    Adoption(
        "tiny Llama (the runtime's own model)",
        "dcp_bench",
        "examples/train_plain.py",
        "examples/train_dcp.py",
        "nothing here, but the model was written for SP: its attention calls the SP exchanges and "
        "it builds its own shards (tens of lines in a model not written for it)",
    ),
    Adoption(
        "Llama from LlamaConfig",
        "transformers",
        "examples/transformers_plain.py",
        "examples/transformers_dcp.py",
        "nothing: the adapter registers Ulysses attention with AttentionInterface; the loop hands "
        "it the same sample_tokens(sample_id, length) function the plain loop reads its data with",
    ),
    Adoption(
        "Wan video transformer",
        "diffusers",
        "examples/diffusers_plain.py",
        "examples/diffusers_dcp.py",
        "nothing: the adapter sets the self-attention processor and the split/gather hooks; the "
        "loop hands it the plain loop's sample_clip function",
    ),
)


@dataclass(frozen=True)
class LineCount:
    added: int  # code lines only in the DCP version (new or rewritten)
    removed: int  # code lines only in the plain loop
    plain_lines: int  # code lines of the plain loop

    @property
    def changed(self) -> int:
        """Lines the user writes or rewrites: a rewritten line counts once, as added."""
        return self.added


def code_lines(source: str) -> list[str]:
    """The source's lines without the module docstring, comment-only lines and blank lines,
    stripped of trailing whitespace."""
    lines = source.splitlines()
    skip: set[int] = set()
    body = ast.parse(source).body
    first = body[0] if body else None
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        skip.update(range(first.lineno - 1, first.end_lineno or first.lineno))
    return [
        ln.rstrip()
        for i, ln in enumerate(lines)
        if i not in skip and ln.strip() and not ln.strip().startswith("#")
    ]


def count_changed_lines(plain: str | Path, dcp: str | Path) -> LineCount:
    """Code lines that differ between a plain loop and its DCP version (a line diff)."""
    a, b = code_lines(Path(plain).read_text()), code_lines(Path(dcp).read_text())
    added = removed = 0
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if tag != "equal":
            removed += i2 - i1
            added += j2 - j1
    return LineCount(added=added, removed=removed, plain_lines=len(a))


def adoption_rows(root: Path = REPO_ROOT) -> list[dict[str, Any]]:
    """One row per example pair found under ``root``: the counted lines and what else was
    written."""
    rows = []
    for ex in EXAMPLES:
        plain, dcp = root / ex.plain, root / ex.dcp
        if not (plain.exists() and dcp.exists()):
            continue
        n = count_changed_lines(plain, dcp)
        rows.append(
            {
                "model": ex.model,
                "library": ex.library,
                "lines added or rewritten": n.added,
                "lines removed": n.removed,
                "plain loop lines": n.plain_lines,
                "anything else the user wrote": ex.also_written,
                "example": f"{ex.plain} -> {ex.dcp}",
            }
        )
    return rows


def adoption_section(doc: Any, data: Any) -> None:
    """The "lines to adopt" table of a claim-reproduction report."""
    if not getattr(data, "leads_with_claims", False):
        return
    rows = adoption_rows()
    if not rows:
        return
    doc.h2("Lines to adopt")
    doc.p(
        f"The paper says DCP takes about {PAPER_LINES} lines to adopt. Counted here by a line "
        "diff of each shipped plain training loop against its DCP version (code lines; "
        "docstrings, comments and blank lines left out); the tests run both versions and check "
        "they train alike. `docs/integration.md` shows the diffs."
    )
    doc.table(
        pd.DataFrame(rows), "counted from examples/ at this commit (a count, not a measurement)"
    )
