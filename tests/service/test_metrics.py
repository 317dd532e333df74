"""Counters, histograms, the Prometheus text exposition and the /metrics endpoint."""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time
import urllib.request
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from sfc_host.metrics import BUCKETS, Histogram, Metrics, metric_name
from sfc_host.service.endpoint import HttpEndpoint

# --- counters and histograms ----------------------------------------------------------------


def test_counters_keep_their_api() -> None:
    m = Metrics()
    m.inc("commands_sent")
    m.inc("commands_sent", 4)
    m.inc("cas_retries", 0)
    assert m["commands_sent"] == 5
    assert m["never_seen"] == 0
    assert m.snapshot() == {"commands_sent": 5, "cas_retries": 0}
    snap = m.snapshot()
    snap["commands_sent"] = 99  # a copy, not the live counters
    assert m["commands_sent"] == 5


def test_histogram_buckets_are_inclusive_upper_bounds() -> None:
    m = Metrics()
    for v in (0.0, 0.0001, 0.00010001, 10.0, 11.0, -1.0):
        m.observe("evolve_seconds", v)
    m.observe("evolve_seconds", math.nan)  # ignored
    h = m.histograms["evolve_seconds"]
    assert h.count == 6
    assert h.sum == pytest.approx(0.0001 + 0.00010001 + 20.0)
    i = h.bounds.index(0.0001)
    assert h.counts[0] == 2  # 0.0 and -1.0 fall in the lowest bucket
    assert h.counts[i] == 1  # 0.0001 <= le="0.0001"
    assert h.counts[i + 1] == 1
    assert h.counts[h.bounds.index(10.0)] == 1
    assert h.counts[-1] == 1  # 11.0 only in +Inf
    assert h.cumulative()[-1] == h.count
    assert list(h.bounds) == sorted(BUCKETS)
    assert BUCKETS[0] <= 0.00005 and BUCKETS[-1] == 10.0


def test_quantiles_interpolate_within_a_bucket() -> None:
    m = Metrics()
    assert math.isnan(m.quantile("event_to_command_seconds", 0.5))
    for _ in range(1000):
        m.observe("lat", 0.003)  # all in (0.0025, 0.005]
    assert m.quantile("lat", 0.5) == pytest.approx(0.00375)
    assert m.quantile("lat", 1.0) == pytest.approx(0.005)
    assert m.quantile("lat", 0.0) == pytest.approx(0.0025)

    h = Histogram((1.0, 2.0, 4.0))
    for v in [0.5] * 50 + [1.5] * 40 + [3.0] * 9 + [100.0]:
        h.observe(v)
    assert h.quantile(0.25) == pytest.approx(0.5)  # 25 of 50 in (0, 1]
    assert h.quantile(0.5) == pytest.approx(1.0)
    assert h.quantile(0.7) == pytest.approx(1.5)  # 20 of 40 in (1, 2]
    assert h.quantile(0.99) == pytest.approx(4.0)
    assert h.quantile(1.0) == 4.0  # above the highest bound: that bound
    with pytest.raises(ValueError):
        h.quantile(1.5)
    with pytest.raises(ValueError):
        m.quantile("nothing", -0.1)


def test_quantile_of_a_spread_of_latencies_is_close() -> None:
    m = Metrics()
    values = [0.0001 * 1.01 ** k for k in range(1000)]  # 100 µs .. ~2 s, log-uniform
    for v in values:
        m.observe("lat", v)
    exact = sorted(values)
    for q in (0.5, 0.9, 0.99):
        est, true = m.quantile("lat", q), exact[int(q * len(exact)) - 1]
        assert true / 2.5 <= est <= true * 2.5  # within the bucket that holds it


def test_timer_observes_the_block_also_when_it_raises() -> None:
    m = Metrics()
    with m.timer("evolve_seconds") as t:
        time.sleep(0.002)
    assert t.elapsed >= 0.002
    assert m.histograms["evolve_seconds"].count == 1
    assert m.histograms["evolve_seconds"].sum == pytest.approx(t.elapsed)
    with pytest.raises(RuntimeError), m.timer("evolve_seconds"):
        raise RuntimeError("boom")
    assert m.histograms["evolve_seconds"].count == 2


def test_hot_path_stays_cheap() -> None:
    m = Metrics()
    n = 100_000
    t0 = time.perf_counter()
    for _ in range(n):
        m.inc("commands_sent")
        m.observe("evolve_seconds", 0.0004)
    per_call = (time.perf_counter() - t0) / (2 * n)
    assert m["commands_sent"] == n
    assert per_call < 5e-6  # generous: a dict increment and a bisect


# --- exposition -----------------------------------------------------------------------------

_SAMPLE = re.compile(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[^"}]|"(?:[^"\\]|\\.)*")*\})? (\S+)')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"(,|$)')


def _unescape(v: str) -> str:
    return re.sub(r"\\(.)", lambda mo: {"n": "\n"}.get(mo.group(1), mo.group(1)), v)


def _labels(text: str | None) -> dict[str, str]:
    if not text:
        return {}
    body, out, pos = text[1:-1], {}, 0
    while pos < len(body):
        mo = _LABEL.match(body, pos)
        assert mo, f"bad labels {text!r}"
        out[mo.group(1)] = _unescape(mo.group(2))
        pos = mo.end()
    return out


def parse(text: str) -> dict[str, dict[str, Any]]:
    """The exposition parsed back, strictly: family -> help, type, samples."""
    assert text.endswith("\n")
    families: dict[str, dict[str, Any]] = {}
    current: str | None = None
    for line in text.splitlines():
        assert line, "no blank lines"
        if line.startswith("# HELP "):
            name, help_text = line[7:].split(" ", 1)
            assert name not in families, f"family {name} repeated"
            families[name] = {"help": help_text, "type": None, "samples": []}
            current = name
        elif line.startswith("# TYPE "):
            name, typ = line[7:].split(" ")
            assert name == current and families[name]["type"] is None
            assert typ in ("counter", "histogram", "gauge")
            families[name]["type"] = typ
        else:
            mo = _SAMPLE.fullmatch(line)
            assert mo, f"bad sample line {line!r}"
            name, labels, value = mo.group(1), _labels(mo.group(2)), mo.group(3)
            assert current is not None and name.startswith(current)
            fam = families[current]
            suffix = name[len(current):]
            if fam["type"] == "counter":
                assert suffix == "" and name.endswith("_total")
            elif fam["type"] == "gauge":
                assert suffix == ""
            else:
                assert suffix in ("_bucket", "_sum", "_count")
            fam["samples"].append((suffix, labels, float(value)))
    return families


def _check_histogram(fam: dict[str, Any], count: int, total: float) -> list[tuple[float, float]]:
    buckets = [(lab, v) for s, lab, v in fam["samples"] if s == "_bucket"]
    les = [lab["le"] for lab, _ in buckets]
    assert les[-1] == "+Inf"
    bounds = [float(le) for le in les]
    assert bounds == sorted(bounds) and len(set(bounds)) == len(bounds)
    values = [v for _, v in buckets]
    assert values == sorted(values), "buckets are cumulative"
    (c,) = [v for s, _, v in fam["samples"] if s == "_count"]
    (s_,) = [v for s, _, v in fam["samples"] if s == "_sum"]
    assert values[-1] == c == count
    assert s_ == pytest.approx(total)
    return list(zip(bounds, values, strict=True))


def test_exposition_parses_back() -> None:
    m = Metrics()
    m.inc("commands_sent", 3)
    m.inc("answers_absorbed")
    m.inc("loop_errors_consumer", 2)
    m.inc("something_new")
    for v in (0.0002, 0.003, 0.003, 20.0):
        m.observe("event_to_command_seconds", v)
    fams = parse(m.exposition())

    sent = fams["sfc_commands_sent_total"]
    assert sent["type"] == "counter"
    assert sent["help"] == "Equipment commands published."
    assert sent["samples"] == [("", {}, 3.0)]
    assert fams["sfc_answers_absorbed_total"]["samples"][0][2] == 1.0
    assert "consumer" in fams["sfc_loop_errors_consumer_total"]["help"]
    assert fams["sfc_something_new_total"]["help"]  # generic, but present

    hist = fams["sfc_event_to_command_seconds"]
    assert hist["type"] == "histogram"
    pairs = dict(_check_histogram(hist, 4, 20.0062))
    assert pairs[0.00025] == 1 and pairs[0.005] == 3 and pairs[10.0] == 3
    assert pairs[math.inf] == 4


def test_observe_n_records_a_batch_as_a_valid_histogram() -> None:
    m = Metrics()
    m.observe_n("evolve_seconds", 0.0003, 40)   # a batch of 40 calls, 0.3 ms each
    m.observe_n("evolve_seconds", 0.002, 2)
    m.observe_n("evolve_seconds", math.nan, 5)  # ignored, like observe
    m.observe_n("evolve_seconds", 0.001, 0)     # nothing
    h = m.histograms["evolve_seconds"]
    assert h.count == 42 and h.sum == pytest.approx(0.0003 * 40 + 0.004)
    pairs = dict(_check_histogram(parse(m.exposition())["sfc_evolve_seconds"], 42,
                                  0.016))
    assert pairs[0.00025] == 0 and pairs[0.0005] == 40 and pairs[0.0025] == 42
    one_by_one, at_once = Histogram(), Histogram()
    for _ in range(40):
        one_by_one.observe(0.0003)
    at_once.observe_n(0.0003, 40)
    assert one_by_one.counts == at_once.counts and one_by_one.count == at_once.count


def _emitted_names() -> set[str]:
    """Every counter and histogram name the host's code emits (literal names, and the
    ``bad_{what}`` family with its two members)."""
    from pathlib import Path

    src = Path(__file__).resolve().parents[2] / "src" / "sfc_host"
    text = "\n".join(p.read_text() for p in src.rglob("*.py"))
    names: set[str] = set()
    for a, b in re.findall(r'\binc(?:_labeled)?\(\s*"([a-z_]+)"(?: if \w+ else "([a-z_]+)")?',
                           text):
        names |= {a, b} - {""}
    names |= set(re.findall(r'observe(?:_n)?\(\s*"([a-z_]+)"', text))
    assert 'inc(f"bad_{what}")' in text
    names |= {"bad_answers", "bad_events"}
    return names


def test_every_emitted_metric_has_a_help_text_and_every_help_text_is_emitted() -> None:
    from sfc_host.metrics import HELP

    emitted = _emitted_names()
    assert {"commands_sent", "mqtt_status_dropped", "answers_dropped", "evolve_seconds",
            "event_to_command_seconds", "answer_to_command_seconds"} <= emitted
    assert sorted(emitted - set(HELP)) == []
    assert sorted(set(HELP) - emitted) == []


def test_operations_md_lists_exactly_the_metrics_the_host_emits() -> None:
    from pathlib import Path

    from sfc_host.metrics import HELP

    doc = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    section = doc.split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]
    listed = {re.sub(r"\{(reason|source)\}$", "", n)
              for n in re.findall(r"^\| `([a-z_{}]+)` \|", section, re.M)}
    assert listed - set(HELP) == {"loop_errors_{loop}"}
    assert sorted(set(HELP) - listed) == []


def test_exposition_names_and_prefix() -> None:
    m = Metrics()
    m.inc("loop_errors_mqtt-in/eq 1")
    m.inc("9lives")
    m.inc("already_total")
    m.observe("weird.name", 0.1)
    fams = parse(m.exposition(prefix=""))
    assert "loop_errors_mqtt_in_eq_1_total" in fams
    assert "_9lives_total" in fams
    assert "already_total" in fams  # not already_total_total
    assert "weird_name" in fams
    assert metric_name("a:b-c") == "a:b_c"
    assert metric_name("") == "_"
    assert Metrics().exposition() == ""


def test_exposition_merges_names_that_sanitize_alike() -> None:
    m = Metrics()
    m.inc("a-b", 2)
    m.inc("a.b", 3)
    m.observe("x-y", 0.001)
    m.observe("x.y", 0.002)
    fams = parse(m.exposition())
    assert fams["sfc_a_b_total"]["samples"] == [("", {}, 5.0)]
    _check_histogram(fams["sfc_x_y"], 2, 0.003)
    assert m.histograms["x-y"].count == 1  # the live histograms are untouched


def test_exposition_labels_are_escaped() -> None:
    nasty = 'a"b\\c\nd'
    m = Metrics(labels={"host": "h1", "site": nasty})
    m.inc("commands_sent")
    m.observe("evolve_seconds", 0.001)
    text = m.exposition(labels={"host": "h2", "zone": "z"})
    assert 'site="a\\"b\\\\c\\nd"' in text  # quote, backslash and newline escaped
    fams = parse(text)
    expected = {"host": "h2", "site": nasty, "zone": "z"}
    assert fams["sfc_commands_sent_total"]["samples"][0][1] == expected
    for suffix, labels, _ in fams["sfc_evolve_seconds"]["samples"]:
        rest = {k: v for k, v in labels.items() if k != "le"}
        assert ("le" in labels) == (suffix == "_bucket")
        assert rest == expected
    _check_histogram(fams["sfc_evolve_seconds"], 1, 0.001)
    for bad in ({"le": "x"}, {"__x": "y"}, {"1a": "y"}, {"a-b": "y"}):
        with pytest.raises(ValueError):
            Metrics(labels=bad)
        with pytest.raises(ValueError):
            m.exposition(labels=bad)


def test_help_text_is_escaped(monkeypatch: pytest.MonkeyPatch) -> None:
    from sfc_host import metrics as mod

    monkeypatch.setitem(mod.HELP, "odd", "line1\nback\\slash")
    m = Metrics()
    m.inc("odd")
    assert "# HELP sfc_odd_total line1\\nback\\\\slash\n" in m.exposition()
    parse(m.exposition())


# --- the HTTP endpoint ----------------------------------------------------------------------


def run(coro_fn: Callable[[], Awaitable[None]]) -> None:
    """Run ``coro_fn`` and fail on any exception the loop reports (e.g. a crashed handler)."""
    errors: list[dict[str, Any]] = []

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: errors.append(ctx))
        await asyncio.wait_for(coro_fn(), 10)

    asyncio.run(main())
    assert not errors, errors


async def request(port: int, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send raw bytes; the status, headers and body of the answer (read to the close)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        data = await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()
        await writer.wait_closed()
    head, _, body = data.replace(b"\r\n", b"\n").partition(b"\n\n")
    status_line, *header_lines = head.decode("latin-1").split("\n")
    assert status_line.startswith("HTTP/1.")
    headers = {k.lower(): v.strip() for k, v in (h.split(":", 1) for h in header_lines)}
    return int(status_line.split()[1]), headers, body


async def get(port: int, path: str = "/metrics", method: str = "GET"
              ) -> tuple[int, dict[str, str], bytes]:
    async with aiohttp.ClientSession() as s, \
            s.request(method, f"http://127.0.0.1:{port}{path}") as r:
        return r.status, {k.lower(): v for k, v in r.headers.items()}, await r.read()


def _metrics() -> Metrics:
    m = Metrics(labels={"host": "h1"})
    m.inc("commands_sent", 7)
    m.observe("evolve_seconds", 0.0003)
    return m


def test_server_answers_get_metrics() -> None:
    async def body() -> None:
        m = _metrics()
        async with HttpEndpoint(m, "127.0.0.1", 0) as srv:
            assert srv.port > 0
            assert srv.url == f"http://127.0.0.1:{srv.port}/metrics"
            status, headers, data = await get(srv.port)
            assert status == 200
            assert headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
            assert int(headers["content-length"]) == len(data)
            assert data.decode() == m.exposition()
            fams = parse(data.decode())
            assert fams["sfc_commands_sent_total"]["samples"] == [("", {"host": "h1"}, 7.0)]

            m.inc("commands_sent")  # each scrape is fresh
            status, _, data = await get(srv.port, "/metrics?x=1")
            assert status == 200 and b'sfc_commands_sent_total{host="h1"} 8' in data

            status, headers, data = await get(srv.port, method="HEAD")
            assert status == 200 and data == b"" and int(headers["content-length"]) > 0

            # a stock HTTP client
            def fetch() -> tuple[int, str, str]:
                with urllib.request.urlopen(srv.url, timeout=5) as resp:
                    return resp.status, resp.headers["Content-Type"], resp.read().decode()

            code, ctype, text = await asyncio.to_thread(fetch)
            assert code == 200 and ctype.startswith("text/plain; version=0.0.4")
            assert text == m.exposition()


    run(body)


def test_server_prefix_and_labels() -> None:
    async def body() -> None:
        srv = HttpEndpoint(_metrics(), prefix="x_", labels={"host": "h9", "dc": "a"})
        await srv.start("127.0.0.1", 0)
        try:
            with pytest.raises(RuntimeError):
                await srv.start()
            _, _, data = await get(srv.port)
            assert b'x_commands_sent_total{host="h9",dc="a"} 7' in data
        finally:
            await srv.aclose()
            await srv.aclose()  # idempotent
        with pytest.raises(ValueError):
            HttpEndpoint(_metrics(), labels={"le": "x"})   # refused at once, not per scrape

    run(body)


def test_server_404_and_405() -> None:
    async def body() -> None:
        async with HttpEndpoint(_metrics()) as srv:
            for path in ("/", "/metricsX", "/healthzz"):
                status, _, _ = await get(srv.port, path)
                assert status == 404, path
            for method in ("POST", "PUT", "DELETE"):
                for path in ("/metrics", "/healthz", "/readyz"):
                    status, headers, _ = await get(srv.port, path, method)
                    assert status == 405
                    assert {m.strip() for m in headers["allow"].split(",")} == {"GET", "HEAD"}
            status, _, _ = await get(srv.port)
            assert status == 200

    run(body)


def test_server_survives_garbage_and_closing_clients(caplog: pytest.LogCaptureFixture) -> None:
    async def body() -> None:
        async with HttpEndpoint(_metrics()) as srv:
            port = srv.port
            for raw in (b"\x00\xff\xfe garbage\r\n\r\n", b"GET\r\n\r\n",
                        b"GET /metrics SPDY/3\r\n\r\n",
                        b"GET /metrics HTTP/1.1 extra\r\n\r\n"):
                status, _, _ = await request(port, raw)
                assert status == 400, raw
            # a header line longer than the limit
            status, _, _ = await request(port, b"GET /metrics HTTP/1.1\r\nX: "
                                         + b"a" * 10_000 + b"\r\n\r\n")
            assert status in (400, 431)

            # connect and vanish, before and after sending part of a request
            for raw in (b"", b"GET /metrics HTTP/1.1\r\n"):
                _, w = await asyncio.open_connection("127.0.0.1", port)
                w.write(raw)
                w.close()
                await w.wait_closed()
            # reset by the peer
            _, w = await asyncio.open_connection("127.0.0.1", port)
            w.write(b"GET /metrics HTTP/1.1\r\n\r\n")
            w.transport.abort()

            # a silent client holds nothing: others are answered meanwhile
            _, w = await asyncio.open_connection("127.0.0.1", port)
            status, _, data = await get(port)
            assert status == 200 and b"sfc_commands_sent_total" in data
            w.close()
            await w.wait_closed()

    run(body)
    # garbage is no news: no error, no traceback in the host's log
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


def test_server_closes_with_open_connections() -> None:
    async def body() -> None:
        srv = HttpEndpoint(_metrics())
        await srv.start()
        idle = [await asyncio.open_connection("127.0.0.1", srv.port) for _ in range(5)]
        await asyncio.sleep(0.05)
        status, _, _ = await get(srv.port)
        assert status == 200  # idle clients take no slot from a scrape
        t0 = time.perf_counter()
        await srv.aclose()  # ends the idle connections instead of waiting for them
        assert time.perf_counter() - t0 < 1.5
        for r, w in idle:
            assert await asyncio.wait_for(r.read(), 1) == b""
            w.close()
        with pytest.raises(OSError):
            await asyncio.open_connection("127.0.0.1", srv.port)

    run(body)


def test_exposition_error_answers_500(caplog: pytest.LogCaptureFixture) -> None:
    class Broken(Metrics):
        def exposition(self, prefix: str = "sfc_", labels: Any = None) -> str:
            raise RuntimeError("bug")

    async def body() -> None:
        async with HttpEndpoint(Broken()) as srv:
            status, _, _ = await get(srv.port)
            assert status == 500
            status, _, _ = await get(srv.port, "/")
            assert status == 404

    run(body)
    assert "exposition failed" in caplog.text


def test_healthz_and_readyz() -> None:
    missing: list[str] = ["redis: not connected", "engine: Ready"]

    async def readiness() -> list[str]:
        if missing == ["boom"]:
            raise RuntimeError("boom")
        return list(missing)

    async def body() -> None:
        async with HttpEndpoint(Metrics(), readiness=readiness) as srv:
            assert (await get(srv.port, "/healthz"))[0] == 200
            status, _, data = await get(srv.port, "/readyz")
            assert status == 503
            assert data == b"not ready: redis: not connected; engine: Ready\n"
            missing[:] = ["boom"]
            status, _, data = await get(srv.port, "/readyz")
            assert status == 503 and b"readiness check failed" in data
            missing.clear()
            status, _, data = await get(srv.port, "/readyz")
            assert status == 200 and data == b"ready\n"
            status, _, data = await get(srv.port, "/healthz", "HEAD")
            assert status == 200 and data == b""
        async with HttpEndpoint(Metrics()) as srv:   # nothing to wait for: ready
            assert (await get(srv.port, "/readyz"))[0] == 200

    run(body)


def test_build_info_and_declared_counters_are_exported_from_the_start() -> None:
    from sfc_host.metrics import COUNTERS, HELP, HISTOGRAMS, LABELED

    m = Metrics(labels={"consumer": "c1"})
    assert m.exposition() == ""       # nothing declared: nothing exported
    m.declare(COUNTERS)
    m.set_info("build_info", {"version": "1.2.3"}, "The version.")
    fams = parse(m.exposition())
    assert fams["sfc_build_info"]["type"] == "gauge"
    assert fams["sfc_build_info"]["samples"] == [
        ("", {"consumer": "c1", "version": "1.2.3"}, 1.0)]
    for name in COUNTERS:
        assert fams[f"sfc_{name}_total"]["samples"] == [("", {"consumer": "c1"}, 0.0)]
    assert set(COUNTERS) == set(HELP) - HISTOGRAMS - LABELED and "commands_sent" in COUNTERS
    m.inc("commands_sent", 3)
    fams = parse(m.exposition())
    assert fams["sfc_commands_sent_total"]["samples"] == [("", {"consumer": "c1"}, 3.0)]
    assert m.snapshot() == {"commands_sent": 3}      # the zeros are only exported
