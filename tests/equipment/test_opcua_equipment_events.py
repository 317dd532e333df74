"""OPC UA events of named types as pull events: a real asyncua server raises events of a
custom type (and of a subtype) on a notifier object; a whole host (``App``, real Redis
and broker) subscribed through its equipment file takes them as pull events, their named
fields as the data, and a job waiting for that type completes with them."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from asyncua import Node, Server, ua
from helpers.aio import run
from helpers.hosts import V110, flush, quick_config, wait_until
from helpers.node import start_peer, stop_peer
from helpers.servers import free_port

from sfc_host.config import ConfigError
from sfc_host.equipment.opcua.settings import parse
from sfc_host.service.app import App

S = "ev1"
URI = "urn:sfc-fast:test-events"


async def camera_server(port: int) -> tuple[Server, Node, Node, Node]:
    """A server with ``RejectEventType`` (BaseEventType + RejectCode: Int32), its subtype
    ``SealRejectEventType`` (+ Station: String) and a notifier object ``Camera1``."""
    server = Server()
    await server.init()
    server.set_endpoint(f"opc.tcp://127.0.0.1:{port}/camera/")
    ns = await server.register_namespace(URI)
    reject = await server.create_custom_event_type(
        ns, "RejectEventType", ua.ObjectIds.BaseEventType,
        [("RejectCode", ua.VariantType.Int32)])
    seal = await server.create_custom_event_type(
        ns, "SealRejectEventType", reject, [("Station", ua.VariantType.String)])
    camera = await server.nodes.objects.add_object(ua.NodeId("Camera1", ns),
                                                   ua.QualifiedName("Camera1", ns))
    await camera.write_attribute(ua.AttributeIds.EventNotifier, ua.DataValue(
        ua.Variant(1, ua.VariantType.Byte)))       # SubscribeToEvents
    await server.nodes.server.add_reference(camera, ua.ObjectIds.HasNotifier)
    return server, reject, seal, camera


def equipment(tmp: Path, port: int, reject: Node, extra: str = "") -> Path:
    f = tmp / "equipment.toml"
    f.write_text(f"""
[[server]]
name = "cam"
endpoint = "opc.tcp://127.0.0.1:{port}/camera/"

[[event]]
server = "cam"
scope = "{S}"
type = "com.example.reject.v1"
event_type = "nsu={URI};i={reject.nodeid.Identifier}"
source = "nsu={URI};s=Camera1"
fields = {{ reason = "Message", code = "RejectCode", level = "Severity" }}
{extra}""")
    return f


def waiting(wm_id: str, type_id: str) -> dict[str, Any]:
    """One step with one action: wait for a pull event of ``type_id``."""
    return {"ID": wm_id, "dataschema": V110, "data": {
        "Steps": [{"Name": "Inspect", "Initial": True}], "Transitions": [],
        "Actions": [{"Name": "inspect", "Step": "Inspect", "Qualifier": "N",
                     "Interaction": "pull_event", "TypeId": type_id,
                     "TimeoutSeconds": 20}]}}


async def ended(app: App, job: str) -> bool:
    raw = await app.host.client.hget(f"sfc:{{{S}}}:order:{job}", "state")
    return bool(raw) and raw.decode().startswith(("Ended", "Aborted"))


async def response_data(app: App, job: str) -> dict[str, Any]:
    raw = await app.host.client.get(f"sfc:{{{S}}}:response:{job}")
    resp = json.loads(raw) if raw else {}
    return {d["ID"]: d["Value"] for d in resp.get("JobResponseData", [])}


async def raise_until_ended(app: App, job: str, gen: Any, **fields: Any) -> None:
    """Raise the event (again, every 0.2 s: a job takes only an event that comes while
    it waits) until the job has ended."""
    for name, value in fields.items():
        setattr(gen.event, name, value)
    while not await ended(app, job):
        await gen.trigger()
        await asyncio.sleep(0.2)


def test_events_of_a_type_and_its_subtypes_are_pull_events_with_their_fields(
        redis_url: str, mqtt_url: str, tmp_path: Path) -> None:
    async def main() -> None:
        await flush(redis_url)
        port = free_port()
        server, reject, seal, camera = await camera_server(port)
        await server.start()
        app = App(quick_config(redis_url, mqtt_url=mqtt_url, scopes=[S], consumer="opcua-ev",
                               equipment_opcua=str(equipment(tmp_path, port, reject))))
        try:
            await app.start(connect_timeout_s=5)
            await wait_until(lambda: not app.opcua_equipment.not_ready(), 15, "bound")
            await app.host.store.put_work_master(S, waiting("wm-r", "com.example.reject.v1"))
            await app.host.orders.store_order(
                S, {"JobOrderID": "R1", "WorkMasterID": [{"ID": "wm-r"}]}, start=True)
            gen = await server.get_event_generator(reject, camera)
            await raise_until_ended(app, "R1", gen, RejectCode=7, Severity=600,
                                    Message=ua.LocalizedText("seal torn"))
            data = await response_data(app, "R1")
            assert data == {"inspect.reason": "seal torn", "inspect.code": 7,
                            "inspect.level": 600}
            # a subtype's event is an event of the type too
            await app.host.orders.store_order(
                S, {"JobOrderID": "R2", "WorkMasterID": [{"ID": "wm-r"}]}, start=True)
            sub = await server.get_event_generator(seal, camera)
            await raise_until_ended(app, "R2", sub, RejectCode=9, Station="capper",
                                    Message=ua.LocalizedText("seal crooked"))
            assert (await response_data(app, "R2"))["inspect.code"] == 9
        finally:
            await app.aclose()
            await server.stop()
    run(main())


def test_the_server_objects_events_with_the_default_fields_and_a_missing_field_said(
        redis_url: str, mqtt_url: str, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    """An ``[[event]]`` with no source listens on the Server object and, with no
    fields, takes the event's Message and Severity; a field the type lacks is one
    ERROR line at the bind, and the events still come, without it."""
    async def main() -> None:
        await flush(redis_url)
        port = free_port()
        server, reject, _seal, _camera = await camera_server(port)
        await server.start()
        base = f"nsu={URI};i={reject.nodeid.Identifier}"
        extra = f"""
[[event]]
server = "cam"
scope = "{S}"
type = "com.example.any_reject.v1"
event_type = "{base}"

[[event]]
server = "cam"
scope = "{S}"
type = "com.example.odd.v1"
event_type = "{base}"
fields = {{ code = "RejectCode", nope = "NoSuchField" }}
"""
        app = App(quick_config(redis_url, mqtt_url=mqtt_url, scopes=[S], consumer="opcua-ev",
                               equipment_opcua=str(equipment(tmp_path, port, reject, extra))))
        try:
            with caplog.at_level(logging.ERROR, "sfc_host.equipment.opcua"):
                await app.start(connect_timeout_s=5)
                await wait_until(lambda: not app.opcua_equipment.not_ready(), 15, "bound")
                await wait_until(lambda: "NoSuchField" in caplog.text, 10, "the missing field")
            assert "has no field NoSuchField" in caplog.text and "RejectCode" in caplog.text
            h = app.host
            for wm, type_id in (("wm-a", "com.example.any_reject.v1"),
                                ("wm-o", "com.example.odd.v1")):
                await h.store.put_work_master(S, waiting(wm, type_id))
            for job, wm in (("A1", "wm-a"), ("O1", "wm-o")):
                await h.orders.store_order(
                    S, {"JobOrderID": job, "WorkMasterID": [{"ID": wm}]}, start=True)
            gen = await server.get_event_generator(reject)     # raised by the Server
            gen.event.RejectCode, gen.event.Severity = 3, 250
            gen.event.Message = ua.LocalizedText("label missing")
            while not (await ended(app, "A1") and await ended(app, "O1")):
                await gen.trigger()
                await asyncio.sleep(0.2)
            assert await response_data(app, "A1") == {"inspect.message": "label missing",
                                                      "inspect.severity": 250}
            assert await response_data(app, "O1") == {"inspect.code": 3}
        finally:
            await app.aclose()
            await server.stop()
    run(main())


@pytest.mark.parametrize(("entry", "says"), [
    ('node = "ns=2;s=X"\nevent_type = "ns=2;i=1"', "one of node"),
    ('', "one of node"),
    ('event_type = "ns=2;i=1"\nfield = "x"', "field goes with node"),
    ('node = "ns=2;s=X"\nsource = "ns=2;s=Y"', "source and fields go with event_type"),
    ('event_type = "ns=2;i=1"\nfields = { a = 1 }', "fields maps names"),
])
def test_an_event_entry_that_mixes_its_kinds_is_one_line(entry: str, says: str) -> None:
    import tomllib
    doc = tomllib.loads(f"""
[[server]]
name = "cam"
endpoint = "opc.tcp://127.0.0.1:4840/"

[[event]]
server = "cam"
scope = "{S}"
type = "t.v1"
{entry}
""")
    with pytest.raises(ConfigError) as e:
        parse(doc, "equipment.toml", {})
    assert says in str(e.value) and "event[0]" in str(e.value)
    assert "\n" not in str(e.value)


def test_events_raised_by_a_node_opcua_server_are_pull_events(
        node: str, redis_url: str, mqtt_url: str, tmp_path: Path) -> None:
    """The same subscription against node-opcua's server (``tests/peers/camera_events.mjs``),
    which raises a ``RejectEventType`` and a ``SealRejectEventType`` every 0.2 s: a job
    waiting for the subtype's pull events gets the subtype's own field."""
    async def main() -> None:
        await flush(redis_url)
        port = free_port()
        proc = await start_peer(node, "camera_events.mjs", ["--port", str(port)],
                                "camera events on", tmp_path / "camera_events.log")
        app: App | None = None
        try:
            f = tmp_path / "equipment.toml"
            f.write_text(f"""
[[server]]
name = "cam"
endpoint = "opc.tcp://127.0.0.1:{port}/camera/"

[[event]]
server = "cam"
scope = "{S}"
type = "com.example.seal_reject.v1"
event_type = "nsu={URI};s=SealRejectEventType"
source = "nsu={URI};s=Camera1"
fields = {{ station = "Station", code = "RejectCode", reason = "Message" }}
""")
            app = App(quick_config(redis_url, mqtt_url=mqtt_url, scopes=[S],
                                   consumer="opcua-ev", equipment_opcua=str(f)))
            await app.start(connect_timeout_s=5)
            await wait_until(lambda: not app.opcua_equipment.not_ready(), 15, "bound")
            await app.host.store.put_work_master(S, waiting("wm-s", "com.example.seal_reject.v1"))
            await app.host.orders.store_order(
                S, {"JobOrderID": "N1", "WorkMasterID": [{"ID": "wm-s"}]}, start=True)
            await wait_until(lambda: ended(app, "N1"), 20, "N1 ended")
            assert await response_data(app, "N1") == {
                "inspect.station": "capper", "inspect.code": 9, "inspect.reason": "seal crooked"}
        finally:
            if app is not None:
                await app.aclose()
            await stop_peer(proc)
    run(main())
