"""A faster ``Properties.unpack`` for the PUBLISH packets the host receives.

paho-mqtt decodes each MQTT 5 property by scanning its whole name table twice (with a
string replace per name) and checking every character of every string in Python; with
the five or six user properties of a binary CloudEvent that was the largest cost of
receiving an answer. This decoder handles the properties a PUBLISH carries, with the
same checks (lengths within the property block, UTF-8, no U+0000, U+FEFF or
surrogates, no repeated single-valued property) and the same attributes as paho; a
packet with anything else, or anything it would refuse, goes to paho's own code, so
errors stay paho's. Properties objects share paho's (never changed) lookup tables
instead of building them anew. ``install()`` is called when the MQTT link is imported.
"""

from __future__ import annotations

import re
from typing import Any

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

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
    self.clear()
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


def install() -> None:
    Properties.unpack = fast_unpack  # type: ignore[method-assign]
    Properties.__init__ = fast_init  # type: ignore[method-assign]
