# cython: language_level=3
"""The embedded runner: many jobs in-process over ``evolve``, no Redis, no MQTT.

It plays the host's part with in-memory structures: the states, a DeadlineIndex, a
waits index by event type, and a callback that receives every command to send. Time
comes from an injectable clock (integer milliseconds), so tests and simulations run
as fast as the CPU allows. Answers come back through ``complete``/``fail``/``held``/
``not_held``; pull events through ``event``.
"""

import time

from libc.stdint cimport int64_t


from sfc_fast.deadlines cimport DeadlineIndex
from sfc_fast.evolve cimport Decision, evolve, job_of_command
from sfc_fast.state cimport NO_TIME
from sfc_fast.events import (
    Cancel, Completed, Event, Failed, Held, Hold, NotHeld, Release, Start, Tick,
)
from sfc_fast.graph cimport Graph
from sfc_fast.state import state_to_json


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


cdef class Runner:
    """Runs jobs in-process. ``on_command(cmd)`` gets each Command to send.

    ``clock()`` returns integer milliseconds (default: the wall clock). ``on_end(job,
    decision)`` is called once when a job completes, aborts or stops. Ended jobs stay
    readable until ``forget(job)``.
    """
    cdef dict _graphs        # job -> Graph
    cdef dict _states        # job -> state bytes
    cdef dict _waits         # event type -> {job: since_ms}
    cdef DeadlineIndex _index   # C calls: evolve and the index without Python dispatch
    cdef object _on_command
    cdef object _on_end
    cdef object _clock
    cdef readonly int absorbed
    cdef readonly int applied

    def __init__(self, on_command, *, clock=None, on_end=None):
        self._graphs = {}
        self._states = {}
        self._waits = {}
        self._index = DeadlineIndex()
        self._on_command = on_command
        self._on_end = on_end
        self._clock = clock if clock is not None else _wall_ms

    # ---- jobs

    def start(self, str job, Graph graph, str scope="default", params=None, str order=""):
        """Start ``job`` on ``graph``; a running job of that id absorbs the start."""
        cdef Decision d = self._apply(job, graph, self._states.get(job),
                                      Start(job, scope, params, order or None))
        if d.applied:
            self._graphs[job] = graph
        return d

    def cancel(self, str job, str reason="", bint stop=False):
        return self._to(job, Cancel(reason, stop))

    def hold(self, str job):
        return self._to(job, Hold())

    def release(self, str job):
        return self._to(job, Release())

    def forget(self, str job) -> None:
        """Drop an ended (or any) job from memory."""
        self._drop_waits(job)
        self._index.c_remove(job)
        self._graphs.pop(job, None)
        self._states.pop(job, None)

    # ---- answers and events

    def complete(self, str command_id, result=None):
        return self._answer(command_id, Completed(command_id, result))

    def fail(self, str command_id, str reason=""):
        return self._answer(command_id, Failed(command_id, reason))

    def held(self, str command_id):
        return self._answer(command_id, Held(command_id))

    def not_held(self, str command_id):
        return self._answer(command_id, NotHeld(command_id))

    def event(self, str type_id, subject=None, correlation_id=None, data=None):
        """Give a pull event to the oldest matching wait; None when no job took it."""
        waiting = self._waits.get(type_id)
        if not waiting:
            return None
        ev = Event(type_id, subject, correlation_id, data)
        for job in sorted(waiting, key=waiting.__getitem__):
            d = self._to(job, ev)
            if d is not None and d.applied:
                return d
        return None

    # ---- time

    def tick(self, limit=None) -> int:
        """Evolve every job whose deadline is due now; returns how many were ticked."""
        cdef Py_ssize_t lim = -1
        cdef Decision d
        if limit is not None:
            lim = limit
            if lim < 0:
                raise ValueError("limit must be >= 0 or None")
        due = self._index.c_pop_due(self._clock(), lim)
        tick = Tick()
        for job, _ in due:
            d = self._to(job, tick)
            if d is not None and not d.applied and d.next_deadline is not None:
                # nothing to do yet (a deadline moved): back on the index
                self._index.c_set(job, d.next_deadline)
        return len(due)

    def next_deadline(self):
        """The earliest deadline of any job, or None."""
        cdef int64_t at
        return at if self._index.c_next(&at) else None

    # ---- reading

    def status(self, str job):
        st = self._states.get(job)
        if st is None:
            return None
        return state_to_json(self._graphs[job], st)["status"]

    def inspect(self, str job) -> dict:
        st = self._states.get(job)
        if st is None:
            raise KeyError(job)
        return state_to_json(self._graphs[job], st)

    def state(self, str job):
        return self._states.get(job)

    def jobs(self) -> list:
        return list(self._states)

    def __len__(self) -> int:
        return len(self._states)

    # ---- plumbing

    cdef object _to(self, str job, event):
        graph = self._graphs.get(job)
        if graph is None:
            return None
        return self._apply(job, graph, self._states[job], event)

    cdef object _answer(self, str command_id, event):
        return self._to(job_of_command(command_id), event)

    cdef object _apply(self, str job, Graph graph, object state, event):
        cdef Decision d = evolve(graph, state, event, self._clock())
        if not d.applied:
            self.absorbed += 1
            return d
        self.applied += 1
        self._states[job] = d.state
        if d._next == NO_TIME:
            self._index.c_remove(job)
        else:
            self._index.c_set(job, d._next)
        if d.waits_removed:
            for t in d.waits_removed:
                w = self._waits.get(t)
                if w is not None:
                    w.pop(job, None)
                    if not w:
                        del self._waits[t]
        if d.waits_added:
            now = self._clock()
            for t in d.waits_added:
                self._waits.setdefault(t, {})[job] = now
        cdef bint ended = d.status != "running" and d.status != "held"
        if ended:
            self._drop_waits(job)
        if d._n_effs:
            for c in d.commands:
                self._on_command(c)
        if ended and self._on_end is not None:
            self._on_end(job, d)
        return d

    cdef void _drop_waits(self, str job):
        for t in list(self._waits):
            w = self._waits[t]
            if w.pop(job, None) is not None and not w:
                del self._waits[t]
