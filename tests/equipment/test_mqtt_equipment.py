"""Equipment over MQTT end to end: real redis-server and mosquitto, the station a
separate MQTT client (tests/helpers/mqtt_station.py)."""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any

import pytest
from helpers.aio import run
from helpers.hosts import flush, quick_config, wait_until, work_master
from helpers.mqtt_station import MqttStation

from sfc_host.service.app import App
from sfc_host.store.keys import ScopeKeys

S = "line1"
K = ScopeKeys(S)


async def start_app(redis_url: str, mqtt_url: str, *wms: dict[str, Any], flush_db: bool = True,
                    **kw: Any) -> App:
    if flush_db:
        await flush(redis_url)
    app = App(quick_config(redis_url, mqtt_url=mqtt_url, **kw))
    for wm in wms:
        await app.host.store.put_work_master(S, wm)
    await app.host.add_scope(S)
    await app.start()
    return app


async def order_state(app: App, job: str) -> str | None:
    o = await app.host.orders.get(S, job)
    return o["state"] if o else None


def tighten_ok(cmd: dict[str, Any]) -> dict[str, Any]:
    if cmd["type"] == "com.example.cell.tighten.v1":
        return {"Outcome": "completed", "Result": {"torque": 85}}
    return {}


@pytest.mark.parametrize("structured", [False, True], ids=["binary", "structured"])
def test_push_recipe_completes_over_mqtt_with_a_job_response(
        redis_url: str, mqtt_url: str, structured: bool) -> None:
    async def main() -> None:
        app = await start_app(redis_url, mqtt_url, work_master("tighten_rework", "wm"))
        try:
            async with MqttStation(mqtt_url, tighten_ok, structured=structured) as st:
                await app.host.orders.store_order(S, {"JobOrderID": "J1",
                                                      "WorkMasterID": [{"ID": "wm"}]},
                                                  start=True)
                await wait_until(lambda: _is(app, "J1", "Ended_Completed"), 15,
                                 "job completed")
                assert st.ids() == ["J1:load_part#1", "J1:tighten#2", "J1:unload_part#3"]
                c = st.commands[1]
                assert c["type"] == "com.example.cell.tighten.v1"
                assert c["subject"] == S and c["correlationid"] == "J1"
                assert c["response_topic"] == f"equipment/{S}/responses"
                assert c["data"]["Parameters"] == {"program": 7}
                assert c["data"]["Context"]["JobOrderID"] == "J1"
                resp = json.loads(await app.host.client.get(K.response("J1")))
                assert {"ID": "tighten.torque", "Value": 85} in resp["JobResponseData"]
                assert app.metrics["answers_received"] == 3
        finally:
            await app.aclose()
    run(main())


async def _is(app: App, job: str, state: str) -> bool:
    return await order_state(app, job) == state


def test_axle_recipe_with_simultaneous_branch_and_pull_events(
        redis_url: str, mqtt_url: str) -> None:
    async def main() -> None:
        app = await start_app(redis_url, mqtt_url, work_master("axle_fit_qa", "axle"))
        try:
            st: MqttStation

            def answer(cmd: dict[str, Any]) -> dict[str, Any] | None:
                if cmd["type"] == "com.example.station.tighten.v1":
                    # the QA camera reports while the bolts are tightened
                    asyncio.get_running_loop().create_task(st.publish(
                        f"equipment/{S}/events", "com.example.station.qa_result.v1",
                        {"passed": True}, subject=S, correlationid=cmd["correlationid"]))
                return {}

            async with MqttStation(mqtt_url, answer) as st:
                await app.host.orders.store_order(S, {"JobOrderID": "A1",
                                                      "WorkMasterID": [{"ID": "axle"}]},
                                                  start=True)
                qa = "com.example.station.torque_result.v1"
                await wait_until(lambda: app.host.client.zscore(K.waits(qa), "A1"), 15,
                                 "waiting for the torque result")
                await st.publish(f"equipment/{S}/events", qa, {"torque_ok": True},
                                 subject=S, correlationid="A1")
                await wait_until(lambda: _is(app, "A1", "Ended_Completed"), 15, "completed")
                view = await app.host.inspect(S, "A1")
                assert view["actions"]["camera_qa"]["result"] == {"passed": True}
                assert sorted(st.ids()) == ["A1:position_axle#1", "A1:tighten#3"] or \
                    len(st.ids()) == 2
        finally:
            await app.aclose()
    run(main())


def test_late_answer_to_an_earlier_round_is_absorbed(redis_url: str, mqtt_url: str) -> None:
    async def main() -> None:
        app = await start_app(redis_url, mqtt_url, work_master("tighten_rework", "wm"))
        try:
            torques = iter([70, 85])
            first: list[dict[str, Any]] = []

            def answer(cmd: dict[str, Any]) -> dict[str, Any]:
                if cmd["type"] == "com.example.cell.tighten.v1":
                    if not first:
                        first.append(cmd)
                    return {"Result": {"torque": next(torques)}}
                return {}

            async with MqttStation(mqtt_url, answer) as st:
                await app.host.orders.store_order(S, {"JobOrderID": "R",
                                                      "WorkMasterID": [{"ID": "wm"}]},
                                                  start=True)
                await wait_until(lambda: _is(app, "R", "Ended_Completed"), 15, "completed")
                absorbed = app.metrics["answers_absorbed"]
                await st.reply(first[0], {"Result": {"torque": 1}})   # round 1, again
                await wait_until(lambda: app.metrics["answers_absorbed"] == absorbed + 1, 5,
                                 "late answer absorbed")
                view = await app.host.inspect(S, "R")
                assert view["status"] == "completed"
                assert view["actions"]["tighten"]["result"] == {"torque": 85}
        finally:
            await app.aclose()
    run(main())


def test_bad_messages_are_counted_and_the_host_keeps_serving(
        redis_url: str, mqtt_url: str) -> None:
    async def main() -> None:
        app = await start_app(redis_url, mqtt_url, work_master("tighten_rework", "wm"),
                              mqtt_max_payload=1 << 20)
        try:
            async with MqttStation(mqtt_url, tighten_ok) as st:
                bad = [
                    (f"equipment/{S}/responses", b"{not json"),
                    (f"equipment/{S}/responses", json.dumps({"specversion": "1.0"}).encode()),
                    (f"equipment/{S}/responses", b"x" * (10 * 1024 * 1024)),
                    ("equipment/a{b}/responses", b"{}"),
                    (f"equipment/{S}/events", b"\xff\xfe"),
                ]
                for topic, payload in bad:
                    await st.raw(topic, payload)
                # a well-formed answer naming a command that does not exist
                await st.publish(f"equipment/{S}/responses", "x.answer", {},
                                 causationid="nobody:nothing#1")
                await st.publish(f"equipment/{S}/responses", "x.answer", {"Outcome": "maybe"},
                                 causationid="J:x#1")
                await st.publish(f"equipment/{S}/responses", "x.answer", {})   # no id
                await wait_until(lambda: app.metrics["bad_answers"] >= 5, 10, "counted")
                # the 10 MiB answer is passed over as it arrives, never kept whole
                await wait_until(lambda: app.metrics["mqtt_oversized"] == 1, 10, "oversized")
                await wait_until(lambda: app.metrics["bad_events"] >= 1, 10, "event counted")
                # and the host still runs jobs
                await app.host.orders.store_order(S, {"JobOrderID": "OK",
                                                      "WorkMasterID": [{"ID": "wm"}]},
                                                  start=True)
                await wait_until(lambda: _is(app, "OK", "Ended_Completed"), 15, "completed")
        finally:
            await app.aclose()
    run(main())


def test_two_hosts_share_one_scope_through_shared_subscriptions(
        redis_url: str, mqtt_url: str) -> None:
    async def main() -> None:
        a = await start_app(redis_url, mqtt_url, work_master("tighten_rework", "wm"),
                            consumer="h1")
        b = await start_app(redis_url, mqtt_url, flush_db=False, consumer="h2")
        try:
            async with MqttStation(mqtt_url, tighten_ok) as st:
                jobs = [f"J{i}" for i in range(30)]
                for j in jobs:
                    await a.host.orders.store_order(S, {"JobOrderID": j,
                                                        "WorkMasterID": [{"ID": "wm"}]},
                                                    start=True)

                async def all_done() -> bool:
                    return all([await _is(a, j, "Ended_Completed") for j in jobs])
                await wait_until(all_done, 20, "every job completed")
                ids = st.ids()
                assert len(ids) == len(set(ids)) == 3 * len(jobs)
                assert a.metrics["answers_received"] > 0 and b.metrics["answers_received"] > 0
        finally:
            await a.aclose()
            await b.aclose()
    run(main())


V110 = "https://aschamberger.github.io/schemas/microdcs/sfc-recipe/v1.1.0/"


def three_quick_steps() -> dict[str, Any]:
    """Three push steps with short timeouts and retries: a command the broker loses in
    its restart (it keeps no messages) is sent again with a new id at its deadline."""
    steps = ["One", "Two", "Three"]
    return {"ID": "wm", "dataschema": V110, "data": {
        "Steps": [{"Name": n, "Initial": i == 0} for i, n in enumerate(steps)],
        "Transitions": [{"Source": a, "Target": b, "Condition": "always"}
                        for a, b in itertools.pairwise(steps)],
        "Actions": [{"Name": n.lower(), "Step": n, "Qualifier": "N",
                     "Interaction": "push_command", "TypeId": f"com.example.{n.lower()}.v1",
                     "TimeoutSeconds": 2, "Retries": 5} for n in steps]}}


def test_broker_restart_mid_run(redis_url: str, mosquitto_server: Any) -> None:
    async def main() -> None:
        url = mosquitto_server.url
        app = await start_app(redis_url, url, three_quick_steps())
        try:
            async with MqttStation(url, lambda c: {}) as st:
                jobs = [f"B{i}" for i in range(20)]
                for j in jobs[:10]:
                    await app.host.orders.store_order(S, {"JobOrderID": j,
                                                          "WorkMasterID": [{"ID": "wm"}]},
                                                      start=True)
                await asyncio.to_thread(mosquitto_server.restart)
                for j in jobs[10:]:
                    await app.host.orders.store_order(S, {"JobOrderID": j,
                                                          "WorkMasterID": [{"ID": "wm"}]},
                                                      start=True)

                async def all_done() -> bool:
                    return all([await _is(app, j, "Ended_Completed") for j in jobs])
                await wait_until(all_done, 30, "every job completed")
                assert app.link.connects >= 2
                assert st.commands
        finally:
            await app.aclose()
    run(main())


def test_pause_holds_running_work_and_resume_restarts_it_to_the_end(
        redis_url: str, mqtt_url: str) -> None:
    async def main() -> None:
        app = await start_app(redis_url, mqtt_url, work_master("paint_hold_restart", "paint"))
        try:
            def answer(cmd: dict[str, Any]) -> dict[str, Any] | None:
                t = cmd["type"]
                if t == "com.example.booth.paint.v1":
                    return None                       # painting takes a while
                if t == "com.example.booth.paint.hold.v1":
                    return {"Outcome": "held"}
                return {}                             # prime, restart, cure: done

            async with MqttStation(mqtt_url, answer) as st:
                await app.host.orders.store_order(S, {"JobOrderID": "P",
                                                      "WorkMasterID": [{"ID": "paint"}]},
                                                  start=True)
                await wait_until(lambda: "P:paint#2" in st.ids(), 10, "paint sent")
                await st.publish(f"equipment/{S}/events", "com.example.booth.ready.v1", {},
                                 subject=S, correlationid="P")
                await app.host.orders.trigger(S, "P", "Pause")
                await wait_until(lambda: "P:paint#2:hold" in st.ids(), 10, "hold sent")
                await wait_until(lambda: _status(app, "P", "held"), 10, "held")
                await app.host.orders.trigger(S, "P", "Resume")
                await wait_until(lambda: _is(app, "P", "Ended_Completed"), 15, "completed")
                restart = next(c for c in st.commands if c["id"] == "P:paint#3")
                assert restart["type"] == "com.example.booth.paint.restart.v1"
                assert restart["data"]["Context"]["Restart"] is True
                absorbed = app.metrics["answers_absorbed"]
                await st.reply(next(c for c in st.commands if c["id"] == "P:paint#2"), {})
                await wait_until(lambda: app.metrics["answers_absorbed"] == absorbed + 1, 5,
                                 "late answer to the held attempt absorbed")
                assert st.ids().count("P:paint#2") == 1
        finally:
            await app.aclose()
    run(main())


async def _status(app: App, job: str, want: str) -> bool:
    v = await app.host.inspect(S, job)
    return v is not None and v["status"] == want


def test_refused_hold_lets_the_work_finish_without_a_resend(
        redis_url: str, mqtt_url: str) -> None:
    async def main() -> None:
        app = await start_app(redis_url, mqtt_url, work_master("paint_hold_restart", "paint"))
        try:
            def answer(cmd: dict[str, Any]) -> dict[str, Any] | None:
                t = cmd["type"]
                if t == "com.example.booth.paint.v1":
                    return None
                if t == "com.example.booth.paint.hold.v1":
                    return {"Outcome": "not_held"}
                return {}

            async with MqttStation(mqtt_url, answer) as st:
                await app.host.orders.store_order(S, {"JobOrderID": "N",
                                                      "WorkMasterID": [{"ID": "paint"}]},
                                                  start=True)
                await wait_until(lambda: "N:paint#2" in st.ids(), 10, "paint sent")
                await st.publish(f"equipment/{S}/events", "com.example.booth.ready.v1", {},
                                 subject=S, correlationid="N")
                await app.host.orders.trigger(S, "N", "Pause")
                await wait_until(lambda: "N:paint#2:hold" in st.ids(), 10, "hold sent")
                await wait_until(lambda: app.metrics["answers_applied"] >= 2, 10, "not held")
                await app.host.orders.trigger(S, "N", "Resume")
                await asyncio.sleep(0.3)
                assert st.ids().count("N:paint#2") == 1      # the work was not sent again
                await st.reply(next(c for c in st.commands if c["id"] == "N:paint#2"), {})
                await wait_until(lambda: _is(app, "N", "Ended_Completed"), 15, "completed")
                assert st.ids().count("N:paint#2") == 1
        finally:
            await app.aclose()
    run(main())


def test_abort_and_stop_end_the_recipe_and_nothing_goes_out_after(
        redis_url: str, mqtt_url: str) -> None:
    async def main() -> None:
        app = await start_app(redis_url, mqtt_url, work_master("tighten_rework", "wm"))
        try:
            async with MqttStation(mqtt_url, lambda c: None) as st:
                for j in ("A", "B"):
                    await app.host.orders.store_order(S, {"JobOrderID": j,
                                                          "WorkMasterID": [{"ID": "wm"}]},
                                                      start=True)
                await wait_until(lambda: len(st.commands) == 2, 10, "first commands")
                await wait_until(lambda: _top(app, "A", "Running"), 10, "running")
                await wait_until(lambda: _top(app, "B", "Running"), 10, "running")
                await app.host.orders.trigger(S, "A", "Abort")
                await app.host.orders.trigger(S, "B", "Stop")
                await wait_until(lambda: _status(app, "A", "aborted"), 10, "aborted")
                await wait_until(lambda: _status(app, "B", "stopped"), 10, "stopped")
                for c in list(st.commands):
                    await st.reply(c, {})             # answers after the end
                await asyncio.sleep(0.3)
                assert len(st.commands) == 2
        finally:
            await app.aclose()
    run(main())


async def _top(app: App, job: str, top: str) -> bool:
    s = await order_state(app, job)
    return bool(s) and s.split("_")[0] == top
