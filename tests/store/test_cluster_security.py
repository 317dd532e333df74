"""The host on a Redis Cluster with TLS everywhere and the least-privilege ACL user:
three masters whose client port, cluster bus (``tls-cluster yes``) and replication
(``tls-replication yes``) speak TLS, with the certificates and the ACL of
``tests/service/test_security.py`` plus the two commands the cluster client needs
(``CLUSTER SLOTS`` to find the nodes, ``COMMAND`` to find the keys of a command), as
docs/operations.md shows them. MQTT is TLS with passwords too (the broker of
``helpers/security.py``).

The nodes keep a plain loopback port for the test's own setup (``CLUSTER MEET``,
``ACL LOG``, ``CLIENT LIST``): a client on a TLS connection is told the TLS ports by
``CLUSTER SLOTS``, and the test checks that every connection of the host's user is on
one.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from helpers.aio import run
from helpers.cluster import SCOPES
from helpers.hosts import wait_until, work_master
from helpers.mqtt_station import MqttStation
from helpers.security import (
    ADMIN_PW,
    HOST_PW,
    HOST_REDIS_ACL,
    MES_PW,
    MQTT_HOST_PW,
    STATION_PW,
    SecureMosquitto,
    client_tls,
    secure_config,
    skip_or_fail,
    tighten_ok,
)
from helpers.servers import RedisClusterServer, RedisServer, ServerMissing, free_port
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisClusterException

from sfc_host.config import HostConfig
from sfc_host.execution.host import Host
from sfc_host.isa95 import state_list
from sfc_host.mes.client import MesClient
from sfc_host.service.app import App
from sfc_host.store.client import connect
from sfc_host.store.cluster_channel import ClusterChannel
from sfc_host.store.keys import ScopeKeys

pytestmark = pytest.mark.servers

# The host's Redis ACL on a cluster: the single-Redis one and what redis-py's cluster
# client sends on its own (docs/operations.md shows the same line).
CLUSTER_COMMANDS = "+cluster|slots +command"
HOST_CLUSTER_ACL = f"{HOST_REDIS_ACL} {CLUSTER_COMMANDS}"
QA = "com.example.station.qa_result.v1"
TORQUE = "com.example.station.torque_result.v1"


class TlsClusterNode(RedisServer):
    """One node: an ACL file, a TLS client port, TLS on the cluster bus and for
    replication."""

    def __init__(self, workdir: Path, port: int, extra: list[str], certs: Path) -> None:
        self.tls_port = free_port()
        workdir.mkdir(parents=True, exist_ok=True)
        acl = workdir / "users.acl"
        acl.write_text(f"user default on >{ADMIN_PW} ~* &* +@all\n"
                       f"user sfc-host on >{HOST_PW} {HOST_CLUSTER_ACL}\n"
                       # the single-Redis line alone: the cluster client cannot start
                       f"user sfc-single on >{HOST_PW} {HOST_REDIS_ACL}\n")
        super().__init__(workdir, port, extra=[
            *extra, "--aclfile", str(acl), "--tls-port", str(self.tls_port),
            "--tls-cert-file", str(certs / "server.crt"),
            "--tls-key-file", str(certs / "server.key"),
            "--tls-ca-cert-file", str(certs / "ca.crt"), "--tls-auth-clients", "optional",
            "--tls-cluster", "yes", "--tls-replication", "yes"])

    def _answers(self) -> bool:
        with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
            s.sendall(b"*1\r\n$4\r\nPING\r\n")
            return s.recv(64)[:7] in (b"+PONG\r\n", b"-NOAUTH")


class TlsRedisCluster(RedisClusterServer):
    password = ADMIN_PW

    def __init__(self, workdir: Path, certs: Path) -> None:
        self.certs = certs
        super().__init__(workdir)

    def _node(self, workdir: Path, port: int, extra: list[str]) -> RedisServer:
        return TlsClusterNode(workdir, port, extra, self.certs)

    @property
    def tls_ports(self) -> list[int]:
        return [n.tls_port for n in self.nodes if isinstance(n, TlsClusterNode)]

    def admin(self, port: int) -> aioredis.Redis:
        """The default user on one node's plain loopback port (the test's own reads)."""
        return aioredis.Redis(host="127.0.0.1", port=port, password=ADMIN_PW)

    def admin_cluster(self) -> RedisCluster:
        """The default user as a cluster client on the plain ports (the test's reads of
        keys, which the host's user may not make)."""
        return RedisCluster(host="127.0.0.1", port=self.ports[0], password=ADMIN_PW)


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory: pytest.TempPathFactory, certs: Path
                ) -> Iterator[TlsRedisCluster]:
    try:
        cluster = TlsRedisCluster(tmp_path_factory.mktemp("redis-cluster-tls"), certs)
        cluster.start()
    except ServerMissing as e:      # before RuntimeError: it is one
        skip_or_fail(f"{e}; install redis-server")
    except RuntimeError as e:       # a node that does not start (stopped by start())
        if "tls" not in str(e).lower():
            raise
        skip_or_fail(f"this redis-server has no TLS support: {e}")
    yield cluster
    cluster.stop()


def cluster_url(cluster: TlsRedisCluster, user: str = "sfc-host") -> str:
    # the certificate names localhost and 127.0.0.1: the nodes CLUSTER SLOTS announces
    # (127.0.0.1) pass the host name check too
    return f"rediss://{user}:{HOST_PW}@localhost:{cluster.tls_ports[0]}/0"


def cluster_config(cluster: TlsRedisCluster, mqtt: SecureMosquitto, certs: Path,
                   **kw: Any) -> HostConfig:
    """test_security's settings (TLS, client certificates and passwords for Redis and
    MQTT), with the cluster's URL."""
    # secure_config reads the server's tls_port only for the URL this one replaces
    node: Any = cluster.nodes[0]
    return secure_config(node, mqtt, certs, **{
        "redis_url": cluster_url(cluster), "redis_cluster": True, **kw})


async def fresh(cluster: TlsRedisCluster) -> None:
    """Empty every node, and start the test's ACL LOG afresh."""
    for port in cluster.ports:
        admin = cluster.admin(port)
        try:
            await admin.flushall()
            await admin.execute_command("ACL", "LOG", "RESET")
        finally:
            await admin.aclose()


async def refused(cluster: TlsRedisCluster, user: str) -> list[dict[str, Any]]:
    """What the nodes refused ``user``; redis-py's own connection setup (CLIENT
    SETINFO) may be refused, which it ignores, and so does this."""
    out: list[dict[str, Any]] = []
    for port in cluster.ports:
        admin = cluster.admin(port)
        try:
            out += [e for e in await admin.acl_log() if e.get("username") == user
                    and not str(e.get("object", "")).startswith("client")]
        finally:
            await admin.aclose()
    return out


async def user_ports(cluster: TlsRedisCluster, user: str) -> set[int]:
    """The server ports ``user``'s connections came in on, over every node."""
    ports: set[int] = set()
    for port in cluster.ports:
        admin = cluster.admin(port)
        try:
            for c in await admin.client_list():
                if c.get("user") == user:
                    ports.add(int(c["laddr"].rsplit(":", 1)[1]))
        finally:
            await admin.aclose()
    return ports


async def shard_of(cluster: TlsRedisCluster) -> dict[str, int]:
    """Each scope's node (its plain port), as the cluster says (CLUSTER KEYSLOT and the
    slot ranges the fixture gave the nodes)."""
    admin = cluster.admin(cluster.ports[0])
    try:
        out = {}
        n = len(cluster.nodes)
        for s in SCOPES:
            slot = int(await admin.execute_command("CLUSTER KEYSLOT", ScopeKeys(s).work))
            out[s] = cluster.ports[slot * n // 16384]
        return out
    finally:
        await admin.aclose()


async def completed(host: Host, jobs: list[tuple[str, str]]) -> bool:
    for s, j in jobs:
        o = await host.orders.get(s, j)
        if not o or o["state"] != "Ended_Completed":
            return False
    return True


def test_a_host_runs_jobs_on_a_tls_cluster_as_the_least_privilege_user(
        tls_cluster: TlsRedisCluster, secure_mqtt: SecureMosquitto, certs: Path) -> None:
    """Jobs in scopes on all three shards run to their end, stored and steered by an
    MES over MQTT (Work Master PUT, StoreAndStart, Pause and Resume of a job waiting for
    pull events), with the host connected to the cluster over TLS as ``sfc-host``: the
    nodes refuse it nothing, and it talks to TLS ports only."""
    async def main() -> None:
        await fresh(tls_cluster)
        shards = await shard_of(tls_cluster)
        assert set(shards.values()) == set(tls_cluster.ports), shards
        # one scope per shard for the job with pull events
        waiting = list({port: s for s, port in reversed(shards.items())}.values())
        cfg = cluster_config(tls_cluster, secure_mqtt, certs)
        mes_cfg = dataclasses.replace(cfg, mqtt_username="mes", mqtt_password=MES_PW)
        station = {"username": "station", "password": STATION_PW,
                   "tls_context": client_tls(certs)}
        app = App(cfg)
        assert isinstance(app.host.client, RedisCluster)
        rc = tls_cluster.admin_cluster()
        await app.start(connect_timeout_s=5)
        try:
            async with (MqttStation(f"mqtt://localhost:{secure_mqtt.tls_port}", tighten_ok,
                                    **station) as st,
                        MesClient(mes_cfg) as mes):
                jobs = []
                for s in SCOPES:
                    assert (await mes.put_work_master(s, work_master("tighten_rework",
                                                                     "wm"))).ok
                    for i in range(2):
                        assert (await mes.submit(s, {"JobOrderID": f"{s}-J{i}",
                                                     "WorkMasterID": [{"ID": "wm"}]})).ok
                        jobs.append((s, f"{s}-J{i}"))
                for s in waiting:
                    assert (await mes.put_work_master(s, work_master("axle_fit_qa",
                                                                     "axle"))).ok
                    assert (await mes.submit(s, {"JobOrderID": f"{s}-A",
                                                 "WorkMasterID": [{"ID": "axle"}]})).ok
                await wait_until(lambda: completed(app.host, jobs), 20,
                                 f"{len(jobs)} jobs completed on three shards")
                for s in waiting:
                    k, job = ScopeKeys(s), f"{s}-A"
                    await wait_until(lambda k=k, job=job: rc.zscore(k.waits(QA), job), 10,
                                     f"{job} waits")
                    assert (await mes.control(s, "Pause", job)).ok
                    assert (await mes.control(s, "Resume", job)).ok
                    for t, data in ((QA, {"passed": True}), (TORQUE, {"torque_ok": True})):
                        await wait_until(lambda k=k, t=t, job=job: rc.zscore(k.waits(t), job),
                                         10, f"{job} waits for {t}")
                        await st.publish(f"equipment/{s}/events", t, data, subject=s,
                                         correlationid=job)
                await wait_until(lambda: completed(app.host, [(s, f"{s}-A") for s in waiting]),
                                 15, "the jobs with pull events completed")
                got = (await mes.by_id(waiting[0], f"{waiting[0]}-A")).data["JobResponse"]
                assert got["JobState"] == state_list("Ended_Completed")
            ports = await user_ports(tls_cluster, "sfc-host")
            # the hot path went through the host's own channel, a TLS link per primary
            ch = app.host.channel
            assert isinstance(ch, ClusterChannel) and ch.writes > 0
            assert {port for _, port in ch.nodes} == set(tls_cluster.tls_ports), ch.nodes
        finally:
            await app.aclose()
            await rc.aclose()
        assert not await refused(tls_cluster, "sfc-host")   # nothing beyond the ACL
        # every node was used, each only on its TLS port
        assert ports == set(tls_cluster.tls_ports), (ports, tls_cluster.tls_ports)
        assert app.metrics["answers_applied"] >= 3 * len(jobs)
        assert app.metrics["mqtt_handler_errors"] == 0
    run(main(), timeout=90)


def test_the_single_redis_acl_is_not_enough_for_a_cluster(
        tls_cluster: TlsRedisCluster, secure_mqtt: SecureMosquitto, certs: Path) -> None:
    """Without ``+cluster|slots`` the cluster client cannot find the nodes; redis-py
    reports it as a cluster it cannot reach, and ACL LOG names the command."""
    cfg = cluster_config(tls_cluster, secure_mqtt, certs,
                         redis_url=cluster_url(tls_cluster, "sfc-single"))

    async def main() -> None:
        await fresh(tls_cluster)
        app = App(cfg)
        try:
            with pytest.raises(RedisClusterException, match="Cluster mode is not enabled"):
                await app.start(connect_timeout_s=5)
        finally:
            await app.aclose()
        assert {e["object"] for e in await refused(tls_cluster, "sfc-single")} \
            == {"cluster|slots"}
    run(main())


def test_sfc_host_run_names_the_missing_cluster_command_in_one_line(
        tls_cluster: TlsRedisCluster, secure_mqtt: SecureMosquitto, certs: Path) -> None:
    """The same refusal through ``sfc-host run``: one line that names what the ACL user
    lacks, exit 1, no traceback, no password."""
    cfg = cluster_config(tls_cluster, secure_mqtt, certs,
                         redis_url=cluster_url(tls_cluster, "sfc-single"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SFC_")}
    env.update(SFC_REDIS_URL=cfg.redis_url, SFC_REDIS_CLUSTER="true",
               SFC_REDIS_CA_FILE=cfg.redis_ca_file, SFC_REDIS_CERT_FILE=cfg.redis_cert_file,
               SFC_REDIS_KEY_FILE=cfg.redis_key_file, SFC_MQTT_URL=cfg.mqtt_url,
               SFC_MQTT_USERNAME=cfg.mqtt_username, SFC_MQTT_PASSWORD=cfg.mqtt_password,
               SFC_MQTT_CA_FILE=cfg.mqtt_ca_file, SFC_MQTT_CERT_FILE=cfg.mqtt_cert_file,
               SFC_MQTT_KEY_FILE=cfg.mqtt_key_file, SFC_SCOPES=",".join(SCOPES))
    proc = subprocess.run([sys.executable, "-m", "sfc_host", "run"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if "sfc-host: error" in line]
    assert len(errors) == 1 and "+cluster|slots" in errors[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert HOST_PW not in proc.stderr + proc.stdout


def test_sfc_host_run_takes_a_tls_cluster_url_with_credentials_from_the_environment(
        tls_cluster: TlsRedisCluster, secure_mqtt: SecureMosquitto, certs: Path) -> None:
    """``sfc-host run`` as an operator starts it, every setting from ``SFC_*``: the
    ``rediss://`` URL with the ACL user's password, ``redis_cluster``, the CA and the
    client certificate reach the cluster client; jobs run, and the password is in no
    line the host writes."""
    cfg = cluster_config(tls_cluster, secure_mqtt, certs)
    names = ("redis_url", "redis_cluster", "redis_ca_file", "redis_cert_file",
             "redis_key_file", "mqtt_url", "mqtt_username", "mqtt_password",
             "mqtt_ca_file", "mqtt_cert_file", "mqtt_key_file", "sweep_interval_ms",
             "read_block_ms", "discover_interval_ms")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SFC_")}
    for name in names:
        env[f"SFC_{name.upper()}"] = str(getattr(cfg, name)).lower() \
            if name == "redis_cluster" else str(getattr(cfg, name))
    env.update(SFC_LOG_LEVEL="DEBUG", SFC_CONSUMER="env-host", SFC_SCOPES=",".join(SCOPES))
    loaded = HostConfig.load(None, env=env)
    assert loaded.redis_cluster and loaded.redis_url == cfg.redis_url
    client = connect(loaded)
    assert isinstance(client, RedisCluster)
    kw = client.nodes_manager.connection_kwargs
    assert (kw["username"], kw["password"]) == ("sfc-host", HOST_PW)
    assert kw["ssl_ca_certs"] == cfg.redis_ca_file
    assert kw["ssl_certfile"] == cfg.redis_cert_file

    async def jobs_run() -> None:
        await fresh(tls_cluster)
        # the jobs are stored by an in-process host as the same user (no loops of its
        # own), the work is done by the ``sfc-host run`` process
        orders = Host(dataclasses.replace(cfg, consumer="orders"), loops=False)
        proc = subprocess.Popen([sys.executable, "-m", "sfc_host", "run"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            station = {"username": "station", "password": STATION_PW,
                       "tls_context": client_tls(certs)}
            async with MqttStation(f"mqtt://localhost:{secure_mqtt.tls_port}", tighten_ok,
                                   **station):
                jobs = []
                for s in SCOPES:
                    await orders.store.put_work_master(s, work_master("tighten_rework", "wm"))
                    await orders.orders.store_order(s, {"JobOrderID": f"{s}-E",
                                                             "WorkMasterID": [{"ID": "wm"}]},
                                                         start=True)
                    jobs.append((s, f"{s}-E"))
                await wait_until(lambda: completed(orders, jobs), 30,
                                 "the jobs run by sfc-host run")
        finally:
            await orders.aclose()
            proc.send_signal(signal.SIGTERM)
            out, _ = await asyncio.to_thread(proc.communicate, timeout=20)
        text = out.decode(errors="replace")
        assert proc.returncode == 0, text[-3000:]
        assert HOST_PW not in text and MQTT_HOST_PW not in text
        assert not await refused(tls_cluster, "sfc-host")
    run(jobs_run(), timeout=90)


def test_docs_show_the_cluster_acl_this_test_uses() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    assert f"user sfc-host on >CHANGE-ME {HOST_CLUSTER_ACL}\n" in doc
