# cython: language_level=3, binding=False
"""``evolve``: the pure step of a job. State bytes and an event in, a Decision out.

No clock, no I/O: ``now_ms`` comes in as an argument and everything the host has to do
comes out as data (work entries, commands, job order transitions, index changes).
The rules are docs/execution.md (their reasons: docs/design.md#execution-rules); each is
named where it is kept.
"""

from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memcmp, memcpy
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.list cimport PyList_GET_ITEM, PyList_New, PyList_SET_ITEM
from cpython.object cimport PyObject, PyTypeObject
from cpython.ref cimport Py_DECREF, Py_INCREF
from cpython.unicode cimport PyUnicode_AsUTF8, PyUnicode_DecodeUTF8, PyUnicode_Substring

cimport cython


from sfc_fast._text cimport (
    PyUnicode_DATA, PyUnicode_GET_LENGTH, PyUnicode_IS_ASCII, PyUnicode_KIND, PyUnicode_New,
    PyUnicode_READ, ascii_only, utf8_view,
)

from sfc_fast.canonical cimport flat_canonical, put_int
from sfc_fast.graph cimport (
    Graph, Q_N, Q_P, Q_P1, Q_P0, Q_S, Q_R, Q_L, Q_D, I_PUSH, I_PULL,
    B_SELECTION, B_SIMULTANEOUS, TK_ENTRY, TK_EXIT, TK_IMPLICIT, TK_PATH_END,
)
from sfc_fast.conditions cimport (
    CondContext, truthy, REF_RESULT, REF_ROUND, REF_OUTCOME, REF_JOB, REF_BARE,
)
from sfc_fast.state cimport (
    State, ActSt, NO_TIME, decode_state, new_state,
    ST_RUNNING, ST_COMPLETED, ST_ABORTED, ST_STOPPED, JF_HELD, JF_ENDING,
    PH_IDLE, PH_DELAYED, PH_OPEN, PH_DONE, PH_WAIT_EXIT,
    OC_NONE, OC_COMPLETED, OC_FAILED, OC_TIMEOUT, OC_CANCELLED, OC_LIMITED,
    HP_NONE, HP_OPEN, HP_HELD, HP_NOT_HELD, AF_RESTART, AF_ABORT_PENDING, AM_LIVE,
)
from sfc_fast.events cimport (
    BaseEvent, Start, Completed, Failed, Held, NotHeld, Event, Tick, Cancel, Shift,
    EV_START, EV_COMPLETED, EV_FAILED, EV_HELD, EV_NOT_HELD, EV_EVENT, EV_TICK, EV_CANCEL,
    EV_HOLD, EV_RELEASE, EV_RESUME, EV_SHIFT,
)

import gc
import json

from sfc_fast.conditions import canonical_dumps

cdef enum:
    _MAX_ENTRIES = 10_000

#: Step entries one evolve call may make before the recipe is judged to loop without
#: waiting (a cycle of steps with no holding action and true conditions).
MAX_ENTRIES_PER_CALL = _MAX_ENTRIES

STATUS_RUNNING = "running"
STATUS_HELD = "held"
# C-level module variables: read on every call without a globals lookup
cdef str _HELD = STATUS_HELD
cdef tuple _STATUS = ("running", "completed", "aborted", "stopped")
cdef tuple _OUTCOMES = (None, "completed", "failed", "timeout", "cancelled", "limited")
# how an attempt or a hold ended (Decision.ended): the outcomes, and two more
cdef enum:
    OC_RESTARTED = 6     # held work, issued again as a restart
    OC_RELEASED = 7      # the job's hold, released
cdef tuple _ENDINGS = _OUTCOMES + ("restarted", "released")
cdef tuple _EMPTY = ()
cdef tuple _JOB_TR = ("Run", "Abort", "Complete")
cdef bytes _NO_BYTES = b""


@cython.freelist(16)
@cython.no_gc
cdef class Command:
    """A command to send to equipment: the work of a push action, a hold or a restart.

    The id is made with the command; the other fields are read from the graph and the
    command's C record when asked for (most callers read only a few)."""

    @property
    def action(self) -> str:
        return self._g.s(self._g.act_name[self._e.action])

    @property
    def type_id(self) -> str:
        cdef Graph g = self._g
        cdef int a = self._e.action
        if self._e.code & EF_HOLD:
            return g.s(g.act_hold_type[a])
        if self._e.code & EF_RESTART:
            return g.s(g.act_restart_type[a])
        return g.s(g.act_type[a])

    @property
    def parameters(self):
        # one object per action and graph, shared by its commands (never mutated here)
        return self._g.params(self._e.action)

    @property
    def deadline_ms(self):
        return None if self._e.deadline == NO_TIME else self._e.deadline

    @property
    def hold(self) -> bool:
        return (self._e.code & EF_HOLD) != 0

    @property
    def restart(self) -> bool:
        return (self._e.code & EF_RESTART) != 0

    @property
    def attempt(self) -> int:
        return self._e.attempt

    @property
    def job(self) -> str:
        if self._job is None:
            self._job = PyUnicode_DecodeUTF8(PyBytes_AS_STRING(self._src) + self._at.job_at,
                                             self._at.job_len, NULL)
        return self._job

    @property
    def scope(self) -> str:
        if self._scope is None:
            self._scope = PyUnicode_DecodeUTF8(
                PyBytes_AS_STRING(self._src) + self._at.scope_at, self._at.scope_len, NULL)
        return self._scope

    def __repr__(self) -> str:
        kind = " hold" if self.hold else (" restart" if self.restart else "")
        return (f"Command({self.command_id!r}{kind}, type_id={self.type_id!r}, "
                f"deadline_ms={self.deadline_ms})")

    def __reduce__(self):
        # plain values: pickle and copy work as they did when every field was stored
        return (_restore_command, (self._g, self._e.action, self._e.code, self._e.attempt,
                                   self._e.n, self._e.deadline, self.job, self.scope))

    def to_dict(self) -> dict:
        return {"command_id": self.command_id, "action": self.action,
                "type_id": self.type_id, "parameters": self.parameters,
                "deadline_ms": self.deadline_ms, "hold": self.hold, "restart": self.restart,
                "job": self.job, "scope": self.scope, "attempt": self.attempt}


cdef inline void _copy(char* w, const char* p, Py_ssize_t n) noexcept:
    """memcpy for the short texts of an id: fixed-size moves, no call, up to 16 bytes."""
    cdef uint64_t a8, b8
    cdef uint32_t a4, b4
    if n >= 8:
        if n > 16:
            memcpy(w, p, n)
            return
        memcpy(&a8, p, 8)                   # two overlapping words cover 8..16 bytes
        memcpy(&b8, p + n - 8, 8)
        memcpy(w, &a8, 8)
        memcpy(w + n - 8, &b8, 8)
    elif n >= 4:
        memcpy(&a4, p, 4)
        memcpy(&b4, p + n - 4, 4)
        memcpy(w, &a4, 4)
        memcpy(w + n - 4, &b4, 4)
    else:
        if n > 0:
            w[0] = p[0]
            w[n - 1] = p[n - 1]
            if n == 3:
                w[1] = p[1]


cdef str _cid(Graph g, const char* job, Py_ssize_t lj, bint job_ascii, int a, int64_t n,
              bint hold):
    """``{job}:{action}#{n}`` (``:hold`` appended for a hold), built in C."""
    cdef int32_t sid = g.act_name[a]
    cdef const char* name = g.str_data + g.str_off[sid]
    cdef Py_ssize_t ln = g.str_off[sid + 1] - g.str_off[sid]
    cdef char digits[24]
    cdef Py_ssize_t nd
    if 0 <= n < 10:             # most attempts of most jobs
        digits[0] = <char>(48 + n)
        nd = 1
    else:
        nd = put_int(digits, n)
    cdef Py_ssize_t size = lj + ln + 2 + nd + (5 if hold else 0)
    cdef str out
    cdef char* q
    if job_ascii and ascii_only(name, ln):
        # the usual case: written straight into a new ASCII str
        out = PyUnicode_New(size, 127)
        q = <char*>PyUnicode_DATA(out)
    else:
        out = None
        q = <char*>PyMem_Malloc(size)
        if q == NULL:
            raise MemoryError()
    cdef char* w = q
    _copy(w, job, lj)
    w += lj
    w[0] = b':'
    w += 1
    _copy(w, name, ln)
    w += ln
    w[0] = b'#'
    w += 1
    _copy(w, digits, nd)
    w += nd
    if hold:
        memcpy(w, b":hold", 5)
    if out is None:
        try:
            out = PyUnicode_DecodeUTF8(q, size, "replace")
        finally:
            PyMem_Free(q)
    return out


cpdef str job_of_command(str command_id):
    """The job id a command id names (as ``_cid`` builds it: ``{job}:{action}#{n}``,
    maybe ``:hold``), or ''."""
    cdef Py_ssize_t n = PyUnicode_GET_LENGTH(command_id)
    cdef Py_ssize_t h, c
    cdef int kind = PyUnicode_KIND(command_id)
    cdef void* data = PyUnicode_DATA(command_id)
    # scanned in place (no slices): the last '#', then the ':' before it
    if command_id.endswith(":hold"):
        n -= 5
    h = n - 1
    while h > 0 and PyUnicode_READ(kind, data, h) != u'#':
        h -= 1
    if h <= 0:
        return ""
    c = h - 1
    while c > 0 and PyUnicode_READ(kind, data, c) != u':':
        c -= 1
    if c <= 0:
        return ""
    return PyUnicode_Substring(command_id, 0, c)


cdef Command _command(Graph g, Eff* e, str job, str scope, bytes src, Texts* at):
    """A Command of effect ``e``: job and scope given as str, or found in ``src`` at ``at``."""
    cdef Command c = Command.__new__(Command)
    cdef Py_ssize_t lj
    cdef const char* jp
    cdef bint job_ascii
    if job is not None:
        jp = utf8_view(job, &lj)
        job_ascii = PyUnicode_IS_ASCII(job)
    else:
        # a job text left in the state bytes is ASCII: decode_state makes a str of the rest
        jp = PyBytes_AS_STRING(src) + at.job_at
        lj = at.job_len
        job_ascii = True
    c.command_id = _cid(g, jp, lj, job_ascii, e.action, e.n, (e.code & EF_HOLD) != 0)
    c._g = g
    c._e = e[0]
    c._job = job
    c._scope = scope
    if job is None or scope is None:
        c._src = src
        c._at = at[0]
    return c


@cython.freelist(16)
@cython.no_gc
cdef class Decision:
    """What one evolve call decided. ``applied`` False: absorbed, nothing to write.

    ``work``, ``commands``, ``job`` and ``next_deadline`` are built from C records on
    first read (and kept), so a caller that only stores the state pays for no objects.
    """

    cdef int set_effs(self, Eff* effs, Py_ssize_t n) except -1:
        # more than fit inline live in a bytes object, so that no __dealloc__ is needed
        # (Cython wraps every __dealloc__ in an exception save and restore)
        if n <= 2:
            self._effs = self._inl
        else:
            self._more = PyBytes_FromStringAndSize(NULL, n * sizeof(Eff))
            self._effs = <Eff*>PyBytes_AS_STRING(self._more)
        memcpy(self._effs, effs, n * sizeof(Eff))
        self._n_effs = n
        return 0

    @property
    def commands(self) -> list:
        cdef Py_ssize_t i, n = 0
        cdef list out
        if self._commands is None:
            for i in range(self._n_effs):
                if self._effs[i].action >= 0 and not self._effs[i].code & EF_ENDED:
                    n += 1
            out = PyList_New(n)         # sized once, filled in place
            n = 0
            for i in range(self._n_effs):
                if self._effs[i].action >= 0 and not self._effs[i].code & EF_ENDED:
                    c = _command(self._g, &self._effs[i], self._job, self._scope,
                                 self.state, &self._at)
                    Py_INCREF(c)
                    PyList_SET_ITEM(out, n, c)
                    n += 1
            self._commands = out
        return self._commands

    @property
    def work(self) -> list:
        cdef Py_ssize_t i, k = 0
        cdef Command c
        if self._work is None:
            out = []
            cmds = self.commands
            for i in range(self._n_effs):
                if self._effs[i].code & EF_ENDED:
                    continue
                if self._effs[i].action >= 0:
                    c = <Command>cmds[k]
                    k += 1
                    name = c.action
                    out.append(("dispatch:" + name, name, c.command_id))
                else:
                    out.append(("job", _JOB_TR[self._effs[i].code], ""))
            self._work = out
        return self._work

    @property
    def job(self) -> tuple:
        cdef Py_ssize_t i
        if self._job_tr is None:
            self._job_tr = tuple([_JOB_TR[self._effs[i].code] for i in range(self._n_effs)
                                  if self._effs[i].action < 0
                                  and not self._effs[i].code & EF_ENDED])
        return self._job_tr

    @property
    def ended(self) -> list:
        """What this call ended, in order: each action's attempt (an answer, a timeout
        that retries or fails, a cancel, held work restarted) and the job's hold, as
        ``(action, command_id, type_id, attempt, round, since_ms, outcome)``. A pull
        action's wait has no command id; the hold has no action (``None``) and
        outcome ``released`` or ``cancelled``. Made when read: a caller that does not
        trace pays for no objects."""
        cdef Py_ssize_t i
        cdef Eff* e
        cdef Graph g = self._g
        out = []
        for i in range(self._n_effs):
            e = &self._effs[i]
            if not e.code & EF_ENDED:
                continue
            outcome = _ENDINGS[e.code >> EF_OUTCOME_SHIFT]
            if e.action < 0:
                out.append((None, None, "", 0, 0, e.deadline, outcome))
                continue
            if e.n > 0:
                c = _command(g, e, self._job, self._scope, self.state, &self._at)
                out.append((c.action, c.command_id, c.type_id, e.attempt, e.round,
                            e.deadline, outcome))
            else:
                out.append((g.s(g.act_name[e.action]), None, g.s(g.act_type[e.action]),
                            e.attempt, e.round, e.deadline, outcome))
        return out

    @property
    def next_deadline(self):
        return None if self._next == NO_TIME else self._next

    def __reduce__(self):
        cdef Py_ssize_t i
        effs = tuple([(self._effs[i].action, self._effs[i].code, self._effs[i].attempt,
                       self._effs[i].n, self._effs[i].deadline, self._effs[i].round)
                      for i in range(self._n_effs)])
        job, scope = self._job, self._scope
        if self._n_effs and job is None:
            # the texts are in the state's bytes (every effect's command reads them there)
            job = PyUnicode_DecodeUTF8(PyBytes_AS_STRING(self.state) + self._at.job_at,
                                       self._at.job_len, NULL)
            scope = PyUnicode_DecodeUTF8(PyBytes_AS_STRING(self.state) + self._at.scope_at,
                                         self._at.scope_len, NULL)
        return (_restore_decision, (self._g, self.applied, self.state, self.status,
                                    self.reason, self.waits_added, self.waits_removed,
                                    self._next, effs, job, scope, self.archived))

    def __repr__(self) -> str:
        return (f"Decision(applied={self.applied}, status={self.status!r}, "
                f"reason={self.reason!r}, work={self.work!r}, job={self.job!r}, "
                f"next_deadline={self.next_deadline!r})")


# ---------------------------------------------------------------- fast attributes
#
# Cython serves `cdef readonly` object fields through getset descriptors, which
# CPython's attribute cache does not specialize; member descriptors (T_OBJECT_EX) it
# does, so a caller's `d.state` or `c.command_id` becomes a load at a fixed offset.
# The offsets come from the generated structs: a rename there fails the C build.

cdef extern from *:
    """
    #include <structmember.h>
    #define SFC_OFF_COMMAND(f) offsetof(struct __pyx_obj_8sfc_fast_6evolve_Command, f)
    #define SFC_OFF_DECISION(f) offsetof(struct __pyx_obj_8sfc_fast_6evolve_Decision, f)
    """
    ctypedef struct PyMemberDef:
        const char* name
        int type
        Py_ssize_t offset
        int flags
        const char* doc
    int T_OBJECT_EX
    int READONLY
    Py_ssize_t _OFF_COMMAND_ID "SFC_OFF_COMMAND(command_id)"
    Py_ssize_t _OFF_STATE "SFC_OFF_DECISION(state)"
    Py_ssize_t _OFF_STATUS "SFC_OFF_DECISION(status)"
    Py_ssize_t _OFF_REASON "SFC_OFF_DECISION(reason)"
    Py_ssize_t _OFF_ADDED "SFC_OFF_DECISION(waits_added)"
    Py_ssize_t _OFF_REMOVED "SFC_OFF_DECISION(waits_removed)"
    object PyDescr_NewMember(PyTypeObject* t, PyMemberDef* m)
    void PyType_Modified(PyTypeObject* t)


cdef PyMemberDef _members[6]     # static: the descriptors point into it for good


cdef int _as_member(type t, int i, str name, Py_ssize_t off) except -1:
    cdef PyTypeObject* tp = <PyTypeObject*>t
    _members[i].name = PyUnicode_AsUTF8(name)   # interned literal: lives as long as we do
    _members[i].type = T_OBJECT_EX
    _members[i].offset = off
    _members[i].flags = READONLY
    _members[i].doc = NULL
    (<dict>(<object>tp.tp_dict))[name] = PyDescr_NewMember(tp, &_members[i])
    PyType_Modified(tp)
    return 0


_as_member(Command, 0, "command_id", _OFF_COMMAND_ID)
_as_member(Decision, 1, "state", _OFF_STATE)
_as_member(Decision, 2, "status", _OFF_STATUS)
_as_member(Decision, 3, "reason", _OFF_REASON)
_as_member(Decision, 4, "waits_added", _OFF_ADDED)
_as_member(Decision, 5, "waits_removed", _OFF_REMOVED)


# ---------------------------------------------------------------- conditions

cdef inline object _lookup(object value, tuple segs):
    """conditions.lookup_path without the Python call: a missing key or non-object is null."""
    for seg in segs:
        if type(value) is not dict:
            return None
        value = (<dict>value).get(seg)
    return value


cdef enum:
    FILLED_MAX = 8

cdef struct Filled:
    int32_t a[FILLED_MAX]        # result slots filled in this call
    int n


@cython.final    # direct calls, not through the vtable: gcc can inline the small ones
cdef class _Ctx(CondContext):
    """Resolves condition references against a job's state."""
    cdef Graph g
    cdef State s
    cdef list refs
    cdef int32_t src_step         # source step for bare names; -1 none
    cdef list results             # the _Run's: action -> parsed result, or _UNSET
    cdef Filled filled            # slots it filled (the _Run clears them at park)
    cdef list bare_order          # action indices of the source step, newest first

    cdef object result(self, int a):
        cdef ActSt* x = &self.s.acts[a]
        if x.res_len < 0:
            return None
        v = <object>PyList_GET_ITEM(self.results, a)
        if v is _UNSET:
            try:
                v = json.loads(PyUnicode_DecodeUTF8(x.res, x.res_len, NULL))
            except ValueError:
                v = None
            self.results[a] = v
            _note_filled(&self.filled, a)
        return v

    cdef object load(self, int32_t ref):
        cdef Graph g = self.g
        cdef int kind = g.ref_kind[ref]
        cdef int a = g.ref_action[ref]
        cdef ActSt* x
        if kind == REF_RESULT:
            v = self.result(a)
            return None if v is None else _lookup(v, <tuple>(<tuple>self.refs[ref])[2])
        if kind == REF_ROUND:
            return self.s.step_round[g.act_step[a]]
        if kind == REF_OUTCOME:
            x = &self.s.acts[a]
            if x.phase == PH_OPEN or x.phase == PH_DELAYED or x.phase == PH_WAIT_EXIT:
                return "open"
            return _OUTCOMES[x.outcome]
        cdef tuple segs = <tuple>(<tuple>self.refs[ref])[2]
        if kind == REF_JOB:
            return _lookup(self.s.params_obj(), segs)
        # bare name: the source step's results, newest first, then job parameters
        head = segs[0]
        if self.bare_order is None:
            self.bare_order = self._bare_order()
        for a in self.bare_order:
            res = self.result(a)
            if type(res) is dict and head in <dict>res:
                return _lookup(res, segs)
        return _lookup(self.s.params_obj(), segs)

    cdef list _bare_order(self):
        cdef Graph g = self.g
        cdef list items = []
        cdef int k, a
        if self.src_step < 0:
            return items
        for k in range(g.step_act_off[self.src_step], g.step_act_off[self.src_step + 1]):
            a = g.step_acts[k]
            if g.act_qual[a] == Q_R:
                a = g.act_reset[a]
            if self.s.acts[a].res_len >= 0:
                items.append((self.s.acts[a].done_at, a))
        items.sort(reverse=True)
        return [a for _, a in items]


cdef object _UNSET = object()     # a result slot not filled in this call


cdef inline void _unset(list slots, Py_ssize_t i) noexcept:
    cdef PyObject* v = PyList_GET_ITEM(slots, i)
    if v != <PyObject*>_UNSET:
        Py_INCREF(_UNSET)
        PyList_SET_ITEM(slots, i, _UNSET)
        Py_DECREF(<object>v)


cdef inline void _note_filled(Filled* f, int a) noexcept:
    if f.n < FILLED_MAX:
        f.a[f.n] = a
    f.n += 1                     # past FILLED_MAX: clear them all


cdef void _clear_filled(list slots, Filled* f) noexcept:
    """Put _UNSET back in the slots ``f`` names (all of them if it lost count); a call
    fills one or two, so a big recipe's list is not walked on every call."""
    cdef Py_ssize_t i
    if f.n > FILLED_MAX:
        for i in range(len(slots)):
            _unset(slots, i)
    else:
        for i in range(f.n):
            _unset(slots, f.a[i])
    f.n = 0


cdef str _canonical(dict fields):
    """canonical_dumps of a result or params object: flat ones without the encoder."""
    text = flat_canonical(fields)
    return canonical_dumps(fields) if text is None else text


cdef int _push_action(Graph g, const char* name, Py_ssize_t n) except -2:
    """The push action (stored association) named by the UTF-8 ``name[:n]``, or -1."""
    cdef int a
    cdef int32_t sid
    if g.n_actions > 64:
        found = g.action_names().get(PyUnicode_DecodeUTF8(name, n, NULL))
        a = -1 if found is None else found
    else:
        # a short scan beats hashing a fresh str; last association wins, as in the dict
        a = g.n_actions - 1
        while a >= 0:
            sid = g.act_name[a]
            # length and last byte before memcmp: names often share a prefix, not an end
            if g.act_qual[a] != Q_R and g.str_off[sid + 1] - g.str_off[sid] == n \
                    and (n == 0 or (g.str_data[g.str_off[sid + 1] - 1] == name[n - 1]
                                    and memcmp(g.str_data + g.str_off[sid], name, n) == 0)):
                break
            a -= 1
    if a < 0 or g.act_inter[a] != I_PUSH:
        return -1
    return a


# ---------------------------------------------------------------- one call

@cython.final
cdef class _Run:
    cdef Graph g
    cdef State s
    cdef int64_t now
    cdef Eff inl[4]
    cdef Eff* effs                # the call's effects in order (inl, or grown)
    cdef Py_ssize_t n_effs
    cdef Py_ssize_t cap_effs
    cdef bint changed
    cdef bint waits_dirty         # a pull wait opened or closed, or the status changed
    cdef dict was_open            # pull action -> open before this call (first touch)
    cdef int entries
    cdef _Ctx ctx                 # made on the first condition that needs one
    cdef _Ctx spare_ctx           # kept from an earlier call, reused by make_ctx
    cdef list results             # action -> result object this call (no re-parse), or
                                  # _UNSET; kept across calls, at least n_actions long
    cdef Filled filled

    def __dealloc__(self):
        if self.effs != NULL and self.effs != self.inl:
            PyMem_Free(self.effs)

    cdef int add_eff(self, int32_t action, int32_t code, int32_t attempt, int64_t n,
                     int64_t deadline) except -1:
        cdef Eff* grown
        if self.n_effs == self.cap_effs:
            if self.effs == NULL:
                self.effs = self.inl
                self.cap_effs = 4
            else:
                grown = <Eff*>PyMem_Malloc(2 * self.cap_effs * sizeof(Eff))
                if grown == NULL:
                    raise MemoryError()
                memcpy(grown, self.effs, self.n_effs * sizeof(Eff))
                if self.effs != self.inl:
                    PyMem_Free(self.effs)
                self.effs = grown
                self.cap_effs *= 2
        cdef Eff* e = &self.effs[self.n_effs]
        e.action = action
        e.code = code
        e.attempt = attempt
        e.round = 0
        e.n = n
        e.deadline = deadline
        self.n_effs += 1
        return 0

    cdef int end_attempt(self, int a, int outcome) except -1:
        """Action a's open attempt ends now with ``outcome`` (Decision.ended)."""
        cdef ActSt* x = &self.s.acts[a]
        cdef int32_t code = EF_ENDED | (outcome << EF_OUTCOME_SHIFT)
        if x.flags & AF_RESTART:
            code |= EF_RESTART
        self.add_eff(a, code, x.attempt, x.cmd_n, x.since)
        self.effs[self.n_effs - 1].round = x.round
        return 0

    cdef int end_hold(self, int outcome) except -1:
        """The job's hold ends now with ``outcome`` (Decision.ended)."""
        if (self.s.flags & JF_HELD) and self.s.held_at != NO_TIME:
            self.add_eff(-1, EF_ENDED | (outcome << EF_OUTCOME_SHIFT), 0, 0,
                         self.s.held_at)
        return 0

    cdef int make_ctx(self) except -1:
        cdef _Ctx ctx = self.spare_ctx
        if ctx is None:
            ctx = _Ctx.__new__(_Ctx)
        self.spare_ctx = None
        ctx.g = self.g
        ctx.s = self.s
        ctx.refs = self.g.refs()
        ctx.results = self.result_slots()
        ctx.src_step = -1
        ctx.bare_order = None
        self.ctx = ctx
        return 0

    cdef void park(self) noexcept:
        """Drop this call's references and keep the object for the next call."""
        global _spare_run
        cdef _Ctx ctx = self.ctx
        if ctx is not None:
            if ctx.filled.n:
                _clear_filled(self.results, &ctx.filled)
            ctx.g = None
            ctx.s = None
            ctx.refs = None
            ctx.results = None
            ctx.bare_order = None
            self.spare_ctx = ctx
            self.ctx = None
        self.g = None
        self.s = None
        self.was_open = None
        if self.filled.n:
            _clear_filled(self.results, &self.filled)
        self.n_effs = 0
        _spare_run = self

    cdef int touch(self, int a) except -1:
        """Note a pull action's phase before this call changes it (for the waits diff)."""
        if self.g.act_inter[a] != I_PULL:
            return 0
        if self.was_open is None:
            self.was_open = {}
        if a not in self.was_open:
            self.was_open[a] = self.s.acts[a].phase == PH_OPEN
        self.waits_dirty = True
        return 0

    cdef set waits_before(self):
        """The waited-for types before this call: now, with touched actions as they were."""
        cdef Graph g = self.g
        cdef int a
        cdef Py_ssize_t i
        cdef set out = set()
        for i in range(self.s.n_live):      # every action open before is live now
            a = self.s.live[i]
            if g.act_inter[a] != I_PULL:
                continue
            if self.was_open is not None and a in self.was_open:
                if self.was_open[a]:
                    out.add(g.s(g.act_type[a]))
            elif self.s.acts[a].phase == PH_OPEN:
                out.add(g.s(g.act_type[a]))
        return out

    cdef int keep_result(self, int a, dict result) except -1:
        self.s.set_result(a, _canonical(result))
        self.result_slots()[a] = result
        _note_filled(&self.filled, a)
        return 0

    cdef list result_slots(self):
        cdef list slots = self.results
        if slots is None or len(slots) < self.g.n_actions:
            slots = self.results = [_UNSET] * max(self.g.n_actions, 8)
        return slots

    # ---- effects

    cdef str cmd_id(self, int a, int64_t n):
        return _cid(self.g, self.s.t_job.p, self.s.t_job.n,
                    ascii_only(self.s.t_job.p, self.s.t_job.n), a, n, False)

    cdef int emit(self, int a, int64_t n, bint hold, bint restart,
                  int64_t deadline) except -1:
        return self.add_eff(a, (EF_HOLD if hold else 0) | (EF_RESTART if restart else 0),
                            self.s.acts[a].attempt, n, deadline)

    cdef int job(self, int transition) except -1:
        return self.add_eff(-1, transition, 0, 0, NO_TIME)

    # ---- arming and settling

    cdef int arm(self, int a) except -1:
        """Start an attempt of action a now (qualifier rules decided that it starts)."""
        cdef Graph g = self.g
        cdef ActSt* x = self.s.act(a)
        self.touch(a)
        x.round = self.s.step_round[g.act_step[a]]
        x.attempt = 1
        x.outcome = OC_NONE
        x.hold = HP_NONE
        x.hold_n = 0
        x.hold_deadline = NO_TIME
        x.flags = 0
        x.since = self.now
        x.timer = NO_TIME
        x.phase = PH_OPEN
        x.deadline = self.now + g.act_timeout_ms[a]
        if g.act_qual[a] == Q_L:
            x.timer = self.now + g.act_duration_ms[a]
        if g.act_inter[a] == I_PUSH:
            self.s.cmd_counter += 1
            x.cmd_n = self.s.cmd_counter
            self.emit(a, x.cmd_n, False, False, x.deadline)
        else:
            x.cmd_n = 0
        self.changed = True
        return 0

    cdef int redispatch(self, int a, bint new_attempt) except -1:
        """Retry after a timeout (new id) or send an unsent command again (same id)."""
        cdef Graph g = self.g
        cdef ActSt* x = &self.s.acts[a]
        cdef bint restart = (x.flags & AF_RESTART) != 0
        if new_attempt:
            self.end_attempt(a, OC_TIMEOUT)
            x.attempt += 1
            self.s.cmd_counter += 1
            x.cmd_n = self.s.cmd_counter
            x.flags &= ~AF_RESTART
            restart = False
        x.deadline = self.now + g.act_timeout_ms[a]
        x.since = self.now
        self.emit(a, x.cmd_n, False, restart, x.deadline)
        self.changed = True
        return 0

    cdef int restart(self, int a) except -1:
        """Held work goes on only through a restart: a new attempt of RestartTypeId."""
        cdef Graph g = self.g
        cdef ActSt* x = &self.s.acts[a]
        self.end_attempt(a, OC_RESTARTED)
        self.s.cmd_counter += 1
        x.cmd_n = self.s.cmd_counter
        x.flags |= AF_RESTART
        x.hold = HP_NONE
        x.hold_n = 0
        x.hold_deadline = NO_TIME
        x.deadline = self.now + g.act_timeout_ms[a]
        x.since = self.now
        if g.act_restart_type[a] >= 0:
            self.emit(a, x.cmd_n, False, True, x.deadline)
        else:
            # no restart command declared: the work itself is issued again
            x.flags &= ~AF_RESTART
            self.emit(a, x.cmd_n, False, False, x.deadline)
        self.changed = True
        return 0

    cdef int settle(self, int a, int outcome) except -1:
        cdef ActSt* x = &self.s.acts[a] if self.s.amark[a] & AM_LIVE else self.s.act(a)
        self.touch(a)
        if x.phase == PH_OPEN:
            self.end_attempt(a, outcome)
        x.phase = PH_DONE
        x.outcome = outcome
        x.deadline = NO_TIME
        x.timer = NO_TIME
        x.hold = HP_NONE
        x.hold_deadline = NO_TIME
        x.flags &= ~AF_RESTART
        x.done_at = self.now
        self.changed = True
        return 0

    cdef int withdraw_all(self, bint only_non_holding) except -1:
        """Settle open work as cancelled (later answers are absorbed by id)."""
        cdef Graph g = self.g
        cdef int a, q
        cdef Py_ssize_t i
        cdef ActSt* x
        for i in range(self.s.n_live):
            a = self.s.live[i]
            x = &self.s.acts[a]
            if x.phase == PH_OPEN or x.phase == PH_DELAYED or x.phase == PH_WAIT_EXIT:
                q = g.act_qual[a]
                if only_non_holding and q != Q_P and q != Q_P1 and q != Q_P0:
                    continue
                self.settle(a, OC_CANCELLED)
        return 0

    cdef int abort(self, str reason) except -1:
        self.withdraw_all(False)
        self.end_hold(OC_CANCELLED)
        self.s.status = ST_ABORTED
        self.s.set_reason(reason)
        self.s.n_active = 0
        self.s.flags &= ~(JF_HELD | JF_ENDING)
        self.s.held_at = NO_TIME
        self.job(JT_ABORT)
        self.changed = True
        self.waits_dirty = True
        return 0

    # ---- steps, branches, transitions

    cdef int enter_step(self, int32_t st) except -1:
        cdef Graph g = self.g
        cdef int k, a, q, r
        cdef ActSt* x
        self.entries += 1
        if self.entries > _MAX_ENTRIES:
            raise _Loop(g.s(g.step_name[st]))
        if self.s.step_round[st]:
            self.s.step_round[st] += 1      # listed already: no call
        else:
            self.s.bump_round(st)
        self.s.add_active(st)
        self.changed = True
        for k in range(g.step_act_off[st], g.step_act_off[st + 1]):
            a = g.step_acts[k]
            q = g.act_qual[a]
            x = &self.s.acts[a]
            if q == Q_R:
                r = g.act_reset[a]
                if self.s.acts[r].phase == PH_OPEN or self.s.acts[r].phase == PH_DELAYED:
                    self.settle(r, OC_CANCELLED)
            elif q == Q_P0:
                self.touch(a)       # a wait of an earlier round may still be open
                x = self.s.act(a)
                x.phase = PH_WAIT_EXIT
                x.round = self.s.step_round[st]
            elif q == Q_D:
                self.touch(a)
                x = self.s.act(a)
                x.phase = PH_DELAYED
                x.outcome = OC_NONE
                x.round = self.s.step_round[st]
                x.timer = self.now + g.act_duration_ms[a]
                x.deadline = NO_TIME
                x.since = self.now
            else:
                self.arm(a)
        return 0

    cdef int exit_step(self, int32_t st) except -1:
        cdef Graph g = self.g
        cdef int k, a
        self.s.remove_active(st)
        self.s.last_exit = st
        for k in range(g.step_act_off[st], g.step_act_off[st + 1]):
            a = g.step_acts[k]
            if g.act_qual[a] == Q_P0 and self.s.acts[a].phase == PH_WAIT_EXIT:
                self.arm(a)
        self.changed = True
        return 0

    cdef bint step_done(self, int32_t st):
        """A step is done when its holding actions (N, L, D) are settled."""
        cdef Graph g = self.g
        cdef int k, a, q
        for k in range(g.step_act_off[st], g.step_act_off[st + 1]):
            a = g.step_acts[k]
            q = g.act_qual[a]
            if (q == Q_N or q == Q_L or q == Q_D) and self.s.acts[a].phase != PH_DONE:
                return False
        return True

    cdef int choose(self, int node, int32_t src_step, int kind_mask) except -2:
        """First outgoing transition of node (by priority) whose kind is in kind_mask
        and whose condition is true; -1 when none is true; -3 when none has the kind."""
        cdef Graph g = self.g
        cdef int k, t
        cdef bint any_kind = False
        for k in range(g.node_out_off[node], g.node_out_off[node + 1]):
            t = g.node_out[k]
            if not ((1 << g.tr_kind[t]) & kind_mask):
                continue
            any_kind = True
            if g.tr_cond[t] < 0:
                return t
            if self.ctx is None:
                self.make_ctx()
            self.ctx.src_step = src_step
            self.ctx.bare_order = None
            if truthy(g.eval_cond(g.tr_cond[t], self.ctx)):
                return t
        return -1 if any_kind else -3

    cdef int leave(self, int32_t st) except -1:
        """Step st is done: fire its first true transition, end its path, or end."""
        cdef Graph g = self.g
        cdef int t = self.choose(st, st, 0xFF)
        cdef int p
        if t == -1:
            self.abort(f"no transition out of step {g.s(g.step_name[st])!r} is true")
            return 0
        self.exit_step(st)
        if t == -3:
            p = g.step_path[st]
            if p >= 0:
                self.path_ended(p)
            else:
                self.recipe_end()
            return 0
        self.take(t)
        return 0

    cdef int take(self, int t) except -1:
        cdef Graph g = self.g
        cdef int target = g.tr_target[t]
        if g.tr_kind[t] == TK_PATH_END:
            self.path_ended(g.step_path[g.tr_source[t]])
        elif target < g.n_steps:
            self.enter_step(target)
        else:
            self.enter_branch(target - g.n_steps)
        return 0

    cdef int enter_branch(self, int b) except -1:
        cdef Graph g = self.g
        cdef int p, t
        self.s.br_ended[b] = 0
        self.changed = True
        if g.br_type[b] == B_SIMULTANEOUS:
            for p in range(g.br_path_off[b], g.br_path_off[b + 1]):
                self.enter_step(g.path_steps[g.path_off[p]])
            return 0
        t = self.choose(g.n_steps + b, self.s.last_exit, (1 << TK_ENTRY) | (1 << TK_IMPLICIT))
        if t < 0:
            self.s.br_ended[b] = -1
            self.abort(f"no entry of selection branch {g.s(g.br_name[b])!r} is true")
            return 0
        self.enter_step(g.tr_target[t])
        return 0

    cdef int path_ended(self, int p) except -1:
        cdef Graph g = self.g
        cdef int b = g.path_branch[p]
        cdef int t
        if g.br_type[b] == B_SIMULTANEOUS:
            self.s.br_ended[b] += 1
            if self.s.br_ended[b] < g.br_path_off[b + 1] - g.br_path_off[b]:
                return 0
        # converged (simultaneous) or its one path ended (selection): leave the branch
        self.s.br_ended[b] = -1
        self.changed = True
        t = self.choose(g.n_steps + b, self.s.last_exit, 1 << TK_EXIT)
        if t == -3:
            self.recipe_end()
        elif t == -1:
            self.abort(f"no exit transition of branch {g.s(g.br_name[b])!r} is true")
        else:
            self.take(t)
        return 0

    cdef int recipe_end(self) except -1:
        self.s.flags |= JF_ENDING
        self.changed = True
        self.check_end()
        return 0

    cdef int check_end(self) except -1:
        """The recipe has ended: complete unless a stored (S) action is still open."""
        cdef Graph g = self.g
        cdef int a
        cdef Py_ssize_t i
        if not (self.s.flags & JF_ENDING) or self.s.status != ST_RUNNING:
            return 0
        if self.s.flags & JF_HELD:
            return 0
        for i in range(self.s.n_live):
            a = self.s.live[i]
            if g.act_qual[a] == Q_S and (self.s.acts[a].phase == PH_OPEN
                                         or self.s.acts[a].phase == PH_DELAYED):
                return 0
        self.withdraw_all(True)
        self.s.status = ST_COMPLETED
        self.s.flags &= ~JF_ENDING
        self.s.n_active = 0
        self.job(JT_COMPLETE)
        self.changed = True
        self.waits_dirty = True
        return 0

    cdef int advance(self) except -1:
        """Fire what can fire: done steps leave, until nothing changes."""
        cdef Py_ssize_t i
        cdef bint moved
        cdef int a
        if self.s.status != ST_RUNNING or (self.s.flags & JF_HELD):
            return 0
        # a failure recorded while held is routed now
        for i in range(self.s.n_live):
            a = self.s.live[i]
            if self.s.acts[a].flags & AF_ABORT_PENDING:
                self.s.acts[a].flags &= ~AF_ABORT_PENDING
                self.abort(self.s.reason() or
                           f"action {self.g.s(self.g.act_name[a])!r} failed while held")
                return 0
        while self.s.status == ST_RUNNING:
            moved = False
            for i in range(self.s.n_active):
                if self.step_done(self.s.active[i]):
                    self.leave(self.s.active[i])
                    moved = True
                    break
            if not moved:
                break
        self.check_end()
        return 0

    # ---- answers

    cdef int parse(self, str cid, int64_t* n, bint* is_hold) except -2:
        """Push action a command id of this job names, or -1 (not ours, malformed).

        Read as UTF-8 against the job's and the actions' UTF-8: no slice, no dict."""
        cdef Py_ssize_t ln, end, i, lj = self.s.t_job.n, digits = 0
        cdef const char* p
        cdef int64_t v = 0, mul = 1
        cdef uint8_t c
        try:
            p = utf8_view(cid, &ln)
        except UnicodeEncodeError:
            return -1       # a lone surrogate: no id this core made
        if ln <= lj + 3 or p[lj] != b':' or memcmp(p, self.s.t_job.p, lj) != 0:
            return -1
        end = ln
        is_hold[0] = memcmp(p + ln - 5, b":hold", 5) == 0
        if is_hold[0]:
            end -= 5
        i = end - 1
        while i > lj:
            c = <uint8_t>p[i]
            if c < 48 or c > 57:
                break
            digits += 1
            if digits > 15:
                return -1
            v += (<int64_t>c - 48) * mul
            mul *= 10
            i -= 1
        if digits == 0 or i <= lj + 1 or p[i] != b'#':
            return -1
        n[0] = v
        return _push_action(self.g, p + lj + 1, i - lj - 1)

    cdef int on_completed(self, Completed ev) except -1:
        cdef int64_t n = 0
        cdef bint is_hold = False
        cdef int a = self.parse(ev.command_id, &n, &is_hold)
        if a < 0:
            return 0
        if is_hold:
            # a hold command answered "completed": the equipment holds the work
            return self.on_held_n(a, n, True)
        cdef ActSt* x = &self.s.acts[a]
        if x.phase != PH_OPEN or x.cmd_n != n:
            return 0     # late or duplicate answer: absorbed
        self.settle(a, OC_COMPLETED)
        # the latest answer replaces the result of an earlier round, also when it has none
        if ev.result is not None:
            self.keep_result(a, ev.result)
        else:
            self.s.set_result(a, None)
        self.advance()
        return 0

    cdef int on_failed(self, Failed ev) except -1:
        cdef int64_t n = 0
        cdef bint is_hold = False
        cdef int a = self.parse(ev.command_id, &n, &is_hold)
        if a < 0:
            return 0
        if is_hold:
            return self.on_not_held_n(a, n)
        cdef ActSt* x = &self.s.acts[a]
        if x.phase != PH_OPEN or x.cmd_n != n:
            return 0
        cdef str name = self.g.s(self.g.act_name[a])
        reason = f"action {name!r} failed" + (f": {ev.reason}" if ev.reason else "")
        self.settle(a, OC_FAILED)
        if self.s.flags & JF_HELD:
            # recorded now, routed on release
            x.flags |= AF_ABORT_PENDING
            self.s.set_reason(reason)
            return 0
        self.abort(reason)
        return 0

    cdef int on_held_n(self, int a, int64_t n, bint is_hold) except -1:
        cdef ActSt* x = &self.s.acts[a]
        if x.phase != PH_OPEN:
            return 0
        if is_hold:
            if x.hold_n != n:
                return 0
        elif x.cmd_n != n or x.hold_n == 0:
            return 0
        if x.hold != HP_OPEN and x.hold != HP_NOT_HELD:
            return 0
        # a late "held" still counts: the equipment did hold the work
        x.hold = HP_HELD
        x.hold_deadline = NO_TIME
        x.deadline = NO_TIME
        self.changed = True
        if not (self.s.flags & JF_HELD):
            self.restart(a)     # the release came before the answer
        return 0

    cdef int on_not_held_n(self, int a, int64_t n) except -1:
        cdef ActSt* x = &self.s.acts[a]
        if x.phase != PH_OPEN or x.hold_n != n or x.hold != HP_OPEN:
            return 0
        x.hold = HP_NOT_HELD
        x.hold_deadline = NO_TIME
        self.changed = True
        if not (self.s.flags & JF_HELD):
            self.redispatch(a, False)
        return 0

    cdef int on_hold_answer(self, str cid, bint held) except -1:
        cdef int64_t n = 0
        cdef bint is_hold = False
        cdef int a = self.parse(cid, &n, &is_hold)
        if a < 0:
            return 0
        if held:
            return self.on_held_n(a, n, is_hold)
        if not is_hold:
            if self.s.acts[a].cmd_n != n:
                return 0
            n = self.s.acts[a].hold_n
        return self.on_not_held_n(a, n)

    cdef int on_event(self, Event ev) except -1:
        cdef Graph g = self.g
        cdef int a, best = -1
        cdef ActSt* x
        cdef int64_t best_since = 0
        cdef Py_ssize_t i
        for i in range(self.s.n_live):
            a = self.s.live[i]
            x = &self.s.acts[a]
            if x.phase != PH_OPEN or g.act_inter[a] != I_PULL:
                continue
            if g.s(g.act_type[a]) != ev.type_id:
                continue
            if not self.matches(a, g.act_match_subject[a], ev.subject):
                continue
            if not self.matches(a, g.act_match_corr[a], ev.correlation_id):
                continue
            if best < 0 or x.since < best_since:
                best = a
                best_since = x.since
        if best < 0:
            return 0
        self.settle(best, OC_COMPLETED)
        if ev.data is not None:
            self.keep_result(best, ev.data)
        else:
            self.s.set_result(best, None)
        self.advance()
        return 0

    cdef bint matches(self, int a, int32_t sid, object value):
        if sid < 0:
            return True
        if value is None:
            return False
        cdef str tpl = self.g.s(sid)
        if "{" in tpl:
            tpl = (tpl.replace("{job}", self.s.job()).replace("{scope}", self.s.scope())
                   .replace("{action}", self.g.s(self.g.act_name[a])))
        return tpl == value

    # ---- time

    cdef int on_tick(self, Tick ev) except -1:
        cdef Graph g = self.g
        cdef int a
        cdef ActSt* x
        cdef int64_t now = self.now
        cdef str name
        cdef Py_ssize_t i
        if self.s.flags & JF_HELD:
            # while held only hold commands expire (docs/design.md#equipment-hold)
            for i in range(self.s.n_live):
                a = self.s.live[i]
                x = &self.s.acts[a]
                if x.phase == PH_OPEN and x.hold == HP_OPEN and x.hold_deadline != NO_TIME \
                        and x.hold_deadline <= now:
                    x.hold = HP_NOT_HELD
                    x.hold_deadline = NO_TIME
                    self.changed = True
            return 0
        for i in range(self.s.n_live):
            if self.s.status != ST_RUNNING:
                break
            a = self.s.live[i]
            x = &self.s.acts[a]
            if x.phase == PH_DELAYED:
                if x.timer != NO_TIME and x.timer <= now:
                    self.arm(a)
                continue
            if x.phase != PH_OPEN:
                continue
            if x.hold == HP_OPEN and x.hold_deadline != NO_TIME and x.hold_deadline <= now:
                # the hold was never answered: the work is issued again
                x.hold = HP_NOT_HELD
                x.hold_deadline = NO_TIME
                self.redispatch(a, False)
                continue
            if g.act_qual[a] == Q_L and x.timer != NO_TIME and x.timer <= now:
                self.settle(a, OC_LIMITED)
                continue
            if x.deadline == NO_TIME or x.deadline > now:
                continue
            name = g.s(g.act_name[a])
            if g.act_inter[a] == I_PULL:
                self.settle(a, OC_TIMEOUT)
                self.abort(f"action {name!r} timed out waiting for "
                           f"{g.s(g.act_type[a])} after {g.act_timeout_ms[a] / 1000:g} s")
                break
            if ev.unsent and self.cmd_id(a, x.cmd_n) in ev.unsent:
                self.redispatch(a, False)     # it never went out: send it, no retry spent
            elif x.attempt <= g.act_retries[a]:
                self.redispatch(a, True)
            else:
                self.settle(a, OC_TIMEOUT)
                self.abort(f"action {name!r} timed out after "
                           f"{g.act_timeout_ms[a] / 1000:g} s (attempt {x.attempt})")
                break
        self.advance()
        return 0

    cdef int shift(self, int64_t gap, bint holds_too) except -1:
        cdef int a
        cdef Py_ssize_t i
        cdef ActSt* x
        for i in range(self.s.n_live):
            a = self.s.live[i]
            x = &self.s.acts[a]
            if x.phase != PH_OPEN and x.phase != PH_DELAYED:
                continue
            if x.deadline != NO_TIME:
                x.deadline += gap
                self.changed = True
            if x.timer != NO_TIME:
                x.timer += gap
                self.changed = True
            if holds_too and x.hold_deadline != NO_TIME:
                x.hold_deadline += gap
                self.changed = True
        return 0

    cdef int on_hold(self) except -1:
        cdef Graph g = self.g
        cdef int a
        cdef Py_ssize_t i
        cdef ActSt* x
        if self.s.flags & JF_HELD:
            return 0
        self.s.flags |= JF_HELD
        self.s.held_at = self.now
        self.changed = True
        for i in range(self.s.n_live):
            a = self.s.live[i]
            x = &self.s.acts[a]
            if x.phase != PH_OPEN or g.act_inter[a] != I_PUSH or g.act_hold_type[a] < 0:
                continue
            if x.hold == HP_HELD:
                continue
            x.hold = HP_OPEN
            x.hold_n = x.cmd_n
            x.hold_deadline = self.now + (g.act_hold_timeout_ms[a] or g.act_timeout_ms[a])
            self.emit(a, x.cmd_n, True, False, x.hold_deadline)
        return 0

    cdef int on_release(self) except -1:
        cdef Graph g = self.g
        cdef int a
        cdef Py_ssize_t i
        cdef ActSt* x
        if not (self.s.flags & JF_HELD):
            return 0
        cdef int64_t gap = self.now - self.s.held_at
        if gap < 0:
            gap = 0
        self.end_hold(OC_RELEASED)
        self.s.flags &= ~JF_HELD
        self.s.held_at = NO_TIME
        self.changed = True
        self.shift(gap, False)
        for i in range(self.s.n_live):
            a = self.s.live[i]
            x = &self.s.acts[a]
            if x.phase != PH_OPEN or g.act_inter[a] != I_PUSH:
                continue
            if x.hold == HP_HELD:
                self.restart(a)
            elif x.hold == HP_OPEN:
                pass                # the answer to the hold decides
            else:
                x.hold = HP_NONE
                if x.deadline == NO_TIME:
                    x.deadline = self.now + g.act_timeout_ms[a]
                self.emit(a, x.cmd_n, False, (x.flags & AF_RESTART) != 0, x.deadline)
        self.advance()
        return 0

    cdef int on_resume(self) except -1:
        """Recovery: issue again what has no deadline, and restarts of held work."""
        cdef Graph g = self.g
        cdef int a
        cdef Py_ssize_t i
        cdef ActSt* x
        if self.s.flags & JF_HELD:
            return 0
        for i in range(self.s.n_live):
            a = self.s.live[i]
            x = &self.s.acts[a]
            if x.phase != PH_OPEN or g.act_inter[a] != I_PUSH:
                continue
            if x.hold == HP_HELD:
                self.restart(a)
            elif x.deadline == NO_TIME:
                self.redispatch(a, False)
            elif x.flags & AF_RESTART:
                self.emit(a, x.cmd_n, False, True, x.deadline)
        self.advance()
        return 0


class _Loop(Exception):
    pass


# ---------------------------------------------------------------- the API

cdef int64_t _next_deadline(Graph g, State s) noexcept:
    """Earliest open deadline; while held, the earliest hold deadline
    (docs/design.md#equipment-hold)."""
    cdef int a
    cdef ActSt* x
    cdef int64_t best = NO_TIME
    cdef bint held = (s.flags & JF_HELD) != 0
    cdef Py_ssize_t i
    if s.status != ST_RUNNING:
        return NO_TIME
    for i in range(s.n_live):
        a = s.live[i]
        x = &s.acts[a]
        if x.phase != PH_OPEN and x.phase != PH_DELAYED:
            continue
        if x.hold_deadline != NO_TIME and (best == NO_TIME or x.hold_deadline < best):
            best = x.hold_deadline
        if held:
            continue
        if x.deadline != NO_TIME and (best == NO_TIME or x.deadline < best):
            best = x.deadline
        if x.timer != NO_TIME and (best == NO_TIME or x.timer < best):
            best = x.timer
    return best


cdef set _waits(Graph g, State s):
    cdef int a
    cdef Py_ssize_t i
    cdef set out = set()
    if s.status != ST_RUNNING:
        return out
    for i in range(s.n_live):
        a = s.live[i]
        if g.act_inter[a] == I_PULL and s.acts[a].phase == PH_OPEN:
            out.add(g.s(g.act_type[a]))
    return out


cdef str _status(State s):
    if s.status == ST_RUNNING and (s.flags & JF_HELD):
        return _HELD
    return <str>_STATUS[s.status]


cdef Decision _absorbed(Graph g, State s, object state):
    cdef Decision d = Decision.__new__(Decision)
    d.applied = False
    d.state = state
    d.archived = _NO_BYTES
    d._g = g
    d.waits_added = _EMPTY
    d.waits_removed = _EMPTY
    if s is None:
        d.status = "none"
        d.reason = None
        d._next = NO_TIME
    else:
        d.status = _status(s)
        d.reason = s.reason() if s.t_reason.n else None    # no str made for no reason
        d._next = _next_deadline(g, s)
        s.release()
    return d


cdef bytes _params_text(object params):
    if params is None:
        return b""
    return _canonical(params).encode("utf-8")


cpdef Decision evolve(Graph graph, object state, BaseEvent event, int64_t now_ms):
    """Apply ``event`` to a job's ``state`` (bytes; None only before Start) at ``now_ms``.

    Returns a Decision; ``applied`` False means absorbed (nothing to write). Raises
    StateFormatError for bytes that are not a readable state of this graph. The new
    state is one document that holds every record (an archive tail it came with is
    copied, not read); ``evolve_live`` keeps the settled records apart.
    """
    return _evolve(graph, state, event, now_ms, False)


cpdef Decision evolve_live(Graph graph, object state, BaseEvent event, int64_t now_ms):
    """``evolve`` for a caller that keeps the archive apart from the live part: the
    Decision's ``state`` is the live part alone and ``archived`` the records to append
    to the job's archive (``b""`` mostly). Its cost follows the live records, not the
    job's history. The archive is never an input: no event reads it."""
    return _evolve(graph, state, event, now_ms, True)


cdef Decision _evolve(Graph graph, object state, BaseEvent event, int64_t now_ms,
                      bint split):
    cdef State s = None
    cdef int kind = event.kind
    cdef Start st
    cdef int64_t issued
    if state is not None:
        s = decode_state(graph, state)
    if kind == EV_START:
        st = <Start>event
        if s is not None:
            if s.status == ST_RUNNING:
                return _absorbed(graph, s, state)        # already running: a repeat
            if st.order and st.order == s.order():
                return _absorbed(graph, s, state)        # same order, already ended
        # a new job, or an ended state of a re-stored job id: replaced. The new run's
        # command ids continue after the ended run's: an id is never given out twice
        # (a late answer to the old run names no command of the new one, and a
        # CloudEvent id stays unique for its source)
        old_waits = set()
        issued = st.commands_before
        if s is not None:
            old_waits = _waits(graph, s)
            if s.cmd_counter > issued:
                issued = s.cmd_counter
            s.release()
        s = new_state(graph, st.job, st.scope, _params_text(st.params), st.order, now_ms)
        s.cmd_counter = issued
        return _run(graph, s, None, event, now_ms, old_waits, split)
    if s is None:
        return _absorbed(graph, None, None)
    if s.status != ST_RUNNING:
        return _absorbed(graph, s, state)                # a terminal job stays terminal
    return _run(graph, s, state, event, now_ms, None, split)


cdef _Run _spare_run = None     # one _Run (with its _Ctx) kept between calls


cdef Decision _run(Graph g, State s, object before, BaseEvent event, int64_t now,
                   set old_waits, bint split):
    global _spare_run
    cdef _Run r = _spare_run
    if r is not None:
        _spare_run = None       # taken: a re-entrant call makes its own
    else:
        r = _Run.__new__(_Run)
    r.g = g
    r.s = s
    r.now = now
    r.changed = False
    r.waits_dirty = old_waits is not None
    r.entries = 0
    cdef int kind = event.kind
    try:
        if kind == EV_START:
            r.job(JT_RUN)
            r.enter_step(g.initial_step)
            r.advance()
        elif kind == EV_COMPLETED:
            r.on_completed(<Completed>event)
        elif kind == EV_FAILED:
            r.on_failed(<Failed>event)
        elif kind == EV_HELD:
            r.on_hold_answer((<Held>event).command_id, True)
        elif kind == EV_NOT_HELD:
            r.on_hold_answer((<NotHeld>event).command_id, False)
        elif kind == EV_EVENT:
            r.on_event(<Event>event)
        elif kind == EV_TICK:
            r.on_tick(<Tick>event)
        elif kind == EV_CANCEL:
            r.withdraw_all(False)
            r.end_hold(OC_CANCELLED)
            s.status = ST_STOPPED if (<Cancel>event).stop else ST_ABORTED
            s.set_reason((<Cancel>event).reason or ("stopped" if (<Cancel>event).stop
                                                    else "aborted"))
            s.n_active = 0
            s.flags = 0
            s.held_at = NO_TIME
            r.changed = True
            r.waits_dirty = True
        elif kind == EV_HOLD:
            r.on_hold()
        elif kind == EV_RELEASE:
            r.on_release()
        elif kind == EV_RESUME:
            r.on_resume()
        elif kind == EV_SHIFT:
            if (<Shift>event).gap_ms > 0:
                r.shift((<Shift>event).gap_ms, True)
                if s.held_at != NO_TIME:
                    # the outage is not part of the hold: release moves by the hold alone
                    s.held_at += (<Shift>event).gap_ms
                    r.changed = True
    except _Loop as e:
        r.n_effs = 0
        r.abort(f"the recipe loops without waiting (more than {_MAX_ENTRIES} step "
                f"entries in one step, last at {e.args[0]!r})")
    if not r.changed and not r.n_effs:
        r.park()
        return _absorbed(g, s, before)
    cdef Decision d = Decision.__new__(Decision)
    d.applied = True
    d.state = s.encode(split)
    d.archived = s.added if s.added is not None else _NO_BYTES
    d._g = g
    d.status = _status(s)
    d.reason = s.reason() if s.t_reason.n else None    # no str made for no reason
    if r.n_effs:
        d.set_effs(r.effs, r.n_effs)
        d._job = s.o_job
        d._scope = s.o_scope
        d._at.job_at = s.job_at
        d._at.job_len = s.t_job.n
        d._at.scope_at = s.scope_at
        d._at.scope_len = s.t_scope.n
    d._next = _next_deadline(g, s)
    d.waits_added = d.waits_removed = _EMPTY
    if r.waits_dirty:
        if old_waits is None:
            old_waits = r.waits_before()     # the call began on a running job
        new_waits = _waits(g, s)
        if new_waits != old_waits:
            d.waits_added = tuple(sorted(new_waits - old_waits))
            d.waits_removed = tuple(sorted(old_waits - new_waits))
    r.park()
    s.release()
    return d


def evolve_many(Graph graph, states, events, int64_t now_ms) -> list:
    """Evolve many jobs of one graph: ``events`` is one event for all, or one per state.

    A state that cannot be read gives its StateFormatError in place of a Decision, so
    one bad job does not stop a sweep.
    """
    # A batch builds many small objects that live until the caller drops the list: the
    # cyclic collector would walk them again and again (3-4x the batch's own time).
    # Decisions hold no cycles, so it is paused for the batch.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _evolve_many(graph, states, events, now_ms)
    finally:
        if was_enabled:
            gc.enable()


cdef list _evolve_many(Graph graph, states, events, int64_t now_ms):
    cdef list out = []
    cdef BaseEvent one = None
    if isinstance(events, BaseEvent):
        one = <BaseEvent>events
        for st in states:
            try:
                out.append(evolve(graph, st, one, now_ms))
            except ValueError as e:
                out.append(e)
        return out
    states = list(states)
    events = list(events)
    if len(states) != len(events):
        raise ValueError(f"{len(states)} states but {len(events)} events")
    for st, ev in zip(states, events):
        try:
            out.append(evolve(graph, st, ev, now_ms))
        except ValueError as e:
            out.append(e)
    return out


def job_index(Graph graph, state) -> tuple:
    """(status, next deadline, waited-for type ids) of a state: what the indexes hold."""
    cdef State s = decode_state(graph, state)
    cdef int64_t nd = _next_deadline(graph, s)
    out = (_status(s), None if nd == NO_TIME else nd, tuple(sorted(_waits(graph, s))))
    s.release()
    return out


def open_command(Graph graph, state, str action):
    """The command a ``dispatch:{action}`` entry should send now, or None.

    None when the job is not running, is held, or the action has no open push attempt.
    While held, the open hold command of the action is returned instead (if any).
    """
    cdef State s = decode_state(graph, state)
    cdef Eff e
    cdef Command c = None
    a = graph.action_names().get(action)
    cdef int ai = -1 if a is None else a
    cdef ActSt* x
    if ai >= 0 and s.status == ST_RUNNING and graph.act_inter[ai] == I_PUSH \
            and s.acts[ai].phase == PH_OPEN:
        x = &s.acts[ai]
        e.action = ai
        e.attempt = x.attempt
        e.code = -1
        if s.flags & JF_HELD:
            if x.hold == HP_OPEN:
                e.code = EF_HOLD
                e.n = x.hold_n
                e.deadline = x.hold_deadline
        elif x.hold != HP_HELD and x.hold != HP_OPEN and x.deadline != NO_TIME:
            e.code = EF_RESTART if x.flags & AF_RESTART else 0
            e.n = x.cmd_n
            e.deadline = x.deadline
        if e.code >= 0:
            c = _command(graph, &e, s.job(), s.scope(), None, NULL)
    s.release()
    return c


def sent_markers(Graph graph, state) -> tuple:
    """``(started_at, ((field, command_id), ...))`` for every open push attempt.

    ``field`` is the job hash's marker field the host writes once that command went
    out (``sent:{action}``, ``sent:{action}:hold`` for a hold command), with the value
    ``{started_at}:{command_id}``. A command whose marker does not match never went
    out: it belongs in ``Tick.unsent``. Open attempts of an ended job are none.
    """
    cdef State s = decode_state(graph, state)
    cdef list out = []
    cdef int ai
    cdef ActSt* x
    cdef str name
    cdef bint ja = ascii_only(s.t_job.p, s.t_job.n)
    cdef Py_ssize_t i
    if s.status == ST_RUNNING:
        for i in range(s.n_live):
            ai = s.live[i]
            x = &s.acts[ai]
            if graph.act_inter[ai] != I_PUSH or x.phase != PH_OPEN:
                continue
            name = graph.s(graph.act_name[ai])
            if x.cmd_n > 0 and x.hold != HP_HELD:
                out.append(("sent:" + name,
                            _cid(graph, s.t_job.p, s.t_job.n, ja, ai, x.cmd_n, False)))
            if x.hold == HP_OPEN and x.hold_n > 0:
                out.append(("sent:" + name + ":hold",
                            _cid(graph, s.t_job.p, s.t_job.n, ja, ai, x.hold_n, True)))
    started = s.started_at
    s.release()
    return started, tuple(out)


def _restore_command(Graph g, int32_t action, int32_t code, int32_t attempt, int64_t n,
                     int64_t deadline, str job, str scope):
    cdef Eff e
    e.action, e.code, e.attempt, e.n, e.deadline = action, code, attempt, n, deadline
    e.round = 0
    return _command(g, &e, job, scope, None, NULL)


def _restore_decision(Graph g, bint applied, state, str status, reason, tuple added,
                      tuple removed, int64_t next_ms, tuple effs, job, scope,
                      bytes archived=b""):
    cdef Decision d = Decision.__new__(Decision)
    cdef Eff* buf = <Eff*>PyMem_Malloc((len(effs) + 1) * sizeof(Eff))
    cdef Py_ssize_t i
    if buf == NULL:
        raise MemoryError()
    try:
        for i, rec in enumerate(effs):
            buf[i].action, buf[i].code, buf[i].attempt, buf[i].n, buf[i].deadline = rec[:5]
            buf[i].round = rec[5] if len(rec) > 5 else 0
        d.set_effs(buf, len(effs))
    finally:
        PyMem_Free(buf)
    d._g = g
    d.applied = applied
    d.state = state
    d.archived = archived
    d.status = status
    d.reason = reason
    d.waits_added = added
    d.waits_removed = removed
    d._next = next_ms
    d._job = job
    d._scope = scope
    return d
