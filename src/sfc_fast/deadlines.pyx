# cython: language_level=3
"""Deadline index: (job, deadline_ms) with O(log n) update and bulk pop of what is due.

An indexed 4-ary min-heap of 16-byte entries (int64 deadline, int32 slot) over one C
array. A job owns a slot while it is indexed; one C array of slots holds its job, heap
position and the stamp of the set() that gave it its deadline (ties on the deadline go
to the earlier stamp, so the order is deterministic). One record, not parallel arrays:
on a large index every array touched at random is a cache miss. The only Python
container is a dict job -> slot at the edge.

Popping does not touch the dict: on a large index a dict delete is two cache misses,
most of the cost of a pop. The popped job's dict entry goes stale instead (its slot is
free or belongs to another job, which every lookup checks); setting the job again
revives it, remove() deletes it, and when stale entries outnumber live ones the dict
is rebuilt, so the cost per pop stays O(1) amortised and memory stays bounded.

Bulk pop (``pop_due``) walks the due part of the heap in order with a small frontier
heap, then removes all of it at once: the tail of the array fills the holes and only
the holes are sifted, children first. That is one Floyd pass restricted to the popped
region instead of one root-to-leaf sift per popped entry.
"""

cimport cython
from cpython.dict cimport PyDict_GetItem, PyDict_SetItem, PyDict_Size
from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.number cimport PyNumber_Index
from cpython.long cimport PyLong_FromLongLong
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF, Py_XDECREF
from cpython.tuple cimport PyTuple_New, PyTuple_SET_ITEM
from libc.stdint cimport INT32_MAX, int32_t, int64_t
from libc.stdlib cimport free, realloc

from sfc_fast._vec cimport I32Vec, i32_free, i32_push


cdef extern from "Python.h":
    void PyObject_GC_UnTrack(object op)


# Stale dict entries tolerated beyond the number of live ones before a rebuild.
cdef enum:
    STALE_SLACK = 4096


cdef inline bint _before(const HeapEntry* a, const HeapEntry* b,
                         const Slot* sl) noexcept nogil:
    return a.deadline < b.deadline or (a.deadline == b.deadline
                                       and sl[a.slot].seq < sl[b.slot].seq)


cdef inline int64_t _ms(object t) except? -1:
    # Whole milliseconds only: a float would be truncated silently by the C conversion.
    return PyNumber_Index(t)


# The frontier of pop_due: a binary heap of heap positions, ordered by their entries.

@cython.boundscheck(False)
@cython.wraparound(False)
cdef inline int _front_push(I32Vec* f, int32_t p, const HeapEntry* h,
                            const Slot* sl) except -1:
    i32_push(f, p)
    cdef int32_t* d = f.data
    cdef Py_ssize_t i = f.size - 1
    cdef Py_ssize_t q
    while i > 0:
        q = (i - 1) >> 1
        if not _before(&h[p], &h[d[q]], sl):
            break
        d[i] = d[q]
        i = q
    d[i] = p
    return 0


@cython.boundscheck(False)
@cython.wraparound(False)
cdef inline int32_t _front_pop(I32Vec* f, const HeapEntry* h, const Slot* sl) noexcept:
    cdef int32_t* d = f.data
    cdef int32_t top = d[0]
    f.size -= 1
    cdef Py_ssize_t n = f.size
    if n == 0:
        return top
    cdef int32_t x = d[n]
    cdef Py_ssize_t i = 0
    cdef Py_ssize_t c
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and _before(&h[d[c + 1]], &h[d[c]], sl):
            c += 1
        if not _before(&h[d[c]], &h[x], sl):
            break
        d[i] = d[c]
        i = c
    d[i] = x
    return top


@cython.final
@cython.boundscheck(False)
@cython.wraparound(False)
cdef class DeadlineIndex:
    """In-process index of (job, deadline_ms); earliest deadline first."""

    def __cinit__(self):
        self._index = {}

    def __dealloc__(self):
        self._drop_jobs()
        free(self._heap)
        free(self._slots)
        i32_free(&self._free)
        i32_free(&self._front)
        i32_free(&self._out)

    # -- storage -------------------------------------------------------------------

    cdef int _grow_heap(self) except -1:
        cdef Py_ssize_t cap = self._cap * 2 if self._cap else 64
        cdef HeapEntry* h = <HeapEntry*>realloc(self._heap, cap * sizeof(HeapEntry))
        if h == NULL:
            raise MemoryError()
        self._heap = h
        self._cap = cap
        return 0

    cdef int32_t _new_slot(self) except -1:
        cdef Py_ssize_t cap
        cdef Slot* slots
        cdef int32_t* fr
        if self._free.size:
            self._free.size -= 1
            return self._free.data[self._free.size]
        if self._n_slots == self._slot_cap:
            if self._slot_cap >= INT32_MAX // 2:
                raise OverflowError("DeadlineIndex is full")
            cap = self._slot_cap * 2 if self._slot_cap else 64
            # Each array is stored back as soon as it is grown, so a failure part way
            # leaves larger arrays, never a dangling pointer.
            slots = <Slot*>realloc(self._slots, cap * sizeof(Slot))
            if slots == NULL:
                raise MemoryError()
            self._slots = slots
            # The free stack never holds more than every slot: reserving here means
            # releasing a slot cannot fail half way through a removal.
            fr = <int32_t*>realloc(self._free.data, cap * sizeof(int32_t))
            if fr == NULL:
                raise MemoryError()
            self._free.data = fr
            self._free.cap = cap
            self._slot_cap = cap
        self._slots[self._n_slots].job = NULL
        self._slots[self._n_slots].pos = -1
        self._n_slots += 1
        return <int32_t>(self._n_slots - 1)

    cdef void _drop_jobs(self) noexcept:
        cdef Py_ssize_t i
        for i in range(self._n):
            Py_XDECREF(self._slots[self._heap[i].slot].job)
            self._slots[self._heap[i].slot].job = NULL

    cdef Py_ssize_t _find(self, str job) except -3:
        # The job's slot; -1 when not in the dict, -2 when its dict entry is stale.
        cdef PyObject* found = PyDict_GetItem(self._index, job)
        if found == NULL:
            return -1
        return self._check(<Py_ssize_t><object>found, job)

    cdef Py_ssize_t _check(self, Py_ssize_t slot, str job) except -3:
        # slot if it holds job, else -2 (a stale dict entry).
        cdef PyObject* k = self._slots[slot].job
        if k == <PyObject*>job:
            return slot
        # Equal but distinct str objects are rare; a slot reused by another job is
        # not, and the cached hashes tell those apart without comparing text.
        if (k == NULL or hash(<object>k) != hash(job)
                or not (<str><object>k == job)):
            return -2
        return slot

    cdef int _rebuild_index(self) except -1:
        cdef dict index = {}
        cdef Py_ssize_t i
        cdef int32_t slot
        for i in range(self._n):
            slot = self._heap[i].slot
            index[<object>self._slots[slot].job] = slot
        self._index = index
        return 0

    cdef inline void _release(self, int32_t slot) noexcept:
        # Free the slot (its dict entry, if any, is the caller's); the caller also
        # removes its heap entry.
        Py_XDECREF(self._slots[slot].job)
        self._slots[slot].job = NULL
        self._slots[slot].pos = -1
        self._free.data[self._free.size] = slot
        self._free.size += 1

    # -- heap ----------------------------------------------------------------------

    cdef inline void _sift_up(self, Py_ssize_t i, HeapEntry e) noexcept:
        cdef HeapEntry* h = self._heap
        cdef Slot* sl = self._slots
        cdef Py_ssize_t p
        while i > 0:
            p = (i - 1) >> 2
            if not _before(&e, &h[p], sl):
                break
            h[i] = h[p]
            sl[h[i].slot].pos = <int32_t>i
            i = p
        h[i] = e
        sl[e.slot].pos = <int32_t>i

    cdef inline void _sift_down(self, Py_ssize_t i, HeapEntry e) noexcept:
        cdef HeapEntry* h = self._heap
        cdef Slot* sl = self._slots
        cdef Py_ssize_t n = self._n
        cdef Py_ssize_t c, end, j, m
        while True:
            c = 4 * i + 1
            if c >= n:
                break
            end = c + 4 if c + 4 <= n else n
            m = c
            for j in range(c + 1, end):
                if _before(&h[j], &h[m], sl):
                    m = j
            if not _before(&h[m], &e, sl):
                break
            h[i] = h[m]
            sl[h[i].slot].pos = <int32_t>i
            i = m
        h[i] = e
        sl[e.slot].pos = <int32_t>i

    cdef inline void _place(self, Py_ssize_t i, HeapEntry e) noexcept:
        # e goes to position i, whose old entry is gone; restore the order around it.
        if i > 0 and _before(&e, &self._heap[(i - 1) >> 2], self._slots):
            self._sift_up(i, e)
        else:
            self._sift_down(i, e)

    # -- C API (deadlines.pxd) -----------------------------------------------------

    cdef int c_set(self, str job, int64_t deadline_ms) except -1:
        cdef Py_ssize_t i
        cdef Py_ssize_t found
        cdef int32_t slot
        cdef HeapEntry e
        if job is None:
            raise TypeError("job must be a str, not None")
        found = self._find(job)
        e.deadline = deadline_ms
        if found >= 0:
            slot = <int32_t>found
            i = self._slots[slot].pos
            if self._heap[i].deadline == deadline_ms:
                return 0
            self._slots[slot].seq = self._stamp
            self._stamp += 1
            e.slot = slot
            self._place(i, e)
            return 0
        if self._n == self._cap:
            self._grow_heap()
        slot = self._new_slot()
        try:
            PyDict_SetItem(self._index, job, slot)     # also revives a stale entry
        except BaseException:
            self._free.data[self._free.size] = slot
            self._free.size += 1
            raise
        Py_INCREF(job)
        self._slots[slot].job = <PyObject*>job
        self._slots[slot].seq = self._stamp
        self._stamp += 1
        e.slot = slot
        self._n += 1
        self._sift_up(self._n - 1, e)
        return 0

    cdef bint c_remove(self, str job) except -1:
        cdef object value
        cdef int32_t slot
        cdef Py_ssize_t i
        if job is None:
            return False
        # One dict operation: pop, then check, since a stale entry goes too.
        value = self._index.pop(job, None)
        if value is None or self._check(<Py_ssize_t>value, job) < 0:
            return False
        slot = <int32_t><Py_ssize_t>value
        i = self._slots[slot].pos
        self._release(slot)
        self._n -= 1
        if i != self._n:
            self._place(i, self._heap[self._n])
        return True

    cdef bint c_get(self, str job, int64_t* deadline_ms) except -1:
        cdef Py_ssize_t found
        if job is None:
            return False
        found = self._find(job)
        if found < 0:
            return False
        deadline_ms[0] = self._heap[self._slots[found].pos].deadline
        return True

    cdef list c_pop_due(self, int64_t now_ms, Py_ssize_t limit):
        cdef list result
        cdef object item
        cdef object job
        cdef HeapEntry* h = self._heap
        cdef Slot* sl = self._slots
        cdef I32Vec* out = &self._out
        cdef I32Vec* front = &self._front
        cdef Py_ssize_t n = self._n
        cdef Py_ssize_t m, k, c, end, j, f, p, n_new
        cdef int32_t q
        if n == 0 or h[0].deadline > now_ms or limit == 0:
            return []

        # 1. The due entries in order (at most limit of them): pop the frontier,
        # push the popped node's due children. Their positions go to out. A parent
        # precedes its children, so out is upward closed in the heap.
        front.size = 0
        out.size = 0
        _front_push(front, 0, h, sl)
        while front.size and (limit < 0 or out.size < limit):
            q = _front_pop(front, h, sl)
            i32_push(out, q)
            c = 4 * <Py_ssize_t>q + 1
            end = c + 4 if c + 4 <= n else n
            for j in range(c, end):
                if h[j].deadline <= now_ms:
                    _front_push(front, <int32_t>j, h, sl)
        m = out.size

        # 2. The answer, before anything changes (only this part can fail). A pair of
        # a str and an int can hold no cycle; untracking it (as the collector would)
        # keeps a large pop from triggering collections that walk every pair.
        result = PyList_New(m)
        for k in range(m):
            p = out.data[k]
            item = PyTuple_New(2)
            job = <object>sl[h[p].slot].job
            Py_INCREF(job)
            PyTuple_SET_ITEM(item, 0, job)
            job = PyLong_FromLongLong(h[p].deadline)
            Py_INCREF(job)
            PyTuple_SET_ITEM(item, 1, job)
            PyObject_GC_UnTrack(item)
            Py_INCREF(item)
            PyList_SET_ITEM(result, k, item)

        # 3. Release the popped slots; their pos becomes -1, which marks them. Their
        # dict entries go stale (see the module docstring).
        for k in range(m):
            self._release(h[out.data[k]].slot)

        # 4. Fill the holes below the new size with the surviving tail entries, then
        # sift the holes down, children before parents (reverse of out). Every other
        # node roots an untouched subheap, so this restores the heap.
        n_new = n - m
        f = n_new
        for k in range(m):
            p = out.data[k]
            if p < n_new:
                while sl[h[f].slot].pos == -1:
                    f += 1
                h[p] = h[f]
                f += 1
        self._n = n_new
        for k in range(m - 1, -1, -1):
            p = out.data[k]
            if p < n_new:
                self._sift_down(p, h[p])
        if PyDict_Size(self._index) - n_new > n_new + STALE_SLACK:
            self._rebuild_index()
        return result

    cdef bint c_next(self, int64_t* deadline_ms) noexcept:
        if self._n == 0:
            return False
        deadline_ms[0] = self._heap[0].deadline
        return True

    cdef Py_ssize_t c_len(self) noexcept:
        return self._n

    # -- Python API ----------------------------------------------------------------

    def set(self, str job not None, deadline_ms) -> None:
        """Index job at deadline_ms, or move it there. Among equal deadlines the job
        set earlier comes first; setting the deadline a job already has keeps its place."""
        self.c_set(job, _ms(deadline_ms))

    def remove(self, str job not None) -> bool:
        """Drop job; False when it was not indexed."""
        return self.c_remove(job)

    def pop_due(self, now_ms, limit=None) -> list:
        """Remove and return every (job, deadline_ms) with deadline_ms <= now_ms,
        earliest first; at most limit of them."""
        cdef Py_ssize_t lim = -1
        if limit is not None:
            lim = limit
            if lim < 0:
                raise ValueError("limit must be >= 0 or None")
        return self.c_pop_due(_ms(now_ms), lim)

    def peek(self):
        """The earliest (job, deadline_ms), or None when empty."""
        if self._n == 0:
            return None
        return (<object>self._slots[self._heap[0].slot].job, self._heap[0].deadline)

    def get(self, job):
        """The deadline of job, or None."""
        cdef int64_t d
        if type(job) is not str and not isinstance(job, str):
            return None
        if self.c_get(<str>job, &d):
            return d
        return None

    def clear(self) -> None:
        self._drop_jobs()
        self._n = 0
        self._n_slots = 0
        self._free.size = 0
        self._stamp = 0
        self._index.clear()

    def __len__(self) -> int:
        return self._n

    def __contains__(self, job) -> bool:
        return isinstance(job, str) and self._find(<str>job) >= 0

    def __repr__(self) -> str:
        if self._n == 0:
            return "<DeadlineIndex empty>"
        return (f"<DeadlineIndex {self._n} jobs, "
                f"next {<object>self._slots[self._heap[0].slot].job!r} "
                f"at {self._heap[0].deadline}>")
