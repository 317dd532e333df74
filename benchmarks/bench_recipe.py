"""Recipe compiler and graph loading (pytest-benchmark).

    python -m pytest benchmarks/bench_recipe.py --benchmark-only

Targets: compile a generated 1,000-step recipe (branches and conditions) under 2 ms;
load its graph from bytes under 50 µs; the same for a 1,000-step chain with a condition
on every transition (report_cost.py's chain: each reads the previous action's result;
parameters on every action).
"""

from __future__ import annotations

import json

import pytest
from helpers.recipes import V110, chain, generated

from sfc_fast import Graph, compile_recipe

RECIPE_1000 = generated(1000)
CHAIN_1000 = chain(1000)
TEXT_1000 = json.dumps(RECIPE_1000)
BLOB_1000 = compile_recipe(RECIPE_1000, V110).to_bytes()


def test_compile_1000_steps_from_dict(benchmark) -> None:
    g = benchmark(compile_recipe, RECIPE_1000, V110)
    assert g.n_steps == 1000


def test_compile_1000_step_chain_condition_on_every_transition(benchmark) -> None:
    g = benchmark(compile_recipe, CHAIN_1000, V110)
    assert g.n_steps == 1000 and sum(1 for t in CHAIN_1000["Transitions"]
                                     if t["Condition"] != "always") == 999


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
