"""The repository's folders, and putting some of them on ``sys.path``."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
DATA = TESTS / "data"
BENCHMARKS = ROOT / "benchmarks"
DOCS = ROOT / "docs"


def put_on_path(*folders: Path) -> None:
    """Put ``folders`` first on ``sys.path`` (once each, in the order given)."""
    for folder in reversed(folders):
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))


def benchmarks_on_path() -> None:
    """``benchmarks/`` on ``sys.path``, for the tests that import a benchmark's module."""
    put_on_path(BENCHMARKS)


def test_folders() -> list[Path]:
    """Every folder under tests/ that holds test modules (helpers, data and peers hold
    none)."""
    return sorted(d for d in TESTS.iterdir() if d.is_dir() and any(d.glob("test_*.py")))


def test_folders_on_path() -> None:
    """Every test folder on ``sys.path``, so that a benchmark or a script imports a test
    module's pieces by its basename, whichever folder it is in and whichever tests pytest
    collected first (a test module imports only ``helpers``, never another test module).
    Basenames are unique across tests/ (pytest's default import mode needs that anyway)."""
    put_on_path(TESTS, *test_folders())
