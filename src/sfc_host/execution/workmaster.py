"""Reading recipes as users hand them over: a Work Master file or a bare recipe."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sfc_fast import (
    MAX_RECIPE_BYTES,
    SCHEMA_V100,
    SCHEMA_V110,
    Graph,
    Problem,
    RecipeError,
    compile_recipe,
)
from sfc_host.errors import SfcHostError

SCHEMA_ALIASES = {
    "1.0.0": SCHEMA_V100,
    "v1.0.0": SCHEMA_V100,
    "1.1.0": SCHEMA_V110,
    "v1.1.0": SCHEMA_V110,
}


class UsageError(SfcHostError):
    """A user mistake on the command line: reported as one line, exit 2."""


@dataclass(frozen=True)
class LoadedRecipe:
    """The recipe of one file: its data and the dataschema it declares."""

    source: str
    data: Any
    dataschema: str
    work_master_id: str | None = None


def resolve_schema(name: str) -> str:
    """Accept the full URI or a short version (``1.1.0``)."""
    return SCHEMA_ALIASES.get(name, name)


def read_recipe_file(path: str | Path, dataschema: str | None = None) -> LoadedRecipe:
    """Read a Work Master (``{ID?, data, dataschema}``) or a bare recipe (``{Steps, ...}``).

    A missing file or a file that is not JSON raises ``UsageError`` / ``RecipeError``
    respectively; ``dataschema`` overrides or supplies the format.
    """
    p = Path(path)
    try:
        size = p.stat().st_size
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror or e}") from None
    if p.is_dir():
        raise UsageError(f"{path} is a folder, not a recipe file")
    if size > MAX_RECIPE_BYTES + 1024 * 1024:
        raise RecipeError([Problem("SFC015", "$", f"file is {size} bytes, the limit is "
                                                  f"{MAX_RECIPE_BYTES}")])
    raw = p.read_bytes()
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RecipeError([Problem("SFC014", "$", f"file is not JSON: {e}")]) from None
    except RecursionError:
        raise RecipeError([Problem("SFC014", "$", "file is nested too deeply")]) from None
    if isinstance(doc, dict) and "data" in doc:
        schema = dataschema or doc.get("dataschema")
        if schema is None:
            raise RecipeError([Problem("SFC014", "dataschema",
                                       "the Work Master has no dataschema")])
        data = doc["data"]
        wm_id = doc.get("ID")
        return LoadedRecipe(str(path), data, resolve_schema(str(schema)),
                            str(wm_id) if wm_id is not None else None)
    if dataschema is None:
        raise UsageError(f"{path} is a bare recipe: give its format with --dataschema "
                         f"(1.0.0 or 1.1.0)")
    return LoadedRecipe(str(path), doc, resolve_schema(dataschema))


def compile_file(path: str | Path, dataschema: str | None = None) -> tuple[LoadedRecipe, Graph]:
    loaded = read_recipe_file(path, dataschema)
    return loaded, compile_recipe(loaded.data, loaded.dataschema)


def example_files() -> list[Path]:
    """The example recipes shipped with the package (used by the demo)."""
    here = Path(__file__).parents[1] / "examples"
    return sorted(here.glob("*.json"))
