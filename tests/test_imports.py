"""The import graph between the project's packages: ``console`` <- ``incidents`` <- ``fleet`` <-
``compliance`` <- ``goodput`` (the shell).

Two rules hold over every module, imports inside functions included (a lazy import is still an
arrow: it only moves the failure from start-up to the first call):

1. no cycle among the modules of ``incidents/``: a model that needs a service, or a service that
   needs the engine that needs it, is one module too many in the wrong place;
2. ``console`` is the lowest library: it imports none of the apps above it, nor the shell.

``fleet``'s own rooms have their order in tests/fleet/test_layout.py.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("console", "incidents", "fleet", "compliance", "goodput", "clients")
ABOVE_CONSOLE = ("fleet", "incidents", "compliance", "goodput")

Arrow = tuple[str, str, int, str]  # (importing module, its file, line, imported module)


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str, root: Path) -> bool:
    base = root / name.replace(".", "/")
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists()


def _arrows(path: Path, root: Path) -> Iterator[Arrow]:
    """Every project module ``path`` imports, with its line. ``from a.b import c`` points at
    ``a.b.c`` when that is a module, else at ``a.b``; relative imports are resolved first."""
    source = _module_name(path, root)
    where = str(path.relative_to(root))
    package = source if path.name == "__init__.py" else source.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            targets = [
                f"{base}.{alias.name}" if _is_module(f"{base}.{alias.name}", root) else base for alias in node.names
            ]
        else:
            continue
        for target in targets:
            if target.split(".")[0] in PACKAGES:
                yield source, where, node.lineno, target


def import_graph(root: Path = ROOT) -> dict[str, list[Arrow]]:
    """Each project module's outgoing arrows, from every ``.py`` file under the project's packages."""
    graph: dict[str, list[Arrow]] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            graph[_module_name(path, root)] = list(_arrows(path, root))
    return graph


def _where(arrow: Arrow) -> str:
    _, where, line, target = arrow
    return f"{where}:{line} imports {target}"


def cycles_within(package: str, graph: dict[str, list[Arrow]]) -> list[list[str]]:
    """One cycle for each strongly connected group of ``package``'s modules (Tarjan's algorithm),
    each arrow written as ``file:line imports module`` so the message names what to move."""
    inside = {name for name in graph if name == package or name.startswith(package + ".")}
    edges = {name: [a for a in graph[name] if a[3] in inside] for name in inside}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(name: str) -> None:
        index[name] = low[name] = len(index)
        stack.append(name)
        for *_, target in edges[name]:
            if target not in index:
                visit(target)
                low[name] = min(low[name], low[target])
            elif target in stack:
                low[name] = min(low[name], index[target])
        if low[name] == index[name]:
            group = set()
            while (member := stack.pop()) != name:
                group.add(member)
            group.add(name)
            if len(group) > 1 or any(t == name for *_, t in edges[name]):
                groups.append(group)

    for name in sorted(inside):
        if name not in index:
            visit(name)
    return [_one_cycle(sorted(group)[0], group, edges) for group in groups]


def _one_cycle(start: str, group: set[str], edges: dict[str, list[Arrow]]) -> list[str]:
    """The shortest way round from ``start`` back to itself inside ``group`` (breadth first)."""
    came_by: dict[str, Arrow] = {}
    frontier = [start]
    while frontier:
        following = []
        for name in frontier:
            for arrow in edges[name]:
                target = arrow[3]
                if target in group and target not in came_by:
                    came_by[target] = arrow
                    following.append(target)
        if start in came_by:
            break
        frontier = following
    path, name = [], start
    while True:
        arrow = came_by[name]
        path.append(_where(arrow))
        name = arrow[0]
        if name == start:
            return path[::-1]


def upward_from_console(graph: dict[str, list[Arrow]]) -> list[str]:
    return [
        _where(arrow)
        for name, arrows in sorted(graph.items())
        if name == "console" or name.startswith("console.")
        for arrow in arrows
        if arrow[3].split(".")[0] in ABOVE_CONSOLE
    ]


@pytest.fixture(scope="module")
def graph() -> dict[str, list[Arrow]]:
    return import_graph()


def test_incidents_has_no_import_cycle(graph: dict[str, list[Arrow]]) -> None:
    assert cycles_within("incidents", graph) == []


def test_console_imports_none_of_the_apps_nor_the_shell(graph: dict[str, list[Arrow]]) -> None:
    assert upward_from_console(graph) == []


def test_the_walk_names_the_file_and_line_of_a_cycle_and_of_an_upward_import(tmp_path: Path) -> None:
    def write(relative: str, text: str = "") -> None:
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    for package in ("console", "incidents", "incidents/models", "incidents/services", "fleet"):
        write(f"{package}/__init__.py")
    write("fleet/models.py")
    write("incidents/models/incident.py", "def cost():\n    from incidents.services import cost\n")
    write("incidents/services/cost.py", "from . import engine\n")
    write("incidents/services/engine.py", "import os\n\nfrom incidents.models.incident import X\n")
    write("console/overview.py", "import json\n\n\ndef f():\n    from fleet.models import Site\n")
    graph = import_graph(tmp_path)
    assert cycles_within("incidents", graph) == [
        [
            "incidents/models/incident.py:2 imports incidents.services.cost",
            "incidents/services/cost.py:1 imports incidents.services.engine",
            "incidents/services/engine.py:3 imports incidents.models.incident",
        ]
    ]
    assert upward_from_console(graph) == ["console/overview.py:5 imports fleet.models"]
