"""W3C traceparent and tracestate: read by the rules, refused with the rule broken,
made anew for a job without one."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sfc_host.tracing import (
    InvalidTraceParent,
    TraceContext,
    new_trace,
    parse_traceparent,
    valid_tracestate,
)

GOOD = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_a_valid_traceparent_is_read_field_by_field() -> None:
    c = parse_traceparent(GOOD)
    assert c == TraceContext("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", 1)
    assert c.sampled and c.traceparent == GOOD
    assert parse_traceparent(GOOD.encode()) == c
    assert not parse_traceparent(GOOD[:-2] + "00").sampled


def test_unknown_flags_are_kept() -> None:
    c = parse_traceparent(GOOD[:-2] + "ff")
    assert c.flags == 0xFF and c.sampled and c.traceparent.endswith("-ff")
    assert c.child().flags == 0xFF


@pytest.mark.parametrize(("value", "rule"), [
    (GOOD.upper(), "lower-case hex"),
    ("ff" + GOOD[2:], "version ff"),
    (GOOD + "-extra", "version 00 is 55"),
    (GOOD[:-1], "at least 55"),
    ("00-" + "0" * 32 + "-00f067aa0ba902b7-01", "trace-id is all zeros"),
    ("00-4bf92f3577b34da6a3ce929d0e0e4736-" + "0" * 16 + "-01", "parent-id is all zeros"),
    (GOOD.replace("-", "_", 1), "separated by '-'"),
    ("00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01", "trace-id"),
    ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902bz-01", "parent-id"),
    (GOOD[:-2] + "0x", "flags"),
    (b"\xff" * 55, "ASCII"),
    (None, "not text"),
    ("", "at least 55"),
])
def test_a_broken_rule_is_named(value: object, rule: str) -> None:
    with pytest.raises(InvalidTraceParent, match=rule):
        parse_traceparent(value)


def test_a_later_version_is_read_past_its_extra_fields() -> None:
    c = parse_traceparent("cc" + GOOD[2:] + "-what-comes-later")
    assert c.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736" and c.flags == 1
    with pytest.raises(InvalidTraceParent, match="follow a '-'"):
        parse_traceparent("cc" + GOOD[2:] + "x")
    # what we send on is our own version
    assert c.traceparent.startswith("00-")


def test_tracestate_is_kept_when_valid_and_dropped_whole_when_not() -> None:
    assert valid_tracestate("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE") == \
        "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"
    assert valid_tracestate(" a=1 , ,b@vendor=x y ") == "a=1,b@vendor=x y"
    assert valid_tracestate("a=1,a=2") == ""            # a key twice
    assert valid_tracestate("A=1") == ""                # keys are lower case
    assert valid_tracestate("a=") == ""
    assert valid_tracestate(",".join(f"k{i}=v" for i in range(33))) == ""
    assert valid_tracestate("a=" + "x" * 600) == ""
    assert valid_tracestate(None) == "" and valid_tracestate(b"\xff=1") == ""
    c = parse_traceparent(GOOD, "bad state")
    assert c.state == "" and c.trace_id    # a bad tracestate does not refuse the context


def test_a_new_trace_and_its_children() -> None:
    t = new_trace()
    assert len(t.trace_id) == 32 and len(t.span_id) == 16 and t.sampled
    assert parse_traceparent(t.traceparent) == t
    kid = t.child()
    assert kid.trace_id == t.trace_id and kid.span_id != t.span_id
    assert not new_trace(sampled=False).sampled
    assert len({new_trace().trace_id for _ in range(1000)}) == 1000


@given(st.one_of(st.text(max_size=80), st.binary(max_size=80)))
def test_any_input_is_read_or_refused_never_crashes(value: str | bytes) -> None:
    try:
        c = parse_traceparent(value)
    except InvalidTraceParent:
        return
    assert len(c.trace_id) == 32 and len(c.span_id) == 16 and 0 <= c.flags <= 255
