"""A simulated station in its own process for benchmarks/mqtt_e2e.py: answers every
command on ``equipment/+/commands`` at once (MQTT 5, QoS 1), in the mode the command came
in (binary CloudEvents: attributes as user properties; structured: JSON).

    python benchmarks/mqtt_station_proc.py HOST PORT [binary|structured]

It speaks MQTT 5 over a plain socket: each read takes every complete packet, and the
PUBACKs and answers for all of them go out in one write. A general MQTT client spends
more CPU per message than the host does per action, and on a 2-core machine the station
would measure itself, not the host.
"""

from __future__ import annotations

import json
import socket
import struct
import sys
import uuid

ANSWER = json.dumps({"Outcome": "completed", "Result": {"ok": True}}).encode()
DATA = {"Outcome": "completed", "Result": {"ok": True}}


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def string(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack(">H", len(b)) + b


def packet(first: int, body: bytes) -> bytes:
    return bytes([first]) + varint(len(body)) + body


def read_varint(buf: bytes | memoryview, i: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        b = buf[i]
        i += 1
        n |= (b & 0x7F) << shift
        if not b & 0x80:
            return n, i
        shift += 7


def props_of(buf: memoryview, i: int, end: int) -> dict[str, str]:
    """Response topic, content type and user properties of a PUBLISH."""
    out: dict[str, str] = {}
    while i < end:
        ident = buf[i]
        i += 1
        if ident in (0x03, 0x08):           # content type, response topic
            n = (buf[i] << 8) | buf[i + 1]
            out["ContentType" if ident == 0x03 else "ResponseTopic"] = \
                bytes(buf[i + 2:i + 2 + n]).decode()
            i += 2 + n
        elif ident == 0x26:                 # user property
            n = (buf[i] << 8) | buf[i + 1]
            k = bytes(buf[i + 2:i + 2 + n]).decode()
            i += 2 + n
            n = (buf[i] << 8) | buf[i + 1]
            out[k] = bytes(buf[i + 2:i + 2 + n]).decode()
            i += 2 + n
        elif ident == 0x09:                 # correlation data
            n = (buf[i] << 8) | buf[i + 1]
            i += 2 + n
        elif ident == 0x01:
            i += 1
        elif ident == 0x02:
            i += 4
        elif ident == 0x0B:
            _, i = read_varint(buf, i)
        elif ident == 0x23:
            i += 2
        else:
            raise ValueError(f"property {ident:#x} not handled")
    return out


# A command as the host sends one (binary CloudEvent): its 200-byte JSON payload and
# its properties; the benchmarks that stand in for the host send these.
COMMAND_PAYLOAD = json.dumps({"Parameters": {"program": 7, "speed": 1.5},
                              "Context": {"JobOrderID": "job-0000001", "Action": "a3",
                                          "Attempt": 1, "Hold": False, "Restart": False,
                                          "DeadlineMs": 1_780_000_000_000}}).encode().ljust(200)


def command_properties(command_id: str, subject: str, response_topic: str) -> bytes:
    """A command's MQTT 5 properties: content type, response topic and the five
    CloudEvent attributes as user properties."""
    p = b"\x03" + string("application/json") + b"\x08" + string(response_topic)
    for k, v in (("specversion", "1.0"), ("id", command_id), ("source", "sfc-host"),
                 ("type", "com.example.a.v1"), ("subject", subject)):
        p += b"\x26" + string(k) + string(v)
    return p


def parse_publish(body: memoryview, qos: int) -> tuple[bytes, dict[str, str], bytes]:
    """The PUBACK owed for a PUBLISH (if QoS 1), its properties (``props_of``) and its
    payload."""
    i = 2 + ((body[0] << 8) | body[1])
    ack = b""
    if qos:
        ack = b"\x40\x02" + bytes(body[i:i + 2])     # PUBACK, success
        i += 2
    plen, i = read_varint(body, i)
    return ack, props_of(body, i, i + plen), bytes(body[i + plen:])


class Station:
    def __init__(self, host: str, port: int, structured: bool) -> None:
        self.sock = socket.create_connection((host, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.structured = structured
        self.mid = 0
        self.n = 0
        self.buf = b""

    def next_mid(self) -> int:
        self.mid = self.mid % 65535 + 1
        return self.mid

    def connect(self, topic: str = "equipment/+/commands") -> None:
        cid = f"bench-station-{uuid.uuid4().hex[:6]}"
        body = string("MQTT") + bytes([5, 0x02]) + struct.pack(">H", 0) + varint(0) + \
            string(cid)
        self.sock.sendall(packet(0x10, body))
        sub = struct.pack(">H", self.next_mid()) + varint(0) + \
            string(topic) + b"\x01"
        self.sock.sendall(packet(0x82, sub))
        got = 0
        while got < 2:                       # CONNACK, SUBACK
            for first, _ in self.packets():
                if first >> 4 in (2, 9):
                    got += 1

    def packets(self) -> list[tuple[int, memoryview]]:
        data = self.sock.recv(1 << 20)
        if not data:
            raise ConnectionError("broker closed the connection")
        buf = self.buf + data
        view = memoryview(buf)
        out = []
        i = 0
        while i < len(buf):
            if i + 2 > len(buf):
                break
            try:
                n, j = read_varint(view, i + 1)
            except IndexError:
                break
            if j + n > len(buf):
                break
            out.append((buf[i], view[j:j + n]))
            i = j + n
        self.buf = buf[i:]
        return out

    def answer(self, body: memoryview, qos: int) -> bytes:
        out, props, payload = parse_publish(body, qos)
        self.n += 1
        topic = props.get("ResponseTopic")
        if not topic:
            return out
        ctype = props.get("ContentType", "")
        mid = struct.pack(">H", self.next_mid())
        if ctype.startswith("application/cloudevents"):
            cid = json.loads(payload)["id"]
            ev = json.dumps({"specversion": "1.0", "id": f"a{self.n}", "source": "station",
                             "type": "answer", "causationid": cid, "data": DATA}).encode()
            p = b"\x03" + string("application/cloudevents+json")
            return out + packet(0x32, string(topic) + mid + varint(len(p)) + p + ev)
        p = b"\x03" + string("application/json")
        for k, v in (("specversion", "1.0"), ("id", f"a{self.n}"), ("source", "station"),
                     ("type", "answer"), ("causationid", props.get("id", ""))):
            p += b"\x26" + string(k) + string(v)
        return out + packet(0x32, string(topic) + mid + varint(len(p)) + p + ANSWER)

    def run(self) -> None:
        self.connect()
        print("ready", flush=True)
        while True:
            out = []
            for first, body in self.packets():
                kind = first >> 4
                if kind == 3:                                   # PUBLISH
                    out.append(self.answer(body, (first >> 1) & 3))
                elif kind == 12:                                # PINGREQ from us: none
                    pass
            if out:
                self.sock.sendall(b"".join(out))


if __name__ == "__main__":
    Station(sys.argv[1], int(sys.argv[2]),
            len(sys.argv) > 3 and sys.argv[3] == "structured").run()
