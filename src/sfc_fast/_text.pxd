# Text at the C level, shared by the modules: CPython's str internals they read, and
# the two views of UTF-8 every hot path needs. Inline, so each module compiles its own.

from libc.stdint cimport uint8_t, uint64_t
from libc.string cimport memcpy
from cpython.unicode cimport PyUnicode_AsUTF8AndSize

cdef extern from "Python.h":
    str PyUnicode_New(Py_ssize_t size, Py_UCS4 maxchar)
    void* PyUnicode_DATA(object o)
    int PyUnicode_KIND(object o)
    Py_UCS4 PyUnicode_READ(int kind, void* data, Py_ssize_t index) nogil
    Py_ssize_t PyUnicode_GET_LENGTH(object o)
    bint PyUnicode_IS_ASCII(object o)
    bint PyUnicode_IS_COMPACT_ASCII(object o)


cdef inline bint ascii_only(const char* p, Py_ssize_t n) noexcept:
    """No byte of ``p[:n]`` has its high bit set; eight bytes a step."""
    cdef uint64_t acc = 0, w
    cdef Py_ssize_t i = 0
    while i + 8 <= n:
        memcpy(&w, p + i, 8)
        acc |= w
        i += 8
    while i < n:
        acc |= <uint8_t>p[i]
        i += 1
    return (acc & <uint64_t>0x8080808080808080) == 0


cdef inline const char* utf8_view(str s, Py_ssize_t* n) except NULL:
    """The UTF-8 of ``s`` (borrowed from it): an ASCII str's own characters, else the
    UTF-8 copy CPython caches on it. Raises UnicodeEncodeError for a lone surrogate."""
    if PyUnicode_IS_COMPACT_ASCII(s):
        n[0] = PyUnicode_GET_LENGTH(s)
        return <const char*>PyUnicode_DATA(s)
    return PyUnicode_AsUTF8AndSize(s, n)
