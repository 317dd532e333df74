"""The client's channel against a scripted server that misbehaves on purpose: an ERR
instead of an Acknowledge, responses in chunks and aborted ones, a ServiceFault, a
response of another type, one that never comes, a sequence number out of order, a chunk
over our buffer, bytes that are no message, and the channel's token renewed. Each
fault fails only what it must: a request, or the connection with every request on it."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from helpers.aio import run

from sfc_fast.wire.uabinary import DOUBLE, NodeId, Reader, Variant, Writer, ticks_now
from sfc_host.opcua_client import services
from sfc_host.opcua_client.channel import Channel
from sfc_host.opcua_client.errors import BadStatus, ChannelError
from sfc_host.opcua_client.security import ChannelSecurity

HDR = struct.Struct("<3scI")
POLICY_NONE = "http://opcfoundation.org/UA/SecurityPolicy#None"


class Request:
    def __init__(self, kind: bytes, seq: int, rid: int, type_id: int, body: Reader) -> None:
        self.kind, self.seq, self.rid, self.type_id, self.body = kind, seq, rid, type_id, body


Script = Callable[["Peer", Request], Awaitable[None]]


class Peer:
    """One connection of the scripted server: it acknowledges the Hello and opens the
    channel (security None) as a server does, then hands each request to the script."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 script: Script, lifetime_ms: int) -> None:
        self.reader, self.writer, self.script = reader, writer, script
        self.lifetime_ms = lifetime_ms
        self.seq = 1
        self.token = 7
        self.tokens_seen: list[int] = []
        self.opens = 0

    async def serve(self, hello: Callable[[Peer], Awaitable[bool]] | None) -> None:
        try:
            while True:
                head = await self.reader.readexactly(8)
                kind, _c, size = HDR.unpack(head)
                chunk = head + await self.reader.readexactly(size - 8)
                if kind == b"HEL":
                    if hello is not None and not await hello(self):
                        return
                    w = Writer()
                    for v in (0, 65535, 65535, 0, 0):
                        w.uint32(v)
                    self.raw(b"ACK", b"F", w.getvalue())
                elif kind == b"OPN":
                    r = Reader(chunk, 12)
                    r.string()
                    r.bytestring()
                    r.bytestring()
                    await self.open(self._request(b"OPN", r))
                elif kind == b"MSG":
                    r = Reader(chunk, 12)
                    self.tokens_seen.append(r.uint32())
                    await self.script(self, self._request(b"MSG", r))
                elif kind == b"CLO":
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            self.writer.close()

    def _request(self, kind: bytes, r: Reader) -> Request:
        seq, rid = r.uint32(), r.uint32()
        tid = r.nodeid()
        r.nodeid()              # the request header: token, time, handle, ...
        r.datetime()
        r.uint32()
        r.uint32()
        r.string()
        r.uint32()
        r.extension_object()
        return Request(kind, seq, rid, int(tid.identifier), r)

    async def open(self, req: Request) -> None:
        req.body.uint32()
        renew = req.body.uint32() == 1
        self.opens += 1
        if renew:
            self.token += 1
        w = self.response_header(services.OPEN_RESPONSE)
        w.uint32(0)
        w.uint32(1)             # channel id
        w.uint32(self.token)
        w.datetime(ticks_now())
        w.uint32(self.lifetime_ms)
        w.bytestring(None)
        sec = Writer()
        sec.uint32(1)
        sec.string(POLICY_NONE)
        sec.bytestring(None)
        sec.bytestring(None)
        self.raw(b"OPN", b"F", sec.getvalue() + self.seq_header(req.rid) + w.getvalue())

    def response_header(self, type_id: int, result: int = 0) -> Writer:
        w = Writer()
        w.nodeid(NodeId(type_id))
        w.datetime(ticks_now())
        w.uint32(0)
        w.status(result)
        w.byte(0)               # no diagnostics
        w.length(-1)
        w.extension_object(None)
        return w

    def seq_header(self, rid: int, seq: int | None = None) -> bytes:
        if seq is None:
            seq, self.seq = self.seq, self.seq + 1
        return struct.pack("<II", seq, rid)

    def raw(self, kind: bytes, chunk: bytes, body: bytes) -> None:
        self.writer.write(HDR.pack(kind, chunk, 8 + len(body)) + body)

    def message(self, rid: int, body: bytes, chunk: bytes = b"F", seq: int | None = None) -> None:
        self.raw(b"MSG", chunk, struct.pack("<II", 1, self.token)
                 + self.seq_header(rid, seq) + body)

    def read_response(self, req: Request, values: list[float]) -> None:
        w = self.response_header(services.READ_RESPONSE)
        w.length(len(values))
        for v in values:
            w.byte(1)           # a DataValue with a value
            w.variant(Variant(DOUBLE, v))
        w.length(-1)
        self.message(req.rid, w.getvalue())


async def serve(script: Script, *, hello: Callable[[Peer], Awaitable[bool]] | None = None,
                lifetime_ms: int = 600_000) -> tuple[asyncio.Server, list[Peer], str]:
    peers: list[Peer] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = Peer(reader, writer, script, lifetime_ms)
        peers.append(peer)
        await peer.serve(hello)
    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, peers, f"opc.tcp://127.0.0.1:{port}/scripted"


def read_body(n: int = 1) -> bytes:
    w = Writer()
    services.write_read(w, [(NodeId(2259), services.VALUE)] * n)
    return w.getvalue()


async def values(ch: Channel, n: int = 1, timeout_s: float | None = None) -> list[Any]:
    r = await ch.request(services.READ, read_body(n), timeout_s)
    return [dv.value.value for dv in services.read_read(r)]


def test_an_err_in_place_of_the_acknowledge_is_one_line() -> None:
    async def hello(peer: Peer) -> bool:
        w = Writer()
        w.uint32(0x80830000)                    # BadTcpEndpointUrlInvalid
        w.string("no such endpoint")
        peer.raw(b"ERR", b"F", w.getvalue())
        await peer.writer.drain()
        return False

    async def main() -> None:
        server, _peers, url = await serve(lambda p, r: asyncio.sleep(0), hello=hello)
        async with server:
            ch = Channel(url, ChannelSecurity(1), 2.0)
            with pytest.raises(ChannelError) as e:
                await ch.open()
            assert "BadTcpEndpointUrlInvalid (no such endpoint)" in str(e.value)
            assert "\n" not in str(e.value)
    run(main())


def test_chunks_are_joined_an_abort_fails_its_request_and_a_fault_its_own() -> None:
    async def script(peer: Peer, req: Request) -> None:
        req.body.double()                       # MaxAge
        req.body.uint32()
        count = req.body.length()
        if count == 3:                          # one response in three chunks
            w = peer.response_header(services.READ_RESPONSE)
            w.length(3)
            for v in (1.0, 2.0, 3.0):
                w.byte(1)
                w.variant(Variant(DOUBLE, v))
            w.length(-1)
            body = w.getvalue()
            peer.message(req.rid, body[:10], b"C")
            peer.message(req.rid, body[10:30], b"C")
            peer.message(req.rid, body[30:])
        elif count == 2:                        # an aborted response
            a = Writer()
            a.uint32(0x80B90000)                # BadResponseTooLarge
            a.string("too large")
            peer.message(req.rid, b"partial", b"C")
            peer.message(req.rid, a.getvalue(), b"A")
        elif count == 4:                        # a ServiceFault
            peer.message(req.rid, peer.response_header(services.SERVICE_FAULT,
                                                       0x80100000).getvalue())
        elif count == 5:                        # a response of another type
            w = peer.response_header(services.WRITE_RESPONSE)
            w.length(0)
            w.length(-1)
            peer.message(req.rid, w.getvalue())
        else:
            peer.read_response(req, [42.0])

    async def main() -> None:
        server, _peers, url = await serve(script)
        async with server:
            ch = Channel(url, ChannelSecurity(1), 2.0)
            await ch.open()
            assert await values(ch, 3) == [1.0, 2.0, 3.0]
            with pytest.raises(BadStatus, match="BadResponseTooLarge"):
                await values(ch, 2)
            with pytest.raises(BadStatus, match="BadTooManyOperations"):
                await values(ch, 4)
            with pytest.raises(services.Unexpected):
                await values(ch, 5)
            assert await values(ch) == [42.0]   # the channel goes on
            await ch.close()
    run(main())


def test_a_response_that_never_comes_times_out_and_a_late_one_is_dropped() -> None:
    held: list[Request] = []

    async def script(peer: Peer, req: Request) -> None:
        if not held:
            held.append(req)                    # answered only after the next one
            return
        peer.read_response(held[0], [1.0])     # late: its caller has given up
        peer.read_response(req, [2.0])

    async def main() -> None:
        server, _peers, url = await serve(script)
        async with server:
            ch = Channel(url, ChannelSecurity(1), 2.0)
            await ch.open()
            with pytest.raises(TimeoutError):
                await values(ch, timeout_s=0.2)
            assert await values(ch) == [2.0]
            assert ch.closed is not None and not ch.closed.done()
            await ch.close()
    run(main())


@pytest.mark.parametrize("fault", ["sequence", "oversized", "garbage"])
def test_a_broken_stream_closes_the_connection_and_fails_every_request(fault: str) -> None:
    async def script(peer: Peer, req: Request) -> None:
        if fault == "sequence":
            peer.seq += 5                       # numbers skipped
            peer.read_response(req, [1.0])
        elif fault == "oversized":
            peer.writer.write(HDR.pack(b"MSG", b"F", 1 << 20))
        else:
            peer.writer.write(b"HTTP/1.1 400 Bad Request\r\n\r\n")

    async def main() -> None:
        server, _peers, url = await serve(script)
        async with server:
            ch = Channel(url, ChannelSecurity(1), 2.0)
            await ch.open()
            waiting = [ch.request(services.READ, read_body(), 5.0) for _ in range(3)]
            for fut in waiting:
                with pytest.raises(ChannelError):
                    await fut
            assert ch.closed is not None
            await asyncio.wait_for(ch.closed, 2)
            with pytest.raises(ChannelError):
                await values(ch)
    run(main())


def test_the_channel_token_is_renewed_before_it_expires() -> None:
    async def script(peer: Peer, req: Request) -> None:
        peer.read_response(req, [float(peer.token)])

    async def main() -> None:
        server, peers, url = await serve(script, lifetime_ms=1000)
        async with server:
            ch = Channel(url, ChannelSecurity(1), 2.0)
            await ch.open()
            assert await values(ch) == [7.0]
            await asyncio.sleep(0.9)            # renewed at 75 % of the 1 s lifetime
            assert peers[0].opens == 2
            assert await values(ch) == [8.0]
            assert peers[0].tokens_seen == [7, 8]
            await ch.close()
    run(main())
