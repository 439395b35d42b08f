#!/usr/bin/env python3
"""Structure counts of the package: imports inside functions, long functions, long lines.

    python scripts/code_metrics.py [ROOT ...] [--list]

ROOT defaults to the package folders (dcp_bench, baselines). Standard library only, so it runs
on any checkout, including an old commit's (`git worktree add` it and pass its folders).
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import Counter
from pathlib import Path

LONG_FUNCTION = 80
LINE_LIMIT = 100
PROJECT = ("dcp_bench", "baselines")


def _is_project(node: ast.Import | ast.ImportFrom) -> bool:
    if isinstance(node, ast.ImportFrom):
        return node.level > 0 or (node.module or "").split(".")[0] in PROJECT
    return any(alias.name.split(".")[0] in PROJECT for alias in node.names)


def file_metrics(path: Path) -> dict:
    text = path.read_text(encoding="utf-8")
    tree = ast.parse(text, filename=str(path))
    inner: list[tuple[int, bool]] = []
    long_functions: list[tuple[str, int]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom) and in_function:
                inner.append((child.lineno, _is_project(child)))
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (child.end_lineno or child.lineno) - child.lineno + 1
                if length > LONG_FUNCTION:
                    long_functions.append((child.name, length))
                visit(child, True)
            else:
                visit(child, in_function)

    visit(tree, False)
    long_lines = sum(1 for line in text.splitlines() if len(line) > LINE_LIMIT)
    return {"inner": inner, "long_functions": long_functions, "long_lines": long_lines}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("roots", nargs="*", default=list(PROJECT))
    parser.add_argument("--list", action="store_true", help="name every file and function counted")
    args = parser.parse_args(argv)
    totals: Counter[str] = Counter()
    per_file: list[tuple[str, dict]] = []
    for root in args.roots:
        for path in sorted(Path(root).rglob("*.py")):
            m = file_metrics(path)
            per_file.append((str(path), m))
            totals["files"] += 1
            totals["imports inside functions"] += len(m["inner"])
            totals["  of them the project's own"] += sum(own for _, own in m["inner"])
            totals[f"functions over {LONG_FUNCTION} lines"] += len(m["long_functions"])
            totals[f"lines over {LINE_LIMIT} characters"] += m["long_lines"]
    for key, value in totals.items():
        print(f"{key}: {value}")
    if args.list:
        for name, m in per_file:
            if m["inner"]:
                lines = ", ".join(f"{line}{'*' if own else ''}" for line, own in m["inner"])
                print(f"imports {name}: {lines}")
            for fn, length in m["long_functions"]:
                print(f"long {name}:{fn}: {length} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
