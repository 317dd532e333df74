"""The server's subscriptions, monitored items and Publish, driven directly: request
bodies encoded and response bodies decoded by asyncua (an implementation of the same
encoding written apart from ours), on a loop with publishing intervals of tens of ms.
One test speaks through the project's own client codec instead."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from asyncua import ua
from asyncua.common.utils import Buffer
from asyncua.ua.ua_binary import nodeid_to_binary, struct_from_binary, struct_to_binary

from sfc_fast.wire.uabinary import (
    DOUBLE,
    INT32,
    LOCALIZED_TEXT,
    STRING,
    UINT16,
    DataValue,
    LocalizedText,
    NodeId,
    QualifiedName,
    Reader,
    Variant,
    Writer,
)
from sfc_host.opcua_client import services
from sfc_host.opcua_server.nodes import BASE_EVENT_TYPE, AddressSpace
from sfc_host.opcua_server.subscriptions import (
    DELETE_MONITORED_ITEMS,
    MAX_OPERATIONS,
    MAX_PUBLISH,
    MODIFY_MONITORED_ITEMS,
    MODIFY_SUBSCRIPTION,
    REPUBLISH,
    SET_MONITORING_MODE,
    SET_PUBLISHING_MODE,
    TRANSFER_SUBSCRIPTIONS,
    Event,
    Subscriptions,
)

NS = 1
TEMP, UNIT, SERVER = NodeId("Temp", NS), NodeId("Unit", NS), NodeId(2253)
JOB, SUB_JOB, OTHER = (NodeId("JobEventType", NS), NodeId("SubJobEventType", NS),
                       NodeId("OtherEventType", NS))
UA_TEMP, UA_UNIT, UA_SERVER = ua.NodeId("Temp", NS), ua.NodeId("Unit", NS), ua.NodeId(2253)
UA_JOB, UA_SUB_JOB = ua.NodeId("JobEventType", NS), ua.NodeId("SubJobEventType", NS)
UA_BASE_EVENT = ua.NodeId(2041)

GOOD = 0
BAD_TIMEOUT = 0x800A0000
BAD_SERVICE_UNSUPPORTED = 0x800B0000
BAD_SESSION_CLOSED = 0x80260000
BAD_SUBSCRIPTION_ID_INVALID = 0x80280000
BAD_NODE_ID_UNKNOWN = 0x80340000
BAD_ATTRIBUTE_ID_INVALID = 0x80350000
BAD_MONITORED_ITEM_FILTER_UNSUPPORTED = 0x80440000
BAD_FILTER_NOT_ALLOWED = 0x80450000
BAD_TYPE_DEFINITION_INVALID = 0x80630000
BAD_TOO_MANY_PUBLISH_REQUESTS = 0x80780000
BAD_NO_SUBSCRIPTION = 0x80790000
BAD_SEQUENCE_NUMBER_UNKNOWN = 0x807A0000
BAD_MESSAGE_NOT_AVAILABLE = 0x807B0000
BAD_FILTER_OPERATOR_UNSUPPORTED = 0x80C20000
OVERFLOW_BITS = 0x0480


def make_space() -> AddressSpace:
    """A variable, a notifier object, the Server object and event types: JobEventType
    (with JobOrder), its subtype SubJobEventType, and OtherEventType beside it."""
    space = AddressSpace(["urn:test"])
    space.add_object_type(BASE_EVENT_TYPE, QualifiedName("BaseEventType", 0), is_abstract=True)
    space.add_event_type(JOB, "JobEventType", [("JobOrder", NodeId(12))])
    space.add_event_type(SUB_JOB, "SubJobEventType", supertype=JOB)
    space.add_event_type(OTHER, "OtherEventType")
    space.add_object(None, SERVER, QualifiedName("Server", 0), event_notifier=1)
    space.add_object(None, UNIT, "Unit", event_notifier=1)
    space.add_variable(UNIT, TEMP, "Temp", Variant(DOUBLE, 1.0), NodeId(11))
    return space


class Answer:
    """What the server gives a request: a body (bytes) or a ServiceFault's status."""

    def __init__(self, deadline: float = math.inf) -> None:
        self.deadline = deadline
        self.future: asyncio.Future[bytes | int] = asyncio.get_running_loop().create_future()

    def ok(self, body: bytes) -> None:
        assert not self.future.done(), "answered twice"
        self.future.set_result(body)

    def fail(self, status: int) -> None:
        assert not self.future.done(), "answered twice"
        self.future.set_result(status)

    async def get(self, timeout: float = 2.0) -> bytes | int:
        return await asyncio.wait_for(asyncio.shield(self.future), timeout)


def decode(cls: Any, body: bytes) -> Any:
    """A response body (after its ResponseHeader) read by asyncua as the whole response."""
    head = nodeid_to_binary(cls().TypeId) + struct_to_binary(ua.ResponseHeader())
    return struct_from_binary(cls, Buffer(head + body))


class Bench:
    """A Subscriptions over ``space`` and the calls of one or more sessions to it."""

    def __init__(self, space: AddressSpace) -> None:
        self.space = space
        self.loop = asyncio.get_running_loop()
        self.subs = Subscriptions(space, self.loop)

    def send(self, type_id: int, params: Any, session: str = "s1",
             deadline: float = math.inf) -> Answer:
        answer = Answer(deadline)
        self.subs.request(session, type_id, Reader(struct_to_binary(params)), answer)
        return answer

    async def call(self, type_id: int, params: Any, response: Any,
                   session: str = "s1") -> Any:
        got = await self.send(type_id, params, session).get()
        assert isinstance(got, bytes), f"a ServiceFault {got:#x}"
        return decode(response, got)

    async def fault(self, type_id: int, params: Any, session: str = "s1") -> int:
        got = await self.send(type_id, params, session).get()
        assert isinstance(got, int), "answered, not faulted"
        return got

    async def subscribe(self, interval: float = 20, keepalive: int = 10, lifetime: int = 0,
                        per_publish: int = 0, session: str = "s1") -> Any:
        params = ua.CreateSubscriptionParameters(
            RequestedPublishingInterval=interval, RequestedLifetimeCount=lifetime,
            RequestedMaxKeepAliveCount=keepalive, MaxNotificationsPerPublish=per_publish,
            PublishingEnabled=True)
        resp = await self.call(services.CREATE_SUBSCRIPTION, params,
                               ua.CreateSubscriptionResponse, session)
        return resp.Parameters

    async def monitor(self, sub: int, items: list[Any], session: str = "s1",
                      ttr: int = ua.TimestampsToReturn.Both) -> list[Any]:
        params = ua.CreateMonitoredItemsParameters(SubscriptionId=sub, TimestampsToReturn=ttr,
                                                   ItemsToCreate=items)
        resp = await self.call(services.CREATE_MONITORED_ITEMS, params,
                               ua.CreateMonitoredItemsResponse, session)
        return resp.Results

    def publish(self, acks: list[tuple[int, int]] | None = None, session: str = "s1",
                deadline: float = math.inf) -> Answer:
        params = ua.PublishParameters(SubscriptionAcknowledgements=[
            ua.SubscriptionAcknowledgement(SubscriptionId=s, SequenceNumber=n)
            for s, n in acks or []])
        return self.send(services.PUBLISH, params, session, deadline)

    async def published(self, acks: list[tuple[int, int]] | None = None,
                        session: str = "s1") -> Any:
        got = await self.publish(acks, session).get()
        assert isinstance(got, bytes), f"a ServiceFault {got:#x}"
        return decode(ua.PublishResponse, got).Parameters

    async def until(self, want: Callable[[Any], bool], session: str = "s1",
                    tries: int = 50) -> Any:
        """Publish (acknowledging what came) until a response passes ``want``."""
        acks: list[tuple[int, int]] = []
        for _ in range(tries):
            res = await self.published(acks, session)
            if want(res):
                return res
            seq = res.NotificationMessage.SequenceNumber
            acks = [(res.SubscriptionId, seq)] if res.NotificationMessage.NotificationData \
                else []
        raise AssertionError("never published")


def run(test: Callable[[Bench], Awaitable[None]]) -> None:
    async def main() -> None:
        bench = Bench(make_space())
        try:
            await test(bench)
        finally:
            bench.subs.close()
    asyncio.run(main())


def value_item(node: ua.NodeId, handle: int, *, queue: int = 10, discard: bool = True,
               attribute: int = ua.AttributeIds.Value, filt: Any = None,
               mode: int = ua.MonitoringMode.Reporting) -> Any:
    return ua.MonitoredItemCreateRequest(
        ItemToMonitor=ua.ReadValueId(NodeId=node, AttributeId=attribute), MonitoringMode=mode,
        RequestedParameters=ua.MonitoringParameters(ClientHandle=handle, SamplingInterval=0,
                                                    Filter=filt, QueueSize=queue,
                                                    DiscardOldest=discard))


def operand(path: str, type_definition: ua.NodeId = UA_BASE_EVENT) -> Any:
    return ua.SimpleAttributeOperand(
        TypeDefinitionId=type_definition,
        BrowsePath=[ua.QualifiedName(n, NS if n == "JobOrder" else 0) for n in path.split("/")],
        AttributeId=ua.AttributeIds.Value)


def literal(value: Any, variant_type: ua.VariantType | None = None) -> Any:
    return ua.LiteralOperand(Value=ua.Variant(value, variant_type))


def element(op: ua.FilterOperator, *operands: Any) -> Any:
    return ua.ContentFilterElement(FilterOperator=op, FilterOperands=list(operands))


def event_item(notifier: ua.NodeId, handle: int, select: list[Any],
               where: list[Any] | None = None, queue: int = 100) -> Any:
    filt = ua.EventFilter(SelectClauses=select, WhereClause=ua.ContentFilter(Elements=where or []))
    return value_item(notifier, handle, attribute=ua.AttributeIds.EventNotifier, filt=filt,
                      queue=queue)


def data_changes(res: Any) -> list[tuple[int, Any]]:
    return [(n.ClientHandle, n.Value) for d in res.NotificationMessage.NotificationData
            if isinstance(d, ua.DataChangeNotification) for n in d.MonitoredItems]


def events(res: Any) -> list[tuple[int, list[Any]]]:
    return [(e.ClientHandle, [v.Value for v in e.EventFields])
            for d in res.NotificationMessage.NotificationData
            if isinstance(d, ua.EventNotificationList) for e in d.Events]


def job_event(event_type: NodeId, severity: int = 500, order: str = "J-1",
              source: str = "Unit") -> Event:
    return Event(event_type, {"Message": Variant(LOCALIZED_TEXT, LocalizedText("started")),
                              "Severity": Variant(UINT16, severity),
                              "JobOrder": Variant(STRING, order),
                              "SourceName": Variant(STRING, source)})


# ---- data changes


def test_a_data_item_reports_its_value_then_each_change_and_not_a_repeat() -> None:
    async def test(b: Bench) -> None:
        sub = await b.subscribe(interval=20, keepalive=2)
        made: list[tuple[NodeId, int]] = []
        b.subs.item_made = lambda node, attribute: made.append((node, attribute))
        [res] = await b.monitor(sub.SubscriptionId, [value_item(UA_TEMP, 7)])
        assert res.StatusCode.is_good() and res.MonitoredItemId and res.RevisedQueueSize == 10
        assert made == [(TEMP, 13)] and b.subs.watches_value(TEMP)
        assert not b.subs.watches_value(UNIT)
        first = await b.published()
        [(handle, dv)] = data_changes(first)
        assert (handle, dv.Value.Value) == (7, 1.0)
        assert dv.SourceTimestamp is not None and dv.ServerTimestamp is not None
        assert first.NotificationMessage.SequenceNumber == 1
        b.space.set_value(TEMP, Variant(DOUBLE, 2.0))
        b.space.set_value(TEMP, Variant(DOUBLE, 3.0))
        b.space.set_value(TEMP, DataValue(Variant(DOUBLE, 3.0), 0))     # no change
        res = await b.published([(sub.SubscriptionId, 1)])
        assert [(h, dv.Value.Value) for h, dv in data_changes(res)] == [(7, 2.0), (7, 3.0)]
        assert res.Results == [ua.StatusCode(GOOD)]
        assert res.NotificationMessage.SequenceNumber == 2
        # nothing more: the next answer is a keep-alive, its sequence number the next one
        res = await b.published([(sub.SubscriptionId, 2)])
        assert res.NotificationMessage.NotificationData == []
        assert res.NotificationMessage.SequenceNumber == 3
        assert res.AvailableSequenceNumbers == []
    run(test)


def test_queue_sizes_keep_the_latest_and_mark_what_was_dropped() -> None:
    async def test(b: Bench) -> None:
        sub = await b.subscribe(interval=30)
        items = [value_item(UA_TEMP, 1, queue=1), value_item(UA_TEMP, 2, queue=2),
                 value_item(UA_TEMP, 3, queue=2, discard=False)]
        assert all(r.StatusCode.is_good() for r in await b.monitor(sub.SubscriptionId, items))
        for v in (2.0, 3.0, 4.0):                # before the first publishing cycle
            b.space.set_value(TEMP, Variant(DOUBLE, v))
        got: dict[int, list[tuple[float, int]]] = {}
        for h, dv in data_changes(await b.published()):
            got.setdefault(h, []).append((dv.Value.Value, dv.StatusCode.value))
        assert got[1] == [(4.0, 0)]
        # discard the oldest: 1.0 and 2.0 dropped, the oldest kept says so
        assert got[2] == [(3.0, OVERFLOW_BITS), (4.0, 0)]
        # discard the newest: the last queued is replaced, and says so
        assert got[3] == [(1.0, 0), (4.0, OVERFLOW_BITS)]
    run(test)


def test_another_attribute_is_read_once_and_modes_stop_and_restart_reporting() -> None:
    async def test(b: Bench) -> None:
        sub = await b.subscribe(interval=20, keepalive=2)
        sid = sub.SubscriptionId
        [name, temp] = await b.monitor(sid, [
            value_item(UA_TEMP, 1, attribute=ua.AttributeIds.DisplayName),
            value_item(UA_TEMP, 2)])
        assert name.StatusCode.is_good() and temp.StatusCode.is_good()
        res = await b.published()
        got = dict(data_changes(res))
        assert got[1].Value.Value == ua.LocalizedText("Temp") and got[2].Value.Value == 1.0
        mode = ua.SetMonitoringModeParameters(SubscriptionId=sid,
                                              MonitoringMode=ua.MonitoringMode.Disabled,
                                              MonitoredItemIds=[temp.MonitoredItemId, 999])
        resp = await b.call(SET_MONITORING_MODE, mode, ua.SetMonitoringModeResponse)
        assert [r.value for r in resp.Parameters.Results] == [GOOD, 0x80420000]
        assert not b.subs.watches_value(TEMP)
        b.space.set_value(TEMP, Variant(DOUBLE, 5.0))
        res = await b.published([(sid, res.NotificationMessage.SequenceNumber)])
        assert data_changes(res) == []                          # a keep-alive
        mode.MonitoringMode = ua.MonitoringMode.Reporting
        await b.call(SET_MONITORING_MODE, mode, ua.SetMonitoringModeResponse)
        res = await b.published()
        assert [(h, dv.Value.Value) for h, dv in data_changes(res)] == [(2, 5.0)]
        # publishing off: changes are held, keep-alives still come
        off = ua.SetPublishingModeParameters(PublishingEnabled=False, SubscriptionIds=[sid, 77])
        resp = await b.call(SET_PUBLISHING_MODE, off, ua.SetPublishingModeResponse)
        assert [r.value for r in resp.Parameters.Results] == [GOOD, BAD_SUBSCRIPTION_ID_INVALID]
        b.space.set_value(TEMP, Variant(DOUBLE, 6.0))
        assert data_changes(await b.published()) == []
        off.PublishingEnabled = True
        await b.call(SET_PUBLISHING_MODE, off, ua.SetPublishingModeResponse)
        res = await b.published()
        assert [(h, dv.Value.Value) for h, dv in data_changes(res)] == [(2, 6.0)]
        # a new handle and queue size; then the item deleted
        modify = ua.ModifyMonitoredItemsParameters(
            SubscriptionId=sid, TimestampsToReturn=ua.TimestampsToReturn.Neither,
            ItemsToModify=[ua.MonitoredItemModifyRequest(
                MonitoredItemId=temp.MonitoredItemId,
                RequestedParameters=ua.MonitoringParameters(ClientHandle=9, QueueSize=0))])
        resp = await b.call(MODIFY_MONITORED_ITEMS, modify, ua.ModifyMonitoredItemsResponse)
        assert resp.Results[0].StatusCode.is_good() and resp.Results[0].RevisedQueueSize == 1
        b.space.set_value(TEMP, Variant(DOUBLE, 7.0))
        [(h, dv)] = data_changes(await b.published())
        assert (h, dv.Value.Value, dv.SourceTimestamp, dv.ServerTimestamp) == (9, 7.0, None, None)
        delete = ua.DeleteMonitoredItemsParameters(SubscriptionId=sid,
                                                   MonitoredItemIds=[temp.MonitoredItemId])
        resp = await b.call(DELETE_MONITORED_ITEMS, delete, ua.DeleteMonitoredItemsResponse)
        assert resp.Results == [ua.StatusCode(GOOD)] and not b.subs.watches_value(TEMP)
    run(test)


def test_index_ranges_and_data_change_triggers() -> None:
    async def test(b: Bench) -> None:
        array = NodeId("Array", NS)
        b.space.add_variable(UNIT, array, "Array", Variant(INT32, [1, 2, 3, 4]), NodeId(6), 1)
        sub = await b.subscribe(interval=20)
        ranged = value_item(ua.NodeId("Array", NS), 1)
        ranged.ItemToMonitor.IndexRange = "1:2"
        wrong = value_item(ua.NodeId("Array", NS), 2)
        wrong.ItemToMonitor.IndexRange = "2:1"
        status_only = value_item(UA_TEMP, 3, filt=ua.DataChangeFilter(
            Trigger=ua.DataChangeTrigger.Status))
        stamps = value_item(UA_TEMP, 4, filt=ua.DataChangeFilter(
            Trigger=ua.DataChangeTrigger.StatusValueTimestamp))
        results = await b.monitor(sub.SubscriptionId, [ranged, wrong, status_only, stamps])
        assert [r.StatusCode.value for r in results] == [GOOD, 0x80360000, GOOD, GOOD]
        first = {h: dv.Value.Value for h, dv in data_changes(await b.published())}
        assert first == {1: [2, 3], 3: 1.0, 4: 1.0}
        b.space.set_value(array, Variant(INT32, [9, 2, 3, 8]))     # outside the range
        b.space.set_value(TEMP, DataValue(Variant(DOUBLE, 1.0), 0, 1000))  # a new timestamp
        b.space.set_value(TEMP, DataValue(Variant(DOUBLE, 2.0), 0, 1000))  # a new value
        b.space.set_value(TEMP, DataValue(None, 0x80000000, 2000))         # a new status
        res = await b.published()
        got = sorted(((h, dv.Value.Value, dv.StatusCode.value) for h, dv in data_changes(res)),
                     key=lambda change: change[0])         # each item's in its order
        assert got == [(3, None, 0x80000000), (4, 1.0, GOOD), (4, 2.0, GOOD),
                       (4, None, 0x80000000)]
    run(test)


def test_items_refused_with_the_specifications_status() -> None:
    async def test(b: Bench) -> None:
        sub = await b.subscribe()
        deadband = ua.DataChangeFilter(Trigger=ua.DataChangeTrigger.StatusValue,
                                       DeadbandType=1, DeadbandValue=0.5)
        like = event_item(UA_UNIT, 5, [operand("Message")],
                          [element(ua.FilterOperator.Like, operand("SourceName"),
                                   literal("Unit%"))])
        bad_type = event_item(UA_UNIT, 6, [operand("Message", ua.NodeId("Nope", NS)),
                                           operand("Severity")])
        results = await b.monitor(sub.SubscriptionId, [
            value_item(ua.NodeId("NoSuchNode", NS), 1),
            value_item(UA_UNIT, 2),                             # an Object has no Value
            value_item(UA_TEMP, 3, filt=deadband),
            value_item(UA_TEMP, 4, filt=ua.EventFilter(SelectClauses=[operand("Message")])),
            like, bad_type])
        assert [r.StatusCode.value for r in results] == [
            BAD_NODE_ID_UNKNOWN, BAD_ATTRIBUTE_ID_INVALID, BAD_MONITORED_ITEM_FILTER_UNSUPPORTED,
            BAD_FILTER_NOT_ALLOWED, BAD_MONITORED_ITEM_FILTER_UNSUPPORTED, GOOD]
        assert all(r.MonitoredItemId == 0 for r in results[:5])
        unsupported = results[4].FilterResult
        assert isinstance(unsupported, ua.EventFilterResult)
        [elem] = unsupported.WhereClauseResult.ElementResults
        assert elem.StatusCode.value == BAD_FILTER_OPERATOR_UNSUPPORTED
        # an unknown type in one select clause: that field is Null, the item is made
        partial = results[5].FilterResult
        assert [s.value for s in partial.SelectClauseResults] == [BAD_TYPE_DEFINITION_INVALID,
                                                                   GOOD]
        assert not b.subs.watches_value(TEMP)
    run(test)


# ---- events


def test_events_with_select_clauses_and_where_clauses() -> None:
    async def test(b: Bench) -> None:
        sub = await b.subscribe(interval=20)
        select = [operand("EventType"), operand("Message"), operand("Severity"),
                  operand("JobOrder", UA_JOB), operand("NoSuchField")]
        items = [
            event_item(UA_UNIT, 1, select, [element(ua.FilterOperator.OfType,
                                                    literal(UA_JOB))]),
            event_item(UA_UNIT, 2, select, [
                element(ua.FilterOperator.InList, operand("Severity"),
                        literal(100, ua.VariantType.UInt16), literal(200, ua.VariantType.UInt16))]),
            event_item(UA_SERVER, 3, [operand("JobOrder", UA_JOB), operand("SourceName")], [
                element(ua.FilterOperator.And, ua.ElementOperand(Index=1),
                        ua.ElementOperand(Index=2)),
                element(ua.FilterOperator.Equals, operand("SourceName"), literal("Unit")),
                element(ua.FilterOperator.Not, ua.ElementOperand(Index=3)),
                element(ua.FilterOperator.LessThan, operand("Severity"),
                        literal(300, ua.VariantType.Int32))]),
            event_item(UA_UNIT, 4, [operand("Message")], [
                element(ua.FilterOperator.IsNull, operand("JobOrder", UA_JOB))]),
        ]
        results = await b.monitor(sub.SubscriptionId, items)
        assert [r.StatusCode.value for r in results] == [GOOD] * 4
        # no error to tell: a null ExtensionObject
        assert not isinstance(results[0].FilterResult, ua.EventFilterResult)
        assert b.subs.watches_events(UNIT) and b.subs.watches_events(NodeId("Elsewhere", NS))
        b.subs.raise_event(UNIT, job_event(SUB_JOB, severity=500))     # 1 (a subtype), 3
        b.subs.raise_event(UNIT, job_event(OTHER, severity=200))       # 2, 4
        b.subs.raise_event(UNIT, job_event(JOB, severity=100, source="Other"))  # 1, 2
        got: dict[int, list[list[Any]]] = {}
        for handle, fields in events(await b.published()):
            got.setdefault(handle, []).append(fields)
        started = ua.LocalizedText("started")
        assert got[1] == [[UA_SUB_JOB, started, 500, "J-1", None],
                          [UA_JOB, started, 100, "J-1", None]]
        # an OtherEventType has no JobOrder of JobEventType's: Null, though it has a field
        # of that name
        assert got[2] == [[ua.NodeId("OtherEventType", NS), started, 200, None, None],
                          [UA_JOB, started, 100, "J-1", None]]
        assert got[3] == [["J-1", "Unit"]]
        assert got[4] == [[started]]
    run(test)


def test_the_projects_client_codec_reads_what_the_server_publishes() -> None:
    async def test(b: Bench) -> None:
        sub = await b.subscribe(interval=20)
        w = Writer()
        flt = services.event_filter([(BASE_EVENT_TYPE, [QualifiedName("Severity")]),
                                     (JOB, [QualifiedName("JobOrder", NS)])], [JOB, SUB_JOB])
        services.write_create_monitored_items(w, sub.SubscriptionId, [
            services.MonitorRequest(UNIT, 11, services.EVENT_NOTIFIER, 0, 10, flt),
            services.MonitorRequest(TEMP, 12)])
        answer = Answer()
        b.subs.request("s1", services.CREATE_MONITORED_ITEMS, Reader(w.getvalue()), answer)
        body = await answer.get()
        assert isinstance(body, bytes)
        assert [s for s, _ in services.read_create_monitored_items(Reader(body))] == [0, 0]
        b.subs.raise_event(UNIT, job_event(OTHER))
        b.subs.raise_event(UNIT, job_event(SUB_JOB, order="J-9"))
        got = await b.publish().get()
        assert isinstance(got, bytes)
        n = services.read_publish(Reader(got))
        assert n.subscription == sub.SubscriptionId and n.sequence == 1
        assert n.events == [(11, [500, "J-9"])]
        assert [(h, dv.value.value) for h, dv in n.data_changes] == [(12, 1.0)]
    run(test)


# ---- the publishing cycle


def test_keep_alive_after_the_keep_alive_count_without_notifications() -> None:
    async def test(b: Bench) -> None:
        sub = await b.subscribe(interval=20, keepalive=3)
        assert (sub.RevisedPublishingInterval, sub.RevisedMaxKeepAliveCount) == (20, 3)
        first = await b.published()              # the first cycle says it is alive
        assert first.NotificationMessage.NotificationData == []
        assert first.NotificationMessage.SequenceNumber == 1
        start = b.loop.time()
        res = await b.published()
        assert b.loop.time() - start >= 0.045    # three intervals, less the timer's slack
        assert res.NotificationMessage.NotificationData == []
        assert res.NotificationMessage.SequenceNumber == 1      # not consumed
        assert res.MoreNotifications is False
    run(test)


def test_revised_parameters_and_modify_subscription() -> None:
    async def test(b: Bench) -> None:
        sub = await b.subscribe(interval=1, keepalive=0, lifetime=1)
        assert sub.RevisedPublishingInterval == 10
        assert sub.RevisedMaxKeepAliveCount == 10 and sub.RevisedLifetimeCount == 30
        modify = ua.ModifySubscriptionParameters(
            SubscriptionId=sub.SubscriptionId, RequestedPublishingInterval=50,
            RequestedLifetimeCount=100, RequestedMaxKeepAliveCount=5)
        resp = await b.call(MODIFY_SUBSCRIPTION, modify, ua.ModifySubscriptionResponse)
        assert (resp.Parameters.RevisedPublishingInterval, resp.Parameters.RevisedLifetimeCount,
                resp.Parameters.RevisedMaxKeepAliveCount) == (50, 100, 5)
        other = await b.subscribe(session="s2")
        assert other.SubscriptionId != sub.SubscriptionId
        modify.SubscriptionId = other.SubscriptionId        # another session's
        assert await b.fault(MODIFY_SUBSCRIPTION, modify) == BAD_SUBSCRIPTION_ID_INVALID
        transfer = ua.TransferSubscriptionsParameters(SubscriptionIds=[other.SubscriptionId])
        assert await b.fault(TRANSFER_SUBSCRIPTIONS, transfer) == BAD_SERVICE_UNSUPPORTED
        nothing = ua.DeleteSubscriptionsParameters(SubscriptionIds=[])
        assert await b.fault(services.DELETE_SUBSCRIPTIONS, nothing) == 0x800F0000
        # a count beyond the bound is refused before anything is read or made
        w = Writer()
        w.length(MAX_OPERATIONS + 1)
        for _ in range(MAX_OPERATIONS + 1):
            w.uint32(other.SubscriptionId)
        answer = Answer()
        b.subs.request("s1", services.DELETE_SUBSCRIPTIONS, Reader(w.getvalue()), answer)
        assert await answer.get() == 0x80100000                 # BadTooManyOperations
    run(test)


def test_max_notifications_per_publish_splits_with_more_notifications() -> None:
    async def test(b: Bench) -> None:
        sub = await b.subscribe(interval=20, per_publish=2)
        await b.monitor(sub.SubscriptionId, [value_item(UA_TEMP, 1, queue=10)])
        for v in (2.0, 3.0, 4.0, 5.0):
            b.space.set_value(TEMP, Variant(DOUBLE, v))
        one, two, three = b.publish(), b.publish(), b.publish()
        got = [decode(ua.PublishResponse, await a.get()).Parameters for a in (one, two, three)]
        assert [[dv.Value.Value for _h, dv in data_changes(r)] for r in got] == [
            [1.0, 2.0], [3.0, 4.0], [5.0]]
        assert [r.MoreNotifications for r in got] == [True, True, False]
        assert [r.NotificationMessage.SequenceNumber for r in got] == [1, 2, 3]
        assert got[2].AvailableSequenceNumbers == [1, 2, 3]
    run(test)


def test_acknowledgements_and_republish() -> None:
    async def test(b: Bench) -> None:
        sub = await b.subscribe(interval=20)
        sid = sub.SubscriptionId
        await b.monitor(sid, [value_item(UA_TEMP, 1)])
        res = await b.published()
        assert res.AvailableSequenceNumbers == [1]
        again = await b.call(REPUBLISH, ua.RepublishParameters(
            SubscriptionId=sid, RetransmitSequenceNumber=1), ua.RepublishResponse)
        assert again.NotificationMessage == res.NotificationMessage
        b.space.set_value(TEMP, Variant(DOUBLE, 2.0))
        res = await b.published([(sid, 1), (sid, 99), (sid + 100, 1)])
        assert [r.value for r in res.Results] == [GOOD, BAD_SEQUENCE_NUMBER_UNKNOWN,
                                                  BAD_SUBSCRIPTION_ID_INVALID]
        assert res.AvailableSequenceNumbers == [2]
        gone = ua.RepublishParameters(SubscriptionId=sid, RetransmitSequenceNumber=1)
        assert await b.fault(REPUBLISH, gone) == BAD_MESSAGE_NOT_AVAILABLE
        gone.SubscriptionId = sid + 100
        assert await b.fault(REPUBLISH, gone) == BAD_SUBSCRIPTION_ID_INVALID
    run(test)


def test_a_subscription_without_publish_for_its_lifetime_ends_with_a_status_change() -> None:
    async def test(b: Bench) -> None:
        sub = await b.subscribe(interval=10, keepalive=1, lifetime=3)
        assert sub.RevisedLifetimeCount == 3
        await b.monitor(sub.SubscriptionId, [value_item(UA_TEMP, 1)])
        await asyncio.sleep(0.2)
        assert not b.subs.watches_value(TEMP)
        res = await b.published()
        assert res.SubscriptionId == sub.SubscriptionId
        [change] = res.NotificationMessage.NotificationData
        assert isinstance(change, ua.StatusChangeNotification)
        assert change.Status.value == BAD_TIMEOUT
        assert await b.publish().get() == BAD_NO_SUBSCRIPTION
        delete = ua.DeleteSubscriptionsParameters(SubscriptionIds=[sub.SubscriptionId])
        resp = await b.call(services.DELETE_SUBSCRIPTIONS, delete,
                            ua.DeleteSubscriptionsResponse)
        assert [r.value for r in resp.Results] == [BAD_SUBSCRIPTION_ID_INVALID]
    run(test)


def test_publish_without_subscription_and_deleting_the_last_one() -> None:
    async def test(b: Bench) -> None:
        assert await b.publish().get() == BAD_NO_SUBSCRIPTION
        sub = await b.subscribe(interval=1000)
        waiting = b.publish()
        await asyncio.sleep(0.02)
        assert not waiting.future.done()
        delete = ua.DeleteSubscriptionsParameters(SubscriptionIds=[sub.SubscriptionId])
        resp = await b.call(services.DELETE_SUBSCRIPTIONS, delete,
                            ua.DeleteSubscriptionsResponse)
        assert resp.Results == [ua.StatusCode(GOOD)]
        assert await waiting.get() == BAD_NO_SUBSCRIPTION
    run(test)


def test_a_publish_past_its_deadline_times_out_and_too_many_fail_the_oldest() -> None:
    async def test(b: Bench) -> None:
        await b.subscribe(interval=1000)
        now = b.loop.time()
        short = b.publish(deadline=now + 0.05)
        long = b.publish(deadline=now + 30)
        assert await short.get() == BAD_TIMEOUT
        assert b.loop.time() - now >= 0.045
        assert not long.future.done()
        more = [b.publish() for _ in range(MAX_PUBLISH)]
        assert await long.get() == BAD_TOO_MANY_PUBLISH_REQUESTS
        assert not any(a.future.done() for a in more)
        b.subs.close_session("s1")
        assert {await a.get() for a in more} == {BAD_SESSION_CLOSED}
    run(test)


def test_close_session_deletes_its_subscriptions_and_fails_its_publishes() -> None:
    async def test(b: Bench) -> None:
        mine = await b.subscribe(interval=1000)
        theirs = await b.subscribe(interval=1000, session="s2")
        await b.monitor(mine.SubscriptionId, [value_item(UA_TEMP, 1),
                                              event_item(UA_UNIT, 2, [operand("Message")])])
        await b.monitor(theirs.SubscriptionId, [value_item(UA_TEMP, 1)], session="s2")
        delete = ua.DeleteSubscriptionsParameters(SubscriptionIds=[theirs.SubscriptionId])
        resp = await b.call(services.DELETE_SUBSCRIPTIONS, delete,
                            ua.DeleteSubscriptionsResponse)
        assert [r.value for r in resp.Results] == [BAD_SUBSCRIPTION_ID_INVALID]
        waiting = b.publish()
        b.subs.close_session("s1")
        assert await waiting.get() == BAD_SESSION_CLOSED
        assert not b.subs.watches_events(UNIT)
        assert b.subs.watches_value(TEMP)                  # s2's item
        b.subs.close_session("s2")
        assert not b.subs.watches_value(TEMP)
        assert await b.publish().get() == BAD_NO_SUBSCRIPTION
    run(test)


@pytest.mark.parametrize("count", [0, 3])
def test_an_event_none_selects_a_field_of_gets_nulls(count: int) -> None:
    """Fields nobody selects are never encoded; one not in the event is Null."""
    async def test(b: Bench) -> None:
        sub = await b.subscribe(interval=20)
        await b.monitor(sub.SubscriptionId, [event_item(
            UA_UNIT, 1, [operand("Missing"), operand("Inner/Deep")] + [operand("Severity")]
            * count)])
        ev = Event(OTHER, {"Severity": Variant(INT32, 1), "Inner/Deep": Variant(STRING, "x")})
        b.subs.raise_event(UNIT, ev)
        [(handle, fields)] = events(await b.published())
        assert handle == 1
        assert fields == [None, "x"] + [1] * count
        assert set(ev.encoded) == ({"Missing", "Inner/Deep", "Severity"} if count
                                   else {"Missing", "Inner/Deep"})
    run(test)
