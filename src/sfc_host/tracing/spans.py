"""OpenTelemetry spans of a job's life (setting ``otel``): recorded when each ends, by
the host that sees it end.

Imported only with ``otel = true`` (it needs the ``[otel]`` extra); without it the trace
context still flows on the wire (``context``) and no OpenTelemetry code is loaded.

A span's start may have happened on another host, or before a restart: every start is
read from what Redis keeps (the job's start, an attempt's ``since``), and every span id
is derived from the trace id and what names the span (``context.span_id_for``), the id
the wire already carries. So a span is recorded once, by the host whose write ends it,
and its children, recorded elsewhere, still hang under it:

- MES request (consumer): id from ``mes:{request id}``, under the MES's span (remote);
- job (internal), start to end: id from ``job:{job}:{token}`` (what its status events
  carry), under the request that stored its order;
- action attempt, command sent to answer settled (producer; a pull wait: consumer): id
  from the command id (what the command carries; a wait: the job span, action, round
  and attempt), under the job;
- hold (internal), Pause to Resume: id from the job span and the hold's start, under
  the job.

Spans go to a ``SpanProcessor`` (the SDK's batch processor, or any other); only sampled
traces (flag bit 0) are recorded.
"""

from __future__ import annotations

import functools
import os
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.span import TraceState

from sfc_fast.wire.otlp import span_record
from sfc_host.errors import ConfigError
from sfc_host.tracing.batch import OtlpBatcher, settings_from
from sfc_host.tracing.context import TraceContext, job_run, span_int_for
from sfc_host.tracing.otlp import OtlpExporter

SERVICE_NAME = "sfc-host"
LINKS_MAX = 10_000       # answers' contexts waiting for their attempt to be recorded

_UNSET = Status(StatusCode.UNSET)


@functools.lru_cache(maxsize=256)
def _flags(flags: int) -> TraceFlags:
    return TraceFlags(flags & 0xFF)


@functools.lru_cache(maxsize=1024)
def _state(header: str | None) -> TraceState | None:
    return TraceState.from_header([header]) if header else None


# OTLP's span kinds (the SDK's count from 0) and status codes
INTERNAL, SERVER, CLIENT, PRODUCER, CONSUMER = 1, 2, 3, 4, 5
_KINDS = {k.value + 1: k for k in SpanKind}
UNSET, ERROR = 0, 2
_ERROR_OUTCOMES = frozenset(("failed", "timeout"))

# what an answer or a pull event's own context is kept as until its attempt is
# recorded: (trace id, span id, tracestate, flags, remote)
LinkFields = tuple[int, int, str | None, int, bool]


def _link_fields(c: TraceContext) -> LinkFields:
    return (int(c.trace_id, 16), int(c.span_id, 16), c.state or None, c.flags & 0xFF, True)


class _Run:
    """A job's stored context, read once: what each of its spans needs."""

    __slots__ = ("flags", "job", "parent", "run_span", "state", "trace", "trace_int",
                 "work_master")

    def __init__(self, c: TraceContext, parent: str, work_master: str) -> None:
        self.trace = c.trace_id
        self.trace_int = int(c.trace_id, 16)
        self.run_span = c.span_id
        self.job = int(c.span_id, 16)
        self.parent = int(parent, 16) if parent else None
        self.flags = c.flags & 0xFF
        self.state = c.state or None
        self.work_master = work_master

    def child(self, key: str) -> int:
        """The id of the span ``key`` names in this trace (``span_id_for``)."""
        return span_int_for(self.trace, key)


# a job's spans are recorded one write at a time: its context is read once
@functools.lru_cache(maxsize=4096)
def _run_of(text: str) -> _Run | None:
    got = job_run(text)
    if got is None or not got[0].sampled:
        return None
    return _Run(*got)


class SpanRecorder:
    """Makes the spans of requests, jobs, attempts and holds and hands each to
    ``processor`` as it ends.

    A processor that takes encoded spans (``takes_entries``: the host's batcher with
    OTLP protobuf) gets each as bytes, written from its fields by the compiled encoder
    (``span_record``): no span object is made. Any other gets the SDK's span objects
    (or the lighter ``span_type`` it names)."""

    def __init__(self, processor: SpanProcessor, resource: Resource | None = None, *,
                 equipment_prefix: str = "equipment", version: str = "") -> None:
        self.processor = processor
        self.resource = resource if resource is not None else Resource.create(
            {"service.name": SERVICE_NAME})
        self.scope = InstrumentationScope("sfc_host", version or None)
        self.prefix = equipment_prefix
        # the context an answer or a pull event came with, until its attempt is recorded
        # (on this host, which applies the answers it receives)
        self._answers: OrderedDict[str, LinkFields] = OrderedDict()
        self._events: OrderedDict[tuple[str, str], LinkFields] = OrderedDict()
        self.recorded = 0
        self._entries = bool(getattr(processor, "takes_entries", False))
        self._span: Any = getattr(processor, "span_type", ReadableSpan)

    def _emit(self, name: str, trace: int, span: int, parent: int | None,
              parent_remote: bool, flags: int, state: str | None, kind: int,
              start_ns: int, end_ns: int, attributes: tuple[Any, ...], code: int = UNSET,
              message: str | None = None, link: LinkFields | None = None) -> None:
        """One ended span, from its fields: ids as ints, ``kind`` and ``code`` OTLP's,
        ``attributes`` flat (key, value, key, value …)."""
        if self._entries:
            self.processor.on_entry(self.resource, self.scope, span_record(  # type: ignore[attr-defined]
                trace, span, parent, parent_remote, flags, state, name, kind, start_ns,
                end_ns, attributes, code, message, link))
        else:
            self.processor.on_end(self._object(
                name, trace, span, parent, parent_remote, flags, state, kind, start_ns,
                end_ns, attributes, code, message, link))
        self.recorded += 1

    def _object(self, name: str, trace: int, span: int, parent: int | None,
                parent_remote: bool, flags: int, state: str | None, kind: int,
                start_ns: int, end_ns: int, attributes: tuple[Any, ...], code: int,
                message: str | None, link: LinkFields | None) -> Any:
        """The same span as the SDK's ``ReadableSpan`` (or ``span_type``)."""
        tf, ts = _flags(flags), _state(state)
        ctx = SpanContext(trace, span, False, tf, ts)
        up = SpanContext(trace, parent, parent_remote, tf, ts) if parent is not None else None
        links: tuple[Link, ...] = ()
        if link is not None:
            lt, ls, lstate, lflags, lremote = link
            links = (Link(SpanContext(lt, ls, lremote, _flags(lflags), _state(lstate))),)
        status = Status(StatusCode(code), message) if code else _UNSET
        attrs = dict(zip(attributes[::2], attributes[1::2], strict=True))
        return self._span(name, ctx, up, self.resource, attrs, (), links, _KINDS[kind], None,
                          status, start_ns, max(end_ns, start_ns), self.scope)

    # ---- the MES side

    def request(self, event: Any, topic: str, method: str | None, scope: str | None,
                trace: TraceContext, *, root: bool, start_ns: int, end_ns: int,
                return_status: int | None, ok: bool, message: str = "",
                job: str | None = None, repeat: bool = False) -> None:
        """The host's handling of one MES request (a CloudEvent): a consumer span under
        the MES's (``root``: the request came without one; the span starts a trace)."""
        if not trace.sampled:
            return
        attrs: tuple[Any, ...] = (
            "messaging.system", "mqtt", "messaging.operation.type", "process",
            "messaging.operation.name", "process", "messaging.destination.name", topic,
            "messaging.message.id", event.id, "cloudevents.event_id", event.id,
            "cloudevents.event_source", event.source, "cloudevents.event_type", event.type,
            "cloudevents.event_spec_version", "1.0")
        if event.subject:
            attrs += ("cloudevents.event_subject", event.subject)
        if scope:
            attrs += ("sfc.scope", scope)
        if job:
            attrs += ("sfc.job_order.id", job)
        if method:
            attrs += ("sfc.mes.method", method)
        if return_status is not None:
            attrs += ("sfc.mes.return_status", return_status)
        if repeat:
            attrs += ("sfc.mes.repeat", True)
        trace_int = int(trace.trace_id, 16)
        self._emit(f"process {method or 'request'}", trace_int,
                   span_int_for(trace.trace_id, f"mes:{event.id}"),
                   None if root else int(trace.span_id, 16), True, trace.flags,
                   trace.state or None, CONSUMER, start_ns, end_ns, attrs,
                   UNSET if ok else ERROR, None if ok else (message[:500] or None))

    def call(self, method: str, scope: str, job: str | None, trace: TraceContext, *,
             start_ns: int, end_ns: int, ok: bool, message: str = "") -> None:
        """A job control call that came with no MES request (a script's ``api.jobs``):
        the root of the trace it started."""
        if not trace.sampled:
            return
        attrs: tuple[Any, ...] = ("sfc.scope", scope, "sfc.mes.method", method)
        if job:
            attrs += ("sfc.job_order.id", job)
        self._emit(method, int(trace.trace_id, 16), int(trace.span_id, 16), None, False,
                   trace.flags, trace.state or None, INTERNAL, start_ns, end_ns, attrs,
                   UNSET if ok else ERROR, None if ok else (message[:500] or None))

    # ---- equipment

    def answered(self, command_id: str, trace: TraceContext) -> None:
        """An answer's own context, linked from its attempt's span when it is recorded."""
        self._keep(self._answers, command_id, _link_fields(trace))

    def evented(self, scope: str, type_id: str, trace: TraceContext) -> None:
        """A pull event's own context, linked from the wait it settles."""
        self._keep(self._events, (scope, type_id), _link_fields(trace))

    @staticmethod
    def _keep(into: OrderedDict[Any, LinkFields], key: Any, link: LinkFields) -> None:
        into[key] = link
        into.move_to_end(key)
        while len(into) > LINKS_MAX:
            into.popitem(last=False)

    def settled(self, scope: str, job: str, trace: str, decisions: Sequence[Any],
                now_ms: int, started_ms: int = 0) -> None:
        """A job's write: the attempts and the hold its decisions ended, each a child of
        the job span (the stored context's span, ``context.job_trace``); when it ended
        the job (``started_ms``: when the job started), the job span."""
        run = _run_of(trace)
        if run is None:
            return
        end_ns = now_ms * 1_000_000
        if started_ms:
            self._job(scope, job, run, decisions[-1], started_ms * 1_000_000, end_ns)
        for d in decisions:
            for ended in d.ended:
                if ended[0] is None:
                    self._hold(scope, job, run, ended[5], ended[6], end_ns)
                else:
                    self._attempt(scope, job, run, ended, end_ns)

    def _attempt(self, scope: str, job: str, run: _Run, ended: tuple[Any, ...],
                 end_ns: int) -> None:
        """An action's attempt: a command sent to its answer settled (producer), or a
        pull action's wait (consumer)."""
        action, cid, type_id, attempt, rnd, since, outcome = ended
        link = None
        op, leaf = ("send", "commands") if cid is not None else ("receive", "events")
        attrs: tuple[Any, ...] = (
            "messaging.system", "mqtt", "messaging.operation.type", op,
            "messaging.operation.name", op,
            "messaging.destination.name", f"{self.prefix}/{scope}/{leaf}",
            "cloudevents.event_type", type_id, "sfc.scope", scope,
            "sfc.job_order.id", job, "sfc.action.name", action,
            "sfc.action.attempt", attempt, "sfc.action.round", rnd,
            "sfc.action.outcome", outcome)
        if cid is not None:
            span = run.child(cid)
            if self._answers:
                link = self._answers.pop(cid, None)
            attrs += ("messaging.message.id", cid, "cloudevents.event_id", cid)
            name, kind = f"send {action}", PRODUCER
        else:
            span = run.child(f"{run.run_span}:{action}:{rnd}:{attempt}")
            if outcome == "completed" and self._events:
                link = self._events.pop((scope, type_id), None)
            name, kind = f"wait {action}", CONSUMER
        failed = outcome in _ERROR_OUTCOMES
        self._emit(name, run.trace_int, span, run.job, False, run.flags, run.state, kind,
                   since * 1_000_000, end_ns, attrs, ERROR if failed else UNSET,
                   outcome if failed else None, link)

    def _hold(self, scope: str, job: str, run: _Run, since: int, outcome: str,
              end_ns: int) -> None:
        """The job's hold: from the Pause to the Resume (or the job's end)."""
        self._emit("hold", run.trace_int, run.child(f"{run.run_span}:hold:{since}"), run.job,
                   False, run.flags, run.state, INTERNAL, since * 1_000_000, end_ns,
                   ("sfc.scope", scope, "sfc.job_order.id", job, "sfc.hold.outcome", outcome))

    def _job(self, scope: str, job: str, run: _Run, last: Any, start_ns: int,
             end_ns: int) -> None:
        """The job span: its run from start to end, under the request that stored it."""
        wm = run.work_master
        attrs: tuple[Any, ...] = ("sfc.scope", scope, "sfc.job_order.id", job,
                                  "sfc.job.status", last.status)
        if wm:
            attrs += ("sfc.work_master.id", wm)
        if last.reason:
            attrs += ("sfc.job.reason", last.reason)
        aborted = last.status == "aborted"
        self._emit(f"job {wm}" if wm else "job", run.trace_int, run.job, run.parent, False,
                   run.flags, run.state, INTERNAL, start_ns, end_ns, attrs,
                   ERROR if aborted else UNSET,
                   (last.reason or "aborted")[:500] if aborted else None)

    def shutdown(self) -> None:
        """Export what is queued, then stop (the host's close)."""
        self.processor.force_flush()
        self.processor.shutdown()


# ---- made from the standard variables


def exporter_from(env: Mapping[str, str]) -> SpanExporter | None:
    """The exporter ``OTEL_TRACES_EXPORTER`` names: ``otlp`` (the default: the host's
    own, ``otlp.OtlpExporter``, over HTTP as ``OTEL_EXPORTER_OTLP_*`` say), ``console``
    or ``none`` (no spans). ``ConfigError`` for anything else."""
    raw = env.get("OTEL_TRACES_EXPORTER", "")
    names = [n.strip().lower() for n in raw.split(",") if n.strip()] or ["otlp"]
    if len(names) > 1:
        raise ConfigError(f"OTEL_TRACES_EXPORTER={raw!r}: one exporter (otlp, console "
                          "or none)", "OTEL_TRACES_EXPORTER")
    name = names[0]
    if name == "none":
        return None
    if name == "console":
        return ConsoleSpanExporter()
    if name != "otlp":
        raise ConfigError(f"OTEL_TRACES_EXPORTER={name!r}: otlp, console or none",
                          "OTEL_TRACES_EXPORTER")
    try:
        return OtlpExporter(env=env)
    except OSError as e:    # a certificate or key file that cannot be read
        raise ConfigError(str(e), "otel") from None


def resource_from(consumer: str, version: str) -> Resource:
    """The host's resource: ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES`` as the
    SDK reads them, ``sfc-host`` when they name no service, this host's consumer name as
    ``service.instance.id`` and its version."""
    base = Resource.create({"service.instance.id": consumer, "service.version": version})
    if str(base.attributes.get("service.name", "")).startswith("unknown_service"):
        base = base.merge(Resource({"service.name": SERVICE_NAME}))
    return base


def processor_from(env: Mapping[str, str], metrics: Any = None) -> SpanProcessor | None:
    """The span processor the variables configure: for OTLP the host's batcher
    (``batch.OtlpBatcher``, counting into ``metrics``' ``spans_exported`` and
    ``spans_dropped``), for the console the SDK's batch processor; None for ``none``."""
    exporter = exporter_from(env)
    if exporter is None:
        return None
    if isinstance(exporter, OtlpExporter):
        if metrics is None:
            return OtlpBatcher(exporter, env=env)
        return OtlpBatcher(exporter, env=env,
                           on_sent=lambda n: metrics.inc("spans_exported", n),
                           on_dropped=lambda n: metrics.inc("spans_dropped", n))
    return BatchSpanProcessor(exporter)


def recorder_from(consumer: str, version: str, equipment_prefix: str,
                  env: Mapping[str, str] | None = None,
                  processor: SpanProcessor | None = None,
                  metrics: Any = None) -> SpanRecorder | None:
    """The host's recorder as the ``OTEL_*`` variables configure it (``processor``
    instead, e.g. a test's), or None when they say ``none``."""
    if processor is None:
        processor = processor_from(os.environ if env is None else env, metrics)
        if processor is None:
            return None
    return SpanRecorder(processor, resource_from(consumer, version),
                        equipment_prefix=equipment_prefix, version=version)


def check_batch(env: Mapping[str, str]) -> None:
    """The ``OTEL_BSP_*`` variables can be used (``ConfigError`` if not)."""
    settings_from(env)
