# cython: language_level=3
"""The state document of a job: compact, versioned bytes and the C view evolve works on.

Wire format (little-endian; ``docs/execution.md`` has the table): a fixed 16-byte
header (magic ``SFS``, major, minor, status, flags, one spare byte, the first 8 bytes
of the graph's fingerprint), then unsigned LEB128 varints: times relative to the
start (zigzag, 0 = none), the job's strings, the active steps, step rounds and branch
counters as sparse pairs, and one record per action that was ever armed. A reader
refuses a newer major version and any byte sequence that does not decode exactly.
"""

from libc.stdint cimport int32_t, int64_t, uint8_t, uint64_t
from libc.string cimport memcpy, memmove, memset
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.list cimport PyList_GET_SIZE
from cpython.object cimport PyObject
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from cpython.unicode cimport PyUnicode_DecodeUTF8

cimport cython

from sfc_fast._text cimport ascii_only, utf8_view

cdef extern from "Python.h":
    # Cython's declaration takes an object for the items; NULL (delete) is what we need
    int _list_set_slice "PyList_SetSlice" (object lst, Py_ssize_t lo, Py_ssize_t hi,
                                           PyObject* items) except -1

from sfc_fast.recipe cimport Graph, Q_D, Q_L, Q_P0, I_PUSH

import json

cdef const int64_t NO_TIME = -(1 << 62)

_MAGIC = b"SFS"

cdef enum:
    _MAX_BYTES = 64 * 1024 * 1024

#: Largest state document accepted, in bytes (a guard against garbage, not a target).
MAX_STATE_BYTES = _MAX_BYTES

STATUS_NAMES = ("running", "completed", "aborted", "stopped")
PHASE_NAMES = ("idle", "delayed", "open", "done", "waiting_exit")
OUTCOME_NAMES = (None, "completed", "failed", "timeout", "cancelled", "limited")
HOLD_NAMES = (None, "hold_open", "held", "not_held")


class StateFormatError(ValueError):
    """Bytes that are not a state document this version can read."""


# ---------------------------------------------------------------- writer
#
# encode() sizes its worst case first and writes into the State's scratch buffer with
# unchecked puts: one bounds computation per call instead of one per field.

cdef inline char* _w_u(char* q, uint64_t v) noexcept:
    while v >= 0x80:
        q[0] = <char>((v & 0x7F) | 0x80)
        q += 1
        v >>= 7
    q[0] = <char>v
    return q + 1


cdef inline uint64_t _zz(int64_t v) noexcept:
    return <uint64_t>((v << 1) ^ (v >> 63))


cdef inline int64_t _unzz(uint64_t v) noexcept:
    return <int64_t>(v >> 1) ^ -(<int64_t>(v & 1))


cdef inline char* _w_time(char* q, int64_t t, int64_t base) noexcept:
    if t == NO_TIME:
        q[0] = 0
        return q + 1
    return _w_u(q, _zz(t - base) + 1)


cdef inline char* _w_raw(char* q, const char* s, Py_ssize_t n) noexcept:
    if n == 0:
        q[0] = 0        # most of these texts are empty: no call to memcpy
        return q + 1
    q = _w_u(q, <uint64_t>n)
    memcpy(q, s, n)
    return q + n


# ---------------------------------------------------------------- reader

cdef struct Rd:
    const char* p
    Py_ssize_t n
    Py_ssize_t i
    bint bad


cdef inline uint64_t _get_u(Rd* r) noexcept:
    # most varints of a state are one byte: that case comes first. Everything that takes
    # a reader is inline, so that the reader stays in registers (its address never leaves
    # decode_state; if it did, every field store would reload it).
    cdef uint8_t c
    if r.i < r.n:
        c = <uint8_t>r.p[r.i]
        if c < 0x80:
            r.i += 1
            return c
    return _get_u_long(r)


cdef inline uint64_t _get_u_long(Rd* r) noexcept:
    cdef uint64_t v = 0
    cdef int shift = 0
    cdef uint8_t c
    while True:
        if r.i >= r.n or shift > 63:
            r.bad = True
            return 0
        c = <uint8_t>r.p[r.i]
        r.i += 1
        v |= (<uint64_t>(c & 0x7F)) << shift
        if c < 0x80:
            return v
        shift += 7


cdef inline int64_t _get_time(Rd* r, int64_t base) noexcept:
    cdef uint64_t v = _get_u(r)
    if v == 0:
        return NO_TIME
    return base + _unzz(v - 1)


cdef inline int64_t _get_count(Rd* r, int64_t limit) noexcept:
    """A varint that must be in [0, limit]; marks the reader bad otherwise."""
    cdef uint64_t v = _get_u(r)
    if v > <uint64_t>limit:
        r.bad = True
        return 0
    return <int64_t>v


cdef inline void _get_txt(Rd* r, Txt* t) noexcept:
    cdef uint64_t ln = _get_u(r)
    if r.bad or ln > <uint64_t>(r.n - r.i):
        r.bad = True
        t.p = NULL
        t.n = 0
        return
    t.p = r.p + r.i
    t.n = <Py_ssize_t>ln
    r.i += <Py_ssize_t>ln


cdef inline bint _ascii(Txt t) noexcept:
    return ascii_only(t.p, t.n)


cdef object _check_utf8(Txt t):
    """The str of non-ASCII text (checked now); None for bad UTF-8."""
    try:
        return PyUnicode_DecodeUTF8(t.p, t.n, NULL)
    except UnicodeDecodeError:
        return None


# ---------------------------------------------------------------- texts

cdef int txt_set(Txt* t, object owner) except -1:
    """Point ``t`` at the UTF-8 of ``owner`` (str or bytes); the caller keeps it alive."""
    cdef Py_ssize_t n
    if isinstance(owner, str):
        t.p = utf8_view(<str>owner, &n)
        t.n = n
    else:
        t.p = PyBytes_AS_STRING(owner)
        t.n = PyBytes_GET_SIZE(owner)
    return 0


cdef str txt_str(Txt t):
    if t.n == 0:
        return ""
    return PyUnicode_DecodeUTF8(t.p, t.n, NULL)


# ---------------------------------------------------------------- the state

cdef inline char* _close_list(char* count_at, char* end, Py_ssize_t n) noexcept:
    """Write the count ``n`` of the list between ``count_at + 1`` and ``end`` into the
    byte kept for it; a count of 128 or more needs more bytes, for which the list moves
    right. Returns the list's new end."""
    cdef char tmp[10]
    cdef Py_ssize_t k
    if n < 128:
        count_at[0] = <char>n
        return end
    k = _w_u(tmp, <uint64_t>n) - tmp
    memmove(count_at + k, count_at + 1, end - count_at - 1)
    memcpy(count_at, tmp, k)
    return end + k - 1


cdef ActSt _IDLE


@cython.final
cdef class State:
    """One job's state, decoded. Evolve mutates it and encodes the result."""

    def __dealloc__(self):
        PyMem_Free(self.acts)       # one block: acts, step_round, br_ended, active
        PyMem_Free(self.buf)

    cdef int add_active(self, int32_t step) except -1:
        # at most n_steps distinct ids: the array never grows
        if self.is_active(step):
            return 0
        self.active[self.n_active] = step
        self.n_active += 1
        return 0

    cdef bint remove_active(self, int32_t step) noexcept:
        cdef Py_ssize_t i
        for i in range(self.n_active):
            if self.active[i] == step:
                self.n_active -= 1
                self.active[i] = self.active[self.n_active]
                return True
        return False

    cdef bint is_active(self, int32_t step) noexcept:
        cdef Py_ssize_t i
        for i in range(self.n_active):
            if self.active[i] == step:
                return True
        return False

    cdef int set_result(self, int a, object owner) except -1:
        """Result text of action a: ``owner`` is its JSON as str or bytes, None = none."""
        cdef Txt t
        if owner is None:
            self.acts[a].res = NULL
            self.acts[a].res_len = -1
            return 0
        self.keep.append(owner)
        txt_set(&t, owner)
        self.acts[a].res = t.p
        self.acts[a].res_len = t.n
        return 0

    cdef object params_obj(self):
        if self._params_obj is None:
            if self.t_params.n:
                try:
                    self._params_obj = json.loads(
                        PyBytes_FromStringAndSize(self.t_params.p, self.t_params.n))
                except ValueError:
                    self._params_obj = {}
            else:
                self._params_obj = {}
        return self._params_obj

    cdef str job(self):
        if self.o_job is None:
            self.o_job = txt_str(self.t_job)
        return <str>self.o_job

    cdef str scope(self):
        if self.o_scope is None:
            self.o_scope = txt_str(self.t_scope)
        return <str>self.o_scope

    cdef str reason(self):
        if self.o_reason is None:
            self.o_reason = txt_str(self.t_reason)
        return <str>self.o_reason

    cdef str order(self):
        if self.o_order is None:
            self.o_order = txt_str(self.t_order)
        return <str>self.o_order

    cdef int set_reason(self, str v) except -1:
        self.o_reason = v
        txt_set(&self.t_reason, v)
        return 0

    @cython.boundscheck(False)
    cdef bytes encode(self):
        cdef Graph g = self.g
        cdef Py_ssize_t i, n
        cdef int a
        cdef ActSt* s
        cdef int64_t base = self.started_at
        cdef char* q
        cdef char* count_at
        # worst case: 10 bytes a varint; an armed action's record is at most 112 bytes
        # and its result text (armed ones only: a big recipe's buffer stays small)
        cdef Py_ssize_t need = (16 + 40 + 50 + self.t_job.n + self.t_scope.n + self.t_reason.n
                                + self.t_order.n + self.t_params.n + 30 + 10 * self.n_active
                                + 20 * g.n_steps + 20 * g.n_branches + 30)
        for a in range(g.n_actions):
            s = &self.acts[a]
            if s.phase != PH_IDLE:
                need += 112 + (s.res_len if s.res_len > 0 else 0)
        if need > self.buf_cap:
            q = <char*>PyMem_Realloc(self.buf, need)
            if q == NULL:
                raise MemoryError()
            self.buf = q
            self.buf_cap = need
        q = self.buf
        q[0] = b'S'
        q[1] = b'F'
        q[2] = b'S'
        q[3] = <char>STATE_FORMAT_MAJOR
        q[4] = <char>STATE_FORMAT_MINOR
        q[5] = <char>self.status
        q[6] = <char>self.flags
        q[7] = 0
        memcpy(q + 8, PyBytes_AS_STRING(g._blob) + 12, 8)
        q += 16
        q = _w_u(q, <uint64_t>self.started_at)
        q = _w_time(q, self.held_at, base)
        q = _w_u(q, <uint64_t>self.cmd_counter)
        q = _w_u(q, <uint64_t>(self.last_exit + 1))
        q = _w_u(q, <uint64_t>self.t_job.n)
        self.job_at = q - self.buf
        memcpy(q, self.t_job.p, self.t_job.n)
        q += self.t_job.n
        q = _w_u(q, <uint64_t>self.t_scope.n)
        self.scope_at = q - self.buf
        memcpy(q, self.t_scope.p, self.t_scope.n)
        q += self.t_scope.n
        q = _w_raw(q, self.t_reason.p, self.t_reason.n)
        q = _w_raw(q, self.t_order.p, self.t_order.n)
        q = _w_raw(q, self.t_params.p, self.t_params.n)
        q = _w_u(q, <uint64_t>self.n_active)
        for i in range(self.n_active):
            q = _w_u(q, <uint64_t>self.active[i])
        # Each sparse list is preceded by its count, known once the list is written:
        # one byte is kept for it (_close_list makes room when it needs more).
        count_at = q
        q += 1
        n = 0
        for i in range(g.n_steps):
            if self.step_round[i]:
                q = _w_u(q, <uint64_t>i)
                q = _w_u(q, <uint64_t>self.step_round[i])
                n += 1
        q = _close_list(count_at, q, n)
        count_at = q
        q += 1
        n = 0
        for i in range(g.n_branches):
            if self.br_ended[i] >= 0:
                q = _w_u(q, <uint64_t>i)
                q = _w_u(q, <uint64_t>self.br_ended[i])
                n += 1
        q = _close_list(count_at, q, n)
        count_at = q
        q += 1
        n = 0
        for a in range(g.n_actions):
            s = &self.acts[a]
            if s.phase == PH_IDLE:
                continue
            n += 1
            q = _w_u(q, <uint64_t>a)
            q[0] = <char>(s.phase | (s.hold << 4))
            q[1] = <char>(s.outcome | (s.flags << 4))
            q += 2
            q = _w_u(q, <uint64_t>s.attempt)
            q = _w_u(q, <uint64_t>s.round)
            q = _w_u(q, <uint64_t>s.cmd_n)
            q = _w_u(q, <uint64_t>s.hold_n)
            q = _w_time(q, s.deadline, base)
            q = _w_time(q, s.hold_deadline, base)
            q = _w_time(q, s.timer, base)
            q = _w_time(q, s.since, base)
            q = _w_time(q, s.done_at, base)
            if s.res_len < 0:
                q[0] = 0
                q += 1
            else:
                # length + 1 so that 0 means "no result" and an empty text stays distinct
                q = _w_u(q, <uint64_t>(s.res_len + 1))
                memcpy(q, s.res, s.res_len)
                q += s.res_len
        q = _close_list(count_at, q, n)
        return PyBytes_FromStringAndSize(self.buf, q - self.buf)

    cdef void release(self) noexcept:
        """Hand this State back to its graph for the next call; it is not used after."""
        cdef Graph g = self.g
        if g is None:
            return
        self.src = None
        self.o_job = self.o_scope = self.o_reason = self.o_order = None
        self._params_obj = None
        if PyList_GET_SIZE(self.keep):
            _list_set_slice(self.keep, 0, PyList_GET_SIZE(self.keep), NULL)   # no slice object
        if self.buf_cap > 65536:
            # a rare huge document does not keep its buffer for the graph's lifetime
            PyMem_Free(self.buf)
            self.buf = NULL
            self.buf_cap = 0
        self.g = None           # no cycle graph -> state -> graph while parked
        g._scratch = self


cdef inline void _reset_act(ActSt* a) noexcept:
    memset(a, 0, sizeof(ActSt))
    a.deadline = NO_TIME
    a.hold_deadline = NO_TIME
    a.timer = NO_TIME
    a.since = NO_TIME
    a.done_at = NO_TIME
    a.res_len = -1


_reset_act(&_IDLE)


cdef State acquire_state(Graph g):
    """A blank State for ``g``: the one parked on the graph, else a new one."""
    cdef State s = <State>g._scratch if g._scratch is not None else None
    cdef Py_ssize_t i
    cdef char* block
    if s is not None:
        g._scratch = None
    else:
        s = State.__new__(State)
        s.keep = []
        block = <char*>PyMem_Malloc((2 * g.n_actions + 1) * sizeof(ActSt)
                                    + (2 * g.n_steps + g.n_branches + 3) * sizeof(int32_t))
        if block == NULL:
            raise MemoryError()
        s.acts = <ActSt*>block
        s.idle = s.acts + g.n_actions + 1
        for i in range(g.n_actions):
            s.idle[i] = _IDLE
        s.step_round = <int32_t*>(block + (2 * g.n_actions + 1) * sizeof(ActSt))
        s.br_ended = s.step_round + (g.n_steps + 1)
        s.active = s.br_ended + (g.n_branches + 1)
    s.g = g
    memset(s.step_round, 0, g.n_steps * sizeof(int32_t))
    for i in range(g.n_branches):
        s.br_ended[i] = -1
    memcpy(s.acts, s.idle, g.n_actions * sizeof(ActSt))   # one copy, not a loop of them
    s.n_active = 0
    s.status = ST_RUNNING
    s.flags = 0
    s.started_at = 0
    s.held_at = NO_TIME
    s.cmd_counter = 0
    s.last_exit = -1
    s.t_job.n = s.t_scope.n = s.t_reason.n = s.t_order.n = s.t_params.n = 0
    s.t_job.p = s.t_scope.p = s.t_reason.p = s.t_order.p = s.t_params.p = ""
    return s


cdef State new_state(Graph g, str job, str scope, bytes params, str order, int64_t now):
    cdef State s = acquire_state(g)
    s.o_job = job
    txt_set(&s.t_job, job)
    s.o_scope = scope
    txt_set(&s.t_scope, scope)
    s.o_reason = ""
    if params is not None and len(params):
        s.keep.append(params)
        txt_set(&s.t_params, params)
    if order is not None:
        s.o_order = order
        txt_set(&s.t_order, order)
    s.status = ST_RUNNING
    s.started_at = now
    return s


cdef State decode_state(Graph g, object data):
    if not isinstance(data, bytes):
        if isinstance(data, (bytearray, memoryview)):
            data = bytes(data)
        else:
            raise StateFormatError(f"a state document is bytes, not {type(data).__name__}")
    cdef bytes raw = <bytes>data
    cdef Py_ssize_t size = PyBytes_GET_SIZE(raw)
    cdef const char* p = PyBytes_AS_STRING(raw)
    if size < 16 or p[0] != b'S' or p[1] != b'F' or p[2] != b'S':
        raise StateFormatError("not a job state document (bad magic)")
    if size > _MAX_BYTES:
        raise StateFormatError(f"state document of {size} bytes is over the limit")
    cdef int major = <uint8_t>p[3]
    if major != STATE_FORMAT_MAJOR:
        raise StateFormatError(
            f"state format {major}.{<uint8_t>p[4]} is not readable by this version, which "
            f"reads {STATE_FORMAT_MAJOR}.x; upgrade sfc-fast" if major > STATE_FORMAT_MAJOR
            else f"state format {major}.x is too old for this version")
    cdef int status = <uint8_t>p[5]
    cdef int flags = <uint8_t>p[6]
    if status > ST_STOPPED or flags > 3:
        raise StateFormatError("state header has an unknown status or flag")
    if memcmp8(p + 8, PyBytes_AS_STRING(g._blob) + 12) != 0:
        raise StateFormatError("state belongs to another recipe graph (fingerprint differs)")
    cdef State s = acquire_state(g)
    s.status = status
    s.flags = flags
    s.src = raw
    cdef Rd r
    r.p = p
    r.n = size
    r.i = 16
    r.bad = False
    cdef int64_t base = <int64_t>_get_count(&r, (<int64_t>1) << 53)
    s.started_at = base
    s.held_at = _get_time(&r, base)
    s.cmd_counter = _get_count(&r, (<int64_t>1) << 40)
    s.last_exit = <int32_t>_get_count(&r, g.n_steps) - 1
    _get_txt(&r, &s.t_job)
    _get_txt(&r, &s.t_scope)
    _get_txt(&r, &s.t_reason)
    _get_txt(&r, &s.t_order)
    _get_txt(&r, &s.t_params)
    if not r.bad:
        # texts are checked now (garbage is refused here), made str only when asked for
        if not _ascii(s.t_job):
            s.o_job = _check_utf8(s.t_job)
            r.bad |= s.o_job is None
        if not _ascii(s.t_scope):
            s.o_scope = _check_utf8(s.t_scope)
            r.bad |= s.o_scope is None
        if not _ascii(s.t_reason):
            s.o_reason = _check_utf8(s.t_reason)
            r.bad |= s.o_reason is None
        if not _ascii(s.t_order):
            s.o_order = _check_utf8(s.t_order)
            r.bad |= s.o_order is None
    if r.bad:
        raise StateFormatError("state document is truncated or corrupt (header fields)")
    cdef int64_t i, n, k, v
    n = _get_count(&r, g.n_steps)
    for i in range(n):
        k = _get_count(&r, g.n_steps - 1)
        if r.bad:
            break
        s.add_active(<int32_t>k)
    n = _get_count(&r, g.n_steps)
    for i in range(n):
        k = _get_count(&r, g.n_steps - 1)
        v = _get_count(&r, 0x7FFFFFFF)
        if r.bad:
            break
        s.step_round[k] = <int32_t>v
    n = _get_count(&r, g.n_branches)
    for i in range(n):
        k = _get_count(&r, g.n_branches - 1 if g.n_branches else 0)
        v = _get_count(&r, 0x7FFFFFFF)
        if r.bad or g.n_branches == 0:
            r.bad = True
            break
        s.br_ended[k] = <int32_t>v
    n = _get_count(&r, g.n_actions)
    cdef ActSt* a
    cdef uint8_t b1, b2
    cdef Py_ssize_t rl
    for i in range(n):
        k = _get_count(&r, g.n_actions - 1 if g.n_actions else 0)
        if r.bad or g.n_actions == 0 or r.i + 2 > r.n:
            r.bad = True
            break
        a = &s.acts[k]
        b1 = <uint8_t>p[r.i]
        b2 = <uint8_t>p[r.i + 1]
        r.i += 2
        a.phase = b1 & 0x0F
        a.hold = b1 >> 4
        a.outcome = b2 & 0x0F
        a.flags = b2 >> 4
        if a.phase == PH_IDLE or a.phase > PH_WAIT_EXIT or a.hold > HP_NOT_HELD \
                or a.outcome > OC_LIMITED:
            r.bad = True
            break
        a.attempt = <int32_t>_get_count(&r, 0x7FFFFFFF)
        a.round = <int32_t>_get_count(&r, 0x7FFFFFFF)
        a.cmd_n = _get_count(&r, (<int64_t>1) << 40)
        a.hold_n = _get_count(&r, (<int64_t>1) << 40)
        a.deadline = _get_time(&r, base)
        a.hold_deadline = _get_time(&r, base)
        a.timer = _get_time(&r, base)
        a.since = _get_time(&r, base)
        a.done_at = _get_time(&r, base)
        v = _get_count(&r, size)
        if r.bad:
            break
        if v == 0:
            a.res_len = -1
        else:
            rl = <Py_ssize_t>(v - 1)
            if rl > r.n - r.i:
                r.bad = True
                break
            a.res = p + r.i
            a.res_len = rl
            r.i += rl
    if r.bad or r.i != r.n:
        raise StateFormatError("state document is truncated or corrupt")
    return s


cdef inline int memcmp8(const char* a, const char* b) noexcept:
    cdef int i
    for i in range(8):
        if a[i] != b[i]:
            return 1
    return 0


# ---------------------------------------------------------------- Python-facing

cdef object _time(int64_t t):
    return None if t == NO_TIME else t


def state_to_json(Graph graph, state) -> dict:
    """The readable view of a state document, for tools and logs (not the hot path)."""
    cdef State s = decode_state(graph, state)
    cdef Graph g = graph
    cdef int a
    cdef ActSt* x
    actions = {}
    for a in range(g.n_actions):
        x = &s.acts[a]
        if x.phase == PH_IDLE:
            continue
        name = g.s(g.act_name[a])
        cmd = None
        if x.cmd_n and g.act_inter[a] == I_PUSH:
            cmd = f"{s.job()}:{name}#{x.cmd_n}"
        result = None
        if x.res_len >= 0:
            try:
                result = json.loads(PyBytes_FromStringAndSize(x.res, x.res_len))
            except ValueError:
                result = None
        entry = {
            "step": g.s(g.step_name[g.act_step[a]]),
            "phase": PHASE_NAMES[x.phase],
            "outcome": OUTCOME_NAMES[x.outcome],
            "attempt": x.attempt,
            "round": x.round,
            "command_id": cmd,
            "deadline_ms": _time(x.deadline),
            "since_ms": _time(x.since),
            "settled_ms": _time(x.done_at),
            "result": result,
        }
        if x.hold != HP_NONE:
            entry["hold"] = HOLD_NAMES[x.hold]
            entry["hold_command_id"] = (f"{s.job()}:{name}#{x.hold_n}:hold" if x.hold_n
                                        else None)
            entry["hold_deadline_ms"] = _time(x.hold_deadline)
        if x.flags & AF_RESTART:
            entry["restart"] = True
        if x.timer != NO_TIME:
            entry["timer_ms"] = x.timer
        actions[name] = entry
    held = bool(s.flags & JF_HELD)
    view = {
        "format": f"{STATE_FORMAT_MAJOR}.{STATE_FORMAT_MINOR}",
        "job": s.job(),
        "scope": s.scope(),
        "status": "held" if held and s.status == ST_RUNNING else STATUS_NAMES[s.status],
        "reason": s.reason() or None,
        "order": s.order() or None,
        "started_ms": s.started_at,
        "held_ms": _time(s.held_at),
        "ending": bool(s.flags & JF_ENDING),
        "commands_issued": s.cmd_counter,
        "active_steps": sorted(g.s(g.step_name[s.active[i]]) for i in range(s.n_active)),
        "step_rounds": {g.s(g.step_name[i]): s.step_round[i] for i in range(g.n_steps)
                        if s.step_round[i]},
        "params": s.params_obj(),
        "actions": actions,
    }
    s.release()
    return view


def check_state(Graph graph, state) -> None:
    """Raise StateFormatError unless ``state`` decodes against ``graph``."""
    decode_state(graph, state).release()
