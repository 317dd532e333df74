# Table-driven state machines: the shared C declarations.
#
# States and triggers are dense int ids. A machine holds one int32 table of
# n_states * n_triggers entries: table[state * n_triggers + trigger] is the new
# (leaf) state, or NO_TRANSITION. Other Cython modules cimport Machine and call
# fire_c(), which is a bounds check and one load, with no Python objects.

from libc.stdint cimport int32_t, uint8_t

cdef enum:
    NO_TRANSITION = -1      # the trigger is refused in this state
    OUT_OF_RANGE = -2       # the state or trigger id is not one of the machine's

# State flags.
cdef enum:
    MF_LEAF = 1             # a state the machine can rest in (no sub-states)
    MF_FINAL = 2            # a terminal state: no trigger is permitted
    MF_INITIAL = 4          # the initial state

cdef class Machine:
    cdef readonly str name
    cdef readonly int n_states
    cdef readonly int n_triggers
    cdef int32_t* table     # n_states * n_triggers new-state ids
    cdef int32_t* parent    # parent state id, -1 at the top level
    cdef int32_t* number    # OPC UA state number, -1 when none
    cdef uint8_t* flags     # MF_*
    cdef readonly int initial
    cdef tuple _state_names     # full names: "Parent_Child" for sub-states
    cdef tuple _local_names     # names inside the parent
    cdef tuple _trigger_names
    cdef dict _state_ids
    cdef dict _trigger_ids
    cdef tuple _declared        # (source, trigger, target, note) as written
    cdef dict _state_notes
    cdef tuple _children        # per state id: tuple of child ids
    cdef tuple _initial_child   # per state id: initial child id or -1

    cdef inline int fire_c(self, int state, int trigger) noexcept nogil:
        if <unsigned int>state >= <unsigned int>self.n_states:
            return OUT_OF_RANGE
        if <unsigned int>trigger >= <unsigned int>self.n_triggers:
            return OUT_OF_RANGE
        return self.table[state * self.n_triggers + trigger]

    cdef int _sid(self, object state) except -1
    cdef int _tid(self, object trigger) except -1
    cdef object _refuse(self, int state, int trigger)
