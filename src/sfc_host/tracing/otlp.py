"""OTLP/HTTP with JSON: the host's span exporter (``http/json``, the default).

The SDK's OTLP exporter builds a protobuf object per attribute: about 30 µs a span,
half of what a whole action costs the host. This one writes the OTLP JSON encoding
(the same messages, IDs in hex as OTLP's JSON requires) with msgspec, for a few µs a
span, and sends it as a collector, Jaeger or Tempo takes it on port 4318.

It does an exporter's whole job, configured by the standard variables (the
``TRACES_`` form wins over the general one):

- ``OTEL_EXPORTER_OTLP[_TRACES]_ENDPOINT``: the general one gets ``/v1/traces``
  appended, the traces one is used as given; default ``http://localhost:4318``;
- ``…_HEADERS`` (``key=value,…``, values URL-encoded), ``…_TIMEOUT`` (ms, default
  10,000), ``…_COMPRESSION`` (``gzip`` or ``none``);
- ``…_CERTIFICATE`` (CA bundle), ``…_CLIENT_CERTIFICATE`` and ``…_CLIENT_KEY``
  (mutual TLS) for an ``https`` endpoint.

A batch the collector refuses for a while (429, 502, 503, 504, or no connection) is
sent again with exponential backoff (``Retry-After`` honoured) until the timeout; then
it is dropped and the export reports failure (the SDK's processor logs it). Any other
refusal drops the batch at once: sending it again would not help.
"""

from __future__ import annotations

import base64
import gzip
import http.client
import logging
import os
import random
import ssl
import threading
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import SpanKind, StatusCode

log = logging.getLogger("sfc_host.tracing.otlp")

DEFAULT_ENDPOINT = "http://localhost:4318"
TRACES_PATH = "/v1/traces"
DEFAULT_TIMEOUT_MS = 10_000
RETRYABLE = frozenset((429, 502, 503, 504))

# OTLP's SpanKind and StatusCode numbers (the SDK's enums start at 0)
_KIND = {SpanKind.INTERNAL: 1, SpanKind.SERVER: 2, SpanKind.CLIENT: 3,
         SpanKind.PRODUCER: 4, SpanKind.CONSUMER: 5}
_STATUS = {StatusCode.UNSET: 0, StatusCode.OK: 1, StatusCode.ERROR: 2}
# SpanFlags: the W3C flags in the low byte; bit 8 says bit 9 (the parent is remote) is set
_HAS_IS_REMOTE = 0x100
_IS_REMOTE = 0x200

_ENCODE = msgspec.json.Encoder()


class OtlpSettingError(ValueError):
    """An ``OTEL_EXPORTER_OTLP_*`` variable the exporter cannot use; says which."""


def _env(env: Mapping[str, str], name: str) -> str | None:
    v = env.get(f"OTEL_EXPORTER_OTLP_TRACES_{name}")
    if v is None:
        v = env.get(f"OTEL_EXPORTER_OTLP_{name}")
    return v.strip() if v is not None else None


def endpoint_from(env: Mapping[str, str]) -> str:
    """The URL spans are posted to, as the variables say."""
    v = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    if not v:
        base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip() or DEFAULT_ENDPOINT
        v = base.rstrip("/") + TRACES_PATH
    u = urllib.parse.urlsplit(v)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise OtlpSettingError(f"OTLP endpoint {v!r}: not an http(s) address")
    return v


def headers_from(text: str | None) -> dict[str, str]:
    """``key=value,…`` (values URL-encoded) as a dict; a member without ``=`` refused."""
    out: dict[str, str] = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        key, eq, value = part.partition("=")
        if not eq or not key.strip():
            raise OtlpSettingError(f"OTLP headers: {part.strip()!r} is not key=value")
        out[urllib.parse.unquote(key.strip())] = urllib.parse.unquote(value.strip())
    return out


class OtlpJsonExporter(SpanExporter):
    """Spans to an OTLP/HTTP endpoint as JSON; one connection, kept open."""

    def __init__(self, endpoint: str | None = None, *, headers: Mapping[str, str] | None = None,
                 timeout_ms: int | None = None, compression: str | None = None,
                 ca_file: str | None = None, cert_file: str | None = None,
                 key_file: str | None = None, env: Mapping[str, str] | None = None) -> None:
        e = os.environ if env is None else env
        self.endpoint = endpoint or endpoint_from(e)
        self.headers = dict(headers) if headers is not None else headers_from(_env(e, "HEADERS"))
        if timeout_ms is None:
            raw = _env(e, "TIMEOUT")
            try:
                timeout_ms = int(raw) if raw else DEFAULT_TIMEOUT_MS
            except ValueError:
                raise OtlpSettingError(f"OTLP timeout {raw!r}: not milliseconds") from None
        if timeout_ms <= 0:
            raise OtlpSettingError(f"OTLP timeout {timeout_ms}: not a positive number of ms")
        self.timeout_s = timeout_ms / 1000
        compression = (compression if compression is not None
                       else _env(e, "COMPRESSION") or "none").lower()
        if compression not in ("gzip", "none"):
            raise OtlpSettingError(f"OTLP compression {compression!r}: gzip or none")
        self.gzip = compression == "gzip"
        u = urllib.parse.urlsplit(self.endpoint)
        self._https = u.scheme == "https"
        self._host = u.hostname or "localhost"
        self._port = u.port or (443 if self._https else 80)
        self._path = (u.path or "/") + (f"?{u.query}" if u.query else "")
        self._tls: ssl.SSLContext | None = None
        if self._https:
            ca = ca_file if ca_file is not None else _env(e, "CERTIFICATE")
            self._tls = ssl.create_default_context(cafile=ca or None)
            cert = cert_file if cert_file is not None else _env(e, "CLIENT_CERTIFICATE")
            key = key_file if key_file is not None else _env(e, "CLIENT_KEY")
            if cert:
                self._tls.load_cert_chain(cert, key or None)
        self._conn: http.client.HTTPConnection | None = None
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self.sent = 0           # spans the endpoint took
        self.dropped = 0        # spans given up on

    # ---- SpanExporter

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._stopped.is_set():
            return SpanExportResult.FAILURE
        if not spans:
            return SpanExportResult.SUCCESS
        body = encode(spans)
        with self._lock:
            ok = self._post(body)
        if ok:
            self.sent += len(spans)
            return SpanExportResult.SUCCESS
        self.dropped += len(spans)
        return SpanExportResult.FAILURE

    def shutdown(self) -> None:
        self._stopped.set()
        with self._lock:
            self._close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True     # nothing is buffered here: the processor holds the batches

    # ---- HTTP

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            if self._https:
                self._conn = http.client.HTTPSConnection(self._host, self._port,
                                                         timeout=self.timeout_s,
                                                         context=self._tls)
            else:
                self._conn = http.client.HTTPConnection(self._host, self._port,
                                                        timeout=self.timeout_s)
        return self._conn

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _post(self, body: bytes) -> bool:
        headers = {**self.headers, "Content-Type": "application/json"}
        if self.gzip:
            body = gzip.compress(body, compresslevel=6)
            headers["Content-Encoding"] = "gzip"
        deadline = time.monotonic() + self.timeout_s
        delay = 0.1
        while True:
            retry_after: float | None = None
            try:
                conn = self._connection()
                conn.request("POST", self._path, body=body, headers=headers)
                resp = conn.getresponse()
                reply = resp.read()
                status = resp.status
                if resp.will_close:
                    self._close()
            except (OSError, http.client.HTTPException) as e:
                self._close()
                why = f"{type(e).__name__}: {e}"
                status = 0
            else:
                if 200 <= status < 300:
                    return True
                why = f"HTTP {status} {reply[:200].decode('utf-8', 'replace')}"
                if status not in RETRYABLE:
                    log.warning("OTLP endpoint %s refused %d bytes of spans: %s",
                                self.endpoint, len(body), why)
                    return False
                retry_after = _retry_after(resp.getheader("Retry-After"))
            wait = retry_after if retry_after is not None else delay * random.uniform(0.8, 1.2)
            if self._stopped.is_set() or time.monotonic() + wait > deadline:
                log.warning("OTLP endpoint %s: spans dropped after retrying: %s",
                            self.endpoint, why)
                return False
            time.sleep(wait)
            delay = min(delay * 2, 5.0)


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None     # an HTTP date: the backoff decides


# ---- the OTLP JSON encoding


def encode(spans: Sequence[ReadableSpan]) -> bytes:
    """An ``ExportTraceServiceRequest`` in OTLP's JSON encoding: spans grouped by
    resource and instrumentation scope; trace and span ids in hex, 64-bit integers as
    strings, enums as numbers."""
    by_resource: dict[int, tuple[Any, dict[tuple[str, str | None], list[Any]]]] = {}
    for s in spans:
        res = s.resource
        got = by_resource.get(id(res))
        if got is None:
            got = by_resource[id(res)] = (res, {})
        scope = s.instrumentation_scope
        key = (scope.name, scope.version) if scope is not None else ("", None)
        got[1].setdefault(key, []).append(_span(s))
    out = []
    for res, scopes in by_resource.values():
        rs: dict[str, Any] = {"resource": {"attributes": attributes(res.attributes)},
                              "scopeSpans": [
                                  {"scope": {"name": n, **({"version": v} if v else {})},
                                   "spans": lst} for (n, v), lst in scopes.items()]}
        if res.schema_url:
            rs["schemaUrl"] = res.schema_url
        out.append(rs)
    return _ENCODE.encode({"resourceSpans": out})


def _span(s: ReadableSpan) -> dict[str, Any]:
    ctx = s.context
    parent = s.parent
    flags = int(ctx.trace_flags) | _HAS_IS_REMOTE
    d: dict[str, Any] = {"traceId": f"{ctx.trace_id:032x}", "spanId": f"{ctx.span_id:016x}"}
    state = ctx.trace_state.to_header() if ctx.trace_state else ""
    if state:
        d["traceState"] = state
    if parent is not None:
        d["parentSpanId"] = f"{parent.span_id:016x}"
        if parent.is_remote:
            flags |= _IS_REMOTE
    d["flags"] = flags
    d["name"] = s.name
    d["kind"] = _KIND.get(s.kind, 0)
    d["startTimeUnixNano"] = str(s.start_time or 0)
    d["endTimeUnixNano"] = str(s.end_time or 0)
    if s.attributes:
        d["attributes"] = attributes(s.attributes)
    if s.events:
        d["events"] = [{"timeUnixNano": str(ev.timestamp), "name": ev.name,
                        **({"attributes": attributes(ev.attributes)} if ev.attributes else {})}
                       for ev in s.events]
    if s.links:
        links = []
        for link in s.links:
            lc = link.context
            one: dict[str, Any] = {"traceId": f"{lc.trace_id:032x}",
                                   "spanId": f"{lc.span_id:016x}",
                                   "flags": int(lc.trace_flags) | _HAS_IS_REMOTE
                                   | (_IS_REMOTE if lc.is_remote else 0)}
            ls = lc.trace_state.to_header() if lc.trace_state else ""
            if ls:
                one["traceState"] = ls
            if link.attributes:
                one["attributes"] = attributes(link.attributes)
            links.append(one)
        d["links"] = links
    status = s.status
    code = _STATUS.get(status.status_code, 0)
    if code:
        d["status"] = {"code": code, **({"message": status.description}
                                        if status.description else {})}
    return d


def attributes(attrs: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    return [{"key": k, "value": any_value(v)} for k, v in (attrs or {}).items()]


def any_value(v: Any) -> dict[str, Any]:
    """An ``AnyValue``: bool before int (a bool is an int in Python)."""
    if isinstance(v, str):
        return {"stringValue": v}
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    if isinstance(v, float):
        return {"doubleValue": v}
    if isinstance(v, (bytes, bytearray)):
        return {"bytesValue": base64.b64encode(bytes(v)).decode("ascii")}
    if isinstance(v, Mapping):
        return {"kvlistValue": {"values": attributes(v)}}
    if isinstance(v, Sequence):
        return {"arrayValue": {"values": [any_value(x) for x in v]}}
    return {"stringValue": str(v)}
