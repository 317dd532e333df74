"""The MES wire as the Python original writes it (tests/data/mes_wire, captured from its
own code): every reference message decodes, the state lists are the original's, and
bad payloads get the status the original gives or INVALID_REQUEST. No server."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import msgspec
import pytest

from sfc_host import isa95 as model
from sfc_host.mes import codec
from sfc_host.mes.catalog import config_id, max_orders
from sfc_host.mqtt.cloudevents import CloudEvent, decode

REF = Path(__file__).resolve().parents[1] / "data" / "mes_wire"


def ref(name: str) -> Any:
    return json.loads((REF / name).read_bytes())


def raw(name: str) -> bytes:
    return (REF / name).read_bytes()


CALLS = {"Store": model.StoreCall, "StoreAndStart": model.StoreCall,
         "Update": model.StoreCall, "RequestJobResponseByJobOrderID": model.IdCall,
         "RequestJobResponseByJobOrderState": model.StateCall}


@pytest.mark.parametrize("path", sorted(p.name for p in REF.glob("*.request.json")))
def test_every_reference_request_decodes_and_gives_back_the_same_bytes(path: str) -> None:
    method = path.split(".")[0].removesuffix("-none")
    kind = CALLS.get(method, model.IdCall)
    call = codec.typed(json.loads(raw(path)), kind)
    # stored as sent, given back as sent: the original's own bytes
    assert msgspec.json.encode(call) == raw(path)


def test_every_reference_config_message_decodes() -> None:
    assert config_id("equipment", ref("equipment.config.json")) == "STATION-10"
    assert config_id("personnel", ref("personnel.config.json")) == "OPERATOR-L1"
    assert config_id("physicalasset", ref("physicalasset.config.json")) == "NUTRUNNER-SN-4711"
    assert config_id("materialclass", ref("materialclass.config.json")) == "AXLE"
    assert config_id("materialdefinition",
                     ref("materialdefinition.config.json")) == "AXLE-FRONT-V2"
    assert max_orders(ref("jobacceptance.config.json")) == 10
    wm = ref("workmaster.config.json")
    assert wm["ID"] == "WM-AXLE-FIT" and wm["dataschema"].endswith("/v1.0.0/")


def test_replies_events_and_retained_reference_payloads_decode() -> None:
    for name in ("ISA95JobOrderStatusEventType.event.json", "order.retained.json"):
        doc = ref(name)
        order = msgspec.convert(doc["JobOrder"], model.JobOrderData)
        assert order.JobOrderID == "J-1001"
        assert model.state_name(doc.get("JobState") or doc.get("State")) in model.STATE_NAMES
    resp = msgspec.convert(ref("result.retained.json"), model.JobResponse)
    assert msgspec.json.encode(resp) == raw("result.retained.json")
    index = ref("state-index.retained.json")
    assert [model.state_name(j["state"]) for j in index["jobs"]] == [
        "NotAllowedToStart_Ready", "Aborted", "Ended_Completed"]


def test_state_lists_are_the_originals() -> None:
    for name, states in ref("states.json").items():
        assert model.state_list(name) == states
        assert model.STATE_JSON[name] == msgspec.json.encode(states)
        assert model.state_name(states) == name


@pytest.mark.parametrize("states, why", [
    ([{"StateText": {"Locale": "en", "Text": "Ended"}, "StateNumber": 9}], "StateNumber 5"),
    ([{"StateText": {"Locale": "en", "Text": "Finished"}, "StateNumber": 5}], "unknown"),
    ([{"StateNumber": 5}], "no StateText"),
    (["Ended"], "not an object"),
])
def test_a_bad_state_list_is_refused_with_a_reason(states: Any, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        model.state_name(states)


def test_numbers_are_optional_and_text_decides_as_in_the_original() -> None:
    assert model.state_name([{"StateText": {"Text": "Running"}}]) == "Running"
    # [Ended] is the top state alone, not Ended_Completed (the original joins texts)
    assert model.state_name([{"StateText": {"Text": "Ended"}}]) == "Ended"


@pytest.mark.parametrize("data, kind, fault", [
    ({"JobOrder": {"JobOrderID": "J", "WorkMasterID": "WM-1"}}, model.StoreCall,
     "$.JobOrder.WorkMasterID"),
    ({"JobOrder": {"JobOrderID": "J", "Priority": "high"}}, model.StoreCall,
     "$.JobOrder.Priority"),
    ({"JobOrderID": "J", "Comment": "operator break"}, model.IdCall, "$.Comment"),
    ({"JobOrderID": 7}, model.IdCall, "$.JobOrderID"),
    ([1, 2], model.IdCall, "not an object"),
])
def test_a_payload_of_the_wrong_types_is_invalid_with_its_path(data: Any, kind: type,
                                                               fault: str) -> None:
    with pytest.raises(codec.Invalid) as e:
        codec.typed(data, kind)
    assert fault in str(e.value) and "\n" not in str(e.value)
    assert e.value.status == model.INVALID_REQUEST


def test_snake_case_field_names_are_taken_as_the_original_takes_them() -> None:
    call = codec.typed({"job_order": {"job_order_id": "J-T4", "priority": 2,
                                      "work_master_id": [{"id": "WM"}]}}, model.StoreCall)
    assert call.JobOrder is not None and call.JobOrder.JobOrderID == "J-T4"
    assert call.JobOrder.Priority == 2 and call.JobOrder.WorkMasterID[0].ID == "WM"
    # unknown keys are ignored, as the original ignores them
    call = codec.typed({"JobOrder": {"JobOrderID": "J-T3", "Foo": 1}, "Bar": 2},
                       model.StoreCall)
    assert msgspec.json.encode(call) == b'{"JobOrder":{"JobOrderID":"J-T3"}}'


def _event(data: bytes, content_type: str, **attrs: str) -> CloudEvent:
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties
    p = Properties(PacketTypes.PUBLISH)
    p.ContentType = content_type
    p.UserProperty = [("specversion", "1.0"), ("id", "r1"), ("source", "urn:example:mes"),
                      ("type", model.JOB_CONTROL + "Start.v2"), *attrs.items()]
    return decode(data, p)


def test_json_with_or_without_charset_and_messagepack_are_read() -> None:
    for ct in ("application/json", "application/json; charset=utf-8"):
        ev = _event(b'{"JobOrderID":"J-T1"}', ct)
        assert codec.typed(codec.data_of(ev), model.IdCall).JobOrderID == "J-T1"
    for ct in ("application/msgpack", "application/msgpack; charset=utf-8"):
        ev = _event(msgspec.msgpack.encode({"JobOrderID": "J-T1"}), ct)
        assert codec.typed(codec.data_of(ev), model.IdCall).JobOrderID == "J-T1"
    with pytest.raises(codec.Invalid, match="MessagePack"):
        codec.data_of(_event(b"\xc1\xff\x00garbage", "application/msgpack"))
    with pytest.raises(codec.Invalid, match="datacontenttype"):
        codec.data_of(_event(b'{"JobOrderID":"J-T1"}', "text/plain"))


def test_scope_from_subject_then_topic() -> None:
    ev = _event(b"{}", "application/json", subject="line1.cell1")
    assert codec.scope_of(ev, "app/jobs/x/commands", "app/jobs") == "line1.cell1"
    assert codec.levels("line1.cell1") == "line1/cell1"
    # the original: the subject up to its first '/'
    ev = _event(b"{}", "application/json", subject="line1/cell1")
    assert codec.scope_of(ev, "app/jobs/commands", "app/jobs") == "line1"
    ev = _event(b"{}", "application/json")
    assert codec.scope_of(ev, "app/jobs/line2/cell3/commands", "app/jobs") == "line2.cell3"
    assert codec.scope_of(ev, "app/jobs/commands", "app/jobs") is None
    assert codec.request_filters("app/jobs", 2) == [
        "app/jobs/commands", "app/jobs/+/commands", "app/jobs/+/+/commands"]


def test_the_reply_carries_the_requests_correlation_as_the_original() -> None:
    cid = str(uuid.uuid4())
    ev = _event(b"{}", "application/json", subject="line1", correlationid=cid)
    payload, props = codec.reply(ev, "Start", "sfc-host", b'{"ReturnStatus":1}', v5=True,
                                 binary=True, expiry_s=10)
    user = dict(props.UserProperty)
    assert payload == b'{"ReturnStatus":1}'
    assert user["correlationid"] == cid and user["causationid"] == "r1"
    assert user["subject"] == "line1" and user["type"] == model.JOB_CONTROL + "Start.v2"
    assert user["dataschema"].endswith("#/$defs/StartResponse")
    assert props.CorrelationData == uuid.UUID(cid).bytes
    assert props.ContentType == "application/json; charset=utf-8"
    assert props.PayloadFormatIndicator == 1 and props.MessageExpiryInterval == 10
    # packed by our fast path: the properties a real client reads back
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties
    back = Properties(PacketTypes.PUBLISH)
    back.unpack(props.pack())
    assert back.PayloadFormatIndicator == 1 and back.CorrelationData == uuid.UUID(cid).bytes
    # no correlation at all: a new UUID, as the original makes one
    ev = _event(b"{}", "application/json")
    _, props = codec.reply(ev, "Start", "s", b"{}", v5=True, binary=True, expiry_s=0)
    assert uuid.UUID(dict(props.UserProperty)["correlationid"]).bytes == props.CorrelationData


def test_actuals_of_a_job_response_are_the_orders_requirements() -> None:
    order = json.dumps(ref("Store.request.json")["JobOrder"]).encode()
    resp = b'{"JobResponseID":"J-1001-response","JobOrderID":"J-1001"}'
    served = json.loads(model.with_actuals(resp, order))
    want = ref("result.retained.json")
    for key in ("PersonnelActuals", "EquipmentActuals", "PhysicalAssetActuals",
                "MaterialActuals"):
        assert served[key] == want[key], key


def test_the_job_order_machine_moves_as_the_originals_in_every_reachable_state() -> None:
    from sfc_fast import JOB_ORDER, InvalidTransition
    t = ref("transitions.json")
    for state in t["states_a_job_can_reach"]:
        moves = t["next_state"][state]
        for trigger in [*t["method_triggers"], "Run"]:
            try:
                got = JOB_ORDER.fire(state, trigger)
            except InvalidTransition:
                got = None
            assert got == moves.get(trigger), (state, trigger)
