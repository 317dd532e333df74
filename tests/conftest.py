"""Shared fixtures: real redis-server, a Redis Cluster and mosquitto, started once per test
session; and the independent MQTT brokers of ``tests/peers`` (aedes, amqtt).

Outside CI a missing binary skips the tests that need it, with the reason; under
``CI=true`` it fails them, so a CI machine without the servers cannot pass quietly.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from servers import (
    AedesServer,
    AmqttServer,
    MosquittoServer,
    RedisClusterServer,
    RedisServer,
    ServerMissing,
    in_ci,
)

REPO = Path(__file__).resolve().parents[1]
REFERENCE_RECIPES = REPO / "tests" / "data" / "recipes"
PACKAGED_RECIPES = REPO / "src" / "sfc_host" / "examples"


def reference_recipes_dir() -> Path:
    """The reference recipes (tests/data/recipes; the package ships them too)."""
    return REFERENCE_RECIPES


def load_reference(name: str) -> dict:
    return json.loads((reference_recipes_dir() / name).read_text())


APT_HINT = "install it (apt-get install -y redis-server mosquitto) to run this test"
NPM_HINT = "bash .ci/setup installs it with npm (Node.js 20+) to run this test"


def _missing(e: ServerMissing, hint: str = APT_HINT) -> None:
    msg = f"{e}; {hint}"
    if in_ci():
        pytest.fail(msg)
    pytest.skip(msg)


def _serve(cls: type, workdir: Path, hint: str = APT_HINT) -> Iterator:
    """Start a server for the session (skip or fail when its binary is missing)."""
    try:
        server = cls(workdir)
    except ServerMissing as e:
        _missing(e, hint)
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
def make_redis(tmp_path: Path) -> Iterator:
    """A factory of private redis-servers (for fault tests that restart them)."""
    started: list[RedisServer] = []

    def make(**kwargs) -> RedisServer:
        try:
            server = RedisServer(tmp_path / f"redis{len(started)}", **kwargs)
        except ServerMissing as e:
            _missing(e)
        server.start()
        started.append(server)
        return server

    yield make
    for s in started:
        s.stop()
