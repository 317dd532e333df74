"""The station of the fault tests, in its own process: an at-least-once equipment
simulator over MQTT 5 that records every command it receives.

    python tests/faults/fault_station.py MQTT_PORT LOG SEED [DELAY_S] [REPEAT_S] [VERSION]

- Every command on ``equipment/+/commands`` is appended to ``LOG`` as one JSON line
  ``{"id", "job", "t"}`` (``t``: this process's wall clock, never faked) and flushed, so
  a harness that reads the file sees every reception, duplicates included.
- It answers each command after a random delay up to ``DELAY_S`` (seeded), as
  ``tests/execution/test_host_faults.py`` does (``helpers.rework.torque_for``):
  tightening is out of tolerance ``reworks(job)`` times, decided by the command number,
  so a command seen twice gets the same answer.
- It is at least once, as equipment on a link that can drop is: the answer to a job's
  latest command is published again every ``REPEAT_S`` until a newer command of the
  job arrives or the job's status event says it ended (``mes/+/events``). A fault can
  drop an answer (a host killed before applying it, a broker restart); a repeat is
  absorbed by the host. ``REPEAT_S`` 0: no repeats; each reception of a command is
  answered once, a repeated id with the same answer (the equipment contract), so an
  answer lost with a host is had again only if a host sends the command again.
- ``VERSION`` 3: MQTT 3.1.1, answers in structured mode (no user properties there).
- Its session outlives a broker restart (clean start off, session expiry): QoS 1
  commands the broker holds for it are delivered after the restart.

Prints ``ready`` once subscribed; runs until killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import aiomqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # the tests folder
from helpers.mqtt_station import _props
from helpers.rework import torque_for

ENDED = ("Ended", "Aborted", "EndState")


def result_for(job: str, command_id: str) -> dict[str, Any]:
    """The answer's result fields (``torque_for`` of the in-process fault tests)."""
    return torque_for(job, command_id) or {}


def _event(msg: aiomqtt.Message) -> tuple[dict[str, Any], Any]:
    """Attributes and data of a CloudEvent in either content mode."""
    props = _props(msg)
    payload = msg.payload if isinstance(msg.payload, bytes | bytearray) else b""
    if str(props.get("ContentType", "")).startswith("application/cloudevents") or (
            not props and payload.startswith(b"{") and b'"specversion"' in payload):
        # structured mode: said by the content type on MQTT 5, the only mode on 3.1.1
        ev = json.loads(payload)
        return ev, ev.get("data")
    return props, json.loads(payload) if payload else None


class FaultStation:
    def __init__(self, port: int, log_path: str, seed: int, delay_s: float,
                 repeat_s: float, version: int = 5) -> None:
        self.port = port
        self.log = open(log_path, "a", buffering=1)  # noqa: SIM115 (open for the run)
        self.rng = random.Random(seed)
        self.delay_s = delay_s
        self.repeat_s = repeat_s
        self.v5 = version == 5
        self.ident = f"fault-station-{uuid.uuid4().hex[:6]}"
        self.out: asyncio.Queue[tuple[str, bytes, Properties | None]] = asyncio.Queue()
        self.latest: dict[str, tuple[str, float, tuple[str, bytes, Properties | None]]] = {}
        self.ended: set[str] = set()
        self.client: aiomqtt.Client | None = None
        self.connected = asyncio.Event()

    def answer(self, topic: str, cid: str, job: str) -> tuple[str, bytes, Properties | None]:
        data = {"Outcome": "completed", "Result": result_for(job, cid)}
        if not self.v5:
            ev = {"specversion": "1.0", "id": uuid.uuid4().hex, "source": "fault-station",
                  "type": "answer", "causationid": cid, "datacontenttype": "application/json",
                  "data": data}
            return topic, json.dumps(ev).encode(), None
        p = Properties(PacketTypes.PUBLISH)
        p.ContentType = "application/json"
        p.UserProperty = [("specversion", "1.0"), ("id", uuid.uuid4().hex),
                          ("source", "fault-station"), ("type", "answer"),
                          ("causationid", cid)]
        return topic, json.dumps(data).encode(), p

    async def on_command(self, msg: aiomqtt.Message) -> None:
        attrs, _ = _event(msg)
        cid, job = str(attrs.get("id")), str(attrs.get("correlationid"))
        self.log.write(json.dumps({"id": cid, "job": job, "t": time.time()}) + "\n")
        reply = self.answer(str(attrs.get("ResponseTopic") or attrs.get("responsetopic")
                                or msg.topic.value.replace("/commands", "/responses")),
                            cid, job)
        await asyncio.sleep(self.rng.uniform(0.0, self.delay_s))
        last = self.latest.get(job)
        if last is None or _number(cid) >= _number(last[0]):
            self.latest[job] = (cid, time.monotonic(), reply)
        self.out.put_nowait(reply)

    def on_status(self, msg: aiomqtt.Message) -> None:
        _, data = _event(msg)
        if isinstance(data, dict) and str(data.get("JobState", "")).startswith(ENDED):
            self.ended.add(str(data.get("JobOrderID")))
            self.latest.pop(str(data.get("JobOrderID")), None)
        elif isinstance(data, dict) and data.get("PreviousJobState") == "InitialState":
            self.ended.discard(str(data.get("JobOrderID")))   # a re-stored id runs again

    async def repeater(self) -> None:
        while True:
            await asyncio.sleep(min(0.2, self.repeat_s))
            now = time.monotonic()
            for job, (cid, at, reply) in list(self.latest.items()):
                if job not in self.ended and now - at >= self.repeat_s:
                    self.latest[job] = (cid, now, reply)
                    self.out.put_nowait(reply)

    async def publisher(self) -> None:
        while True:
            topic, body, props = await self.out.get()
            while True:
                await self.connected.wait()
                client = self.client
                try:
                    assert client is not None
                    # bounded: a publish on a connection the broker dropped never ends
                    await asyncio.wait_for(
                        client.publish(topic, body, qos=1, properties=props), 1.0)
                    break
                except (aiomqtt.MqttError, AssertionError, TimeoutError):
                    await asyncio.sleep(0.05)

    async def run(self) -> None:
        tasks = [asyncio.create_task(self.publisher())]
        if self.repeat_s > 0:
            tasks.append(asyncio.create_task(self.repeater()))
        handlers: set[asyncio.Task[None]] = set()
        first = True
        connect = Properties(PacketTypes.CONNECT)
        connect.SessionExpiryInterval = 3600
        while True:
            try:
                v5 = dict(protocol=aiomqtt.ProtocolVersion.V5, clean_start=False,
                          properties=connect) if self.v5 else dict(
                    protocol=aiomqtt.ProtocolVersion.V311, clean_session=False)
                async with aiomqtt.Client("127.0.0.1", self.port, identifier=self.ident,
                                          max_inflight_messages=1000, **v5) as c:
                    await c.subscribe("equipment/+/commands", qos=1)
                    await c.subscribe("mes/+/events", qos=1)
                    self.client = c
                    self.connected.set()
                    if first:
                        print("ready", flush=True)
                        first = False
                    async for msg in c.messages:
                        if msg.topic.value.endswith("/commands"):
                            t = asyncio.create_task(self.on_command(msg))
                            handlers.add(t)
                            t.add_done_callback(handlers.discard)
                        else:
                            self.on_status(msg)
            except aiomqtt.MqttError:
                self.connected.clear()
                self.client = None
                await asyncio.sleep(0.1)       # the broker restarts in some faults
            finally:
                self.connected.clear()
        for t in tasks:   # pragma: no cover (runs until killed)
            t.cancel()


def _number(cid: str) -> int:
    with contextlib.suppress(ValueError):
        return int(cid.rsplit("#", 1)[1].split(":", 1)[0])
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    station = FaultStation(int(args[0]), args[1], int(args[2]),
                           float(args[3]) if len(args) > 3 else 0.1,
                           float(args[4]) if len(args) > 4 else 1.0,
                           int(args[5]) if len(args) > 5 else 5)
    asyncio.run(station.run())
