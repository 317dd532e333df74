# Events that evolve takes. Each carries a small int `kind` so evolve switches in C.

from libc.stdint cimport int64_t

cdef enum:
    EV_START = 0
    EV_COMPLETED = 1
    EV_FAILED = 2
    EV_HELD = 3
    EV_NOT_HELD = 4
    EV_EVENT = 5
    EV_TICK = 6
    EV_CANCEL = 7
    EV_HOLD = 8
    EV_RELEASE = 9
    EV_RESUME = 10
    EV_SHIFT = 11


cdef class BaseEvent:
    cdef readonly int kind


cdef class Start(BaseEvent):
    cdef readonly str job
    cdef readonly str scope
    cdef readonly object params
    cdef readonly str order
    cdef readonly long long commands_before


cdef class Completed(BaseEvent):
    cdef readonly str command_id
    cdef readonly object result


cdef class Failed(BaseEvent):
    cdef readonly str command_id
    cdef readonly str reason


cdef class Held(BaseEvent):
    cdef readonly str command_id


cdef class NotHeld(BaseEvent):
    cdef readonly str command_id


cdef class Event(BaseEvent):
    cdef readonly str type_id
    cdef readonly object subject
    cdef readonly object correlation_id
    cdef readonly object data


cdef class Tick(BaseEvent):
    cdef readonly frozenset unsent


cdef class Cancel(BaseEvent):
    cdef readonly str reason
    cdef readonly bint stop


cdef class Hold(BaseEvent):
    pass


cdef class Release(BaseEvent):
    pass


cdef class Resume(BaseEvent):
    pass


cdef class Shift(BaseEvent):
    cdef readonly int64_t gap_ms
