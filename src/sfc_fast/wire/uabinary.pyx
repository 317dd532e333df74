# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The OPC UA Binary encoding (IEC 62541-6 §5.2), no I/O: a ``Writer`` that appends
values to a growing buffer and a ``Reader`` that takes them back out of a bytes object,
with the built-in types as small immutable classes.

The host's OPC UA client builds and parses every service message with it, so each
value is read and written at the C level; only the values handed back are Python
objects. What a server sends is untrusted: every length is checked against the bytes
left before anything is allocated, nesting is bounded, and anything truncated or
invalid raises ``DecodeError`` with the byte it was found at. What the caller hands
the writer is checked too (ranges, types, every element of an array) and a bad value
raises ``EncodeError`` with the buffer left as it was before the call.

Two choices the spec leaves open: a DataValue's picoseconds follow their timestamp on
the wire (Source, SourcePico, Server, ServerPico; Table 26); and a null array in a
Variant reads as an empty list, since a Variant here has no null-array state.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.datetime cimport (
    PyDateTime_Check, PyDateTime_DATE_GET_HOUR, PyDateTime_DATE_GET_MICROSECOND,
    PyDateTime_DATE_GET_MINUTE, PyDateTime_DATE_GET_SECOND, PyDateTime_GET_DAY,
    PyDateTime_GET_MONTH, PyDateTime_GET_YEAR, datetime_new, datetime_tzinfo,
    import_datetime,
)
from cpython.float cimport PyFloat_AS_DOUBLE
from cpython.long cimport PyLong_AsLongLongAndOverflow, PyLong_AsUnsignedLongLong, PyLong_Check
from cpython.mem cimport PyMem_Free, PyMem_Realloc
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.math cimport isinf
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy
from posix.time cimport CLOCK_REALTIME, clock_gettime, timespec

from sfc_fast._text cimport utf8_view

import base64
import binascii
import uuid
from datetime import datetime as _datetime, timedelta as _timedelta, timezone as _timezone

from sfc_fast.errors import SfcError

import_datetime()

# Variant built-in type ids (Part 6, Table 1)
cdef enum:
    T_NULL = 0
    T_BOOLEAN = 1
    T_SBYTE = 2
    T_BYTE = 3
    T_INT16 = 4
    T_UINT16 = 5
    T_INT32 = 6
    T_UINT32 = 7
    T_INT64 = 8
    T_UINT64 = 9
    T_FLOAT = 10
    T_DOUBLE = 11
    T_STRING = 12
    T_DATETIME = 13
    T_GUID = 14
    T_BYTE_STRING = 15
    T_XML_ELEMENT = 16
    T_NODE_ID = 17
    T_EXPANDED_NODE_ID = 18
    T_STATUS_CODE = 19
    T_QUALIFIED_NAME = 20
    T_LOCALIZED_TEXT = 21
    T_EXTENSION_OBJECT = 22
    T_DATA_VALUE = 23
    T_VARIANT = 24
    T_DIAGNOSTIC_INFO = 25

# NodeId identifier kinds, numbered as their binary encoding byte
cdef enum:
    K_NUMERIC = 2
    K_STRING = 3
    K_GUID = 4
    K_OPAQUE = 5

# Variants and DataValues nest; neither side nests them deeper than this
cdef enum:
    MAX_DEPTH = 64

globals()["NULL"] = T_NULL      # NULL is a Cython keyword
BOOLEAN = T_BOOLEAN
SBYTE = T_SBYTE
BYTE = T_BYTE
INT16 = T_INT16
UINT16 = T_UINT16
INT32 = T_INT32
UINT32 = T_UINT32
INT64 = T_INT64
UINT64 = T_UINT64
FLOAT = T_FLOAT
DOUBLE = T_DOUBLE
STRING = T_STRING
DATETIME = T_DATETIME
GUID = T_GUID
BYTE_STRING = T_BYTE_STRING
XML_ELEMENT = T_XML_ELEMENT
NODE_ID = T_NODE_ID
EXPANDED_NODE_ID = T_EXPANDED_NODE_ID
STATUS_CODE = T_STATUS_CODE
QUALIFIED_NAME = T_QUALIFIED_NAME
LOCALIZED_TEXT = T_LOCALIZED_TEXT
EXTENSION_OBJECT = T_EXTENSION_OBJECT
DATA_VALUE = T_DATA_VALUE
VARIANT = T_VARIANT
DIAGNOSTIC_INFO = T_DIAGNOSTIC_INFO

cdef tuple _NAMES = (
    "Null", "Boolean", "SByte", "Byte", "Int16", "UInt16", "Int32", "UInt32", "Int64",
    "UInt64", "Float", "Double", "String", "DateTime", "Guid", "ByteString", "XmlElement",
    "NodeId", "ExpandedNodeId", "StatusCode", "QualifiedName", "LocalizedText",
    "ExtensionObject", "DataValue", "Variant", "DiagnosticInfo")
cdef tuple _CONSTS = (
    "NULL", "BOOLEAN", "SBYTE", "BYTE", "INT16", "UINT16", "INT32", "UINT32", "INT64",
    "UINT64", "FLOAT", "DOUBLE", "STRING", "DATETIME", "GUID", "BYTE_STRING", "XML_ELEMENT",
    "NODE_ID", "EXPANDED_NODE_ID", "STATUS_CODE", "QUALIFIED_NAME", "LOCALIZED_TEXT",
    "EXTENSION_OBJECT", "DATA_VALUE", "VARIANT", "DIAGNOSTIC_INFO")
TYPE_NAMES = {i: n for i, n in enumerate(_NAMES)}

# The fewest bytes one element of each type takes: an array length is checked against
# the bytes left with it, so a forged length fails before anything is allocated.
cdef Py_ssize_t _MIN_SIZE[26]
_MIN_SIZE[:] = [0, 1, 1, 1, 2, 2, 4, 4, 8, 8, 4, 8, 4, 8, 16, 4, 4, 2, 2, 4, 6, 1, 3, 1, 1, 1]


class EncodeError(SfcError, ValueError):
    """A value the OPC UA Binary encoding cannot carry: out of range or of the wrong type."""


class DecodeError(SfcError, ValueError):
    """Bytes that are no valid OPC UA Binary encoding; ``pos`` is where it was found."""

    def __init__(self, message, pos=-1):
        super().__init__(message)
        self.pos = pos


cdef object _UUID = uuid.UUID


# ---------------------------------------------------------------------------------
# Checked conversions of what a caller hands in (EncodeError names type and value)


cdef int _as_int(object v, long long lo, long long hi, str name, long long* out) except -1:
    cdef int overflow = 0
    cdef long long x
    if not PyLong_Check(v):
        raise EncodeError(f"{name} needs an int, not {type(v).__name__}: {v!r}")
    x = PyLong_AsLongLongAndOverflow(v, &overflow)
    if overflow or x < lo or x > hi:
        raise EncodeError(f"{name} out of range: {v!r}")
    out[0] = x
    return 0


cdef int _as_u64(object v, str name, unsigned long long* out) except -1:
    cdef int overflow = 0
    cdef long long x
    if not PyLong_Check(v):
        raise EncodeError(f"{name} needs an int, not {type(v).__name__}: {v!r}")
    x = PyLong_AsLongLongAndOverflow(v, &overflow)
    if overflow == 0 and x >= 0:
        out[0] = <unsigned long long>x
    elif overflow > 0:
        try:
            out[0] = PyLong_AsUnsignedLongLong(v)
        except OverflowError:
            raise EncodeError(f"{name} out of range: {v!r}") from None
    else:
        raise EncodeError(f"{name} out of range: {v!r}")
    return 0


cdef double _as_double(object v, str name) except? -1.0:
    if isinstance(v, float):
        return PyFloat_AS_DOUBLE(v)
    if PyLong_Check(v):
        try:
            return <double>v
        except OverflowError:
            raise EncodeError(f"{name} out of range: {v!r}") from None
    raise EncodeError(f"{name} needs a float, not {type(v).__name__}: {v!r}")


cdef inline str _type_of(object v):
    return type(v).__name__


# ---------------------------------------------------------------------------------
# DateTime: Int64 ticks of 100 ns since 1601-01-01 UTC


cdef inline int64_t _days_from_civil(int64_t y, int64_t m, int64_t d) noexcept:
    # days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant); y >= 0 here
    y -= m <= 2
    cdef int64_t era = y // 400
    cdef int64_t yoe = y - era * 400
    cdef int64_t doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    cdef int64_t doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


cdef inline void _civil_from_days(int64_t z, int* y, int* m, int* d) noexcept:
    # the inverse, for z >= days_from_civil(1601, 1, 1)
    z += 719468
    cdef int64_t era = z // 146097
    cdef int64_t doe = z - era * 146097
    cdef int64_t yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    cdef int64_t doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    cdef int64_t mp = (5 * doy + 2) // 153
    d[0] = <int>(doy - (153 * mp + 2) // 5 + 1)
    m[0] = <int>(mp + 3 if mp < 10 else mp - 9)
    y[0] = <int>(yoe + era * 400 + (m[0] <= 2))


cdef int64_t _DAYS_1601 = _days_from_civil(1601, 1, 1)
cdef int64_t _US_PER_DAY = 86_400_000_000
cdef int64_t _INT64_MAX = 0x7FFFFFFFFFFFFFFF
cdef object _UTC = _timezone.utc
cdef object _DT_MIN = _datetime(1601, 1, 1, tzinfo=_UTC)
cdef object _DT_MAX = _datetime.max.replace(tzinfo=_UTC)
# the last microsecond a datetime holds, counted from 1601
cdef int64_t _MAX_US = (_datetime.max - _datetime(1601, 1, 1)) // _timedelta(microseconds=1)
# 9999-12-31 23:59:59 UTC and later encode as Int64's maximum (Part 6, 5.2.2.5)
cdef int64_t _END_TICKS = 10 * ((_datetime(9999, 12, 31, 23, 59, 59) - _datetime(1601, 1, 1))
                                // _timedelta(microseconds=1))


cdef int64_t _ticks_of(object dt) except? -1:
    """``dt`` as ticks, clamped as the spec says; a naive datetime is taken as UTC."""
    cdef int64_t days = _days_from_civil(PyDateTime_GET_YEAR(dt), PyDateTime_GET_MONTH(dt),
                                         PyDateTime_GET_DAY(dt)) - _DAYS_1601
    cdef int64_t us = (days * 86400 + PyDateTime_DATE_GET_HOUR(dt) * 3600
                       + PyDateTime_DATE_GET_MINUTE(dt) * 60
                       + PyDateTime_DATE_GET_SECOND(dt)) * 1_000_000
    us += PyDateTime_DATE_GET_MICROSECOND(dt)
    tz = datetime_tzinfo(dt)
    if tz is not None and tz is not _UTC:
        off = dt.utcoffset()
        if off is not None:
            us -= (<int64_t>off.days * 86400 + <int64_t>off.seconds) * 1_000_000 + off.microseconds
    if us <= 0:
        return 0
    if us * 10 >= _END_TICKS:
        return _INT64_MAX
    return us * 10


cdef object _dt_of(int64_t ticks):
    if ticks <= 0:
        return _DT_MIN
    cdef int64_t us = ticks // 10
    if us > _MAX_US:
        return _DT_MAX
    cdef int64_t days = us // _US_PER_DAY
    cdef int64_t rem = us - days * _US_PER_DAY
    cdef int y, m, d
    _civil_from_days(days + _DAYS_1601, &y, &m, &d)
    return datetime_new(y, m, d, <int>(rem // 3_600_000_000), <int>(rem // 60_000_000 % 60),
                        <int>(rem // 1_000_000 % 60), <int>(rem % 1_000_000), _UTC)


def ticks_now():
    """Now, as DateTime ticks."""
    cdef timespec ts
    clock_gettime(CLOCK_REALTIME, &ts)
    return <int64_t>ts.tv_sec * 10_000_000 + ts.tv_nsec // 100 + 116_444_736_000_000_000


def ticks_from_datetime(dt):
    """``dt`` as DateTime ticks: a naive datetime is UTC; 1601-01-01 and before are 0,
    9999-12-31 23:59:59 and after Int64's maximum (Part 6, 5.2.2.5)."""
    if not PyDateTime_Check(dt):
        raise TypeError(f"needs a datetime, not {_type_of(dt)}: {dt!r}")
    return _ticks_of(dt)


def datetime_from_ticks(ticks):
    """DateTime ticks as an aware UTC datetime, clamped to 1601-01-01 and datetime.max."""
    if ticks <= 0:
        return _DT_MIN
    if ticks > _INT64_MAX:
        return _DT_MAX
    return _dt_of(ticks)


# ---------------------------------------------------------------------------------
# Values


cdef class NodeId:
    """A node's id: ``identifier`` an int (UInt32), str, bytes (opaque) or uuid.UUID in
    ``namespace``. ``NodeId.parse("ns=2;s=Filler1")`` and ``str()`` speak the text form."""

    cdef readonly object identifier
    cdef uint16_t ns
    cdef uint8_t kind
    cdef uint32_t num

    def __init__(self, identifier, namespace=0):
        cdef long long v
        _as_int(namespace, 0, 0xFFFF, "namespace index", &v)
        self.ns = <uint16_t>v
        if isinstance(identifier, bool):
            raise TypeError("a NodeId identifier is an int, str, bytes or UUID, not bool")
        if PyLong_Check(identifier):
            _as_int(identifier, 0, 0xFFFFFFFF, "numeric NodeId", &v)
            self.kind = K_NUMERIC
            self.num = <uint32_t>v
            identifier = int(identifier)
        elif isinstance(identifier, str):
            self.kind = K_STRING
        elif isinstance(identifier, bytes):
            self.kind = K_OPAQUE
        elif isinstance(identifier, _UUID):
            self.kind = K_GUID
        else:
            raise TypeError("a NodeId identifier is an int, str, bytes or UUID, "
                            f"not {_type_of(identifier)}: {identifier!r}")
        self.identifier = identifier

    @property
    def namespace(self):
        return self.ns

    @property
    def is_null(self):
        return self.ns == 0 and self.kind == K_NUMERIC and self.num == 0

    @staticmethod
    def parse(str text not None):
        """A NodeId from its text form: [ns=<index>;](i=<uint32>|s=<text>|g=<guid>|b=<base64>)."""
        cdef str rest = text
        cdef int ns = 0
        cdef Py_ssize_t semi
        if text.startswith("ns="):
            semi = text.find(";")
            if semi < 0:
                raise ValueError(f"NodeId {text!r}: no identifier after the namespace")
            part = text[3:semi]
            if not (part.isascii() and part.isdigit()) or int(part) > 0xFFFF:
                raise ValueError(f"NodeId {text!r}: namespace {part!r} is no UInt16")
            ns = int(part)
            rest = text[semi + 1:]
        if len(rest) < 2 or rest[1] != "=" or rest[0] not in "isgb":
            raise ValueError(f"NodeId {text!r}: expected i=, s=, g= or b= before the identifier")
        kind = rest[0]
        value = rest[2:]
        if kind == "i":
            if not (value.isascii() and value.isdigit()) or int(value) > 0xFFFFFFFF:
                raise ValueError(f"NodeId {text!r}: numeric identifier {value!r} is no UInt32")
            return _numeric(ns, int(value))
        if kind == "s":
            return _nid(ns, K_STRING, value, 0)
        if kind == "g":
            try:
                return _nid(ns, K_GUID, _UUID(value), 0)
            except ValueError:
                raise ValueError(f"NodeId {text!r}: {value!r} is no GUID") from None
        try:
            return _nid(ns, K_OPAQUE, base64.b64decode(value, validate=True), 0)
        except (binascii.Error, ValueError):
            raise ValueError(f"NodeId {text!r}: {value!r} is no base64") from None

    def __str__(self):
        head = f"ns={self.ns};" if self.ns else ""
        if self.kind == K_NUMERIC:
            return f"{head}i={self.num}"
        if self.kind == K_STRING:
            return f"{head}s={self.identifier}"
        if self.kind == K_GUID:
            return f"{head}g={self.identifier}"
        return f"{head}b={base64.b64encode(self.identifier).decode('ascii')}"

    def __repr__(self):
        if self.ns:
            return f"NodeId({self.identifier!r}, {self.ns})"
        return f"NodeId({self.identifier!r})"

    def __eq__(self, other):
        if not isinstance(other, NodeId):
            return NotImplemented
        cdef NodeId o = other
        if self.ns != o.ns or self.kind != o.kind:
            return False
        if self.kind == K_NUMERIC:
            return self.num == o.num
        return self.identifier == o.identifier

    def __hash__(self):
        return hash((self.ns, self.kind, self.identifier))


cdef inline NodeId _nid(uint16_t ns, uint8_t kind, object identifier, uint32_t num):
    cdef NodeId n = NodeId.__new__(NodeId)
    n.ns = ns
    n.kind = kind
    n.identifier = identifier
    n.num = num
    return n


# ns 0 ids below 256 (the two-byte form: most type and reference ids) are shared
cdef tuple _SMALL = tuple([_nid(0, K_NUMERIC, i, i) for i in range(256)])
cdef NodeId _NULL_NODE = _SMALL[0]


cdef inline NodeId _numeric(uint16_t ns, uint32_t num):
    if ns == 0 and num < 256:
        return <NodeId>_SMALL[num]
    return _nid(ns, K_NUMERIC, num, num)


cdef class ExpandedNodeId:
    """A NodeId that may name its namespace by URI and live on another server."""

    cdef readonly NodeId node
    cdef readonly object namespace_uri
    cdef uint32_t srv

    def __init__(self, NodeId node not None, namespace_uri=None, server_index=0):
        cdef long long v
        if namespace_uri is not None and not isinstance(namespace_uri, str):
            raise TypeError(f"namespace_uri is a str or None, not {_type_of(namespace_uri)}")
        _as_int(server_index, 0, 0xFFFFFFFF, "server index", &v)
        self.node = node
        self.namespace_uri = namespace_uri
        self.srv = <uint32_t>v

    @property
    def server_index(self):
        return self.srv

    def __repr__(self):
        return f"ExpandedNodeId({self.node!r}, {self.namespace_uri!r}, {self.srv})"

    def __eq__(self, other):
        if not isinstance(other, ExpandedNodeId):
            return NotImplemented
        cdef ExpandedNodeId o = other
        return self.srv == o.srv and self.namespace_uri == o.namespace_uri and self.node == o.node

    def __hash__(self):
        return hash((self.node, self.namespace_uri, self.srv))


cdef class QualifiedName:
    """A browse name: ``name`` in ``namespace``."""

    cdef readonly object name
    cdef uint16_t ns

    def __init__(self, name, namespace=0):
        cdef long long v
        if name is not None and not isinstance(name, str):
            raise TypeError(f"a QualifiedName's name is a str, not {_type_of(name)}")
        _as_int(namespace, 0, 0xFFFF, "namespace index", &v)
        self.name = name
        self.ns = <uint16_t>v

    @property
    def namespace(self):
        return self.ns

    def __repr__(self):
        return f"QualifiedName({self.name!r}, {self.ns})"

    def __eq__(self, other):
        if not isinstance(other, QualifiedName):
            return NotImplemented
        cdef QualifiedName o = other
        return self.ns == o.ns and self.name == o.name

    def __hash__(self):
        return hash((self.ns, self.name))


cdef class LocalizedText:
    """A text and its locale, either of them absent (None)."""

    cdef readonly object text
    cdef readonly object locale

    def __init__(self, text, locale=None):
        if text is not None and not isinstance(text, str):
            raise TypeError(f"a LocalizedText's text is a str or None, not {_type_of(text)}")
        if locale is not None and not isinstance(locale, str):
            raise TypeError(f"a LocalizedText's locale is a str or None, not {_type_of(locale)}")
        self.text = text
        self.locale = locale

    def __repr__(self):
        return f"LocalizedText({self.text!r}, {self.locale!r})"

    def __eq__(self, other):
        if not isinstance(other, LocalizedText):
            return NotImplemented
        cdef LocalizedText o = other
        return self.text == o.text and self.locale == o.locale

    def __hash__(self):
        return hash((self.text, self.locale))


cdef class ExtensionObject:
    """A structure as its encoding id and raw body: ``encoding`` 0 no body, 1 binary,
    2 XML. A body of None means no body (encoding 0)."""

    cdef readonly NodeId type_id
    cdef readonly object body
    cdef uint8_t enc

    def __init__(self, NodeId type_id not None, body, encoding=1):
        if body is None:
            encoding = 0
        elif not isinstance(body, bytes):
            raise TypeError(f"an ExtensionObject's body is bytes or None, not {_type_of(body)}")
        elif encoding == 0:
            raise ValueError("an ExtensionObject with encoding 0 has no body")
        if encoding not in (0, 1, 2):
            raise ValueError(f"an ExtensionObject's encoding is 0, 1 or 2, not {encoding!r}")
        self.type_id = type_id
        self.body = body
        self.enc = encoding

    @property
    def encoding(self):
        return self.enc

    def __repr__(self):
        return f"ExtensionObject({self.type_id!r}, {self.body!r}, {self.enc})"

    def __eq__(self, other):
        if not isinstance(other, ExtensionObject):
            return NotImplemented
        cdef ExtensionObject o = other
        return self.enc == o.enc and self.type_id == o.type_id and self.body == o.body

    def __hash__(self):
        return hash((self.type_id, self.body, self.enc))


cdef class Variant:
    """A value of built-in ``type`` (0..25): a scalar, or a list for an array (flat,
    ``dimensions`` giving a matrix's shape, higher rank first). Null is Variant(NULL, None)."""

    cdef uint8_t vtype
    cdef readonly object value
    cdef readonly object dimensions

    def __init__(self, type, value, dimensions=None):
        cdef long long t
        cdef long long total = 1
        cdef long long d
        _as_int(type, 0, 25, "Variant type", &t)
        if isinstance(value, (list, tuple)):
            value = list(value)     # a copy: a caller's later change cannot reach it
        if t == T_NULL and value is not None:
            raise ValueError(f"a Null Variant has no value: {value!r}")
        if dimensions is not None:
            if not isinstance(value, list):
                raise ValueError("a Variant with dimensions holds a list")
            dimensions = tuple(dimensions)
            for x in dimensions:
                _as_int(x, 0, 0x7FFFFFFF, "array dimension", &d)
                total *= d
                if total > 0x7FFFFFFF:
                    raise ValueError(f"dimensions {dimensions} are too large")
            if total != len(value):
                raise ValueError(f"dimensions {dimensions} do not hold {len(value)} values")
        self.vtype = <uint8_t>t
        self.value = value
        self.dimensions = dimensions

    @property
    def type(self):
        return self.vtype

    @property
    def is_array(self):
        return isinstance(self.value, list)

    def __repr__(self):
        if self.dimensions is not None:
            return f"Variant({_CONSTS[self.vtype]}, {self.value!r}, {self.dimensions!r})"
        return f"Variant({_CONSTS[self.vtype]}, {self.value!r})"

    def __eq__(self, other):
        if not isinstance(other, Variant):
            return NotImplemented
        cdef Variant o = other
        return (self.vtype == o.vtype and self.dimensions == o.dimensions
                and self.value == o.value)

    def __hash__(self):
        v = self.value
        return hash((self.vtype, tuple(v) if isinstance(v, list) else v, self.dimensions))


cdef inline Variant _variant(uint8_t t, object value, object dims):
    cdef Variant v = Variant.__new__(Variant)
    v.vtype = t
    v.value = value
    v.dimensions = dims
    return v


cdef class DataValue:
    """A value with its status and timestamps; the times are raw DateTime ticks (int)
    or None, the picoseconds 0 when absent. A Null Variant is kept as None."""

    cdef readonly object value
    cdef uint32_t st
    cdef int64_t src_t, srv_t
    cdef bint has_src, has_srv
    cdef uint16_t src_p, srv_p

    def __init__(self, value=None, status=0, source_time=None, server_time=None,
                 source_pico=0, server_pico=0):
        cdef long long v
        if value is not None:
            if not isinstance(value, Variant):
                raise TypeError(f"a DataValue's value is a Variant or None, not {_type_of(value)}")
            if (<Variant>value).vtype == T_NULL:
                value = None
        self.value = value
        _as_int(status, 0, 0xFFFFFFFF, "StatusCode", &v)
        self.st = <uint32_t>v
        if source_time is not None:
            _as_int(source_time, -_INT64_MAX - 1, _INT64_MAX, "DateTime", &v)
            self.src_t = v
            self.has_src = True
        if server_time is not None:
            _as_int(server_time, -_INT64_MAX - 1, _INT64_MAX, "DateTime", &v)
            self.srv_t = v
            self.has_srv = True
        _as_int(source_pico, 0, 0xFFFF, "picoseconds", &v)
        self.src_p = <uint16_t>v
        _as_int(server_pico, 0, 0xFFFF, "picoseconds", &v)
        self.srv_p = <uint16_t>v

    @property
    def status(self):
        return self.st

    @property
    def source_time(self):
        return self.src_t if self.has_src else None

    @property
    def server_time(self):
        return self.srv_t if self.has_srv else None

    @property
    def source_pico(self):
        return self.src_p

    @property
    def server_pico(self):
        return self.srv_p

    cdef tuple _key(self):
        return (self.value, self.st, self.source_time, self.server_time, self.src_p, self.srv_p)

    def __repr__(self):
        return (f"DataValue({self.value!r}, status=0x{self.st:08X}, "
                f"source_time={self.source_time!r}, server_time={self.server_time!r}, "
                f"source_pico={self.src_p}, server_pico={self.srv_p})")

    def __eq__(self, other):
        if not isinstance(other, DataValue):
            return NotImplemented
        return self._key() == (<DataValue>other)._key()

    def __hash__(self):
        return hash(self._key())


# ---------------------------------------------------------------------------------
# Writing


cdef inline void _le16(char* p, uint16_t v) noexcept:
    p[0] = <char>(v & 0xFF)
    p[1] = <char>(v >> 8)


cdef inline void _le32(char* p, uint32_t v) noexcept:
    p[0] = <char>(v & 0xFF)
    p[1] = <char>((v >> 8) & 0xFF)
    p[2] = <char>((v >> 16) & 0xFF)
    p[3] = <char>(v >> 24)


cdef inline void _le64(char* p, uint64_t v) noexcept:
    _le32(p, <uint32_t>(v & 0xFFFFFFFF))
    _le32(p + 4, <uint32_t>(v >> 32))


cdef class Writer:
    """Appends OPC UA Binary values to a growing buffer; ``getvalue()`` gives the bytes.
    A value that cannot be encoded raises ``EncodeError`` and leaves the buffer as it was."""

    cdef char* buf
    cdef Py_ssize_t n, cap

    def __cinit__(self):
        self.buf = NULL
        self.n = 0
        self.cap = 0

    def __dealloc__(self):
        PyMem_Free(self.buf)

    cdef char* _room(self, Py_ssize_t k) except NULL:
        """Room for ``k`` more bytes, already counted as written."""
        cdef Py_ssize_t need = self.n + k
        cdef Py_ssize_t cap
        cdef char* nb
        if need > self.cap:
            cap = self.cap * 2 if self.cap else 256
            while cap < need:
                cap *= 2
            nb = <char*>PyMem_Realloc(self.buf, cap)
            if nb == NULL:
                raise MemoryError()
            self.buf = nb
            self.cap = cap
        nb = self.buf + self.n
        self.n = need
        return nb

    cdef inline int _u8(self, uint8_t v) except -1:
        self._room(1)[0] = <char>v
        return 0

    cdef inline int _u16(self, uint16_t v) except -1:
        _le16(self._room(2), v)
        return 0

    cdef inline int _u32(self, uint32_t v) except -1:
        _le32(self._room(4), v)
        return 0

    cdef inline int _u64(self, uint64_t v) except -1:
        _le64(self._room(8), v)
        return 0

    cdef int _chunk(self, const char* p, Py_ssize_t k) except -1:
        # a length-prefixed String or ByteString body
        cdef char* q = self._room(4 + k)
        _le32(q, <uint32_t>k)
        memcpy(q + 4, p, k)
        return 0

    cdef int _str(self, object s, str name) except -1:
        cdef Py_ssize_t k
        cdef const char* p
        if s is None:
            return self._u32(0xFFFFFFFF)
        if not isinstance(s, str):
            raise EncodeError(f"{name} needs a str, not {_type_of(s)}: {s!r}")
        try:
            p = utf8_view(s, &k)
        except UnicodeEncodeError:
            raise EncodeError(f"{name} is not valid Unicode: {s!r}") from None
        if k > 0x7FFFFFFF:
            raise EncodeError(f"{name} is longer than an Int32 says: {k} bytes")
        return self._chunk(p, k)

    cdef int _bin(self, object b, str name) except -1:
        if b is None:
            return self._u32(0xFFFFFFFF)
        if isinstance(b, (bytearray, memoryview)):
            b = bytes(b)
        elif not isinstance(b, bytes):
            raise EncodeError(f"{name} needs bytes, not {_type_of(b)}: {b!r}")
        if PyBytes_GET_SIZE(b) > 0x7FFFFFFF:
            raise EncodeError(f"{name} is longer than an Int32 says: {PyBytes_GET_SIZE(b)} bytes")
        return self._chunk(PyBytes_AS_STRING(b), PyBytes_GET_SIZE(b))

    cdef int _guid(self, object g) except -1:
        if not isinstance(g, _UUID):
            raise EncodeError(f"Guid needs a uuid.UUID, not {_type_of(g)}: {g!r}")
        le = g.bytes_le         # Data1..3 little-endian, Data4 as is: the wire layout
        memcpy(self._room(16), PyBytes_AS_STRING(le), 16)
        return 0

    cdef int _nodeid(self, object obj, uint8_t flags) except -1:
        if not isinstance(obj, NodeId):
            raise EncodeError(f"NodeId needs a NodeId, not {_type_of(obj)}: {obj!r}")
        cdef NodeId n = <NodeId>obj
        cdef char* p
        if n.kind == K_NUMERIC:
            # the smallest form that holds it (Part 6, 5.2.2.9)
            if n.ns == 0 and n.num < 256:
                p = self._room(2)
                p[0] = <char>flags
                p[1] = <char>n.num
            elif n.ns < 256 and n.num < 65536:
                p = self._room(4)
                p[0] = <char>(flags | 1)
                p[1] = <char>n.ns
                _le16(p + 2, <uint16_t>n.num)
            else:
                p = self._room(7)
                p[0] = <char>(flags | 2)
                _le16(p + 1, n.ns)
                _le32(p + 3, n.num)
            return 0
        p = self._room(3)
        p[0] = <char>(flags | n.kind)
        _le16(p + 1, n.ns)
        if n.kind == K_STRING:
            return self._str(n.identifier, "NodeId")
        if n.kind == K_GUID:
            return self._guid(n.identifier)
        return self._bin(n.identifier, "NodeId")

    cdef int _expanded(self, object obj) except -1:
        cdef ExpandedNodeId x
        cdef uint8_t flags = 0
        if isinstance(obj, NodeId):
            return self._nodeid(obj, 0)
        if not isinstance(obj, ExpandedNodeId):
            raise EncodeError(f"ExpandedNodeId needs an ExpandedNodeId or NodeId, "
                              f"not {_type_of(obj)}: {obj!r}")
        x = <ExpandedNodeId>obj
        if x.namespace_uri is not None:
            flags |= 0x80
        if x.srv:
            flags |= 0x40
        self._nodeid(x.node, flags)
        if x.namespace_uri is not None:
            self._str(x.namespace_uri, "ExpandedNodeId")
        if x.srv:
            self._u32(x.srv)
        return 0

    cdef int _qname(self, object obj) except -1:
        if not isinstance(obj, QualifiedName):
            raise EncodeError(f"QualifiedName needs a QualifiedName, not {_type_of(obj)}: {obj!r}")
        self._u16((<QualifiedName>obj).ns)
        return self._str((<QualifiedName>obj).name, "QualifiedName")

    cdef int _ltext(self, object obj) except -1:
        if not isinstance(obj, LocalizedText):
            raise EncodeError(f"LocalizedText needs a LocalizedText, not {_type_of(obj)}: {obj!r}")
        cdef LocalizedText t = <LocalizedText>obj
        self._u8((t.locale is not None) | ((t.text is not None) << 1))
        if t.locale is not None:
            self._str(t.locale, "LocalizedText")
        if t.text is not None:
            self._str(t.text, "LocalizedText")
        return 0

    cdef int _extobj(self, object obj) except -1:
        cdef ExtensionObject e
        cdef char* p
        if obj is None:
            p = self._room(3)       # null type id, no body
            p[0] = p[1] = p[2] = 0
            return 0
        if not isinstance(obj, ExtensionObject):
            raise EncodeError(f"ExtensionObject needs an ExtensionObject or None, "
                              f"not {_type_of(obj)}: {obj!r}")
        e = <ExtensionObject>obj
        self._nodeid(e.type_id, 0)
        self._u8(e.enc)
        if e.enc:
            self._bin(e.body, "ExtensionObject")
        return 0

    cdef int _datavalue(self, object obj, int depth) except -1:
        if not isinstance(obj, DataValue):
            raise EncodeError(f"DataValue needs a DataValue, not {_type_of(obj)}: {obj!r}")
        cdef DataValue d = <DataValue>obj
        cdef uint8_t mask = 0
        if d.value is not None:
            mask |= 0x01
        if d.st:
            mask |= 0x02
        if d.has_src:
            mask |= 0x04
        if d.has_srv:
            mask |= 0x08
        if d.src_p:
            mask |= 0x10
        if d.srv_p:
            mask |= 0x20
        self._u8(mask)
        if d.value is not None:
            self._variant(d.value, depth + 1)
        if d.st:
            self._u32(d.st)
        if d.has_src:
            self._u64(<uint64_t>d.src_t)
        if d.src_p:
            self._u16(d.src_p)
        if d.has_srv:
            self._u64(<uint64_t>d.srv_t)
        if d.srv_p:
            self._u16(d.srv_p)
        return 0

    cdef int _variant(self, object obj, int depth) except -1:
        cdef Variant v
        cdef uint8_t t
        cdef list items
        cdef Py_ssize_t k
        cdef long long total = 1
        cdef long long d
        if obj is None:
            return self._u8(0)
        if not isinstance(obj, Variant):
            raise EncodeError(f"Variant needs a Variant or None, not {_type_of(obj)}: {obj!r}")
        if depth > MAX_DEPTH:
            raise EncodeError(f"Variants nested deeper than {MAX_DEPTH}")
        v = <Variant>obj
        t = v.vtype
        if t == T_NULL:
            return self._u8(0)
        if not isinstance(v.value, list):
            if t == T_VARIANT:
                raise EncodeError(f"a Variant holds a Variant only in an array: {v.value!r}")
            self._u8(t)
            return self._put(t, v.value, depth)
        items = <list>v.value
        k = len(items)
        if k > 0x7FFFFFFF:
            raise EncodeError(f"an array of {k} values is longer than an Int32 says")
        if v.dimensions is not None:
            for x in v.dimensions:
                _as_int(x, 0, 0x7FFFFFFF, "array dimension", &d)
                total *= d
                if total > 0x7FFFFFFF:
                    break
            if total != k:
                raise EncodeError(f"dimensions {v.dimensions} do not hold {k} values")
            self._u8(t | 0xC0)
        else:
            self._u8(t | 0x80)
        self._u32(<uint32_t>k)
        for x in items:
            self._put(t, x, depth)
        if v.dimensions is not None:
            self._u32(<uint32_t>len(v.dimensions))
            for x in v.dimensions:
                self._u32(<uint32_t>x)
        return 0

    cdef int _put(self, uint8_t t, object x, int depth) except -1:
        """One value of a Variant, scalar or array element, checked against type ``t``."""
        cdef long long iv
        cdef unsigned long long uv
        cdef double dv
        cdef float fv
        cdef uint32_t u32
        cdef uint64_t u64
        if t == T_BOOLEAN:
            if x is True:
                return self._u8(1)
            if x is False:
                return self._u8(0)
            raise EncodeError(f"Boolean needs a bool, not {_type_of(x)}: {x!r}")
        if t == T_SBYTE:
            _as_int(x, -128, 127, "SByte", &iv)
            return self._u8(<uint8_t>iv)
        if t == T_BYTE:
            _as_int(x, 0, 255, "Byte", &iv)
            return self._u8(<uint8_t>iv)
        if t == T_INT16:
            _as_int(x, -32768, 32767, "Int16", &iv)
            return self._u16(<uint16_t>iv)
        if t == T_UINT16:
            _as_int(x, 0, 65535, "UInt16", &iv)
            return self._u16(<uint16_t>iv)
        if t == T_INT32:
            _as_int(x, -2147483648, 2147483647, "Int32", &iv)
            return self._u32(<uint32_t>iv)
        if t == T_UINT32:
            _as_int(x, 0, 0xFFFFFFFF, "UInt32", &iv)
            return self._u32(<uint32_t>iv)
        if t == T_INT64:
            _as_int(x, -_INT64_MAX - 1, _INT64_MAX, "Int64", &iv)
            return self._u64(<uint64_t>iv)
        if t == T_UINT64:
            _as_u64(x, "UInt64", &uv)
            return self._u64(uv)
        if t == T_FLOAT:
            dv = _as_double(x, "Float")
            fv = <float>dv
            if isinf(fv) and not isinf(dv):
                raise EncodeError(f"Float out of range: {x!r}")
            memcpy(&u32, &fv, 4)
            return self._u32(u32)
        if t == T_DOUBLE:
            dv = _as_double(x, "Double")
            memcpy(&u64, &dv, 8)
            return self._u64(u64)
        if t == T_STRING:
            return self._str(x, "String")
        if t == T_DATETIME:
            if not PyDateTime_Check(x):
                raise EncodeError(f"DateTime needs a datetime, not {_type_of(x)}: {x!r}")
            return self._u64(<uint64_t>_ticks_of(x))
        if t == T_GUID:
            return self._guid(x)
        if t == T_BYTE_STRING:
            return self._bin(x, "ByteString")
        if t == T_XML_ELEMENT:
            return self._str(x, "XmlElement")
        if t == T_NODE_ID:
            return self._nodeid(x, 0)
        if t == T_EXPANDED_NODE_ID:
            return self._expanded(x)
        if t == T_STATUS_CODE:
            _as_int(x, 0, 0xFFFFFFFF, "StatusCode", &iv)
            return self._u32(<uint32_t>iv)
        if t == T_QUALIFIED_NAME:
            return self._qname(x)
        if t == T_LOCALIZED_TEXT:
            return self._ltext(x)
        if t == T_EXTENSION_OBJECT:
            return self._extobj(x)
        if t == T_DATA_VALUE:
            return self._datavalue(x, depth + 1)
        if t == T_VARIANT:
            return self._variant(x, depth + 1)
        if t == T_DIAGNOSTIC_INFO:
            if x is not None:
                raise EncodeError(f"DiagnosticInfo is written only as None (empty): {x!r}")
            return self._u8(0)
        raise EncodeError(f"no value of Variant type {t}")

    # -- the public methods; a composite one undoes a partial write when it fails

    def boolean(self, v):
        self._put(T_BOOLEAN, v, 0)

    def sbyte(self, v):
        self._put(T_SBYTE, v, 0)

    def byte(self, v):
        self._put(T_BYTE, v, 0)

    def int16(self, v):
        self._put(T_INT16, v, 0)

    def uint16(self, v):
        self._put(T_UINT16, v, 0)

    def int32(self, v):
        self._put(T_INT32, v, 0)

    def uint32(self, v):
        self._put(T_UINT32, v, 0)

    def int64(self, v):
        self._put(T_INT64, v, 0)

    def uint64(self, v):
        self._put(T_UINT64, v, 0)

    def float32(self, v):
        self._put(T_FLOAT, v, 0)

    def double(self, v):
        self._put(T_DOUBLE, v, 0)

    def string(self, v):
        self._str(v, "String")

    def bytestring(self, v):
        self._bin(v, "ByteString")

    def datetime(self, ticks):
        """A DateTime as raw ticks (Int64)."""
        cdef long long iv
        _as_int(ticks, -_INT64_MAX - 1, _INT64_MAX, "DateTime", &iv)
        self._u64(<uint64_t>iv)

    def guid(self, v):
        self._guid(v)

    def status(self, v):
        self._put(T_STATUS_CODE, v, 0)

    def length(self, v):
        """An array's Int32 length, -1 for a null array."""
        cdef long long iv
        _as_int(v, -1, 0x7FFFFFFF, "array length", &iv)
        self._u32(<uint32_t>iv)

    def raw(self, data):
        if not isinstance(data, bytes):
            data = bytes(data)
        memcpy(self._room(PyBytes_GET_SIZE(data)), PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data))

    cpdef nodeid(self, v):
        cdef Py_ssize_t start = self.n
        try:
            self._nodeid(v, 0)
        except BaseException:
            self.n = start
            raise

    cpdef expanded_nodeid(self, v):
        cdef Py_ssize_t start = self.n
        try:
            self._expanded(v)
        except BaseException:
            self.n = start
            raise

    cpdef qualified_name(self, v):
        cdef Py_ssize_t start = self.n
        try:
            self._qname(v)
        except BaseException:
            self.n = start
            raise

    cpdef localized_text(self, v):
        cdef Py_ssize_t start = self.n
        try:
            self._ltext(v)
        except BaseException:
            self.n = start
            raise

    cpdef extension_object(self, v):
        cdef Py_ssize_t start = self.n
        try:
            self._extobj(v)
        except BaseException:
            self.n = start
            raise

    cpdef variant(self, v):
        cdef Py_ssize_t start = self.n
        try:
            self._variant(v, 0)
        except BaseException:
            self.n = start
            raise

    cpdef data_value(self, v):
        cdef Py_ssize_t start = self.n
        try:
            self._datavalue(v, 0)
        except BaseException:
            self.n = start
            raise

    def getvalue(self):
        return PyBytes_FromStringAndSize(self.buf, self.n)

    def clear(self):
        """Empty the buffer (its memory is kept for the next message)."""
        self.n = 0

    def __len__(self):
        return self.n


# ---------------------------------------------------------------------------------
# Reading


cdef class Reader:
    """Reads OPC UA Binary values from ``data`` at ``pos``, which each read advances.
    Truncated or invalid bytes raise ``DecodeError`` (``pos`` is then where the value
    began or further on; the reader can be repositioned)."""

    cdef bytes data
    cdef const unsigned char* p
    cdef Py_ssize_t n, at
    cdef int depth

    def __init__(self, data, pos=0):
        if not isinstance(data, bytes):
            data = bytes(data)
        self.data = data
        self.p = <const unsigned char*>PyBytes_AS_STRING(data)
        self.n = PyBytes_GET_SIZE(data)
        self.depth = 0
        self.pos = pos

    @property
    def pos(self):
        return self.at

    @pos.setter
    def pos(self, Py_ssize_t value):
        if value < 0 or value > self.n:
            raise ValueError(f"position {value} is outside 0..{self.n}")
        self.at = value

    @property
    def remaining(self):
        return self.n - self.at

    cdef const unsigned char* _take(self, Py_ssize_t k) except NULL:
        cdef Py_ssize_t at = self.at
        if k > self.n - at:
            raise DecodeError(f"truncated at byte {at}: needs {k} bytes, {self.n - at} left", at)
        self.at = at + k
        return self.p + at

    cdef inline uint8_t _u8(self) except? 0xFF:
        return self._take(1)[0]

    cdef inline uint16_t _u16(self) except? 0xFFFF:
        cdef const unsigned char* q = self._take(2)
        return q[0] | (<uint16_t>q[1] << 8)

    cdef inline uint32_t _u32(self) except? 0xFFFFFFFF:
        cdef const unsigned char* q = self._take(4)
        return (q[0] | (<uint32_t>q[1] << 8) | (<uint32_t>q[2] << 16)
                | (<uint32_t>q[3] << 24))

    cdef inline uint64_t _u64(self) except? 0xFFFFFFFFFFFFFFFF:
        cdef const unsigned char* q = self._take(8)
        cdef uint64_t lo = q[0] | (<uint32_t>q[1] << 8) | (<uint32_t>q[2] << 16) | (<uint32_t>q[3] << 24)
        cdef uint64_t hi = q[4] | (<uint32_t>q[5] << 8) | (<uint32_t>q[6] << 16) | (<uint32_t>q[7] << 24)
        return lo | (hi << 32)

    cdef Py_ssize_t _len(self, Py_ssize_t unit) except -2:
        """An Int32 length of ``unit``-byte items, -1 for null, checked against the bytes left."""
        cdef Py_ssize_t at = self.at
        cdef int32_t k = <int32_t>self._u32()
        if k < -1:
            raise DecodeError(f"bad length {k} at byte {at}", at)
        if k > 0 and k * unit > self.n - self.at:
            raise DecodeError(f"length {k} at byte {at} runs past the end "
                              f"({self.n - self.at} bytes left)", at)
        return k

    cdef object _string(self):
        cdef Py_ssize_t at = self.at
        cdef Py_ssize_t k = self._len(1)
        if k < 0:
            return None
        cdef const unsigned char* q = self._take(k)
        try:
            return PyUnicode_DecodeUTF8(<const char*>q, k, NULL)
        except UnicodeDecodeError:
            raise DecodeError(f"String at byte {at} is not valid UTF-8", at) from None

    cdef object _bytes(self):
        cdef Py_ssize_t k = self._len(1)
        if k < 0:
            return None
        return PyBytes_FromStringAndSize(<const char*>self._take(k), k)

    cdef object _guid(self):
        return _UUID(bytes_le=PyBytes_FromStringAndSize(<const char*>self._take(16), 16))

    cdef NodeId _node_body(self, uint8_t form, Py_ssize_t at):
        cdef uint16_t ns
        cdef uint32_t num
        cdef object ident
        if form == 0:
            return <NodeId>_SMALL[self._u8()]
        if form == 1:
            ns = self._u8()
            return _numeric(ns, self._u16())
        if form == 2:
            ns = self._u16()
            return _numeric(ns, self._u32())
        if form > 5:
            raise DecodeError(f"bad NodeId encoding 0x{form:02X} at byte {at}", at)
        ns = self._u16()
        if form == 3:
            ident = self._string()
            return _nid(ns, K_STRING, "" if ident is None else ident, 0)
        if form == 4:
            return _nid(ns, K_GUID, self._guid(), 0)
        ident = self._bytes()
        return _nid(ns, K_OPAQUE, b"" if ident is None else ident, 0)

    cdef NodeId _nodeid(self):
        cdef Py_ssize_t at = self.at
        cdef uint8_t b = self._u8()
        if b & 0xC0:
            raise DecodeError(f"NodeId at byte {at} has ExpandedNodeId flags 0x{b:02X}", at)
        return self._node_body(b, at)

    cdef ExpandedNodeId _expanded(self):
        cdef Py_ssize_t at = self.at
        cdef uint8_t b = self._u8()
        cdef ExpandedNodeId x = ExpandedNodeId.__new__(ExpandedNodeId)
        x.node = self._node_body(b & 0x3F, at)
        if b & 0x80:
            x.namespace_uri = self._string()
        if b & 0x40:
            x.srv = self._u32()
        return x

    cdef QualifiedName _qname(self):
        cdef QualifiedName q = QualifiedName.__new__(QualifiedName)
        q.ns = self._u16()
        q.name = self._string()
        return q

    cdef LocalizedText _ltext(self):
        cdef uint8_t mask = self._u8()
        cdef LocalizedText t = LocalizedText.__new__(LocalizedText)
        if mask & 0x01:
            t.locale = self._string()
        if mask & 0x02:
            t.text = self._string()
        return t

    cdef object _extobj(self):
        cdef NodeId tid = self._nodeid()
        cdef Py_ssize_t at = self.at
        cdef uint8_t enc = self._u8()
        cdef ExtensionObject e
        if enc > 2:
            raise DecodeError(f"bad ExtensionObject encoding {enc} at byte {at}", at)
        if enc == 0 and tid.is_null:
            return None
        e = ExtensionObject.__new__(ExtensionObject)
        e.type_id = tid
        e.enc = enc
        if enc:
            body = self._bytes()
            e.body = b"" if body is None else body
        return e

    cdef DataValue _datavalue(self):
        cdef uint8_t mask = self._u8()
        cdef DataValue d = DataValue.__new__(DataValue)
        if mask & 0x01:
            d.value = self._variant()
        if mask & 0x02:
            d.st = self._u32()
        if mask & 0x04:
            d.src_t = <int64_t>self._u64()
            d.has_src = True
        if mask & 0x10:
            d.src_p = self._u16()
        if mask & 0x08:
            d.srv_t = <int64_t>self._u64()
            d.has_srv = True
        if mask & 0x20:
            d.srv_p = self._u16()
        return d

    cdef int _skip_diag(self) except -1:
        # iterative: a chain of inner infos cannot run the stack out
        cdef uint8_t mask
        cdef Py_ssize_t k
        while True:
            mask = self._u8()
            # SymbolicId, NamespaceUri, LocalizedText, Locale: an Int32 each
            self._take(4 * ((mask & 1) + (mask >> 1 & 1) + (mask >> 2 & 1) + (mask >> 3 & 1)))
            if mask & 0x10:
                k = self._len(1)
                if k > 0:
                    self._take(k)
            if mask & 0x20:
                self._take(4)
            if not mask & 0x40:
                return 0

    cdef object _elem(self, uint8_t t):
        cdef uint32_t u32
        cdef uint64_t u64
        cdef float fv
        cdef double dv
        if t == T_BOOLEAN:
            return self._u8() != 0
        if t == T_SBYTE:
            return <signed char>self._u8()
        if t == T_BYTE:
            return self._u8()
        if t == T_INT16:
            return <short>self._u16()
        if t == T_UINT16:
            return self._u16()
        if t == T_INT32:
            return <int32_t>self._u32()
        if t == T_UINT32 or t == T_STATUS_CODE:
            return self._u32()
        if t == T_INT64:
            return <int64_t>self._u64()
        if t == T_UINT64:
            return self._u64()
        if t == T_FLOAT:
            u32 = self._u32()
            memcpy(&fv, &u32, 4)
            return <double>fv
        if t == T_DOUBLE:
            u64 = self._u64()
            memcpy(&dv, &u64, 8)
            return dv
        if t == T_STRING or t == T_XML_ELEMENT:
            return self._string()
        if t == T_DATETIME:
            return _dt_of(<int64_t>self._u64())
        if t == T_GUID:
            return self._guid()
        if t == T_BYTE_STRING:
            return self._bytes()
        if t == T_NODE_ID:
            return self._nodeid()
        if t == T_EXPANDED_NODE_ID:
            return self._expanded()
        if t == T_QUALIFIED_NAME:
            return self._qname()
        if t == T_LOCALIZED_TEXT:
            return self._ltext()
        if t == T_EXTENSION_OBJECT:
            return self._extobj()
        if t == T_DATA_VALUE:
            return self._datavalue()
        if t == T_VARIANT:
            return self._variant()
        self._skip_diag()
        return None

    cdef object _variant(self):
        cdef Py_ssize_t at = self.at
        cdef uint8_t b = self._u8()
        cdef uint8_t t = b & 0x3F
        cdef Py_ssize_t k, i, nd
        cdef long long total = 1
        cdef int32_t d
        cdef list items
        cdef object dims = None
        if b == 0:
            return None
        if t == T_NULL or t > T_DIAGNOSTIC_INFO:
            raise DecodeError(f"bad Variant encoding 0x{b:02X} at byte {at}", at)
        if self.depth >= MAX_DEPTH:
            raise DecodeError(f"Variant at byte {at} nested deeper than {MAX_DEPTH}", at)
        self.depth += 1
        try:
            if not b & 0x80:
                if b & 0x40:
                    raise DecodeError(f"Variant at byte {at} has dimensions but no array", at)
                if t == T_VARIANT:
                    raise DecodeError(f"Variant at byte {at} holds a Variant outside an array", at)
                return _variant(t, self._elem(t), None)
            k = self._len(_MIN_SIZE[t])
            items = [self._elem(t) for i in range(k)] if k > 0 else []
            if b & 0x40:
                i = self.at
                nd = self._len(4)
                if nd > 0:
                    dims = tuple([<int32_t>self._u32() for _ in range(nd)])
                    for x in dims:
                        d = x
                        if d < 0:
                            raise DecodeError(f"negative array dimension {d} at byte {i}", i)
                        total *= d
                        if total > 0x7FFFFFFF:
                            break
                    if total != len(items):
                        raise DecodeError(f"dimensions {dims} at byte {i} do not hold "
                                          f"{len(items)} values", i)
            return _variant(t, items, dims)
        finally:
            self.depth -= 1

    # -- the public methods

    def boolean(self):
        return self._u8() != 0

    def sbyte(self):
        return <signed char>self._u8()

    def byte(self):
        return self._u8()

    def int16(self):
        return <short>self._u16()

    def uint16(self):
        return self._u16()

    def int32(self):
        return <int32_t>self._u32()

    def uint32(self):
        return self._u32()

    def int64(self):
        return <int64_t>self._u64()

    def uint64(self):
        return self._u64()

    def float32(self):
        return self._elem(T_FLOAT)

    def double(self):
        return self._elem(T_DOUBLE)

    def string(self):
        return self._string()

    def bytestring(self):
        return self._bytes()

    def datetime(self):
        """A DateTime as raw ticks (Int64)."""
        return <int64_t>self._u64()

    def guid(self):
        return self._guid()

    def status(self):
        return self._u32()

    def length(self):
        """An array's Int32 length (-1 null); a length over the bytes left is an error."""
        return self._len(1)

    def raw(self, Py_ssize_t k):
        if k < 0:
            raise ValueError(f"cannot read {k} bytes")
        return PyBytes_FromStringAndSize(<const char*>self._take(k), k)

    cpdef NodeId nodeid(self):
        return self._nodeid()

    cpdef ExpandedNodeId expanded_nodeid(self):
        return self._expanded()

    cpdef QualifiedName qualified_name(self):
        return self._qname()

    cpdef LocalizedText localized_text(self):
        return self._ltext()

    cpdef extension_object(self):
        return self._extobj()

    cpdef variant(self):
        return self._variant()

    cpdef DataValue data_value(self):
        return self._datavalue()

    cpdef diagnostic_info(self):
        """Skips a DiagnosticInfo (with its inner ones); None."""
        self._skip_diag()
        return None
