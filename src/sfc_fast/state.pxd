# The state document of one job: a C view decoded from (and encoded to) compact bytes.
#
# Times are integer milliseconds; NO_TIME marks "none". Per-action records are dense
# (one per association of the graph) in memory and sparse on the wire. Format 2 splits
# the wire form: a live part that evolve reads and rewrites, and an archive of settled
# records it never reads again (appended, see state.pyx). Per-call work is sized by the
# live records: the lists `live` and `rsteps` say which dense slots are set.

cimport cython
from libc.stdint cimport int32_t, int64_t, uint8_t

from sfc_fast.graph cimport Graph

cdef enum:
    STATE_FORMAT_MAJOR = 2
    STATE_FORMAT_MINOR = 0

# Job status.
cdef enum:
    ST_RUNNING = 0
    ST_COMPLETED = 1
    ST_ABORTED = 2
    ST_STOPPED = 3

# Job flags.
cdef enum:
    JF_HELD = 1          # MES hold (heldAt is set)
    JF_ENDING = 2        # the recipe reached its end; waiting for stored (S) actions

# Action phases.
cdef enum:
    PH_IDLE = 0          # never armed in this job
    PH_DELAYED = 1       # D: armed at `timer`
    PH_OPEN = 2          # push command out or pull wait open
    PH_DONE = 3          # settled: see outcome
    PH_WAIT_EXIT = 4     # P0: armed when its step is left

# Outcomes of an action's latest attempt.
cdef enum:
    OC_NONE = 0
    OC_COMPLETED = 1
    OC_FAILED = 2
    OC_TIMEOUT = 3
    OC_CANCELLED = 4     # withdrawn: job cancelled, reset by R, or recipe ended
    OC_LIMITED = 5       # L: its duration was reached before an answer

# Equipment hold of a push action's open work (v1.1.0).
cdef enum:
    HP_NONE = 0
    HP_OPEN = 1          # hold command out, waiting for its answer
    HP_HELD = 2          # equipment holds the work: only a restart gets it going
    HP_NOT_HELD = 3      # hold refused or timed out: the work is issued again on release

# Marks of an action's slot in State.amark.
cdef enum:
    AM_LIVE = 1          # listed in State.live
    AM_ARCH = 2          # read from the archive (full decode only)

# Action flags.
cdef enum:
    AF_RESTART = 1       # the open attempt is a restart command (RestartTypeId)
    AF_ABORT_PENDING = 2 # failed or timed out while held: routed on release

cdef const int64_t NO_TIME

cdef struct ActSt:
    uint8_t phase
    uint8_t outcome
    uint8_t hold
    uint8_t flags
    int32_t attempt      # 1 on first dispatch; counts retries
    int32_t round        # the pass count of its step when armed
    int64_t cmd_n        # command number of the open (or last) attempt; 0 = none
    int64_t hold_n       # command number the hold command refers to; 0 = none
    int64_t deadline
    int64_t hold_deadline
    int64_t timer        # D: when it arms; L: when its duration ends
    int64_t since        # when the latest attempt or wait began
    int64_t done_at      # when it settled (newest-first order of bare names)
    Py_ssize_t res_len   # -1 = no result
    const char* res      # JSON text of the result fields (borrowed, see State.keep)


# A text field of the state: UTF-8 bytes borrowed from an owner the State keeps alive
# (the document it was decoded from, or the str it was set from).
cdef struct Txt:
    const char* p
    Py_ssize_t n


@cython.final
cdef class State:
    # Evolve reuses one State per graph (acquire/release), so a decode allocates no
    # Python objects: texts stay UTF-8 views into the input until someone asks for a str.
    cdef Graph g
    cdef bytes src                # the document the Txt views and `res` pointers borrow
    cdef Txt t_job, t_scope, t_reason, t_order, t_params
    cdef object o_job, o_scope, o_reason, o_order   # str views, made on demand or set
    cdef int status
    cdef int flags
    cdef int64_t started_at
    cdef int64_t held_at
    cdef int64_t cmd_counter
    cdef int32_t last_exit        # step whose actions bare names read first; -1 none
    cdef int32_t* active          # active step ids (unordered set, at most n_steps)
    cdef Py_ssize_t n_active
    cdef int32_t* step_round      # [n_steps]
    cdef int32_t* br_ended        # [n_branches]: paths ended, -1 = branch not active
    cdef ActSt* acts              # [n_actions]; idle unless listed in `live`
    cdef int32_t* live            # sorted ids of the actions whose slot is set
    cdef Py_ssize_t n_live
    cdef uint8_t* amark           # [n_actions] AM_* bits
    cdef int32_t* rsteps          # sorted ids of the steps whose round is set
    cdef Py_ssize_t n_rsteps
    cdef const uint8_t* pin       # the graph's pins: [n_actions] then [n_steps]
    cdef Py_ssize_t tail_at       # where the archive records start in `src`
    cdef int64_t arch_n           # records in the job's archive (here or elsewhere)
    cdef int64_t arch_read        # of those, read from this document (full decode)
    cdef bytes added              # encode(split): the archive records it wrote
    cdef list keep                # objects that own the memory `res` pointers borrow
    cdef object _params_obj       # decoded params (lazy)
    cdef char* buf                # encode scratch, reused across calls
    cdef Py_ssize_t buf_cap
    cdef Py_ssize_t job_at, scope_at   # where encode() wrote the job and scope texts

    cdef int add_active(self, int32_t step) except -1
    cdef bint remove_active(self, int32_t step) noexcept
    cdef bint is_active(self, int32_t step) noexcept
    cdef ActSt* act(self, int a) except NULL
    cdef int bump_round(self, int32_t step) except -1
    cdef int set_result(self, int a, object owner) except -1
    cdef object params_obj(self)
    cdef str job(self)
    cdef str scope(self)
    cdef str reason(self)
    cdef str order(self)
    cdef int set_reason(self, str v) except -1
    cdef bint splitting           # encode(split) is archiving
    cdef bint archivable(self, int a) noexcept
    cdef bint step_archivable(self, int32_t st) noexcept
    cdef bytes encode(self, bint split)
    cdef void release(self) noexcept


cdef int txt_set(Txt* t, object owner) except -1
cdef str txt_str(Txt t)
cdef State acquire_state(Graph g)
cdef State decode_state(Graph g, object data, bint full=*)
cdef State new_state(Graph g, str job, str scope, bytes params, str order, int64_t now)
