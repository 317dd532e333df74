"""The floor of the host's answer-to-command p99 (its target: within 2x of the broker's
own p99 at the same rate): what p99 a host can have on this machine at all, measured by
a relay with none of the host's work.

    python benchmarks/mqtt_floor.py [--rate 7000] [--seconds 6] [--no-redis]
    python benchmarks/mqtt_floor.py --ports BROKER REDIS [--rate N] [--seconds S]

The relay runs in one process, one selector loop, plain sockets: MQTT 5 framed as
``mqtt_station_proc.py`` does, RESP parsed by ``hiredis.Reader``. It offers jobs of five
commands at ``--rate`` actions a second to the same station process the host's
benchmarks use. For every answer it runs one compare-and-set script shaped like the
host's (``report_limits.CAS_LIKE``: read and compare the version, write state and
version, the due index, the active set and one work entry), all answers of one read in
one write to Redis, and sends the job's next command when the script's reply is read.
That is the order of docs/design.md#few-large-requests (the state is stored before the
command goes out) with no
evolve, no records, no MES side and no queue between the steps. ``--no-redis`` leaves
the script out: the broker and the station alone.

It prints the relay's latency from an answer read to the next command written (the
host's ``answer_to_command_seconds``), its CPU, and then the broker's own ping-pong at
the same rate (``mqtt_pingpong_proc.py``, the relay closed): the yardstick of that target.
With ``--ports`` it uses a running broker (with the station answering on it) and Redis,
as ``report.py`` does after its host is closed, and prints the relay's figures alone as
one JSON line.
"""

from __future__ import annotations

import argparse
import json
import selectors
import socket
import struct
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import hiredis
from mqtt_e2e import broker_pingpong, servers_and_station
from mqtt_station_proc import (
    COMMAND_PAYLOAD,
    Station,
    command_properties,
    packet,
    parse_publish,
    string,
    varint,
)
from report_limits import CAS_LIKE

from sfc_fast.wire.resp import pack_command

ACTIONS = 5
RESPONSES = "floor/responses"
STATE = b"x" * 120          # about a small job's live state


def command(mq: Station, job: str, action: int) -> bytes:
    """A command as the host sends it: binary CloudEvent, response topic, QoS 1."""
    p = command_properties(f"{job}:a{action}#{action + 1}", job, RESPONSES)
    mid = struct.pack(">H", mq.next_mid())
    return packet(0x32, string("equipment/cell/commands") + mid + varint(len(p)) + p
                  + COMMAND_PAYLOAD)


class Relay:
    def __init__(self, broker_port: int, redis_port: int | None) -> None:
        self.mq = Station("127.0.0.1", broker_port, False)
        self.mq.connect(RESPONSES)
        self.rs: socket.socket | None = None
        self.reader = hiredis.Reader()
        self.sha = b""
        if redis_port is not None:
            self.rs = socket.create_connection(("127.0.0.1", redis_port))
            self.rs.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.rs.sendall(pack_command(("SCRIPT", "LOAD", CAS_LIKE)))
            sha = False
            while sha is False:
                self.reader.feed(self.rs.recv(65536))
                sha = self.reader.gets()
            self.sha = sha
            self.rs.setblocking(False)
        self.versions: dict[str, int] = {}
        self.waiting: list[tuple[str, int, float]] = []    # (job, action, answer read)
        self.latency: list[float] = []
        self.ended = 0

    def close(self) -> None:
        self.mq.sock.close()
        if self.rs is not None:
            self.rs.close()

    def answers(self) -> None:
        """Every answer of one read: its PUBACK, and its script (or its next command)."""
        acks: list[bytes] = []
        calls: list[bytes] = []
        arrived: list[tuple[str, int, float]] = []
        for first, body in self.mq.packets():
            if first >> 4 != 3:
                continue
            t = time.perf_counter()
            ack, props, _ = parse_publish(body, (first >> 1) & 3)
            acks.append(ack)
            job, _, rest = props["causationid"].partition(":a")
            action = int(rest.partition("#")[0])
            arrived.append((job, action, t))
            if self.rs is not None:
                v = self.versions.get(job, 0) + 1
                self.versions[job] = v
                calls.append(pack_command((
                    "EVALSHA", self.sha, 4, "{cell}:job:" + job, "{cell}:due",
                    "{cell}:active", "{cell}:work", v, STATE, 1000 + action)))
        if calls and self.rs is not None:
            self.rs.sendall(b"".join(calls))
            self.waiting += arrived
            arrived = []
        if acks:
            self.mq.sock.sendall(b"".join(acks))
        if arrived:
            self.next_commands(arrived)

    def replies(self) -> None:
        assert self.rs is not None
        self.reader.feed(self.rs.recv(1 << 20))
        n = 0
        while self.reader.gets() is not False:
            n += 1
        done, self.waiting = self.waiting[:n], self.waiting[n:]
        self.next_commands(done)

    def next_commands(self, done: list[tuple[str, int, float]]) -> None:
        out = [command(self.mq, job, a + 1) for job, a, _ in done if a + 1 < ACTIONS]
        self.ended += sum(1 for _, a, _ in done if a + 1 >= ACTIONS)
        if out:
            self.mq.sock.sendall(b"".join(out))
            now = time.perf_counter()
            self.latency += [now - t for _, a, t in done if a + 1 < ACTIONS]

    def run(self, rate: float, seconds: float) -> dict[str, float]:
        sel = selectors.DefaultSelector()
        sel.register(self.mq.sock, selectors.EVENT_READ, self.answers)
        if self.rs is not None:
            sel.register(self.rs, selectors.EVENT_READ, self.replies)
        jobs_s = rate / ACTIONS
        jobs = max(1, int(jobs_s * seconds))
        started = 0
        cpu0 = time.process_time()
        t0 = time.perf_counter()
        give_up = t0 + seconds + 30
        while self.ended < jobs and time.perf_counter() < give_up:
            now = time.perf_counter()
            due = [command(self.mq, f"J{i}", 0)
                   for i in range(started, min(jobs, int((now - t0) * jobs_s) + 1))]
            if due:
                started += len(due)
                self.mq.sock.sendall(b"".join(due))
            wait = max(0.0, t0 + started / jobs_s - time.perf_counter()) \
                if started < jobs else 0.05
            for key, _ in sel.select(wait):
                key.data()
        wall = time.perf_counter() - t0
        if self.ended < jobs:
            raise RuntimeError(f"{jobs - self.ended} of {jobs} jobs did not end in time")
        lat = sorted(self.latency)

        def q(f: float) -> float:
            return lat[min(len(lat) - 1, int(f * len(lat)))] * 1000

        return {"rate": len(lat) / wall * ACTIONS / (ACTIONS - 1), "answers": len(lat),
                "p50_ms": q(0.5), "p99_ms": q(0.99), "p999_ms": q(0.999),
                "core": (time.process_time() - cpu0) / wall}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rate", type=float, default=7000.0, help="actions/s offered")
    p.add_argument("--seconds", type=float, default=6.0)
    p.add_argument("--no-redis", action="store_true",
                   help="no compare-and-set: the broker and the station alone")
    p.add_argument("--ports", type=int, nargs=2, metavar=("BROKER", "REDIS"),
                   help="a running broker, with the station on it, and Redis")
    args = p.parse_args()
    if args.rate <= 0 or args.seconds <= 0:
        p.error("--rate and --seconds must be greater than 0")
    if args.ports:
        try:
            relay = Relay(args.ports[0], None if args.no_redis else args.ports[1])
        except OSError as e:
            p.error(f"no broker or Redis to use on ports {args.ports[0]} and "
                    f"{args.ports[1]}: {e}")
        try:
            print(json.dumps(relay.run(args.rate, args.seconds)))
        except RuntimeError as e:
            sys.exit(f"mqtt_floor.py: {e}")
        finally:
            relay.close()
        return
    with servers_and_station() as (redis, broker):
        relay = Relay(broker.port, None if args.no_redis else redis.port)
        try:
            r = relay.run(args.rate, args.seconds)
        except RuntimeError as e:
            sys.exit(f"mqtt_floor.py: {e}")
        finally:
            relay.close()
        pp = broker_pingpong(broker.port, args.rate, args.seconds)
    what = "no Redis" if args.no_redis else "one compare-and-set script an answer"
    print(f"relay ({what}) at {r['rate']:,.0f} actions/s ({r['answers']:,} answers): answer "
          f"to next command p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms, p99.9 "
          f"{r['p999_ms']:.2f} ms; relay CPU {r['core']:.0%} of a core")
    print(f"broker ping-pong (MQTT 5 QoS 1) at {pp['rate']:,.0f} round trips/s: p50 "
          f"{pp['p50_ms']:.2f} ms, p99 {pp['p99_ms']:.2f} ms; the relay's p99 is "
          f"{r['p99_ms'] / pp['p99_ms']:.2f}x the broker's")


if __name__ == "__main__":
    main()
