"""The package's layout: layers that import only downwards, no import circle, the
command line alone parsing arguments (shared/DESIGN.md).

The import graph is built from the source with ``ast``, so imports inside functions
and under ``TYPE_CHECKING`` count as much as those at the top of a module.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

PACKAGE = Path(__file__).resolve().parents[1] / "simulator"

#: Layers, bottom up. A module may import from its own layer and the ones below.
LAYERS = (
    ("units", "errors", "files", "version"),
    ("topology",),
    ("network",),
    ("algorithms",),
    ("library",),
    ("collective",),
    ("workload",),
    ("validate",),
    ("viz",),
    ("sweep", "search"),
    ("cli",),
)


def module_name(path: Path) -> str:
    parts = ["simulator", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imported(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The ``simulator`` modules that ``name`` (at ``path``) imports, directly or by
    importing a package's ``__init__`` on the way."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            bases = [alias.name for alias in node.names]
            names: list[str] = []
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                bases = [f"{base}.{node.module}" if node.module else base]
            else:
                bases = [node.module or ""]
            names = [alias.name for alias in node.names]
        else:
            continue
        for base in bases:
            if not base.startswith("simulator"):
                continue
            found = [f"{base}.{n}" for n in names if f"{base}.{n}" in known]
            targets.update(found or [base])
    closed = set()
    own = {name.rsplit(".", k)[0] for k in range(name.count(".") + 1)}
    for target in targets:
        parts = target.split(".")
        for k in range(2, len(parts) + 1):  # every package on the way, but the root
            step = ".".join(parts[:k])
            if step in known and (step == target or step not in own):
                closed.add(step)
    closed.discard(name)
    return closed


def import_graph() -> nx.DiGraph:
    known = modules()
    graph = nx.DiGraph()
    for name, path in known.items():
        graph.add_node(name)
        for target in imported(name, path, known):
            graph.add_edge(name, target)
    return graph


def layer_of(name: str) -> int | None:
    parts = name.split(".")
    if len(parts) == 1 or parts[1] == "__main__":
        return None  # the package root re-exports from every layer
    for index, layer in enumerate(LAYERS):
        if parts[1] in layer:
            return index
    raise AssertionError(f"{name} belongs to no layer: add it to LAYERS and DESIGN.md")


def test_the_graph_sees_imports_inside_functions():
    """The check would be blind if it missed a lazy import: validate's runner imports
    the tuner at the top, and the CLI imports viz.outputs inside a function."""
    graph = import_graph()
    assert graph.has_edge("simulator.cli.collective", "simulator.viz.outputs")
    assert graph.has_edge("simulator.collective.simulate", "simulator.collective.tuner")


def test_no_import_cycle():
    cycles = list(nx.simple_cycles(import_graph()))
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles[:5])


def test_imports_go_down():
    upward = []
    for source, target in import_graph().edges:
        low, high = layer_of(target), layer_of(source)
        if low is not None and high is not None and low > high:
            upward.append(f"{source} -> {target}")
    assert not upward, "imports from a higher layer: " + ", ".join(sorted(upward))


def test_runner_does_not_import_the_tuner():
    graph = import_graph()
    assert not nx.has_path(graph, "simulator.collective.run", "simulator.collective.tuner")


def test_argparse_only_in_the_cli():
    outside = []
    for name, path in modules().items():
        if name.startswith("simulator.cli"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            if "argparse" in names:
                outside.append(name)
    assert not outside, f"argparse imported outside simulator/cli: {outside}"


def test_few_loose_modules():
    loose = sorted(
        path.name
        for path in PACKAGE.glob("*.py")
        if path.name not in ("__init__.py", "__main__.py")
    )
    assert len(loose) <= 6, loose
