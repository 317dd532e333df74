"""The script engine inside a host: its MQTT link and its job API.

- ``ScriptLink`` gives the engine's ``api.mqtt`` a real broker: a second MQTT
  connection of the host (its own client id, not shared, every matching subscription
  delivered once), so scripts never steal the host's own messages.
- ``ScriptJobs`` is ``api.jobs``: the host's job control (``MesControl``) called
  directly, the same checks and order script as a request from the MES, without the
  round trip through the broker. A refusal raises ``ScriptAPIError`` naming the OPC UA
  return status.
"""

from __future__ import annotations

import inspect
import json
import logging
from typing import Any

from sfc_host.engine import Handler, Props, ScriptAPIError, wants_properties
from sfc_host.isa95 import status_names
from sfc_host.mes.codec import Invalid
from sfc_host.mes.control import MesControl
from sfc_host.mqtt import Message, MqttLink, Properties
from sfc_host.store.orders import OrderError

log = logging.getLogger("sfc_host.store.lua_scripts")


class ScriptLink:
    """The engine's MQTT protocol (``publish``/``subscribe``) over an ``MqttLink``."""

    def __init__(self, link: MqttLink) -> None:
        self.link = link

    async def publish(self, topic: str, payload: bytes, *, qos: int = 0,
                      retain: bool = False, properties: Props | None = None) -> None:
        props = to_properties(properties) if properties and self.link.v5 else None
        if not self.link.publish_nowait(topic, payload, props, qos=qos, retain=retain):
            raise ScriptAPIError(f"api.mqtt.publish to {topic}: the outgoing queue is full")

    def subscribe(self, topic_filter: str, handler: Handler) -> Any:
        with_props = wants_properties(handler)

        def on_message(message: Message) -> Any:
            if with_props:
                r = handler(message.topic, message.payload,
                            from_properties(message.properties))
            else:
                r = handler(message.topic, message.payload)
            return r if inspect.isawaitable(r) else None
        return self.link.subscribe(topic_filter, on_message, shared=False)


_NAMED = ("ContentType", "ResponseTopic", "CorrelationData")


def from_properties(p: Properties | None) -> Props:
    """MQTT 5 properties as the flat dict scripts see."""
    out: Props = {}
    if p is None:
        return out
    for name, value in getattr(p, "UserProperty", None) or ():
        out[name] = value
    for name in _NAMED:
        value = getattr(p, name, None)
        if value is not None:
            out[name] = value
    return out


def to_properties(props: Props) -> Properties:
    """The flat dict back into MQTT 5 properties (other names as user properties)."""
    p = Properties()
    users = []
    for name, value in props.items():
        if name in _NAMED:
            setattr(p, name, value if name != "CorrelationData" or isinstance(value, bytes)
                    else str(value).encode())
        else:
            users.append((str(name), str(value)))
    if users:
        p.UserProperty = users
    return p


class ScriptJobs:
    """``api.jobs`` of an engine running inside a host."""

    def __init__(self, mes: MesControl) -> None:
        self.mes = mes

    async def _call(self, what: str, scope: str, method: str,
                    data: dict[str, Any]) -> dict[str, Any]:
        try:
            return await self.mes.job_control(scope, method, data)
        except (OrderError, Invalid) as e:
            raise ScriptAPIError(f"api.jobs.{what}: {'|'.join(status_names(e.status))}: "
                                 f"{e}") from None
        except ValueError as e:
            raise ScriptAPIError(f"api.jobs.{what}: INVALID_REQUEST: {e}") from None

    async def submit(self, job_order: dict[str, Any], *, scope: str,
                     start: bool = True) -> str:
        """Store (and by default start) a job order; returns its id."""
        if not isinstance(job_order, dict):
            raise ScriptAPIError("api.jobs.submit: the job order must be a dict "
                                 f"(got {type(job_order).__name__})")
        try:
            order = json.loads(json.dumps(job_order))   # plain JSON, as from the MES
        except (TypeError, ValueError) as e:
            raise ScriptAPIError(f"api.jobs.submit: the job order is not JSON: {e}") from None
        reply = await self._call("submit", scope, "StoreAndStart" if start else "Store",
                                 {"JobOrder": order})
        return str(reply["JobOrderID"])

    async def query(self, job_id: str, *, scope: str) -> dict[str, Any] | None:
        """``{JobOrderID, JobState, JobOrder, Reason, JobResponse}`` or None."""
        try:
            return (await self.mes.views(scope, [job_id]))[0]
        except ValueError as e:
            raise ScriptAPIError(f"api.jobs.query: {e}") from None

    async def _trigger(self, what: str, method: str, job_id: str, scope: str,
                       reason: str) -> str:
        data: dict[str, Any] = {"JobOrderID": job_id}
        if reason:
            data["Comment"] = [{"Locale": "en", "Text": reason}]
        return str((await self._call(what, scope, method, data))["JobState"])

    async def start(self, job_id: str, *, scope: str) -> str:
        return await self._trigger("start", "Start", job_id, scope, "")

    async def pause(self, job_id: str, *, scope: str, reason: str = "") -> str:
        return await self._trigger("pause", "Pause", job_id, scope, reason)

    async def resume(self, job_id: str, *, scope: str, reason: str = "") -> str:
        return await self._trigger("resume", "Resume", job_id, scope, reason)

    async def stop(self, job_id: str, *, scope: str, reason: str = "") -> str:
        return await self._trigger("stop", "Stop", job_id, scope, reason)

    async def abort(self, job_id: str, *, scope: str, reason: str = "") -> str:
        return await self._trigger("abort", "Abort", job_id, scope, reason)

    async def clear(self, job_id: str, *, scope: str) -> str:
        return await self._trigger("clear", "Clear", job_id, scope, "")
