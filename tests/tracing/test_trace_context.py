"""W3C traceparent and tracestate: read by the rules, refused with the rule broken,
made anew for a job without one."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sfc_host.tracing.context import (
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
    assert c.under("J1:a#1").flags == 0xFF


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


def test_a_new_trace_and_the_spans_under_it() -> None:
    t = new_trace()
    assert len(t.trace_id) == 32 and len(t.span_id) == 16 and t.sampled
    assert parse_traceparent(t.traceparent) == t
    kid = t.under("J1:a#1")
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


def test_stored_contexts_are_carried_on_as_the_span_a_key_names() -> None:
    from sfc_host.tracing.context import carried, from_stored, span_id_for, stored

    c = parse_traceparent(GOOD, "vendor=x")
    text = stored(c)
    assert from_stored(text) == c and from_stored(text.encode()) == c
    assert from_stored("") is None and from_stored("garbage") is None
    out = carried(text, "J1:tighten#1")
    span = span_id_for(c.trace_id, "J1:tighten#1")
    assert out == {"traceparent": f"00-{c.trace_id}-{span}-01", "tracestate": "vendor=x"}
    # derived, so any host names the span alike; another key, another span
    assert span == span_id_for(c.trace_id, "J1:tighten#1") != span_id_for(c.trace_id, "J1:a#1")
    assert carried("", "x") == {} and carried(None, "x") == {}
    under = c.under("mes:r1")
    assert under.trace_id == c.trace_id and under.span_id == span_id_for(c.trace_id, "mes:r1")
    assert under.flags == c.flags and under.state == c.state


def test_trace_url_is_an_http_address_with_the_trace_id() -> None:
    from sfc_host.config import ConfigError, HostConfig
    from sfc_host.web.pages import trace_item

    HostConfig(trace_url="https://grafana.example/explore?traceId={trace_id}")
    for bad in ("https://grafana.example/explore", "ftp://x/{trace_id}"):
        with pytest.raises(ConfigError, match="setting trace_url"):
            HostConfig(trace_url=bad)
    t = "4bf92f3577b34da6a3ce929d0e0e4736"
    assert f"<code>{t}</code>" in trace_item(t, "") and "href" not in trace_item(t, "")
    linked = trace_item(t, "https://g.example/e?a=1&traceId={trace_id}")
    assert f'href="https://g.example/e?a=1&amp;traceId={t}"' in linked
    assert trace_item(None, "https://g.example/{trace_id}").endswith(">-</dd>")


def test_a_script_publishes_in_a_trace(tmp_path: object) -> None:
    import asyncio
    import textwrap
    from pathlib import Path

    from sfc_host.engine import Engine

    folder = Path(str(tmp_path))
    (folder / "answer.py").write_text(textwrap.dedent(f"""\
        from sfc_host.engine import mission

        @mission
        async def answer(api, good):
            if good:
                await api.mqtt.publish("equipment/l1/responses", b"{{}}",
                                       traceparent="{GOOD}", tracestate="vendor=x")
            else:
                await api.mqtt.publish("equipment/l1/responses", b"{{}}",
                                       traceparent="00-bad")
            yield
    """))
    e = Engine(folder)
    got: list[dict[str, object]] = []

    async def main() -> None:
        await e.build()
        e.mqtt.subscribe("equipment/+/responses", lambda t, p, props: got.append(props))
        await e.start()
        assert await (await e.start_mission("answer", good=True)).join(5) == "Completed"
        bad = await e.start_mission("answer", good=False)
        assert await bad.join(5) == "Error"
        await e.stop()
        assert "api.mqtt.publish: traceparent '00-bad'" in str(bad.record)

    asyncio.run(main())
    assert got == [{"traceparent": GOOD, "tracestate": "vendor=x"}]


@given(st.text(alphabet="0123456789abcdef", min_size=32, max_size=32), st.text(max_size=40))
def test_a_span_id_as_a_number_is_the_same_id(trace_id: str, key: str) -> None:
    """The spans are written with ``span_int_for``, the wire carries ``span_id_for``: one
    id, so a station's span hangs under the attempt that sent its command."""
    from sfc_host.tracing.context import span_id_for, span_int_for

    assert span_int_for(trace_id, key) == int(span_id_for(trace_id, key), 16) != 0
