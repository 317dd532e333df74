"""The compiled OTLP protobuf encoder, ``sfc_fast.wire.otlp.encode_spans``: the body of
``OtlpExporter``'s ``http/protobuf`` requests (the HTTP side is in test_otlp_exporter.py).

It writes the bytes of an ``ExportTraceServiceRequest`` itself, so it is checked
against what does not share its code:

- the SDK's own encoder (``opentelemetry.exporter.otlp.proto.common.trace_encoder``),
  on the same spans: ours is parsed with ``ExportTraceServiceRequest.FromString`` and
  compared with the SDK's message field by field, then as a whole once the differences
  by design are made as ours has them (``_as_ours``). Those differences:

  - span and link ``flags``: ours carry the W3C trace flags in the low byte as well as
    0x100 and 0x200 (the parent, or the linked context, is remote); the SDK writes only
    the latter two;
  - a link's ``trace_state``: ours writes it, the SDK leaves it out;
  - an UNSET status or a span without a scope: ours leaves the empty message out, the
    SDK writes it (the same values when read);
  - an int beyond int64: ours writes its digits as a string value, the SDK drops the
    attribute (tested on ours alone).

- protobuf's own serializer: the bytes are exactly what it writes for the message they
  parse to (fields in field-number order, proto3 defaults left out, every length in
  the fewest bytes), so a nested message's length, for which the encoder reserves room
  and then shifts the message into place, is checked at each varint size;
- sizes that make the buffer grow: 5,000 spans, 2,000 attributes a span, megabyte
  strings.
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import (
    encode_spans as sdk_encode_spans,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope as PbScope
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.span import TraceState

from sfc_fast.wire.otlp import encode_entries, encode_spans, span_entry, span_record
from sfc_host.tracing.batch import PlainSpan

# ids with leading zero bytes: an encoder that trims them shows up at once
TRACE_A = 0x0AF7651916CD43DD8448EB211C80319C
TRACE_B = 0x00000000000000000000000000ABCDEF
T0 = 1_700_000_000_123_456_789

SPAN_FLAGS_REMOTE_BITS = 0x300      # HAS_IS_REMOTE | IS_REMOTE
W3C_FLAGS_BYTE = 0xFF
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def _ctx(trace_id: int, span_id: int, *, flags: int = 0x01, remote: bool = False,
         state: TraceState | None = None) -> SpanContext:
    return SpanContext(trace_id, span_id, remote, TraceFlags(flags), state)


# ---- spans of two resources and two scopes, interleaved, with every kind of field


RES_A = Resource({"service.name": "sfc-host", "service.instance.id": "host-a",
                  "process.pid": 4242, "host.cpu.ratio": 0.5, "deploy.canary": True,
                  "deploy.tags": ["blue", "eu"]},
                 schema_url="https://opentelemetry.io/schemas/1.26.0")
RES_B = Resource({"service.name": "other-service", "ключ": "значение"})   # no schema_url
SCOPE_1 = InstrumentationScope("sfc_host", "1.2.3", "https://opentelemetry.io/schemas/1.27.0",
                               {"sfc.role": "host", "sfc.shards": 4})
SCOPE_2 = InstrumentationScope("other.library")     # version None: no version field

# every value the SDK's encoder takes (NaN aside: NaN != NaN, so messages holding one
# never compare equal; it has a test of its own)
EVERY_TYPE: dict[str, Any] = {
    "s": "text",
    "s_unicode": "ünïcödé ✓ 日本語 🚀",
    "s_empty": "",                  # a oneof member: written although it is the default
    "b_true": True,
    "b_false": False,               # likewise
    "i_zero": 0,
    "i": 42,
    "i_neg": -7,                    # a negative int64: a 10-byte varint
    "i_big": 2**62 + 1,
    "i_min": INT64_MIN,
    "i_max": INT64_MAX,
    "f": 1.25,
    "f_neg": -0.5,
    "f_zero": 0.0,
    "f_negzero": -0.0,
    "f_tiny": 5e-324,
    "f_inf": math.inf,
    "f_ninf": -math.inf,
    "bytes": b"\x00\xff binary",
    "bytes_empty": b"",
    "list_s": ["a", "", "ü"],
    "list_i": [1, -1, INT64_MAX, INT64_MIN],
    "list_b": [True, False],
    "list_f": [0.5, -2.0],
    "list_empty": [],
    "tuple": ("x", 1),
    "list_mixed": ["a", 1, 2.5, True, None, b"\x01"],
    "list_nested": [[1, 2], ["x", [True]]],
    "list_of_dicts": [{"k": "v"}, {}],
    "dict": {"k": "v", "n": -1, "nested": {"deep": [1, {"deeper": None}]}},
    "dict_empty": {},
    "dict_int_keys": {1: "one", 2: 2},  # a key that is not a str: its str, as the SDK's
    "none": None,                   # a KeyValue with an empty value
    "ключ.ü": "a unicode key",
}


def _rich_spans() -> list[ReadableSpan]:
    """Seven spans over (RES_A, SCOPE_1), (RES_A, SCOPE_2), (RES_B, SCOPE_1) and
    (RES_B, SCOPE_2), interleaved so the grouping has to gather them: every SpanKind,
    parents remote, local and none, trace flags 0, 1 and 3, every status."""
    server = ReadableSpan(
        "GET /orders", _ctx(TRACE_A, 0x00F067AA0BA902B7, state=TraceState(
            [("vendor", "abc"), ("ot", "p:8")])),
        _ctx(TRACE_A, 0x1111111111111111, remote=True), RES_A, EVERY_TYPE,
        events=(Event("exception", {"exception.type": "ValueError", "attempt": 2,
                                    "exception.stacktrace": "línea 1\nlínea 2"},
                      timestamp=T0 + 500),
                Event("no attributes", timestamp=T0 + 600),
                Event("ünïcode ✓", {"nested": {"k": [1, None]}}, timestamp=T0 + 700)),
        links=(Link(_ctx(TRACE_B, 0x2222222222222222, remote=True, state=TraceState(
                   [("linked", "yes")])), {"link.kind": "answer", "n": 3}),
               Link(_ctx(TRACE_A, 0x3333333333333333, flags=0x00)),
               Link(_ctx(TRACE_B, 0x0000000000000001, flags=0x03, remote=True))),
        kind=SpanKind.SERVER, status=Status(StatusCode.ERROR, "boom: it broke ✗"),
        start_time=T0, end_time=T0 + 1_000_001, instrumentation_scope=SCOPE_1)
    client = ReadableSpan(
        "send", _ctx(TRACE_A, 0x4444444444444444, flags=0x00),
        _ctx(TRACE_A, 0x00F067AA0BA902B7), RES_A, {"peer": "x"},
        kind=SpanKind.CLIENT, status=Status(StatusCode.OK),
        start_time=T0 + 10, end_time=T0 + 20, instrumentation_scope=SCOPE_2)
    producer = ReadableSpan(
        "publish", _ctx(TRACE_B, 0x5555555555555555, flags=0x03), None, RES_B, None,
        kind=SpanKind.PRODUCER, start_time=T0 + 30, end_time=T0 + 40,
        instrumentation_scope=SCOPE_1)
    internal = ReadableSpan(
        "work", _ctx(TRACE_A, 0x6666666666666666), _ctx(TRACE_A, 0x00F067AA0BA902B7),
        RES_A, {"step": 1}, kind=SpanKind.INTERNAL, status=Status(StatusCode.ERROR),
        start_time=T0 + 50, end_time=T0 + 60, instrumentation_scope=SCOPE_1)
    consumer = ReadableSpan(
        "process", _ctx(TRACE_B, 0x7777777777777777),
        _ctx(TRACE_B, 0x5555555555555555, remote=True, flags=0x03), RES_B, {"q": "jobs"},
        links=(Link(_ctx(TRACE_A, 0x4444444444444444, remote=True, state=TraceState(
            [("a", "1"), ("b", "2")])), {"why": ["retry", None]}),),
        kind=SpanKind.CONSUMER, start_time=T0 + 70, end_time=T0 + 80,
        instrumentation_scope=SCOPE_2)
    unicode = ReadableSpan(
        "работа ✓", _ctx(TRACE_B, 0x8888888888888888), None, RES_B, {"ü": "ü"},
        kind=SpanKind.INTERNAL, start_time=T0 + 90, end_time=T0 + 91,
        instrumentation_scope=SCOPE_1)
    root = ReadableSpan(
        "GET /health", _ctx(TRACE_A, 0x9999999999999999), None, RES_A, {},
        kind=SpanKind.SERVER, status=Status(StatusCode.OK), start_time=T0 + 100,
        end_time=T0 + 101, instrumentation_scope=SCOPE_2)
    return [server, client, producer, internal, consumer, unicode, root]


RICH_LAYOUT = [
    ("sfc-host", [("sfc_host", ["GET /orders", "work"]),
                  ("other.library", ["send", "GET /health"])]),
    ("other-service", [("sfc_host", ["publish", "работа ✓"]),
                       ("other.library", ["process"])]),
]


# ---- reading ours, comparing with the SDK's


def _ours(batch: Sequence[ReadableSpan]) -> tuple[bytes, ExportTraceServiceRequest]:
    body = encode_spans(batch)
    return body, ExportTraceServiceRequest.FromString(body)


def _layout(request: ExportTraceServiceRequest) -> list[tuple[str, list[tuple[str, list[str]]]]]:
    """(service name, [(scope name, [span names])]): a request's grouping at a glance."""
    return [(next(kv.value.string_value for kv in rs.resource.attributes
                  if kv.key == "service.name"),
             [(ss.scope.name, [span.name for span in ss.spans]) for ss in rs.scope_spans])
            for rs in request.resource_spans]


def _sources(batch: Sequence[ReadableSpan]) -> dict[bytes, ReadableSpan]:
    """The spans by their encoded span id (unique in each batch here)."""
    by_id = {s.context.span_id.to_bytes(8, "big"): s for s in batch}
    assert len(by_id) == len(batch)
    return by_id


def _state_header(ctx: SpanContext) -> str:
    return ctx.trace_state.to_header() if ctx.trace_state else ""


def _assert_span_matches(ours: PbSpan, sdk: PbSpan, source: ReadableSpan) -> None:
    """Every field of ``ours`` as the SDK has it, but the W3C flags byte and a link's
    trace state, which the SDK does not write: those are checked against ``source``."""
    where = ours.name
    assert ours.trace_id == sdk.trace_id, where
    assert ours.span_id == sdk.span_id, where
    assert ours.trace_state == sdk.trace_state, where
    assert ours.parent_span_id == sdk.parent_span_id, where
    assert ours.name == sdk.name, where
    assert ours.kind == sdk.kind, where
    assert ours.start_time_unix_nano == sdk.start_time_unix_nano, where
    assert ours.end_time_unix_nano == sdk.end_time_unix_nano, where
    assert list(ours.attributes) == list(sdk.attributes), where
    assert ours.dropped_attributes_count == sdk.dropped_attributes_count, where
    assert list(ours.events) == list(sdk.events), where
    assert ours.dropped_events_count == sdk.dropped_events_count, where
    assert len(ours.links) == len(sdk.links) == len(source.links), where
    for ol, sl, link in zip(ours.links, sdk.links, source.links, strict=True):
        assert ol.trace_id == sl.trace_id, where
        assert ol.span_id == sl.span_id, where
        assert ol.trace_state == _state_header(link.context), where
        assert list(ol.attributes) == list(sl.attributes), where
        assert ol.dropped_attributes_count == sl.dropped_attributes_count, where
        assert ol.flags & SPAN_FLAGS_REMOTE_BITS == sl.flags & SPAN_FLAGS_REMOTE_BITS, where
        assert ol.flags & W3C_FLAGS_BYTE == int(link.context.trace_flags), where
        assert ol.flags & ~(SPAN_FLAGS_REMOTE_BITS | W3C_FLAGS_BYTE) == 0, where
    assert ours.dropped_links_count == sdk.dropped_links_count, where
    assert ours.status.code == sdk.status.code, where
    assert ours.status.message == sdk.status.message, where
    assert ours.flags & SPAN_FLAGS_REMOTE_BITS == sdk.flags & SPAN_FLAGS_REMOTE_BITS, where
    assert ours.flags & W3C_FLAGS_BYTE == int(source.context.trace_flags), where
    assert ours.flags & ~(SPAN_FLAGS_REMOTE_BITS | W3C_FLAGS_BYTE) == 0, where


def _assert_matches_sdk(ours: ExportTraceServiceRequest, batch: Sequence[ReadableSpan]) -> None:
    """``ours`` and the SDK's message for ``batch`` agree field by field."""
    sdk = sdk_encode_spans(batch)
    source = _sources(batch)
    assert len(ours.resource_spans) == len(sdk.resource_spans)
    for o_rs, s_rs in zip(ours.resource_spans, sdk.resource_spans, strict=True):
        assert list(o_rs.resource.attributes) == list(s_rs.resource.attributes)
        assert o_rs.resource.dropped_attributes_count == s_rs.resource.dropped_attributes_count
        assert o_rs.schema_url == s_rs.schema_url
        assert len(o_rs.scope_spans) == len(s_rs.scope_spans)
        for o_ss, s_ss in zip(o_rs.scope_spans, s_rs.scope_spans, strict=True):
            assert o_ss.scope.name == s_ss.scope.name
            assert o_ss.scope.version == s_ss.scope.version
            assert list(o_ss.scope.attributes) == list(s_ss.scope.attributes)
            assert o_ss.scope.dropped_attributes_count == s_ss.scope.dropped_attributes_count
            assert o_ss.schema_url == s_ss.schema_url
            assert len(o_ss.spans) == len(s_ss.spans)
            for o_span, s_span in zip(o_ss.spans, s_ss.spans, strict=True):
                _assert_span_matches(o_span, s_span, source[o_span.span_id])


def _as_ours(batch: Sequence[ReadableSpan]) -> ExportTraceServiceRequest:
    """The SDK's message for ``batch`` with the differences by design made as ours has
    them: what is left to differ is a mistake, whatever field it is in."""
    request = sdk_encode_spans(batch)
    source = _sources(batch)
    for rs in request.resource_spans:
        for ss in rs.scope_spans:
            if ss.scope == PbScope():
                ss.ClearField("scope")
            for span in ss.spans:
                s = source[span.span_id]
                span.flags |= int(s.context.trace_flags)
                for pb_link, link in zip(span.links, s.links, strict=True):
                    pb_link.flags |= int(link.context.trace_flags)
                    pb_link.trace_state = _state_header(link.context)
                if span.status.code == 0 and not span.status.message:
                    span.ClearField("status")
    return request


def _assert_canonical(body: bytes) -> None:
    """``body`` is, byte for byte, what protobuf's serializer writes for the message it
    parses to."""
    assert ExportTraceServiceRequest.FromString(body).SerializeToString(
        deterministic=True) == body


def _span(name: str, span_id: int, attributes: dict[str, Any] | None = None, *,
          resource: Resource = RES_A,
          scope: InstrumentationScope | None = SCOPE_1) -> ReadableSpan:
    """A plain span with ``attributes``: what the value and size tests need."""
    return ReadableSpan(name, _ctx(TRACE_A, span_id), None, resource, attributes,
                        start_time=T0, end_time=T0 + 1, instrumentation_scope=scope)


def _attrs(request: ExportTraceServiceRequest) -> dict[str, AnyValue]:
    """The first span's attributes by key."""
    return {kv.key: kv.value
            for kv in request.resource_spans[0].scope_spans[0].spans[0].attributes}


# ---- the tests


class TestAgainstTheSdk:
    def test_groups_by_resource_then_scope_in_first_seen_order(self) -> None:
        _, ours = _ours(_rich_spans())
        assert _layout(ours) == RICH_LAYOUT
        assert _layout(sdk_encode_spans(_rich_spans())) == RICH_LAYOUT

    def test_field_by_field(self) -> None:
        _, ours = _ours(_rich_spans())
        _assert_matches_sdk(ours, _rich_spans())

    def test_the_whole_message_but_the_differences_by_design(self) -> None:
        batch = _rich_spans()
        body, ours = _ours(batch)
        expected = _as_ours(batch)
        assert ours == expected
        # and byte for byte: the same message written the same canonical way
        assert body == expected.SerializeToString(deterministic=True)

    def test_resource_and_scope_fields(self) -> None:
        _, ours = _ours(_rich_spans())
        rs_a, rs_b = ours.resource_spans
        assert rs_a.schema_url == "https://opentelemetry.io/schemas/1.26.0"
        assert rs_b.schema_url == ""
        ss_1, ss_2 = rs_a.scope_spans
        assert ss_1.schema_url == "https://opentelemetry.io/schemas/1.27.0"
        assert [kv.key for kv in ss_1.scope.attributes] == ["sfc.role", "sfc.shards"]
        assert ss_1.scope.attributes[1].value.int_value == 4
        # version None: no version (that no empty one is written either, the canonical
        # bytes test says)
        assert ss_2.scope == PbScope(name="other.library")
        assert ss_2.schema_url == ""

    def test_flags_carry_the_trace_flags_and_the_parent_remoteness(self) -> None:
        _, ours = _ours(_rich_spans())
        flags = {span.name: span.flags for rs in ours.resource_spans
                 for ss in rs.scope_spans for span in ss.spans}
        assert flags == {
            "GET /orders": 0x01 | 0x100 | 0x200,    # sampled, remote parent
            "send": 0x00 | 0x100,                   # unsampled, local parent
            "publish": 0x03 | 0x100,                # no parent: not remote
            "work": 0x01 | 0x100,
            "process": 0x01 | 0x100 | 0x200,
            "работа ✓": 0x01 | 0x100,
            "GET /health": 0x01 | 0x100,
        }
        links = ours.resource_spans[0].scope_spans[0].spans[0].links
        assert [link.flags for link in links] == [0x01 | 0x300, 0x00 | 0x100, 0x03 | 0x300]
        assert [link.trace_state for link in links] == ["linked=yes", "", ""]

    def test_every_span_kind_and_status(self) -> None:
        _, ours = _ours(_rich_spans())
        got = {span.name: (span.kind, span.HasField("status"), span.status.code,
                           span.status.message)
               for rs in ours.resource_spans for ss in rs.scope_spans for span in ss.spans}
        assert got == {
            "GET /orders": (PbSpan.SPAN_KIND_SERVER, True, 2, "boom: it broke ✗"),
            "send": (PbSpan.SPAN_KIND_CLIENT, True, 1, ""),
            "publish": (PbSpan.SPAN_KIND_PRODUCER, False, 0, ""),     # UNSET: left out
            "work": (PbSpan.SPAN_KIND_INTERNAL, True, 2, ""),
            "process": (PbSpan.SPAN_KIND_CONSUMER, False, 0, ""),
            "работа ✓": (PbSpan.SPAN_KIND_INTERNAL, False, 0, ""),
            "GET /health": (PbSpan.SPAN_KIND_SERVER, True, 1, ""),
        }

    def test_canonical_bytes(self) -> None:
        body, _ = _ours(_rich_spans())
        _assert_canonical(body)

    def test_a_span_without_a_scope(self) -> None:
        batch = [_span("bare", 0x10, {"k": "v"}, scope=None), _span("scoped", 0x11)]
        body, ours = _ours(batch)
        assert [ss.HasField("scope") for ss in ours.resource_spans[0].scope_spans] == [
            False, True]
        assert ours == _as_ours(batch)
        _assert_canonical(body)

    # Spans are grouped by their scope as a whole (name, version, schema, attributes):
    # a scope that differs only in its attributes is a group of its own, as the SDK's
    # encoder keeps them (InstrumentationScope's __eq__ compares attributes).
    def test_scopes_differing_only_in_attributes_are_separate(self) -> None:
        one = InstrumentationScope("lib", "1", None, {"tier": "a"})
        two = InstrumentationScope("lib", "1", None, {"tier": "b"})
        batch = [_span("a", 0x20, scope=one), _span("b", 0x21, scope=two)]
        _, ours = _ours(batch)
        assert [(ss.scope.attributes[0].value.string_value, [s.name for s in ss.spans])
                for ss in ours.resource_spans[0].scope_spans] == [("a", ["a"]), ("b", ["b"])]
        assert ours == _as_ours(batch)

    def test_equal_scope_objects_share_a_group(self) -> None:
        """Two scope objects that compare equal are one group, whichever comes first."""
        one = InstrumentationScope("lib", "1", None, {"tier": "a"})
        same = InstrumentationScope("lib", "1", None, {"tier": "a"})
        batch = [_span("a", 0x22, scope=one), _span("b", 0x23, scope=same),
                 _span("c", 0x24, scope=one)]
        _, ours = _ours(batch)
        assert [[s.name for s in ss.spans] for ss in ours.resource_spans[0].scope_spans] \
            == [["a", "b", "c"]]
        assert ours == _as_ours(batch)

    def test_the_hosts_plain_spans_encode_as_readable_spans_do(self) -> None:
        """``PlainSpan`` (what the host's recorder hands its batcher) made from the same
        arguments as each rich span: the same bytes."""
        batch = _rich_spans()
        plain = [PlainSpan(s.name, s.context, s.parent, s.resource, s.attributes,
                           s.events, s.links, s.kind, None, s.status, s.start_time,
                           s.end_time, s.instrumentation_scope) for s in batch]
        assert encode_spans(plain) == encode_spans(batch)

    def test_spans_encoded_one_by_one_make_the_same_request(self) -> None:
        """``span_entry`` of each span, grouped and wrapped by ``encode_entries``: the
        bytes ``encode_spans`` writes for the batch (the host's batcher encodes each
        span as it ends)."""
        batch = _rich_spans()
        groups: dict[int, tuple[Any, dict[Any, list[bytes]]]] = {}
        for sp in batch:
            got = groups.setdefault(id(sp.resource), (sp.resource, {}))
            got[1].setdefault(sp.instrumentation_scope, []).append(span_entry(sp))
        layout = [(res, list(scopes.items())) for res, scopes in groups.values()]
        assert encode_entries(layout) == encode_spans(batch)

    @pytest.mark.parametrize("case", ["attempt", "request", "job", "unsampled"])
    def test_a_span_written_from_its_fields_is_the_span_object_written(
            self, case: str) -> None:
        """``span_record`` (the host's own spans, no span object) against ``span_entry``
        of the ``ReadableSpan`` with the same fields: byte for byte."""
        state = TraceState([("vendor", "abc"), ("ot", "p:8")])
        attrs: tuple[Any, ...] = ("messaging.system", "mqtt", "sfc.action.attempt", 2,
                                  "sfc.mes.repeat", True, "ü.key", "värde ✓",
                                  "big", 2**70, "f", 0.5)
        flags = {"unsampled": 0x00}.get(case, 0x01)
        parent_id = {"request": 0x1111111111111111, "job": None}.get(case, 0x2222)
        remote = case == "request"
        link = (TRACE_B, 0x5555555555555555, "linked=yes", 0x03, True) \
            if case == "attempt" else None
        code, message = {"attempt": (2, "timeout"), "job": (1, None)}.get(case, (0, None))
        kind = {"attempt": SpanKind.PRODUCER, "request": SpanKind.CONSUMER}.get(
            case, SpanKind.INTERNAL)
        ctx = _ctx(TRACE_A, 0x00F067AA0BA902B7, flags=flags, state=state)
        parent = None if parent_id is None else _ctx(TRACE_A, parent_id, flags=flags,
                                                      remote=remote, state=state)
        links = () if link is None else (Link(_ctx(
            link[0], link[1], flags=link[3], remote=True,
            state=TraceState([("linked", "yes")]))),)
        status = Status(StatusCode(code), message) if code else Status(StatusCode.UNSET)
        obj = ReadableSpan(f"{case} ✓", ctx, parent, RES_A,
                           dict(zip(attrs[::2], attrs[1::2], strict=True)),
                           links=links, kind=kind, status=status, start_time=T0,
                           end_time=T0 + 5, instrumentation_scope=SCOPE_1)
        written = span_record(TRACE_A, 0x00F067AA0BA902B7, parent_id, remote, flags,
                              "vendor=abc,ot=p:8", f"{case} ✓", kind.value + 1, T0, T0 + 5,
                              attrs, code, message, link)
        assert written == span_entry(obj)
        # an end before the start is written as the start, as the recorder clamps it
        assert span_record(TRACE_A, 1, None, False, 1, None, "x", 1, T0, T0 - 1, (), 0,
                           None, None) == span_record(TRACE_A, 1, None, False, 1, None,
                                                      "x", 1, T0, T0, (), 0, None, None)

    # A span an SDK tracer made under its limits (SpanLimits, OTEL_SPAN_*_LIMIT) says
    # how many attributes, events and links it lost: the counts go on (the host's own
    # recorder makes spans that lose nothing, other tracers' spans may).
    def test_dropped_counts_are_written(self) -> None:
        memory = InMemorySpanExporter()
        provider = TracerProvider(span_limits=SpanLimits(
            max_span_attributes=1, max_events=1, max_links=1,
            max_event_attributes=1, max_link_attributes=1))
        provider.add_span_processor(SimpleSpanProcessor(memory))
        link = Link(_ctx(TRACE_B, 0x2222222222222222), {"a": 1, "b": 2})
        with provider.get_tracer("limited").start_as_current_span(
                "cut", attributes={"a": 1, "b": 2}, links=[link, link]) as span:
            span.add_event("e1", {"a": 1, "b": 2})
            span.add_event("e2")
        provider.shutdown()
        batch = memory.get_finished_spans()
        _, ours = _ours(batch)
        pb = ours.resource_spans[0].scope_spans[0].spans[0]
        assert (pb.dropped_attributes_count, pb.dropped_events_count,
                pb.dropped_links_count) == (1, 1, 1)
        assert ours == _as_ours(batch)

    def test_scopes_differing_only_in_schema_url_are_separate(self) -> None:
        one = InstrumentationScope("lib", "1", "https://example.com/schemas/1")
        two = InstrumentationScope("lib", "1", "https://example.com/schemas/2")
        batch = [_span("a", 0x20, scope=one), _span("b", 0x21, scope=two),
                 _span("c", 0x22, scope=one)]
        _, ours = _ours(batch)
        assert [(ss.schema_url, [s.name for s in ss.spans])
                for ss in ours.resource_spans[0].scope_spans] == [
            ("https://example.com/schemas/1", ["a", "c"]),
            ("https://example.com/schemas/2", ["b"])]
        assert ours == _as_ours(batch)


class TestValues:
    def test_every_attribute_type(self) -> None:
        """The values the comparison with the SDK covers, as they read back: the
        comparison alone would pass if both encoders made the same mistake."""
        _, ours = _ours([_span("types", 0x30, EVERY_TYPE)])
        got = _attrs(ours)
        assert list(got) == list(EVERY_TYPE)
        assert got["s_unicode"].string_value == "ünïcödé ✓ 日本語 🚀"
        assert got["s_empty"].WhichOneof("value") == "string_value"
        assert got["b_false"].WhichOneof("value") == "bool_value"
        assert got["i_zero"].WhichOneof("value") == "int_value"
        assert (got["i_min"].int_value, got["i_max"].int_value) == (INT64_MIN, INT64_MAX)
        assert got["i_neg"].int_value == -7
        assert math.copysign(1.0, got["f_negzero"].double_value) == -1.0
        assert got["f_tiny"].double_value == 5e-324
        assert got["f_ninf"].double_value == -math.inf
        assert got["bytes"].bytes_value == b"\x00\xff binary"
        assert got["bytes_empty"].WhichOneof("value") == "bytes_value"
        assert [v.int_value for v in got["list_i"].array_value.values] == [
            1, -1, INT64_MAX, INT64_MIN]
        assert got["list_empty"].WhichOneof("value") == "array_value"
        assert [v.WhichOneof("value") for v in got["list_mixed"].array_value.values] == [
            "string_value", "int_value", "double_value", "bool_value", None, "bytes_value"]
        inner = got["list_nested"].array_value.values[1].array_value.values[1]
        assert inner.array_value.values[0].bool_value is True
        nested = {kv.key: kv.value for kv in got["dict"].kvlist_value.values}
        assert nested["n"].int_value == -1
        deep = nested["nested"].kvlist_value.values[0]
        assert deep.key == "deep"
        assert deep.value.array_value.values[1].kvlist_value.values[0].value == AnyValue()
        assert got["dict_empty"].WhichOneof("value") == "kvlist_value"
        assert [kv.key for kv in got["dict_int_keys"].kvlist_value.values] == ["1", "2"]
        assert got["none"] == AnyValue()
        assert got["ключ.ü"].string_value == "a unicode key"

    def test_none_in_a_list_is_an_empty_value(self) -> None:
        _, ours = _ours([_span("none", 0x31, {"l": ["a", None, 1]})])
        values = _attrs(ours)["l"].array_value.values
        assert values[1] == AnyValue()
        assert values[1].WhichOneof("value") is None
        assert [values[0].string_value, values[2].int_value] == ["a", 1]

    @pytest.mark.parametrize("value", [2**63, INT64_MIN - 1, 2**64, -(2**100), 10**30],
                             ids=["int64-max+1", "int64-min-1", "2^64", "-2^100", "1e30"])
    def test_an_int_beyond_int64_is_written_as_its_digits(self, value: int) -> None:
        # by design: the SDK drops such an attribute (and logs the error); ours keeps it
        _, ours = _ours([_span("big", 0x32, {"big": value, "list": [1, value],
                                               "dict": {"v": value}, "after": "kept"})])
        got = _attrs(ours)
        assert got["big"].WhichOneof("value") == "string_value"
        assert got["big"].string_value == str(value)
        assert [v.WhichOneof("value") for v in got["list"].array_value.values] == [
            "int_value", "string_value"]
        assert got["list"].array_value.values[1].string_value == str(value)
        assert got["dict"].kvlist_value.values[0].value.string_value == str(value)
        assert got["after"].string_value == "kept"

    def test_nan(self) -> None:
        _, ours = _ours([_span("nan", 0x33, {"nan": math.nan, "list": [math.nan, 1.0]})])
        got = _attrs(ours)
        assert got["nan"].WhichOneof("value") == "double_value"
        assert math.isnan(got["nan"].double_value)
        assert math.isnan(got["list"].array_value.values[0].double_value)

    class _Mode(enum.IntEnum):
        AUTO = 3

    class _Ratio(float):
        pass

    class _Thing:
        def __str__(self) -> str:
            return "a thing"

    @pytest.mark.parametrize(("value", "field", "expected"), [
        (bytearray(b"\x01\x02"), "bytes_value", b"\x01\x02"),
        (memoryview(b"\x03"), "bytes_value", b"\x03"),
        (_Mode.AUTO, "int_value", 3),
        (_Ratio(0.25), "double_value", 0.25),
        (_Thing(), "string_value", "a thing"),
    ], ids=["bytearray", "memoryview", "int-enum", "float-subclass", "other-object"])
    def test_values_outside_the_attribute_types(self, value: Any, field: str,
                                                expected: Any) -> None:
        # what a caller's attributes may hold though the API does not name it: the
        # nearest value (the SDK's encoder makes a bytearray an array of ints)
        body, ours = _ours([_span("odd", 0x34, {"v": value})])
        got = _attrs(ours)["v"]
        assert got.WhichOneof("value") == field
        assert getattr(got, field) == expected
        _assert_canonical(body)


# the attributes the boundary sweep writes: a text or int value (and its key) goes by the
# encoder's measured one-pass path, anything else by the reserved-room one
SWEPT: dict[str, Callable[[int], dict[str, Any]]] = {
    "text": lambda n: {"k": "v" * n},
    "key": lambda n: {"k" * n: 1},          # n == 0: an empty key, left out
    "bytes": lambda n: {"k": b"v" * n},
    "nested": lambda n: {"k": ["v" * n]},
}


class TestSizes:
    def test_no_spans_is_an_empty_request(self) -> None:
        assert encode_spans([]) == b""
        assert ExportTraceServiceRequest.FromString(b"") == ExportTraceServiceRequest()

    def test_5000_spans(self) -> None:
        resources, scopes = (RES_A, RES_B), (SCOPE_1, SCOPE_2)
        batch = [ReadableSpan(
            f"span-{i}", _ctx(TRACE_A if i % 2 else TRACE_B, i + 1, flags=i % 2),
            _ctx(TRACE_A, 0xABC, remote=i % 3 == 0) if i % 5 else None,
            resources[i % 2], {"i": i, "s": f"value-{i}", "even": i % 2 == 0, "f": i / 7},
            kind=SpanKind(i % 5), start_time=T0 + i, end_time=T0 + i + 1,
            instrumentation_scope=scopes[(i // 2) % 2]) for i in range(5_000)]
        body, ours = _ours(batch)
        spans = [span for rs in ours.resource_spans for ss in rs.scope_spans
                 for span in ss.spans]
        assert len(spans) == 5_000
        assert sorted(int.from_bytes(s.span_id, "big") for s in spans) == list(
            range(1, 5_001))
        assert [len(ss.spans) for rs in ours.resource_spans for ss in rs.scope_spans] == [
            1_250] * 4
        assert ours == _as_ours(batch)
        _assert_canonical(body)

    def test_2000_attributes_a_span(self) -> None:
        # far beyond the buffer's first size (512 bytes a span, 4 KiB at least)
        cycle = ("text", -12345, 3.5, True, b"\x00\x01", ["a", 1], {"k": "v"})
        attrs = {f"attr.{i:04d}": cycle[i % len(cycle)] for i in range(2_000)}
        batch = [ReadableSpan(
            f"wide-{n}", _ctx(TRACE_A, 0x40 + n), None, RES_A, attrs,
            events=(Event("wide event", attrs, timestamp=T0 + 1),),
            links=(Link(_ctx(TRACE_B, 0x50 + n), attrs),), start_time=T0,
            end_time=T0 + 2, instrumentation_scope=SCOPE_1) for n in range(3)]
        body, ours = _ours(batch)
        span = ours.resource_spans[0].scope_spans[0].spans[2]
        assert len(span.attributes) == len(span.events[0].attributes) == 2_000
        assert len(span.links[0].attributes) == 2_000
        _assert_matches_sdk(ours, batch)
        assert ours == _as_ours(batch)
        _assert_canonical(body)

    @pytest.mark.parametrize("text", ["x" * 2**20, "é" * 2**20, "🚀" * (2**18 + 1)],
                             ids=["1MB-ascii", "2MB-utf8", "1MB-astral"])
    def test_a_megabyte_string(self, text: str) -> None:
        # lengths of 3 and 4 varint bytes (2**21 bytes of UTF-8 need 4), at every level
        batch = [_span("big", 0x60, {"big": text, "after": 1})]
        body, ours = _ours(batch)
        got = _attrs(ours)
        assert got["big"].string_value == text
        assert got["after"].int_value == 1
        assert ours == _as_ours(batch)
        _assert_canonical(body)

    @pytest.mark.parametrize("kind", list(SWEPT))
    def test_nested_lengths_across_every_varint_boundary(self, kind: str) -> None:
        """A nested message's length goes before it: measured first, or written into
        room reserved before the message which is then shifted up to it. Sizes around
        2**7 and 2**14 put each level (value, key-value, span, scope, resource) on both
        sides of the boundary where its length takes one byte more; 2**21 needs four."""
        make = SWEPT[kind]
        for n in (*range(0, 200), *range(16_150, 16_400), 2**21 - 1, 2**21):
            attrs = make(n)
            body = encode_spans([_span("s", 0x70, attrs)])
            ours = ExportTraceServiceRequest.FromString(body)
            [kv] = ours.resource_spans[0].scope_spans[0].spans[0].attributes
            assert kv.key == next(iter(attrs)), n
            assert ours.SerializeToString(deterministic=True) == body, n
            if n in (0, 16_383, 2**21):     # the values, now and then (the bytes above
                assert ours == _as_ours([_span("s", 0x70, attrs)]), n   # say the rest)

    def test_ints_of_every_varint_size(self) -> None:
        # 1 to 9 bytes (2**7k - 1 is the largest of k bytes), then the 10 of a negative
        values = [0, *(v for k in range(1, 9) for v in (2 ** (7 * k) - 1, 2 ** (7 * k))),
                  INT64_MAX, -1, -(2**31), INT64_MIN]
        attrs = {f"i{n}": v for n, v in enumerate(values)}
        batch = [_span("ints", 0x71, {**attrs, "list": values})]
        body, ours = _ours(batch)
        got = _attrs(ours)
        assert [got[k].int_value for k in attrs] == values
        assert ours == _as_ours(batch)
        _assert_canonical(body)

    @pytest.mark.parametrize(("trace_id", "span_id"), [
        (2**128 - 1, 2**64 - 1),                # every bit: unsigned all the way
        (1, 1),                                 # leading zero bytes kept
        (2**127, 2**63),                        # the top bit only
        (2**64 - 1, 2**32),                     # the low half full, the high half empty
        (2**64, 0xFF),                          # the high half's lowest bit
    ], ids=["all-ones", "one", "top-bit", "low-half", "high-half"])
    def test_ids_at_their_extremes(self, trace_id: int, span_id: int) -> None:
        batch = [ReadableSpan(
            "ids", _ctx(trace_id, span_id), _ctx(trace_id, span_id ^ 1, remote=True),
            RES_A, None, links=(Link(_ctx(trace_id, span_id ^ 2)),), start_time=T0,
            end_time=T0 + 1, instrumentation_scope=SCOPE_1)]
        body, ours = _ours(batch)
        span = ours.resource_spans[0].scope_spans[0].spans[0]
        assert span.trace_id == trace_id.to_bytes(16, "big")
        assert span.span_id == span_id.to_bytes(8, "big")
        assert span.parent_span_id == (span_id ^ 1).to_bytes(8, "big")
        assert span.links[0].trace_id == trace_id.to_bytes(16, "big")
        assert span.links[0].span_id == (span_id ^ 2).to_bytes(8, "big")
        assert ours == _as_ours(batch)
        _assert_canonical(body)


def test_a_lone_surrogate_costs_a_question_mark_not_the_batch() -> None:
    """UTF-8 cannot hold a lone surrogate: the text goes with ``?`` in its place (both
    encodings), and the other spans of the batch go too."""
    from sfc_host.tracing.otlp import encode as encode_json

    ctx = SpanContext(0x1, 0x2, False, TraceFlags(1))
    bad = ReadableSpan("a\ud800", ctx, None, Resource.create({}),
                       {"k\udfff": "v\ud800", "ok": "fine"}, start_time=1, end_time=2)
    good = ReadableSpan("b", SpanContext(0x1, 0x3, False, TraceFlags(1)), None,
                        bad.resource, {"ok": "fine"}, start_time=1, end_time=2)
    msg = ExportTraceServiceRequest.FromString(encode_spans([bad, good]))
    spans = msg.resource_spans[0].scope_spans[0].spans
    assert [s.name for s in spans] == ["a?", "b"]
    assert [(a.key, a.value.string_value) for a in spans[0].attributes] == [
        ("k?", "v?"), ("ok", "fine")]
    doc = json.loads(encode_json([bad, good]))
    assert [s["name"] for s in doc["resourceSpans"][0]["scopeSpans"][0]["spans"]] == [
        "a\ud800", "b"]
