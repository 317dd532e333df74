"""A simulated station for MQTT tests: its own aiomqtt client, separate from the host's
code. It receives commands on ``equipment/{scope}/commands`` and answers on the
command's response topic, written by hand in either CloudEvents mode (structured JSON
or MQTT 5 binary with user properties), as equipment software would. On MQTT 3.1.1
(``version=3``) it is structured and answers on ``{prefix}/{scope}/responses``, as a
3.1.1 command has no response topic."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

import aiomqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties


def retrieve_disconnect(client: aiomqtt.Client) -> None:
    # aiomqtt keeps the disconnection's error in a future nobody awaits after the
    # context exits; reading it keeps asyncio from printing it as never retrieved.
    fut = getattr(client, "_disconnected", None)
    if isinstance(fut, asyncio.Future) and fut.done() and not fut.cancelled():
        fut.exception()


# answer(command) -> None (no answer) | dict(data of the answer: Outcome, Result, Reason)
Answer = Callable[[dict[str, Any]], "dict[str, Any] | None"]


def _props(msg: aiomqtt.Message) -> dict[str, Any]:
    p = msg.properties
    out: dict[str, Any] = {}
    if p is None:
        return out
    for name, value in getattr(p, "UserProperty", None) or []:
        out[name] = value
    for attr in ("ContentType", "ResponseTopic", "CorrelationData"):
        if hasattr(p, attr):
            out[attr] = getattr(p, attr)
    return out


class MqttStation:
    def __init__(self, url: str, answer: Answer, *, structured: bool = False,
                 prefix: str = "equipment", version: int = 5, **client_kw: Any) -> None:
        # client_kw: more aiomqtt.Client arguments (username, password, tls_context).
        # A short timeout: the station answers inline, and a publish on a connection
        # the broker dropped would otherwise hold its message loop for aiomqtt's 10 s.
        self.client_kw = {"timeout": 1.0, "keepalive": 5, **client_kw}
        u = urlparse(url)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 1883
        self.answer = answer
        self.v5 = version == 5
        self.structured = structured or not self.v5
        self.prefix = prefix
        self.commands: list[dict[str, Any]] = []    # every command as received
        # command id -> the answer it got: a repeated id gets the same answer again,
        # with no second call of ``answer`` (the equipment contract)
        self.answered: dict[str, dict[str, Any]] = {}
        self.client: aiomqtt.Client | None = None
        self._task: asyncio.Task[None] | None = None
        self.ready = asyncio.Event()

    async def __aenter__(self) -> MqttStation:
        self._task = asyncio.create_task(self._run())
        await asyncio.wait_for(self.ready.wait(), 10)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task

    async def _run(self) -> None:
        while True:
            try:
                proto = (aiomqtt.ProtocolVersion.V5 if self.v5
                         else aiomqtt.ProtocolVersion.V311)
                async with aiomqtt.Client(self.host, self.port,
                                          identifier=f"station-{uuid.uuid4().hex[:8]}",
                                          protocol=proto, **self.client_kw) as c:
                    self.client = c
                    await c.subscribe(f"{self.prefix}/+/commands", qos=1)
                    self.ready.set()
                    async for msg in c.messages:
                        # a broker may send more than was subscribed (amqtt: on connect,
                        # the retained messages that match any client's filters)
                        if msg.topic.matches(f"{self.prefix}/+/commands"):
                            await self._on_command(msg)
            except aiomqtt.MqttError:
                # a publish that failed on the lost connection leaves aiomqtt's
                # disconnection error unread (asyncio would print it at exit)
                if self.client is not None:
                    retrieve_disconnect(self.client)
                self.client = None
                await asyncio.sleep(0.2)   # the broker restarts in some tests

    async def _on_command(self, msg: aiomqtt.Message) -> None:
        props = _props(msg)
        payload = bytes(msg.payload) if isinstance(msg.payload, (bytes, bytearray)) else b""
        if not self.v5 or props.get("ContentType", "").startswith("application/cloudevents"):
            ev = json.loads(payload)
            # 3.1.1: no response topic; the scope's responses topic beside its commands
            reply_to = props.get("ResponseTopic") or \
                msg.topic.value.removesuffix("/commands") + "/responses"
            cmd = {"id": ev["id"], "type": ev["type"], "subject": ev.get("subject"),
                   "correlationid": ev.get("correlationid"), "data": ev.get("data"),
                   "response_topic": reply_to, "traceparent": ev.get("traceparent"),
                   "tracestate": ev.get("tracestate")}
        else:
            cmd = {"id": props.get("id"), "type": props.get("type"),
                   "subject": props.get("subject"), "correlationid": props.get("correlationid"),
                   "data": json.loads(payload) if payload else None,
                   "response_topic": props.get("ResponseTopic"),
                   "specversion": props.get("specversion"), "source": props.get("source"),
                   "traceparent": props.get("traceparent"), "tracestate": props.get("tracestate")}
        self.commands.append(cmd)
        cid = str(cmd["id"])
        data = self.answered.get(cid)
        if data is None:
            data = self.answer(cmd)
            if data is not None:
                self.answered[cid] = data
        if data is not None:
            await self.reply(cmd, data)

    async def reply(self, cmd: dict[str, Any], data: dict[str, Any]) -> None:
        # a device that traces answers in the command's trace (its span the parent)
        await self.publish(cmd["response_topic"], f"{cmd['type']}.answer", data,
                           subject=cmd["subject"], causationid=cmd["id"],
                           traceparent=self.answer_traceparent(cmd))

    def answer_traceparent(self, cmd: dict[str, Any]) -> str | None:
        return cmd.get("traceparent")

    async def publish(self, topic: str, type_: str, data: Any, **attrs: Any) -> None:
        assert self.client is not None
        if self.structured:
            ev = {"specversion": "1.0", "id": uuid.uuid4().hex, "source": "station",
                  "type": type_, "datacontenttype": "application/json", "data": data,
                  **{k: v for k, v in attrs.items() if v is not None}}
            p = Properties(PacketTypes.PUBLISH)
            p.ContentType = "application/cloudevents+json"
            await self.client.publish(topic, json.dumps(ev), qos=1,
                                      properties=p if self.v5 else None)
        else:
            p = Properties(PacketTypes.PUBLISH)
            p.ContentType = "application/json"
            user = [("specversion", "1.0"), ("id", uuid.uuid4().hex), ("source", "station"),
                    ("type", type_)]
            user += [(k, str(v)) for k, v in attrs.items() if v is not None]
            p.UserProperty = user
            await self.client.publish(topic, json.dumps(data), qos=1, properties=p)

    async def raw(self, topic: str, payload: bytes, properties: Properties | None = None) -> None:
        assert self.client is not None
        await self.client.publish(topic, payload, qos=1, properties=properties)

    def ids(self) -> list[str]:
        return [c["id"] for c in self.commands]
