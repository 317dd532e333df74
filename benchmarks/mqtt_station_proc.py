"""A simulated station in its own process for benchmarks/mqtt_e2e.py: answers every
command on ``equipment/+/commands`` at once (MQTT 5, binary CloudEvents, QoS 1).

    python benchmarks/mqtt_station_proc.py HOST PORT
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import uuid

import aiomqtt
import uvloop
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

ANSWER = json.dumps({"Outcome": "completed", "Result": {"ok": True}}).encode()


def _user(msg: aiomqtt.Message) -> dict[str, str]:
    p = msg.properties
    return dict(getattr(p, "UserProperty", None) or []) if p is not None else {}


async def main(host: str, port: int) -> None:
    quiet = logging.getLogger("bench.station")
    quiet.setLevel(logging.ERROR)
    async with aiomqtt.Client(host, port, identifier=f"bench-station-{uuid.uuid4().hex[:6]}",
                              logger=quiet,
                              protocol=aiomqtt.ProtocolVersion.V5,
                              max_inflight_messages=1000) as c:
        await c.subscribe("equipment/+/commands", qos=1)
        print("ready", flush=True)
        pending: set[asyncio.Task[None]] = set()
        n = 0
        async for msg in c.messages:
            user = _user(msg)
            p = Properties(PacketTypes.PUBLISH)
            p.ContentType = "application/json"
            n += 1
            p.UserProperty = [("specversion", "1.0"), ("id", f"a{n}"), ("source", "station"),
                              ("type", "answer"), ("causationid", user.get("id", ""))]
            topic = msg.properties.ResponseTopic  # type: ignore[union-attr]
            t = asyncio.create_task(c.publish(topic, ANSWER, qos=1, properties=p))
            pending.add(t)
            t.add_done_callback(pending.discard)


if __name__ == "__main__":
    uvloop.run(main(sys.argv[1], int(sys.argv[2])))
