"""The MQTT face's JSON of a JobOrder or a JobResponse straight into the OPC UA binary
body its structure class encodes to.

The face's status events and lists carry these structures as encoded bodies. Building
asyncua's objects from the JSON only to encode them at once was most of what a status
event cost the host with a client subscribed. The layout is read once from the classes
the loaded NodeSet made (the field order, which fields are optional and their bits in
the encoding mask, the width of each integer), so it follows the NodeSet. The bytes are
those of ``struct_to_binary(convert.from_json(name, doc))``, and a value that does not
fit raises ``ConvertError`` with its field's path, as ``from_json`` does; the tests
compare both over generated orders and responses.
"""

from __future__ import annotations

import dataclasses
import functools
import struct
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

from asyncua import ua
from asyncua.ua.ua_binary import to_binary

from sfc_host.opcua.convert import (
    FIELDS,
    ConvertError,
    Kind,
    time_from_json,
    ua_class,
    variant_shape,
)

_I32 = struct.Struct("<i").pack
_I64 = struct.Struct("<q").pack
_F64 = struct.Struct("<d").pack
_U32 = struct.Struct("<I").pack
_INTS = {"Byte": "<B", "SByte": "<b", "Int16": "<h", "UInt16": "<H", "Int32": "<i",
         "UInt32": "<I", "Int64": "<q", "UInt64": "<Q"}
_NULL_VARIANT = b"\x00"
_ARRAY = 0x80
# the types a JSON value becomes (convert.variant_shape): a scalar's bytes, an array's
# struct code (text: each its own string)
_ARRAY_CODES = {ua.VariantType.Boolean: "?", ua.VariantType.Int64: "q",
                ua.VariantType.Double: "d"}

# one field of a structure: name, kind (convert.FIELDS), its bit in the encoding mask
# (-1: not optional), the struct format of an integer, and the bytes of its default
_Field = tuple[str, Kind, int, str, bytes]


def body(name: str, doc: Mapping[str, Any]) -> bytes:
    """The encoded body of structure ``name`` (``JobOrder``, ``JobResponse``, …)."""
    out: list[bytes] = []
    _struct(name, doc, name, out)
    return b"".join(out)


def extension_object(name: str, doc: Mapping[str, Any]) -> ua.ExtensionObject:
    """``body`` as the ExtensionObject the structure goes out as."""
    return ua.ExtensionObject(TypeId=type_id(name), Body=body(name, doc))


@functools.cache
def type_id(name: str) -> ua.NodeId:
    """The binary encoding id structure ``name`` goes out with."""
    return ua.typeid_by_extension_objects[ua_class(name)]     # type: ignore[no-any-return]


@functools.cache
def _layout(name: str) -> tuple[bool, tuple[_Field, ...]]:
    """Whether the structure starts with an encoding mask, and its fields in wire order."""
    cls = ua_class(name)
    hints = typing.get_type_hints(cls, {"ua": ua})
    kinds = FIELDS[name][1]
    blank = cls()
    masked = False
    bit = 0
    fields: list[_Field] = []
    for f in dataclasses.fields(cls):
        if f.name == "Encoding":
            masked = True
            continue
        kind = kinds.get(f.name)
        if kind is None or (isinstance(kind, tuple) and kind[0] == "one"):
            raise RuntimeError(f"{FIELDS[name][0]}.{f.name}: not encoded here")
        hint = hints[f.name]
        optional = typing.get_origin(hint) in (typing.Union, types.UnionType) and \
            type(None) in typing.get_args(hint)
        base = next((a for a in typing.get_args(hint) if a is not type(None)), hint) \
            if optional else hint
        fmt = _INTS.get(getattr(base, "__name__", ""), "") if kind == "int" else ""
        if kind == "int" and not fmt:
            raise RuntimeError(f"{FIELDS[name][0]}.{f.name}: an integer of unknown width")
        default = b"" if optional else to_binary(hint, getattr(blank, f.name))
        fields.append((f.name, kind, bit if optional else -1, fmt, default))
        if optional:
            bit += 1
    return masked, tuple(fields)


def _struct(name: str, doc: Any, path: str, out: list[bytes]) -> None:
    if not isinstance(doc, Mapping):
        raise ConvertError(f"{path}: not an object")
    masked, fields = _layout(name)
    at = len(out)
    mask = 0
    for field, kind, bit, fmt, default in fields:
        v = doc.get(field)
        if v is None:
            if kind == "path" or bit < 0:
                out.append(default)     # an empty RelativePath, never null
            continue
        if bit >= 0:
            mask |= 1 << bit
        _field(kind, v, fmt, f"{path}.{field}", out)
    if masked:
        out.insert(at, _U32(mask))


def _field(kind: Kind, v: Any, fmt: str, path: str, out: list[bytes]) -> None:
    if isinstance(kind, tuple):
        if not isinstance(v, list):
            raise ConvertError(f"{path}: not a list")
        out.append(_I32(len(v)))
        for i, x in enumerate(v):
            _struct(kind[1], x, f"{path}[{i}]", out)
        return
    _SCALARS[kind](v, fmt, path, out)


def _text(v: Any, fmt: str, path: str, out: list[bytes]) -> None:
    out.append(_string(v if isinstance(v, str) else str(v)))


def _int(v: Any, fmt: str, path: str, out: list[bytes]) -> None:
    if not isinstance(v, int) or isinstance(v, bool):
        raise ConvertError(f"{path}: not an integer")
    try:
        out.append(struct.pack(fmt, v))
    except struct.error:
        raise ConvertError(f"{path}: {v} is out of its range") from None


def _time(v: Any, fmt: str, path: str, out: list[bytes]) -> None:
    out.append(_I64(ua.datetime_to_win_epoch(time_from_json(v, path))))


def _ltext(v: Any, fmt: str, path: str, out: list[bytes]) -> None:
    if not isinstance(v, Mapping):
        raise ConvertError(f"{path}: not a LocalizedText object")
    out.append(_localized(v.get("Text"), v.get("Locale"), path))


def _texts(v: Any, fmt: str, path: str, out: list[bytes]) -> None:
    if not isinstance(v, list):
        raise ConvertError(f"{path}: not a list")
    out.append(_I32(len(v)))
    for i, x in enumerate(v):
        _ltext(x, fmt, f"{path}[{i}]", out)


def _variant(v: Any, fmt: str, path: str, out: list[bytes]) -> None:
    out.append(variant(v))


def _eu(v: Any, fmt: str, path: str, out: list[bytes]) -> None:
    if not isinstance(v, Mapping):
        raise ConvertError(f"{path}: not an object")
    uri = v.get("NamespaceUri")
    if uri is not None and not isinstance(uri, str):
        raise ConvertError(f"{path}.NamespaceUri: not a String")
    try:
        unit = _I32(int(v.get("UnitId") or 0))
    except (ValueError, TypeError, struct.error):
        raise ConvertError(f"{path}.UnitId: not an Int32") from None
    display, description = v.get("DisplayName") or {}, v.get("Description") or {}
    for what, lt in (("DisplayName", display), ("Description", description)):
        if not isinstance(lt, Mapping):
            raise ConvertError(f"{path}.{what}: not a LocalizedText object")
    out += (_string(uri), unit,
            _localized(display.get("Text"), display.get("Locale"), path),
            _localized(description.get("Text"), description.get("Locale"), path))


def _path(v: Any, fmt: str, path: str, out: list[bytes]) -> None:
    out.append(_I32(0))     # a state's BrowsePath goes empty, as from_json makes it


_SCALARS: dict[str, Callable[[Any, str, str, list[bytes]], None]] = {
    "text": _text, "int": _int, "time": _time, "ltext": _ltext, "texts": _texts,
    "variant": _variant, "eu": _eu, "path": _path}


def _string(s: str | None) -> bytes:
    if s is None:
        return _I32(-1)
    data = s.encode("utf-8", "surrogateescape")
    return _I32(len(data)) + data


def _localized(text: Any, locale: Any, path: str) -> bytes:
    for what, s in (("Text", text), ("Locale", locale)):
        if s is not None and not isinstance(s, str):
            raise ConvertError(f"{path}: a LocalizedText's {what} must be a string")
    mask = (1 if locale is not None else 0) | (2 if text is not None else 0)
    return bytes((mask,)) + (_string(locale) if locale is not None else b"") + \
        (_string(text) if text is not None else b"")


def variant(v: Any) -> bytes:
    """``convert.variant_from_json(v)`` encoded (the same ``variant_shape``)."""
    try:
        vt, value, array = variant_shape(v)
    except OverflowError:
        raise ConvertError(f"{v} does not fit a Double") from None
    if vt is ua.VariantType.Null:
        return _NULL_VARIANT
    if not array:
        return bytes((vt.value,)) + _PACK[vt](value)
    code = _ARRAY_CODES.get(vt)
    items = _I32(len(value)) + (struct.pack(f"<{len(value)}{code}", *value) if code
                                else b"".join(_string(x) for x in value))
    return bytes((vt.value | _ARRAY,)) + items


_PACK: dict[ua.VariantType, Callable[[Any], bytes]] = {
    ua.VariantType.Boolean: lambda b: b"\x01" if b else b"\x00",
    ua.VariantType.Int64: _I64, ua.VariantType.Double: _F64,
    ua.VariantType.String: _string}
