"""The host's own OTLP/HTTP span exporter (``sfc_host.tracing.otlp``) and the
``OTEL_*`` plumbing around it (``sfc_host.tracing.spans``).

- ``encode`` (the ``http/json`` body): what it writes is checked independently of it,
  by the OTLP protobuf classes: the JSON is parsed with protobuf's JSON mapping (after
  turning the hex ids OTLP's JSON uses into the base64 proto3 JSON wants) and compared
  field by field with what the SDK's own protobuf encoder makes of the same spans. The
  ``http/protobuf`` body (``sfc_fast.wire.otlp.encode_spans``) is checked against the
  SDK in ``test_otlp_wire.py``.
- ``OtlpExporter``: against a real HTTP server on 127.0.0.1 that records every request
  and answers with scripted statuses (no HTTP mocks): protocol and Content-Type,
  endpoint, headers, compression, retries, timeouts, keep-alive and shutdown. Where the
  body's format matters a test runs for both protocols, and reads the body back as the
  ``ExportTraceServiceRequest`` it encodes (protobuf with ``FromString``, JSON as above).
- the settings the exporter, ``protocol_from`` and ``exporter_from`` refuse (gRPC among
  them); ``resource_from``; the ``SpanRecorder``'s sampling and its bound on the answers
  it remembers.
"""

from __future__ import annotations

import base64
import gzip
import json
import math
import socket
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest
from google.protobuf import json_format
from helpers.otlp import Collector, Reply
from opentelemetry.exporter.otlp.proto.common.trace_encoder import (
    encode_spans as sdk_encode_spans,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import (
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExportResult,
)
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.span import TraceState

from sfc_fast.wire.otlp import encode_spans
from sfc_host.errors import ConfigError
from sfc_host.tracing import spans
from sfc_host.tracing.context import TraceContext, job_trace, stored
from sfc_host.tracing.otlp import (
    DEFAULT_ENDPOINT,
    TRACES_PATH,
    OtlpExporter,
    encode,
    endpoint_from,
    protocol_from,
)
from sfc_host.tracing.spans import SpanRecorder, exporter_from, resource_from

# ids with leading zero digits: a hex encoding that drops the padding shows up at once
TRACE_A = 0x0AF7651916CD43DD8448EB211C80319C
TRACE_B = 0x00000000000000000000000000ABCDEF
# past 2**53: a time written as a JSON number instead of a string loses digits
T0 = 1_700_000_000_123_456_789

SPAN_FLAGS_REMOTE_BITS = 0x300      # HAS_IS_REMOTE | IS_REMOTE
W3C_FLAGS_BYTE = 0xFF

PROTOCOLS = ("http/protobuf", "http/json")
# written out here rather than taken from the module: the test says what a collector expects
CONTENT_TYPE = {"http/protobuf": "application/x-protobuf", "http/json": "application/json"}
# the SDK's HTTP exporter, which the host no longer uses (nor needs installed)
SDK_HTTP_EXPORTER = "opentelemetry.exporter.otlp.proto.http"


def _ctx(trace_id: int, span_id: int, *, flags: int = 0x01, remote: bool = False,
         state: TraceState | None = None) -> SpanContext:
    return SpanContext(trace_id, span_id, remote, TraceFlags(flags), state)


# ---- spans of two resources and two scopes, with every kind of field


RES_A = Resource({"service.name": "sfc-host", "service.instance.id": "host-a",
                  "process.pid": 4242, "host.arch.bits": 64.0, "deploy.canary": True},
                 schema_url="https://opentelemetry.io/schemas/1.26.0")
RES_B = Resource({"service.name": "other-service"})
# a scope's schema_url and attributes are written too (and, with its name and version,
# tell scopes apart)
SCOPE_1 = InstrumentationScope("sfc_host", "1.2.3", "https://opentelemetry.io/schemas/1.27.0",
                               {"sfc.role": "host", "sfc.shards": 4})
SCOPE_2 = InstrumentationScope("other.library")     # no version: none written

EVERY_TYPE: dict[str, Any] = {
    "s": "text ünïcode",
    "b_true": True,
    "b_false": False,
    "i": 2**62 + 1,             # beyond a double's precision: must travel as a string
    "i_neg": -7,
    "i_min": -(2**63),          # int64's ends: JSON strings, protobuf 10-byte varints
    "i_max": 2**63 - 1,
    "f": 1.25,
    "f_tiny": 5e-324,
    "f_inf": math.inf,          # not JSON numbers: written "Infinity" / "-Infinity"
    "f_ninf": -math.inf,
    "s_empty": "",
    "bytes": b"\x00\xff binary",
    "list_s": ["a", "b", ""],
    "list_i": [1, 2, 3],
    "list_b": [True, False],
    "list_f": [0.5, -2.0],
    "list_none": ["a", None],   # a missing member: an empty AnyValue
    "dict": {"k": "v", "n": 1, "nested": {"deep": True}},
}


def _spans() -> list[ReadableSpan]:
    """Five spans, one of each kind, interleaved over (RES_A, SCOPE_1), (RES_A, SCOPE_2)
    and (RES_B, SCOPE_1), so the grouping has to gather them."""
    server = ReadableSpan(
        "GET /orders", _ctx(TRACE_A, 0x00F067AA0BA902B7, state=TraceState(
            [("vendor", "abc"), ("ot", "p:8")])),
        _ctx(TRACE_A, 0x1111111111111111, remote=True), RES_A, EVERY_TYPE,
        events=(Event("exception", {"exception.type": "ValueError", "attempt": 2},
                      timestamp=T0 + 500),
                Event("no attributes", timestamp=T0 + 600)),
        links=(Link(_ctx(TRACE_B, 0x2222222222222222, remote=True, state=TraceState(
                   [("linked", "yes")])), {"link.kind": "answer", "n": 3}),
               Link(_ctx(TRACE_A, 0x3333333333333333, flags=0x00))),
        kind=SpanKind.SERVER, status=Status(StatusCode.ERROR, "boom: it broke"),
        start_time=T0, end_time=T0 + 1_000_001, instrumentation_scope=SCOPE_1)
    client = ReadableSpan(
        "send", _ctx(TRACE_A, 0x4444444444444444),
        _ctx(TRACE_A, 0x00F067AA0BA902B7), RES_A, {"peer": "x"},
        kind=SpanKind.CLIENT, status=Status(StatusCode.OK),
        start_time=T0 + 10, end_time=T0 + 20, instrumentation_scope=SCOPE_2)
    producer = ReadableSpan(
        "publish", _ctx(TRACE_B, 0x5555555555555555, flags=0x00), None, RES_B, None,
        kind=SpanKind.PRODUCER, start_time=T0 + 30, end_time=T0 + 40,
        instrumentation_scope=SCOPE_1)
    internal = ReadableSpan(
        "work", _ctx(TRACE_A, 0x6666666666666666), _ctx(TRACE_A, 0x00F067AA0BA902B7),
        RES_A, {"step": 1}, kind=SpanKind.INTERNAL, start_time=T0 + 50, end_time=T0 + 60,
        instrumentation_scope=SCOPE_1)
    consumer = ReadableSpan(
        "process", _ctx(TRACE_B, 0x7777777777777777, flags=0x03),
        _ctx(TRACE_B, 0x5555555555555555, remote=True), RES_B, {"q": "jobs"},
        kind=SpanKind.CONSUMER, start_time=T0 + 70, end_time=T0 + 80,
        instrumentation_scope=SCOPE_1)
    return [server, client, producer, internal, consumer]


# ---- OTLP JSON read back with protobuf's own JSON mapping


_ID_KEYS = frozenset(("traceId", "spanId", "parentSpanId"))


def _ids_to_base64(node: Any) -> Any:
    """OTLP's JSON writes ids in hex; the proto3 JSON mapping reads bytes as base64."""
    if isinstance(node, dict):
        return {k: (base64.b64encode(bytes.fromhex(v)).decode("ascii")
                    if k in _ID_KEYS and isinstance(v, str) else _ids_to_base64(v))
                for k, v in node.items()}
    if isinstance(node, list):
        return [_ids_to_base64(x) for x in node]
    return node


def _parse(body: bytes) -> ExportTraceServiceRequest:
    """``body`` as the message it encodes; unknown field names are refused."""
    text = json.dumps(_ids_to_base64(json.loads(body)))
    return json_format.Parse(text, ExportTraceServiceRequest())


def _state_header(ctx: SpanContext) -> str:
    return ctx.trace_state.to_header() if ctx.trace_state else ""


def _assert_span_equal(ours: PbSpan, sdk: PbSpan, source: ReadableSpan) -> None:
    """``ours`` and the SDK's encoding of ``source`` agree field by field, but for two
    things the SDK leaves out, checked against ``source`` instead: the W3C byte of the
    flags (span and link) and a link's trace state."""
    where = ours.name
    assert ours.trace_id == sdk.trace_id, where
    assert ours.span_id == sdk.span_id, where
    assert ours.parent_span_id == sdk.parent_span_id, where
    assert ours.trace_state == sdk.trace_state, where
    assert ours.name == sdk.name
    assert ours.kind == sdk.kind, where
    assert ours.start_time_unix_nano == sdk.start_time_unix_nano, where
    assert ours.end_time_unix_nano == sdk.end_time_unix_nano, where
    assert list(ours.attributes) == list(sdk.attributes), where
    assert ours.dropped_attributes_count == sdk.dropped_attributes_count, where
    assert list(ours.events) == list(sdk.events), where
    assert ours.dropped_events_count == sdk.dropped_events_count, where
    assert ours.status.code == sdk.status.code, where
    assert ours.status.message == sdk.status.message, where
    # the SDK leaves the W3C byte of SpanFlags empty; ours fills it, as OTLP allows
    assert ours.flags & SPAN_FLAGS_REMOTE_BITS == sdk.flags & SPAN_FLAGS_REMOTE_BITS, where
    assert ours.flags & W3C_FLAGS_BYTE == int(source.context.trace_flags), where
    assert ours.dropped_links_count == sdk.dropped_links_count, where
    for ol, sl, link in zip(ours.links, sdk.links, source.links, strict=True):
        assert ol.trace_id == sl.trace_id, where
        assert ol.span_id == sl.span_id, where
        assert list(ol.attributes) == list(sl.attributes), where
        assert ol.dropped_attributes_count == sl.dropped_attributes_count, where
        assert ol.flags & SPAN_FLAGS_REMOTE_BITS == sl.flags & SPAN_FLAGS_REMOTE_BITS, where
        assert ol.flags & W3C_FLAGS_BYTE == int(link.context.trace_flags), where
        assert ol.trace_state == _state_header(link.context), where


class TestEncode:
    def test_matches_the_sdk_protobuf_encoder_field_by_field(self) -> None:
        batch = _spans()
        ours = _parse(encode(batch))
        sdk = sdk_encode_spans(batch)
        source = {s.context.span_id.to_bytes(8, "big"): s for s in batch}
        assert len(ours.resource_spans) == len(sdk.resource_spans) == 2
        for o_rs, s_rs in zip(ours.resource_spans, sdk.resource_spans, strict=True):
            assert list(o_rs.resource.attributes) == list(s_rs.resource.attributes)
            assert o_rs.schema_url == s_rs.schema_url
            assert len(o_rs.scope_spans) == len(s_rs.scope_spans)
            for o_ss, s_ss in zip(o_rs.scope_spans, s_rs.scope_spans, strict=True):
                # name, version and attributes (message equality)
                assert o_ss.scope == s_ss.scope
                assert o_ss.schema_url == s_ss.schema_url
                assert len(o_ss.spans) == len(s_ss.spans)
                for o_span, s_span in zip(o_ss.spans, s_ss.spans, strict=True):
                    _assert_span_equal(o_span, s_span, source[o_span.span_id])

    def test_groups_spans_by_resource_then_scope(self) -> None:
        doc = json.loads(encode(_spans()))
        layout = [
            (next(a["value"]["stringValue"] for a in rs["resource"]["attributes"]
                  if a["key"] == "service.name"),
             [(ss["scope"]["name"], ss["scope"].get("version"),
               [s["name"] for s in ss["spans"]]) for ss in rs["scopeSpans"]])
            for rs in doc["resourceSpans"]]
        assert layout == [
            ("sfc-host", [("sfc_host", "1.2.3", ["GET /orders", "work"]),
                          ("other.library", None, ["send"])]),
            ("other-service", [("sfc_host", "1.2.3", ["publish", "process"])]),
        ]

    def test_json_uses_otlp_conventions(self) -> None:
        """What the protobuf reading cannot see: OTLP's JSON differs from proto3's in
        ids (hex, not base64) and enums (numbers, not names)."""
        span = json.loads(encode(_spans()[:1]))["resourceSpans"][0]["scopeSpans"][0][
            "spans"][0]
        assert span["traceId"] == f"{TRACE_A:032x}"
        assert span["spanId"] == "00f067aa0ba902b7"
        assert span["parentSpanId"] == "1111111111111111"
        assert span["links"][0]["traceId"] == f"{TRACE_B:032x}"
        assert span["links"][0]["traceState"] == "linked=yes"
        assert span["traceState"] == "vendor=abc,ot=p:8"
        assert span["kind"] == 2
        assert span["status"] == {"code": 2, "message": "boom: it broke"}
        assert span["startTimeUnixNano"] == str(T0)
        attrs = {a["key"]: a["value"] for a in span["attributes"]}
        assert attrs["i"] == {"intValue": str(2**62 + 1)}
        assert attrs["bytes"] == {"bytesValue": base64.b64encode(b"\x00\xff binary").decode()}
        assert attrs["b_true"] == {"boolValue": True}

    def test_unset_status_and_empty_fields_are_left_out(self) -> None:
        producer = _spans()[2]
        span = json.loads(encode([producer]))["resourceSpans"][0]["scopeSpans"][0][
            "spans"][0]
        for absent in ("status", "parentSpanId", "attributes", "events", "links",
                       "traceState"):
            assert absent not in span

    def test_same_scope_name_different_version_is_a_separate_scope(self) -> None:
        base = _spans()[3]
        other = ReadableSpan(
            "v2", _ctx(TRACE_A, 0x8888888888888888), None, RES_A, None,
            start_time=T0, end_time=T0 + 1,
            instrumentation_scope=InstrumentationScope("sfc_host", "9.9.9"))
        doc = json.loads(encode([base, other]))
        scopes = [(ss["scope"]["name"], ss["scope"]["version"])
                  for ss in doc["resourceSpans"][0]["scopeSpans"]]
        assert scopes == [("sfc_host", "1.2.3"), ("sfc_host", "9.9.9")]

    def test_non_finite_floats_survive(self) -> None:
        span = ReadableSpan("nan", _ctx(TRACE_A, 0x9999999999999999), None, RES_A,
                            {"nan": math.nan, "inf": math.inf, "ninf": -math.inf},
                            start_time=T0, end_time=T0 + 1, instrumentation_scope=SCOPE_1)
        body = encode([span])
        # JSON has no such numbers: protobuf's JSON mapping names them as strings
        raw = {a["key"]: a["value"] for a in json.loads(body)["resourceSpans"][0][
            "scopeSpans"][0]["spans"][0]["attributes"]}
        assert raw == {"nan": {"doubleValue": "NaN"}, "inf": {"doubleValue": "Infinity"},
                       "ninf": {"doubleValue": "-Infinity"}}
        attrs = {kv.key: kv.value for kv in
                 _parse(body).resource_spans[0].scope_spans[0].spans[0].attributes}
        assert attrs["nan"].WhichOneof("value") == "double_value"
        assert math.isnan(attrs["nan"].double_value)
        assert attrs["inf"].double_value == math.inf
        assert attrs["ninf"].double_value == -math.inf

    def test_none_in_an_array_is_an_empty_value(self) -> None:
        span = ReadableSpan("none", _ctx(TRACE_A, 0x9999999999999999), None, RES_A,
                            {"l": ["a", None]}, start_time=T0, end_time=T0 + 1,
                            instrumentation_scope=SCOPE_1)
        body = encode([span])
        raw = json.loads(body)["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
        assert raw["attributes"][0]["value"] == {
            "arrayValue": {"values": [{"stringValue": "a"}, {}]}}
        ours = _parse(body).resource_spans[0].scope_spans[0].spans[0]
        assert ours.attributes[0].value.array_value.values[1] == AnyValue()

    def test_scope_schema_url_and_attributes_are_written(self) -> None:
        ss = json.loads(encode(_spans()[3:4]))["resourceSpans"][0]["scopeSpans"][0]
        assert ss["schemaUrl"] == "https://opentelemetry.io/schemas/1.27.0"
        assert ss["scope"] == {"name": "sfc_host", "version": "1.2.3", "attributes": [
            {"key": "sfc.role", "value": {"stringValue": "host"}},
            {"key": "sfc.shards", "value": {"intValue": "4"}}]}

    def test_scopes_differing_only_in_schema_url_are_separate(self) -> None:
        one = InstrumentationScope("lib", "1", "https://example.com/schemas/1")
        two = InstrumentationScope("lib", "1", "https://example.com/schemas/2")
        doc = json.loads(encode([_scoped("a", 1, one), _scoped("b", 2, two),
                                 _scoped("c", 3, one)]))
        assert [(ss.get("schemaUrl"), [s["name"] for s in ss["spans"]])
                for ss in doc["resourceSpans"][0]["scopeSpans"]] == [
            ("https://example.com/schemas/1", ["a", "c"]),
            ("https://example.com/schemas/2", ["b"])]

    # Spans are grouped by their scope as a whole (name, version, schema, attributes):
    # a scope that differs only in its attributes is a group of its own, as the SDK's
    # encoder keeps them (InstrumentationScope's __eq__ compares attributes).
    def test_scopes_differing_only_in_attributes_are_separate(self) -> None:
        one = InstrumentationScope("lib", "1", None, {"tier": "a"})
        two = InstrumentationScope("lib", "1", None, {"tier": "b"})
        doc = json.loads(encode([_scoped("a", 1, one), _scoped("b", 2, two)]))
        assert [(ss["scope"]["attributes"][0]["value"]["stringValue"],
                 [s["name"] for s in ss["spans"]])
                for ss in doc["resourceSpans"][0]["scopeSpans"]] == [
            ("a", ["a"]), ("b", ["b"])]


def _scoped(name: str, span_id: int, scope: InstrumentationScope) -> ReadableSpan:
    """A bare span of RES_A in ``scope``: what a grouping test needs."""
    return ReadableSpan(name, _ctx(TRACE_A, span_id), None, RES_A, None, start_time=T0,
                        end_time=T0 + 1, instrumentation_scope=scope)


# ---- a real collector on 127.0.0.1 (``helpers.otlp.Collector``)


@pytest.fixture
def serve() -> Iterator[Any]:
    """``serve(script, default=..., keep_alive=...)``: a started ``Collector``."""
    started: list[Collector] = []

    def start(script: Sequence[Reply] = (), **kw: Any) -> Collector:
        c = Collector(script, **kw)
        c.start()
        started.append(c)
        return c

    yield start
    for c in started:
        c.stop()


@pytest.fixture
def exporters() -> Iterator[Any]:
    """``make(endpoint, **kw)``: an ``OtlpExporter`` shut down after the test; ``env``
    defaults to none (so the process's own ``OTEL_*`` cannot leak in)."""
    made: list[OtlpExporter] = []

    def make(endpoint: str | None = None, **kw: Any) -> OtlpExporter:
        kw.setdefault("env", {})
        e = OtlpExporter(endpoint, **kw)
        made.append(e)
        return e

    yield make
    for e in made:
        e.shutdown()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(params=PROTOCOLS)
def protocol(request: pytest.FixtureRequest) -> str:
    """Each OTLP/HTTP protocol in turn, for the tests whose body format matters."""
    return str(request.param)


def _decode(protocol: str, body: bytes) -> ExportTraceServiceRequest:
    """A request body as the message it encodes, read as its protocol says."""
    if protocol == "http/protobuf":
        return ExportTraceServiceRequest.FromString(body)
    return _parse(body)


def _body_encoder(protocol: str) -> Callable[[Sequence[ReadableSpan]], bytes]:
    """What writes the body for ``protocol``: the compiled protobuf encoder or ``encode``."""
    return encode_spans if protocol == "http/protobuf" else encode


def _layout(request: ExportTraceServiceRequest) -> list[tuple[str, list[tuple[str, list[str]]]]]:
    """(service name, [(scope name, [span names])]) of a request: its grouping at a glance."""
    return [(next(kv.value.string_value for kv in rs.resource.attributes
                  if kv.key == "service.name"),
             [(ss.scope.name, [span.name for span in ss.spans]) for ss in rs.scope_spans])
            for rs in request.resource_spans]


# how _spans() is grouped, whichever the protocol
SPANS_LAYOUT = [("sfc-host", [("sfc_host", ["GET /orders", "work"]),
                              ("other.library", ["send"])]),
                ("other-service", [("sfc_host", ["publish", "process"])])]


def _timed_export(exporter: OtlpExporter,
                  batch: Sequence[ReadableSpan]) -> tuple[SpanExportResult, float]:
    t = time.monotonic()
    result = exporter.export(batch)
    return result, time.monotonic() - t


class TestExporterHttp:
    def test_posts_the_encoded_batch_with_the_configured_headers(
            self, serve: Any, exporters: Any, protocol: str) -> None:
        c = serve()
        batch = _spans()
        exporter = exporters(env={
            "OTEL_EXPORTER_OTLP_ENDPOINT": c.base,
            "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
            "OTEL_EXPORTER_OTLP_HEADERS": "api-key=s%20e%3Dcret, x-tenant=a%2Cb"})
        assert exporter.protocol == protocol
        assert exporter.export(batch) is SpanExportResult.SUCCESS
        [seen] = c.requests
        assert seen.path == TRACES_PATH
        assert seen.headers["content-type"] == CONTENT_TYPE[protocol]
        assert seen.headers["api-key"] == "s e=cret"
        assert seen.headers["x-tenant"] == "a,b"
        assert "content-encoding" not in seen.headers
        assert seen.body == _body_encoder(protocol)(batch)
        request = _decode(protocol, seen.body)
        assert _layout(request) == SPANS_LAYOUT
        # read back, both protocols carry the same message (the JSON one is checked
        # against the SDK's encoder in TestEncode, the protobuf one in test_otlp_wire.py)
        assert request == _parse(encode(batch))
        assert exporter.sent == len(batch)
        assert exporter.dropped == 0

    def test_default_protocol_is_protobuf(self, serve: Any, exporters: Any) -> None:
        c = serve()
        exporter = exporters(c.url)
        assert exporter.protocol == "http/protobuf"
        assert exporter.export(_spans()) is SpanExportResult.SUCCESS
        [seen] = c.requests
        assert seen.headers["content-type"] == "application/x-protobuf"
        assert _layout(ExportTraceServiceRequest.FromString(seen.body)) == SPANS_LAYOUT

    def test_protocol_argument_wins_over_the_variables(self, serve: Any,
                                                       exporters: Any) -> None:
        c = serve()
        exporter = exporters(c.url, protocol="http/json",
                             env={"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"})
        assert exporter.export(_spans()[:1]) is SpanExportResult.SUCCESS
        [seen] = c.requests
        assert seen.headers["content-type"] == "application/json"
        assert _layout(_parse(seen.body)) == [("sfc-host", [("sfc_host", ["GET /orders"])])]

    def test_traces_headers_win_over_the_general_ones(self, serve: Any,
                                                      exporters: Any) -> None:
        c = serve()
        exporter = exporters(env={"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": c.url,
                                  "OTEL_EXPORTER_OTLP_HEADERS": "who=general",
                                  "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "who=traces"})
        assert exporter.export(_spans()) is SpanExportResult.SUCCESS
        assert c.requests[0].headers["who"] == "traces"

    @pytest.mark.parametrize(("variable", "value", "path"), [
        ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "{base}/custom/traces", "/custom/traces"),
        ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "{base}/x?tenant=7", "/x?tenant=7"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "{base}", "/v1/traces"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "{base}/", "/v1/traces"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "{base}/otlp/", "/otlp/v1/traces"),
    ])
    def test_endpoint_variables(self, serve: Any, exporters: Any, variable: str,
                                value: str, path: str) -> None:
        c = serve()
        exporter = exporters(env={variable: value.format(base=c.base)})
        assert exporter.export(_spans()[:1]) is SpanExportResult.SUCCESS
        assert [s.path for s in c.requests] == [path]

    def test_traces_endpoint_wins_over_the_general_one(self, serve: Any,
                                                       exporters: Any) -> None:
        c = serve()
        nowhere = f"http://127.0.0.1:{_closed_port()}"
        exporter = exporters(env={"OTEL_EXPORTER_OTLP_ENDPOINT": nowhere,
                                  "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{c.base}/t"})
        assert exporter.export(_spans()[:1]) is SpanExportResult.SUCCESS
        assert [s.path for s in c.requests] == ["/t"]

    def test_default_endpoint(self) -> None:
        assert endpoint_from({}) == DEFAULT_ENDPOINT + TRACES_PATH

    def test_gzip(self, serve: Any, exporters: Any, protocol: str) -> None:
        c = serve()
        batch = _spans()
        exporter = exporters(protocol=protocol,
                             env={"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": c.url,
                                  "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip"})
        assert exporter.export(batch) is SpanExportResult.SUCCESS
        [seen] = c.requests
        assert seen.headers["content-encoding"] == "gzip"
        assert seen.headers["content-type"] == CONTENT_TYPE[protocol]
        body = gzip.decompress(seen.body)
        assert body == _body_encoder(protocol)(batch)
        assert _layout(_decode(protocol, body)) == SPANS_LAYOUT

    def test_503_then_200_is_retried(self, serve: Any, exporters: Any, protocol: str) -> None:
        c = serve([Reply(503)])
        exporter = exporters(c.url, protocol=protocol, timeout_ms=5_000)
        assert exporter.export(_spans()) is SpanExportResult.SUCCESS
        assert len(c.requests) == 2
        # the same batch, as its protocol writes it, both times
        assert c.requests[0].body == c.requests[1].body
        assert {r.headers["content-type"] for r in c.requests} == {CONTENT_TYPE[protocol]}
        assert _layout(_decode(protocol, c.requests[1].body)) == SPANS_LAYOUT
        assert (exporter.sent, exporter.dropped) == (5, 0)

    def test_429_with_retry_after_0_is_retried(self, serve: Any, exporters: Any) -> None:
        c = serve([Reply(429, {"Retry-After": "0"})])
        exporter = exporters(c.url, timeout_ms=5_000)
        assert exporter.export(_spans()) is SpanExportResult.SUCCESS
        assert len(c.requests) == 2

    def test_retry_after_past_the_timeout_gives_up_at_once(self, serve: Any,
                                                           exporters: Any) -> None:
        # honouring Retry-After means not sleeping through a wait that cannot end in time
        c = serve(default=Reply(429, {"Retry-After": "30"}))
        exporter = exporters(c.url, timeout_ms=2_000)
        result, took = _timed_export(exporter, _spans())
        assert result is SpanExportResult.FAILURE
        assert len(c.requests) == 1
        assert took < 1.0

    def test_400_is_dropped_at_once(self, serve: Any, exporters: Any) -> None:
        c = serve(default=Reply(400))
        exporter = exporters(c.url, timeout_ms=5_000)
        batch = _spans()
        assert exporter.export(batch) is SpanExportResult.FAILURE
        assert len(c.requests) == 1
        assert (exporter.sent, exporter.dropped) == (0, len(batch))

    def test_always_503_fails_within_about_the_timeout(self, serve: Any,
                                                       exporters: Any) -> None:
        c = serve(default=Reply(503))
        exporter = exporters(env={"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": c.url,
                                  "OTEL_EXPORTER_OTLP_TIMEOUT": "300"})
        batch = _spans()
        result, took = _timed_export(exporter, batch)
        assert result is SpanExportResult.FAILURE
        assert len(c.requests) >= 2
        assert took < 0.3 + 0.25
        assert exporter.dropped == len(batch)

    def test_connection_refused_fails_within_the_timeout(self, exporters: Any) -> None:
        exporter = exporters(f"http://127.0.0.1:{_closed_port()}{TRACES_PATH}",
                             timeout_ms=300)
        result, took = _timed_export(exporter, _spans())
        assert result is SpanExportResult.FAILURE
        assert took < 0.3 + 0.25
        assert exporter.dropped == 5

    def test_a_stuck_retry_does_not_outlast_the_timeout(self, serve: Any,
                                                        exporters: Any) -> None:
        # the third attempt starts ~0.3 s in; the collector then never answers: the
        # socket may wait only for what is left of the export's 0.4 s, not 0.4 s afresh
        c = serve([Reply(503), Reply(503), Reply(200, hang_s=2.0)])
        exporter = exporters(c.url, timeout_ms=400)
        result, took = _timed_export(exporter, _spans())
        assert result is SpanExportResult.FAILURE
        assert len(c.requests) == 3
        assert took < 0.4 + 0.15

    def test_keep_alive_reuses_one_connection(self, serve: Any, exporters: Any) -> None:
        c = serve()
        exporter = exporters(c.url)
        assert exporter.export(_spans()[:2]) is SpanExportResult.SUCCESS
        assert exporter.export(_spans()[2:]) is SpanExportResult.SUCCESS
        assert [s.connection for s in c.requests] == [1, 1]
        assert c.connections == 1
        assert exporter.sent == 5

    def test_a_server_that_closes_gets_a_new_connection(self, serve: Any,
                                                        exporters: Any) -> None:
        c = serve(keep_alive=False)
        exporter = exporters(c.url)
        assert exporter.export(_spans()[:2]) is SpanExportResult.SUCCESS
        assert exporter.export(_spans()[2:]) is SpanExportResult.SUCCESS
        assert [s.connection for s in c.requests] == [1, 2]

    def test_export_after_shutdown_fails_without_sending(self, serve: Any,
                                                         exporters: Any) -> None:
        c = serve()
        exporter = exporters(c.url)
        assert exporter.export(_spans()[:1]) is SpanExportResult.SUCCESS
        exporter.shutdown()
        assert exporter.export(_spans()[:1]) is SpanExportResult.FAILURE
        assert len(c.requests) == 1

    def test_empty_batch_sends_nothing(self, serve: Any, exporters: Any) -> None:
        c = serve()
        assert exporters(c.url).export([]) is SpanExportResult.SUCCESS
        assert c.requests == []


# ---- settings


class TestSettings:
    @pytest.mark.parametrize(("env", "match"), [
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "ftp://x"}, "not an http"),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "ftp://x/v1/traces"}, "not an http"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:43l8"}, "port is not a number"),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:x/v1/traces"},
         "port is not a number"),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "gRPC is not supported"),
        ({"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/xml"}, "http/protobuf or http/json"),
        ({"OTEL_EXPORTER_OTLP_HEADERS": "novalue"}, "not key=value"),
        ({"OTEL_EXPORTER_OTLP_TIMEOUT": "abc"}, "not milliseconds"),
        ({"OTEL_EXPORTER_OTLP_TIMEOUT": "0"}, "not a positive"),
        ({"OTEL_EXPORTER_OTLP_COMPRESSION": "zstd"}, "gzip or none"),
    ], ids=["endpoint-ftp", "traces-endpoint-ftp", "endpoint-port", "traces-endpoint-port",
            "protocol-grpc", "protocol-unknown", "headers", "timeout-abc", "timeout-0",
            "compression"])
    def test_refused(self, env: dict[str, str], match: str) -> None:
        with pytest.raises(ConfigError, match=match):
            OtlpExporter(env=env)

    @pytest.mark.parametrize(("kw", "match"), [
        ({"endpoint": "http://collector:43l8/v1/traces"}, "port is not a number"),
        ({"endpoint": "ftp://x/v1/traces"}, "not an http"),
        ({"protocol": "grpc"}, "gRPC is not supported"),
    ], ids=["endpoint-port", "endpoint-ftp", "protocol-grpc"])
    def test_refused_arguments(self, kw: dict[str, str], match: str) -> None:
        # the arguments are checked as the variables are
        with pytest.raises(ConfigError, match=match):
            OtlpExporter(env={}, **kw)

    @pytest.mark.parametrize(("env", "protocol"), [
        ({}, "http/protobuf"),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "http/json"),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": " HTTP/JSON "}, "http/json"),
        ({"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
          "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "http/protobuf"),
        ({"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json",
          "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, "http/json"),
    ], ids=["default", "general", "case-and-space", "traces-wins-protobuf",
            "traces-wins-json"])
    def test_protocol_from(self, env: dict[str, str], protocol: str) -> None:
        assert protocol_from(env) == protocol
        assert OtlpExporter(env=env).protocol == protocol

    @pytest.mark.parametrize("empty", ["", "  "], ids=["empty", "blank"])
    @pytest.mark.parametrize(("name", "general", "attribute", "expected"), [
        ("HEADERS", "a=b", "headers", {"a": "b"}),
        ("PROTOCOL", "http/json", "protocol", "http/json"),
        ("TIMEOUT", "2500", "timeout_s", 2.5),
        ("COMPRESSION", "gzip", "gzip", True),
        ("ENDPOINT", "http://collector:4318", "endpoint", "http://collector:4318/v1/traces"),
    ], ids=["headers", "protocol", "timeout", "compression", "endpoint"])
    def test_an_empty_traces_variable_counts_as_unset(self, name: str, general: str,
                                                      attribute: str, expected: Any,
                                                      empty: str) -> None:
        # an empty value (as a deployment template leaves it) must not hide the general one
        exporter = OtlpExporter(env={f"OTEL_EXPORTER_OTLP_TRACES_{name}": empty,
                                     f"OTEL_EXPORTER_OTLP_{name}": general})
        assert getattr(exporter, attribute) == expected


class TestExporterFrom:
    @pytest.fixture
    def no_sdk_http_exporter(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Importing the SDK's OTLP/HTTP exporter fails, as where it is not installed
        (the ``[otel]`` extra no longer brings it): a ``None`` in ``sys.modules`` makes
        ``import`` raise ``ImportError``, for the package and any module of it loaded
        already."""
        for name in [m for m in sys.modules if m.startswith(SDK_HTTP_EXPORTER + ".")]:
            monkeypatch.setitem(sys.modules, name, None)
        monkeypatch.setitem(sys.modules, SDK_HTTP_EXPORTER, None)

    @pytest.mark.usefixtures("no_sdk_http_exporter")
    def test_default_is_our_exporter_over_protobuf(self) -> None:
        exporter = exporter_from({})
        assert isinstance(exporter, OtlpExporter)
        assert exporter.protocol == "http/protobuf"
        assert exporter.endpoint == DEFAULT_ENDPOINT + TRACES_PATH
        exporter.shutdown()

    def test_none(self) -> None:
        assert exporter_from({"OTEL_TRACES_EXPORTER": "none"}) is None

    @pytest.mark.parametrize("value", ["", " , "], ids=["empty", "blank-list"])
    def test_an_empty_exporter_variable_is_otlp(self, value: str) -> None:
        exporter = exporter_from({"OTEL_TRACES_EXPORTER": value})
        assert isinstance(exporter, OtlpExporter)
        exporter.shutdown()

    def test_console(self) -> None:
        assert isinstance(exporter_from({"OTEL_TRACES_EXPORTER": "console"}),
                          ConsoleSpanExporter)

    @pytest.mark.parametrize("name", ["jaeger", "otlp,console"])
    def test_unknown_or_several_exporters(self, name: str) -> None:
        with pytest.raises(ConfigError, match="OTEL_TRACES_EXPORTER"):
            exporter_from({"OTEL_TRACES_EXPORTER": name})

    @pytest.mark.usefixtures("no_sdk_http_exporter")
    @pytest.mark.parametrize("variable", ["OTEL_EXPORTER_OTLP_PROTOCOL",
                                          "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"])
    def test_both_protocols_are_our_exporter(self, variable: str, protocol: str) -> None:
        exporter = exporter_from({"OTEL_TRACES_EXPORTER": "otlp", variable: protocol})
        assert isinstance(exporter, OtlpExporter)
        assert exporter.protocol == protocol
        exporter.shutdown()

    def test_traces_protocol_wins_over_the_general_one(self) -> None:
        exporter = exporter_from({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                                  "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"})
        assert isinstance(exporter, OtlpExporter)
        assert exporter.protocol == "http/json"
        exporter.shutdown()

    @pytest.mark.parametrize("variable", ["OTEL_EXPORTER_OTLP_PROTOCOL",
                                          "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"])
    def test_grpc_is_refused(self, variable: str) -> None:
        with pytest.raises(ConfigError, match="gRPC"):
            exporter_from({variable: "grpc"})

    def test_an_unknown_protocol_is_refused(self) -> None:
        with pytest.raises(ConfigError, match="http/protobuf or http/json"):
            exporter_from({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/xml"})

    def test_a_bad_otlp_variable_is_an_otel_setting_error(self) -> None:
        with pytest.raises(ConfigError, match="timeout"):
            exporter_from({"OTEL_EXPORTER_OTLP_TIMEOUT": "abc"})

    def test_a_bad_port_is_an_otel_setting_error(self) -> None:
        with pytest.raises(ConfigError, match="port is not a number"):
            exporter_from({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:43l8"})


class TestResourceFrom:
    @pytest.fixture(autouse=True)
    def _clean_env(self, monkeypatch: pytest.MonkeyPatch) -> None:
        # Resource.create reads these from the process environment
        monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
        monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)

    def test_defaults(self) -> None:
        attrs = resource_from("host-a", "1.2.3").attributes
        assert attrs["service.name"] == "sfc-host"
        assert attrs["service.instance.id"] == "host-a"
        assert attrs["service.version"] == "1.2.3"

    def test_otel_service_name_wins(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("OTEL_SERVICE_NAME", "line-7-host")
        attrs = resource_from("host-a", "1.2.3").attributes
        assert attrs["service.name"] == "line-7-host"
        assert attrs["service.instance.id"] == "host-a"
        assert attrs["service.version"] == "1.2.3"

    def test_service_name_from_resource_attributes(self,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.name=plant,site=north")
        attrs = resource_from("host-a", "1.2.3").attributes
        assert attrs["service.name"] == "plant"
        assert attrs["site"] == "north"


# ---- the recorder


TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
MES_SPAN = "00f067aa0ba902b7"
ANSWER_TRACE = "0123456789abcdef0123456789abcdef"


@dataclass(frozen=True)
class _Event:
    id: str
    source: str = "mes"
    type: str = "org.isa95.job.order"
    subject: str | None = None


def _recorder() -> tuple[SpanRecorder, InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    return SpanRecorder(SimpleSpanProcessor(memory)), memory


def _request(recorder: SpanRecorder, trace: TraceContext) -> None:
    recorder.request(_Event("req-1"), "mes/requests", "StartJob", "line-1", trace,
                     root=False, start_ns=T0, end_ns=T0 + 1_000, return_status=0, ok=True)


class TestSpanRecorder:
    def test_an_unsampled_request_records_nothing(self) -> None:
        recorder, memory = _recorder()
        _request(recorder, TraceContext(TRACE, MES_SPAN, flags=0x00))
        assert memory.get_finished_spans() == ()
        assert recorder.recorded == 0

    def test_a_sampled_request_records_one_span(self) -> None:
        recorder, memory = _recorder()
        _request(recorder, TraceContext(TRACE, MES_SPAN, flags=0x01))
        [span] = memory.get_finished_spans()
        assert span.kind is SpanKind.CONSUMER
        assert span.parent is not None
        assert span.parent.span_id == int(MES_SPAN, 16)
        assert recorder.recorded == 1

    def test_answered_keeps_at_most_links_max(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(spans, "LINKS_MAX", 3)
        recorder, memory = _recorder()
        answer_span = {f"cmd-{i}": f"{i + 1:016x}" for i in range(5)}
        for cid, span_id in answer_span.items():
            recorder.answered(cid, TraceContext(ANSWER_TRACE, span_id))
        # the attempts those answers settle: only the newest three still have a link
        decision = SimpleNamespace(
            ended=[("move", cid, "org.example.move", 1, 0, 1_000, "completed")
                   for cid in answer_span],
            status="running", reason=None)
        run = job_trace(stored(TraceContext(TRACE, MES_SPAN)), "job-1", "token-1")
        recorder.settled("line-1", "job-1", run, [decision], now_ms=2_000)
        # keyed by messaging.message.id: the command id, as the semantic conventions name
        # it (the recorder no longer writes a separate sfc.command.id)
        linked = {s.attributes["messaging.message.id"]:
                  [f"{link.context.span_id:016x}" for link in s.links]
                  for s in memory.get_finished_spans()}
        assert linked == {"cmd-0": [], "cmd-1": [],
                          "cmd-2": [answer_span["cmd-2"]], "cmd-3": [answer_span["cmd-3"]],
                          "cmd-4": [answer_span["cmd-4"]]}
