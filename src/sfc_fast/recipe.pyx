# cython: language_level=3
"""Recipe compiler's face: validates a v1.0.0 / v1.1.0 SFC recipe and builds its graph.

Every problem of a recipe is collected and reported at once (``RecipeError``). The
parts live in a module each: the problems (``problems``), canonical JSON
(``canonical``), the checks of one element (``checks``), the compiler's phases
(``compiler``), the graph (``graph``) and the layout of its bytes (``_layout.pxd``).
This module reads the input and names the recipe API in one place.
"""

from sfc_fast._layout cimport MAX_ELEMENTS as _MAX_ELEMENTS
from sfc_fast.compiler cimport build_graph
from sfc_fast.graph cimport graph_of

import gc
import json

from sfc_fast.canonical import canonical_json
from sfc_fast.checks import MAX_FIELD_CHARS, MAX_SECONDS, PLACEHOLDERS, V110_FIELDS
from sfc_fast.compiler import MAX_PARAMS_CHARS, MAX_RECIPE_BYTES
from sfc_fast.graph import (
    BRANCH_TYPE_NAMES, BRANCH_TYPES, INTERACTION_NAMES, INTERACTIONS, QUALIFIER_NAMES,
    QUALIFIERS, SCHEMA_V100, SCHEMA_V110, SCHEMAS, TRANSITION_KINDS, Graph, GraphFormatError,
)
from sfc_fast.problems import CODES, Problem, RecipeError

#: Largest number of elements of one kind (steps, actions, transitions, branches).
MAX_ELEMENTS = _MAX_ELEMENTS

__all__ = [
    "BRANCH_TYPES", "BRANCH_TYPE_NAMES", "CODES", "INTERACTIONS", "INTERACTION_NAMES",
    "MAX_ELEMENTS", "MAX_FIELD_CHARS", "MAX_PARAMS_CHARS", "MAX_RECIPE_BYTES", "MAX_SECONDS",
    "PLACEHOLDERS", "QUALIFIERS", "QUALIFIER_NAMES", "SCHEMAS", "SCHEMA_V100", "SCHEMA_V110",
    "TRANSITION_KINDS", "V110_FIELDS", "Graph", "GraphFormatError", "Problem", "RecipeError",
    "canonical_json", "compile_recipe", "schema_minor",
]


def schema_minor(dataschema) -> int:
    """0 for v1.0.0, 1 for v1.1.0; RecipeError for anything else."""
    if not isinstance(dataschema, str):
        raise RecipeError([Problem("SFC014", "dataschema",
                                   "dataschema must be a string naming the recipe format")])
    minor = SCHEMAS.get(dataschema)
    if minor is None:
        # tolerate a missing trailing slash, nothing else
        minor = SCHEMAS.get(dataschema + "/")
    if minor is None:
        raise RecipeError([Problem(
            "SFC014", "dataschema",
            f"unknown dataschema {dataschema[:200]!r}; accepted: {SCHEMA_V100}, {SCHEMA_V110}")])
    return minor


def _load(data):
    if isinstance(data, (bytes, bytearray, memoryview)):
        raw = bytes(data)
        if len(raw) > MAX_RECIPE_BYTES:
            raise RecipeError([Problem("SFC015", "$",
                                       f"recipe is {len(raw)} bytes, the limit is "
                                       f"{MAX_RECIPE_BYTES}")])
        try:
            data = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise RecipeError([Problem("SFC014", "$", f"recipe is not UTF-8 text: {e.reason} "
                                                      f"at byte {e.start}")]) from None
    if isinstance(data, str):
        if len(data) > MAX_RECIPE_BYTES:
            raise RecipeError([Problem("SFC015", "$",
                                       f"recipe is {len(data)} characters, the limit is "
                                       f"{MAX_RECIPE_BYTES}")])
        try:
            data = json.loads(data)
        except json.JSONDecodeError as e:
            raise RecipeError([Problem("SFC014", "$",
                                       f"recipe is not JSON: {e.msg} at line {e.lineno} "
                                       f"column {e.colno}")]) from None
        except RecursionError:
            raise RecipeError([Problem("SFC014", "$", "recipe is nested too deeply")]) from None
    return data


def compile_recipe(data, dataschema) -> Graph:
    """Validate a recipe and build its graph.

    ``data`` is the recipe (a dict, or its JSON as str/bytes); ``dataschema`` names
    its format (v1.0.0 or v1.1.0). Raises ``RecipeError`` listing every problem.
    """
    cdef int minor = schema_minor(dataschema)
    # A compile makes many short-lived objects (tokens, lists, tuples of references):
    # the cyclic collector would walk them again and again (a third of a big recipe's
    # compile time). None of them outlives the call in a cycle, so it is paused.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        blob = build_graph(_load(data), minor)
    finally:
        if was_enabled:
            gc.enable()
    return graph_of(blob)
