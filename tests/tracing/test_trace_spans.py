"""OpenTelemetry spans of a job, end to end over real redis-server, mosquitto and a
station, recorded with the SDK's in-memory exporter: the MES request, the job under it,
one child per action attempt (linked to the station's answer), the hold of a Pause, and
a job another host finishes, in the same trace."""

from __future__ import annotations

import asyncio
from typing import Any

from helpers.aio import run
from helpers.hosts import quick_config, wait_until
from helpers.mes import JC, Mes, S, answer_all, no_tighten_answer, order
from helpers.mqtt_station import MqttStation
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.trace import SpanKind, StatusCode

from sfc_host.service.app import App
from sfc_host.store.keys import ScopeKeys
from sfc_host.tracing.context import (
    from_stored,
    job_span_key,
    parse_traceparent,
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
            assert a["messaging.message.id"] in sent and a["sfc.action.outcome"] == "completed"
            assert a["sfc.action.attempt"] == 1 and a["sfc.action.round"] >= 1
            assert a["messaging.destination.name"] == "equipment/line1/commands"
            assert s.start_time is not None and s.end_time is not None
            assert job.start_time is not None and job.end_time is not None
            assert job.start_time <= s.start_time <= s.end_time
            (link,) = s.links
            assert _hex(link.context.trace_id, 32) == TRACE
            assert _hex(link.context.span_id, 16) == span_id_for(TRACE, a["messaging.message.id"])
        tight = next(s for s in attempts if dict(s.attributes or {})["messaging.message.id"]
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
    from helpers.hosts import flush as flush_redis
    from helpers.hosts import work_master
    if flush:
        await flush_redis(redis_url)
    app = App(quick_config(redis_url, mqtt_url=mqtt_url, otel=True),
              span_processor=SimpleSpanProcessor(exporter))
    if flush:
        await app.host.store.put_work_master(S, work_master("tighten_rework", "wm"))
    await app.host.add_scope(S)
    await app.start()
    return app


def test_a_job_another_host_finishes_stays_in_its_trace(redis_url: str, mqtt_url: str) -> None:
    async def main() -> None:
        first_spans, second_spans = InMemorySpanExporter(), InMemorySpanExporter()
        first: App | None = await _start(redis_url, mqtt_url, first_spans)
        second: App | None = None
        try:
            async with Mes(mqtt_url) as mes, \
                    MqttStation(mqtt_url, no_tighten_answer) as station:
                rep = await mes.call(JC + "StoreAndStart.v2", order("H1"), traceparent=TP)
                tighten = await wait_until(
                    lambda: next((c for c in _commands_of(station, "H1")
                                  if c["type"] == "com.example.cell.tighten.v1"), None),
                    20, "the tightening command")
                assert first is not None
                token = await _token(first, "H1")
                await first.aclose()
                first = None
                # a host that never saw the job: its run's context comes from Redis
                second = await _start(redis_url, mqtt_url, second_spans, flush=False)
                await asyncio.sleep(0.3)
                station.answer = answer_all
                await station.reply(tighten, {"Outcome": "completed",
                                              "Result": {"torque": 85}})
                await wait_until(lambda: "Ended_Completed" in mes.states("H1"), 20, "H1 done")
                job_span = span_id_for(TRACE, job_span_key("H1", token))
                await wait_until(lambda: any(_ids(s)[1] == job_span
                                             for s in second_spans.get_finished_spans()),
                                 10, "the job span")
        finally:
            for app in (first, second):
                if app is not None:
                    await app.aclose()
        before, after = _traced(first_spans, TRACE), _traced(second_spans, TRACE)
        request_span = span_id_for(TRACE, f"mes:{rep['causationid']}")
        # the first host recorded the request and the attempts it settled ...
        assert request_span in {_ids(s)[1] for s in before}
        assert job_span not in {_ids(s)[1] for s in before}
        # ... the second the tightening it settled and the job, in the same tree
        by_id = {_ids(s)[1]: s for s in after}
        assert _ids(by_id[job_span])[2] == request_span
        tight = by_id[span_id_for(TRACE, tighten["id"])]
        assert _ids(tight)[2] == job_span
        assert tight.start_time is not None and tight.end_time is not None
        assert by_id[job_span].start_time is not None
        # the attempt began on the first host: its start is the command's, not the answer's
        assert tight.start_time < tight.end_time - 250_000_000
        assert by_id[job_span].start_time <= tight.start_time
        every = {_ids(s)[1] for s in before + after}
        for s in before + after:
            parent = _ids(s)[2]
            assert parent in every or parent == MES_SPAN, s.name
    run(main(), 60)


def test_untraced_requests_and_script_calls_start_traces_of_their_own(
        redis_url: str, mqtt_url: str) -> None:
    async def main() -> None:
        exporter = InMemorySpanExporter()
        app = await _start(redis_url, mqtt_url, exporter)
        try:
            async with Mes(mqtt_url) as mes, MqttStation(mqtt_url, answer_all) as station:
                rep = await mes.call(JC + "StoreAndStart.v2", order("R1"))
                # traced: the reply names the trace the request started
                ctx = parse_traceparent(rep["traceparent"])
                # a script's api.jobs call: no request, a root span of the call
                out = await app.mes.job_control(S, "StoreAndStart", order("R2"))
                assert out["JobOrderID"] == "R2"
                await wait_until(lambda: "Ended_Completed" in mes.states("R1")
                                 and "Ended_Completed" in mes.states("R2"), 20, "done")
                kept = from_stored(await app.host.client.hget(ScopeKeys(S).order("R2"), "tp"))
                assert kept is not None
                r2_cmds = _commands_of(station, "R2")
                assert r2_cmds and all(parse_traceparent(c["traceparent"]).trace_id
                                       == kept.trace_id for c in r2_cmds)
                tokens = {j: await _token(app, j) for j in ("R1", "R2")}
                await wait_until(lambda: sum(s.name == "job wm"
                                             for s in exporter.get_finished_spans()) >= 2,
                                 10, "the job spans")
        finally:
            await app.aclose()
        r1 = {_ids(s)[1]: s for s in _traced(exporter, ctx.trace_id)}
        root = r1[span_id_for(ctx.trace_id, f"mes:{rep['causationid']}")]
        assert root.parent is None and root.name == "process StoreAndStart"
        job1 = r1[span_id_for(ctx.trace_id, job_span_key("R1", tokens["R1"]))]
        assert _ids(job1)[2] == _ids(root)[1]
        r2 = {_ids(s)[1]: s for s in _traced(exporter, kept.trace_id)}
        call = r2[kept.span_id]
        assert call.parent is None and call.name == "StoreAndStart"
        assert dict(call.attributes or {})["sfc.job_order.id"] == "R2"
        job2 = r2[span_id_for(kept.trace_id, job_span_key("R2", tokens["R2"]))]
        assert _ids(job2)[2] == kept.span_id
        assert sum(s.name.startswith("send ") for s in r2.values()) == len(r2_cmds)
    run(main(), 60)


def test_an_unsampled_trace_flows_on_the_wire_and_records_nothing(
        redis_url: str, mqtt_url: str) -> None:
    async def main() -> None:
        exporter = InMemorySpanExporter()
        app = await _start(redis_url, mqtt_url, exporter)
        try:
            async with Mes(mqtt_url) as mes, MqttStation(mqtt_url, answer_all) as station:
                await mes.call(JC + "StoreAndStart.v2", order("U1"),
                               traceparent=TP[:-2] + "00")
                await wait_until(lambda: "Ended_Completed" in mes.states("U1"), 20, "done")
                cmds = _commands_of(station, "U1")
        finally:
            await app.aclose()
        assert cmds and all(parse_traceparent(c["traceparent"]).flags == 0 for c in cmds)
        assert _traced(exporter, TRACE) == []
    run(main(), 60)
