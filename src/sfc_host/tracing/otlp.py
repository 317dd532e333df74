"""OTLP/HTTP: the host's span exporter, protobuf (the default) or JSON.

The SDK's OTLP exporter builds a protobuf object per span, attribute and value: about
30 µs a span, half of what a whole action costs the host. This one sends what
``sfc_fast.wire.otlp`` writes in C (``http/protobuf``, a few µs a span), or the OTLP
JSON encoding written here (``http/json``, IDs in hex as OTLP's JSON has them), as a
collector, Jaeger or Tempo takes them on port 4318.

It does an exporter's whole job, configured by the standard variables (the
``TRACES_`` form wins over the general one; an empty value counts as unset):

- ``OTEL_EXPORTER_OTLP[_TRACES]_ENDPOINT``: the general one gets ``/v1/traces``
  appended, the traces one is used as given; default ``http://localhost:4318``;
- ``…_PROTOCOL``: ``http/protobuf`` (default) or ``http/json``;
- ``…_HEADERS`` (``key=value,…``, values URL-encoded), ``…_TIMEOUT`` (ms, default
  10,000), ``…_COMPRESSION`` (``gzip`` or ``none``);
- ``…_CERTIFICATE`` (CA bundle), ``…_CLIENT_CERTIFICATE`` and ``…_CLIENT_KEY``
  (mutual TLS) for an ``https`` endpoint.

A batch the collector refuses for a while (429, 502, 503, 504, or no connection) is
sent again with exponential backoff (``Retry-After`` honoured) until the timeout, which
bounds the whole export; then it is dropped and the export reports failure (the SDK's
processor logs it). Any other refusal drops the batch at once: sending it again would
not help.
"""

from __future__ import annotations

import base64
import gzip
import http.client
import json
import logging
import math
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

from sfc_fast.wire.otlp import encode_entries, encode_spans
from sfc_host.errors import ConfigError

log = logging.getLogger("sfc_host.tracing.otlp")

DEFAULT_ENDPOINT = "http://localhost:4318"
TRACES_PATH = "/v1/traces"
DEFAULT_TIMEOUT_MS = 10_000
PROTOCOLS = {"http/protobuf": "application/x-protobuf", "http/json": "application/json"}
RETRYABLE = frozenset((429, 502, 503, 504))

# OTLP's SpanKind and StatusCode numbers (the SDK's enums start at 0)
_KIND = {SpanKind.INTERNAL: 1, SpanKind.SERVER: 2, SpanKind.CLIENT: 3,
         SpanKind.PRODUCER: 4, SpanKind.CONSUMER: 5}
_STATUS = {StatusCode.UNSET: 0, StatusCode.OK: 1, StatusCode.ERROR: 2}
# SpanFlags: the W3C flags in the low byte; bit 8 says bit 9 (the parent is remote) is set
_HAS_IS_REMOTE = 0x100
_IS_REMOTE = 0x200

_ENCODE = msgspec.json.Encoder()


def _env(env: Mapping[str, str], name: str) -> str | None:
    """The ``TRACES_`` variable, else the general one; None when neither has a value."""
    for v in (env.get(f"OTEL_EXPORTER_OTLP_TRACES_{name}"), env.get(f"OTEL_EXPORTER_OTLP_{name}")):
        if v is not None and v.strip():
            return v.strip()
    return None


def protocol_from(env: Mapping[str, str]) -> str:
    """``http/protobuf`` (the default) or ``http/json``; ``ConfigError`` else."""
    v = (_env(env, "PROTOCOL") or "http/protobuf").lower()
    if v not in PROTOCOLS:
        raise ConfigError(f"OTLP protocol {v!r}: http/protobuf or http/json "
                          "(gRPC is not supported)", "OTEL_EXPORTER_OTLP_PROTOCOL")
    return v


def endpoint_from(env: Mapping[str, str]) -> str:
    """The URL spans are posted to, as the variables say."""
    v = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    if not v:
        base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip() or DEFAULT_ENDPOINT
        v = base.rstrip("/") + TRACES_PATH
    u = urllib.parse.urlsplit(v)
    try:
        u.port      # noqa: B018 - a port that is not a number raises here
    except ValueError:
        raise ConfigError(f"OTLP endpoint {v!r}: the port is not a number",
                          "OTEL_EXPORTER_OTLP_ENDPOINT") from None
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ConfigError(f"OTLP endpoint {v!r}: not an http(s) address",
                          "OTEL_EXPORTER_OTLP_ENDPOINT")
    return v


def headers_from(text: str | None) -> dict[str, str]:
    """``key=value,…`` (values URL-encoded) as a dict; a member without ``=`` refused."""
    out: dict[str, str] = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        key, eq, value = part.partition("=")
        if not eq or not key.strip():
            raise ConfigError(f"OTLP headers: {part.strip()!r} is not key=value",
                              "OTEL_EXPORTER_OTLP_HEADERS")
        out[urllib.parse.unquote(key.strip())] = urllib.parse.unquote(value.strip())
    return out


class OtlpExporter(SpanExporter):
    """Spans to an OTLP/HTTP endpoint, protobuf or JSON; one connection, kept open."""

    def __init__(self, endpoint: str | None = None, *, protocol: str | None = None,
                 headers: Mapping[str, str] | None = None, timeout_ms: int | None = None,
                 compression: str | None = None, ca_file: str | None = None,
                 cert_file: str | None = None, key_file: str | None = None,
                 env: Mapping[str, str] | None = None) -> None:
        e = os.environ if env is None else env
        self.endpoint = endpoint_from({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": endpoint}) \
            if endpoint else endpoint_from(e)
        self.protocol = protocol_from({"OTEL_EXPORTER_OTLP_PROTOCOL": protocol}) \
            if protocol else protocol_from(e)
        self._encode = encode_spans if self.protocol == "http/protobuf" else encode
        self.headers = dict(headers) if headers is not None else headers_from(_env(e, "HEADERS"))
        if timeout_ms is None:
            raw = _env(e, "TIMEOUT")
            try:
                timeout_ms = int(raw) if raw else DEFAULT_TIMEOUT_MS
            except ValueError:
                raise ConfigError(f"OTLP timeout {raw!r}: not milliseconds",
                                  "OTEL_EXPORTER_OTLP_TIMEOUT") from None
        if timeout_ms <= 0:
            raise ConfigError(f"OTLP timeout {timeout_ms}: not a positive number of ms",
                              "OTEL_EXPORTER_OTLP_TIMEOUT")
        self.timeout_s = timeout_ms / 1000
        compression = (compression if compression is not None
                       else _env(e, "COMPRESSION") or "none").strip().lower()
        if compression not in ("gzip", "none"):
            raise ConfigError(f"OTLP compression {compression!r}: gzip or none",
                              "OTEL_EXPORTER_OTLP_COMPRESSION")
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
        ok = self.send(self.encode(spans), len(spans))
        return SpanExportResult.SUCCESS if ok else SpanExportResult.FAILURE

    # ---- in two steps (``batch.OtlpBatcher`` encodes where spans end, sends elsewhere)

    def encode(self, spans: Sequence[ReadableSpan]) -> bytes:
        """A request's body of ``spans`` in the exporter's protocol."""
        return self._encode(spans)

    @property
    def takes_entries(self) -> bool:
        """Whether spans may come encoded one by one (``encode_entries``): protobuf."""
        return self.protocol == "http/protobuf"

    def encode_entries(self, groups: Sequence[tuple[Any, Sequence[tuple[Any, Sequence[bytes]]]]]
                       ) -> bytes:
        """A protobuf request's body of spans already encoded, ``[(resource, [(scope,
        [entry, …]), …]), …]`` (``sfc_fast.wire.otlp.encode_entries``)."""
        return encode_entries(groups)

    def send(self, body: bytes, n: int) -> bool:
        """Post ``body`` (``n`` spans), retrying as the collector allows; False: the
        spans are dropped (counted)."""
        if self._stopped.is_set():
            self.dropped += n
            return False
        with self._lock:
            ok = self._post(body)
        if ok:
            self.sent += n
        else:
            self.dropped += n
        return ok

    def shutdown(self) -> None:
        self._stopped.set()
        with self._lock:
            self._close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True     # nothing is buffered here: the processor holds the batches

    # ---- HTTP

    def _connection(self, timeout_s: float) -> http.client.HTTPConnection:
        """The connection, its socket timeout set to what is left of the export's."""
        conn = self._conn
        if conn is None:
            if self._https:
                conn = http.client.HTTPSConnection(self._host, self._port,
                                                   timeout=timeout_s, context=self._tls)
            else:
                conn = http.client.HTTPConnection(self._host, self._port, timeout=timeout_s)
            self._conn = conn
        else:
            conn.timeout = timeout_s
            if conn.sock is not None:
                conn.sock.settimeout(timeout_s)
        return conn

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _post(self, body: bytes) -> bool:
        headers = {**self.headers, "Content-Type": PROTOCOLS[self.protocol]}
        if self.gzip:
            body = gzip.compress(body, compresslevel=6)
            headers["Content-Encoding"] = "gzip"
        deadline = time.monotonic() + self.timeout_s
        delay = 0.1
        while True:
            retry_after: float | None = None
            left = deadline - time.monotonic()
            if left <= 0:
                log.warning("OTLP endpoint %s: spans dropped, no answer within %g s",
                            self.endpoint, self.timeout_s)
                return False
            try:
                conn = self._connection(left)
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
    by_resource: dict[int, tuple[Any, dict[Any, tuple[Any, list[Any]]]]] = {}
    for s in spans:
        res = s.resource
        got = by_resource.get(id(res))
        if got is None:
            got = by_resource[id(res)] = (res, {})
        scope = s.instrumentation_scope
        key = scope     # equal scopes (name, version, schema, attributes) share a group
        lst = got[1].get(key)
        if lst is None:
            lst = got[1][key] = (scope, [])
        lst[1].append(_span(s))
    out = []
    for res, scopes in by_resource.values():
        rs: dict[str, Any] = {"resource": {"attributes": attributes(res.attributes)},
                              "scopeSpans": [_scope_spans(sc, lst)
                                             for sc, lst in scopes.values()]}
        if res.schema_url:
            rs["schemaUrl"] = res.schema_url
        out.append(rs)
    doc = {"resourceSpans": out}
    try:
        return _ENCODE.encode(doc)
    except UnicodeEncodeError:
        # a lone surrogate, which UTF-8 cannot hold: escaped, so the batch still goes
        return json.dumps(doc).encode("ascii")


def _scope_spans(scope: Any, spans: list[dict[str, Any]]) -> dict[str, Any]:
    if scope is None:
        return {"scope": {}, "spans": spans}
    sc: dict[str, Any] = {"name": scope.name}
    if scope.version:
        sc["version"] = scope.version
    if scope.attributes:
        sc["attributes"] = attributes(scope.attributes)
    out: dict[str, Any] = {"scope": sc, "spans": spans}
    if scope.schema_url:
        out["schemaUrl"] = scope.schema_url
    return out


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
    if s.dropped_attributes:
        d["droppedAttributesCount"] = s.dropped_attributes
    if s.events:
        d["events"] = [_event(ev) for ev in s.events]
    if s.dropped_events:
        d["droppedEventsCount"] = s.dropped_events
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
            if link.dropped_attributes:
                one["droppedAttributesCount"] = link.dropped_attributes
            links.append(one)
        d["links"] = links
    if s.dropped_links:
        d["droppedLinksCount"] = s.dropped_links
    status = s.status
    code = _STATUS.get(status.status_code, 0)
    if code:
        d["status"] = {"code": code, **({"message": status.description}
                                        if status.description else {})}
    return d


def _event(ev: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"timeUnixNano": str(ev.timestamp), "name": ev.name}
    if ev.attributes:
        out["attributes"] = attributes(ev.attributes)
    if ev.dropped_attributes:
        out["droppedAttributesCount"] = ev.dropped_attributes
    return out


def attributes(attrs: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    return [{"key": k, "value": any_value(v)} for k, v in (attrs or {}).items()]


def any_value(v: Any) -> dict[str, Any]:
    """An ``AnyValue``: bool before int (a bool is an int in Python); None is an empty
    one (an array's missing member), a float that is not finite as protobuf's JSON
    names it."""
    if v is None:
        return {}
    if isinstance(v, str):
        return {"stringValue": v}
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    if isinstance(v, float):
        if not math.isfinite(v):
            return {"doubleValue": "NaN" if v != v else ("Infinity" if v > 0 else "-Infinity")}
        return {"doubleValue": v}
    if isinstance(v, (bytes, bytearray)):
        return {"bytesValue": base64.b64encode(bytes(v)).decode("ascii")}
    if isinstance(v, Mapping):
        return {"kvlistValue": {"values": attributes(v)}}
    if isinstance(v, Sequence):
        return {"arrayValue": {"values": [any_value(x) for x in v]}}
    return {"stringValue": str(v)}
