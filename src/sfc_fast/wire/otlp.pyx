# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""OpenTelemetry spans as an OTLP ``ExportTraceServiceRequest`` in protobuf, no I/O.

The SDK's encoder builds a protobuf object per span, attribute and value: about 30 µs a
span, half of what a whole action costs the host. Here the message is written straight
into one buffer, fields in field-number order as a protobuf encoder writes them, for a
few µs a span.

The spans are read by attribute, as the SDK's ``ReadableSpan`` has them (``context``,
``parent``, ``name``, ``kind``, ``start_time``, ``end_time``, ``attributes``,
``events``, ``links``, ``status``, ``resource``, ``instrumentation_scope``); nothing
of OpenTelemetry is imported. Spans are grouped by resource and scope, in the order
they first come. A span's ``flags`` carry its W3C trace flags in the low byte and say
whether its parent is remote (bits 8 and 9), as OTLP 1.1 defines them.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.float cimport PyFloat_AS_DOUBLE
from cpython.long cimport (
    PyLong_AsLongLongAndOverflow,
    PyLong_AsUnsignedLongLong,
    PyLong_AsUnsignedLongLongMask,
)
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from libc.stdint cimport int64_t, uint32_t, uint64_t
from libc.string cimport memcpy, memmove

from collections.abc import Mapping

cdef extern from "Python.h":
    const char* PyUnicode_AsUTF8AndSize(object s, Py_ssize_t* size) except NULL

cdef enum:
    WT_VARINT = 0
    WT_I64 = 1
    WT_LEN = 2
    WT_I32 = 5
    RESERVE = 5             # room for a nested message's length (under 4 GiB)
    HAS_IS_REMOTE = 0x100
    IS_REMOTE = 0x200


cdef object _clean(object s):
    """``s`` as text UTF-8 can hold: a lone surrogate (which no UTF-8 encodes) becomes
    ``?``, so one bad attribute does not lose the batch."""
    return (<str>s).encode("utf-8", "replace").decode("utf-8")


cdef object _utf8(object s, const char** p, Py_ssize_t* n):
    """``s`` as UTF-8 (``p``, ``n``: valid while the returned str lives), cleaned first
    if it holds a lone surrogate."""
    try:
        p[0] = PyUnicode_AsUTF8AndSize(s, n)
    except UnicodeEncodeError:
        s = _clean(s)
        p[0] = PyUnicode_AsUTF8AndSize(s, n)
    return s


cdef class _Out:
    """A growing buffer the message is written into."""

    cdef char* p
    cdef Py_ssize_t n
    cdef Py_ssize_t cap

    def __cinit__(self, Py_ssize_t cap=4096):
        self.p = <char*>PyMem_Malloc(cap)
        if self.p == NULL:
            raise MemoryError()
        self.cap = cap
        self.n = 0

    def __dealloc__(self):
        PyMem_Free(self.p)

    cdef int need(self, Py_ssize_t k) except -1:
        cdef Py_ssize_t cap
        cdef char* grown
        if self.n + k <= self.cap:
            return 0
        cap = self.cap * 2
        if cap < self.n + k:
            cap = self.n + k
        grown = <char*>PyMem_Realloc(self.p, cap)
        if grown == NULL:
            raise MemoryError()
        self.p = grown
        self.cap = cap
        return 0

    cdef int varint(self, uint64_t v) except -1:
        self.need(10)
        while v >= 0x80:
            self.p[self.n] = <char>((v & 0x7F) | 0x80)
            self.n += 1
            v >>= 7
        self.p[self.n] = <char>v
        self.n += 1
        return 0

    cdef inline int tag(self, uint32_t field, uint32_t wire) except -1:
        return self.varint((field << 3) | wire)

    cdef int raw(self, const char* s, Py_ssize_t k) except -1:
        self.need(k)
        memcpy(self.p + self.n, s, k)
        self.n += k
        return 0

    cdef int blob(self, uint32_t field, const char* s, Py_ssize_t k) except -1:
        self.tag(field, WT_LEN)
        self.varint(<uint64_t>k)
        return self.raw(s, k)

    cdef int text(self, uint32_t field, object s, bint always=False) except -1:
        """A string field; an empty one is left out (proto3's default) unless
        ``always`` (a member of a oneof)."""
        cdef Py_ssize_t k
        cdef const char* b
        if s is None:
            if always:
                return self.blob(field, "", 0)
            return 0
        if type(s) is not str:
            s = str(s)
        s = _utf8(s, &b, &k)
        if k == 0 and not always:
            return 0
        return self.blob(field, b, k)

    cdef int fixed(self, uint32_t field, uint64_t v, int size) except -1:
        """A fixed64 (``size`` 8) or fixed32 (4) field: little-endian."""
        cdef int i
        self.tag(field, WT_I64 if size == 8 else WT_I32)
        self.need(size)
        for i in range(size):
            self.p[self.n + i] = <char>((v >> (8 * i)) & 0xFF)
        self.n += size
        return 0

    cdef Py_ssize_t begin(self, uint32_t field) except -1:
        """A nested message's field: its tag, and room for its length (``end``)."""
        cdef Py_ssize_t at
        self.tag(field, WT_LEN)
        self.need(RESERVE)
        at = self.n
        self.n += RESERVE
        return at

    cdef int end(self, Py_ssize_t at) except -1:
        """The nested message begun at ``at`` is written: its length goes before it."""
        cdef Py_ssize_t body = self.n - at - RESERVE
        cdef uint64_t v = <uint64_t>body
        cdef char head[10]
        cdef int k = 0
        while v >= 0x80:
            head[k] = <char>((v & 0x7F) | 0x80)
            k += 1
            v >>= 7
        head[k] = <char>v
        k += 1
        if k < RESERVE:
            memmove(self.p + at + k, self.p + at + RESERVE, body)
        memcpy(self.p + at, head, k)
        self.n = at + k + body
        return 0


cdef inline void _be64(char* p, uint64_t v) noexcept:
    cdef int i
    for i in range(8):
        p[i] = <char>((v >> (56 - 8 * i)) & 0xFF)


cdef int _id(_Out out, uint32_t field, object value, int size) except -1:
    """A trace (16 bytes) or span id (8) given as an int, big-endian."""
    out.tag(field, WT_LEN)
    out.varint(<uint64_t>size)
    out.need(size)
    if size == 16:
        _be64(out.p + out.n, PyLong_AsUnsignedLongLong(value >> 64))
        _be64(out.p + out.n + 8, PyLong_AsUnsignedLongLongMask(value))
    else:
        _be64(out.p + out.n, PyLong_AsUnsignedLongLong(value))
    out.n += size
    return 0


cdef inline Py_ssize_t _vlen(uint64_t v) noexcept:
    """The bytes ``v`` takes as a varint."""
    cdef Py_ssize_t n = 1
    while v >= 0x80:
        v >>= 7
        n += 1
    return n


cdef int _any_value(_Out out, object v) except -1:
    """An ``AnyValue``'s one field (bool before int: a bool is an int in Python)."""
    cdef int overflow = 0
    cdef long long i
    cdef Py_ssize_t at
    cdef double d
    if v is None:
        return 0                                # an array's missing member: empty
    t = type(v)
    if t is str:
        return out.text(1, v, True)
    if t is bool:
        out.tag(2, WT_VARINT)
        return out.varint(1 if v else 0)
    if t is int:
        i = PyLong_AsLongLongAndOverflow(v, &overflow)
        if overflow:
            return out.text(1, str(v), True)    # beyond int64: its digits
        out.tag(3, WT_VARINT)
        return out.varint(<uint64_t>i)
    if t is float:
        d = PyFloat_AS_DOUBLE(v)
        out.tag(4, WT_I64)
        out.need(8)
        memcpy(out.p + out.n, &d, 8)            # little-endian IEEE 754, as x86 and ARM
        out.n += 8
        return 0
    if t is bytes:
        return out.blob(7, PyBytes_AS_STRING(v), PyBytes_GET_SIZE(v))
    if isinstance(v, (list, tuple)):
        at = out.begin(5)
        for x in v:
            inner = out.begin(1)
            _any_value(out, x)
            out.end(inner)
        return out.end(at)
    if isinstance(v, Mapping):
        at = out.begin(6)
        _attributes(out, 1, v)
        return out.end(at)
    if isinstance(v, bool):
        return _any_value(out, bool(v))
    if isinstance(v, int):
        return _any_value(out, int(v))
    if isinstance(v, float):
        return _any_value(out, float(v))
    if isinstance(v, (bytes, bytearray, memoryview)):
        return _any_value(out, bytes(v))
    return out.text(1, str(v), True)


cdef int _kv_head(_Out out, uint32_t field, const char* k, Py_ssize_t klen,
                  Py_ssize_t any_len) except -1:
    """A ``KeyValue``'s tag, length, key and its value's tag and length, for a value
    of ``any_len`` bytes written next."""
    out.tag(field, WT_LEN)
    out.varint(<uint64_t>((1 + _vlen(klen) + klen if klen else 0) + 1 + _vlen(any_len)
                          + any_len))
    if klen:
        out.blob(1, k, klen)
    out.tag(2, WT_LEN)
    return out.varint(<uint64_t>any_len)


cdef int _kv(_Out out, uint32_t field, object key, object value) except -1:
    """One attribute as a ``KeyValue`` in ``field``. A text or whole-number value (the
    usual ones) is measured first and written in one pass."""
    cdef Py_ssize_t at, val, klen, vlen
    cdef const char* k
    cdef const char* v
    cdef long long i
    cdef int overflow
    if type(key) is not str:
        key = str(key)
    key = _utf8(key, &k, &klen)
    t = type(value)
    if t is str:
        value = _utf8(value, &v, &vlen)
        _kv_head(out, field, k, klen, 1 + _vlen(vlen) + vlen)
        return out.blob(1, v, vlen)
    if t is int:
        overflow = 0
        i = PyLong_AsLongLongAndOverflow(value, &overflow)
        if not overflow:
            _kv_head(out, field, k, klen, 1 + _vlen(<uint64_t>i))
            out.tag(3, WT_VARINT)
            return out.varint(<uint64_t>i)
    at = out.begin(field)
    if klen:
        out.blob(1, k, klen)
    val = out.begin(2)
    _any_value(out, value)
    out.end(val)
    return out.end(at)


cdef int _attributes(_Out out, uint32_t field, object attrs) except -1:
    """Each attribute of a mapping as a ``KeyValue`` in ``field``."""
    if not attrs:
        return 0
    for key, value in attrs.items():
        _kv(out, field, key, value)
    return 0


cdef int _count(_Out out, uint32_t field, object n) except -1:
    """A dropped-items count; none (0) is left out, as proto3 leaves out defaults."""
    if n:
        out.tag(field, WT_VARINT)
        out.varint(<uint64_t>n)
    return 0


# enum members' codes by id: an enum's ``value`` is a Python-level property, and a
# member lives as long as its class
cdef dict _codes = {}


cdef long _code(object member) except? -1:
    """``member.value`` of a span kind or status code, looked up once per member."""
    got = _codes.get(id(member))
    if got is None:
        got = _codes[id(member)] = (member, int(member.value))
    return got[1]


cdef object _state(object ctx):
    state = ctx.trace_state
    return state.to_header() if state else None


cdef int _head(_Out out, object trace_id, object span_id, object state, object parent_id,
               object name, uint64_t kind, uint64_t start, uint64_t end) except -1:
    """A span's fields 1 to 8: ids, state, parent, name, kind (OTLP's), times."""
    _id(out, 1, trace_id, 16)
    _id(out, 2, span_id, 8)
    out.text(3, state)
    if parent_id is not None:
        _id(out, 4, parent_id, 8)
    out.text(5, name)
    out.tag(6, WT_VARINT)
    out.varint(kind)
    out.fixed(7, start, 8)
    return out.fixed(8, end, 8)


cdef int _link(_Out out, object trace_id, object span_id, object state, object attrs,
               object dropped, uint32_t flags, bint remote) except -1:
    """A link (field 13) to the span ``trace_id``/``span_id``."""
    cdef Py_ssize_t e = out.begin(13)
    _id(out, 1, trace_id, 16)
    _id(out, 2, span_id, 8)
    out.text(3, state)
    _attributes(out, 4, attrs)
    _count(out, 5, dropped)
    out.fixed(6, (flags & 0xFF) | HAS_IS_REMOTE | (IS_REMOTE if remote else 0), 4)
    return out.end(e)


cdef int _status_and_flags(_Out out, uint64_t code, object message, uint32_t flags,
                           bint parent_remote) except -1:
    """A span's status (field 15, left out when unset and empty) and its flags (16):
    the W3C trace flags, and whether its parent is remote."""
    cdef Py_ssize_t e
    if code or message:
        e = out.begin(15)
        out.text(2, message)
        if code:
            out.tag(3, WT_VARINT)
            out.varint(code)
        out.end(e)
    return out.fixed(16, (flags & 0xFF) | HAS_IS_REMOTE
                     | (IS_REMOTE if parent_remote else 0), 4)


cdef int _span(_Out out, object s) except -1:
    cdef Py_ssize_t at = out.begin(2)
    ctx = s.context
    parent = s.parent
    # the SDK's kinds count from 0, OTLP's from 1
    _head(out, ctx.trace_id, ctx.span_id, _state(ctx),
          parent.span_id if parent is not None else None, s.name, _code(s.kind) + 1,
          <uint64_t>(s.start_time or 0), <uint64_t>(s.end_time or 0))
    _attributes(out, 9, s.attributes)
    _count(out, 10, getattr(s, "dropped_attributes", 0))
    for ev in s.events or ():
        e = out.begin(11)
        out.fixed(1, <uint64_t>(ev.timestamp or 0), 8)
        out.text(2, ev.name)
        _attributes(out, 3, ev.attributes)
        _count(out, 4, getattr(ev, "dropped_attributes", 0))
        out.end(e)
    _count(out, 12, getattr(s, "dropped_events", 0))
    for link in s.links or ():
        lc = link.context
        _link(out, lc.trace_id, lc.span_id, _state(lc), link.attributes,
              getattr(link, "dropped_attributes", 0), int(lc.trace_flags), lc.is_remote)
    _count(out, 14, getattr(s, "dropped_links", 0))
    status = s.status
    _status_and_flags(out, _code(status.status_code), status.description,
                      int(ctx.trace_flags), parent is not None and parent.is_remote)
    return out.end(at)


def span_entry(s) -> bytes:
    """One span (the SDK's ``ReadableSpan``, or alike) as it stands in a ``ScopeSpans``:
    for a batcher that encodes each span as it ends (``encode_entries``)."""
    cdef _Out out = _Out(512)
    _span(out, s)
    return PyBytes_FromStringAndSize(out.p, out.n)


def span_record(object trace_id, object span_id, object parent_id, bint parent_remote,
                uint32_t flags, object state, object name, uint32_t kind,
                uint64_t start, uint64_t end, tuple attributes, uint32_t status_code,
                object status_message, object link) -> bytes:
    """A span from its fields, as ``span_entry`` writes it, without a span object:
    the host's own spans. ``trace_id`` (128 bits) and ``span_id`` as ints, ``parent_id``
    an int or None; ``flags`` the W3C trace flags; ``state`` a ``tracestate`` header or
    None; ``kind`` OTLP's (1 internal … 5 consumer); ``attributes`` flat: key, value,
    key, value …; ``status_code`` OTLP's (0 unset, 1 ok, 2 error); ``link`` None or
    ``(trace_id, span_id, state, flags, remote)``."""
    cdef _Out out = _Out(512)
    cdef Py_ssize_t at = out.begin(2)
    cdef Py_ssize_t i = 0, n = len(attributes)
    _head(out, trace_id, span_id, state, parent_id, name, kind, start,
          end if end > start else start)
    while i + 1 < n:
        _kv(out, 9, attributes[i], attributes[i + 1])
        i += 2
    if link is not None:
        l_trace, l_span, l_state, l_flags, l_remote = link
        _link(out, l_trace, l_span, l_state, None, 0, l_flags, l_remote)
    _status_and_flags(out, status_code, status_message, flags,
                      parent_id is not None and parent_remote)
    out.end(at)
    return PyBytes_FromStringAndSize(out.p, out.n)


def encode_entries(groups) -> bytes:
    """An ``ExportTraceServiceRequest`` of spans already encoded (``span_entry``,
    ``span_record``): ``groups`` is ``[(resource, [(scope, [entry, …]), …]), …]``."""
    cdef _Out out = _Out(4096)
    _request(out, groups, True)
    return PyBytes_FromStringAndSize(out.p, out.n)


cdef int _request(_Out out, object groups, bint encoded) except -1:
    """``[(resource, [(scope, [span or entry, …]), …]), …]`` as the request's
    ``ResourceSpans``: spans written here, or entries (``encoded``) copied."""
    cdef Py_ssize_t rs, ss
    for res, scopes in groups:
        rs = out.begin(1)
        r = out.begin(1)
        _attributes(out, 1, res.attributes)
        out.end(r)
        for scope, items in scopes:
            ss = out.begin(2)
            _scope(out, scope)
            for item in items:
                if encoded:
                    out.raw(PyBytes_AS_STRING(item), PyBytes_GET_SIZE(item))
                else:
                    _span(out, item)
            if scope is not None:
                out.text(3, getattr(scope, "schema_url", None))
            out.end(ss)
        out.text(3, res.schema_url)
        out.end(rs)
    return 0


cdef int _scope(_Out out, object scope) except -1:
    cdef Py_ssize_t sc
    if scope is None:
        return 0
    sc = out.begin(1)
    out.text(1, scope.name)
    out.text(2, scope.version)
    _attributes(out, 3, getattr(scope, "attributes", None))
    return out.end(sc)


def encode_spans(spans) -> bytes:
    """An ``ExportTraceServiceRequest`` of ``spans`` (the SDK's ``ReadableSpan``)."""
    cdef _Out out = _Out(max(4096, 512 * len(spans)))
    groups = {}                 # id(resource) -> (resource, {scope key: (scope, [spans])})
    # the spans of one (resource, scope) pair of objects: most spans share one, and an
    # instrumentation scope's hash formats a string
    by_ids = {}
    for s in spans:
        res = s.resource
        scope = s.instrumentation_scope
        lst = by_ids.get((id(res), id(scope)))
        if lst is None:
            got = groups.get(id(res))
            if got is None:
                got = groups[id(res)] = (res, {})
            key = scope     # equal scopes (name, version, schema, attributes) share a group
            lst = got[1].get(key)
            if lst is None:
                lst = got[1][key] = (scope, [])
            by_ids[(id(res), id(scope))] = lst
        lst[1].append(s)
    _request(out, [(res, scopes.values()) for res, scopes in groups.values()], False)
    return PyBytes_FromStringAndSize(out.p, out.n)
