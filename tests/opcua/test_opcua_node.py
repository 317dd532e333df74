"""The OPC UA face with a second, independent stack: node-opcua's client
(``tests/peers/opcua_client.mjs``, Node.js) against ``sfc-host run`` (real redis-server,
mosquitto and a station answering every command). It connects, browses to the scope's
objects by type, subscribes to the status events, Stores and Starts a job, follows it
to its end and reads its job response, and one of an unknown id; the job it stored
over OPC UA sends the MQTT status events as well. The same again over Basic256Sha256
SignAndEncrypt as a user (the host secured as ``tests/opcua/test_opcua_security.py``
runs it): the client's certificate refused until the administrator trusts it, then the
scenario (also over Sign), then a wrong password refused.

node-opcua is installed by ``.ci/setup`` (``npm ci`` in ``tests/peers``, as aedes): without
Node.js or the package the test skips, and under CI it fails.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path
from typing import Any

from helpers.aio import run
from helpers.hosts import flush, stop_cleanly, wait_until
from helpers.mes import answer_all
from helpers.mqtt_station import MqttStation
from helpers.node import NODE_ENV
from helpers.opcua import PASSWORD, SCOPE, WM, Site, running
from helpers.servers import PEERS

CLIENT = PEERS / "opcua_client.mjs"
JOB = "N1"
CLIENT_TIMEOUT_S = 30       # the client's own bound on the scenario


async def _node_client(node: str, port: int, scope: str, job: str, pki: Path,
                       env: dict[str, str] | None) -> tuple[int, str, str]:
    """Run the node-opcua scenario (in a subprocess, the event loop free for the
    station meanwhile): its exit code, stdout and stderr."""
    proc = await asyncio.create_subprocess_exec(
        node, str(CLIENT), f"opc.tcp://127.0.0.1:{port}/sfc-host/", scope, job,
        str(CLIENT_TIMEOUT_S), cwd=str(PEERS),
        env={**os.environ, **NODE_ENV, "OPCUA_CLIENT_PKI": str(pki), **(env or {})},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), CLIENT_TIMEOUT_S + 10)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def node_client(node: str, port: int, scope: str, job: str, pki: Path,
                      env: dict[str, str] | None = None) -> dict[str, Any]:
    """The node-opcua scenario, its certificate store in ``pki``, ``env`` its settings
    (``OPCUA_SECURITY``, ``OPCUA_USER``, ``OPCUA_PASSWORD``); what it saw, from its one
    JSON line."""
    code, text, errors = await _node_client(node, port, scope, job, pki, env)
    assert code == 0, f"node-opcua client exit {code}:\n{errors}{text}"
    lines = [line for line in text.splitlines() if line.startswith("{")]
    assert lines, f"no JSON line from the node-opcua client:\n{text}\n{errors}"
    return dict(json.loads(lines[-1]))


async def node_client_refused(node: str, port: int, pki: Path, env: dict[str, str]) -> str:
    """The node-opcua client refused (exit 1, no scenario run): its error output."""
    code, text, errors = await _node_client(node, port, SCOPE, "refused", pki, env)
    assert code == 1, f"node-opcua client exit {code}:\n{errors}{text}"
    assert not any(line.startswith("{") for line in text.splitlines()), text
    return errors


def in_order(seen: list[str], wanted: list[str]) -> bool:
    """``wanted`` appear in ``seen`` in this order (others between allowed)."""
    it = iter(seen)
    return all(any(s == w for s in it) for w in wanted)


def check_scenario(seen: dict[str, Any], job: str = JOB) -> None:
    """What the node-opcua client saw of the scenario with ``job``, as it should be."""
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
        assert ev["message"] == f"{job} {ev['state']}", ev
        assert ev["workMasterID"] == [WM], ev
        assert ev["responseJobOrderID"] == job, ev
        assert ev["responseState"] == ev["state"], ev
    # the job response by id, with the order's actuals and the recipe's results
    response = seen["response"]
    assert response["status"] == "Good" and response["returnStatus"] == 1, response
    assert response["jobOrderID"] == job, response
    assert response["state"] == "Ended_Completed", response
    assert response["equipmentActuals"] == ["STATION-10"], response
    assert {"ID": "tighten.torque", "value": 85, "type": "Int64"} in response["data"], \
        response
    # an unknown id: Uncertain, ReturnStatus 2 (UnknownJobOrderId), no response
    unknown = seen["unknown"]
    assert unknown["status"] == "Uncertain", unknown
    assert unknown["returnStatus"] == 2, unknown
    assert unknown["jobResponse"] is None, unknown


def test_a_node_opcua_mes_stores_starts_and_follows_a_job(
        node: str, redis_url: str, mqtt_url: str, tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path, redis_url, mqtt_url) as h, \
                MqttStation(mqtt_url, answer_all):
            seen = await node_client(node, h.port, SCOPE, JOB, tmp_path / "pki")
            check_scenario(seen)
            # the job stored over OPC UA sent the MQTT status events too
            await wait_until(lambda: "Ended_Completed" in h.mqtt_mes.states(JOB), 10,
                             f"{JOB}'s MQTT status events")
            mqtt_states = h.mqtt_mes.states(JOB)
            assert in_order(mqtt_states, ["NotAllowedToStart_Ready", "Running",
                                          "Ended_Completed"]), mqtt_states
    run(main(), 90)


def test_a_node_opcua_mes_over_sign_and_encrypt_as_a_user(
        node: str, redis_url: str, mqtt_url: str, tmp_path: Path) -> None:
    """Basic256Sha256 SignAndEncrypt (and Sign), user ``op``: our secure channel,
    sessions and user tokens against another stack's, and the trust workflow of
    docs/opcua.md."""
    pki = tmp_path / "node-pki"     # the client's own certificate, made on its first run
    secure = {"OPCUA_SECURITY": "SignAndEncrypt", "OPCUA_USER": "op",
              "OPCUA_PASSWORD": PASSWORD}

    async def main() -> None:
        await flush(redis_url)
        site = Site(tmp_path, redis_url, mqtt_url)
        await site.make()
        host = await site.start()
        try:
            # a certificate the host has never seen: refused, kept for the administrator
            # (node-opcua's client reports the ERR that answers its OPN only as a closed
            # connection, so the host's log and rejected/ say why)
            why = await node_client_refused(node, site.port, pki, secure)
            assert "rejected by server" in why, why
            rejected = list((site.pki / "rejected").iterdir())
            assert len(rejected) == 1, rejected
            # ... who trusts it: the next connection goes through, no restart
            shutil.move(rejected[0], site.pki / "trusted" / rejected[0].name)
            async with MqttStation(mqtt_url, answer_all):
                check_scenario(await node_client(node, site.port, SCOPE, JOB, pki, secure))
                # Sign alone: the same channel, its messages signed but not encrypted
                check_scenario(await node_client(node, site.port, SCOPE, "N2", pki,
                                                 {**secure, "OPCUA_SECURITY": "Sign"}), "N2")
            # a wrong password: the session refused, the channel's certificate not
            why = await node_client_refused(node, site.port, pki,
                                            {**secure, "OPCUA_PASSWORD": "wrong-pass"})
            assert "BadUserAccessDenied" in why, why
            assert not list((site.pki / "rejected").iterdir())
        finally:
            stop_cleanly(host)
        assert host.stderr is not None
        log = host.stderr.read()
        assert "refused: not trusted" in log, log[-3000:]
        assert "OPC UA Store in line1 by op: ReturnStatus 1" in log, log[-3000:]
        assert "user 'op' refused: unknown user or wrong password" in log, log[-3000:]
    run(main(), 120)
