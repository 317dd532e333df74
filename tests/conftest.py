"""Shared fixtures: real redis-server, a Redis Cluster and mosquitto, started once per test
session; and the independent MQTT brokers of ``tests/peers`` (aedes, amqtt).

Only fixtures live here (also the ones several test folders share: ``node``, ``certs``,
``secure_mqtt``); what tests share besides them is in ``tests/helpers`` (which this
file's folder being on ``sys.path`` makes importable as ``helpers``). A test module never
imports another test module (``tests/house/test_test_layout.py`` holds that). Every test
folder goes on ``sys.path`` too, for the benchmarks and scripts that import a test
module's pieces by its (unique) basename.

Outside CI a missing binary skips the tests that need it, with the reason; under
``CI=true`` it fails them, so a CI machine without the servers cannot pass quietly.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.node import find_node
from helpers.paths import test_folders_on_path
from helpers.security import SecureMosquitto, make_certs, skip_or_fail
from helpers.servers import (
    APT_HINT,
    NPM_HINT,
    AedesServer,
    AmqttServer,
    MosquittoServer,
    RedisClusterServer,
    RedisServer,
    ServerMissing,
    missing,
)

test_folders_on_path()


def _serve(cls: type, workdir: Path, hint: str = APT_HINT) -> Iterator:
    """Start a server for the session (skip or fail when its binary is missing)."""
    try:
        server = cls(workdir)
    except ServerMissing as e:
        missing(e, hint)
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    yield from _serve(RedisServer, tmp_path_factory.mktemp("redis"))


@pytest.fixture(scope="session")
def redis_url(redis_server: RedisServer) -> str:
    return redis_server.url


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServer]:
    """Three redis-server masters in one cluster (slots spread evenly, no replicas)."""
    yield from _serve(RedisClusterServer, tmp_path_factory.mktemp("redis-cluster"))


@pytest.fixture(scope="session")
def mosquitto_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MosquittoServer]:
    yield from _serve(MosquittoServer, tmp_path_factory.mktemp("mosquitto"))


@pytest.fixture(scope="session")
def mqtt_url(mosquitto_server: MosquittoServer) -> str:
    return mosquitto_server.url


@pytest.fixture(scope="session")
def aedes_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AedesServer]:
    """aedes (Node.js), an MQTT 3.1.1 broker independent of mosquitto; like the other
    servers, missing it fails the test under CI and skips it elsewhere."""
    yield from _serve(AedesServer, tmp_path_factory.mktemp("aedes"), NPM_HINT)


@pytest.fixture(scope="session")
def aedes_url(aedes_server: AedesServer) -> str:
    return aedes_server.url


@pytest.fixture(scope="session")
def amqtt_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AmqttServer]:
    """amqtt, a pure-Python MQTT 3.1.1 broker. Optional as in the demo's fallback test:
    .ci/setup installs it where pip can, and without it the test skips, also in CI."""
    try:
        server = AmqttServer(tmp_path_factory.mktemp("amqtt"))
    except ServerMissing as e:
        pytest.skip(f"{e} (pip install amqtt)")
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def amqtt_url(amqtt_server: AmqttServer) -> str:
    return amqtt_server.url


@pytest.fixture
def node() -> str:
    """The ``node`` binary (Node.js 20 or newer) with node-opcua installed in tests/peers,
    for the tests that run a node-opcua peer; else a skip (a failure under CI)."""
    return find_node()


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Test certificates (a CA, a server certificate for localhost and 127.0.0.1, a
    client certificate), made by the ``openssl`` command line for each module."""
    return make_certs(tmp_path_factory)


@pytest.fixture(scope="module")
def secure_mqtt(tmp_path_factory: pytest.TempPathFactory, certs: Path) -> Iterator[SecureMosquitto]:
    """mosquitto with passwords, the least-privilege ACL and TLS with client
    certificates (``helpers.security``), for each module."""
    if shutil.which("mosquitto_passwd") is None:
        skip_or_fail("mosquitto_passwd is needed for the broker's password file")
    try:
        server = SecureMosquitto(tmp_path_factory.mktemp("mosquitto-secure"), certs)
    except ServerMissing as e:
        skip_or_fail(f"{e}; install mosquitto")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def make_redis(tmp_path: Path) -> Iterator:
    """A factory of private redis-servers (for fault tests that restart them)."""
    started: list[RedisServer] = []

    def make(**kwargs) -> RedisServer:
        try:
            server = RedisServer(tmp_path / f"redis{len(started)}", **kwargs)
        except ServerMissing as e:
            missing(e)
        server.start()
        started.append(server)
        return server

    yield make
    for s in started:
        s.stop()
