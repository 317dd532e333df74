"""The tests' own layout: no file under tests/ imports a test module. What tests share
(classes, constants, functions) lives in ``tests/helpers``, shared fixtures in a
``conftest.py``; a test module holds its tests and imports only those."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from helpers.paths import TESTS

IMPORTERS = ("import_module", "importorskip", "__import__")   # calls that import by name


def _python_files() -> Iterator[Path]:
    """Every .py file under tests/ but the conftest.py files (and installed Node.js
    packages, which are no part of the tests)."""
    for path in sorted(TESTS.rglob("*.py")):
        if path.name != "conftest.py" and "node_modules" not in path.parts:
            yield path


def imported_modules(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """``(line, module)`` for every import in ``tree``: import statements (at any depth)
    and calls such as ``importlib.import_module("name")`` with a literal name."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.lineno, node.module
        elif isinstance(node, ast.Call) and node.args:
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            arg = node.args[0]
            if name in IMPORTERS and isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                yield node.lineno, arg.value


def test_no_file_under_tests_imports_a_test_module() -> None:
    found = []
    for path in _python_files():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for line, module in imported_modules(tree):
            if any(part.startswith("test_") for part in module.split(".")):
                found.append(f"{path.relative_to(TESTS)}:{line}: {module}")
    assert not found, ("a test module's pieces imported; move them to tests/helpers "
                       "(fixtures to a conftest.py):\n" + "\n".join(found))


def test_the_check_sees_every_kind_of_import() -> None:
    source = ("import test_a\nfrom test_b import x\ndef f():\n    from test_c import y\n"
              "importlib.import_module('test_d')\npytest.importorskip('helpers.x')\n"
              "from . import test_e\nprint('test_f')\n")
    assert sorted(m for _, m in imported_modules(ast.parse(source))) == [
        "helpers.x", "test_a", "test_b", "test_c", "test_d"]


def test_every_test_module_has_a_name_of_its_own() -> None:
    """The test folders are no packages, so pytest imports each test module by its
    file name alone: two of one name in two folders stop the whole run at collection."""
    seen: dict[str, Path] = {}
    twice = []
    for path in TESTS.rglob("test_*.py"):
        if "node_modules" in path.parts:
            continue
        other = seen.setdefault(path.name, path)
        if other != path:
            twice.append(f"{other.relative_to(TESTS)} and {path.relative_to(TESTS)}")
    assert not twice, "; ".join(twice)
