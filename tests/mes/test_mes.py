"""MES job control over MQTT end to end, on the wire of the Python original: real
redis-server and mosquitto; the MES is a separate aiomqtt client that sends the
reference's own messages (tests/data/mes_wire) and reads only reference-shaped ones,
and a station (tests/helpers/mqtt_station.py) answers the equipment commands."""

from __future__ import annotations

import asyncio
import copy
import json
import uuid
from typing import Any

from helpers.aio import run
from helpers.hosts import wait_until
from helpers.mes import (
    BY_ID,
    BY_STATE,
    CFG,
    JC,
    STATUS,
    WM,
    Mes,
    S,
    answer_all,
    configure,
    no_tighten_answer,
    order,
    ref,
    same_shape,
    start_app,
    state,
)
from helpers.mqtt_station import MqttStation
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from sfc_host.isa95 import state_list, state_name
from sfc_host.service.app import App
from sfc_host.store.orders import (
    INVALID_JOB_ORDER_STATUS,
    INVALID_REQUEST,
    NO_ERROR,
    UNABLE_TO_ACCEPT_JOB_ORDER,
    UNKNOWN_JOB_ORDER_ID,
)


async def _is(app: App, job: str, s: str) -> bool:
    return await state(app, job) == s


def the_reference_store() -> dict[str, Any]:
    """Store.request.json as the original's MES sends it, naming our test Work Master
    (the reference's recipe needs a station of its own)."""
    return ref("Store.request.json")


def test_reference_messages_in_and_reference_shapes_out(redis_url: str, mqtt_url: str) -> None:
    """Every method of the reference, sent as the original's MES sends it (prefix
    app/jobs): each reply, status event and retained message has the reference's
    structure and field names; the stored order is given back byte for byte."""
    async def main() -> None:
        app = await start_app(redis_url, mqtt_url, mes_prefix="app/jobs",
                              mes_message_expiry_s=10)
        try:
            async with Mes(mqtt_url, prefix="app/jobs") as mes, \
                    MqttStation(mqtt_url, no_tighten_answer) as st:
                meta = await wait_until(lambda: mes.retained.get("app/jobs/metadata"), 5,
                                        "metadata")
                assert json.loads(meta) == ref("metadata.retained.json")
                await configure(mes)
                store = the_reference_store()
                sent = store["JobOrder"]
                rep = await mes.call(JC + "Store.v2", store)
                assert rep["data"] == ref("Store.reply.json")
                assert rep["_content_type"] == "application/json; charset=utf-8"
                assert rep["_pfi"] == 1 and rep["subject"] == S
                assert rep["dataschema"].endswith("#/$defs/StoreResponse")
                ev = await wait_until(lambda: mes.events and mes.events[-1], 5, "event")
                want = ref("ISA95JobOrderStatusEventType.event.json")
                assert ev["data"] == want        # the order as sent, the state as theirs
                assert ev["type"] == STATUS and ev["_topic"] == f"app/jobs/{S}/events"
                assert ev["correlationid"] == rep["correlationid"]
                assert ev["causationid"] == rep["causationid"]
                o = await wait_until(lambda: mes.retained_json("order/J-1001"), 5, "order")
                assert o == ref("order.retained.json")
                assert o["JobOrder"] == sent

                # every other method with the reference's own request, event shapes
                # (RevokeStart races with the host, which runs the job at once)
                for method in ("Update", "Start", "RevokeStart", "Start"):
                    before = len(mes.events)
                    rep = await mes.call(JC + method + ".v2", ref(f"{method}.request.json"))
                    if method == "RevokeStart" and rep["data"]["ReturnStatus"] != NO_ERROR:
                        assert rep["data"]["ReturnStatus"] == INVALID_JOB_ORDER_STATUS
                        break
                    assert rep["data"] == ref(f"{method}.reply.json"), method
                    ev = await wait_until(lambda b=before: len(mes.events) > b
                                          and mes.events[-1], 5, f"{method} event")
                    same_shape(ref(f"ISA95JobOrderStatusEventType-{method}.event.json"),
                               ev["data"])
                    if method == "Update":
                        assert ev["data"]["JobOrder"] == ref("Update.request.json")["JobOrder"]
                        assert ev["data"]["JobState"] == state_list("NotAllowedToStart_Ready")
                await wait_until(lambda: _is(app, "J-1001", "Running"), 10, "running")
                await wait_until(lambda: any(c["id"].startswith("J-1001:tighten")
                                             for c in st.commands), 10, "tightening")
                for method, after in (("Pause", "Interrupted_Suspended"),
                                      ("Resume", "Running"), ("Stop", "Ended_Completed")):
                    rep = await mes.call(JC + method + ".v2", ref(f"{method}.request.json"))
                    assert rep["data"] == ref(f"{method}.reply.json"), method
                    assert await state(app, "J-1001") == after
                    ev = await wait_until(lambda a=after: mes.events[-1]["data"]["JobState"]
                                          == state_list(a) and mes.events[-1], 5, method)
                    same_shape(ref(f"ISA95JobOrderStatusEventType-{method}.event.json"),
                               ev["data"])
                # the stopped job wrote its response: retained result, by id, by state
                res = await wait_until(lambda: mes.retained_json("result/J-1001"), 10, "result")
                same_shape(ref("result.retained.json"), res)
                assert res["JobState"] == state_list("Ended_Completed")
                assert res["EquipmentActuals"] == [{"ID": "STATION-10", "Quantity": "1"}]
                rep = await mes.call(BY_ID, ref("RequestJobResponseByJobOrderID.request.json"))
                same_shape(ref("RequestJobResponseByJobOrderID.reply.json"), rep["data"])
                assert rep["data"]["JobResponse"] == res
                rep = await mes.call(BY_STATE,
                                     ref("RequestJobResponseByJobOrderState.request.json"))
                same_shape(ref("RequestJobResponseByJobOrderState.reply.json"), rep["data"])
                assert [r["JobOrderID"] for r in rep["data"]["JobResponses"]] == ["J-1001"]
                rep = await mes.call(BY_STATE,
                                     ref("RequestJobResponseByJobOrderState-none.request.json"))
                assert rep["data"] == ref("RequestJobResponseByJobOrderState-none.reply.json")

                # a stored order without response, an aborted one, then the index
                for job, method in (("J-1002", "StoreAndStart"), ("J-1004", "Store")):
                    req = copy.deepcopy(ref(f"{method}.request.json"))
                    req["JobOrder"]["JobOrderID"] = job
                    assert (await mes.call(JC + method + ".v2", req))["data"]["ReturnStatus"] \
                        == NO_ERROR
                rep = await mes.call(BY_ID, {"JobOrderID": "J-1004"})
                # a refusal says why in one line beside the original's status (our addition)
                assert rep["data"].pop("Message")
                assert rep["data"] == ref("RequestJobResponseByJobOrderID-none.reply.json")
                await wait_until(lambda: _is(app, "J-1002", "Running"), 10, "J-1002 runs")
                req = dict(ref("Abort.request.json"), JobOrderID="J-1002")
                assert (await mes.call(JC + "Abort.v2", req))["data"] == ref("Abort.reply.json")
                assert (await app.host.orders.get(S, "J-1002"))["reason"] == \
                    req["Comment"][0]["Text"]
                ev = mes.events[-1]
                same_shape(ref("ISA95JobOrderStatusEventType-Abort.event.json"), ev["data"])
                await wait_until(lambda: mes.retained_json("result/J-1002"), 10, "aborted")
                idx = await wait_until(
                    lambda: mes.index().get("J-1002") == "Aborted" and len(mes.index()) == 3
                    and mes.retained_json("state-index"), 5, "index")
                same_shape(ref("state-index.retained.json"), idx)
                assert idx["scope"] == S and idx["published_at"].endswith("+00:00")
                assert {j["job_order_id"]: j["has_result"] for j in idx["jobs"]} == {
                    "J-1001": True, "J-1002": True, "J-1004": False}

                # Cancel and Clear: the reference's requests; Clear deletes order/result
                req = dict(ref("Cancel.request.json"), JobOrderID="J-1004")
                assert (await mes.call(JC + "Cancel.v2", req))["data"] == ref("Cancel.reply.json")
                same_shape(ref("ISA95JobOrderStatusEventType-Cancel.event.json"),
                           mes.events[-1]["data"])
                rep = await mes.call(JC + "Clear.v2", ref("Clear.request.json"))
                assert rep["data"] == ref("Clear.reply.json")
                same_shape(ref("ISA95JobOrderStatusEventType-Clear.event.json"),
                           mes.events[-1]["data"])
                for t in ("order", "result"):
                    await wait_until(lambda t=t: mes.retained.get(f"app/jobs/{S}/{t}/J-1001")
                                     == b"", 5, f"{t} deleted")
                await wait_until(lambda: set(mes.index()) == {"J-1002"}, 5, "index after")
        finally:
            await app.aclose()
    run(main(), 60)


def test_methods_in_their_states(redis_url: str, mqtt_url: str) -> None:
    async def main() -> None:
        app = await start_app(redis_url, mqtt_url, max_job_orders=4)
        try:
            async with Mes(mqtt_url) as mes, MqttStation(mqtt_url, no_tighten_answer) as st:
                # Store, repeated Store, Update, RevokeStart, Cancel of a stored order
                assert await mes.status("Store", order("S1")) == NO_ERROR
                # the same order again (a lost reply): success, nothing changes; another
                # order under a live id is refused (the original would overwrite it)
                assert await mes.status("Store", order("S1")) == NO_ERROR
                assert mes.states("S1") == ["NotAllowedToStart_Ready"]
                assert await mes.status("Store", order("S1", Priority=5)) == \
                    UNABLE_TO_ACCEPT_JOB_ORDER
                upd = {"JobOrder": {"JobOrderID": "S1",
                                    "WorkMasterID": [{"ID": "wm"}], "Priority": 9}}
                assert await mes.status("Update", upd) == NO_ERROR
                stored = json.loads((await app.host.orders.get(S, "S1"))["order"])
                assert stored == upd["JobOrder"]     # the whole order is replaced
                assert await mes.status("RevokeStart", {"JobOrderID": "S1"}) == \
                    INVALID_JOB_ORDER_STATUS
                assert await mes.status("Pause", {"JobOrderID": "S1"}) == \
                    INVALID_JOB_ORDER_STATUS
                assert await mes.status("Cancel", {"JobOrderID": "S1"}) == NO_ERROR
                assert await state(app, "S1") == "EndState"
                assert await mes.status("Start", {"JobOrderID": "S1"}) == UNKNOWN_JOB_ORDER_ID
                assert await mes.status("Start", {"JobOrderID": "nope"}) == \
                    UNKNOWN_JOB_ORDER_ID

                # Start then RevokeStart before it runs is a race with the host: only
                # check that the answer is one of the two documented ones
                assert await mes.status("Store", order("R1")) == NO_ERROR
                assert await mes.status("Start", {"JobOrderID": "R1"}) == NO_ERROR
                assert await mes.status("RevokeStart", {"JobOrderID": "R1"}) in (
                    NO_ERROR, INVALID_JOB_ORDER_STATUS)

                # Pause / Resume / Pause of a running job: Interrupted, the recipe held
                assert await mes.status("StoreAndStart", order("P1")) == NO_ERROR
                await wait_until(lambda: any(c["id"].startswith("P1:tighten") for c in
                                             st.commands), 10, "P1 tightening")
                assert await state(app, "P1") == "Running"
                for m in ("Pause", "Resume", "Pause"):
                    assert await mes.status(m, {"JobOrderID": "P1"}) == NO_ERROR
                assert (await state(app, "P1") or "").startswith("Interrupted")
                await wait_until(lambda: _held(app, "P1"), 5, "recipe held")
                await wait_until(lambda: state_name(mes.retained_json("order/P1")["State"])
                                 .startswith("Interrupted"), 5, "retained Interrupted")

                # the limit counts live orders only: R1, P1 live, then A1, T1 -> 4
                assert await mes.status("StoreAndStart", order("A1")) == NO_ERROR
                assert await mes.status("StoreAndStart", order("T1")) == NO_ERROR
                assert await mes.status("Store", order("X1")) == UNABLE_TO_ACCEPT_JOB_ORDER
                assert await mes.status("Store", order("X2", "no-such-wm")) == \
                    UNABLE_TO_ACCEPT_JOB_ORDER

                # Abort and Stop of running jobs
                for job in ("A1", "T1"):
                    await wait_until(lambda j=job: _is(app, j, "Running"), 10, f"{job} runs")
                assert await mes.status("Abort", {"JobOrderID": "A1", "Comment": [
                    {"Locale": "de", "Text": "Teil defekt"},
                    {"Locale": "en", "Text": "bad part"}]}) == NO_ERROR
                assert await mes.status("Stop", {"JobOrderID": "T1"}) == NO_ERROR
                assert await state(app, "A1") == "Aborted"
                assert (await state(app, "T1") or "").startswith("Ended")
                await wait_until(lambda: _not_running(app, "A1"), 5, "A1 cancelled")
                assert (await app.host.orders.get(S, "A1"))["reason"] == "bad part"
                assert await mes.status("Resume", {"JobOrderID": "A1"}) == \
                    INVALID_JOB_ORDER_STATUS
                # ended orders no longer count: X1 is accepted now
                assert await mes.status("Store", order("X1")) == NO_ERROR
                # a per-scope maximum (config.jobacceptance) overrides the setting
                rep = await mes.call(CFG + "jobacceptance.v1", ref("jobacceptance.config.json"))
                assert rep["data"]["ReturnStatus"] == NO_ERROR
                assert await mes.status("Store", order("X3")) == NO_ERROR
        finally:
            await app.aclose()
    run(main())


async def _held(app: App, job: str) -> bool:
    view = await app.host.inspect(S, job)
    return bool(view and view["status"] == "held")


async def _not_running(app: App, job: str) -> bool:
    view = await app.host.inspect(S, job)
    return bool(view and view["status"] not in ("running", "held"))


def test_config_messages_and_acceptance_checks(redis_url: str, mqtt_url: str) -> None:
    async def main() -> None:
        app = await start_app(redis_url, mqtt_url)
        try:
            async with Mes(mqtt_url) as mes:
                base = {"JobOrderID": "E1", "WorkMasterID": [{"ID": "wm"}]}
                needs = {"EquipmentRequirements": [{"ID": "STATION-10"}],
                         "MaterialRequirements": [{"MaterialClassID": "AXLE",
                                                   "MaterialDefinitionID": "AXLE-FRONT-V2"}],
                         "PersonnelRequirements": [{"ID": "OPERATOR-L1"}],
                         "PhysicalAssetRequirements": [{"ID": "NUTRUNNER-SN-4711"}]}
                for key, value in needs.items():
                    rep = await mes.call(JC + "Store.v2", {"JobOrder": {**base, key: value}})
                    assert rep["data"]["ReturnStatus"] == UNABLE_TO_ACCEPT_JOB_ORDER, key
                    assert "not configured" in rep["data"]["Message"]
                await configure(mes)
                assert await mes.status("Store", {"JobOrder": {**base, **needs}}) == NO_ERROR
                # DELETE removes an id again; stored in Redis (a restart keeps it)
                rep = await mes.call(CFG + "equipment.v1", ref("equipment.config.json"),
                                     method="DELETE")
                assert rep["data"]["ReturnStatus"] == NO_ERROR
                k = app.host.store.keys(S)
                assert not await app.host.client.sismember(k.catalog("equipment"), "STATION-10")
                assert await app.host.client.sismember(k.catalog("personnel"), "OPERATOR-L1")
                upd = {"JobOrder": {**base, **needs, "Priority": 2}}
                assert await mes.status("Update", upd) == UNABLE_TO_ACCEPT_JOB_ORDER
                # a Work Master DELETE, and a Work Master that cannot run
                rep = await mes.call(WM, {"ID": "wm"}, method="DELETE")
                assert rep["data"]["ReturnStatus"] == NO_ERROR
                assert await app.host.store.work_master(S, "wm") is None
                assert await mes.status("Store", order("W2")) == UNABLE_TO_ACCEPT_JOB_ORDER
                rep = await mes.call(WM, {"ID": "broken", "data": {"Steps": []},
                                          "dataschema": "1.1.0"})
                assert rep["data"]["ReturnStatus"] == INVALID_REQUEST
                assert await app.host.store.work_master(S, "broken") is None
                rep = await mes.call(CFG + "jobacceptance.v1", {})
                assert rep["data"]["ReturnStatus"] == INVALID_REQUEST
        finally:
            await app.aclose()
    run(main())


def test_the_first_listed_known_work_master_runs(redis_url: str, mqtt_url: str) -> None:
    """With the Work Master check off an order may list ones the scope does not know;
    the first one it knows runs, with that entry's Parameters as job parameters."""
    async def main() -> None:
        app = await start_app(redis_url, mqtt_url,
                              mes_acceptance=["equipment", "max_job_orders"])
        try:
            async with Mes(mqtt_url) as mes, MqttStation(mqtt_url, answer_all):
                o = {"JobOrderID": "K1", "WorkMasterID": [
                    {"ID": "elsewhere"}, {"ID": "wm", "Parameters": [{"ID": "p", "Value": 4}]}],
                    "JobOrderParameters": [{"ID": "lot", "Value": "L-1"}]}
                assert await mes.status("StoreAndStart", {"JobOrder": o}) == NO_ERROR
                assert (await app.host.orders.get(S, "K1"))["wm"] == "wm"
                await wait_until(lambda: _is(app, "K1", "Ended_Completed"), 15, "K1 done")
                # none known: accepted, and the start aborts it with the reason
                o = {"JobOrderID": "K2", "WorkMasterID": [{"ID": "elsewhere"}]}
                assert await mes.status("StoreAndStart", {"JobOrder": o}) == NO_ERROR
                await wait_until(lambda: _is(app, "K2", "Aborted"), 10, "K2 aborted")
                assert "no Work Master" in (await app.host.orders.get(S, "K2"))["reason"]
        finally:
            await app.aclose()
    run(main())


def test_bad_requests_get_a_status_and_a_line(redis_url: str, mqtt_url: str) -> None:
    async def main() -> None:
        app = await start_app(redis_url, mqtt_url, mqtt_max_payload=1 << 20)
        try:
            async with Mes(mqtt_url) as mes:
                assert await mes.status("Store", order("W1")) == NO_ERROR
                k = app.host.store.keys(S)
                before = await app.host.client.hgetall(k.order("W1"))
                st = [{"StateText": {"Locale": "en", "Text": "Ended"}, "StateNumber": 9}]
                cases = (
                    (JC + "Fly.v2", {"JobOrderID": "W1"}, INVALID_REQUEST),
                    (JC + "Start.v2", {"JobOrderID": 7}, INVALID_REQUEST),
                    (JC + "Start.v2", [1, 2], INVALID_REQUEST),
                    (JC + "Start.v2", {}, INVALID_REQUEST),
                    (JC + "Store.v2", {}, INVALID_REQUEST),
                    (JC + "Store.v2", {"JobOrder": "W3"}, INVALID_REQUEST),
                    (JC + "Store.v2", {"JobOrder": {"Priority": 1}}, UNABLE_TO_ACCEPT_JOB_ORDER),
                    (JC + "Store.v2", {"JobOrder": {"JobOrderID": "W4", "WorkMasterID": "wm"}},
                     INVALID_REQUEST),
                    (JC + "Pause.v2", {"JobOrderID": "W1", "Comment": "break"},
                     INVALID_REQUEST),
                    (JC + "Update.v2", {"JobOrder": {"Priority": 1}}, INVALID_REQUEST),
                    (BY_STATE, {}, INVALID_REQUEST),
                    (BY_STATE, {"JobOrderState": []}, INVALID_REQUEST),
                    (BY_STATE, {"JobOrderState": st}, INVALID_REQUEST),
                    (BY_ID, {}, INVALID_REQUEST),
                )
                for type_, data, status in cases:
                    rep = await mes.call(type_, data)
                    assert rep["data"]["ReturnStatus"] == status, (type_, data)
                    assert rep["data"]["Message"] and "\n" not in rep["data"]["Message"]
                # MessagePack where the original takes it; garbage is a status, not a crash
                assert mes.client is not None
                import msgspec
                for payload, status in ((msgspec.msgpack.encode({"JobOrderID": "W1"}), 8),
                                        (b"\xc1\xc1garbage", INVALID_REQUEST)):
                    p = Properties(PacketTypes.PUBLISH)
                    p.ResponseTopic, p.ContentType = mes.inbox, "application/msgpack"
                    rid = str(uuid.uuid4())
                    p.UserProperty = [("specversion", "1.0"), ("id", rid), ("source", "m"),
                                      ("type", JC + "Pause.v2"), ("subject", S)]
                    await mes.client.publish(mes.topic(), payload, qos=1, properties=p)
                    rep = await wait_until(lambda r=rid: mes.replies.get(r), 5, "msgpack")
                    assert rep["data"]["ReturnStatus"] == status
                # no subject: the scope comes from the topic; none at all: the original's
                # statuses for a request it cannot file
                rep = await mes.call(JC + "Cancel.v2", {"JobOrderID": "nope"}, subject=None)
                assert rep["data"]["ReturnStatus"] == UNKNOWN_JOB_ORDER_ID
                await mes.client.subscribe("mes/commands", qos=1)
                rid = str(uuid.uuid4())
                p = Properties(PacketTypes.PUBLISH)
                p.ResponseTopic, p.ContentType = mes.inbox, "application/json"
                p.UserProperty = [("specversion", "1.0"), ("id", rid), ("source", "m"),
                                  ("type", JC + "Store.v2")]
                await mes.client.publish("mes/commands", json.dumps(order("Z9")), qos=1,
                                         properties=p)
                rep = await wait_until(lambda: mes.replies.get(rid), 5, "no scope")
                assert rep["data"]["ReturnStatus"] == UNABLE_TO_ACCEPT_JOB_ORDER
                # 1 MB of payload and not answerable ones: counted, the host keeps serving
                bad = app.metrics["bad_mes_requests"]
                big = order("BIG", Description=[{"Locale": "en", "Text": "x" * (1 << 20)}])
                await mes.send(JC + "Store.v2", big)
                for payload in (b"{not json", b"[]", b'{"specversion": "0.3"}'):
                    await mes.client.publish(f"mes/{S}/commands", payload, qos=1)
                await wait_until(lambda: app.metrics["bad_mes_requests"] >= bad + 4, 5,
                                 "bad requests counted")
                # nothing stored changed
                assert await app.host.client.hgetall(k.order("W1")) == before
                assert await app.host.orders.get(S, "W4") is None
                assert await app.host.orders.get(S, "BIG") is None
                assert await mes.status("Cancel", {"JobOrderID": "W1"}) == NO_ERROR
        finally:
            await app.aclose()
    run(main(), 30)


def test_a_repeated_request_id_is_answered_again_not_run_again(redis_url: str,
                                                               mqtt_url: str) -> None:
    """The original drops a repeat of a request id within 10 minutes; we send the first
    reply again. The id is recorded only after the request ran: a request that failed
    half-way runs when it is delivered again."""
    async def main() -> None:
        app = await start_app(redis_url, mqtt_url)
        try:
            async with Mes(mqtt_url) as mes:
                rid = await mes.send(JC + "Store.v2", order("D1"))
                first = await wait_until(lambda: mes.replies.get(rid), 5, "first")
                assert first["data"]["ReturnStatus"] == NO_ERROR
                mes.replies.clear()
                await mes.send(JC + "Cancel.v2", {"JobOrderID": "D1"}, rid=rid)
                again = await wait_until(lambda: mes.replies.get(rid), 5, "again")
                assert again["data"] == first["data"]
                assert await state(app, "D1") == "NotAllowedToStart_Ready"
                assert app.metrics["mes_duplicates"] == 1
                # a request that fails inside the host is not recorded
                real = app.mes.handle
                calls = 0

                async def failing(*a: Any) -> Any:
                    nonlocal calls
                    calls += 1
                    if calls == 1:
                        raise ConnectionError("Redis went away")
                    return await real(*a)
                app.mes.handle = failing   # type: ignore[method-assign]
                rid2 = str(uuid.uuid4())
                await mes.send(JC + "Start.v2", {"JobOrderID": "D1"}, rid=rid2)
                await wait_until(lambda: calls == 1, 5, "first delivery")
                await asyncio.sleep(0.2)
                assert rid2 not in mes.replies
                await mes.send(JC + "Start.v2", {"JobOrderID": "D1"}, rid=rid2)
                rep = await wait_until(lambda: mes.replies.get(rid2), 5, "redelivery")
                assert rep["data"]["ReturnStatus"] == NO_ERROR
                assert await state(app, "D1") in ("AllowedToStart_Ready", "Running")
        finally:
            await app.aclose()
    run(main())


def test_structured_mode_on_mqtt_311(redis_url: str, mqtt_url: str) -> None:
    async def main() -> None:
        app = await start_app(redis_url, mqtt_url, mqtt_version=3)
        try:
            async with Mes(mqtt_url, structured=True) as mes:
                rep = await mes.call(JC + "Store.v2", order("M1"), inbox=False)
                assert rep["specversion"] == "1.0" and rep["subject"] == S
                assert rep["data"]["ReturnStatus"] == NO_ERROR
                await wait_until(lambda: mes.retained_json("order/M1"), 5, "order")
                assert mes.events and mes.events[-1]["type"] == STATUS
                assert mes.states("M1") == ["NotAllowedToStart_Ready"]
                rep = await mes.call(BY_STATE, {"JobOrderState": state_list(
                    "NotAllowedToStart_Ready")}, inbox=False)
                assert [r["JobOrderID"] for r in rep["data"]["JobResponses"]] == ["M1"]
                assert rep["data"]["JobResponses"][0]["JobState"] == state_list(
                    "NotAllowedToStart_Ready")
                rep = await mes.call(JC + "Cancel.v2", {"JobOrderID": "M1"}, inbox=False)
                assert rep["data"]["ReturnStatus"] == NO_ERROR
                assert mes.states("M1")[-1] == "EndState"
                await wait_until(lambda: state_name(mes.retained_json("order/M1")["State"])
                                 == "EndState", 5, "order EndState")
        finally:
            await app.aclose()
    run(main())


def test_structured_replies_on_mqtt_5_when_binary_is_off(redis_url: str, mqtt_url: str) -> None:
    async def main() -> None:
        app = await start_app(redis_url, mqtt_url, mqtt_binary=False)
        try:
            async with Mes(mqtt_url) as mes:
                rid = await mes.send(JC + "Store.v2", order("B1"))
                rep = await wait_until(lambda: mes.replies.get(rid), 10, "reply")
                # structured: the attributes came in the JSON body, and the MQTT 5
                # correlation data still comes back
                assert rep["specversion"] == "1.0" and rep["data"]["ReturnStatus"] == NO_ERROR
                assert rep["CorrelationData"] == uuid.UUID(rep["correlationid"]).bytes
                assert rep["_content_type"] == "application/cloudevents+json"
        finally:
            await app.aclose()
    run(main())
