"""CloudEvents over MQTT: round trips in both content modes, hand-written messages, every
refusal with its code, and fuzzing (only CloudEventError may ever come out of decode)."""

from __future__ import annotations

import base64
import dataclasses
import json
import re
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from sfc_host.mqtt.cloudevents import (
    STRUCTURED_CONTENT_TYPE,
    CloudEvent,
    CloudEventError,
    decode,
    encode_binary,
    encode_structured,
    new,
    structured_properties,
)

JOB_TYPE = "org.opcfoundation.ISA95-JOBCONTROL_V2.Start.v2"


def props(content_type: str | None = None, user: list | None = None, *,
          response_topic: str | None = None, correlation_data: bytes | None = None) -> Properties:
    """Properties built with paho's own setters, the way another MQTT client builds them."""
    p = Properties(PacketTypes.PUBLISH)
    if content_type is not None:
        p.ContentType = content_type
    if user:
        p.UserProperty = user
    if response_topic is not None:
        p.ResponseTopic = response_topic
    if correlation_data is not None:
        p.CorrelationData = correlation_data
    return p


def wire(p: Properties) -> Properties:
    """What the receiver sees: the properties packed and parsed again by paho."""
    received = Properties(PacketTypes.PUBLISH)
    received.unpack(p.pack())
    return received


def full_event(**kw: Any) -> CloudEvent:
    attrs: dict[str, Any] = dict(
        id="job1:dose#3", source="/sfc-host/line1", type="com.example.Dose", subject="line1",
        time="2026-05-09T07:35:25.123Z", dataschema="https://example.com/dose.json",
        data={"Amount": 12.5, "Unit": "kg", "Tags": ["a", None, True], "Ümlaut": "ß"},
        extensions={"correlationid": "job1", "causationid": "req-7", "method": "PUT"},
        response_topic="equipment/line1/responses", correlation_data=b"job1:dose#3")
    attrs.update(kw)
    return CloudEvent(**attrs)


# ---------------------------------------------------------------------------------------------
# Round trips


def test_binary_round_trip_with_all_attributes_and_mqtt_properties() -> None:
    ev = full_event()
    payload, p = encode_binary(ev, expiry_s=172800)
    assert json.loads(payload) == ev.data  # payload is data alone
    got = wire(p)
    assert got.ContentType == "application/json"
    assert got.ResponseTopic == "equipment/line1/responses"
    assert got.CorrelationData == b"job1:dose#3"
    assert got.MessageExpiryInterval == 172800
    assert dict(got.UserProperty) == {
        "specversion": "1.0", "id": "job1:dose#3", "source": "/sfc-host/line1",
        "type": "com.example.Dose", "subject": "line1", "time": "2026-05-09T07:35:25.123Z",
        "dataschema": "https://example.com/dose.json", "correlationid": "job1",
        "causationid": "req-7", "method": "PUT"}
    back = decode(payload, got)
    assert back == ev
    assert (back.correlationid, back.causationid) == ("job1", "req-7")


def test_our_properties_pack_as_paho_setters_build_them() -> None:
    """Our codec's packing (``sfc_fast.wire.mqtt5``) is byte for byte another client's."""
    ev = full_event()
    _, p = encode_binary(ev, expiry_s=60)
    slow = props("application/json", list(p.UserProperty), response_topic=ev.response_topic,
                 correlation_data=ev.correlation_data)
    slow.MessageExpiryInterval = 60
    assert p.pack() == slow.pack()
    assert encode_binary(CloudEvent("i", "s", "t"))[1].MessageExpiryInterval is None


def test_structured_round_trip() -> None:
    ev = full_event(response_topic=None, correlation_data=None)
    body = encode_structured(ev)
    obj = json.loads(body)
    assert obj["data"] == ev.data and obj["specversion"] == "1.0" and obj["method"] == "PUT"
    assert b", " not in body and b": " not in body  # compact
    assert decode(body) == ev  # MQTT 3.1.1: no properties at all
    ev = full_event()
    p = wire(structured_properties(ev, expiry_s=5))
    assert (p.ContentType, p.MessageExpiryInterval) == (STRUCTURED_CONTENT_TYPE, 5)
    assert not hasattr(p, "UserProperty")
    assert decode(encode_structured(ev), p) == ev


def test_non_json_data_is_raw_in_binary_and_base64_in_structured() -> None:
    blob = bytes(range(256))
    ev = CloudEvent("i", "s", "t", datacontenttype="application/octet-stream", data=blob)
    payload, p = encode_binary(ev)
    assert payload == blob and decode(payload, wire(p)) == ev
    body = encode_structured(ev)
    assert json.loads(body)["data_base64"] == base64.b64encode(blob).decode()
    assert decode(body) == ev
    # Text data: a string inside a structured event, UTF-8 bytes as a binary payload.
    ev = CloudEvent("i", "s", "t", datacontenttype="text/plain; charset=utf-8", data="grüß")
    assert decode(encode_structured(ev)) == ev
    payload, p = encode_binary(ev)
    assert payload == "grüß".encode() and decode(payload, wire(p)).data == payload


def test_empty_data() -> None:
    ev = CloudEvent("i", "s", "t")
    payload, p = encode_binary(ev)
    assert payload == b"" and decode(payload, wire(p)) == ev
    assert "data" not in json.loads(encode_structured(ev))
    assert decode(encode_structured(ev)) == ev


def test_new_fills_id_and_time() -> None:
    ev = new("com.example.T", "/src", {"a": 1}, subject="s1", correlationid="job1",
             response_topic="r/t")
    assert re.fullmatch(r"[0-9a-f]{32}", ev.id) and ev.id != new("t", "s").id
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", ev.time or "")
    assert (ev.type, ev.source, ev.data, ev.subject) == ("com.example.T", "/src", {"a": 1}, "s1")
    assert ev.extensions == {"correlationid": "job1"} and ev.response_topic == "r/t"
    assert ev.causationid is None
    ev = new("t", "s", id="x", time="2026-01-01T00:00:00Z", extensions={"method": "DELETE"})
    assert (ev.id, ev.time, ev.extensions) == ("x", "2026-01-01T00:00:00Z", {"method": "DELETE"})


def test_new_ids_stay_unique_across_processes_and_forks() -> None:
    # ids are a per-process random half and a counter: two processes, or a parent and
    # its forked child, never hand out the same one
    ids = {new("t", "s").id for _ in range(20_000)}
    assert len(ids) == 20_000
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in list(ids)[:100])
    script = ("import os, sys\n"
              "from sfc_host.mqtt.cloudevents import new\n"
              "mine = [new('t', 's').id for _ in range(1000)]\n"
              "r, w = os.pipe()\n"
              "pid = os.fork()\n"
              "if pid == 0:\n"
              "    os.write(w, ' '.join(new('t', 's').id for _ in range(1000)).encode())\n"
              "    os._exit(0)\n"
              "os.waitpid(pid, 0)\n"
              "child = os.read(r, 1 << 20).decode().split()\n"
              "print(' '.join(mine + child + [new('t', 's').id for _ in range(1000)]))\n")
    outs = [subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           check=True).stdout.split() for _ in range(2)]
    every = [i for out in outs for i in out] + list(ids)
    assert len(outs[0]) == len(outs[1]) == 3000
    assert len(set(every)) == len(every)


def test_timestamps_follow_the_clock_across_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    import sfc_host.times as ce
    t = [1_767_225_599.9985]     # 2025-12-31T23:59:59.998Z, then past midnight
    monkeypatch.setattr(ce._time, "time", lambda: t[0])
    assert ce.timestamp() == "2025-12-31T23:59:59.998Z"
    t[0] = 1_767_225_600.0415
    assert ce.timestamp() == "2026-01-01T00:00:00.041Z"
    t[0] = 1_767_225_600.9005
    assert ce.timestamp() == "2026-01-01T00:00:00.900Z"
    t[0] = 1_767_225_599.5      # the clock stepped back: formatted anew, never stale
    assert ce.timestamp() == "2025-12-31T23:59:59.500Z"


# ---------------------------------------------------------------------------------------------
# Messages as other clients send them


def test_hand_typed_structured_event_on_mqtt311() -> None:
    body = b"""{
        "specversion" : "1.0",
        "type" : "org.opcfoundation.ISA95-JOBCONTROL_V2.Start.v2",
        "source" : "mes-client",
        "id" : "A234-1234-1234",
        "time" : "2026-04-05T17:31:00Z",
        "correlationid" : "corr-1",
        "retries" : 3,
        "urgent" : true,
        "comment" : null,
        "subject" : null,
        "data" : {"JobOrderID": "J-1", "Comment": "go"}
    }"""
    ev = decode(body)
    assert (ev.id, ev.type, ev.source, ev.time) == (
        "A234-1234-1234", JOB_TYPE, "mes-client", "2026-04-05T17:31:00Z")
    assert ev.extensions == {"correlationid": "corr-1", "retries": "3", "urgent": "true"}
    assert ev.subject is None and ev.datacontenttype is None
    assert ev.data == {"JobOrderID": "J-1", "Comment": "go"}


def test_structured_event_with_content_type_on_mqtt5() -> None:
    body = b'{"specversion":"1.0","id":"1","source":"s","type":"t","data":[1,2]}'
    p = wire(props("application/cloudevents+json; charset=utf-8", response_topic="mes/s/r",
                   correlation_data=b"\x00\x01"))
    ev = decode(body, p)
    assert (ev.data, ev.response_topic, ev.correlation_data) == ([1, 2], "mes/s/r", b"\x00\x01")
    # User properties do not matter in structured mode.
    assert decode(body, wire(props(STRUCTURED_CONTENT_TYPE, [("x", "y")]))).data == [1, 2]


def test_binary_answer_as_an_equipment_client_sends_it() -> None:
    # mosquitto_pub -V 5 -D publish content-type application/json
    #   -D publish user-property specversion 1.0 ... -D publish correlation-data job1:a#3
    p = wire(props("application/json", [
        ("specversion", "1.0"), ("id", "e-77"), ("source", "/plc/7"),
        ("type", "com.example.DoseDone"), ("subject", "line1"),
        ("causationid", "job1:dose#3"), ("correlationid", "job1")],
        correlation_data=b"job1:dose#3"))
    ev = decode(b'{"Outcome":"completed","Result":{"Weight":12.5}}', p)
    assert ev.data == {"Outcome": "completed", "Result": {"Weight": 12.5}}
    assert (ev.causationid, ev.correlationid, ev.subject) == ("job1:dose#3", "job1", "line1")
    assert (ev.correlation_data, ev.datacontenttype) == (b"job1:dose#3", "application/json")


def test_binary_content_type_variants() -> None:
    user = [("specversion", "1.0"), ("id", "1"), ("source", "s"), ("type", "t")]
    ev = decode(b'{"a":1}', wire(props(None, user)))  # no ContentType: JSON
    assert (ev.data, ev.datacontenttype) == ({"a": 1}, None)
    ev = decode(b'"x"', wire(props(None, [*user, ("datacontenttype", "text/json")])))
    assert (ev.data, ev.datacontenttype) == ("x", "text/json")  # user property as fallback
    assert decode(b'{"a":1}', wire(props("application/vnd.acme+json", user))).data == {"a": 1}
    ev = decode(b"\xff\x00raw", wire(props("application/octet-stream", user)))
    assert ev.data == b"\xff\x00raw"
    assert decode(b"", wire(props("application/json", user))).data is None
    assert decode(b"", wire(props("text/plain", user))).data is None


# ---------------------------------------------------------------------------------------------
# Refusals

CE = [("specversion", "1.0"), ("id", "1"), ("source", "s"), ("type", "t")]
S = STRUCTURED_CONTENT_TYPE


def structured(**kw: Any) -> bytes:
    obj: dict[str, Any] = {"specversion": "1.0", "id": "1", "source": "s", "type": "t"}
    obj.update(kw)
    return json.dumps(obj).encode()


REFUSALS: list[tuple[str, bytes, Properties | None, str]] = [
    ("structured not JSON", b"{oops", props(S), "not_json"),
    ("NaN is not JSON", structured()[:-1] + b',"x":NaN}', None, "not_json"),
    ("invalid UTF-8", b'{"id":"\xff"}', props(S), "not_utf8"),
    ("UTF-16 is not UTF-8", structured().decode().encode("utf-16"), props(S), "not_utf8"),
    ("array", b"[1]", props(S), "not_an_object"),
    ("batch", b"[]", props("application/cloudevents-batch+json"), "not_an_object"),
    ("other format", b"\x00", props("application/cloudevents+avro"), "unsupported_format"),
    ("plain JSON, no CE", b'{"JobOrderID":"J"}', None, "missing_attribute"),
    ("nothing", b"", None, "missing_attribute"),
    ("text without CE", b"hello", props("text/plain"), "missing_attribute"),
    ("no id", json.dumps({"specversion": "1.0", "source": "s", "type": "t"}).encode(), None,
     "missing_attribute"),
    ("null type", structured(type=None), None, "missing_attribute"),
    ("binary no specversion", b"{}", props(None, CE[1:]), "missing_attribute"),
    ("binary no source", b"{}", props(None, [CE[0], CE[1], CE[3]]), "missing_attribute"),
    ("empty id", structured(id=""), None, "bad_attribute"),
    ("numeric id", structured(id=7), None, "bad_attribute"),
    ("long source", structured(source="s" * 1025), None, "bad_attribute"),
    ("empty subject", structured(subject=""), None, "bad_attribute"),
    ("object time", structured(time={}), None, "bad_attribute"),
    ("lone surrogate", structured(id="\ud800"), None, "bad_attribute"),
    ("NUL in subject", structured(subject="a\x00"), None, "bad_attribute"),
    ("newline in extension", structured(method="PUT\n"), None, "bad_attribute"),
    ("uppercase extension", structured(CorrelationId="x"), None, "bad_attribute"),
    ("long extension name", structured(a23456789012345678901="x"), None, "bad_attribute"),
    ("extension object", structured(method={"a": 1}), None, "bad_attribute"),
    ("extension list", structured(method=[]), None, "bad_attribute"),
    ("dashed user property", b"", props(None, [*CE, ("x-trace", "1")]), "bad_attribute"),
    ("data user property", b"", props(None, [*CE, ("data", "1")]), "bad_attribute"),
    ("duplicate user property", b"", props(None, [*CE, ("id", "2")]), "bad_attribute"),
    ("empty ContentType", b"", props("", CE), "bad_attribute"),
    ("specversion 0.3", structured(specversion="0.3"), None, "bad_specversion"),
    ("numeric specversion", structured(specversion=1.0), None, "bad_specversion"),
    ("binary specversion 2", b"", props(None, [("specversion", "2.0"), *CE[1:]]),
     "bad_specversion"),
    ("binary JSON data garbage", b"{nope", props("application/json", CE), "bad_data"),
    ("bad base64", structured(data_base64="!!"), None, "bad_data"),
    ("numeric base64", structured(data_base64=5), None, "bad_data"),
    ("data and base64", structured(data=1, data_base64="AA=="), None, "bad_data"),
    ("structured nesting bomb", b'{"specversion":"1.0","data":' + b"[" * 100_000, None,
     "too_deep"),
    ("binary nesting bomb", b"[" * 100_000, props("application/json", CE), "too_deep"),
    ("huge integer", structured()[:-1] + b',"data":' + b"9" * 5000 + b"}", None, "not_json"),
]


@pytest.mark.parametrize("payload,properties,code", [r[1:] for r in REFUSALS],
                         ids=[r[0] for r in REFUSALS])
def test_refusals(payload: bytes, properties: Properties | None, code: str) -> None:
    with pytest.raises(CloudEventError) as e:
        decode(payload, wire(properties) if properties is not None else None)
    assert e.value.code == code
    assert "\n" not in str(e.value) and len(str(e.value)) < 300


def test_size_limit_is_checked_before_parsing() -> None:
    body = structured(data="x" * 1000)
    assert decode(body, max_bytes=len(body)).data == "x" * 1000
    with pytest.raises(CloudEventError) as e:
        decode(body, max_bytes=len(body) - 1)
    assert e.value.code == "too_large"
    with pytest.raises(CloudEventError) as e:  # garbage, but too large comes first
        decode(b"\xff" * ((1 << 20) + 1))
    assert e.value.code == "too_large"


@pytest.mark.parametrize("ev,code", [
    (CloudEvent("i", "s", "t", specversion="0.3"), "bad_specversion"),
    (CloudEvent("", "s", "t"), "bad_attribute"),
    (CloudEvent("i", "s", None), "missing_attribute"),  # type: ignore[arg-type]
    (CloudEvent("i", "s", "t", subject=""), "bad_attribute"),
    (CloudEvent("i", "s", "t\x00"), "bad_attribute"),  # would be a malformed MQTT packet
    (CloudEvent("i", "s", "t", response_topic=""), "bad_attribute"),
    (CloudEvent("i", "s", "t", extensions={"Bad": "x"}), "bad_attribute"),
    (CloudEvent("i", "s", "t", extensions={"id": "x"}), "bad_attribute"),
    (CloudEvent("i", "s", "t", extensions={"data": "x"}), "bad_attribute"),
    (CloudEvent("i", "s", "t", extensions={"n": 1}), "bad_attribute"),  # type: ignore[dict-item]
    (CloudEvent("i", "s", "t", data=b"raw"), "bad_data"),  # bytes need a non-JSON type
    (CloudEvent("i", "s", "t", data=float("nan")), "bad_data"),
    (CloudEvent("i", "s", "t", data={1j}), "bad_data"),
    (CloudEvent("i", "s", "t", datacontenttype="text/plain", data={"a": 1}), "bad_data"),
])
def test_encode_refusals(ev: CloudEvent, code: str) -> None:
    for encode in (encode_binary, encode_structured):
        with pytest.raises(CloudEventError) as e:
            encode(ev)
        assert e.value.code == code


def test_expiry_out_of_range() -> None:
    with pytest.raises(CloudEventError) as e:
        encode_binary(CloudEvent("i", "s", "t"), expiry_s=1 << 32)
    assert e.value.code == "bad_expiry"


# ---------------------------------------------------------------------------------------------
# Fuzzing

CORE_NAMES = ["specversion", "id", "source", "type", "subject", "time", "datacontenttype",
              "dataschema", "data", "data_base64", "correlationid"]
CONTENT_TYPES = [None, "application/json", "application/cloudevents+json", "text/plain",
                 "application/cloudevents+json; charset=utf-8", "application/x+json",
                 "application/octet-stream", "application/cloudevents-batch+json", ""]
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=12)
loose_values = json_values | st.binary(max_size=8) | st.just(float("nan"))
names = st.sampled_from(CORE_NAMES) | st.text(max_size=24)
user_lists = st.lists(st.tuples(names, st.sampled_from(["1.0", "x", ""]) | st.text(max_size=8))
                      | st.tuples(names, loose_values) | loose_values | st.tuples(),
                      max_size=8)


def decode_or_refuse(payload: bytes, p: Properties | None) -> None:
    try:
        decode(payload, p, max_bytes=4096)
    except CloudEventError as e:
        assert isinstance(e.code, str) and str(e)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.sampled_from(CONTENT_TYPES))
def test_fuzz_arbitrary_bytes(payload: bytes, content_type: str | None) -> None:
    decode_or_refuse(payload, None)
    decode_or_refuse(payload, props(content_type, list(CE)))
    decode_or_refuse(payload, props(content_type))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(user=user_lists, content_type=st.sampled_from(CONTENT_TYPES) | st.text(max_size=30),
       payload=st.binary(max_size=40) | json_values.map(lambda v: json.dumps(v).encode()),
       response_topic=st.none() | st.text(max_size=5) | st.integers(),
       correlation_data=st.none() | st.binary(max_size=5) | st.text(max_size=5))
def test_fuzz_properties(user: list, content_type: str | None, payload: bytes,
                         response_topic: Any, correlation_data: Any) -> None:
    # Attributes set directly: a broken peer or a future paho may hand over anything.
    p = Properties(PacketTypes.PUBLISH)
    for name, value in [("UserProperty", user), ("ContentType", content_type),
                        ("ResponseTopic", response_topic),
                        ("CorrelationData", correlation_data)]:
        if value is not None:
            object.__setattr__(p, name, value)
    decode_or_refuse(payload, p)
    decode_or_refuse(payload, wire(props(None, [*CE, *[u for u in user if _pair(u)]])))


def _pair(u: Any) -> bool:
    """A user property paho can send (MQTT strings never hold U+0000)."""
    return (isinstance(u, tuple) and len(u) == 2
            and all(isinstance(x, str) and "\x00" not in x for x in u))


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(names, loose_values.filter(lambda v: not isinstance(v, bytes)),
                       max_size=10),
       st.booleans())
def test_fuzz_structured_objects(obj: dict, mostly_valid: bool) -> None:
    if mostly_valid:
        obj = {"specversion": "1.0", "id": "1", "source": "s", "type": "t", **obj}
    body = json.dumps(obj).encode()
    decode_or_refuse(body, None)
    decode_or_refuse(body, props(S))


ext_names = st.from_regex(r"[a-z0-9]{1,20}", fullmatch=True).filter(
    lambda n: n not in CORE_NAMES[:8] and n != "data")
ce_chars = st.characters(blacklist_categories=("Cs", "Cc"))  # CE strings: no controls
attr_text = st.text(ce_chars, min_size=1, max_size=30)


@st.composite
def events(draw: st.DrawFn) -> CloudEvent:
    content_type = draw(st.sampled_from([None, "application/json", "application/x+json",
                                         "application/json; charset=utf-8", "text/plain",
                                         "application/octet-stream"]))
    json_type = content_type is None or "json" in content_type
    data = draw(json_values if json_type else st.none() | st.binary(min_size=1, max_size=50))
    opt = st.none() | attr_text
    return CloudEvent(
        id=draw(attr_text), source=draw(attr_text), type=draw(attr_text), subject=draw(opt),
        time=draw(opt), datacontenttype=content_type, dataschema=draw(opt), data=data,
        extensions=draw(st.dictionaries(ext_names, st.text(ce_chars, max_size=20), max_size=4)),
        response_topic=draw(st.none() | attr_text),
        correlation_data=draw(st.none() | st.binary(max_size=16)))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events(), st.none() | st.integers(0, 2**32 - 1))
def test_fuzz_round_trip(ev: CloudEvent, expiry: int | None) -> None:
    payload, p = encode_binary(ev, expiry_s=expiry)
    assert decode(payload, wire(p)) == ev
    assert decode(encode_structured(ev), wire(structured_properties(ev))) == ev
    plain = dataclasses.replace(ev, response_topic=None, correlation_data=None)
    assert decode(encode_structured(ev)) == plain


def test_publish_properties_pack_exactly_as_paho_does() -> None:
    """Every property we send, packed by our codec, is what paho packs of the same."""
    from sfc_host.mqtt.cloudevents import CloudEvent, encode_binary, structured_properties

    def paho_of(p: Any) -> Properties:
        q = Properties(PacketTypes.PUBLISH)
        for name in ("ContentType", "ResponseTopic", "CorrelationData",
                     "MessageExpiryInterval", "UserProperty"):
            if getattr(p, name) is not None:
                setattr(q, name, getattr(p, name))
        return q

    ev = CloudEvent(id="J:a#1", source="s", type="t.v1", subject="line1", data={"a": 1},
                    extensions={"correlationid": "J", "causationid": "ü-ß"})
    ev.response_topic = "equipment/line1/responses"
    ev.correlation_data = b"J:a#1\x00\xff"
    for expiry in (None, 0, 172800):
        _, props = encode_binary(ev, expiry_s=expiry)
        assert props.pack() == paho_of(props).pack()
        sp = structured_properties(ev, expiry_s=expiry)
        assert sp.pack() == paho_of(sp).pack()
    long = CloudEvent(id="x" * 1000, source="s" * 1000, type="t")
    _, props = encode_binary(long)
    assert props.pack() == paho_of(props).pack()   # a multi-byte length prefix


# ---- a command's message: the plain path against the event built and encoded


@dataclasses.dataclass
class _Cmd:
    """A command's fields as ``MqttSink.message`` reads them (the core's ``Command``
    is built only by ``evolve``)."""
    command_id: str
    type_id: str
    scope: str
    job: str
    action: str = "a"
    attempt: int = 1
    hold: bool = False
    restart: bool = False
    deadline_ms: int | None = 1_700_000_000_000
    parameters: dict[str, Any] | None = None


_texts = st.one_of(st.text(max_size=12), st.text(st.characters(min_codepoint=32, max_codepoint=126),
                                                 min_size=1, max_size=12),
                   st.sampled_from(["", "\x7f", "é", "\ud800", "a\x00b", "x" * 1100]))
_params = st.none() | st.dictionaries(st.text(max_size=5), st.integers() | st.floats()
                                      | st.text(max_size=5) | st.none(), max_size=3)


def _message(sink: Any, c: _Cmd, plain: bool) -> tuple[str, Any]:
    try:
        topic, payload, props = sink.message(c, plain=plain)
    except Exception as e:       # the same refusal either way
        return "error", type(e)
    return topic, (payload, None if props is None else props.pack())


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cid=_texts, type_id=_texts, job=_texts, params=_params, v5=st.booleans(),
       binary=st.booleans(), scope=st.sampled_from(["cell", "line-1", "z"]))
def test_a_command_s_message_is_the_same_by_the_plain_path_and_by_the_event(
        cid: str, type_id: str, job: str, params: dict[str, Any] | None, v5: bool,
        binary: bool, scope: str) -> None:
    from sfc_host.config import HostConfig
    from sfc_host.equipment.mqtt_transport import MqttSink
    from sfc_host.metrics import Metrics
    from sfc_host.mqtt import MqttLink
    link = MqttLink(HostConfig(mqtt_url="mqtt://127.0.0.1:1883", consumer="c",
                               mqtt_version=5 if v5 else 3, mqtt_binary=binary), Metrics())
    sink = MqttSink(link)
    c = _Cmd(cid, type_id, scope, job, parameters=params)
    assert _message(sink, c, True) == _message(sink, c, False)


def test_a_plain_command_is_encoded_without_building_its_event() -> None:
    from sfc_host.mqtt.cloudevents import encode_binary_plain
    data = {"Parameters": {}, "Context": {"JobOrderID": "J1"}}
    ev = CloudEvent(id="J1:a#1", source="sfc-host", type="com.example.a.v1", subject="cell",
                    data=data, extensions={"correlationid": "J1"})
    ev.response_topic = "equipment/cell/responses"
    ev.correlation_data = b"J1:a#1"
    payload, props = encode_binary(ev)          # the extension's name is seen valid
    got = encode_binary_plain("J1:a#1", "sfc-host", "com.example.a.v1", "cell", data,
                              {"correlationid": "J1"}, "equipment/cell/responses",
                              b"J1:a#1")
    assert got is not None
    assert got[0] == payload and got[1].pack() == props.pack()
    # anything but plain ASCII attributes goes the way that checks them
    assert encode_binary_plain("J1:a#1", "sfc-host", "com.example.ä.v1", "cell", data,
                               {"correlationid": "J1"}, None, None) is None
    assert encode_binary_plain("", "sfc-host", "t", None, data, {}, None, None) is None
    assert encode_binary_plain("i", "sfc-host", "t", None, [1], {}, None, None) is None


# ---- an MES status event: the plain path against the event built and encoded


_states = st.sampled_from(["InitialState", "Running", "Interrupted_Held", "EndState"])


@st.composite
def _causes(draw: Any) -> CloudEvent | None:
    kind = draw(st.sampled_from(["none", "uuid", "text", "bytes"]))
    if kind == "none":
        return None
    ev = CloudEvent(id=draw(_texts) or "r1", source="mes", type="t")
    if kind == "uuid":
        ev.extensions["correlationid"] = "3f1c2b9e-8a7d-4c6b-9e2f-1a2b3c4d5e6f"
    elif kind == "text":
        ev.extensions["correlationid"] = draw(_texts) or "c"
    else:
        ev.correlation_data = draw(st.binary(min_size=1, max_size=20))
    return ev


def _status(plain: bool, *args: Any, **kw: Any) -> Any:
    from sfc_host.mes import codec
    try:
        payload, props = codec.status_event(*args, plain=plain, **kw)
        return payload, None if props is None else props.pack()
    except Exception as e:       # the same refusal either way
        return "error", type(e)


@settings(max_examples=400, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(scope=_texts, source=_texts, state=_states, order=st.none() | st.sampled_from(
           [b'{"ID":"J1","WorkMasterID":[{"ID":"five"}]}', b"{}"]),
       cause=_causes(), v5=st.booleans(), binary=st.booleans(),
       expiry=st.sampled_from([0, 1, 3600, 0xFFFFFFFF, 0x100000000]))
def test_a_status_event_is_the_same_by_the_plain_path_and_by_the_event(
        monkeypatch: pytest.MonkeyPatch, scope: str, source: str, state: str,
        order: bytes | None, cause: CloudEvent | None, v5: bool, binary: bool,
        expiry: int) -> None:
    import sfc_host.mqtt.cloudevents as ce
    from sfc_host.mes import codec
    # the same id and time by either path
    for mod in (ce, codec):
        monkeypatch.setattr(mod, "next_id", lambda: "0123456789abcdef0123456789abcdef")
        monkeypatch.setattr(mod, "timestamp", lambda: "2026-12-05T01:02:03.456Z")
    args = (scope, order, state, source, cause)
    kw = {"v5": v5, "binary": binary, "expiry_s": expiry}
    assert _status(True, *args, **kw) == _status(False, *args, **kw)


def test_a_plain_status_event_is_encoded_without_building_its_event(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from sfc_host.mes import codec
    built: list[Any] = []
    real = codec.new_event
    monkeypatch.setattr(codec, "new_event", lambda *a, **k: built.append(a) or real(*a, **k))
    payload, props = codec.status_event("cell", b'{"ID":"J1"}', "Running", "sfc-host", None,
                                        v5=True, binary=True, expiry_s=60)
    assert not built
    assert payload.startswith(b'{"JobOrder":{"ID":"J1"},"JobState":')
    assert props.PayloadFormatIndicator == 1 and props.MessageExpiryInterval == 60
    assert ("subject", "cell") in props.UserProperty
    # not plain ASCII, structured mode or MQTT 3.1.1: the event is built
    for scope, v5, binary in (("cellé", True, True), ("cell", True, False),
                              ("cell", False, True)):
        codec.status_event(scope, None, "Running", "sfc-host", None, v5=v5, binary=binary,
                           expiry_s=0)
    assert len(built) == 3
