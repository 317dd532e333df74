"""A PLC that restarts mid-action and loses what it was doing: node-opcua's units
(``tests/peers/packml_unit.mjs``) killed while a unit works and started again on the
same port come back Idle, holding no command. The host, back on the link, reads that
the unit lost the command: the action fails at once with that reason, not at its
deadline, and the unit is not started again (what it did before the restart is not
known). A unit that still holds the command (a link that only dropped) is followed
instead, as the asyncua units' tests show."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

from asyncua import Client, ua
from helpers.aio import run
from helpers.hosts import flush, quick_config, wait_until
from helpers.node import start_peer, stop_peer
from helpers.opcua_equipment import S, equipment_file, recipe
from helpers.servers import free_port

from sfc_host.examples.packml_unit import URI
from sfc_host.service.app import App


async def units(node: str, port: int, tmp: Path, work_ms: int) -> asyncio.subprocess.Process:
    """The node-opcua units' server, once it listens."""
    return await start_peer(node, "packml_unit.mjs", [
        "--port", str(port), "--units", "Filler1,Capper1", "--work-ms", str(work_ms),
        "--pki", str(tmp / "node-pki")], "PackML units",
        tmp / f"packml_unit-{time.monotonic_ns()}.log")


def test_a_plc_restarted_mid_action_fails_the_action_at_once_and_is_not_started_again(
        node: str, redis_url: str, mqtt_url: str, tmp_path: Path) -> None:
    async def main() -> None:
        await flush(redis_url)
        port = free_port()
        proc = await units(node, port, tmp_path, 2500)
        wm = recipe([("fill", "com.example.fill.v1", {"setpoint": 3.0})], wm_id="wm-rs")
        wm["data"]["Actions"][0].update(TimeoutSeconds=60)
        app = App(quick_config(redis_url, mqtt_url=mqtt_url, scopes=[S], consumer="restart",
                               equipment_opcua=str(equipment_file(tmp_path, port))))
        try:
            await app.start(connect_timeout_s=5)
            eq = app.opcua_equipment
            await wait_until(lambda: not eq.not_ready(), 20, "the units bound")
            await app.host.store.put_work_master(S, wm)
            await app.host.orders.store_order(
                S, {"JobOrderID": "RS1", "WorkMasterID": [{"ID": "wm-rs"}]}, start=True)
            filler = eq.binding(S, "com.example.fill.v1")
            await wait_until(lambda: filler.state == "Execute", 15, "the unit at work")
            # the PLC goes down hard and comes back with nothing of what it did
            proc.send_signal(signal.SIGKILL)
            await proc.wait()
            t0 = time.monotonic()
            proc = await units(node, port, tmp_path, 200)

            async def state() -> str:
                raw = await app.host.client.hget(f"sfc:{{{S}}}:order:RS1", "state")
                return raw.decode() if raw else ""
            await wait_until(lambda: state(), 40, "the order")

            async def ended() -> bool:
                return (await state()).startswith(("Ended", "Aborted"))
            await wait_until(ended, 40, "the job's end")
            reason = await app.host.client.hget(f"sfc:{{{S}}}:order:RS1", "reason")
            assert await state() == "Aborted"
            assert b"unit filler1 lost command RS1:fill#1: it is Idle and holds command " \
                b"none (the PLC restarted?)" in reason
            assert time.monotonic() - t0 < 30      # on the link's return, not at 60 s
            watch = Client(f"opc.tcp://127.0.0.1:{port}/units/")
            await watch.connect()
            try:
                ns = await watch.get_namespace_index(URI)
                starts = await watch.get_node(ua.NodeId("Filler1.Starts", ns)).read_value()
                assert int(starts) == 0                # never started again blind
            finally:
                await watch.disconnect()
        finally:
            await app.aclose()
            await stop_peer(proc)
    run(main(), timeout=120)
