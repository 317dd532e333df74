"""ISA-95 job control values between the MQTT face's JSON and OPC UA's structures.

The JSON the MES side speaks is, field for field, the structures of the ISA-95 Job
Control v2 NodeSet (``ISA95JobOrderDataType`` and the rest): the same names, the same
nesting. So one table per structure says what each field holds, and two walks turn a
value one way or the other. A JobOrder that comes in over OPC UA becomes the JSON the
MQTT face would have received and goes through the same checks; what goes out (status
events, job responses, the order list) is made from the JSON the host stores.

The structure classes exist once the NodeSet is loaded (``asyncua.ua`` makes them).
A value that does not fit raises ``ConvertError`` with the path of the field.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from collections.abc import Mapping
from typing import Any

from asyncua import ua

from sfc_host import isa95 as model
from sfc_host.errors import SfcHostError


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


def ua_class(name: str) -> type:
    """The structure class of ``name`` (``JobOrder``), as the loaded NodeSet made it."""
    cls = getattr(ua, FIELDS[name][0], None)
    if cls is None:
        raise RuntimeError(f"{FIELDS[name][0]} is not loaded: import the Job Control NodeSet")
    return cls     # type: ignore[no-any-return]


# ---- OPC UA -> JSON


def to_json(name: str, value: Any, path: str = "") -> dict[str, Any]:
    """A structure ``name`` (an instance of its class) as the MQTT face's JSON."""
    path = path or name
    cls = ua_class(name)
    if not isinstance(value, cls):
        raise ConvertError(f"{path}: not an {FIELDS[name][0]}")
    out: dict[str, Any] = {}
    for field, kind in FIELDS[name][1].items():
        v = getattr(value, field, None)
        if v is None:
            continue
        got = _field_to_json(kind, v, f"{path}.{field}")
        if got is not None:
            out[field] = got
    return out


def _field_to_json(kind: Kind, v: Any, path: str) -> Any:
    if isinstance(kind, tuple):
        how, inner = kind
        if how == "one":
            return to_json(inner, v, path)
        if not isinstance(v, list):
            raise ConvertError(f"{path}: not a list")
        return [to_json(inner, x, f"{path}[{i}]") for i, x in enumerate(v)] or None
    if kind == "text":
        if not isinstance(v, str):
            raise ConvertError(f"{path}: not a String")
        return v
    if kind == "int":
        if not isinstance(v, int) or isinstance(v, bool):
            raise ConvertError(f"{path}: not an integer")
        return v
    if kind == "time":
        if not isinstance(v, dt.datetime):
            raise ConvertError(f"{path}: not a DateTime")
        return _iso(v)
    if kind == "ltext":
        return _ltext_to_json(v, path)
    if kind == "texts":
        if not isinstance(v, list):
            raise ConvertError(f"{path}: not a list")
        return [_ltext_to_json(x, f"{path}[{i}]") for i, x in enumerate(v)] or None
    if kind == "variant":
        return variant_to_json(v, path)
    if kind == "eu":
        return _eu_to_json(v, path)
    if kind == "path":
        return None     # a state's BrowsePath: the MQTT face leaves it out
    raise AssertionError(kind)


def _ltext_to_json(v: Any, path: str) -> dict[str, Any]:
    if not isinstance(v, ua.LocalizedText):
        raise ConvertError(f"{path}: not a LocalizedText")
    out: dict[str, Any] = {}
    if v.Locale:
        out["Locale"] = v.Locale
    if v.Text is not None:
        out["Text"] = v.Text
    return out


def texts_to_json(v: Any, path: str = "Comment") -> list[dict[str, Any]]:
    """A ``LocalizedText[]`` argument (a Comment); an empty list for none."""
    if v is None:
        return []
    if not isinstance(v, list):
        raise ConvertError(f"{path}: not a LocalizedText array")
    return [_ltext_to_json(x, f"{path}[{i}]") for i, x in enumerate(v)]


def _eu_to_json(v: Any, path: str) -> dict[str, Any]:
    if not isinstance(v, ua.EUInformation):
        raise ConvertError(f"{path}: not an EUInformation")
    out: dict[str, Any] = {}
    if v.NamespaceUri:
        out["NamespaceUri"] = v.NamespaceUri
    if v.UnitId:
        out["UnitId"] = v.UnitId
    if v.DisplayName is not None and v.DisplayName.Text is not None:
        out["DisplayName"] = _ltext_to_json(v.DisplayName, path + ".DisplayName")
    if v.Description is not None and v.Description.Text is not None:
        out["Description"] = _ltext_to_json(v.Description, path + ".Description")
    return out


def variant_to_json(v: Any, path: str = "Value") -> Any:
    """A parameter's value: what its Variant holds, as JSON holds it."""
    if isinstance(v, ua.Variant):
        v = v.Value
    return _plain(v, path)


def _plain(v: Any, path: str) -> Any:
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, dt.datetime):
        return _iso(v)
    if isinstance(v, (bytes, bytearray)):
        return base64.b64encode(bytes(v)).decode("ascii")
    if isinstance(v, ua.LocalizedText):
        return v.Text
    if isinstance(v, list):
        return [_plain(x, f"{path}[{i}]") for i, x in enumerate(v)]
    if isinstance(v, ua.Variant):
        return _plain(v.Value, path)
    raise ConvertError(f"{path}: a {type(v).__name__} value has no JSON form")


def _iso(t: dt.datetime) -> str:
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.UTC)
    return t.astimezone(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# ---- JSON -> OPC UA


def from_json(name: str, doc: Mapping[str, Any], path: str = "") -> Any:
    """The MQTT face's JSON of a structure ``name`` as its OPC UA class."""
    path = path or name
    if not isinstance(doc, Mapping):
        raise ConvertError(f"{path}: not an object")
    cls = ua_class(name)
    fields = FIELDS[name][1]
    kw: dict[str, Any] = {}
    for field, kind in fields.items():
        v = doc.get(field)
        if v is None:
            if kind == "path":
                kw[field] = ua.RelativePath()     # never null: clients decode it
            continue
        kw[field] = _field_from_json(kind, v, f"{path}.{field}")
    try:
        return cls(**kw)
    except TypeError as e:
        raise ConvertError(f"{path}: {e}") from None


def _field_from_json(kind: Kind, v: Any, path: str) -> Any:
    if isinstance(kind, tuple):
        how, inner = kind
        if how == "one":
            return from_json(inner, v, path)
        if not isinstance(v, list):
            raise ConvertError(f"{path}: not a list")
        return [from_json(inner, x, f"{path}[{i}]") for i, x in enumerate(v)]
    if kind == "text":
        return v if isinstance(v, str) else str(v)
    if kind == "int":
        if not isinstance(v, int) or isinstance(v, bool):
            raise ConvertError(f"{path}: not an integer")
        return v
    if kind == "time":
        return time_from_json(v, path)
    if kind == "ltext":
        return _ltext_from_json(v, path)
    if kind == "texts":
        if not isinstance(v, list):
            raise ConvertError(f"{path}: not a list")
        return [_ltext_from_json(x, f"{path}[{i}]") for i, x in enumerate(v)]
    if kind == "variant":
        return variant_from_json(v)
    if kind == "eu":
        if not isinstance(v, Mapping):
            raise ConvertError(f"{path}: not an object")
        return ua.EUInformation(
            NamespaceUri=v.get("NamespaceUri"), UnitId=int(v.get("UnitId") or 0),
            DisplayName=_ltext_from_json(v.get("DisplayName") or {}, path),
            Description=_ltext_from_json(v.get("Description") or {}, path))
    if kind == "path":
        return ua.RelativePath()
    raise AssertionError(kind)


def _ltext_from_json(v: Any, path: str) -> ua.LocalizedText:
    if not isinstance(v, Mapping):
        raise ConvertError(f"{path}: not a LocalizedText object")
    return ua.LocalizedText(v.get("Text"), v.get("Locale"))


def time_from_json(v: Any, path: str) -> dt.datetime:
    """An RFC 3339 time of the MQTT face's JSON (``Z`` or an offset; none: UTC)."""
    if not isinstance(v, str):
        raise ConvertError(f"{path}: not a time")
    try:
        return dt.datetime.fromisoformat(v.replace("Z", "+00:00"))
    except ValueError:
        raise ConvertError(f"{path}: {v!r} is not an RFC 3339 time") from None


_SCALAR_TYPES = {bool: ua.VariantType.Boolean, int: ua.VariantType.Int64,
                 float: ua.VariantType.Double, str: ua.VariantType.String}


def variant_shape(v: Any) -> tuple[ua.VariantType, Any, bool]:
    """What a JSON value is as the Variant a parameter's ``Value`` is: its type, its
    value and whether it is an array. A number, text or flag as itself (an integer past
    Int64 as a Double), an array of one of them as an array; an object, or a mixed or
    empty array, as its JSON text; null as the null Variant."""
    if v is None:
        return ua.VariantType.Null, None, False
    vt = _SCALAR_TYPES.get(type(v))
    if vt is ua.VariantType.Int64 and not -2**63 <= v < 2**63:
        return ua.VariantType.Double, float(v), False
    if vt is not None:
        return vt, v, False
    if isinstance(v, list) and v:
        kinds = {type(x) for x in v}
        if len(kinds) == 1:
            t = next(iter(kinds))
            vt = _SCALAR_TYPES.get(t)
            if vt is not None and (t is not int or all(-2**63 <= x < 2**63 for x in v)):
                return vt, list(v), True
    return ua.VariantType.String, json.dumps(v, separators=(",", ":")), False


def variant_from_json(v: Any) -> ua.Variant:
    """A JSON value as the Variant a parameter's ``Value`` is (``variant_shape``)."""
    vt, value, array = variant_shape(v)
    if vt is ua.VariantType.Null:
        return ua.Variant()
    return ua.Variant(value, vt, is_array=array)


# ---- job order states


def states(name: str) -> list[Any]:
    """A job order state (``Ended_Completed``) as its ``ISA95StateDataType`` list."""
    return [from_json("State", s) for s in model.state_list(name)]


def state_of(value: Any, path: str = "JobOrderState") -> str:
    """The state an ``ISA95StateDataType[]`` argument names (``ConvertError`` if none)."""
    if not isinstance(value, list) or not value:
        raise ConvertError(f"{path}: not a non-empty ISA95StateDataType array")
    docs = [to_json("State", s, f"{path}[{i}]") for i, s in enumerate(value)]
    try:
        return model.state_name(docs)
    except ValueError as e:
        raise ConvertError(f"{path}: {e}") from None
