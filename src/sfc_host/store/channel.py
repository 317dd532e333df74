"""The hot path's Redis connection: script calls pipelined on one connection.

redis-py spends about 100 µs of CPU on one awaited call (a connection out of the pool
and back, a timeout scope, the retry wrapper, its parser's Python side) and about 11 µs
a call in pipelines; the compare-and-set scripts of every answer pay that. This channel
packs with the core's ``sfc_fast.wire.resp.pack_command`` (hiredis's bytes, a tenth of its
time on a compare-and-set call's thousands of arguments) and parses with
``hiredis.Reader`` (C), keeps
one connection, and writes every request of one event-loop pass in one write, whoever
made it; replies come back in order and go to their callers' futures
(docs/design.md#few-large-requests). On a Redis Cluster, ``cluster_channel.ClusterChannel`` keeps
one of these per primary and routes each request by its key's slot.

Errors are redis-py's classes (``NoScriptError`` for ``NOSCRIPT``, ``ResponseError`` for
other replies, ``ConnectionError`` when the connection fails), so callers handle them
alike whichever connection ran the call. A call whose connection failed is tried again
on a new one, as the host's redis-py client does (its script calls are all safe to
repeat).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Sequence
from typing import Any

import hiredis
from redis import exceptions as rx
from redis.asyncio.connection import SSLConnection, UnixDomainSocketConnection, parse_url

from sfc_host.store.client import BACKOFF_BASE_S, BACKOFF_CAP_S, RETRIES, pack_request
from sfc_host.tls import client_context

CONNECT_TIMEOUT_S = 10.0
# A lazy request (``lazy=True``: the sent markers) waits this long for another request
# to share its write; at a few hundred actions a second the next compare-and-set comes
# first, so the marker costs no write, no read and no wakeup of its own.
LAZY_WAIT_S = 0.005

# error replies by their first word, as redis-py names them
_ERRORS: dict[str, type[rx.ResponseError]] = {
    "NOSCRIPT": rx.NoScriptError, "LOADING": rx.BusyLoadingError,
    "READONLY": rx.ReadOnlyError, "NOPERM": rx.NoPermissionError,
    "OOM": rx.OutOfMemoryError, "EXECABORT": rx.ExecAbortError,
}


def reply_error(e: Exception) -> Exception:
    """An error reply (``hiredis.ReplyError``) as redis-py raises it."""
    text = str(e)
    word = text.split(" ", 1)[0]
    if word in ("NOAUTH", "WRONGPASS"):
        return rx.AuthenticationError(text)
    cls = _ERRORS.get(word, rx.ResponseError)
    if cls is not rx.ResponseError:
        text = text.split(" ", 1)[1] if " " in text else text
    return cls(text)


def _pack(args: tuple[Any, ...]) -> bytes:
    try:
        return pack_request(args)
    except TypeError as e:      # None, say: refused as redis-py refuses it
        raise rx.DataError(f"not a Redis argument: {e}") from e


class _Pending:
    """The caller of one request (``n == 0``) or of a batch of ``n`` requests."""

    __slots__ = ("fut", "n", "replies")

    def __init__(self, fut: asyncio.Future[Any], n: int) -> None:
        self.fut = fut
        self.n = n
        self.replies: list[Any] = []


class _Connection(asyncio.Protocol):
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.reader = hiredis.Reader()
        self.pending: collections.deque[_Pending] = collections.deque()
        self.out: list[bytes] = []
        self.transport: asyncio.Transport | None = None
        self.lost: Exception | None = None
        self._flush_soon = False
        self._lazy_timer: asyncio.TimerHandle | None = None
        self.writes = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]   # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        reader = self.reader
        reader.feed(data)
        pending = self.pending
        while True:
            try:
                r = reader.gets()
            except hiredis.ProtocolError as e:
                self._fail(rx.ConnectionError(f"Redis protocol error: {e}"))
                if self.transport is not None:
                    self.transport.abort()
                return
            if r is False:
                return
            if not pending:       # nothing asked for it: the stream is out of step
                self._fail(rx.ConnectionError("Redis sent a reply nobody asked for"))
                if self.transport is not None:
                    self.transport.abort()
                return
            head = pending[0]
            if isinstance(r, hiredis.ReplyError):
                r = reply_error(r)
            if head.n:
                head.replies.append(r)
                if len(head.replies) < head.n:
                    continue
                r = head.replies
            pending.popleft()
            fut = head.fut
            if fut.done():        # its caller was cancelled; the reply is consumed
                continue
            if head.n or not isinstance(r, Exception):
                fut.set_result(r)
            else:
                fut.set_exception(r)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self._lazy_timer is not None:
            self._lazy_timer.cancel()
            self._lazy_timer = None
        self._fail(rx.ConnectionError(
            f"Connection to Redis lost: {exc}" if exc else "Connection closed by server."))

    def _fail(self, err: Exception) -> None:
        if self.lost is None:
            self.lost = err
        while self.pending:
            fut = self.pending.popleft().fut
            if not fut.done():
                fut.set_exception(err)
                fut.exception()       # retrieved: its caller may be gone already

    def send(self, packed: bytes, n: int, lazy: bool = False) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = self.loop.create_future()
        if self.lost is not None:
            fut.set_exception(self.lost)
            return fut
        self.pending.append(_Pending(fut, n))
        self.out.append(packed)
        if not self._flush_soon:
            if not lazy:
                self._flush_soon = True
                self.loop.call_soon(self._flush)
            elif self._lazy_timer is None:
                self._lazy_timer = self.loop.call_later(LAZY_WAIT_S, self._flush)
        return fut

    def _flush(self) -> None:
        self._flush_soon = False
        if self._lazy_timer is not None:
            self._lazy_timer.cancel()
            self._lazy_timer = None
        if self.transport is None or not self.out:
            return
        data = b"".join(self.out) if len(self.out) > 1 else self.out[0]
        self.out.clear()
        self.transport.write(data)
        self.writes += 1


class RedisChannel:
    """One pipelined connection to a standalone Redis for the host's script calls.

    ``execute`` sends one command and returns its reply (an error reply raises);
    ``execute_many`` sends several at once and returns their replies in order, an
    error reply in place of its result (as a redis-py pipeline with
    ``raise_on_error=False``). A ``lazy`` request starts no write of its own: it goes
    with the next request's, or after ``LAZY_WAIT_S``."""

    def __init__(self, url: str, *, ca_file: str = "", cert_file: str = "",
                 key_file: str = "") -> None:
        kw = parse_url(url)
        cls = kw.get("connection_class")
        self.path: str | None = kw.get("path") if cls is UnixDomainSocketConnection else None
        self.host: str = kw.get("host") or "localhost"
        self.port: int = int(kw.get("port") or 6379)
        self.db = int(kw.get("db") or 0)
        self.username: str | None = kw.get("username")
        self.password: str | None = kw.get("password")
        self.tls = cls is SSLConnection
        self._tls_files = (ca_file, cert_file, key_file)
        self._conn: _Connection | None = None
        self._connecting = asyncio.Lock()     # one connect for every caller that waits
        self._closed = False
        self.connects = 0

    def __repr__(self) -> str:
        where = self.path or f"{self.host}:{self.port}"
        return f"RedisChannel({where}, db={self.db})"

    @property
    def writes(self) -> int:
        """Writes on the current connection (tests see requests share them)."""
        return self._conn.writes if self._conn is not None else 0

    async def execute(self, *args: Any, lazy: bool = False) -> Any:
        return await self._send(_pack(args), 0, lazy)

    async def execute_many(self, commands: Sequence[Sequence[Any]],
                           lazy: bool = False) -> list[Any]:
        if not commands:
            return []
        packed = b"".join([_pack(tuple(c)) for c in commands])
        return await self._send(packed, len(commands), lazy)  # type: ignore[no-any-return]

    async def _send(self, packed: bytes, n: int, lazy: bool = False) -> Any:
        # As redis-py's Retry(ExponentialBackoff(cap=1.0, base=0.05), 3) of client.py:
        # a short outage (a restart) is bridged, not reported to every caller.
        failures = 0
        while True:
            try:
                conn = self._conn
                if conn is None or conn.lost is not None:
                    conn = await self._connection()
                got = await conn.send(packed, n, lazy)
                if n:
                    # a batch is one request: a server still loading refuses it whole
                    busy = next((r for r in got if isinstance(r, rx.ConnectionError)), None)
                    if busy is not None:
                        raise busy
                return got
            except rx.ConnectionError:
                failures += 1
                if failures > RETRIES or self._closed:
                    raise
                await asyncio.sleep(min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** failures))

    async def _connection(self) -> _Connection:
        async with self._connecting:
            if self._closed:
                raise rx.ConnectionError("the Redis channel is closed")
            conn = self._conn
            if conn is None or conn.lost is not None:
                conn = self._conn = await self._connect()
            return conn

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        where = self.path or f"{self.host}:{self.port}"
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                if self.path:
                    _, conn = await loop.create_unix_connection(
                        lambda: _Connection(loop), self.path)
                else:
                    ctx = client_context(*self._tls_files) if self.tls else None
                    _, conn = await loop.create_connection(
                        lambda: _Connection(loop), self.host, self.port, ssl=ctx,
                        server_hostname=self.host if ctx else None)
        except (OSError, TimeoutError) as e:
            raise rx.ConnectionError(f"Error connecting to Redis at {where}: {e}") from e
        hello: list[tuple[Any, ...]] = []
        if self.password is not None:
            hello.append(("AUTH", self.username, self.password) if self.username
                         else ("AUTH", self.password))
        if self.db:
            hello.append(("SELECT", self.db))
        if hello:
            replies = await conn.send(b"".join(_pack(c) for c in hello),
                                      len(hello))
            bad = next((r for r in replies if isinstance(r, Exception)), None)
            if bad is not None:
                if conn.transport is not None:
                    conn.transport.close()
                if isinstance(bad, rx.AuthenticationError) or "password" in str(bad):
                    raise rx.AuthenticationError(str(bad))
                raise bad
        self.connects += 1
        return conn

    async def aclose(self) -> None:
        self._closed = True
        conn, self._conn = self._conn, None
        if conn is not None and conn.transport is not None:
            conn.transport.close()
            await asyncio.sleep(0)      # the transport closes on the next loop pass
