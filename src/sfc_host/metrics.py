"""Counters and latency histograms of one host instance, in the Prometheus text format.

``Metrics.inc`` and ``Metrics.observe`` sit on the hot path, so they only touch plain dicts and
lists; the text exposition (format 0.0.4) is built on demand when the endpoint
(``sfc_host.service.endpoint``) is scraped.
"""

from __future__ import annotations

import math
import re
import time
from bisect import bisect_left
from collections import Counter
from collections.abc import Iterable, Mapping
from types import TracebackType

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
    "equipment_opcua_commands": "Commands carried out on OPC UA units and methods "
                                "(equipment_opcua).",
    "equipment_opcua_answers": "Outcomes of OPC UA units and methods turned into answers.",
    "commands_resent": "Open commands sent again because a host had ended (its answers "
                       "may have ended with it).",
    "host_ends_taken": "Ends of hosts' runs (a death, a stop) this host took over.",
    "dispatch_skipped": "Command dispatches skipped (settled, superseded or ended meanwhile).",
    "dispatch_already_sent": "Command dispatches skipped because the command was already sent.",
    "dispatch_sending": "Command dispatches skipped because this host was sending the "
                        "command at that moment (its entry taken over while the send waited).",
    "marker_errors": "Sent-marker writes that failed (Redis away past the retries): their "
                     "commands count as unsent, their deadlines send them again.",
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
    "redis_cluster_table_reads": "Redis Cluster slot tables read (at start, after MOVED, "
                                 "a failover or a node lost).",
    "redis_cluster_redirects": "Redis Cluster requests redirected (MOVED or ASK: a slot "
                               "moved or moving to another primary).",
    "redis_cluster_retries": "Redis Cluster requests sent again after a pause (TRYAGAIN, "
                             "CLUSTERDOWN, a node lost: a failover or a migration).",
    "mqtt_sent": "MQTT messages published.",
    "mqtt_received": "MQTT messages received.",
    "mqtt_queue_full": "MQTT messages dropped because the outgoing queue was full.",
    "mqtt_refused": "MQTT messages the broker refused (a PUBACK with an error code).",
    "mqtt_bad_topic": "MQTT messages not published: the topic has a wildcard or is empty.",
    "mqtt_unrouted": "MQTT messages on a topic no handler subscribed to.",
    "mqtt_handler_errors": "MQTT messages whose handler raised.",
    "mqtt_reconnects": "MQTT reconnections.",
    "mqtt_malformed": "MQTT packets from the broker that broke the protocol (the connection "
                      "was closed and made again).",
    "mqtt_oversized": "MQTT messages larger than mqtt_max_payload, passed over unread.",
    "mqtt_repeats_joined": "Commands sent again while their first copy was still queued or "
                           "unacknowledged in the MQTT link; joined to that copy, not sent twice.",
    "mqtt_unsendable": "MQTT messages not published because they could not be encoded.",
    "mqtt_subscribe_refused": "MQTT subscriptions the broker refused.",
    "mqtt_messages_dropped": "MQTT messages dropped, by reason: from the broker, an "
                             "invalid topic, properties or packet (acknowledged and "
                             "passed over) or no room in the backlog of unhandled "
                             "messages; to the broker, one it closed the connection on "
                             "twice (broker_refused).",
    "opcua_calls": "Job Control method calls the OPC UA face answered (done or refused "
                   "with a ReturnStatus).",
    "bad_opcua_calls": "OPC UA method calls with arguments of the wrong type or count "
                       "(BadInvalidArgument), or that failed inside the host.",
    "opcua_events": "ISA-95 job order status events the OPC UA face raised.",
    "opcua_events_dropped": "OPC UA status events not raised: the face's queue of "
                            "changes was full (the lists still follow the orders).",
    "opcua_events_failed": "OPC UA status events or JobOrderList rewrites that failed "
                           "(logged).",
    "opcua_list_seconds": "Time to build and write one scope's OPC UA JobOrderList.",
    "spans_exported": "OpenTelemetry spans the OTLP endpoint took (setting otel).",
    "spans_dropped": "OpenTelemetry spans given up on: the OTLP endpoint refused them, "
                     "did not take them within its timeout, or too many waited for it.",
    "trace_contexts_invalid": "Trace contexts (traceparent) that broke a W3C rule, by "
                              "where they came from (mes, equipment): ignored, the message "
                              "handled as if it had none.",
    "mqtt_ignored_properties": "MQTT acknowledgements from the broker with invalid "
                               "properties, used without them.",
    "mqtt_keepalive_timeouts": "MQTT connections left because the broker stopped "
                               "answering (no PINGRESP, or an acknowledgement overdue by "
                               "more than the keep alive).",
    "mqtt_takeovers": "MQTT connections the broker ended because another client "
                      "connected with the same client id.",
    "mqtt_status_dropped": "MES status events and retained state not sent because they "
                           "filled 80 % of the outgoing MQTT queue.",
    "order_hook_errors": "Job order changes whose publishing hook raised.",
    "capabilities_received": "Equipment capability announcements stored or withdrawn.",
    "bad_capabilities": "Equipment capability announcements refused.",
    "mes_requests": "Replies sent to MES job control requests.",
    "mes_requests_refused": "MES requests refused (unknown job order, invalid state, "
                            "unable to accept).",
    "bad_mes_requests": "MES requests answered INVALID_REQUEST or not CloudEvents at all.",
    "bad_mes_replies": "MES replies that could not be encoded.",
    "mes_duplicates": "MES requests seen before (same source and id within mes_dedupe_s): "
                      "their recorded reply sent again, not run again.",
    "mes_outbox_republished": "Job orders whose retained state was published again from "
                              "the MES outbox (left there by a host that stopped or died "
                              "before the broker acknowledged it).",
    "mes_index_errors": "Failures publishing a retained order, result or state index.",
    "evolve_seconds": "Time of one evolve call in the host (the mean of its batch, "
                      "counted once per call).",
    "answer_to_command_seconds": "Latency from an equipment answer arriving to the job's "
                                 "next command being queued.",
    "event_to_command_seconds": "Latency from a pull event arriving to the command of the "
                                "job that took it being queued (events this host received "
                                "and handled).",
}
# The histograms among HELP's names; every other one is a counter.
HISTOGRAMS = frozenset(("evolve_seconds", "answer_to_command_seconds",
                        "event_to_command_seconds", "opcua_list_seconds"))
# The counters a host exports from the start, at 0 until their first increment (a rate
# or an alert needs the series before the first event, not from it on).
# Counter families with one label (``inc_labeled``); exported from their first count.
LABELED = frozenset(("mqtt_messages_dropped", "trace_contexts_invalid"))
COUNTERS: tuple[str, ...] = tuple(n for n in HELP if n not in HISTOGRAMS and n not in LABELED)
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


def check_labels(labels: Mapping[str, str]) -> dict[str, str]:
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
        self.labels = check_labels(labels or {})
        self.buckets: tuple[float, ...] = tuple(Histogram(buckets).bounds)
        self.declared: set[str] = set()
        self.infos: dict[str, tuple[dict[str, str], str]] = {}
        # (name, label, value) -> count: a counter family with one label
        self.labeled: Counter[tuple[str, str, str]] = Counter()

    def declare(self, names: Iterable[str]) -> None:
        """Export these counters at 0 until their first increment."""
        self.declared.update(names)

    def set_info(self, name: str, labels: Mapping[str, str], help_text: str) -> None:
        """A gauge always 1 whose labels carry facts (``build_info{version=…}``)."""
        self.infos[name] = (check_labels(labels), help_text)

    def inc(self, name: str, n: int = 1) -> None:
        self.counts[name] += n

    def inc_labeled(self, name: str, label: str, value: str, n: int = 1) -> None:
        """Count in the family ``name`` under ``{label="value"}``."""
        self.labeled[(name, label, value)] += n

    def by_label(self, name: str) -> dict[str, int]:
        """The counts of family ``name`` by its label's value."""
        return {v: c for (n, _, v), c in self.labeled.items() if n == name}

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
        const = {**self.labels, **check_labels(labels or {})}
        base = ",".join(f'{k}="{_escape_value(v)}"' for k, v in const.items())
        plain = "{" + base + "}" if base else ""
        sep = base + "," if base else ""

        # Names that sanitize alike are one family: Prometheus refuses a repeated family.
        counters: dict[str, tuple[str, int]] = {}
        counts = self.counts
        zeros = [(n, 0) for n in self.declared if n not in counts]
        for name, value in [*zeros, *counts.items()]:
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
        for name, (info, text) in sorted(self.infos.items()):
            full = metric_name(prefix + name)
            values = ",".join(f'{k}="{_escape_value(v)}"' for k, v in {**const, **info}.items())
            lines.append(f"# HELP {full} {_escape_help(text)}")
            lines.append(f"# TYPE {full} gauge")
            lines.append(f"{full}{{{values}}} 1" if values else f"{full} 1")
        for full in sorted(counters):
            name, value = counters[full]
            lines.append(f"# HELP {full} {_escape_help(_help_text(name))}")
            lines.append(f"# TYPE {full} counter")
            lines.append(f"{full}{plain} {value}")
        families: dict[str, list[tuple[str, str, str, int]]] = {}
        for (name, label, value), n in list(self.labeled.items()):
            full = metric_name(prefix + name)
            if not full.endswith("_total"):
                full += "_total"
            families.setdefault(full, []).append((name, label, value, n))
        for full in sorted(families):
            rows = sorted(families[full])
            lines.append(f"# HELP {full} {_escape_help(_help_text(rows[0][0]))}")
            lines.append(f"# TYPE {full} counter")
            for _, label, value, n in rows:
                lines.append(f'{full}{{{sep}{label}="{_escape_value(value)}"}} {n}')
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
