"""The server's address space (IEC 62541 Part 3): nodes with their attributes and
references, and the questions the services ask of them (Read, Browse,
TranslateBrowsePaths, the instances of a type). One model that the NodeSet loader,
namespace 0 and the services share, kept apart from the wire.

A reference is stored on both its ends (``Reference.forward`` tells which end), by
node id: an end that is not in the space yet keeps its half aside until it is added,
so a NodeSet may name a node before it defines it.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from sfc_fast.wire.uabinary import (
    BOOLEAN,
    BYTE,
    DOUBLE,
    EXTENSION_OBJECT,
    INT32,
    LOCALIZED_TEXT,
    NODE_ID,
    QUALIFIED_NAME,
    STRING,
    UINT32,
    DataValue,
    ExtensionObject,
    LocalizedText,
    NodeId,
    QualifiedName,
    Variant,
    Writer,
    ticks_now,
)

UA_NAMESPACE = "http://opcfoundation.org/UA/"

# node classes (Part 3 §8.29)
OBJECT, VARIABLE, METHOD, OBJECT_TYPE, VARIABLE_TYPE, REFERENCE_TYPE, DATA_TYPE, VIEW = (
    1, 2, 4, 8, 16, 32, 64, 128)

# attribute ids (Part 6 Annex A.1)
NODE_ID_ATTR, NODE_CLASS, BROWSE_NAME, DISPLAY_NAME, DESCRIPTION = 1, 2, 3, 4, 5
WRITE_MASK, USER_WRITE_MASK, IS_ABSTRACT, SYMMETRIC, INVERSE_NAME = 6, 7, 8, 9, 10
CONTAINS_NO_LOOPS, EVENT_NOTIFIER, VALUE, DATA_TYPE_ATTR, VALUE_RANK = 11, 12, 13, 14, 15
ARRAY_DIMENSIONS, ACCESS_LEVEL, USER_ACCESS_LEVEL, MINIMUM_SAMPLING_INTERVAL = 16, 17, 18, 19
HISTORIZING, EXECUTABLE, USER_EXECUTABLE, DATA_TYPE_DEFINITION = 20, 21, 22, 23
ACCESS_LEVEL_EX = 27

# status codes (Part 6 Annex A.2)
BAD_NODE_ID_UNKNOWN = 0x80340000
BAD_ATTRIBUTE_ID_INVALID = 0x80350000
BAD_REFERENCE_TYPE_ID_INVALID = 0x804C0000
BAD_BROWSE_DIRECTION_INVALID = 0x804D0000
BAD_BROWSE_NAME_INVALID = 0x80600000
BAD_NO_MATCH = 0x806F0000
BAD_NOTHING_TO_DO = 0x800F0000

# reference types (Part 5 / Part 6 Annex A)
REFERENCES = NodeId(31)
HIERARCHICAL = NodeId(33)
ORGANIZES = NodeId(35)
HAS_MODELLING_RULE = NodeId(37)
HAS_ENCODING = NodeId(38)
HAS_TYPE_DEFINITION = NodeId(40)
HAS_SUBTYPE = NodeId(45)
HAS_PROPERTY = NodeId(46)
HAS_COMPONENT = NodeId(47)

# the types and modelling rules the builders use
BASE_DATA_TYPE = NodeId(24)
BASE_OBJECT_TYPE = NodeId(58)
FOLDER_TYPE = NodeId(61)
BASE_VARIABLE_TYPE = NodeId(62)
BASE_DATA_VARIABLE_TYPE = NodeId(63)
PROPERTY_TYPE = NodeId(68)
ARGUMENT_TYPE = NodeId(296)
BASE_EVENT_TYPE = NodeId(2041)
MANDATORY = NodeId(78)
OPTIONAL = NodeId(80)
NAMESPACE_ARRAY = NodeId(2255)

INPUT_ARGUMENTS = QualifiedName("InputArguments", 0)
OUTPUT_ARGUMENTS = QualifiedName("OutputArguments", 0)

_NULL_ID = NodeId(0)
_NULL_TEXT = LocalizedText(None)
_INSTANCE_RULES = frozenset((MANDATORY, OPTIONAL))
_MAX_DEPTH = 32                 # instance declarations nested deeper are a loop in the model


# ---- the structures the address space itself carries (Part 3 §8, Part 5 §12)


def _dims(w: Writer, dims: Sequence[int]) -> None:
    w.length(len(dims))
    for d in dims:
        w.uint32(d)


@dataclass(frozen=True, slots=True)
class Argument:
    """A method argument (Part 3 §8.6), binary encoding i=298."""
    name: str
    data_type: NodeId
    value_rank: int = -1
    array_dimensions: tuple[int, ...] = ()
    description: LocalizedText = _NULL_TEXT

    def encode(self) -> ExtensionObject:
        w = Writer()
        w.string(self.name)
        w.nodeid(self.data_type)
        w.int32(self.value_rank)
        _dims(w, self.array_dimensions)
        w.localized_text(self.description)
        return ExtensionObject(NodeId(298), w.getvalue())


@dataclass(frozen=True, slots=True)
class EnumValueType:
    """An enumeration value with its name (Part 3 §8.40), binary encoding i=8251."""
    value: int
    display_name: LocalizedText
    description: LocalizedText = _NULL_TEXT

    def encode(self) -> ExtensionObject:
        w = Writer()
        w.int64(self.value)
        w.localized_text(self.display_name)
        w.localized_text(self.description)
        return ExtensionObject(NodeId(8251), w.getvalue())


@dataclass(frozen=True, slots=True)
class EUInformation:
    """An engineering unit (Part 8 §5.6.3), binary encoding i=889."""
    namespace_uri: str | None
    unit_id: int
    display_name: LocalizedText
    description: LocalizedText = _NULL_TEXT

    def encode(self) -> ExtensionObject:
        w = Writer()
        w.string(self.namespace_uri)
        w.int32(self.unit_id)
        w.localized_text(self.display_name)
        w.localized_text(self.description)
        return ExtensionObject(NodeId(889), w.getvalue())


@dataclass(frozen=True, slots=True)
class Range:
    """A range of values (Part 8 §5.6.2), binary encoding i=886."""
    low: float
    high: float

    def encode(self) -> ExtensionObject:
        w = Writer()
        w.double(self.low)
        w.double(self.high)
        return ExtensionObject(NodeId(886), w.getvalue())


@dataclass(frozen=True, slots=True)
class StructureField:
    """One field of a StructureDefinition (Part 3 §8.51)."""
    name: str
    data_type: NodeId
    value_rank: int = -1
    array_dimensions: tuple[int, ...] = ()
    max_string_length: int = 0
    is_optional: bool = False
    description: LocalizedText = _NULL_TEXT


@dataclass(frozen=True, slots=True)
class StructureDefinition:
    """A Structure DataType's DataTypeDefinition (Part 3 §8.48), binary encoding i=122.
    ``structure_type``: 0 Structure, 1 with optional fields, 2 Union (3, 4 with
    subtyped values)."""
    default_encoding_id: NodeId
    base_data_type: NodeId
    structure_type: int
    fields: tuple[StructureField, ...]

    def encode(self) -> ExtensionObject:
        return _encode_definition(self)


@dataclass(frozen=True, slots=True)
class EnumField:
    """One value of an EnumDefinition (Part 3 §8.52): an EnumValueType and a Name."""
    value: int
    display_name: LocalizedText
    description: LocalizedText
    name: str


@dataclass(frozen=True, slots=True)
class EnumDefinition:
    """An Enumeration (or OptionSet) DataType's DataTypeDefinition (Part 3 §8.49),
    binary encoding i=123."""
    fields: tuple[EnumField, ...]

    def encode(self) -> ExtensionObject:
        return _encode_definition(self)


@functools.lru_cache(maxsize=512)
def _encode_definition(d: StructureDefinition | EnumDefinition) -> ExtensionObject:
    # a definition does not change once made: encoded once, read many times
    w = Writer()
    if isinstance(d, EnumDefinition):
        w.length(len(d.fields))
        for e in d.fields:
            w.int64(e.value)
            w.localized_text(e.display_name)
            w.localized_text(e.description)
            w.string(e.name)
        return ExtensionObject(NodeId(123), w.getvalue())
    w.nodeid(d.default_encoding_id)
    w.nodeid(d.base_data_type)
    w.int32(d.structure_type)
    w.length(len(d.fields))
    for f in d.fields:
        w.string(f.name)
        w.localized_text(f.description)
        w.nodeid(f.data_type)
        w.int32(f.value_rank)
        _dims(w, f.array_dimensions)
        w.uint32(f.max_string_length)
        w.boolean(f.is_optional)
    return ExtensionObject(NodeId(122), w.getvalue())


# ---- nodes


class Reference(NamedTuple):
    type_id: NodeId
    target: NodeId              # the other end
    forward: bool


@dataclass(frozen=True, slots=True)
class ReferenceDescription:
    """One reference a Browse found (Part 4 §7.30); every field filled whatever the
    result mask: the response writer leaves out what was not asked."""
    type_id: NodeId
    forward: bool
    target: NodeId
    browse_name: QualifiedName
    display_name: LocalizedText
    node_class: int             # 0 where the target is not in the space
    type_definition: NodeId     # null unless the target is an Object or a Variable


class Node:
    """A node: the attributes every class has as fields, the class's others in
    ``attributes`` by attribute id (the Value of a Variable a DataValue)."""

    __slots__ = ("attributes", "browse_name", "description", "display_name", "node_class",
                 "node_id", "references")

    def __init__(self, node_id: NodeId, node_class: int, browse_name: QualifiedName,
                 display_name: LocalizedText | None = None,
                 description: LocalizedText | None = None,
                 attributes: dict[int, Any] | None = None,
                 references: list[Reference] | None = None) -> None:
        self.node_id = node_id
        self.node_class = node_class
        self.browse_name = browse_name
        self.display_name = display_name if display_name is not None else \
            LocalizedText(browse_name.name)
        self.description = description
        self.attributes: dict[int, Any] = attributes if attributes is not None else {}
        self.references: list[Reference] = references if references is not None else []

    def __repr__(self) -> str:
        return f"Node({self.node_id}, class {self.node_class}, {self.browse_name.name!r})"


# The attributes each node class has beyond the seven every node has (Part 3 §5)
_COMMON = frozenset((NODE_ID_ATTR, NODE_CLASS, BROWSE_NAME, DISPLAY_NAME, DESCRIPTION,
                     WRITE_MASK, USER_WRITE_MASK))
_VARIABLE_ATTRS = (VALUE, DATA_TYPE_ATTR, VALUE_RANK, ARRAY_DIMENSIONS)
CLASS_ATTRIBUTES: dict[int, frozenset[int]] = {
    cls: _COMMON | frozenset(extra) for cls, extra in {
        OBJECT: (EVENT_NOTIFIER,),
        VARIABLE: (*_VARIABLE_ATTRS, ACCESS_LEVEL, USER_ACCESS_LEVEL,
                   MINIMUM_SAMPLING_INTERVAL, HISTORIZING, ACCESS_LEVEL_EX),
        METHOD: (EXECUTABLE, USER_EXECUTABLE),
        OBJECT_TYPE: (IS_ABSTRACT,),
        VARIABLE_TYPE: (*_VARIABLE_ATTRS, IS_ABSTRACT),
        REFERENCE_TYPE: (IS_ABSTRACT, SYMMETRIC, INVERSE_NAME),
        DATA_TYPE: (IS_ABSTRACT, DATA_TYPE_DEFINITION),
        VIEW: (CONTAINS_NO_LOOPS, EVENT_NOTIFIER),
    }.items()}

# each attribute's built-in type on the wire, and its value where a node stores none
# (the NodeSet schema's defaults)
_TYPES = {WRITE_MASK: UINT32, USER_WRITE_MASK: UINT32, IS_ABSTRACT: BOOLEAN,
          SYMMETRIC: BOOLEAN, INVERSE_NAME: LOCALIZED_TEXT, CONTAINS_NO_LOOPS: BOOLEAN,
          EVENT_NOTIFIER: BYTE, DATA_TYPE_ATTR: NODE_ID, VALUE_RANK: INT32,
          ARRAY_DIMENSIONS: UINT32, ACCESS_LEVEL: BYTE, USER_ACCESS_LEVEL: BYTE,
          MINIMUM_SAMPLING_INTERVAL: DOUBLE, HISTORIZING: BOOLEAN, EXECUTABLE: BOOLEAN,
          USER_EXECUTABLE: BOOLEAN, ACCESS_LEVEL_EX: UINT32}
_DEFAULTS: dict[int, Any] = {
    WRITE_MASK: 0, USER_WRITE_MASK: 0, IS_ABSTRACT: False, SYMMETRIC: False,
    INVERSE_NAME: _NULL_TEXT, CONTAINS_NO_LOOPS: False, EVENT_NOTIFIER: 0,
    DATA_TYPE_ATTR: BASE_DATA_TYPE, VALUE_RANK: -1, ACCESS_LEVEL: 1,
    MINIMUM_SAMPLING_INTERVAL: 0.0, HISTORIZING: False, EXECUTABLE: True}
# those whose absent value is another attribute's
_FOLLOWS = {USER_ACCESS_LEVEL: ACCESS_LEVEL, USER_EXECUTABLE: EXECUTABLE,
            ACCESS_LEVEL_EX: ACCESS_LEVEL, USER_WRITE_MASK: WRITE_MASK}


def _qualified(name: str | QualifiedName, namespace: int) -> QualifiedName:
    return name if isinstance(name, QualifiedName) else QualifiedName(name, namespace)


def _as_data_value(value: Variant | DataValue) -> DataValue:
    if isinstance(value, DataValue):
        return value
    now = ticks_now()
    return DataValue(value, 0, now, now)


class AddressSpace:
    """The nodes of a server, by node id, and the namespace table."""

    def __init__(self, namespaces: Sequence[str] = ()) -> None:
        self.namespaces: list[str] = [UA_NAMESPACE]
        self.namespaces += [u for u in namespaces if u != UA_NAMESPACE]
        self._nodes: dict[NodeId, Node] = {}
        # halves of references whose node is not in the space yet, by that node's id
        self._pending: dict[NodeId, list[Reference]] = {}
        self._subtypes: dict[NodeId, frozenset[NodeId]] = {}
        self._watchers: dict[NodeId, list[Callable[[DataValue], None]]] = {}
        self._dynamic: dict[NodeId, Callable[[], Variant | DataValue]] = {}
        self._origins: dict[NodeId, NodeId] = {}
        # the server awaits this before it reads a Value (a value kept elsewhere brought
        # up to date); ``read`` itself never calls it, being synchronous
        self.before_read: Callable[[NodeId], Awaitable[None] | None] | None = None

    # ---- namespaces

    def register_namespace(self, uri: str) -> int:
        try:
            return self.namespaces.index(uri)
        except ValueError:
            pass
        self.namespaces.append(uri)
        if NAMESPACE_ARRAY in self._nodes:
            # the Server's NamespaceArray is this table, watchers told of a new entry
            self.set_value(NAMESPACE_ARRAY, Variant(STRING, list(self.namespaces)))
        return len(self.namespaces) - 1

    def namespace_index(self, uri: str) -> int:
        try:
            return self.namespaces.index(uri)
        except ValueError:
            raise KeyError(uri) from None

    # ---- nodes and references

    def add(self, node: Node) -> Node:
        """Adds ``node``; each of its references is mirrored on the other end (now, or
        when that end is added)."""
        nid = node.node_id
        if nid in self._nodes:
            raise ValueError(f"node {nid} is already in the address space")
        self._nodes[nid] = node
        refs = node.references
        waiting = self._pending.pop(nid, None)
        if waiting:
            for ref in waiting:
                if ref not in refs:
                    refs.append(ref)
        subtype = False
        for ref in refs:
            self._mirror(nid, ref)
            subtype = subtype or ref.type_id == HAS_SUBTYPE
        if subtype:
            self._subtypes.clear()
        return node

    def _mirror(self, nid: NodeId, ref: Reference) -> None:
        half = Reference(ref.type_id, nid, not ref.forward)
        other = self._nodes.get(ref.target)
        if other is not None:
            if half not in other.references:
                other.references.append(half)
        else:
            waiting = self._pending.setdefault(ref.target, [])
            if half not in waiting:
                waiting.append(half)

    def add_reference(self, source: NodeId, type_id: NodeId, target: NodeId) -> None:
        """A reference ``source`` -> ``target``: forward on the source, inverse on the
        target; an end not in the space yet gets its half when it is added."""
        for nid, ref in ((source, Reference(type_id, target, True)),
                         (target, Reference(type_id, source, False))):
            node = self._nodes.get(nid)
            refs = node.references if node is not None else self._pending.setdefault(nid, [])
            if ref not in refs:
                refs.append(ref)
        if type_id == HAS_SUBTYPE:
            self._subtypes.clear()

    def remove_reference(self, source: NodeId, type_id: NodeId, target: NodeId) -> None:
        for nid, ref in ((source, Reference(type_id, target, True)),
                         (target, Reference(type_id, source, False))):
            node = self._nodes.get(nid)
            refs = node.references if node is not None else self._pending.get(nid, [])
            if ref in refs:
                refs.remove(ref)
        if type_id == HAS_SUBTYPE:
            self._subtypes.clear()

    def remove(self, node_id: NodeId) -> None:
        """Removes the node and every reference to or from it (KeyError if absent)."""
        node = self._nodes.pop(node_id)
        subtype = False
        for ref in node.references:
            half = Reference(ref.type_id, node_id, not ref.forward)
            other = self._nodes.get(ref.target)
            refs = other.references if other is not None else self._pending.get(ref.target)
            if refs is not None and half in refs:
                refs.remove(half)
            subtype = subtype or ref.type_id == HAS_SUBTYPE
        if subtype:
            self._subtypes.clear()
        self._watchers.pop(node_id, None)
        self._dynamic.pop(node_id, None)
        self._origins.pop(node_id, None)

    def get(self, node_id: NodeId) -> Node | None:
        return self._nodes.get(node_id)

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._nodes

    def __len__(self) -> int:
        return len(self._nodes)

    def __iter__(self) -> Iterator[Node]:
        return iter(self._nodes.values())

    def copy(self) -> AddressSpace:
        """A space of copies of these nodes (their attribute dicts and reference lists
        copied, the values shared: they are immutable) and of the namespace table;
        watchers and computed values are not copied."""
        out = AddressSpace()
        out.namespaces = list(self.namespaces)
        out._nodes = {nid: Node(n.node_id, n.node_class, n.browse_name, n.display_name,
                                n.description, dict(n.attributes), list(n.references))
                      for nid, n in self._nodes.items()}
        out._pending = {nid: list(refs) for nid, refs in self._pending.items()}
        out._subtypes = dict(self._subtypes)
        out._origins = dict(self._origins)
        return out

    # ---- types

    def subtypes(self, base: NodeId) -> set[NodeId]:
        """``base`` and every type below it by HasSubtype."""
        return set(self._subtype_set(base))

    def _subtype_set(self, base: NodeId) -> frozenset[NodeId]:
        found = self._subtypes.get(base)
        if found is None:
            seen = {base}
            todo = [base]
            while todo:
                node = self._nodes.get(todo.pop())
                if node is None:
                    continue
                for ref in node.references:
                    if ref.forward and ref.type_id == HAS_SUBTYPE and ref.target not in seen:
                        seen.add(ref.target)
                        todo.append(ref.target)
            found = self._subtypes[base] = frozenset(seen)
        return found

    def is_subtype(self, type_id: NodeId, base: NodeId) -> bool:
        """``type_id`` is ``base`` or below it by HasSubtype."""
        return type_id == base or type_id in self._subtype_set(base)

    def supertype(self, type_id: NodeId) -> NodeId | None:
        node = self._nodes.get(type_id)
        if node is None:
            return None
        return next((r.target for r in node.references
                     if not r.forward and r.type_id == HAS_SUBTYPE), None)

    def supertypes(self, type_id: NodeId) -> list[NodeId]:
        """The types above ``type_id``, nearest first (``type_id`` not included)."""
        out: list[NodeId] = []
        t = self.supertype(type_id)
        while t is not None and t not in out and t != type_id:
            out.append(t)
            t = self.supertype(t)
        return out

    def type_definition(self, node_id: NodeId) -> NodeId | None:
        node = self._nodes.get(node_id)
        if node is None:
            return None
        return next((r.target for r in node.references
                     if r.forward and r.type_id == HAS_TYPE_DEFINITION), None)

    def encoding_of(self, encoding_id: NodeId) -> NodeId | None:
        """The DataType that ``encoding_id`` (a DataTypeEncoding node) encodes."""
        node = self._nodes.get(encoding_id)
        if node is None:
            return None
        return next((r.target for r in node.references
                     if not r.forward and r.type_id == HAS_ENCODING), None)

    def encoding(self, data_type: NodeId, name: str = "Default Binary") -> NodeId | None:
        """The DataType's encoding node of that name (the binary one by default)."""
        node = self._nodes.get(data_type)
        if node is None:
            return None
        for r in node.references:
            if r.forward and r.type_id == HAS_ENCODING:
                enc = self._nodes.get(r.target)
                if enc is not None and enc.browse_name.name == name:
                    return r.target
        return None

    def modelling_rule(self, node_id: NodeId) -> NodeId | None:
        node = self._nodes.get(node_id)
        if node is None:
            return None
        return next((r.target for r in node.references
                     if r.forward and r.type_id == HAS_MODELLING_RULE), None)

    def origin(self, node_id: NodeId) -> NodeId | None:
        """The InstanceDeclaration that ``instantiate`` copied ``node_id`` from (a
        Method's declaration on its type, say), None for a node not so made."""
        return self._origins.get(node_id)

    # ---- navigation

    def targets(self, node_id: NodeId, ref_type: NodeId = HIERARCHICAL, *,
                forward: bool = True, include_subtypes: bool = True) -> list[NodeId]:
        """The other ends of the node's references of that type (or a subtype)."""
        node = self._nodes.get(node_id)
        if node is None:
            return []
        kinds = self._subtype_set(ref_type) if include_subtypes else frozenset((ref_type,))
        return [r.target for r in node.references if r.forward == forward and r.type_id in kinds]

    def child(self, parent: NodeId, name: QualifiedName) -> NodeId | None:
        """The target of a hierarchical reference from ``parent`` named ``name``."""
        node = self._nodes.get(parent)
        if node is None:
            return None
        hierarchical = self._subtype_set(HIERARCHICAL)
        nodes = self._nodes
        for r in node.references:
            if r.forward and r.type_id in hierarchical:
                t = nodes.get(r.target)
                if t is not None and t.browse_name == name:
                    return r.target
        return None

    def browse_path(self, start: NodeId, names: Sequence[QualifiedName]) -> NodeId | None:
        node: NodeId | None = start if start in self._nodes else None
        for name in names:
            if node is None:
                return None
            node = self.child(node, name)
        return node

    def browse(self, node_id: NodeId, direction: int, ref_type: NodeId,
               include_subtypes: bool, node_class_mask: int, result_mask: int
               ) -> list[ReferenceDescription] | int:
        """The node's references as Browse (Part 4 §5.8.2) finds them, or a Bad status.
        ``direction``: 0 forward, 1 inverse, 2 both; a null ``ref_type``: every type;
        a ``node_class_mask`` of 0: every class (a target outside the space only
        then)."""
        node = self._nodes.get(node_id)
        if node is None:
            return BAD_NODE_ID_UNKNOWN
        if direction not in (0, 1, 2):
            return BAD_BROWSE_DIRECTION_INVALID
        kinds: frozenset[NodeId] | None = None
        if not ref_type.is_null:
            rt = self._nodes.get(ref_type)
            if rt is None or rt.node_class != REFERENCE_TYPE:
                return BAD_REFERENCE_TYPE_ID_INVALID
            kinds = self._subtype_set(ref_type) if include_subtypes else \
                frozenset((ref_type,))
        out = []
        nodes = self._nodes
        for r in node.references:
            if direction != 2 and r.forward != (direction == 0):
                continue
            if kinds is not None and r.type_id not in kinds:
                continue
            t = nodes.get(r.target)
            if t is None:
                if node_class_mask:
                    continue
                out.append(ReferenceDescription(r.type_id, r.forward, r.target,
                                                QualifiedName(None), _NULL_TEXT, 0, _NULL_ID))
                continue
            if node_class_mask and not t.node_class & node_class_mask:
                continue
            tdef = _NULL_ID
            if t.node_class in (OBJECT, VARIABLE):
                tdef = next((x.target for x in t.references
                             if x.forward and x.type_id == HAS_TYPE_DEFINITION), _NULL_ID)
            out.append(ReferenceDescription(r.type_id, r.forward, r.target, t.browse_name,
                                            t.display_name, t.node_class, tdef))
        return out

    def translate(self, start: NodeId,
                  elements: Sequence[tuple[NodeId, bool, bool, QualifiedName]]
                  ) -> list[NodeId] | int:
        """The nodes a relative path leads to from ``start`` (Part 4 §5.8.4), each
        element (reference type, is inverse, include subtypes, target name); a null
        reference type follows every reference. A Bad status where none."""
        if start not in self._nodes:
            return BAD_NODE_ID_UNKNOWN
        if not elements:
            return BAD_NOTHING_TO_DO
        if any(not e[3].name for e in elements):
            return BAD_BROWSE_NAME_INVALID
        nodes = self._nodes
        current = [start]
        for ref_type, inverse, include_subtypes, name in elements:
            kinds: frozenset[NodeId] | None = None
            if not ref_type.is_null:
                kinds = self._subtype_set(ref_type) if include_subtypes else \
                    frozenset((ref_type,))
            found: list[NodeId] = []
            for nid in current:
                for r in nodes[nid].references:
                    if r.forward == inverse or (kinds is not None and r.type_id not in kinds):
                        continue
                    t = nodes.get(r.target)
                    if t is not None and t.browse_name == name and r.target not in found:
                        found.append(r.target)
            if not found:
                return BAD_NO_MATCH
            current = found
        return current

    # ---- attributes and values

    def read(self, node_id: NodeId, attribute: int) -> DataValue:
        """An attribute's value (Part 4 §5.10.2), a Bad status in the DataValue where
        the node or the attribute is not there."""
        node = self._nodes.get(node_id)
        if node is None:
            return DataValue(None, BAD_NODE_ID_UNKNOWN)
        if attribute not in CLASS_ATTRIBUTES.get(node.node_class, _COMMON):
            return DataValue(None, BAD_ATTRIBUTE_ID_INVALID)
        if attribute == VALUE:
            fn = self._dynamic.get(node_id)
            if fn is not None:
                return _as_data_value(fn())
            stored = node.attributes.get(VALUE)
            return stored if stored is not None else DataValue()
        if attribute == NODE_ID_ATTR:
            return DataValue(Variant(NODE_ID, node.node_id))
        if attribute == NODE_CLASS:
            return DataValue(Variant(INT32, node.node_class))
        if attribute == BROWSE_NAME:
            return DataValue(Variant(QUALIFIED_NAME, node.browse_name))
        if attribute == DISPLAY_NAME:
            return DataValue(Variant(LOCALIZED_TEXT, node.display_name))
        if attribute == DESCRIPTION:
            return DataValue(Variant(LOCALIZED_TEXT, node.description or _NULL_TEXT))
        attrs = node.attributes
        if attribute == DATA_TYPE_DEFINITION:
            d = attrs.get(DATA_TYPE_DEFINITION)
            if d is None:
                return DataValue(None, BAD_ATTRIBUTE_ID_INVALID)
            obj = d if isinstance(d, ExtensionObject) else d.encode()
            return DataValue(Variant(EXTENSION_OBJECT, obj))
        value = attrs.get(attribute)
        if value is None:
            source = _FOLLOWS.get(attribute)
            if source is not None:
                value = attrs.get(source)
                if value is None:
                    value = _DEFAULTS.get(source)
                elif attribute == USER_ACCESS_LEVEL:
                    value &= 0xFF
            elif attribute == ARRAY_DIMENSIONS:
                rank = attrs.get(VALUE_RANK, -1)
                value = [0] * rank if rank > 0 else []
            else:
                value = _DEFAULTS[attribute]
        if attribute == ARRAY_DIMENSIONS:
            value = list(value or ())
        return DataValue(Variant(_TYPES[attribute], value))

    def set_value(self, node_id: NodeId, value: Variant | DataValue) -> None:
        """Sets a Variable's (or VariableType's) Value; a Variant gets source and server
        timestamps of now. Every watcher of the node is called with the DataValue."""
        node = self._nodes.get(node_id)
        if node is None or node.node_class not in (VARIABLE, VARIABLE_TYPE):
            raise KeyError(f"no variable {node_id}")
        dv = _as_data_value(value)
        node.attributes[VALUE] = dv
        for callback in self._watchers.get(node_id, ()):
            callback(dv)

    def watch(self, node_id: NodeId, callback: Callable[[DataValue], None]
              ) -> Callable[[], None]:
        """Calls ``callback`` on each ``set_value`` of the node; returns the unwatch
        function."""
        callbacks = self._watchers.setdefault(node_id, [])
        callbacks.append(callback)

        def unwatch() -> None:
            if callback in callbacks:
                callbacks.remove(callback)
            if not callbacks and self._watchers.get(node_id) is callbacks:
                del self._watchers[node_id]
        return unwatch

    def dynamic(self, node_id: NodeId, fn: Callable[[], Variant | DataValue] | None) -> None:
        """The node's Value is ``fn()`` on each read (a clock, say); None: the stored
        value again. Watchers are not called: nothing sets such a value."""
        if fn is None:
            self._dynamic.pop(node_id, None)
        elif node_id not in self._nodes:
            raise KeyError(f"no node {node_id}")
        else:
            self._dynamic[node_id] = fn

    def is_dynamic(self, node_id: NodeId) -> bool:
        return node_id in self._dynamic

    # ---- instances of types

    def instantiate(self, parent: NodeId | None, ref_type: NodeId, node_id_prefix: str,
                    namespace: int, browse_name: str | QualifiedName,
                    type_definition: NodeId,
                    keep: Callable[[Node], bool] | None = None) -> NodeId:
        """An Object (of an ObjectType) or a Variable (of a VariableType) with its
        InstanceDeclarations copied (Part 3 §6.3): those of the type and its supertypes
        whose ModellingRule is Mandatory or Optional, and ``keep(declaration)`` true
        where given, recursively, a subtype's declaration overriding its supertype's of
        the same browse name. The instance is ``NodeId(node_id_prefix, namespace)``,
        each copy ``<its parent's id>.<its browse name>``, referenced from its parent as
        the declaration is; a Method copy keeps its argument properties."""
        tnode = self._nodes.get(type_definition)
        if tnode is None or tnode.node_class not in (OBJECT_TYPE, VARIABLE_TYPE):
            raise ValueError(f"{type_definition} is no ObjectType or VariableType")
        name = _qualified(browse_name, namespace)
        nid = NodeId(node_id_prefix, namespace)
        if tnode.node_class == OBJECT_TYPE:
            node = Node(nid, OBJECT, name, attributes={EVENT_NOTIFIER: 0})
        else:
            attrs = {a: tnode.attributes[a] for a in _VARIABLE_ATTRS if a in tnode.attributes}
            attrs[ACCESS_LEVEL] = 1
            node = Node(nid, VARIABLE, name, attributes=attrs)
        node.references.append(Reference(HAS_TYPE_DEFINITION, type_definition, True))
        added = [nid]
        self.add(node)
        try:
            if parent is not None:
                self.add_reference(parent, ref_type, nid)
            self._copy_declarations(nid, node_id_prefix, namespace,
                                    [type_definition, *self.supertypes(type_definition)],
                                    keep, False, added, 0)
        except Exception:
            for made in reversed(added):
                self.remove(made)
            raise
        return nid

    def _declarations(self, sources: list[NodeId], keep: Callable[[Node], bool] | None,
                      method: bool) -> list[tuple[NodeId, Node]]:
        """(reference type, declaration) of each instance declaration to copy, the first
        source's winning a browse name."""
        hierarchical = self._subtype_set(HIERARCHICAL)
        chosen: dict[QualifiedName, tuple[NodeId, Node, NodeId | None]] = {}  # None: kept
        for source in sources:
            snode = self._nodes.get(source)
            if snode is None:
                continue
            for r in snode.references:
                if not r.forward or r.type_id == HAS_SUBTYPE or r.type_id not in hierarchical:
                    continue
                decl = self._nodes.get(r.target)
                if decl is None or decl.browse_name in chosen:
                    continue
                rule = self.modelling_rule(r.target)
                if method and decl.browse_name in (INPUT_ARGUMENTS, OUTPUT_ARGUMENTS):
                    rule = None     # a method's arguments go with it, declared so or not
                elif rule is None:
                    continue
                chosen[decl.browse_name] = (r.type_id, decl, rule)
        return [(rt, decl) for rt, decl, rule in chosen.values()
                if rule is None or (rule in _INSTANCE_RULES and (keep is None or keep(decl)))]

    def _copy_declarations(self, parent: NodeId, prefix: str, namespace: int,
                           sources: list[NodeId], keep: Callable[[Node], bool] | None,
                           method: bool, added: list[NodeId], depth: int) -> None:
        if depth > _MAX_DEPTH:
            raise ValueError(f"instance declarations nested deeper than {_MAX_DEPTH} "
                             f"under {parent}: a loop in the type model")
        for ref_type, decl in self._declarations(sources, keep, method):
            child_prefix = f"{prefix}.{decl.browse_name.name}"
            cid = NodeId(child_prefix, namespace)
            copy = Node(cid, decl.node_class, decl.browse_name, decl.display_name,
                        decl.description, dict(decl.attributes))
            tdef = self.type_definition(decl.node_id)
            if tdef is not None:
                copy.references.append(Reference(HAS_TYPE_DEFINITION, tdef, True))
            copy.references.append(Reference(ref_type, parent, False))
            self.add(copy)
            added.append(cid)
            self._origins[cid] = decl.node_id
            child_sources = [decl.node_id]
            if tdef is not None:
                child_sources += [tdef, *self.supertypes(tdef)]
            self._copy_declarations(cid, child_prefix, namespace, child_sources, keep,
                                    decl.node_class == METHOD, added, depth + 1)

    # ---- building nodes in code

    def _new(self, parent: NodeId | None, ref_type: NodeId, node_id: NodeId, node_class: int,
             name: str | QualifiedName, attributes: dict[int, Any],
             type_definition: NodeId | None, modelling_rule: NodeId | None,
             description: str | None) -> Node:
        qname = _qualified(name, node_id.namespace)
        node = Node(node_id, node_class, qname, LocalizedText(qname.name),
                    LocalizedText(description) if description is not None else None,
                    attributes)
        if parent is not None:
            node.references.append(Reference(ref_type, parent, False))
        if type_definition is not None:
            node.references.append(Reference(HAS_TYPE_DEFINITION, type_definition, True))
        if modelling_rule is not None:
            node.references.append(Reference(HAS_MODELLING_RULE, modelling_rule, True))
        return self.add(node)

    def add_folder(self, parent: NodeId | None, node_id: NodeId, name: str | QualifiedName,
                   *, ref_type: NodeId = ORGANIZES, description: str | None = None) -> Node:
        """A FolderType object, organized by ``parent``. A str name is in the node id's
        namespace (here and in the other builders)."""
        return self._new(parent, ref_type, node_id, OBJECT, name, {EVENT_NOTIFIER: 0},
                         FOLDER_TYPE, None, description)

    def add_object(self, parent: NodeId | None, node_id: NodeId, name: str | QualifiedName,
                   type_definition: NodeId = BASE_OBJECT_TYPE, *,
                   ref_type: NodeId = HAS_COMPONENT, event_notifier: int = 0,
                   modelling_rule: NodeId | None = None,
                   description: str | None = None) -> Node:
        """An Object of ``type_definition``, without its declarations (``instantiate``
        copies those)."""
        return self._new(parent, ref_type, node_id, OBJECT, name,
                         {EVENT_NOTIFIER: event_notifier}, type_definition, modelling_rule,
                         description)

    def add_variable(self, parent: NodeId | None, node_id: NodeId, name: str | QualifiedName,
                     value: Variant | DataValue | None, data_type: NodeId,
                     value_rank: int = -1, access_level: int = 1, *,
                     ref_type: NodeId = HAS_COMPONENT, type_definition: NodeId | None = None,
                     array_dimensions: Sequence[int] | None = None,
                     modelling_rule: NodeId | None = None,
                     description: str | None = None) -> Node:
        """A Variable (a Property where ``ref_type`` is HasProperty: PropertyType,
        else BaseDataVariableType, unless ``type_definition`` says). ``access_level``:
        1 read, 3 read and write (Part 3 §8.57)."""
        if type_definition is None:
            type_definition = PROPERTY_TYPE if ref_type == HAS_PROPERTY else \
                BASE_DATA_VARIABLE_TYPE
        attrs: dict[int, Any] = {DATA_TYPE_ATTR: data_type, VALUE_RANK: value_rank,
                                 ACCESS_LEVEL: access_level & 0xFF,
                                 USER_ACCESS_LEVEL: access_level & 0xFF,
                                 ACCESS_LEVEL_EX: access_level}
        if array_dimensions is not None:
            attrs[ARRAY_DIMENSIONS] = tuple(array_dimensions)
        attrs[VALUE] = _as_data_value(value) if value is not None else DataValue()
        return self._new(parent, ref_type, node_id, VARIABLE, name, attrs, type_definition,
                         modelling_rule, description)

    def add_method(self, parent: NodeId | None, node_id: NodeId, name: str | QualifiedName,
                   inputs: Sequence[Argument] = (), outputs: Sequence[Argument] = (), *,
                   ref_type: NodeId = HAS_COMPONENT, modelling_rule: NodeId | None = None,
                   description: str | None = None) -> Node:
        """A Method with its InputArguments and OutputArguments properties (where it has
        arguments), ids ``<node id>.InputArguments`` / ``.OutputArguments``."""
        node = self._new(parent, ref_type, node_id, METHOD, name,
                         {EXECUTABLE: True, USER_EXECUTABLE: True}, None, modelling_rule,
                         description)
        rule = MANDATORY if modelling_rule is not None else None
        for qname, args in ((INPUT_ARGUMENTS, inputs), (OUTPUT_ARGUMENTS, outputs)):
            if args:
                self.add_variable(
                    node_id, NodeId(f"{node_id.identifier!s}.{qname.name}", node_id.namespace),
                    qname, Variant(EXTENSION_OBJECT, [a.encode() for a in args]),
                    ARGUMENT_TYPE, 1, ref_type=HAS_PROPERTY, array_dimensions=(len(args),),
                    modelling_rule=rule)
        return node

    def add_object_type(self, node_id: NodeId, name: str | QualifiedName,
                        supertype: NodeId = BASE_OBJECT_TYPE, *, is_abstract: bool = False,
                        description: str | None = None) -> Node:
        """An ObjectType below ``supertype``; its declarations are added with the other
        builders, ``modelling_rule=MANDATORY`` (or OPTIONAL)."""
        return self._new(supertype, HAS_SUBTYPE, node_id, OBJECT_TYPE, name,
                         {IS_ABSTRACT: is_abstract}, None, None, description)

    def add_event_type(self, node_id: NodeId, name: str | QualifiedName,
                       fields: Sequence[tuple[str | QualifiedName, NodeId]] = (),
                       supertype: NodeId = BASE_EVENT_TYPE, *,
                       is_abstract: bool = False, description: str | None = None) -> Node:
        """An event type below ``supertype`` with its own fields: (name, data type) of
        each, a mandatory scalar property ``<node id>.<name>``."""
        node = self.add_object_type(node_id, name, supertype, is_abstract=is_abstract,
                                    description=description)
        for field_name, data_type in fields:
            qname = _qualified(field_name, node_id.namespace)
            self.add_variable(node_id, NodeId(f"{node_id.identifier!s}.{qname.name}",
                                              node_id.namespace),
                              qname, None, data_type, ref_type=HAS_PROPERTY,
                              modelling_rule=MANDATORY)
        return node
