"""Faster paths through paho-mqtt for the host's MQTT link, same behaviour.

``Properties.unpack`` for the PUBLISH packets the host receives: paho decodes each
MQTT 5 property by scanning its whole name table twice (with a string replace per
name) and checking every character of every string in Python; with the five or six
user properties of a binary CloudEvent that was the largest cost of receiving an
answer. This decoder handles the properties a PUBLISH carries, with the same checks
(lengths within the property block, UTF-8, no U+0000, U+FEFF or surrogates, no
repeated single-valued property) and the same attributes as paho; a packet with
anything else, or anything it would refuse, goes to paho's own code, so errors stay
paho's. Properties objects share paho's (never changed) lookup tables instead of
building them anew.

The client's socket path, with less per-packet work: what is queued goes out in one
``send`` (paho sends each packet on its own); reads take up to 64 KiB at a time and
whole packets are cut from them (paho reads a packet's first bytes one ``recv`` each);
a PUBACK without properties is handled without reason code objects; an
acknowledgement that leaves nothing queued skips paho's scan of every message in
flight; debug log lines nobody listens to are not made. ``queue_publish`` sends a QoS 1
message without paho's per-message objects. ``install()`` is called when the MQTT link
is imported.
"""

from __future__ import annotations

import re
from typing import Any

import paho.mqtt.client as mc
from paho.mqtt.client import Client, MQTTErrorCode
from paho.mqtt.exception import MalformedPacket
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from sfc_host.cloudevents import varint

_original_unpack = Properties.unpack
_original_init = Properties.__init__
_blank: dict[int, dict[str, Any]] = {}
_BAD_CHARS = re.compile("[\x00\ufeff]")
_STRINGS = {0x03: "ContentType", 0x08: "ResponseTopic"}


class _Fallback(Exception):
    pass


def _varint(buf: Any, i: int) -> tuple[int, int]:
    value = shift = 0
    for k in range(4):
        if i + k >= len(buf):
            raise _Fallback
        b = buf[i + k]
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i + k + 1
        shift += 7
    raise _Fallback


def _utf(buf: Any, i: int, end: int) -> tuple[str, int]:
    if i + 2 > end:
        raise _Fallback
    n = (buf[i] << 8) | buf[i + 1]
    j = i + 2 + n
    if j > end:
        raise _Fallback
    try:
        s = bytes(buf[i + 2:j]).decode("utf-8")   # refuses encoded surrogates
    except UnicodeDecodeError:
        raise _Fallback from None
    if _BAD_CHARS.search(s):
        raise _Fallback
    return s, j


def fast_unpack(self: Properties, buffer: Any) -> tuple[Properties, int]:
    if self.packetType != PacketTypes.PUBLISH:
        return _original_unpack(self, buffer)
    try:
        propslen, start = _varint(buffer, 0)
        end = start + propslen
        if end > len(buffer):
            raise _Fallback
        found: dict[str, Any] = {}
        users: list[tuple[str, str]] = []
        i = start
        while i < end:
            ident, i = _varint(buffer, i)
            if ident == 0x26:
                k, i = _utf(buffer, i, end)
                v, i = _utf(buffer, i, end)
                users.append((k, v))
                continue
            name = _STRINGS.get(ident)
            if name is not None:
                value, i = _utf(buffer, i, end)
            elif ident == 0x09:
                if i + 2 > end:
                    raise _Fallback
                n = (buffer[i] << 8) | buffer[i + 1]
                if i + 2 + n > end:
                    raise _Fallback
                name, value, i = "CorrelationData", bytes(buffer[i + 2:i + 2 + n]), i + 2 + n
            elif ident == 0x02:
                if i + 4 > end:
                    raise _Fallback
                name, value = "MessageExpiryInterval", int.from_bytes(buffer[i:i + 4], "big")
                i += 4
            elif ident == 0x01:
                if i + 1 > end or buffer[i] > 1:
                    raise _Fallback
                name, value, i = "PayloadFormatIndicator", buffer[i], i + 1
            else:
                raise _Fallback   # topic alias, subscription identifiers, …: paho's path
            if name in found:
                raise _Fallback   # repeated: paho raises its own error
            found[name] = value
        if i != end:
            raise _Fallback
    except _Fallback:
        return _original_unpack(self, buffer)
    if len(self.__dict__) != _fresh_size:
        self.clear()    # reused: a fresh one (paho's decoder) has no values to clear
    for name, value in found.items():
        object.__setattr__(self, name, value)
    if users:
        object.__setattr__(self, "UserProperty", users)
    return self, end


def fast_init(self: Properties, packetType: int) -> None:
    """paho rebuilds its name and type tables for every Properties object (one per
    PUBACK received); they are never changed after, so instances share one copy."""
    d = _blank.get(packetType)
    if d is None:
        _original_init(self, packetType)
        _blank[packetType] = dict(self.__dict__)
        return
    self.__dict__.update(d)


_fresh_size = len(vars(Properties(PacketTypes.PUBLISH)))

# ---- the client's socket path

_original_packet_write = Client._packet_write
_original_packet_read = Client._packet_read
_original_sock_recv = Client._sock_recv
_original_handle_pubackcomp = Client._handle_pubackcomp
_original_update_inflight = Client._update_inflight
_original_easy_log = Client._easy_log
_SUCCESS = MQTTErrorCode.MQTT_ERR_SUCCESS
_AGAIN = MQTTErrorCode.MQTT_ERR_AGAIN
_CONN_LOST = MQTTErrorCode.MQTT_ERR_CONN_LOST
_PUBLISH = int(mc.PUBLISH)
_DISCONNECT = int(mc.DISCONNECT)
WRITE_MAX_BYTES = 1 << 16    # one send takes at most about this much
WRITE_MAX_PACKETS = 512
READ_BYTES = 1 << 16


def fast_packet_write(self: Client) -> MQTTErrorCode:
    """paho's ``_packet_write`` with the queued packets joined into one ``send``: the
    same bookkeeping per packet (partial writes, QoS 0 publish callbacks), one system
    call instead of one per packet. A DISCONNECT goes through paho's own code."""
    out = self._out_packet
    while out:
        if out[0]["command"] & 0xF0 == _DISCONNECT:
            return _original_packet_write(self)
        batch = []
        size = 0
        # by index, not an iterator: another thread may append while we look
        for k in range(min(len(out), WRITE_MAX_PACKETS)):
            p = out[k]
            if p["command"] & 0xF0 == _DISCONNECT:
                break
            batch.append(p)
            size += p["to_process"]
            if size >= WRITE_MAX_BYTES:
                break
        chunks = [p["packet"] if not p["pos"] else memoryview(p["packet"])[p["pos"]:]
                  for p in batch]
        try:
            n = self._sock_send(chunks[0] if len(chunks) == 1 else b"".join(chunks))
        except (AttributeError, ValueError):
            return _SUCCESS
        except BlockingIOError:
            return _AGAIN
        except OSError as err:
            self._easy_log(mc.MQTT_LOG_ERR, "failed to receive on socket: %s", err)
            return _CONN_LOST
        if n <= 0:
            break
        for p in batch:
            k = min(n, p["to_process"])
            p["to_process"] -= k
            p["pos"] += k
            n -= k
            if p["to_process"]:
                break            # the rest next time (paho's next send says when)
            out.popleft()        # p was the head
            if p["command"] & 0xF0 == _PUBLISH and p["qos"] == 0:
                _qos0_published(self, p)
    with self._msgtime_mutex:
        self._last_msg_out = mc.time_func()
    return _SUCCESS


def _qos0_published(self: Client, packet: Any) -> None:
    """What paho does once a QoS 0 PUBLISH is written: on_publish, then the info."""
    with self._callback_mutex:
        on_publish = self.on_publish
    if on_publish:
        with self._in_callback_mutex:
            try:
                if self._callback_api_version == mc.CallbackAPIVersion.VERSION1:
                    on_publish(self, self._userdata, packet["mid"])  # type: ignore[call-arg]
                else:
                    on_publish(self, self._userdata, packet["mid"],
                               ReasonCode(PacketTypes.PUBACK), Properties(PacketTypes.PUBACK))
            except Exception as err:
                self._easy_log(mc.MQTT_LOG_ERR, "Caught exception in on_publish: %s", err)
                if not self.suppress_exceptions:
                    raise
    packet["info"]._set_as_published()


def fast_sock_recv(self: Client, bufsize: int) -> bytes:
    """paho asks for one byte, then one more, then the rest of a packet: serve those
    from one large ``recv`` of the same socket."""
    rb = self.__dict__.get("_sfc_rb")
    if rb is not None:
        if rb[0] is self._sock:
            data, pos = rb[1], rb[2]
            end = pos + bufsize
            if end >= len(data):
                self._sfc_rb = None
            else:
                rb[2] = end
            return data[pos:end]
        self._sfc_rb = None   # bytes of an earlier connection: never parsed
    data = _original_sock_recv(self, max(bufsize, READ_BYTES))
    if len(data) > bufsize:
        self._sfc_rb = [self._sock, data, bufsize]
        return data[:bufsize]
    return data


def fast_packet_read(self: Client) -> MQTTErrorCode:
    """A whole packet cut straight from the read buffer (one large ``recv`` when it is
    empty) and handed to paho's handler; a packet not yet all here, or a header paho
    would refuse, goes through paho's own reader, which continues from the buffer."""
    if self._in_packet["command"]:
        return _original_packet_read(self)      # paho's reader has begun a packet
    rb = self.__dict__.get("_sfc_rb")
    if rb is None or rb[0] is not self._sock:
        try:
            data = _original_sock_recv(self, READ_BYTES)
        except BlockingIOError:
            return _AGAIN
        except TimeoutError as err:
            self._easy_log(mc.MQTT_LOG_ERR, "timeout on socket: %s", err)
            return _CONN_LOST
        except OSError as err:
            self._easy_log(mc.MQTT_LOG_ERR, "failed to receive on socket: %s", err)
            return _CONN_LOST
        if not data:
            return _CONN_LOST
        rb = self._sfc_rb = [self._sock, data, 0]
    data, pos = rb[1], rb[2]
    n = len(data)
    i = pos + 1
    length = shift = 0
    while True:
        if i >= n or i - pos > 4:
            return _original_packet_read(self)   # header incomplete, or too long
        b = data[i]
        i += 1
        length |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            break
    end = i + length
    if end > n:
        return _original_packet_read(self)       # the rest is still on its way
    if end == n:
        self._sfc_rb = None
    else:
        rb[2] = end
    self._in_packet = {"command": data[pos], "have_remaining": 1,
                       "remaining_count": list(data[pos + 1:i]), "remaining_mult": 1 << shift,
                       "remaining_length": length, "packet": data[i:end], "to_process": 0,
                       "pos": 0}
    with self._msgtime_mutex:
        self._last_bytes_received = mc.time_func()
    try:
        rc = self._packet_handle()
    except MalformedPacket as exc:
        self._easy_log(mc.MQTT_LOG_DEBUG, "Received malformed packet: %s", exc)
        rc = MQTTErrorCode.MQTT_ERR_PROTOCOL
    self._in_packet = {"command": 0, "have_remaining": 0, "remaining_count": [],
                       "remaining_mult": 1, "remaining_length": 0, "packet": bytearray(b""),
                       "to_process": 0, "pos": 0}
    return rc


def _buffered(self: Client) -> bool:
    rb = self.__dict__.get("_sfc_rb")
    return rb is not None and rb[0] is self._sock


def fast_loop_read(self: Client, max_packets: int = 1) -> MQTTErrorCode:
    """paho's ``loop_read``, except that it never returns with bytes read from the
    socket and not yet handled: the socket would not wake the loop for them."""
    if self._sock is None:
        return MQTTErrorCode.MQTT_ERR_NO_CONN
    n = max(len(self._out_messages) + len(self._in_messages), 1)
    while True:
        if self._sock is None:
            return MQTTErrorCode.MQTT_ERR_NO_CONN
        rc = self._packet_read()
        if rc > 0:
            return self._loop_rc_handle(rc)
        n -= 1
        if (rc == _AGAIN or n <= 0) and not _buffered(self):
            return _SUCCESS


_PUBACK_CODES: dict[int, ReasonCode] = {}


def queue_publish(client: Client, mid: int, topic: bytes, payload: bytes, retain: bool,
                  properties: Properties | None) -> MQTTErrorCode:
    """Queue a QoS 1 PUBLISH on paho's connection without paho's bookkeeping (an
    MQTTMessage, its info with a lock and a condition, the in-flight scan): the caller
    keeps the message until its PUBACK reaches ``client._sfc_puback(mid, code)``, and
    sends it again on the next connection if it never does. The topic is checked by
    the caller (no wildcards, at most 65,535 bytes)."""
    if client._sock is None:
        return MQTTErrorCode.MQTT_ERR_NO_CONN
    props = b""
    if client._protocol == mc.MQTTv5:
        props = b"\x00" if properties is None else properties.pack()
    head = len(topic).to_bytes(2, "big") + topic + mid.to_bytes(2, "big") + props
    size = len(head) + len(payload)
    packet = b"".join((b"\x33" if retain else b"\x32", varint(size), head, payload))
    return client._packet_queue(_PUBLISH, packet, mid, 1, None)


def fast_handle_pubackcomp(self: Client, cmd: str) -> MQTTErrorCode:
    """A PUBACK without properties (what brokers send) without paho's two ReasonCode
    and Properties objects per packet; the callback still gets a ReasonCode (shared,
    one per code) and a fresh Properties. A PUBACK of a ``queue_publish`` message goes
    to ``_sfc_puback``. Anything else is paho's."""
    packet = self._in_packet["packet"]
    n = len(packet)
    hook = self.__dict__.get("_sfc_puback")
    # the reason code decides; properties (a reason string) are not needed
    if (hook is not None and cmd == "PUBACK" and n >= 2
            and (n == 2 or self._protocol == mc.MQTTv5)
            and hook((packet[0] << 8) | packet[1], packet[2] if n > 2 else 0)):
        return _SUCCESS
    if cmd != "PUBACK" or n not in (2, 3) or (n == 3 and self._protocol != mc.MQTTv5):
        return _original_handle_pubackcomp(self, cmd)
    code = packet[2] if n == 3 else 0
    reason = _PUBACK_CODES.get(code)
    if reason is None:
        try:
            reason = ReasonCode(PacketTypes.PUBACK, identifier=code)
        except Exception:
            return _original_handle_pubackcomp(self, cmd)   # paho's error
        _PUBACK_CODES[code] = reason
    mid = (packet[0] << 8) | packet[1]
    self._easy_log(mc.MQTT_LOG_DEBUG, "Received %s (Mid: %d)", cmd, mid)
    with self._out_message_mutex:
        if mid in self._out_messages:
            return self._do_on_publish(mid, reason, Properties(PacketTypes.PUBACK))
    return _SUCCESS


def fast_update_inflight(self: Client) -> MQTTErrorCode:
    """paho scans every message in flight after each acknowledgement for one queued
    behind the in-flight limit; when every message it holds is counted in flight,
    none is queued."""
    if self._inflight_messages >= len(self._out_messages):
        return _SUCCESS
    return _original_update_inflight(self)


def fast_easy_log(self: Client, level: Any, fmt: str, *args: Any) -> None:
    if self._on_log is None:
        logger = self._logger
        if logger is None or not logger.isEnabledFor(mc.LOGGING_LEVEL[level]):
            return
    _original_easy_log(self, level, fmt, *args)


def install() -> None:
    Properties.unpack = fast_unpack  # type: ignore[method-assign]
    Properties.__init__ = fast_init  # type: ignore[method-assign]
    Client._packet_write = fast_packet_write  # type: ignore[method-assign]
    Client._sock_recv = fast_sock_recv  # type: ignore[method-assign]
    Client._packet_read = fast_packet_read  # type: ignore[method-assign]
    Client.loop_read = fast_loop_read  # type: ignore[method-assign]
    Client._handle_pubackcomp = fast_handle_pubackcomp  # type: ignore[method-assign]
    Client._update_inflight = fast_update_inflight  # type: ignore[method-assign]
    Client._easy_log = fast_easy_log  # type: ignore[method-assign]
