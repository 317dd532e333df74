# cython: language_level=3
"""The recipe compiler: a parsed recipe in, the bytes of its graph out (their layout:
_layout.pxd), or every problem found at once.

``_Compiler.run`` is its phases, in the order that fixes the problems' order and the
string ids (and so the bytes and the fingerprint): steps, branches and their paths,
actions and their resets, transitions; then, for a recipe without problems, the
implicit transitions, the order of the transitions leaving each node, the string ids
and the packed blob. Each element's fields are read and checked by ``Checker``
(checks.pyx).
"""

cimport cython
from libc.stdint cimport int32_t, int64_t, uint16_t, uint32_t
from libc.stdlib cimport calloc, free, malloc, realloc
from libc.string cimport memcpy, memset
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_GetItemWithError
from cpython.list cimport PyList_GET_SIZE
from cpython.object cimport PyObject
from cpython.unicode cimport Py_UNICODE_ISSPACE

from sfc_fast._layout cimport (
    COUNTS_AT, FINGERPRINT_AT, GRAPH_FORMAT_MAJOR, GRAPH_FORMAT_MINOR, HEADER_SIZE,
    N_COUNTS, N_I32, N_I64, i64_at, table_lengths,
    X_STEP_NAME, X_STEP_FLAGS, X_STEP_PATH, X_STEP_ACT_OFF, X_STEP_ACTS, X_NODE_OUT_OFF,
    X_NODE_OUT, X_TR_SRC, X_TR_DST, X_TR_PRIO, X_TR_COND, X_TR_KIND, X_TR_TEXT, X_A_NAME,
    X_A_STEP, X_A_QUAL, X_A_INTER, X_A_TYPE, X_A_PARAMS, X_A_HOLD, X_A_RESTART,
    X_A_RETRIES, X_A_SUBJ, X_A_CORR, X_A_RESET, X_B_NAME, X_B_TYPE, X_B_PATH_OFF,
    X_PATH_BRANCH, X_PATH_OFF, X_PATH_STEPS, X_COND_OFF, X_CODE, X_REF_KIND, X_REF_ACTION,
    X_REF_SEG_OFF, X_REF_SEGS, X_CONST_TEXT, X_STR_OFF, X_A_TIMEOUT, X_A_HOLD_TIMEOUT,
    X_A_DURATION,
)
from sfc_fast._text cimport utf8_view
from sfc_fast._vec cimport I32Vec, I64Vec, i32_free, i32_push, i64_free, i64_push
from sfc_fast.canonical cimport flat_canonical
from sfc_fast.checks cimport (
    Checker, at, get, is_int, is_str, val,
    F_NAME, F_INITIAL, F_SOURCE, F_TARGET, F_CONDITION, F_PRIORITY, F_STEP, F_QUALIFIER,
    F_INTERACTION, F_TYPE_ID, F_TIMEOUT, F_PARAMETERS, F_MAX,
)
from sfc_fast.graph cimport (
    Q_R, Q_S, B_SELECTION, B_SIMULTANEOUS, TK_STEP, TK_ENTRY, TK_EXIT, TK_PATH, TK_IMPLICIT,
    TK_PATH_END, SF_INITIAL,
)

import hashlib

from sfc_fast.checks import MAX_FIELD_CHARS
from sfc_fast.conditions import CondBuilder, ConditionSyntaxError, canonical_dumps
from sfc_fast.graph import BRANCH_TYPES, INTERACTIONS, QUALIFIERS
from sfc_fast.problems import Problem, RecipeError

#: Largest recipe accepted, as JSON text (bytes); also the bound of its strings.
MAX_RECIPE_BYTES = 8 * 1024 * 1024
#: Longest Parameters object of one action, as JSON.
MAX_PARAMS_CHARS = 1024 * 1024
RESERVED_ACTION_NAMES = frozenset(("job",))

cdef frozenset _RECIPE_KEYS = frozenset(("Steps", "Transitions", "Actions", "Branches",
                                         "Description"))
cdef frozenset _BRANCH_KEYS = frozenset(("Name", "Type", "Branches", "Description"))
cdef dict _QUAL = QUALIFIERS
cdef dict _INTER = INTERACTIONS

cdef extern from "Python.h":
    PyObject* PyDict_SetDefault(object d, object key, object default) except NULL

# A bucket of transitions leaving one node longer than this is ordered by Python's
# sort rather than by insertion (a hostile recipe may give one node 100,000).
cdef enum:
    INSERTION_SORT_MAX = 16


cdef bytes build_graph(object obj, int minor):
    cdef _Compiler comp = _Compiler(minor)
    try:
        blob = comp.run(obj)
    except RecursionError:
        raise RecipeError([Problem("SFC014", "$", "recipe is nested too deeply")]) from None
    if comp.problems:
        raise RecipeError(comp.problems)
    return blob


# ---------------------------------------------------------------- helpers

cdef int _name_flaw(str s) noexcept:
    """1: s holds a ':'; 2: whitespace or a control character (the regex
    [\s\x00-\x1f\x7f]: str.isspace, which re's \s matches for str, and ASCII controls);
    0: neither. One pass."""
    cdef Py_UCS4 c
    cdef bint bad = False
    for c in s:
        if c == u':':
            return 1
        if c < 0x20 or c == 0x7f or Py_UNICODE_ISSPACE(c):
            bad = True
    return 2 if bad else 0


cdef inline bint _insert_new(dict d, object key, object value) except -1:
    """d[key] = value unless key is in d; whether it was (one lookup)."""
    cdef Py_ssize_t n = len(d)
    PyDict_SetDefault(d, key, value)
    return len(d) > n


cdef inline object _lookup(dict d, object key):
    """d.get(key) for a hashable key, without the method call."""
    cdef PyObject* v = PyDict_GetItemWithError(d, key)
    return None if v == NULL else <object>v


cdef int _push_list(I32Vec* v, list xs) except -1:
    cdef object x
    for x in xs:
        i32_push(v, x)
    return 0


cdef int _reserve(I32Vec* v, Py_ssize_t n) except -1:
    cdef int32_t* p
    if n > v.cap:
        p = <int32_t*>realloc(v.data, n * sizeof(int32_t))
        if p == NULL:
            raise MemoryError()
        v.data = p
        v.cap = n
    return 0


cdef int _push_bytes(I32Vec* v, bytes b) except -1:
    """Append the native int32 values held in b."""
    cdef Py_ssize_t n = PyBytes_GET_SIZE(b) // 4, k
    cdef const int32_t* p = <const int32_t*>PyBytes_AS_STRING(b)
    for k in range(n):
        i32_push(v, p[k])
    return 0


cdef inline void _push_transition(I32Vec* t, int32_t src, int32_t dst, int32_t prio,
                                  int32_t cond, int32_t kind, int32_t text) noexcept:
    i32_push(&t[X_TR_SRC], src)
    i32_push(&t[X_TR_DST], dst)
    i32_push(&t[X_TR_PRIO], prio)
    i32_push(&t[X_TR_COND], cond)
    i32_push(&t[X_TR_KIND], kind)
    i32_push(&t[X_TR_TEXT], text)


@cython.boundscheck(False)
@cython.wraparound(False)
cdef int _csr(I32Vec* off, I32Vec* items, const int32_t* key, Py_ssize_t n,
              Py_ssize_t n_keys) except -1:
    """off[n_keys+1], items[n]: the indices 0..n-1 grouped by key[i], in order."""
    cdef Py_ssize_t i
    cdef int32_t* o
    cdef int32_t* fill
    for i in range(n_keys + 1):
        i32_push(off, 0)
    for i in range(n):
        i32_push(items, 0)
    o = off.data
    for i in range(n):
        o[key[i] + 1] += 1
    for i in range(n_keys):
        o[i + 1] += o[i]
    fill = <int32_t*>malloc((n_keys + 1) * sizeof(int32_t))
    if fill == NULL:
        raise MemoryError()
    memcpy(fill, o, (n_keys + 1) * sizeof(int32_t))
    for i in range(n):
        items.data[fill[key[i]]] = <int32_t>i
        fill[key[i]] += 1
    free(fill)
    return 0


cdef struct _Slot:
    PyObject* s
    uint32_t h      # the low bits of the str's hash: most mismatches end here
    int32_t id


# ---------------------------------------------------------------- the compiler

cdef class _Compiler(Checker):
    # The phases index Python lists only with ids they made or checked, so they run
    # without bounds and wraparound checks.
    cdef list strings       # by id; holds the references the table borrows
    # string -> id: open addressing over (hash, borrowed str, id), a C probe per lookup
    # rather than a dict operation and an int object per string
    cdef _Slot* tab
    cdef Py_ssize_t tab_mask
    cdef I32Vec t[N_I32]
    cdef I64Vec t64[N_I64]
    cdef PyObject* f[F_MAX]     # the fields of the element at hand (Checker.*_fields)
    cdef list keep              # what f borrows from elements that are not plain dicts
    # what the phases hand on: steps, branches and paths, actions
    cdef int S, B, P
    cdef Py_ssize_t A
    cdef dict node_of           # step or branch name -> node id
    cdef list step_names, initial, step_path
    cdef list br_names, br_types, br_path_off, path_branch, path_off, path_steps
    cdef list a_names, a_types, a_params, a_hold, a_restart, a_subj, a_corr
    cdef dict stored            # name -> association index of non-reset actions
    cdef object cb              # the conditions' CondBuilder
    cdef object cb_add
    cdef bytearray has_out      # [S + B]: a node some explicit transition leaves
    cdef bytearray path_entry   # [P]: a path some explicit transition enters

    def __init__(self, int minor):
        Checker.__init__(self, minor)
        self.strings = []
        self.keep = []
        self.node_of = {}
        self.step_names = []
        self.initial = []
        self.br_names = []
        self.br_types = []
        self.br_path_off = [0]
        self.path_branch = []
        self.path_off = [0]
        self.path_steps = []
        self.a_names = []
        self.a_types = []
        self.a_params = []
        self.a_hold = []
        self.a_restart = []
        self.a_subj = []
        self.a_corr = []
        self.stored = {}

    def __dealloc__(self):
        cdef int k
        free(self.tab)
        for k in range(N_I32):
            i32_free(&self.t[k])
        for k in range(N_I64):
            i64_free(&self.t64[k])

    def run(self, obj):
        """The graph's bytes, or None with every problem in ``problems``."""
        if not isinstance(obj, dict):
            self.err("SFC014", "$", f"a recipe is a JSON object, not {type(obj).__name__}")
            return None
        self.unknown_keys(obj, _RECIPE_KEYS, "$", -1)
        cdef list steps_in = self.list_of(obj, "Steps", "$", True)
        cdef list trans_in = self.list_of(obj, "Transitions", "$", True)
        cdef list acts_in = self.list_of(obj, "Actions", "$", True)
        cdef list brs_in = self.list_of(obj, "Branches", "$", False)
        self._reserve(len(steps_in), len(trans_in), len(acts_in), len(brs_in))
        self._steps(steps_in)
        self._branches(brs_in)
        self._actions(acts_in)
        self._resets()
        self._transitions(trans_in)
        if self.problems:
            return None
        self._implicit()
        self._outgoing()
        # actions per step, document order
        _csr(&self.t[X_STEP_ACT_OFF], &self.t[X_STEP_ACTS], self.t[X_A_STEP].data, self.A,
             self.S)
        self._string_ids()
        return self._pack()

    cdef int _reserve(self, Py_ssize_t n_steps, Py_ssize_t n_trans, Py_ssize_t n_acts,
                      Py_ssize_t n_brs) except -1:
        """Room for a recipe this size: the string table so that it is not rehashed as
        it grows (names, type ids, parameters, conditions), and the int32 tables of one
        entry per step, action or transition at once rather than grown by copies."""
        cdef Py_ssize_t k, cap = 1024, want = min(
            3 * n_acts + n_steps + n_brs + n_trans + 64, 1 << 20)
        while 2 * cap < 3 * want:
            cap *= 2
        if self.tab == NULL:
            self._table(cap)
        for k in range(X_A_NAME, X_A_RESET + 1):
            _reserve(&self.t[k], n_acts)
        for k in range(X_TR_SRC, X_TR_TEXT + 1):
            _reserve(&self.t[k], n_trans)
        for k in (X_STEP_NAME, X_STEP_FLAGS, X_STEP_PATH):
            _reserve(&self.t[k], n_steps)
        return 0

    # ---- the string table

    cdef int _table(self, Py_ssize_t cap) except -1:
        """A string table of cap (a power of two) slots holding the current entries."""
        cdef _Slot* old = self.tab
        cdef Py_ssize_t k, i, old_cap = self.tab_mask + 1 if old != NULL else 0
        self.tab = <_Slot*>calloc(cap, sizeof(_Slot))
        if self.tab == NULL:
            self.tab = old
            raise MemoryError()
        self.tab_mask = cap - 1
        for k in range(old_cap):
            if old[k].s != NULL:
                i = <Py_ssize_t>(old[k].h & self.tab_mask)
                while self.tab[i].s != NULL:
                    i = (i + 1) & self.tab_mask
                self.tab[i] = old[k]
        free(old)
        return 0

    cdef int sid(self, str s) except -2:
        """The id of s in the string table, the next one if s is new."""
        cdef uint32_t h = <uint32_t>hash(s)
        cdef Py_ssize_t n = PyList_GET_SIZE(self.strings), i
        cdef _Slot* slot
        if self.tab == NULL:
            self._table(1024)
        i = <Py_ssize_t>(h & self.tab_mask)
        while True:
            slot = &self.tab[i]
            if slot.s == NULL:
                break
            if slot.h == h and (slot.s == <PyObject*>s or <object>slot.s == s):
                return slot.id
            i = (i + 1) & self.tab_mask
        self.strings.append(s)
        slot.s = <PyObject*>s
        slot.h = h
        slot.id = <int32_t>n
        if 3 * (n + 1) > 2 * self.tab_mask:
            self._table(2 * (self.tab_mask + 1))     # two thirds full: twice the room
        return <int>n

    cdef int sid_or_none(self, object s) except -2:
        return -1 if s is None else self.sid(s)

    # ---- steps

    @cython.boundscheck(False)
    @cython.wraparound(False)
    cdef int _steps(self, list steps_in) except -1:
        cdef Py_ssize_t i
        cdef object st, name
        cdef PyObject** f = self.f
        cdef dict node_of = self.node_of
        cdef list step_names = self.step_names
        cdef list initial = self.initial
        cdef I32Vec* flags = &self.t[X_STEP_FLAGS]
        for i in range(len(steps_in)):
            st = steps_in[i]
            if not isinstance(st, dict):
                self.err("SFC013", at("$.Steps", i, ""), "a step is an object with a Name")
                step_names.append(None)
                i32_push(flags, 0)
                continue
            self.step_fields(st, i, f, self.keep)
            name = self.name(val(f[F_NAME]), "$.Steps", i, "a step")
            ini = False if f[F_INITIAL] == NULL else <object>f[F_INITIAL]
            if not isinstance(ini, bool):
                self.err("SFC013", at("$.Steps", i, ".Initial"), "Initial must be true or false")
                ini = False
            if name is not None and not _insert_new(node_of, name, len(step_names)):
                self.err("SFC002", at("$.Steps", i, ".Name"), f"duplicate step name {name!r}")
            step_names.append(name)
            i32_push(flags, SF_INITIAL if ini else 0)
            if ini:
                initial.append(i)
        self.S = len(step_names)
        self.step_path = [-1] * self.S
        if len(initial) != 1:
            if not initial:
                self.err("SFC001", "$.Steps", "no step is marked Initial; exactly one must be")
            else:
                names = ", ".join(repr(step_names[i]) for i in initial)
                self.err("SFC001", "$.Steps",
                         f"{len(initial)} steps are marked Initial ({names}); exactly one must be")
        return 0

    # ---- branches and their paths

    @cython.boundscheck(False)
    @cython.wraparound(False)
    cdef int _branches(self, list brs_in) except -1:
        cdef Py_ssize_t bi, i
        # branch names first, so a path that names a branch is told apart from a typo
        for bi in range(len(brs_in)):
            self._branch(brs_in[bi], bi)
        for bi in range(len(brs_in)):
            if isinstance(brs_in[bi], dict):
                self._paths(brs_in[bi], bi)
            self.br_path_off.append(len(self.path_branch))
        self.B = len(self.br_names)
        self.P = len(self.path_branch)
        for i in self.initial:
            if self.step_path[i] != -1:
                self.err("SFC023", at("$.Steps", i, ""),
                         f"initial step {self.step_names[i]!r} is inside a branch path")
        return 0

    cdef int _branch(self, object br, Py_ssize_t bi) except -1:
        """A branch's name and type."""
        name = None
        tcode = B_SELECTION
        if not isinstance(br, dict):
            self.err("SFC013", at("$.Branches", bi, ""),
                     "a branch is an object with Name, Type and Branches")
        else:
            self.unknown_keys(br, _BRANCH_KEYS, "$.Branches", bi)
            name = self.name(get(br, "Name"), "$.Branches", bi, "a branch")
            btype = get(br, "Type")
            if not is_str(btype) or btype not in BRANCH_TYPES:
                self.err("SFC020", at("$.Branches", bi, ".Type"),
                         f"unknown branch type {str(btype)[:80]!r}; "
                         f"use selection or simultaneous")
            else:
                tcode = BRANCH_TYPES[btype]
            if name is not None:
                if name in self.node_of:
                    self.err("SFC002", at("$.Branches", bi, ".Name"),
                             f"duplicate name {name!r} (steps and branches share one "
                             f"namespace)")
                else:
                    self.node_of[name] = self.S + bi
        self.br_names.append(name)
        self.br_types.append(tcode)
        return 0

    @cython.boundscheck(False)
    @cython.wraparound(False)
    cdef int _paths(self, object br, Py_ssize_t bi) except -1:
        """The paths of a branch: each a list of steps in no other path."""
        cdef Py_ssize_t pi
        name = self.br_names[bi]
        paths = get(br, "Branches")
        if not isinstance(paths, list):
            self.err("SFC013", at("$.Branches", bi, ".Branches"),
                     "Branches must be a list of step lists")
            return 0
        if not paths:
            self.err("SFC008", at("$.Branches", bi, ".Branches"),
                     f"branch {name!r} has no paths")
        for pi in range(len(paths)):
            path = paths[pi]
            if not isinstance(path, list):
                self.err("SFC013", f"$.Branches[{bi}].Branches[{pi}]",
                         "a branch path is a list of step names")
                continue
            if not path:
                self.err("SFC008", f"$.Branches[{bi}].Branches[{pi}]",
                         f"path {pi} of branch {name!r} is empty")
                continue
            self._path(path, bi, pi)
            self.path_off.append(len(self.path_steps))
        return 0

    @cython.boundscheck(False)
    @cython.wraparound(False)
    cdef int _path(self, list path, Py_ssize_t bi, Py_ssize_t pi) except -1:
        cdef Py_ssize_t k
        cdef int S = self.S
        cdef list step_path = self.step_path
        pidx = len(self.path_branch)
        self.path_branch.append(bi)
        for k in range(len(path)):
            sname = path[k]
            if not is_str(sname):
                self.err("SFC013", f"$.Branches[{bi}].Branches[{pi}][{k}]",
                         "a branch path lists step names (text)")
                continue
            node = self.node_of.get(sname)
            if node is None:
                self.err("SFC003", f"$.Branches[{bi}].Branches[{pi}][{k}]",
                         f"unknown step {sname!r}")
                continue
            if node >= S:
                self.err("SFC019", f"$.Branches[{bi}].Branches[{pi}][{k}]",
                         f"{sname!r} is a branch; paths hold steps only (no nesting)")
                continue
            if step_path[node] != -1:
                self.err("SFC009", f"$.Branches[{bi}].Branches[{pi}][{k}]",
                         f"step {sname!r} is already in a branch path")
                continue
            step_path[node] = pidx
            self.path_steps.append(node)
        return 0

    # ---- actions: one entry per association in every table, valid or not

    @cython.boundscheck(False)
    @cython.wraparound(False)
    cdef int _actions(self, list acts_in) except -1:
        cdef Py_ssize_t ai
        self.A = len(acts_in)
        for ai in range(self.A):
            a = acts_in[ai]
            if isinstance(a, dict):
                self._action(a, ai)
            else:
                self.err("SFC013", at("$.Actions", ai, ""), "an action is an object")
                self.v110(None, ai, -1, -1, 0, 0)       # the v_* fields blank
                self._push_action(None, None, None, -1, -1, -1, 0)
        return 0

    @cython.boundscheck(False)
    @cython.wraparound(False)
    cdef int _action(self, dict a, Py_ssize_t ai) except -1:
        cdef PyObject** f = self.f
        cdef int sidx, qc, ic, n_v110
        cdef int64_t timeout
        n_v110 = self.action_fields(a, ai, f, self.keep)
        name = self.name(val(f[F_NAME]), "$.Actions", ai, "an action")
        if name is not None:
            self._action_name(name, ai)
        step = val(f[F_STEP])
        sidx = -1
        if not is_str(step):
            self.err("SFC013", at("$.Actions", ai, ".Step"), "Step is required (a step name)")
        else:
            found = _lookup(self.node_of, step)
            if found is None or found >= self.S:
                self.err("SFC003", at("$.Actions", ai, ".Step"), f"unknown step {step!r}")
            else:
                sidx = found
        q = val(f[F_QUALIFIER])
        found = _lookup(_QUAL, q) if is_str(q) else None
        if found is None:
            self.err("SFC006", at("$.Actions", ai, ".Qualifier"),
                     f"unknown qualifier {str(q)[:40]!r}; use one of "
                     f"{', '.join(QUALIFIERS)}")
            qc = -1
        else:
            qc = found
        inter = val(f[F_INTERACTION])
        found = _lookup(_INTER, inter) if is_str(inter) else None
        if found is None:
            self.err("SFC007", at("$.Actions", ai, ".Interaction"),
                     f"unknown interaction {str(inter)[:40]!r}; use push_command or "
                     f"pull_event")
            ic = -1
        else:
            ic = found
        type_id = self.text(val(f[F_TYPE_ID]), "$.Actions", ai, ".TypeId", "TypeId")
        found = self.seconds(val(f[F_TIMEOUT]), "TimeoutSeconds", "$.Actions", ai,
                             "SFC005", False)
        timeout = 0 if found is None else found
        ptext = self._parameters(val(f[F_PARAMETERS]), ai)
        self.v110(a, ai, qc, ic, timeout, n_v110)
        if qc >= 0 and qc != Q_R and name is not None \
                and not _insert_new(self.stored, name, ai):
            self.err("SFC002", at("$.Actions", ai, ".Name"), f"duplicate action name {name!r}")
        self._push_action(name, type_id, ptext, sidx, qc, ic, timeout)
        return 0

    cdef void _action_name(self, str name, Py_ssize_t ai):
        """An action's name goes into command ids and markers: no ':', no blanks."""
        flaw = _name_flaw(name)
        if flaw == 1:
            self.err("SFC004", at("$.Actions", ai, ".Name"),
                     f"action name {name!r} contains ':'; command ids and markers "
                     f"use ':' as a separator")
        elif name in RESERVED_ACTION_NAMES:
            self.err("SFC004", at("$.Actions", ai, ".Name"),
                     f"action name {name!r} is reserved (job.* names job parameters)")
        elif flaw == 2:
            self.err("SFC004", at("$.Actions", ai, ".Name"),
                     f"action name {name!r} contains whitespace or control characters")

    cdef object _parameters(self, object params, Py_ssize_t ai):
        """Parameters as canonical JSON text; None when absent or after reporting."""
        ptext = None
        if params is None:
            return None
        if not isinstance(params, dict):
            self.err("SFC013", at("$.Actions", ai, ".Parameters"),
                     "Parameters must be an object")
            return None
        if type(params) is dict:
            ptext = flat_canonical(<dict>params)
        try:
            if ptext is None:
                ptext = canonical_dumps(params)
        except (TypeError, ValueError) as e:
            self.err("SFC013", at("$.Actions", ai, ".Parameters"),
                     f"Parameters must be JSON data: {e}")
            return None
        if len(ptext) > MAX_PARAMS_CHARS:
            self.err("SFC015", at("$.Actions", ai, ".Parameters"),
                     f"Parameters are {len(ptext)} characters as JSON, the "
                     f"limit is {MAX_PARAMS_CHARS}")
            return None
        return ptext

    cdef int _push_action(self, object name, object type_id, object ptext, int sidx,
                          int qc, int ic, int64_t timeout) except -1:
        """An action's entry in every table; its v1.1.0 fields from the v_* ones."""
        self.a_names.append(name)
        self.a_types.append(type_id)
        self.a_params.append(ptext)
        self.a_hold.append(self.v_hold)
        self.a_restart.append(self.v_restart)
        self.a_subj.append(self.v_subject)
        self.a_corr.append(self.v_corr)
        i32_push(&self.t[X_A_STEP], sidx)
        i32_push(&self.t[X_A_QUAL], qc)
        i32_push(&self.t[X_A_INTER], ic)
        i32_push(&self.t[X_A_RETRIES], self.v_retries)
        i64_push(&self.t64[X_A_TIMEOUT], timeout)
        i64_push(&self.t64[X_A_HOLD_TIMEOUT], self.v_hold_timeout)
        i64_push(&self.t64[X_A_DURATION], self.v_duration)
        return 0

    @cython.boundscheck(False)
    @cython.wraparound(False)
    cdef int _resets(self) except -1:
        """Resets (R) name a stored (S) action in another step."""
        cdef Py_ssize_t ai
        cdef int32_t x
        cdef const int32_t* a_step = self.t[X_A_STEP].data
        cdef const int32_t* a_qual = self.t[X_A_QUAL].data
        for ai in range(self.A):
            x = -1
            name = self.a_names[ai]
            if a_qual[ai] == Q_R and name is not None:
                target = self.stored.get(name)
                if target is None or a_qual[<Py_ssize_t>target] != Q_S:
                    self.err("SFC016", at("$.Actions", ai, ".Name"),
                             f"R resets {name!r}, which is not an S (stored) action")
                elif (a_step[<Py_ssize_t>target] >= 0
                      and a_step[<Py_ssize_t>target] == a_step[ai]):
                    self.err("SFC016", at("$.Actions", ai, ".Step"),
                             f"R of {name!r} must be in a later step than its S")
                else:
                    x = target
            i32_push(&self.t[X_A_RESET], x)
        return 0

    # ---- transitions

    @cython.boundscheck(False)
    @cython.wraparound(False)
    cdef int _transitions(self, list trans_in) except -1:
        cdef Py_ssize_t ti
        self.cb = CondBuilder(self.stored)
        self.cb_add = self.cb.add
        self.has_out = bytearray(self.S + self.B)
        self.path_entry = bytearray(self.P)
        for ti in range(len(trans_in)):
            tr = trans_in[ti]
            if not isinstance(tr, dict):
                self.err("SFC013", at("$.Transitions", ti, ""),
                         "a transition is an object with Source, Target, Condition")
                continue
            self._transition(tr, ti)
        return 0

    @cython.boundscheck(False)
    @cython.wraparound(False)
    cdef int _transition(self, dict tr, Py_ssize_t ti) except -1:
        cdef PyObject** f = self.f
        cdef int src, dst, cidx = -1, kind
        self.transition_fields(tr, ti, f, self.keep)
        src = self._end(val(f[F_SOURCE]), "Source", ti)
        dst = self._end(val(f[F_TARGET]), "Target", ti)
        cond_text = val(f[F_CONDITION])
        if not is_str(cond_text):
            self.err("SFC013", at("$.Transitions", ti, ".Condition"),
                     "Condition is required (text; 'always' for none)")
            cond_text = None
        elif len(cond_text) > MAX_FIELD_CHARS:
            self.err("SFC015", at("$.Transitions", ti, ".Condition"),
                     f"Condition is {len(cond_text)} characters, the limit is "
                     f"{MAX_FIELD_CHARS}")
            cond_text = None
        elif cond_text != "always":     # the common case skips the builder call
            try:
                cidx = self.cb_add(cond_text)
            except ConditionSyntaxError as e:
                self.err("SFC011", at("$.Transitions", ti, ".Condition"),
                         f"{e.message} at position {e.position} in {cond_text[:200]!r}")
        prio = 0 if f[F_PRIORITY] == NULL else <object>f[F_PRIORITY]
        if not is_int(prio) or not (-1_000_000 <= prio <= 1_000_000):
            self.err("SFC013", at("$.Transitions", ti, ".Priority"),
                     "Priority must be a whole number between -1000000 and 1000000")
            prio = 0
        if src < 0 or dst < 0:
            return 0
        kind = self._kind(src, dst, cidx, ti)
        if kind < 0:
            return 0
        if kind == TK_ENTRY:
            self.path_entry[<Py_ssize_t>self.step_path[dst]] = 1
        self.has_out[src] = 1
        _push_transition(self.t, src, dst, prio, cidx, kind, self.sid_or_none(cond_text))
        return 0

    cdef int _end(self, object v, str key, Py_ssize_t ti) except -2:
        """The node a transition's Source or Target names, or -1 after reporting."""
        if not is_str(v):
            self.err("SFC013", at("$.Transitions", ti, "." + key),
                     f"{key} is required (a step or branch name)")
            return -1
        cdef PyObject* node = PyDict_GetItemWithError(self.node_of, v)
        if node == NULL:
            self.err("SFC003", at("$.Transitions", ti, "." + key),
                     f"unknown step or branch {v!r}")
            return -1
        return <int><object>node

    cdef int _kind(self, int src, int dst, int cidx, Py_ssize_t ti) except -2:
        """Classify a transition, or report why it crosses a branch path (-1)."""
        cdef int S = self.S, sp, dp
        cdef list step_path = self.step_path
        cdef list path_branch = self.path_branch
        cdef list step_names = self.step_names
        cdef list br_names = self.br_names
        if src < S:
            sp = step_path[src]
            dp = step_path[dst] if dst < S else -1
            if sp >= 0:
                if dst < S and dp == sp:
                    return TK_PATH
                if dst == S + path_branch[sp]:
                    return TK_PATH_END
                self.err("SFC019", at("$.Transitions", ti, ""),
                         f"a transition from {step_names[src]!r} (inside a branch path) must "
                         f"stay in its path, or target its own branch "
                         f"{br_names[path_branch[sp]]!r} to end the path")
                return -1
            if dst < S and dp >= 0:
                self.err("SFC019", at("$.Transitions", ti, ""),
                         f"{step_names[dst]!r} is inside a branch path; target the branch "
                         f"{br_names[path_branch[dp]]!r} instead")
                return -1
            return TK_STEP
        bi = src - S
        if dst < S and step_path[dst] >= 0:
            pidx = step_path[dst]
            if path_branch[pidx] == bi and self.path_steps[self.path_off[pidx]] == dst:
                if self.br_types[bi] == B_SIMULTANEOUS and cidx >= 0:
                    self.err("SFC019", at("$.Transitions", ti, ""),
                             f"every path of simultaneous branch {br_names[bi]!r} starts; an "
                             f"entry transition cannot carry a condition")
                    return -1
                return TK_ENTRY
            self.err("SFC019", at("$.Transitions", ti, ""),
                     f"{step_names[dst]!r} is inside a branch path and not the first step "
                     f"of a path of {br_names[bi]!r}")
            return -1
        return TK_EXIT

    # ---- a recipe without problems: the tables that follow from the others

    @cython.boundscheck(False)
    @cython.wraparound(False)
    cdef int _implicit(self) except -1:
        """Implicit transitions: the next step of a path (unless a step leaves by a
        transition of its own), the default entry of a selection path no explicit
        transition enters."""
        cdef I32Vec* t = self.t
        cdef Py_ssize_t pi, k, lo, hi
        cdef int32_t x
        cdef int S = self.S
        cdef const char* has_out = self.has_out
        cdef const char* path_entry = self.path_entry
        _push_list(&t[X_PATH_OFF], self.path_off)
        _push_list(&t[X_PATH_STEPS], self.path_steps)
        _push_list(&t[X_PATH_BRANCH], self.path_branch)
        _push_list(&t[X_B_TYPE], self.br_types)
        cdef const int32_t* poff = t[X_PATH_OFF].data
        cdef const int32_t* psteps = t[X_PATH_STEPS].data
        cdef const int32_t* pbranch = t[X_PATH_BRANCH].data
        cdef const int32_t* btypes = t[X_B_TYPE].data
        for pi in range(self.P):
            lo = poff[pi]
            hi = poff[pi + 1]
            for k in range(lo, hi - 1):
                x = psteps[k]
                if not has_out[x]:
                    _push_transition(t, x, psteps[k + 1], 0, -1, TK_IMPLICIT, -1)
            x = pbranch[pi]
            if btypes[x] == B_SELECTION and not path_entry[pi]:
                _push_transition(t, S + x, psteps[lo], 2_000_000, -1, TK_IMPLICIT, -1)
        return 0

    @cython.boundscheck(False)
    @cython.wraparound(False)
    cdef int _outgoing(self) except -1:
        """CSR of outgoing transitions, by priority then document order: a counting
        sort by source keeps document order; each node's few are then ordered by
        priority with a stable sort."""
        cdef I32Vec* t = self.t
        cdef Py_ssize_t i, k, n, lo, hi, N = self.S + self.B
        cdef int32_t x
        _csr(&t[X_NODE_OUT_OFF], &t[X_NODE_OUT], t[X_TR_SRC].data, t[X_TR_SRC].size, N)
        cdef int32_t* out = t[X_NODE_OUT].data
        cdef const int32_t* out_off = t[X_NODE_OUT_OFF].data
        cdef const int32_t* prio_of = t[X_TR_PRIO].data
        for n in range(N):
            lo = out_off[n]
            hi = out_off[n + 1]
            if hi - lo <= 1:
                continue
            if hi - lo <= INSERTION_SORT_MAX:
                for i in range(lo + 1, hi):
                    x = out[i]
                    k = i
                    while k > lo and prio_of[out[k - 1]] > prio_of[x]:
                        out[k] = out[k - 1]
                        k -= 1
                    out[k] = x
            else:
                keyed = sorted([(prio_of[out[i]], out[i]) for i in range(lo, hi)])
                for i in range(lo, hi):
                    out[i] = keyed[i - lo][1]
        return 0

    @cython.boundscheck(False)
    @cython.wraparound(False)
    cdef int _string_ids(self) except -1:
        """The string ids of every table, in the order that fixes them (and so the
        blob); the conditions' tables."""
        cdef I32Vec* t = self.t
        for name in self.a_names:
            i32_push(&t[X_A_NAME], self.sid(name))
        for name in self.a_types:
            i32_push(&t[X_A_TYPE], self.sid(name))
        for name in self.a_params:
            i32_push(&t[X_A_PARAMS], self.sid_or_none(name))
        for name in self.a_hold:
            i32_push(&t[X_A_HOLD], self.sid_or_none(name))
        for name in self.a_restart:
            i32_push(&t[X_A_RESTART], self.sid_or_none(name))
        for name in self.a_subj:
            i32_push(&t[X_A_SUBJ], self.sid_or_none(name))
        for name in self.a_corr:
            i32_push(&t[X_A_CORR], self.sid_or_none(name))
        for name in self.step_names:
            i32_push(&t[X_STEP_NAME], self.sid(name))
        for name in self.br_names:
            i32_push(&t[X_B_NAME], self.sid(name))
        i32_push(&t[X_REF_SEG_OFF], 0)
        for ref in self.cb.refs:
            i32_push(&t[X_REF_KIND], ref[0])
            i32_push(&t[X_REF_ACTION], ref[1])
            for name in ref[2]:
                i32_push(&t[X_REF_SEGS], self.sid(name))
            i32_push(&t[X_REF_SEG_OFF], <int32_t>t[X_REF_SEGS].size)
        for name in self.cb.consts:
            i32_push(&t[X_CONST_TEXT], self.sid(name))
        _push_list(&t[X_STEP_PATH], self.step_path)
        _push_list(&t[X_B_PATH_OFF], self.br_path_off)
        code, offsets = self.cb.tables()
        _push_bytes(&t[X_COND_OFF], offsets)
        _push_bytes(&t[X_CODE], code)
        return 0

    cdef Py_ssize_t _string_offsets(self) except -2:
        """The UTF-8 offsets of the strings (the bytes are copied by _pack); their
        total size, or -1 after reporting."""
        cdef Py_ssize_t size, total = 0
        cdef I32Vec* off = &self.t[X_STR_OFF]
        _reserve(off, len(self.strings) + 1)
        i32_push(off, 0)
        try:
            for name in self.strings:
                utf8_view(name, &size)
                total += size
                i32_push(off, <int32_t>total)   # wraps only past the limit
        except UnicodeEncodeError as e:
            # json.loads accepts lone surrogates ("\ud800"); they have no UTF-8 form.
            self.err("SFC014", "$", f"recipe text is not valid Unicode: {e.reason} "
                                    f"({e.object[e.start:e.end]!r})")
            return -1
        if total > MAX_RECIPE_BYTES:
            self.err("SFC015", "$", f"recipe text is {total} bytes, the limit is "
                                    f"{MAX_RECIPE_BYTES}")
            return -1
        return total

    @cython.boundscheck(False)
    @cython.wraparound(False)
    cdef object _pack(self):
        """The blob: header, tables, strings, fingerprint; None after reporting."""
        cdef Py_ssize_t total = self._string_offsets()
        if total < 0:
            return None
        cdef I32Vec* t = self.t
        cdef int32_t c[N_COUNTS]
        c[:] = [self.S, self.B, self.P, t[X_PATH_STEPS].size, t[X_TR_SRC].size, self.A,
                t[X_COND_OFF].size - 1, t[X_CODE].size, t[X_REF_KIND].size,
                t[X_REF_SEGS].size, t[X_CONST_TEXT].size, len(self.strings), total,
                self.initial[0]]
        cdef Py_ssize_t lengths[N_I32]
        cdef Py_ssize_t k, off, n
        cdef int32_t A = c[5], SB = c[12]
        off = i64_at(table_lengths(c, lengths))
        for k in range(N_I32):
            if t[k].size != lengths[k]:
                raise AssertionError(f"graph table {k} of length {t[k].size}, "
                                     f"expected {lengths[k]}")
        for k in range(N_I64):
            if self.t64[k].size != A:
                raise AssertionError(f"graph table {N_I32 + k} of length {self.t64[k].size}, "
                                     f"expected {A}")
        cdef bytes blob = PyBytes_FromStringAndSize(NULL, off + 3 * 8 * A + SB)
        cdef char* b = PyBytes_AS_STRING(blob)
        memset(b, 0, HEADER_SIZE)
        memcpy(b + COUNTS_AT, c, N_COUNTS * sizeof(int32_t))
        cdef char* w = b + HEADER_SIZE
        for k in range(N_I32):
            if lengths[k]:
                memcpy(w, t[k].data, lengths[k] * sizeof(int32_t))
                w += lengths[k] * sizeof(int32_t)
        memset(w, 0, (b + off) - w)
        w = b + off
        for k in range(N_I64):
            if A:
                memcpy(w, self.t64[k].data, A * sizeof(int64_t))
                w += A * sizeof(int64_t)
        cdef const char* u
        for name in self.strings:
            u = utf8_view(name, &n)
            memcpy(w, u, n)
            w += n
        # The fingerprint is taken over the canonical encoding itself: every field that
        # decides behaviour, in document order, Parameters as sorted-key JSON. Key order
        # and whitespace of the source do not reach it; the schema version does.
        fp = hashlib.blake2b(memoryview(blob)[COUNTS_AT:], digest_size=16,
                             person=b"sfc-recipe-1." + str(self.minor).encode()).digest()
        cdef uint16_t h16[4]
        h16[:] = [GRAPH_FORMAT_MAJOR, GRAPH_FORMAT_MINOR, self.minor, 0]
        memcpy(b, b"SFCG", 4)
        memcpy(b + 4, h16, 8)
        memcpy(b + FINGERPRINT_AT, <const char*>fp, 16)
        return blob
