# cython: language_level=3
"""Canonical JSON: sorted keys, no whitespace, the form in which a recipe's Parameters
are stored and fingerprinted. ``flat_canonical`` writes the common case (a flat object
of plain scalars) in C and leaves everything else to ``canonical_dumps``."""

from libc.stdint cimport uint64_t
from libc.string cimport memcmp, memcpy, strlen
from cpython.object cimport PyObject
from cpython.unicode cimport PyUnicode_AsUTF8AndSize
from cpython.mem cimport PyMem_Free
from libc.math cimport isfinite

from sfc_fast._text cimport PyUnicode_DATA, PyUnicode_IS_ASCII, PyUnicode_New

from sfc_fast.conditions import canonical_dumps


def canonical_json(obj) -> bytes:
    """Sorted keys, no whitespace: how Parameters are stored and fingerprinted."""
    return canonical_dumps(obj).encode("utf-8")


cdef extern from "Python.h":
    char* PyOS_double_to_string(double val, char format_code, int precision, int flags,
                                int* ptype) except NULL
    int Py_DTSF_ADD_DOT_0
    long long PyLong_AsLongLongAndOverflow(object o, int* overflow) except? -1


cdef struct _Item:
    const char* key
    Py_ssize_t klen
    PyObject* value

cdef enum:
    FLAT_MAX_KEYS = 32
    FLAT_BUF = 4096

cdef char* _HEX = b"0123456789abcdef"

# A direct-mapped cache of float reprs (bit pattern -> text), FC_SIZE entries.
cdef enum:
    FC_SIZE = 64
    FC_TEXT = 32
cdef uint64_t _fc_bits[FC_SIZE]
cdef char _fc_text[FC_SIZE][FC_TEXT]
cdef Py_ssize_t _fc_len[FC_SIZE]


cdef Py_ssize_t _put_str(char* w, Py_ssize_t at, const char* s, Py_ssize_t n) noexcept:
    """Write s as a JSON string (json's encode_basestring for ASCII) at w[at];
    return the new end, or -1 when the buffer would overflow."""
    cdef Py_ssize_t k
    cdef unsigned char c
    if at + 2 + 6 * n > FLAT_BUF:
        return -1
    w[at] = b'"'
    at += 1
    for k in range(n):
        c = <unsigned char>s[k]
        if c >= 0x20 and c != b'"' and c != b'\\':
            w[at] = <char>c
            at += 1
        else:
            w[at] = b'\\'
            if c == b'"' or c == b'\\':
                w[at + 1] = <char>c
                at += 2
            elif c == b'\n':
                w[at + 1] = b'n'
                at += 2
            elif c == b'\r':
                w[at + 1] = b'r'
                at += 2
            elif c == b'\t':
                w[at + 1] = b't'
                at += 2
            elif c == 8:
                w[at + 1] = b'b'
                at += 2
            elif c == 12:
                w[at + 1] = b'f'
                at += 2
            else:
                w[at + 1] = b'u'
                w[at + 2] = b'0'
                w[at + 3] = b'0'
                w[at + 4] = _HEX[c >> 4]
                w[at + 5] = _HEX[c & 15]
                at += 6
    w[at] = b'"'
    return at + 1


cdef object flat_canonical(dict d):
    """canonical_dumps(d) for a flat object with ASCII text keys and str/int/float/bool/
    None values of the exact built-in types; None when anything else is in it (the
    caller then takes the general path, which also reports errors)."""
    cdef Py_ssize_t n = len(d), i, k, at, m, h
    cdef _Item items[FLAT_MAX_KEYS]
    cdef _Item tmp
    cdef char buf[FLAT_BUF + 8]    # a separator or the closing brace may land at FLAT_BUF
    cdef char* num
    cdef const char* u
    cdef long long iv
    cdef int overflow
    cdef double fv
    cdef uint64_t bits
    cdef object key, value
    if n > FLAT_MAX_KEYS:
        return None
    i = 0
    for key, value in d.items():
        if type(key) is not str or not PyUnicode_IS_ASCII(key):
            return None
        items[i].key = PyUnicode_AsUTF8AndSize(key, &items[i].klen)
        items[i].value = <PyObject*>value
        i += 1
    # insertion sort by code point (byte order for ASCII)
    for i in range(1, n):
        tmp = items[i]
        k = i
        while k > 0 and _key_less(tmp.key, tmp.klen, items[k - 1].key, items[k - 1].klen):
            items[k] = items[k - 1]
            k -= 1
        items[k] = tmp
    buf[0] = b'{'
    at = 1
    for i in range(n):
        if i:
            buf[at] = b','
            at += 1
        at = _put_str(buf, at, items[i].key, items[i].klen)
        if at < 0 or at + 40 > FLAT_BUF:
            return None
        buf[at] = b':'
        at += 1
        value = <object>items[i].value
        if value is None:
            memcpy(buf + at, b"null", 4)
            at += 4
        elif value is True:
            memcpy(buf + at, b"true", 4)
            at += 4
        elif value is False:
            memcpy(buf + at, b"false", 5)
            at += 5
        elif type(value) is int:
            iv = PyLong_AsLongLongAndOverflow(value, &overflow)
            if overflow:
                return None
            at += put_int(buf + at, iv)
        elif type(value) is float:
            fv = value
            if not isfinite(fv):
                return None
            # float repr (shortest round-trip digits) is the costly part; the
            # parameters of a recipe repeat a few values, so remember recent ones
            memcpy(&bits, &fv, 8)
            h = <Py_ssize_t>((bits * <uint64_t>0x9E3779B97F4A7C15) >> (64 - 6))
            if _fc_len[h] == 0 or _fc_bits[h] != bits:
                num = PyOS_double_to_string(fv, b'r', 0, Py_DTSF_ADD_DOT_0, NULL)
                m = strlen(num)
                if m >= FC_TEXT:
                    PyMem_Free(num)
                    return None
                memcpy(_fc_text[h], num, m)
                PyMem_Free(num)
                _fc_bits[h] = bits
                _fc_len[h] = m
            m = _fc_len[h]
            if at + m + 2 > FLAT_BUF:
                return None
            memcpy(buf + at, _fc_text[h], m)
            at += m
        elif type(value) is str:
            if not PyUnicode_IS_ASCII(value):
                return None
            u = PyUnicode_AsUTF8AndSize(value, &m)
            at = _put_str(buf, at, u, m)
            if at < 0:
                return None
        else:
            return None
    buf[at] = b'}'
    at += 1
    # all of it is ASCII (keys and text checked above, numbers and escapes are):
    # a new ASCII str filled in place, without a scan for its widest character
    out = PyUnicode_New(at, 127)
    memcpy(PyUnicode_DATA(out), buf, at)
    return out


cdef inline bint _key_less(const char* a, Py_ssize_t na, const char* b, Py_ssize_t nb) noexcept:
    cdef int c = memcmp(a, b, na if na < nb else nb)
    if c != 0:
        return c < 0
    return na < nb


cdef Py_ssize_t put_int(char* w, long long v) noexcept:
    cdef char tmp[24]
    cdef Py_ssize_t n = 0, k
    cdef unsigned long long u
    cdef bint neg = v < 0
    if neg:
        u = <unsigned long long>(-(v + 1)) + 1
    else:
        u = <unsigned long long>v
    while True:
        tmp[n] = <char>(48 + u % 10)
        n += 1
        u //= 10
        if u == 0:
            break
    k = 0
    if neg:
        w[0] = b'-'
        k = 1
    while n > 0:
        n -= 1
        w[k] = tmp[n]
        k += 1
    return k

