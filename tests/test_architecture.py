"""The import graph of ``app``: its top-level packages form layers and no cycle.

The graph is grimp's (import-linter's own builder). Packages are compared as wholes: an
import from anywhere inside ``app.releases`` into anywhere inside ``app.ledger`` is an edge
``releases -> ledger``. The layer list is the one of the import-linter contract in
pyproject.toml, so the test and ``lint-imports`` cannot drift apart.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Top to bottom; "a | b" share a layer and may not import each other.
LAYERS = [
    "runtime",
    "api",
    "models",
    "releases | ingest",
    "auth | ledger",
    "datasets",
    "audit",
    "core | codec | experiments",
    "planner",
    "mechanisms",
]

Edges = dict[str, set[str]]


def package_edges(graph: grimp.ImportGraph, root: str) -> Edges:
    """``{a: {b, ...}}`` for the children a, b of ``root`` where something in a imports b."""
    children = sorted(graph.find_children(root))
    prefix = len(root) + 1
    edges: Edges = {child[prefix:]: set() for child in children}
    for importer in children:
        for imported in children:
            if importer != imported and graph.direct_import_exists(
                importer=importer, imported=imported, as_packages=True
            ):
                edges[importer[prefix:]].add(imported[prefix:])
    return edges


def find_cycle(edges: Edges) -> list[str] | None:
    """One cycle of ``edges`` as ``[a, b, ..., a]``, or None when the graph is acyclic."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(edges):
        if start not in state and (found := visit(start)) is not None:
            return found
    return None


def layer_of(layers: list[str]) -> dict[str, int]:
    """Package name -> its layer's index (0 is the top)."""
    return {name.strip(): i for i, layer in enumerate(layers) for name in layer.split("|")}


def layer_violations(edges: Edges, layers: list[str]) -> list[str]:
    """Every edge that goes up, or sideways between packages sharing a layer."""
    rank = layer_of(layers)
    return [
        f"{a} -> {b}"
        for a in sorted(edges)
        for b in sorted(edges[a])
        if a in rank and b in rank and rank[a] >= rank[b]
    ]


@pytest.fixture(scope="module")
def app_edges() -> Edges:
    return package_edges(grimp.build_graph("app"), "app")


def test_layers_are_the_import_linter_contract() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    layered = [c for c in contracts if c["type"] == "layers"]
    assert len(layered) == 1
    assert layered[0]["containers"] == ["app"]
    assert layered[0]["layers"] == LAYERS
    assert layered[0]["exhaustive"] is True


def test_every_top_level_package_has_a_layer(app_edges: Edges) -> None:
    assert set(app_edges) == set(layer_of(LAYERS))


def test_no_cycle_between_top_level_packages(app_edges: Edges) -> None:
    assert find_cycle(app_edges) is None


def test_every_import_goes_down_the_layers(app_edges: Edges) -> None:
    assert layer_violations(app_edges, LAYERS) == []


def test_domains_sit_where_they_are_recorded(app_edges: Edges) -> None:
    """The edges the layer order rests on, recorded: losing one means a layer moved."""
    assert {"api", "ingest", "releases"} <= app_edges["runtime"]
    assert {"releases", "ledger", "auth", "datasets", "audit", "core"} <= app_edges["api"]
    assert {"ledger", "auth", "datasets", "planner", "mechanisms"} <= app_edges["releases"]
    assert {"datasets", "audit"} <= app_edges["ledger"]
    assert {"datasets", "audit"} <= app_edges["auth"]
    assert {"audit", "codec", "core"} <= app_edges["datasets"]
    assert app_edges["core"] == set()
    assert app_edges["codec"] == set()
    assert app_edges["mechanisms"] == set()


def synthetic_graph(*imports: tuple[str, str]) -> grimp.ImportGraph:
    graph = grimp.ImportGraph()
    graph.add_module("pkg")
    for importer, imported in imports:
        for module in (importer, imported):
            parts = module.split(".")
            for depth in range(2, len(parts) + 1):
                graph.add_module(".".join(parts[:depth]))
        graph.add_import(importer=importer, imported=imported)
    return graph


def test_the_checks_catch_a_cycle_and_an_upward_import() -> None:
    acyclic = package_edges(synthetic_graph(("pkg.top.x", "pkg.low.y")), "pkg")
    assert acyclic == {"top": {"low"}, "low": set()}
    assert find_cycle(acyclic) is None
    assert layer_violations(acyclic, ["top", "low"]) == []

    cyclic = package_edges(
        synthetic_graph(
            ("pkg.top.x", "pkg.mid.y"),
            ("pkg.mid.z", "pkg.low"),
            ("pkg.low.w", "pkg.top.v"),
        ),
        "pkg",
    )
    assert find_cycle(cyclic) == ["low", "top", "mid", "low"]
    assert layer_violations(cyclic, ["top", "mid", "low"]) == ["low -> top"]
    assert layer_violations(acyclic, ["low", "top"]) == ["top -> low"]
    assert layer_violations(acyclic, ["top | low"]) == ["top -> low"]


#: What counts as source under app/ (data files, e.g. the experiments' CSV, are not held to it).
SOURCE_SUFFIXES = {".py", ".js", ".html", ".css", ".sql", ".mako"}
MAX_SOURCE_LINES = 600


def source_files(root: Path) -> list[Path]:
    return sorted(
        p
        for p in root.rglob("*")
        if p.is_file() and p.suffix in SOURCE_SUFFIXES and "__pycache__" not in p.parts
    )


def long_files(root: Path) -> list[tuple[str, int]]:
    """Source files under ``root`` longer than MAX_SOURCE_LINES, with their lengths."""
    out = []
    for p in source_files(root):
        lines = len(p.read_text(encoding="utf-8").splitlines())
        if lines > MAX_SOURCE_LINES:
            out.append((str(p.relative_to(root)), lines))
    return out


def test_no_source_file_under_app_is_longer_than_the_limit() -> None:
    assert len(source_files(ROOT / "app")) > 100  # the scan sees the package
    assert long_files(ROOT / "app") == []


def test_the_length_check_sees_a_long_file(tmp_path: Path) -> None:
    (tmp_path / "ui").mkdir()
    (tmp_path / "ui" / "long.js").write_text("x;\n" * (MAX_SOURCE_LINES + 1))
    (tmp_path / "data.csv").write_text("1\n" * (MAX_SOURCE_LINES + 1))
    assert long_files(tmp_path) == [("ui/long.js", MAX_SOURCE_LINES + 1)]


#: History narration ("stop 23", "issue 8 run"): the docs and code say what is true now; the
#: story is in CHANGELOG.md and git history.
NARRATION = re.compile(r"\bstops? [0-9]+|issue [0-9]+", re.IGNORECASE)


def narrated(paths: list[Path]) -> list[str]:
    """``file:line`` of every line of these files (and the files under these directories)
    that narrates history."""
    out = []
    for top in paths:
        files = [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file())
        for p in files:
            if "__pycache__" in p.parts or p.suffix in {".csv", ".nbi", ".nbc", ".pyc"}:
                continue
            try:
                text = p.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                continue
            out += [
                f"{p}:{n}" for n, line in enumerate(text.splitlines(), 1) if NARRATION.search(line)
            ]
    return out


def test_code_and_docs_do_not_narrate_history() -> None:
    assert narrated([ROOT / "app", ROOT / "docs", ROOT / "README.md"]) == []


def test_the_narration_check_sees_a_stop_and_an_issue(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("# measured in stop 23\nx = 1\n# see Issue 8\n")
    assert narrated([tmp_path]) == [f"{tmp_path / 'a.py'}:1", f"{tmp_path / 'a.py'}:3"]
