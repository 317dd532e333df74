# Growable C vectors used by the compilers: appending is a C call, not a Python one.

from libc.stdint cimport int32_t, int64_t
from libc.stdlib cimport realloc, free
from libc.string cimport memcpy


cdef struct I32Vec:
    int32_t* data
    Py_ssize_t size
    Py_ssize_t cap


cdef struct I64Vec:
    int64_t* data
    Py_ssize_t size
    Py_ssize_t cap


cdef inline int i32_push(I32Vec* v, int32_t x) except -1:
    cdef Py_ssize_t cap
    cdef int32_t* p
    if v.size == v.cap:
        cap = v.cap * 2 if v.cap else 16
        p = <int32_t*>realloc(v.data, cap * sizeof(int32_t))
        if p == NULL:
            raise MemoryError()
        v.data = p
        v.cap = cap
    v.data[v.size] = x
    v.size += 1
    return 0


cdef inline int i64_push(I64Vec* v, int64_t x) except -1:
    cdef Py_ssize_t cap
    cdef int64_t* p
    if v.size == v.cap:
        cap = v.cap * 2 if v.cap else 16
        p = <int64_t*>realloc(v.data, cap * sizeof(int64_t))
        if p == NULL:
            raise MemoryError()
        v.data = p
        v.cap = cap
    v.data[v.size] = x
    v.size += 1
    return 0


cdef inline void i32_free(I32Vec* v) noexcept:
    free(v.data)
    v.data = NULL
    v.size = 0
    v.cap = 0


cdef inline void i64_free(I64Vec* v) noexcept:
    free(v.data)
    v.data = NULL
    v.size = 0
    v.cap = 0
