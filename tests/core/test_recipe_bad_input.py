"""Bad input to the compiler: a RecipeError every time, never a crash or a hang."""

from __future__ import annotations

import copy
import json
import time
from typing import Any

import pytest
from helpers.recipes import V100, V110, generated, linear
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sfc_fast import Graph, RecipeError, compile_recipe

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**12, 10**12) | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda children: st.lists(children, max_size=5)
    | st.dictionaries(st.text(max_size=12), children, max_size=5),
    max_leaves=40,
)

FIELDS = ["Steps", "Transitions", "Actions", "Branches", "Name", "Initial", "Source",
          "Target", "Condition", "Priority", "Step", "Qualifier", "Interaction", "TypeId",
          "TimeoutSeconds", "Parameters", "HoldTypeId", "RestartTypeId", "Retries",
          "HoldTimeoutSeconds", "DurationSeconds", "Match", "Type", "Subject"]


def _compile_or_refuse(data: Any, schema: str) -> Graph | None:
    try:
        return compile_recipe(data, schema)
    except RecipeError as e:
        assert e.problems and all(p.code.startswith("SFC") for p in e.problems)
        return None


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(json_values, st.sampled_from([V100, V110]))
def test_any_json_value_compiles_or_is_refused(value: Any, schema: str) -> None:
    _compile_or_refuse(value, schema)
    _compile_or_refuse(json.dumps(value), schema)


def _mutate(recipe: dict, path: list, value: Any) -> dict:
    r = copy.deepcopy(recipe)
    node: Any = r
    for key in path[:-1]:
        if isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, list) and isinstance(key, int) and node:
            node = node[key % len(node)]
        else:
            return r
    last = path[-1]
    if isinstance(node, dict):
        node[last if isinstance(last, str) else FIELDS[last % len(FIELDS)]] = value
    elif isinstance(node, list) and node:
        node[(last if isinstance(last, int) else 0) % len(node)] = value
    return r


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(FIELDS) | st.integers(0, 20), min_size=1, max_size=4),
       json_values, st.sampled_from([V100, V110]))
def test_mutated_recipes_compile_or_are_refused(path: list, value: Any, schema: str) -> None:
    base = generated(30, branch_every=5)
    g = _compile_or_refuse(_mutate(base, path, value), schema)
    if g is not None:
        assert Graph.from_bytes(g.to_bytes()) == g


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=60))
def test_any_condition_text_compiles_or_is_refused(text: str) -> None:
    r = linear(2)
    r["Transitions"][0]["Condition"] = text
    g = _compile_or_refuse(r, V110)
    if g is not None:
        g.evaluate(0, results={"a0": {"x": 1}}, params={"y": [1, 2]})


@pytest.mark.parametrize("make", [
    lambda: "[" * 100_000 + "]" * 100_000,                    # deep JSON text
    lambda: {"Steps": [{"Name": "A", "Initial": True, "Description": _deep(5000)}],
             "Transitions": [], "Actions": []},                 # deep Python object
    lambda: {"Steps": [{"Name": "A", "Initial": True}], "Transitions": [],
             "Actions": [{"Name": "a", "Step": "A", "Qualifier": "N",
                          "Interaction": "push_command", "TypeId": "t", "TimeoutSeconds": 1,
                          "Parameters": {"p": _deep(5000)}}]},  # deep parameters
    lambda: {"Steps": [{"Name": f"S{i}"} for i in range(200_000)], "Transitions": [],
             "Actions": []},                                   # too many steps
    lambda: "{" + '"a":1,' * 2_000_000 + '"b":2}',             # 14 MB of text
])
def test_pathological_inputs_are_refused_quickly(make) -> None:
    data = make()
    t0 = time.perf_counter()
    with pytest.raises(RecipeError):
        compile_recipe(data, V110)
    assert time.perf_counter() - t0 < 5


def _deep(n: int) -> Any:
    v: Any = 1
    for _ in range(n):
        v = [v]
    return v


def test_a_10mb_recipe_of_many_steps_is_refused_as_too_large() -> None:
    r = generated(2000)
    r["Description"] = "x" * (10 * 1024 * 1024)
    with pytest.raises(RecipeError) as ei:
        compile_recipe(json.dumps(r), V110)
    assert ei.value.codes == ["SFC015"]


def test_large_recipes_within_limits_compile() -> None:
    g = compile_recipe(generated(10_000), V110)
    assert g.n_steps == 10_000


def test_lone_surrogate_in_recipe_text_is_a_recipe_error() -> None:
    """json.loads accepts a lone surrogate; the compiler refuses it instead of raising."""
    import pytest as _pytest

    from sfc_fast import RecipeError, compile_recipe

    r = {"Steps": [{"Name": "A", "Initial": True}], "Transitions": [],
         "Actions": [{"Name": "a", "Step": "A", "Qualifier": "N",
                      "Interaction": "push_command", "TypeId": "x\ud800",
                      "TimeoutSeconds": 5}]}
    with _pytest.raises(RecipeError) as e:
        compile_recipe(r, "https://aschamberger.github.io/schemas/microdcs/sfc-recipe/v1.0.0/")
    assert "SFC014" in e.value.codes
