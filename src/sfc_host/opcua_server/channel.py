"""One client's TCP connection and its secure channel, the server's side (IEC 62541
Part 6 §6–7): Hello and Acknowledge, OpenSecureChannel (issue and renew), requests
taken out of their chunks and responses put into them.

An asyncio ``Protocol``, as the client's channel is: every chunk of one socket read
parsed in one call, the responses of one event-loop pass written together. The
chunks' crypto is the client's ``ChannelSecurity`` with the roles turned; which
policies and modes are offered, and whether a client certificate is trusted, is the
server's to say (``ChannelOwner``). The services themselves are the owner's too: the
channel hands over each whole request (its type id and a Reader after it) and takes
back the response's bytes.

A chunk that cannot be read, a sequence number out of order, a certificate not trusted
or a token expired ends the connection with an ERR message naming the status.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from typing import Any, Protocol

from sfc_fast.wire.uabinary import DecodeError, NodeId, Reader, Writer, ticks_now
from sfc_host.errors import SfcHostError
from sfc_host.opcua_client import (
    BASIC256SHA256,
    MODE_NONE,
    MODE_SIGN,
    MODE_SIGN_AND_ENCRYPT,
    POLICY_NONE,
    ChannelSecurity,
    SecurityError,
    open_header,
    services,
    thumbprint,
)
from sfc_host.opcua_server import bodies

log = logging.getLogger("sfc_host.opcua_server")

BUFFER = 65535                  # our receive and send buffers: the largest chunk
MAX_MESSAGE = 16 * 1024 * 1024  # the largest request we take
MAX_CHUNKS = 4096
MIN_LIFETIME_MS, MAX_LIFETIME_MS = 10_000, 3_600_000
_HEADER = struct.Struct("<3scI")
_SEQ = struct.Struct("<II")
_U32 = struct.Struct("<I")

BAD_TCP_MESSAGE_TYPE_INVALID = 0x807E0000
BAD_TCP_MESSAGE_TOO_LARGE = 0x80800000
BAD_TCP_INTERNAL_ERROR = 0x80820000
BAD_SECURITY_CHECKS_FAILED = 0x80130000
BAD_SECURITY_POLICY_REJECTED = 0x80550000
BAD_SECURITY_MODE_REJECTED = 0x80E60000
BAD_CERTIFICATE_UNTRUSTED = 0x801A0000
BAD_SECURE_CHANNEL_ID_INVALID = 0x80220000
BAD_SEQUENCE_NUMBER_INVALID = 0x80880000
BAD_DECODING_ERROR = 0x80070000
BAD_REQUEST_TOO_LARGE = 0x80B80000
BAD_TIMEOUT = 0x800A0000
BAD_RESPONSE_TOO_LARGE = 0x80B90000


class ChannelRefused(SfcHostError):
    """Why the channel ends: a status code and a line for the log."""

    def __init__(self, status: int, why: str) -> None:
        super().__init__(why)
        self.status = status


class ChannelOwner(Protocol):
    """What a channel asks of its server."""

    certificate: bytes | None
    private_key: Any
    modes: frozenset[int]       # the message security modes offered

    def trusts(self, certificate: bytes) -> int:
        """Good (0) for a client certificate the server takes, else the status to refuse
        it with; the owner logs and keeps a refused one."""

    def request(self, channel: ServerChannel, request_id: int, type_id: int,
                body: Reader) -> None:
        """A whole request: ``body`` stands after its type id."""

    def channel_closed(self, channel: ServerChannel) -> None:
        """The connection ended."""


_channel_ids = iter(range(1, 1 << 32))


class ServerChannel(asyncio.Protocol):
    """One connection. The owner answers a request with ``respond``."""

    def __init__(self, owner: ChannelOwner) -> None:
        self.owner = owner
        self.channel_id = next(_channel_ids)
        self.security: ChannelSecurity | None = None
        self.peer = "?"
        self.endpoint_url = ""
        self.client_certificate: bytes | None = None
        self.requests = 0
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._out: list[bytes] = []
        self._reading = False
        self._hello = False
        self._send_size = 8192
        self._max_response = 0
        self._max_chunk_body = 0
        self._partial: dict[int, list[bytes]] = {}
        self._partial_size = 0
        self._send_seq = 1
        self._recv_seq: int | None = None
        self._token_id = 0
        self._old_token: int | None = None
        self._next_token = 1
        self._expiry: asyncio.TimerHandle | None = None
        self._closed = False

    @property
    def open(self) -> bool:
        return not self._closed and self.security is not None

    # ---- responses

    def respond(self, request_id: int, message: bytes) -> None:
        """Send a response: ``message`` is its type id, header and body, encoded."""
        if self._closed or self.security is None:
            return
        if self._max_response and len(message) > self._max_response:
            log.warning("OPC UA %s: a response of %d bytes is over the client's limit of "
                        "%d", self.peer, len(message), self._max_response)
            message = _too_large(message)
        room = self._max_chunk_body
        sec = self.security
        for at in range(0, max(len(message), 1), room):
            part = message[at:at + room]
            last = at + room >= len(message)
            self._out.append(sec.encode_message(b"MSG", b"F" if last else b"C",
                                                self.channel_id, self._token_id,
                                                _SEQ.pack(self._next_seq(), request_id)
                                                + part))
        if not self._reading:
            # an answer made outside a read (a method's coroutine, a Publish) goes out
            # now, ahead of the work its call woke; data_received writes what its
            # chunks answered in one write at its end
            self._flush()

    def close(self, status: int = 0, why: str = "") -> None:
        """End the connection, with an ERR message when ``status`` is set."""
        if self._closed:
            return
        self._closed = True
        if self._expiry is not None:
            self._expiry.cancel()
        t = self._transport
        if t is not None:
            if status:
                w = Writer()
                w.uint32(status)
                # a security check's reason stays in our log
                w.string(None if status == BAD_SECURITY_CHECKS_FAILED else why[:4000])
                body = w.getvalue()
                self._out.append(_HEADER.pack(b"ERR", b"F", 8 + len(body)) + body)
            self._flush()
            t.close()
        self.owner.channel_closed(self)

    def _write(self, data: bytes) -> None:
        self._out.append(data)
        if not self._reading:
            self._flush()

    def _flush(self) -> None:
        out, self._out = self._out, []
        if self._transport is not None and out:
            self._transport.write(b"".join(out) if len(out) > 1 else out[0])

    def _next_seq(self) -> int:
        s = self._send_seq
        self._send_seq = s + 1 if s < 4294966271 else 1
        return s

    # ---- asyncio.Protocol

    def connection_made(self, transport: Any) -> None:
        self._transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        # a client that never says Hello is dropped
        self._expiry = self._loop.call_later(10.0, self._no_hello)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        if not self._closed:
            self._closed = True
            if self._expiry is not None:
                self._expiry.cancel()
            self.owner.channel_closed(self)

    def data_received(self, data: bytes) -> None:
        self._reading = True
        try:
            self._read(data)
        finally:
            self._reading = False
            if self._out:
                self._flush()

    def _read(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        at = 0
        n = len(buf)
        try:
            while n - at >= 8 and not self._closed:
                kind, _final, size = _HEADER.unpack_from(buf, at)
                if size < 8 or size > BUFFER:
                    raise ChannelRefused(BAD_TCP_MESSAGE_TOO_LARGE, f"a chunk of {size} bytes")
                if n - at < size:
                    break
                self._chunk(kind, bytes(buf[at:at + size]))
                at += size
        except ChannelRefused as e:
            log.warning("OPC UA %s: %s; the connection is closed", self.peer, e)
            del buf[:]
            self.close(e.status, str(e))
            return
        except (SecurityError, DecodeError) as e:
            log.warning("OPC UA %s: %s; the connection is closed", self.peer, e)
            del buf[:]
            status = BAD_DECODING_ERROR if isinstance(e, DecodeError) else \
                BAD_SECURITY_CHECKS_FAILED
            self.close(status, str(e))
            return
        if at:
            del buf[:at]

    # ---- chunks

    def _chunk(self, kind: bytes, chunk: bytes) -> None:
        if kind == b"MSG":
            self._message(chunk)
        elif kind == b"HEL":
            self._say_ack(chunk)
        elif kind == b"OPN":
            self._open(chunk)
        elif kind == b"CLO":
            if self.security is not None:
                self.security.decode_message(chunk)
            self.close()
        else:
            raise ChannelRefused(BAD_TCP_MESSAGE_TYPE_INVALID, f"a message of type {kind!r}")

    def _no_hello(self) -> None:
        if not self._hello:
            self.close(BAD_TIMEOUT, "no Hello in time")

    def _say_ack(self, chunk: bytes) -> None:
        if self._hello:
            raise ChannelRefused(BAD_TCP_MESSAGE_TYPE_INVALID, "a second Hello")
        r = Reader(chunk, 8)
        r.uint32()                      # protocol version: 0 is the only one
        receive, send = r.uint32(), r.uint32()
        max_message, max_chunks = r.uint32(), r.uint32()
        self.endpoint_url = r.string() or ""
        if receive < 8192 or send < 8192:
            raise ChannelRefused(BAD_TCP_INTERNAL_ERROR,
                                 f"buffers of {receive}/{send} bytes, under 8192")
        self._hello = True
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        self._send_size = min(receive, BUFFER)
        self._max_response = max_message if max_message else 0
        if max_chunks:
            limit = max_chunks * (self._send_size - 200)
            self._max_response = min(self._max_response or limit, limit)
        w = Writer()
        for v in (0, min(send, BUFFER), self._send_size, MAX_MESSAGE, MAX_CHUNKS):
            w.uint32(v)
        body = w.getvalue()
        self._write(_HEADER.pack(b"ACK", b"F", 8 + len(body)) + body)

    def _open(self, chunk: bytes) -> None:
        if not self._hello:
            raise ChannelRefused(BAD_TCP_MESSAGE_TYPE_INVALID, "an OPN before the Hello")
        sec = self.security
        renew = sec is not None
        if sec is None:
            sec = self._security_for(chunk)
        channel_id, payload = sec.decode_open(chunk)
        if renew and channel_id != self.channel_id:
            raise ChannelRefused(BAD_SECURE_CHANNEL_ID_INVALID,
                                 f"an OPN for channel {channel_id}")
        seq, request_id = _SEQ.unpack_from(payload)
        self._check_seq(seq)
        r = Reader(payload, 8)
        tid = r.nodeid()
        if tid != NodeId(services.OPEN_REQUEST):
            raise ChannelRefused(BAD_TCP_MESSAGE_TYPE_INVALID,
                                 f"an OPN chunk holding a message of type {tid}")
        handle = bodies.read_request_header(r).handle
        req = bodies.read_open_secure_channel(r)
        request_type, mode, client_nonce = req.request_type, req.security_mode, req.client_nonce
        lifetime = min(max(req.requested_lifetime_ms, MIN_LIFETIME_MS), MAX_LIFETIME_MS)
        if request_type == 1 and not renew:
            raise ChannelRefused(BAD_SECURITY_CHECKS_FAILED, "a renewal of no channel")
        if not renew:
            self._check_mode(sec, mode)
            sec.mode = mode
            self.security = sec
        elif mode != sec.mode:
            raise ChannelRefused(BAD_SECURITY_MODE_REJECTED,
                                 "a renewal that changes the security mode")
        server_nonce = sec.nonce()
        token = self._next_token
        self._next_token += 1
        sec.derive(token, client_nonce, server_nonce)
        if renew:
            self._old_token = self._token_id
        self._token_id = token
        w = bodies.start_response(services.OPEN_RESPONSE, handle)
        bodies.write_open_secure_channel(w, channel_id=self.channel_id, token_id=token,
                                         created_at=ticks_now(), lifetime_ms=lifetime,
                                         server_nonce=server_nonce)
        self._write(sec.encode_open(self.channel_id,
                                    _SEQ.pack(self._next_seq(), request_id) + w.getvalue()))
        self._max_chunk_body = sec.max_payload(self._send_size) - 8
        if self._expiry is not None:
            self._expiry.cancel()
        # a token not renewed within a quarter more than its lifetime ends the channel
        self._expiry = self._loop.call_later(lifetime * 1.25 / 1000, self._expired)

    def _security_for(self, chunk: bytes) -> ChannelSecurity:
        """The channel's security, from the first OPN's header: its policy offered, our
        certificate its receiver, the sender's certificate trusted."""
        policy, sender, receiver = open_header(chunk)
        owner = self.owner
        if policy == POLICY_NONE:
            # always open: a client asks a server's endpoints over a channel without
            # security (Part 4 §5.4); sessions need the mode None offered (the owner)
            return ChannelSecurity(MODE_NONE, server=True)
        if policy != BASIC256SHA256 or not (owner.modes - {MODE_NONE}) \
                or owner.certificate is None:
            raise ChannelRefused(BAD_SECURITY_POLICY_REJECTED,
                                 f"security policy {policy!r} is not offered")
        if receiver != thumbprint(owner.certificate):
            raise ChannelRefused(BAD_SECURITY_CHECKS_FAILED,
                                 "the OPN is encrypted for another certificate than ours")
        if not sender:
            raise ChannelRefused(BAD_SECURITY_CHECKS_FAILED, "an OPN without a certificate")
        status = owner.trusts(sender)
        if status:
            # Part 6 §6.7.7: BadSecurityChecksFailed, and nothing of why for a peer not
            # yet authenticated; the owner logged the reason
            raise ChannelRefused(BAD_SECURITY_CHECKS_FAILED,
                                 "the client's certificate is not trusted")
        self.client_certificate = sender
        return ChannelSecurity(MODE_SIGN_AND_ENCRYPT, owner.certificate, owner.private_key,
                               sender, server=True)

    def _check_mode(self, sec: ChannelSecurity, mode: int) -> None:
        if (mode != MODE_NONE and mode not in self.owner.modes) or \
                (mode == MODE_NONE) != (sec.mode == MODE_NONE):
            raise ChannelRefused(BAD_SECURITY_MODE_REJECTED,
                                 f"security mode {mode} is not offered with "
                                 f"{sec.policy_uri}")
        if mode not in (MODE_NONE, MODE_SIGN, MODE_SIGN_AND_ENCRYPT):
            raise ChannelRefused(BAD_SECURITY_MODE_REJECTED, f"security mode {mode}")

    def _expired(self) -> None:
        self.close(BAD_SECURE_CHANNEL_ID_INVALID, "the channel's token expired")

    def _check_seq(self, seq: int) -> None:
        expected = self._recv_seq
        wrapped = seq < 1024 and expected is not None and expected > 4294966271 - 1024
        if expected is not None and seq != expected and not wrapped:
            raise ChannelRefused(BAD_SEQUENCE_NUMBER_INVALID,
                                 f"sequence number {seq} where {expected} was due")
        self._recv_seq = seq + 1

    def _message(self, chunk: bytes) -> None:
        sec = self.security
        if sec is None:
            raise ChannelRefused(BAD_SECURE_CHANNEL_ID_INVALID, "a MSG before the OPN")
        _k, final, channel_id, token, payload = sec.decode_message(chunk)
        if channel_id != self.channel_id:
            raise ChannelRefused(BAD_SECURE_CHANNEL_ID_INVALID,
                                 f"a MSG for channel {channel_id}")
        if self._old_token is not None and token == self._token_id:
            sec.forget(self._old_token)
            self._old_token = None
        seq, request_id = _SEQ.unpack_from(payload)
        self._check_seq(seq)
        body = payload[8:]
        if final == b"C":
            parts = self._partial.setdefault(request_id, [])
            parts.append(body)
            self._partial_size += len(body)
            if self._partial_size > MAX_MESSAGE or len(parts) > MAX_CHUNKS:
                raise ChannelRefused(BAD_REQUEST_TOO_LARGE, "a request over our limit")
            return
        done = self._partial.pop(request_id, None)
        if done:
            self._partial_size -= sum(len(p) for p in done)
        if final == b"A":
            return                                  # the client gave the request up
        if done:
            done.append(body)
            body = b"".join(done)
        self.requests += 1
        r = Reader(body)
        tid = r.nodeid()
        type_id = tid.identifier if tid.namespace == 0 and isinstance(tid.identifier,
                                                                      int) else -1
        self.owner.request(self, request_id, type_id, r)


def _too_large(message: bytes) -> bytes:
    """A ServiceFault with BadResponseTooLarge in place of a response over the client's
    limit, keeping its request handle."""
    r = Reader(message)
    r.nodeid()
    r.datetime()
    return bodies.service_fault(r.uint32(), BAD_RESPONSE_TOO_LARGE)
