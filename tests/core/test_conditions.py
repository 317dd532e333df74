"""The condition language (docs/design.md#execution-rules): parsed at compile time, run
as bytecode."""

from __future__ import annotations

import pytest
from helpers.recipes import V110, linear

from sfc_fast import compile_recipe
from sfc_fast.conditions import ConditionSyntaxError, disassemble, evaluate


@pytest.mark.parametrize("text", ["", "always", "true", "  always  "])
def test_trivially_true_conditions_compile_to_nothing(text: str) -> None:
    assert disassemble(text) == ["TRUE"]
    assert evaluate(text)


@pytest.mark.parametrize("text,expected", [
    ("1 == 1", True), ("1 == 1.0", True), ("1 != 2", True), ("'a' == 'a'", True),
    ("'a' < 'b'", True), ("2 <= 2", True), ("3 > 2.5", True), ("-1 < 0", True),
    ("true == true", True), ("false", False), ("null", False), ("not null", True),
    ("1 in [1, 2]", True), ("3 in [1, 2]", False), ("3 not in [1, 2]", True),
    ("'ab' in 'cabd'", True), ("[1, 'a'] == [1, 'a']", True), ("[] == []", True),
    ("true and false", False), ("true or false", True), ("not (true and false)", True),
    ("1 == 1 and 2 == 2 and 3 == 3", True), ("1 == 2 or 2 == 3 or 3 == 3", True),
    ("true == 1", False), ("'1' == 1", False), ("1e3 == 1000", True), (".5 < 1", True),
])
def test_literals_and_operators(text: str, expected: bool) -> None:
    assert evaluate(text) is expected


def test_references_to_results_rounds_outcomes_and_job_parameters() -> None:
    results = {"tighten": {"torque": 85, "spindle": {"id": 4}}}
    assert evaluate("tighten.torque >= 80 and tighten.torque <= 90", results=results)
    assert evaluate("tighten.spindle.id == 4", results=results)
    assert evaluate("tighten._round < 3", rounds={"tighten": 2})
    assert not evaluate("tighten._round < 3", rounds={"tighten": 3})
    assert evaluate("tighten._outcome == 'completed'", outcomes={"tighten": "completed"})
    assert evaluate("job.mode == 'fast'", params={"mode": "fast"})
    assert evaluate("job.limits.max > 3", params={"limits": {"max": 4}})


def test_bare_names_look_in_step_results_newest_first_then_job_parameters() -> None:
    assert evaluate("torque_ok", bare=[{"torque_ok": True}, {"torque_ok": False}])
    assert not evaluate("torque_ok", bare=[{"torque_ok": False}, {"torque_ok": True}])
    assert evaluate("torque_ok", bare=[{"other": 1}], params={"torque_ok": True})
    assert not evaluate("torque_ok", bare=[], params={})


def test_missing_values_are_null_and_ordering_with_null_is_false() -> None:
    res = {"a": {}}
    assert not evaluate("a.x < 1", results=res)
    assert not evaluate("a.x >= 1", results=res)
    assert not evaluate("a.x > -1", results=res)
    assert evaluate("a.x == null", results=res)
    assert not evaluate("a.x != null", results=res)
    assert evaluate("a.x != null", results={"a": {"x": 0}})
    assert not evaluate("a.x in [null]", results=res)
    assert not evaluate("a.x.y == 1", results={"a": {"x": 5}})


def test_mixed_types_do_not_compare() -> None:
    assert not evaluate("'10' > 9")
    assert not evaluate("true > false")
    assert not evaluate("[1] < [2]")


def test_short_circuit_bytecode() -> None:
    code = disassemble("a.x == 1 and a.y == 2", ["a"])
    assert code[3].startswith("AND_JUMP")
    assert code[-2:] == ["BOOL", "END"]


def test_constant_lists_fold_and_lists_with_references_are_built() -> None:
    assert disassemble("x in [1, 2]") == ["LOAD bare:-1:x", "CONST [1,2]", "IN", "END"]
    code = disassemble("x in [1, y, 3]")
    assert "LIST 3" in code
    assert evaluate("x in [1, y, 3]", params={"x": 2, "y": 2})
    assert evaluate("x in [1, y or z, 3]", params={"x": True, "y": False, "z": 5})


@pytest.mark.parametrize("text", ["a ==", "(a", "a = 1", "!a", "a && b", "1 < 2 < 3",
                                  "'unterminated", "[1, 2", "a.b.", "3x", "- 'x'",
                                  "not", "a in", "'bad \\q escape'"])
def test_syntax_errors_carry_a_position(text: str) -> None:
    with pytest.raises(ConditionSyntaxError) as ei:
        evaluate(text)
    assert 0 <= ei.value.position <= len(text)


def test_deep_nesting_is_refused_not_a_crash() -> None:
    with pytest.raises(ConditionSyntaxError, match="nested too deeply"):
        evaluate("(" * 500 + "1" + ")" * 500)
    with pytest.raises(ConditionSyntaxError, match="nested too deeply"):
        evaluate("not " * 500 + "true")


def test_no_python_is_reachable_from_a_condition() -> None:
    for text in ["__import__('os').system('true')", "a.__class__", "().__class__",
                 "open('x')", "lambda: 1"]:
        with pytest.raises(ConditionSyntaxError):
            evaluate(text)


def test_graph_evaluates_a_compiled_transition() -> None:
    r = linear(2)
    r["Transitions"][0]["Condition"] = "a0.torque >= 80 and a0._round < 3"
    g = compile_recipe(r, V110)
    assert g.evaluate(0, results={"a0": {"torque": 81}}, rounds={"a0": 1})
    assert not g.evaluate(0, results={"a0": {"torque": 81}}, rounds={"a0": 3})
    assert not g.evaluate(0)


# Messages and positions as the first (tuple-per-token) parser gave them; the
# tokenizer over the string buffer must keep every one.
SYNTAX_ERRORS = [
    ("'\\q'", 'unknown escape \\q', 1),
    ("'abc", 'unterminated string', 0),
    ('a = b', "'=' is not an operator, use '=='", 2),
    ('a ! b', "'!' is not an operator, use 'not' or '!='", 2),
    ('a < b < c', "comparisons do not chain; use 'and' between them", 6),
    ('a in b in c', "comparisons do not chain; use 'and' between them", 7),
    ('(a', "expected ')'", 2),
    ('a)', "unexpected ')'", 1),
    ('[a, ]', "expected an operand, found ']'", 4),
    ('[1 2]', "expected ',' or ']'", 3),
    ("-'x'", "'-' applies to numbers only", 0),
    ('- true', "'-' applies to numbers only", 0),
    ('1x', "malformed number '1x'", 0),
    ('1.2.3', 'unexpected 0.3', 3),
    ('1e', "malformed number '1e'", 0),
    ('12abc', "malformed number '12a'", 0),
    ('x and', 'expected an operand, found the end', 5),
    ('or x', "expected an operand, found 'or'", 0),
    ('not', 'expected an operand, found the end', 3),
    ('not in x', "expected an operand, found 'in'", 4),
    ('a not b', "unexpected 'not'", 2),
    ('@', "unexpected character '@'", 0),
    ('é == 1', "unexpected character 'é'", 0),
    ('a..b', "unexpected character '.'", 1),
    ('a._round.x', '_round has no fields', 0),
    ('job._x', "unknown reserved field '_x'", 0),
    ('zz.y == 1', "unknown action 'zz' in 'zz.y' (use a bare name or job.zz)", 0),
    ("a.x == 'é😀", 'unterminated string', 7),
    ('x == 1 )', "unexpected ')'", 7),
]


@pytest.mark.parametrize(("text", "message", "position"), SYNTAX_ERRORS)
def test_syntax_error_messages_and_positions(text: str, message: str, position: int) -> None:
    with pytest.raises(ConditionSyntaxError) as ei:
        disassemble(text, ["a"])
    assert (ei.value.message, ei.value.position) == (message, position)


@pytest.mark.parametrize(("text", "code"), [
    ('andx or notin', ['LOAD bare:-1:andx', 'OR_JUMP 7', 'LOAD bare:-1:notin', 'BOOL', 'END']),
    ('in_ in [1, \'a\\\'b\\n\', "q\\\\"]',
     ['LOAD bare:-1:in_', 'CONST [1,"a\'b\\n","q\\\\"]', 'IN', 'END']),
    ('a.x >= -2.5e3 and not a._outcome',
     ['LOAD result:0:x', 'CONST -2500.0', 'GE', 'AND_JUMP 11', 'LOAD outcome:0:', 'NOT',
      'BOOL', 'END']),
    ('true == TRUE', ['CONST true', 'LOAD bare:-1:TRUE', 'EQ', 'END']),
    ('x not in [a.y, -1]',
     ['LOAD bare:-1:x', 'LOAD result:0:y', 'CONST -1', 'LIST 2', 'IN', 'NOT', 'END']),
    ('.5 < 1.', ['CONST 0.5', 'CONST 1.0', 'LT', 'END']),
    ('nullx != null', ['LOAD bare:-1:nullx', 'CONST null', 'NE', 'END']),
])
def test_keywords_only_as_whole_words_and_literals_as_before(text: str, code: list) -> None:
    assert disassemble(text, ["a"]) == code


def test_a_reference_compared_to_a_constant_decides_as_the_general_path() -> None:
    """`ref <op> constant` runs without the stack machine (the common shape); it must
    decide as the stack machine does, which `... and true` still goes through."""
    values = [None, True, False, 0, 1, 2, -1, 1.0, 2.5, float("inf"), "a", "b", "", [1],
              {"x": 1}, 10**20]
    consts = ["null", "true", "false", "0", "1", "2", "-1", "1.0", "2.5", "'a'", "'b'",
              "''", "[1]"]
    for op in ("==", "!=", "<", "<=", ">", ">="):
        for k in consts:
            text = f"t.v {op} {k}"
            assert len(disassemble(text, ["t"])) == 4             # the short shape
            assert len(disassemble(f"({text}) and true", ["t"])) > 4
            for v in values:
                results = {"t": {"v": v}}
                fast = evaluate(text, results=results)
                general = evaluate(f"({text}) and true", results=results)
                assert fast is general, (text, v)
