"""The MES of the Python original as tests use it: ``Mes``, an aiomqtt client that sends
the reference's own messages (tests/data/mes_wire) and reads only reference-shaped ones;
the job-control type names, the reference's requests, orders and config messages, the
station's answers, and an App started for one scope."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import uuid
from typing import Any
from urllib.parse import urlparse

import aiomqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from helpers.hosts import flush, quick_config, wait_until, work_master
from helpers.paths import DATA
from sfc_host.isa95 import state_name
from sfc_host.service.app import App
from sfc_host.store.orders import NO_ERROR

S = "line1"
JC = "org.opcfoundation.ISA95-JOBCONTROL_V2."
BY_ID = "org.opcfoundation.Machinery.Jobs.RequestJobResponseByJobOrderID.v1"
BY_STATE = "org.opcfoundation.Machinery.Jobs.RequestJobResponseByJobOrderState.v1"
CFG = "com.github.aschamberger.ISA95-JOBCONTROL_V2.config."
WM = CFG + "workmaster.v1"
STATUS = JC + "ISA95JobOrderStatusEventType.v2"
REF = DATA / "mes_wire"


def ref(name: str) -> Any:
    return json.loads((REF / name).read_bytes())


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
    ev["_pfi"] = getattr(p, "PayloadFormatIndicator", None) if p is not None else None
    ev["_topic"] = msg.topic.value
    return ev


class Mes:
    """An MES written for the original: requests by hand as its sender makes them
    (subject = scope, a UUID correlationid and the same 16 bytes as CorrelationData),
    sees replies, events and retained topics under ``prefix``. ``version=3``: an MQTT
    3.1.1 client, so structured, with no response topic (the host replies on
    ``{prefix}/{scope levels}/replies``)."""

    def __init__(self, url: str, *, structured: bool = False, prefix: str = "mes",
                 scope: str = S, version: int = 5) -> None:
        u = urlparse(url)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 1883
        self.v5 = version == 5
        self.structured = structured or not self.v5
        self.prefix = prefix
        self.scope = scope
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
        proto = aiomqtt.ProtocolVersion.V5 if self.v5 else aiomqtt.ProtocolVersion.V311
        async with aiomqtt.Client(self.host, self.port,
                                  identifier=f"mes-{uuid.uuid4().hex[:8]}",
                                  protocol=proto) as c:
            self.client = c
            for f in (self.inbox, f"{self.prefix}/#"):
                await c.subscribe(f, qos=1)
            self._ready.set()
            async for msg in c.messages:
                t = msg.topic.value
                if t.endswith("/replies") or t == self.inbox:
                    ev = _event(msg)
                    self.replies[ev["causationid"]] = ev
                elif t.endswith("/events"):
                    self.events.append(_event(msg))
                elif not t.endswith("/commands"):
                    p = msg.payload
                    self.retained[t] = bytes(p) if isinstance(p, (bytes, bytearray)) else b""

    def topic(self, scope: str | None = None) -> str:
        return f"{self.prefix}/{(scope or self.scope).replace('.', '/')}/commands"

    async def send(self, type_: str, data: Any, *, inbox: bool = True, scope: str | None = None,
                   rid: str | None = None, **attrs: Any) -> str:
        assert self.client is not None
        rid = rid or str(uuid.uuid4())
        corr = uuid.uuid4()
        p = Properties(PacketTypes.PUBLISH)
        inbox = inbox and self.v5
        if inbox:
            p.ResponseTopic = self.inbox
            p.CorrelationData = corr.bytes
        attrs = {"subject": scope or self.scope, "correlationid": str(corr), **attrs}
        attrs = {k: v for k, v in attrs.items() if v is not None}
        if self.structured:
            p.ContentType = "application/cloudevents+json"
            ev = {"specversion": "1.0", "id": rid, "source": "urn:example:mes", "type": type_,
                  "datacontenttype": "application/json", "data": data, **attrs}
            await self.client.publish(self.topic(scope), json.dumps(ev), qos=1,
                                      properties=p if self.v5 else None)
        else:
            p.ContentType = "application/json; charset=utf-8"
            p.PayloadFormatIndicator = 1
            p.UserProperty = [("id", rid), ("source", "urn:example:mes"),
                              ("specversion", "1.0"), ("type", type_), *attrs.items()]
            await self.client.publish(self.topic(scope), json.dumps(data), qos=1,
                                      properties=p)
        return rid

    async def call(self, type_: str, data: Any, **kw: Any) -> dict[str, Any]:
        """Send a request; its reply (checked for type, correlation and causation)."""
        rid = await self.send(type_, data, **kw)
        rep: dict[str, Any] = await wait_until(lambda: self.replies.get(rid), 10, f"reply {type_}")
        assert rep["type"] == type_ and rep["causationid"] == rid
        if kw.get("inbox", True) and not self.structured:
            assert rep["CorrelationData"] == uuid.UUID(rep["correlationid"]).bytes
        return rep

    async def status(self, method: str, data: Any, **kw: Any) -> int:
        rep = await self.call(JC + method + ".v2", data, **kw)
        return int(rep["data"]["ReturnStatus"])

    def retained_json(self, topic: str, scope: str | None = None) -> Any:
        raw = self.retained.get(f"{self.prefix}/{scope or self.scope}/{topic}")
        return json.loads(raw) if raw else None

    def index(self, scope: str | None = None) -> dict[str, str]:
        doc = self.retained_json("state-index", scope)
        return {j["job_order_id"]: state_name(j["state"]) for j in doc["jobs"]} if doc else {}

    def states(self, job: str) -> list[str]:
        return [state_name(e["data"]["JobState"]) for e in self.events
                if (e["data"].get("JobOrder") or {}).get("JobOrderID") == job]


def order(job: str, wm: str = "wm", **fields: Any) -> dict[str, Any]:
    return {"JobOrder": {"JobOrderID": job, "WorkMasterID": [{"ID": wm}], "Priority": 1,
                         **fields},
            "Comment": [{"Locale": "en", "Text": "test"}]}


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


def same_shape(ref_value: Any, got: Any, path: str = "$") -> None:
    """``got`` has the reference's structure: the same JSON types, and at every level
    only field names the reference has there (a list's items against the fields of
    all the reference's items). ``Value`` holds any JSON."""
    if path.endswith(".Value"):
        return
    if isinstance(ref_value, dict):
        assert isinstance(got, dict), f"{path}: not an object"
        extra = set(got) - set(ref_value)
        assert not extra, f"{path}: fields the original does not send: {sorted(extra)}"
        for k, v in got.items():
            same_shape(ref_value[k], v, f"{path}.{k}")
    elif isinstance(ref_value, list):
        assert isinstance(got, list), f"{path}: not a list"
        if ref_value and got:
            merged: Any = ref_value[0]
            if isinstance(merged, dict):
                merged = {}
                for item in ref_value:
                    merged.update(item)
            for i, item in enumerate(got):
                same_shape(merged, item, f"{path}[{i}]")
    elif isinstance(ref_value, bool) or ref_value is None:
        assert got is None or isinstance(got, bool), path
    elif isinstance(ref_value, (int, float)) and not isinstance(ref_value, bool):
        assert isinstance(got, (int, float)) and not isinstance(got, bool), path
    else:
        assert isinstance(got, type(ref_value)), f"{path}: {type(got).__name__}"


async def configure(mes: Mes, *, scope: str | None = None) -> None:
    """The reference's config messages: the Work Master, equipment, material, personnel
    and physical asset the reference's order names (every acceptance check is on)."""
    wm = work_master("tighten_rework", "WM-AXLE-FIT")
    wm.update({k: v for k, v in ref("workmaster.config.json").items()
               if k not in ("data", "dataschema")})
    rep = await mes.call(WM, wm, scope=scope)
    assert rep["data"]["ReturnStatus"] == NO_ERROR, rep
    for kind in ("equipment", "materialclass", "materialdefinition", "personnel",
                 "physicalasset"):
        rep = await mes.call(f"{CFG}{kind}.v1", ref(f"{kind}.config.json"), scope=scope)
        assert rep["data"]["ReturnStatus"] == NO_ERROR, (kind, rep)


def slow_tighten(cmd: dict[str, Any]) -> dict[str, Any] | None:
    # the "slow" jobs wait for their tightening: the MES acts on them while they run
    if cmd["type"] == "com.example.cell.tighten.v1":
        if "slow" in cmd["id"]:
            return None
        return {"Outcome": "completed", "Result": {"torque": 85}}
    return {}


def store(job: str, method: str = "StoreAndStart") -> dict[str, Any]:
    """The reference's ``method`` request for the order ``job``."""
    req = copy.deepcopy(ref(f"{method}.request.json"))
    req["JobOrder"]["JobOrderID"] = job
    return req
