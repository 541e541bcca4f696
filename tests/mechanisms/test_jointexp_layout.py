"""The layout of :mod:`app.mechanisms.jointexp` is its audit boundary: the speed-only
strategy imports nothing the law depends on, and every module stays short enough to read."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import app.mechanisms.jointexp as package

PACKAGE = "app.mechanisms.jointexp"
PKG_DIR = Path(package.__file__).parent
SELECT = PKG_DIR.parent / "select.py"
MAX_LINES = 600


def imported_modules(source: str, module: str) -> set[str]:
    """Every module ``source`` (the text of ``module``) imports, absolute, including the
    ``from X import name`` targets ``X.name`` (a submodule or a name of X)."""
    package_parts = module.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package_parts[: len(package_parts) - node.level + 1]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def package_imports(source: str, module: str) -> set[str]:
    """The imports of ``source`` that reach into the jointexp package."""
    return {
        name
        for name in imported_modules(source, module)
        if name == PACKAGE or name.startswith(PACKAGE + ".")
    }


def test_the_strategy_imports_nothing_from_the_package() -> None:
    source = (PKG_DIR / "strategy.py").read_text()
    assert package_imports(source, f"{PACKAGE}.strategy") == set()


@pytest.mark.parametrize(
    "source",
    [
        "from app.mechanisms.jointexp import kernels_linear\n",
        "from app.mechanisms.jointexp.mechanism import LINEAR_RANGE\n",
        "import app.mechanisms.jointexp.error_bound\n",
        "from . import mechanism\n",
        "from .kernels_log import log_of\n",
    ],
)
def test_the_import_check_sees_every_way_into_the_package(source: str) -> None:
    assert package_imports(source, f"{PACKAGE}.strategy")


def line_count(path: Path) -> int:
    return len(path.read_text().splitlines())


def modules() -> list[Path]:
    return [*sorted(PKG_DIR.glob("*.py")), SELECT]


@pytest.mark.parametrize("path", [pytest.param(p, id=p.name) for p in modules()])
def test_no_module_is_longer_than_the_limit(path: Path) -> None:
    assert line_count(path) <= MAX_LINES, (path.name, line_count(path))


def test_the_line_check_fails_on_a_long_module(tmp_path: Path) -> None:
    long = tmp_path / "long.py"
    long.write_text("x = 1\n" * (MAX_LINES + 1))
    assert line_count(long) > MAX_LINES
