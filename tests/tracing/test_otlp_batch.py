"""The host's span processor (``tracing.batch.OtlpBatcher``) against a real OTLP/HTTP
collector on 127.0.0.1: full batches go at once, a partial one after the delay, a slow
collector costs dropped (and counted) batches, never a wait; flush and shutdown send
what waits; its settings come from the ``OTEL_BSP_*`` variables."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from helpers.otlp import Collector, Reply
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanContext, TraceFlags

from sfc_host.errors import ConfigError
from sfc_host.tracing.batch import OtlpBatcher, settings_from
from sfc_host.tracing.otlp import OtlpExporter
from sfc_host.tracing.spans import check_batch, processor_from

RES = Resource.create({"service.name": "test"})


def _span(i: int, name: str = "s") -> ReadableSpan:
    ctx = SpanContext(0xABC, i + 1, False, TraceFlags(1))
    return ReadableSpan(f"{name}{i}", ctx, None, RES, {"i": i}, start_time=1, end_time=2)


def _names(c: Collector) -> list[str]:
    return [s.name for r in c.requests
            for rs in ExportTraceServiceRequest.FromString(r.body).resource_spans
            for ss in rs.scope_spans for s in ss.spans]


def _wait(pred: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.01)


@pytest.fixture
def collector() -> Iterator[Collector]:
    c = Collector()
    c.start()
    yield c
    c.stop()


def _batcher(c: Collector, **env: str) -> OtlpBatcher:
    counts: dict[str, int] = {"sent": 0, "dropped": 0}
    b = OtlpBatcher(OtlpExporter(c.url, env={"OTEL_EXPORTER_OTLP_TIMEOUT": "2000"}),
                    env=env,
                    on_sent=lambda n: counts.__setitem__("sent", counts["sent"] + n),
                    on_dropped=lambda n: counts.__setitem__("dropped", counts["dropped"] + n))
    b.counts = counts  # type: ignore[attr-defined]
    return b


def test_a_full_batch_goes_at_once_a_partial_one_after_the_delay(collector: Collector) -> None:
    b = _batcher(collector, OTEL_BSP_MAX_EXPORT_BATCH_SIZE="4", OTEL_BSP_SCHEDULE_DELAY="300")
    try:
        for i in range(4):
            b.on_end(_span(i))
        _wait(lambda: len(collector.requests) == 1, 1.0)       # well before the delay
        b.on_end(_span(4))
        time.sleep(0.1)
        assert len(collector.requests) == 1                     # waits for the delay
        _wait(lambda: len(collector.requests) == 2, 2.0)
        assert _names(collector) == [f"s{i}" for i in range(5)]
        _wait(lambda: b.sent == 5, 2.0)         # counted once the reply is read
        assert b.counts["sent"] == 5                            # type: ignore[attr-defined]
    finally:
        b.shutdown()


def test_force_flush_sends_what_waits_and_returns_once_sent(collector: Collector) -> None:
    b = _batcher(collector, OTEL_BSP_SCHEDULE_DELAY="60000")
    try:
        for i in range(3):
            b.on_end(_span(i))
        assert b.force_flush(5000)
        assert _names(collector) == ["s0", "s1", "s2"]
    finally:
        b.shutdown()


def test_shutdown_sends_what_waits_then_takes_no_more(collector: Collector) -> None:
    b = _batcher(collector, OTEL_BSP_SCHEDULE_DELAY="60000")
    b.on_end(_span(0))
    b.shutdown()
    assert _names(collector) == ["s0"]
    b.on_end(_span(1))
    b.shutdown()                                                # twice: nothing happens
    assert _names(collector) == ["s0"] and not b._thread.is_alive()


def test_a_slow_collector_costs_dropped_batches_never_a_wait() -> None:
    # every request hangs 0.5 s: the first batch is being sent, one more may wait
    slow = Collector(default=Reply(hang_s=0.5))
    slow.start()
    b = _batcher(slow, OTEL_BSP_MAX_EXPORT_BATCH_SIZE="2", OTEL_BSP_MAX_QUEUE_SIZE="2",
                 OTEL_BSP_SCHEDULE_DELAY="60000")
    try:
        t0 = time.perf_counter()
        for i in range(10):
            b.on_end(_span(i))
        took = time.perf_counter() - t0
        assert took < 0.1, took                                 # the caller never waited
        assert b.dropped >= 6 and b.counts["dropped"] == b.dropped  # type: ignore[attr-defined]
        assert b.force_flush(5000)
        assert b.sent + b.dropped == 10
    finally:
        b.shutdown()
        slow.stop()


def test_a_refused_batch_is_dropped_and_counted(collector: Collector) -> None:
    refusing = Collector(default=Reply(status=400))
    refusing.start()
    b = _batcher(refusing, OTEL_BSP_MAX_EXPORT_BATCH_SIZE="2")
    try:
        b.on_end(_span(0))
        b.on_end(_span(1))
        _wait(lambda: b.counts["dropped"] == 2)                 # type: ignore[attr-defined]
        assert b.sent == 0 and b.dropped == 2
    finally:
        b.shutdown()
        refusing.stop()


def test_settings_from_the_variables() -> None:
    assert settings_from({}) == (512, 5.0, 2048)
    assert settings_from({"OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "100",
                          "OTEL_BSP_SCHEDULE_DELAY": "250",
                          "OTEL_BSP_MAX_QUEUE_SIZE": "50"}) == (50, 0.25, 50)
    for name in ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "OTEL_BSP_SCHEDULE_DELAY",
                 "OTEL_BSP_MAX_QUEUE_SIZE"):
        for bad in ("x", "0", "-3", "1.5"):
            with pytest.raises(ConfigError, match=name) as caught:
                settings_from({name: bad})
            assert caught.value.setting == name
            with pytest.raises(ConfigError, match=name):
                check_batch({name: bad})


def test_the_host_counts_what_went_and_what_was_dropped(collector: Collector) -> None:
    from sfc_host.metrics import Metrics

    m = Metrics()
    b = processor_from({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": collector.url}, m)
    assert isinstance(b, OtlpBatcher)
    try:
        b.on_end(_span(0))
        assert b.force_flush(5000)
        assert m["spans_exported"] == 1 and m["spans_dropped"] == 0
    finally:
        b.shutdown()
    assert processor_from({"OTEL_TRACES_EXPORTER": "none"}) is None
