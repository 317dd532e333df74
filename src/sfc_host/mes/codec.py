"""MES messages in and out: payload decoding, scopes and topics, reply and event
envelopes. Pure functions, no I/O.

Requests are CloudEvents (binary or structured mode). Their data is JSON (with or
without ``; charset=utf-8``) or MessagePack, decoded into the typed call of
``model``; a payload that does not fit is ``Invalid`` with the path of the fault. A job
order's limits (``check_order``) are the same for every face: the OPC UA face's calls
go through the same job control.
Replies and status events go out in binary mode on MQTT 5 as the original sends them:
``application/json; charset=utf-8``, payload format indicator 1, the request's
``correlationid`` (a UUID) as user property and as 16 bytes of CorrelationData.
"""

from __future__ import annotations

import uuid
from typing import Any, TypeVar

import msgspec

from sfc_host import isa95 as model
from sfc_host.errors import SfcHostError
from sfc_host.mqtt.cloudevents import (
    CloudEvent,
    CloudEventError,
    RawJSON,
    encode,
    encode_binary_json_plain,
    next_id,
    timestamp,
)
from sfc_host.mqtt.cloudevents import new as new_event
from sfc_host.names import check_scope

T = TypeVar("T")

JSON_UTF8 = "application/json; charset=utf-8"
_ENCODE = msgspec.json.Encoder()
_MSGPACK = msgspec.msgpack.Decoder()


class Invalid(SfcHostError):
    """A request that is a CloudEvent but not a valid job control request: answered
    with INVALID_REQUEST (or the status the original gives for it)."""

    def __init__(self, message: str, status: int = model.INVALID_REQUEST) -> None:
        super().__init__(message)
        self.status = status


def dumps(value: Any) -> bytes:
    return _ENCODE.encode(value)


# ---- payloads


def _media(content_type: str | None) -> str:
    return (content_type or "application/json").partition(";")[0].strip().lower()


def data_of(ev: CloudEvent) -> Any:
    """The request's data as builtins: JSON (already parsed by the CloudEvent decoder)
    or MessagePack."""
    media = _media(ev.datacontenttype)
    if media == "application/msgpack":
        raw = ev.data
        if raw is None or raw == b"":
            return None
        if not isinstance(raw, (bytes, bytearray)):
            raise Invalid("MessagePack data is not bytes")
        try:
            return _MSGPACK.decode(raw)
        except (msgspec.DecodeError, RecursionError) as e:
            raise Invalid(f"data is not valid MessagePack: {e}") from None
    if media == "application/json" or media.endswith("+json"):
        return ev.data
    raise Invalid(f"unsupported datacontenttype {ev.datacontenttype!r} "
                  "(application/json or application/msgpack)")


def typed(data: Any, kind: type[T]) -> T:
    """``data`` as the call type ``kind``; the original's snake_case names are taken too.
    A zero-byte payload is an empty call (every field absent)."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise Invalid("data is not an object")
    if model.has_snake_keys(data) or any(model.has_snake_keys(v) for v in data.values()):
        data = model.pascal_keys(data)
    try:
        return msgspec.convert(data, kind)
    except msgspec.ValidationError as e:
        raise Invalid(str(e).replace("`", "")) from None


# ---- what a job order may be, for every face (checked before anything is stored)
#
# - its encoded size: an order travels in each of its status events, which must stay
#   within mqtt_max_payload (a larger message is passed over by every host, and every
#   OPC UA client of every host would miss that order's events);
# - the entries of its lists together (parameters with their subparameters,
#   requirements with their properties, descriptions): at most MAX_ENTRIES;
# - its strings: an identifier (ID, JobOrderID, MaterialLotID …, Locale) at most MAX_ID
#   characters, any other string at most MAX_TEXT.

MAX_ENTRIES = 1000
MAX_ID = 256            # as a job id (names.MAX_JOB_ID)
MAX_TEXT = 65_536
# a status event's envelope and JobState beside the order: attributes, trace context
EVENT_ROOM = 4096


def check_order(order: model.JobOrderData, encoded: bytes, max_payload: int) -> None:
    """``Invalid`` naming the first limit ``order`` (encoded: ``encoded``) is over."""
    room = max_payload - EVENT_ROOM
    if len(encoded) > room:
        raise Invalid(f"the job order is {len(encoded):,} bytes encoded; its status "
                      f"events would be over mqtt_max_payload: at most {room:,} bytes")
    if len(encoded) <= MAX_ID:
        return      # too short to hold a long string or many entries
    entries = _walk(msgspec.to_builtins(order), "JobOrder")
    if entries > MAX_ENTRIES:
        raise Invalid(f"the job order has {entries:,} entries in its lists (parameters, "
                      f"requirements, properties, descriptions): at most {MAX_ENTRIES:,}")


def _walk(doc: dict[str, Any], path: str) -> int:
    """The entries of the lists in ``doc``; ``Invalid`` for a string over its limit."""
    entries = 0
    for key, v in doc.items():
        if key == "Value":
            _value(v, f"{path}.Value")
        elif isinstance(v, str):
            _text(key, v, f"{path}.{key}")
        elif isinstance(v, dict):
            entries += _walk(v, f"{path}.{key}")
        elif isinstance(v, list):
            entries += len(v)
            for i, x in enumerate(v):
                if isinstance(x, dict):
                    entries += _walk(x, f"{path}.{key}[{i}]")
                elif isinstance(x, str):
                    _text(key, x, f"{path}.{key}[{i}]")
        if entries > MAX_ENTRIES:
            break
    return entries


def _text(key: str, v: str, path: str) -> None:
    limit = MAX_ID if key.endswith("ID") or key == "Locale" else MAX_TEXT
    if len(v) > limit:
        raise Invalid(f"{path}: {len(v):,} characters, at most {limit:,}")


def _value(v: Any, path: str) -> None:
    """A parameter's or property's value: any JSON; its strings at most ``MAX_TEXT``."""
    if isinstance(v, str):
        _text("Value", v, path)
    elif isinstance(v, list):
        for i, x in enumerate(v):
            _value(x, f"{path}[{i}]")
    elif isinstance(v, dict):
        for k, x in v.items():
            _value(x, f"{path}.{k}")


# ---- scopes and topics


def scope_of(ev: CloudEvent, topic: str, prefix: str) -> str | None:
    """The request's scope: its ``subject`` up to the first ``/`` (as the original), or
    without a subject the topic levels between the prefix and ``commands`` joined by
    ``.`` (``mes/line1/cell1/commands`` -> ``line1.cell1``). None: no scope (``Invalid``
    for one that cannot name keys)."""
    subject = ev.subject
    if subject:
        scope = subject.partition("/")[0]
    else:
        head = prefix + "/"
        if not topic.startswith(head) or not topic.endswith("/commands"):
            return None
        scope = topic[len(head):-len("/commands")].replace("/", ".")
        if not scope:
            return None
    try:
        return check_scope(scope)
    except ValueError as e:
        raise Invalid(str(e)) from None


def levels(scope: str) -> str:
    """A scope as topic levels (``line1.cell1`` -> ``line1/cell1``): requests, events and
    the reply fallback; the retained topics keep the scope as one level."""
    return scope.replace(".", "/")


def request_filters(prefix: str, depth: int) -> list[str]:
    """The request topic filters: ``{prefix}/commands``, ``{prefix}/+/commands`` … with
    up to ``depth`` levels between."""
    return [prefix + "/+" * i + "/commands" for i in range(depth + 1)]


# ---- envelopes


def correlation(req: CloudEvent) -> tuple[str, bytes]:
    """The correlation id a reply and the request's status event carry, and its
    CorrelationData: the request's ``correlationid`` (its UUID's 16 bytes, as the
    original), else its CorrelationData (a UUID's bytes, or any bytes echoed as they
    came), else a new UUID as the original makes one."""
    cid = req.correlationid
    if cid:
        try:
            return cid, uuid.UUID(cid).bytes
        except ValueError:
            # not a UUID: the original fails here; echo what the client sent
            return cid, req.correlation_data if req.correlation_data else cid.encode()
    data = req.correlation_data
    if data:
        if len(data) == 16:
            return str(uuid.UUID(bytes=data)), data
        try:
            text = data.decode("ascii")
            if text.isprintable():
                return text, data
        except UnicodeDecodeError:
            pass
        return data.hex(), data
    u = uuid.uuid4()
    return str(u), u.bytes


def _with_props(ev: CloudEvent, *, v5: bool, binary: bool,
                expiry_s: int) -> tuple[bytes, Any]:
    payload, props = encode(ev, v5=v5, binary=binary)
    if props is not None:
        # UTF-8 JSON: the payload format indicator says so, as the original's does
        object.__setattr__(props, "PayloadFormatIndicator", 1)
        if expiry_s > 0:
            object.__setattr__(props, "MessageExpiryInterval", int(expiry_s))
    return payload, props


def reply(req: CloudEvent, method: str | None, source: str, body: bytes, *, v5: bool,
          binary: bool, expiry_s: int, trace: dict[str, str] | None = None
          ) -> tuple[bytes, Any]:
    """The reply to ``req``: its type, subject and correlation, ``causationid`` = its id,
    ``body`` the encoded ``{…, ReturnStatus}``; ``trace``: the attributes that carry its
    trace context on (``traceparent``, ``tracestate``)."""
    cid, cdata = correlation(req)
    ev = new_event(req.type, source, RawJSON(body), subject=req.subject,
                   datacontenttype=JSON_UTF8,
                   dataschema=model.reply_schema(method) if method else None,
                   extensions={"correlationid": cid, "causationid": req.id, **(trace or {})})
    ev.correlation_data = cdata
    return _with_props(ev, v5=v5, binary=binary, expiry_s=expiry_s)


def status_event(scope: str, order_json: bytes | None, state: str, source: str,
                 cause: CloudEvent | None, *, v5: bool, binary: bool,
                 expiry_s: int, plain: bool = True,
                 trace: dict[str, str] | None = None) -> tuple[bytes, Any]:
    """``{JobOrder, JobState}`` of one change, with the correlation of the MES request
    that caused it (none for the recipe's own Run, Complete and Abort). ``plain=False``
    builds the event even where the attributes alone would do (the tests compare)."""
    body = b'{"JobOrder":' + order_json + b',"JobState":' if order_json else \
        b'{"JobState":'
    body += model.STATE_JSON[state] + b"}"
    ext: dict[str, str] = {}
    cdata = None
    if cause is not None:
        cid, cdata = correlation(cause)
        ext = {"correlationid": cid, "causationid": cause.id}
    if trace:
        ext = {**ext, **trace}
    if binary and v5 and plain:
        # three of these a job: encoded from the attributes, no event built
        got = encode_binary_json_plain(next_id(), source, model.STATUS_EVENT, scope,
                                       timestamp(), model.STATUS_EVENT_SCHEMA, JSON_UTF8,
                                       body, ext, cdata, expiry_s=expiry_s,
                                       format_indicator=1)
        if got is not None:
            return got
    ev = new_event(model.STATUS_EVENT, source, RawJSON(body), subject=scope,
                   datacontenttype=JSON_UTF8, dataschema=model.STATUS_EVENT_SCHEMA,
                   extensions=ext)
    ev.correlation_data = cdata
    return _with_props(ev, v5=v5, binary=binary, expiry_s=expiry_s)


def metadata(source: str, *, v5: bool, binary: bool, expiry_s: int) -> tuple[bytes, Any]:
    """The retained capabilities message the original publishes at start (no type)."""
    u = uuid.uuid4()
    # a CloudEvent needs a type to be encoded here; the original's has none, and an
    # MES reads only the data, so the type names the message for our own decoders
    ev = new_event("org.opcfoundation.Machinery.Jobs.Meta.v1", source,
                   RawJSON(dumps(model.METADATA)), datacontenttype=JSON_UTF8,
                   extensions={"correlationid": str(u)})
    ev.correlation_data = u.bytes
    return _with_props(ev, v5=v5, binary=binary, expiry_s=expiry_s)


__all__ = ["CloudEventError", "Invalid", "check_order", "correlation", "data_of", "dumps", "levels",
           "metadata", "reply", "request_filters", "scope_of", "status_event", "typed"]
