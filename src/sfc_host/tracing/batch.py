"""The host's span processor for OTLP: spans encoded in batches where they end, sent by
a thread of its own.

The SDK's batch processor hands every span to a worker thread that encodes and sends
it: at the host's rates the two threads take the interpreter's lock from each other
hundreds of times a second, and each span pays the processor's bookkeeping (a process
id check, its own metrics). Here a span is appended to a list; every full batch is
encoded at once, on the thread that ended its last span (the host's event loop, about
3 µs a span), and only the bytes cross to the sender, which spends its time in socket
calls that release the lock.

Bounded as the SDK's processor is, by the standard variables:

- ``OTEL_BSP_MAX_EXPORT_BATCH_SIZE`` (512): spans a request;
- ``OTEL_BSP_SCHEDULE_DELAY`` (5,000 ms): the longest a span waits for its batch;
- ``OTEL_BSP_MAX_QUEUE_SIZE`` (2,048): spans waiting to be sent. When a collector is
  slow or away and that many wait, a new batch is dropped and counted (``dropped``,
  and the host's ``spans_dropped`` metric): the host never waits for its traces.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor

from sfc_fast.wire.otlp import span_entry
from sfc_host.errors import ConfigError
from sfc_host.tracing.otlp import OtlpExporter

log = logging.getLogger("sfc_host.tracing.batch")

DEFAULT_BATCH = 512
DEFAULT_DELAY_MS = 5_000
DEFAULT_QUEUE = 2_048


def _positive(env: Mapping[str, str], name: str, default: int) -> int:
    raw = (env.get(name) or "").strip()
    if not raw:
        return default
    try:
        v = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r}: not a whole number", name) from None
    if v <= 0:
        raise ConfigError(f"{name}={raw!r}: not positive", name)
    return v


def settings_from(env: Mapping[str, str]) -> tuple[int, float, int]:
    """Spans a batch, the longest a span waits (s) and the most that wait to be sent,
    as the ``OTEL_BSP_*`` variables say; ``ConfigError`` naming a bad one."""
    queue_size = _positive(env, "OTEL_BSP_MAX_QUEUE_SIZE", DEFAULT_QUEUE)
    batch = min(_positive(env, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", DEFAULT_BATCH), queue_size)
    delay_s = _positive(env, "OTEL_BSP_SCHEDULE_DELAY", DEFAULT_DELAY_MS) / 1000
    return batch, delay_s, queue_size


class PlainSpan:
    """An ended span as the OTLP encoder reads it, in plain fields.

    Made as ``ReadableSpan`` is (the same arguments) and encoded the same, byte for byte;
    the SDK's class serves each field through a property, and its dropped counts through
    a type check, which together cost the host about a microsecond a span. Only for
    processors that say they take it (``span_type``): spans nothing else reads.
    """

    __slots__ = ("attributes", "context", "end_time", "events", "instrumentation_scope",
                 "kind", "links", "name", "parent", "resource", "start_time", "status")
    dropped_attributes = 0
    dropped_events = 0
    dropped_links = 0

    def __init__(self, name: str, context: Any, parent: Any, resource: Any,
                 attributes: Any, events: Any, links: Any, kind: Any,
                 instrumentation_info: Any, status: Any, start_time: int, end_time: int,
                 instrumentation_scope: Any) -> None:
        self.name = name
        self.context = context
        self.parent = parent
        self.resource = resource
        self.attributes = attributes
        self.events = events
        self.links = links
        self.kind = kind
        self.status = status
        self.start_time = start_time
        self.end_time = end_time
        self.instrumentation_scope = instrumentation_scope


Entry = tuple[Any, Any, bytes]        # resource, instrumentation scope, the encoded span


def _grouped(entries: list[Entry]) -> list[tuple[Any, list[tuple[Any, list[bytes]]]]]:
    """Entries by resource, then by scope (equal scopes together), in the order they
    first come: an OTLP request's layout."""
    by_ids: dict[tuple[int, int], list[bytes]] = {}
    groups: dict[int, tuple[Any, dict[Any, tuple[Any, list[bytes]]]]] = {}
    for res, scope, entry in entries:
        lst = by_ids.get((id(res), id(scope)))
        if lst is None:
            got = groups.get(id(res))
            if got is None:
                got = groups[id(res)] = (res, {})
            pair = got[1].get(scope)
            if pair is None:
                pair = got[1][scope] = (scope, [])
            lst = by_ids[(id(res), id(scope))] = pair[1]
        lst.append(entry)
    return [(res, list(scopes.values())) for res, scopes in groups.values()]


class OtlpBatcher(SpanProcessor):
    """Batches spans for an ``OtlpExporter``: encoded where they end, sent by a thread.

    With protobuf (``takes_entries``) each span is encoded as it ends, and only bytes
    wait for the batch: span objects (``on_end``), or spans a recorder wrote itself
    (``on_entry``). With JSON, span objects wait: ``ReadableSpan``s, or the cheaper
    ``PlainSpan``s (``span_type``) from a recorder that knows it."""

    span_type = PlainSpan

    def __init__(self, exporter: OtlpExporter, *, env: Mapping[str, str] | None = None,
                 on_sent: Callable[[int], None] | None = None,
                 on_dropped: Callable[[int], None] | None = None) -> None:
        e = os.environ if env is None else env
        self.exporter = exporter
        self.batch_size, self.delay_s, queue_size = settings_from(e)
        self.on_sent = on_sent
        self.on_dropped = on_dropped
        self.sent = 0
        self.dropped = 0
        self.takes_entries = exporter.takes_entries
        self._spans: list[Any] = []         # span objects, or entries (takes_entries)
        self._lock = threading.Lock()
        # encoded batches waiting for the sender, with their span counts; None: stop
        self._bodies: queue.Queue[tuple[bytes, int] | None] = queue.Queue(
            maxsize=max(1, queue_size // self.batch_size))
        self._idle = threading.Condition()
        self._busy = 0            # batches handed over and not yet sent
        self._closed = False
        self._thread = threading.Thread(target=self._send_loop, name="sfc-otlp-sender",
                                        daemon=True)
        self._thread.start()

    # ---- SpanProcessor

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        pass

    def on_end(self, span: ReadableSpan | PlainSpan) -> None:  # type: ignore[override]
        if self.takes_entries:
            self.on_entry(span.resource, span.instrumentation_scope, span_entry(span))
            return
        self._add(span)

    def on_entry(self, resource: Any, scope: Any, entry: bytes) -> None:
        """A span already encoded (``sfc_fast.wire.otlp.span_record``), of ``resource``
        and ``scope``; only with ``takes_entries``."""
        self._add((resource, scope, entry))

    def _add(self, item: Any) -> None:
        if self._closed:
            return
        with self._lock:
            spans = self._spans
            spans.append(item)
            if len(spans) < self.batch_size:
                return
            self._spans = []
        self._hand_over(spans)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Send what waits, and wait for it (at most ``timeout_millis``)."""
        self._cut()
        with self._idle:
            return self._idle.wait_for(lambda: self._busy == 0, timeout_millis / 1000)

    def shutdown(self) -> None:
        """Send what waits (within the exporter's timeout), then stop the sender."""
        if self._closed:
            return
        self.force_flush(int(self.exporter.timeout_s * 1000) + 1000)
        self._closed = True
        try:
            self._bodies.put_nowait(None)
        except queue.Full:
            self.exporter.shutdown()    # stop a send in its retries: its batch is lost
            self._bodies.put(None)
        self._thread.join(self.exporter.timeout_s + 5)
        self.exporter.shutdown()

    # ---- batches

    def _cut(self) -> None:
        """Whatever is waiting, as a batch of its own."""
        with self._lock:
            spans, self._spans = self._spans, []
        if spans:
            self._hand_over(spans)

    def _hand_over(self, spans: list[Any]) -> None:
        body = self.exporter.encode_entries(_grouped(spans)) if self.takes_entries \
            else self.exporter.encode(spans)
        with self._idle:
            self._busy += 1
        try:
            self._bodies.put_nowait((body, len(spans)))
        except queue.Full:
            with self._idle:
                self._busy -= 1
                self._idle.notify_all()
            self._count(dropped=len(spans))
            log.warning("OTLP: %d spans dropped: %d more wait for a slow or absent "
                        "collector at %s", len(spans), self._bodies.qsize() * self.batch_size,
                        self.exporter.endpoint)

    def _send_loop(self) -> None:
        while True:
            try:
                item = self._bodies.get(timeout=self.delay_s)
            except queue.Empty:
                self._cut()         # the spans the delay waited for: a batch now
                continue
            if item is None:
                return
            body, n = item
            try:
                ok = self.exporter.send(body, n)
            except Exception:
                log.exception("OTLP: sending %d spans failed", n)
                ok = False
            self._count(sent=n if ok else 0, dropped=0 if ok else n)
            with self._idle:
                self._busy -= 1
                self._idle.notify_all()

    def _count(self, sent: int = 0, dropped: int = 0) -> None:
        if sent:
            self.sent += sent
            if self.on_sent is not None:
                self.on_sent(sent)
        if dropped:
            self.dropped += dropped
            if self.on_dropped is not None:
                self.on_dropped(dropped)
