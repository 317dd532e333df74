# The Decision and Command of evolve, for Cython callers (the Runner) that read their
# C fields and call evolve without going through Python.

cimport cython
from libc.stdint cimport int32_t, int64_t

from sfc_fast.events cimport BaseEvent
from sfc_fast.graph cimport Graph

cdef enum:
    EF_HOLD = 1
    EF_RESTART = 2
    EF_ENDED = 4         # not a command: an attempt (or the job's hold) that ended;
                         # its outcome is code >> EF_OUTCOME_SHIFT
    EF_OUTCOME_SHIFT = 4

# Job order transitions an evolve call can imply (Eff.code when Eff.action is -1).
cdef enum:
    JT_RUN = 0
    JT_ABORT = 1
    JT_COMPLETE = 2


cdef struct Eff:
    # one effect of a call, in order: a command (action >= 0) or a job transition
    # (action -1); with EF_ENDED, an action's attempt that ended (the job's hold when
    # action is -1)
    int32_t action
    int32_t code         # EF_* flags of a command, JT_* of a job transition
    int32_t attempt
    int32_t round        # EF_ENDED: the round of its step the attempt was in
    int64_t n            # command number
    int64_t deadline     # EF_ENDED: when the attempt (or the hold) began


cdef struct Texts:
    # where a decision's job and scope texts are in its state bytes (UTF-8)
    Py_ssize_t job_at, job_len, scope_at, scope_len


@cython.freelist(16)
@cython.no_gc
cdef class Command:
    cdef readonly str command_id
    cdef Graph _g
    cdef Eff _e
    cdef str _job
    cdef str _scope
    cdef bytes _src               # the state whose texts hold job and scope, if not str
    cdef Texts _at


@cython.freelist(16)
@cython.no_gc
cdef class Decision:
    cdef readonly bint applied
    cdef readonly object state
    cdef readonly bytes archived  # evolve_live: records to append to the job's archive
    cdef readonly str status
    cdef readonly str reason
    cdef readonly tuple waits_added
    cdef readonly tuple waits_removed
    cdef Graph _g
    cdef int64_t _next            # next deadline; NO_TIME = none
    cdef Eff _inl[2]
    cdef Eff* _effs               # _inl, or the data of _more
    cdef bytes _more
    cdef Py_ssize_t _n_effs
    cdef str _job                 # job and scope as str, when the call had them
    cdef str _scope
    cdef Texts _at                # else: where they are in `state`
    cdef list _work
    cdef list _commands
    cdef tuple _job_tr

    cdef int set_effs(self, Eff* effs, Py_ssize_t n) except -1


cpdef Decision evolve(Graph graph, object state, BaseEvent event, int64_t now_ms)
cpdef Decision evolve_live(Graph graph, object state, BaseEvent event, int64_t now_ms)

cpdef str job_of_command(str command_id)
