"""Parameters are stored as canonical JSON (sorted keys, no whitespace, json's own
number and string forms). Flat objects take a hand-written writer; these tests hold it
to the text the general path (the json encoder) gives."""

from __future__ import annotations

import json

import pytest
from helpers.recipes import V110, linear
from hypothesis import given, settings
from hypothesis import strategies as st

from sfc_fast import RecipeError, compile_recipe


def _canonical(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)


def _stored_params(params) -> str | None:
    """Compile a two-step recipe with ``params`` on its first action; return the
    stored Parameters text read back from the graph bytes."""
    r = linear(2)
    r["Actions"][0]["Parameters"] = params
    g = compile_recipe(r, V110)
    t = g.arrays()
    sid = int(t["act_params"][0])
    if sid < 0:
        return None
    blob = g.to_bytes()
    off = t["str_off"]
    data = blob[len(blob) - int(off[-1]):]
    return data[int(off[sid]):int(off[sid + 1])].decode("utf-8")


SCALARS = [0, 1, -1, 7, -(2**63), 2**63 - 1, 2**63, -(2**63) - 1, 10**30, 1.5, -0.0, 0.0, 3.0,
           1e16, 1e22, 1e-7, 2.5e-10, 1e300, 5e-324, 0.1, 1 / 3, True, False, None, "",
           "x", "a\"b", "back\\slash", "\n\t\r\b\f", "\x00\x01\x1f\x7f", "é", "😀", "\u2028",
           "a" * 5000]

KEYS = ["a", "b", "A", "Z", "_", "", "1", "10", "9", "aa", "ab", "a b", "\"", "k\n", "é",
        "😀", "\x7f"]


@pytest.mark.parametrize("value", SCALARS, ids=repr)
def test_flat_values_are_stored_as_the_json_encoder_writes_them(value) -> None:
    params = {"v": value, "a": 1, "zz": "text"}
    assert _stored_params(params) == _canonical(params)


@pytest.mark.parametrize("key", KEYS, ids=repr)
def test_keys_are_sorted_by_code_point_and_escaped(key) -> None:
    params = {key: 1, "m": 2, "B": 3, "~": 4}
    assert _stored_params(params) == _canonical(params)


def test_empty_and_nested_and_many_keys() -> None:
    for params in ({}, {"a": {"b": [1, 2.5, None]}}, {"a": [1]},
                   {f"k{i}": i for i in range(100)}, {f"k{i}": 0.5 * i for i in range(33)}):
        assert _stored_params(params) == _canonical(params)


def test_non_finite_and_non_json_values_are_refused_as_before() -> None:
    for bad in (float("nan"), float("inf"), -float("inf"), object(), (1, 2)):
        if isinstance(bad, tuple):
            # a tuple is a JSON array for the encoder
            assert _stored_params({"a": bad}) == _canonical({"a": list(bad)})
            continue
        with pytest.raises(RecipeError) as e:
            _stored_params({"a": bad})
        assert e.value.codes == ["SFC013"]
        assert e.value.problems[0].path == "$.Actions[0].Parameters"


def test_subclasses_take_the_general_path() -> None:
    class D(dict):
        pass

    class S(str):
        pass

    class F(float):
        pass

    class I(int):  # noqa: E742
        pass

    for params in (D(a=1, b="x"), {"a": S("x")}, {"a": F(2.5)}, {"a": I(3)}, {S("k"): 1}):
        assert _stored_params(params) == _canonical(params)


json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.text(max_size=30),
    st.floats(allow_nan=False, allow_infinity=False))


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.text(max_size=12), json_scalars, max_size=40))
def test_any_flat_object_matches_the_encoder(params) -> None:
    try:
        expected = _canonical(params)
        expected.encode("utf-8")
    except UnicodeEncodeError:
        # lone surrogates have no UTF-8 form: the recipe is refused either way
        with pytest.raises(RecipeError):
            _stored_params(params)
        return
    assert _stored_params(params) == expected


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=1, max_size=200))
def test_repeated_floats_keep_their_own_text(values) -> None:
    # the writer remembers recent float texts; -0.0 and 0.0, and values that share a
    # cache slot, must still come out as their own repr
    r = linear(len(values) + 1)
    for i, v in enumerate(values):
        r["Actions"][i]["Parameters"] = {"v": v, "w": -v}
    g = compile_recipe(r, V110)
    for i, v in enumerate(values):
        assert g.action_info(i)["parameters"] == {"v": v, "w": -v}
    blob = g.to_bytes()
    for v in values:
        assert _canonical({"v": v, "w": -v}).encode() in blob


@pytest.mark.parametrize("n", [4080, 4085, 4088, 4090, 4094, 4095, 4096, 4100])
def test_objects_near_the_writer_buffer_size(n: int) -> None:
    for filler in ("x", "\x01"):
        for params in ({"a": filler * (n // len(filler) // (6 if filler == "\x01" else 1))},
                       {"a": "x" * (n - 20), "b": 1.5, "c": 12345678901234},
                       {f"k{i:03d}": "y" * (n // 32) for i in range(32)}):
            assert _stored_params(params) == _canonical(params)


def test_escaped_text_that_fills_the_writer_buffer_exactly() -> None:
    # '{"abcd":' is 8 characters, 681 escaped controls are 6 each, plus 2 quotes: 4096
    for params in ({"abcd": "\x01" * 681}, {"abcd": "\x01" * 681, "b": None},
                   {"abcd": "\x01" * 680 + "x"}, {"abcd": "\x01" * 682}):
        assert _stored_params(params) == _canonical(params)
