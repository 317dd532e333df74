"""The OPC UA Binary codec against asyncua, an independent implementation: what our
Writer encodes asyncua decodes to the same value and what asyncua encodes our Reader
reads to the same value, for every built-in type as scalar and array; a NodeId takes
the smallest form asyncua takes; bad input raises DecodeError, bad values EncodeError.

asyncua writes a DataValue's ServerTimestamp before its SourcePicoseconds, against
Part 6 Table 26 (Source, SourcePico, Server, ServerPico), so the values exchanged with
it carry no picoseconds; the order is pinned by bytes in test_data_value_field_order.
"""

from __future__ import annotations

import math
import struct
import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from asyncua import ua
from asyncua.common.utils import Buffer
from asyncua.ua import ua_binary
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sfc_fast.wire import uabinary as u
from sfc_fast.wire.uabinary import (
    DataValue,
    DecodeError,
    EncodeError,
    ExpandedNodeId,
    ExtensionObject,
    LocalizedText,
    NodeId,
    QualifiedName,
    Reader,
    Variant,
    Writer,
)

FAST = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])

INT_RANGES = {
    u.SBYTE: (-(2 ** 7), 2 ** 7 - 1), u.BYTE: (0, 2 ** 8 - 1),
    u.INT16: (-(2 ** 15), 2 ** 15 - 1), u.UINT16: (0, 2 ** 16 - 1),
    u.INT32: (-(2 ** 31), 2 ** 31 - 1), u.UINT32: (0, 2 ** 32 - 1),
    u.INT64: (-(2 ** 63), 2 ** 63 - 1), u.UINT64: (0, 2 ** 64 - 1),
    u.STATUS_CODE: (0, 2 ** 32 - 1),
}
WRITE_INT = {u.SBYTE: "sbyte", u.BYTE: "byte", u.INT16: "int16", u.UINT16: "uint16",
             u.INT32: "int32", u.UINT32: "uint32", u.INT64: "int64", u.UINT64: "uint64",
             u.STATUS_CODE: "status"}
# asyncua's own upper clamp is 9999-12-31 23:59:59, ours datetime.max: stay below both
DT_MAX = datetime(9999, 12, 31, 23, 59, 58)
TICKS_MAX = (DT_MAX - datetime(1601, 1, 1)) // timedelta(microseconds=1) * 10


# ---------------------------------------------------------------------------------
# Strategies

namespaces = st.integers(0, 2 ** 16 - 1)
nodeids = st.one_of(
    st.builds(NodeId, st.one_of(st.integers(0, 300), st.integers(0, 70_000),
                                st.integers(0, 2 ** 32 - 1)),
              st.one_of(st.just(0), st.integers(0, 300), namespaces)),
    st.builds(NodeId, st.text(max_size=20), namespaces),
    st.builds(NodeId, st.uuids(), namespaces),
    st.builds(NodeId, st.binary(max_size=20), namespaces),
)
expanded = st.builds(ExpandedNodeId, nodeids, st.none() | st.text(min_size=1, max_size=20),
                     st.integers(0, 2 ** 32 - 1))
texts = st.none() | st.text(max_size=30)
# type ids asyncua does not know (it decodes known bodies into its own classes), not null
ext_type_ids = st.one_of(
    st.builds(NodeId, st.integers(1, 2 ** 32 - 1), st.integers(1, 2 ** 16 - 1)),
    st.builds(NodeId, st.text(max_size=10), st.integers(1, 9)))
ext_objects = st.one_of(
    st.none(),
    st.builds(ExtensionObject, ext_type_ids, st.binary(max_size=30)),
    st.builds(ExtensionObject, ext_type_ids, st.none()),
)
ticks = st.none() | st.integers(0, TICKS_MAX // 10).map(lambda t: t * 10)

SIMPLE = {
    u.BOOLEAN: st.booleans(),
    **{t: st.integers(lo, hi) for t, (lo, hi) in INT_RANGES.items()},
    u.FLOAT: st.floats(width=32, allow_nan=False),
    u.DOUBLE: st.floats(allow_nan=False),
    u.STRING: texts,
    u.DATETIME: st.datetimes(min_value=datetime(1601, 1, 1), max_value=DT_MAX,
                             timezones=st.just(UTC)),
    u.GUID: st.uuids(),
    u.BYTE_STRING: st.none() | st.binary(max_size=30),
    u.XML_ELEMENT: st.text(max_size=30),
    u.NODE_ID: nodeids,
    u.EXPANDED_NODE_ID: expanded,
    # asyncua takes a QualifiedName's namespace for an Int16 (it is a UInt16)
    u.QUALIFIED_NAME: st.builds(QualifiedName, st.text(max_size=20), st.integers(0, 2 ** 15 - 1)),
    u.LOCALIZED_TEXT: st.builds(LocalizedText, texts, texts),
    u.EXTENSION_OBJECT: ext_objects,
    u.DIAGNOSTIC_INFO: st.none(),
}


def _variants(types: dict[int, st.SearchStrategy[Any]]) -> st.SearchStrategy[Variant]:
    def one(t: int) -> st.SearchStrategy[Variant]:
        values = types[t]
        scalar = values.map(lambda v: Variant(t, v))
        array = st.lists(values, max_size=6).map(lambda vs: Variant(t, vs))
        matrix = st.lists(st.integers(1, 3), min_size=1, max_size=3).flatmap(
            lambda dims: st.lists(values, min_size=math.prod(dims), max_size=math.prod(dims))
            .map(lambda vs: Variant(t, vs, tuple(dims))))
        return st.one_of(array, matrix) if t == u.VARIANT else st.one_of(scalar, array, matrix)

    return st.sampled_from(sorted(types)).flatmap(one)


simple_variants = _variants(SIMPLE)
data_values = st.builds(DataValue, st.none() | simple_variants, st.integers(0, 2 ** 32 - 1),
                        ticks, ticks)
variants = _variants({**SIMPLE, u.DATA_VALUE: data_values,
                      u.VARIANT: st.none() | simple_variants})


# ---------------------------------------------------------------------------------
# Our values <-> asyncua's


def ua_node(n: NodeId) -> ua.NodeId:
    return ua.NodeId(n.identifier, n.namespace)


def our_node(n: ua.NodeId) -> NodeId:
    ident = n.Identifier
    return NodeId(str(ident) if isinstance(ident, str) else ident, n.NamespaceIndex)


def to_ua(t: int, v: Any) -> Any:
    if t == u.DIAGNOSTIC_INFO:
        return ua.DiagnosticInfo()
    if t == u.VARIANT and v is None:
        return ua.Variant()                         # a Null Variant: encoding byte 0
    if v is None:
        return None
    if t == u.XML_ELEMENT:
        return ua.XmlElement(v)
    if t == u.STATUS_CODE:
        return ua.StatusCode(v)
    if t == u.NODE_ID:
        return ua_node(v)
    if t == u.EXPANDED_NODE_ID:
        n = v.node
        return ua.ExpandedNodeId(n.identifier, n.namespace, NamespaceUri=v.namespace_uri,
                                 ServerIndex=v.server_index)
    if t == u.QUALIFIED_NAME:
        return ua.QualifiedName(v.name, v.namespace)
    if t == u.LOCALIZED_TEXT:
        return ua.LocalizedText(v.text, v.locale)
    if t == u.EXTENSION_OBJECT:
        return ua.ExtensionObject(TypeId=ua_node(v.type_id), Body=v.body)
    if t == u.DATA_VALUE:
        return ua.DataValue(
            Value=variant_to_ua(v.value) if v.value is not None else ua.Variant(),
            StatusCode=ua.StatusCode(v.status),
            SourceTimestamp=None if v.source_time is None else u.datetime_from_ticks(v.source_time),
            ServerTimestamp=None if v.server_time is None else u.datetime_from_ticks(v.server_time))
    if t == u.VARIANT:
        return variant_to_ua(v)
    return v


def variant_to_ua(v: Variant) -> ua.Variant:
    vt = ua.VariantType(v.type)
    if v.is_array:
        return ua.Variant([to_ua(v.type, x) for x in v.value], vt,
                          list(v.dimensions) if v.dimensions else None, is_array=True)
    return ua.Variant(to_ua(v.type, v.value), vt)


def _ticks(dt: datetime | None) -> int | None:
    return None if dt is None else ua.datetime_to_win_epoch(dt)


def from_ua(t: int, v: Any) -> Any:
    if t == u.DIAGNOSTIC_INFO:
        return None
    if v is None:
        return None
    if t == u.XML_ELEMENT:
        return v.Value
    if t == u.STATUS_CODE:
        return v.value
    if t == u.NODE_ID:
        return our_node(v)
    if t == u.EXPANDED_NODE_ID:
        uri = getattr(v, "NamespaceUri", None)
        return ExpandedNodeId(our_node(v), uri, getattr(v, "ServerIndex", None) or 0)
    if t == u.QUALIFIED_NAME:
        return QualifiedName(v.Name, v.NamespaceIndex)
    if t == u.LOCALIZED_TEXT:
        return LocalizedText(v.Text, v.Locale)
    if t == u.EXTENSION_OBJECT:
        if v.TypeId.is_null() and v.Body is None:
            return None
        return ExtensionObject(our_node(v.TypeId), v.Body)
    if t == u.DATA_VALUE:
        return DataValue(variant_from_ua(v.Value), v.StatusCode.value if v.StatusCode else 0,
                         _ticks(v.SourceTimestamp), _ticks(v.ServerTimestamp),
                         v.SourcePicoseconds or 0, v.ServerPicoseconds or 0)
    if t == u.VARIANT:
        return variant_from_ua(v)
    return v


def _flatten(v: Any) -> list[Any]:
    return [y for x in v for y in _flatten(x)] if isinstance(v, list) else [v]


def variant_from_ua(v: ua.Variant | None) -> Variant | None:
    if v is None or v.VariantType == ua.VariantType.Null:
        return None
    t = v.VariantType.value
    if v.is_array:
        flat = _flatten(v.Value) if v.Value is not None else []
        return Variant(t, [from_ua(t, x) for x in flat],
                       tuple(v.Dimensions) if v.Dimensions is not None else None)
    return Variant(t, from_ua(t, v.Value))


def encode(method: str, value: Any) -> bytes:
    w = Writer()
    getattr(w, method)(value)
    return w.getvalue()


def decode_all(method: str, data: bytes) -> Any:
    r = Reader(data)
    value = getattr(r, method)()
    assert r.remaining == 0
    return value


def _float_key(v: Any) -> Any:
    # -0.0 == 0.0 in Python; compare floats by their bits where it matters
    return struct.pack("<d", v) if isinstance(v, float) else v


# ---------------------------------------------------------------------------------
# Interoperability


@FAST
@given(variants)
def test_variants_interoperate_with_asyncua(v: Variant) -> None:
    ours = encode("variant", v)
    assert decode_all("variant", ours) == v
    theirs = ua_binary.variant_to_binary(variant_to_ua(v))
    assert decode_all("variant", theirs) == v
    buf = Buffer(ours)
    assert variant_from_ua(ua_binary.variant_from_binary(buf)) == v
    assert len(buf) == 0
    # asyncua always writes a DataValue's StatusCode; elsewhere the bytes agree too
    if v.type not in (u.DATA_VALUE, u.VARIANT):
        assert ours == theirs
    if v.type in (u.FLOAT, u.DOUBLE) and not v.is_array:
        assert _float_key(Reader(ours).variant().value) == _float_key(float(v.value))


@FAST
@given(data_values)
def test_data_values_interoperate_with_asyncua(dv: DataValue) -> None:
    ours = encode("data_value", dv)
    assert decode_all("data_value", ours) == dv
    buf = Buffer(ours)
    assert from_ua(u.DATA_VALUE, ua_binary.struct_from_binary(ua.DataValue, buf)) == dv
    assert len(buf) == 0
    theirs = ua_binary.struct_to_binary(to_ua(u.DATA_VALUE, dv))
    assert decode_all("data_value", theirs) == dv


@FAST
@given(nodeids)
def test_nodeid_takes_asyncuas_smallest_form(n: NodeId) -> None:
    ours = encode("nodeid", n)
    assert ours == ua_binary.nodeid_to_binary(ua_node(n))
    assert decode_all("nodeid", ours) == n
    assert our_node(ua_binary.nodeid_from_binary(Buffer(ours))) == n
    assert str(n) == ua_node(n).to_string()
    assert NodeId.parse(str(n)) == n
    assert hash(NodeId.parse(str(n))) == hash(n)


@FAST
@given(expanded)
def test_expanded_nodeid_interoperates(x: ExpandedNodeId) -> None:
    ours = encode("expanded_nodeid", x)
    assert ours == ua_binary.nodeid_to_binary(to_ua(u.EXPANDED_NODE_ID, x))
    assert decode_all("expanded_nodeid", ours) == x
    assert from_ua(u.EXPANDED_NODE_ID, ua_binary.nodeid_from_binary(Buffer(ours))) == x


@pytest.mark.parametrize("form", list(ua.NodeIdType))
def test_reads_every_nodeid_form(form: ua.NodeIdType) -> None:
    ident = {ua.NodeIdType.String: "Filler1", ua.NodeIdType.Guid: uuid.UUID(int=7),
             ua.NodeIdType.ByteString: b"\x00\xff"}.get(form, 200)
    ns = 0 if form == ua.NodeIdType.TwoByte else 3
    data = ua_binary.nodeid_to_binary(ua.NodeId(ident, ns, form))
    assert data[0] == form.value
    assert decode_all("nodeid", data) == NodeId(ident, ns)


@FAST
@given(st.sampled_from(sorted(SIMPLE)).flatmap(lambda t: st.tuples(st.just(t), SIMPLE[t])))
def test_scalar_methods_match_asyncua(case: tuple[int, Any]) -> None:
    t, v = case
    methods = {u.BOOLEAN: "boolean", **WRITE_INT, u.STRING: "string",
               u.BYTE_STRING: "bytestring", u.GUID: "guid", u.NODE_ID: "nodeid",
               u.EXPANDED_NODE_ID: "expanded_nodeid", u.QUALIFIED_NAME: "qualified_name",
               u.LOCALIZED_TEXT: "localized_text", u.EXTENSION_OBJECT: "extension_object",
               u.DOUBLE: "double", u.FLOAT: "float32"}
    if t not in methods:
        return
    ours = encode(methods[t], v)
    theirs = ua_binary.pack_uatype(ua.VariantType(t), to_ua(t, v))
    assert ours == theirs
    back = decode_all(methods[t], ours)
    assert back == v if t != u.FLOAT else back == struct.unpack("<f", struct.pack("<f", v))[0]


@FAST
@given(st.datetimes(min_value=datetime(1601, 1, 1), max_value=DT_MAX))
def test_datetime_ticks_match_asyncua(dt: datetime) -> None:
    aware = dt.replace(tzinfo=UTC)
    t = u.ticks_from_datetime(aware)
    assert t == ua.datetime_to_win_epoch(aware) == u.ticks_from_datetime(dt)
    assert u.datetime_from_ticks(t) == ua.win_epoch_to_datetime(t) == aware
    assert encode("datetime", t) == ua_binary.Primitives.DateTime.pack(aware)
    assert decode_all("datetime", encode("datetime", t)) == t


def test_datetime_clamps_and_zones() -> None:
    assert u.datetime_from_ticks(0) == u.datetime_from_ticks(-5) == datetime(1601, 1, 1, tzinfo=UTC)
    top = datetime.max.replace(tzinfo=UTC)
    assert u.datetime_from_ticks(2 ** 63 - 1) == u.datetime_from_ticks(2 ** 70) == top
    assert u.ticks_from_datetime(datetime(1500, 1, 1)) == 0
    assert u.ticks_from_datetime(datetime(9999, 12, 31, 23, 59, 59)) == 2 ** 63 - 1
    plus2 = datetime(2024, 1, 1, 14, 0, tzinfo=timezone(timedelta(hours=2)))
    assert u.ticks_from_datetime(plus2) == u.ticks_from_datetime(datetime(2024, 1, 1, 12, 0))
    assert u.datetime_from_ticks(u.ticks_from_datetime(plus2)) == plus2
    now = u.ticks_now()
    assert abs(u.datetime_from_ticks(now) - datetime.now(UTC)) < timedelta(seconds=5)
    with pytest.raises(TypeError):
        u.ticks_from_datetime(now)


# ---------------------------------------------------------------------------------
# Layout pinned by bytes


def test_data_value_field_order() -> None:
    dv = DataValue(Variant(u.BYTE, 7), 0x80000000, 1, 2, 3, 4)
    assert encode("data_value", dv) == (
        b"\x3f" + b"\x03\x07" + b"\x00\x00\x00\x80"
        + (1).to_bytes(8, "little") + b"\x03\x00" + (2).to_bytes(8, "little") + b"\x04\x00")
    assert decode_all("data_value", encode("data_value", dv)) == dv
    assert encode("data_value", DataValue()) == b"\x00"
    assert encode("data_value", DataValue(Variant(u.NULL, None))) == b"\x00"


def test_forms_and_nulls() -> None:
    assert encode("nodeid", NodeId(255)) == b"\x00\xff"
    assert encode("nodeid", NodeId(256)) == b"\x01\x00\x00\x01"
    assert encode("nodeid", NodeId(1, 255)) == b"\x01\xff\x01\x00"
    assert encode("nodeid", NodeId(1, 256)) == b"\x02\x00\x01\x01\x00\x00\x00"
    assert encode("nodeid", NodeId(65536, 1)) == b"\x02\x01\x00\x00\x00\x01\x00"
    assert encode("string", None) == encode("bytestring", None) == b"\xff\xff\xff\xff"
    assert encode("variant", None) == encode("variant", Variant(u.NULL, None)) == b"\x00"
    assert encode("extension_object", None) == b"\x00\x00\x00"
    assert decode_all("extension_object", b"\x00\x00\x00") is None
    assert encode("length", -1) == b"\xff\xff\xff\xff"
    x = ExpandedNodeId(NodeId(5), "urn:x", 2)
    assert encode("expanded_nodeid", x) == (
        b"\xc0\x05" + b"\x05\x00\x00\x00urn:x" + b"\x02\x00\x00\x00")
    assert encode("localized_text", LocalizedText("hi", "en")) == (
        b"\x03\x02\x00\x00\x00en\x02\x00\x00\x00hi")
    assert encode("localized_text", LocalizedText(None)) == b"\x00"
    xml = ExtensionObject(NodeId(9, 1), b"<a/>", 2)
    assert decode_all("extension_object", encode("extension_object", xml)) == xml
    w = Writer()
    w.uint32(1)
    w.raw(b"ab")
    assert len(w) == 6 and w.getvalue() == b"\x01\x00\x00\x00ab"
    w.clear()
    assert len(w) == 0 and w.getvalue() == b""


def test_diagnostic_info_is_skipped() -> None:
    string = b"\x03\x00\x00\x00abc"
    inner = b"\x30" + string + b"\x05\x00\x00\x80"           # AdditionalInfo, InnerStatusCode
    outer = b"\x7f" + b"\x01\x00\x00\x00" * 4 + string + b"\x00\x00\x00\x80" + b"\x40" + inner
    r = Reader(outer + b"\x2a")
    assert r.diagnostic_info() is None
    assert r.byte() == 0x2A
    assert decode_all("variant", b"\x99\x02\x00\x00\x00\x00" + outer) == Variant(
        u.DIAGNOSTIC_INFO, [None, None])
    for cut in range(len(outer)):
        with pytest.raises(DecodeError):
            Reader(outer[:cut]).diagnostic_info()


# ---------------------------------------------------------------------------------
# Bad input and bad values


@settings(max_examples=60, deadline=None)
@given(st.one_of(variants.map(lambda v: ("variant", v)),
                 data_values.map(lambda d: ("data_value", d)),
                 expanded.map(lambda x: ("expanded_nodeid", x))))
def test_every_cut_is_a_decode_error(case: tuple[str, Any]) -> None:
    method, value = case
    data = encode(method, value)
    for cut in range(len(data)):
        with pytest.raises(DecodeError) as err:
            getattr(Reader(data[:cut]), method)()
        assert 0 <= err.value.pos <= cut and "byte" in str(err.value)


@pytest.mark.parametrize("data", [
    b"\x06\x00",                                    # NodeId form 6
    b"\x1a",                                        # Variant type 26
    b"\x80\x05\x00\x00\x00",                        # an array of Null
    b"\x46\x01\x00\x00\x00",                        # dimensions without an array
    b"\x18\x00",                                    # a scalar Variant in a Variant
    b"\x86\xff\xff\xff\x7f" + b"\x00" * 8,          # a length over the bytes left
    b"\x86\x02\x00\x00\x00\x00\x00\x00\x00",        # shorter than its length says
    b"\x86\xfe\xff\xff\xff",                        # a length below -1
    b"\xc6\x02\x00\x00\x00" + b"\x00" * 8 + b"\x01\x00\x00\x00\x03\x00\x00\x00",  # dims
    b"\xc6\x00\x00\x00\x00\x01\x00\x00\x00\xff\xff\xff\xff",  # negative dimension
    b"\x0c\x02\x00\x00\x00\xc3\x28",                # invalid UTF-8
    b"\x11\x40\x05",                                # a NodeId with expanded flags
    b"\x16\x01\x00\x07\x03",                        # ExtensionObject encoding 3
    b"\x98\x01\x00\x00\x00" * 100 + b"\x00",        # nested past the bound
])
def test_invalid_input_is_a_decode_error(data: bytes) -> None:
    with pytest.raises(DecodeError):
        Reader(data).variant()


def test_reader_positions() -> None:
    r = Reader(b"\x01\x02\x03", 1)
    assert r.pos == 1 and r.remaining == 2 and r.raw(2) == b"\x02\x03"
    r.pos = 0
    assert r.byte() == 1
    with pytest.raises(ValueError):
        r.pos = 4
    with pytest.raises(DecodeError, match="byte 0"):
        Reader(b"\x05\x00\x00\x00ab").length()
    assert Reader(b"\xff\xff\xff\xff").length() == -1
    assert Reader(b"\x02").boolean() is True


@pytest.mark.parametrize("t", sorted(INT_RANGES))
def test_out_of_range_ints_are_encode_errors(t: int) -> None:
    lo, hi = INT_RANGES[t]
    for bad in (lo - 1, hi + 1, 2 ** 200, -(2 ** 200)):
        w = Writer()
        with pytest.raises(EncodeError, match=f"{u.TYPE_NAMES[t]} out of range: {bad}"):
            getattr(w, WRITE_INT[t])(bad)
        with pytest.raises(EncodeError, match=u.TYPE_NAMES[t]):
            w.variant(Variant(t, bad))
        with pytest.raises(EncodeError):
            w.variant(Variant(t, [lo, hi, bad]))
        assert len(w) == 0
    assert decode_all("variant", encode("variant", Variant(t, [lo, hi]))) == Variant(t, [lo, hi])


@pytest.mark.parametrize(("t", "bad"), [
    (u.BOOLEAN, 1), (u.INT32, 1.5), (u.INT32, "1"), (u.DOUBLE, "x"), (u.FLOAT, 1e39),
    (u.STRING, b"x"), (u.STRING, "\ud800"), (u.BYTE_STRING, "x"), (u.DATETIME, 5),
    (u.GUID, "x"), (u.NODE_ID, "i=1"), (u.EXPANDED_NODE_ID, 1), (u.QUALIFIED_NAME, "q"),
    (u.LOCALIZED_TEXT, "t"), (u.EXTENSION_OBJECT, b""), (u.DATA_VALUE, None),
    (u.DIAGNOSTIC_INFO, 1), (u.XML_ELEMENT, 1),
])
def test_wrong_value_types_are_encode_errors(t: int, bad: Any) -> None:
    w = Writer()
    w.byte(1)
    with pytest.raises(EncodeError):
        w.variant(Variant(t, bad))
    with pytest.raises(EncodeError):
        w.variant(Variant(t, [bad] * 3))
    assert w.getvalue() == b"\x01"              # left as it was
    with pytest.raises(EncodeError):
        w.variant(Variant(u.VARIANT, Variant(u.INT32, 1)))
    with pytest.raises(EncodeError):
        w.nodeid(NodeId("\ud800"))
    assert w.getvalue() == b"\x01"


def test_deep_nesting_is_refused() -> None:
    v = Variant(u.INT32, [1])
    for _ in range(100):
        v = Variant(u.VARIANT, [v])
    with pytest.raises(EncodeError, match="nested"):
        encode("variant", v)
    items = [1]
    v = Variant(u.INT32, items)
    items.append(2)                                 # the Variant keeps its own copy
    assert v.value == [1]


# ---------------------------------------------------------------------------------
# Values


def test_parse_and_str() -> None:
    assert NodeId.parse("i=85") == NodeId(85)
    assert NodeId.parse("ns=2;s=Filler1") == NodeId("Filler1", 2)
    assert NodeId.parse("ns=2;s=a;b=c") == NodeId("a;b=c", 2)
    g = uuid.UUID("72962b91-fa75-4ae6-8d28-b404dc7daf63")
    assert NodeId.parse(f"ns=1;g={g}") == NodeId(g, 1)
    assert NodeId.parse("ns=1;b=AAEC") == NodeId(b"\x00\x01\x02", 1)
    assert str(NodeId(85)) == "i=85" and str(NodeId(b"\x00\x01\x02", 1)) == "ns=1;b=AAEC"
    for bad, why in [("", "expected"), ("x=1", "expected"), ("ns=1", "no identifier"),
                     ("ns=a;i=1", "namespace"), ("ns=70000;i=1", "namespace"),
                     ("i=-1", "UInt32"), ("i=4294967296", "UInt32"), ("i=", "UInt32"),
                     ("g=nope", "GUID"), ("b=@@", "base64")]:
        with pytest.raises(ValueError, match=why):
            NodeId.parse(bad)


def test_value_classes() -> None:
    assert NodeId(1) == NodeId(1) and NodeId(1) != NodeId("1") and NodeId(1) != NodeId(1, 1)
    assert len({NodeId(1), NodeId(1), NodeId(2)}) == 2
    assert NodeId(0).is_null and not NodeId(0, 1).is_null and not NodeId("").is_null
    assert repr(NodeId("x", 2)) == "NodeId('x', 2)"
    with pytest.raises(AttributeError):
        NodeId(1).identifier = 2  # type: ignore[misc]
    with pytest.raises(ValueError):
        NodeId(-1)
    with pytest.raises(ValueError):
        NodeId(1, 65536)
    with pytest.raises(TypeError):
        NodeId(1.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        NodeId(True)
    assert hash(QualifiedName("a", 1)) == hash(QualifiedName("a", 1))
    assert LocalizedText("a") != LocalizedText("a", "en")
    assert ExtensionObject(NodeId(1), None).encoding == 0
    with pytest.raises(ValueError):
        ExtensionObject(NodeId(1), b"x", 0)
    assert Variant(u.INT32, (1, 2)) == Variant(u.INT32, [1, 2])
    assert hash(Variant(u.INT32, [1, 2])) == hash(Variant(u.INT32, (1, 2)))
    assert repr(Variant(u.INT32, 5)) == "Variant(INT32, 5)"
    with pytest.raises(ValueError):
        Variant(u.INT32, [1, 2, 3], (2, 2))
    with pytest.raises(ValueError):
        Variant(26, 1)
    assert DataValue(Variant(u.NULL, None)) == DataValue()
    assert DataValue(source_time=5).source_time == 5 and DataValue().server_time is None
    with pytest.raises(EncodeError):
        DataValue(status=-1)
    assert u.TYPE_NAMES[u.BOOLEAN] == "Boolean" and u.DIAGNOSTIC_INFO == 25 and u.NULL == 0
    assert issubclass(EncodeError, ValueError) and issubclass(DecodeError, ValueError)


READS = ["variant", "data_value", "expanded_nodeid", "extension_object", "localized_text",
         "qualified_name", "diagnostic_info", "string", "guid", "length"]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=60), st.sampled_from(READS))
def test_random_bytes_read_or_raise_decode_error(data: bytes, method: str) -> None:
    r = Reader(data)
    try:
        getattr(r, method)()
    except DecodeError as err:
        assert 0 <= err.pos <= len(data)
    else:
        assert 0 <= r.pos <= len(data)
