"""The OPC UA face with a second, independent stack: node-opcua's client
(``tests/peers/opcua_client.mjs``, Node.js) against ``sfc-host run`` (real redis-server,
mosquitto and a station answering every command). It connects, browses to the scope's
objects by type, subscribes to the status events, Stores and Starts a job, follows it
to its end and reads its job response, and one of an unknown id; the job it stored
over OPC UA sends the MQTT status events as well.

node-opcua is installed by ``.ci/setup`` (``npm ci`` in ``tests/peers``, as aedes): without
Node.js or the package the test skips, and under CI it fails.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

from helpers.aio import run
from helpers.hosts import wait_until
from helpers.mes import answer_all
from helpers.mqtt_station import MqttStation
from helpers.node import NODE_ENV
from helpers.opcua import SCOPE, WM, running
from helpers.servers import PEERS

CLIENT = PEERS / "opcua_client.mjs"
JOB = "N1"
CLIENT_TIMEOUT_S = 30       # the client's own bound on the scenario


async def node_client(node: str, port: int, scope: str, job: str,
                      pki: Path) -> dict[str, Any]:
    """Run the node-opcua scenario (in a subprocess, the event loop free for the
    station meanwhile), its certificate store in ``pki``; what it saw, from its one
    JSON line."""
    proc = await asyncio.create_subprocess_exec(
        node, str(CLIENT), f"opc.tcp://127.0.0.1:{port}/sfc-host/", scope, job,
        str(CLIENT_TIMEOUT_S), cwd=str(PEERS),
        env={**os.environ, **NODE_ENV, "OPCUA_CLIENT_PKI": str(pki)},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), CLIENT_TIMEOUT_S + 10)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    text, errors = out.decode(), err.decode()
    assert proc.returncode == 0, f"node-opcua client exit {proc.returncode}:\n{errors}{text}"
    lines = [line for line in text.splitlines() if line.startswith("{")]
    assert lines, f"no JSON line from the node-opcua client:\n{text}\n{errors}"
    return dict(json.loads(lines[-1]))


def in_order(seen: list[str], wanted: list[str]) -> bool:
    """``wanted`` appear in ``seen`` in this order (others between allowed)."""
    it = iter(seen)
    return all(any(s == w for s in it) for w in wanted)


def test_a_node_opcua_mes_stores_starts_and_follows_a_job(
        node: str, redis_url: str, mqtt_url: str, tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path, redis_url, mqtt_url) as h, \
                MqttStation(mqtt_url, answer_all):
            seen = await node_client(node, h.port, SCOPE, JOB, tmp_path / "pki")
            # found by browsing, by type definition
            assert seen["receiver"].endswith(f"s={SCOPE}.JobOrderControl"), seen
            assert seen["provider"].endswith(f"s={SCOPE}.JobOrderResults"), seen
            # Store and Start: Good, ReturnStatus 1 as a UInt64
            for call in ("store", "start"):
                assert seen[call] == {"status": "Good", "returnStatus": 1,
                                      "returnStatusType": "UInt64"}, (call, seen[call])
            # the status events, their structures decoded, in order
            states = seen["states"]
            assert in_order(states, ["NotAllowedToStart_Ready", "Running",
                                     "Ended_Completed"]), states
            assert states[0] == "NotAllowedToStart_Ready", states
            for ev in seen["events"]:
                assert ev["eventType"].endswith("s=SfcJobOrderStatusEventType"), ev
                assert ev["message"] == f"{JOB} {ev['state']}", ev
                assert ev["workMasterID"] == [WM], ev
                assert ev["responseJobOrderID"] == JOB, ev
                assert ev["responseState"] == ev["state"], ev
            # the job response by id, with the order's actuals and the recipe's results
            response = seen["response"]
            assert response["status"] == "Good" and response["returnStatus"] == 1, response
            assert response["jobOrderID"] == JOB, response
            assert response["state"] == "Ended_Completed", response
            assert response["equipmentActuals"] == ["STATION-10"], response
            assert {"ID": "tighten.torque", "value": 85, "type": "Int64"} in response["data"], \
                response
            # an unknown id: Uncertain, ReturnStatus 2 (UnknownJobOrderId), no response
            unknown = seen["unknown"]
            assert unknown["status"] == "Uncertain", unknown
            assert unknown["returnStatus"] == 2, unknown
            assert unknown["jobResponse"] is None, unknown
            # the job stored over OPC UA sent the MQTT status events too
            await wait_until(lambda: "Ended_Completed" in h.mqtt_mes.states(JOB), 10,
                             f"{JOB}'s MQTT status events")
            mqtt_states = h.mqtt_mes.states(JOB)
            assert in_order(mqtt_states, ["NotAllowedToStart_Ready", "Running",
                                          "Ended_Completed"]), mqtt_states
    run(main(), 90)
