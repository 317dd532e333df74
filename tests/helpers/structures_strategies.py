"""JSON of every ISA-95 structure the OPC UA face encodes, for hypothesis."""

from __future__ import annotations

from typing import Any


def encode_strategies() -> dict[str, Any]:
    """JSON of every ISA-95 structure the face encodes, each field drawn or left out."""
    import datetime as dt

    from hypothesis import strategies as st

    text = st.text(max_size=6)
    ltext = st.fixed_dictionaries({}, optional={"Text": text,
                                                "Locale": st.sampled_from(["en", "de-DE"])})
    texts = st.lists(ltext, max_size=2)
    eu = st.fixed_dictionaries({}, optional={
        "NamespaceUri": text, "UnitId": st.integers(-2**31, 2**31 - 1),
        "DisplayName": ltext, "Description": ltext})
    scalar = st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | text
    value = st.recursive(scalar, lambda inner: st.lists(inner, max_size=3)
                         | st.dictionaries(text, inner, max_size=2), max_leaves=6)
    times = st.datetimes(min_value=dt.datetime(1500, 1, 1),
                         timezones=st.none() | st.just(dt.UTC)).map(
        lambda d: d.isoformat().replace("+00:00", "Z"))
    param = st.deferred(lambda: st.fixed_dictionaries({}, optional={
        "ID": text, "Value": value, "Description": texts, "EngineeringUnits": eu,
        "Subparameters": st.lists(param, max_size=2)}))
    prop = st.deferred(lambda: st.fixed_dictionaries({}, optional={
        "ID": text, "Value": value, "Description": texts, "EngineeringUnits": eu,
        "Subproperties": st.lists(prop, max_size=2)}))

    def resource(use: str) -> Any:
        return st.fixed_dictionaries({}, optional={
            "ID": text, "Description": texts, use: text, "Quantity": text,
            "EngineeringUnits": eu, "Properties": st.lists(prop, max_size=2)})
    material = st.fixed_dictionaries({}, optional={
        **{k: text for k in ("MaterialClassID", "MaterialDefinitionID", "MaterialLotID",
                             "MaterialSublotID", "MaterialUse", "Quantity")},
        "Description": texts, "EngineeringUnits": eu, "Properties": st.lists(prop, max_size=2)})
    lists = {"Personnel": resource("PersonnelUse"), "Equipment": resource("EquipmentUse"),
             "PhysicalAsset": resource("PhysicalAssetUse"), "Material": material}
    state = st.fixed_dictionaries({"StateText": ltext, "StateNumber": st.integers(0, 2**32 - 1)})
    order = st.fixed_dictionaries({"JobOrderID": text}, optional={
        "Description": texts, "StartTime": times, "EndTime": times,
        "Priority": st.integers(-2**15, 2**15 - 1),
        "WorkMasterID": st.lists(st.fixed_dictionaries({"ID": text}, optional={
            "Description": ltext, "Parameters": st.lists(param, max_size=2)}), max_size=2),
        "JobOrderParameters": st.lists(param, max_size=2),
        **{f"{k}Requirements": st.lists(s, max_size=2) for k, s in lists.items()}})
    response = st.fixed_dictionaries({"JobResponseID": text, "JobOrderID": text}, optional={
        "Description": ltext, "StartTime": times, "EndTime": times,
        "JobState": st.lists(state, max_size=2),
        "JobResponseData": st.lists(param, max_size=2),
        **{f"{k}Actuals": st.lists(s, max_size=2) for k, s in lists.items()}})
    return {"JobOrder": order, "JobResponse": response}


