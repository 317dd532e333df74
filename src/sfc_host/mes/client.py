"""An MES-side client of the host's job control over MQTT (the ``sfc-host job`` commands,
the demo and tests use it).

It speaks the wire of an MES written for the Python original: a request is a CloudEvent
on ``{mes}/{scope levels}/commands`` with the scope as ``subject``, a UUID
``correlationid`` (also as CorrelationData) and a response topic private to this
client; the host's reply carries the request id as ``causationid``, which is how
replies find their request (on MQTT 3.1.1 there is no response topic: replies come on
``{mes}/{scope levels}/replies``, shared with other clients, and the same id picks
ours). Many requests may be in flight at once.

    async with MesClient(HostConfig.load("host.toml")) as mes:
        reply = await mes.submit("line1", job_order("J1", "wm"))
        if not reply.ok:
            print(" ".join(reply.status_names))
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from sfc_fast.wire.mqtt5 import MAX_REMAINING
from sfc_host import isa95 as model
from sfc_host.config import HostConfig
from sfc_host.errors import SfcHostError
from sfc_host.isa95 import BY_ID, BY_STATE, CONFIG, JOB_CONTROL, METHODS, WORK_MASTER, status_names
from sfc_host.mes.codec import levels
from sfc_host.metrics import Metrics
from sfc_host.mqtt import Message, MqttError, MqttLink, MqttRefused
from sfc_host.mqtt.cloudevents import (
    CloudEvent,
    CloudEventError,
    decode,
    encode,
    new,
)
from sfc_host.names import check_scope

__all__ = ["LISTED_STATES", "MesClient", "MesError", "NoReply", "Reply", "job_order",
           "status_names"]

SOURCE = "sfc-host-cli"

# The states a job order can be in (RequestJobResponseByJobOrderState matches a state
# exactly): listing every order asks for each.
LISTED_STATES = ("NotAllowedToStart_Ready", "AllowedToStart_Ready", "Running",
                 "Interrupted_Suspended", "Interrupted_Held", "Ended_Completed",
                 "Ended_Closed", "Aborted")


def job_order(job: str, work_master: str | None = None, params: dict[str, Any] | None = None,
              *, priority: int | None = None, **fields: Any) -> dict[str, Any]:
    """An ``ISA95JobOrderDataType`` with the fields one usually sets: its Work Master and
    its parameters (``{ID, Value}`` each); other fields as given (PascalCase)."""
    order: dict[str, Any] = {"JobOrderID": job}
    if work_master:
        order["WorkMasterID"] = [{"ID": work_master}]
    if priority is not None:
        order["Priority"] = priority
    if params:
        order["JobOrderParameters"] = [{"ID": k, "Value": v} for k, v in params.items()]
    order.update(fields)
    return order


class MesError(SfcHostError):
    """The broker cannot be reached or the request cannot be sent."""


class NoReply(MesError):
    """No reply within the timeout (no host serves the scope, or it is overloaded)."""


@dataclass(slots=True)
class Reply:
    status: int
    data: dict[str, Any] = field(default_factory=dict)   # without ReturnStatus
    event: CloudEvent | None = None

    @property
    def ok(self) -> bool:
        return self.status == 1

    @property
    def status_names(self) -> list[str]:
        return status_names(self.status)

    @property
    def message(self) -> str:
        m = self.data.get("Message")
        return m if isinstance(m, str) else ""


class MesClient:
    def __init__(self, config: HostConfig, *, timeout_s: float = 10.0,
                 client_id: str = "") -> None:
        u = urlparse(config.mqtt_url)
        if u.scheme not in ("mqtt", "mqtts", "tcp", "ssl"):
            raise ValueError(f"mqtt_url {config.mqtt_url!r}: use mqtt://host:port or "
                             "mqtts://host:port")
        self.config = config
        self.timeout_s = timeout_s
        self.host = u.hostname or "127.0.0.1"
        self.port = u.port or (8883 if u.scheme in ("mqtts", "ssl") else 1883)
        self.v5 = config.mqtt_version == 5
        self.prefix = config.mes_prefix
        self.client_id = client_id or f"sfc-cli-{uuid.uuid4().hex[:12]}"
        self._link: MqttLink | None = None
        self._waiting: dict[str, asyncio.Future[Reply]] = {}
        self._subscribed: dict[str, asyncio.Future[Any]] = {}
        self._retained: dict[str, asyncio.Future[bytes]] = {}

    # ---- connection

    async def __aenter__(self) -> MesClient:
        # the host's own link, with nothing shared and nothing counted anyone reads; a
        # retained state index may be larger than any request (1.6 MB at 10,000 orders)
        link = MqttLink(self.config, Metrics(), client_id=self.client_id, once=True,
                        max_packet=MAX_REMAINING + 5)
        await link.start()
        try:
            await link.wait_connected(self.timeout_s)
        except (MqttError, MqttRefused, TimeoutError) as e:
            await link.aclose(drain_s=0)
            why = link.last_error or e
            raise MesError(f"cannot reach the MQTT broker at {self.host}:{self.port} "
                           f"({why})") from None
        self._link = link
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        for f in self._subscribed.values():
            f.cancel()
        if self._link is not None:
            await self._link.aclose()
            self._link = None

    def _inbox(self, scope: str) -> str:
        # MQTT 5: a topic of this client only, under the scope's tree (broker ACLs that
        # allow {mes}/{scope}/# allow it); 3.1.1 has no response topic.
        if self.v5:
            return f"{self.prefix}/{levels(scope)}/replies/{self.client_id}"
        return f"{self.prefix}/{levels(scope)}/replies"

    async def _subscribe(self, topic: str) -> None:
        # concurrent requests share one SUBSCRIBE, and each waits for it to be done
        # before it publishes (else its reply could come before the subscription)
        done = self._subscribed.get(topic)
        if done is None:
            assert self._link is not None
            done = self._subscribed[topic] = asyncio.ensure_future(
                self._link.subscribed(topic, self._on_message, shared=False))
        try:
            await asyncio.shield(done)
        except (MqttError, TimeoutError) as e:
            self._subscribed.pop(topic, None)
            raise MesError(f"cannot subscribe to {topic} ({e})") from None

    def _on_message(self, msg: Message) -> None:
        fut = self._retained.get(msg.topic)
        if fut is not None:
            if not fut.done():
                fut.set_result(msg.payload)
            return
        self._on_reply(msg)

    def _on_reply(self, msg: Message) -> None:
        try:
            ev = decode(msg.payload, msg.properties,
                        max_bytes=self.config.mqtt_max_payload)
        except CloudEventError:
            return      # not a reply of ours (a shared replies topic on 3.1.1)
        fut = self._waiting.get(ev.causationid or "") or self._waiting.get(
            ev.correlationid or "")
        if fut is None or fut.done():
            return
        data = dict(ev.data) if isinstance(ev.data, dict) else {}
        status = data.pop("ReturnStatus", None)
        if not isinstance(status, int) or isinstance(status, bool):
            status = 0
        fut.set_result(Reply(status, data, ev))

    # ---- requests

    async def request(self, scope: str, type_: str, data: Any, *,
                      extensions: dict[str, str] | None = None,
                      timeout_s: float | None = None) -> Reply:
        """Send one request to ``scope`` and wait for its reply; ``NoReply`` after the
        timeout."""
        check_scope(scope)
        if self._link is None:
            raise MesError("the client is not connected")
        inbox = self._inbox(scope)
        await self._subscribe(inbox)
        corr = uuid.uuid4()
        method = model.method_of(type_)
        ev = new(type_, SOURCE, data, subject=scope, id=str(uuid.uuid4()),
                 datacontenttype="application/json; charset=utf-8",
                 dataschema=model.call_schema(method) if method else None,
                 extensions={"correlationid": str(corr), **(extensions or {})})
        if self.v5:
            ev.response_topic = inbox
            ev.correlation_data = corr.bytes
        payload, props = encode(ev, v5=self.v5, binary=self.config.mqtt_binary)
        fut: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._waiting[ev.id] = fut
        wait = self.timeout_s if timeout_s is None else timeout_s
        try:
            if not self._link.publish_nowait(f"{self.prefix}/{levels(scope)}/commands",
                                             payload, props, qos=1):
                raise MesError("cannot send to the MQTT broker (the queue is full)")
            try:
                return await asyncio.wait_for(fut, wait)
            except TimeoutError:
                raise NoReply(f"no reply from a host for scope {scope!r} within {wait:g} s "
                              "(is a host running?)") from None
        finally:
            self._waiting.pop(ev.id, None)

    async def control(self, scope: str, method: str, job: str, comment: str = "") -> Reply:
        """A job control method on a stored order (Start, Pause, Resume, Stop, Abort…)."""
        if method not in METHODS:
            raise ValueError(f"unknown job control method {method!r}")
        data: dict[str, Any] = {"JobOrderID": job}
        if comment:
            data["Comment"] = model.comment(comment)
        return await self.request(scope, f"{JOB_CONTROL}{method}.v2", data)

    async def submit(self, scope: str, order: dict[str, Any], *, start: bool = True,
                     comment: str = "") -> Reply:
        """StoreAndStart (or Store) of an ``ISA95JobOrderDataType`` (see ``job_order``)."""
        data: dict[str, Any] = {"JobOrder": order}
        if comment:
            data["Comment"] = model.comment(comment)
        method = "StoreAndStart" if start else "Store"
        return await self.request(scope, f"{JOB_CONTROL}{method}.v2", data)

    async def update(self, scope: str, order: dict[str, Any], comment: str = "") -> Reply:
        data: dict[str, Any] = {"JobOrder": order}
        if comment:
            data["Comment"] = model.comment(comment)
        return await self.request(scope, f"{JOB_CONTROL}Update.v2", data)

    async def by_id(self, scope: str, job: str) -> Reply:
        """RequestJobResponseByJobOrderID: ``JobResponse`` once the job ended."""
        return await self.request(scope, BY_ID, {"JobOrderID": job})

    async def by_state(self, scope: str, state: str) -> Reply:
        """RequestJobResponseByJobOrderState for one state (``Ended_Completed``)."""
        return await self.request(scope, BY_STATE,
                                  {"JobOrderState": model.state_list(state)})

    async def all_orders(self, scope: str) -> tuple[Reply | None, list[dict[str, Any]]]:
        """A job response per order of the scope (one ByJobOrderState request per state
        an order can be in, at once), sorted by id; the first refusal instead, if any."""
        replies = await asyncio.gather(*(self.by_state(scope, s) for s in LISTED_STATES))
        rows: list[dict[str, Any]] = []
        for r in replies:
            if not r.ok:
                return r, []
            got = r.data.get("JobResponses")
            rows += [x for x in got if isinstance(x, dict)] if isinstance(got, list) else []
        return None, sorted(rows, key=lambda x: str(x.get("JobOrderID")))

    async def put_work_master(self, scope: str, work_master: dict[str, Any]) -> Reply:
        return await self.request(scope, WORK_MASTER, work_master)

    async def delete_work_master(self, scope: str, wm_id: str) -> Reply:
        return await self.request(scope, WORK_MASTER, {"ID": wm_id},
                                  extensions={"method": "DELETE"})

    async def configure(self, scope: str, kind: str, data: dict[str, Any], *,
                     delete: bool = False) -> Reply:
        """A config message (``equipment``, ``materialclass``, ``materialdefinition``,
        ``personnel``, ``physicalasset``, ``jobacceptance``)."""
        return await self.request(scope, f"{CONFIG}{kind}.v1", data,
                                  extensions={"method": "DELETE"} if delete else None)

    async def retained(self, topic: str, wait_s: float = 1.0) -> Any:
        """The retained JSON on ``{mes}/{topic}`` (``line1/state-index``,
        ``line1/order/J1``), or None when the broker holds none."""
        if self._link is None:
            raise MesError("the client is not connected")
        full = f"{self.prefix}/{topic}"
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._retained[full] = fut
        end: Callable[[], None] | None = None
        try:
            end = await self._link.subscribed(full, self._on_message, shared=False)
            raw = await asyncio.wait_for(fut, wait_s)
        except TimeoutError:
            return None
        finally:
            self._retained.pop(full, None)
            if end is not None:
                end()
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            return None

    async def state_index(self, scope: str, wait_s: float = 1.0) -> dict[str, Any] | None:
        """The retained ``{mes}/{scope}/state-index`` (``{seq, scope, published_at, jobs}``),
        or None when the broker holds none (nothing arrives within ``wait_s``)."""
        check_scope(scope)
        doc = await self.retained(f"{scope}/state-index", wait_s)
        return doc if isinstance(doc, dict) else None
