"""Spans over OTLP/HTTP from ``sfc-host run`` to a small receiver in the test, as a
collector would take them: the host's own JSON encoding (the default) and the SDK's
protobuf exporter (``OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf``); and a host with
``otel = false`` loads no OpenTelemetry code at all."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format
from helpers.aio import run
from helpers.hosts import flush, start_sfc_host, stop_cleanly, wait_until
from helpers.mes import JC, Mes, answer_all, configure, store
from helpers.mqtt_station import MqttStation
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from sfc_host.tracing.context import parse_traceparent, span_id_for

TRACE = "0af7651916cd43dd8448eb211c80319c"
TP = f"00-{TRACE}-b7ad6b7169203331-01"


class Receiver:
    """An OTLP/HTTP trace receiver: every POST to /v1/traces decoded to spans (JSON or
    protobuf, as its Content-Type says), with the resource each came with."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.content_types: set[str] = set()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                ctype = self.headers.get("Content-Type", "")
                ok = self.path == "/v1/traces"
                if ok:
                    receiver.take(ctype, body)
                self.send_response(200 if ok else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def take(self, ctype: str, body: bytes) -> None:
        self.content_types.add(ctype)
        if ctype == "application/x-protobuf":
            doc = json_format.MessageToDict(ExportTraceServiceRequest.FromString(body))
            ids = _b64_to_hex
        else:
            doc = json.loads(body)
            # a collector checks the JSON against the same messages: parse it as one
            # (with the ids as proto3's JSON mapping has them: base64, not OTLP's hex)
            json_format.Parse(json.dumps(_ids_as(doc, _hex_to_b64)),
                              ExportTraceServiceRequest())
            ids = str
        for rs in doc["resourceSpans"]:
            res = {a["key"]: next(iter(a["value"].values()))
                   for a in rs["resource"]["attributes"]}
            for ss in rs["scopeSpans"]:
                for s in ss["spans"]:
                    attrs = {a["key"]: next(iter(a["value"].values()))
                             for a in s.get("attributes", [])}
                    self.spans.append({
                        "trace": ids(s["traceId"]), "span": ids(s["spanId"]),
                        "parent": ids(s["parentSpanId"]) if s.get("parentSpanId") else None,
                        "name": s["name"], "attributes": attrs, "resource": res,
                        "scope": ss["scope"]["name"],
                        "links": [ids(x["spanId"]) for x in s.get("links", [])]})

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _hex_to_b64(h: str) -> str:
    return base64.b64encode(bytes.fromhex(h)).decode()


def _b64_to_hex(b: str) -> str:
    return base64.b64decode(b).hex()


def _ids_as(doc: Any, conv: Any) -> Any:
    if isinstance(doc, dict):
        return {k: conv(v) if k in ("traceId", "spanId", "parentSpanId") and v
                else _ids_as(v, conv) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_ids_as(x, conv) for x in doc]
    return doc


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    try:
        yield r
    finally:
        r.close()


@pytest.mark.parametrize("protocol", ["http/json", "http/protobuf"])
def test_sfc_host_run_exports_a_jobs_spans_over_otlp(
        redis_url: str, mqtt_url: str, tmp_path: Path, receiver: Receiver,
        protocol: str) -> None:
    async def main() -> None:
        await flush(redis_url)
        conf = tmp_path / "host.toml"
        conf.write_text(f'redis_url = "{redis_url}"\nmqtt_url = "{mqtt_url}"\n'
                        'consumer = "otlp-e2e"\notel = true\n'
                        "sweep_interval_ms = 50\ndiscover_interval_ms = 100\n")
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
               "OTEL_EXPORTER_OTLP_PROTOCOL": protocol, "OTEL_BSP_SCHEDULE_DELAY": "100"}
        host = start_sfc_host(["run", "--config", str(conf)], env, "host otlp-e2e running")
        try:
            async with Mes(mqtt_url) as mes, MqttStation(mqtt_url, answer_all) as station:
                await configure(mes)
                rep = await mes.call(JC + "StoreAndStart.v2", store("O1"), traceparent=TP)
                assert parse_traceparent(rep["traceparent"]).trace_id == TRACE
                await wait_until(lambda: "Ended_Completed" in mes.states("O1"), 20, "O1 done")
                cmds = [c for c in station.commands if c["correlationid"] == "O1"]
                await wait_until(lambda: any(s["name"].startswith("job ")
                                             for s in receiver.spans), 10, "the job span")
        finally:
            stop_cleanly(host)
        spans = [s for s in receiver.spans if s["trace"] == TRACE]
        by_id = {s["span"]: s for s in spans}
        request = by_id[span_id_for(TRACE, f"mes:{rep['causationid']}")]
        assert request["name"] == "process StoreAndStart" and request["parent"] == TP[36:52]
        (job,) = [s for s in spans if s["name"] == "job WM-AXLE-FIT"]
        assert job["parent"] == request["span"]
        assert job["attributes"]["sfc.work_master.id"] == "WM-AXLE-FIT"
        attempts = [s for s in spans if s["name"].startswith("send ")]
        assert {s["span"] for s in attempts} == {span_id_for(TRACE, c["id"]) for c in cmds}
        assert all(s["parent"] == job["span"] for s in attempts)
        assert all(s["links"] == [s["span"]] for s in attempts)   # the station's answers
        assert {s["resource"]["service.name"] for s in spans} == {"sfc-host"}
        assert {s["resource"]["service.instance.id"] for s in spans} == {"otlp-e2e"}
        assert {s["scope"] for s in spans} == {"sfc_host"}
        assert receiver.content_types == {"application/json" if protocol == "http/json"
                                          else "application/x-protobuf"}
    run(main(), 60)


def test_a_host_killed_mid_job_and_another_finishing_it_make_one_trace(
        redis_url: str, mqtt_url: str, tmp_path: Path, receiver: Receiver) -> None:
    """kill -9 of the host running a job, after its first spans went out; the host that
    takes the job over records the rest under the same parents."""
    from helpers.mes import no_tighten_answer

    def host(name: str) -> subprocess.Popen[str]:
        conf = tmp_path / f"{name}.toml"
        conf.write_text(f'redis_url = "{redis_url}"\nmqtt_url = "{mqtt_url}"\n'
                        f'consumer = "{name}"\notel = true\nsweep_interval_ms = 50\n'
                        "discover_interval_ms = 100\nclaim_min_idle_ms = 300\n"
                        "claim_interval_ms = 100\n")
        return start_sfc_host(["run", "--config", str(conf)],
                              {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
                               "OTEL_BSP_SCHEDULE_DELAY": "50"}, f"host {name} running")

    async def main() -> None:
        await flush(redis_url)
        first = host("first")
        second = None
        try:
            async with Mes(mqtt_url) as mes, \
                    MqttStation(mqtt_url, no_tighten_answer) as station:
                await configure(mes)
                rep = await mes.call(JC + "StoreAndStart.v2", store("K1"), traceparent=TP)
                tighten = await wait_until(
                    lambda: next((c for c in station.commands
                                  if c["type"] == "com.example.cell.tighten.v1"), None),
                    20, "the tightening command")
                await wait_until(lambda: any(s["name"] == "send load_part"
                                             for s in receiver.spans), 10, "a first span")
                first.kill()
                first.wait(10)
                second = host("second")
                station.answer = answer_all
                await station.reply(tighten, {"Outcome": "completed",
                                              "Result": {"torque": 85}})
                await wait_until(lambda: "Ended_Completed" in mes.states("K1"), 30, "K1 done")
                await wait_until(lambda: any(s["name"].startswith("job ")
                                             for s in receiver.spans), 10, "the job span")
        finally:
            if first.poll() is None:
                first.kill()
            if second is not None:
                stop_cleanly(second)
        spans = [s for s in receiver.spans if s["trace"] == TRACE]
        by_id = {s["span"]: s for s in spans}
        by_host = {s["span"]: s["resource"]["service.instance.id"] for s in spans}
        request = span_id_for(TRACE, f"mes:{rep['causationid']}")
        (job,) = [s for s in spans if s["name"].startswith("job ")]
        tight = by_id[span_id_for(TRACE, tighten["id"])]
        assert by_host[request] == "first" and by_host[job["span"]] == "second"
        assert by_host[tight["span"]] == "second"
        assert job["parent"] == request and tight["parent"] == job["span"]
        load = next(s for s in spans if s["name"] == "send load_part")
        assert by_host[load["span"]] == "first" and load["parent"] == job["span"]
    run(main(), 90)


_RUN_HOST = """
import asyncio, sys
{block}
import redis.asyncio
# redis-py imports the OpenTelemetry metrics SDK itself when it is installed
theirs = {{m for m in sys.modules if m.startswith("opentelemetry")}}
from sfc_host.config import ConfigError, HostConfig
from sfc_host.service.app import App
async def go(otel):
    app = App(HostConfig(redis_url={redis!r}, mqtt_url={mqtt!r}, otel=otel))
    await app.start()
    await app.aclose()
asyncio.run(go(False))
ours = {{m for m in sys.modules if m.startswith("opentelemetry")}} - theirs
print(sorted(ours), "sfc_host.tracing.spans" in sys.modules)
try:
    asyncio.run(go(True))
except ConfigError as e:
    print("refused:", e)
"""

# as if the [otel] extra were not installed: no opentelemetry module can be imported
_NO_EXTRA = """
import importlib.abc
class NoOtel(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ImportError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, NoOtel())
"""


@pytest.mark.parametrize("extra", [True, False])
def test_a_host_without_otel_loads_no_opentelemetry_code(redis_url: str, mqtt_url: str,
                                                         extra: bool) -> None:
    """The trace context flows on the wire; none of our code imports OpenTelemetry.
    Without the extra, ``otel = true`` is refused in one line that says what to install."""
    code = _RUN_HOST.format(block="" if extra else _NO_EXTRA, redis=redis_url,
                            mqtt=mqtt_url)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    assert lines[0] == "[] False", out.stdout
    if extra:
        assert len(lines) == 1, out.stdout      # otel = true started and stopped
    else:
        assert lines[1] == ("refused: setting otel: the OpenTelemetry SDK is not "
                            "installed: pip install 'sfc-fast[otel]'"), out.stdout


def test_run_check_says_where_traces_go_and_refuses_a_bad_exporter(tmp_path: Path) -> None:
    conf = tmp_path / "host.toml"
    conf.write_text("otel = true\n")
    ok = subprocess.run([sys.executable, "-m", "sfc_host", "run", "--check", "--config",
                         str(conf)], capture_output=True, text=True, timeout=60,
                        env={"PATH": "/usr/bin:/bin",
                             "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert ok.returncode == 0, ok.stderr
    assert "traces to http://collector:4318/v1/traces" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "sfc_host", "run", "--check", "--config",
                          str(conf)], capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin", "OTEL_TRACES_EXPORTER": "zipkin"})
    assert bad.returncode == 2
    lines = bad.stderr.strip().splitlines()
    assert len(lines) == 1 and "otel" in lines[0] and "zipkin" in lines[0], bad.stderr
