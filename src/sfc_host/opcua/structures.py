"""ISA-95 job control values between the MQTT face's JSON and OPC UA's binary bodies.

The JSON the MES side speaks is, field for field, the structures of the ISA-95 Job
Control v2 NodeSet (``ISA95JobOrderDataType`` and the rest): the same names, the same
nesting. One table (``FIELDS``) says what each field holds in JSON; the wire layout
(the field order, which fields are optional and their bits in the encoding mask, the
width of each integer) is read from the NodeSet's DataTypeDefinitions in the server's
address space, so it follows the NodeSet. Both ways go straight between JSON and bytes:
a JobOrder that comes in over OPC UA becomes the JSON the MQTT face would have received
and goes through the same checks; what goes out (status events, job responses, the
order list) is encoded from the JSON the host stores, with no object per field between.

A value that does not fit raises ``ConvertError`` with the path of its field.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from collections.abc import Callable, Mapping
from typing import Any

from sfc_fast.wire.uabinary import (
    BOOLEAN,
    DOUBLE,
    INT64,
    NULL,
    STRING,
    DecodeError,
    EncodeError,
    ExtensionObject,
    LocalizedText,
    NodeId,
    Reader,
    Variant,
    Writer,
    datetime_from_ticks,
    ticks_from_datetime,
)
from sfc_host import isa95 as model
from sfc_host.errors import SfcHostError
from sfc_host.opcua_server import AddressSpace, StructureDefinition


class ConvertError(SfcHostError, ValueError):
    """A value that does not fit its field; the message names the field's path."""


# what each field of a structure holds: a scalar kind, or ("list"|"one", structure)
Kind = str | tuple[str, str]

_RESOURCE: dict[str, Kind] = {"ID": "text", "Description": "texts", "Quantity": "text",
                              "EngineeringUnits": "eu", "Properties": ("list", "Property")}
FIELDS: dict[str, tuple[str, dict[str, Kind]]] = {
    "Parameter": ("ISA95ParameterDataType", {
        "ID": "text", "Value": "variant", "Description": "texts", "EngineeringUnits": "eu",
        "Subparameters": ("list", "Parameter")}),
    "Property": ("ISA95PropertyDataType", {
        "ID": "text", "Value": "variant", "Description": "texts", "EngineeringUnits": "eu",
        "Subproperties": ("list", "Property")}),
    "WorkMaster": ("ISA95WorkMasterDataType", {
        "ID": "text", "Description": "ltext", "Parameters": ("list", "Parameter")}),
    "Personnel": ("ISA95PersonnelDataType", {**_RESOURCE, "PersonnelUse": "text"}),
    "Equipment": ("ISA95EquipmentDataType", {**_RESOURCE, "EquipmentUse": "text"}),
    "PhysicalAsset": ("ISA95PhysicalAssetDataType", {**_RESOURCE, "PhysicalAssetUse": "text"}),
    "Material": ("ISA95MaterialDataType", {
        "MaterialClassID": "text", "MaterialDefinitionID": "text", "MaterialLotID": "text",
        "MaterialSublotID": "text", "Description": "texts", "MaterialUse": "text",
        "Quantity": "text", "EngineeringUnits": "eu", "Properties": ("list", "Property")}),
    "JobOrder": ("ISA95JobOrderDataType", {
        "JobOrderID": "text", "Description": "texts", "WorkMasterID": ("list", "WorkMaster"),
        "StartTime": "time", "EndTime": "time", "Priority": "int",
        "JobOrderParameters": ("list", "Parameter"),
        "PersonnelRequirements": ("list", "Personnel"),
        "EquipmentRequirements": ("list", "Equipment"),
        "PhysicalAssetRequirements": ("list", "PhysicalAsset"),
        "MaterialRequirements": ("list", "Material")}),
    "State": ("ISA95StateDataType", {
        "BrowsePath": "path", "StateText": "ltext", "StateNumber": "int"}),
    "JobResponse": ("ISA95JobResponseDataType", {
        "JobResponseID": "text", "Description": "ltext", "JobOrderID": "text",
        "StartTime": "time", "EndTime": "time", "JobState": ("list", "State"),
        "JobResponseData": ("list", "Parameter"), "PersonnelActuals": ("list", "Personnel"),
        "EquipmentActuals": ("list", "Equipment"),
        "PhysicalAssetActuals": ("list", "PhysicalAsset"),
        "MaterialActuals": ("list", "Material")}),
    "JobOrderAndState": ("ISA95JobOrderAndStateDataType", {
        "JobOrder": ("one", "JobOrder"), "State": ("list", "State")}),
}

# the integer built-in types a field may have: their Writer and Reader methods
_INT_WRITE: dict[int, Callable[[Writer, int], None]] = {
    2: Writer.sbyte, 3: Writer.byte, 4: Writer.int16, 5: Writer.uint16, 6: Writer.int32,
    7: Writer.uint32, 8: Writer.int64, 9: Writer.uint64}
_INT_READ: dict[int, Callable[[Reader], int]] = {
    2: Reader.sbyte, 3: Reader.byte, 4: Reader.int16, 5: Reader.uint16, 6: Reader.int32,
    7: Reader.uint32, 8: Reader.int64, 9: Reader.uint64}
_ENUMERATION = NodeId(29)
STATES_KEPT = 256           # distinct ISA95StateDataType bodies kept (a machine has ~20)

# one field of a structure: name, kind (FIELDS), its bit in the encoding mask (-1: not
# optional), the integer's built-in type (0 for other kinds)
_Field = tuple[str, Kind, int, int]


class Structures:
    """The Job Control structures of a loaded NodeSet, by the MQTT face's names
    (``JobOrder``, ``JobResponse``, …): their binary encoding ids and their layouts."""

    def __init__(self, space: AddressSpace, namespace: int) -> None:
        by_name = {n.browse_name.name: n for n in space
                   if n.node_id.namespace == namespace and n.node_class == 64}
        self._layouts: dict[str, tuple[bool, tuple[_Field, ...]]] = {}
        self._type_ids: dict[str, NodeId] = {}
        for name, (type_name, kinds) in FIELDS.items():
            node = by_name.get(type_name)
            if node is None:
                raise RuntimeError(f"{type_name} is not loaded: load the Job Control NodeSet")
            definition = node.attributes.get(23)
            if not isinstance(definition, StructureDefinition):
                raise RuntimeError(f"{type_name} has no StructureDefinition")
            self._layouts[name] = _layout(space, type_name, definition, kinds)
            encoding = space.encoding(node.node_id)
            if encoding is None:
                raise RuntimeError(f"{type_name} has no Default Binary encoding")
            self._type_ids[name] = encoding
        self._states: dict[str, tuple[bytes, ...]] = {}
        self._state_bodies: dict[tuple[Any, ...], bytes] = {}

    def type_id(self, name: str) -> NodeId:
        """The binary encoding id structure ``name`` goes out with."""
        return self._type_ids[name]

    # ---- JSON -> bytes

    def body(self, name: str, doc: Mapping[str, Any]) -> bytes:
        """The encoded body of structure ``name`` made from its JSON."""
        w = Writer()
        self._struct(w, name, doc, name)
        return w.getvalue()

    def extension_object(self, name: str, doc: Mapping[str, Any]) -> ExtensionObject:
        return ExtensionObject(self._type_ids[name], self.body(name, doc))

    def state_bodies(self, state: str) -> tuple[bytes, ...]:
        """A job order state (``Ended_Completed``) as its ``ISA95StateDataType``
        bodies, made once."""
        got = self._states.get(state)
        if got is None:
            got = self._states[state] = tuple(self.body("State", s)
                                              for s in model.state_list(state))
        return got

    def state_list(self, state: str) -> list[ExtensionObject]:
        kind = self._type_ids["State"]
        return [ExtensionObject(kind, b) for b in self.state_bodies(state)]

    def state_array(self, state: str) -> bytes:
        """The encoded ``ISA95StateDataType[]`` of a state (a count, then each body),
        as it follows the JobOrder in an ``ISA95JobOrderAndStateDataType``."""
        parts = self.state_bodies(state)
        return len(parts).to_bytes(4, "little", signed=True) + b"".join(parts)

    def _struct(self, w: Writer, name: str, doc: Any, path: str) -> None:
        if type(doc) is not dict and not isinstance(doc, Mapping):
            raise ConvertError(f"{path}: not an object")
        if name == "State":
            # a state machine's few states: each state's body made once
            text = doc.get("StateText")
            if type(text) is dict:
                key = (text.get("Text"), text.get("Locale"), doc.get("StateNumber"))
                got = self._state_bodies.get(key)
                if got is None:
                    sub = Writer()
                    self._fields(sub, name, doc, path)
                    got = sub.getvalue()
                    if len(self._state_bodies) < STATES_KEPT:
                        self._state_bodies[key] = got
                w.raw(got)
                return
        self._fields(w, name, doc, path)

    def _fields(self, w: Writer, name: str, doc: Any, path: str) -> None:
        masked, fields = self._layouts[name]
        if masked:
            mask = 0
            for field, _kind, bit, _t in fields:
                if bit >= 0 and doc.get(field) is not None:
                    mask |= 1 << bit
            w.uint32(mask)
        for field, kind, bit, int_type in fields:
            v = doc.get(field)
            if v is None:
                if bit >= 0:
                    continue
                if isinstance(kind, tuple) and kind[0] == "one":
                    self._struct(w, kind[1], {}, f"{path}.{field}")
                else:
                    _default(w, kind, int_type)
                continue
            self._field(w, kind, v, int_type, f"{path}.{field}")

    def _field(self, w: Writer, kind: Kind, v: Any, int_type: int, path: str) -> None:
        if type(kind) is tuple:
            how, inner = kind
            if how == "one":
                self._struct(w, inner, v, path)
                return
            if not isinstance(v, list):
                raise ConvertError(f"{path}: not a list")
            w.length(len(v))
            for i, x in enumerate(v):
                self._struct(w, inner, x, f"{path}[{i}]")
            return
        assert isinstance(kind, str)
        try:
            _WRITE[kind](w, v, int_type, path)
        except EncodeError as e:
            raise ConvertError(f"{path}: {e}") from None

    # ---- bytes -> JSON

    def decode(self, name: str, body: bytes | None, path: str = "") -> dict[str, Any]:
        """A structure's encoded body as the MQTT face's JSON (fields left out where the
        structure holds nothing)."""
        if body is None:
            raise ConvertError(f"{path or name}: an empty {FIELDS[name][0]}")
        r = Reader(body)
        try:
            out = self._read_struct(r, name, path or name)
        except DecodeError as e:
            raise ConvertError(f"{path or name}: not an {FIELDS[name][0]}: {e}") from None
        if r.remaining:
            raise ConvertError(f"{path or name}: {r.remaining} bytes after its "
                               f"{FIELDS[name][0]}")
        return out

    def decode_object(self, name: str, obj: Any, path: str = "") -> dict[str, Any]:
        """An ExtensionObject argument holding structure ``name``."""
        path = path or name
        if not isinstance(obj, ExtensionObject) or obj.encoding != 1:
            raise ConvertError(f"{path}: not an {FIELDS[name][0]}")
        if obj.type_id != self._type_ids[name]:
            raise ConvertError(f"{path}: an {obj.type_id}, not an {FIELDS[name][0]}")
        return self.decode(name, obj.body, path)

    def _read_struct(self, r: Reader, name: str, path: str) -> dict[str, Any]:
        masked, fields = self._layouts[name]
        mask = r.uint32() if masked else -1
        out: dict[str, Any] = {}
        for field, kind, bit, int_type in fields:
            if bit >= 0 and not mask & (1 << bit):
                continue
            got = self._read_field(r, kind, int_type, f"{path}.{field}")
            if got is not None and got != []:
                out[field] = got
        return out

    def _read_field(self, r: Reader, kind: Kind, int_type: int, path: str) -> Any:
        if isinstance(kind, tuple):
            how, inner = kind
            if how == "one":
                return self._read_struct(r, inner, path)
            n = r.length()
            if n > r.remaining:
                raise DecodeError(f"{path}: {n} items in {r.remaining} bytes", r.pos)
            return [self._read_struct(r, inner, f"{path}[{i}]") for i in range(max(n, 0))]
        return _READ[kind](r, int_type, path)


def _layout(space: AddressSpace, type_name: str, d: StructureDefinition,
            kinds: Mapping[str, Kind]) -> tuple[bool, tuple[_Field, ...]]:
    if d.structure_type not in (0, 1):
        raise RuntimeError(f"{type_name}: a union is not encoded here")
    masked = d.structure_type == 1
    bit = 0
    fields: list[_Field] = []
    for f in d.fields:
        kind = kinds.get(f.name)
        if kind is None:
            raise RuntimeError(f"{type_name}.{f.name}: a field the face does not know")
        int_type = 0
        if kind == "int":
            int_type = _builtin(space, f.data_type)
            if int_type not in _INT_WRITE:
                raise RuntimeError(f"{type_name}.{f.name}: an integer of unknown width")
        optional = masked and f.is_optional
        fields.append((f.name, kind, bit if optional else -1, int_type))
        if optional:
            bit += 1
    return masked, tuple(fields)


def _builtin(space: AddressSpace, data_type: NodeId) -> int:
    """The built-in type id a data type is (an Enumeration encodes as Int32)."""
    for t in [data_type, *space.supertypes(data_type)]:
        if t == _ENUMERATION:
            return 6
        if t.namespace == 0 and isinstance(t.identifier, int) and t.identifier <= 25:
            return t.identifier
    return 0


def _default(w: Writer, kind: Kind, int_type: int) -> None:
    """A mandatory field the JSON leaves out: its null or zero."""
    if isinstance(kind, tuple) or kind == "texts":
        w.length(0)                 # an empty list
    elif kind == "int":
        _INT_WRITE[int_type](w, 0)
    elif kind == "text":
        w.string(None)
    elif kind == "time":
        w.int64(0)
    elif kind == "ltext":
        w.localized_text(LocalizedText(None))
    elif kind == "variant":
        w.variant(None)
    elif kind == "eu":
        w.string(None)
        w.int32(0)
        w.localized_text(LocalizedText(None))
        w.localized_text(LocalizedText(None))
    elif kind == "path":
        w.length(0)                 # an empty RelativePath, never null: clients decode it


# ---- scalar kinds, written


def _w_text(w: Writer, v: Any, _t: int, path: str) -> None:
    w.string(v if isinstance(v, str) else str(v))


def _w_int(w: Writer, v: Any, int_type: int, path: str) -> None:
    if not isinstance(v, int) or isinstance(v, bool):
        raise ConvertError(f"{path}: not an integer")
    try:
        _INT_WRITE[int_type](w, v)
    except (EncodeError, OverflowError):
        raise ConvertError(f"{path}: {v} is out of its range") from None


def _w_time(w: Writer, v: Any, _t: int, path: str) -> None:
    w.datetime(ticks_from_datetime(time_from_json(v, path)))


def _w_ltext(w: Writer, v: Any, _t: int, path: str) -> None:
    w.localized_text(_ltext_from_json(v, path))


def _w_texts(w: Writer, v: Any, _t: int, path: str) -> None:
    if not isinstance(v, list):
        raise ConvertError(f"{path}: not a list")
    w.length(len(v))
    for i, x in enumerate(v):
        w.localized_text(_ltext_from_json(x, f"{path}[{i}]"))


def _w_variant(w: Writer, v: Any, _t: int, path: str) -> None:
    try:
        w.variant(variant_from_json(v))
    except (EncodeError, OverflowError) as e:
        raise ConvertError(f"{path}: {e}") from None


def _w_eu(w: Writer, v: Any, _t: int, path: str) -> None:
    if not isinstance(v, Mapping):
        raise ConvertError(f"{path}: not an object")
    uri = v.get("NamespaceUri")
    if uri is not None and not isinstance(uri, str):
        raise ConvertError(f"{path}.NamespaceUri: not a String")
    try:
        unit = int(v.get("UnitId") or 0)
    except (ValueError, TypeError):
        raise ConvertError(f"{path}.UnitId: not an Int32") from None
    display = _ltext_from_json(v.get("DisplayName") or {}, path + ".DisplayName")
    description = _ltext_from_json(v.get("Description") or {}, path + ".Description")
    w.string(uri)
    try:
        w.int32(unit)
    except (EncodeError, OverflowError):
        raise ConvertError(f"{path}.UnitId: not an Int32") from None
    w.localized_text(display)
    w.localized_text(description)


def _w_path(w: Writer, v: Any, _t: int, path: str) -> None:
    w.length(0)                     # a state's BrowsePath goes empty


_WRITE: dict[str, Callable[[Writer, Any, int, str], None]] = {
    "text": _w_text, "int": _w_int, "time": _w_time, "ltext": _w_ltext, "texts": _w_texts,
    "variant": _w_variant, "eu": _w_eu, "path": _w_path}


# ---- scalar kinds, read


def _r_text(r: Reader, _t: int, path: str) -> Any:
    return r.string()


def _r_int(r: Reader, int_type: int, path: str) -> Any:
    return _INT_READ[int_type](r)


def _r_time(r: Reader, _t: int, path: str) -> Any:
    ticks = r.datetime()
    return _iso(datetime_from_ticks(ticks)) if ticks > 0 else None


def _r_ltext(r: Reader, _t: int, path: str) -> Any:
    return _ltext_to_json(r.localized_text()) or None


def _r_texts(r: Reader, _t: int, path: str) -> Any:
    n = r.length()
    if n > r.remaining:
        raise DecodeError(f"{path}: {n} texts in {r.remaining} bytes", r.pos)
    return [_ltext_to_json(r.localized_text()) for _ in range(max(n, 0))] or None


def _r_variant(r: Reader, _t: int, path: str) -> Any:
    return variant_to_json(r.variant(), path)


def _r_eu(r: Reader, _t: int, path: str) -> Any:
    out: dict[str, Any] = {}
    uri = r.string()
    unit = r.int32()
    display, description = r.localized_text(), r.localized_text()
    if uri:
        out["NamespaceUri"] = uri
    if unit:
        out["UnitId"] = unit
    if display.text is not None:
        out["DisplayName"] = _ltext_to_json(display)
    if description.text is not None:
        out["Description"] = _ltext_to_json(description)
    return out


def _r_path(r: Reader, _t: int, path: str) -> Any:
    n = r.length()
    if n > r.remaining:
        raise DecodeError(f"{path}: {n} path elements in {r.remaining} bytes", r.pos)
    for _ in range(max(n, 0)):      # the MQTT face leaves a state's BrowsePath out
        r.nodeid()
        r.boolean()
        r.boolean()
        r.qualified_name()
    return None


_READ: dict[str, Callable[[Reader, int, str], Any]] = {
    "text": _r_text, "int": _r_int, "time": _r_time, "ltext": _r_ltext, "texts": _r_texts,
    "variant": _r_variant, "eu": _r_eu, "path": _r_path}


# ---- values


def _ltext_to_json(v: LocalizedText) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if v.locale:
        out["Locale"] = v.locale
    if v.text is not None:
        out["Text"] = v.text
    return out


def _ltext_from_json(v: Any, path: str) -> LocalizedText:
    if not isinstance(v, Mapping):
        raise ConvertError(f"{path}: not a LocalizedText object")
    text, locale = v.get("Text"), v.get("Locale")
    for what, s in (("Text", text), ("Locale", locale)):
        if s is not None and not isinstance(s, str):
            raise ConvertError(f"{path}: a LocalizedText's {what} must be a string")
    return LocalizedText(text, locale)


def texts_to_json(v: Variant | None, path: str = "Comment") -> list[dict[str, Any]]:
    """A ``LocalizedText[]`` argument (a Comment); an empty list for none."""
    if v is None or v.type == NULL:
        return []
    if not v.is_array or v.type != 21:
        raise ConvertError(f"{path}: not a LocalizedText array")
    return [_ltext_to_json(x) for x in v.value]


def variant_to_json(v: Variant | None, path: str = "Value") -> Any:
    """A parameter's value: what its Variant holds, as JSON holds it."""
    return None if v is None else _plain(v.value, path)


def _plain(v: Any, path: str) -> Any:
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, dt.datetime):
        return _iso(v)
    if isinstance(v, (bytes, bytearray)):
        return base64.b64encode(bytes(v)).decode("ascii")
    if isinstance(v, LocalizedText):
        return v.text
    if isinstance(v, list):
        return [_plain(x, f"{path}[{i}]") for i, x in enumerate(v)]
    if isinstance(v, Variant):
        return _plain(v.value, path)
    raise ConvertError(f"{path}: a {type(v).__name__} value has no JSON form")


def _iso(t: dt.datetime) -> str:
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.UTC)
    return t.astimezone(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def time_from_json(v: Any, path: str) -> dt.datetime:
    """An RFC 3339 time of the MQTT face's JSON (``Z`` or an offset; none: UTC)."""
    if not isinstance(v, str):
        raise ConvertError(f"{path}: not a time")
    try:
        t = dt.datetime.fromisoformat(v.replace("Z", "+00:00"))
    except ValueError:
        raise ConvertError(f"{path}: {v!r} is not an RFC 3339 time") from None
    return t if t.tzinfo is not None else t.replace(tzinfo=dt.UTC)


_SCALAR_TYPES = {bool: BOOLEAN, int: INT64, float: DOUBLE, str: STRING}


def variant_shape(v: Any) -> tuple[int, Any, bool]:
    """What a JSON value is as the Variant a parameter's ``Value`` is: its type, its
    value and whether it is an array. A number, text or flag as itself (an integer past
    Int64 as a Double), an array of one of them as an array; an object, or a mixed or
    empty array, as its JSON text; null as the null Variant."""
    if v is None:
        return NULL, None, False
    vt = _SCALAR_TYPES.get(type(v))
    if vt == INT64 and not -2**63 <= v < 2**63:
        return DOUBLE, float(v), False
    if vt is not None:
        return vt, v, False
    if isinstance(v, list) and v:
        kinds = {type(x) for x in v}
        if len(kinds) == 1:
            t = next(iter(kinds))
            vt = _SCALAR_TYPES.get(t)
            if vt is not None and (t is not int or all(-2**63 <= x < 2**63 for x in v)):
                return vt, list(v), True
    return STRING, json.dumps(v, separators=(",", ":")), False


def variant_from_json(v: Any) -> Variant | None:
    """A JSON value as the Variant a parameter's ``Value`` is (``variant_shape``)."""
    vt, value, _array = variant_shape(v)
    return None if vt == NULL else Variant(vt, value)


def state_of(structures: Structures, value: Variant | None,
             path: str = "JobOrderState") -> str:
    """The state an ``ISA95StateDataType[]`` argument names (``ConvertError`` if none)."""
    if value is None or not value.is_array or not value.value:
        raise ConvertError(f"{path}: not a non-empty ISA95StateDataType array")
    docs = [structures.decode_object("State", s, f"{path}[{i}]")
            for i, s in enumerate(value.value)]
    try:
        return model.state_name(docs)
    except ValueError as e:
        raise ConvertError(f"{path}: {e}") from None
