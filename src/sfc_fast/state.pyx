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
from libc.string cimport memcpy, memset
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.mem cimport PyMem_Calloc, PyMem_Free, PyMem_Malloc, PyMem_Realloc
from cpython.unicode cimport PyUnicode_DecodeUTF8

cimport cython

from sfc_fast.recipe cimport Graph, Q_D, Q_L, Q_P0, I_PUSH

import json

cdef const int64_t NO_TIME = -(1 << 62)

_MAGIC = b"SFS"

#: Largest state document accepted, in bytes (a guard against garbage, not a target).
MAX_STATE_BYTES = 64 * 1024 * 1024

STATUS_NAMES = ("running", "completed", "aborted", "stopped")
PHASE_NAMES = ("idle", "delayed", "open", "done", "waiting_exit")
OUTCOME_NAMES = (None, "completed", "failed", "timeout", "cancelled", "limited")
HOLD_NAMES = (None, "hold_open", "held", "not_held")


class StateFormatError(ValueError):
    """Bytes that are not a state document this version can read."""


# ---------------------------------------------------------------- writer

cdef struct Buf:
    char* p
    Py_ssize_t n
    Py_ssize_t cap


cdef int _grow(Buf* b, Py_ssize_t need) except -1:
    cdef Py_ssize_t cap = b.cap * 2 if b.cap else 512
    while cap < b.n + need:
        cap *= 2
    cdef char* q = <char*>PyMem_Realloc(b.p, cap)
    if q == NULL:
        raise MemoryError()
    b.p = q
    b.cap = cap
    return 0


cdef inline int _put_u(Buf* b, uint64_t v) except -1:
    if b.n + 10 > b.cap:
        _grow(b, 10)
    while v >= 0x80:
        b.p[b.n] = <char>((v & 0x7F) | 0x80)
        b.n += 1
        v >>= 7
    b.p[b.n] = <char>v
    b.n += 1
    return 0


cdef inline int _put_byte(Buf* b, uint8_t v) except -1:
    if b.n + 1 > b.cap:
        _grow(b, 1)
    b.p[b.n] = <char>v
    b.n += 1
    return 0


cdef inline uint64_t _zz(int64_t v) noexcept:
    return <uint64_t>((v << 1) ^ (v >> 63))


cdef inline int64_t _unzz(uint64_t v) noexcept:
    return <int64_t>(v >> 1) ^ -(<int64_t>(v & 1))


cdef inline int _put_time(Buf* b, int64_t t, int64_t base) except -1:
    if t == NO_TIME:
        return _put_u(b, 0)
    return _put_u(b, _zz(t - base) + 1)


cdef int _put_raw(Buf* b, const char* s, Py_ssize_t n) except -1:
    _put_u(b, <uint64_t>n)
    if b.n + n > b.cap:
        _grow(b, n)
    memcpy(b.p + b.n, s, n)
    b.n += n
    return 0


cdef int _put_str(Buf* b, str s) except -1:
    cdef bytes e = s.encode("utf-8")
    return _put_raw(b, PyBytes_AS_STRING(e), PyBytes_GET_SIZE(e))


# ---------------------------------------------------------------- reader

cdef struct Rd:
    const char* p
    Py_ssize_t n
    Py_ssize_t i
    bint bad


@cython.boundscheck(False)
cdef inline uint64_t _get_u(Rd* r) noexcept:
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


cdef const char* _get_raw(Rd* r, Py_ssize_t* n) noexcept:
    cdef uint64_t ln = _get_u(r)
    if r.bad or ln > <uint64_t>(r.n - r.i):
        r.bad = True
        n[0] = 0
        return NULL
    cdef const char* s = r.p + r.i
    r.i += <Py_ssize_t>ln
    n[0] = <Py_ssize_t>ln
    return s


cdef str _get_str(Rd* r):
    cdef Py_ssize_t n
    cdef const char* s = _get_raw(r, &n)
    if r.bad:
        return ""
    try:
        return PyUnicode_DecodeUTF8(s, n, NULL)
    except UnicodeDecodeError:
        r.bad = True
        return ""


# ---------------------------------------------------------------- the state

cdef class State:
    """One job's state, decoded. Evolve mutates a fresh one per call and encodes it."""

    def __dealloc__(self):
        PyMem_Free(self.active)
        PyMem_Free(self.step_round)
        PyMem_Free(self.br_ended)
        PyMem_Free(self.acts)

    cdef int add_active(self, int32_t step) except -1:
        cdef int32_t* q
        if self.is_active(step):
            return 0
        if self.n_active == self.cap_active:
            self.cap_active = self.cap_active * 2 if self.cap_active else 8
            q = <int32_t*>PyMem_Realloc(self.active, self.cap_active * sizeof(int32_t))
            if q == NULL:
                raise MemoryError()
            self.active = q
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

    cdef int set_result(self, int a, bytes text) except -1:
        if text is None:
            self.acts[a].res = NULL
            self.acts[a].res_len = -1
            return 0
        self.keep.append(text)
        self.acts[a].res = PyBytes_AS_STRING(text)
        self.acts[a].res_len = PyBytes_GET_SIZE(text)
        return 0

    cdef object params_obj(self):
        if self._params_obj is None:
            if self.params:
                try:
                    self._params_obj = json.loads(self.params)
                except ValueError:
                    self._params_obj = {}
            else:
                self._params_obj = {}
        return self._params_obj

    cdef bytes encode(self):
        cdef Graph g = self.g
        cdef Buf b
        cdef Py_ssize_t i, n
        cdef int a
        cdef ActSt* s
        cdef int64_t base = self.started_at
        b.p = NULL
        b.n = 0
        b.cap = 0
        try:
            _grow(&b, 256)
            b.p[0] = b'S'
            b.p[1] = b'F'
            b.p[2] = b'S'
            b.p[3] = <char>STATE_FORMAT_MAJOR
            b.p[4] = <char>STATE_FORMAT_MINOR
            b.p[5] = <char>self.status
            b.p[6] = <char>self.flags
            b.p[7] = 0
            memcpy(b.p + 8, PyBytes_AS_STRING(g._blob) + 12, 8)
            b.n = 16
            _put_u(&b, <uint64_t>self.started_at)
            _put_time(&b, self.held_at, base)
            _put_u(&b, <uint64_t>self.cmd_counter)
            _put_u(&b, <uint64_t>(self.last_exit + 1))
            _put_str(&b, self.job)
            _put_str(&b, self.scope)
            _put_str(&b, self.reason)
            _put_str(&b, self.order)
            _put_raw(&b, PyBytes_AS_STRING(self.params), PyBytes_GET_SIZE(self.params))
            _put_u(&b, <uint64_t>self.n_active)
            for i in range(self.n_active):
                _put_u(&b, <uint64_t>self.active[i])
            n = 0
            for i in range(g.n_steps):
                if self.step_round[i]:
                    n += 1
            _put_u(&b, <uint64_t>n)
            for i in range(g.n_steps):
                if self.step_round[i]:
                    _put_u(&b, <uint64_t>i)
                    _put_u(&b, <uint64_t>self.step_round[i])
            n = 0
            for i in range(g.n_branches):
                if self.br_ended[i] >= 0:
                    n += 1
            _put_u(&b, <uint64_t>n)
            for i in range(g.n_branches):
                if self.br_ended[i] >= 0:
                    _put_u(&b, <uint64_t>i)
                    _put_u(&b, <uint64_t>self.br_ended[i])
            n = 0
            for a in range(g.n_actions):
                if self.acts[a].phase != PH_IDLE:
                    n += 1
            _put_u(&b, <uint64_t>n)
            for a in range(g.n_actions):
                s = &self.acts[a]
                if s.phase == PH_IDLE:
                    continue
                _put_u(&b, <uint64_t>a)
                _put_byte(&b, s.phase | (s.hold << 4))
                _put_byte(&b, s.outcome | (s.flags << 4))
                _put_u(&b, <uint64_t>s.attempt)
                _put_u(&b, <uint64_t>s.round)
                _put_u(&b, <uint64_t>s.cmd_n)
                _put_u(&b, <uint64_t>s.hold_n)
                _put_time(&b, s.deadline, base)
                _put_time(&b, s.hold_deadline, base)
                _put_time(&b, s.timer, base)
                _put_time(&b, s.since, base)
                _put_time(&b, s.done_at, base)
                if s.res_len < 0:
                    _put_u(&b, 0)
                else:
                    _put_res(&b, s)
            return PyBytes_FromStringAndSize(b.p, b.n)
        finally:
            PyMem_Free(b.p)


cdef inline int _put_res(Buf* b, ActSt* s) except -1:
    # length + 1 so that 0 means "no result" and an empty text stays distinct
    _put_u(b, <uint64_t>(s.res_len + 1))
    if b.n + s.res_len > b.cap:
        _grow(b, s.res_len)
    memcpy(b.p + b.n, s.res, s.res_len)
    b.n += s.res_len
    return 0


cdef State _alloc(Graph g):
    cdef State s = State.__new__(State)
    s.g = g
    s.keep = []
    s.step_round = <int32_t*>PyMem_Calloc(g.n_steps + 1, sizeof(int32_t))
    s.br_ended = <int32_t*>PyMem_Malloc((g.n_branches + 1) * sizeof(int32_t))
    s.acts = <ActSt*>PyMem_Calloc(g.n_actions + 1, sizeof(ActSt))
    if s.step_round == NULL or s.br_ended == NULL or s.acts == NULL:
        raise MemoryError()
    cdef Py_ssize_t i
    for i in range(g.n_branches):
        s.br_ended[i] = -1
    for i in range(g.n_actions):
        _reset_act(&s.acts[i])
    s.held_at = NO_TIME
    s.last_exit = -1
    s.reason = ""
    s.order = ""
    s.params = b""
    return s


cdef inline void _reset_act(ActSt* a) noexcept:
    memset(a, 0, sizeof(ActSt))
    a.deadline = NO_TIME
    a.hold_deadline = NO_TIME
    a.timer = NO_TIME
    a.since = NO_TIME
    a.done_at = NO_TIME
    a.res_len = -1


cdef State new_state(Graph g, str job, str scope, bytes params, str order, int64_t now):
    cdef State s = _alloc(g)
    s.job = job
    s.scope = scope
    s.params = params if params is not None else b""
    s.order = order if order is not None else ""
    s.status = ST_RUNNING
    s.started_at = now
    return s


cdef State copy_state(State src):
    cdef Graph g = src.g
    cdef State s = _alloc(g)
    s.job, s.scope, s.reason, s.order, s.params = (src.job, src.scope, src.reason,
                                                   src.order, src.params)
    s.status, s.flags, s.started_at, s.held_at = (src.status, src.flags, src.started_at,
                                                  src.held_at)
    s.cmd_counter = src.cmd_counter
    s.last_exit = src.last_exit
    cdef Py_ssize_t i
    for i in range(src.n_active):
        s.add_active(src.active[i])
    memcpy(s.step_round, src.step_round, g.n_steps * sizeof(int32_t))
    memcpy(s.br_ended, src.br_ended, g.n_branches * sizeof(int32_t))
    memcpy(s.acts, src.acts, g.n_actions * sizeof(ActSt))
    s.keep = list(src.keep)
    s._params_obj = src._params_obj
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
    if size > MAX_STATE_BYTES:
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
    cdef State s = _alloc(g)
    s.status = status
    s.flags = flags
    s.keep.append(raw)
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
    s.job = _get_str(&r)
    s.scope = _get_str(&r)
    s.reason = _get_str(&r)
    s.order = _get_str(&r)
    cdef Py_ssize_t pn
    cdef const char* pp = _get_raw(&r, &pn)
    if r.bad:
        raise StateFormatError("state document is truncated or corrupt (header fields)")
    s.params = PyBytes_FromStringAndSize(pp, pn)
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
            cmd = f"{s.job}:{name}#{x.cmd_n}"
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
            entry["hold_command_id"] = (f"{s.job}:{name}#{x.hold_n}:hold" if x.hold_n
                                        else None)
            entry["hold_deadline_ms"] = _time(x.hold_deadline)
        if x.flags & AF_RESTART:
            entry["restart"] = True
        if x.timer != NO_TIME:
            entry["timer_ms"] = x.timer
        actions[name] = entry
    held = bool(s.flags & JF_HELD)
    return {
        "format": f"{STATE_FORMAT_MAJOR}.{STATE_FORMAT_MINOR}",
        "job": s.job,
        "scope": s.scope,
        "status": "held" if held and s.status == ST_RUNNING else STATUS_NAMES[s.status],
        "reason": s.reason or None,
        "order": s.order or None,
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


def check_state(Graph graph, state) -> None:
    """Raise StateFormatError unless ``state`` decodes against ``graph``."""
    decode_state(graph, state)
