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
import json
import logging
import time
from typing import TYPE_CHECKING, Any

import msgspec
from asyncua import Node, Server, ua
from asyncua.common.callback import CallbackType, ServerItemCallback
from asyncua.common.ua_utils import get_node_subtypes

from sfc_host import isa95 as model
from sfc_host.aio import reap
from sfc_host.config import HostConfig
from sfc_host.mqtt import Message, MqttLink
from sfc_host.mqtt.cloudevents import CloudEventError, decode
from sfc_host.opcua.bodies import Bodies, Change, EncodedTypes
from sfc_host.opcua.convert import ConvertError, from_json
from sfc_host.opcua.lists import OrderLists
from sfc_host.opcua.methods import ID_METHODS, ORDER_METHODS, QUERIES, JobControlCalls
from sfc_host.opcua.server import (
    PROVIDER_TYPE,
    RECEIVER_TYPE,
    Namespaces,
    make_server,
    takes_events,
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


class ScopeObjects:
    """One scope's nodes: its receiver, provider and event generator, and the variables
    of its configuration with the values last written to them (its lists: ``lists``)."""

    def __init__(self, receiver: Node, provider: Node, events: Any,
                 config_nodes: dict[str, Node]) -> None:
        self.receiver = receiver
        self.provider = provider
        self.events = events
        self.config_nodes = config_nodes
        self.config_values: dict[str, Any] = {}


class OpcUaFace:
    _types: EncodedTypes        # made once the NodeSet is loaded (start)

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
        self._folder: Node | None = None
        self._event_type: Node | None = None
        # the changes to raise events for; None: the face is closing
        self._changes: asyncio.Queue[tuple[str, str, Change] | None] = \
            asyncio.Queue(EVENT_QUEUE)
        self._closing = False
        self._closed = asyncio.Event()      # set on close: the loops' sleeps end
        self._dropped_logged = 0.0
        self._subtype_cache: dict[ua.NodeId, list[ua.NodeId]] = {}
        self._failed: set[str] = set()      # scopes whose objects could not be made
        self._tasks: list[asyncio.Task[None]] = []
        self._unsubscribe: list[Any] = []

    # ---- start and stop

    async def start(self) -> None:
        """Build the address space of the scopes served now, then listen."""
        self.server, self.ns, self._event_type = await make_server(self.config)
        self._types = self.lists.types = EncodedTypes()
        self.lists.server = self.server
        # one listener a kind: asyncua keeps one per priority, and the server's
        # subscribe_server_callback gives every listener the same
        self.server.subscribe_server_callback(CallbackType.ItemSubscriptionCreated,
                                              self._item_made)
        self.server.subscribe_server_callback(CallbackType.ItemSubscriptionModified,
                                              self._widen_of_type)
        self.server.subscribe_server_callback(CallbackType.PreRead, self.lists.before_read)
        self._folder = await self.server.nodes.objects.add_folder(
            ua.NodeId("Scopes", self.ns.own), ua.QualifiedName("Scopes", self.ns.own))
        for scope in sorted(self.host.streams.scopes):
            await self._add_scope(scope)
        await self.server.start()
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
        own = ns.own
        top = await folder.add_folder(ua.NodeId(scope, own), ua.QualifiedName(scope, own))
        receiver = await top.add_object(
            ua.NodeId(f"{scope}.JobOrderControl", own), ua.QualifiedName("JobOrderControl", own),
            objecttype=ua.NodeId(RECEIVER_TYPE, ns.jc))
        provider = await top.add_object(
            ua.NodeId(f"{scope}.JobOrderResults", own), ua.QualifiedName("JobOrderResults", own),
            objecttype=ua.NodeId(PROVIDER_TYPE, ns.jc))
        for obj, names in ((receiver, ORDER_METHODS + ID_METHODS), (provider, QUERIES)):
            for name in names:
                method = await obj.get_child(f"{ns.jc}:{name}")
                server.link_method(method, self._callback(scope, name, obj.nodeid))
        events = await server.get_event_generator(self._event_type, emitting_node=provider)
        for f in EVENT_FIELDS:
            # typed, or asyncua sends the structures as Null
            events.event.data_types[f] = ua.VariantType.ExtensionObject
        share_fields(events.event)
        order_list = await self._child(receiver, "JobOrderList")
        config_nodes = {}
        for name in ("WorkMaster", "MaxDownloadableJobOrders", *CATALOG_VARIABLES.values()):
            node = await self._child(receiver, name)
            if node is not None:
                config_nodes[name] = node
        response_list = await self._child(provider, "JobOrderResponseList")
        objects = ScopeObjects(receiver, provider, events, config_nodes)
        self.scopes[scope] = objects
        await self._write_config(scope, objects)
        self.lists.add(scope, order_list, response_list)

    async def _child(self, obj: Node, name: str) -> Node | None:
        assert self.ns is not None
        try:
            return await obj.get_child(f"{self.ns.jc}:{name}")
        except ua.UaError:
            return None

    def _callback(self, scope: str, name: str, own: ua.NodeId) -> Any:
        calls = self.calls

        async def call(parent: ua.NodeId, *args: Any) -> ua.CallMethodResult:
            # asyncua does not check that a method is called on its own object
            if parent != own:
                return ua.CallMethodResult(
                    StatusCode=ua.StatusCode(ua.StatusCodes.BadMethodInvalid))
            return await calls.call(scope, name, args)
        return call

    # ---- event filters

    async def _item_made(self, event: ServerItemCallback, service: Any) -> None:
        await self._widen_of_type(event, service)
        await self.lists.item_made(event, service)

    async def _widen_of_type(self, event: ServerItemCallback, _: Any) -> None:
        """An event filter's ``OfType T`` takes T's subtypes too, as the standard says:
        asyncua 2.1 matches the type exactly, so a client that filters on the abstract
        ``ISA95JobOrderStatusEventType`` (as UaExpert and node-opcua build filters)
        would receive nothing. Done in the hook asyncua offers when a monitored item is
        made or changed: the element becomes ``EventType InList (T, its subtypes)``."""
        params = event.request_params
        items = getattr(params, "ItemsToCreate", None) or getattr(params, "ItemsToModify",
                                                                   None) or []
        for item in items:
            flt = item.RequestedParameters.Filter
            if not isinstance(flt, ua.EventFilter) or flt.WhereClause is None:
                continue
            for el in flt.WhereClause.Elements or ():
                if el.FilterOperator != ua.FilterOperator.OfType or not el.FilterOperands \
                        or not isinstance(el.FilterOperands[0], ua.LiteralOperand):
                    continue
                base = el.FilterOperands[0].Value.Value
                if not isinstance(base, ua.NodeId):
                    continue
                types = await self._subtypes(base)
                if len(types) < 2:
                    continue
                el.FilterOperator = ua.FilterOperator.InList
                el.FilterOperands = [ua.SimpleAttributeOperand(
                    TypeDefinitionId=ua.NodeId(ua.ObjectIds.BaseEventType),
                    BrowsePath=[ua.QualifiedName("EventType", 0)],
                    AttributeId=ua.AttributeIds.Value)] + [
                    ua.LiteralOperand(Value=ua.Variant(n)) for n in types]

    async def _subtypes(self, base: ua.NodeId) -> list[ua.NodeId]:
        got = self._subtype_cache.get(base)
        if got is None:
            assert self.server is not None
            try:
                nodes = await get_node_subtypes(self.server.get_node(base))
            except ua.UaError:
                nodes = []
            got = self._subtype_cache[base] = [n.nodeid for n in nodes]
        return got

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
        for name, (value, kind) in values.items():
            node = objects.config_nodes.get(name)
            if node is None or objects.config_values.get(name) == value:
                continue
            if kind == ua.VariantType.ExtensionObject:
                variant = ua.Variant([from_json("WorkMaster", w) for w in value], kind,
                                     is_array=True)
            elif kind == ua.VariantType.String:
                variant = ua.Variant(list(value), kind, is_array=True)
            else:
                variant = ua.Variant(value, kind)
            await node.write_value(variant)
            objects.config_values[name] = value

    async def _config_values(self, scope: str) -> dict[str, tuple[Any, ua.VariantType]]:
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
        out: dict[str, tuple[Any, ua.VariantType]] = {
            var: (tuple(sorted(m.decode() for m in got[i])), ua.VariantType.String)
            for i, var in enumerate(CATALOG_VARIABLES.values())}
        limit = int(got[n]) if got[n] is not None else self.config.max_job_orders
        out["MaxDownloadableJobOrders"] = (min(max(limit, 0), 65535), ua.VariantType.UInt16)
        masters = []
        for wm_id, raw in zip(ids, got[n + 1:], strict=True):
            doc = _work_master_doc(wm_id, raw)
            if doc is not None:
                masters.append(doc)
        out["WorkMaster"] = (tuple(masters), ua.VariantType.ExtensionObject)
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
        if self.server is None or not takes_events(self.server, objects.provider.nodeid):
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
        """Each change's event, its structures encoded once (asyncua then copies bytes
        for each subscriber instead of encoding the structures again); what is built
        is kept for the scope's lists."""
        built = await self.bodies.build(changes)
        for (scope, job, change), entry in zip(changes, built, strict=True):
            objects = self.scopes.get(scope)
            if objects is None or entry is None:
                continue
            order, response = entry
            self.lists.built(scope, job, change, entry)
            try:
                ev = objects.events.event
                ev.JobOrder = ua.ExtensionObject(TypeId=self._types.order, Body=order)
                ev.JobState = self._types.state_list(change[0])
                ev.JobResponse = response
                ev.shared_fields.clear()
                await objects.events.trigger(message=f"{job} {change[0]}")
                self.metrics.inc("opcua_events")
            except Exception:
                if self._closing:
                    raise
                self.metrics.inc("opcua_events_failed")
                log.exception("OPC UA status event of %s/%s (%s) not raised", scope, job,
                              change[0], extra={"scope": scope, "job": job})


def share_fields(event: Any) -> None:
    """Make ``event`` give every monitored item with the same select clauses the same
    event fields, made once per event. asyncua's ``Event.to_event_fields`` deep-copies
    every field for every subscriber (most of an event's cost with ten subscribers);
    the face never changes a value it handed over (each event gets new objects), so
    sharing them is safe. A subclass of the event's own class, overriding that method:
    the ``[opcua]`` extra pins asyncua to 2.1, and the events tests of
    tests/opcua/test_opcua.py check what subscribers receive. The owner clears
    ``shared_fields`` before each trigger.

    The same event object is triggered again and again, and most of its fields (its
    type, source, severity, the null ones) hold the same object each time: a field's
    Variant is made again only when the field holds another object than last time
    (``field_variants``), and a select clause list's names are resolved once
    (``clause_names``)."""
    base = type(event)
    event.__class__ = type(f"Shared{base.__name__}", (base,), {
        "to_event_fields": _shared_event_fields})
    event.shared_fields = {}
    event.field_variants = {}
    event.clause_names = {}
    event.internal_properties.extend(("shared_fields", "field_variants", "clause_names"))


_NULL = ua.Variant(None)
CLAUSE_LISTS_KEPT = 1024        # the select clause lists whose names are kept resolved


def _shared_event_fields(self: Any, select_clauses: list[ua.SimpleAttributeOperand]
                         ) -> list[ua.Variant]:
    known = self.clause_names.get(id(select_clauses))
    if known is None or known[0] is not select_clauses:
        # a monitored item keeps its filter's list: resolved once per list (held here,
        # so its id stays its own); the names alone say which fields it gets
        names = tuple(ua.AttributeIds(c.AttributeId).name if not c.BrowsePath else
                      self.browse_path_to_attribute_name(c.BrowsePath)
                      for c in select_clauses)
        known = (select_clauses, names)
        if len(self.clause_names) >= CLAUSE_LISTS_KEPT:    # items of sessions long gone
            self.clause_names.clear()
        self.clause_names[id(select_clauses)] = known
    names = known[1]
    fields: list[ua.Variant] | None = self.shared_fields.get(names)
    if fields is None:
        made = self.field_variants
        fields = []
        for name in names:
            val = getattr(self, name, None)
            if val is None:
                fields.append(_NULL)
                continue
            last = made.get(name)
            if last is None or last[0] is not val:
                last = made[name] = (val, ua.Variant(val, self.data_types[name]))
            fields.append(last[1])
        self.shared_fields[names] = fields
    return fields


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
    try:
        from_json("WorkMaster", out)
    except ConvertError:
        out.pop("Parameters", None)
        out.pop("Description", None)
    return out


def event_filters(prefix: str, depth: int) -> list[str]:
    """The MQTT status event topics of every scope: ``{prefix}/+/events`` … with up to
    ``depth`` levels for the scope."""
    return [prefix + "/+" * i + "/events" for i in range(1, depth + 1)]
