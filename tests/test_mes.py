"""MES job control over MQTT end to end: real redis-server and mosquitto; the MES is a
separate aiomqtt client that writes its requests by hand (binary or structured
CloudEvents), and a station (tests/mqtt_station.py) answers the equipment commands."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from typing import Any
from urllib.parse import urlparse

import aiomqtt
from hosts import flush, quick_config, wait_until, work_master
from mqtt_station import MqttStation
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from sfc_host.app import App
from sfc_host.orders import (
    INVALID_JOB_ORDER_STATUS,
    INVALID_REQUEST,
    NO_ERROR,
    UNABLE_TO_ACCEPT_JOB_ORDER,
    UNKNOWN_JOB_ORDER_ID,
)

S = "line1"
JC = "org.opcfoundation.ISA95-JOBCONTROL_V2."
BY_ID = "org.opcfoundation.Machinery.Jobs.RequestJobResponseByJobOrderID.v1"
BY_STATE = "org.opcfoundation.Machinery.Jobs.RequestJobResponseByJobOrderState.v1"
WM = "com.github.aschamberger.ISA95-JOBCONTROL_V2.config.workmaster.v1"
STATUS = JC + "ISA95JobOrderStatusEventType.v2"


def run(coro: Any, timeout: float = 40) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def start_app(redis_url: str, mqtt_url: str, **kw: Any) -> App:
    await flush(redis_url)
    app = App(quick_config(redis_url, mqtt_url=mqtt_url, **kw))
    await app.host.store.put_work_master(S, work_master("tighten_rework", "wm"))
    await app.host.add_scope(S)
    await app.start()
    return app


def _event(msg: aiomqtt.Message) -> dict[str, Any]:
    """A received CloudEvent as a flat dict (attributes + data), either mode."""
    p = msg.properties
    payload = bytes(msg.payload) if isinstance(msg.payload, (bytes, bytearray)) else b""
    ct = getattr(p, "ContentType", "") if p is not None else ""
    user = dict(getattr(p, "UserProperty", None) or []) if p is not None else {}
    if ct.startswith("application/cloudevents") or (not user and payload[:1] == b"{"):
        ev: dict[str, Any] = json.loads(payload)
    else:
        ev = dict(user)
        ev["data"] = json.loads(payload) if payload else None
    if p is not None and hasattr(p, "CorrelationData"):
        ev["CorrelationData"] = p.CorrelationData
    ev["_content_type"] = ct
    return ev


class Mes:
    """An MES client: requests by hand, sees replies, events and retained topics."""

    def __init__(self, url: str, *, structured: bool = False) -> None:
        u = urlparse(url)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 1883
        self.structured = structured
        self.inbox = f"mes-client/{uuid.uuid4().hex[:8]}/replies"
        self.replies: dict[str, dict[str, Any]] = {}     # causationid -> reply
        self.events: list[dict[str, Any]] = []
        self.retained: dict[str, bytes] = {}             # topic -> last payload
        self.client: aiomqtt.Client | None = None
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()

    async def __aenter__(self) -> Mes:
        self._task = asyncio.create_task(self._run())
        await asyncio.wait_for(self._ready.wait(), 10)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task

    async def _run(self) -> None:
        async with aiomqtt.Client(self.host, self.port,
                                  identifier=f"mes-{uuid.uuid4().hex[:8]}",
                                  protocol=aiomqtt.ProtocolVersion.V5) as c:
            self.client = c
            for f in (self.inbox, f"mes/{S}/replies", f"mes/{S}/events", f"mes/{S}/order/+",
                      f"mes/{S}/result/+", f"mes/{S}/state-index"):
                await c.subscribe(f, qos=1)
            self._ready.set()
            async for msg in c.messages:
                t = msg.topic.value
                if t.endswith("/replies"):
                    ev = _event(msg)
                    self.replies[ev["causationid"]] = ev
                elif t.endswith("/events"):
                    self.events.append(_event(msg))
                else:
                    p = msg.payload
                    self.retained[t] = bytes(p) if isinstance(p, (bytes, bytearray)) else b""

    async def send(self, type_: str, data: Any, *, inbox: bool = True, **attrs: Any) -> str:
        assert self.client is not None
        rid = uuid.uuid4().hex
        p = Properties(PacketTypes.PUBLISH)
        if inbox:
            p.ResponseTopic = self.inbox
            p.CorrelationData = rid.encode()
        attrs = {"correlationid": f"c-{rid}", **attrs}
        if self.structured:
            p.ContentType = "application/cloudevents+json"
            ev = {"specversion": "1.0", "id": rid, "source": "mes", "type": type_,
                  "datacontenttype": "application/json", "data": data, **attrs}
            await self.client.publish(f"mes/{S}/commands", json.dumps(ev), qos=1,
                                      properties=p)
        else:
            p.ContentType = "application/json"
            p.UserProperty = [("specversion", "1.0"), ("id", rid), ("source", "mes"),
                              ("type", type_), *attrs.items()]
            await self.client.publish(f"mes/{S}/commands", json.dumps(data), qos=1,
                                      properties=p)
        return rid

    async def call(self, type_: str, data: Any, **kw: Any) -> dict[str, Any]:
        """Send a request; its reply (checked for type, correlation and causation)."""
        rid = await self.send(type_, data, **kw)
        rep: dict[str, Any] = await wait_until(lambda: self.replies.get(rid), 10, f"reply {type_}")
        assert rep["type"] == type_ and rep["causationid"] == rid
        assert rep["correlationid"] == f"c-{rid}"
        return rep

    async def status(self, method: str, data: Any, **kw: Any) -> int:
        rep = await self.call(JC + method + ".v2", data, **kw)
        return int(rep["data"]["ReturnStatus"])

    def retained_json(self, topic: str) -> Any:
        raw = self.retained.get(f"mes/{S}/{topic}")
        return json.loads(raw) if raw else None

    def states(self, job: str) -> list[str]:
        return [e["data"]["JobState"] for e in self.events if e["data"]["JobOrderID"] == job]


def order(job: str, wm: str = "wm") -> dict[str, Any]:
    return {"JobOrder": {"ID": job, "WorkMasterID": wm, "Priority": 1}, "Comment": "test"}


def answer_all(cmd: dict[str, Any]) -> dict[str, Any]:
    if cmd["type"] == "com.example.cell.tighten.v1":
        return {"Outcome": "completed", "Result": {"torque": 85}}
    return {}


def no_tighten_answer(cmd: dict[str, Any]) -> dict[str, Any] | None:
    # the job stays Running (waiting for the tightening) while the MES acts on it
    return None if cmd["type"] == "com.example.cell.tighten.v1" else {}


async def state(app: App, job: str) -> str | None:
    o = await app.host.orders.get(S, job)
    return o["state"] if o else None


def test_store_start_complete_and_retained_topics(redis_url: str, mqtt_url: str) -> None:
    async def main() -> None:
        app = await start_app(redis_url, mqtt_url)
        try:
            async with Mes(mqtt_url) as mes, MqttStation(mqtt_url, answer_all):
                assert await mes.status("Store", order("J1")) == NO_ERROR
                assert await state(app, "J1") == "NotAllowedToStart_Ready"
                rep = await mes.call(JC + "Start.v2", {"JobOrderID": "J1", "Comment": "go"})
                assert rep["data"]["ReturnStatus"] == NO_ERROR
                assert rep["CorrelationData"] == rep["causationid"].encode()
                await wait_until(lambda: mes.retained_json("result/J1"), 15, "result")
                assert await state(app, "J1") == "Ended_Completed"
                assert mes.states("J1")[0] == "NotAllowedToStart_Ready"
                assert mes.states("J1")[-1] == "Ended_Completed"
                assert "Running" in mes.states("J1")
                ev = mes.events[-1]
                assert ev["type"] == STATUS and ev["data"]["PreviousJobState"] == "Running"
                o = mes.retained_json("order/J1")
                assert o["JobState"] == "Ended_Completed" and o["JobOrder"]["Priority"] == 1
                resp = mes.retained_json("result/J1")
                assert {"ID": "tighten.torque", "Value": 85} in resp["JobResponseData"]
                idx = await wait_until(
                    lambda: (i := mes.retained_json("state-index"))
                    and i["States"].get("J1") == "Ended_Completed" and i, 5, "index")
                assert idx["Seq"] == len(mes.states("J1"))

                # the job response by id, and by state (top state matches)
                rep = await mes.call(BY_ID, {"JobOrderID": "J1"})
                assert rep["data"]["ReturnStatus"] == NO_ERROR
                assert rep["data"]["JobState"] == "Ended_Completed"
                assert rep["data"]["JobResponse"]["JobResponseData"] == resp["JobResponseData"]
                rep = await mes.call(BY_STATE, {"JobOrderState": "Ended"})
                assert [r["JobOrderID"] for r in rep["data"]["JobResponses"]] == ["J1"]
                rep = await mes.call(BY_STATE, {"JobOrderState": "Running"})
                assert rep["data"]["JobResponses"] == []

                # Clear deletes the retained order and result, and the index entry
                assert await mes.status("Clear", {"JobOrderID": "J1"}) == NO_ERROR
                await wait_until(lambda: mes.retained.get(f"mes/{S}/order/J1") == b"", 5,
                                 "order deleted")
                await wait_until(lambda: mes.retained.get(f"mes/{S}/result/J1") == b"", 5,
                                 "result deleted")
                await wait_until(lambda: "J1" not in mes.retained_json("state-index")["States"],
                                 5, "index entry dropped")
                rep = await mes.call(BY_ID, {"JobOrderID": "J1"})
                assert rep["data"]["ReturnStatus"] == UNKNOWN_JOB_ORDER_ID
                # a cleared id may be stored again
                assert await mes.status("StoreAndStart", order("J1")) == NO_ERROR
                await wait_until(lambda: _is(app, "J1", "Ended_Completed"), 15, "again")
        finally:
            await app.aclose()
    run(main())


async def _is(app: App, job: str, s: str) -> bool:
    return await state(app, job) == s


def test_methods_in_their_states(redis_url: str, mqtt_url: str) -> None:
    async def main() -> None:
        app = await start_app(redis_url, mqtt_url, max_job_orders=4)
        try:
            async with Mes(mqtt_url) as mes, MqttStation(mqtt_url, no_tighten_answer) as st:
                # Store, Update, RevokeStart, Cancel of a stored order
                assert await mes.status("Store", order("S1")) == NO_ERROR
                assert await mes.status("Store", order("S1")) == INVALID_JOB_ORDER_STATUS
                upd = {"JobOrder": {"ID": "S1", "WorkMasterID": "wm", "Priority": 9}}
                assert await mes.status("Update", upd) == NO_ERROR
                stored = json.loads((await app.host.orders.get(S, "S1"))["order"])
                assert stored["Priority"] == 9
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
                assert mes.retained_json("order/P1") is not None
                await wait_until(lambda: mes.retained_json("order/P1")["JobState"]
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
                assert await mes.status("Abort", {"JobOrderID": "A1", "Comment": "bad part"}) \
                    == NO_ERROR
                assert await mes.status("Stop", {"JobOrderID": "T1"}) == NO_ERROR
                assert await state(app, "A1") == "Aborted"
                assert (await state(app, "T1") or "").startswith("Ended")
                await wait_until(lambda: _not_running(app, "A1"), 5, "A1 cancelled")
                assert (await app.host.orders.get(S, "A1"))["reason"] == "bad part"
                assert await mes.status("Resume", {"JobOrderID": "A1"}) == \
                    INVALID_JOB_ORDER_STATUS
                # ended orders no longer count: X1 is accepted now
                assert await mes.status("Store", order("X1")) == NO_ERROR
        finally:
            await app.aclose()
    run(main())


async def _held(app: App, job: str) -> bool:
    view = await app.host.inspect(S, job)
    return bool(view and view["status"] == "held")


async def _not_running(app: App, job: str) -> bool:
    view = await app.host.inspect(S, job)
    return bool(view and view["status"] not in ("running", "held"))


def test_work_masters_and_bad_requests(redis_url: str, mqtt_url: str) -> None:
    async def main() -> None:
        app = await start_app(redis_url, mqtt_url, mqtt_max_payload=4096)
        try:
            async with Mes(mqtt_url) as mes:
                wm = work_master("tighten_rework", "wm2")
                wm["Description"] = "second"
                rep = await mes.call(WM, wm)
                assert rep["data"]["ReturnStatus"] == NO_ERROR
                assert json.loads(await app.host.store.work_master(S, "wm2"))["Description"] \
                    == "second"
                assert await mes.status("Store", order("W1", "wm2")) == NO_ERROR
                rep = await mes.call(WM, {"ID": "wm2"}, method="DELETE")
                assert rep["data"] == {"ReturnStatus": NO_ERROR, "ID": "wm2", "Deleted": True}
                assert await app.host.store.work_master(S, "wm2") is None
                assert await mes.status("Store", order("W2", "wm2")) == \
                    UNABLE_TO_ACCEPT_JOB_ORDER
                rep = await mes.call(WM, {"ID": "broken", "data": {"Steps": []},
                                          "dataschema": "1.1.0"})
                assert rep["data"]["ReturnStatus"] == INVALID_REQUEST
                assert await app.host.store.work_master(S, "broken") is None
                rep = await mes.call(WM, {"ID": "x"}, method="PATCH")
                assert rep["data"]["ReturnStatus"] == INVALID_REQUEST

                # answerable malformed requests: INVALID_REQUEST with a message
                for type_, data in ((JC + "Fly.v2", {"JobOrderID": "W1"}),
                                    (JC + "Start.v2", {"JobOrderID": 7}),
                                    (JC + "Start.v2", [1, 2]),
                                    (JC + "Store.v2", {"JobOrder": "W3"}),
                                    (JC + "Store.v2", {"JobOrder": {"ID": "W3"}}),
                                    (BY_STATE, {})):
                    rep = await mes.call(type_, data)
                    assert rep["data"]["ReturnStatus"] == INVALID_REQUEST, (type_, data)
                    assert rep["data"]["Message"]
                # a request without a response topic is answered on {mes}/{scope}/replies
                rep = await mes.call(JC + "Start.v2", {"JobOrderID": "zz"}, inbox=False)
                assert rep["data"]["ReturnStatus"] == UNKNOWN_JOB_ORDER_ID
                assert "CorrelationData" not in rep

                # a wrong scope in the topic: answered on the response topic
                p = Properties(PacketTypes.PUBLISH)
                p.ResponseTopic, p.ContentType = mes.inbox, "application/json"
                p.UserProperty = [("specversion", "1.0"), ("id", "ws1"), ("source", "mes"),
                                  ("type", JC + "Start.v2")]
                assert mes.client is not None
                await mes.client.publish("mes/bad{x}/commands", b'{"JobOrderID": "W1"}',
                                         qos=1, properties=p)
                rep = await wait_until(lambda: mes.replies.get("ws1"), 5, "wrong-scope reply")
                assert rep["data"]["ReturnStatus"] == INVALID_REQUEST

                # not answerable: counted, and the host keeps serving
                bad = app.metrics["bad_mes_requests"]
                assert mes.client is not None
                for payload in (b"{not json", b"[]", b'{"specversion": "0.3"}'):
                    await mes.client.publish(f"mes/{S}/commands", payload, qos=1)
                await mes.client.publish(f"mes/{S}/commands", b" " * 8192, qos=1)
                await wait_until(lambda: app.metrics["bad_mes_requests"] >= bad + 4, 5,
                                 "bad requests counted")
                assert await mes.status("Cancel", {"JobOrderID": "W1"}) == NO_ERROR
        finally:
            await app.aclose()
    run(main(), 30)


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
                rep = await mes.call(BY_STATE, {"JobOrderState": "NotAllowedToStart"},
                                     inbox=False)
                assert [r["JobOrderID"] for r in rep["data"]["JobResponses"]] == ["M1"]
                assert rep["data"]["JobResponses"][0]["JobResponse"] is None
                rep = await mes.call(JC + "Cancel.v2", {"JobOrderID": "M1"}, inbox=False)
                assert rep["data"]["ReturnStatus"] == NO_ERROR
                await wait_until(lambda: mes.retained.get(f"mes/{S}/order/M1") == b"", 5,
                                 "order deleted")
                assert mes.states("M1")[-1] == "EndState"
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
                assert rep["CorrelationData"] == rid.encode()
                assert rep["_content_type"] == "application/cloudevents+json"
        finally:
            await app.aclose()
    run(main())
