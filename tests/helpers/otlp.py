"""A real OTLP/HTTP collector on 127.0.0.1 for the exporter's and the batcher's tests:
``Collector`` records what it is sent (``Seen``) and answers from a script of
``Reply``s, and counts the TCP connections it accepts."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from sfc_host.tracing.otlp import TRACES_PATH


@dataclass(frozen=True)
class Reply:
    status: int = 200
    headers: Mapping[str, str] = field(default_factory=dict)
    hang_s: float = 0.0         # wait this long before answering (a stuck collector)


@dataclass(frozen=True)
class Seen:
    path: str
    headers: dict[str, str]     # names lower-cased
    body: bytes
    connection: int


class Collector:
    """An OTLP/HTTP endpoint that records what it is sent and answers from a script
    (then ``default``); counts the TCP connections it accepts."""

    def __init__(self, script: Sequence[Reply] = (), *, default: Reply = Reply(),
                 keep_alive: bool = True) -> None:
        self._script = list(script)
        self._default = default
        self._lock = threading.Lock()
        self.requests: list[Seen] = []
        self.connections = 0
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self, keep_alive))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.02}, daemon=True)

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return self.base + TRACES_PATH

    def connected(self) -> int:
        with self._lock:
            self.connections += 1
            return self.connections

    def received(self, seen: Seen) -> Reply:
        with self._lock:
            self.requests.append(seen)
            return self._script.pop(0) if self._script else self._default

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _handler(collector: Collector, keep_alive: bool) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        # HTTP/1.0 makes the server close after each reply: the client must reconnect
        protocol_version = "HTTP/1.1" if keep_alive else "HTTP/1.0"
        timeout = 5

        def setup(self) -> None:
            super().setup()
            self.connection_no = collector.connected()

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = self.rfile.read(length)
            reply = collector.received(Seen(
                self.path, {k.lower(): v for k, v in self.headers.items()}, body,
                self.connection_no))
            if reply.hang_s:
                time.sleep(reply.hang_s)
            payload = b"{}" if 200 <= reply.status < 300 else b'{"message":"scripted"}'
            try:
                self.send_response(reply.status)
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
            except OSError:
                pass    # the client gave up first: what the hanging replies are for

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler
