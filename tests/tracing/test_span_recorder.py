"""The span recorder's two ways out: encoded from its fields by the compiled encoder
(``span_record``, for the host's batcher with protobuf) and as the SDK's span objects
(any other processor, which the trace tests read). The same calls must give the same
spans, byte for byte once the objects are encoded (``span_entry``)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan

from sfc_fast.wire.otlp import span_entry
from sfc_host.tracing.context import TraceContext, job_trace, stored
from sfc_host.tracing.spans import SpanRecorder

T0_MS = 1_700_000_000_123
TRACE = TraceContext("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", 0x01,
                     "vendor=abc,ot=p:8")


class Entries:
    """A processor that takes spans encoded, as the host's batcher does."""

    takes_entries = True

    def __init__(self) -> None:
        self.got: list[bytes] = []

    def on_entry(self, resource: Any, scope: Any, entry: bytes) -> None:
        self.got.append(entry)


class Objects:
    """A processor that takes span objects, as the SDK's do."""

    def __init__(self) -> None:
        self.got: list[bytes] = []
        self.spans: list[ReadableSpan] = []

    def on_end(self, span: ReadableSpan) -> None:
        self.spans.append(span)
        self.got.append(span_entry(span))


def _drive(rec: SpanRecorder) -> None:
    """Every kind of span the host records, with links, errors and a hold."""
    ev = SimpleNamespace(id="req-1", source="urn:mes", type="StoreAndStart.v2",
                         subject="line1")
    rec.request(ev, "mes/line1/commands", "StoreAndStart", "line1", TRACE, root=False,
                start_ns=T0_MS * 10**6, end_ns=T0_MS * 10**6 + 900, return_status=1,
                ok=True, job="J1")
    rec.request(ev, "mes/line1/commands", None, None, TRACE, root=True,
                start_ns=T0_MS * 10**6, end_ns=T0_MS * 10**6 - 5, return_status=None,
                ok=False, message="bad request", repeat=True)
    rec.call("Stop", "line1", "J1", TRACE, start_ns=1, end_ns=2, ok=False, message="")
    trace = job_trace(stored(TRACE), "J1", "tok", "wm-tighten")
    rec.answered("J1:tighten#1", TraceContext("0af7651916cd43dd8448eb211c80319c",
                                              "b7ad6b7169203331", 0x01, "st=1"))
    rec.evented("line1", "org.x.Passed", TraceContext("0af7651916cd43dd8448eb211c80319c",
                                                       "c7ad6b7169203331", 0x00))
    ended = [("tighten", "J1:tighten#1", "org.x.Tighten", 1, 0, T0_MS, "completed"),
             ("tighten", "J1:tighten#2", "org.x.Tighten", 2, 1, T0_MS + 5, "timeout"),
             ("qa", None, "org.x.Passed", 1, 0, T0_MS + 7, "completed"),
             (None, None, None, 0, 0, T0_MS + 9, "resumed")]
    rec.settled("line1", "J1", trace, [SimpleNamespace(ended=ended, status="running",
                                                        reason="")], T0_MS + 20)
    rec.settled("line1", "J1", trace, [SimpleNamespace(ended=[], status="aborted",
                                                        reason="action qa failed")],
                T0_MS + 30, started_ms=T0_MS - 100)


def test_encoded_from_fields_and_from_span_objects_the_same() -> None:
    fast, slow = Entries(), Objects()
    _drive(SpanRecorder(fast, equipment_prefix="plant", version="1.0"))  # type: ignore[arg-type]
    _drive(SpanRecorder(slow, equipment_prefix="plant", version="1.0"))  # type: ignore[arg-type]
    assert len(fast.got) == len(slow.got) == 8
    assert fast.got == slow.got
    by_name = {s.name: s for s in slow.spans}
    # what the objects say, so the bytes are known to carry it
    first, second = (s for s in slow.spans if s.name == "send tighten")
    assert first.links[0].context.span_id == 0xB7AD6B7169203331
    assert not second.links and second.status.description == "timeout"
    assert by_name["wait qa"].links[0].context.trace_flags == 0x00
    assert by_name["job wm-tighten"].status.description == "action qa failed"
    assert by_name["process request"].parent is None
    assert by_name["process StoreAndStart"].parent.is_remote  # type: ignore[union-attr]
