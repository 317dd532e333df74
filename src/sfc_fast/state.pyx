# cython: language_level=3
"""The state document of a job: compact, versioned bytes and the C view evolve works on.

Wire format (little-endian; ``docs/execution.md`` has the table): a fixed 16-byte
header (magic ``SFS``, major, minor, status, flags, one spare byte, the first 8 bytes
of the graph's fingerprint), then unsigned LEB128 varints: times relative to the
start (zigzag, 0 = none), the job's strings, the active steps, step rounds and branch
counters as sparse pairs, and one record per live action. A reader refuses a newer
major version and any byte sequence that does not decode exactly.

Format 2 (format 1 is still read) ends with the archive: records of settled actions
(and rounds of left steps) that no later event can read, so evolve neither decodes nor
rewrites them. A record is archived once its action is settled and its step is not
active, unless the graph pins it: a step on a cycle of the chart (it is entered again),
or an action a condition reads from another step (see ``_graph_pins``). The archive is
kept apart by the caller (``evolve_live``: the Decision's ``archived`` are the records
to append) or the document's tail (``join_state``: the live part followed by them is
the whole state again); ``evolve`` of one document archives nothing and copies a tail
it is given (checked, never decoded). A later record of the same action wins, a live
one over any archived one.
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

from sfc_fast.graph cimport (
    Graph, Q_D, Q_L, Q_P0, Q_R, I_PUSH, B_SIMULTANEOUS, TK_PATH_END,
)
from sfc_fast.conditions cimport (
    OP_CONST, OP_LOAD, OP_AND_JUMP, OP_OR_JUMP, OP_LIST, REF_RESULT, REF_ROUND, REF_OUTCOME,
)

import json

from sfc_fast.errors import SfcError

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


class StateFormatError(SfcError, ValueError):
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


# ---------------------------------------------------------------- pins
#
# What evolve may read again stays in the live part. Everything else of a settled action
# is read by nobody but tools: a step is entered again only if it is on a cycle of the
# chart (steps and branches as nodes), and a condition reads an action of another step
# than its transition's source only by name (its result, round or outcome); a condition
# of a step's own transition runs while that step is active, when its records are live.

cdef list _node_edges(Graph g):
    """Successor nodes of every node, or None when the chart has a shape this does not
    follow (then everything is pinned: right, only not flat)."""
    cdef int ns = g.n_steps, nn = g.n_steps + g.n_branches
    cdef int u, k, t, b, p
    cdef list adj = [[] for _ in range(nn)]
    for u in range(nn):
        out = <list>adj[u]
        for k in range(g.node_out_off[u], g.node_out_off[u + 1]):
            t = g.node_out[k]
            if g.tr_kind[t] == TK_PATH_END:
                if u >= ns or g.step_path[u] < 0:
                    return None
                out.append(ns + g.path_branch[g.step_path[u]])
            elif 0 <= g.tr_target[t] < nn:
                out.append(g.tr_target[t])
            else:
                return None
        if u < ns and g.node_out_off[u] == g.node_out_off[u + 1] and g.step_path[u] >= 0:
            out.append(ns + g.path_branch[g.step_path[u]])     # its path ends here
        if u >= ns:
            b = u - ns
            if g.br_type[b] == B_SIMULTANEOUS:
                for p in range(g.br_path_off[b], g.br_path_off[b + 1]):
                    out.append(g.path_steps[g.path_off[p]])
    return adj


cdef bytearray _on_cycle(list adj):
    """1 for every node on a cycle (Tarjan's strongly connected components, iterative)."""
    cdef Py_ssize_t nn = len(adj), counter = 0, v, w, i
    cdef list index = [-1] * nn
    cdef list low = [0] * nn
    cdef bytearray on_stack = bytearray(nn)
    cdef bytearray cyc = bytearray(nn)
    cdef list stack = []
    cdef list work
    for root in range(nn):
        if index[root] >= 0:
            continue
        work = [(root, 0)]
        while work:
            v, i = work[-1]
            if i == 0:
                index[v] = low[v] = counter
                counter += 1
                stack.append(v)
                on_stack[v] = 1
            succ = <list>adj[v]
            if i < len(succ):
                work[-1] = (v, i + 1)
                w = succ[i]
                if w == v:
                    cyc[v] = 1
                if index[w] < 0:
                    work.append((w, 0))
                elif on_stack[w] and index[w] < low[v]:
                    low[v] = index[w]
                continue
            work.pop()
            if work:
                w = work[-1][0]
                if low[v] < low[w]:
                    low[w] = low[v]
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack[w] = 0
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    for w in comp:
                        cyc[w] = 1
    return cyc


cdef bytes _graph_pins(Graph g):
    """[n_actions] then [n_steps] bytes: 1 = never archived. Made once per graph."""
    if g._pins is not None:
        return g._pins
    cdef int na = g.n_actions, ns = g.n_steps
    cdef int a, t, c, i, end, op, ref, src
    cdef bytearray pins = bytearray(na + ns)
    adj = _node_edges(g)
    if adj is None:
        pins[:] = b"\x01" * (na + ns)
    else:
        cyc = _on_cycle(adj)
        for i in range(ns):
            pins[na + i] = cyc[i]
        for a in range(na):
            if cyc[g.act_step[a]]:
                pins[a] = 1
            if g.act_qual[a] == Q_R and g.act_reset[a] >= 0:
                pins[g.act_reset[a]] = 1        # bare names of the R's step read it
        for t in range(g.n_transitions):
            c = g.tr_cond[t]
            if c < 0:
                continue
            src = g.tr_source[t]
            i = g.cond_off[c]
            end = g.cond_off[c + 1]
            while i < end:
                op = g.code[i]
                if op == OP_LOAD:
                    ref = g.code[i + 1]
                    a = g.ref_action[ref]
                    if 0 <= a < na and g.act_step[a] != src and (
                            g.ref_kind[ref] == REF_RESULT or g.ref_kind[ref] == REF_ROUND
                            or g.ref_kind[ref] == REF_OUTCOME):
                        pins[a] = 1
                        pins[na + g.act_step[a]] = 1
                if op == OP_CONST or op == OP_LOAD or op == OP_AND_JUMP \
                        or op == OP_OR_JUMP or op == OP_LIST:
                    i += 2
                else:
                    i += 1
    g._pins = bytes(pins)
    return g._pins


# ---------------------------------------------------------------- sorted id lists

cdef inline Py_ssize_t _insert_sorted(int32_t* xs, Py_ssize_t n, int32_t v) noexcept:
    """Insert ``v`` (not present) into the sorted ``xs[:n]``; returns the new length."""
    cdef Py_ssize_t lo = 0, hi = n, mid
    if n == 0 or xs[n - 1] < v:
        xs[n] = v               # the usual case: a later step, a later action
        return n + 1
    while lo < hi:
        mid = (lo + hi) >> 1
        if xs[mid] < v:
            lo = mid + 1
        else:
            hi = mid
    if lo < n:
        memmove(xs + lo + 1, xs + lo, (n - lo) * sizeof(int32_t))
    xs[lo] = v
    return n + 1


@cython.final
cdef class State:
    """One job's state, decoded. Evolve mutates it and encodes the result."""

    def __dealloc__(self):
        PyMem_Free(self.acts)       # one block: every array of the state
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

    cdef ActSt* act(self, int a) except NULL:
        """Action a's slot, listed as live (a writer's access: it is about to be set)."""
        if not (self.amark[a] & AM_LIVE):
            self.amark[a] |= AM_LIVE
            self.n_live = _insert_sorted(self.live, self.n_live, a)
        return &self.acts[a]

    cdef int bump_round(self, int32_t step) except -1:
        if self.step_round[step] == 0:
            self.n_rsteps = _insert_sorted(self.rsteps, self.n_rsteps, step)
        self.step_round[step] += 1
        return 0

    cdef int set_result(self, int a, object owner) except -1:
        """Result text of action a: ``owner`` is its JSON as str or bytes, None = none."""
        cdef Txt t
        cdef ActSt* x = &self.acts[a] if self.amark[a] & AM_LIVE else self.act(a)
        if owner is None:
            x.res = NULL
            x.res_len = -1
            return 0
        self.keep.append(owner)
        txt_set(&t, owner)
        x.res = t.p
        x.res_len = t.n
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

    cdef bint archivable(self, int a) noexcept:
        cdef ActSt* s = &self.acts[a]
        return (self.splitting and s.phase == PH_DONE and s.flags == 0 and not self.pin[a]
                and not self.is_active(self.g.act_step[a]))

    cdef bint step_archivable(self, int32_t st) noexcept:
        return self.splitting and not self.pin[self.g.n_actions + st] and not self.is_active(st)

    @cython.boundscheck(False)
    cdef bytes encode(self, bint split):
        """The document: live part, then the archive it came with. ``split``: the live
        part alone; the archive it came with and the records archived now go to
        ``added``. (Without, nothing is archived now: one document that holds every
        record costs what format 1 did, with no archive to carry along.)"""
        cdef Graph g = self.g
        cdef Py_ssize_t i, n, n_arch = 0
        cdef int a, st
        cdef ActSt* s
        cdef int64_t base = self.started_at
        cdef char* q
        cdef char* count_at
        cdef Py_ssize_t tail_n = (PyBytes_GET_SIZE(self.src) - self.tail_at
                                  if self.src is not None else 0)
        self.splitting = split
        # worst case: 10 bytes a varint; an action's record is at most 112 bytes and
        # its result text; the archive came in as it goes out
        cdef Py_ssize_t need = (16 + 50 + 50 + self.t_job.n + self.t_scope.n + self.t_reason.n
                                + self.t_order.n + self.t_params.n + 30 + 10 * self.n_active
                                + 20 * self.n_rsteps + 20 * g.n_branches + 30 + tail_n)
        for i in range(self.n_live):
            s = &self.acts[self.live[i]]
            need += 112 + (s.res_len if s.res_len > 0 else 0)
        if split:
            for i in range(self.n_live):
                if self.archivable(self.live[i]) and not (self.amark[self.live[i]] & AM_ARCH):
                    n_arch += 1
            for i in range(self.n_rsteps):
                if self.step_archivable(self.rsteps[i]):
                    n_arch += 1
        if need > self.buf_cap:
            q = <char*>PyMem_Realloc(self.buf, need)
            if q == NULL:
                raise MemoryError()
            self.buf = q
            self.buf_cap = need
        self.arch_n += n_arch
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
        q = _w_u(q, <uint64_t>self.arch_n)
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
        for i in range(self.n_rsteps):
            st = self.rsteps[i]
            if not self.step_archivable(st):
                q = _w_u(q, <uint64_t>st)
                q = _w_u(q, <uint64_t>self.step_round[st])
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
        for i in range(self.n_live):
            a = self.live[i]
            if self.acts[a].phase == PH_IDLE or self.archivable(a):
                continue
            n += 1
            q = _w_u(q, <uint64_t>a)
            q = _w_act(q, &self.acts[a], base)
        q = _close_list(count_at, q, n)
        cdef Py_ssize_t live_end = q - self.buf
        if tail_n:
            memcpy(q, PyBytes_AS_STRING(self.src) + self.tail_at, tail_n)
            q += tail_n
        if n_arch:
            for i in range(self.n_rsteps):
                st = self.rsteps[i]
                if self.step_archivable(st):
                    q = _w_u(q, ((<uint64_t>st) << 1) | 1)
                    q = _w_u(q, <uint64_t>self.step_round[st])
            for i in range(self.n_live):
                a = self.live[i]
                if self.archivable(a) and not (self.amark[a] & AM_ARCH):
                    q = _w_u(q, (<uint64_t>a) << 1)
                    q = _w_act(q, &self.acts[a], base)
        if not split:
            self.added = None
            return PyBytes_FromStringAndSize(self.buf, q - self.buf)
        self.added = (PyBytes_FromStringAndSize(self.buf + live_end, q - self.buf - live_end)
                      if q - self.buf > live_end else _EMPTY_BYTES)
        return PyBytes_FromStringAndSize(self.buf, live_end)

    cdef void release(self) noexcept:
        """Hand this State back to its graph for the next call; it is not used after.
        Only the slots the call set are cleared: the cost follows the live records."""
        cdef Graph g = self.g
        cdef Py_ssize_t i
        cdef int a
        if g is None:
            return
        if g.n_actions <= _SMALL:
            # a small recipe: one block copy beats the loop over the live slots
            memcpy(self.acts, _IDLES, g.n_actions * sizeof(ActSt))
            memset(self.amark, 0, g.n_actions)
        else:
            for i in range(self.n_live):
                a = self.live[i]
                self.acts[a] = _IDLE
                self.amark[a] = 0
        self.n_live = 0
        if g.n_steps <= 4 * _SMALL:
            memset(self.step_round, 0, g.n_steps * sizeof(int32_t))
        else:
            for i in range(self.n_rsteps):
                self.step_round[self.rsteps[i]] = 0
        self.n_rsteps = 0
        for i in range(g.n_branches):
            self.br_ended[i] = -1
        self.src = None
        self.added = None
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


cdef bytes _EMPTY_BYTES = b""

cdef enum:
    _SMALL = 16

cdef ActSt _IDLES[_SMALL]         # idle slots, copied in one block by release()


cdef inline char* _w_act(char* q, ActSt* s, int64_t base) noexcept:
    """An action's record after its index: phase byte, outcome byte, then varints."""
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
        return q + 1
    # length + 1 so that 0 means "no result" and an empty text stays distinct
    q = _w_u(q, <uint64_t>(s.res_len + 1))
    memcpy(q, s.res, s.res_len)
    return q + s.res_len


cdef inline void _reset_act(ActSt* a) noexcept:
    memset(a, 0, sizeof(ActSt))
    a.deadline = NO_TIME
    a.hold_deadline = NO_TIME
    a.timer = NO_TIME
    a.since = NO_TIME
    a.done_at = NO_TIME
    a.res_len = -1


_reset_act(&_IDLE)
for _i in range(_SMALL):
    _IDLES[_i] = _IDLE


cdef State acquire_state(Graph g):
    """A blank State for ``g``: the one parked on the graph (cleared by its release),
    else a new one."""
    cdef State s = <State>g._scratch if g._scratch is not None else None
    cdef Py_ssize_t i
    cdef char* block
    cdef Py_ssize_t na = g.n_actions, ns = g.n_steps
    if s is not None:
        g._scratch = None
    else:
        pins = _graph_pins(g)
        s = State.__new__(State)
        s.keep = []
        block = <char*>PyMem_Malloc((na + 1) * sizeof(ActSt)
                                    + (na + 3 * ns + g.n_branches + 4) * sizeof(int32_t)
                                    + na + 1)
        if block == NULL:
            raise MemoryError()
        s.acts = <ActSt*>block
        for i in range(na):
            s.acts[i] = _IDLE
        s.step_round = <int32_t*>(block + (na + 1) * sizeof(ActSt))
        memset(s.step_round, 0, ns * sizeof(int32_t))
        s.rsteps = s.step_round + (ns + 1)
        s.active = s.rsteps + (ns + 1)
        s.br_ended = s.active + (ns + 1)
        for i in range(g.n_branches):
            s.br_ended[i] = -1
        s.live = s.br_ended + (g.n_branches + 1)
        s.amark = <uint8_t*>(s.live + na)
        memset(s.amark, 0, na)
        s.pin = <const uint8_t*>PyBytes_AS_STRING(pins)   # the graph keeps the bytes
    s.g = g
    s.n_active = 0
    s.n_live = 0
    s.n_rsteps = 0
    s.tail_at = 0
    s.arch_n = 0
    s.arch_read = 0
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


cdef State decode_state(Graph g, object data, bint full=False):
    """The State of a document. Its archive records are loaded only when ``full``
    (tools); otherwise they are checked and left where they are (``tail_at``)."""
    if not isinstance(data, bytes):
        if isinstance(data, (bytearray, memoryview)):
            data = bytes(data)
        else:
            raise StateFormatError(f"a state document is bytes, not {type(data).__name__}")
    cdef bytes raw = <bytes>data
    cdef Py_ssize_t size = PyBytes_GET_SIZE(raw)
    cdef const char* p = PyBytes_AS_STRING(raw)
    cdef int major = _check_header(g, p, size)
    cdef State s = acquire_state(g)
    s.status = <uint8_t>p[5]
    s.flags = <uint8_t>p[6]
    s.src = raw
    # The reader is a local whose address goes only to inline functions, so that it
    # stays in registers (see _get_u).
    cdef Rd r
    r.p = p
    r.n = size
    r.i = 16
    r.bad = False
    _read_head(&r, s, g, major)
    if r.bad:
        s.release()
        raise StateFormatError("state document is truncated or corrupt (header fields)")
    _read_steps(&r, s, g)
    s.arch_read = _read_records(&r, s, g, major, full)
    if r.bad or r.i != r.n or s.arch_read > s.arch_n:
        s.release()
        raise StateFormatError("state document is truncated or corrupt")
    return s


cdef inline int _check_header(Graph g, const char* p, Py_ssize_t size) except -1:
    """The format major of a document of g's; StateFormatError for anything else."""
    if size < 16 or p[0] != b'S' or p[1] != b'F' or p[2] != b'S':
        raise StateFormatError("not a job state document (bad magic)")
    if size > _MAX_BYTES:
        raise StateFormatError(f"state document of {size} bytes is over the limit")
    cdef int major = <uint8_t>p[3]
    if major != STATE_FORMAT_MAJOR and major != 1:
        raise StateFormatError(
            f"state format {major}.{<uint8_t>p[4]} is not readable by this version, which "
            f"reads {STATE_FORMAT_MAJOR}.x; upgrade sfc-fast" if major > STATE_FORMAT_MAJOR
            else f"state format {major}.x is too old for this version")
    if <uint8_t>p[5] > ST_STOPPED or <uint8_t>p[6] > 3:
        raise StateFormatError("state header has an unknown status or flag")
    if memcmp8(p + 8, PyBytes_AS_STRING(g._blob) + 12) != 0:
        raise StateFormatError("state belongs to another recipe graph (fingerprint differs)")
    return major


cdef inline int _read_head(Rd* r, State s, Graph g, int major) except -1:
    """The job's fields after the fixed header: times, counters and texts."""
    cdef int64_t base = <int64_t>_get_count(r, (<int64_t>1) << 53)
    s.started_at = base
    s.held_at = _get_time(r, base)
    s.cmd_counter = _get_count(r, (<int64_t>1) << 40)
    s.last_exit = <int32_t>_get_count(r, g.n_steps) - 1
    if major >= 2:
        s.arch_n = _get_count(r, (<int64_t>1) << 40)
    _get_txt(r, &s.t_job)
    _get_txt(r, &s.t_scope)
    _get_txt(r, &s.t_reason)
    _get_txt(r, &s.t_order)
    _get_txt(r, &s.t_params)
    if r.bad:
        return 0
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
    return 0


cdef inline int _read_steps(Rd* r, State s, Graph g) except -1:
    """The active steps, the steps' rounds (ascending, as encode writes them: each is
    appended) and the paths ended of each active branch."""
    cdef int64_t i, n, k, v
    n = _get_count(r, g.n_steps)
    for i in range(n):
        k = _get_count(r, g.n_steps - 1)
        if r.bad:
            break
        s.add_active(<int32_t>k)
    n = _get_count(r, g.n_steps)
    for i in range(n):
        k = _get_count(r, g.n_steps - 1)
        v = _get_count(r, 0x7FFFFFFF)
        if r.bad or v == 0 or (s.n_rsteps and s.rsteps[s.n_rsteps - 1] >= k):
            r.bad = True
            break
        s.rsteps[s.n_rsteps] = <int32_t>k
        s.n_rsteps += 1
        s.step_round[k] = <int32_t>v
    n = _get_count(r, g.n_branches)
    for i in range(n):
        k = _get_count(r, g.n_branches - 1 if g.n_branches else 0)
        v = _get_count(r, 0x7FFFFFFF)
        if r.bad or g.n_branches == 0:
            r.bad = True
            break
        s.br_ended[k] = <int32_t>v
    return 0


cdef inline int64_t _read_records(Rd* r, State s, Graph g, int major,
                                  bint full) except -1:
    """The live records (counted, ascending: each appended to the live list), then for
    format 2 the archive records to the end; returns how many archive records it read.
    One loop, so that a record is parsed by one piece of inline code (_read_record)."""
    cdef int64_t n = _get_count(r, g.n_actions), i = 0, k, v, count = 0
    cdef int64_t base = s.started_at
    cdef bint archive = False
    cdef bint load = False
    cdef uint64_t tag
    cdef ActSt scratch
    cdef ActSt* a
    cdef set live_steps = None
    while not r.bad:
        if not archive:
            if i == n:
                s.tail_at = r.i
                if major == 1 or r.i == r.n:
                    break
                archive = True
                load = full
                if load:
                    live_steps = {s.rsteps[j] for j in range(s.n_rsteps)}
                continue
            i += 1
            k = _get_count(r, g.n_actions - 1 if g.n_actions else 0)
            if r.bad or g.n_actions == 0 or (s.n_live and s.live[s.n_live - 1] >= k):
                r.bad = True
                break
            a = &s.acts[k]
            s.amark[k] = AM_LIVE
            s.live[s.n_live] = <int32_t>k
            s.n_live += 1
        else:
            if r.i >= r.n:
                break
            tag = _get_u(r)
            k = <int64_t>(tag >> 1)
            count += 1
            if tag & 1:
                # a step's round
                v = _get_count(r, 0x7FFFFFFF)
                if r.bad or k >= g.n_steps or v == 0:
                    r.bad = True
                    break
                if load and k not in live_steps:
                    if s.step_round[k] == 0:
                        s.n_rsteps = _insert_sorted(s.rsteps, s.n_rsteps, <int32_t>k)
                    s.step_round[k] = <int32_t>v
                continue
            if r.bad or k >= g.n_actions:
                r.bad = True
                break
            if not load or (s.amark[k] & (AM_LIVE | AM_ARCH)) == AM_LIVE:
                a = &scratch                     # checked only, or a live one wins
            else:
                a = s.act(<int>k)
                s.amark[k] |= AM_ARCH
        _read_record(r, a, base)
    return count


cdef inline void _read_record(Rd* r, ActSt* a, int64_t base) noexcept:
    """An action's record after its index (see _w_act); marks the reader bad if it is
    not one. The result stays a view into the document."""
    cdef uint8_t b1, b2
    cdef int64_t v
    cdef Py_ssize_t rl
    if r.i + 2 > r.n:
        r.bad = True
        return
    b1 = <uint8_t>r.p[r.i]
    b2 = <uint8_t>r.p[r.i + 1]
    r.i += 2
    a.phase = b1 & 0x0F
    a.hold = b1 >> 4
    a.outcome = b2 & 0x0F
    a.flags = b2 >> 4
    if a.phase == PH_IDLE or a.phase > PH_WAIT_EXIT or a.hold > HP_NOT_HELD \
            or a.outcome > OC_LIMITED:
        r.bad = True
        return
    a.attempt = <int32_t>_get_count(r, 0x7FFFFFFF)
    a.round = <int32_t>_get_count(r, 0x7FFFFFFF)
    a.cmd_n = _get_count(r, (<int64_t>1) << 40)
    a.hold_n = _get_count(r, (<int64_t>1) << 40)
    a.deadline = _get_time(r, base)
    a.hold_deadline = _get_time(r, base)
    a.timer = _get_time(r, base)
    a.since = _get_time(r, base)
    a.done_at = _get_time(r, base)
    v = _get_count(r, r.n)
    if r.bad:
        return
    if v == 0:
        a.res = NULL
        a.res_len = -1
        return
    rl = <Py_ssize_t>(v - 1)
    if rl > r.n - r.i:
        r.bad = True
        return
    a.res = r.p + r.i
    a.res_len = rl
    r.i += rl


cdef inline int memcmp8(const char* a, const char* b) noexcept:
    cdef int i
    for i in range(8):
        if a[i] != b[i]:
            return 1
    return 0


# ---------------------------------------------------------------- Python-facing

cdef object _time(int64_t t):
    return None if t == NO_TIME else t


def join_state(state, archive) -> bytes:
    """The whole document of a live part kept apart from its archive records (those a
    Decision's ``archived`` gave, in order): what ``state_to_json`` shows in full."""
    if not archive:
        return bytes(state)
    if len(state) < 16 or state[3] < 2:
        raise StateFormatError("archive records belong to a format 2 document")
    return bytes(state) + bytes(archive)


def state_to_json(Graph graph, state) -> dict:
    """The readable view of a state document, for tools and logs (not the hot path).
    ``archived_missing``: archive records the document counts but does not hold (they
    were kept apart: ``join_state``)."""
    cdef State s = decode_state(graph, state, True)
    cdef Graph g = graph
    cdef int a
    cdef ActSt* x
    actions = {}
    cdef Py_ssize_t i
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
        "format": f"{<uint8_t>s.src[3]}.{<uint8_t>s.src[4]}",
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
    if s.arch_n > s.arch_read:
        view["archived_missing"] = s.arch_n - s.arch_read
    s.release()
    return view


def action_results(Graph graph, state) -> tuple:
    """``(job id, started ms, [(action name, result JSON bytes), ...])`` of a state
    document (its archive records included), in action order: what a job response
    lists, without building the whole readable view (``state_to_json``) of a job that
    ends."""
    cdef State s = decode_state(graph, state, True)
    cdef Graph g = graph
    cdef int a
    cdef ActSt* x
    out = []
    try:
        for a in range(g.n_actions):
            x = &s.acts[a]
            if x.phase == PH_IDLE or x.res_len < 0:
                continue
            out.append((g.s(g.act_name[a]), PyBytes_FromStringAndSize(x.res, x.res_len)))
        return s.job(), s.started_at, out
    finally:
        s.release()


def check_state(Graph graph, state) -> None:
    """Raise StateFormatError unless ``state`` decodes against ``graph`` (its archive
    records included)."""
    decode_state(graph, state, True).release()
