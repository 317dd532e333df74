"""One end of the broker's limit measurement for benchmarks/report.py: a QoS 1 publisher
or subscriber over a plain socket (MQTT 5), no host in between.

    python benchmarks/mqtt_limit_proc.py sub HOST PORT N     # prints "ready", then JSON
    python benchmarks/mqtt_limit_proc.py pub HOST PORT N     # prints JSON when acked

The subscriber acks every PUBLISH and prints ``{"n", "seconds"}`` from its first to its
N-th message. The publisher keeps ``WINDOW`` messages unacked at once. Packets are built
once and only their packet id changes, so the clients spend little CPU per message and
the figure is the broker's (on a shared 2-core machine, with these two processes).
The message has the shape of a host command: a topic, a response topic, a content type,
five CloudEvent user properties and a 200-byte JSON payload.
"""

from __future__ import annotations

import json
import socket
import struct
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from mqtt_station_proc import (
    COMMAND_PAYLOAD,
    Station,
    command_properties,
    packet,
    string,
    varint,
)

TOPIC = "limit/cell/commands"   # not under equipment/: the station would answer it
WINDOW = 1000
class Client:
    def __init__(self, host: str, port: int) -> None:
        self.sock = socket.create_connection((host, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def connect(self, subscribe: bool) -> None:
        cid = f"limit-{uuid.uuid4().hex[:8]}"
        body = string("MQTT") + bytes([5, 0x02]) + struct.pack(">H", 0) + varint(0) + \
            string(cid)
        self.sock.sendall(packet(0x10, body))
        want = {2}
        if subscribe:
            sub = struct.pack(">H", 1) + varint(0) + string(TOPIC) + b"\x01"
            self.sock.sendall(packet(0x82, sub))
            want.add(9)
        while want:
            for first, _ in self.packets():
                want.discard(first >> 4)

    packets = Station.packets   # every complete packet of one read (same fields)


def subscriber(host: str, port: int, n: int) -> None:
    c = Client(host, port)
    c.connect(subscribe=True)
    print("ready", flush=True)
    got = 0
    t0 = 0.0
    while got < n:
        acks = []
        for first, body in c.packets():
            if first >> 4 != 3:
                continue
            if got == 0:
                t0 = time.perf_counter()
            got += 1
            if (first >> 1) & 3:
                tlen = (body[0] << 8) | body[1]
                acks.append(b"\x40\x02" + bytes(body[2 + tlen:4 + tlen]))
        if acks:
            c.sock.sendall(b"".join(acks))
    print(json.dumps({"n": got, "seconds": time.perf_counter() - t0}), flush=True)


def publisher(host: str, port: int, n: int) -> None:
    c = Client(host, port)
    c.connect(subscribe=False)
    props = command_properties("job-0000001:a3#4", "limit", "limit/cell/responses")
    head_topic = string(TOPIC)
    tail = varint(len(props)) + props + COMMAND_PAYLOAD
    first = bytes([0x32]) + varint(len(head_topic) + 2 + len(tail))
    sent = acked = 0
    t0 = time.perf_counter()
    while acked < n:
        room = min(WINDOW - (sent - acked), n - sent)
        if room > 0:
            c.sock.sendall(b"".join(first + head_topic + struct.pack(">H", (sent + i) % 65535 + 1)
                                    + tail for i in range(room)))
            sent += room
        for f, _ in c.packets():
            if f >> 4 == 4:
                acked += 1
    print(json.dumps({"n": acked, "seconds": time.perf_counter() - t0}), flush=True)


if __name__ == "__main__":
    role, h, p, count = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    (subscriber if role == "sub" else publisher)(h, p, count)
