"""The hot modules of sfc_fast are compiled extension modules, not Python files."""

from __future__ import annotations

import importlib
import importlib.machinery
from pathlib import Path

import pytest

HOT = ["sfc_fast.recipe", "sfc_fast.problems", "sfc_fast.canonical", "sfc_fast.checks",
       "sfc_fast.compiler", "sfc_fast.graph", "sfc_fast.conditions", "sfc_fast.evolve",
       "sfc_fast.state", "sfc_fast.events", "sfc_fast.deadlines", "sfc_fast.runner",
       "sfc_fast.machines", "sfc_fast.wire.mqtt5", "sfc_fast.wire.resp",
       "sfc_fast.wire.uabinary"]


@pytest.mark.parametrize("name", HOT)
def test_hot_module_is_an_extension_module(name: str) -> None:
    mod = importlib.import_module(name)
    path = Path(mod.__file__ or "")
    assert path.suffix in (".so", ".pyd"), f"{name} loaded from {path}"
    assert any(str(path).endswith(s) for s in importlib.machinery.EXTENSION_SUFFIXES)
    assert isinstance(mod.__loader__, importlib.machinery.ExtensionFileLoader)


def test_stubs_ship_next_to_the_compiled_modules() -> None:
    import sfc_fast

    pkg = Path(sfc_fast.__file__).parent
    for name in HOT:
        assert (pkg.parent / (name.replace(".", "/") + ".pyi")).exists(), name
    assert (pkg / "py.typed").exists()
