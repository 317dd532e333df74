"""The OPC UA face as tests drive it: an MES client of asyncua (``Mes95``) that browses
to a scope's objects and receives their events and list values, ``sfc-host run`` with
the face on (``start_host``, ``running``), the reference's order as an OPC UA structure
and a method result's return status."""

from __future__ import annotations

import asyncio
import socket
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from asyncua import Client, Node, ua

from helpers.hosts import flush, start_sfc_host, stop_cleanly
from helpers.mes import Mes, configure

JC_URI = "http://opcfoundation.org/UA/ISA95-JOBCONTROL_V2/"
OWN_URI = "urn:sfc-fast:opcua"
SCOPE = "line1"
WM = "WM-AXLE-FIT"       # the Work Master helpers.mes.configure stores
NO_ERROR, UNKNOWN_ID, INVALID_STATUS, UNABLE = 1, 2, 8, 16


def free_port() -> int:
    """A free TCP port on loopback, for a host's OPC UA endpoint."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_host(tmp_path: Path, redis_url: str, mqtt_url: str, port: int,
               name: str = "opcua-e2e", more: str = "") -> subprocess.Popen[str]:
    conf = tmp_path / f"{name}.toml"
    conf.write_text(f'redis_url = "{redis_url}"\nmqtt_url = "{mqtt_url}"\n'
                    f'consumer = "{name}"\nsweep_interval_ms = 50\n'
                    "discover_interval_ms = 100\nopcua = true\n"
                    f'opcua_endpoint = "opc.tcp://127.0.0.1:{port}/sfc-host/"\n'
                    "opcua_list_interval_ms = 200\n"
                    # the MES of these tests: on loopback, no security, calls allowed
                    # (tests/opcua/test_opcua_security.py runs the secure endpoints)
                    'opcua_security = ["None"]\nopcua_anonymous = "call"\n' + more)
    return start_sfc_host(["run", "--config", str(conf)], {}, f"host {name} running")


class Mes95:
    """An OPC UA MES client: the scope's objects found by browsing, calls that return
    the whole result (Uncertain included), the events and list values it receives."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.events: list[Any] = []
        self.lists: list[list[Any]] = []
        self.jc = 0
        self.own = 0
        self.receiver: Node | None = None
        self.provider: Node | None = None

    async def find(self, scope: str) -> None:
        """Objects → Scopes → {scope} → its receiver and provider, by type definition."""
        self.jc = await self.client.get_namespace_index(JC_URI)
        self.own = await self.client.get_namespace_index(OWN_URI)
        objects = self.client.nodes.objects
        folder = await objects.get_child([f"{self.own}:Scopes", f"{self.own}:{scope}"])
        for child in await folder.get_children():
            kind = await child.read_type_definition()
            if kind == ua.NodeId(1002, self.jc):
                self.receiver = child
            elif kind == ua.NodeId(1003, self.jc):
                self.provider = child
        assert self.receiver is not None and self.provider is not None

    async def call(self, name: str, *args: ua.Variant) -> ua.CallMethodResult:
        obj = self.provider if name.startswith("RequestJobResponse") else self.receiver
        assert obj is not None
        method = await obj.get_child(f"{self.jc}:{name}")
        [result] = await self.client.uaclient.call([ua.CallMethodRequest(
            ObjectId=obj.nodeid, MethodId=method.nodeid, InputArguments=list(args))])
        return result

    async def on_order(self, name: str, job: str, comment: str = "") -> ua.CallMethodResult:
        texts = [ua.LocalizedText(comment, "en")] if comment else []
        return await self.call(name, ua.Variant(job, ua.VariantType.String),
                               ua.Variant(texts, ua.VariantType.LocalizedText, is_array=True))

    async def store(self, name: str, order: Any) -> ua.CallMethodResult:
        return await self.call(name, ua.Variant(order, ua.VariantType.ExtensionObject),
                               ua.Variant([], ua.VariantType.LocalizedText, is_array=True))

    def states(self, job: str) -> list[str]:
        return ["_".join(s.StateText.Text for s in e.JobState) for e in self.events
                if e.JobOrder is not None and e.JobOrder.JobOrderID == job]

    def listed(self) -> dict[str, str]:
        last = self.lists[-1] if self.lists else []
        return {e.JobOrder.JobOrderID: "_".join(s.StateText.Text for s in e.State)
                for e in last}

    # asyncua subscription handler
    def event_notification(self, event: Any) -> None:
        self.events.append(event)

    def datachange_notification(self, node: Node, value: Any, data: Any) -> None:
        self.lists.append(list(value or []))


@asynccontextmanager
async def connected(port: int, scope: str = SCOPE) -> AsyncIterator[Mes95]:
    client = Client(f"opc.tcp://127.0.0.1:{port}/sfc-host/")
    async with client:
        await client.load_data_type_definitions()
        mes = Mes95(client)
        await mes.find(scope)
        assert mes.provider is not None and mes.receiver is not None
        sub = await client.create_subscription(50, mes)
        own = await client.get_namespace_index(OWN_URI)
        event_type = client.get_node(ua.NodeId("SfcJobOrderStatusEventType", own))
        await sub.subscribe_events(mes.provider, event_type)
        await sub.subscribe_data_change(
            await mes.receiver.get_child(f"{mes.jc}:JobOrderList"))
        yield mes


def order(job: str, wm: str = WM, **fields: Any) -> Any:
    fields.setdefault("EquipmentRequirements", [ua.ISA95EquipmentDataType(ID="STATION-10")])
    return ua.ISA95JobOrderDataType(
        JobOrderID=job, WorkMasterID=[ua.ISA95WorkMasterDataType(ID=wm)], **fields)


def rs(result: ua.CallMethodResult) -> int:
    """A method result's return status (its last output argument)."""
    return int(result.OutputArguments[-1].Value)


class Running:
    """A host under test: its OPC UA port and the MQTT MES that configured it."""

    def __init__(self, port: int, mqtt_mes: Mes, host: subprocess.Popen[str]) -> None:
        self.port = port
        self.mqtt_mes = mqtt_mes
        self.host = host


@asynccontextmanager
async def running(tmp_path: Path, redis_url: str, mqtt_url: str,
                  scopes: tuple[str, ...] = (SCOPE,), more: str = "") -> AsyncIterator[Running]:
    """An emptied Redis, ``sfc-host run`` with the face, the reference's Work Master and
    catalogs in ``scopes`` (over MQTT), and their objects made; stopped on the way out."""
    await flush(redis_url)
    port = free_port()
    r = Running(port, Mes(mqtt_url), start_host(tmp_path, redis_url, mqtt_url, port,
                                                 more=more))
    try:
        async with r.mqtt_mes:
            for scope in scopes:
                await configure(r.mqtt_mes, scope=scope)
            await asyncio.sleep(1.2)     # the scopes' objects, once they are served
            yield r
    finally:
        stop_cleanly(r.host)
