"""One OPC UA TCP connection and its secure channel (IEC 62541 Part 6 §6–7): Hello and
Acknowledge, OpenSecureChannel and its renewal, requests framed into chunks and matched
to their responses by request id.

An asyncio ``Protocol`` over the loop's transport, as the MQTT connection is: every
chunk of one socket read parsed in one call, and what the client sends in one event-loop
pass written together. Requests wait on a future with a timer of their own, not a task
each. The chunks' security (signatures, encryption) is ``security.ChannelSecurity``'s.

A response that cannot be read, a sequence number out of order or an ERR message
closes the connection: every request waiting fails with ``ChannelError`` and the caller
connects again. A Bad ServiceResult fails only its own request, with ``BadStatus``.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from typing import Any
from urllib.parse import urlsplit

from sfc_fast.wire.uabinary import DecodeError, NodeId, Reader, Writer, ticks_now
from sfc_host.opcua_client import services
from sfc_host.opcua_client.errors import BadStatus, ChannelError, status_name
from sfc_host.opcua_client.security import ChannelSecurity, SecurityError

log = logging.getLogger("sfc_host.opcua_client")

BUFFER = 65535                  # our receive buffer: the largest chunk the server sends
MAX_MESSAGE = 64 * 1024 * 1024  # the largest response we take
LIFETIME_MS = 600_000           # the channel token's requested lifetime
RENEW_AT = 0.75                 # of the revised lifetime, as Part 4 advises
_HEADER = struct.Struct("<3scI")
_U32 = struct.Struct("<I")
_SEQ = struct.Struct("<II")
_NULL = NodeId(0)


def endpoint_address(url: str) -> tuple[str, int]:
    """Host and port of an ``opc.tcp://`` URL (port 4840 when it names none)."""
    u = urlsplit(url)
    if u.scheme != "opc.tcp" or not u.hostname:
        raise ValueError(f"{url!r} is no opc.tcp://host:port/ URL")
    return u.hostname, u.port or 4840


class Channel(asyncio.Protocol):
    """The connection. ``open`` connects and opens the secure channel; ``request``
    sends one service request and returns its response body after the header."""

    def __init__(self, url: str, security: ChannelSecurity, timeout_s: float = 5.0) -> None:
        self.url = url
        self.security = security
        self.timeout_s = timeout_s
        self.auth_token: NodeId = _NULL         # the session's, once it has one
        self.closed: asyncio.Future[None] | None = None
        self.requests = 0
        self.responses = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._out: list[bytes] = []
        self._flushing = False
        self._pending: dict[int, tuple[asyncio.Future[Reader], int, Any]] = {}
        self._partial: dict[int, list[bytes]] = {}
        self._next_id = 1
        self._send_seq = 1
        self._recv_seq: int | None = None
        self._channel_id = 0
        self._token_id = 0
        self._old_token: int | None = None
        self._send_size = 8192
        self._max_chunk_body = 0
        self._hello: asyncio.Future[None] | None = None
        self._renew: asyncio.TimerHandle | None = None
        self._error: BaseException | None = None

    # ---- opening

    async def open(self) -> None:
        loop = self._loop = asyncio.get_running_loop()
        self.closed = loop.create_future()
        host, port = endpoint_address(self.url)
        try:
            await asyncio.wait_for(loop.create_connection(lambda: self, host, port),
                                   self.timeout_s)
        except (OSError, TimeoutError) as e:
            raise ChannelError(f"{self.url}: {e or type(e).__name__}") from e
        try:
            await self._say_hello()
            await self._open_channel(renew=False)
        except BaseException:
            self.abort()
            raise

    async def _say_hello(self) -> None:
        assert self._loop is not None and self._transport is not None
        self._hello = self._loop.create_future()
        w = Writer()
        for v in (0, BUFFER, BUFFER, MAX_MESSAGE, 0):
            w.uint32(v)
        w.string(self.url)
        body = w.getvalue()
        self._transport.write(_HEADER.pack(b"HEL", b"F", 8 + len(body)) + body)
        try:
            await asyncio.wait_for(asyncio.shield(self._hello), self.timeout_s)
        except TimeoutError:
            raise ChannelError(f"{self.url}: no Acknowledge to our Hello") from None

    async def _open_channel(self, *, renew: bool) -> None:
        nonce = self.security.nonce()
        w = Writer()
        w.uint32(0)                                 # protocol version
        w.uint32(1 if renew else 0)
        w.uint32(self.security.mode)
        w.bytestring(nonce or None)
        w.uint32(LIFETIME_MS)
        r = await self._send(services.OPEN_REQUEST, w.getvalue(), b"OPN")
        r.uint32()                                  # server protocol version
        channel_id, token_id = r.uint32(), r.uint32()
        r.datetime()
        lifetime = r.uint32()
        server_nonce = r.bytestring() or b""
        self.security.derive(token_id, nonce, server_nonce)
        self._channel_id = channel_id
        if renew:
            self._old_token = self._token_id
        self._token_id = token_id
        assert self._loop is not None
        self._renew = self._loop.call_later(max(lifetime, 1000) * RENEW_AT / 1000,
                                            self._renew_now)

    def _renew_now(self) -> None:
        assert self._loop is not None
        task = self._loop.create_task(self._renew_token())
        task.add_done_callback(_quiet)

    async def _renew_token(self) -> None:
        try:
            await self._open_channel(renew=True)
        except Exception as e:
            log.warning("OPC UA %s: the secure channel's renewal failed: %s", self.url, e)
            self.abort(ChannelError(f"{self.url}: the secure channel's renewal failed"))

    # ---- requests

    def request(self, type_id: int, body: bytes,
                timeout_s: float | None = None) -> asyncio.Future[Reader]:
        """Send one request; the future's Reader stands after the response header."""
        return self._send(type_id, body, b"MSG", timeout_s)

    def _send(self, type_id: int, body: bytes, kind: bytes,
              timeout_s: float | None = None) -> asyncio.Future[Reader]:
        loop = self._loop
        assert loop is not None
        fut: asyncio.Future[Reader] = loop.create_future()
        if self._error is not None or self._transport is None:
            fut.set_exception(self._error or ChannelError(f"{self.url}: not connected"))
            return fut
        timeout = self.timeout_s if timeout_s is None else timeout_s
        rid = self._next_id
        self._next_id = rid + 1 if rid < 0xFFFFFFF0 else 1
        message = self._message(type_id, rid, timeout, body)
        timer = loop.call_later(timeout, self._timed_out, rid)
        self._pending[rid] = (fut, type_id + 3, timer)
        self.requests += 1
        if kind == b"OPN":
            payload = _SEQ.pack(self._next_seq(), rid) + message
            self._write(self.security.encode_open(self._channel_id, payload))
        else:
            self._write_chunks(kind, rid, message)
        return fut

    def _message(self, type_id: int, rid: int, timeout: float, body: bytes) -> bytes:
        """A request: its type, the RequestHeader (the session's token, the request id
        as its handle, the timeout as its hint), then ``body``."""
        w = Writer()
        w.nodeid(NodeId(type_id))
        w.nodeid(self.auth_token)
        w.datetime(ticks_now())
        w.uint32(rid)                       # request handle: the request id
        w.uint32(0)                         # no diagnostics
        w.string(None)
        w.uint32(int(timeout * 1000))
        w.extension_object(None)
        w.raw(body)
        return w.getvalue()

    def _write_chunks(self, kind: bytes, rid: int, message: bytes) -> None:
        room = self._max_chunk_body
        sec = self.security
        if len(message) <= room:
            self._write(sec.encode_message(kind, b"F", self._channel_id, self._token_id,
                                           _SEQ.pack(self._next_seq(), rid) + message))
            return
        for at in range(0, len(message), room):
            part = message[at:at + room]
            last = at + room >= len(message)
            self._write(sec.encode_message(kind, b"F" if last else b"C", self._channel_id,
                                           self._token_id,
                                           _SEQ.pack(self._next_seq(), rid) + part))

    def _next_seq(self) -> int:
        s = self._send_seq
        # wraps before UInt32's end, as Part 6 §6.7.2.4 asks
        self._send_seq = s + 1 if s < 4294966271 else 1
        return s

    def _write(self, data: bytes) -> None:
        self._out.append(data)
        if not self._flushing:
            self._flushing = True
            assert self._loop is not None
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flushing = False
        out, self._out = self._out, []
        if self._transport is not None and out:
            self._transport.write(b"".join(out) if len(out) > 1 else out[0])

    def _timed_out(self, rid: int) -> None:
        entry = self._pending.pop(rid, None)
        self._partial.pop(rid, None)
        if entry is not None and not entry[0].done():
            entry[0].set_exception(TimeoutError(f"{self.url}: no response in time"))

    # ---- closing

    async def close(self) -> None:
        """Close the secure channel and the connection, politely."""
        if self._transport is not None and self._error is None and self._channel_id:
            try:
                self._write(self.security.encode_message(
                    b"CLO", b"F", self._channel_id, self._token_id,
                    _SEQ.pack(self._next_seq(), 0)
                    + self._message(services.CLOSE_CHANNEL, 0, 0.0, b"")))
                self._flush()
            except Exception as e:      # closing anyway
                log.debug("OPC UA %s: CloseSecureChannel not sent: %s", self.url, e)
        self.abort(ChannelError(f"{self.url}: closed"))

    def abort(self, why: BaseException | None = None) -> None:
        if self._error is None:
            self._error = why or ChannelError(f"{self.url}: connection closed")
        if self._renew is not None:
            self._renew.cancel()
        t, self._transport = self._transport, None
        if t is not None:
            t.close()
        self._fail_all(self._error)

    def _fail_all(self, e: BaseException) -> None:
        pending, self._pending = self._pending, {}
        self._partial.clear()
        for fut, _expect, timer in pending.values():
            timer.cancel()
            if not fut.done():
                fut.set_exception(e)
        if self._hello is not None and not self._hello.done():
            self._hello.set_exception(e)
        if self.closed is not None and not self.closed.done():
            self.closed.set_result(None)

    # ---- asyncio.Protocol

    def connection_made(self, transport: Any) -> None:
        self._transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        if self._error is None:
            self._error = ChannelError(f"{self.url}: connection lost"
                                       + (f" ({exc})" if exc else ""))
        self._fail_all(self._error)

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        at = 0
        n = len(buf)
        try:
            while n - at >= 8:
                kind, _final, size = _HEADER.unpack_from(buf, at)
                if size < 8 or size > BUFFER:
                    raise ChannelError(f"{self.url}: a chunk of {size} bytes")
                if n - at < size:
                    break
                self._chunk(kind, bytes(buf[at:at + size]))
                at += size
        except (ChannelError, SecurityError, DecodeError, BadStatus) as e:
            log.warning("OPC UA %s: %s; the connection is closed", self.url, e)
            del buf[:]
            self.abort(e if isinstance(e, ChannelError) else ChannelError(f"{self.url}: {e}"))
            return
        if at:
            del buf[:at]

    def _chunk(self, kind: bytes, chunk: bytes) -> None:
        if kind == b"MSG":
            _k, final, _cid, token, payload = self.security.decode_message(chunk)
            if self._old_token is not None and token == self._token_id:
                self.security.forget(self._old_token)
                self._old_token = None
            self._payload(final, payload)
        elif kind == b"OPN":
            _cid, payload = self.security.decode_open(chunk)
            self._payload(b"F", payload)
        elif kind == b"ACK":
            self._acknowledged(chunk)
        elif kind == b"ERR":
            r = Reader(chunk, 8)
            code = r.uint32()
            reason = r.string() or ""
            raise ChannelError(f"{self.url}: the server closed the channel: "
                               f"{status_name(code)}" + (f" ({reason})" if reason else ""))
        else:
            raise ChannelError(f"{self.url}: a message of type {kind!r}")

    def _acknowledged(self, chunk: bytes) -> None:
        receive = Reader(chunk, 12).uint32()    # its receive buffer: our largest chunk
        self._send_size = min(receive, BUFFER) if receive else BUFFER
        self._max_chunk_body = self.security.max_payload(self._send_size) - 8
        if self._hello is not None and not self._hello.done():
            self._hello.set_result(None)

    def _payload(self, final: bytes, payload: bytes) -> None:
        seq, rid = _SEQ.unpack_from(payload)
        expected = self._recv_seq
        wrapped = seq < 1024 and expected is not None and expected > 4294966271 - 1024
        if expected is not None and seq != expected and not wrapped:
            raise ChannelError(f"{self.url}: sequence number {seq} where {expected} was due")
        self._recv_seq = seq + 1
        self.responses += 1
        body = payload[8:]
        if final == b"C":
            self._partial.setdefault(rid, []).append(body)
            return
        parts = self._partial.pop(rid, None)
        entry = self._pending.pop(rid, None)
        if entry is None:
            return                          # timed out already
        fut, expect, timer = entry
        timer.cancel()
        if fut.done():
            return
        if final == b"A":
            r = Reader(body)
            code = r.uint32()
            fut.set_exception(BadStatus(code, "the server aborted the response"))
            return
        if parts:
            parts.append(body)
            body = b"".join(parts)
        try:
            fut.set_result(_response(body, expect))
        except (BadStatus, DecodeError, services.Unexpected) as e:
            fut.set_exception(e)


def _response(body: bytes, expect: int) -> Reader:
    r = Reader(body)
    tid = r.nodeid()
    kind = tid.identifier if tid.namespace == 0 else -1
    r.datetime()
    r.uint32()                              # request handle
    result = r.status()
    r.diagnostic_info()
    for _ in range(max(r.length(), 0)):     # string table
        r.string()
    r.extension_object()
    if kind == services.SERVICE_FAULT or result & 0x80000000:
        raise BadStatus(result or 0x80010000)   # a fault without a code: BadUnexpectedError
    if kind != expect:
        raise services.Unexpected(f"a response of type {tid} where type i={expect} was due")
    return r


def _quiet(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()

