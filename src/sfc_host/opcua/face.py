"""The OPC UA face of one host: the ISA-95 Job Control v2 objects of every scope it
serves, their methods run by the MES side's job control, a status event for every
change of every order, and each scope's ``JobOrderList`` kept current.

The address space, under ``Objects``:

    Scopes/                              (folder, our namespace)
      {scope}/                           (folder)
        JobOrderControl                  ISA95JobOrderReceiverObjectType
          Store, StoreAndStart, Update, Start, RevokeStart, Pause, Resume, Stop,
          Abort, Cancel, Clear; JobOrderList, MaxDownloadableJobOrders, …
        JobOrderResults                  ISA95JobResponseProviderObjectType
          RequestJobResponseByJobOrderID, RequestJobResponseByJobOrderState;
          raises SfcJobOrderStatusEventType

Node ids are strings in our namespace (``{scope}.JobOrderControl.Store``), the same on
every host, so a client can go to any host. Scopes are the host's: configured and
discovered; a scope discovered later gets its objects within a second.

Every state lives in Redis, and whichever host changes an order (for an MQTT request,
an OPC UA call, the web view's button or the recipe's own end) publishes its MQTT
status event. Each host's face takes those events from the broker (a plain
subscription: every host gets every one) and raises the OPC UA event from it, so a
client connected to any host sees every change, in the order it was made. An event the
MQTT side had to drop under overload (``mqtt_status_dropped``) is missing here too.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
import os
import time
from typing import TYPE_CHECKING, Any

import msgspec

from sfc_fast.wire.uabinary import (
    BYTE_STRING,
    DATETIME,
    EXTENSION_OBJECT,
    LOCALIZED_TEXT,
    NODE_ID,
    STRING,
    UINT16,
    LocalizedText,
    QualifiedName,
)
from sfc_host import isa95 as model
from sfc_host.aio import reap
from sfc_host.config import HostConfig
from sfc_host.mqtt import Message, MqttLink
from sfc_host.mqtt.cloudevents import CloudEventError, decode
from sfc_host.opcua.bodies import Bodies, Change
from sfc_host.opcua.lists import OrderLists
from sfc_host.opcua.methods import ID_METHODS, ORDER_METHODS, QUERIES, JobControlCalls
from sfc_host.opcua.server import PROVIDER_TYPE, RECEIVER_TYPE, Namespaces, make_server
from sfc_host.opcua.structures import ConvertError, Structures
from sfc_host.opcua_server import (
    Event,
    ExtensionObject,
    Node,
    NodeId,
    Server,
    Session,
    Variant,
)

if TYPE_CHECKING:
    from sfc_host.execution.host import Host
    from sfc_host.mes.control import MesControl

log = logging.getLogger("sfc_host.opcua")

SCOPES_EVERY_S = 1.0        # how often the face looks for scopes the host serves anew
EVENT_FIELDS = ("JobOrder", "JobState", "JobResponse")
CLOSE_S = 5.0               # the longest the face's loops get to end on close
EVENT_QUEUE = 20_000        # changes waiting for their OPC UA event; more are dropped
EVENT_BATCH = 256           # events raised from one round trip
CATALOG_EVERY_S = 2.0       # how often the scopes' Work Masters and catalogs are read
# the receiver's variables of the config messages, by the catalog kind they list
CATALOG_VARIABLES = {"equipment": "EquipmentID", "materialclass": "MaterialClassID",
                     "materialdefinition": "MaterialDefinitionID",
                     "personnel": "PersonnelID", "physicalasset": "PhysicalAssetID"}


_ENCODE = msgspec.json.Encoder()


OBJECTS = NodeId(85)
HAS_COMPONENT = NodeId(47)
MANDATORY = NodeId(78)
SEVERITY = 100              # an order's change: information, not an alarm
# the optional declarations of the two types the face serves
KEPT = frozenset((*ORDER_METHODS, *ID_METHODS, *QUERIES, "JobOrderList",
                  "JobOrderResponseList", "WorkMaster", "MaxDownloadableJobOrders",
                  *CATALOG_VARIABLES.values()))


class ScopeObjects:
    """One scope's nodes: its receiver and provider, and the variables of its
    configuration with the values last written to them (its lists: ``lists``)."""

    def __init__(self, receiver: NodeId, provider: NodeId,
                 config_nodes: dict[str, NodeId]) -> None:
        self.receiver = receiver
        self.provider = provider
        self.config_nodes = config_nodes
        self.config_values: dict[str, Any] = {}


class OpcUaFace:
    _structures: Structures     # made once the NodeSet is loaded (start)

    def __init__(self, config: HostConfig, host: Host, control: MesControl,
                 link: MqttLink) -> None:
        self.config = config
        self.link = link
        self.host = host
        self.control = control
        self.metrics = host.metrics
        self.calls = JobControlCalls(control)
        self.bodies = Bodies(host.store.keys, control.reads)
        self.lists = OrderLists(config, host, self.metrics, self.bodies)
        self.server: Server | None = None
        self.ns: Namespaces | None = None
        self.scopes: dict[str, ScopeObjects] = {}
        self._folder: NodeId | None = None
        self._event_type: NodeId | None = None
        # the changes to raise events for; None: the face is closing
        self._changes: asyncio.Queue[tuple[str, str, Change] | None] = \
            asyncio.Queue(EVENT_QUEUE)
        self._closing = False
        self._closed = asyncio.Event()      # set on close: the loops' sleeps end
        self._dropped_logged = 0.0
        self._failed: set[str] = set()      # scopes whose objects could not be made
        self._tasks: list[asyncio.Task[None]] = []
        self._unsubscribe: list[Any] = []

    # ---- start and stop

    async def start(self) -> None:
        """Build the address space of the scopes served now, then listen."""
        self.server, self.ns, self._event_type = make_server(self.config)
        space = self.server.space
        structures = self._structures = Structures(space, self.ns.jc)
        self.calls.structures = self.bodies.structures = self.lists.structures = structures
        self.lists.server = self.server
        self._folder = space.add_folder(OBJECTS, NodeId("Scopes", self.ns.own),
                                        QualifiedName("Scopes", self.ns.own)).node_id
        for scope in sorted(self.host.streams.scopes):
            await self._add_scope(scope)
        await self.server.start()
        assert self.server.subscriptions is not None
        self.server.subscriptions.item_made = self.lists.item_made
        for f in event_filters(self.config.mes_prefix, self.config.mes_topic_levels):
            self._unsubscribe.append(self.link.subscribe(f, self._status_event, shared=False))
        loop = asyncio.get_running_loop()
        self._tasks += [loop.create_task(self._watch_scopes()),
                        loop.create_task(self._raise_events()),
                        loop.create_task(self._keep_config())]
        log.info("OPC UA face listening on %s (%d scopes)", self.config.opcua_endpoint,
                 len(self.scopes))

    async def aclose(self) -> None:
        """Stop taking events, let the loops end, stop the server. The loops end by a
        flag, not only by cancelling: asyncua turns a cancelled wait into a TimeoutError,
        which a loop that must survive a failed event would take for one."""
        self._closing = True
        self._closed.set()
        for end in self._unsubscribe:
            end()
        with contextlib.suppress(asyncio.QueueFull):
            self._changes.put_nowait(None)
        tasks = self._tasks + await self.lists.aclose()
        _, pending = await asyncio.wait(tasks, timeout=CLOSE_S) if tasks else ((), ())
        for t in pending:
            t.cancel()
        for t in tasks:
            await reap(t)
        if self.server is not None:
            await self.server.stop()
            self.server = None

    # ---- scopes

    async def _watch_scopes(self) -> None:
        while not self._closing:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closed.wait(), SCOPES_EVERY_S)
            if self._closing:
                return
            for scope in sorted(set(self.host.streams.scopes) - set(self.scopes)
                                - self._failed):
                try:
                    await self._add_scope(scope)
                except Exception:
                    # once: its nodes may be half made, and a second try would clash
                    self._failed.add(scope)
                    self.metrics.inc("opcua_events_failed")
                    log.exception("OPC UA objects of scope %s could not be made; the "
                                  "scope is not on the face until a restart", scope,
                                  extra={"scope": scope})

    async def _add_scope(self, scope: str) -> None:
        server, ns, folder = self.server, self.ns, self._folder
        assert server is not None and ns is not None and folder is not None
        space = server.space
        own = ns.own

        def keep(decl: Node) -> bool:
            return decl.browse_name.name in KEPT or \
                space.modelling_rule(decl.node_id) == MANDATORY

        top = space.add_folder(folder, NodeId(scope, own), QualifiedName(scope, own)).node_id
        receiver = space.instantiate(top, HAS_COMPONENT, f"{scope}.JobOrderControl", own,
                                     QualifiedName("JobOrderControl", own),
                                     NodeId(RECEIVER_TYPE, ns.jc), keep)
        provider = space.instantiate(top, HAS_COMPONENT, f"{scope}.JobOrderResults", own,
                                     QualifiedName("JobOrderResults", own),
                                     NodeId(PROVIDER_TYPE, ns.jc), keep)
        notifier = space.get(provider)
        assert notifier is not None
        notifier.attributes[12] = 1                 # EventNotifier: SubscribeToEvents
        for obj, names in ((receiver, ORDER_METHODS + ID_METHODS), (provider, QUERIES)):
            for name in names:
                method = NodeId(f"{obj.identifier!s}.{name}", own)
                if method in space:
                    server.methods.add(method, self._callback(scope, name))
        order_list = self._child(receiver, "JobOrderList")
        config_nodes = {}
        for name in ("WorkMaster", "MaxDownloadableJobOrders", *CATALOG_VARIABLES.values()):
            node = self._child(receiver, name)
            if node is not None:
                config_nodes[name] = node
        response_list = self._child(provider, "JobOrderResponseList")
        objects = ScopeObjects(receiver, provider, config_nodes)
        self.scopes[scope] = objects
        await self._write_config(scope, objects)
        self.lists.add(scope, order_list, response_list)

    def _child(self, obj: NodeId, name: str) -> NodeId | None:
        node = NodeId(f"{obj.identifier!s}.{name}", obj.namespace)
        assert self.server is not None
        return node if node in self.server.space else None

    def _callback(self, scope: str, name: str) -> Any:
        calls = self.calls

        def call(session: Session, _obj: NodeId, args: list[Variant | None]
                 ) -> Any:
            # the server checked the object is this method's own: this scope's
            return calls.call(scope, name, args, session.user)
        return call

    # ---- the configuration: Work Masters, catalogs, the order limit

    async def _keep_config(self) -> None:
        """The receivers' configuration variables follow the config messages (which any
        host may take): read every ``CATALOG_EVERY_S``, written when they changed."""
        while not self._closing:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closed.wait(), CATALOG_EVERY_S)
            for scope, objects in list(self.scopes.items()):
                if self._closing:
                    return
                try:
                    await self._write_config(scope, objects)
                except Exception:
                    if self._closing:
                        return
                    self.metrics.inc("opcua_events_failed")
                    log.exception("OPC UA configuration of %s not written", scope,
                                  extra={"scope": scope})

    async def _write_config(self, scope: str, objects: ScopeObjects) -> None:
        values = await self._config_values(scope)
        assert self.server is not None
        for name, (value, kind) in values.items():
            node = objects.config_nodes.get(name)
            if node is None or objects.config_values.get(name) == value:
                continue
            if kind == EXTENSION_OBJECT:
                variant = Variant(kind, [self._work_master(w) for w in value])
            elif kind == STRING:
                variant = Variant(kind, list(value))
            else:
                variant = Variant(kind, value)
            self.server.space.set_value(node, variant)
            objects.config_values[name] = value

    def _work_master(self, doc: dict[str, Any]) -> ExtensionObject:
        """A Work Master's structure; its ID alone where the rest does not fit."""
        try:
            return self._structures.extension_object("WorkMaster", doc)
        except ConvertError:
            return self._structures.extension_object("WorkMaster", {"ID": doc["ID"]})

    async def _config_values(self, scope: str) -> dict[str, tuple[Any, int]]:
        """What the configuration variables of ``scope`` hold now, in one round trip
        (and one more for the Work Masters' documents)."""
        store = self.host.store
        k = store.keys(scope)
        client = self.host.client
        ids = await store.work_master_ids(scope)
        pipe = client.pipeline(transaction=False)
        for kind in CATALOG_VARIABLES:
            pipe.smembers(k.catalog(kind))
        pipe.get(k.acceptance)
        for wm_id in ids:
            pipe.get(k.work_master(wm_id))
        got = await pipe.execute()
        n = len(CATALOG_VARIABLES)
        out: dict[str, tuple[Any, int]] = {
            var: (tuple(sorted(m.decode() for m in got[i])), STRING)
            for i, var in enumerate(CATALOG_VARIABLES.values())}
        limit = int(got[n]) if got[n] is not None else self.config.max_job_orders
        out["MaxDownloadableJobOrders"] = (min(max(limit, 0), 65535), UINT16)
        masters = []
        for wm_id, raw in zip(ids, got[n + 1:], strict=True):
            doc = _work_master_doc(wm_id, raw)
            if doc is not None:
                masters.append(doc)
        out["WorkMaster"] = (tuple(masters), EXTENSION_OBJECT)
        return out

    # ---- status events

    def _status_event(self, message: Message) -> None:
        """An MQTT status event of any host: the scope's lists due, and queued for its
        OPC UA event when a client takes the scope's events (none is built for
        nobody)."""
        try:
            ev = decode(message.payload, message.properties,
                        max_bytes=self.config.mqtt_max_payload)
        except CloudEventError:
            return      # not ours to judge: the MQTT side counts what it cannot read
        if ev.type != model.STATUS_EVENT or not ev.subject or not isinstance(ev.data, dict):
            return
        scope = ev.subject
        objects = self.scopes.get(scope)
        if objects is None:
            return
        order = ev.data.get("JobOrder")
        try:
            state = model.state_name(ev.data.get("JobState") or [])
        except ValueError:
            return
        job = order.get("JobOrderID") if isinstance(order, dict) else None
        if not isinstance(job, str):
            return
        change = (state, _ENCODE.encode(order))
        self.lists.noted(scope, job, change)
        if self.server is None or not self.server.takes_events(objects.provider):
            return
        try:
            self._changes.put_nowait((scope, job, change))
        except asyncio.QueueFull:
            # the face cannot keep up: the MES side and the lists still follow
            self.metrics.inc("opcua_events_dropped")
            if self._dropped_logged + 10 < time.monotonic():
                self._dropped_logged = time.monotonic()
                log.warning("OPC UA status events dropped: %d changes wait to be raised",
                            EVENT_QUEUE)

    async def _raise_events(self) -> None:
        """One event per change, in the order the changes were made; what the queue
        holds is raised as one batch, its job responses read in one round trip."""
        while not self._closing:
            first = await self._changes.get()
            batch = [first]
            while len(batch) < EVENT_BATCH and not self._changes.empty():
                batch.append(self._changes.get_nowait())
            changes = [c for c in batch if c is not None]
            try:
                await self._raise_batch(changes)
            except Exception:
                if self._closing:
                    return
                self.metrics.inc("opcua_events_failed", len(changes))
                log.exception("OPC UA status events of %d changes not raised", len(changes))
            if len(changes) < len(batch):
                return          # None: the face is closing

    async def _raise_batch(self, changes: list[tuple[str, str, Change]]) -> None:
        """Each change's event, its structures encoded once, whatever the number of
        subscribers; what is built is kept for the scope's lists."""
        built = await self.bodies.build(changes)
        server, event_type = self.server, self._event_type
        assert server is not None and event_type is not None
        structures = self._structures
        for (scope, job, change), entry in zip(changes, built, strict=True):
            objects = self.scopes.get(scope)
            if objects is None or entry is None:
                continue
            order, response = entry
            self.lists.built(scope, job, change, entry)
            try:
                now = dt.datetime.now(dt.UTC)
                server.raise_event(objects.provider, Event(event_type, {
                    "EventId": Variant(BYTE_STRING, os.urandom(16)),
                    "EventType": Variant(NODE_ID, event_type),
                    "SourceNode": Variant(NODE_ID, objects.provider),
                    "SourceName": Variant(STRING, "JobOrderResults"),
                    "Time": Variant(DATETIME, now),
                    "ReceiveTime": Variant(DATETIME, now),
                    "Message": Variant(LOCALIZED_TEXT, LocalizedText(f"{job} {change[0]}")),
                    "Severity": Variant(UINT16, SEVERITY),
                    "JobOrder": Variant(EXTENSION_OBJECT, ExtensionObject(
                        structures.type_id("JobOrder"), order)),
                    "JobState": Variant(EXTENSION_OBJECT, structures.state_list(change[0])),
                    "JobResponse": Variant(EXTENSION_OBJECT, response)}))
                self.metrics.inc("opcua_events")
            except Exception:
                if self._closing:
                    raise
                self.metrics.inc("opcua_events_failed")
                log.exception("OPC UA status event of %s/%s (%s) not raised", scope, job,
                              change[0], extra={"scope": scope, "job": job})


def _work_master_doc(wm_id: str, raw: bytes | None) -> dict[str, Any] | None:
    """A stored Work Master as an ``ISA95WorkMasterDataType``'s JSON (its ID,
    Description and Parameters; the recipe stays in the host); None if unreadable."""
    try:
        doc = json.loads(raw) if raw else None
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    out: dict[str, Any] = {"ID": wm_id}
    if isinstance(doc.get("Description"), dict):
        out["Description"] = doc["Description"]
    if isinstance(doc.get("Parameters"), list):
        out["Parameters"] = doc["Parameters"]
    return out


def event_filters(prefix: str, depth: int) -> list[str]:
    """The MQTT status event topics of every scope: ``{prefix}/+/events`` … with up to
    ``depth`` levels for the scope."""
    return [prefix + "/+" * i + "/events" for i in range(1, depth + 1)]
