"""Real servers for the tests: redis-server and mosquitto on free loopback ports.

Each server gets its own data folder under a temp dir, is waited for until it answers
its protocol (PING / CONNACK), and is stopped at the end. Fault tests use
``restart()``/``stop()``/``start()``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

START_TIMEOUT_S = 10.0


class ServerMissing(RuntimeError):
    """The server's binary is not on PATH."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


class MosquittoServer(_Server):
    binary = "mosquitto"
    name = "mosquitto"

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
            "log_dest stderr\n"
            "log_type error\n"
            "log_type warning\n"
        )
        return [self.path, "-c", str(conf)]

    def _answers(self) -> bool:
        # MQTT 3.1.1 CONNECT with a clean session and client id "probe"; expect CONNACK 0.
        body = (b"\x00\x04MQTT\x04\x02\x00\x05" + b"\x00\x05probe")
        packet = b"\x10" + bytes([len(body)]) + body
        with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
            s.sendall(packet)
            reply = s.recv(4)
            if reply[:1] == b"\x20" and len(reply) >= 4 and reply[3] == 0:
                s.sendall(b"\xe0\x00")  # DISCONNECT
                return True
            return False


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")
