"""CloudEvents 1.0 over MQTT (the CloudEvents MQTT protocol binding): encode and decode, no I/O.

Binary content mode (MQTT 5): the payload is ``data``, ``datacontenttype`` travels as the MQTT
``ContentType`` property and every other attribute as a user property. Structured mode
(``application/cloudevents+json``): the whole event is one JSON object; it is accepted everywhere
and is the only mode on MQTT 3.1.1, where it is recognised by a ``specversion`` member.

This sits on the hot path, so decoding does one pass over the user properties and one JSON parse,
and encoding builds the compiled codec's ``Properties`` (``sfc_fast.wire.mqtt5``), which packs them
into the PUBLISH packet itself. Decoding takes any object with the MQTT 5 property names as
attributes (ours, or another client's such as paho's).
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

import msgspec

from sfc_fast.wire.mqtt5 import Properties, plain_texts
from sfc_host.errors import SfcHostError
from sfc_host.times import timestamp

__all__ = ["STRUCTURED_CONTENT_TYPE", "CloudEvent", "CloudEventError", "RawJSON", "decode",
           "encode_binary", "encode_binary_json_plain", "encode_binary_plain",
           "encode_structured", "new",
           "publish_properties", "structured_properties"]

STRUCTURED_CONTENT_TYPE = "application/cloudevents+json"
MAX_ATTRIBUTE_CHARS = 1024
_REQUIRED = ("id", "source", "type")
_OPTIONAL = ("subject", "time", "datacontenttype", "dataschema")
_CORE = frozenset(("specversion", *_REQUIRED, *_OPTIONAL))
# CE 1.0: extension names are lowercase ASCII letters and digits; the spec's "should not exceed
# 20 characters" is enforced so that peers with fixed-size name tables accept ours.
_EXT_NAME = re.compile(r"[a-z0-9]{1,20}")
# CE 1.0 strings exclude controls and surrogates; MQTT receivers drop a whole packet with U+0000
# or a surrogate in a property (MQTT-1.5.4), so an event carrying one could never be answered.
_BAD_CHARS = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


class RawJSON(bytes):
    """Event data that is already JSON (UTF-8): sent as it is, not encoded again. The MES
    side builds its payloads from stored JSON this way."""


class CloudEventError(SfcHostError, ValueError):
    """An event that cannot be encoded or decoded; ``code`` is short and stable (for metrics)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(slots=True)
class CloudEvent:
    id: str
    source: str
    type: str
    specversion: str = "1.0"
    subject: str | None = None
    time: str | None = None
    datacontenttype: str | None = "application/json"
    dataschema: str | None = None
    data: Any = None  # a JSON value; bytes (or str) with a non-JSON datacontenttype
    extensions: dict[str, str] = field(default_factory=dict)
    # MQTT 5 request/response properties: they travel beside the event, not in it.
    response_topic: str | None = None
    correlation_data: bytes | None = None

    @property
    def correlationid(self) -> str | None:
        return self.extensions.get("correlationid")

    @property
    def causationid(self) -> str | None:
        return self.extensions.get("causationid")


_FIELDS = frozenset(CloudEvent.__dataclass_fields__)


class _Ids:
    """Event ids: 32 hex digits, a random half drawn once per process (and again in a
    forked child) and a counter. Unique as a random id is, without a system call for
    each event (``os.urandom`` per id was a measurable part of the MES side's cost)."""

    __slots__ = ("count", "prefix")

    def __init__(self) -> None:
        self.prefix = ""
        self.count = itertools.count()
        self.reseed()

    def reseed(self) -> None:
        self.prefix = os.urandom(8).hex()
        self.count = itertools.count(int.from_bytes(os.urandom(4), "big"))

    def __call__(self) -> str:
        return f"{self.prefix}{next(self.count) & 0xFFFF_FFFF_FFFF_FFFF:016x}"


next_id = _Ids()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=next_id.reseed)


def new(type: str, source: str, data: Any = None, **attrs: Any) -> CloudEvent:
    """A fresh event with a unique id and the current time; unknown keywords become
    extensions."""
    ext = dict(attrs.pop("extensions", None) or {})
    for name in [n for n in attrs if n not in _FIELDS]:
        ext[name] = attrs.pop(name)
    if "id" not in attrs:
        attrs["id"] = next_id()
    if "time" not in attrs:
        attrs["time"] = timestamp()
    return CloudEvent(type=type, source=source, data=data, extensions=ext, **attrs)


# ---------------------------------------------------------------------------------------------
# Shared checks


def _value(name: str, value: object, *, required: bool = False, empty: bool = False) -> Any:
    """A valid attribute string (or None when absent and optional)."""
    if value is None:
        if required:
            raise CloudEventError("missing_attribute", f"required attribute {name!r} is missing")
        return None
    if type(value) is not str or (not value and not empty):
        kind = "a string" if empty else "a non-empty string"
        raise CloudEventError("bad_attribute", f"attribute {name!r} must be {kind}")
    if len(value) > MAX_ATTRIBUTE_CHARS:
        raise CloudEventError("bad_attribute",
                              f"attribute {name!r} is longer than {MAX_ATTRIBUTE_CHARS}")
    if not (value.isascii() and value.isprintable()) and _BAD_CHARS.search(value):
        raise CloudEventError("bad_attribute",
                              f"attribute {name!r} has control or surrogate characters")
    return value


_GOOD_NAMES: set[str] = set()  # names seen valid: a product uses a handful, skip the regex


def _ext_name(name: object) -> str:
    if name in _GOOD_NAMES:
        return name  # type: ignore[return-value]
    if type(name) is not str or name == "data" or not _EXT_NAME.fullmatch(name):
        raise CloudEventError("bad_attribute", f"invalid attribute name {str(name)[:40]!r}")
    if len(_GOOD_NAMES) < 256:
        _GOOD_NAMES.add(name)
    return name


def _is_json(content_type: str | None) -> bool:
    if content_type is None or content_type == "application/json":
        return True
    media = content_type.partition(";")[0].strip().lower()
    return media in ("application/json", "text/json") or media.endswith("+json")


# msgspec (already the MES payloads' codec) is several times faster than json for the
# small documents of every command and answer; json stays the judge of what msgspec
# refuses or would write differently (NaN), so what is accepted and refused is unchanged
_FAST_ENCODE = msgspec.json.Encoder().encode
_FAST_DECODE = msgspec.json.Decoder().decode
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def _dumps(value: Any) -> bytes:
    try:
        out = _FAST_ENCODE(value)
        # msgspec writes NaN and infinities as null: json's refusal decides then
        if b"null" not in out:
            return out
    except (TypeError, ValueError, OverflowError, RecursionError):
        pass        # json words the error: the same text whichever encoder ran
    try:
        return _ENCODER.encode(value).encode()
    except (TypeError, ValueError, RecursionError) as e:  # UnicodeEncodeError is a ValueError
        raise CloudEventError("bad_data", f"data is not JSON-serialisable: {e}") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_DECODER = json.JSONDecoder(parse_constant=_no_constant)


def _parse(payload: bytes, code: str) -> Any:
    try:  # strict UTF-8: json.loads(bytes) would also guess UTF-16/32
        text = str(payload, "utf-8")
    except UnicodeDecodeError:
        raise CloudEventError("not_utf8", "payload is not valid UTF-8") from None
    try:
        return _FAST_DECODE(text)
    except (msgspec.DecodeError, RecursionError):
        pass        # json decides, and words the error the same either way
    try:
        return _DECODER.decode(text)
    except RecursionError:
        raise CloudEventError("too_deep", "payload JSON is nested too deeply") from None
    except ValueError as e:
        raise CloudEventError(code, f"payload is not valid JSON: {e}") from None


# ---------------------------------------------------------------------------------------------
# Encoding


def _check(ev: CloudEvent) -> None:
    # the usual event (plain ASCII attributes) in one compiled pass; anything else is
    # checked attribute by attribute below, which also says what is wrong
    ext = ev.extensions
    if (ev.specversion == "1.0" and ev.id and ev.source and ev.type
            and plain_texts((ev.id, ev.source, ev.type, ev.subject, ev.time,
                             ev.datacontenttype, ev.dataschema, ev.response_topic))
            and (not ext or (_GOOD_NAMES.issuperset(ext)
                             and plain_texts(ext.values(), False)))):
        return
    if ev.specversion != "1.0":
        raise CloudEventError("bad_specversion",
                              f"specversion must be '1.0', not {ev.specversion!r}")
    for name in _REQUIRED:
        _value(name, getattr(ev, name), required=True)
    for name in _OPTIONAL:
        _value(name, getattr(ev, name))
    _value("response_topic", ev.response_topic)
    for name, value in ev.extensions.items():
        if name in _CORE:
            raise CloudEventError("bad_attribute", f"extension {name!r} is a core attribute")
        _value(_ext_name(name), value, empty=True)


def publish_properties(*, content_type: str | None = None,
                       expiry_s: int | None = None) -> Properties:
    """Fixed PUBLISH properties (content type, message expiry), packed once."""
    return Properties(ContentType=content_type, MessageExpiryInterval=expiry_s).freeze()


def _properties(ev: CloudEvent, content_type: str | None, user: list[tuple[str, str]] | None,
                expiry_s: int | None) -> Properties:
    if expiry_s is not None and not 0 <= expiry_s <= 0xFFFFFFFF:
        raise CloudEventError("bad_expiry", f"expiry {expiry_s} s is out of the MQTT range")
    cd = ev.correlation_data
    return Properties(ContentType=content_type, ResponseTopic=ev.response_topic,
                      CorrelationData=None if cd is None else bytes(cd),
                      MessageExpiryInterval=expiry_s, UserProperty=user)


def encode_binary(ev: CloudEvent, *, expiry_s: int | None = None) -> tuple[bytes, Properties]:
    """Payload and MQTT 5 properties of ``ev`` in binary content mode."""
    _check(ev)
    data = ev.data
    if _is_json(ev.datacontenttype):
        if isinstance(data, RawJSON):
            payload = bytes(data)
        elif isinstance(data, (bytes, bytearray)):
            raise CloudEventError("bad_data", "bytes data need a non-JSON datacontenttype")
        else:
            payload = b"" if data is None else _dumps(data)
    elif data is None or isinstance(data, (bytes, bytearray)):
        payload = bytes(data or b"")
    elif isinstance(data, str):
        try:
            payload = data.encode()
        except UnicodeEncodeError:
            raise CloudEventError("bad_data", "data is not valid Unicode") from None
    else:
        raise CloudEventError("bad_data", "non-JSON datacontenttype needs bytes or str data")
    user = _user_properties(ev.id, ev.source, ev.type, ev.subject, ev.time, ev.dataschema,
                            ev.extensions)
    return payload, _properties(ev, ev.datacontenttype, user, expiry_s)


def _user_properties(id: str, source: str, type: str, subject: str | None, time: str | None,
                     dataschema: str | None, extensions: dict[str, str]
                     ) -> list[tuple[str, str]]:
    """The attributes as binary mode's user properties, in their order on the wire."""
    user = [("specversion", "1.0"), ("id", id), ("source", source), ("type", type)]
    if subject is not None:
        user.append(("subject", subject))
    if time is not None:
        user.append(("time", time))
    if dataschema is not None:
        user.append(("dataschema", dataschema))
    user.extend(extensions.items())
    return user


def _plain_properties(id: str, source: str, type: str, subject: str | None,
                      time: str | None, dataschema: str | None, content_type: str,
                      extensions: dict[str, str], response_topic: str | None,
                      correlation_data: bytes | None, format_indicator: int | None,
                      expiry_s: int) -> Properties | None:
    """Binary mode's properties of the event these attributes make, without building
    the event; None when an attribute is not plain printable ASCII, an extension's name
    was not seen valid before or the expiry (0: none) is out of the MQTT range: then the
    caller builds the event, whose checks also say what is wrong."""
    if not (id and source and type
            and plain_texts((id, source, type, subject, time, content_type, dataschema,
                             response_topic))
            and _GOOD_NAMES.issuperset(extensions)
            and plain_texts(extensions.values(), False)
            and 0 <= expiry_s <= 0xFFFFFFFF):
        return None
    return Properties(ContentType=content_type, ResponseTopic=response_topic,
                      CorrelationData=correlation_data,
                      PayloadFormatIndicator=format_indicator,
                      MessageExpiryInterval=expiry_s or None,
                      UserProperty=_user_properties(id, source, type, subject, time,
                                                    dataschema, extensions))


def encode_binary_plain(id: str, source: str, type: str, subject: str | None, data: Any,
                        extensions: dict[str, str], response_topic: str | None,
                        correlation_data: bytes | None) -> tuple[bytes, Properties] | None:
    """``encode_binary`` of the event these attributes make (JSON ``data``, the default
    content type, no time, no dataschema), without building the event: the host's
    commands take this path. None where ``_plain_properties`` says so, or when the data
    is not a dict: then build the event and call ``encode_binary``. Where both encode,
    they write the same bytes (tests/mqtt/test_cloudevents.py)."""
    if data.__class__ is not dict:
        return None
    props = _plain_properties(id, source, type, subject, None, None, "application/json",
                              extensions, response_topic, correlation_data, None, 0)
    return None if props is None else (_dumps(data), props)


def encode_binary_json_plain(id: str, source: str, type: str, subject: str | None,
                             time: str | None, dataschema: str | None, content_type: str,
                             body: bytes, extensions: dict[str, str],
                             correlation_data: bytes | None, *, expiry_s: int = 0,
                             format_indicator: int | None = None
                             ) -> tuple[bytes, Properties] | None:
    """``encode_binary`` of the event these attributes make with ``body`` as its encoded
    JSON data (``RawJSON``), and the MQTT 5 payload format indicator and message
    expiry (``expiry_s`` > 0) set, without building the event: the MES status events
    take this path. None where ``_plain_properties`` says so. Where both encode, they
    write the same bytes (tests/mqtt/test_cloudevents.py)."""
    props = _plain_properties(id, source, type, subject, time, dataschema, content_type,
                              extensions, None, correlation_data, format_indicator,
                              expiry_s)
    return None if props is None else (bytes(body), props)


def encode_structured(ev: CloudEvent) -> bytes:
    """``ev`` as one ``application/cloudevents+json`` object (MQTT 3.1.1, or 5 by choice)."""
    _check(ev)
    obj: dict[str, Any] = {"specversion": "1.0", "id": ev.id, "source": ev.source,
                           "type": ev.type}
    for name in _OPTIONAL:
        value = getattr(ev, name)
        if value is not None:
            obj[name] = value
    obj.update(ev.extensions)
    data = ev.data
    if isinstance(data, RawJSON):
        data = _parse(data, "bad_data")   # structured mode embeds it: rare (MQTT 3.1.1)
    if isinstance(data, (bytes, bytearray)):
        if _is_json(ev.datacontenttype):
            raise CloudEventError("bad_data", "bytes data need a non-JSON datacontenttype")
        obj["data_base64"] = base64.b64encode(data).decode("ascii")
    elif data is not None:
        if not (isinstance(data, str) or _is_json(ev.datacontenttype)):
            raise CloudEventError("bad_data", "non-JSON datacontenttype needs bytes or str data")
        obj["data"] = data
    return _dumps(obj)


def structured_properties(ev: CloudEvent, *, expiry_s: int | None = None) -> Properties:
    """MQTT 5 properties to send ``encode_structured(ev)`` with."""
    return _properties(ev, STRUCTURED_CONTENT_TYPE, None, expiry_s)


def encode(ev: CloudEvent, *, v5: bool, binary: bool) -> tuple[bytes, Properties | None]:
    """Payload and properties in the mode a connection sends: binary on MQTT 5 unless
    ``binary`` is off (the ``mqtt_binary`` setting), structured otherwise; on MQTT 3.1.1
    no properties at all."""
    if v5 and binary:
        return encode_binary(ev)
    if v5:
        return encode_structured(ev), structured_properties(ev)
    return encode_structured(ev), None


# ---------------------------------------------------------------------------------------------
# Decoding


def _user_attributes(user: object) -> dict[str, Any]:
    """Name -> value; names and values are type-checked later, per attribute."""
    if not user:
        return {}
    try:
        attrs = dict(user)  # type: ignore[call-overload]
        if len(attrs) == len(user):  # type: ignore[arg-type]
            return attrs
    except (TypeError, ValueError):
        raise CloudEventError("bad_attribute", "user properties are not a list of pairs") from None
    # MQTT allows a name more than once; an attribute with two values is ambiguous.
    raise CloudEventError("bad_attribute", "an attribute is given twice in the user properties")


def _event(attrs: dict[str, Any], data: Any, response_topic: Any,
           correlation_data: Any) -> CloudEvent:
    """The event of ``attrs`` (consumed): core attributes checked, the rest extensions."""
    specversion = attrs.pop("specversion", None)
    if specversion != "1.0":
        if specversion is None:
            raise CloudEventError("missing_attribute",
                                  "required attribute 'specversion' is missing")
        shown = repr(specversion[:20]) if type(specversion) is str else "a non-string"
        raise CloudEventError("bad_specversion", f"specversion must be '1.0', not {shown}")
    pop = attrs.pop
    id_, source, type_ = pop("id", None), pop("source", None), pop("type", None)
    subject, time, schema = pop("subject", None), pop("time", None), pop("dataschema", None)
    content_type = pop("datacontenttype", None)
    # the usual event (plain ASCII attributes, known extension names) in one compiled
    # pass; anything else attribute by attribute, which also says what is wrong
    if not (id_ and source and type_
            and plain_texts((id_, source, type_, subject, time, content_type, schema))):
        id_ = _value("id", id_, required=True)
        source = _value("source", source, required=True)
        type_ = _value("type", type_, required=True)
        subject = _value("subject", subject)
        time = _value("time", time)
        content_type = _value("datacontenttype", content_type)
        schema = _value("dataschema", schema)
    ext: dict[str, str] = {}
    if _GOOD_NAMES.issuperset(attrs) and plain_texts(attrs.values(), False):
        ext, attrs = attrs, {}
    for name, value in attrs.items():
        if value is None:  # JSON null: absent
            continue
        if type(value) is not str:
            # Structured mode: CE integers and booleans have a canonical string form.
            if value is True or value is False:
                value = "true" if value else "false"
            elif isinstance(value, (int, float)):
                value = str(value)
        name = _ext_name(name)
        ext[name] = _value(name, value, empty=True)
    if response_topic is not None and (type(response_topic) is not str or not response_topic):
        raise CloudEventError("bad_attribute", "ResponseTopic must be a non-empty string")
    if correlation_data is not None:
        if not isinstance(correlation_data, (bytes, bytearray)):
            raise CloudEventError("bad_attribute", "CorrelationData must be bytes")
        correlation_data = bytes(correlation_data)
    return CloudEvent(id_, source, type_, "1.0", subject, time, content_type, schema, data, ext,
                      response_topic, correlation_data)


def _structured(obj: Any, response_topic: Any, correlation_data: Any) -> CloudEvent:
    if type(obj) is not dict:
        raise CloudEventError("not_an_object", "a structured event must be a JSON object")
    data = obj.pop("data", None)
    encoded = obj.pop("data_base64", None)
    if encoded is not None:
        if data is not None:
            raise CloudEventError("bad_data", "both 'data' and 'data_base64' given")
        if type(encoded) is not str:
            raise CloudEventError("bad_data", "'data_base64' must be a string")
        try:
            data = base64.b64decode(encoded, validate=True)
        except ValueError:  # binascii.Error, or non-ASCII text
            raise CloudEventError("bad_data", "'data_base64' is not valid base64") from None
    return _event(obj, data, response_topic, correlation_data)


def decode(payload: bytes, properties: Properties | None = None, *,
           max_bytes: int = 1 << 20) -> CloudEvent:
    """The event in an MQTT message (either content mode); only ``CloudEventError`` is raised."""
    if len(payload) > max_bytes:
        raise CloudEventError("too_large", f"payload of {len(payload)} bytes exceeds {max_bytes}")
    content_type = user = response_topic = correlation_data = None
    if properties is not None:
        content_type = getattr(properties, "ContentType", None)
        user = getattr(properties, "UserProperty", None)
        response_topic = getattr(properties, "ResponseTopic", None)
        correlation_data = getattr(properties, "CorrelationData", None)
        if content_type is not None and type(content_type) is not str:
            raise CloudEventError("bad_attribute", "ContentType must be a string")
    if content_type is not None and content_type[:23].lower() == "application/cloudevents":
        if not content_type.partition(";")[0].strip().lower().endswith("json"):
            raise CloudEventError("unsupported_format",
                                  f"unsupported event format {content_type[:60]!r}")
        return _structured(_parse(payload, "not_json"), response_topic, correlation_data)
    attrs = _user_attributes(user)
    if not ("specversion" in attrs or "id" in attrs or "source" in attrs or "type" in attrs):
        # Nothing marks binary mode: a structured event without a content type (MQTT 3.1.1).
        if payload and _is_json(content_type):
            obj = _parse(payload, "not_json")
            if type(obj) is dict and "specversion" in obj:
                return _structured(obj, response_topic, correlation_data)
        raise CloudEventError("missing_attribute",
                              "no CloudEvents attributes in the user properties or payload")
    # Binary mode. ContentType is where the binding puts datacontenttype; a user property of that
    # name (some clients send one) only counts when ContentType is absent.
    fallback = attrs.pop("datacontenttype", None)
    if content_type is None:
        content_type = _value("datacontenttype", fallback)
    attrs["datacontenttype"] = content_type
    data: Any = None
    if payload:
        data = _parse(payload, "bad_data") if _is_json(content_type) else bytes(payload)
    return _event(attrs, data, response_topic, correlation_data)
