# The deadline index: (job, deadline_ms) pairs in an indexed 4-ary min-heap over C
# arrays. Cython callers (the Runner) cimport this and call the c_* methods directly:
# the class is final, so those are plain C calls, no Python dispatch.

cimport cython
from cpython.object cimport PyObject
from libc.stdint cimport int32_t, int64_t

from sfc_fast._vec cimport I32Vec


cdef struct HeapEntry:
    int64_t deadline
    int32_t slot


cdef struct Slot:
    PyObject* job               # owned reference; NULL = free slot
    int64_t seq                 # stamp of the set() that gave the deadline: breaks ties
    int32_t pos                 # heap position; -1 = free slot


@cython.final
cdef class DeadlineIndex:
    cdef HeapEntry* _heap       # [_n], ordered by (deadline, _seq[slot])
    cdef Py_ssize_t _n
    cdef Py_ssize_t _cap
    cdef Slot* _slots
    cdef Py_ssize_t _n_slots
    cdef Py_ssize_t _slot_cap
    cdef int64_t _stamp
    cdef I32Vec _free           # released slots, reused first
    cdef I32Vec _front          # pop_due scratch: frontier (heap positions)
    cdef I32Vec _out            # pop_due scratch: due positions, earliest first
    cdef dict _index            # job -> slot; may hold stale entries (see deadlines.pyx)

    cdef int _grow_heap(self) except -1
    cdef Py_ssize_t _find(self, str job) except -3
    cdef Py_ssize_t _check(self, Py_ssize_t slot, str job) except -3
    cdef int _rebuild_index(self) except -1
    cdef int32_t _new_slot(self) except -1
    cdef void _drop_jobs(self) noexcept
    cdef void _release(self, int32_t slot) noexcept
    cdef void _sift_up(self, Py_ssize_t i, HeapEntry e) noexcept
    cdef void _sift_down(self, Py_ssize_t i, HeapEntry e) noexcept
    cdef void _place(self, Py_ssize_t i, HeapEntry e) noexcept

    # Insert or move. Setting the deadline a job already has keeps its place.
    cdef int c_set(self, str job, int64_t deadline_ms) except -1
    # False when the job was not indexed.
    cdef bint c_remove(self, str job) except -1
    # Deadline of job into *deadline_ms; False when the job is not indexed.
    cdef bint c_get(self, str job, int64_t* deadline_ms) except -1
    # Everything due at now_ms, earliest first: a list of (job, deadline_ms) tuples.
    # limit < 0: no limit.
    cdef list c_pop_due(self, int64_t now_ms, Py_ssize_t limit)
    # Earliest deadline into *deadline_ms; False when empty.
    cdef bint c_next(self, int64_t* deadline_ms) noexcept
    cdef Py_ssize_t c_len(self) noexcept
