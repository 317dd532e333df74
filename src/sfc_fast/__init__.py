"""sfc-fast: the compiled core of the recipe-execution host.

Pure functions over array-based graphs: the recipe compiler, conditions, and (as
they land) evolve, the deadline index and the table-driven state machines.
No I/O, no clock: time comes in as integer milliseconds.
"""

from sfc_fast.recipe import (
    SCHEMA_V100,
    SCHEMA_V110,
    Graph,
    GraphFormatError,
    Problem,
    RecipeError,
    compile_recipe,
)

__all__ = [
    "SCHEMA_V100",
    "SCHEMA_V110",
    "Graph",
    "GraphFormatError",
    "Problem",
    "RecipeError",
    "compile_recipe",
]

__version__ = "0.1.0"
