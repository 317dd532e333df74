"""Counters and latency histograms of one host instance, and their Prometheus endpoint.

``Metrics.inc`` and ``Metrics.observe`` sit on the hot path, so they only touch plain dicts and
lists; the text exposition (format 0.0.4) is built on demand when the endpoint is scraped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import time
from bisect import bisect_left
from collections import Counter
from collections.abc import Iterable, Mapping
from types import TracebackType

log = logging.getLogger(__name__)

# Upper bounds (seconds) of the histogram buckets: 50 µs to 10 s, roughly 1-2.5-5 per decade,
# the range of an evolve step up to an equipment round trip.
BUCKETS: tuple[float, ...] = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# What the counters and histograms used by the host mean; other names get a generic text.
HELP: dict[str, str] = {
    "commands_sent": "Equipment commands published.",
    "dispatch_skipped": "Command dispatches skipped (settled, superseded or ended meanwhile).",
    "dispatch_already_sent": "Command dispatches skipped because the command was already sent.",
    "hold_answered_not_held": "Held commands answered not_held (the hold was not in effect).",
    "queue_full": "Commands not sent because the outgoing queue was full.",
    "mqtt_unacked_commands": "Commands the broker had not acknowledged within 2 s of "
                             "queueing: no sent marker (the deadline sends the id again).",
    "answers_received": "Equipment answers received.",
    "answers_dropped": "Queued equipment answers dropped, oldest first, because the queue "
                       "was full (Redis away); the action's deadline settles them.",
    "answers_applied": "Equipment answers applied to a job.",
    "answers_absorbed": "Late or duplicate equipment answers absorbed without effect.",
    "answers_unknown_id": "Equipment answers with an unknown command id.",
    "answers_unknown_job": "Equipment answers for a job that no longer exists.",
    "answer_errors": "Equipment answers that failed to apply.",
    "bad_answers": "Malformed equipment answers.",
    "bad_events": "Malformed equipment events.",
    "events_received": "Equipment pull events received.",
    "events_matched": "Equipment pull events matched to a waiting job.",
    "events_unmatched": "Equipment pull events no job was waiting for.",
    "cas_retries": "Job state compare-and-set attempts retried after a conflict.",
    "cas_conflicts": "Job state updates given up after repeated compare-and-set conflicts.",
    "cache_rereads": "Job states re-read because the cached copy was stale.",
    "state_errors": "Job states that could not be decoded.",
    "entries": "Stream entries read.",
    "entries_claimed": "Stream entries claimed from other consumers.",
    "dead_entries": "Stream entries given up after too many deliveries.",
    "invalid_entries": "Invalid stream entries acknowledged and dropped.",
    "entry_failures": "Stream entry batches that failed and stay pending.",
    "read_errors": "Stream read errors.",
    "invalid_scopes": "Configured scopes refused as invalid.",
    "unusable_recipes": "Job orders refused because their recipe is unknown or invalid.",
    "order_retries": "Job order updates retried.",
    "jobs_recovered": "Jobs recovered at start-up.",
    "recovery_errors": "Jobs that failed to recover at start-up.",
    "outages": "Sweeps that found a scope not swept for longer than the outage threshold.",
    "ticks_queued": "Deadline ticks queued by the sweep.",
    "mqtt_sent": "MQTT messages published.",
    "mqtt_received": "MQTT messages received.",
    "mqtt_queue_full": "MQTT messages dropped because the outgoing queue was full.",
    "mqtt_refused": "MQTT messages the broker refused (a PUBACK with an error code).",
    "mqtt_bad_topic": "MQTT messages not published: the topic has a wildcard or is empty.",
    "mqtt_unrouted": "MQTT messages on a topic no handler subscribed to.",
    "mqtt_handler_errors": "MQTT messages whose handler raised.",
    "mqtt_reconnects": "MQTT reconnections.",
    "mqtt_status_dropped": "MES status events and retained state not sent because the "
                           "outgoing MQTT queue was 80 % full.",
    "order_hook_errors": "Job order changes whose publishing hook raised.",
    "capabilities_received": "Equipment capability announcements stored or withdrawn.",
    "bad_capabilities": "Equipment capability announcements refused.",
    "mes_requests": "Replies sent to MES job control requests.",
    "mes_requests_refused": "MES requests refused (unknown job order, invalid state, "
                            "unable to accept).",
    "bad_mes_requests": "MES requests answered INVALID_REQUEST or not CloudEvents at all.",
    "bad_mes_replies": "MES replies that could not be encoded.",
    "mes_index_errors": "Failures publishing a retained order, result or state index.",
    "evolve_seconds": "Time of one evolve call in the host (the mean of its batch, "
                      "counted once per call).",
    "answer_to_command_seconds": "Latency from an equipment answer arriving to the job's "
                                 "next command being queued.",
    "event_to_command_seconds": "Latency from a pull event arriving to the command of the "
                                "job that took it being queued (events this host received "
                                "and handled).",
}
_HELP_PREFIXES: tuple[tuple[str, str], ...] = (
    ("loop_errors_", "Errors in the host loop {}."),
)

_NAME_BAD = re.compile(r"[^a-zA-Z0-9_:]")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def metric_name(name: str) -> str:
    """``name`` made a valid Prometheus metric name (``[a-zA-Z_:][a-zA-Z0-9_:]*``)."""
    name = _NAME_BAD.sub("_", name)
    return name if name and not name[0].isdigit() else "_" + name


def _help_text(name: str) -> str:
    text = HELP.get(name)
    if text is None:
        for prefix, template in _HELP_PREFIXES:
            if name.startswith(prefix):
                return template.format(name[len(prefix):])
        return f"Host metric {name}."
    return text


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _escape_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _check_labels(labels: Mapping[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in labels.items():
        # "le" is the bucket label of histograms; "__" names are reserved by Prometheus.
        if not _LABEL_NAME.fullmatch(k) or k.startswith("__") or k == "le":
            raise ValueError(f"invalid metric label name {k!r}")
        out[k] = str(v)
    return out


def _fmt(v: float) -> str:
    if isinstance(v, int):
        return str(v)
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(v)


class Histogram:
    """Cumulative-bucket histogram; ``counts[i]`` counts values in (bounds[i-1], bounds[i]],
    the last slot everything above the highest bound (+Inf)."""

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: Iterable[float] = BUCKETS) -> None:
        self.bounds: list[float] = sorted(float(b) for b in bounds)
        if not self.bounds or any(math.isinf(b) or math.isnan(b) for b in self.bounds):
            raise ValueError("histogram bounds must be finite and not empty")
        self.counts: list[int] = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        if value != value:  # NaN: no bucket fits, and it would poison the sum
            return
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def observe_n(self, value: float, n: int) -> None:
        """``n`` observations of ``value`` at once (a batch's mean per item): one bucket
        gains ``n``, so the exposition stays a valid histogram."""
        if value != value or n <= 0:
            return
        self.counts[bisect_left(self.bounds, value)] += n
        self.sum += value * n
        self.count += n

    def cumulative(self) -> list[int]:
        """Counts per bucket, cumulative, the +Inf bucket last (== ``count``)."""
        out, acc = [], 0
        for c in self.counts:
            acc += c
            out.append(acc)
        return out

    def merge(self, other: Histogram) -> None:
        if other.bounds != self.bounds:
            raise ValueError("cannot merge histograms with different buckets")
        for i, c in enumerate(other.counts):
            self.counts[i] += c
        self.sum += other.sum
        self.count += other.count

    def quantile(self, q: float) -> float:
        """Estimate of the ``q`` quantile, linear within a bucket like Prometheus'
        ``histogram_quantile``; NaN when empty, the highest bound when it lies above it."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile must be within [0, 1], got {q}")
        if self.count == 0:
            return math.nan
        rank = q * self.count
        acc = 0
        for i, c in enumerate(self.counts):
            if c == 0:
                continue
            prev, acc = acc, acc + c
            if acc < rank:
                continue
            if i == len(self.bounds):
                return self.bounds[-1]  # no upper bound to interpolate to
            upper = self.bounds[i]
            lower = self.bounds[i - 1] if i else min(0.0, upper)
            return lower + (upper - lower) * (rank - prev) / c
        return self.bounds[-1]  # unreachable: the last non-empty bucket reaches count


class _Timer:
    """Observes the time spent in a ``with`` block (also when it raises)."""

    __slots__ = ("_metrics", "_name", "_t0", "elapsed")

    def __init__(self, metrics: Metrics, name: str) -> None:
        self._metrics = metrics
        self._name = name
        self._t0 = 0.0
        self.elapsed = 0.0

    def __enter__(self) -> _Timer:
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.elapsed = time.perf_counter() - self._t0
        self._metrics.observe(self._name, self.elapsed)


class Metrics:
    """Named counters and histograms; ``inc`` and ``observe`` are cheap enough for the hot
    path. ``labels`` are constant labels put on every exported sample (e.g. ``host="h1"``)."""

    def __init__(self, labels: Mapping[str, str] | None = None,
                 buckets: Iterable[float] = BUCKETS) -> None:
        self.counts: Counter[str] = Counter()
        self.histograms: dict[str, Histogram] = {}
        self.labels = _check_labels(labels or {})
        self.buckets: tuple[float, ...] = tuple(Histogram(buckets).bounds)

    def inc(self, name: str, n: int = 1) -> None:
        self.counts[name] += n

    def __getitem__(self, name: str) -> int:
        return self.counts[name]

    def snapshot(self) -> dict[str, int]:
        return dict(self.counts)

    def observe(self, name: str, value: float) -> None:
        """Record ``value`` (seconds) in histogram ``name``, created on first use."""
        h = self.histograms.get(name)
        if h is None:
            h = self.histograms[name] = Histogram(self.buckets)
        # Histogram.observe inlined: this runs per evolve batch and per command.
        if value != value:  # NaN
            return
        h.counts[bisect_left(h.bounds, value)] += 1
        h.sum += value
        h.count += 1

    def observe_n(self, name: str, value: float, n: int) -> None:
        """Record ``value`` ``n`` times in histogram ``name`` (see ``Histogram.observe_n``)."""
        h = self.histograms.get(name)
        if h is None:
            h = self.histograms[name] = Histogram(self.buckets)
        h.observe_n(value, n)

    def timer(self, name: str) -> _Timer:
        """``with metrics.timer("evolve_seconds"): ...`` observes the block's duration."""
        return _Timer(self, name)

    def quantile(self, name: str, q: float) -> float:
        """Estimated ``q`` quantile (0..1) of histogram ``name``; NaN when nothing observed."""
        h = self.histograms.get(name)
        if h is None:
            if not 0.0 <= q <= 1.0:
                raise ValueError(f"quantile must be within [0, 1], got {q}")
            return math.nan
        return h.quantile(q)

    def exposition(self, prefix: str = "sfc_", labels: Mapping[str, str] | None = None) -> str:
        """Everything in the Prometheus text format 0.0.4; ``labels`` add to (and override)
        the constant labels of the constructor."""
        const = {**self.labels, **_check_labels(labels or {})}
        base = ",".join(f'{k}="{_escape_value(v)}"' for k, v in const.items())
        plain = "{" + base + "}" if base else ""
        sep = base + "," if base else ""

        # Names that sanitize alike are one family: Prometheus refuses a repeated family.
        counters: dict[str, tuple[str, int]] = {}
        for name, value in list(self.counts.items()):
            full = metric_name(prefix + name)
            if not full.endswith("_total"):
                full += "_total"
            _, acc = counters.get(full, (name, 0))
            counters[full] = (name, acc + value)
        hists: dict[str, tuple[str, Histogram]] = {}
        for name, h in list(self.histograms.items()):
            full = metric_name(prefix + name)
            if full in counters:  # a counter already owns this family name
                full += "_seconds" if not full.endswith("_seconds") else "_histogram"
            if full in hists:
                hists[full][1].merge(h)
            else:
                copy = Histogram(h.bounds)
                copy.merge(h)
                hists[full] = (name, copy)

        lines: list[str] = []
        for full in sorted(counters):
            name, value = counters[full]
            lines.append(f"# HELP {full} {_escape_help(_help_text(name))}")
            lines.append(f"# TYPE {full} counter")
            lines.append(f"{full}{plain} {value}")
        for full in sorted(hists):
            name, h = hists[full]
            lines.append(f"# HELP {full} {_escape_help(_help_text(name))}")
            lines.append(f"# TYPE {full} histogram")
            cum = h.cumulative()
            for bound, c in zip([*h.bounds, math.inf], cum, strict=True):
                lines.append(f'{full}_bucket{{{sep}le="{_fmt(bound)}"}} {c}')
            lines.append(f"{full}_sum{plain} {_fmt(h.sum)}")
            lines.append(f"{full}_count{plain} {h.count}")
        return "\n".join(lines) + "\n" if lines else ""


_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            408: "Request Timeout", 431: "Request Header Fields Too Large",
            500: "Internal Server Error", 503: "Service Unavailable"}


class MetricsServer:
    """A minimal HTTP/1.1 endpoint serving ``GET /metrics`` (one request per connection).

    Every read and write has a timeout and every error ends only its own connection, so a
    scraper that misbehaves can never disturb the host. ``port=0`` binds an ephemeral port
    (the bound one is in ``port``); the host itself treats a configured 0 as "off".
    """

    def __init__(self, metrics: Metrics, host: str = "127.0.0.1", port: int = 0, *,
                 prefix: str = "sfc_", labels: Mapping[str, str] | None = None,
                 timeout: float = 5.0, max_connections: int = 32,
                 max_header_bytes: int = 8192) -> None:
        self.metrics = metrics
        self.host = host
        self.port = port
        self.prefix = prefix
        self.labels = _check_labels(labels or {})
        self.timeout = timeout
        self.max_connections = max_connections
        self.max_header_bytes = max_header_bytes
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    async def start(self, host: str | None = None, port: int | None = None) -> None:
        if self._server is not None:
            raise RuntimeError("metrics server already started")
        if host is not None:
            self.host = host
        if port is not None:
            self.port = port
        self._server = await asyncio.start_server(
            self._handle, self.host, self.port, limit=self.max_header_bytes)
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("metrics endpoint on %s", self.url)

    async def aclose(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        # Python 3.11 leaves accepted connections open on close(): end them here.
        conns = list(self._conns)
        for t in conns:
            t.cancel()
        await asyncio.gather(*conns, return_exceptions=True)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(server.wait_closed(), self.timeout)

    async def __aenter__(self) -> MetricsServer:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        try:
            if len(self._conns) >= self.max_connections:
                await self._respond(writer, 503, "too many connections\n")
                return
            if task is not None:
                self._conns.add(task)
            try:
                status, head, body = await asyncio.wait_for(self._serve(reader), self.timeout)
            except TimeoutError:
                status, head, body = 408, False, "request timeout\n"
            await self._respond(writer, status, body, head=head)
        except asyncio.CancelledError:
            pass  # server closing: just drop the connection
        except (TimeoutError, ConnectionError, OSError):
            pass  # the client went away or stalled while reading the answer
        except Exception:  # a scrape never takes the host down
            log.exception("metrics endpoint: request failed")
        finally:
            if task is not None:
                self._conns.discard(task)
            writer.close()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(writer.wait_closed(), 1.0)

    async def _serve(self, reader: asyncio.StreamReader) -> tuple[int, bool, str]:
        """Read one request; (status, is HEAD, body)."""
        try:
            request_line = await reader.readline()
            total = len(request_line)
            while True:  # headers are read only to bound them; none changes the answer
                line = await reader.readline()
                total += len(line)
                if total > self.max_header_bytes:
                    return 431, False, "request header too large\n"
                if line in (b"\r\n", b"\n", b""):
                    break
        except ValueError:  # a line longer than the stream limit
            return 431, False, "request header too large\n"
        if not request_line.endswith(b"\n"):
            return 400, False, "bad request\n"  # the client closed mid-line
        parts = request_line.decode("latin-1").split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            return 400, False, "bad request\n"
        method, target, _ = parts
        path = target.split("?", 1)[0]
        if path != "/metrics":
            return 404, method == "HEAD", "not found; try /metrics\n"
        if method not in ("GET", "HEAD"):
            return 405, method == "HEAD", "method not allowed\n"
        try:
            text = self.metrics.exposition(self.prefix, self.labels)
        except Exception:  # a broken exposition answers 500, not a dropped link
            log.exception("metrics endpoint: exposition failed")
            return 500, method == "HEAD", "internal error\n"
        return 200, method == "HEAD", text

    async def _respond(self, writer: asyncio.StreamWriter, status: int, body: str, *,
                       head: bool = False) -> None:
        data = body.encode("utf-8")
        ctype = CONTENT_TYPE if status == 200 else "text/plain; charset=utf-8"
        lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}",
                 f"Content-Type: {ctype}", f"Content-Length: {len(data)}",
                 "Connection: close"]
        if status == 405:
            lines.append("Allow: GET, HEAD")
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        if not head:
            writer.write(data)
        await asyncio.wait_for(writer.drain(), self.timeout)
