"""The package's dependencies point one way (README "Layout"): every import, at module level or
inside a function, goes from a higher layer to a lower one. Planners, baselines, the simulator
and the plan/cost/workload core never import torch; nothing imports in a circle."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# Units (a module, or a package with its submodules), lowest layer first. A unit may import its
# own modules and units of lower layers; units of one layer are siblings that never import each
# other (except the pairs in SIBLING_IMPORTS).
LAYERS: list[list[str]] = [
    ["dcp_bench.errors", "dcp_bench.paths"],
    [
        "dcp_bench.files",
        "dcp_bench.layout",
        "dcp_bench.config",
        "dcp_bench.envinfo",
        "dcp_bench.batch",
        "dcp_bench.train_policy",
        "dcp_bench.archs",  # architectures as plug-ins: what the cost model prices, torch-free
        "dcp_bench.summary_schema",
    ],
    ["dcp_bench.records", "dcp_bench.run_ids", "dcp_bench.corpora", "dcp_bench.cost"],
    ["dcp_bench.plan", "dcp_bench.workloads"],
    ["dcp_bench.execution"],
    [
        "dcp_bench.reference"
    ],  # the reference runtime's rules (profile, samplers, epoch), used by planners
    ["dcp_bench.planners", "baselines", "dcp_bench.sim", "dcp_bench.runtime"],
    ["dcp_bench.report"],
    ["dcp_bench.run"],
    # many runs (sweeps, Slurm arrays, the reproduction); the profiler launches its ranks and a
    # rank-baseline run as runs are launched
    ["dcp_bench.campaign", "dcp_bench.api", "dcp_bench.profiling"],
    ["dcp_bench.commands"],
    ["dcp_bench.cli", "dcp_bench"],
]
SIBLING_IMPORTS = {("baselines", "dcp_bench.planners")}  # a baseline is a Planner subclass
TORCH_FREE = (
    "dcp_bench.archs",
    "dcp_bench.planners",
    "baselines",
    "dcp_bench.sim",
    "dcp_bench.plan",
    "dcp_bench.cost",
    "dcp_bench.reference",
    "dcp_bench.workloads",
    "dcp_bench.execution",
    "dcp_bench.layout",
    "dcp_bench.batch",
    "dcp_bench.train_policy",
)


def unit_of(module: str) -> str:
    best = ""
    for layer in LAYERS:
        for unit in layer:
            if (module == unit or module.startswith(unit + ".")) and len(unit) > len(best):
                best = unit
    assert best, f"module {module} is in no layer: add it to LAYERS"
    return best


def layer_of(unit: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if unit in layer)


def modules() -> dict[str, Path]:
    out = {}
    for top in ("dcp_bench", "baselines"):
        for path in (REPO / top).rglob("*.py"):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def imports(path: Path) -> list[tuple[str, int]]:
    """(imported module, line) for every import in the file, wherever it stands."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.module, node.lineno))
        elif isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
    return out


def test_every_import_points_down() -> None:
    offences = []
    for module, path in modules().items():
        src = unit_of(module)
        for target, line in imports(path):
            if not target.startswith(("dcp_bench", "baselines")):
                continue
            dst = unit_of(target)
            if dst == src or (src, dst) in SIBLING_IMPORTS or layer_of(dst) < layer_of(src):
                continue
            offences.append(
                f"{path.relative_to(REPO)}:{line}: {src} (layer {layer_of(src)}) imports "
                f"{target} ({dst}, layer {layer_of(dst)})"
            )
    assert not offences, "imports against the layer direction:\n" + "\n".join(offences)


def test_pure_code_never_imports_torch() -> None:
    offences = [
        f"{path.relative_to(REPO)}:{line}: imports {target}"
        for module, path in modules().items()
        if module.startswith(TORCH_FREE)
        for target, line in imports(path)
        if target.split(".")[0] == "torch"
    ]
    assert not offences, "\n".join(offences)


def test_no_module_imports_in_a_circle() -> None:
    mods = modules()
    graph: dict[str, set[str]] = defaultdict(set)
    for module, path in mods.items():
        for target, _ in imports(path):
            # `from pkg import name` may name a submodule; resolve to the longest module known.
            while target and target not in mods:
                target = target.rpartition(".")[0]
            if target and target != module and not module.startswith(target + "."):
                graph[module].add(target)
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return stack[stack.index(n) :] + [n]
            if n not in state and (cycle := visit(n)):
                return cycle
        state[m] = 2
        stack.pop()
        return None

    for m in sorted(mods):
        if m not in state and (cycle := visit(m)):
            raise AssertionError("import circle: " + " -> ".join(cycle))


def static_imports(path: Path) -> set[str]:
    """Every module a file names in an import statement: ``from pkg import mod`` counts as
    ``pkg.mod`` too (it may name a submodule)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def unreached_commands(cli: Path, package: Path) -> list[str]:
    """Command modules of ``package`` (the ``dcp_bench.commands`` folder) that the CLI does not
    reach by plain imports (CLI -> the package -> each command), so the checks above would not
    see their dependencies; a module loaded by a name string (``importlib``) counts as unreached."""
    mods = static_imports(cli)
    if "dcp_bench.commands" not in mods and not any(
        m.startswith("dcp_bench.commands.") for m in mods
    ):
        return sorted(p.stem for p in package.glob("*.py") if p.stem != "__init__")
    reached = mods | static_imports(package / "__init__.py")
    return sorted(
        p.stem
        for p in package.glob("*.py")
        if p.stem != "__init__" and f"dcp_bench.commands.{p.stem}" not in reached
    )


def test_every_command_is_imported_by_the_cli() -> None:
    """The CLI registers its commands by plain imports, so the layer and circle checks cover
    them."""
    missing = unreached_commands(REPO / "dcp_bench" / "cli.py", REPO / "dcp_bench" / "commands")
    assert not missing, f"commands the CLI loads without a plain import: {', '.join(missing)}"
    assert "importlib" not in static_imports(REPO / "dcp_bench" / "cli.py")
    for path in (REPO / "dcp_bench" / "commands").glob("*.py"):
        assert (
            unit_of(".".join(path.relative_to(REPO).with_suffix("").parts)) == "dcp_bench.commands"
        )


def test_the_command_check_can_fail(tmp_path: Path) -> None:
    """A command module loaded by a name string is reported."""
    pkg = tmp_path / "commands"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from dcp_bench.commands import env\n")
    (pkg / "env.py").write_text("")
    (pkg / "extra.py").write_text("")
    cli = tmp_path / "cli.py"
    cli.write_text(
        "import importlib\nfrom dcp_bench.commands import COMMANDS\n"
        "importlib.import_module('dcp_bench.commands.extra')\n"
    )
    assert unreached_commands(cli, pkg) == ["extra"]
    cli.write_text("import importlib\n")
    assert unreached_commands(cli, pkg) == ["env", "extra"]


def test_the_layer_table_can_fail() -> None:
    """The checker itself: a planner importing the runtime would be an offence."""
    src, dst = unit_of("dcp_bench.planners.dcp"), unit_of("dcp_bench.runtime.executor")
    assert src != dst and layer_of(dst) == layer_of(src) and (src, dst) not in SIBLING_IMPORTS


def test_the_library_never_imports_the_tools() -> None:
    """tools/ (the GPU check, the browser check) runs beside the package, which never needs it."""
    offences = [
        f"{path.relative_to(REPO)}:{line}: imports {target}"
        for module, path in modules().items()
        for target, line in imports(path)
        if target.split(".")[0] == "tools"
    ]
    assert not offences, "\n".join(offences)
