"""Real servers for the tests: redis-server (single and cluster) and mosquitto on free
loopback ports; and independent MQTT brokers (aedes on Node.js, the pure-Python amqtt)
from ``tests/peers``.

Each server gets its own data folder under a temp dir, is waited for until it answers
its protocol (PING / CONNACK; a cluster: ``cluster_state:ok`` on every node), and is
stopped at the end. Fault tests use ``restart()``/``stop()``/``start()``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from sfc_host.demo.servers import free_port

START_TIMEOUT_S = 10.0
PEERS = Path(__file__).resolve().parents[1] / "peers"


class ServerMissing(RuntimeError):
    """The server's binary is not on PATH."""


def _wait(check, what: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise RuntimeError(f"{what} exited with {proc.returncode} while starting:\n{tail}")
        try:
            if check():
                return
        except OSError as e:
            last = e
        time.sleep(0.02)
    raise RuntimeError(f"{what} did not answer within {START_TIMEOUT_S} s ({last})")


class _Server:
    binary = ""
    name = ""

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        path = shutil.which(self.binary)
        if path is None:
            raise ServerMissing(f"{self.binary} not found on PATH")
        self.path = path
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.proc: subprocess.Popen | None = None
        self.log = self.workdir / f"{self.name}.log"

    def _argv(self) -> list[str]:
        raise NotImplementedError

    def _answers(self) -> bool:
        raise NotImplementedError

    def start(self) -> None:
        logf = self.log.open("ab")
        self.proc = subprocess.Popen(self._argv(), stdout=logf, stderr=subprocess.STDOUT,
                                     cwd=self.workdir, start_new_session=True)
        logf.close()
        _wait(self._answers, f"{self.name} on port {self.port}", self.proc, self.log)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()


class RedisServer(_Server):
    binary = "redis-server"
    name = "redis"

    def __init__(self, workdir: Path, port: int | None = None, *, aof: bool = False,
                 extra: list[str] | None = None) -> None:
        super().__init__(workdir, port)
        self.aof = aof
        self.extra = extra or []

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _argv(self) -> list[str]:
        argv = [self.path, "--port", str(self.port), "--bind", "127.0.0.1",
                "--dir", str(self.workdir), "--save", "", "--daemonize", "no",
                "--protected-mode", "yes", "--loglevel", "warning"]
        if self.aof:
            argv += ["--appendonly", "yes", "--appendfsync", "everysec"]
        else:
            argv += ["--appendonly", "no"]
        return argv + self.extra

    def _answers(self) -> bool:
        with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
            s.sendall(b"*1\r\n$4\r\nPING\r\n")
            return s.recv(64).startswith(b"+PONG")


def _resp(*args: str | int) -> bytes:
    parts = [str(a).encode() for a in args]
    return b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)


def _command(port: int, *args: str | int, timeout: float = 2.0,
             password: str | None = None) -> bytes | int:
    """Send one command to a Redis on loopback; the reply of a simple, integer or bulk string.

    ``password``: AUTH as the default user first (a server with an ACL file). An error
    reply raises RuntimeError with its text.
    """
    with (socket.create_connection(("127.0.0.1", port), timeout=timeout) as s,
          s.makefile("rb") as f):
        if password is not None:
            s.sendall(_resp("AUTH", password))
            if not f.readline().startswith(b"+OK"):
                raise RuntimeError(f"redis on port {port}: AUTH refused")
        s.sendall(_resp(*args))
        line = f.readline().rstrip(b"\r\n")
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            return b"" if n < 0 else f.read(n + 2)[:n]
        if kind == b"-":
            raise RuntimeError(f"redis on port {port}: {rest.decode(errors='replace')}")
        raise RuntimeError(f"redis on port {port}: unexpected reply {line[:80]!r}")


class RedisClusterServer:
    """A Redis Cluster of ``n_masters`` master nodes, each a ``RedisServer``, and
    ``replicas`` replicas of each (none by default; ``replica_of`` says whose).

    Every node has its own folder ``node{i}`` (with its ``nodes.conf``) under ``workdir``,
    a free client port and a free cluster-bus port (``--cluster-port``, so the bus does not
    depend on ``port + 10000`` being free). ``start()`` starts the nodes, spreads the 16384
    slots evenly, joins them with CLUSTER MEET and waits until every node reports
    ``cluster_state:ok``; if anything fails it stops what it started before raising.

    A subclass may make other nodes (``_node``: TLS, an ACL file) and set ``password``
    (the default user's, which the setup commands then AUTH with).
    """

    name = "redis-cluster"
    password: str | None = None

    def __init__(self, workdir: Path, n_masters: int = 3, *,
                 node_timeout_ms: int = 2000, replicas: int = 0) -> None:
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        taken: set[int] = set()
        self.nodes: list[RedisServer] = []
        self.bus_ports: list[int] = []
        self.n_masters = n_masters
        # replica node index -> the index of the master it replicates
        self.replica_of = {n_masters + r * n_masters + m: m
                           for r in range(replicas) for m in range(n_masters)}
        for i in range(n_masters * (1 + replicas)):
            port, bus = self._fresh_port(taken), self._fresh_port(taken)
            extra = ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                     "--cluster-node-timeout", str(node_timeout_ms), "--cluster-port", str(bus)]
            self.nodes.append(self._node(workdir / f"node{i}", port, extra))
            self.bus_ports.append(bus)

    def _node(self, workdir: Path, port: int, extra: list[str]) -> RedisServer:
        return RedisServer(workdir, port, extra=extra)

    def _admin(self, port: int, *args: str | int) -> bytes | int:
        return _command(port, *args, password=self.password)

    @staticmethod
    def _fresh_port(taken: set[int]) -> int:
        while True:
            p = free_port()
            if p not in taken:
                taken.add(p)
                return p

    @property
    def ports(self) -> list[int]:
        return [n.port for n in self.nodes]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.nodes[0].port}"

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", n.port) for n in self.nodes]

    def start(self) -> None:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        for node in self.nodes:  # a fresh cluster each start, not the last one's config
            (node.workdir / "nodes.conf").unlink(missing_ok=True)
            node.start()
        n = self.n_masters
        for i, node in enumerate(self.nodes[:n]):
            first, last = i * 16384 // n, (i + 1) * 16384 // n - 1
            self._admin(node.port, "CLUSTER", "ADDSLOTSRANGE", first, last)
        for i, node in enumerate(self.nodes):
            self._admin(node.port, "CLUSTER", "SET-CONFIG-EPOCH", i + 1)
        # every pair meets directly: no waiting for gossip to introduce them (~1 s a hop)
        for i, node in enumerate(self.nodes):
            for other, bus in zip(self.nodes[i + 1:], self.bus_ports[i + 1:], strict=True):
                self._admin(node.port, "CLUSTER", "MEET", "127.0.0.1", other.port, bus)
        self._wait_ok()
        if self.replica_of:
            self._replicate()

    def _replicate(self) -> None:
        """Each replica follows its master, and has its data, before the start ends."""
        ids = [bytes(self._admin(node.port, "CLUSTER", "MYID")).decode()
               for node in self.nodes[:self.n_masters]]
        for r, m in self.replica_of.items():
            self._admin(self.nodes[r].port, "CLUSTER", "REPLICATE", ids[m])
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            up = [b"master_link_status:up" in bytes(self._admin(self.nodes[r].port, "INFO",
                                                                "replication"))
                  for r in self.replica_of]
            if all(up):
                return
            time.sleep(0.05)
        raise RuntimeError(f"{self.name}: replicas not in sync within {START_TIMEOUT_S} s\n"
                           + self._tails())

    def _states(self) -> list[str]:
        states = []
        for node in self.nodes:
            try:
                info = self._admin(node.port, "CLUSTER", "INFO")
            except (OSError, RuntimeError) as e:
                states.append(f"port {node.port}: {e}")
                continue
            fields = dict(line.split(":", 1) for line in bytes(info).decode().split()
                          if ":" in line)
            states.append(f"port {node.port}: cluster_state:{fields.get('cluster_state')} "
                          f"known_nodes:{fields.get('cluster_known_nodes')} "
                          f"slots_ok:{fields.get('cluster_slots_ok')}")
        return states

    def _wait_ok(self) -> None:
        want = [f"port {p}: cluster_state:ok known_nodes:{len(self.nodes)} slots_ok:16384"
                for p in self.ports]
        deadline = time.monotonic() + START_TIMEOUT_S
        states: list[str] = []
        while time.monotonic() < deadline:
            for node in self.nodes:
                if node.proc is not None and node.proc.poll() is not None:
                    raise RuntimeError(f"{self.name} node on port {node.port} exited with "
                                       f"{node.proc.returncode}:\n{self._tails()}")
            states = self._states()
            if states == want:
                return
            time.sleep(0.05)
        raise RuntimeError(f"{self.name} not ok within {START_TIMEOUT_S} s:\n"
                           + "\n".join(states) + "\n" + self._tails())

    def _query(self, port: int, *args: str | int) -> Any:
        """One command with redis-py (array replies too); raises what redis-py raises."""
        import redis
        r = redis.Redis(port=port, password=self.password, socket_timeout=2)
        try:
            return r.execute_command(*args)
        finally:
            r.close()

    def primary_of(self, slot: int) -> RedisServer:
        """The node serving ``slot`` now, as the first live node that answers says
        (after a failover: the promoted replica)."""
        import redis
        for node in self.nodes:
            if node.proc is None:
                continue
            try:
                table = self._query(node.port, "CLUSTER", "SLOTS")
            except (redis.RedisError, OSError):
                continue
            for first, last, primary, *_ in table:
                if first <= slot <= last:
                    port = int(primary[1])
                    return next(n for n in self.nodes if n.port == port)
        raise RuntimeError(f"{self.name}: no node answered CLUSTER SLOTS for slot {slot}")

    def shard_slot(self, shard: int) -> int:
        """The first slot of shard ``shard`` as ``start()`` spread them."""
        return shard * 16384 // self.n_masters

    def is_ok(self) -> bool:
        """Whether the first live node that answers says ``cluster_state:ok``."""
        import redis
        for node in self.nodes:
            if node.proc is None:
                continue
            try:
                return b"cluster_state:ok" in self._query(node.port, "CLUSTER", "INFO")
            except (redis.RedisError, OSError):
                continue
        return False

    def migrate(self, slot: int, src: int, dst: int, *, batch: int = 2,
                pause_s: float = 0.05) -> int:
        """Move ``slot`` from the primary on port ``src`` to the one on ``dst`` as
        ``redis-cli --cluster reshard`` does: IMPORTING/MIGRATING, the keys in batches
        (``pause_s`` between them, so that clients meet the slot half moved), then the
        new owner told to every primary. The number of keys moved."""
        ids = {p: bytes(self._query(p, "CLUSTER", "MYID")).decode() for p in (src, dst)}
        self._query(dst, "CLUSTER", "SETSLOT", slot, "IMPORTING", ids[src])
        self._query(src, "CLUSTER", "SETSLOT", slot, "MIGRATING", ids[dst])
        moved = 0
        while keys := self._query(src, "CLUSTER", "GETKEYSINSLOT", slot, batch):
            auth: list[str] = [] if self.password is None else ["AUTH", self.password]
            self._query(src, "MIGRATE", "127.0.0.1", dst, "", 0, 5000, *auth, "KEYS", *keys)
            moved += len(keys)
            time.sleep(pause_s)
        import redis
        for node in self.nodes:
            if node.proc is None:
                continue
            try:
                self._query(node.port, "CLUSTER", "SETSLOT", slot, "NODE", ids[dst])
            except redis.ResponseError as e:    # a replica: its primary tells it
                if "master" not in str(e):
                    raise
        return moved

    def _tails(self) -> str:
        out = []
        for node in self.nodes:
            tail = node.log.read_text(errors="replace")[-1000:] if node.log.exists() else ""
            out.append(f"--- {node.log}\n{tail}")
        return "\n".join(out)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop every node (also those of a start that failed midway)."""
        errors: list[BaseException] = []
        for node in self.nodes:
            try:
                node.stop(sig)
            except BaseException as e:  # stop the others before raising
                errors.append(e)
        if errors:
            raise errors[0]


class MosquittoServer(_Server):
    binary = "mosquitto"
    name = "mosquitto"

    def __init__(self, workdir: Path, port: int | None = None, *,
                 extra: list[str] | None = None) -> None:
        super().__init__(workdir, port)
        # more mosquitto.conf lines (max_packet_size, acl_file, ...), after the defaults
        self.extra = extra or []

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    def _argv(self) -> list[str]:
        conf = self.workdir / "mosquitto.conf"
        conf.write_text(
            f"listener {self.port} 127.0.0.1\n"
            "allow_anonymous true\n"
            "persistence false\n"
            "max_queued_messages 100000\n"
            # docs/operations.md's broker settings: with mosquitto's default of 20, a
            # busy host's publishes leave in writes of a few messages each
            "max_inflight_messages 1000\n"
            "set_tcp_nodelay true\n"
            "log_dest stderr\n"
            "log_type error\n"
            "log_type warning\n"
            + "".join(f"{line}\n" for line in self.extra)
        )
        return [self.path, "-c", str(conf)]

    def _answers(self) -> bool:
        return _connack(self.port)


def _connack(port: int) -> bool:
    """An MQTT 3.1.1 CONNECT with a clean session and client id "probe" is answered
    with CONNACK 0."""
    body = (b"\x00\x04MQTT\x04\x02\x00\x05" + b"\x00\x05probe")
    packet = b"\x10" + bytes([len(body)]) + body
    with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
        s.sendall(packet)
        reply = s.recv(4)
        if reply[:1] == b"\x20" and len(reply) >= 4 and reply[3] == 0:
            s.sendall(b"\xe0\x00")  # DISCONNECT
            return True
        return False


class _PeerBroker(_Server):
    """A broker of another implementation, run as ``binary script port`` from
    ``tests/peers``."""

    script: Path

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    def _argv(self) -> list[str]:
        return [self.path, str(self.script), str(self.port)]

    def _answers(self) -> bool:
        return _connack(self.port)


class AedesServer(_PeerBroker):
    """aedes (Node.js; ``tests/peers/broker.js``): MQTT 3.1 and 3.1.1 only, no shared
    subscriptions (a ``$share/…`` filter is taken as a plain topic). In memory: a
    restart forgets sessions and retained messages. ``.ci/setup`` installs it with npm."""

    binary = "node"
    name = "aedes"
    script = PEERS / "broker.js"

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        if not (PEERS / "node_modules" / "aedes" / "package.json").is_file():
            raise ServerMissing("aedes is not installed in tests/peers")
        super().__init__(workdir, port)


class AmqttServer(_PeerBroker):
    """amqtt (pure Python; ``tests/peers/amqtt_broker.py``) in a process of its own:
    MQTT 3.1.1 only, no shared subscriptions (a ``$share/…`` filter is granted and
    receives nothing). In memory, as aedes."""

    binary = sys.executable
    name = "amqtt"
    script = PEERS / "amqtt_broker.py"

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        if find_spec("amqtt") is None:
            raise ServerMissing("the amqtt package is not installed")
        super().__init__(workdir, port)



def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds a process has used so far (``/proc``): the
    benchmarks' measure of a server's (or a host process's) cost."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


APT_HINT = "install it (apt-get install -y redis-server mosquitto) to run this test"
NPM_HINT = "bash .ci/setup installs it with npm (Node.js 20+) to run this test"


def missing(e: ServerMissing, hint: str = APT_HINT) -> None:
    """A server's binary is missing: fail the test under CI, skip it elsewhere."""
    import pytest

    msg = f"{e}; {hint}"
    if in_ci():
        pytest.fail(msg)
    pytest.skip(msg)
