"""The OPC UA face as tests drive it: an MES client of asyncua (``Mes95``) that browses
to a scope's objects and receives their events and list values, ``sfc-host run`` with
the face on (``start_host``, ``running``) or secured as plants run it (``Site``), the
reference's order as an OPC UA structure and a method result's return status."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from asyncua import Client, Node, ua
from asyncua.crypto.cert_gen import setup_self_signed_certificate
from asyncua.crypto.security_policies import SecurityPolicyBasic256Sha256
from cryptography.x509.oid import ExtendedKeyUsageOID

from helpers.hosts import flush, start_sfc_host, stop_cleanly
from helpers.mes import Mes, configure

JC_URI = "http://opcfoundation.org/UA/ISA95-JOBCONTROL_V2/"
OWN_URI = "urn:sfc-fast:opcua"
SCOPE = "line1"
WM = "WM-AXLE-FIT"       # the Work Master helpers.mes.configure stores
NO_ERROR, UNKNOWN_ID, INVALID_STATUS, UNABLE = 1, 2, 8, 16
SE, SIGN = ua.MessageSecurityMode.SignAndEncrypt, ua.MessageSecurityMode.Sign
PASSWORD = "s3cret-pass"    # every user-name user's of a Site


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


def host_cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    """``sfc-host *args`` in a process of its own, ``stdin`` its input."""
    return subprocess.run([sys.executable, "-m", "sfc_host", *args], input=stdin,
                          capture_output=True, text=True, timeout=60)


class Site:
    """A host's settings, PKI folder and users (``op``, an operator, and ``viewer``, a
    reader, both of password ``PASSWORD``; ``alice``, an X.509 user), and the clients'
    certificates under ``clients/``: ``good``, which the administrator trusted (unless
    ``make`` is told not to), ``evil`` and ``alice``, not trusted."""

    def __init__(self, tmp: Path, redis_url: str, mqtt_url: str, more: str = "") -> None:
        self.tmp = tmp
        self.mqtt_url = mqtt_url
        self.checked = ""
        self.port = free_port()
        self.url = f"opc.tcp://127.0.0.1:{self.port}/sfc-host/"
        self.pki = tmp / "pki"
        self.conf = tmp / "host.toml"
        self.users = tmp / "users"
        self.conf.write_text(
            f'redis_url = "{redis_url}"\nmqtt_url = "{mqtt_url}"\nconsumer = "secure"\n'
            "sweep_interval_ms = 50\ndiscover_interval_ms = 100\nopcua = true\n"
            f'opcua_endpoint = "{self.url}"\nopcua_pki_dir = "{self.pki}"\n'
            f'opcua_users_file = "{self.users}"\n' + more)

    async def make(self, trust_good: bool = True) -> None:
        made = host_cli("opcua", "cert", "--config", str(self.conf))
        assert made.returncode == 0, made.stderr
        assert "urn:sfc-fast:127.0.0.1:secure" in made.stdout
        lines = []
        for name, role in (("op", "operator"), ("viewer", "reader")):
            line = host_cli("opcua", "user", name, "--role", role, stdin=PASSWORD + "\n")
            assert line.returncode == 0, line.stderr
            lines.append(line.stdout)
        clients = self.tmp / "clients"
        clients.mkdir()
        for name in ("good", "evil", "alice"):
            await setup_self_signed_certificate(
                clients / f"{name}.pem", clients / f"{name}.der", f"urn:test:{name}",
                "localhost", [ExtendedKeyUsageOID.CLIENT_AUTH], {"commonName": name})
        # an X.509 user: alice's certificate, proven by her key, no password
        line = host_cli("opcua", "user", "alice", "--role", "operator", "--certificate",
                    str(clients / "alice.der"))
        assert line.returncode == 0 and " x509:" in line.stdout, line.stderr
        lines.append(line.stdout)
        self.users.write_text("# OPC UA users\n" + "".join(lines))
        if trust_good:
            shutil.copy(clients / "good.der", self.pki / "trusted" / "good.der")

    async def start(self) -> subprocess.Popen[str]:
        """``run --check`` (which must pass; its line kept in ``checked``), then ``sfc-host
        run`` with the reference's Work Master and catalogs (over MQTT) and the scope's
        objects made."""
        checked = host_cli("run", "--check", "--config", str(self.conf))
        assert checked.returncode == 0, checked.stderr
        self.checked = checked.stdout
        host = start_sfc_host(["run", "--config", str(self.conf)], {}, "host secure running")
        try:
            async with Mes(self.mqtt_url) as mqtt_mes:
                await configure(mqtt_mes)
            await asyncio.sleep(1.2)
        except BaseException:
            stop_cleanly(host)
            raise
        return host

    @asynccontextmanager
    async def client(self, cert: str = "good", mode: ua.MessageSecurityMode | None = SE,
                     user: str | None = "op", password: str = PASSWORD,
                     forge: bytes | None = None, x509_user: str | None = None
                     ) -> AsyncIterator[Mes95]:
        """A client session; ``forge``: a hostile client's CreateSession names this
        certificate (b"": none) instead of its channel's. ``mode`` None: security None."""
        c = Client(self.url)
        c.application_uri = f"urn:test:{cert}"
        if mode is not None:
            await c.set_security(SecurityPolicyBasic256Sha256,
                                 str(self.tmp / "clients" / f"{cert}.der"),
                                 str(self.tmp / "clients" / f"{cert}.pem"), mode=mode)
        if user is not None:
            c.set_user(user)
            c.set_password(password)
        if x509_user is not None:
            await c.load_client_certificate(str(self.tmp / "clients" / f"{x509_user}.der"))
            await c.load_private_key(str(self.tmp / "clients" / f"{x509_user}.pem"))
        if forge is not None:
            create = c.uaclient.create_session

            async def forged(params: Any) -> Any:
                params.ClientCertificate = forge or None
                if forge:
                    params.ClientDescription.ApplicationUri = "urn:test:good"
                return await create(params)
            c.uaclient.create_session = forged  # type: ignore[method-assign]
        async with c:
            await c.load_data_type_definitions()
            mes = Mes95(c)
            await mes.find(SCOPE)
            yield mes
