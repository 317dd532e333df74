"""Security with real servers this module starts: Redis with a password, an ACL user
and TLS; mosquitto with TLS (client certificates), a password file and a least-privilege
ACL; a host running jobs end to end over all of it. The ACLs are the ones
docs/operations.md shows. No credential ever reaches a log line or an error the CLI
prints; the condition language cannot reach Python.

Certificates are made by the ``openssl`` command line for each run.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiomqtt
import pytest
import redis.asyncio as aioredis
from helpers.aio import run
from helpers.hosts import flush, wait_until, work_master
from helpers.mqtt_station import MqttStation
from helpers.security import (
    ADMIN_PW,
    HOST_PW,
    HOST_REDIS_ACL,
    MES_PW,
    MOSQUITTO_ACL,
    MQTT_HOST_PW,
    STATION_PW,
    SecureMosquitto,
    SecureRedis,
    client_tls,
    secure_config,
    skip_or_fail,
    tighten_ok,
)
from helpers.servers import RedisServer, ServerMissing
from redis.exceptions import AuthenticationError, NoPermissionError
from redis.exceptions import ConnectionError as RedisConnectionError

from sfc_fast import RecipeError, compile_recipe
from sfc_host.config import HostConfig, without_credentials
from sfc_host.isa95 import state_list, state_name
from sfc_host.mes.client import MesClient
from sfc_host.mqtt import MqttRefused
from sfc_host.service.app import App
from sfc_host.store.client import connect, tls_options
from sfc_host.store.keys import ScopeKeys

S = "line1"
K = ScopeKeys(S)
WM_TYPE = "com.github.aschamberger.ISA95-JOBCONTROL_V2.config.workmaster.v1"
WRONG_PW = "wrong-Pw-9d7a2e"          # must never appear anywhere


def _redis_users() -> str:
    return (f"user default on >{ADMIN_PW} ~* &* +@all\n"
            f"user sfc-host on >{HOST_PW} {HOST_REDIS_ACL}\n"
            # the same user without one command the host needs: it must fail clearly
            f"user sfc-noload on >{HOST_PW} {HOST_REDIS_ACL} -script|load\n"
            f"user sfc-noeval on >{HOST_PW} {HOST_REDIS_ACL} -evalsha\n")


@pytest.fixture(scope="module")
def secure_redis(tmp_path_factory: pytest.TempPathFactory, certs: Path) -> Iterator[SecureRedis]:
    try:
        server = SecureRedis(tmp_path_factory.mktemp("redis-secure"), certs, _redis_users())
    except ServerMissing as e:
        skip_or_fail(f"{e}; install redis-server")
    try:
        server.start()
    except RuntimeError as e:
        if "tls" in str(e).lower():
            skip_or_fail(f"this redis-server has no TLS support: {e}")
        raise
    yield server
    server.stop()


async def fresh(redis: SecureRedis) -> None:
    admin = redis.admin()
    try:
        await admin.flushall()
    finally:
        await admin.aclose()


async def jobs_complete(app: App, jobs: list[str]) -> None:
    async def done() -> bool:
        for j in jobs:
            o = await app.host.orders.get(S, j)
            if not o or o["state"] != "Ended_Completed":
                return False
        return True
    await wait_until(done, 15, f"{len(jobs)} jobs completed")


async def serve_jobs(config: HostConfig, station_kw: dict[str, Any], station_url: str,
                     n: int = 5) -> App:
    """Start a host on ``config``, run ``n`` jobs to their end through a station."""
    app = App(config)
    await app.host.store.put_work_master(S, work_master("tighten_rework", "wm"))
    await app.host.add_scope(S)
    await app.start(connect_timeout_s=5)
    try:
        async with MqttStation(station_url, tighten_ok, **station_kw):
            jobs = [f"J{i}" for i in range(n)]
            for j in jobs:
                await app.host.orders.store_order(S, {"JobOrderID": j,
                                                      "WorkMasterID": [{"ID": "wm"}]},
                                                  start=True)
            await jobs_complete(app, jobs)
    finally:
        await app.aclose()
    return app


# ------------------------------------------------------------------ end to end

def test_a_host_runs_jobs_over_redis_tls_acl_and_mqtt_tls_password_acl(
        secure_redis: SecureRedis, secure_mqtt: SecureMosquitto, certs: Path) -> None:
    """Every setting on at once; the MES is the product's client as the broker's ``mes``
    user, the station the ``station`` user. Pause, Resume, a Work Master PUT and pull
    events go through too, so the ACLs cover every path of a running host."""
    async def main() -> None:
        await fresh(secure_redis)
        cfg = secure_config(secure_redis, secure_mqtt, certs)
        mes_cfg = dataclasses.replace(cfg, mqtt_username="mes", mqtt_password=MES_PW)
        app = App(cfg)
        await app.host.add_scope(S)
        await app.start(connect_timeout_s=5)
        station = {"username": "station", "password": STATION_PW,
                   "tls_context": client_tls(certs)}
        admin = secure_redis.admin()          # the test's reads: not the host's ACL
        try:
            async with (MqttStation(f"mqtt://localhost:{secure_mqtt.tls_port}", tighten_ok,
                                    **station) as st,
                        MesClient(mes_cfg) as mes):
                assert (await mes.put_work_master(S, work_master("tighten_rework", "wm"))).ok
                assert (await mes.put_work_master(S, work_master("axle_fit_qa", "axle"))).ok
                jobs = [f"J{i}" for i in range(4)]
                for j in jobs:
                    assert (await mes.submit(S, {"JobOrderID": j,
                                                 "WorkMasterID": [{"ID": "wm"}]})).ok
                assert (await mes.submit(S, {"JobOrderID": "A1",
                                             "WorkMasterID": [{"ID": "axle"}]})).ok
                await jobs_complete(app, jobs)
                # the axle job waits for pull events: pause and resume it first
                await wait_until(lambda: admin.zscore(
                    K.waits("com.example.station.qa_result.v1"), "A1"), 10, "A1 waits")
                assert (await mes.control(S, "Pause", "A1")).ok
                assert (await mes.control(S, "Resume", "A1")).ok
                for t, data in (("com.example.station.qa_result.v1", {"passed": True}),
                                ("com.example.station.torque_result.v1", {"torque_ok": True})):
                    await wait_until(lambda t=t: admin.zscore(K.waits(t), "A1"),
                                     10, f"A1 waits for {t}")
                    await st.publish(f"equipment/{S}/events", t, data, subject=S,
                                     correlationid="A1")
                await jobs_complete(app, ["A1"])
                assert (await mes.by_id(S, "A1")).data["JobResponse"]["JobState"] == \
                    state_list("Ended_Completed")

                async def indexed() -> bool:     # the retained state index (coalesced)
                    index = await mes.state_index(S)
                    return index is not None and {j["job_order_id"]: state_name(j["state"])
                                                  for j in index["jobs"]}.get("A1") == \
                        "Ended_Completed"
                await wait_until(indexed, 10, "A1 in the retained state index")
                # the other methods and requests: their scripts and reads under the ACL
                assert (await mes.submit(S, {"JobOrderID": "C1", "WorkMasterID": [{"ID": "wm"}]},
                                         start=False)).ok
                assert (await mes.control(S, "Cancel", "C1")).ok
                assert (await mes.control(S, "Clear", "J0")).ok
                assert len((await mes.by_state(S, "Ended_Completed")).data["JobResponses"]) == 4
                assert (await mes.submit(S, {"JobOrderID": "X1",
                                             "WorkMasterID": [{"ID": "wm"}]})).ok
                assert (await mes.control(S, "Abort", "X1")).ok
                # the sweep's commands: an outage, and a due deadline popped (of a job
                # that is not there: its tick finds nothing to do)
                sec, _ = await admin.time()
                await admin.set(K.heartbeat, (int(sec) - 5) * 1000)
                await admin.zadd(K.due, {"ghost": 1})

                async def swept() -> bool:
                    return app.metrics["outages"] >= 1 and \
                        await admin.zscore(K.due, "ghost") is None
                await wait_until(swept, 10, "an outage and a due deadline swept")
                # a config message and the acceptance checks that read it
                assert (await mes.configure(S, "equipment", {"ID": "ST-1"})).ok
                assert (await mes.submit(S, {"JobOrderID": "E1",
                                             "WorkMasterID": [{"ID": "wm"}],
                                             "EquipmentRequirements": [{"ID": "ST-1"}]},
                                         start=False)).ok
                gone = await mes.request(S, WM_TYPE, {"ID": "axle"},
                                         extensions={"method": "DELETE"})
                assert gone.ok
                assert await admin.get(K.work_master("axle")) is None
            # redis-py's connection setup (CLIENT SETINFO, MAINT_NOTIFICATIONS on newer
            # servers) may be refused: it ignores that, and so does this check
            denied = [e for e in await admin.acl_log() if e.get("username") == "sfc-host"
                      and not str(e.get("object", "")).startswith("client")]
        finally:
            await app.aclose()
            await admin.aclose()
        assert not denied, denied      # nothing beyond the ACL was needed
        assert app.metrics["answers_applied"] >= 12
        assert app.metrics["mqtt_handler_errors"] == 0
    run(main())


def test_redis_requirepass_and_mqtt_username_password_without_tls(
        tmp_path: Path, secure_mqtt: SecureMosquitto, certs: Path) -> None:
    """The plain forms: ``requirepass`` (the default user's password, in the URL) and an
    MQTT user and password over TCP."""
    try:
        server = PasswordRedis(tmp_path / "redis")
    except ServerMissing as e:
        skip_or_fail(f"{e}; install redis-server")
    server.start()
    try:
        cfg = HostConfig(redis_url=f"redis://:{HOST_PW}@127.0.0.1:{server.port}/0",
                         mqtt_url=f"mqtt://127.0.0.1:{secure_mqtt.port}",
                         mqtt_username="sfc-host", mqtt_password=MQTT_HOST_PW,
                         sweep_interval_ms=30, read_block_ms=20)
        station = {"username": "station", "password": STATION_PW}
        app = run(serve_jobs(cfg, station, f"mqtt://127.0.0.1:{secure_mqtt.port}"))
        assert app.metrics["answers_applied"] >= 15
    finally:
        server.stop()


class PasswordRedis(RedisServer):
    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir, extra=["--requirepass", HOST_PW])

    def _answers(self) -> bool:
        with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
            s.sendall(b"*1\r\n$4\r\nPING\r\n")
            return s.recv(64)[:7] == b"-NOAUTH"


# ------------------------------------------------------------------ least privilege

def test_the_host_acl_user_can_do_nothing_else(secure_redis: SecureRedis,
                                              certs: Path) -> None:
    async def main() -> None:
        c = aioredis.Redis(host="127.0.0.1", port=secure_redis.port, username="sfc-host",
                           password=HOST_PW)
        try:
            assert await c.set("sfc:{t}:x", "1")
            for call in (c.flushall(), c.keys("*"), c.config_get("*"), c.get("other:key"),
                         c.eval("return 1", 0), c.acl_list(), c.shutdown(),
                         c.set("app:x", "1"), c.script_flush(), c.client_list()):
                with pytest.raises(NoPermissionError):
                    await call
        finally:
            await c.aclose()
    run(main())


def test_a_missing_acl_command_fails_clearly(
        secure_redis: SecureRedis, secure_mqtt: SecureMosquitto, certs: Path) -> None:
    """An ACL without SCRIPT LOAD stops the start naming the command (and ``sfc-host
    run`` says so in one line, exit 1, without the password); one without EVALSHA
    refuses the first write the same way."""
    def as_user(user: str) -> HostConfig:
        return secure_config(secure_redis, secure_mqtt, certs, redis_url=(
            f"rediss://{user}:{HOST_PW}@localhost:{secure_redis.tls_port}/0"))

    async def main() -> None:
        app = App(as_user("sfc-noload"))
        try:
            with pytest.raises(NoPermissionError, match=r"script\|load"):
                await app.start(connect_timeout_s=5)
        finally:
            await app.aclose()
        app = App(as_user("sfc-noeval"))
        try:
            await app.start(connect_timeout_s=5)
            with pytest.raises(NoPermissionError, match="evalsha"):
                await app.host.orders.store_order(S, {"JobOrderID": "J",
                                                      "WorkMasterID": [{"ID": "wm"}]},
                                                  start=True)
        finally:
            await app.aclose()
    run(main())
    out = sfc_host_run(as_user("sfc-noload"))
    assert out.returncode == 1, out.stderr
    [line] = [x for x in out.stderr.splitlines() if x.startswith("sfc-host: error:")]
    assert "refused the host" in line and "script|load" in line
    assert "Traceback" not in out.stderr
    assert HOST_PW not in out.stderr + out.stdout


def test_a_station_cannot_send_mes_requests_or_read_them(
        secure_mqtt: SecureMosquitto, redis_url: str) -> None:
    """The broker's ACL: a request published by the ``station`` user never reaches the
    host, and the station cannot read the MES topics."""
    async def main() -> None:
        await flush(redis_url)
        cfg = HostConfig(redis_url=redis_url, mqtt_url=f"mqtt://127.0.0.1:{secure_mqtt.port}",
                         mqtt_username="sfc-host", mqtt_password=MQTT_HOST_PW)
        app = App(cfg)
        await app.host.store.put_work_master(S, work_master("tighten_rework", "wm"))
        await app.host.add_scope(S)
        await app.start(connect_timeout_s=5)
        try:
            async with aiomqtt.Client("127.0.0.1", secure_mqtt.port, username="station",
                                      password=STATION_PW,
                                      protocol=aiomqtt.ProtocolVersion.V5) as c:
                await c.subscribe(f"mes/{S}/#", qos=1)   # granted; each message is checked
                await c.publish(f"mes/{S}/commands", b'{"specversion": "1.0", "id": "x", '
                                b'"source": "s", "type": "t"}', qos=1)
                # the host publishes a status event and the retained order and index
                await app.host.orders.store_order(S, {"JobOrderID": "J",
                                                      "WorkMasterID": [{"ID": "wm"}]},
                                                  start=False)
                got: list[str] = []

                async def read() -> None:
                    async for m in c.messages:
                        got.append(m.topic.value)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(read(), 0.7)
            assert app.metrics["mqtt_received"] == 0     # the request never reached it
            assert app.metrics["mqtt_sent"] >= 2         # the host did publish
            assert got == []                             # and the station saw none of it
        finally:
            await app.aclose()
    run(main())


# ------------------------------------------------------------------ nothing logged

def sfc_host_run(cfg: HostConfig, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """``sfc-host run`` as an operator starts it: settings in the environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SFC_")}
    for name in ("redis_url", "redis_ca_file", "redis_cert_file", "redis_key_file",
                 "mqtt_url", "mqtt_username", "mqtt_password", "mqtt_ca_file",
                 "mqtt_cert_file", "mqtt_key_file"):
        env[f"SFC_{name.upper()}"] = str(getattr(cfg, name))
    env["SFC_LOG_LEVEL"] = "DEBUG"
    return subprocess.run([sys.executable, "-m", "sfc_host", "run"], env=env, text=True,
                          capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)


def test_no_credential_in_logs_or_errors_of_a_failed_connect(
        secure_redis: SecureRedis, secure_mqtt: SecureMosquitto, certs: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    good = secure_config(secure_redis, secure_mqtt, certs)
    bad_redis = dataclasses.replace(
        good, redis_url=f"rediss://sfc-host:{WRONG_PW}@localhost:{secure_redis.tls_port}/0")
    bad_mqtt = dataclasses.replace(good, mqtt_password=WRONG_PW)
    seen: list[str] = []

    async def fails(cfg: HostConfig, error: type[BaseException]) -> None:
        app = App(cfg)
        try:
            with pytest.raises(error) as e:
                await app.start(connect_timeout_s=1.5)
            seen.extend([str(e.value), repr(e.value), repr(cfg), repr(app.link.last_error)])
        finally:
            await app.aclose()

    run(fails(bad_redis, AuthenticationError))
    run(fails(bad_mqtt, MqttRefused))          # at once: retrying cannot help
    assert "Bad user name or password" in caplog.text or "Not authorized" in caplog.text
    for cfg, says, why in (
            (bad_redis, "cannot reach Redis at rediss://localhost:", "invalid username-pass"),
            (bad_mqtt, "the broker at localhost:", "refused the connection ([code:135] Not "
                                                   "authorized)")):
        t0 = time.monotonic()
        out = sfc_host_run(cfg)
        assert time.monotonic() - t0 < 8         # not the 10 s connect timeout
        [line] = [x for x in out.stderr.splitlines() if x.startswith("sfc-host: error:")]
        assert out.returncode == 1 and says in line and why in line, out.stderr
        seen += [out.stdout, out.stderr]
    # the operator commands, with the password in the URL
    out = subprocess.run([sys.executable, "-m", "sfc_host", "inspect", "J1", "--scope", S,
                          "--redis", f"redis://sfc-host:{WRONG_PW}@127.0.0.1:"
                                     f"{secure_redis.port}/0"],
                         text=True, capture_output=True, timeout=30, stdin=subprocess.DEVNULL)
    assert out.returncode != 0
    seen += [out.stdout, out.stderr, caplog.text]
    leaked = [s for s in seen if WRONG_PW in s or HOST_PW in s or MQTT_HOST_PW in s]
    assert not leaked, leaked


def test_tls_without_the_servers_ca_is_refused_clearly(
        secure_redis: SecureRedis, secure_mqtt: SecureMosquitto, certs: Path) -> None:
    cfg = secure_config(secure_redis, secure_mqtt, certs, redis_ca_file="")

    async def main() -> None:
        app = App(cfg)
        try:
            with pytest.raises(RedisConnectionError, match="certificate verify failed"):
                await app.start(connect_timeout_s=5)
        finally:
            await app.aclose()
    run(main())


def test_tls_settings_reach_the_redis_client_only_for_rediss(certs: Path) -> None:
    ca, crt, key = (str(certs / n) for n in ("ca.crt", "client.crt", "client.key"))
    assert tls_options("redis://h:1/0", ca, crt, key) == {}
    assert tls_options("rediss://h:1/0", ca, crt, key) == {
        "ssl_ca_certs": ca, "ssl_certfile": crt, "ssl_keyfile": key}
    assert tls_options("rediss://h:1/0") == {}
    c = connect(HostConfig(redis_url="rediss://h:1/0", redis_ca_file=ca))
    assert c.connection_pool.connection_kwargs["ssl_ca_certs"] == ca
    assert HostConfig.load(None, env={"SFC_REDIS_CA_FILE": ca}).redis_ca_file == ca
    assert "secret" not in repr(HostConfig(redis_url="redis://u:secret@h:1/0",
                                           mqtt_password="secret"))
    assert without_credentials("rediss://u:secret@h:1/0") == "rediss://h:1/0"


def test_docs_show_the_acls_these_tests_use() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    assert f"user sfc-host on >CHANGE-ME {HOST_REDIS_ACL}\n" in doc
    assert MOSQUITTO_ACL.rstrip() + "\n```" in doc


# ------------------------------------------------------------------ conditions

@pytest.mark.parametrize("text", [
    "__import__('os').system('true')", "__import__", "__builtins__", "job.__class__",
    "tighten.__dict__", "job.x.__globals__", "().__class__.__bases__", "open('x')",
    "tighten.torque()", "job.mode.upper()", "lambda: 1", "lambda x: x", "eval('1')",
    "[c for c in job]", "job['mode']", "tighten.torque[0]", "getattr(job, 'mode')",
    "2 ** 1000", "10 ** 10 ** 10", "9" * 5000, "1e999", "-1e999", "1" + "0" * 30,
    "(" * 100 + "1" + ")" * 100, "not " * 100 + "true", "[" * 100 + "]" * 100,
    "f'{job}'", "'%s' % job", "job if true else 1", "x := 1", "job.mode; 1",
    "tighten.torque + 1", "`id`", "$HOME", "\\x41",
])
def test_the_condition_language_cannot_reach_python(text: str) -> None:
    """Refused when the recipe is compiled, with a clear message naming the place."""
    wm = work_master("tighten_rework", "wm")
    wm["data"]["Transitions"][1]["Condition"] = text
    with pytest.raises(RecipeError) as e:
        compile_recipe(wm["data"], wm["dataschema"])
    [p] = e.value.problems
    assert p.code == "SFC011" and p.path == "$.Transitions[1].Condition"
    assert "position" in p.message and len(p.message) < 300
