"""The server's address space (``sfc_host.opcua_server.nodes``, ``base``): Read of every
attribute of every node class with its built-in type, Browse, TranslateBrowsePaths,
the subtype tables, instances of types (the ISA-95 Job Order receiver's methods and
their arguments), values set and watched, and namespace 0 with the Server object's
values. The structures written with our codec are decoded by asyncua's, an
implementation of its own."""

from __future__ import annotations

import time
import xml.etree.ElementTree as ET
from datetime import UTC, datetime
from pathlib import Path

import pytest
from asyncua import ua
from asyncua.common.utils import Buffer
from asyncua.ua.ua_binary import struct_from_binary

from sfc_fast.wire.uabinary import (
    BOOLEAN,
    BYTE,
    DOUBLE,
    EXTENSION_OBJECT,
    INT32,
    LOCALIZED_TEXT,
    NODE_ID,
    QUALIFIED_NAME,
    UINT32,
    DataValue,
    ExtensionObject,
    LocalizedText,
    NodeId,
    QualifiedName,
    Variant,
    ticks_now,
)
from sfc_host.opcua_server.base import base_space, describe_server
from sfc_host.opcua_server.nodes import (
    BASE_DATA_VARIABLE_TYPE,
    BASE_OBJECT_TYPE,
    HAS_COMPONENT,
    HAS_MODELLING_RULE,
    HAS_PROPERTY,
    HAS_SUBTYPE,
    HAS_TYPE_DEFINITION,
    MANDATORY,
    OPTIONAL,
    ORGANIZES,
    VIEW,
    AddressSpace,
    Argument,
    EnumValueType,
    EUInformation,
    Node,
    Range,
    Reference,
)
from sfc_host.opcua_server.nodeset import load_nodeset

ROOT = Path(__file__).resolve().parents[2]
JOB_CONTROL = ROOT / "src" / "sfc_host" / "opcua" / "nodeset" / \
    "opc.ua.isa95-jobcontrol.nodeset2.xml"
JC_URI = "http://opcfoundation.org/UA/ISA95-JOBCONTROL_V2/"
UA_TYPES = "{http://opcfoundation.org/UA/2008/02/Types.xsd}"
NODESET = "{http://opcfoundation.org/UA/2011/03/UANodeSet.xsd}"

GOOD = 0
BAD_NODE_ID_UNKNOWN = 0x80340000
BAD_ATTRIBUTE_ID_INVALID = 0x80350000
BAD_REFERENCE_TYPE_ID_INVALID = 0x804C0000
BAD_BROWSE_DIRECTION_INVALID = 0x804D0000
BAD_BROWSE_NAME_INVALID = 0x80600000
BAD_NO_MATCH = 0x806F0000
BAD_NOTHING_TO_DO = 0x800F0000

HIERARCHICAL = NodeId(33)
OBJECTS, SERVER, ROOT_FOLDER = NodeId(85), NodeId(2253), NodeId(84)

# Part 3 §5 and Part 6 A.1, written out here as the test's own table: each node class's
# attributes, and the built-in type each one's value has
COMMON = {1: NODE_ID, 2: INT32, 3: QUALIFIED_NAME, 4: LOCALIZED_TEXT, 5: LOCALIZED_TEXT,
          6: UINT32, 7: UINT32}
CLASS_ATTRIBUTES = {
    1: {12: BYTE},
    2: {13: None, 14: NODE_ID, 15: INT32, 16: UINT32, 17: BYTE, 18: BYTE, 19: DOUBLE,
        20: BOOLEAN, 27: UINT32},
    4: {21: BOOLEAN, 22: BOOLEAN},
    8: {8: BOOLEAN},
    16: {13: None, 14: NODE_ID, 15: INT32, 16: UINT32, 8: BOOLEAN},
    32: {8: BOOLEAN, 9: BOOLEAN, 10: LOCALIZED_TEXT},
    64: {8: BOOLEAN, 23: EXTENSION_OBJECT},
    128: {11: BOOLEAN, 12: BYTE},
}


@pytest.fixture(scope="module")
def jc_space() -> AddressSpace:
    space = base_space()
    load_nodeset(space, JOB_CONTROL)
    return space


def _jc(space: AddressSpace, ident: int) -> NodeId:
    return NodeId(ident, space.namespace_index(JC_URI))


def _decode(cls: type, obj: ExtensionObject) -> object:
    assert obj.body is not None
    return struct_from_binary(cls, Buffer(obj.body))


def _value(space: AddressSpace, node: NodeId) -> object:
    dv = space.read(node, 13)
    assert dv.status == GOOD and dv.value is not None, dv
    return dv.value.value


def _jc_xml() -> ET.Element:
    return ET.parse(JOB_CONTROL).getroot()


# ---- Read


def test_every_attribute_of_every_node_class_reads_with_its_type(
        jc_space: AddressSpace) -> None:
    space = jc_space.copy()
    space.add(Node(NodeId("view", 2), VIEW, QualifiedName("AView", 2),
                   attributes={11: True, 12: 1}))
    samples = {1: OBJECTS, 2: NodeId(2255), 4: _jc(space, 7001), 8: BASE_OBJECT_TYPE,
               16: BASE_DATA_VARIABLE_TYPE, 32: HAS_COMPONENT, 64: _jc(space, 3008),
               128: NodeId("view", 2)}
    for cls, node in samples.items():
        wanted = {**COMMON, **CLASS_ATTRIBUTES[cls]}
        for attribute in range(0, 29):
            dv = space.read(node, attribute)
            if attribute not in wanted:
                assert dv.status == BAD_ATTRIBUTE_ID_INVALID, (cls, attribute, dv)
                assert dv.value is None
                continue
            assert dv.status == GOOD, (cls, attribute, dv)
            kind = wanted[attribute]
            if kind is not None:
                assert dv.value is not None and dv.value.type == kind, (cls, attribute, dv)
    assert space.read(NodeId("view", 2), 11).value == Variant(BOOLEAN, True)


def test_attribute_values(jc_space: AddressSpace) -> None:
    space = jc_space
    ns = NodeId(2255)
    assert space.read(ns, 1).value == Variant(NODE_ID, ns)
    assert space.read(ns, 2).value == Variant(INT32, 2)
    assert space.read(ns, 3).value == Variant(QUALIFIED_NAME, QualifiedName("NamespaceArray"))
    assert space.read(ns, 4).value == Variant(LOCALIZED_TEXT, LocalizedText("NamespaceArray"))
    assert space.read(ns, 5).value == Variant(LOCALIZED_TEXT, LocalizedText(None))
    assert space.read(ns, 6).value == Variant(UINT32, 0)
    assert space.read(ns, 14).value == Variant(NODE_ID, NodeId(12))
    assert space.read(ns, 15).value == Variant(INT32, 1)
    assert space.read(ns, 16).value == Variant(UINT32, [0])
    assert space.read(ns, 17).value == Variant(BYTE, 1)
    assert space.read(ns, 18).value == Variant(BYTE, 1)
    assert space.read(ns, 19).value == Variant(DOUBLE, 0.0)
    assert space.read(ns, 20).value == Variant(BOOLEAN, False)
    assert space.read(ns, 27).value == Variant(UINT32, 1)
    assert space.read(NodeId(2254), 16).value == Variant(UINT32, [0])
    assert space.read(NodeId(2267), 16).value == Variant(UINT32, [])   # a scalar
    assert space.read(HAS_COMPONENT, 10).value == \
        Variant(LOCALIZED_TEXT, LocalizedText("ComponentOf"))
    assert space.read(HAS_COMPONENT, 9).value == Variant(BOOLEAN, False)
    assert space.read(HIERARCHICAL, 8).value == Variant(BOOLEAN, True)
    assert space.read(BASE_OBJECT_TYPE, 8).value == Variant(BOOLEAN, False)
    assert space.read(SERVER, 12).value == Variant(BYTE, 1)     # SubscribeToEvents
    assert space.read(_jc(space, 7001), 21).value == Variant(BOOLEAN, True)
    assert space.read(_jc(space, 7001), 22).value == Variant(BOOLEAN, True)
    description = space.read(_jc(space, 3008), 5).value
    assert description is not None and description.value.text == \
        "Defines the information needed to schedule and execute a job."


def test_read_of_a_missing_node_or_definition_is_bad(jc_space: AddressSpace) -> None:
    assert jc_space.read(NodeId("nowhere", 7), 1).status == BAD_NODE_ID_UNKNOWN
    assert jc_space.read(NodeId(24), 23).status == BAD_ATTRIBUTE_ID_INVALID  # BaseDataType
    assert jc_space.read(OBJECTS, 0).status == BAD_ATTRIBUTE_ID_INVALID
    assert jc_space.read(OBJECTS, 99).status == BAD_ATTRIBUTE_ID_INVALID


def test_structure_definition_decodes_with_asyncua_to_the_nodesets_fields(
        jc_space: AddressSpace) -> None:
    dv = jc_space.read(_jc(jc_space, 3008), 23)
    assert dv.value is not None
    obj = dv.value.value
    assert obj.type_id == NodeId(122) and obj.encoding == 1
    d = _decode(ua.StructureDefinition, obj)
    jc = jc_space.namespace_index(JC_URI)
    assert d.DefaultEncodingId == ua.NodeId(5014, jc)        # the "Default Binary" one
    assert d.BaseDataType == ua.NodeId(22, 0)
    assert d.StructureType == ua.StructureType.StructureWithOptionalFields

    root = _jc_xml()
    aliases = {a.get("Alias"): a.text for a in root.iter(f"{NODESET}Alias")}
    el = next(e for e in root.iter(f"{NODESET}UADataType") if e.get("NodeId") == "ns=1;i=3008")
    fields = el.findall(f"{NODESET}Definition/{NODESET}Field")
    assert [f.Name for f in d.Fields] == [f.get("Name") for f in fields]
    for got, want in zip(d.Fields, fields, strict=True):
        wanted_type = ua.NodeId.from_string(aliases.get(want.get("DataType"),
                                                        want.get("DataType")))
        if wanted_type.NamespaceIndex == 1:
            wanted_type = ua.NodeId(wanted_type.Identifier, jc)
        assert got.DataType == wanted_type, got.Name
        assert got.ValueRank == int(want.get("ValueRank", "-1"))
        assert got.ArrayDimensions == ([int(want.get("ArrayDimensions"))]
                                       if want.get("ArrayDimensions") else [])
        assert got.IsOptional == (want.get("IsOptional") == "true")
        assert got.Description.Text == want.find(f"{NODESET}Description").text


def test_enum_definition_decodes_with_asyncua(jc_space: AddressSpace) -> None:
    dv = jc_space.read(NodeId(852), 23)          # ServerState
    assert dv.value is not None and dv.value.value.type_id == NodeId(123)
    d = _decode(ua.EnumDefinition, dv.value.value)
    names = {f.Name: f.Value for f in d.Fields}
    assert names["Running"] == 0 and names["Failed"] == 1 and names["Unknown"] == 7
    assert all(f.DisplayName.Text == f.Name for f in d.Fields)


def test_an_argument_value_decodes_with_asyncua(jc_space: AddressSpace) -> None:
    store = _jc(jc_space, 7001)
    prop = jc_space.child(store, QualifiedName("InputArguments"))
    assert prop is not None
    values = _value(jc_space, prop)
    assert isinstance(values, list) and all(v.type_id == NodeId(298) for v in values)
    args = [_decode(ua.Argument, v) for v in values]
    assert [a.Name for a in args] == ["JobOrder", "Comment"]
    jc = jc_space.namespace_index(JC_URI)
    assert args[0].DataType == ua.NodeId(3008, jc) and args[0].ValueRank == -1
    assert args[1].DataType == ua.NodeId(21, 0) and args[1].ValueRank == 1


def test_structures_written_in_code_decode_with_asyncua() -> None:
    arg = _decode(ua.Argument, Argument("Speed", NodeId(11), 1, (3,),
                                        LocalizedText("mm/s", "en")).encode())
    assert (arg.Name, arg.DataType, arg.ValueRank, arg.ArrayDimensions,
            arg.Description.Text, arg.Description.Locale) == \
        ("Speed", ua.NodeId(11), 1, [3], "mm/s", "en")
    ev = _decode(ua.EnumValueType, EnumValueType(-3, LocalizedText("Minus")).encode())
    assert (ev.Value, ev.DisplayName.Text) == (-3, "Minus")
    eu = _decode(ua.EUInformation, EUInformation("http://www.opcfoundation.org/UA/units/un/cefact",
                                                 4408652, LocalizedText("°C")).encode())
    assert (eu.UnitId, eu.DisplayName.Text) == (4408652, "°C")
    r = _decode(ua.Range, Range(-1.5, 2.5).encode())
    assert (r.Low, r.High) == (-1.5, 2.5)


# ---- Browse and TranslateBrowsePaths


def test_browse_forward_inverse_both(jc_space: AddressSpace) -> None:
    found = jc_space.browse(OBJECTS, 0, NodeId(0), True, 0, 0x3F)
    assert not isinstance(found, int)
    server = next(r for r in found if r.target == SERVER)
    assert (server.type_id, server.forward, server.node_class, server.browse_name,
            server.display_name, server.type_definition) == \
        (ORGANIZES, True, 1, QualifiedName("Server"), LocalizedText("Server"), NodeId(2004))
    assert all(r.forward for r in found)
    inverse = jc_space.browse(OBJECTS, 1, NodeId(0), True, 0, 0x3F)
    assert not isinstance(inverse, int)
    assert [(r.type_id, r.target, r.forward) for r in inverse] == \
        [(ORGANIZES, ROOT_FOLDER, False)]
    both = jc_space.browse(OBJECTS, 2, NodeId(0), True, 0, 0x3F)
    assert not isinstance(both, int) and len(both) == len(found) + len(inverse)
    # a type's type definition is null
    types = jc_space.browse(NodeId(88), 0, HIERARCHICAL, True, 0, 0x3F)
    assert not isinstance(types, int)
    assert [(r.target, r.node_class, r.type_definition) for r in types] == \
        [(BASE_OBJECT_TYPE, 8, NodeId(0))]


def test_browse_filters_by_reference_type_and_node_class(jc_space: AddressSpace) -> None:
    def targets(ref: NodeId, subtypes: bool, mask: int = 0) -> set[NodeId]:
        found = jc_space.browse(SERVER, 0, ref, subtypes, mask, 0x3F)
        assert not isinstance(found, int)
        return {r.target for r in found}

    everything = targets(NodeId(0), True)
    hierarchical = targets(HIERARCHICAL, True)
    assert NodeId(2004) in everything and NodeId(2004) not in hierarchical
    assert {NodeId(2254), NodeId(2256), NodeId(2268)} <= hierarchical
    assert targets(HIERARCHICAL, False) == set()               # only its subtypes are used
    assert targets(HAS_PROPERTY, False) == {t for t in hierarchical
                                            if jc_space.get(t).node_class == 2} - \
        {NodeId(2256)}                                          # ServerStatus: a component
    assert targets(HIERARCHICAL, True, 1) == {t for t in hierarchical
                                              if jc_space.get(t).node_class == 1}
    assert targets(NodeId(0), True, 8) == {NodeId(2004)}       # ObjectTypes only


def test_browse_errors(jc_space: AddressSpace) -> None:
    assert jc_space.browse(NodeId(999999), 0, NodeId(0), True, 0, 0) == BAD_NODE_ID_UNKNOWN
    assert jc_space.browse(OBJECTS, 3, NodeId(0), True, 0, 0) == BAD_BROWSE_DIRECTION_INVALID
    assert jc_space.browse(OBJECTS, 0, OBJECTS, True, 0, 0) == BAD_REFERENCE_TYPE_ID_INVALID
    assert jc_space.browse(OBJECTS, 0, NodeId(424242), True, 0, 0) == \
        BAD_REFERENCE_TYPE_ID_INVALID


def test_translate(jc_space: AddressSpace) -> None:
    def path(*names: str, ref: NodeId = HIERARCHICAL, inverse: bool = False
             ) -> list[tuple[NodeId, bool, bool, QualifiedName]]:
        return [(ref, inverse, True, QualifiedName(n)) for n in names]

    assert jc_space.translate(ROOT_FOLDER, path("Objects", "Server", "ServerStatus", "State")) \
        == [NodeId(2259)]
    assert jc_space.translate(NodeId(2259), path("ServerStatus", "Server", inverse=True)) == \
        [SERVER]
    assert jc_space.translate(ROOT_FOLDER, path("Objects", "Server", ref=NodeId(0))) == [SERVER]
    # HasComponent does not reach a property
    assert jc_space.translate(SERVER, path("NamespaceArray", ref=HAS_COMPONENT)) == BAD_NO_MATCH
    assert jc_space.translate(SERVER, [(HIERARCHICAL, False, True,
                                        QualifiedName("ServerArray", 1))]) == BAD_NO_MATCH
    assert jc_space.translate(NodeId(999999), path("Objects")) == BAD_NODE_ID_UNKNOWN
    assert jc_space.translate(ROOT_FOLDER, path("Objects", "")) == BAD_BROWSE_NAME_INVALID
    assert jc_space.translate(ROOT_FOLDER, []) == BAD_NOTHING_TO_DO
    assert jc_space.browse_path(ROOT_FOLDER, [QualifiedName("Objects"),
                                              QualifiedName("Server")]) == SERVER
    assert jc_space.browse_path(ROOT_FOLDER, [QualifiedName("Nothing")]) is None


# ---- types


def test_subtypes_and_their_cache(jc_space: AddressSpace) -> None:
    space = jc_space.copy()
    assert space.is_subtype(HAS_COMPONENT, HIERARCHICAL)
    assert space.is_subtype(NodeId(49), HAS_COMPONENT)          # HasOrderedComponent
    assert space.is_subtype(HAS_COMPONENT, HAS_COMPONENT)
    assert not space.is_subtype(HIERARCHICAL, HAS_COMPONENT)
    assert space.is_subtype(_jc(space, 3008), NodeId(22))
    assert NodeId(49) in space.subtypes(HAS_COMPONENT)
    assert space.supertypes(NodeId(49)) == [HAS_COMPONENT, NodeId(44), NodeId(34),
                                            HIERARCHICAL, NodeId(31)]
    mine = NodeId("HasPart", 3)
    space.add(Node(mine, 32, QualifiedName("HasPart", 3),
                   references=[Reference(HAS_SUBTYPE, HAS_COMPONENT, False)]))
    assert space.is_subtype(mine, HIERARCHICAL)
    space.remove_reference(HAS_COMPONENT, HAS_SUBTYPE, mine)
    assert not space.is_subtype(mine, HIERARCHICAL)
    space.add_reference(NodeId(49), HAS_SUBTYPE, mine)
    assert space.is_subtype(mine, HIERARCHICAL)
    space.remove(mine)
    assert mine not in space.subtypes(HIERARCHICAL)
    assert all(r.target != mine for r in space.get(NodeId(49)).references)
    assert space.type_definition(SERVER) == NodeId(2004)
    assert space.encoding_of(_jc(space, 5014)) == _jc(space, 3008)
    assert space.encoding(_jc(space, 3008)) == _jc(space, 5014)


def test_instantiate_the_job_order_receiver(jc_space: AddressSpace) -> None:
    space = jc_space.copy()
    receiver_type = _jc(space, 1002)
    nid = space.instantiate(OBJECTS, ORGANIZES, "Receiver", 2, "JobOrderReceiver",
                            receiver_type)
    assert nid == NodeId("Receiver", 2)
    node = space.get(nid)
    assert node is not None and node.node_class == 1
    assert node.browse_name == QualifiedName("JobOrderReceiver", 2)
    assert space.type_definition(nid) == receiver_type
    assert Reference(ORGANIZES, nid, True) in space.get(OBJECTS).references
    methods = {"Store", "StoreAndStart", "Start", "Stop", "Pause", "Resume", "Update",
               "Abort", "Cancel", "Clear", "RevokeStart"}
    jc = space.namespace_index(JC_URI)
    for name in methods:
        method = space.child(nid, QualifiedName(name, jc))
        assert method == NodeId(f"Receiver.{name}", 2), name
        m = space.get(method)
        assert m.node_class == 4
        assert not any(r.type_id == HAS_MODELLING_RULE for r in m.references)
        declaration = space.origin(method)
        assert declaration is not None and \
            space.child(receiver_type, QualifiedName(name, jc)) == declaration
        inputs = space.child(method, QualifiedName("InputArguments"))
        assert inputs == NodeId(f"Receiver.{name}.InputArguments", 2)
        copied = _value(space, inputs)
        declared = _value(space, space.child(declaration, QualifiedName("InputArguments")))
        assert copied == declared
        assert [_decode(ua.Argument, a).Name for a in copied]
    # a state machine's CurrentState and its Id come from FiniteStateMachineType's
    # supertypes, recursively through the state variable's type
    current = space.browse_path(nid, [QualifiedName("CurrentState"), QualifiedName("Id")])
    assert current == NodeId("Receiver.CurrentState.Id", 2)
    assert space.read(current, 14).value == Variant(NODE_ID, NodeId(17))
    # the states of the machine are no instance declarations
    assert space.child(nid, QualifiedName("Running", jc)) is None
    # every copy is a string id in namespace 2 and has no modelling rule
    made = [n for n in space if n.node_id.namespace == 2]
    assert all(str(n.node_id.identifier).startswith("Receiver") for n in made)
    assert all(r.type_id != HAS_MODELLING_RULE for n in made for r in n.references)


def test_instantiate_keeps_what_keep_says_and_rolls_back_on_a_clash(
        jc_space: AddressSpace) -> None:
    space = jc_space.copy()
    before = len(space)
    nid = space.instantiate(None, ORGANIZES, "R", 2, "R", _jc(space, 1002),
                            keep=lambda d: space.modelling_rule(d.node_id) == MANDATORY)
    made = {n.browse_name.name for n in space if n.node_id.namespace == 2}
    assert "CurrentState" in made and "LastTransition" not in made    # Optional left out
    space.remove(nid)
    for n in [n.node_id for n in space if n.node_id.namespace == 2]:
        space.remove(n)
    assert len(space) == before
    nid = space.instantiate(None, ORGANIZES, "R", 2, "R", _jc(space, 1002),
                            keep=lambda d: d.node_class == 4)
    made = {n.browse_name.name for n in space if n.node_id.namespace == 2}
    assert "CurrentState" not in made and "Store" in made
    assert "InputArguments" in made     # a method's arguments go with it, whatever keep says
    count = len(space)
    with pytest.raises(ValueError):
        space.instantiate(OBJECTS, ORGANIZES, "R", 2, "R", _jc(space, 1002))
    assert len(space) == count
    space.remove(nid)
    assert len(space) == count - 1     # its children stay: removing is one node's
    with pytest.raises(ValueError, match="no ObjectType"):
        space.instantiate(OBJECTS, ORGANIZES, "X", 2, "X", OBJECTS)
    assert before < count


def test_a_subtypes_declaration_overrides_its_supertypes() -> None:
    space = base_space()
    base_t = space.add_object_type(NodeId("BaseT", 2), "BaseT")
    space.add_variable(base_t.node_id, NodeId("BaseT.X", 2), "X", Variant(INT32, 1),
                       NodeId(6), ref_type=HAS_PROPERTY, modelling_rule=OPTIONAL)
    space.add_variable(base_t.node_id, NodeId("BaseT.Y", 2), "Y", Variant(INT32, 5),
                       NodeId(6), modelling_rule=MANDATORY)
    sub_t = space.add_object_type(NodeId("SubT", 2), "SubT", base_t.node_id)
    space.add_variable(sub_t.node_id, NodeId("SubT.X", 2), "X", Variant(INT32, 2),
                       NodeId(6), ref_type=HAS_PROPERTY, modelling_rule=MANDATORY)
    space.add_method(sub_t.node_id, NodeId("SubT.Go", 2), "Go",
                     [Argument("Speed", NodeId(11))], modelling_rule=MANDATORY)
    nid = space.instantiate(OBJECTS, HAS_COMPONENT, "Thing", 3, "Thing", sub_t.node_id)
    x = space.child(nid, QualifiedName("X", 2))
    assert x == NodeId("Thing.X", 3)
    assert _value(space, x) == 2
    assert space.type_definition(x) == NodeId(68)
    assert Reference(HAS_PROPERTY, nid, False) in space.get(x).references
    y = space.child(nid, QualifiedName("Y", 2))
    assert _value(space, y) == 5 and space.type_definition(y) == BASE_DATA_VARIABLE_TYPE
    assert [r.target for r in space.get(nid).references
            if r.forward and r.type_id in (HAS_PROPERTY, HAS_COMPONENT)].count(x) == 1
    go = space.child(nid, QualifiedName("Go", 2))
    args = _value(space, space.child(go, QualifiedName("InputArguments")))
    assert [_decode(ua.Argument, a).Name for a in args] == ["Speed"]


# ---- values


def test_set_value_watch_and_dynamic() -> None:
    space = AddressSpace()
    space.add_folder(None, NodeId("top", 1), "Top")
    var = space.add_variable(NodeId("top", 1), NodeId("v", 1), "V", Variant(INT32, 1),
                             NodeId(6), access_level=3).node_id
    seen: list[DataValue] = []
    unwatch = space.watch(var, seen.append)
    before = ticks_now()
    space.set_value(var, Variant(INT32, 2))
    dv = space.read(var, 13)
    assert dv.value == Variant(INT32, 2) and dv.source_time is not None
    assert dv.source_time >= before and seen == [dv]
    space.set_value(var, DataValue(Variant(INT32, 3), 0x40000000))
    assert space.read(var, 13).status == 0x40000000 and len(seen) == 2
    unwatch()
    space.set_value(var, Variant(INT32, 4))
    assert len(seen) == 2
    with pytest.raises(KeyError):
        space.set_value(NodeId("top", 1), Variant(INT32, 1))     # an Object
    calls = iter(range(100))
    space.dynamic(var, lambda: Variant(INT32, next(calls)))
    assert space.read(var, 13).value == Variant(INT32, 0)
    assert space.read(var, 13).value == Variant(INT32, 1)
    space.dynamic(var, None)
    assert space.read(var, 13).value == Variant(INT32, 4)
    assert space.read(var, 17).value == Variant(BYTE, 3)


def test_references_wait_for_their_other_end() -> None:
    space = base_space()        # the reference types: what makes Organizes hierarchical
    a, b = NodeId("a", 1), NodeId("b", 1)
    space.add_folder(None, a, "A")
    space.add_reference(a, ORGANIZES, b)
    found = space.browse(a, 0, ORGANIZES, True, 0, 0)
    assert not isinstance(found, int) and [(r.target, r.node_class) for r in found] == \
        [(b, 0)]                                                # b is not there yet
    assert space.browse(a, 0, ORGANIZES, True, 1, 0) == []
    space.add(Node(b, 1, QualifiedName("B", 1)))
    assert Reference(ORGANIZES, a, False) in space.get(b).references
    assert space.child(a, QualifiedName("B", 1)) == b
    space.add_reference(a, ORGANIZES, b)                    # once only
    assert space.get(a).references.count(Reference(ORGANIZES, b, True)) == 1
    space.remove(b)
    assert space.get(a).references == [Reference(HAS_TYPE_DEFINITION, NodeId(61), True)]
    with pytest.raises(ValueError):
        space.add(Node(a, 1, QualifiedName("A", 1)))


def test_builders() -> None:
    space = base_space()
    folder = space.add_folder(OBJECTS, NodeId("Plant", 2), "Plant").node_id
    assert space.type_definition(folder) == NodeId(61)
    assert Reference(ORGANIZES, folder, True) in space.get(OBJECTS).references
    obj = space.add_object(folder, NodeId("Unit", 2), "Unit", event_notifier=1).node_id
    assert space.read(obj, 12).value == Variant(BYTE, 1)
    prop = space.add_variable(obj, NodeId("Unit.Size", 2), "Size", Variant(DOUBLE, 1.5),
                              NodeId(11), ref_type=HAS_PROPERTY).node_id
    assert space.type_definition(prop) == NodeId(68)
    arr = space.add_variable(obj, NodeId("Unit.Vals", 2), "Vals", Variant(INT32, [1, 2]),
                             NodeId(6), 1, array_dimensions=[2]).node_id
    assert space.read(arr, 16).value == Variant(UINT32, [2])
    method = space.add_method(obj, NodeId("Unit.Run", 2), "Run",
                              [Argument("Recipe", NodeId(12))],
                              [Argument("Id", NodeId(7))]).node_id
    assert space.read(method, 21).value == Variant(BOOLEAN, True)
    outs = _value(space, space.child(method, QualifiedName("OutputArguments")))
    assert [_decode(ua.Argument, a).Name for a in outs] == ["Id"]
    event = space.add_event_type(NodeId("UnitEvent", 2), "UnitEvent",
                                 [("Unit", NodeId(12))]).node_id
    assert space.is_subtype(event, NodeId(2041))
    field = space.child(event, QualifiedName("Unit", 2))
    assert space.modelling_rule(field) == MANDATORY
    assert space.read(field, 14).value == Variant(NODE_ID, NodeId(12))


# ---- namespace 0 and the Server object


def test_base_space_is_a_fresh_copy_each_time() -> None:
    first = base_space()
    first.add_folder(OBJECTS, NodeId("Mine", 1), "Mine")
    first.register_namespace("urn:mine")
    second = base_space()
    assert NodeId("Mine", 1) not in second and second.namespaces == [
        "http://opcfoundation.org/UA/"]
    assert all(r.target != NodeId("Mine", 1) for r in second.get(OBJECTS).references)
    assert 400 < len(second) < 1000
    t0 = time.perf_counter()
    base_space()
    assert time.perf_counter() - t0 < 1.0       # a copy, not a parse of the file


def test_describe_server() -> None:
    space = base_space()
    start = ticks_now()
    describe_server(space, "urn:sfc:host", "urn:sfc-fast",
                    {"ProductName": "sfc-fast", "ManufacturerName": "sfc-fast developers",
                     "SoftwareVersion": "0.1.0", "build_number": "7",
                     "BuildDate": datetime(2026, 1, 2, tzinfo=UTC)},
                    start, limits={"MaxBrowseContinuationPoints": 16})
    assert _value(space, NodeId(2254)) == ["urn:sfc:host"]
    seen: list[DataValue] = []
    space.watch(NodeId(2255), seen.append)
    index = space.register_namespace("urn:plant")
    assert _value(space, NodeId(2255)) == ["http://opcfoundation.org/UA/", "urn:plant"]
    assert index == 1 and len(seen) == 1
    assert space.read(NodeId(2259), 13).value == Variant(INT32, 0)
    assert space.read(NodeId(2267), 13).value == Variant(BYTE, 255)
    assert space.read(NodeId(2994), 13).value == Variant(BOOLEAN, False)
    assert space.read(NodeId(2294), 17).value == Variant(BYTE, 1)  # diagnostics stay off
    assert space.read(NodeId(3709), 13).value == Variant(INT32, 0)
    assert space.read(NodeId(11705), 13).value.type == UINT32     # MaxNodesPerRead
    assert _value(space, NodeId(11705)) > 0
    assert _value(space, NodeId(2735)) == 16                       # MaxBrowseContinuation..
    assert _value(space, NodeId(2271)) == ["en"]
    assert space.read(NodeId(2272), 13).value.type == DOUBLE
    t1 = _value(space, NodeId(2258))
    time.sleep(0.002)
    t2 = _value(space, NodeId(2258))
    assert isinstance(t1, datetime) and t2 > t1
    status = _decode(ua.ServerStatusDataType, _value(space, NodeId(2256)))
    assert status.State == ua.ServerState.Running
    assert status.BuildInfo.ProductUri == "urn:sfc-fast"
    assert status.BuildInfo.ProductName == "sfc-fast"
    assert status.BuildInfo.BuildNumber == "7"
    assert status.BuildInfo.BuildDate == datetime(2026, 1, 2, tzinfo=UTC)
    assert status.CurrentTime >= status.StartTime
    space.set_value(NodeId(2259), Variant(INT32, 4))               # Shutdown
    assert _decode(ua.ServerStatusDataType, _value(space, NodeId(2256))).State == \
        ua.ServerState.Shutdown
    info = _decode(ua.BuildInfo, _value(space, NodeId(2260)))
    assert (info.ManufacturerName, info.SoftwareVersion) == ("sfc-fast developers", "0.1.0")
    assert _value(space, NodeId(2262)) == "urn:sfc-fast"
