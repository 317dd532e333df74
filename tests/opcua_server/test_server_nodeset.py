"""The NodeSet2 loader (``sfc_host.opcua_server.nodeset``) and the namespace 0 file it
reads: the ISA-95 Job Control and PackML NodeSets load on it with every reference
resolved; values of the built-in types and the structures are what the XML says (the
structures decoded by asyncua's codec, an implementation of its own); DataType
definitions of each kind; a broken node is named and leaves nothing behind; and the
trimmed namespace 0 file agrees with the OPC Foundation's full one and is what the
generator makes of it."""

from __future__ import annotations

import subprocess
import sys
import uuid
import xml.etree.ElementTree as ET
from datetime import UTC, datetime
from pathlib import Path

import pytest
from asyncua import ua
from asyncua.common.utils import Buffer
from asyncua.ua.ua_binary import struct_from_binary

from sfc_fast.wire.uabinary import (
    BOOLEAN,
    BYTE_STRING,
    DATETIME,
    DOUBLE,
    EXTENSION_OBJECT,
    GUID,
    INT32,
    LOCALIZED_TEXT,
    NODE_ID,
    QUALIFIED_NAME,
    STRING,
    UINT16,
    ExtensionObject,
    LocalizedText,
    NodeId,
    QualifiedName,
    Variant,
)
from sfc_host.opcua_server.base import BASE_NODESET, base_space
from sfc_host.opcua_server.nodes import (
    EnumDefinition,
    StructureDefinition,
)
from sfc_host.opcua_server.nodeset import NodesetError, load_nodeset

ROOT = Path(__file__).resolve().parents[2]
JOB_CONTROL = ROOT / "src" / "sfc_host" / "opcua" / "nodeset" / \
    "opc.ua.isa95-jobcontrol.nodeset2.xml"
PACKML = ROOT / "src" / "sfc_host" / "equipment" / "opcua" / "nodeset" / \
    "Opc.Ua.PackML.NodeSet2.xml"
OFFICIAL = ROOT / "tests" / "peers" / "node_modules" / "node-opcua-nodesets" / "nodesets" / \
    "Opc.Ua.NodeSet2.xml"
GENERATOR = ROOT / "tools" / "base_nodeset.py"
NS = "{http://opcfoundation.org/UA/2011/03/UANodeSet.xsd}"
NO_OFFICIAL = "node-opcua's nodesets are not installed (npm ci in tests/peers)"

HEAD = """<?xml version="1.0" encoding="utf-8"?>
<UANodeSet xmlns="http://opcfoundation.org/UA/2011/03/UANodeSet.xsd"
           xmlns:uax="http://opcfoundation.org/UA/2008/02/Types.xsd"
           xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance">
  <NamespaceUris><Uri>urn:test:a</Uri><Uri>urn:test:b</Uri></NamespaceUris>
  <Aliases>
    <Alias Alias="HasComponent">i=47</Alias>
    <Alias Alias="HasProperty">i=46</Alias>
    <Alias Alias="HasTypeDefinition">i=40</Alias>
    <Alias Alias="HasSubtype">i=45</Alias>
    <Alias Alias="Organizes">i=35</Alias>
    <Alias Alias="Int32">i=6</Alias>
    <Alias Alias="Argument">i=296</Alias>
  </Aliases>
"""
TAIL = "</UANodeSet>\n"


def _variable(ident: int, name: str, data_type: str, value: str, rank: int = -1) -> str:
    return f"""
  <UAVariable NodeId="ns=2;i={ident}" BrowseName="2:{name}" ParentNodeId="ns=2;i=1"
              DataType="{data_type}" ValueRank="{rank}">
    <DisplayName>{name}</DisplayName>
    <References>
      <Reference ReferenceType="HasTypeDefinition">i=63</Reference>
      <Reference ReferenceType="HasComponent" IsForward="false">ns=2;i=1</Reference>
    </References>
    <Value>{value}</Value>
  </UAVariable>"""


def _doc(*nodes: str) -> bytes:
    return (HEAD + "".join(nodes) + TAIL).encode()


# the variables come before the object that holds them: references wait for their end
VALUES = _doc(
    _variable(10, "S", "i=12", "<uax:String>hello</uax:String>"),
    _variable(11, "Ss", "i=12", "<uax:ListOfString><uax:String>a</uax:String>"
              "<uax:String>b</uax:String></uax:ListOfString>", 1),
    _variable(12, "T", "i=21", "<uax:LocalizedText><uax:Locale>de</uax:Locale>"
              "<uax:Text>Hallo</uax:Text></uax:LocalizedText>"),
    _variable(13, "Ts", "i=21", "<uax:ListOfLocalizedText><uax:LocalizedText>"
              "<uax:Text>x</uax:Text></uax:LocalizedText></uax:ListOfLocalizedText>", 1),
    _variable(14, "I", "Int32", "<uax:Int32>-7</uax:Int32>"),
    _variable(15, "U", "i=5", "<uax:UInt16>65535</uax:UInt16>"),
    _variable(16, "B", "i=1", "<uax:Boolean>true</uax:Boolean>"),
    _variable(17, "D", "i=11", "<uax:Double>2.5</uax:Double>"),
    _variable(18, "When", "i=13", "<uax:DateTime>2024-01-31T12:00:00Z</uax:DateTime>"),
    _variable(19, "Raw", "i=15", "<uax:ByteString>AAEC</uax:ByteString>"),
    _variable(20, "G", "i=14", "<uax:Guid><uax:String>72962b91-fa75-4ae6-8d28-b404dc7daf63"
              "</uax:String></uax:Guid>"),
    _variable(21, "N", "i=17", "<uax:NodeId><uax:Identifier>ns=1;s=x</uax:Identifier>"
              "</uax:NodeId>"),
    _variable(22, "Q", "i=20", "<uax:QualifiedName><uax:NamespaceIndex>2</uax:NamespaceIndex>"
              "<uax:Name>q</uax:Name></uax:QualifiedName>"),
    _variable(23, "Args", "Argument", """<uax:ListOfExtensionObject>
        <uax:ExtensionObject><uax:TypeId><uax:Identifier>i=297</uax:Identifier></uax:TypeId>
          <uax:Body><uax:Argument><uax:Name>Speed</uax:Name>
            <uax:DataType><uax:Identifier>ns=1;i=3008</uax:Identifier></uax:DataType>
            <uax:ValueRank>1</uax:ValueRank>
            <uax:ArrayDimensions><uax:UInt32>4</uax:UInt32></uax:ArrayDimensions>
            <uax:Description><uax:Text>how fast</uax:Text></uax:Description>
          </uax:Argument></uax:Body></uax:ExtensionObject>
        <uax:ExtensionObject><uax:TypeId><uax:Identifier>i=297</uax:Identifier></uax:TypeId>
          <uax:Body><uax:Argument><uax:Name>Nil</uax:Name>
            <uax:DataType><uax:Identifier>i=12</uax:Identifier></uax:DataType>
            <uax:ValueRank>-1</uax:ValueRank><uax:ArrayDimensions />
            <uax:Description xsi:nil="true" />
          </uax:Argument></uax:Body></uax:ExtensionObject>
      </uax:ListOfExtensionObject>""", 1),
    _variable(24, "Enum", "i=7594", """<uax:ExtensionObject>
        <uax:TypeId><uax:Identifier>i=7616</uax:Identifier></uax:TypeId>
        <uax:Body><uax:EnumValueType><uax:Value>-2</uax:Value>
          <uax:DisplayName><uax:Text>Minus two</uax:Text></uax:DisplayName>
          <uax:Description><uax:Text>below zero</uax:Text></uax:Description>
        </uax:EnumValueType></uax:Body></uax:ExtensionObject>"""),
    _variable(25, "Unit", "i=887", """<uax:ExtensionObject>
        <uax:TypeId><uax:Identifier>i=888</uax:Identifier></uax:TypeId>
        <uax:Body><uax:EUInformation>
          <uax:NamespaceUri>http://www.opcfoundation.org/UA/units/un/cefact</uax:NamespaceUri>
          <uax:UnitId>4408652</uax:UnitId>
          <uax:DisplayName><uax:Text>°C</uax:Text></uax:DisplayName>
          <uax:Description><uax:Text>degree Celsius</uax:Text></uax:Description>
        </uax:EUInformation></uax:Body></uax:ExtensionObject>"""),
    _variable(26, "Span", "i=884", """<uax:ExtensionObject>
        <uax:TypeId><uax:Identifier>i=885</uax:Identifier></uax:TypeId>
        <uax:Body><uax:Range><uax:Low>-10</uax:Low><uax:High>90.5</uax:High></uax:Range>
        </uax:Body></uax:ExtensionObject>"""),
    _variable(27, "Other", "i=22", """<uax:ExtensionObject>
        <uax:TypeId><uax:Identifier>ns=1;i=5</uax:Identifier></uax:TypeId>
        <uax:Body><uax:Thing><uax:Size>3</uax:Size></uax:Thing></uax:Body>
        </uax:ExtensionObject>"""),
    """
  <UAObject NodeId="ns=2;i=1" BrowseName="2:Box" EventNotifier="1">
    <DisplayName Locale="en">Box</DisplayName>
    <Description>holds the values</Description>
    <References>
      <Reference ReferenceType="Organizes" IsForward="false">i=85</Reference>
      <Reference ReferenceType="HasTypeDefinition">i=58</Reference>
    </References>
  </UAObject>""")

DEFINITIONS = _doc("""
  <UADataType NodeId="ns=1;i=100" BrowseName="1:Opt">
    <DisplayName>Opt</DisplayName>
    <References>
      <Reference ReferenceType="HasSubtype" IsForward="false">i=22</Reference>
      <Reference ReferenceType="i=38">ns=1;i=101</Reference>
      <Reference ReferenceType="i=38">ns=1;i=102</Reference>
    </References>
    <Definition Name="1:Opt">
      <Field Name="A" DataType="Int32" />
      <Field Name="B" DataType="i=12" ValueRank="1" ArrayDimensions="0" IsOptional="true"
             MaxStringLength="40"><Description>bee</Description></Field>
    </Definition>
  </UADataType>
  <UAObject NodeId="ns=1;i=101" BrowseName="Default XML">
    <DisplayName>Default XML</DisplayName>
    <References><Reference ReferenceType="HasTypeDefinition">i=76</Reference></References>
  </UAObject>
  <UAObject NodeId="ns=1;i=102" BrowseName="Default Binary">
    <DisplayName>Default Binary</DisplayName>
    <References><Reference ReferenceType="HasTypeDefinition">i=76</Reference></References>
  </UAObject>
  <UADataType NodeId="ns=1;i=110" BrowseName="1:Either">
    <DisplayName>Either</DisplayName>
    <References>
      <Reference ReferenceType="HasSubtype" IsForward="false">ns=1;i=100</Reference>
    </References>
    <Definition Name="1:Either" IsUnion="true">
      <Field Name="Number" DataType="i=11" />
      <Field Name="Text" DataType="i=12" />
    </Definition>
  </UADataType>
  <UADataType NodeId="ns=1;i=120" BrowseName="1:Colour">
    <DisplayName>Colour</DisplayName>
    <References>
      <Reference ReferenceType="HasSubtype" IsForward="false">i=29</Reference>
    </References>
    <Definition Name="1:Colour">
      <Field Name="Red" Value="1"><Description>warm</Description></Field>
      <Field Name="Blue" Value="5"><DisplayName>Bleu</DisplayName></Field>
    </Definition>
  </UADataType>
  <UADataType NodeId="ns=1;i=130" BrowseName="1:Flags">
    <DisplayName>Flags</DisplayName>
    <References>
      <Reference ReferenceType="HasSubtype" IsForward="false">i=7</Reference>
    </References>
    <Definition Name="1:Flags" IsOptionSet="true">
      <Field Name="Read" Value="0" />
      <Field Name="Write" Value="1" />
    </Definition>
  </UADataType>""")


def _value(space, node: NodeId) -> Variant:
    dv = space.read(node, 13)
    assert dv.status == 0 and dv.value is not None, dv
    return dv.value


def _decode(cls: type, obj: ExtensionObject) -> object:
    assert obj.body is not None and obj.encoding == 1
    return struct_from_binary(cls, Buffer(obj.body))


def _elements(path: Path) -> list[ET.Element]:
    return [e for e in ET.parse(path).getroot() if e.tag.startswith(f"{NS}UA")]


# ---- the product's NodeSets


@pytest.mark.parametrize("files", [[JOB_CONTROL], [PACKML], [JOB_CONTROL, PACKML]],
                         ids=["job-control", "packml", "both"])
def test_the_nodesets_load_on_the_base_with_every_reference_resolved(files: list[Path]
                                                                      ) -> None:
    space = base_space()
    before = len(space)
    for path in files:
        added = load_nodeset(space, path)
        assert len(added) == len(_elements(path)) and len(set(added)) == len(added)
    assert len(space) == before + sum(len(_elements(p)) for p in files)
    dangling = sorted(f"{n.node_id} -> {r.target}" for n in space for r in n.references
                      if r.target not in space)
    assert not dangling, dangling[:20]
    for path in files:
        uri = ET.parse(path).getroot().find(f"{NS}NamespaceUris/{NS}Uri").text
        index = space.namespace_index(uri)
        assert space.read(NodeId(2255), 13).value.value[index] == uri


def test_job_control_nodes_are_what_the_file_says() -> None:
    space = base_space()
    load_nodeset(space, JOB_CONTROL)
    jc = space.namespace_index("http://opcfoundation.org/UA/ISA95-JOBCONTROL_V2/")
    classes = {"UAObject": 1, "UAVariable": 2, "UAMethod": 4, "UAObjectType": 8,
               "UAVariableType": 16, "UAReferenceType": 32, "UADataType": 64, "UAView": 128}
    for el in _elements(JOB_CONTROL):
        nid = NodeId.parse(el.get("NodeId").replace("ns=1;", ""))
        nid = NodeId(nid.identifier, jc)
        node = space.get(nid)
        assert node is not None, nid
        assert node.node_class == classes[el.tag[len(NS):]]
        name = el.get("BrowseName")
        assert node.browse_name == (QualifiedName(name[2:], jc) if name.startswith("1:")
                                    else QualifiedName(name, 0))
        assert node.display_name.text == el.find(f"{NS}DisplayName").text
    receiver = space.get(NodeId(1002, jc))
    assert space.supertypes(receiver.node_id)[0] == NodeId(2771)   # FiniteStateMachineType
    assert isinstance(space.get(NodeId(3008, jc)).attributes[23], StructureDefinition)


# ---- values and definitions


def test_values_of_the_builtin_types() -> None:
    space = base_space()
    space.register_namespace("urn:test:b")         # an index the file's does not match
    load_nodeset(space, VALUES)
    a, b = space.namespace_index("urn:test:a"), space.namespace_index("urn:test:b")
    assert (a, b) == (2, 1)

    def v(ident: int) -> Variant:
        return _value(space, NodeId(ident, b))

    assert v(10) == Variant(STRING, "hello")
    assert v(11) == Variant(STRING, ["a", "b"])
    assert v(12) == Variant(LOCALIZED_TEXT, LocalizedText("Hallo", "de"))
    assert v(13) == Variant(LOCALIZED_TEXT, [LocalizedText("x")])
    assert v(14) == Variant(INT32, -7)
    assert v(15) == Variant(UINT16, 65535)
    assert v(16) == Variant(BOOLEAN, True)
    assert v(17) == Variant(DOUBLE, 2.5)
    assert v(18) == Variant(DATETIME, datetime(2024, 1, 31, 12, tzinfo=UTC))
    assert v(19) == Variant(BYTE_STRING, b"\x00\x01\x02")
    assert v(20) == Variant(GUID, uuid.UUID("72962b91-fa75-4ae6-8d28-b404dc7daf63"))
    assert v(21) == Variant(NODE_ID, NodeId("x", a))
    assert v(22) == Variant(QUALIFIED_NAME, QualifiedName("q", b))
    box = space.get(NodeId(1, b))
    assert box.browse_name == QualifiedName("Box", b)
    assert box.display_name == LocalizedText("Box", "en")
    assert box.description == LocalizedText("holds the values")
    assert space.read(box.node_id, 12).value.value == 1
    assert space.child(NodeId(85), QualifiedName("Box", b)) == box.node_id
    assert space.child(box.node_id, QualifiedName("Raw", b)) == NodeId(19, b)
    assert space.read(NodeId(14, b), 14).value == Variant(NODE_ID, NodeId(6))


def test_values_of_structures_decode_with_asyncua() -> None:
    space = base_space()
    load_nodeset(space, VALUES)
    a, b = space.namespace_index("urn:test:a"), space.namespace_index("urn:test:b")
    args = _value(space, NodeId(23, b))
    assert args.type == EXTENSION_OBJECT and args.is_array
    assert all(x.type_id == NodeId(298) for x in args.value)
    speed, nil = (_decode(ua.Argument, x) for x in args.value)
    assert (speed.Name, speed.DataType, speed.ValueRank, speed.ArrayDimensions,
            speed.Description.Text) == ("Speed", ua.NodeId(3008, a), 1, [4], "how fast")
    assert (nil.Name, nil.DataType, nil.ArrayDimensions, nil.Description.Text) == \
        ("Nil", ua.NodeId(12), [], None)
    enum = _value(space, NodeId(24, b)).value
    assert enum.type_id == NodeId(8251)
    ev = _decode(ua.EnumValueType, enum)
    assert (ev.Value, ev.DisplayName.Text, ev.Description.Text) == \
        (-2, "Minus two", "below zero")
    unit = _value(space, NodeId(25, b)).value
    assert unit.type_id == NodeId(889)
    eu = _decode(ua.EUInformation, unit)
    assert (eu.NamespaceUri, eu.UnitId, eu.DisplayName.Text, eu.Description.Text) == \
        ("http://www.opcfoundation.org/UA/units/un/cefact", 4408652, "°C", "degree Celsius")
    span = _value(space, NodeId(26, b)).value
    assert span.type_id == NodeId(886)
    r = _decode(ua.Range, span)
    assert (r.Low, r.High) == (-10.0, 90.5)
    other = _value(space, NodeId(27, b)).value         # no layout known: kept as XML
    assert other.encoding == 2 and other.type_id == NodeId(5, a)
    assert b"Size" in other.body


def test_definitions_of_each_kind_decode_with_asyncua() -> None:
    space = base_space()
    load_nodeset(space, DEFINITIONS)
    a = space.namespace_index("urn:test:a")

    def definition(ident: int) -> ExtensionObject:
        dv = space.read(NodeId(ident, a), 23)
        assert dv.status == 0 and dv.value is not None
        return dv.value.value

    opt = _decode(ua.StructureDefinition, definition(100))
    assert opt.DefaultEncodingId == ua.NodeId(102, a)       # "Default Binary", not XML
    assert opt.BaseDataType == ua.NodeId(22)
    assert opt.StructureType == ua.StructureType.StructureWithOptionalFields
    assert [(f.Name, f.DataType, f.ValueRank, f.ArrayDimensions, f.MaxStringLength,
             f.IsOptional, f.Description.Text) for f in opt.Fields] == [
        ("A", ua.NodeId(6), -1, [], 0, False, None),
        ("B", ua.NodeId(12), 1, [0], 40, True, "bee")]
    union = _decode(ua.StructureDefinition, definition(110))
    assert union.StructureType == ua.StructureType.Union
    assert union.BaseDataType == ua.NodeId(100, a)
    assert union.DefaultEncodingId == ua.NodeId(0)           # it has no encoding
    assert [f.Name for f in union.Fields] == ["Number", "Text"]
    colour = definition(120)
    assert colour.type_id == NodeId(123)
    enum = _decode(ua.EnumDefinition, colour)
    assert [(f.Name, f.Value, f.DisplayName.Text, f.Description.Text) for f in enum.Fields] == [
        ("Red", 1, "Red", "warm"), ("Blue", 5, "Bleu", None)]
    flags = space.get(NodeId(130, a)).attributes[23]
    assert isinstance(flags, EnumDefinition) and [f.value for f in flags.fields] == [0, 1]


# ---- bad input


@pytest.mark.parametrize(("node", "fault"), [
    ('<UAObject NodeId="ns=1;x=5" BrowseName="1:X"><DisplayName>X</DisplayName></UAObject>',
     "ns=1;x=5"),
    ('<UAObject NodeId="ns=7;i=5" BrowseName="1:X"><DisplayName>X</DisplayName></UAObject>',
     "namespace index 7"),
    ('<UAObject NodeId="ns=1;i=5" BrowseName="9:X"><DisplayName>X</DisplayName></UAObject>',
     "namespace index 9"),
    ('<UAObject NodeId="ns=1;i=5"><DisplayName>X</DisplayName></UAObject>', "no BrowseName"),
    ('<UAObjectType NodeId="ns=1;i=5" BrowseName="1:X" IsAbstract="maybe">'
     '<DisplayName>X</DisplayName></UAObjectType>', "'maybe' is no Boolean"),
    ('<UAVariable NodeId="ns=1;i=5" BrowseName="1:X" DataType="i=6"><DisplayName>X'
     '</DisplayName><Value><uax:Int32>seven</uax:Int32></Value></UAVariable>', "seven"),
    ('<UAVariable NodeId="ns=1;i=5" BrowseName="1:X" DataType="i=6"><DisplayName>X'
     '</DisplayName><Value><uax:Matrix /></Value></UAVariable>', "Matrix is not supported"),
    ('<UAVariable NodeId="ns=1;i=5" BrowseName="1:X" ParentNodeId="i=85" DataType="i=6">'
     '<DisplayName>X</DisplayName></UAVariable>', "ParentNodeId i=85"),
    ('<UAObject NodeId="i=85" BrowseName="Objects"><DisplayName>O</DisplayName></UAObject>',
     "already in the address space"),
])
def test_a_broken_node_is_named_and_nothing_of_the_file_stays(
        tmp_path: Path, node: str, fault: str) -> None:
    path = tmp_path / "broken.xml"
    good = ('<UAObject NodeId="ns=1;i=4" BrowseName="1:Fine"><DisplayName>Fine</DisplayName>'
            '<References><Reference ReferenceType="Organizes" IsForward="false">i=85'
            '</Reference></References></UAObject>')
    path.write_bytes(_doc(good, node))
    space = base_space()
    before = len(space)
    objects = list(space.get(NodeId(85)).references)
    with pytest.raises(NodesetError) as err:
        load_nodeset(space, path)
    message = str(err.value)
    assert message.startswith("broken.xml: node ") and fault in message, message
    assert "\n" not in message
    assert len(space) == before and space.get(NodeId(85)).references == objects
    assert isinstance(err.value, ValueError)


def test_what_is_no_nodeset(tmp_path: Path) -> None:
    space = base_space()
    with pytest.raises(NodesetError, match=r"^<bytes>: not XML"):
        load_nodeset(space, b"<UANodeSet")
    with pytest.raises(NodesetError, match=r"^<bytes>: not a UANodeSet"):
        load_nodeset(space, b"<html/>")
    with pytest.raises(NodesetError, match=r"^absent\.xml: cannot be read"):
        load_nodeset(space, tmp_path / "absent.xml")


# ---- the namespace 0 file


def test_the_base_file_is_lean_and_carries_its_licence_and_origin() -> None:
    text = BASE_NODESET.read_text(encoding="utf-8")
    assert len(text.encode()) < 1_000_000
    head = text[:4000]
    assert "OPC Foundation MIT License 1.00" in head
    assert "python tools/base_nodeset.py Opc.Ua.NodeSet2.xml" in head
    nodes = _elements(BASE_NODESET)
    assert 300 < len(nodes) < 1000
    ids = {e.get("NodeId") for e in nodes}
    for wanted in (84, 85, 86, 87, 88, 89, 90, 91, 3048, 2041, 2253, 2254, 2255, 2256, 2257,
                   2258, 2259, 2260, 2992, 2993, 2267, 2994, 2268, 11704, 2271, 2274, 2294,
                   2296, 3709, 99, 100, 101, 102, 122, 123, 296, 298, 7594, 8251, 887, 889,
                   884, 886, 338, 340, 862, 864, 8912, *range(1, 26)):
        assert f"i={wanted}" in ids, wanted
    reference_types = {e.get("NodeId") for e in nodes if e.tag == f"{NS}UAReferenceType"}
    assert {"i=31", "i=33", "i=35", "i=45", "i=46", "i=47"} <= reference_types


@pytest.mark.skipif(not OFFICIAL.exists(), reason=NO_OFFICIAL)
def test_the_base_file_agrees_with_the_official_nodeset() -> None:
    official = {e.get("NodeId"): e for e in _elements(OFFICIAL)}
    aliases = {a.get("Alias"): a.text
               for a in ET.parse(OFFICIAL).getroot().iter(f"{NS}Alias")}

    def refs(el: ET.Element) -> set[tuple[str, str, str]]:
        return {(aliases.get(r.get("ReferenceType"), r.get("ReferenceType")),
                 r.get("IsForward", "true"), r.text) for r in el.iter(f"{NS}Reference")}

    ours = _elements(BASE_NODESET)
    for el in ours:
        nid = el.get("NodeId")
        theirs = official.get(nid)
        assert theirs is not None, nid
        assert el.tag == theirs.tag, nid
        assert el.get("BrowseName") == theirs.get("BrowseName"), nid
        assert el.get("ParentNodeId") == theirs.get("ParentNodeId"), nid
        assert el.get("DataType") == theirs.get("DataType"), nid
        assert refs(el) <= refs(theirs), nid
        # the parent reference, where a node has one, is kept
        parent = el.get("ParentNodeId")
        if parent:
            assert any(r[2] == parent for r in refs(el)), nid
    # the space agrees with the file, node for node
    space = base_space()
    assert len(space) == len(ours)


@pytest.mark.skipif(not OFFICIAL.exists(), reason=NO_OFFICIAL)
def test_the_generator_makes_the_base_file(tmp_path: Path) -> None:
    out = tmp_path / "base.xml"
    done = subprocess.run([sys.executable, str(GENERATOR), str(OFFICIAL), "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert out.read_bytes() == BASE_NODESET.read_bytes(), \
        "the base file differs from what tools/base_nodeset.py makes: regenerate it"
