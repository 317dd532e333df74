"""Loads a NodeSet2 XML file (IEC 62541 Part 6 Annex F) into an ``AddressSpace``: the
information models the server offers (namespace 0, ISA-95 Job Control, PackML) come as
the OPC Foundation's NodeSets, read as they are published rather than retyped in code.

Values are turned into the codec's Variants; the structures a NodeSet carries in
values (Argument, EnumValueType, EUInformation, Range) into binary ExtensionObjects, any
other one kept XML-encoded; a DataType's ``Definition`` into its DataTypeDefinition.
"""

from __future__ import annotations

import base64
import re
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sfc_fast.wire.uabinary import (
    BOOLEAN,
    BYTE,
    BYTE_STRING,
    DATETIME,
    DOUBLE,
    EXPANDED_NODE_ID,
    EXTENSION_OBJECT,
    FLOAT,
    GUID,
    INT16,
    INT32,
    INT64,
    LOCALIZED_TEXT,
    NODE_ID,
    QUALIFIED_NAME,
    SBYTE,
    STATUS_CODE,
    STRING,
    UINT16,
    UINT32,
    UINT64,
    XML_ELEMENT,
    DataValue,
    ExpandedNodeId,
    ExtensionObject,
    LocalizedText,
    NodeId,
    QualifiedName,
    Variant,
)
from sfc_host.errors import SfcHostError
from sfc_host.opcua_server.nodes import (
    ACCESS_LEVEL,
    ACCESS_LEVEL_EX,
    ARRAY_DIMENSIONS,
    CONTAINS_NO_LOOPS,
    DATA_TYPE,
    DATA_TYPE_ATTR,
    DATA_TYPE_DEFINITION,
    EVENT_NOTIFIER,
    EXECUTABLE,
    HISTORIZING,
    INVERSE_NAME,
    IS_ABSTRACT,
    METHOD,
    MINIMUM_SAMPLING_INTERVAL,
    OBJECT,
    OBJECT_TYPE,
    REFERENCE_TYPE,
    SYMMETRIC,
    USER_ACCESS_LEVEL,
    USER_EXECUTABLE,
    VALUE,
    VALUE_RANK,
    VARIABLE,
    VARIABLE_TYPE,
    VIEW,
    WRITE_MASK,
    AddressSpace,
    Argument,
    EnumDefinition,
    EnumField,
    EnumValueType,
    EUInformation,
    Node,
    Range,
    Reference,
    StructureDefinition,
    StructureField,
)

__all__ = ["NodesetError", "load_nodeset"]

_NS = "{http://opcfoundation.org/UA/2011/03/UANodeSet.xsd}"
_TYPES_NS = "http://opcfoundation.org/UA/2008/02/Types.xsd"
_XSI_NIL = "{http://www.w3.org/2001/XMLSchema-instance}nil"

_CLASSES = {"UAObject": OBJECT, "UAVariable": VARIABLE, "UAMethod": METHOD,
            "UAObjectType": OBJECT_TYPE, "UAVariableType": VARIABLE_TYPE,
            "UADataType": DATA_TYPE, "UAReferenceType": REFERENCE_TYPE, "UAView": VIEW}

_STRUCTURE = NodeId(22)
_ENUMERATION = NodeId(29)

_BUILTINS: dict[str, int] = {
    "Boolean": BOOLEAN, "SByte": SBYTE, "Byte": BYTE, "Int16": INT16, "UInt16": UINT16,
    "Int32": INT32, "UInt32": UINT32, "Int64": INT64, "UInt64": UINT64, "Float": FLOAT,
    "Double": DOUBLE, "String": STRING, "DateTime": DATETIME, "Guid": GUID,
    "ByteString": BYTE_STRING, "XmlElement": XML_ELEMENT, "NodeId": NODE_ID,
    "ExpandedNodeId": EXPANDED_NODE_ID, "StatusCode": STATUS_CODE,
    "QualifiedName": QUALIFIED_NAME, "LocalizedText": LOCALIZED_TEXT,
    "ExtensionObject": EXTENSION_OBJECT}
_INTEGERS = frozenset((SBYTE, BYTE, INT16, UINT16, INT32, UINT32, INT64, UINT64))

_QNAME = re.compile(r"^(\d+):(.*)$", re.DOTALL)
_NSINDEX = re.compile(r"^ns=(\d+);(.*)$", re.DOTALL)


class NodesetError(SfcHostError, ValueError):
    """A NodeSet that cannot be loaded, said in one line naming the file and the node."""


class _Bad(Exception):
    """A fault in one node, reported with the file's and the node's names around it."""


def load_nodeset(space: AddressSpace, source: Path | str | bytes) -> list[NodeId]:
    """Adds the nodes of a NodeSet2 document (a path, or the XML itself as bytes) to
    ``space``; returns their ids. Its namespaces are registered in the space and its
    indexes mapped onto the space's. On an error nothing of it stays (but the
    namespaces registered)."""
    if isinstance(source, bytes):
        name, data = "<bytes>", source
    else:
        path = Path(source)
        name = path.name
        try:
            data = path.read_bytes()
        except OSError as e:
            raise NodesetError(f"{name}: cannot be read: {e.strerror or e}") from None
    try:
        root = ET.fromstring(data)
    except ET.ParseError as e:
        raise NodesetError(f"{name}: not XML: {e}") from None
    if root.tag != f"{_NS}UANodeSet":
        raise NodesetError(f"{name}: not a UANodeSet document")
    loader = _Loader(space, name, root)
    return loader.run()


class _Loader:
    def __init__(self, space: AddressSpace, name: str, root: ET.Element) -> None:
        self.space = space
        self.name = name
        self.root = root
        self.ns_map = [0]
        uris = root.find(f"{_NS}NamespaceUris")
        for uri in uris.findall(f"{_NS}Uri") if uris is not None else ():
            self.ns_map.append(space.register_namespace((uri.text or "").strip()))
        self.aliases: dict[str, str] = {}
        aliases = root.find(f"{_NS}Aliases")
        for a in aliases.findall(f"{_NS}Alias") if aliases is not None else ():
            self.aliases[a.get("Alias", "")] = (a.text or "").strip()

    def run(self) -> list[NodeId]:
        added: list[NodeId] = []
        definitions: list[tuple[Node, ET.Element]] = []
        parents: list[tuple[NodeId, NodeId, str]] = []
        current = "?"
        try:
            for el in self.root:
                tag = el.tag[len(_NS):] if el.tag.startswith(_NS) else el.tag
                cls = _CLASSES.get(tag)
                if cls is None:
                    continue
                current = el.get("NodeId") or f"a {tag} without a NodeId"
                node = self._node(el, cls)
                current = str(node.node_id)
                if node.node_id in self.space:
                    raise _Bad("is already in the address space")
                self.space.add(node)
                added.append(node.node_id)
                parent = el.get("ParentNodeId")
                if parent:
                    parents.append((node.node_id, self.node_id(parent), current))
                definition = el.find(f"{_NS}Definition")
                if cls == DATA_TYPE and definition is not None:
                    definitions.append((node, definition))
            # second pass: a definition needs the supertypes and encodings, which the
            # file may define after the type
            for node, definition in definitions:
                current = str(node.node_id)
                node.attributes[DATA_TYPE_DEFINITION] = self._definition(node, definition)
            for nid, parent_id, where in parents:
                current = str(where)
                child = self.space.get(nid)
                assert child is not None
                if not any(r.target == parent_id for r in child.references):
                    raise _Bad(f"has no reference to its ParentNodeId {parent_id}")
        except (_Bad, ValueError, TypeError, OverflowError) as e:
            for nid in reversed(added):
                self.space.remove(nid)
            raise NodesetError(f"{self.name}: node {current}: {e}") from None
        return added

    # ---- names and ids

    def node_id(self, text: str) -> NodeId:
        text = text.strip()
        text = self.aliases.get(text, text)
        ns = 0
        m = _NSINDEX.match(text)
        if m:
            ns = self._ns(int(m.group(1)))
            text = m.group(2)
        try:
            parsed = NodeId.parse(text)
        except ValueError as e:
            raise _Bad(f"bad NodeId {text!r}: {e}") from None
        return NodeId(parsed.identifier, ns) if ns else parsed

    def _ns(self, index: int) -> int:
        if index >= len(self.ns_map):
            raise _Bad(f"namespace index {index} is not in the file's NamespaceUris")
        return self.ns_map[index]

    def qualified(self, text: str) -> QualifiedName:
        m = _QNAME.match(text)
        if m:
            return QualifiedName(m.group(2), self._ns(int(m.group(1))))
        return QualifiedName(text, 0)

    # ---- nodes

    def _node(self, el: ET.Element, cls: int) -> Node:
        nid_text = el.get("NodeId")
        bn_text = el.get("BrowseName")
        if not nid_text:
            raise _Bad("has no NodeId")
        nid = self.node_id(nid_text)
        if not bn_text:
            raise _Bad("has no BrowseName")
        browse_name = self.qualified(bn_text)
        display = _text(el.find(f"{_NS}DisplayName"))
        description = el.find(f"{_NS}Description")
        node = Node(nid, cls, browse_name,
                    display if display is not None else LocalizedText(browse_name.name),
                    _text(description) if description is not None else None)
        refs = el.find(f"{_NS}References")
        for r in refs.findall(f"{_NS}Reference") if refs is not None else ():
            rtype = r.get("ReferenceType")
            if not rtype or not (r.text or "").strip():
                raise _Bad("has a Reference without a type or a target")
            ref = Reference(self.node_id(rtype), self.node_id(r.text or ""),
                            _bool(r.get("IsForward"), True))
            if ref not in node.references:
                node.references.append(ref)
        self._attributes(el, cls, node.attributes)
        return node

    def _attributes(self, el: ET.Element, cls: int, attrs: dict[int, Any]) -> None:
        get = el.get
        if get("WriteMask"):
            attrs[WRITE_MASK] = int(get("WriteMask", "0"))
        if cls in (OBJECT_TYPE, VARIABLE_TYPE, DATA_TYPE, REFERENCE_TYPE):
            attrs[IS_ABSTRACT] = _bool(get("IsAbstract"), False)
        if cls in (OBJECT, VIEW):
            attrs[EVENT_NOTIFIER] = int(get("EventNotifier", "0"))
        if cls == VIEW:
            attrs[CONTAINS_NO_LOOPS] = _bool(get("ContainsNoLoops"), False)
        if cls == REFERENCE_TYPE:
            attrs[SYMMETRIC] = _bool(get("Symmetric"), False)
            inverse = el.find(f"{_NS}InverseName")
            if inverse is not None:
                attrs[INVERSE_NAME] = _text(inverse)
        if cls == METHOD:
            attrs[EXECUTABLE] = _bool(get("Executable"), True)
            attrs[USER_EXECUTABLE] = _bool(get("UserExecutable"), attrs[EXECUTABLE])
        if cls in (VARIABLE, VARIABLE_TYPE):
            attrs[DATA_TYPE_ATTR] = self.node_id(get("DataType", "i=24"))
            attrs[VALUE_RANK] = int(get("ValueRank", "-1"))
            dims = get("ArrayDimensions")
            if dims:
                attrs[ARRAY_DIMENSIONS] = tuple(int(d) for d in dims.split(","))
            value = el.find(f"{_NS}Value")
            if value is not None:
                inner = next(iter(value), None)
                if inner is not None:
                    attrs[VALUE] = DataValue(self.variant(inner))
        if cls == VARIABLE:
            # a 1.05 NodeSet's AccessLevel is the AccessLevelEx, a UInt32
            level = int(get("AccessLevel", "1"))
            attrs[ACCESS_LEVEL] = level & 0xFF
            attrs[USER_ACCESS_LEVEL] = int(get("UserAccessLevel", str(level))) & 0xFF
            attrs[ACCESS_LEVEL_EX] = int(get("AccessLevelEx", str(level)))
            attrs[MINIMUM_SAMPLING_INTERVAL] = float(get("MinimumSamplingInterval", "0"))
            attrs[HISTORIZING] = _bool(get("Historizing"), False)

    # ---- values (Part 6 §5.3, the XML encoding)

    def variant(self, el: ET.Element) -> Variant:
        tag = _local(el)
        if tag.startswith("ListOf"):
            kind = _BUILTINS.get(tag[6:])
            if kind is None:
                raise _Bad(f"a value of type {tag} is not supported")
            return Variant(kind, [self.scalar(kind, e) for e in el])
        kind = _BUILTINS.get(tag)
        if kind is None:
            raise _Bad(f"a value of type {tag} is not supported")
        return Variant(kind, self.scalar(kind, el))

    def scalar(self, kind: int, el: ET.Element) -> Any:
        text = (el.text or "").strip()
        if kind in _INTEGERS:
            return int(text)
        if kind in (FLOAT, DOUBLE):
            return float(text)
        if kind == BOOLEAN:
            return _bool(text, False)
        if kind == STRING:
            return None if el.get(_XSI_NIL) == "true" else (el.text or "")
        if kind == LOCALIZED_TEXT:
            return _text(el)
        if kind == DATETIME:
            dt = datetime.fromisoformat(text)
            return dt if dt.tzinfo is not None else dt.replace(tzinfo=UTC)
        if kind == BYTE_STRING:
            return base64.b64decode(text)
        if kind == GUID:
            return uuid.UUID(_child_text(el, "String") or text)
        if kind == NODE_ID:
            return self.node_id(_child_text(el, "Identifier") or "i=0")
        if kind == EXPANDED_NODE_ID:
            return ExpandedNodeId(self.node_id(_child_text(el, "Identifier") or "i=0"))
        if kind == STATUS_CODE:
            return int(_child_text(el, "Code") or "0")
        if kind == QUALIFIED_NAME:
            index = int(_child_text(el, "NamespaceIndex") or "0")
            return QualifiedName(_child_text(el, "Name"), self._ns(index))
        if kind == XML_ELEMENT:
            return "".join(ET.tostring(c, encoding="unicode") for c in el)
        return self.extension_object(el)

    def extension_object(self, el: ET.Element) -> ExtensionObject:
        type_id = self.node_id(_child_text(_child(el, "TypeId"), "Identifier") or "i=0")
        body = _child(el, "Body")
        inner = next(iter(body), None) if body is not None else None
        if inner is None:
            return ExtensionObject(type_id, None, 0)
        reader = _STRUCTURES.get(_local(inner))
        if reader is None:
            # a structure this loader has no layout for travels as the XML it came as
            return ExtensionObject(type_id, ET.tostring(inner, encoding="utf-8"), 2)
        return reader(self, inner).encode()

    def _argument(self, el: ET.Element) -> Argument:
        dims = _child(el, "ArrayDimensions")
        return Argument(_child_text(el, "Name") or "",
                        self.node_id(_child_text(_child(el, "DataType"), "Identifier")
                                     or "i=24"),
                        int(_child_text(el, "ValueRank") or "-1"),
                        tuple(int((d.text or "0").strip()) for d in dims)
                        if dims is not None else (),
                        _text(_child(el, "Description")))

    def _enum_value(self, el: ET.Element) -> EnumValueType:
        return EnumValueType(int(_child_text(el, "Value") or "0"),
                             _text(_child(el, "DisplayName")),
                             _text(_child(el, "Description")))

    def _eu_information(self, el: ET.Element) -> EUInformation:
        return EUInformation(_child_text(el, "NamespaceUri"),
                             int(_child_text(el, "UnitId") or "0"),
                             _text(_child(el, "DisplayName")),
                             _text(_child(el, "Description")))

    def _range(self, el: ET.Element) -> Range:
        return Range(float(_child_text(el, "Low") or "0"),
                     float(_child_text(el, "High") or "0"))

    # ---- DataType definitions (Part 6 F.12)

    def _definition(self, node: Node, el: ET.Element) -> StructureDefinition | EnumDefinition:
        space = self.space
        fields = el.findall(f"{_NS}Field")
        # an OptionSet's bits are an EnumDefinition too; a definition under neither
        # Structure nor Enumeration is told by its fields' values
        enum = space.is_subtype(node.node_id, _ENUMERATION) or \
            _bool(el.get("IsOptionSet"), False) or \
            (not space.is_subtype(node.node_id, _STRUCTURE)
             and any(f.get("Value") is not None for f in fields))
        if enum:
            out = []
            for i, f in enumerate(fields):
                name = f.get("Name") or ""
                display = f.find(f"{_NS}DisplayName")
                description = f.find(f"{_NS}Description")
                out.append(EnumField(int(f.get("Value", str(i))),
                                     _text(display) if display is not None
                                     else LocalizedText(name),
                                     _text(description), name))
            return EnumDefinition(tuple(out))
        sfields = []
        optional = subtyped = False
        for f in fields:
            fname = f.get("Name")
            if not fname:
                raise _Bad("has a definition field without a Name")
            name = fname
            dims = f.get("ArrayDimensions")
            is_optional = _bool(f.get("IsOptional"), False)
            optional = optional or is_optional
            subtyped = subtyped or _bool(f.get("AllowSubTypes"), False)
            sfields.append(StructureField(
                name, self.node_id(f.get("DataType", "i=24")), int(f.get("ValueRank", "-1")),
                tuple(int(d) for d in dims.split(",")) if dims else (),
                int(f.get("MaxStringLength", "0")), is_optional,
                _text(f.find(f"{_NS}Description"))))
        # StructureType (Part 3 §8.49): 0 plain, 1 optional fields, 2 union, 3 and 4
        # the same with subtyped values
        if _bool(el.get("IsUnion"), False):
            kind = 4 if subtyped else 2
        else:
            kind = 3 if subtyped else (1 if optional else 0)
        encoding = space.encoding(node.node_id)
        return StructureDefinition(encoding if encoding is not None else NodeId(0),
                                   space.supertype(node.node_id) or _STRUCTURE,
                                   kind, tuple(sfields))


_STRUCTURES: dict[str, Callable[[_Loader, ET.Element], Any]] = {
    "Argument": _Loader._argument, "EnumValueType": _Loader._enum_value,
    "EUInformation": _Loader._eu_information, "Range": _Loader._range}


def _local(el: ET.Element) -> str:
    tag = el.tag
    return tag[tag.index("}") + 1:] if tag.startswith("{") else tag


def _child(el: ET.Element | None, name: str) -> ET.Element | None:
    if el is None:
        return None
    for c in el:
        if _local(c) == name:
            return c
    return None


def _child_text(el: ET.Element | None, name: str) -> str | None:
    c = _child(el, name)
    if c is None or c.get(_XSI_NIL) == "true":
        return None
    return (c.text or "").strip()


def _text(el: ET.Element | None) -> LocalizedText:
    """A LocalizedText: a NodeSet's (text, ``Locale`` attribute) or a value's (``Locale``
    and ``Text`` children)."""
    if el is None or el.get(_XSI_NIL) == "true":
        return LocalizedText(None)
    if len(el):
        return LocalizedText(_child_text(el, "Text"), _child_text(el, "Locale") or None)
    return LocalizedText(el.text or "", el.get("Locale") or None)


def _bool(text: str | None, default: bool) -> bool:
    if text is None or not text.strip():
        return default
    t = text.strip().lower()
    if t in ("true", "1"):
        return True
    if t in ("false", "0"):
        return False
    raise _Bad(f"{text!r} is no Boolean")
