# cython: language_level=3
"""The checks of one recipe element: its fields read in one walk, unknown fields, names,
texts, seconds and the v1.1.0 fields of an action. ``Checker`` collects every problem
(``err``); the compiler (compiler.pyx) builds on it and adds the graph's tables."""

from libc.stdint cimport int32_t, int64_t
from cpython.dict cimport PyDict_GetItem, PyDict_Next
from cpython.set cimport PySet_Contains
from cpython.object cimport PyObject
from cpython.unicode cimport Py_UNICODE_ISSPACE

from sfc_fast._layout cimport MAX_ELEMENTS
from sfc_fast.graph cimport I_PULL, I_PUSH, Q_D, Q_L

import re

from sfc_fast.graph import QUALIFIER_NAMES
from sfc_fast.problems import Problem

#: Largest timeout or duration, in seconds (about 11.5 days... times 100: ~3 years).
MAX_SECONDS = 100_000_000
#: Longest text field (names, type ids, conditions, Match templates).
MAX_FIELD_CHARS = 65536

V110_FIELDS = ("HoldTypeId", "RestartTypeId", "HoldTimeoutSeconds", "Retries",
               "DurationSeconds", "Match")
STEP_KEYS = frozenset(("Name", "Initial", "Description"))
TRANSITION_KEYS = frozenset(("Source", "Target", "Condition", "Priority", "Description"))
ACTION_KEYS = frozenset(("Name", "Step", "Qualifier", "Interaction", "TypeId",
                         "TimeoutSeconds", "Parameters", "Description") + V110_FIELDS)
cdef frozenset _STEP_KEYS = STEP_KEYS
cdef frozenset _TRANSITION_KEYS = TRANSITION_KEYS
cdef frozenset _ACTION_V100_KEYS = ACTION_KEYS - frozenset(V110_FIELDS)
cdef frozenset _MATCH_KEYS = frozenset(("Subject", "CorrelationId"))
# The fields compile reads of each element, in one walk of it (Checker._fields), in
# the order of the F_* positions.
cdef tuple _STEP_FIELDS = ("Description", "Name", "Initial")
cdef tuple _TRANSITION_FIELDS = ("Description", "Source", "Target", "Condition", "Priority")
cdef tuple _ACTION_FIELDS = ("Description", "Name", "Step", "Qualifier", "Interaction",
                             "TypeId", "TimeoutSeconds", "Parameters") + V110_FIELDS
cdef dict _STEP_INDEX = {f: k for k, f in enumerate(_STEP_FIELDS)}
cdef dict _TRANSITION_INDEX = {f: k for k, f in enumerate(_TRANSITION_FIELDS)}
cdef dict _ACTION_INDEX = {f: k for k, f in enumerate(_ACTION_FIELDS)}
_ABSENT = object()
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
PLACEHOLDERS = frozenset(("job", "scope", "action"))


cdef extern from "Python.h":
    PyObject* _tuple_item "PyTuple_GET_ITEM"(object t, Py_ssize_t i)
    PyObject* _list_item "PyList_GET_ITEM"(object t, Py_ssize_t i)


cdef str at(str base, Py_ssize_t i, str suffix):
    # JSON paths are built only when a problem is reported, never per element.
    if i < 0:
        return base + suffix
    return f"{base}[{i}]{suffix}"


cdef inline Py_ssize_t _field_index(tuple fields, Py_ssize_t n, dict index, list seen,
                                    PyObject* key):
    """The index of key in fields, -1 if absent: the same object as the field's literal
    (literal and interned keys) or as a key found before in this document (parsed JSON
    gives each distinct key of a document one object), else an equal str found through
    ``index`` (field -> its position) and remembered in ``seen``. Comparing each key
    with every field in turn was a sixth of the compile of a parsed document."""
    cdef Py_ssize_t k
    for k in range(n):
        if _tuple_item(fields, k) == key or _list_item(seen, k) == key:
            return k
    if type(<object>key) is not str:
        return -1
    # a str looked up among str keys: the lookup cannot raise
    cdef PyObject* v = PyDict_GetItem(index, <object>key)
    if v == NULL:
        return -1
    k = <Py_ssize_t><long><object>v
    seen[k] = <object>key
    return k


cdef inline bint _blank(object v):
    """not v.strip(), without the method call for a plain str."""
    cdef Py_UCS4 c
    if type(v) is not str:
        return not v.strip()
    for c in <str>v:
        if not Py_UNICODE_ISSPACE(c):
            return False
    return True


cdef class Checker:

    def __init__(self, int minor):
        self.minor = minor
        self.problems = []
        # a private sentinel, never a key of the input (None may be one)
        self.seen_step = [_ABSENT] * len(_STEP_FIELDS)
        self.seen_transition = [_ABSENT] * len(_TRANSITION_FIELDS)
        self.seen_action = [_ABSENT] * len(_ACTION_FIELDS)

    cdef void err(self, str code, str path, str message):
        self.problems.append(Problem(code, path, message))

    cdef list list_of(self, dict obj, str key, str path, bint required):
        """obj[key] as a list of at most MAX_ELEMENTS entries; [] after reporting."""
        v = obj.get(key)
        if v is None:
            if required:
                self.err("SFC013", path, f"{key} is required")
            return []
        if not isinstance(v, list):
            self.err("SFC013", f"{path}.{key}", f"{key} must be a list")
            return []
        if len(v) > MAX_ELEMENTS:
            self.err("SFC015", f"{path}.{key}",
                     f"{len(v)} entries, the limit is {MAX_ELEMENTS}")
            return []
        return v

    cdef void _description(self, object d, str base, Py_ssize_t idx):
        if d is not None and (not is_str(d) or len(d) > MAX_FIELD_CHARS):
            self.err("SFC013", at(base, idx, ".Description"),
                     f"Description must be text of at most {MAX_FIELD_CHARS} characters")

    cdef int step_fields(self, dict st, Py_ssize_t i, PyObject** out, list keep) except -1:
        return self._fields(st, _STEP_FIELDS, _STEP_INDEX, self.seen_step, 3, _STEP_KEYS,
                            "$.Steps", i, out, keep)

    cdef int transition_fields(self, dict tr, Py_ssize_t i, PyObject** out,
                               list keep) except -1:
        return self._fields(tr, _TRANSITION_FIELDS, _TRANSITION_INDEX, self.seen_transition,
                            5, _TRANSITION_KEYS, "$.Transitions", i, out, keep)

    cdef int action_fields(self, dict a, Py_ssize_t i, PyObject** out, list keep) except -1:
        # Checked against the v1.0.0 fields: the count of v1.1.0 ones tells v110
        # whether it has anything to look at.
        return self._fields(a, _ACTION_FIELDS, _ACTION_INDEX, self.seen_action, F_N_V100,
                            _ACTION_V100_KEYS, "$.Actions", i, out, keep)

    cdef int _fields(self, dict obj, tuple fields, dict index, list seen,
                     Py_ssize_t n_allowed, frozenset allowed, str base, Py_ssize_t idx,
                     PyObject** out, list keep) except -1:
        """out[k] = obj's value of fields[k] (NULL: absent), its Description checked and
        its unknown fields reported; returns how many of fields[n_allowed:] (v1.1.0
        fields) it has, as unknown_keys does. Values are borrowed from obj, or held
        by keep."""
        cdef Py_ssize_t n = len(fields), k, pos = 0
        cdef PyObject* kp
        cdef PyObject* vp
        cdef int n_v110 = 0
        for k in range(n):
            out[k] = NULL
        if type(obj) is dict:
            # the common case: one walk, every key one of fields
            while PyDict_Next(obj, &pos, &kp, &vp):
                k = _field_index(fields, n, index, seen, kp)
                if k < 0:
                    break
                out[k] = vp
                if k >= n_allowed:
                    n_v110 += 1
            else:
                self._description(val(out[F_DESC]), base, idx)
                return n_v110
        n_v110 = self.unknown_keys(obj, allowed, base, idx)
        for k in range(n):
            v = obj.get(fields[k], _ABSENT)
            if v is not _ABSENT:
                keep.append(v)
                out[k] = <PyObject*>v
        return n_v110

    cdef int unknown_keys(self, dict obj, frozenset allowed, str base,
                          Py_ssize_t idx) except -1:
        """Report unknown fields; return how many v1.1.0 fields obj has beyond allowed."""
        cdef int n_v110 = 0
        self._description(obj.get("Description"), base, idx)
        path = None
        cdef Py_ssize_t pos = 0
        cdef PyObject* kp
        cdef PyObject* vp
        if type(obj) is dict:
            # the common case: every key allowed, checked without a Python iterator
            while PyDict_Next(obj, &pos, &kp, &vp):
                if not PySet_Contains(allowed, <object>kp):
                    break
            else:
                return 0
        for k in obj:
            if k not in allowed:
                if isinstance(k, str) and k in V110_FIELDS:
                    n_v110 += 1
                    continue   # reported as SFC012 or validated where they belong
                if path is None:
                    path = at(base, idx, "")
                self.err("SFC021", f"{path}.{k}" if isinstance(k, str) else path,
                         f"unknown field {str(k)[:80]!r}")
        return n_v110

    cdef object name(self, object v, str base, Py_ssize_t idx, str what):
        if not is_str(v) or _blank(v):
            self.err("SFC013", at(base, idx, ".Name"), f"{what} needs a non-empty Name (text)")
            return None
        if len(v) > MAX_FIELD_CHARS:
            self.err("SFC015", at(base, idx, ".Name"),
                     f"Name is {len(v)} characters, the limit is {MAX_FIELD_CHARS}")
            return None
        return v

    cdef object text(self, object v, str base, Py_ssize_t idx, str suffix, str what):
        """A non-empty text field of bounded length, or None after reporting."""
        if not is_str(v) or not v:
            self.err("SFC013", at(base, idx, suffix), f"{what} is required (non-empty text)")
            return None
        if len(v) > MAX_FIELD_CHARS:
            self.err("SFC015", at(base, idx, suffix),
                     f"{what} is {len(v)} characters, the limit is {MAX_FIELD_CHARS}")
            return None
        return v

    cdef object seconds(self, object v, str key, str base, Py_ssize_t idx, str code,
                        bint allow_float):
        """A positive number of seconds as milliseconds, or None after reporting."""
        if allow_float:
            ok = (is_int(v) or type(v) is float) and v == v
        else:
            ok = is_int(v)
        if not ok:
            kind = "a number of seconds" if allow_float else "a whole number of seconds"
            self.err("SFC013" if v is None or not isinstance(v, (int, float)) else code,
                     at(base, idx, "." + key), f"{key} must be {kind}")
            return None
        if v <= 0:
            self.err(code, at(base, idx, "." + key), f"{key} must be greater than 0, not {v}")
            return None
        if v > MAX_SECONDS:
            self.err(code, at(base, idx, "." + key), f"{key} must be at most {MAX_SECONDS}")
            return None
        if type(v) is int:
            return v * 1000
        return int(round(v * 1000))

    # ---- the v1.1.0 fields of an action

    cdef void v110(self, dict a, Py_ssize_t ai, int qual, int inter, int64_t timeout,
                   int n_v110):
        """Check an action's v1.1.0 fields; what they say is left in the v_* fields."""
        self.v_hold = self.v_restart = self.v_subject = self.v_corr = None
        self.v_hold_timeout = 0
        self.v_retries = 0
        self.v_duration = 0
        present = [k for k in V110_FIELDS if k in a] if n_v110 else None
        if not present:
            if qual == Q_D or qual == Q_L:
                q = QUALIFIER_NAMES[qual]
                self.err("SFC017", at("$.Actions", ai, ".DurationSeconds"),
                         f"qualifier {q} needs DurationSeconds" + (
                             " (a v1.1.0 field)" if self.minor == 0 else ""))
            return
        if self.minor == 0:
            for k in present:
                self.err("SFC012", at("$.Actions", ai, "." + k),
                         f"{k} is a v1.1.0 field; this recipe declares v1.0.0")
            if qual == Q_D or qual == Q_L:
                self.err("SFC017", at("$.Actions", ai, ".DurationSeconds"),
                         f"qualifier {QUALIFIER_NAMES[qual]} needs DurationSeconds "
                         f"(a v1.1.0 field)")
            return
        self._hold(a, ai, inter, timeout)
        if "Retries" in a:
            r = a.get("Retries")
            if not is_int(r) or r < 0 or r > 1000:
                self.err("SFC024", at("$.Actions", ai, ".Retries"),
                         "Retries must be a whole number from 0 to 1000")
            elif inter == I_PULL and r:
                self.err("SFC018", at("$.Actions", ai, ".Retries"),
                         "Retries re-dispatch a command; a pull_event action has none")
            else:
                self.v_retries = r
        if "DurationSeconds" in a:
            if qual != Q_D and qual != Q_L:
                self.err("SFC017", at("$.Actions", ai, ".DurationSeconds"),
                         "only qualifiers D and L take DurationSeconds")
            else:
                v = self.seconds(a.get("DurationSeconds"), "DurationSeconds", "$.Actions",
                                 ai, "SFC017", True)
                if v is not None:
                    self.v_duration = v
        elif qual == Q_D or qual == Q_L:
            self.err("SFC017", at("$.Actions", ai, ".DurationSeconds"),
                     f"qualifier {QUALIFIER_NAMES[qual]} needs DurationSeconds")
        if "Match" in a:
            self._match(a.get("Match"), ai, inter)

    cdef void _hold(self, dict a, Py_ssize_t ai, int inter, int64_t timeout):
        """HoldTypeId, RestartTypeId and HoldTimeoutSeconds (the action's timeout when
        absent)."""
        hold = a.get("HoldTypeId")
        if hold is not None:
            if not is_str(hold) or not hold:
                self.err("SFC013", at("$.Actions", ai, ".HoldTypeId"),
                         "HoldTypeId must be non-empty text")
            elif inter == I_PULL:
                self.err("SFC018", at("$.Actions", ai, ".HoldTypeId"),
                         "only push_command actions can be held")
            else:
                self.v_hold = hold
        restart = a.get("RestartTypeId")
        if restart is not None:
            if hold is None:
                self.err("SFC010", at("$.Actions", ai, ".RestartTypeId"),
                         "RestartTypeId needs HoldTypeId")
            elif not is_str(restart) or not restart:
                self.err("SFC013", at("$.Actions", ai, ".RestartTypeId"),
                         "RestartTypeId must be non-empty text")
            else:
                self.v_restart = restart
        if "HoldTimeoutSeconds" in a:
            if hold is None:
                self.err("SFC010", at("$.Actions", ai, ".HoldTimeoutSeconds"),
                         "HoldTimeoutSeconds needs HoldTypeId")
            else:
                v = self.seconds(a.get("HoldTimeoutSeconds"), "HoldTimeoutSeconds",
                                 "$.Actions", ai, "SFC005", False)
                self.v_hold_timeout = 0 if v is None else v
        elif self.v_hold is not None:
            self.v_hold_timeout = timeout

    cdef void _match(self, object m, Py_ssize_t ai, int inter):
        """Match: the Subject and CorrelationId templates of a pull event."""
        if inter == I_PUSH:
            self.err("SFC018", at("$.Actions", ai, ".Match"),
                     "Match selects pull events; this is a push_command")
            return
        if not isinstance(m, dict):
            self.err("SFC013", at("$.Actions", ai, ".Match"),
                     "Match is an object with Subject and/or CorrelationId")
            return
        for k in m:
            if k not in _MATCH_KEYS:
                self.err("SFC021", f"$.Actions[{ai}].Match.{k}",
                         f"unknown Match field {str(k)[:40]!r}")
        for k, field in (("Subject", "subject"), ("CorrelationId", "corr")):
            if k not in m:
                continue
            v = m[k]
            if not is_str(v):
                self.err("SFC013", f"$.Actions[{ai}].Match.{k}",
                         f"Match.{k} must be text")
                continue
            bad = [ph for ph in _PLACEHOLDER.findall(v) if ph not in PLACEHOLDERS]
            if bad:
                self.err("SFC022", f"$.Actions[{ai}].Match.{k}",
                         f"unknown placeholder {{{bad[0]}}}; use {{job}}, {{scope}} or "
                         f"{{action}}")
                continue
            if field == "subject":
                self.v_subject = v
            else:
                self.v_corr = v
