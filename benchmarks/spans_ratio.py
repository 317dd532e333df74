"""What a span costs the host's thread, written from its fields against made as a span
object, same process, in turns.

    python benchmarks/spans_ratio.py             # the figures of docs/benchmarks.md
    python benchmarks/spans_ratio.py --quick     # a smoke run

The recorder (``tracing.spans.SpanRecorder``) records attempt spans, five per job over
1,000 jobs in turn (each its own stored trace context), into the host's batcher
(``tracing.batch.OtlpBatcher``) over an exporter that encodes as for OTLP protobuf and
drops the bytes instead of posting them (so only the host's thread's work is timed):

- fields: the batcher takes encoded spans (its protobuf mode), and the recorder writes
  each with ``sfc_fast.wire.otlp.span_record``, no span object;
- objects: the batcher takes span objects (as in its JSON mode), and the recorder makes
  ``PlainSpan``s, which the batch then encodes with ``encode_spans`` (protobuf all the
  same, so the two sides write the same bytes).

Per side: µs a span, batch encoding included; the ratio is the median of the rounds'
own ratios (both sides of a round saw the same machine).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from types import SimpleNamespace
from typing import Any

from sfc_host.tracing.batch import OtlpBatcher
from sfc_host.tracing.context import job_trace, new_trace, stored
from sfc_host.tracing.otlp import OtlpExporter
from sfc_host.tracing.spans import SpanRecorder

JOBS = 1_000
ACTIONS = 5
ENV = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",
       "OTEL_BSP_SCHEDULE_DELAY": "3600000", "OTEL_BSP_MAX_QUEUE_SIZE": "1000000"}


class DroppingExporter(OtlpExporter):
    """Encodes as the OTLP exporter does; sends nothing."""

    def send(self, body: bytes, n: int) -> bool:
        return True


def recorder(fields: bool) -> SpanRecorder:
    batcher = OtlpBatcher(DroppingExporter(env=ENV), env=ENV)
    batcher.takes_entries = fields
    return SpanRecorder(batcher)


def workload() -> list[tuple[str, str, list[list[Any]]]]:
    """Per job: its id, its stored context and one decision list per action."""
    out = []
    for i in range(JOBS):
        job = f"J{i}"
        trace = job_trace(stored(new_trace()), job, "tok", "wm-tighten")
        decisions = [[SimpleNamespace(status="running", reason="", ended=[
            ("tighten", f"{job}:tighten#{k}", "org.example.Tighten", 1, 0,
             1_700_000_000_000 + k, "completed")])] for k in range(ACTIONS)]
        out.append((job, trace, decisions))
    return out


def run(rec: SpanRecorder, work: list[tuple[str, str, list[list[Any]]]], n: int) -> float:
    """µs a span for ``n`` spans (the batcher's last partial batch encoded too)."""
    t0 = time.perf_counter()
    done = 0
    while done < n:
        for job, trace, decisions in work:
            for d in decisions:
                rec.settled("line1", job, trace, d, 1_700_000_001_000)
            done += ACTIONS
            if done >= n:
                break
    rec.processor._cut()
    return (time.perf_counter() - t0) / done * 1e6


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--rounds", type=int, default=7)
    a = p.parse_args()
    n, rounds = (20_000, 2) if a.quick else (100_000, a.rounds)
    work = workload()
    sides = {True: recorder(True), False: recorder(False)}
    for rec in sides.values():
        run(rec, work, 5_000)       # warm-up: caches, the first batches
    got: dict[bool, list[float]] = {True: [], False: []}
    for r in range(rounds):
        for fields in ((True, False) if r % 2 == 0 else (False, True)):
            got[fields].append(run(sides[fields], work, n))
    med = statistics.median
    ratio = med(o / f for f, o in zip(got[True], got[False], strict=True))
    print(f"spans, Python {sys.version.split()[0]}: {n:,} attempt spans a round, "
          f"{rounds} rounds in turns")
    print(f"written from fields: {med(got[True]):.2f} µs a span; as span objects: "
          f"{med(got[False]):.2f} µs a span; objects / fields x{ratio:.2f}")
    for rec in sides.values():
        rec.processor.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
