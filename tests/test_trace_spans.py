"""OpenTelemetry spans of a job, end to end over real redis-server, mosquitto and a
station, recorded with the SDK's in-memory exporter: the MES request, the job under it,
one child per action attempt (linked to the station's answer), the hold of a Pause, and
a job another host finishes, in the same trace."""

from __future__ import annotations

import asyncio
from typing import Any

from hosts import quick_config, wait_until
from mqtt_station import MqttStation
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.trace import SpanKind, StatusCode
from test_mes import (
    JC,
    Mes,
    S,
    answer_all,
    no_tighten_answer,
    order,
    run,
)

from sfc_host.service.app import App
from sfc_host.store.keys import ScopeKeys
from sfc_host.tracing.context import (
    job_span_key,
    span_id_for,
)

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
MES_SPAN = "00f067aa0ba902b7"
TP = f"00-{TRACE}-{MES_SPAN}-01"


def _hex(n: int, width: int) -> str:
    return f"{n:0{width}x}"


def _ids(s: ReadableSpan) -> tuple[str, str, str | None]:
    ctx = s.context
    assert ctx is not None
    parent = s.parent
    return (_hex(ctx.trace_id, 32), _hex(ctx.span_id, 16),
            _hex(parent.span_id, 16) if parent is not None else None)


def _traced(exporter: InMemorySpanExporter, trace: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if _ids(s)[0] == trace]


async def _token(app: App, job: str) -> str:
    raw = await app.host.client.hget(ScopeKeys(S).order(job), "token")
    return raw.decode()


def _commands_of(station: MqttStation, job: str) -> list[dict[str, Any]]:
    return [c for c in station.commands if c["correlationid"] == job]


def test_a_jobs_spans_hang_under_the_mes_request(redis_url: str, mqtt_url: str) -> None:
    async def main() -> None:
        exporter = InMemorySpanExporter()
        app = await _start(redis_url, mqtt_url, exporter)
        try:
            async with Mes(mqtt_url) as mes, \
                    MqttStation(mqtt_url, no_tighten_answer) as station:
                rep = await mes.call(JC + "StoreAndStart.v2", order("T1"), traceparent=TP,
                                     tracestate="vendor=x")
                request_id = rep["causationid"]
                tighten = await wait_until(
                    lambda: next((c for c in _commands_of(station, "T1")
                                  if c["type"] == "com.example.cell.tighten.v1"), None),
                    20, "the tightening command")
                assert (await mes.call(JC + "Pause.v2", {"JobOrderID": "T1"},
                                       traceparent=TP))["data"]["ReturnStatus"] == 1
                await asyncio.sleep(0.2)
                assert (await mes.call(JC + "Resume.v2", {"JobOrderID": "T1"},
                                       traceparent=TP))["data"]["ReturnStatus"] == 1
                station.answer = answer_all
                await station.reply(tighten, {"Outcome": "completed",
                                              "Result": {"torque": 85}})
                await wait_until(lambda: "Ended_Completed" in mes.states("T1"), 20, "T1 done")
                token = await _token(app, "T1")
                cmds = _commands_of(station, "T1")
                # the job span and the last attempt are recorded as the job ends
                job_span = span_id_for(TRACE, job_span_key("T1", token))
                await wait_until(lambda: any(_ids(s)[1] == job_span
                                             for s in exporter.get_finished_spans()),
                                 10, "the job span")
        finally:
            await app.aclose()
        spans = _traced(exporter, TRACE)
        by_id = {_ids(s)[1]: s for s in spans}
        request_span = span_id_for(TRACE, f"mes:{request_id}")
        # the MES request: a consumer span under the MES's own
        req = by_id[request_span]
        assert req.name == "process StoreAndStart" and req.kind == SpanKind.CONSUMER
        assert _ids(req)[2] == MES_SPAN and req.parent is not None and req.parent.is_remote
        attrs = dict(req.attributes or {})
        assert attrs["messaging.system"] == "mqtt"
        assert attrs["messaging.operation.type"] == "process"
        assert attrs["messaging.destination.name"] == "mes/line1/commands"
        assert attrs["cloudevents.event_id"] == request_id
        assert attrs["cloudevents.event_type"] == JC + "StoreAndStart.v2"
        assert attrs["sfc.job_order.id"] == "T1" and attrs["sfc.mes.return_status"] == 1
        assert req.context is not None and req.context.trace_state.get("vendor") == "x"
        # the job: the order's run, under the request that stored it
        job = by_id[job_span]
        assert job.name == "job wm" and _ids(job)[2] == request_span
        jattrs = dict(job.attributes or {})
        assert jattrs["sfc.work_master.id"] == "wm"
        assert jattrs["sfc.job.status"] == "completed"
        assert job.status.status_code == StatusCode.UNSET
        # one child of the job per command the station received, under the id the
        # command carried, linked to the station's answer (sent in the command's trace)
        attempts = [s for s in spans if s.name.startswith("send ")]
        sent = {c["id"] for c in cmds}
        assert {_ids(s)[1] for s in attempts} == {span_id_for(TRACE, c) for c in sent}
        for s in attempts:
            a = dict(s.attributes or {})
            assert _ids(s)[2] == job_span and s.kind == SpanKind.PRODUCER
            assert a["sfc.command.id"] in sent and a["sfc.action.outcome"] == "completed"
            assert a["sfc.action.attempt"] == 1 and a["sfc.action.round"] >= 1
            assert a["messaging.destination.name"] == "equipment/line1/commands"
            assert s.start_time is not None and s.end_time is not None
            assert job.start_time is not None and job.end_time is not None
            assert job.start_time <= s.start_time <= s.end_time
            (link,) = s.links
            assert _hex(link.context.trace_id, 32) == TRACE
            assert _hex(link.context.span_id, 16) == span_id_for(TRACE, a["sfc.command.id"])
        tight = next(s for s in attempts if dict(s.attributes or {})["sfc.command.id"]
                     == tighten["id"])
        assert tight.end_time is not None and tight.start_time is not None
        # the hold of the Pause: a child of the job, released by the Resume
        (hold,) = [s for s in spans if s.name == "hold"]
        assert _ids(hold)[2] == job_span
        assert dict(hold.attributes or {})["sfc.hold.outcome"] == "released"
        assert hold.end_time is not None and hold.start_time is not None
        assert hold.end_time - hold.start_time >= 150_000_000
        # the Pause and Resume requests are spans of their own in the MES's trace
        assert {s.name for s in spans if s.name.startswith("process ")} >= {
            "process StoreAndStart", "process Pause", "process Resume"}
        assert app.spans is not None and app.spans.recorded >= len(spans)
    run(main(), 60)


async def _start(redis_url: str, mqtt_url: str, exporter: InMemorySpanExporter,
                 flush: bool = True) -> App:
    from hosts import flush as flush_redis
    from hosts import work_master
    if flush:
        await flush_redis(redis_url)
    app = App(quick_config(redis_url, mqtt_url=mqtt_url, otel=True),
              span_processor=SimpleSpanProcessor(exporter))
    if flush:
        await app.host.store.put_work_master(S, work_master("tighten_rework", "wm"))
    await app.host.add_scope(S)
    await app.start()
    return app
