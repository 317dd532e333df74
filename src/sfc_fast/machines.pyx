# cython: language_level=3
"""Table-driven state machines: one machine type for every state machine of the product.

A machine is built once from names (states with optional sub-states, transitions as
``(source, trigger, target)``) into C arrays: states and triggers become dense ids and
``fire`` is one table load. Names exist only at the Python-facing edge.

Hierarchy, resolved when the table is built (so firing never walks it):

- the machine always rests in a leaf state; naming a composite state means its
  initial sub-state;
- a transition declared on a composite state applies to all its sub-states, unless a
  sub-state declares the same trigger itself (the nearest declaration wins);
- entering a composite state enters the sub-state with the same name as the one the
  source was in, if there is one (``AllowedToStart_Loaded --RevokeStart-->
  NotAllowedToStart_Loaded``: revoking the start does not unload the program), else
  its initial sub-state.

Instances: ``JOB_ORDER`` (OPC UA ISA95JOBCONTROL v2), ``TASK``, ``MISSION``,
``ENGINE`` (the ScriptEngine document).
"""

cimport cython
from libc.stdint cimport int32_t, uint8_t
from libc.stdlib cimport free, malloc
from libc.string cimport memset

from sfc_fast.errors import SfcError

SEPARATOR = "_"


class InvalidTransition(SfcError, ValueError):
    """A trigger that the machine does not permit in the state it is in."""

    def __init__(self, machine: str, state: str, trigger: str, permitted: tuple):
        self.machine = machine
        self.state = state
        self.trigger = trigger
        self.permitted = permitted
        allowed = ", ".join(permitted) if permitted else "none, it is final"
        super().__init__(f"{machine}: {trigger} is not permitted in state {state} "
                         f"(permitted: {allowed})")

    def __reduce__(self):
        return (InvalidTransition, (self.machine, self.state, self.trigger, self.permitted))


_STATE_KEYS = frozenset(("name", "number", "children", "initial"))


cdef class _Tree:
    """The states as declared, by id in declaration order (a parent before its
    sub-states): full and local names, parent, OPC UA number, sub-states, initial
    sub-state."""
    cdef str machine
    cdef list names, local, parents, numbers, children, initial_child
    cdef dict ids

    def __init__(self, str machine, states):
        self.machine = machine
        self.names = []
        self.local = []
        self.parents = []
        self.numbers = []
        self.children = []
        self.initial_child = []
        for spec in states:
            self._walk(spec, -1, "")
        if not self.names:
            raise ValueError(f"{machine}: a machine needs at least one state")
        self.ids = {s: i for i, s in enumerate(self.names)}

    cdef int _walk(self, object spec, int parent_id, str parent_full) except -1:
        cdef str name = self.machine
        if isinstance(spec, str):
            spec = {"name": spec}
        if not isinstance(spec, dict):
            raise TypeError(f"{name}: a state is a name or a dict, not {spec!r}")
        unknown = set(spec) - _STATE_KEYS
        if unknown:
            raise ValueError(f"{name}: unknown state keys {sorted(unknown)}")
        sname = spec.get("name")
        if not isinstance(sname, str) or not sname:
            raise ValueError(f"{name}: a state needs a non-empty name")
        full = sname if parent_id < 0 else parent_full + SEPARATOR + sname
        if full in self.names:
            raise ValueError(f"{name}: state {full} declared twice")
        number = spec.get("number", -1)
        if not isinstance(number, int) or number < -1:
            raise ValueError(f"{name}: state {full}: number must be an int >= 0")
        cdef int sid = len(self.names)
        self.names.append(full)
        self.local.append(sname)
        self.parents.append(parent_id)
        self.numbers.append(number)
        self.children.append([])
        self.initial_child.append(-1)
        if parent_id >= 0:
            self.children[parent_id].append(sid)
        for c in spec.get("children", ()):
            self._walk(c, sid, full)
        self._initial(spec, sid, full)
        return 0

    cdef int _initial(self, dict spec, int sid, str full) except -1:
        """A composite's initial sub-state: the one named, else the first."""
        kids = self.children[sid]
        if not kids:
            if "initial" in spec:
                raise ValueError(f"{self.machine}: state {full} has no sub-states but an "
                                 f"initial")
            return 0
        first = spec.get("initial")
        if first is None:
            self.initial_child[sid] = kids[0]
            return 0
        matches = [c for c in kids if self.local[c] == first]
        if not matches:
            raise ValueError(f"{self.machine}: state {full}: initial sub-state "
                             f"{first!r} is not one of its sub-states")
        self.initial_child[sid] = matches[0]
        return 0

    cdef int sid_of(self, object s, str what) except -1:
        try:
            return self.ids[s]
        except (KeyError, TypeError):
            raise ValueError(f"{self.machine}: {what} names unknown state {s!r}") from None

    cdef int leaf_of(self, int s) except -1:
        while self.initial_child[s] >= 0:
            s = self.initial_child[s]
        return s

    cdef int enter(self, int target, int source) except -1:
        """The leaf a transition from source into target rests in."""
        # Entering a composite: keep the source's sub-state name if the target has
        # a sub-state of that name, else take the target's initial sub-state.
        while self.initial_child[target] >= 0:
            nxt = self.initial_child[target]
            if self.parents[source] >= 0:
                for c in self.children[target]:
                    if self.local[c] == self.local[source]:
                        nxt = c
                        break
            target = nxt
        return target


cdef class _Declared:
    """The transitions as declared: trigger names by id, (source, trigger) -> target
    ids, and the declarations as written (for the diagram)."""
    cdef list triggers
    cdef dict tids
    cdef dict decl
    cdef list declared

    def __init__(self, _Tree tree, transitions):
        cdef str name = tree.machine
        self.triggers = []
        self.tids = {}
        self.decl = {}
        self.declared = []
        for tr in transitions:
            if len(tr) == 3:
                src, trig, dst = tr
                note = None
            elif len(tr) == 4:
                src, trig, dst, note = tr
            else:
                raise ValueError(f"{name}: a transition is (source, trigger, target[, note])")
            if not isinstance(trig, str) or not trig:
                raise ValueError(f"{name}: a trigger needs a non-empty name")
            s = tree.sid_of(src, f"transition {src} --{trig}-->")
            d = tree.sid_of(dst, f"transition {src} --{trig}-->")
            if trig not in self.tids:
                self.tids[trig] = len(self.triggers)
                self.triggers.append(trig)
            key = (s, self.tids[trig])
            if key in self.decl:
                raise ValueError(f"{name}: {trig} declared twice on {src} (a machine "
                                 "is deterministic)")
            self.decl[key] = d
            self.declared.append((src, trig, dst, note))

    cdef int target(self, _Tree tree, int s, int t) except -2:
        """Where trigger t leads from leaf s: the nearest declaration on s or an
        ancestor, -1 when none."""
        cdef int a = s
        while a >= 0:
            d = self.decl.get((a, t))
            if d is not None:
                return d
            a = tree.parents[a]
        return -1


cdef class Machine:
    """A deterministic state machine over int ids, with names at the edge.

    ``states``: names or dicts ``{"name", "number", "children", "initial"}``
    (``number``: the OPC UA state number; ``children``: sub-states, same form;
    ``initial``: the local name of the initial sub-state, default the first).
    ``transitions``: ``(source, trigger, target)`` or ``(source, trigger, target,
    note)`` with full state names (``Parent_Child`` for a sub-state); the note is a
    guard description printed in the diagram. ``final``: terminal leaf states.
    ``notes``: per state name, lines printed as a Mermaid note.
    """

    def __cinit__(self):
        self.table = NULL
        self.parent = NULL
        self.number = NULL
        self.flags = NULL
        self.n_states = 0
        self.n_triggers = 0

    def __dealloc__(self):
        free(self.table)
        free(self.parent)
        free(self.number)
        free(self.flags)

    def __init__(self, str name, states, transitions, *, str initial, final=(),
                 notes=None):
        if self.table != NULL:
            raise RuntimeError("Machine is already initialised")
        self.name = name
        cdef _Tree tree = _Tree(name, states)
        cdef _Declared dec = _Declared(tree, transitions)
        _build(self, tree, dec)
        init_id = tree.sid_of(initial, "initial")
        self.flags[init_id] |= MF_INITIAL
        self.initial = tree.leaf_of(init_id)
        for f in final:
            _final(self, tree.sid_of(f, "final"), f, tree, dec)
        self._state_names = tuple(tree.names)
        self._local_names = tuple(tree.local)
        self._trigger_names = tuple(dec.triggers)
        self._state_ids = tree.ids
        self._trigger_ids = dec.tids
        self._declared = tuple(dec.declared)
        self._children = tuple(tuple(c) for c in tree.children)
        self._initial_child = tuple(tree.initial_child)
        self._state_notes = {}
        for k, v in (notes or {}).items():
            tree.sid_of(k, "note")
            self._state_notes[k] = tuple(v.splitlines() if isinstance(v, str) else v)

    # ---- names <-> ids ------------------------------------------------------------

    cdef int _sid(self, object state) except -1:
        cdef Py_ssize_t i
        if isinstance(state, str):
            try:
                return self._state_ids[state]
            except KeyError:
                raise ValueError(f"{self.name}: unknown state {state!r}") from None
        if isinstance(state, int) and not isinstance(state, bool):
            i = state
            if 0 <= i < self.n_states:
                return <int>i
            raise ValueError(f"{self.name}: no state has id {state}")
        raise TypeError(f"{self.name}: a state is a name or an int id, not {state!r}")

    cdef int _tid(self, object trigger) except -1:
        cdef Py_ssize_t i
        if isinstance(trigger, str):
            try:
                return self._trigger_ids[trigger]
            except KeyError:
                raise ValueError(f"{self.name}: unknown trigger {trigger!r}") from None
        if isinstance(trigger, int) and not isinstance(trigger, bool):
            i = trigger
            if 0 <= i < self.n_triggers:
                return <int>i
            raise ValueError(f"{self.name}: no trigger has id {trigger}")
        raise TypeError(f"{self.name}: a trigger is a name or an int id, not {trigger!r}")

    cdef object _refuse(self, int state, int trigger):
        return InvalidTransition(self.name, self._state_names[state],
                                 self._trigger_names[trigger], self.permitted(state))

    def state_id(self, state) -> int:
        """The id of a state (a name, or an id which is checked)."""
        return self._sid(state)

    def trigger_id(self, trigger) -> int:
        """The id of a trigger (a name, or an id which is checked)."""
        return self._tid(trigger)

    def state_name(self, state) -> str:
        return self._state_names[self._sid(state)]

    def trigger_name(self, trigger) -> str:
        return self._trigger_names[self._tid(trigger)]

    @property
    def states(self) -> tuple:
        """Every state's full name, in id order (composite states included)."""
        return self._state_names

    @property
    def triggers(self) -> tuple:
        """Every trigger's name, in id order."""
        return self._trigger_names

    @property
    def initial_name(self) -> str:
        return self._state_names[self.initial]

    # ---- firing -------------------------------------------------------------------

    def fire(self, state, trigger):
        """The state after ``trigger`` in ``state``, or ``InvalidTransition``.

        With int ids in, an int id comes out (one table load); with a state name in,
        the new state's name comes out.
        """
        cdef int r, s, t
        if type(state) is int and type(trigger) is int:
            r = self.fire_c(state, trigger)
            if r >= 0:
                return r
            if r == OUT_OF_RANGE:
                self._sid(state)
                self._tid(trigger)
            raise self._refuse(state, trigger)
        s = self._sid(state)
        t = self._tid(trigger)
        r = self.table[s * self.n_triggers + t]
        if r < 0:
            raise self._refuse(s, t)
        if isinstance(state, str):
            return self._state_names[r]
        return r

    @cython.boundscheck(False)
    @cython.wraparound(False)
    def fire_all(self, int state, const int[:] triggers) -> int:
        """Fire a sequence of trigger ids (any int32 buffer) from ``state``; the last state.

        A refused trigger raises ``InvalidTransition`` with ``index`` set to its
        position; nothing is undone (there is nothing to undo: states are values).
        """
        cdef Py_ssize_t i, n = triggers.shape[0]
        cdef int s = state, r = 0
        self._sid(state)
        with nogil:
            for i in range(n):
                r = self.fire_c(s, triggers[i])
                if r < 0:
                    break
                s = r
        if n and r < 0:
            self._tid(triggers[i])
            e = self._refuse(s, triggers[i])
            e.index = i
            raise e
        return s

    def can_fire(self, state, trigger) -> bool:
        cdef int s = self._sid(state)
        cdef int t = self._tid(trigger)
        return self.table[s * self.n_triggers + t] >= 0

    def permitted(self, state) -> tuple:
        """Names of the triggers permitted in ``state``, in trigger id order."""
        cdef int s = self._sid(state)
        cdef int t
        return tuple(self._trigger_names[t] for t in range(self.n_triggers)
                     if self.table[s * self.n_triggers + t] >= 0)

    # ---- structure ----------------------------------------------------------------

    def is_final(self, state) -> bool:
        return bool(self.flags[self._sid(state)] & MF_FINAL)

    def is_leaf(self, state) -> bool:
        return bool(self.flags[self._sid(state)] & MF_LEAF)

    def is_in(self, state, ancestor) -> bool:
        """True if ``state`` is ``ancestor`` or one of its sub-states."""
        cdef int s = self._sid(state)
        cdef int a = self._sid(ancestor)
        while s >= 0:
            if s == a:
                return True
            s = self.parent[s]
        return False

    def parent_of(self, state):
        """The parent state's name, or None at the top level."""
        cdef int p = self.parent[self._sid(state)]
        return None if p < 0 else self._state_names[p]

    def number_of(self, state) -> int:
        """The state's own number (OPC UA), -1 when it has none."""
        return self.number[self._sid(state)]

    def path(self, state) -> tuple:
        """``((name, number), ...)`` from the top-level state down to ``state``.

        For the job order machine this is the OPC UA ``ISA95StateDataType`` list:
        ``JOB_ORDER.path("AllowedToStart_Ready") == (("AllowedToStart", 2), ("Ready", 2))``.
        """
        cdef int s = self._sid(state)
        out = []
        while s >= 0:
            out.append((self._local_names[s], self.number[s]))
            s = self.parent[s]
        out.reverse()
        return tuple(out)

    def transitions(self) -> tuple:
        """The declared transitions ``(source, trigger, target)``, as written."""
        return tuple((s, t, d) for s, t, d, _ in self._declared)

    def final_states(self) -> tuple:
        cdef int i
        return tuple(self._state_names[i] for i in range(self.n_states)
                     if self.flags[i] & MF_FINAL)

    def __repr__(self) -> str:
        return (f"<Machine {self.name}: {self.n_states} states, "
                f"{self.n_triggers} triggers, {len(self._declared)} transitions>")

    # ---- diagram ------------------------------------------------------------------

    def to_mermaid(self) -> str:
        """The machine as a Mermaid ``stateDiagram-v2`` (declared transitions)."""
        names = self._state_names
        lines = ["stateDiagram-v2"]
        top_initial = [i for i in range(self.n_states) if self.flags[i] & MF_INITIAL]
        lines.append(f"    [*] --> {names[top_initial[0]]}")
        inside = set()

        def block(int c, str indent):
            lines.append(f"{indent}state {names[c]} {{")
            inner = indent + "    "
            lines.append(f"{inner}[*] --> {names[self._initial_child[c]]}")
            for k in self._children[c]:
                if self._children[k]:
                    block(k, inner)
                else:
                    lines.append(f"{inner}{names[k]} : {self._local_names[k]}")
            for i, (src, trig, dst, note) in enumerate(self._declared):
                s, d = self._state_ids[src], self._state_ids[dst]
                if (s != c and d != c and self.parent[s] == c
                        and self.is_in(dst, names[c])):
                    lines.append(f"{inner}{src} --> {dst}: {_label(trig, note)}")
                    inside.add(i)
            lines.append(f"{indent}}}")

        for i in range(self.n_states):
            if self.parent[i] < 0 and self._children[i]:
                block(i, "    ")
        for i, (src, trig, dst, note) in enumerate(self._declared):
            if i not in inside:
                lines.append(f"    {src} --> {dst}: {_label(trig, note)}")
        for i in range(self.n_states):
            if self.flags[i] & MF_FINAL:
                lines.append(f"    {names[i]} --> [*]")
        for state, text in self._state_notes.items():
            lines.append(f"    note right of {state}")
            lines.extend(f"        {line}" for line in text)
            lines.append("    end note")
        return "\n".join(lines) + "\n"


cdef int _build(Machine m, _Tree tree, _Declared dec) except -1:
    """The C arrays: the table of every (leaf, trigger), parents, numbers, flags."""
    cdef int n = len(tree.names), nt = len(dec.triggers), i, t, src, found
    m.table = <int32_t*>malloc(max(1, n * nt) * sizeof(int32_t))
    m.parent = <int32_t*>malloc(n * sizeof(int32_t))
    m.number = <int32_t*>malloc(n * sizeof(int32_t))
    m.flags = <uint8_t*>malloc(n * sizeof(uint8_t))
    if m.table == NULL or m.parent == NULL or m.number == NULL or m.flags == NULL:
        raise MemoryError()
    memset(m.flags, 0, n * sizeof(uint8_t))
    m.n_states = n
    m.n_triggers = nt
    for i in range(n):
        m.parent[i] = tree.parents[i]
        m.number[i] = tree.numbers[i]
        if not tree.children[i]:
            m.flags[i] |= MF_LEAF
        src = tree.leaf_of(i)   # a composite behaves as its initial sub-state
        for t in range(nt):
            found = dec.target(tree, src, t)
            m.table[i * nt + t] = NO_TRANSITION if found < 0 else tree.enter(found, src)
    return 0


cdef int _final(Machine m, int fid, object f, _Tree tree, _Declared dec) except -1:
    """Mark a final state: a leaf that no trigger leaves."""
    cdef int t, nt = m.n_triggers
    if tree.children[fid]:
        raise ValueError(f"{m.name}: final state {f} has sub-states")
    for t in range(nt):
        if m.table[fid * nt + t] >= 0:
            raise ValueError(f"{m.name}: final state {f} has a transition "
                             f"({dec.triggers[t]})")
    m.flags[fid] |= MF_FINAL
    return 0


def _label(str trigger, note) -> str:
    if not note:
        return trigger
    return trigger + "<br/>(" + "<br/>".join(str(note).splitlines()) + ")"


# ---- the product's machines ---------------------------------------------------------

_READINESS = [{"name": "Waiting", "number": 1}, {"name": "Ready", "number": 2},
              {"name": "Loaded", "number": 3}]


def _readiness_moves(parent: str) -> list:
    # The OPC UA sub-state machine of NotAllowedToStart and AllowedToStart.
    p = parent + SEPARATOR
    return [
        (p + "Waiting", "FromWaitingToReady", p + "Ready"),
        (p + "Ready", "FromReadyToWaiting", p + "Waiting"),
        (p + "Ready", "FromReadyToLoaded", p + "Loaded"),
        (p + "Loaded", "FromLoadedToReady", p + "Ready"),
        (p + "Loaded", "FromLoadedToWaiting", p + "Waiting"),
    ]


#: ISA-95 job order machine (OPC UA ISA95JOBCONTROL v2, ISA95JobOrderStateMachineType).
#: State numbers are the OPC UA ones; sub-states carry their own numbers.
JOB_ORDER = Machine(
    "JobOrder",
    states=[
        {"name": "InitialState", "number": 0},
        {"name": "NotAllowedToStart", "number": 1, "children": _READINESS,
         "initial": "Ready"},
        {"name": "AllowedToStart", "number": 2, "children": _READINESS,
         "initial": "Ready"},
        {"name": "Running", "number": 3},
        {"name": "Interrupted", "number": 4, "initial": "Suspended",
         "children": [{"name": "Held", "number": 1}, {"name": "Suspended", "number": 2}]},
        {"name": "Ended", "number": 5, "initial": "Completed",
         "children": [{"name": "Completed", "number": 1}, {"name": "Closed", "number": 2}]},
        {"name": "Aborted", "number": 6},
        {"name": "EndState", "number": 7},
    ],
    transitions=[
        ("InitialState", "Store", "NotAllowedToStart"),
        ("InitialState", "StoreAndStart", "AllowedToStart"),
        ("NotAllowedToStart", "Update", "NotAllowedToStart"),
        ("NotAllowedToStart", "Start", "AllowedToStart"),
        ("NotAllowedToStart", "Abort", "Aborted"),
        ("NotAllowedToStart", "Cancel", "EndState"),
        ("AllowedToStart", "Update", "AllowedToStart"),
        ("AllowedToStart", "RevokeStart", "NotAllowedToStart"),
        ("AllowedToStart", "Run", "Running"),
        ("AllowedToStart", "Abort", "Aborted"),
        ("AllowedToStart", "Cancel", "EndState"),
        ("Running", "Pause", "Interrupted"),
        ("Running", "Stop", "Ended"),
        ("Running", "Abort", "Aborted"),
        ("Interrupted", "Resume", "Running"),
        ("Interrupted", "Stop", "Ended"),
        ("Interrupted", "Abort", "Aborted"),
        ("Ended", "Clear", "EndState"),
        ("Aborted", "Clear", "EndState"),
        *_readiness_moves("NotAllowedToStart"),
        *_readiness_moves("AllowedToStart"),
        ("Interrupted_Held", "FromHeldToSuspended", "Interrupted_Suspended"),
        ("Interrupted_Suspended", "FromSuspendedToHeld", "Interrupted_Held"),
        ("Ended_Completed", "FromCompletedToClosed", "Ended_Closed"),
    ],
    initial="InitialState",
    final=("EndState",),
)

#: Task machine of the ScriptEngine document (periodic script Tasks).
TASK = Machine(
    "Task",
    states=["Idle", "Running", "Pausing", "Paused", "Resuming", "Stopping", "Stopped",
            "Error"],
    transitions=[
        ("Idle", "Start", "Running"),
        ("Running", "Pause", "Pausing"),
        ("Running", "Stop", "Stopping"),
        ("Running", "ErrorOccurred", "Error"),
        ("Pausing", "PausingCompleted", "Paused"),
        ("Pausing", "ErrorOccurred", "Error"),
        ("Paused", "Resume", "Resuming"),
        ("Paused", "Stop", "Stopping"),
        ("Resuming", "ResumingCompleted", "Running"),
        ("Resuming", "ErrorOccurred", "Error"),
        ("Stopping", "StoppingCompleted", "Stopped"),
        ("Stopping", "ErrorOccurred", "Error"),
        ("Stopped", "Start", "Running"),
        ("Error", "Start", "Running"),
    ],
    initial="Idle",
    notes={
        "Running": "Runs every interval\nTimer loop running",
        "Paused": "Timer loop still running\nExecutions are skipped\nResume or stop",
        "Stopped": "Timer loop stopped\nCan start again",
        "Error": "An execution raised\nCan start again",
    },
)

#: Mission instance machine of the ScriptEngine document (long-running Missions).
MISSION = Machine(
    "Mission",
    states=["Idle", "Running", "Canceling", "Pausing", "Paused", "Resuming", "Canceled",
            "Completed", "Error"],
    transitions=[
        ("Idle", "Start", "Running"),
        ("Running", "Cancel", "Canceling"),
        ("Running", "Pause", "Pausing"),
        ("Running", "CompleteRunning", "Completed"),
        ("Running", "ErrorOccurred", "Error"),
        ("Canceling", "CompleteCanceling", "Canceled"),
        ("Canceling", "ErrorOccurred", "Error"),
        ("Pausing", "CompletePausing", "Paused"),
        ("Pausing", "ErrorOccurred", "Error"),
        ("Paused", "Resume", "Resuming"),
        ("Paused", "Cancel", "Canceling"),
        ("Resuming", "CompleteResuming", "Running"),
        ("Resuming", "ErrorOccurred", "Error"),
    ],
    initial="Idle",
    final=("Canceled", "Completed", "Error"),
    notes={
        "Running": "Mission executing\nasync generator",
        "Paused": "Mission paused at a yield\nResume or cancel",
    },
)

#: Engine manager machine of the ScriptEngine document.
ENGINE = Machine(
    "Engine",
    states=["Initializing", "Resetting", "Idle", "Building", "Ready", "Starting", "Running",
            "Stopping", "BuildError", "Fault"],
    transitions=[
        ("Initializing", "Reset", "Resetting"),
        ("Initializing", "InitializationCompleted", "Idle"),
        ("Resetting", "ResettingCompleted", "Idle"),
        ("Resetting", "FaultOccurred", "Fault"),
        ("Idle", "Build", "Building"),
        ("Idle", "Reset", "Resetting"),
        ("Building", "BuildingCompleted", "Ready"),
        ("Building", "BuildErrorOccurred", "BuildError"),
        ("Building", "FaultOccurred", "Fault"),
        ("BuildError", "Reset", "Idle"),
        ("BuildError", "Build", "Building"),
        ("Ready", "Start", "Starting"),
        ("Ready", "Reset", "Idle"),
        ("Ready", "Build", "Building"),
        ("Starting", "StartingCompleted", "Running"),
        ("Starting", "FaultOccurred", "Fault"),
        ("Running", "Stop", "Stopping"),
        ("Running", "Reset", "Resetting"),
        ("Running", "FaultOccurred", "Fault"),
        ("Stopping", "StoppingCompleted", "Ready",
         "All Tasks Stopped\nAND All Missions not Running"),
        ("Stopping", "FaultOccurred", "Fault"),
        ("Fault", "Reset", "Resetting"),
    ],
    initial="Initializing",
    notes={
        "Idle": "Scripts can be edited\nand saved",
        "Building": "Compile scripts\nExtract metadata",
        "Running": "Tasks execute periodically\nMissionInstances can be created\n"
                   "Tasks with AutoStart=true auto-start",
        "Stopping": "Wait for all Tasks to Stopped\nWait for all MissionInstances\n"
                    "not Running",
    },
)
