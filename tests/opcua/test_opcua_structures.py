"""The ISA-95 structures between the MQTT face's JSON and OPC UA's binary bodies
(``sfc_host.opcua.structures``), laid out by the NodeSet's DataTypeDefinitions, checked
against asyncua's codec as the independent implementation: asyncua reads the bytes we
write to the same values and writes them back byte for byte."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from sfc_fast.wire.uabinary import EXTENSION_OBJECT, ExtensionObject, Variant
from sfc_host.opcua.structures import ConvertError, Structures, state_of


@pytest.fixture(scope="module")
def structures() -> Structures:
    from sfc_host.opcua.server import JC_URI, nodeset_path
    from sfc_host.opcua_server import base_space, load_nodeset

    space = base_space()
    load_nodeset(space, nodeset_path())
    return Structures(space, space.namespace_index(JC_URI))


@pytest.fixture(scope="module")
def asyncua_types() -> Any:
    """asyncua's structure classes of the Job Control NodeSet, made by its own loader."""
    from asyncua import Server, ua

    from sfc_host.opcua.server import nodeset_path

    async def load() -> None:
        server = Server()
        await server.init()
        await server.import_xml(str(nodeset_path()))
    asyncio.run(load())
    return ua


def test_a_job_order_goes_both_ways_unchanged(structures: Structures) -> None:
    doc = {"JobOrderID": "J1", "Description": [{"Locale": "en", "Text": "first"}],
           "WorkMasterID": [{"ID": "WM", "Parameters": [{"ID": "speed", "Value": 1.5}]}],
           "StartTime": "2026-12-05T10:00:00.000Z", "Priority": 3,
           "JobOrderParameters": [{"ID": "qty", "Value": 10},
                                  {"ID": "tags", "Value": ["a", "b"]},
                                  {"ID": "on", "Value": True},
                                  {"ID": "spec", "Value": {"nested": 1}}],
           "EquipmentRequirements": [{"ID": "Station-3", "EquipmentUse": "Production",
                                      "Quantity": "1"}],
           "MaterialRequirements": [{"MaterialDefinitionID": "M1", "Quantity": "5"}]}
    back = structures.decode("JobOrder", structures.body("JobOrder", doc))
    # an object value goes as its JSON text (a Variant holds no JSON object)
    want = dict(doc)
    want["JobOrderParameters"] = [*doc["JobOrderParameters"][:3],
                                  {"ID": "spec", "Value": '{"nested":1}'}]
    assert back == want


def test_a_value_that_does_not_fit_names_its_field(structures: Structures) -> None:
    with pytest.raises(ConvertError, match=r"JobOrder.Priority: not an integer"):
        structures.body("JobOrder", {"JobOrderID": "J", "Priority": "high"})
    with pytest.raises(ConvertError, match="not an ISA95JobOrderDataType"):
        structures.decode_object("JobOrder", "J")
    with pytest.raises(ConvertError, match="not an ISA95JobOrderDataType"):
        structures.decode_object("JobOrder", ExtensionObject(structures.type_id("JobOrder"),
                                                             b"\x01\x02"))

    def states(number: int) -> Variant:
        body = structures.body("State", {"StateText": {"Locale": "en", "Text": "Running"},
                                         "StateNumber": number})
        return Variant(EXTENSION_OBJECT, [ExtensionObject(structures.type_id("State"), body)])
    assert state_of(structures, states(3)) == "Running"
    with pytest.raises(ConvertError, match="StateNumber 3, not 4"):
        state_of(structures, states(4))


@pytest.mark.parametrize("name", ["JobOrder", "JobResponse"])
def test_asyncua_reads_our_bytes_to_the_same_structure(structures: Structures,
                                                       asyncua_types: Any, name: str) -> None:
    """For any order or response: asyncua decodes the body we encode without a byte
    left, encodes what it read back to the same bytes, and the ids it read are the
    JSON's; our reader's JSON is stable."""
    from asyncua.common.utils import Buffer
    from asyncua.ua.ua_binary import struct_from_binary, struct_to_binary
    from helpers.structures_strategies import encode_strategies
    from hypothesis import HealthCheck, given, settings

    cls = getattr(asyncua_types, {"JobOrder": "ISA95JobOrderDataType",
                                  "JobResponse": "ISA95JobResponseDataType"}[name])

    @settings(max_examples=300, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(encode_strategies()[name])
    def check(doc: dict[str, Any]) -> None:
        body = structures.body(name, doc)
        buf = Buffer(body)
        obj = struct_from_binary(cls, buf)
        assert buf.cur_pos == len(body)
        assert struct_to_binary(obj) == body
        ident = "JobOrderID" if name == "JobOrder" else "JobResponseID"
        assert getattr(obj, ident) == doc[ident]
        # our reader gives JSON that encodes and reads back to itself (empty texts
        # and lists left out, as the MQTT face leaves them)
        again = structures.decode(name, body)
        assert structures.decode(name, structures.body(name, again)) == again
    check()


@pytest.mark.parametrize(("doc", "says"), [
    ({"JobOrderID": "J", "Priority": "high"}, r"JobOrder.Priority: not an integer"),
    ({"JobOrderID": "J", "Priority": 40_000}, r"JobOrder.Priority: 40000 is out of"),
    ({"JobOrderID": "J", "StartTime": "yesterday"}, r"JobOrder.StartTime: 'yesterday'"),
    ({"JobOrderID": "J", "Description": "x"}, r"JobOrder.Description: not a list"),
    ({"JobOrderID": "J", "WorkMasterID": [7]}, r"JobOrder.WorkMasterID\[0\]: not an object"),
    ({"JobOrderID": "J", "Description": [{"Text": 5}]}, r"LocalizedText's Text"),
])
def test_what_does_not_fit_is_refused_with_its_path(structures: Structures,
                                                    doc: dict[str, Any], says: str) -> None:
    with pytest.raises(ConvertError, match=says):
        structures.body("JobOrder", doc)
