"""The broker's own latency: a plain MQTT 5 QoS 1 ping-pong through mosquitto at a fixed
rate, the yardstick of the host's answer-to-command p99 (the target: within 2x
of this at the same message rate).

    python benchmarks/mqtt_pingpong_proc.py HOST PORT RATE SECONDS

Two raw MQTT 5 connections in this process, written as ``mqtt_station_proc.py`` (each
read takes every complete packet; its PUBACKs and echoes go out in one write): the echo
subscribes to ``bench/ping`` and publishes every message again on ``bench/pong``; the
pinger publishes RATE pings a second (QoS 1, its send time in the payload) and takes the
round trip of each pong: two trips through the broker and a client's turn, as an answer
and the next command are. Prints one JSON line: p50, p99 and p99.9 in ms, the pings and
the rate achieved.
"""

from __future__ import annotations

import json
import selectors
import struct
import sys
import time

from mqtt_station_proc import Station, packet, parse_publish, string, varint

PING, PONG = "bench/ping", "bench/pong"


def publish(peer: Station, topic: str, payload: bytes) -> bytes:
    mid = struct.pack(">H", peer.next_mid())
    return packet(0x32, string(topic) + mid + varint(0) + payload)


def main(host: str, port: int, rate: float, seconds: float) -> None:
    echo, pinger = Station(host, port, False), Station(host, port, False)
    echo.connect(PING)
    pinger.connect(PONG)
    sel = selectors.DefaultSelector()
    sel.register(echo.sock, selectors.EVENT_READ, echo)
    sel.register(pinger.sock, selectors.EVENT_READ, pinger)
    n = max(20, int(rate * seconds))
    rtts: list[float] = []
    sent = 0
    t0 = time.perf_counter()
    end = t0 + seconds + 30
    while len(rtts) < n and time.perf_counter() < end:
        now = time.perf_counter()
        burst = []
        while sent < n and t0 + sent / rate <= now:
            burst.append(publish(pinger, PING, struct.pack(">d", time.perf_counter())))
            sent += 1
        if burst:
            pinger.sock.sendall(b"".join(burst))
        wait = max(0.0, t0 + sent / rate - time.perf_counter()) if sent < n else 0.1
        for key, _ in sel.select(wait):
            peer: Station = key.data
            out = []
            for first, body in peer.packets():
                if first >> 4 != 3:
                    continue
                ack, _, payload = parse_publish(body, (first >> 1) & 3)
                out.append(ack)
                if peer is echo:
                    out.append(publish(echo, PONG, payload))
                else:
                    rtts.append(time.perf_counter() - struct.unpack(">d", payload)[0])
            if out:
                peer.sock.sendall(b"".join(out))
    wall = time.perf_counter() - t0
    rtts.sort()

    def q(f: float) -> float:
        return rtts[min(len(rtts) - 1, int(f * len(rtts)))] * 1000 if rtts else float("nan")
    print(json.dumps({"p50_ms": q(0.5), "p99_ms": q(0.99), "p999_ms": q(0.999),
                      "pings": len(rtts), "rate": len(rtts) / wall}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]))
