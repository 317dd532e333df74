"""Equipment over OPC UA as tests drive it: PackML units on a real asyncua server (the
example units of ``sfc_host.examples.packml_unit``, with a method beside them), their
equipment file, and ``Plant``: the units' server with a whole host (``App``) on it;
recipes of their actions (``THREE``: three actions on two units) and a job's response
data."""

from __future__ import annotations

import json
import re
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from asyncua import Server, ua

from helpers.hosts import V110, flush, quick_config, wait_until
from helpers.servers import free_port
from sfc_host.config import HostConfig
from sfc_host.examples.packml_unit import URI, build
from sfc_host.execution.host import Host
from sfc_host.service.app import App

S = "pk1"


def recipe(actions: list[tuple[str, str, dict[str, Any]]], hold: bool = False,
           wm_id: str = "wm") -> dict[str, Any]:
    """One step per action, in a row; each action of ``(name, type, parameters)``."""
    steps = [{"Name": f"S{i}", "Initial": i == 0} for i in range(len(actions))]
    trans = [{"Source": f"S{i}", "Target": f"S{i + 1}", "Condition": "always"}
             for i in range(len(actions) - 1)]
    acts = []
    for i, (name, type_id, params) in enumerate(actions):
        a: dict[str, Any] = {"Name": name, "Step": f"S{i}", "Qualifier": "N",
                             "Interaction": "push_command", "TypeId": type_id,
                             "TimeoutSeconds": 20, "Parameters": params}
        if hold:
            a["HoldTypeId"] = type_id + ".hold"
            a["RestartTypeId"] = type_id + ".restart"
        acts.append(a)
    return {"ID": wm_id, "dataschema": V110,
            "data": {"Steps": steps, "Transitions": trans, "Actions": acts}}


def equipment_file(path: Path, port: int, *, method: bool = False) -> Path:
    text = f"""
[[server]]
name = "plc1"
endpoint = "opc.tcp://127.0.0.1:{port}/units/"

[[unit]]
equipment = "filler1"
server = "plc1"
scopes = ["{S}"]
node = "nsu=urn:sfc-fast:example-units;s=Filler1"
types = ["com.example.fill.v1"]
hold_types = ["com.example.fill.v1.hold"]
restart_types = ["com.example.fill.v1.restart"]
command_id = "nsu=urn:sfc-fast:example-units;s=Filler1.CommandId"
parameters = {{ setpoint = "nsu=urn:sfc-fast:example-units;s=Filler1.Setpoint" }}
results = {{ filled = "nsu=urn:sfc-fast:example-units;s=Filler1.Result" }}

[[unit]]
equipment = "capper1"
server = "plc1"
scopes = ["{S}"]
node = "nsu=urn:sfc-fast:example-units;s=Capper1"
types = ["com.example.cap.v1"]
command_id = "nsu=urn:sfc-fast:example-units;s=Capper1.CommandId"
results = {{ torque = "nsu=urn:sfc-fast:example-units;s=Capper1.Result" }}
"""
    if method:
        text += f"""
[[method]]
equipment = "scale1"
server = "plc1"
scopes = ["{S}"]
types = ["com.example.weigh.v1"]
object = "nsu=urn:sfc-fast:example-units;s=Scale1"
method = "nsu=urn:sfc-fast:example-units;s=Scale1.Weigh"
"""
    f = path / "equipment.toml"
    f.write_text(text)
    return f


async def add_scale(server: Server) -> None:
    """A method beside the units: Weigh(Tare: Double, Count: UInt16) -> (Net: Double)."""
    ns = await server.get_namespace_index(URI)
    obj = await server.nodes.objects.add_object(ua.NodeId("Scale1", ns),
                                                ua.QualifiedName("Scale1", ns))

    async def weigh(parent: Any, tare: ua.Variant, count: ua.Variant) -> list[ua.Variant]:
        if count.Value == 0:
            return ua.StatusCode(ua.StatusCodes.BadOutOfRange)     # type: ignore[return-value]
        return [ua.Variant(10.0 * count.Value - tare.Value, ua.VariantType.Double)]
    tare = ua.Argument(Name="Tare", DataType=ua.NodeId(ua.ObjectIds.Double), ValueRank=-1)
    count = ua.Argument(Name="Count", DataType=ua.NodeId(ua.ObjectIds.UInt16), ValueRank=-1)
    net = ua.Argument(Name="Net", DataType=ua.NodeId(ua.ObjectIds.Double), ValueRank=-1)
    await obj.add_method(ua.NodeId("Scale1.Weigh", ns), ua.QualifiedName("Weigh", ns),
                         weigh, [tare, count], [net])


class Plant:
    """The units' server, a host on it, and the helpers the tests share."""

    def __init__(self, redis_url: str, mqtt_url: str, tmp_path: Path, *,
                 work_s: float = 0.05, method: bool = False) -> None:
        self.redis_url, self.mqtt_url, self.tmp = redis_url, mqtt_url, tmp_path
        self.port = free_port()
        self.work_s = work_s
        self.method = method
        self.server: Server | None = None
        self.units: dict[str, Any] = {}
        self.app: App | None = None

    async def __aenter__(self) -> Plant:
        await flush(self.redis_url)
        self.server, self.units = await build(self.port, ["Filler1", "Capper1"], self.work_s)
        if self.method:
            await add_scale(self.server)
        await self.server.start()
        cfg = quick_config(self.redis_url, mqtt_url=self.mqtt_url, scopes=[S],
                           consumer="opcua-eq",
                           equipment_opcua=str(equipment_file(self.tmp, self.port,
                                                              method=self.method)))
        self.app = App(cfg)
        await self.app.start(connect_timeout_s=5)
        eq = self.app.opcua_equipment
        await wait_until(lambda: not eq.not_ready(), 15, "the units bound")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.app is not None:
            await self.app.aclose()
        if self.server is not None:
            await self.server.stop()

    async def with_variable_events(self, name: str, field: str = "value") -> Any:
        """A Boolean variable ``name`` added to the server, and the host started again
        with an ``[[event]]`` of type ``com.example.qa_result.v1`` on it; the variable."""
        assert self.app is not None and self.server is not None
        ns = await self.server.get_namespace_index(URI)
        var = await self.server.nodes.objects.add_variable(
            ua.NodeId(name, ns), ua.QualifiedName(name.rpartition(".")[2], ns), False)
        await self.app.aclose()
        eq_file = self.tmp / "equipment.toml"
        eq_file.write_text(eq_file.read_text() + f"""
[[event]]
server = "plc1"
scope = "{S}"
type = "com.example.qa_result.v1"
node = "nsu={URI};s={name}"
field = "{field}"
""")
        self.app = App(quick_config(self.redis_url, mqtt_url=self.mqtt_url, scopes=[S],
                                    consumer="opcua-eq", equipment_opcua=str(eq_file)))
        await self.app.start(connect_timeout_s=5)
        eq = self.app.opcua_equipment
        await wait_until(lambda: not eq.not_ready(), 15, "the units bound")
        return var

    async def run_job(self, wm: dict[str, Any], job: str) -> None:
        assert self.app is not None
        await self.app.host.store.put_work_master(S, wm)
        await self.app.host.orders.store_order(
            S, {"JobOrderID": job, "WorkMasterID": [{"ID": wm["ID"]}]}, start=True)

    async def order_state(self, job: str) -> str:
        assert self.app is not None
        raw = await self.app.host.client.hget(f"sfc:{{{S}}}:order:{job}", "state")
        return raw.decode() if raw else ""

    async def wait_state(self, job: str, prefix: str, timeout: float = 20) -> None:
        async def reached() -> bool:
            return (await self.order_state(job)).startswith(prefix)
        await wait_until(reached, timeout, f"job {job} {prefix}")

    async def response(self, job: str) -> dict[str, Any]:
        assert self.app is not None
        raw = await self.app.host.client.get(f"sfc:{{{S}}}:response:{job}")
        return json.loads(raw) if raw else {}

    async def starts(self, unit: str) -> int:
        return int(await self.units[unit].nodes["starts"].read_value())


def response_data(resp: dict[str, Any]) -> dict[str, Any]:
    return {d["ID"]: d["Value"] for d in resp.get("JobResponseData", [])}


THREE = recipe([("fill", "com.example.fill.v1", {"setpoint": 2.5}),
                ("cap", "com.example.cap.v1", {}),
                ("fill_again", "com.example.fill.v1", {"setpoint": 4.0})])


async def make_pki(tmp: Path, server_uri: str) -> Path:
    """``tmp/pki`` with the host's certificate and key (``host.der``, ``host.pem``) and
    a server's for application URI ``server_uri`` (``plc.der``, ``plc.pem``)."""
    from asyncua.crypto.cert_gen import setup_self_signed_certificate
    from cryptography.x509.oid import ExtendedKeyUsageOID

    pki = tmp / "pki"
    pki.mkdir(parents=True)
    await setup_self_signed_certificate(
        pki / "host.pem", pki / "host.der", "urn:sfc-fast:equipment-client", "localhost",
        [ExtendedKeyUsageOID.CLIENT_AUTH], {"commonName": "sfc-host"})
    await setup_self_signed_certificate(
        pki / "plc.pem", pki / "plc.der", server_uri, "localhost",
        [ExtendedKeyUsageOID.SERVER_AUTH], {"commonName": "plc1"})
    return pki


async def secured(tmp: Path, eq_file: Path, server_uri: str) -> tuple[Path, Path]:
    """The host's and a server's certificates (``pki/host.*``, ``pki/plc.*``, the
    server's for application URI ``server_uri``), and ``eq_file``'s server set to
    SignAndEncrypt as user ``sfc`` (password in ``$PLC1_PASSWORD``) trusting what is in
    ``pki/plc1``, empty so far; (the pki folder, that trust folder)."""
    pki = await make_pki(tmp, server_uri)
    trust = pki / "plc1"
    trust.mkdir()
    eq_file.write_text(eq_file.read_text().replace(
        'endpoint = "opc.tcp://', f'security = "SignAndEncrypt"\n'
        f'certificate = "{pki / "host.der"}"\nprivate_key = "{pki / "host.pem"}"\n'
        f'trust_dir = "{trust}"\nusername = "sfc"\npassword_env = "PLC1_PASSWORD"\n'
        'endpoint = "opc.tcp://'))
    return pki, trust


async def kill_mid_action(redis_url: str, mqtt_url: str, tmp: Path, port: int,
                          executing: Callable[[], Awaitable[bool]],
                          starts: Callable[[str], Awaitable[int]]) -> None:
    """Two ``sfc-host run`` processes share the units' server at ``port``; the one that
    started the filler is killed (SIGKILL) while ``executing()``. The other must take
    over the death, send the open command again, read from the unit that it took that
    command already, follow it to Complete and run ``THREE`` to its end: each unit
    started once per action (``starts(unit)``)."""
    from fault_harness import HostProcess, scrape

    await flush(redis_url)
    settings = {"redis_url": redis_url, "mqtt_url": mqtt_url, "scopes": [S],
                "equipment_opcua": str(equipment_file(tmp, port)), "claim_min_idle_ms": 300,
                "claim_interval_ms": 100, "log_level": "WARNING"}
    hosts = {n: HostProcess(n, tmp, settings) for n in ("kh1", "kh2")}
    orders = Host(HostConfig(redis_url=redis_url, consumer="kill-orders"), loops=False)
    order_key = f"sfc:{{{S}}}:order:K1"

    def sent(h: HostProcess) -> int:
        m = re.search(r"^sfc_equipment_opcua_commands_total\{[^}]*\} (\d+)",
                      scrape(h.metrics_port) or "", re.M)
        return int(m.group(1)) if m else 0

    async def ended() -> bool:
        st = await orders.client.hget(order_key, "state")
        return bool(st) and st.startswith(b"Ended")
    try:
        for h in hosts.values():
            await h.ready()
        await orders.store.put_work_master(S, THREE)
        await orders.orders.store_order(
            S, {"JobOrderID": "K1", "WorkMasterID": [{"ID": THREE["ID"]}]}, start=True)
        await wait_until(executing, 15, "the unit executing")
        await wait_until(lambda: any(sent(h) for h in hosts.values()), 10, "a sender")
        victim = next(h for h in hosts.values() if sent(h))
        victim.signal(signal.SIGKILL)
        await wait_until(ended, 30, "the job's end on the other host")
        st = await orders.client.hget(order_key, "state")
        assert st == b"Ended_Completed", (st, await orders.client.hget(order_key, "reason"))
        assert await starts("Filler1") == 2         # fill, fill_again
        assert await starts("Capper1") == 1
    finally:
        for h in hosts.values():
            h.stop()
        await orders.aclose()


async def weigh_jobs(plant: Any) -> None:
    """The scale's method as an action, on ``plant`` (bound with its method): Weigh's
    output argument is the job's result; a Bad status fails the action with its name."""
    wm = recipe([("weigh", "com.example.weigh.v1", {"Tare": 1.5, "Count": 3})],
                wm_id="wm-weigh")
    await plant.run_job(wm, "J7")
    await plant.wait_state("J7", "Ended_Completed")
    assert response_data(await plant.response("J7"))["weigh.Net"] == 28.5
    bad = recipe([("weigh", "com.example.weigh.v1", {"Tare": 0.0, "Count": 0})],
                 wm_id="wm-zero")
    await plant.run_job(bad, "J8")
    await plant.wait_state("J8", "Aborted")
    reason = await plant.app.host.client.hget(f"sfc:{{{S}}}:order:J8", "reason")
    assert b"BadOutOfRange" in reason, reason


async def weigh_puts(app: App, mqtt_url: str, wrong_count: float) -> str:
    """Over the MES wire, as an MES of the original sends it: a Work Master whose
    parameters match Weigh's arguments is stored; one with a Tare of the wrong type,
    a Count of ``wrong_count`` and a parameter Weigh lacks is refused, and not stored;
    the refusal's message."""
    from helpers.mes import WM, Mes
    from sfc_host.store.orders import INVALID_REQUEST, NO_ERROR
    async with Mes(mqtt_url, scope=S) as mes:
        good = recipe([("weigh", "com.example.weigh.v1", {"Tare": 1.5, "Count": 3})],
                      wm_id="wm-good")
        rep = await mes.call(WM, good, scope=S)
        assert rep["data"]["ReturnStatus"] == NO_ERROR, rep
        wrong = recipe([("weigh", "com.example.weigh.v1",
                         {"Tare": "heavy", "Count": wrong_count, "Extra": 1})], wm_id="wm-wrong")
        rep = await mes.call(WM, wrong, scope=S)
        assert rep["data"]["ReturnStatus"] == INVALID_REQUEST, rep
        text: str = rep["data"]["Message"]
        assert "SFC026 Actions[0].Parameters: parameter 'Tare': expected a number for " \
               "Double (method scale1, action 'weigh')" in text, text
        assert "parameter 'Extra' is no input argument of the method" in text, text
        assert await app.host.client.sismember(f"sfc:{{{S}}}:wms", "wm-good")
        assert not await app.host.client.sismember(f"sfc:{{{S}}}:wms", "wm-wrong")
    return text


async def x509_users(pki: Path, names: tuple[str, ...] = ("operator", "stranger")) -> None:
    """Certificates and keys of users (``pki/{name}.der``, ``pki/{name}.pem``)."""
    from asyncua.crypto.cert_gen import setup_self_signed_certificate
    from cryptography.x509.oid import ExtendedKeyUsageOID

    for name in names:
        await setup_self_signed_certificate(
            pki / f"{name}.pem", pki / f"{name}.der", f"urn:test:{name}", "localhost",
            [ExtendedKeyUsageOID.CLIENT_AUTH], {"commonName": name})


def certificate_users(known: bytes, seen: list[bytes] | None = None) -> Any:
    """An asyncua user manager that takes the X.509 user of certificate ``known``
    (DER) and no other; each certificate it is shown goes to ``seen``."""
    from asyncua.crypto.permission_rules import User, UserRole
    from asyncua.server.user_managers import UserManager
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import Encoding

    class Certificates(UserManager):
        def get_user(self, iserver: Any, username: str | None = None,
                     password: str | None = None, certificate: Any = None) -> Any:
            der = certificate.public_bytes(Encoding.DER) \
                if isinstance(certificate, x509.Certificate) else certificate
            if seen is not None:
                seen.append(der or b"")
            return User(role=UserRole.User, name="operator") if der == known else None
    return Certificates()

