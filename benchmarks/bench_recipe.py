"""Recipe compiler and graph loading (pytest-benchmark).

    python -m pytest benchmarks/bench_recipe.py --benchmark-only

Goals (issue 2): compile a generated 1,000-step recipe (branches and conditions)
under 2 ms; load its graph from bytes under 50 µs.
"""

from __future__ import annotations

import json

import pytest
from recipes import V110, generated

from sfc_fast import Graph, compile_recipe

RECIPE_1000 = generated(1000)
TEXT_1000 = json.dumps(RECIPE_1000)
BLOB_1000 = compile_recipe(RECIPE_1000, V110).to_bytes()


def test_compile_1000_steps_from_dict(benchmark) -> None:
    g = benchmark(compile_recipe, RECIPE_1000, V110)
    assert g.n_steps == 1000


def test_compile_1000_steps_from_json_text(benchmark) -> None:
    g = benchmark(compile_recipe, TEXT_1000, V110)
    assert g.n_steps == 1000


def test_graph_from_bytes_1000_steps(benchmark) -> None:
    g = benchmark(Graph.from_bytes, BLOB_1000)
    assert g.n_steps == 1000


@pytest.mark.parametrize("n", [10, 100, 10_000])
def test_compile_scaling(benchmark, n: int) -> None:
    r = generated(n)
    g = benchmark(compile_recipe, r, V110)
    assert g.n_steps == n
