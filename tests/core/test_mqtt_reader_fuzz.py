"""A million broken streams per reader setup through ``sfc_fast.wire.mqtt5.Reader``: valid
packets a broker sends, mutated (a byte flipped or set, the stream cut short, two
streams spliced, bytes put in or taken out) or replaced by random bytes, each fed in
up to three pieces cut at random points. ``feed`` must raise nothing but
``MalformedPacket``, every item must have one of the documented shapes, and the reader
must hold no more than the packet still in progress can need.

Seeded (``random.Random``), so a failure comes back with the same input. The count is
``MQTT_FUZZ_INPUTS`` (default 1,000,000 per setup); the four setups take about 20 s of
one core together, about 5 us per input.
"""

from __future__ import annotations

import os
import random
from typing import Any

import pytest

from sfc_fast.wire import mqtt5
from sfc_fast.wire.mqtt5 import MalformedPacket, Message, Properties, Reader

INPUTS = int(os.environ.get("MQTT_FUZZ_INPUTS", "1000000"))
DEFAULT_MAX = mqtt5.MAX_REMAINING + 5
SETUPS = [(True, 300), (True, DEFAULT_MAX), (False, 300), (False, DEFAULT_MAX)]
STREAMS = 2048                 # base streams per setup, each one to four packets

# QoS 1, 400 bytes long (over a max_packet of 300), with a topic length of 65,535: its
# topic cannot fit in it
TOPIC_PAST_ITS_PACKET = b"\x32\x90\x03\xff\xff" + b"x" * 398


def frame(first: int, body: bytes) -> bytes:
    n, length = len(body), bytearray()
    while True:
        length.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes([first]) + bytes(length) + body


def publish(topic: str, payload: bytes, qos: int, mid: int, props: Properties | None,
            v5: bool) -> bytes:
    out = bytearray()
    mqtt5.publish_into(out, topic, payload, qos, False, mid, props, v5)
    return bytes(out)


def seeds(v5: bool) -> list[bytes]:
    """Packets a broker sends, the shapes the mutations start from: valid but for
    TOPIC_PAST_ITS_PACKET and the last two of MQTT 5."""
    props = Properties(ContentType="application/json", ResponseTopic="r/1",
                       CorrelationData=b"\x00\xff", MessageExpiryInterval=60,
                       PayloadFormatIndicator=1, UserProperty=[("id", "1"), ("ü", "ß")])
    out = [
        publish("a/b", b"x" * 10, 1, 7, props, v5),
        publish("t", b"", 0, 0, None, v5),
        publish("equipment/line1/commands", bytes(range(100)), 2, 0x1234,
                Properties(UserProperty=[("specversion", "1.0")]), v5),
        publish("big/one", b"z" * 400, 1, 9, props, v5),         # over a max_packet of 300
        publish("ü/" + "l" * 150, b"{}", 2, 0xFFFF, Properties(ContentType="text/plain"), v5),
        publish("r", b"retained", 1, 1, None, v5)[:1].replace(b"\x32", b"\x33")
        + publish("r", b"retained", 1, 1, None, v5)[1:],               # retained
        b"\x40\x02\x00\x07", b"\x50\x02\x01\x00", b"\x62\x02\x00\x07", b"\x70\x02\xff\xff",
        b"\x90\x04\x00\x01\x00\x01" if v5 else b"\x90\x03\x00\x01\x01",
        b"\xb0\x03\x00\x02\x00" if v5 else b"\xb0\x02\x00\x02",
        b"\xd0\x00",
        TOPIC_PAST_ITS_PACKET,
    ]
    if not v5:
        return [*out, b"\x20\x02\x01\x00"]
    sid = b"\x0b\x05" + b"\x0b\x80\x01"                        # subscription ids 5, 128
    return [
        *out,
        frame(0x32, b"\x00\x03s/1\x00\x05" + bytes([len(sid)]) + sid + b"data"),
        frame(0x20, b"\x00\x00\x14\x21\x00\x14\x27\x00\x10\x00\x00\x1f\x00\x02hi"
                    b"\x26\x00\x01k\x00\x01v"),
        b"\x40\x03\x00\x08\x87",
        frame(0x50, b"\x00\x09\x10\x05\x1f\x00\x02ok"),
        frame(0x90, b"\x00\x03\x07\x26\x00\x01a\x00\x01b\x00\x01\x80"),
        frame(0xE0, b"\x8b\x08\x1f\x00\x05going"),
        frame(0x40, b"\x00\x0a\x00\x02\x01\x00"),                 # a property PUBACK may not carry
        frame(0x30, b"\x00\x01q\x03\x23\x00\x01"),                # a topic alias
    ]


ACKS = (mqtt5.PUBACK, mqtt5.PUBREC, mqtt5.PUBREL, mqtt5.PUBCOMP)
ACKED = (*ACKS, mqtt5.SUBACK, mqtt5.UNSUBACK)
DROP_REASONS = ("bad_topic", "bad_properties", "protocol_error")
MALFORMED_REASONS = (mqtt5.MALFORMED, mqtt5.PROTOCOL_ERROR, mqtt5.PACKET_TOO_LARGE)


def check_items(items: list[Any], v5: bool, max_packet: int, seen: dict[int, int]) -> None:
    """Every item one of the shapes ``Reader`` documents; counted by kind in ``seen``."""
    for k, item in enumerate(items):
        if type(item) is Message:
            seen[mqtt5.PUBLISH] += 1
            assert type(item.topic) is str and type(item.payload) is bytes
            assert item.topic and "+" not in item.topic and "#" not in item.topic
            assert (0 < item.mid < 0x10000) if item.qos else item.mid == 0, item
            assert item.qos in (0, 1, 2)
            assert item.properties is None or (v5 and type(item.properties) is Properties)
            continue
        assert type(item) is tuple, item
        kind = item[0]
        seen[kind] += 1
        if kind in ACKS:
            _, mid, reason = item
            assert 0 <= mid < 0x10000 and 0 <= reason < 0x100
        elif kind == mqtt5.DROPPED:
            _, topic, qos, mid, reason, why = item
            assert type(topic) is str and reason in DROP_REASONS and why and type(why) is str
            assert (0 < mid < 0x10000 and qos in (1, 2)) if mid else qos == 0, item
        elif kind == mqtt5.IGNORED:
            _, ptype, why = item
            assert v5 and ptype in ACKED and why and type(why) is str
            assert items[k + 1][0] == ptype, "its packet's own item comes next"
        elif kind == mqtt5.SUBACK or kind == mqtt5.UNSUBACK:
            _, mid, codes = item
            assert 0 <= mid < 0x10000 and type(codes) is list
            assert all(0 <= c < 0x100 for c in codes) and (codes or kind == mqtt5.UNSUBACK)
        elif kind == mqtt5.OVERSIZED:
            _, topic, qos, mid, size = item
            assert topic and "+" not in topic and "#" not in topic and size > max_packet
            assert (0 < mid < 0x10000) if qos in (1, 2) else (qos == 0 and mid == 0), item
        elif kind == mqtt5.CONNACK:
            _, present, reason, props = item
            assert type(present) is bool and 0 <= reason < 0x100 and type(props) is dict
        elif kind == mqtt5.DISCONNECT:
            _, reason, props = item
            assert v5 and 0 <= reason < 0x100 and type(props) is dict
        else:
            assert item == (mqtt5.PINGRESP,), item


def held_too_much(data: bytes, fed: int, held: int, max_packet: int) -> bool:
    """Whether ``held`` bytes (the end of ``data[:fed]``, where a packet starts) are more
    than that packet can need: a length still arriving has at most four bytes, a packet
    fewer than its size, and a PUBLISH over ``max_packet`` only its topic and id."""
    head = data[fed - held:fed]
    remaining = shift = 0
    i = 1
    while True:
        if i == held:
            return held > 4
        byte = head[i]
        remaining |= (byte & 0x7F) << shift
        shift += 7
        i += 1
        if not byte & 0x80:
            break
    total = i + remaining
    if held >= total:
        return True
    if total <= max_packet:
        return False
    if head[0] >> 4 != mqtt5.PUBLISH:
        return True                        # refused as soon as its length was known
    if held < i + 2:
        return False
    need = i + 2 + (head[i] << 8 | head[i + 1]) + (2 if (head[0] >> 1) & 3 in (1, 2) else 0)
    return held >= need or need > total   # to pass over once its topic and id are here


def streams(rng: random.Random, v5: bool) -> list[bytes]:
    base = seeds(v5)
    return [b"".join(rng.choice(base) for _ in range(rng.randint(1, 4)))
            for _ in range(STREAMS)]


def mutate(r: int, data: bytes, pool: list[bytes], garbage: bytes) -> bytes:
    """``data`` changed as the bits of ``r`` say."""
    n = len(data)
    op = r & 15
    r >>= 4
    pos = (r & 0xFFFF) % (n + 1)
    r >>= 16
    if op < 5 and pos < n:                  # a byte flipped
        return data[:pos] + bytes((data[pos] ^ (r & 0xFF or 1),)) + data[pos + 1:]
    if op < 7:                              # cut short
        return data[:pos]
    if op < 9:                              # spliced with another stream
        other = pool[r & (STREAMS - 1)]
        return data[:pos] + other[(r >> 11) % len(other):]
    if op == 9:                             # a byte set to an edge value
        return data[:pos] + (b"\x00", b"\xff", b"\x7f", b"\x80")[r & 3] + data[pos + 1:]
    if op == 10:                            # bytes taken out
        return data[:pos] + data[pos + 1 + (r & 7):]
    if op == 11:                            # random bytes
        start = (r >> 8) % (len(garbage) - 256)
        return garbage[start:start + (r & 0xFF)]
    if op < 14 and pos < n:                 # two bytes flipped
        data = data[:pos] + bytes((data[pos] ^ (r & 0xFF or 1),)) + data[pos + 1:]
        pos = (r >> 8 & 0xFFFF) % n
        return data[:pos] + bytes((data[pos] ^ (r >> 24 & 0xFF or 1),)) + data[pos + 1:]
    return data                             # as it was


@pytest.mark.parametrize(("v5", "max_packet"), SETUPS, ids=[
    f"MQTT {5 if v5 else 3}, max_packet {'default' if m == DEFAULT_MAX else m}"
    for v5, m in SETUPS])
def test_the_reader_takes_a_million_broken_streams(v5: bool, max_packet: int) -> None:
    # the crafted packet first: its topic runs past its end, so it is passed over
    reader = Reader(v5, max_packet)
    got = reader.feed(TOPIC_PAST_ITS_PACKET + seeds(v5)[0] + b"\xd0\x00")
    assert got[0][:5] == (mqtt5.DROPPED, "", 0, 0, "protocol_error")
    assert type(got[1]) is Message and got[2:] == [(mqtt5.PINGRESP,)]
    assert reader.buffered == 0

    rng = random.Random(f"mqtt reader {v5} {max_packet}")
    pool = streams(rng, v5)
    garbage = rng.randbytes(1 << 16)
    bits = rng.getrandbits
    seen = dict.fromkeys(range(19), 0)
    raised = 0
    for _ in range(INPUTS):
        r = bits(64)
        data = mutate(r >> 11, pool[r & (STREAMS - 1)], pool, garbage)
        n = len(data)
        r = bits(34)                        # fed whole, or cut at one or two points
        a = (r & 0xFFFF) % (n + 1)
        b = (r >> 16 & 0xFFFF) % (n + 1)
        ends = (n,) if r >> 32 == 0 else (a, n) if r >> 32 == 1 else (min(a, b), max(a, b), n)
        reader = Reader(v5, max_packet)
        lo = 0
        try:
            for hi in ends:
                items = reader.feed(data[lo:hi])
                if items:
                    check_items(items, v5, max_packet, seen)
                held = reader.buffered
                assert not held or not held_too_much(data, hi, held, max_packet), (
                    data, ends, held)
                lo = hi
        except MalformedPacket as e:
            assert e.reason in MALFORMED_REASONS, (data, e)
            raised += 1
    # every way out was taken
    assert raised and seen[mqtt5.PUBLISH] and seen[mqtt5.DROPPED]
    assert seen[mqtt5.IGNORED] if v5 else not seen[mqtt5.IGNORED]
    assert seen[mqtt5.OVERSIZED] if max_packet == 300 else not seen[mqtt5.OVERSIZED]
