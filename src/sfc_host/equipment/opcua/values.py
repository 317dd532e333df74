"""Values between a recipe (JSON) and OPC UA: a parameter converted to an argument's or
a variable's declared built-in type, and what the server returns made JSON again."""

from __future__ import annotations

import datetime
import math
from typing import Any

from sfc_fast.wire import uabinary as ub
from sfc_fast.wire.uabinary import ExtensionObject, LocalizedText, NodeId, QualifiedName, Variant

_INTS = {ub.SBYTE: (-(2**7), 2**7 - 1), ub.BYTE: (0, 2**8 - 1),
         ub.INT16: (-(2**15), 2**15 - 1), ub.UINT16: (0, 2**16 - 1),
         ub.INT32: (-(2**31), 2**31 - 1), ub.UINT32: (0, 2**32 - 1),
         ub.INT64: (-(2**63), 2**63 - 1), ub.UINT64: (0, 2**64 - 1)}
_FLOATS = (ub.FLOAT, ub.DOUBLE)


def builtin(data_type: NodeId) -> int | None:
    """The built-in type a DataType node id names (ns 0, 1..25), else None."""
    if data_type.namespace == 0 and isinstance(data_type.identifier, int) \
            and 1 <= data_type.identifier <= 25:
        return data_type.identifier
    return None


def type_name(vt: int | None) -> str:
    return ub.TYPE_NAMES[vt] if vt is not None else "a structure"


def problem(value: Any, vt: int | None) -> str:
    """Why ``value`` cannot be that type ("" when it can)."""
    if vt is None:
        return "the server declares a type the host does not convert (not a built-in type)"
    name = ub.TYPE_NAMES[vt]
    if vt == ub.BOOLEAN:
        return "" if isinstance(value, bool) else "expected true or false"
    if vt in _INTS:
        lo, hi = _INTS[vt]
        if isinstance(value, bool) or not isinstance(value, int | float) or \
                (isinstance(value, float) and not value.is_integer()):
            return f"expected a whole number for {name}"
        return "" if lo <= value <= hi else f"{value} is out of {name}'s range"
    if vt in _FLOATS:
        ok = isinstance(value, int | float) and not isinstance(value, bool) \
            and math.isfinite(value)
        return "" if ok else f"expected a number for {name}"
    if vt == ub.STRING:
        return "" if isinstance(value, str) else "expected text"
    return f"the host does not convert to {name}"


def to_variant(value: Any, vt: int | None) -> Variant:
    """The value as a Variant of that type; ``ValueError`` with the reason."""
    why = problem(value, vt)
    if why:
        raise ValueError(why)
    assert vt is not None
    if vt in _INTS:
        value = int(value)
    elif vt in _FLOATS:
        value = float(value)
    return Variant(vt, value)


def to_json(value: Any) -> Any:
    """What a server returned, as JSON a condition can read."""
    if isinstance(value, Variant):
        value = value.value
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, LocalizedText):
        return value.text
    if isinstance(value, QualifiedName):
        return value.name
    if isinstance(value, datetime.datetime):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, list | tuple):
        return [to_json(v) for v in value]
    if isinstance(value, ExtensionObject):
        return (value.body or b"").hex()
    return str(value)
