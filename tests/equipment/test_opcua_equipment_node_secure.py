"""Equipment over OPC UA, secured, against node-opcua's server: the PackML units of
``tests/peers/packml_unit.mjs`` take only Basic256Sha256 SignAndEncrypt and one user. The
host refuses the server's certificate until it is in the trust folder, then runs a job
of three actions to its end over the secure session."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path

import pytest
from helpers.aio import run
from helpers.hosts import flush, quick_config, wait_until
from helpers.node import NODE_ENV
from helpers.opcua_equipment import THREE, S, equipment_file, response_data
from helpers.servers import PEERS, free_port

from sfc_host.service.app import App

UNITS = PEERS / "packml_unit.mjs"


def test_sign_and_encrypt_with_a_user_on_node_opcua_units(
        node: str, redis_url: str, mqtt_url: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from asyncua.crypto.cert_gen import setup_self_signed_certificate
    from cryptography.x509.oid import ExtendedKeyUsageOID

    async def main() -> None:
        await flush(redis_url)
        pki = tmp_path / "pki"
        trust = pki / "plc1"
        trust.mkdir(parents=True)
        await setup_self_signed_certificate(
            pki / "host.pem", pki / "host.der", "urn:sfc-fast:equipment-client", "localhost",
            [ExtendedKeyUsageOID.CLIENT_AUTH], {"commonName": "sfc-host"})
        await setup_self_signed_certificate(
            pki / "plc.pem", pki / "plc.der", "urn:test:node-plc1", "localhost",
            [ExtendedKeyUsageOID.SERVER_AUTH], {"commonName": "node-plc1"})
        port = free_port()
        log = tmp_path / "packml_unit.log"
        with log.open("wb") as out:
            proc = await asyncio.create_subprocess_exec(
                node, str(UNITS), "--port", str(port), "--units", "Filler1,Capper1",
                "--work-ms", "50", "--pki", str(tmp_path / "node-pki"), "--secure",
                "--cert", str(pki / "plc.der"), "--key", str(pki / "plc.pem"),
                "--uri", "urn:test:node-plc1", "--user", "sfc:plc-secret-2",
                cwd=str(PEERS), env={**os.environ, **NODE_ENV}, stdout=out,
                stderr=subprocess.STDOUT)
        app: App | None = None
        try:
            loop = asyncio.get_running_loop()
            end = loop.time() + 30
            while "PackML units" not in log.read_text(errors="replace"):
                assert proc.returncode is None, f"packml_unit.mjs:\n{log.read_text()}"
                assert loop.time() < end, f"packml_unit.mjs not ready:\n{log.read_text()}"
                await asyncio.sleep(0.05)
            eq_file = equipment_file(tmp_path, port)
            eq_file.write_text(eq_file.read_text().replace(
                'endpoint = "opc.tcp://', f'security = "SignAndEncrypt"\n'
                f'certificate = "{pki / "host.der"}"\nprivate_key = "{pki / "host.pem"}"\n'
                f'trust_dir = "{trust}"\nusername = "sfc"\npassword_env = "PLC1_PASSWORD"\n'
                'endpoint = "opc.tcp://'))

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
            if proc.returncode is None:
                proc.terminate()
                await asyncio.wait_for(proc.wait(), 10)
    run(main())
