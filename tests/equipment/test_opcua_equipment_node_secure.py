"""Equipment over OPC UA, secured, against node-opcua's server: the PackML units of
``tests/peers/packml_unit.mjs`` take only Basic256Sha256 SignAndEncrypt and one user. The
host refuses the server's certificate until it is in the trust folder, then runs a job
of three actions to its end over the secure session."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.aio import run
from helpers.hosts import flush, quick_config, wait_until
from helpers.node import start_peer, stop_peer
from helpers.opcua_equipment import THREE, S, equipment_file, response_data, secured
from helpers.servers import free_port

from sfc_host.service.app import App


def test_sign_and_encrypt_with_a_user_on_node_opcua_units(
        node: str, redis_url: str, mqtt_url: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> None:
        await flush(redis_url)
        port = free_port()
        eq_file = equipment_file(tmp_path, port)
        pki, trust = await secured(tmp_path, eq_file, "urn:test:node-plc1")
        proc = await start_peer(node, "packml_unit.mjs", [
            "--port", str(port), "--units", "Filler1,Capper1", "--work-ms", "50",
            "--pki", str(tmp_path / "node-pki"), "--secure", "--cert", str(pki / "plc.der"),
            "--key", str(pki / "plc.pem"), "--uri", "urn:test:node-plc1",
            "--user", "sfc:plc-secret-2"], "PackML units", tmp_path / "packml_unit.log")
        app: App | None = None
        try:
            def host() -> App:
                return App(quick_config(redis_url, mqtt_url=mqtt_url, scopes=[S],
                                        consumer="secure-node", equipment_opcua=str(eq_file)))
            # a wrong password: first the certificate, then the user is refused
            monkeypatch.setenv("PLC1_PASSWORD", "not-the-password")
            app = host()
            await app.start(connect_timeout_s=5)
            eq = app.opcua_equipment
            await wait_until(lambda: any("not in" in line for line in eq.not_ready()), 20,
                             "the untrusted certificate named")
            rejected = list((trust / "rejected").iterdir())
            assert len(rejected) == 1
            rejected[0].rename(trust / rejected[0].name)       # the administrator's step
            await wait_until(lambda: any("refused user 'sfc'" in line
                                         for line in eq.not_ready()), 30, "the user refused")
            line = next(line for line in eq.not_ready() if "refused user" in line)
            assert "BadUserAccessDenied" in line and "password_env" in line and "\n" not in line
            await app.aclose()
            # the right one: a secure session, and a job of three actions to its end
            monkeypatch.setenv("PLC1_PASSWORD", "plc-secret-2")
            app = host()
            await app.start(connect_timeout_s=5)
            eq = app.opcua_equipment
            await wait_until(lambda: not eq.not_ready(), 30, "the secure session")
            await app.host.store.put_work_master(S, THREE)
            await app.host.orders.store_order(
                S, {"JobOrderID": "NS1", "WorkMasterID": [{"ID": THREE["ID"]}]}, start=True)

            async def ended() -> bool:
                st = await app.host.client.hget(f"sfc:{{{S}}}:order:NS1", "state")
                return bool(st) and st.startswith((b"Ended", b"Aborted"))
            await wait_until(ended, 30, "the job's end")
            assert await app.host.client.hget(f"sfc:{{{S}}}:order:NS1", "state") == \
                b"Ended_Completed"
            raw = await app.host.client.get(f"sfc:{{{S}}}:response:NS1")
            data = response_data(json.loads(raw))
            assert data["fill.filled"] == 2.5 and data["fill_again.filled"] == 4.0
        finally:
            if app is not None:
                await app.aclose()
            await stop_peer(proc)
    run(main())
