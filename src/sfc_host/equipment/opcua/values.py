"""Values between a recipe (JSON) and OPC UA: a parameter converted to an argument's or
a variable's declared built-in type, and what the server returns made JSON again."""

from __future__ import annotations

import datetime
import math
from typing import Any

from asyncua import ua

_INTS = {ua.VariantType.SByte: (-(2**7), 2**7 - 1), ua.VariantType.Byte: (0, 2**8 - 1),
         ua.VariantType.Int16: (-(2**15), 2**15 - 1), ua.VariantType.UInt16: (0, 2**16 - 1),
         ua.VariantType.Int32: (-(2**31), 2**31 - 1), ua.VariantType.UInt32: (0, 2**32 - 1),
         ua.VariantType.Int64: (-(2**63), 2**63 - 1), ua.VariantType.UInt64: (0, 2**64 - 1)}
_FLOATS = (ua.VariantType.Float, ua.VariantType.Double)


def builtin(data_type: ua.NodeId) -> ua.VariantType | None:
    """The built-in type a DataType node id names (ns 0, 1..25), else None."""
    if data_type.NamespaceIndex == 0 and isinstance(data_type.Identifier, int) \
            and 1 <= data_type.Identifier <= 25:
        return ua.VariantType(data_type.Identifier)
    return None


def type_name(vt: ua.VariantType | None) -> str:
    return vt.name if vt is not None else "a structure"


def problem(value: Any, vt: ua.VariantType | None) -> str:
    """Why ``value`` cannot be that type ("" when it can)."""
    if vt is None:
        return "the server declares a type the host does not convert (not a built-in type)"
    if vt is ua.VariantType.Boolean:
        return "" if isinstance(value, bool) else "expected true or false"
    if vt in _INTS:
        lo, hi = _INTS[vt]
        if isinstance(value, bool) or not isinstance(value, int | float) or \
                (isinstance(value, float) and not value.is_integer()):
            return f"expected a whole number for {vt.name}"
        return "" if lo <= value <= hi else f"{value} is out of {vt.name}'s range"
    if vt in _FLOATS:
        ok = isinstance(value, int | float) and not isinstance(value, bool) \
            and math.isfinite(value)
        return "" if ok else f"expected a number for {vt.name}"
    if vt is ua.VariantType.String:
        return "" if isinstance(value, str) else "expected text"
    return f"the host does not convert to {vt.name}"


def to_variant(value: Any, vt: ua.VariantType | None) -> ua.Variant:
    """The value as a Variant of that type; ``ValueError`` with the reason."""
    why = problem(value, vt)
    if why:
        raise ValueError(why)
    assert vt is not None
    if vt in _INTS:
        value = int(value)
    elif vt in _FLOATS:
        value = float(value)
    return ua.Variant(value, vt)


def to_json(value: Any) -> Any:
    """What a server returned, as JSON a condition can read."""
    if isinstance(value, ua.Variant):
        value = value.Value
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, ua.LocalizedText):
        return value.Text
    if isinstance(value, datetime.datetime):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, list | tuple):
        return [to_json(v) for v in value]
    return str(value)
