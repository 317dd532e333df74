"""One job's trace context on the wire, end to end over real redis-server and
mosquitto: the MES request's ``traceparent`` is kept with the job, every equipment
command carries it on (a span of its own per attempt), replies and status events carry
it, and a host that takes over a job mid-run continues the same trace."""

from __future__ import annotations

import asyncio
from typing import Any

from helpers.aio import run
from helpers.hosts import wait_until
from helpers.mes import BY_ID, JC, STATUS, Mes, answer_all, no_tighten_answer, order, start_app
from helpers.mqtt_station import MqttStation

from sfc_host.cli.ops import inspect_text
from sfc_host.store.keys import ScopeKeys
from sfc_host.store.outbox import Outbox
from sfc_host.store.views import read_job
from sfc_host.tracing.context import (
    TraceContext,
    from_stored,
    job_carried,
    parse_traceparent,
    span_id_for,
)

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
MES_SPAN = "00f067aa0ba902b7"
TP = f"00-{TRACE}-{MES_SPAN}-01"


def _commands_of(station: MqttStation, job: str) -> list[dict[str, Any]]:
    return [c for c in station.commands if c["correlationid"] == job]


def _assert_carried(cmds: list[dict[str, Any]], trace: str, state: str | None) -> None:
    assert cmds
    spans = set()
    for c in cmds:
        ctx = parse_traceparent(c["traceparent"])
        assert ctx.trace_id == trace, c
        # the attempt's own span, derived from the command id: any host names it alike
        assert ctx.span_id == span_id_for(trace, c["id"]) and ctx.flags == 1
        assert c["tracestate"] == state
        spans.add(ctx.span_id)
    assert len(spans) == len(cmds)


def test_the_mes_trace_runs_through_every_command_reply_and_status_event(
        redis_url: str, mqtt_url: str) -> None:
    async def main() -> None:
        app = await start_app(redis_url, mqtt_url)
        try:
            async with Mes(mqtt_url) as mes, MqttStation(mqtt_url, answer_all) as station:
                rep = await mes.call(JC + "StoreAndStart.v2", order("T1"),
                                     traceparent=TP, tracestate="vendor=x")
                assert rep["data"]["ReturnStatus"] == 1
                reply_ctx = parse_traceparent(rep["traceparent"])
                # the reply names the host's handling of the request; the job's run
                # hangs under it (the order keeps it as the parent)
                assert reply_ctx.trace_id == TRACE
                assert reply_ctx.span_id == span_id_for(TRACE, "mes:" + rep["causationid"])
                kept = await app.host.client.hget(ScopeKeys("line1").order("T1"), "tp")
                assert from_stored(kept) == TraceContext(TRACE, reply_ctx.span_id, 1, "vendor=x")
                await wait_until(lambda: "Ended_Completed" in mes.states("T1"), 20, "T1 done")
                _assert_carried(_commands_of(station, "T1"), TRACE, "vendor=x")
                events = [e for e in mes.events if e["type"] == STATUS
                          and e["data"]["JobOrder"]["JobOrderID"] == "T1"]
                assert events and {parse_traceparent(e["traceparent"]).trace_id
                                   for e in events} == {TRACE}
                # an end event sent again from the outbox (its host died) carries the
                # same span as the first: read with the order, named by its run
                [row] = await Outbox(app.host.scripts).read(ScopeKeys("line1"), ["T1"])
                again = job_carried(row.trace, "T1", row.token)
                assert again is not None and again["tracestate"] == "vendor=x"
                assert {e["traceparent"] for e in events} == {again["traceparent"]}
                # the operator sees it: inspect (and the web page) read it from the order
                view = await read_job(app.host.client, "line1", "T1")
                assert view["trace_id"] == TRACE and f"trace          {TRACE}" in \
                    inspect_text(view)
                # the job response (sfc-host job show asks for it) carries the job's trace
                by_id = await mes.call(BY_ID, {"JobOrderID": "T1"})
                ctx = parse_traceparent(by_id["traceparent"])
                assert ctx.trace_id == TRACE and "JobResponse" in by_id["data"]
                # structured mode, and a job with no context: nothing is made up
                async with Mes(mqtt_url, structured=True) as smes:
                    await smes.call(JC + "StoreAndStart.v2", order("T2"),
                                    traceparent=TP.replace(TRACE, "a" * 32))
                    await mes.call(JC + "StoreAndStart.v2", order("T3"))
                    await wait_until(lambda: "Ended_Completed" in mes.states("T2")
                                     and "Ended_Completed" in mes.states("T3"), 20, "done")
                _assert_carried(_commands_of(station, "T2"), "a" * 32, None)
                assert all(c["traceparent"] is None for c in _commands_of(station, "T3"))
                assert app.metrics.by_label("trace_contexts_invalid") == {}
        finally:
            await app.aclose()
    run(main())


def test_a_broken_traceparent_is_ignored_and_counted_never_refused(
        redis_url: str, mqtt_url: str) -> None:
    async def main() -> None:
        app = await start_app(redis_url, mqtt_url)
        try:
            class Garbled(MqttStation):
                def answer_traceparent(self, cmd: dict[str, Any]) -> str | None:
                    return "00-not-a-trace"
            async with Mes(mqtt_url) as mes, Garbled(mqtt_url, answer_all) as station:
                rep = await mes.call(JC + "StoreAndStart.v2", order("B1"),
                                     traceparent="00-" + "0" * 32 + "-" + MES_SPAN + "-01")
                assert rep["data"]["ReturnStatus"] == 1 and "traceparent" not in rep
                await wait_until(lambda: "Ended_Completed" in mes.states("B1"), 20, "B1 done")
                assert all(c["traceparent"] is None for c in _commands_of(station, "B1"))
                # the garbled answers were used: the job completed; each was counted
                counts = app.metrics.by_label("trace_contexts_invalid")
                assert counts.get("mes") == 1 and counts.get("equipment", 0) >= 1, counts
        finally:
            await app.aclose()
    run(main())


def test_a_host_that_takes_a_job_over_continues_its_trace(redis_url: str,
                                                          mqtt_url: str) -> None:
    async def main() -> None:
        first = await start_app(redis_url, mqtt_url)
        second = None
        try:
            async with Mes(mqtt_url) as mes, \
                    MqttStation(mqtt_url, no_tighten_answer) as station:
                await mes.call(JC + "StoreAndStart.v2", order("H1"), traceparent=TP)
                tighten = await wait_until(
                    lambda: next((c for c in _commands_of(station, "H1")
                                  if c["type"] == "com.example.cell.tighten.v1"), None),
                    20, "the tightening command")
                await first.aclose()
                first = None
                # a host that never saw the job: its state, and trace, come from Redis
                from helpers.hosts import quick_config

                from sfc_host.service.app import App
                second = App(quick_config(redis_url, mqtt_url=mqtt_url))
                await second.host.add_scope("line1")
                await second.start()
                await asyncio.sleep(0.3)
                station.answer = answer_all
                await station.reply(tighten, {"Outcome": "completed",
                                              "Result": {"torque": 85}})
                await wait_until(lambda: "Ended_Completed" in mes.states("H1"), 20, "H1 done")
                cmds = _commands_of(station, "H1")
                later = cmds[cmds.index(tighten) + 1:]
                assert later, "the second host sent no command"
                _assert_carried(cmds, TRACE, None)
        finally:
            for app in (first, second):
                if app is not None:
                    await app.aclose()
    run(main(), 60)
