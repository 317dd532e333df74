"""The source stays ruff clean (the test extra installs ruff)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.servers import in_ci

REPO = Path(__file__).resolve().parents[2]


def test_ruff_clean() -> None:
    ruff = Path(sys.executable).parent / "ruff"
    exe = str(ruff) if ruff.exists() else shutil.which("ruff")
    if exe is None:
        if in_ci():
            pytest.fail("ruff is not installed (it is in the test extra)")
        pytest.skip("ruff not installed")
    p = subprocess.run([exe, "check", "--no-cache", "--output-format", "concise",
                        "src", "tests", "benchmarks", "setup.py"],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
