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


STRUCTURED = False


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
            n += 1
            p = Properties(PacketTypes.PUBLISH)
            topic = msg.properties.ResponseTopic  # type: ignore[union-attr]
            if STRUCTURED:
                cid = json.loads(msg.payload)["id"]  # type: ignore[arg-type]
                p.ContentType = "application/cloudevents+json"
                body = json.dumps({"specversion": "1.0", "id": f"a{n}", "source": "station",
                                   "type": "answer", "causationid": cid,
                                   "data": {"Outcome": "completed", "Result": {"ok": True}}})
                t = asyncio.create_task(c.publish(topic, body, qos=1, properties=p))
            else:
                user = _user(msg)
                p.ContentType = "application/json"
                p.UserProperty = [("specversion", "1.0"), ("id", f"a{n}"),
                                  ("source", "station"), ("type", "answer"),
                                  ("causationid", user.get("id", ""))]
                t = asyncio.create_task(c.publish(topic, ANSWER, qos=1, properties=p))
            pending.add(t)
            t.add_done_callback(pending.discard)


if __name__ == "__main__":
    STRUCTURED = len(sys.argv) > 3 and sys.argv[3] == "structured"
    uvloop.run(main(sys.argv[1], int(sys.argv[2])))
