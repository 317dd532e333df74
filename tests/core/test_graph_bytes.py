"""The compiled graph: fingerprint, bytes round trip, and refusal of foreign bytes."""

from __future__ import annotations

import array
import contextlib
import json
import pickle
import random

import pytest
from helpers.recipes import V100, V110, chain, generated, linear, load_reference
from hypothesis import given, settings
from hypothesis import strategies as st

from sfc_fast import Graph, GraphFormatError, compile_recipe
from sfc_fast.conditions import CondBuilder


def _reorder_keys(obj):
    if isinstance(obj, dict):
        return {k: _reorder_keys(obj[k]) for k in reversed(list(obj))}
    if isinstance(obj, list):
        return [_reorder_keys(x) for x in obj]
    return obj


@pytest.mark.parametrize("name", ["axle_fit_qa.json", "paint_hold_restart.json",
                                  "tighten_rework.json"])
def test_fingerprint_is_stable_under_key_order_and_whitespace(name: str) -> None:
    wm = load_reference(name)
    a = compile_recipe(wm["data"], wm["dataschema"])
    b = compile_recipe(json.dumps(_reorder_keys(wm["data"]), indent=7), wm["dataschema"])
    assert a.fingerprint == b.fingerprint
    assert a.to_bytes() == b.to_bytes()


def test_fingerprint_changes_with_content_and_version() -> None:
    base = compile_recipe(linear(3), V110)
    r = linear(3)
    r["Actions"][1]["TimeoutSeconds"] = 11
    assert compile_recipe(r, V110).fingerprint != base.fingerprint
    r = linear(3)
    r["Actions"][0]["Parameters"] = {"a": 1}
    assert compile_recipe(r, V110).fingerprint != base.fingerprint
    assert compile_recipe(linear(3), V100).fingerprint != base.fingerprint
    assert len(base.fingerprint) == 32 and int(base.fingerprint, 16) >= 0


def test_bytes_round_trip_and_pickle() -> None:
    g = compile_recipe(generated(300), V110)
    h = Graph.from_bytes(g.to_bytes())
    assert h == g and h.fingerprint == g.fingerprint
    assert h.steps == g.steps and h.actions == g.actions
    assert [h.transition_info(i) for i in range(h.n_transitions)] == \
        [g.transition_info(i) for i in range(g.n_transitions)]
    assert pickle.loads(pickle.dumps(g)) == g
    assert Graph.from_bytes(bytearray(g.to_bytes())) == g
    assert Graph.from_bytes(memoryview(g.to_bytes())) == g


def test_arrays_are_views_of_the_tables() -> None:
    g = compile_recipe(load_reference("axle_fit_qa.json")["data"], V100)
    arr = g.arrays()
    assert list(arr["act_timeout_ms"]) == [30_000, 60_000, 45_000, 15_000]
    assert arr["step_act_off"][-1] == g.n_actions
    assert arr["node_out_off"][-1] == g.n_transitions
    with pytest.raises(ValueError):
        arr["act_timeout_ms"][0] = 1  # read-only


@pytest.mark.parametrize("data", [b"", b"SFCG", b"XXXX" + b"\0" * 200, b"\0" * 1000])
def test_foreign_bytes_are_refused(data: bytes) -> None:
    with pytest.raises(GraphFormatError):
        Graph.from_bytes(data)


def test_a_newer_major_format_is_refused_with_a_clear_error() -> None:
    blob = bytearray(compile_recipe(linear(2), V110).to_bytes())
    blob[4] = 9
    with pytest.raises(GraphFormatError, match="graph format 9"):
        Graph.from_bytes(bytes(blob))


def test_truncated_and_extended_bytes_are_refused() -> None:
    blob = compile_recipe(generated(50), V110).to_bytes()
    for n in (len(blob) - 1, len(blob) // 2, 100):
        with pytest.raises(GraphFormatError):
            Graph.from_bytes(blob[:n])
    with pytest.raises(GraphFormatError):
        Graph.from_bytes(blob + b"\0")


def test_wrong_type_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        Graph.from_bytes("text")  # type: ignore[arg-type]


def _touch_everything(g: Graph) -> None:
    for i in range(g.n_steps):
        g.step_info(i)
        g.outgoing(i)
    for i in range(g.n_actions):
        g.action_info(i)
    for i in range(g.n_transitions):
        g.transition_info(i)
        g.evaluate(i, results={"a1": {"ok": True}}, params={"mode": "x"})
    for i in range(g.n_branches):
        g.branch_info(i)


def test_corrupted_bytes_never_crash() -> None:
    """Flip random bytes of a valid graph: each load is refused or yields a graph whose
    every accessor and condition works (no crash, no hang)."""
    blob = compile_recipe(generated(40), V110).to_bytes()
    rng = random.Random(7)
    loaded = 0
    for _ in range(3000):
        b = bytearray(blob)
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        try:
            g = Graph.from_bytes(bytes(b))
        except GraphFormatError:
            continue
        loaded += 1
        with contextlib.suppress(KeyError, ValueError, IndexError):
            _touch_everything(g)
    assert loaded > 0  # some flips land in text or fingerprint and stay loadable


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600))
def test_random_bytes_are_refused(data: bytes) -> None:
    with pytest.raises(GraphFormatError):
        Graph.from_bytes(b"SFCG\x01\x00" + data)


def test_string_ids_stay_right_past_the_first_table_size() -> None:
    """A small recipe whose conditions name thousands of distinct fields: the compiler's
    string table outgrows the size it started with and rehashes; every reference still
    reads its own field, and JSON text (other key objects) gives the same bytes."""
    n = 3000
    r = chain(3)
    r["Transitions"][1]["Condition"] = " and ".join(f"a1.f{k} == {k}" for k in range(n))
    g = compile_recipe(r, V110)
    fields = {f"f{k}": k for k in range(n)}
    assert g.evaluate(1, results={"a1": fields})
    assert not g.evaluate(1, results={"a1": {**fields, f"f{n - 1}": -1}})
    # each string once: 2 condition texts, 3 each of action names, type ids, parameters
    # and step names, the segments ok and f0.., the constants false and 0..
    assert g.n_strings == 2 + 4 * 3 + 1 + n + 1 + n
    assert compile_recipe(json.dumps(r), V110).to_bytes() == g.to_bytes()


def test_condition_tables_hold_the_code_and_offsets() -> None:
    b = CondBuilder({"a0": 0, "a1": 1})
    assert [b.add(c) for c in ("a0.ok != false", "a1.x > 1 or job.m == 'x'",
                               "a0.ok != false", "always")] == [0, 1, 0, -1]
    code, offsets = b.tables()
    assert list(array.array("i", code)) == b.code
    assert list(array.array("i", offsets)) == b.offsets == [0, 6, len(b.code)]
    assert b.refs == [(0, 0, ("ok",)), (0, 1, ("x",)), (3, -1, ("m",))]
