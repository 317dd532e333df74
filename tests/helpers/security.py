"""Secured servers for the security tests: the passwords, the host's Redis ACL and the
broker's ACL (the ones docs/operations.md shows), test certificates made by the
``openssl`` command line, redis-server with an ACL file and TLS, mosquitto with
passwords, an ACL and TLS with client certificates, and a host config with every
security setting on. The ``certs`` and ``secure_mqtt`` fixtures of ``tests/conftest.py``
start them."""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from helpers.servers import MosquittoServer, RedisServer, free_port, in_ci
from sfc_host.config import HostConfig

ADMIN_PW = "admin-Pw-7c1e"            # the default user: test setup only
HOST_PW = "host-Pw-4b2d9f"            # the host's Redis ACL user
MQTT_HOST_PW = "mqtt-Pw-e83a1c"       # the host's MQTT user
STATION_PW = "station-Pw-51f0"
MES_PW = "mes-Pw-22c4"

# The Redis ACL of the host: exactly the commands it sends (directly and from its Lua
# scripts) on its keys only. docs/operations.md shows the same lines.
HOST_REDIS_COMMANDS = (
    "+time +script|load +evalsha "
    "+get +set +del +exists +expire +persist +incr +incrby "
    "+hget +hset +hdel +hgetall +hmget +hexists +hvals "
    "+sadd +srem +smembers +sismember +scard +sscan "
    "+zadd +zrem +zremrangebyrank +zrange +zrangebyscore +zcard "
    "+xadd +xack +xdel +xtrim +xpending +xreadgroup +xautoclaim +xgroup|create "
    "+xinfo|groups")
HOST_REDIS_ACL = f"resetkeys ~sfc:* resetchannels -@all {HOST_REDIS_COMMANDS}"

# The broker's ACL: each client may use its own topics and nothing else.
MOSQUITTO_ACL = """\
# the host: commands out, answers, events and capabilities in; MES requests in,
# replies, status events and the retained order, result and state-index topics out
user sfc-host
topic write equipment/+/commands
topic read equipment/+/responses
topic read equipment/+/events
topic read equipment/+/capabilities/+
topic read mes/commands
topic read mes/+/commands
topic read mes/+/+/commands
topic read mes/+/+/+/commands
topic write mes/metadata
topic write mes/+/replies
topic write mes/+/replies/#
topic write mes/+/events
topic write mes/+/+/events
topic write mes/+/+/+/events
topic write mes/+/order/+
topic write mes/+/result/+
topic write mes/+/state-index
topic write mes/hosts/+
topic readwrite mes/hosts/+/probe

# equipment: commands in, answers, pull events and capabilities out
user station
topic read equipment/+/commands
topic write equipment/+/responses
topic write equipment/+/events
topic write equipment/+/capabilities/+

# an MES: requests out, everything the host publishes for it in
user mes
topic write mes/+/commands
topic write mes/+/+/commands
topic write mes/+/+/+/commands
topic read mes/#
"""


def skip_or_fail(reason: str) -> None:
    """Skip the test, or fail it under CI (a CI machine must have what it needs)."""
    if in_ci():
        pytest.fail(reason)
    pytest.skip(reason)


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA, a server certificate for localhost and 127.0.0.1, a client certificate
    (made by the ``openssl`` command line, in a new temporary folder)."""
    if shutil.which("openssl") is None:
        skip_or_fail("the openssl command line is needed to make test certificates")
    d = tmp_path_factory.mktemp("certs")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
             "/CN=sfc test CA", "-keyout", "ca.key", "-out", "ca.crt", cwd=d)
    (d / "server.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    (d / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    for name, subject in (("server", "/CN=localhost"), ("client", "/CN=sfc-host")):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", subject,
                 "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                 "-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext",
                 "-out", f"{name}.crt", cwd=d)
    for key in d.glob("*.key"):
        key.chmod(0o644)           # the servers may run as another user than the tests
    return d


# ------------------------------------------------------------------ servers

class SecureRedis(RedisServer):
    """redis-server with an ACL file (a password on the default user, the host's user)
    and a TLS port beside the plain one (both loopback only)."""

    def __init__(self, workdir: Path, certs: Path, users: str) -> None:
        self.tls_port = free_port()
        acl = workdir / "users.acl"
        workdir.mkdir(parents=True, exist_ok=True)
        acl.write_text(users)
        super().__init__(workdir, extra=[
            "--aclfile", str(acl), "--tls-port", str(self.tls_port),
            "--tls-cert-file", str(certs / "server.crt"),
            "--tls-key-file", str(certs / "server.key"),
            "--tls-ca-cert-file", str(certs / "ca.crt"), "--tls-auth-clients", "optional"])

    def _answers(self) -> bool:
        with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
            s.sendall(b"*1\r\n$4\r\nPING\r\n")
            return s.recv(64)[:7] in (b"+PONG\r\n", b"-NOAUTH")

    def admin(self) -> aioredis.Redis:
        return aioredis.Redis(host="127.0.0.1", port=self.port, password=ADMIN_PW)


class SecureMosquitto(MosquittoServer):
    """mosquitto with a password file and an ACL file, on a plain listener and a TLS
    listener that requires a client certificate."""

    def __init__(self, workdir: Path, certs: Path) -> None:
        super().__init__(workdir)
        self.certs = certs
        self.tls_port = free_port()

    def _argv(self) -> list[str]:
        passwd = self.workdir / "passwd"
        passwd.write_text("")
        for user, pw in (("sfc-host", MQTT_HOST_PW), ("station", STATION_PW),
                         ("mes", MES_PW)):
            subprocess.run(["mosquitto_passwd", "-b", str(passwd), user, pw], check=True,
                           capture_output=True, timeout=30)
        passwd.chmod(0o644)
        (self.workdir / "acl").write_text(MOSQUITTO_ACL)
        conf = self.workdir / "mosquitto.conf"
        c = self.certs
        conf.write_text(
            # as root, mosquitto drops to its own user before it reads the password
            # file, which lies in the tests' private temp dir: it stays who started it
            "user root\n"
            "per_listener_settings false\n"
            "allow_anonymous false\n"
            f"password_file {passwd}\n"
            f"acl_file {self.workdir / 'acl'}\n"
            "persistence false\n"
            "log_dest stderr\n"
            "log_type error\nlog_type warning\n"
            f"listener {self.port} 127.0.0.1\n"
            f"listener {self.tls_port} 127.0.0.1\n"
            f"cafile {c / 'ca.crt'}\ncertfile {c / 'server.crt'}\nkeyfile {c / 'server.key'}\n"
            "require_certificate true\n")
        return [self.path, "-c", str(conf)]

    def _answers(self) -> bool:
        # any CONNACK (anonymous clients are refused, but the broker answers)
        body = b"\x00\x04MQTT\x04\x02\x00\x05" + b"\x00\x05probe"
        with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
            s.sendall(b"\x10" + bytes([len(body)]) + body)
            return s.recv(4)[:1] == b"\x20"


def client_tls(certs: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(certs / "ca.crt"))
    ctx.load_cert_chain(str(certs / "client.crt"), str(certs / "client.key"))
    return ctx


def secure_config(redis: SecureRedis, mqtt: SecureMosquitto, certs: Path,
                  **kw: Any) -> HostConfig:
    """Every security setting on: Redis over TLS as the ACL user, MQTT over TLS with a
    client certificate and a password."""
    base: dict[str, Any] = dict(
        redis_url=f"rediss://sfc-host:{HOST_PW}@localhost:{redis.tls_port}/0",
        redis_ca_file=str(certs / "ca.crt"), redis_cert_file=str(certs / "client.crt"),
        redis_key_file=str(certs / "client.key"),
        mqtt_url=f"mqtts://localhost:{mqtt.tls_port}", mqtt_username="sfc-host",
        mqtt_password=MQTT_HOST_PW, mqtt_ca_file=str(certs / "ca.crt"),
        mqtt_cert_file=str(certs / "client.crt"), mqtt_key_file=str(certs / "client.key"),
        sweep_interval_ms=30, read_block_ms=20, discover_interval_ms=100,
        claim_min_idle_ms=300, claim_interval_ms=100, outage_threshold_ms=1500)
    base.update(kw)
    return HostConfig(**base)


def tighten_ok(cmd: dict[str, Any]) -> dict[str, Any]:
    if cmd["type"] == "com.example.cell.tighten.v1":
        return {"Outcome": "completed", "Result": {"torque": 85}}
    return {}
