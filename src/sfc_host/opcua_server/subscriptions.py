"""Subscriptions, monitored items and the Publish service of the server (IEC 62541
Part 4 §5.12, §5.13, the filters of §7.7 and §7.22), read from and written to the
compiled codec (``sfc_fast.wire.uabinary``).

Why it is shaped this way:

- An event is raised once and goes to many subscribers. ``Event`` encodes each of its
  fields on first use and keeps the bytes; a monitored item resolves its select clauses
  to field names when it is made, so delivering an event to an item is its where clause
  (compiled to closures when the item is made), then its client handle before the
  fields' bytes joined (joined once for all the items that select the same fields).
  Nothing is encoded per subscriber.
- A data change is reported when the address space calls its watcher (one watch per
  node, shared by the node's items): values are not sampled on a clock, every change is
  queued (the sampling interval is echoed, not used).
- One timer per subscription (its publishing interval) and one timer for all waiting
  Publish requests (the earliest deadline): no task per notification, no timer per item
  or per request.

Bounds the server revises requests to: a publishing interval of ``MIN_INTERVAL_MS`` to
``MAX_INTERVAL_MS``; a keep-alive period of at most ``MAX_KEEPALIVE_MS``; a lifetime of
at least three keep-alive counts and at most ``MAX_LIFETIME_MS`` (unless three
keep-alives are longer); ``MAX_NOTIFICATIONS`` notifications a message when the client
sets no cap; queues of 1 to ``MAX_QUEUE`` entries (``DEFAULT_EVENT_QUEUE`` for an event
item that asks for 0); ``MAX_PUBLISH`` waiting Publish requests a session (the oldest
fails BadTooManyPublishRequests); ``MAX_KEPT`` messages a subscription keeps for
Republish.

Not served: deadband filters, the aggregate filter, the where clause operators Like,
Between, Cast, InView, RelatedTo, BitwiseAnd and BitwiseOr (the item is refused
BadMonitoredItemFilterUnsupported, the operator's element says
BadFilterOperatorUnsupported), AttributeOperands (events are no nodes here),
TransferSubscriptions (a ServiceFault BadServiceUnsupported: a client makes its
subscriptions anew), SetTriggering (not among ``SERVICES``), subscription priority
(late subscriptions are served in the order they became late), multi-dimensional index
ranges, index ranges of select clauses (the whole field is sent), the
EventQueueOverflow event (an event queue drops quietly).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import operator
import re
import struct
from collections import deque
from collections.abc import Callable, Hashable, Iterable
from typing import TYPE_CHECKING, Any, Protocol, cast

from sfc_fast.wire.uabinary import (
    BYTE_STRING,
    NODE_ID,
    STRING,
    DataValue,
    DecodeError,
    EncodeError,
    ExpandedNodeId,
    ExtensionObject,
    LocalizedText,
    NodeId,
    QualifiedName,
    Reader,
    Variant,
    Writer,
    ticks_now,
)
from sfc_host.errors import SfcHostError
from sfc_host.opcua_client import services

if TYPE_CHECKING:
    import asyncio

    from sfc_host.opcua_server.nodes import AddressSpace

log = logging.getLogger("sfc_host.opcua_server")

# The DefaultBinary encoding ids (Part 6 Annex A) the client's module lacks
MODIFY_SUBSCRIPTION = 793
SET_PUBLISHING_MODE = 799
MODIFY_MONITORED_ITEMS = 763
SET_MONITORING_MODE = 769
DELETE_MONITORED_ITEMS = 781
REPUBLISH = 832
TRANSFER_SUBSCRIPTIONS = 841
ELEMENT_OPERAND, ATTRIBUTE_OPERAND = 594, 600
DATA_CHANGE_FILTER, AGGREGATE_FILTER, EVENT_FILTER_RESULT = 724, 730, 736

# Status codes (Part 4 §7.39, values of Part 6 Annex A.2)
GOOD = 0
BAD_TIMEOUT = 0x800A0000
BAD_SHUTDOWN = 0x800C0000
BAD_SERVICE_UNSUPPORTED = 0x800B0000
BAD_NOTHING_TO_DO = 0x800F0000
BAD_TOO_MANY_OPERATIONS = 0x80100000
BAD_SESSION_CLOSED = 0x80260000
BAD_SUBSCRIPTION_ID_INVALID = 0x80280000
BAD_TIMESTAMPS_TO_RETURN_INVALID = 0x802B0000
BAD_NODE_ID_UNKNOWN = 0x80340000
BAD_ATTRIBUTE_ID_INVALID = 0x80350000
BAD_INDEX_RANGE_INVALID = 0x80360000
BAD_INDEX_RANGE_NO_DATA = 0x80370000
BAD_DATA_ENCODING_INVALID = 0x80380000
BAD_DATA_ENCODING_UNSUPPORTED = 0x80390000
BAD_MONITORING_MODE_INVALID = 0x80410000
BAD_MONITORED_ITEM_ID_INVALID = 0x80420000
BAD_MONITORED_ITEM_FILTER_INVALID = 0x80430000
BAD_MONITORED_ITEM_FILTER_UNSUPPORTED = 0x80440000
BAD_FILTER_NOT_ALLOWED = 0x80450000
BAD_EVENT_FILTER_INVALID = 0x80470000
BAD_FILTER_OPERAND_INVALID = 0x80490000
BAD_BROWSE_NAME_INVALID = 0x80600000
BAD_TYPE_DEFINITION_INVALID = 0x80630000
BAD_TOO_MANY_SUBSCRIPTIONS = 0x80770000
BAD_TOO_MANY_PUBLISH_REQUESTS = 0x80780000
BAD_NO_SUBSCRIPTION = 0x80790000
BAD_SEQUENCE_NUMBER_UNKNOWN = 0x807A0000
BAD_MESSAGE_NOT_AVAILABLE = 0x807B0000
BAD_FILTER_OPERATOR_INVALID = 0x80C10000
BAD_FILTER_OPERATOR_UNSUPPORTED = 0x80C20000
BAD_FILTER_OPERAND_COUNT_MISMATCH = 0x80C30000
BAD_TOO_MANY_MONITORED_ITEMS = 0x80DB0000
# InfoType DataValue (bit 10) with its Overflow bit (bit 7): a queue dropped a value
OVERFLOW_BITS = 0x0480

# attribute ids, monitoring modes, TimestampsToReturn, DataChangeTrigger
NODE_ID_ATTRIBUTE, EVENT_NOTIFIER, VALUE = 1, 12, 13
DISABLED, SAMPLING, REPORTING = 0, 1, 2
SOURCE, SERVER, BOTH, NEITHER = 0, 1, 2, 3
TRIGGER_STATUS, TRIGGER_STATUS_VALUE, TRIGGER_STATUS_VALUE_TIMESTAMP = 0, 1, 2

# FilterOperator (Part 4 §7.7.3)
EQUALS, IS_NULL, GREATER_THAN, LESS_THAN, GREATER_OR_EQUAL, LESS_OR_EQUAL = 0, 1, 2, 3, 4, 5
NOT, IN_LIST, AND, OR, OF_TYPE = 7, 9, 10, 11, 14
LAST_OPERATOR = 17              # BitwiseOr: the highest operator the specification defines
# operand counts of the operators served; None: two or more
_OPERANDS: dict[int, int | None] = {EQUALS: 2, IS_NULL: 1, GREATER_THAN: 2, LESS_THAN: 2,
                                    GREATER_OR_EQUAL: 2, LESS_OR_EQUAL: 2, NOT: 1,
                                    IN_LIST: None, AND: 2, OR: 2, OF_TYPE: 1}

SERVER_OBJECT = NodeId(2253)
BASE_EVENT_TYPE = NodeId(2041)
_DEFAULT_BINARY = "Default Binary"

MIN_INTERVAL_MS, MAX_INTERVAL_MS = 10.0, 3_600_000.0
DEFAULT_KEEPALIVE = 10
MAX_KEEPALIVE_MS = 600_000.0
MAX_LIFETIME_MS = 3_600_000.0
MAX_NOTIFICATIONS = 10_000
MAX_QUEUE = 10_000
DEFAULT_EVENT_QUEUE = MAX_QUEUE   # an event is shared: an entry is a reference
MAX_PUBLISH = 100
MAX_KEPT = 100
MAX_SUBSCRIPTIONS = 100         # a session's
MAX_ITEMS = 10_000              # a subscription's
MAX_OPERATIONS = 10_000         # items of one request
MAX_STATUSES = 100              # status changes a session holds for its next Publish

_HANDLE_AND_COUNT = struct.Struct("<Ii")
_HANDLE = struct.Struct("<I")
_NULL_VARIANT = b"\x00"
_NO_DIAGNOSTICS = b"\x00"


def _ext_head(type_id: int) -> bytes:
    """An ExtensionObject's bytes before its body's length: type id, binary body."""
    w = Writer()
    w.nodeid(NodeId(type_id))
    w.byte(1)
    return w.getvalue()


_DATA_CHANGE_HEAD = _ext_head(services.DATA_CHANGE_NOTIFICATION)
_EVENT_LIST_HEAD = _ext_head(services.EVENT_NOTIFICATION_LIST)
_STATUS_CHANGE_HEAD = _ext_head(services.STATUS_CHANGE_NOTIFICATION)


class Reply(Protocol):
    """The answer to one request, given by the server: ``ok`` with the response's body
    after its ResponseHeader, or ``fail`` with a ServiceFault's status. ``deadline`` is
    the loop time by which a Publish must be answered (inf when none)."""

    deadline: float

    def ok(self, body: bytes) -> None: ...

    def fail(self, status: int) -> None: ...


# ---- events


class _Encoded(dict[str | None, bytes]):
    """An event's fields as encoded Variants, each encoded the first time an item asks
    (it holds the fields, not the event: no reference cycle keeps an event alive)."""

    __slots__ = ("event_type", "fields")

    def __init__(self, fields: dict[str, Variant], event_type: NodeId) -> None:
        super().__init__()
        self.fields = fields
        self.event_type = event_type

    def __missing__(self, key: str | None) -> bytes:
        v = _variant(self.fields, self.event_type, key)
        data = _NULL_VARIANT
        if v is not None:
            w = Writer()
            try:
                w.variant(v)
                data = w.getvalue()
            except EncodeError as e:
                log.error("OPC UA event field %s cannot be encoded: %s", key, e)
        self[key] = data
        return data


class Event:
    """An event raised once and delivered to many: its fields by browse path
    ("EventId", "EventType", "SourceNode", "SourceName", "Time", "ReceiveTime",
    "Message", "Severity", "JobOrder", "Inner/Field" for a nested one: names joined
    with '/', namespaces ignored), each Variant encoded once, on first use, whatever
    the number of subscribers. "EventType" is ``event_type`` unless given."""

    __slots__ = ("encoded", "event_type", "fields", "joined")

    def __init__(self, event_type: NodeId, fields: dict[str, Variant]) -> None:
        self.event_type = event_type
        self.fields = fields
        self.encoded = _Encoded(fields, event_type)
        # the field list of each selection (by its number) some item took it with
        self.joined: dict[int, bytes] = {}

    def variant(self, key: str | None) -> Variant | None:
        """The field's Variant (None: Null)."""
        return _variant(self.fields, self.event_type, key)

    def value(self, key: str) -> Any:
        """The field's value as a where clause compares it."""
        v = self.fields.get(key)
        if v is None:
            return self.event_type if key == "EventType" else None
        return _plain(v.value)


def _variant(fields: dict[str, Variant], event_type: NodeId, key: str | None) -> Variant | None:
    if key is None:
        return None
    v = fields.get(key)
    if v is None and key == "EventType":
        return Variant(NODE_ID, event_type)
    return v


def _plain(value: Any) -> Any:
    """A value as the where clause compares it: a LocalizedText by its text, an
    ExpandedNodeId of this server by its NodeId."""
    if isinstance(value, LocalizedText):
        return value.text
    if isinstance(value, ExpandedNodeId) and value.namespace_uri is None \
            and value.server_index == 0:
        return value.node
    return value


# ---- the where clause (Part 4 §7.7), compiled to closures of an event


_Check = Callable[[Event], Any]      # True, False or None (the specification's NULL)

_NUMBER = (int, float)


def _equals(a: Any, b: Any) -> bool | None:
    if a is None or b is None:
        return None
    return bool(a == b)


def _ordered(compare: Callable[[Any, Any], bool]) -> Callable[[Any, Any], bool | None]:
    def test(a: Any, b: Any) -> bool | None:
        if a is None or b is None:
            return None
        if not (isinstance(a, _NUMBER) and isinstance(b, _NUMBER)) and type(a) is not type(b):
            return False        # no implicit conversion between these types
        try:
            return bool(compare(a, b))
        except TypeError:
            return False
    return test


_COMPARE = {GREATER_THAN: _ordered(operator.gt), LESS_THAN: _ordered(operator.lt),
            GREATER_OR_EQUAL: _ordered(operator.ge), LESS_OR_EQUAL: _ordered(operator.le)}


def _operator(op: int, args: list[_Check], space: AddressSpace, of_type: NodeId | None) -> _Check:
    """The closure of one element, its operands' closures given."""
    if op == OF_TYPE:
        assert of_type is not None
        known: dict[NodeId, bool] = {}

        def is_of_type(ev: Event) -> bool:
            t = ev.event_type
            hit = known.get(t)
            if hit is None:
                hit = known[t] = space.is_subtype(t, of_type)
            return hit
        return is_of_type
    if op == EQUALS:
        a, b = args
        return lambda ev: _equals(a(ev), b(ev))
    if op == IS_NULL:
        [a] = args
        return lambda ev: a(ev) is None
    if op in _COMPARE:
        a, b = args
        cmp = _COMPARE[op]
        return lambda ev: cmp(a(ev), b(ev))
    if op == NOT:
        [a] = args

        def negated(ev: Event) -> bool | None:
            v = a(ev)
            return not v if isinstance(v, bool) else None
        return negated
    if op == IN_LIST:
        first, rest = args[0], args[1:]

        def in_list(ev: Event) -> bool | None:
            v = first(ev)
            if v is None:
                return None
            return any(_equals(v, f(ev)) for f in rest)
        return in_list
    if op == AND:
        a, b = args

        def both(ev: Event) -> bool | None:
            x = a(ev)
            if x is False:
                return False
            y = b(ev)
            if y is False:
                return False
            return True if x is True and y is True else None
        return both
    a, b = args                         # OR

    def either(ev: Event) -> bool | None:
        x = a(ev)
        if x is True:
            return True
        y = b(ev)
        if y is True:
            return True
        return False if x is False and y is False else None
    return either


class _Operand:
    """A where clause operand as read: an element's index, a literal value or an event
    field (its key, and the event type it is restricted to)."""

    __slots__ = ("element", "key", "literal", "typed")

    def __init__(self, *, element: int = -1, literal: Any = None, key: str | None = None,
                 typed: NodeId | None = None) -> None:
        self.element = element
        self.literal = literal
        self.key = key
        self.typed = typed


def _field_key(path: list[QualifiedName]) -> str | None:
    """A browse path's field name (names joined with '/'), None when a name is empty."""
    names = [q.name for q in path]
    if not names or not all(names):
        return None
    return "/".join(names)          # type: ignore[arg-type]


def _read_simple_operand(r: Reader) -> tuple[NodeId, list[QualifiedName], int, str | None]:
    tdef = r.nodeid()
    path = [r.qualified_name() for _ in range(_count(r))]
    attribute = r.uint32()
    return tdef, path, attribute, r.string()


def _count(r: Reader) -> int:
    """An array's length (a null array is empty), bounded before anything is made."""
    at = r.pos
    n = r.length()
    if n > MAX_OPERATIONS:
        raise TooManyOperations(f"{n} entries at byte {at}: at most {MAX_OPERATIONS}", at)
    return max(n, 0)


class TooManyOperations(DecodeError, SfcHostError):
    """An array longer than a request may carry: answered BadTooManyOperations."""

    status = BAD_TOO_MANY_OPERATIONS


# ---- monitored items


class _Item:
    """What data and event items share: their identity, mode and queue."""

    __slots__ = ("attribute", "discard_oldest", "handle", "id", "mode", "node", "queue",
                 "sampling", "size", "sub")

    is_event = False

    def __init__(self, item_id: int, sub: _Subscription, node: NodeId, attribute: int,
                 mode: int, handle: int) -> None:
        self.id = item_id
        self.sub = sub
        self.node = node
        self.attribute = attribute
        self.mode = mode
        self.handle = handle
        self.sampling = 0.0
        self.size = 1
        self.discard_oldest = True
        self.queue: deque[Any] = deque()

    def resize(self, size: int, discard_oldest: bool) -> None:
        self.size = size
        self.discard_oldest = discard_oldest
        q = self.queue
        while len(q) > size:
            q.popleft()


class _DataItem(_Item):
    """An attribute's value: reported when it changes (the Value, through the address
    space's watch) or once (any other attribute: it does not change)."""

    __slots__ = ("index_range", "last", "trigger", "ttr")

    def __init__(self, item_id: int, sub: _Subscription, node: NodeId, attribute: int,
                 mode: int, handle: int) -> None:
        super().__init__(item_id, sub, node, attribute, mode, handle)
        self.ttr = BOTH
        self.trigger = TRIGGER_STATUS_VALUE
        self.index_range: tuple[int, int] | None = None
        self.last: DataValue | None = None

    def offer(self, dv: DataValue) -> None:
        if self.index_range is not None:
            dv = _ranged(dv, self.index_range)
        last = self.last
        if last is not None and dv.status == last.status:
            t = self.trigger
            if t == TRIGGER_STATUS or (dv.value == last.value and (
                    t == TRIGGER_STATUS_VALUE or dv.source_time == last.source_time)):
                return
        self.last = dv
        dv = _stamped(dv, self.ttr)
        q = self.queue
        if len(q) >= self.size:
            if self.discard_oldest:
                q.popleft()
                if q:
                    q[0] = _overflowed(q[0])
            else:
                q.pop()
                if self.size > 1:
                    dv = _overflowed(dv)
        q.append(dv)
        if self.mode == REPORTING:
            self.sub.ready[self] = None


def _overflowed(dv: DataValue) -> DataValue:
    return DataValue(dv.value, dv.status | OVERFLOW_BITS, dv.source_time, dv.server_time,
                     dv.source_pico, dv.server_pico)


def _stamped(dv: DataValue, ttr: int) -> DataValue:
    """The value with the timestamps the client asked for (the server's: now, when the
    address space gave none)."""
    if ttr == BOTH:
        if dv.server_time is not None:
            return dv
        return DataValue(dv.value, dv.status, dv.source_time, ticks_now(), dv.source_pico)
    if ttr == SOURCE:
        if dv.server_time is None:
            return dv
        return DataValue(dv.value, dv.status, dv.source_time, None, dv.source_pico)
    if ttr == SERVER:
        server = dv.server_time
        return DataValue(dv.value, dv.status, None, ticks_now() if server is None else server,
                         0, dv.server_pico)
    return DataValue(dv.value, dv.status)


_RANGE = re.compile(r"(\d+)(?::(\d+))?")


def _parse_range(text: str | None) -> tuple[int, int] | None:
    """A one-dimensional NumericRange ("3" or "2:5"); ValueError when not one."""
    if not text:
        return None
    m = _RANGE.fullmatch(text)
    if m is None:
        raise ValueError(text)
    lo = int(m.group(1))
    hi = lo if m.group(2) is None else int(m.group(2))
    if m.group(2) is not None and hi <= lo:
        raise ValueError(text)
    return lo, hi


def _ranged(dv: DataValue, rng: tuple[int, int]) -> DataValue:
    v = dv.value
    if v is None or dv.status & 0x80000000:
        return dv
    part: Any = None
    if (v.is_array and not v.dimensions) or (v.type in (STRING, BYTE_STRING)
                                             and v.value is not None):
        part = v.value[rng[0]:rng[1] + 1]
    if not part:
        return DataValue(None, BAD_INDEX_RANGE_NO_DATA, dv.source_time, dv.server_time)
    return DataValue(Variant(v.type, part), dv.status, dv.source_time, dv.server_time,
                     dv.source_pico, dv.server_pico)


_Keys = tuple[str | None, ...]


class _EventItem(_Item):
    """A notifier's events: its where clause, and its select clauses as field keys (a
    key of None: a Null field). Items that select the same keys share a selection
    number, so an event's field list is joined once for all of them."""

    __slots__ = ("by_type", "keys", "prefix", "selection", "selections", "space", "typed",
                 "where")

    is_event = True

    def __init__(self, item_id: int, sub: _Subscription, node: NodeId, mode: int,
                 handle: int, space: AddressSpace, selections: dict[_Keys, int]) -> None:
        super().__init__(item_id, sub, node, EVENT_NOTIFIER, mode, handle)
        self.space = space
        self.selections = selections
        self.keys: _Keys = ()
        self.selection = 0
        self.typed: tuple[NodeId | None, ...] | None = None
        self.by_type: dict[NodeId, tuple[_Keys, int]] = {}
        self.where: _Check | None = None
        self.prefix = b""

    def _number(self, keys: _Keys) -> int:
        n = self.selections.get(keys)
        if n is None:
            n = self.selections[keys] = len(self.selections) + 1
        return n

    def configure(self, keys: _Keys, typed: tuple[NodeId | None, ...] | None,
                  where: _Check | None) -> None:
        self.keys = keys
        self.selection = self._number(keys)
        self.typed = typed
        self.by_type = {}
        self.where = where
        self.prefix = _HANDLE_AND_COUNT.pack(self.handle, len(keys))

    def rehandle(self, handle: int) -> None:
        """A new client handle, in the queued field lists too (each keeps its count)."""
        if handle == self.handle:
            return
        self.handle = handle
        self.prefix = _HANDLE_AND_COUNT.pack(handle, len(self.keys))
        head = _HANDLE.pack(handle)
        self.queue = deque(head + e[4:] for e in self.queue)

    def take(self, ev: Event) -> None:
        where = self.where
        if where is not None and where(ev) is not True:
            return
        if self.typed is None:
            keys, selection = self.keys, self.selection
        else:
            keys, selection = self._keys_of(ev.event_type)
        joined = ev.joined.get(selection)
        if joined is None:
            joined = ev.joined[selection] = b"".join(map(ev.encoded.__getitem__, keys))
        data = self.prefix + joined
        q = self.queue
        if len(q) >= self.size:
            if self.discard_oldest:
                q.popleft()
            else:
                q.pop()
        q.append(data)
        if self.mode == REPORTING:
            self.sub.ready[self] = None

    def _keys_of(self, event_type: NodeId) -> tuple[_Keys, int]:
        """The keys for events of this type (a clause restricted to a type the event is
        not of selects Null) and their selection number."""
        found = self.by_type.get(event_type)
        if found is None:
            assert self.typed is not None
            keys = tuple(k if t is None or self.space.is_subtype(event_type, t) else None
                         for k, t in zip(self.keys, self.typed, strict=True))
            found = self.by_type[event_type] = (keys, self._number(keys))
        return found


# ---- subscriptions and sessions


class _Waiting:
    """A Publish request waiting for a notification message."""

    __slots__ = ("deadline", "done", "reply", "results", "session")

    def __init__(self, session: _Session, reply: Reply, results: list[int],
                 deadline: float) -> None:
        self.session = session
        self.reply = reply
        self.results = results
        self.deadline = deadline
        self.done = False


class _Subscription:
    """One subscription: its revised parameters, items, counters and kept messages."""

    __slots__ = ("enabled", "first", "id", "interval", "items", "keep", "keepalive", "late",
                 "life", "lifetime", "max_per", "next_at", "priority", "ready", "sent", "seq",
                 "session", "timer")

    def __init__(self, sub_id: int, session: _Session) -> None:
        self.id = sub_id
        self.session = session
        self.interval = MIN_INTERVAL_MS / 1000
        self.keepalive = DEFAULT_KEEPALIVE
        self.lifetime = 3 * DEFAULT_KEEPALIVE
        self.max_per = MAX_NOTIFICATIONS
        self.enabled = True
        self.priority = 0
        self.items: dict[int, _Item] = {}
        self.ready: dict[_Item, None] = {}     # items with queued notifications, in order
        self.sent: dict[int, bytes] = {}       # unacknowledged messages by sequence number
        self.seq = 1
        self.keep = 0
        self.life = 0
        self.first = True
        self.late = False
        self.next_at = 0.0
        self.timer: asyncio.TimerHandle | None = None

    def revise(self, interval_ms: float, lifetime: int, keepalive: int,
               per_publish: int) -> None:
        if not interval_ms >= MIN_INTERVAL_MS:          # also NaN
            interval_ms = MIN_INTERVAL_MS
        interval_ms = min(interval_ms, MAX_INTERVAL_MS)
        keepalive = min(keepalive or DEFAULT_KEEPALIVE,
                        max(1, int(MAX_KEEPALIVE_MS // interval_ms)))
        lifetime = min(max(lifetime, 3 * keepalive),
                       max(3 * keepalive, int(MAX_LIFETIME_MS // interval_ms)))
        self.interval = interval_ms / 1000
        self.keepalive = keepalive
        self.lifetime = lifetime
        self.max_per = min(per_publish or MAX_NOTIFICATIONS, MAX_NOTIFICATIONS)

    def next_seq(self) -> int:
        seq = self.seq
        self.seq = seq + 1 if seq < 0xFFFFFFFF else 1
        return seq


class _Session:
    """A session's subscriptions, its waiting Publish requests, the subscriptions that
    are late (due while no request waited) and the status changes its next Publish
    owes."""

    __slots__ = ("key", "late", "statuses", "subs", "waiting")

    def __init__(self, key: Hashable) -> None:
        self.key = key
        self.subs: dict[int, _Subscription] = {}
        self.waiting: deque[_Waiting] = deque()
        self.late: dict[_Subscription, None] = {}
        # (subscription id, message) of subscriptions that ended for want of Publish
        self.statuses: deque[tuple[int, bytes]] = deque(maxlen=MAX_STATUSES)


def _write_statuses(w: Writer, statuses: Iterable[int]) -> None:
    codes = list(statuses)
    w.length(len(codes))
    for c in codes:
        w.status(c)
    w.length(0)                     # diagnostic infos


def _message(seq: int, parts: list[tuple[bytes, bytes]]) -> bytes:
    """A NotificationMessage: its NotificationData as (ExtensionObject head, body)."""
    w = Writer()
    w.uint32(seq)
    w.datetime(ticks_now())
    w.length(len(parts))
    for head, body in parts:
        w.raw(head)
        w.int32(len(body))
        w.raw(body)
    return w.getvalue()


class Subscriptions:
    """The subscriptions of all sessions, their monitored items and Publish requests."""

    SERVICES: frozenset[int] = frozenset({
        services.CREATE_SUBSCRIPTION, MODIFY_SUBSCRIPTION, SET_PUBLISHING_MODE,
        services.DELETE_SUBSCRIPTIONS, services.CREATE_MONITORED_ITEMS, MODIFY_MONITORED_ITEMS,
        SET_MONITORING_MODE, DELETE_MONITORED_ITEMS, services.PUBLISH, REPUBLISH,
        TRANSFER_SUBSCRIPTIONS})

    def __init__(self, space: AddressSpace, loop: asyncio.AbstractEventLoop) -> None:
        self.space = space
        self._loop = loop
        self.item_made: Callable[[NodeId, int], None] | None = None
        self._sessions: dict[Hashable, _Session] = {}
        self._subs: dict[int, _Subscription] = {}
        self._sub_ids = itertools.count(1)
        self._item_ids = itertools.count(1)
        # enabled items by node: Value items by the node watched, event items by notifier
        self._values: dict[NodeId, list[_DataItem]] = {}
        self._events: dict[NodeId, list[_EventItem]] = {}
        self._selections: dict[_Keys, int] = {}     # the select keys items use, numbered
        # the address space's watch of a node, and how many Value items use it
        self._watches: dict[NodeId, tuple[Callable[[], None], int]] = {}
        # waiting Publish requests by deadline, and the one timer for the earliest
        self._deadlines: list[tuple[float, int, _Waiting]] = []
        self._order = itertools.count()
        self._deadline_timer: asyncio.TimerHandle | None = None
        self._deadline_at = math.inf
        self._compact_at = 256
        self._handlers: dict[int, Callable[[_Session, Reader, Reply], None]] = {
            services.CREATE_SUBSCRIPTION: self._create_subscription,
            MODIFY_SUBSCRIPTION: self._modify_subscription,
            SET_PUBLISHING_MODE: self._set_publishing_mode,
            services.DELETE_SUBSCRIPTIONS: self._delete_subscriptions,
            services.CREATE_MONITORED_ITEMS: self._create_monitored_items,
            MODIFY_MONITORED_ITEMS: self._modify_monitored_items,
            SET_MONITORING_MODE: self._set_monitoring_mode,
            DELETE_MONITORED_ITEMS: self._delete_monitored_items,
            services.PUBLISH: self._publish,
            REPUBLISH: self._republish,
        }

    # ---- the server's calls

    def request(self, session: Hashable, type_id: int, body: Reader, reply: Reply) -> None:
        """Read the request body of ``type_id`` and answer now or, for a Publish, later.
        A body that cannot be read raises the codec's DecodeError, nothing changed (one
        with more operations than ``MAX_OPERATIONS`` is answered BadTooManyOperations)."""
        handler = self._handlers.get(type_id)
        if handler is None:
            reply.fail(BAD_SERVICE_UNSUPPORTED)
            return
        s = self._sessions.get(session)
        if s is None:
            s = self._sessions[session] = _Session(session)
        try:
            handler(s, body, reply)
        except TooManyOperations:
            reply.fail(BAD_TOO_MANY_OPERATIONS)

    def close_session(self, session: Hashable) -> None:
        """Its subscriptions deleted, its waiting Publish requests failed BadSessionClosed."""
        s = self._sessions.pop(session, None)
        if s is None:
            return
        for sub in list(s.subs.values()):
            self._drop_subscription(sub)
        self._fail_waiting(s, BAD_SESSION_CLOSED)

    def watches_events(self, notifier: NodeId) -> bool:
        """Whether an enabled monitored item takes the events raised on ``notifier``: one
        on that notifier, or one on the Server object (which takes every event)."""
        return notifier in self._events or SERVER_OBJECT in self._events

    def watches_value(self, node_id: NodeId) -> bool:
        """Whether an enabled monitored item reports this node's Value."""
        return node_id in self._values

    def raise_event(self, notifier: NodeId, event: Event) -> None:
        """Deliver ``event`` to every enabled event item on ``notifier`` and on the Server
        object whose where clause it passes."""
        items = self._events.get(notifier)
        if items:
            for item in items:
                item.take(event)
        if notifier != SERVER_OBJECT:
            items = self._events.get(SERVER_OBJECT)
            if items:
                for item in items:
                    item.take(event)

    def close(self) -> None:
        """Every subscription deleted, every waiting Publish failed BadShutdown."""
        for key in list(self._sessions):
            s = self._sessions.pop(key)
            for sub in list(s.subs.values()):
                self._drop_subscription(sub)
            self._fail_waiting(s, BAD_SHUTDOWN)
        for unwatch, _n in self._watches.values():
            unwatch()
        self._watches.clear()
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
            self._deadline_timer = None
        self._deadlines.clear()

    # ---- subscription services

    def _create_subscription(self, s: _Session, r: Reader, reply: Reply) -> None:
        interval, lifetime, keepalive = r.double(), r.uint32(), r.uint32()
        per_publish, enabled, priority = r.uint32(), r.boolean(), r.byte()
        if len(s.subs) >= MAX_SUBSCRIPTIONS:
            reply.fail(BAD_TOO_MANY_SUBSCRIPTIONS)
            return
        sub = _Subscription(next(self._sub_ids), s)
        sub.revise(interval, lifetime, keepalive, per_publish)
        sub.enabled = enabled
        sub.priority = priority
        s.subs[sub.id] = sub
        self._subs[sub.id] = sub
        self._start_timer(sub)
        w = Writer()
        w.uint32(sub.id)
        w.double(sub.interval * 1000)
        w.uint32(sub.lifetime)
        w.uint32(sub.keepalive)
        reply.ok(w.getvalue())

    def _modify_subscription(self, s: _Session, r: Reader, reply: Reply) -> None:
        sid, interval, lifetime, keepalive = r.uint32(), r.double(), r.uint32(), r.uint32()
        per_publish, priority = r.uint32(), r.byte()
        sub = s.subs.get(sid)
        if sub is None:
            reply.fail(BAD_SUBSCRIPTION_ID_INVALID)
            return
        before = sub.interval
        sub.revise(interval, lifetime, keepalive, per_publish)
        sub.priority = priority
        if sub.interval != before:
            self._start_timer(sub)
        w = Writer()
        w.double(sub.interval * 1000)
        w.uint32(sub.lifetime)
        w.uint32(sub.keepalive)
        reply.ok(w.getvalue())

    def _set_publishing_mode(self, s: _Session, r: Reader, reply: Reply) -> None:
        enabled = r.boolean()
        ids = [r.uint32() for _ in range(_count(r))]
        if not ids:
            reply.fail(BAD_NOTHING_TO_DO)
            return
        results = []
        for sid in ids:
            sub = s.subs.get(sid)
            if sub is None:
                results.append(BAD_SUBSCRIPTION_ID_INVALID)
                continue
            sub.enabled = enabled
            results.append(GOOD)
        w = Writer()
        _write_statuses(w, results)
        reply.ok(w.getvalue())

    def _delete_subscriptions(self, s: _Session, r: Reader, reply: Reply) -> None:
        ids = [r.uint32() for _ in range(_count(r))]
        if not ids:
            reply.fail(BAD_NOTHING_TO_DO)
            return
        results = []
        for sid in ids:
            sub = s.subs.get(sid)
            if sub is None:
                results.append(BAD_SUBSCRIPTION_ID_INVALID)
                continue
            self._drop_subscription(sub)
            results.append(GOOD)
        w = Writer()
        _write_statuses(w, results)
        reply.ok(w.getvalue())
        if not s.subs and not s.statuses:
            self._fail_waiting(s, BAD_NO_SUBSCRIPTION)

    def _drop_subscription(self, sub: _Subscription) -> None:
        if sub.timer is not None:
            sub.timer.cancel()
            sub.timer = None
        for item in list(sub.items.values()):
            self._drop_item(item)
        s = sub.session
        s.subs.pop(sub.id, None)
        s.late.pop(sub, None)
        sub.late = False
        self._subs.pop(sub.id, None)

    def _fail_waiting(self, s: _Session, status: int) -> None:
        while s.waiting:
            waiting = s.waiting.popleft()
            waiting.done = True
            waiting.reply.fail(status)

    # ---- the publishing cycle (Part 4 §5.13.1)

    def _start_timer(self, sub: _Subscription) -> None:
        if sub.timer is not None:
            sub.timer.cancel()
        sub.next_at = self._loop.time() + sub.interval
        sub.timer = self._loop.call_at(sub.next_at, self._tick, sub)

    def _tick(self, sub: _Subscription) -> None:
        now = self._loop.time()
        sub.next_at += sub.interval
        if sub.next_at <= now:              # the loop was late: no burst of ticks
            sub.next_at = now + sub.interval
        sub.timer = self._loop.call_at(sub.next_at, self._tick, sub)
        s = sub.session
        if s.waiting:
            sub.life = 0
        else:
            sub.life += 1
            if sub.life >= sub.lifetime:
                self._expire(sub)
                return
        if sub.late:
            return
        if not (sub.enabled and sub.ready):
            sub.keep += 1
            if not sub.first and sub.keep < sub.keepalive:
                return
        if s.waiting:
            self._serve(sub)
            if sub.late:                    # more to send: to the other waiting requests
                self._serve_late(s)
        else:
            sub.late = True
            s.late[sub] = None

    def _serve(self, sub: _Subscription) -> None:
        """Answer the session's oldest waiting Publish with the subscription's
        notifications, or a keep-alive when it has none to send."""
        sub.first = False
        sub.keep = 0
        if not (sub.enabled and sub.ready):
            self._respond(sub.session, sub.id, sub.sent, False, _message(sub.seq, []))
            return
        parts, more = self._notifications(sub)
        seq = sub.next_seq()
        msg = _message(seq, parts)
        sub.sent[seq] = msg
        if len(sub.sent) > MAX_KEPT:
            del sub.sent[next(iter(sub.sent))]
        self._respond(sub.session, sub.id, sub.sent, more, msg)
        if more:
            sub.late = True
            sub.session.late[sub] = None

    def _notifications(self, sub: _Subscription) -> tuple[list[tuple[bytes, bytes]], bool]:
        budget = sub.max_per
        changes: list[tuple[int, DataValue]] = []
        events: list[bytes] = []
        for item in list(sub.ready):
            q = item.queue
            n = min(len(q), budget)
            if item.is_event:
                if n == len(q):
                    events.extend(q)
                    q.clear()
                else:
                    events.extend(q.popleft() for _ in range(n))
            else:
                h = item.handle
                changes.extend((h, q.popleft()) for _ in range(n))
            if not q:
                del sub.ready[item]
            budget -= n
            if budget <= 0:
                break
        parts = []
        if changes:
            w = Writer()
            w.length(len(changes))
            for handle, dv in changes:
                w.uint32(handle)
                w.data_value(dv)
            w.length(0)                     # diagnostic infos
            parts.append((_DATA_CHANGE_HEAD, w.getvalue()))
        if events:
            w = Writer()
            w.length(len(events))
            w.raw(b"".join(events))
            parts.append((_EVENT_LIST_HEAD, w.getvalue()))
        return parts, bool(sub.ready)

    def _respond(self, s: _Session, sub_id: int, available: Iterable[int], more: bool,
                 msg: bytes) -> None:
        waiting = s.waiting.popleft()
        waiting.done = True
        w = Writer()
        w.uint32(sub_id)
        seqs = list(available)
        w.length(len(seqs))
        for seq in seqs:
            w.uint32(seq)
        w.boolean(more)
        w.raw(msg)
        _write_statuses(w, waiting.results)
        waiting.reply.ok(w.getvalue())

    def _expire(self, sub: _Subscription) -> None:
        """No Publish for its lifetime: the subscription ends and says so in a
        StatusChangeNotification (BadTimeout) to the session's next Publish."""
        w = Writer()
        w.status(BAD_TIMEOUT)
        w.raw(_NO_DIAGNOSTICS)
        msg = _message(sub.next_seq(), [(_STATUS_CHANGE_HEAD, w.getvalue())])
        log.info("OPC UA subscription %d ended: no Publish for %d intervals", sub.id,
                 sub.lifetime)
        self._drop_subscription(sub)
        sub.session.statuses.append((sub.id, msg))

    def _serve_late(self, s: _Session) -> None:
        """Answer waiting Publish requests with what was due while none waited."""
        while s.waiting:
            if s.statuses:
                sid, msg = s.statuses.popleft()
                self._respond(s, sid, (), False, msg)
                continue
            if not s.late:
                break
            sub = next(iter(s.late))
            del s.late[sub]
            sub.late = False
            self._serve(sub)
        if s.waiting and not s.subs and not s.statuses:
            self._fail_waiting(s, BAD_NO_SUBSCRIPTION)

    # ---- Publish and Republish

    def _publish(self, s: _Session, r: Reader, reply: Reply) -> None:
        acks = [(r.uint32(), r.uint32()) for _ in range(_count(r))]
        results = []
        for sid, seq in acks:
            sub = s.subs.get(sid)
            if sub is None:
                results.append(BAD_SUBSCRIPTION_ID_INVALID)
            elif sub.sent.pop(seq, None) is None:
                results.append(BAD_SEQUENCE_NUMBER_UNKNOWN)
            else:
                results.append(GOOD)
        if not s.subs and not s.statuses:
            reply.fail(BAD_NO_SUBSCRIPTION)
            return
        for sub in s.subs.values():
            sub.life = 0
        deadline = getattr(reply, "deadline", math.inf)
        waiting = _Waiting(s, reply, results, deadline)
        s.waiting.append(waiting)
        if len(s.waiting) > MAX_PUBLISH:
            oldest = s.waiting.popleft()
            oldest.done = True
            oldest.reply.fail(BAD_TOO_MANY_PUBLISH_REQUESTS)
        if deadline < math.inf:
            heap = self._deadlines
            heapq.heappush(heap, (deadline, next(self._order), waiting))
            if len(heap) >= self._compact_at:
                # answered requests stay in the heap until their deadline: drop them now
                # and then, at a cost proportional to the requests pushed meanwhile
                heap[:] = [e for e in heap if not e[2].done]
                heapq.heapify(heap)
                self._compact_at = max(256, 2 * len(heap))
            if deadline < self._deadline_at:
                self._arm_deadline()
        self._serve_late(s)

    def _arm_deadline(self) -> None:
        heap = self._deadlines
        while heap and heap[0][2].done:
            heapq.heappop(heap)
        at = heap[0][0] if heap else math.inf
        if at == self._deadline_at:
            return
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
            self._deadline_timer = None
        self._deadline_at = at
        if heap:
            self._deadline_timer = self._loop.call_at(at, self._deadlines_passed)

    def _deadlines_passed(self) -> None:
        self._deadline_timer = None
        self._deadline_at = math.inf
        now = self._loop.time()
        heap = self._deadlines
        while heap and (heap[0][2].done or heap[0][0] <= now):
            waiting = heapq.heappop(heap)[2]
            if not waiting.done:
                waiting.done = True
                waiting.session.waiting.remove(waiting)
                waiting.reply.fail(BAD_TIMEOUT)
        self._arm_deadline()

    def _republish(self, s: _Session, r: Reader, reply: Reply) -> None:
        sid, seq = r.uint32(), r.uint32()
        sub = s.subs.get(sid)
        if sub is None:
            reply.fail(BAD_SUBSCRIPTION_ID_INVALID)
            return
        msg = sub.sent.get(seq)
        if msg is None:
            reply.fail(BAD_MESSAGE_NOT_AVAILABLE)
            return
        reply.ok(msg)

    # ---- monitored item services

    def _create_monitored_items(self, s: _Session, r: Reader, reply: Reply) -> None:
        sid, ttr = r.uint32(), r.uint32()
        reqs = []
        for _ in range(_count(r)):
            node, attribute, rng, encoding = r.nodeid(), r.uint32(), r.string(), \
                r.qualified_name()
            mode, handle, sampling = r.uint32(), r.uint32(), r.double()
            flt, size, discard = r.extension_object(), r.uint32(), r.boolean()
            reqs.append((node, attribute, rng, encoding, mode, handle, sampling, flt, size,
                         discard))
        sub = s.subs.get(sid)
        if sub is None:
            reply.fail(BAD_SUBSCRIPTION_ID_INVALID)
            return
        if ttr > NEITHER:
            reply.fail(BAD_TIMESTAMPS_TO_RETURN_INVALID)
            return
        if not reqs:
            reply.fail(BAD_NOTHING_TO_DO)
            return
        w = Writer()
        w.length(len(reqs))
        made: list[_Item] = []
        for req in reqs:
            status, item, result = self._make(sub, ttr, *req)
            w.status(status)
            w.uint32(item.id if item is not None else 0)
            w.double(item.sampling if item is not None else 0.0)
            w.uint32(item.size if item is not None else 0)
            w.extension_object(result)
            if item is not None:
                made.append(item)
        w.length(0)                         # diagnostic infos
        reply.ok(w.getvalue())
        if self.item_made is not None:
            for item in made:
                try:
                    self.item_made(item.node, item.attribute)
                except Exception:
                    log.exception("OPC UA: the host's item_made failed for %s", item.node)

    def _make(self, sub: _Subscription, ttr: int, node: NodeId, attribute: int,
              rng: str | None, encoding: QualifiedName, mode: int, handle: int,
              sampling: float, flt: ExtensionObject | None, size: int,
              discard: bool) -> tuple[int, _Item | None, ExtensionObject | None]:
        """One monitored item made (status Good) or refused, with its filter result."""
        if self.space.get(node) is None:
            return BAD_NODE_ID_UNKNOWN, None, None
        if mode > REPORTING:
            return BAD_MONITORING_MODE_INVALID, None, None
        if len(sub.items) >= MAX_ITEMS:
            return BAD_TOO_MANY_MONITORED_ITEMS, None, None
        current = self.space.read(node, attribute)
        if current.status in (BAD_ATTRIBUTE_ID_INVALID, BAD_NODE_ID_UNKNOWN):
            return current.status, None, None
        if encoding.name:
            if attribute != VALUE:
                return BAD_DATA_ENCODING_INVALID, None, None
            if encoding.name != _DEFAULT_BINARY or encoding.namespace != 0:
                return BAD_DATA_ENCODING_UNSUPPORTED, None, None
        item: _Item
        if attribute == EVENT_NOTIFIER:
            status, result, config = self._event_filter(flt)
            if status != GOOD:
                return status, None, result
            item = _EventItem(next(self._item_ids), sub, node, mode, handle, self.space,
                              self._selections)
            item.configure(*config)
            item.resize(_event_queue(size), discard)
        else:
            status, trigger = _data_filter(flt, attribute)
            if status != GOOD:
                return status, None, None
            try:
                index_range = _parse_range(rng)
            except ValueError:
                return BAD_INDEX_RANGE_INVALID, None, None
            item = _DataItem(next(self._item_ids), sub, node, attribute, mode, handle)
            item.trigger = trigger
            item.ttr = ttr
            item.index_range = index_range
            item.resize(_data_queue(size), discard)
            item.sampling = sampling if sampling >= 0 else sub.interval * 1000
            if attribute == VALUE:
                self._watch(node)
            result = None
        sub.items[item.id] = item
        self._index(item)
        if mode != DISABLED and isinstance(item, _DataItem):
            item.offer(current)
        return GOOD, item, result

    def _modify_monitored_items(self, s: _Session, r: Reader, reply: Reply) -> None:
        sid, ttr = r.uint32(), r.uint32()
        reqs = []
        for _ in range(_count(r)):
            item_id, handle, sampling = r.uint32(), r.uint32(), r.double()
            flt, size, discard = r.extension_object(), r.uint32(), r.boolean()
            reqs.append((item_id, handle, sampling, flt, size, discard))
        sub = s.subs.get(sid)
        if sub is None:
            reply.fail(BAD_SUBSCRIPTION_ID_INVALID)
            return
        if ttr > NEITHER:
            reply.fail(BAD_TIMESTAMPS_TO_RETURN_INVALID)
            return
        if not reqs:
            reply.fail(BAD_NOTHING_TO_DO)
            return
        w = Writer()
        w.length(len(reqs))
        for item_id, handle, sampling, flt, size, discard in reqs:
            item = sub.items.get(item_id)
            result = None
            if item is None:
                status = BAD_MONITORED_ITEM_ID_INVALID
            elif isinstance(item, _EventItem):
                status, result, config = self._event_filter(flt)
                if status == GOOD:
                    item.configure(*config)
                    item.rehandle(handle)
                    item.resize(_event_queue(size), discard)
            else:
                assert isinstance(item, _DataItem)
                status, trigger = _data_filter(flt, item.attribute)
                if status == GOOD:
                    item.trigger = trigger
                    item.ttr = ttr
                    item.handle = handle
                    item.sampling = sampling if sampling >= 0 else sub.interval * 1000
                    item.resize(_data_queue(size), discard)
            if item is not None and not item.queue:
                sub.ready.pop(item, None)
            w.status(status)
            w.double(item.sampling if item is not None else 0.0)
            w.uint32(item.size if item is not None else 0)
            w.extension_object(result)
        w.length(0)
        reply.ok(w.getvalue())

    def _set_monitoring_mode(self, s: _Session, r: Reader, reply: Reply) -> None:
        sid, mode = r.uint32(), r.uint32()
        ids = [r.uint32() for _ in range(_count(r))]
        sub = s.subs.get(sid)
        if sub is None:
            reply.fail(BAD_SUBSCRIPTION_ID_INVALID)
            return
        if mode > REPORTING:
            reply.fail(BAD_MONITORING_MODE_INVALID)
            return
        if not ids:
            reply.fail(BAD_NOTHING_TO_DO)
            return
        results = []
        for item_id in ids:
            item = sub.items.get(item_id)
            if item is None:
                results.append(BAD_MONITORED_ITEM_ID_INVALID)
                continue
            self._set_mode(item, mode)
            results.append(GOOD)
        w = Writer()
        _write_statuses(w, results)
        reply.ok(w.getvalue())

    def _set_mode(self, item: _Item, mode: int) -> None:
        before = item.mode
        if mode == before:
            return
        item.mode = mode
        self._index(item)
        sub = item.sub
        if mode == DISABLED:
            item.queue.clear()
            sub.ready.pop(item, None)
            if isinstance(item, _DataItem):
                item.last = None
            return
        if mode == SAMPLING:
            sub.ready.pop(item, None)
        elif item.queue:
            sub.ready[item] = None
        if before == DISABLED and isinstance(item, _DataItem):
            # enabled again: the value now is its first sample
            item.offer(self.space.read(item.node, item.attribute))

    def _delete_monitored_items(self, s: _Session, r: Reader, reply: Reply) -> None:
        sid = r.uint32()
        ids = [r.uint32() for _ in range(_count(r))]
        sub = s.subs.get(sid)
        if sub is None:
            reply.fail(BAD_SUBSCRIPTION_ID_INVALID)
            return
        if not ids:
            reply.fail(BAD_NOTHING_TO_DO)
            return
        results = []
        for item_id in ids:
            item = sub.items.get(item_id)
            if item is None:
                results.append(BAD_MONITORED_ITEM_ID_INVALID)
                continue
            self._drop_item(item)
            results.append(GOOD)
        w = Writer()
        _write_statuses(w, results)
        reply.ok(w.getvalue())

    def _drop_item(self, item: _Item) -> None:
        item.mode = DISABLED
        self._index(item)
        item.queue.clear()
        item.sub.ready.pop(item, None)
        item.sub.items.pop(item.id, None)
        if not item.is_event and item.attribute == VALUE:
            self._unwatch(item.node)

    # ---- the indexes the host's calls look in

    def _index(self, item: _Item) -> None:
        """The item in (or out of) the index of enabled items of its node."""
        table: dict[NodeId, list[Any]]
        if item.is_event:
            table = cast(dict[NodeId, list[Any]], self._events)
        elif item.attribute == VALUE:
            table = cast(dict[NodeId, list[Any]], self._values)
        else:
            return
        items: list[Any] | None = table.get(item.node)
        if item.mode != DISABLED:
            if items is None:
                table[item.node] = [item]
            elif item not in items:
                items.append(item)
        elif items is not None and item in items:
            items.remove(item)
            if not items:
                del table[item.node]

    def _watch(self, node: NodeId) -> None:
        entry = self._watches.get(node)
        if entry is None:
            unwatch = self.space.watch(node, lambda dv: self._changed(node, dv))
            self._watches[node] = (unwatch, 1)
        else:
            self._watches[node] = (entry[0], entry[1] + 1)

    def _unwatch(self, node: NodeId) -> None:
        entry = self._watches.get(node)
        if entry is None:
            return
        unwatch, n = entry
        if n > 1:
            self._watches[node] = (unwatch, n - 1)
            return
        del self._watches[node]
        unwatch()

    def _changed(self, node: NodeId, dv: DataValue) -> None:
        for item in self._values.get(node, ()):
            item.offer(dv)

    # ---- filters

    def _event_filter(self, flt: ExtensionObject | None) -> tuple[
            int, ExtensionObject | None,
            tuple[_Keys, tuple[NodeId | None, ...] | None, _Check | None]]:
        """An EventFilter read and checked: the item's status, the EventFilterResult (None
        when all is Good) and the item's keys, their type restrictions and where clause."""
        empty: tuple[_Keys, None, None] = ((), None, None)
        if flt is None or flt.body is None:
            return BAD_MONITORED_ITEM_FILTER_INVALID, None, empty
        kind = flt.type_id.identifier if flt.type_id.namespace == 0 else -1
        if kind in (DATA_CHANGE_FILTER, AGGREGATE_FILTER):
            return BAD_FILTER_NOT_ALLOWED, None, empty
        if kind != services.EVENT_FILTER or flt.encoding != 1:
            return BAD_MONITORED_ITEM_FILTER_UNSUPPORTED, None, empty
        r = Reader(flt.body)
        try:
            clauses = [_read_simple_operand(r) for _ in range(_count(r))]
            elements = []
            for _ in range(_count(r)):
                op = r.uint32()
                elements.append((op, [r.extension_object() for _ in range(_count(r))]))
        except DecodeError:
            return BAD_MONITORED_ITEM_FILTER_INVALID, None, empty
        keys: list[str | None] = []
        typed: list[NodeId | None] = []
        select_results = []
        for tdef, path, attribute, _rng in clauses:
            status, key, restrict = self._select(tdef, path, attribute)
            select_results.append(status)
            keys.append(key)
            typed.append(restrict)
        where, element_results, status = self._where(elements)
        if status == GOOD and GOOD not in select_results:
            status = BAD_EVENT_FILTER_INVALID       # at least one valid select clause
        bad = any(select_results) or any(code for code, _ in element_results)
        result = _event_filter_result(select_results, element_results) if bad else None
        config = (tuple(keys), tuple(typed) if any(t is not None for t in typed) else None,
                  where)
        return status, result, config

    def _select(self, tdef: NodeId, path: list[QualifiedName],
                attribute: int) -> tuple[int, str | None, NodeId | None]:
        """A select clause (or a where clause's SimpleAttributeOperand): its status, the
        field's key and the event type it is restricted to (None: any event)."""
        restrict = None if tdef.is_null or tdef == BASE_EVENT_TYPE else tdef
        if restrict is not None and restrict not in self.space:
            return BAD_TYPE_DEFINITION_INVALID, None, None
        if attribute == NODE_ID_ATTRIBUTE:
            # the ConditionId (an empty path) or a field's own node: events here are no
            # nodes of the address space, so Null
            return GOOD, None, None
        if attribute != VALUE:
            return BAD_ATTRIBUTE_ID_INVALID, None, None
        key = _field_key(path)
        if key is None:
            return BAD_BROWSE_NAME_INVALID, None, None
        return GOOD, key, restrict

    def _where(self, elements: list[tuple[int, list[ExtensionObject | None]]]) -> tuple[
            _Check | None, list[tuple[int, list[int]]], int]:
        """A ContentFilter compiled: its test (None: every event passes), each element's
        result (status, its operands' statuses) and the item's status."""
        results: list[tuple[int, list[int]]] = []
        operands: list[list[_Operand | None]] = []
        item_status = GOOD
        for i, (op, raw) in enumerate(elements):
            codes = [GOOD] * len(raw)
            parsed: list[_Operand | None] = []
            for j, obj in enumerate(raw):
                operand, code = self._operand(obj, len(elements), i)
                parsed.append(operand)
                codes[j] = code
            status = GOOD
            if op > LAST_OPERATOR:
                status = BAD_FILTER_OPERATOR_INVALID
            elif op not in _OPERANDS:
                status = BAD_FILTER_OPERATOR_UNSUPPORTED
            elif (_OPERANDS[op] is None and len(raw) < 2) or \
                    (_OPERANDS[op] is not None and len(raw) != _OPERANDS[op]):
                status = BAD_FILTER_OPERAND_COUNT_MISMATCH
            elif op == OF_TYPE and (parsed[0] is None or
                                    not isinstance(parsed[0].literal, NodeId)):
                codes[0] = BAD_FILTER_OPERAND_INVALID
            if status == GOOD and any(codes):
                status = BAD_FILTER_OPERAND_INVALID
            if status == BAD_FILTER_OPERATOR_UNSUPPORTED:
                item_status = item_status or BAD_MONITORED_ITEM_FILTER_UNSUPPORTED
            elif status != GOOD:
                item_status = BAD_MONITORED_ITEM_FILTER_INVALID
            results.append((status, codes if any(codes) else []))
            operands.append(parsed)
        if item_status != GOOD or not elements:
            return None, results, item_status
        compiled: dict[int, _Check] = {}

        def element(i: int, path: frozenset[int]) -> _Check | None:
            """Element i's test; None when it loops back to an element on the path."""
            if i in path:
                return None
            if i in compiled:
                return compiled[i]
            op = elements[i][0]
            args: list[_Check] = []
            for operand in operands[i]:
                assert operand is not None
                if operand.element >= 0:
                    sub = element(operand.element, path | {i})
                    if sub is None:
                        return None
                    args.append(sub)
                else:
                    args.append(self._value_of(operand))
            of_type = operands[i][0].literal if op == OF_TYPE else None   # type: ignore[union-attr]
            compiled[i] = test = _operator(op, args, self.space, of_type)
            return test

        test = element(0, frozenset())
        if test is None:
            results[0] = (BAD_FILTER_OPERAND_INVALID, results[0][1])
            return None, results, BAD_MONITORED_ITEM_FILTER_INVALID
        return test, results, GOOD

    def _operand(self, obj: ExtensionObject | None, count: int,
                 at: int) -> tuple[_Operand | None, int]:
        if obj is None or obj.body is None or obj.encoding != 1 or obj.type_id.namespace != 0:
            return None, BAD_FILTER_OPERAND_INVALID
        try:
            return self._read_operand(obj.type_id.identifier, Reader(obj.body), count, at)
        except DecodeError:
            return None, BAD_FILTER_OPERAND_INVALID

    def _read_operand(self, kind: Any, r: Reader, count: int,
                      at: int) -> tuple[_Operand | None, int]:
        if kind == ELEMENT_OPERAND:
            index = r.uint32()
            if index >= count or index == at:
                return None, BAD_FILTER_OPERAND_INVALID
            return _Operand(element=index), GOOD
        if kind == services.LITERAL_OPERAND:
            v = r.variant()
            return _Operand(literal=None if v is None else _plain(v.value)), GOOD
        if kind == services.SIMPLE_ATTRIBUTE_OPERAND:
            tdef, path, attribute, _rng = _read_simple_operand(r)
            status, key, restrict = self._select(tdef, path, attribute)
            if status != GOOD:
                return None, status
            return _Operand(key=key, typed=restrict), GOOD
        # an AttributeOperand names a node of the address space: events are none
        return None, BAD_FILTER_OPERAND_INVALID

    def _value_of(self, operand: _Operand) -> _Check:
        key = operand.key
        if key is None:
            literal = operand.literal
            return lambda _ev: literal
        restrict = operand.typed
        if restrict is None:
            return lambda ev: ev.value(key)
        space = self.space
        return lambda ev: ev.value(key) if space.is_subtype(ev.event_type, restrict) else None


def _event_filter_result(select: list[int],
                         elements: list[tuple[int, list[int]]]) -> ExtensionObject:
    w = Writer()
    _write_statuses(w, select)
    w.length(len(elements))
    for status, operands in elements:
        w.status(status)
        _write_statuses(w, operands)
    w.length(0)                             # element diagnostic infos
    return ExtensionObject(NodeId(EVENT_FILTER_RESULT), w.getvalue())


def _data_filter(flt: ExtensionObject | None, attribute: int) -> tuple[int, int]:
    """A data item's filter checked: (status, DataChangeTrigger)."""
    if flt is None or (flt.body is None and flt.type_id.is_null):
        return GOOD, TRIGGER_STATUS_VALUE
    kind = flt.type_id.identifier if flt.type_id.namespace == 0 else -1
    if kind == services.EVENT_FILTER:
        return BAD_FILTER_NOT_ALLOWED, 0
    if kind != DATA_CHANGE_FILTER or flt.body is None or flt.encoding != 1:
        return BAD_MONITORED_ITEM_FILTER_UNSUPPORTED, 0
    if attribute != VALUE:
        return BAD_FILTER_NOT_ALLOWED, 0
    r = Reader(flt.body)
    try:
        trigger, deadband = r.uint32(), r.uint32()
        r.double()                          # deadband value: no deadband is served
    except DecodeError:
        return BAD_MONITORED_ITEM_FILTER_INVALID, 0
    if trigger > TRIGGER_STATUS_VALUE_TIMESTAMP:
        return BAD_MONITORED_ITEM_FILTER_INVALID, 0
    if deadband != 0:
        return BAD_MONITORED_ITEM_FILTER_UNSUPPORTED, 0
    return GOOD, trigger


def _data_queue(size: int) -> int:
    return max(1, min(size, MAX_QUEUE))


def _event_queue(size: int) -> int:
    return DEFAULT_EVENT_QUEUE if size == 0 else min(size, MAX_QUEUE)
