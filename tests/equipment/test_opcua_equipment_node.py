"""Equipment over OPC UA against a second, independent server stack: the example PackML
units written again on node-opcua's server (``tests/peers/packml_unit.mjs``, Node.js),
driven by a whole host (``App``, real Redis and broker) with the same equipment file as
the asyncua units (``nsu=`` node ids). The host is watched from the outside through an
asyncua client of its own, as an operator's panel would.

node-opcua is installed by ``.ci/setup`` (``npm ci`` in ``tests/peers``): without Node.js
20+ or the package the tests skip, and under CI they fail.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from asyncua import Client, Node, ua
from helpers.aio import run
from helpers.hosts import flush, quick_config, wait_until
from helpers.node import start_peer
from helpers.opcua_equipment import (
    THREE,
    Plant,
    S,
    equipment_file,
    kill_mid_action,
    recipe,
    response_data,
    weigh_jobs,
    weigh_puts,
)
from helpers.servers import free_port

from sfc_host.examples.packml_unit import PACKML_URI, URI
from sfc_host.service.app import App

READY_S = 30                            # node-opcua loads the standard nodeset first


class NodeUnits:
    """The node-opcua units' server in a subprocess, and an asyncua client that watches
    and pokes the units from outside (their state, Starts, Fault)."""

    def __init__(self, node: str, tmp: Path, port: int, work_s: float) -> None:
        self.node, self.tmp, self.port, self.work_s = node, tmp, port, work_s
        self.endpoint = f"opc.tcp://127.0.0.1:{port}/units/"
        self.log = tmp / "packml_unit.log"
        self.proc: asyncio.subprocess.Process | None = None
        self.client: Client | None = None
        self._nodes: dict[str, Node] = {}

    async def start(self) -> None:
        self.proc = await start_peer(self.node, "packml_unit.mjs", [
            "--port", str(self.port), "--units", "Filler1,Capper1",
            "--work-ms", str(self.work_s * 1000), "--pki", str(self.tmp / "pki")],
            "PackML units", self.log, READY_S)
        self.client = Client(self.endpoint)
        await self.client.connect()
        packml = await self.client.get_namespace_index(PACKML_URI)
        ns = await self.client.get_namespace_index(URI)
        for name in ("Filler1", "Capper1"):
            unit = self.client.get_node(ua.NodeId(name, ns))
            sm = await unit.get_child(f"{packml}:BaseStateMachine")
            self._nodes[f"{name}.sm"] = sm
            self._nodes[f"{name}.state"] = await sm.get_child("0:CurrentState")
            self._nodes[f"{name}.Unhold"] = await sm.get_child(f"{packml}:Unhold")
            for var in ("Starts", "Fault"):
                self._nodes[f"{name}.{var}"] = self.client.get_node(ua.NodeId(f"{name}.{var}",
                                                                              ns))

    async def stop(self, check: bool) -> None:
        if self.client is not None:
            await self.client.disconnect()
        if self.proc is None or self.proc.returncode is not None:
            return
        self.proc.terminate()
        try:
            rc = await asyncio.wait_for(self.proc.wait(), 10)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
            raise
        if check:       # SIGTERM shuts the server down cleanly
            assert rc == 0, f"packml_unit.mjs exit {rc} on SIGTERM:\n{self.log.read_text()}"

    async def state(self, unit: str) -> str:
        return str((await self._nodes[f"{unit}.state"].read_value()).Text)

    async def starts(self, unit: str) -> int:
        return int(await self._nodes[f"{unit}.Starts"].read_value())

    async def set_fault(self, unit: str) -> None:
        await self._nodes[f"{unit}.Fault"].write_value(ua.Variant(True, ua.VariantType.Boolean))

    async def unhold(self, unit: str) -> None:
        await self._nodes[f"{unit}.sm"].call_method(self._nodes[f"{unit}.Unhold"])

    async def in_state(self, unit: str, *states: str) -> bool:
        return await self.state(unit) in states


class NodePlant:
    """The node-opcua units, a host on them (the asyncua units' equipment file), and the
    job helpers."""

    def __init__(self, node: str, redis_url: str, mqtt_url: str, tmp_path: Path, *,
                 work_s: float = 0.05, method: bool = False) -> None:
        self.redis_url, self.mqtt_url, self.tmp = redis_url, mqtt_url, tmp_path
        self.units = NodeUnits(node, tmp_path, free_port(), work_s)
        self.method = method        # the scale's Weigh bound too
        self.app: App | None = None

    async def __aenter__(self) -> NodePlant:
        await flush(self.redis_url)
        await self.units.start()
        cfg = quick_config(self.redis_url, mqtt_url=self.mqtt_url, scopes=[S],
                           consumer="opcua-eq-node",
                           equipment_opcua=str(equipment_file(self.tmp, self.units.port,
                                                              method=self.method)))
        self.app = App(cfg)
        await self.app.start(connect_timeout_s=5)
        eq = self.app.opcua_equipment
        await wait_until(lambda: not eq.not_ready(), 15, "the units bound")
        return self

    async def __aexit__(self, exc_type: object, *exc: object) -> None:
        try:
            if self.app is not None:
                await self.app.aclose()
        finally:
            await self.units.stop(check=exc_type is None)

    async def run_job(self, wm: dict[str, Any], job: str) -> None:
        assert self.app is not None
        await self.app.host.store.put_work_master(S, wm)
        await self.app.host.orders.store_order(
            S, {"JobOrderID": job, "WorkMasterID": [{"ID": wm["ID"]}]}, start=True)

    async def order(self, job: str, field: str) -> str:
        assert self.app is not None
        raw = await self.app.host.client.hget(f"sfc:{{{S}}}:order:{job}", field)
        return raw.decode() if raw else ""

    async def wait_state(self, job: str, prefix: str, timeout: float = 20) -> None:
        async def reached() -> bool:
            return (await self.order(job, "state")).startswith(prefix)
        try:
            await wait_until(reached, timeout, f"job {job} {prefix}")
        except AssertionError as e:
            state, reason = await self.order(job, "state"), await self.order(job, "reason")
            raise AssertionError(f"{e}: it is {state} ({reason})") from None

    async def response(self, job: str) -> dict[str, Any]:
        assert self.app is not None
        raw = await self.app.host.client.get(f"sfc:{{{S}}}:response:{job}")
        return json.loads(raw) if raw else {}


# the capper's offset has no variable of its own: it goes through SetParameter, whose
# argument the PackML model declares an array of descriptors (node-opcua checks it)
WITH_OFFSET = recipe([("fill", "com.example.fill.v1", {"setpoint": 3.0}),
                      ("cap", "com.example.cap.v1", {"offset": 0.5}),
                      ("fill_again", "com.example.fill.v1", {"setpoint": 1.25})],
                     wm_id="wm-offset")


def test_a_recipe_of_three_actions_on_two_node_opcua_units_runs_to_the_end(
        node: str, redis_url: str, mqtt_url: str, tmp_path: Path) -> None:
    async def main() -> None:
        async with NodePlant(node, redis_url, mqtt_url, tmp_path) as p:
            u = p.units
            await p.run_job(THREE, "J1")
            await p.wait_state("J1", "Ended_Completed")
            data = response_data(await p.response("J1"))
            assert data["fill.filled"] == 2.5 and data["fill_again.filled"] == 4.0, data
            assert await u.starts("Filler1") == 2 and await u.starts("Capper1") == 1
            # each unit reset after its work: Idle for the next job
            await wait_until(lambda: u.in_state("Filler1", "Idle"), 5, "the filler reset")
            await wait_until(lambda: u.in_state("Capper1", "Idle"), 5, "the capper reset")
            await p.run_job(WITH_OFFSET, "J2")
            await p.wait_state("J2", "Ended_Completed")
            data = response_data(await p.response("J2"))
            assert data["fill.filled"] == 3.0 and data["fill_again.filled"] == 1.25, data
            assert data["cap.torque"] == 0.5, data
            assert await u.starts("Filler1") == 4 and await u.starts("Capper1") == 2
            # a command the unit's state does not allow: refused with BadInvalidState
            await wait_until(lambda: u.in_state("Filler1", "Idle"), 5, "the filler reset")
            with pytest.raises(ua.uaerrors.BadInvalidState):
                await u.unhold("Filler1")
    run(main())


def test_mes_pause_holds_the_node_opcua_unit_and_resume_brings_it_back(
        node: str, redis_url: str, mqtt_url: str, tmp_path: Path) -> None:
    async def main() -> None:
        # work long enough that the Pause reaches the unit before it completes, on a
        # loaded machine as well
        async with NodePlant(node, redis_url, mqtt_url, tmp_path, work_s=3.0) as p:
            assert p.app is not None
            u = p.units
            wm = recipe([("fill", "com.example.fill.v1", {"setpoint": 1.0})], hold=True)
            await p.run_job(wm, "J4")
            await wait_until(lambda: u.in_state("Filler1", "Execute"), 10,
                             "the unit executing")
            # once the command is marked sent (a hold of work not known to be out is
            # answered "not held" by the host itself, and the work goes on)
            await wait_until(lambda: p.app.host.client.hexists(f"sfc:{{{S}}}:job:J4",
                                                               "sent:fill"), 10, "the marker")
            await p.app.host.orders.trigger(S, "J4", "Pause")
            await wait_until(lambda: u.in_state("Filler1", "Held"), 10, "the unit held")
            await p.wait_state("J4", "Interrupted")
            await asyncio.sleep(0.3)
            assert await u.state("Filler1") == "Held"
            await p.app.host.orders.trigger(S, "J4", "Resume")
            await wait_until(lambda: u.in_state("Filler1", "Execute", "Complete", "Idle"), 10,
                             "the unit executing again")
            await p.wait_state("J4", "Ended_Completed")
            assert response_data(await p.response("J4"))["fill.filled"] == 1.0
            assert await u.starts("Filler1") == 1     # Unhold, not a second Start
    run(main())


def test_a_node_opcua_unit_that_aborts_fails_its_action_with_the_stop_reason(
        node: str, redis_url: str, mqtt_url: str, tmp_path: Path) -> None:
    async def main() -> None:
        async with NodePlant(node, redis_url, mqtt_url, tmp_path) as p:
            await p.units.set_fault("Capper1")
            await p.run_job(THREE, "J3")
            await p.wait_state("J3", "Aborted")
            reason = await p.order("J3", "reason")
            assert "unit capper1 went Aborted" in reason, reason
            assert "fault injected: jam in the infeed" in reason, reason
            assert await p.units.starts("Filler1") == 1    # the job went no further
            assert await p.units.starts("Capper1") == 1
    run(main())


def test_set_parameter_takes_an_array_of_descriptors_on_the_asyncua_units_too(
        redis_url: str, mqtt_url: str, tmp_path: Path) -> None:
    """The host sends SetParameter's argument as the method declares it (an array, as
    the model has it), which the asyncua units take as well."""
    async def main() -> None:
        async with Plant(redis_url, mqtt_url, tmp_path) as p:
            await p.run_job(WITH_OFFSET, "J5")
            await p.wait_state("J5", "Ended_Completed")
            data = response_data(await p.response("J5"))
            assert data["cap.torque"] == 0.5 and data["fill.filled"] == 3.0, data
    run(main())


def test_a_method_call_on_a_node_opcua_server_and_its_bad_status(
        node: str, redis_url: str, mqtt_url: str, tmp_path: Path) -> None:
    """The method binding against node-opcua's server: its declared arguments (read from
    node-opcua's InputArguments) type the recipe's parameters, the output argument is the
    result, a Bad status fails the action with its name."""
    async def main() -> None:
        async with NodePlant(node, redis_url, mqtt_url, tmp_path, method=True) as p:
            await weigh_jobs(p)
    run(main())


def test_a_work_master_put_is_checked_against_a_node_opcua_methods_arguments(
        node: str, redis_url: str, mqtt_url: str, tmp_path: Path) -> None:
    """Over the MES wire: parameters that do not match node-opcua's declared arguments by
    name and type are refused with the compiler's codes, and nothing is stored."""
    async def main() -> None:
        async with NodePlant(node, redis_url, mqtt_url, tmp_path, method=True) as p:
            assert p.app is not None
            text = await weigh_puts(p.app, mqtt_url, 70000)
            assert "parameter 'Count': 70000 is out of UInt16's range" in text, text
    run(main())


def test_a_host_killed_mid_action_on_node_opcua_units_is_finished_by_another(
        node: str, redis_url: str, mqtt_url: str, tmp_path: Path) -> None:
    """The kill -9 of the asyncua units' test, on node-opcua's units: the host that takes
    over recognises from the unit's CommandId that it took the command already, and
    starts no unit twice."""
    async def main() -> None:
        units = NodeUnits(node, tmp_path, free_port(), 3.0)
        await units.start()
        ok = False
        try:
            await kill_mid_action(redis_url, mqtt_url, tmp_path, units.port,
                                  lambda: units.in_state("Filler1", "Execute"), units.starts)
            ok = True
        finally:
            await units.stop(check=ok)
    run(main(), timeout=150)
