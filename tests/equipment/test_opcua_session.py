"""One OPC UA server's link (``equipment.opcua.session.ServerLink``) on a real asyncua
server: a fault of ours that ends the link's loop is said in its status and the link
starts again, so it never ends in silence."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from helpers.aio import run
from helpers.hosts import wait_until
from helpers.servers import free_port

from sfc_host.equipment.opcua import session
from sfc_host.equipment.opcua.session import ServerLink
from sfc_host.equipment.opcua.settings import ServerSettings
from sfc_host.examples.packml_unit import build


def test_a_link_that_fails_on_a_fault_of_ours_says_so_and_starts_again(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(session, "BACKOFF_S", (0.05, 0.1, 0.2))
    hooks = ServerLink._hooks
    calls = 0

    async def failing_once(self: ServerLink) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("a fault of ours")
        await hooks(self)
    monkeypatch.setattr(ServerLink, "_hooks", failing_once)

    async def main() -> None:
        port = free_port()
        server, _units = await build(port, ["Filler1"], 0.05)
        await server.start()
        link = ServerLink(ServerSettings("plc1", f"opc.tcp://127.0.0.1:{port}/units/"))
        try:
            with caplog.at_level(logging.ERROR, "sfc_host.equipment.opcua"):
                link.start()
                await wait_until(lambda: "the link failed" in link.status(), 10, "said")
            assert link.status() == ("OPC UA server plc1: the link failed (RuntimeError: a "
                                     "fault of ours); it starts again")
            assert "a fault of ours" in caplog.text
            await wait_until(lambda: link.status() == "", 10, "connected again")
            assert calls == 2
        finally:
            await link.aclose()
            await server.stop()
    run(main())


def test_a_link_with_an_x509_user_connects_and_a_stranger_is_told_why(
        tmp_path: Path) -> None:
    """The equipment file's ``user_certificate`` and ``user_private_key``: a server
    that knows the certificate takes the session; one it does not know is refused, and
    the link's status says which user to check."""
    import shutil

    from helpers.opcua_equipment import certificate_users, make_pki, x509_users

    async def main() -> None:
        pki = await make_pki(tmp_path, "urn:freeopcua:python:server")
        trust = pki / "plc1"
        trust.mkdir()
        shutil.copy(pki / "plc.der", trust / "plc.der")
        await x509_users(pki)
        port = free_port()
        server, _units = await build(port, ["Filler1"], 0.05,
                                     certificate=str(pki / "plc.der"),
                                     private_key=str(pki / "plc.pem"))
        server.iserver.set_user_manager(
            certificate_users((pki / "operator.der").read_bytes()))
        server.set_security_IDs(["Basic256Sha256"])
        async with server:
            for user, ok in (("stranger", False), ("operator", True)):
                link = ServerLink(ServerSettings(
                    "plc1", f"opc.tcp://127.0.0.1:{port}/units/", "SignAndEncrypt",
                    str(pki / "host.der"), str(pki / "host.pem"), str(trust),
                    user_certificate=str(pki / f"{user}.der"),
                    user_private_key=str(pki / f"{user}.pem")))
                try:
                    link.start()
                    if ok:
                        await wait_until(lambda link=link: link.status() == "", 20,
                                         "connected")
                    else:
                        await wait_until(lambda link=link: "X.509 user" in link.status(),
                                         20, "the refusal said")
                        assert "stranger.der" in link.status()
                finally:
                    await link.aclose()
    run(main())
