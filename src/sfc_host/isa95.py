"""The ISA-95 job control payloads as the Python original puts them on the wire.

The types are msgspec Structs named and ordered like OPC UA ISA95JOBCONTROL v2 and
Machinery Jobs: PascalCase keys, ``None`` fields left out, unknown keys ignored. A
payload is checked by type while it is decoded (a ``WorkMasterID`` that is a string is
refused with the path of the fault), and what is stored is the Struct encoded again, so
an order is given back exactly as the original gives it back.

Inside the host a job order state is one string (``Ended_Completed``); on the wire it
is a list of ``ISA95StateDataType`` (``StateText``, ``StateNumber``), made here from the
job order machine once per state and kept as encoded JSON.
"""

from __future__ import annotations

from typing import Any

import msgspec

from sfc_fast import JOB_ORDER

# ---- CloudEvent types and data schemas (copied verbatim from the original's wire)

JOB_CONTROL = "org.opcfoundation.ISA95-JOBCONTROL_V2."
METHODS = ("Store", "StoreAndStart", "Start", "RevokeStart", "Update", "Pause", "Resume",
           "Stop", "Abort", "Cancel", "Clear")
STORE_METHODS = frozenset(("Store", "StoreAndStart", "Update"))
BY_ID = "org.opcfoundation.Machinery.Jobs.RequestJobResponseByJobOrderID.v1"
BY_STATE = "org.opcfoundation.Machinery.Jobs.RequestJobResponseByJobOrderState.v1"
STATUS_EVENT = JOB_CONTROL + "ISA95JobOrderStatusEventType.v2"
CONFIG = "com.github.aschamberger.ISA95-JOBCONTROL_V2.config."
CONFIG_KINDS = ("workmaster", "equipment", "materialclass", "materialdefinition",
                "personnel", "physicalasset", "jobacceptance")
WORK_MASTER = CONFIG + "workmaster.v1"

_JC_SCHEMA = "https://aschamberger.github.com/schemas/UA/ISA95-JOBCONTROL_V2/v2.0.0/"
_JOBS_SCHEMA = "https://aschamberger.github.com/schemas/UA/Machinery/Jobs/v1.0.1/"
STATUS_EVENT_SCHEMA = _JC_SCHEMA + "#/$defs/ISA95JobOrderStatusEventType"

SUPPORTED_COMMANDS = ("Store", "StoreAndStart", "Abort", "Cancel", "Clear", "Pause",
                      "Resume", "RevokeStart", "Start", "Stop", "Update",
                      "RequestJobResponseByJobOrderID", "RequestJobResponseByJobOrderState")
METADATA = {
    "modelUri": "http://opcfoundation.org/UA/Machinery/Jobs/",
    "modelVersion": "1.0.1",
    "modelDate": "2024-05-01T00:00:00",
    "additionalAttributes": [["supported_commands", list(SUPPORTED_COMMANDS)],
                             ["event_types", ["ISA95JobOrderStatusEventType"]]],
}

# OPC UA method return status bits (ISA-95 job control)
NO_ERROR = 1
UNKNOWN_JOB_ORDER_ID = 2
INVALID_JOB_ORDER_STATUS = 8
UNABLE_TO_ACCEPT_JOB_ORDER = 16
INVALID_REQUEST = 2 ** 32


def method_of(ce_type: str) -> str | None:
    """The request's method (``Store``, ``RequestJobResponseByJobOrderID``, ``config.
    equipment``) or None for a type this side does not serve."""
    if ce_type.startswith(JOB_CONTROL) and ce_type.endswith(".v2"):
        m = ce_type[len(JOB_CONTROL):-3]
        return m if m in METHODS else None
    if ce_type == BY_ID:
        return "RequestJobResponseByJobOrderID"
    if ce_type == BY_STATE:
        return "RequestJobResponseByJobOrderState"
    if ce_type.startswith(CONFIG) and ce_type.endswith(".v1"):
        kind = ce_type[len(CONFIG):-3]
        return "config." + kind if kind in CONFIG_KINDS else None
    return None


def reply_schema(method: str) -> str | None:
    """The ``dataschema`` of a reply, as the original sets it (configs get none)."""
    if method in METHODS:
        return f"{_JC_SCHEMA}#/$defs/{method}Response"
    if method.startswith("RequestJobResponse"):
        return f"{_JOBS_SCHEMA}#/$defs/{method}Response"
    return None


def call_schema(method: str) -> str:
    """The ``dataschema`` a request of the original's own sender carries."""
    if method in METHODS:
        return f"{_JC_SCHEMA}#/$defs/{method}Call"
    if method.startswith("RequestJobResponse"):
        return f"{_JOBS_SCHEMA}#/$defs/{method}Call"
    kind = method.removeprefix("config.")
    names = {"workmaster": "WorkMaster", "equipment": "Equipment",
             "materialclass": "MaterialClass", "materialdefinition": "MaterialDefinition",
             "personnel": "Personnel", "physicalasset": "PhysicalAsset",
             "jobacceptance": "JobAcceptance"}
    return f"{_JC_SCHEMA}Config{names[kind]}/"


# ---- the ISA-95 types

_OPTS: dict[str, Any] = {"omit_defaults": True, "kw_only": True}


class LocalizedText(msgspec.Struct, **_OPTS):
    Locale: str | None = None
    Text: str | None = None


class EUInformation(msgspec.Struct, **_OPTS):
    NamespaceUri: str | None = None
    UnitId: int | None = None
    DisplayName: LocalizedText | None = None
    Description: LocalizedText | None = None


class Property(msgspec.Struct, **_OPTS):
    ID: str | None = None
    Value: Any = None
    Description: list[LocalizedText] | None = None
    EngineeringUnits: EUInformation | None = None
    Subproperties: list[Property] | None = None


class Parameter(msgspec.Struct, **_OPTS):
    ID: str | None = None
    Value: Any = None
    Description: list[LocalizedText] | None = None
    EngineeringUnits: EUInformation | None = None
    Subparameters: list[Parameter] | None = None


class Resource(msgspec.Struct, **_OPTS):
    """Personnel, equipment and physical asset (their ``…Use`` field differs)."""

    ID: str | None = None
    Description: list[LocalizedText] | None = None
    PersonnelUse: str | None = None
    EquipmentUse: str | None = None
    PhysicalAssetUse: str | None = None
    Quantity: str | None = None
    EngineeringUnits: EUInformation | None = None
    Properties: list[Property] | None = None


class Material(msgspec.Struct, **_OPTS):
    MaterialClassID: str | None = None
    MaterialDefinitionID: str | None = None
    MaterialLotID: str | None = None
    MaterialSublotID: str | None = None
    Description: list[LocalizedText] | None = None
    MaterialUse: str | None = None
    Quantity: str | None = None
    EngineeringUnits: EUInformation | None = None
    Properties: list[Property] | None = None


class WorkMasterRef(msgspec.Struct, **_OPTS):
    ID: str | None = None
    Description: LocalizedText | None = None
    Parameters: list[Parameter] | None = None


class JobOrderData(msgspec.Struct, **_OPTS):
    JobOrderID: str | None = None
    Description: list[LocalizedText] | None = None
    WorkMasterID: list[WorkMasterRef] | None = None
    StartTime: str | None = None
    EndTime: str | None = None
    Priority: int | None = None
    JobOrderParameters: list[Parameter] | None = None
    PersonnelRequirements: list[Resource] | None = None
    EquipmentRequirements: list[Resource] | None = None
    PhysicalAssetRequirements: list[Resource] | None = None
    MaterialRequirements: list[Material] | None = None


class PathElement(msgspec.Struct, **_OPTS):
    ReferenceTypeId: str | None = None
    IsInverse: bool | None = None
    IncludeSubtypes: bool | None = None
    TargetName: str | None = None


class RelativePath(msgspec.Struct, **_OPTS):
    Elements: list[PathElement] | None = None


class State(msgspec.Struct, **_OPTS):
    BrowsePath: RelativePath | None = None
    StateText: LocalizedText | None = None
    StateNumber: int | None = None


# ---- request payloads


class StoreCall(msgspec.Struct, **_OPTS):
    """Store, StoreAndStart, Update."""

    JobOrder: JobOrderData | None = None
    Comment: list[LocalizedText] | None = None


class IdCall(msgspec.Struct, **_OPTS):
    """The methods on a stored order, and RequestJobResponseByJobOrderID."""

    JobOrderID: str | None = None
    Comment: list[LocalizedText] | None = None


class StateCall(msgspec.Struct, **_OPTS):
    JobOrderState: list[State] | None = None


class ConfigItem(msgspec.Struct, **_OPTS):
    """Equipment, personnel, physical asset (``ID``) and material class / definition."""

    ID: str | None = None
    MaterialClassID: str | None = None
    MaterialDefinitionID: str | None = None


class ConfigJobAcceptance(msgspec.Struct):
    max_downloadable_job_orders: int


# ---- snake_case input (the original accepts its field names as well as the aliases)


def _snake(name: str) -> str:
    out = []
    for i, ch in enumerate(name):
        if ch.isupper() and i and not (name[i - 1].isupper() and (
                i + 1 == len(name) or name[i + 1].isupper())):
            out.append("_")
        out.append(ch.lower())
    return "".join(out)


def _aliases() -> dict[str, str]:
    names: set[str] = set()
    for t in (LocalizedText, EUInformation, Property, Parameter, Resource, Material,
              WorkMasterRef, JobOrderData, PathElement, RelativePath, State, StoreCall, IdCall,
              StateCall, ConfigItem):
        names.update(t.__struct_fields__)
    return {_snake(n): n for n in names}


_ALIASES: dict[str, str] = {}   # job_order_id -> JobOrderID, … (made at import's end)


def pascal_keys(value: Any) -> Any:
    """A decoded payload with the original's snake_case field names turned into the
    wire's names (a key that is already PascalCase stays)."""
    if isinstance(value, dict):
        return {(_ALIASES.get(k, k) if isinstance(k, str) else k): pascal_keys(v)
                for k, v in value.items()}
    if isinstance(value, list):
        return [pascal_keys(v) for v in value]
    return value


def has_snake_keys(value: Any) -> bool:
    return isinstance(value, dict) and any(
        isinstance(k, str) and k in _ALIASES and k != _ALIASES[k] for k in value)


# ---- states


def _state_list(name: str) -> list[dict[str, Any]]:
    return [{"StateText": {"Locale": "en", "Text": text}, "StateNumber": number}
            for text, number in JOB_ORDER.path(name)]


STATE_NAMES: tuple[str, ...] = tuple(JOB_ORDER.states)
STATE_LISTS: dict[str, list[dict[str, Any]]] = {s: _state_list(s) for s in STATE_NAMES}
STATE_JSON: dict[str, bytes] = {s: msgspec.json.encode(v) for s, v in STATE_LISTS.items()}
# joined StateText of every state -> (state name, its numbers)
_BY_TEXT: dict[str, tuple[str, tuple[int, ...]]] = {
    "_".join(t for t, _ in JOB_ORDER.path(s)): (s, tuple(n for _, n in JOB_ORDER.path(s)))
    for s in STATE_NAMES}


def state_list(state: str) -> list[dict[str, Any]]:
    """``Ended_Completed`` -> ``[{StateText: Ended, StateNumber: 5}, {… Completed, 1}]``."""
    return STATE_LISTS[state]


def state_name(states: list[State] | list[dict[str, Any]]) -> str:
    """The state a list names (``ValueError`` for an unknown text or a number that does
    not belong to it). Texts are joined as the original joins them; a number, where
    given, must be the machine's own for that text."""
    texts: list[str] = []
    numbers: list[int | None] = []
    for s in states:
        if isinstance(s, State):
            text = s.StateText.Text if s.StateText is not None else None
            number = s.StateNumber
        elif isinstance(s, dict):
            st = s.get("StateText")
            text = st.get("Text") if isinstance(st, dict) else None
            number = s.get("StateNumber")
        else:
            raise ValueError("a state is not an object")
        if not isinstance(text, str) or not text:
            raise ValueError("a state has no StateText.Text")
        texts.append(text)
        numbers.append(number if isinstance(number, int) else None)
    joined = "_".join(texts)
    hit = _BY_TEXT.get(joined)
    if hit is None:
        raise ValueError(f"unknown job order state {joined[:80]!r}")
    name, expected = hit
    for got, want, text in zip(numbers, expected, texts, strict=True):
        if got is not None and got != want:
            raise ValueError(f"state {text!r} has StateNumber {want}, not {got}")
    return name


def text_of(texts: list[LocalizedText] | None) -> str:
    """A LocalizedText list as one line (an Abort's comment becomes its reason):
    English first, else the first text."""
    if not texts:
        return ""
    pick = next((t for t in texts if t.Locale and t.Locale.lower().startswith("en")
                 and t.Text), None) or next((t for t in texts if t.Text), None)
    return " ".join((pick.Text or "").split()) if pick else ""


def comment(text: str) -> list[dict[str, str]]:
    """A reason as the LocalizedText list a Comment is."""
    return [{"Locale": "en", "Text": text}]


def parameters(order: JobOrderData, wm: WorkMasterRef | None) -> dict[str, Any]:
    """Job parameters for conditions (``job.param``): the chosen Work Master entry's
    ``Parameters`` as defaults, then the order's ``JobOrderParameters``."""
    out: dict[str, Any] = {}
    for plist in (wm.Parameters if wm is not None else None, order.JobOrderParameters):
        for p in plist or ():
            if p.ID:
                out[p.ID] = p.Value
    return out


# ---- job responses


class JobResponse(msgspec.Struct, **_OPTS):
    JobResponseID: str | None = None
    Description: LocalizedText | None = None
    JobOrderID: str | None = None
    StartTime: str | None = None
    EndTime: str | None = None
    JobState: list[State] | None = None
    JobResponseData: list[Parameter] | None = None
    PersonnelActuals: list[Resource] | None = None
    EquipmentActuals: list[Resource] | None = None
    PhysicalAssetActuals: list[Resource] | None = None
    MaterialActuals: list[Material] | None = None


def _actual(r: Resource) -> Resource:
    return Resource(ID=r.ID, Quantity=r.Quantity, EngineeringUnits=r.EngineeringUnits)


def with_actuals(response: bytes, order_json: bytes | str | None) -> bytes:
    """A stored job response as it is served: the host tracks no resources of its own,
    so the personnel, equipment, physical assets and material the order required are
    reported as its actuals (ids, quantities and units as ordered)."""
    if not order_json:
        return response
    try:
        order = msgspec.json.decode(order_json, type=JobOrderData)
        if not (order.PersonnelRequirements or order.EquipmentRequirements
                or order.PhysicalAssetRequirements or order.MaterialRequirements):
            return response
        resp = msgspec.json.decode(response, type=JobResponse)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return response
    if order.PersonnelRequirements and resp.PersonnelActuals is None:
        resp.PersonnelActuals = [_actual(r) for r in order.PersonnelRequirements]
    if order.EquipmentRequirements and resp.EquipmentActuals is None:
        resp.EquipmentActuals = [_actual(r) for r in order.EquipmentRequirements]
    if order.PhysicalAssetRequirements and resp.PhysicalAssetActuals is None:
        resp.PhysicalAssetActuals = [_actual(r) for r in order.PhysicalAssetRequirements]
    if order.MaterialRequirements and resp.MaterialActuals is None:
        resp.MaterialActuals = [
            Material(MaterialDefinitionID=m.MaterialDefinitionID,
                     MaterialLotID=m.MaterialLotID, MaterialUse=m.MaterialUse,
                     Quantity=m.Quantity, EngineeringUnits=m.EngineeringUnits)
            for m in order.MaterialRequirements]
    return msgspec.json.encode(resp)


_ALIASES.update(_aliases())


# OPC UA ISA-95 job control method return status: a bit map (bit 0 = no error); the
# names are those of the constants, as the docs' reply table shows them.
STATUS_BITS = {v.bit_length() - 1: name for name, v in (
    ("NO_ERROR", NO_ERROR), ("UNKNOWN_JOB_ORDER_ID", UNKNOWN_JOB_ORDER_ID),
    ("INVALID_JOB_ORDER_STATUS", INVALID_JOB_ORDER_STATUS),
    ("UNABLE_TO_ACCEPT_JOB_ORDER", UNABLE_TO_ACCEPT_JOB_ORDER),
    ("INVALID_REQUEST", INVALID_REQUEST))}


def status_names(status: int) -> list[str]:
    """The names of the bits set in a return status (``BIT_n`` for one not named)."""
    if status <= 0:
        return [f"INVALID_STATUS_{status}"]
    return [STATUS_BITS.get(b, f"BIT_{b}") for b in range(status.bit_length())
            if status >> b & 1]
