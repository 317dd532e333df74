"""One OPC UA server's link (``equipment.opcua.session.ServerLink``) on a real asyncua
server: a fault of ours that ends the link's loop is said in its status and the link
starts again, so it never ends in silence."""

from __future__ import annotations

import logging

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
