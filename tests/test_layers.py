"""The service's layers as docs/architecture.md states them, checked against every import in the tree
(function-level imports included, which the import-time test in test_boundaries.py cannot see):
no import cycle between backend packages, each layer imports only those beneath it, no feature imports
another, the service and the CLI reach the analysis only through its entry point, and the doc's tables
name every folder and what each feature takes from the analysis and the store."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

from bubblescope import analysis
from tests.support import REPO

BACKEND = REPO / "backend"
ARCHITECTURE = REPO / "docs" / "architecture.md"
FACADE = "bubblescope.analysis"
# What reaches the analysis only through its entry point: the service, the command line and the demo.
FACADE_ONLY = [*sorted(BACKEND.rglob("*.py")), *sorted((REPO / "bubblescope").glob("*.py"))]


def python_files(unit: str) -> list[Path]:
    folder = BACKEND / unit
    return sorted(folder.rglob("*.py")) if folder.is_dir() else [BACKEND / f"{unit}.py"]


def backend_units() -> set[str]:
    """Every package and top-level module of backend/."""
    folders = {p.name for p in BACKEND.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    modules = {p.stem for p in BACKEND.glob("*.py") if p.name != "__init__.py"}
    return folders | modules


@cache
def tree_of(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def imported_modules(path: Path) -> Iterator[str]:
    """Every module an import statement anywhere in ``path`` names (``from a import b``: ``a`` and ``a.b``)."""
    for node in ast.walk(tree_of(path)):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def backend_unit(module: str) -> str | None:
    prefix = "bubblescope.backend."
    return module.removeprefix(prefix).split(".")[0] if module.startswith(prefix) else None


def unit_imports(unit: str) -> set[str]:
    """The other backend units ``unit`` imports."""
    found = {backend_unit(m) for path in python_files(unit) for m in imported_modules(path)}
    return {u for u in found if u is not None and u != unit and u in backend_units()}


def doc_table(heading: str) -> list[list[str]]:
    """The rows (cells) of the first table under ``heading`` in docs/architecture.md."""
    text = ARCHITECTURE.read_text()
    start = text.index(f"\n{heading}\n")
    rows = []
    for line in text[start:].splitlines()[2:]:
        if rows and not line.startswith("|"):
            break
        if line.startswith("|") and not re.match(r"^\|\s*-", line):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows[1:]


def ticked(cell: str) -> set[str]:
    return set(re.findall(r"`([^`]+)`", cell))


@cache
def layers() -> list[tuple[str, set[str]]]:
    """(layer, its units), top first, as the doc's table lists them."""
    return [(row[0].strip("*"), ticked(row[1])) for row in doc_table("## The service's layers")]


def layer_of(unit: str) -> int:
    """The layer's depth: 0 for the top."""
    return next(depth for depth, (_, units) in enumerate(layers()) if unit in units)


def test_the_layer_table_names_every_package_and_module_of_the_backend_once() -> None:
    named = [unit for _, units in layers() for unit in units]
    assert sorted(named) == sorted(backend_units())
    assert [name for name, _ in layers()] == ["top", "features", "derived", "store", "bottom"]


def test_no_import_cycle_between_backend_packages() -> None:
    graph = {unit: unit_imports(unit) for unit in backend_units()}
    cycles: list[list[str]] = []

    def visit(unit: str, path: list[str]) -> None:
        for target in sorted(graph[unit]):
            if target in path:
                cycles.append([*path[path.index(target) :], target])
            elif not cycles:
                visit(target, [*path, target])

    for unit in sorted(graph):
        visit(unit, [unit])
    assert cycles == [], f"import cycle: {' -> '.join(cycles[0])}"


@pytest.mark.parametrize("unit", sorted(backend_units()))
def test_each_unit_imports_only_the_layers_beneath_it(unit: str) -> None:
    depth = layer_of(unit)
    name = layers()[depth][0]
    wrong = []
    for target in sorted(unit_imports(unit)):
        below = layer_of(target) > depth
        same_layer_allowed = layer_of(target) == depth and name in ("top", "bottom")
        if not (below or same_layer_allowed):
            wrong.append(f"{unit} ({name}) imports {target} ({layers()[layer_of(target)][0]})")
    assert wrong == []


def facade_names(path: Path) -> set[str]:
    """What ``path`` takes from the analysis' entry point: ``from bubblescope.analysis import X`` and
    ``analysis.X`` after ``from bubblescope import analysis``."""
    names: set[str] = set()
    module_alias = None
    tree = tree_of(path)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            if node.module == FACADE:
                names.update(alias.name for alias in node.names)
            elif node.module == "bubblescope":
                module_alias = next((a.asname or a.name for a in node.names if a.name == "analysis"), module_alias)
    if module_alias is not None:
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == module_alias:
                names.add(node.attr)
    return names


@pytest.mark.parametrize("path", FACADE_ONLY, ids=lambda p: p.relative_to(REPO).as_posix())
def test_the_service_and_the_cli_reach_the_analysis_only_through_its_entry_point(path: Path) -> None:
    inside = [
        m for m in imported_modules(path) if m.startswith(FACADE + ".") and m.split(".")[2] not in analysis.__all__
    ]
    assert inside == [], f"imports the analysis' modules directly: {sorted(set(inside))}"
    unknown = sorted(facade_names(path) - set(analysis.__all__))
    assert unknown == [], f"names the entry point does not offer: {unknown}"


def test_the_entry_points_names_match_their_homes() -> None:
    """``analysis/__init__.py`` lists each name twice (for type checkers, and for its lazy import): the same."""
    typed: dict[str, set[str]] = defaultdict(set)
    for node in ast.walk(tree_of(REPO / "analysis" / "__init__.py")):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(FACADE + "."):
            typed[node.module.removeprefix(FACADE + ".")].update(alias.name for alias in node.names)
    assert {home: set(names) for home, names in analysis.HOMES.items()} == dict(typed)
    for name in analysis.__all__:
        assert getattr(analysis, name) is not None


def _feature_rows() -> dict[str, list[str]]:
    return {next(iter(ticked(row[0]))): row for row in doc_table("## The service: one folder per feature")}


def test_the_feature_table_lists_every_feature_folder() -> None:
    features = next(units for name, units in layers() if name == "features")
    assert sorted(_feature_rows()) == sorted(features)
    assert all((BACKEND / feature).is_dir() for feature in features)


@pytest.mark.parametrize("feature", sorted(_feature_rows()))
def test_the_feature_table_says_what_each_feature_takes_from_the_analysis_and_the_store(feature: str) -> None:
    row = _feature_rows()[feature]
    files = python_files(feature)
    called = set().union(*(facade_names(path) for path in files))
    assert ticked(row[3]) == called, f"{feature}: the doc says {sorted(ticked(row[3]))}, the code {sorted(called)}"
    used = {
        ".".join(m.split(".")[2:4])
        for path in files
        for m in imported_modules(path)
        if backend_unit(m) in ("store", "derived") and len(m.split(".")) > 3
    }
    used = {m for m in used if (BACKEND / m.replace(".", "/")).with_suffix(".py").exists()}
    assert ticked(row[2]) == used, f"{feature}: the doc says {sorted(ticked(row[2]))}, the code {sorted(used)}"
