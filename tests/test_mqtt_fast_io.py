"""The MQTT link's faster socket path (sfc_host.paho_fast, MqttLink): packets joined
into one send and split again on partial writes, reads buffered without ever keeping
bytes the socket will not announce again, PUBACKs of our own publishes (refusals
included), and a topic paho would refuse turned away before it reaches the writer."""

from __future__ import annotations

import asyncio
from typing import Any

import aiomqtt
import paho.mqtt.client as mc
from paho.mqtt.enums import CallbackAPIVersion

from sfc_host import paho_fast
from sfc_host.config import HostConfig
from sfc_host.metrics import Metrics
from sfc_host.mqtt import MqttLink

paho_fast.install()


class FakeSocket:
    """Takes at most ``room`` bytes per send; recv hands out the chunks given."""

    def __init__(self, room: int = 1 << 20, chunks: list[bytes] | None = None) -> None:
        self.room = room
        self.sent: list[bytes] = []
        self.chunks = list(chunks or [])
        self.recvs = 0

    def send(self, buf: Any) -> int:
        if not self.room:
            raise BlockingIOError
        data = bytes(buf)[:self.room]
        self.sent.append(data)
        return len(data)

    def recv(self, n: int) -> bytes:
        self.recvs += 1
        if not self.chunks:
            raise BlockingIOError
        c = self.chunks.pop(0)
        if len(c) > n:
            self.chunks.insert(0, c[n:])
        return c[:n]

    def fileno(self) -> int:
        return -1

    def close(self) -> None:
        pass


def client(sock: FakeSocket) -> mc.Client:
    c = mc.Client(CallbackAPIVersion.VERSION2, protocol=mc.MQTTv5)
    c._sock = sock  # type: ignore[assignment]
    c.on_socket_register_write = lambda *a: None   # written when the test says
    c.on_socket_unregister_write = lambda *a: None
    return c


def publish_packet(topic: str, payload: bytes, mid: int = 0) -> bytes:
    t = topic.encode()
    body = len(t).to_bytes(2, "big") + t + (mid.to_bytes(2, "big") if mid else b"") \
        + b"\x00" + payload
    return bytes([0x32 if mid else 0x30]) + paho_fast.varint(len(body)) + body


def test_queued_packets_go_out_in_one_send_with_partial_writes_resumed() -> None:
    sock = FakeSocket()
    c = client(sock)
    for mid in (1, 2, 3):
        assert paho_fast.queue_publish(c, mid, b"a/b", b"x" * 100, False, None) == 0
    done: list[int] = []
    c.on_publish = lambda cl, u, mid, *rest: done.append(mid)
    info = c.publish("a/q0", b"zero", qos=0)
    expected = b"".join(p["packet"] for p in c._out_packet)
    c.loop_write()
    assert len(sock.sent) == 1 and sock.sent[0] == expected
    assert done == [info.mid] and info.is_published()

    sock = FakeSocket(room=150)          # the socket takes part of the packets
    c = client(sock)
    for mid in (1, 2, 3):
        paho_fast.queue_publish(c, mid, b"a/b", bytes([mid]) * 100, True, None)
    expected = b"".join(p["packet"] for p in c._out_packet)
    sock.room = 150
    c.loop_write()                       # 150 bytes per send, until everything is out
    assert b"".join(sock.sent) == expected and not c._out_packet
    sock2 = FakeSocket(room=0)
    c2 = client(sock2)
    paho_fast.queue_publish(c2, 9, b"a/b", b"y", False, None)
    c2.loop_write()                      # no room at all: stays queued
    assert len(c2._out_packet) == 1 and c2._out_packet[0]["pos"] == 0


def test_reads_take_every_buffered_packet_and_never_bytes_of_another_socket() -> None:
    packets = [publish_packet(f"t/{i}", bytes([i]) * 20) for i in range(5)]
    data = b"".join(packets)
    # one read brings three and a half packets; the rest comes in the next
    cut = len(b"".join(packets[:3])) + 5
    sock = FakeSocket(chunks=[data[:cut], data[cut:]])
    c = client(sock)
    got: list[str] = []
    c.on_message = lambda cl, u, m: got.append(m.topic)
    c.loop_read()
    assert got == [f"t/{i}" for i in range(5)]
    assert sock.recvs <= 4               # not one recv per byte of a header
    for cut in range(1, len(data)):      # a read may end anywhere, header included
        c = client(FakeSocket(chunks=[data[:cut], data[cut:]]))
        got.clear()
        c.on_message = lambda cl, u, m: got.append(m.topic)
        for _ in range(3):   # as paho's: a call may stop at a read's end (the socket
            c.loop_read()    # is still readable then and the loop calls again)
        assert got == [f"t/{i}" for i in range(5)], cut
    # bytes left from an earlier socket are dropped, not parsed on the new one
    sock = FakeSocket(chunks=[packets[0]])
    c._sfc_rb = [object(), b"\x30\x05junk!", 0]   # type: ignore[attr-defined]
    c._sock = sock  # type: ignore[assignment]
    got.clear()
    c.loop_read()
    assert got == ["t/0"]


def test_pubacks_of_our_publishes_reach_the_hook_with_their_reason_code() -> None:
    puback = b"\x40\x02\x00\x07" + b"\x40\x03\x00\x08\x87" + b"\x40\x04\x00\x09\x00\x00"
    sock = FakeSocket(chunks=[puback])
    c = client(sock)
    seen: list[tuple[int, int]] = []
    c._sfc_puback = lambda mid, code: seen.append((mid, code)) or True  # type: ignore[attr-defined]
    c.loop_read()
    assert seen == [(7, 0), (8, 0x87), (9, 0)]


def test_a_topic_paho_refuses_is_turned_away_and_the_link_keeps_sending(
        mqtt_url: str) -> None:
    async def main() -> None:
        cfg = HostConfig(redis_url="redis://127.0.0.1:1", mqtt_url=mqtt_url,
                         consumer="fastio")
        metrics = Metrics()
        got: list[bytes] = []
        async with aiomqtt.Client("127.0.0.1", int(mqtt_url.rsplit(":", 1)[1]),
                                  protocol=aiomqtt.ProtocolVersion.V5) as sub:
            await sub.subscribe("fastio/#", qos=1)
            async with MqttLink(cfg, metrics) as link:
                await link.wait_connected()
                assert not link.publish_nowait("fastio/#", b"bad")
                assert not link.publish_nowait("", b"bad")
                acks = []
                for i in range(300):            # more than IN_FLIGHT at once
                    f = asyncio.get_running_loop().create_future()
                    assert link.publish_nowait(f"fastio/{i % 3}", str(i).encode(), acked=f)
                    acks.append(f)
                await asyncio.wait_for(asyncio.gather(*acks), 10)

                async def read() -> None:
                    async for m in sub.messages:
                        got.append(m.payload)  # type: ignore[arg-type]
                        if len(got) == 300:
                            return
                await asyncio.wait_for(read(), 10)
        assert got == [str(i).encode() for i in range(300)]
        assert metrics["mqtt_bad_topic"] == 2 and metrics["mqtt_sent"] == 300
    asyncio.run(main())
