# cython: language_level=3
"""The events ``evolve`` takes: plain immutable values, checked when made.

Answers name the command they answer by its id (``{job}:{action}#{n}``, a hold's id
ends in ``:hold``); everything else about routing is the host's business.
"""

_KIND_NAMES = ("Start", "Completed", "Failed", "Held", "NotHeld", "Event", "Tick", "Cancel",
               "Hold", "Release", "Resume", "Shift")


cdef str _text(object v, str what):
    if not isinstance(v, str):
        raise TypeError(f"{what} must be text, not {type(v).__name__}")
    return <str>v


cdef object _opt_text(object v, str what):
    if v is None:
        return None
    return _text(v, what)


cdef object _fields(object v, str what):
    if v is None:
        return None
    if not isinstance(v, dict):
        raise TypeError(f"{what} must be an object (dict) of fields, not {type(v).__name__}")
    return v


cdef class BaseEvent:
    """Common base: ``kind`` is a small int evolve switches on."""

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={getattr(self, k)!r}" for k in self._fields())
        return f"{_KIND_NAMES[self.kind]}({fields})"

    def _fields(self) -> tuple:
        return ()

    def __eq__(self, other) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(getattr(self, k) == getattr(other, k) for k in self._fields())

    def __hash__(self) -> int:
        return hash((self.kind,) + tuple(repr(getattr(self, k)) for k in self._fields()))


cdef class Start(BaseEvent):
    """Start the recipe of ``job`` in ``scope`` with job parameters ``params``.

    ``order`` optionally names the job order instance (for example its store time):
    a start of an ended job with the same ``order`` is a repeat and is absorbed; a
    different or empty one is a re-stored job id and replaces the ended state.

    A replaced run's command ids are never given out again: the new run numbers its
    commands after the ended state's. ``commands_before`` tells it that count when the
    ended state is not passed in (a re-stored job id with another recipe, whose state
    this graph cannot read: its ``commands_issued``).
    """

    def __init__(self, job, scope, params=None, order=None, commands_before=0):
        self.kind = EV_START
        self.job = _text(job, "job")
        self.scope = _text(scope, "scope")
        if not self.job:
            raise ValueError("job must not be empty")
        self.params = _fields(params, "params")
        self.order = _opt_text(order, "order") or ""
        if type(commands_before) is not int or not 0 <= commands_before < (1 << 40):
            raise ValueError("commands_before must be an int from 0 to 2**40 - 1")
        self.commands_before = commands_before

    def _fields(self) -> tuple:
        if self.commands_before:
            return ("job", "scope", "params", "order", "commands_before")
        return ("job", "scope", "params", "order")


cdef class Completed(BaseEvent):
    """The command ``command_id`` completed; ``result`` holds its result fields."""

    def __init__(self, command_id, result=None):
        self.kind = EV_COMPLETED
        self.command_id = _text(command_id, "command_id")
        self.result = _fields(result, "result")

    def _fields(self) -> tuple:
        return ("command_id", "result")


cdef class Failed(BaseEvent):
    """The command ``command_id`` failed (or a hold was refused, for a hold id)."""

    def __init__(self, command_id, reason=""):
        self.kind = EV_FAILED
        self.command_id = _text(command_id, "command_id")
        self.reason = _text(reason if reason is not None else "", "reason")

    def _fields(self) -> tuple:
        return ("command_id", "reason")


cdef class Held(BaseEvent):
    """The equipment holds the work of a hold command (``…:hold``) or of its work id."""

    def __init__(self, command_id):
        self.kind = EV_HELD
        self.command_id = _text(command_id, "command_id")

    def _fields(self) -> tuple:
        return ("command_id",)


cdef class NotHeld(BaseEvent):
    """The equipment did not hold the work (it was done, or never reached it)."""

    def __init__(self, command_id):
        self.kind = EV_NOT_HELD
        self.command_id = _text(command_id, "command_id")

    def _fields(self) -> tuple:
        return ("command_id",)


cdef class Event(BaseEvent):
    """A pull event of type ``type_id``; ``data`` holds its fields."""

    def __init__(self, type_id, subject=None, correlation_id=None, data=None):
        self.kind = EV_EVENT
        self.type_id = _text(type_id, "type_id")
        self.subject = _opt_text(subject, "subject")
        self.correlation_id = _opt_text(correlation_id, "correlation_id")
        self.data = _fields(data, "data")

    def _fields(self) -> tuple:
        return ("type_id", "subject", "correlation_id", "data")


cdef class Tick(BaseEvent):
    """Time passed: expire what is due. ``unsent``: command ids known never to have
    gone out (no sent marker); at their deadline they are dispatched again."""

    def __init__(self, unsent=()):
        self.kind = EV_TICK
        self.unsent = frozenset(unsent)
        for c in self.unsent:
            _text(c, "unsent command id")

    def _fields(self) -> tuple:
        return ("unsent",)


cdef class Cancel(BaseEvent):
    """MES Abort (``stop=False``) or Stop (``stop=True``): the recipe ends at once."""

    def __init__(self, reason="", stop=False):
        self.kind = EV_CANCEL
        self.reason = _text(reason if reason is not None else "", "reason")
        self.stop = bool(stop)

    def _fields(self) -> tuple:
        return ("reason", "stop")


cdef class Hold(BaseEvent):
    """MES Pause: hold the recipe at the next step boundary."""

    def __init__(self):
        self.kind = EV_HOLD


cdef class Release(BaseEvent):
    """MES Resume: end the hold; deadlines move by its length."""

    def __init__(self):
        self.kind = EV_RELEASE


cdef class Resume(BaseEvent):
    """Recovery after a host restart: re-issue what has no deadline."""

    def __init__(self):
        self.kind = EV_RESUME


cdef class Shift(BaseEvent):
    """An outage of ``gap_ms``: every open deadline moves by the gap."""

    def __init__(self, gap_ms):
        self.kind = EV_SHIFT
        if isinstance(gap_ms, bool) or not isinstance(gap_ms, int):
            raise TypeError("gap_ms must be a whole number of milliseconds")
        if gap_ms < 0:
            raise ValueError("gap_ms must be >= 0")
        self.gap_ms = gap_ms

    def _fields(self) -> tuple:
        return ("gap_ms",)
