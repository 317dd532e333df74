"""The OPC UA client of our own against real servers: asyncua's (the example PackML
units) and node-opcua's (``tests/peers/packml_unit.mjs``), without security and with
Basic256Sha256 SignAndEncrypt and a user: endpoints, sessions, Read, Write, Call,
Browse, TranslateBrowsePaths, subscriptions to data changes and events, and a server
that goes away."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest
from asyncua import Server, ua
from cryptography.hazmat.primitives.serialization import load_pem_private_key
from helpers.aio import run
from helpers.node import start_peer, stop_peer
from helpers.opcua_equipment import add_scale, make_pki
from helpers.servers import free_port

from sfc_fast.wire.uabinary import (
    DOUBLE,
    STRING,
    UINT16,
    ExtensionObject,
    LocalizedText,
    NodeId,
    QualifiedName,
    Variant,
    Writer,
)
from sfc_host.examples.packml_unit import URI, build
from sfc_host.opcua_client.client import Client, find_endpoint, get_endpoints
from sfc_host.opcua_client.errors import BadStatus, ChannelError, OpcUaError
from sfc_host.opcua_client.security import MODE_NONE, MODE_SIGN_AND_ENCRYPT

PACKML = "http://opcfoundation.org/UA/PackML/"


class Feed:
    """A subscription handler that keeps what arrives."""

    def __init__(self) -> None:
        self.changes: list[tuple[int, Any]] = []
        self.events: list[tuple[int, list[Any]]] = []
        self.changed = asyncio.Event()

    def data_changed(self, handle: int, value: Any) -> None:
        self.changes.append((handle, value))
        self.changed.set()

    def event(self, handle: int, fields: list[Any]) -> None:
        self.events.append((handle, fields))
        self.changed.set()

    async def until(self, ok: Any, timeout: float = 10.0) -> None:
        end = asyncio.get_running_loop().time() + timeout
        while not ok():
            self.changed.clear()
            left = end - asyncio.get_running_loop().time()
            assert left > 0, f"not seen in time: {self.changes[-5:]} {self.events[-5:]}"
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), left)


def states(feed: Feed) -> list[str]:
    return [v.value.value.text for _h, v in feed.changes if v.value is not None]


async def descriptor(client: Client, name: str, value: float = 0.0) -> ExtensionObject:
    """A PackMLDescriptorDataType, encoded by its fields (OPC 30050): the encoding's id
    browsed from the data type."""
    packml = await client.namespace_index(PACKML)
    refs = await client.browse(NodeId(16, packml), 38)          # HasEncoding
    enc = next(r.node for r in refs if r.browse_name.name == "Default Binary")
    w = Writer()
    w.int32(0)
    w.string(name)
    w.string(None)                      # EUInformation: namespace URI, unit id, names
    w.int32(-1)
    w.localized_text(LocalizedText(None))
    w.localized_text(LocalizedText(None))
    w.float32(value)
    return ExtensionObject(enc, w.getvalue())


async def run_unit(client: Client) -> None:
    """The unit's whole cycle through the client: its nodes found by browse path, a
    write, Start with a descriptor, the state followed by a subscription to Complete,
    Reset, and a method's output and Bad status."""
    ns = await client.namespace_index(URI)
    packml = await client.namespace_index(PACKML)
    unit = await client.node(f"nsu={URI};s=Filler1")
    assert unit == NodeId("Filler1", ns)
    sm = await client.child(unit, QualifiedName("BaseStateMachine", packml))
    state = await client.child(sm, QualifiedName("CurrentState", 0))
    start, reset = await client.translate([(sm, [QualifiedName("Start", packml)]),
                                           (sm, [QualifiedName("Reset", packml)])])
    assert start is not None and reset is not None
    assert await client.translate([(sm, [QualifiedName("NoSuch", packml)])]) == [None]
    with pytest.raises(BadStatus, match="BadNoMatch"):
        await client.child(sm, QualifiedName("NoSuch", packml))
    [now] = await client.read_values([state])
    assert now == LocalizedText("Idle", now.locale)
    cid = NodeId("Filler1.CommandId", ns)
    await client.write_values([(NodeId("Filler1.Setpoint", ns), Variant(DOUBLE, 12.5)),
                               (cid, Variant(STRING, "c-1"))])
    assert await client.read_values([NodeId("Filler1.Setpoint", ns), cid]) == [12.5, "c-1"]
    [bad] = await client.write([(NodeId("Filler1.Result", ns), Variant(DOUBLE, 1.0))])
    assert bad & 0x80000000                        # not writable: its status, not a raise
    # the reads of one event-loop pass go in one request; each caller gets its own
    # results, and a node that is not there fails its caller only
    assert client.channel is not None
    sent = client.channel.requests
    got = await asyncio.gather(*(client.read_values([cid, NodeId(2259)]) for _ in range(30)),
                               client.read_values([NodeId("NoSuchNode", ns)]),
                               return_exceptions=True)
    assert client.channel.requests == sent + 1
    assert got[:30] == [["c-1", 0]] * 30
    assert isinstance(got[30], BadStatus) and got[30].name == "BadNodeIdUnknown"
    names = {r.browse_name.name for r in await client.browse(NodeId(85))}   # Objects
    assert {"Filler1", "Server"} <= names

    feed = Feed()
    sub = await client.create_subscription(10, feed)
    [handle] = await sub.watch([state], queue=16)
    await feed.until(lambda: states(feed) == ["Idle"])
    assert feed.changes[0][0] == handle and feed.changes[0][1].source_time
    [res] = await client.call([(sm, start, [Variant(22, await descriptor(client, "c-1"))])])
    assert res.status == 0, hex(res.status)
    await feed.until(lambda: "Complete" in states(feed))
    assert states(feed)[:2] == ["Idle", "Starting"]
    [res] = await client.call([(sm, reset, [])])
    assert res.status == 0
    await feed.until(lambda: states(feed)[-1] == "Idle")
    await sub.delete()

    scale = await client.node(f"nsu={URI};s=Scale1")
    weigh = await client.node(f"nsu={URI};s=Scale1.Weigh")
    ok, zero = await client.call([
        (scale, weigh, [Variant(DOUBLE, 1.5), Variant(UINT16, 3)]),
        (scale, weigh, [Variant(DOUBLE, 1.5), Variant(UINT16, 0)])])
    assert ok.status == 0 and ok.outputs == [28.5]
    assert BadStatus(zero.status).name == "BadOutOfRange"


def test_a_session_on_asyncuas_units_without_security() -> None:
    async def main() -> None:
        port = free_port()
        server, _units = await build(port, ["Filler1"], 0.02)
        await add_scale(server)
        async with server:
            url = f"opc.tcp://127.0.0.1:{port}/units/"
            eps = await get_endpoints(url)
            ep = find_endpoint(eps, MODE_NONE)
            with pytest.raises(OpcUaError, match="no endpoint for SignAndEncrypt"):
                find_endpoint(eps, MODE_SIGN_AND_ENCRYPT)
            client = Client(url)
            await client.connect(ep)
            try:
                await run_unit(client)
            finally:
                await client.close()
            with pytest.raises(ChannelError):
                await client.read_values([NodeId(2259)])
    run(main())


def _secure_client(url: str, pki: Path, password: str) -> Client:
    return Client(url, mode=MODE_SIGN_AND_ENCRYPT,
                  certificate=(pki / "host.der").read_bytes(),
                  private_key=load_pem_private_key((pki / "host.pem").read_bytes(), None),
                  username="sfc", password=password,
                  application_uri="urn:sfc-fast:equipment-client")


def test_sign_and_encrypt_with_a_user_on_asyncuas_units(tmp_path: Path) -> None:
    async def main() -> None:
        pki = await make_pki(tmp_path, "urn:freeopcua:python:server")
        port = free_port()
        server, _units = await build(port, ["Filler1"], 0.02,
                                     certificate=str(pki / "plc.der"),
                                     private_key=str(pki / "plc.pem"),
                                     users={"sfc": "plc-secret"})
        await add_scale(server)
        async with server:
            url = f"opc.tcp://127.0.0.1:{port}/units/"
            ep = find_endpoint(await get_endpoints(url), MODE_SIGN_AND_ENCRYPT)
            assert ep.server_certificate == (pki / "plc.der").read_bytes()
            wrong = _secure_client(url, pki, "not-it")
            with pytest.raises(BadStatus, match=r"BadUserAccessDenied|BadIdentityToken"):
                await wrong.connect(ep)
            client = _secure_client(url, pki, "plc-secret")
            await client.connect(ep)
            try:
                await run_unit(client)
            finally:
                await client.close()
    run(main())


def test_events_of_a_type_with_their_fields(tmp_path: Path) -> None:
    async def main() -> None:
        port = free_port()
        server = Server()
        await server.init()
        server.set_endpoint(f"opc.tcp://127.0.0.1:{port}/events/")
        ns = await server.register_namespace("urn:test:client-events")
        etype = await server.create_custom_event_type(
            ns, "RejectEventType", ua.ObjectIds.BaseEventType,
            [("RejectCode", ua.VariantType.Int32)])
        gen = await server.get_event_generator(etype)
        async with server:
            client = Client(f"opc.tcp://127.0.0.1:{port}/events/")
            await client.connect()
            try:
                feed = Feed()
                sub = await client.create_subscription(20, feed)
                base, reject = NodeId(2041), NodeId(etype.nodeid.Identifier, ns)
                await sub.watch_events(NodeId(2253), [(base, [QualifiedName("Message")]),
                                                      (reject, [QualifiedName("RejectCode", ns)]),
                                                      (base, [QualifiedName("Severity")])],
                                       [reject])
                await asyncio.sleep(0.1)
                gen.event.Message = ua.LocalizedText("seal torn")
                gen.event.RejectCode = 7
                gen.event.Severity = 600
                await gen.trigger()
                await feed.until(lambda: feed.events)
                [(_h, fields)] = feed.events
                assert fields[0].text == "seal torn" and fields[1:] == [7, 600]
            finally:
                await client.close()
    run(main())


def test_a_server_that_goes_away_fails_what_waits_and_says_closed() -> None:
    async def main() -> None:
        port = free_port()
        server, _units = await build(port, ["Filler1"], 0.02)
        await server.start()
        client = Client(f"opc.tcp://127.0.0.1:{port}/units/", timeout_s=2.0)
        await client.connect()
        try:
            feed = Feed()
            sub = await client.create_subscription(10, feed)
            await sub.watch([NodeId(2259)])
            await server.stop()
            await asyncio.wait_for(asyncio.shield(client.closed), 10)
            with pytest.raises(ChannelError):
                await client.read_values([NodeId(2259)])
        finally:
            await client.close()
    run(main())


def test_a_session_on_node_opcua_units_plain_and_secured(node: str, tmp_path: Path) -> None:
    async def main() -> None:
        pki = await make_pki(tmp_path, "urn:test:node-plc1")
        for secure in (False, True):
            port = free_port()
            args = ["--port", str(port), "--units", "Filler1", "--work-ms", "20",
                    "--pki", str(tmp_path / f"node-pki-{secure}")]
            if secure:
                args += ["--secure", "--cert", str(pki / "plc.der"), "--key",
                         str(pki / "plc.pem"), "--uri", "urn:test:node-plc1",
                         "--user", "sfc:plc-secret-2"]
            proc = await start_peer(node, "packml_unit.mjs", args, "PackML units",
                                    tmp_path / f"packml_unit_{secure}.log")
            try:
                url = f"opc.tcp://127.0.0.1:{port}/units/"
                client = _secure_client(url, pki, "plc-secret-2") if secure else Client(url)
                await client.connect()
                try:
                    await run_unit(client)
                finally:
                    await client.close()
            finally:
                await stop_peer(proc)
    run(main())


def test_an_x509_user_on_asyncuas_units(tmp_path: Path) -> None:
    """A session whose user is a certificate (its token signed with the user's key):
    the server's user manager takes the one it knows and refuses another."""
    from helpers.opcua_equipment import certificate_users, x509_users

    async def main() -> None:
        pki = await make_pki(tmp_path, "urn:freeopcua:python:server")
        await x509_users(pki)
        known = (pki / "operator.der").read_bytes()
        seen: list[bytes] = []
        port = free_port()
        server, _units = await build(port, ["Filler1"], 0.02,
                                     certificate=str(pki / "plc.der"),
                                     private_key=str(pki / "plc.pem"))
        server.iserver.set_user_manager(certificate_users(known, seen))
        server.set_security_IDs(["Basic256Sha256"])
        async with server:
            url = f"opc.tcp://127.0.0.1:{port}/units/"

            def client(user: str) -> Client:
                return Client(url, mode=MODE_SIGN_AND_ENCRYPT,
                              certificate=(pki / "host.der").read_bytes(),
                              private_key=load_pem_private_key(
                                  (pki / "host.pem").read_bytes(), None),
                              user_certificate=(pki / f"{user}.der").read_bytes(),
                              user_key=load_pem_private_key(
                                  (pki / f"{user}.pem").read_bytes(), None),
                              application_uri="urn:sfc-fast:equipment-client")
            with pytest.raises(BadStatus):
                await client("stranger").connect()
            c = client("operator")
            await c.connect()
            try:
                [state] = await c.read_values([NodeId(2259)])
                assert state == 0                       # Running
            finally:
                await c.close()
            assert known in seen
    run(main())


@pytest.mark.parametrize("mode", ["None", "Sign", "SignAndEncrypt"])
def test_messages_over_one_chunk_both_ways_in_each_mode(tmp_path: Path, mode: str) -> None:
    """A value of 200,000 bytes written (our request in chunks) and read back (the
    server's response in chunks), on asyncua's server in each security mode."""
    from sfc_host.opcua_client.security import MODE_SIGN

    async def main() -> None:
        pki = await make_pki(tmp_path, "urn:freeopcua:python:server")
        port = free_port()
        server = Server()
        await server.init()
        server.set_endpoint(f"opc.tcp://127.0.0.1:{port}/big/")
        if mode == "None":
            server.set_security_policy([ua.SecurityPolicyType.NoSecurity])
        else:
            await server.load_certificate(str(pki / "plc.der"))
            await server.load_private_key(str(pki / "plc.pem"))
            server.set_security_policy([ua.SecurityPolicyType.Basic256Sha256_Sign
                                        if mode == "Sign" else
                                        ua.SecurityPolicyType.Basic256Sha256_SignAndEncrypt])
        ns = await server.register_namespace("urn:test:big")
        var = await server.nodes.objects.add_variable(
            ua.NodeId("Big", ns), ua.QualifiedName("Big", ns),
            ua.Variant([0.0], ua.VariantType.Double))
        await var.set_writable()
        async with server:
            url = f"opc.tcp://127.0.0.1:{port}/big/"
            modes = {"None": MODE_NONE, "Sign": MODE_SIGN,
                     "SignAndEncrypt": MODE_SIGN_AND_ENCRYPT}
            client = Client(url, mode=modes[mode],
                            certificate=(pki / "host.der").read_bytes(),
                            private_key=load_pem_private_key((pki / "host.pem").read_bytes(),
                                                             None),
                            application_uri="urn:sfc-fast:equipment-client")
            await client.connect()
            try:
                big = [i / 7 for i in range(25_000)]        # 200,000 bytes of doubles
                await client.write_values([(NodeId("Big", ns), Variant(DOUBLE, big))])
                assert await var.read_value() == big
                [back] = await client.read_values([NodeId("Big", ns)])
                assert back == big
            finally:
                await client.close()
    run(main())
