# cython: language_level=3
"""Recipe compiler: validates a v1.0.0 / v1.1.0 SFC recipe and builds its graph.

Every problem of a recipe is collected and reported at once (``RecipeError``).
The graph is one immutable bytes blob with int32/int64 tables inside; the
``Graph`` object only holds typed pointers into it, so ``to_bytes`` is free and
``from_bytes`` is a bounds check, not a parse.
"""

cimport cython
from libc.stdint cimport int32_t, int64_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, malloc, realloc
from libc.string cimport memcmp, memcpy, memset, strlen
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_GetItem, PyDict_GetItemWithError, PyDict_Next
from cpython.set cimport PySet_Contains
from cpython.list cimport PyList_GET_SIZE
from cpython.object cimport PyObject
from cpython.unicode cimport PyUnicode_AsUTF8AndSize, PyUnicode_DecodeUTF8, Py_UNICODE_ISSPACE
from cpython.mem cimport PyMem_Free
from libc.math cimport isfinite

from sfc_fast._vec cimport I32Vec, I64Vec, i32_free, i32_push, i64_free, i64_push

from sfc_fast.conditions cimport CondContext, run_condition, verify_code

import gc
import hashlib
import json
import re

from sfc_fast.conditions import CondBuilder, ConditionSyntaxError, canonical_dumps

SCHEMA_V100 = "https://aschamberger.github.io/schemas/microdcs/sfc-recipe/v1.0.0/"
SCHEMA_V110 = "https://aschamberger.github.io/schemas/microdcs/sfc-recipe/v1.1.0/"
SCHEMAS = {SCHEMA_V100: 0, SCHEMA_V110: 1}

#: Largest recipe accepted, as JSON text (bytes).
MAX_RECIPE_BYTES = 8 * 1024 * 1024
#: Largest number of elements of one kind (steps, actions, transitions, branches).
MAX_ELEMENTS = 100_000
#: Largest timeout or duration, in seconds (about 11.5 days... times 100: ~3 years).
MAX_SECONDS = 100_000_000

QUALIFIERS = {"N": Q_N, "P": Q_P, "P1": Q_P1, "P0": Q_P0, "S": Q_S, "R": Q_R,
              "L": Q_L, "D": Q_D}
QUALIFIER_NAMES = {v: k for k, v in QUALIFIERS.items()}
INTERACTIONS = {"push_command": I_PUSH, "pull_event": I_PULL}
INTERACTION_NAMES = {v: k for k, v in INTERACTIONS.items()}
cdef dict _QUAL = QUALIFIERS
cdef dict _INTER = INTERACTIONS
BRANCH_TYPES = {"selection": B_SELECTION, "simultaneous": B_SIMULTANEOUS}
BRANCH_TYPE_NAMES = {v: k for k, v in BRANCH_TYPES.items()}
TRANSITION_KINDS = {TK_STEP: "step", TK_ENTRY: "entry", TK_EXIT: "exit",
                    TK_PATH: "path", TK_IMPLICIT: "implicit", TK_PATH_END: "path_end"}

V110_FIELDS = ("HoldTypeId", "RestartTypeId", "HoldTimeoutSeconds", "Retries",
               "DurationSeconds", "Match")
_RECIPE_KEYS = frozenset(("Steps", "Transitions", "Actions", "Branches", "Description"))
_STEP_KEYS = frozenset(("Name", "Initial", "Description"))
_TRANSITION_KEYS = frozenset(("Source", "Target", "Condition", "Priority", "Description"))
_BRANCH_KEYS = frozenset(("Name", "Type", "Branches", "Description"))
_ACTION_KEYS = frozenset(("Name", "Step", "Qualifier", "Interaction", "TypeId",
                          "TimeoutSeconds", "Parameters", "Description") + V110_FIELDS)
_ACTION_V100_KEYS = _ACTION_KEYS - frozenset(V110_FIELDS)
_MATCH_KEYS = frozenset(("Subject", "CorrelationId"))
# The fields compile reads of each element, in one walk of it (_Compiler._fields):
# Description first, the v1.1.0 ones of an action last.
cdef tuple _STEP_FIELDS = ("Description", "Name", "Initial")
cdef tuple _TRANSITION_FIELDS = ("Description", "Source", "Target", "Condition", "Priority")
cdef tuple _ACTION_FIELDS = ("Description", "Name", "Step", "Qualifier", "Interaction",
                             "TypeId", "TimeoutSeconds", "Parameters") + V110_FIELDS
cdef dict _STEP_INDEX = {f: k for k, f in enumerate(_STEP_FIELDS)}
cdef dict _TRANSITION_INDEX = {f: k for k, f in enumerate(_TRANSITION_FIELDS)}
cdef dict _ACTION_INDEX = {f: k for k, f in enumerate(_ACTION_FIELDS)}
cdef enum:
    F_DESC = 0
    F_NAME = 1
    F_INITIAL = 2
    F_SOURCE = 1
    F_TARGET = 2
    F_CONDITION = 3
    F_PRIORITY = 4
    F_STEP = 2
    F_QUALIFIER = 3
    F_INTERACTION = 4
    F_TYPE_ID = 5
    F_TIMEOUT = 6
    F_PARAMETERS = 7
    F_N_V100 = 8        # the action fields before the v1.1.0 ones
    F_MAX = 16
_ABSENT = object()
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
PLACEHOLDERS = frozenset(("job", "scope", "action"))
RESERVED_ACTION_NAMES = frozenset(("job",))

# Problem codes. Stable: tools and tests match on them.
CODES = {
    "SFC001": "not exactly one initial step",
    "SFC002": "duplicate name",
    "SFC003": "unknown step or branch",
    "SFC004": "invalid action name",
    "SFC005": "timeout must be a positive whole number of seconds",
    "SFC006": "unknown qualifier",
    "SFC007": "unknown interaction",
    "SFC008": "empty branch or empty branch path",
    "SFC009": "step in more than one branch path",
    "SFC010": "hold field without HoldTypeId",
    "SFC011": "condition does not parse",
    "SFC012": "v1.1.0 field in a v1.0.0 recipe",
    "SFC013": "missing field or wrong type",
    "SFC014": "unusable recipe (dataschema, not JSON, not an object)",
    "SFC015": "recipe too large",
    "SFC016": "reset of an action that is not stored",
    "SFC017": "duration missing or not allowed",
    "SFC018": "field not allowed for this interaction",
    "SFC019": "transition crosses a branch path",
    "SFC020": "unknown branch type",
    "SFC021": "unknown field",
    "SFC022": "unknown placeholder in Match",
    "SFC023": "initial step inside a branch path",
    "SFC024": "retries must be a whole number >= 0",
}


class Problem:
    """One problem of a recipe: a stable ``code``, a JSON ``path`` and a ``message``."""

    __slots__ = ("code", "path", "message")

    def __init__(self, code: str, path: str, message: str) -> None:
        self.code = code
        self.path = path
        self.message = message

    def __repr__(self) -> str:
        return f"Problem({self.code!r}, {self.path!r}, {self.message!r})"

    def __str__(self) -> str:
        return f"{self.code} {self.path}: {self.message}"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Problem) and (
            (self.code, self.path, self.message) == (other.code, other.path, other.message))

    def __hash__(self) -> int:
        return hash((self.code, self.path, self.message))

    def to_dict(self) -> dict:
        return {"code": self.code, "path": self.path, "message": self.message}


class RecipeError(ValueError):
    """A recipe that cannot run; ``problems`` lists every problem found."""

    def __init__(self, problems: list) -> None:
        self.problems = list(problems)
        first = self.problems[0] if self.problems else None
        more = len(self.problems) - 1
        text = str(first) if first is not None else "unusable recipe"
        if more > 0:
            text += f" (and {more} more problem{'s' if more > 1 else ''})"
        super().__init__(text)

    @property
    def codes(self) -> list:
        return [p.code for p in self.problems]


class GraphFormatError(ValueError):
    """Bytes that are not a graph this version can load."""


# ---------------------------------------------------------------- helpers

cdef inline bint _is_int(object v) noexcept:
    return type(v) is int or (isinstance(v, int) and not isinstance(v, bool))


cdef inline bint _is_str(object v) noexcept:
    return isinstance(v, str)


cdef inline object _get(object d, str key, object default=None):
    """d.get(key, default), without the method call for a plain dict."""
    cdef PyObject* v
    if type(d) is dict:
        v = PyDict_GetItem(d, key)
        return default if v == NULL else <object>v
    return d.get(key, default)


cdef inline object _val(PyObject* p):
    return None if p == NULL else <object>p


cdef extern from "Python.h":
    PyObject* _tuple_item "PyTuple_GET_ITEM"(object t, Py_ssize_t i)
    PyObject* _list_item "PyList_GET_ITEM"(object t, Py_ssize_t i)


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


def schema_minor(dataschema) -> int:
    """0 for v1.0.0, 1 for v1.1.0; RecipeError for anything else."""
    if not isinstance(dataschema, str):
        raise RecipeError([Problem("SFC014", "dataschema",
                                   "dataschema must be a string naming the recipe format")])
    minor = SCHEMAS.get(dataschema)
    if minor is None:
        # tolerate a missing trailing slash, nothing else
        minor = SCHEMAS.get(dataschema + "/")
    if minor is None:
        raise RecipeError([Problem(
            "SFC014", "dataschema",
            f"unknown dataschema {dataschema[:200]!r}; accepted: {SCHEMA_V100}, {SCHEMA_V110}")])
    return minor


def _load(data):
    if isinstance(data, (bytes, bytearray, memoryview)):
        raw = bytes(data)
        if len(raw) > MAX_RECIPE_BYTES:
            raise RecipeError([Problem("SFC015", "$",
                                       f"recipe is {len(raw)} bytes, the limit is "
                                       f"{MAX_RECIPE_BYTES}")])
        try:
            data = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise RecipeError([Problem("SFC014", "$", f"recipe is not UTF-8 text: {e.reason} "
                                                      f"at byte {e.start}")]) from None
    if isinstance(data, str):
        if len(data) > MAX_RECIPE_BYTES:
            raise RecipeError([Problem("SFC015", "$",
                                       f"recipe is {len(data)} characters, the limit is "
                                       f"{MAX_RECIPE_BYTES}")])
        try:
            data = json.loads(data)
        except json.JSONDecodeError as e:
            raise RecipeError([Problem("SFC014", "$",
                                       f"recipe is not JSON: {e.msg} at line {e.lineno} "
                                       f"column {e.colno}")]) from None
        except RecursionError:
            raise RecipeError([Problem("SFC014", "$", "recipe is nested too deeply")]) from None
    return data


#: Longest text field (names, type ids, conditions, Match templates).
MAX_FIELD_CHARS = 65536
#: Longest Parameters object of one action, as JSON.
MAX_PARAMS_CHARS = 1024 * 1024


def canonical_json(obj) -> bytes:
    """Sorted keys, no whitespace: how Parameters are stored and fingerprinted."""
    return canonical_dumps(obj).encode("utf-8")


# ---------------------------------------------------------------- flat canonical JSON

from sfc_fast._text cimport PyUnicode_DATA, PyUnicode_IS_ASCII, PyUnicode_New, utf8_view

cdef extern from "Python.h":
    PyObject* PyDict_SetDefault(object d, object key, object default) except NULL
    char* PyOS_double_to_string(double val, char format_code, int precision, int flags,
                                int* ptype) except NULL
    int Py_DTSF_ADD_DOT_0
    long long PyLong_AsLongLongAndOverflow(object o, int* overflow) except? -1

cdef struct _Item:
    const char* key
    Py_ssize_t klen
    PyObject* value

cdef enum:
    FLAT_MAX_KEYS = 32
    FLAT_BUF = 4096

cdef char* _HEX = b"0123456789abcdef"

# A direct-mapped cache of float reprs (bit pattern -> text), FC_SIZE entries.
cdef enum:
    FC_SIZE = 64
    FC_TEXT = 32
cdef uint64_t _fc_bits[FC_SIZE]
cdef char _fc_text[FC_SIZE][FC_TEXT]
cdef Py_ssize_t _fc_len[FC_SIZE]


cdef Py_ssize_t _put_str(char* w, Py_ssize_t at, const char* s, Py_ssize_t n) noexcept:
    """Write s as a JSON string (json's encode_basestring for ASCII) at w[at];
    return the new end, or -1 when the buffer would overflow."""
    cdef Py_ssize_t k
    cdef unsigned char c
    if at + 2 + 6 * n > FLAT_BUF:
        return -1
    w[at] = b'"'
    at += 1
    for k in range(n):
        c = <unsigned char>s[k]
        if c >= 0x20 and c != b'"' and c != b'\\':
            w[at] = <char>c
            at += 1
        else:
            w[at] = b'\\'
            if c == b'"' or c == b'\\':
                w[at + 1] = <char>c
                at += 2
            elif c == b'\n':
                w[at + 1] = b'n'
                at += 2
            elif c == b'\r':
                w[at + 1] = b'r'
                at += 2
            elif c == b'\t':
                w[at + 1] = b't'
                at += 2
            elif c == 8:
                w[at + 1] = b'b'
                at += 2
            elif c == 12:
                w[at + 1] = b'f'
                at += 2
            else:
                w[at + 1] = b'u'
                w[at + 2] = b'0'
                w[at + 3] = b'0'
                w[at + 4] = _HEX[c >> 4]
                w[at + 5] = _HEX[c & 15]
                at += 6
    w[at] = b'"'
    return at + 1


cdef object _flat_canonical(dict d):
    """canonical_dumps(d) for a flat object with ASCII text keys and str/int/float/bool/
    None values of the exact built-in types; None when anything else is in it (the
    caller then takes the general path, which also reports errors)."""
    cdef Py_ssize_t n = len(d), i, k, at, m, h
    cdef _Item items[FLAT_MAX_KEYS]
    cdef _Item tmp
    cdef char buf[FLAT_BUF + 8]    # a separator or the closing brace may land at FLAT_BUF
    cdef char* num
    cdef const char* u
    cdef long long iv
    cdef int overflow
    cdef double fv
    cdef uint64_t bits
    cdef object key, value
    if n > FLAT_MAX_KEYS:
        return None
    i = 0
    for key, value in d.items():
        if type(key) is not str or not PyUnicode_IS_ASCII(key):
            return None
        items[i].key = PyUnicode_AsUTF8AndSize(key, &items[i].klen)
        items[i].value = <PyObject*>value
        i += 1
    # insertion sort by code point (byte order for ASCII)
    for i in range(1, n):
        tmp = items[i]
        k = i
        while k > 0 and _key_less(tmp.key, tmp.klen, items[k - 1].key, items[k - 1].klen):
            items[k] = items[k - 1]
            k -= 1
        items[k] = tmp
    buf[0] = b'{'
    at = 1
    for i in range(n):
        if i:
            buf[at] = b','
            at += 1
        at = _put_str(buf, at, items[i].key, items[i].klen)
        if at < 0 or at + 40 > FLAT_BUF:
            return None
        buf[at] = b':'
        at += 1
        value = <object>items[i].value
        if value is None:
            memcpy(buf + at, b"null", 4)
            at += 4
        elif value is True:
            memcpy(buf + at, b"true", 4)
            at += 4
        elif value is False:
            memcpy(buf + at, b"false", 5)
            at += 5
        elif type(value) is int:
            iv = PyLong_AsLongLongAndOverflow(value, &overflow)
            if overflow:
                return None
            at += _put_int(buf + at, iv)
        elif type(value) is float:
            fv = value
            if not isfinite(fv):
                return None
            # float repr (shortest round-trip digits) is the costly part; the
            # parameters of a recipe repeat a few values, so remember recent ones
            memcpy(&bits, &fv, 8)
            h = <Py_ssize_t>((bits * <uint64_t>0x9E3779B97F4A7C15) >> (64 - 6))
            if _fc_len[h] == 0 or _fc_bits[h] != bits:
                num = PyOS_double_to_string(fv, b'r', 0, Py_DTSF_ADD_DOT_0, NULL)
                m = strlen(num)
                if m >= FC_TEXT:
                    PyMem_Free(num)
                    return None
                memcpy(_fc_text[h], num, m)
                PyMem_Free(num)
                _fc_bits[h] = bits
                _fc_len[h] = m
            m = _fc_len[h]
            if at + m + 2 > FLAT_BUF:
                return None
            memcpy(buf + at, _fc_text[h], m)
            at += m
        elif type(value) is str:
            if not PyUnicode_IS_ASCII(value):
                return None
            u = PyUnicode_AsUTF8AndSize(value, &m)
            at = _put_str(buf, at, u, m)
            if at < 0:
                return None
        else:
            return None
    buf[at] = b'}'
    at += 1
    # all of it is ASCII (keys and text checked above, numbers and escapes are):
    # a new ASCII str filled in place, without a scan for its widest character
    out = PyUnicode_New(at, 127)
    memcpy(PyUnicode_DATA(out), buf, at)
    return out


cdef inline bint _key_less(const char* a, Py_ssize_t na, const char* b, Py_ssize_t nb) noexcept:
    cdef int c = memcmp(a, b, na if na < nb else nb)
    if c != 0:
        return c < 0
    return na < nb


cdef Py_ssize_t _put_int(char* w, long long v) noexcept:
    cdef char tmp[24]
    cdef Py_ssize_t n = 0, k
    cdef unsigned long long u
    cdef bint neg = v < 0
    if neg:
        u = <unsigned long long>(-(v + 1)) + 1
    else:
        u = <unsigned long long>v
    while True:
        tmp[n] = <char>(48 + u % 10)
        n += 1
        u //= 10
        if u == 0:
            break
    k = 0
    if neg:
        w[0] = b'-'
        k = 1
    while n > 0:
        n -= 1
        w[k] = tmp[n]
        k += 1
    return k


# ---------------------------------------------------------------- blob layout

# int32 tables in blob order, with their length in terms of the counts
# (S, B, P, PS, T, A, C, K, R, RS, CN, NS, SB, initial).
cdef enum:
    HEADER_SIZE = 88

_MAGIC = b"SFCG"


cdef Py_ssize_t _table_lengths(const int32_t* c, Py_ssize_t* out) noexcept:
    """Lengths of the int32 tables, in blob order, from the header counts; returns
    their sum. The one place the layout is written down (pack, attach, arrays)."""
    cdef int32_t S = c[0], B = c[1], P = c[2], PS = c[3], T = c[4], A = c[5], C = c[6]
    cdef int32_t K = c[7], R = c[8], RS = c[9], CN = c[10], NS = c[11]
    cdef Py_ssize_t k, total = 0
    out[:N_I32] = [S, S, S, S + 1, A,
                   S + B + 1, T,
                   T, T, T, T, T, T,
                   A, A, A, A, A, A, A, A, A, A, A, A,
                   B, B, B + 1,
                   P, P + 1, PS,
                   C + 1, K, R, R, R + 1, RS, CN,
                   NS + 1]
    for k in range(N_I32):
        total += out[k]
    return total


# ---------------------------------------------------------------- compiler

# The int32 tables of the blob, in blob order (_attach reads them back). The compiler
# fills one growable C vector per table; packing is a memcpy per table.
cdef enum:
    X_STEP_NAME
    X_STEP_FLAGS
    X_STEP_PATH
    X_STEP_ACT_OFF
    X_STEP_ACTS
    X_NODE_OUT_OFF
    X_NODE_OUT
    X_TR_SRC
    X_TR_DST
    X_TR_PRIO
    X_TR_COND
    X_TR_KIND
    X_TR_TEXT
    X_A_NAME
    X_A_STEP
    X_A_QUAL
    X_A_INTER
    X_A_TYPE
    X_A_PARAMS
    X_A_HOLD
    X_A_RESTART
    X_A_RETRIES
    X_A_SUBJ
    X_A_CORR
    X_A_RESET
    X_B_NAME
    X_B_TYPE
    X_B_PATH_OFF
    X_PATH_BRANCH
    X_PATH_OFF
    X_PATH_STEPS
    X_COND_OFF
    X_CODE
    X_REF_KIND
    X_REF_ACTION
    X_REF_SEG_OFF
    X_REF_SEGS
    X_CONST_TEXT
    X_STR_OFF
    N_I32

# int64 tables, after the int32 ones.
cdef enum:
    X_A_TIMEOUT
    X_A_HOLD_TIMEOUT
    X_A_DURATION
    N_I64

# A bucket of transitions leaving one node longer than this is ordered by Python's
# sort rather than by insertion (a hostile recipe may give one node 100,000).
cdef enum:
    INSERTION_SORT_MAX = 16


cdef str _at(str base, Py_ssize_t i, str suffix):
    # JSON paths are built only when a problem is reported, never per element.
    if i < 0:
        return base + suffix
    return f"{base}[{i}]{suffix}"


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


cdef struct _Slot:
    PyObject* s
    uint32_t h      # the low bits of the str's hash: most mismatches end here
    int32_t id


cdef class _Compiler:
    cdef int minor
    cdef list problems
    cdef list strings       # by id; holds the references the table borrows
    # string -> id: open addressing over (hash, borrowed str, id), a C probe per lookup
    # rather than a dict operation and an int object per string
    cdef _Slot* tab
    cdef Py_ssize_t tab_mask
    cdef I32Vec t[N_I32]
    cdef I64Vec t64[N_I64]
    # what _v110 found for the action at hand
    cdef object v_hold
    cdef object v_restart
    cdef object v_subject
    cdef object v_corr
    cdef int64_t v_hold_timeout
    cdef int64_t v_duration
    cdef int32_t v_retries
    # per element kind, the key objects of this document that named each field
    cdef list seen_step, seen_transition, seen_action

    def __init__(self, int minor):
        self.minor = minor
        self.problems = []
        self.strings = []
        # a private sentinel, never a key of the input (None may be one)
        self.seen_step = [_ABSENT] * len(_STEP_FIELDS)
        self.seen_transition = [_ABSENT] * len(_TRANSITION_FIELDS)
        self.seen_action = [_ABSENT] * len(_ACTION_FIELDS)

    def __dealloc__(self):
        cdef int k
        free(self.tab)
        for k in range(N_I32):
            i32_free(&self.t[k])
        for k in range(N_I64):
            i64_free(&self.t64[k])

    cdef void err(self, str code, str path, str message):
        self.problems.append(Problem(code, path, message))

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

    cdef list _list(self, dict obj, str key, str path, bint required):
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
        if d is not None and (not _is_str(d) or len(d) > MAX_FIELD_CHARS):
            self.err("SFC013", _at(base, idx, ".Description"),
                     f"Description must be text of at most {MAX_FIELD_CHARS} characters")

    cdef int _fields(self, dict obj, tuple fields, dict index, list seen,
                     Py_ssize_t n_allowed, frozenset allowed, str base, Py_ssize_t idx,
                     PyObject** out, list keep) except -1:
        """out[k] = obj's value of fields[k] (NULL: absent), its Description checked and
        its unknown fields reported; returns how many of fields[n_allowed:] (v1.1.0
        fields) it has, as _unknown_keys does. Values are borrowed from obj, or held
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
                self._description(_val(out[F_DESC]), base, idx)
                return n_v110
        n_v110 = self._unknown_keys(obj, allowed, base, idx)
        for k in range(n):
            v = obj.get(fields[k], _ABSENT)
            if v is not _ABSENT:
                keep.append(v)
                out[k] = <PyObject*>v
        return n_v110

    cdef int _unknown_keys(self, dict obj, frozenset allowed, str base,
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
                    path = _at(base, idx, "")
                self.err("SFC021", f"{path}.{k}" if isinstance(k, str) else path,
                         f"unknown field {str(k)[:80]!r}")
        return n_v110

    cdef object _name(self, object v, str base, Py_ssize_t idx, str what):
        if not _is_str(v) or _blank(v):
            self.err("SFC013", _at(base, idx, ".Name"), f"{what} needs a non-empty Name (text)")
            return None
        if len(v) > MAX_FIELD_CHARS:
            self.err("SFC015", _at(base, idx, ".Name"),
                     f"Name is {len(v)} characters, the limit is {MAX_FIELD_CHARS}")
            return None
        return v

    cdef object _text(self, object v, str base, Py_ssize_t idx, str suffix, str what):
        """A non-empty text field of bounded length, or None after reporting."""
        if not _is_str(v) or not v:
            self.err("SFC013", _at(base, idx, suffix), f"{what} is required (non-empty text)")
            return None
        if len(v) > MAX_FIELD_CHARS:
            self.err("SFC015", _at(base, idx, suffix),
                     f"{what} is {len(v)} characters, the limit is {MAX_FIELD_CHARS}")
            return None
        return v

    cdef object _seconds(self, object v, str key, str base, Py_ssize_t idx, str code,
                         bint allow_float):
        if allow_float:
            ok = (_is_int(v) or type(v) is float) and v == v
        else:
            ok = _is_int(v)
        if not ok:
            kind = "a number of seconds" if allow_float else "a whole number of seconds"
            self.err("SFC013" if v is None or not isinstance(v, (int, float)) else code,
                     _at(base, idx, "." + key), f"{key} must be {kind}")
            return None
        if v <= 0:
            self.err(code, _at(base, idx, "." + key), f"{key} must be greater than 0, not {v}")
            return None
        if v > MAX_SECONDS:
            self.err(code, _at(base, idx, "." + key), f"{key} must be at most {MAX_SECONDS}")
            return None
        if type(v) is int:
            return v * 1000
        return int(round(v * 1000))

    cdef int _end(self, object v, str key, Py_ssize_t ti, dict node_of) except -2:
        """The node a transition's Source or Target names, or -1 after reporting."""
        if not _is_str(v):
            self.err("SFC013", _at("$.Transitions", ti, "." + key),
                     f"{key} is required (a step or branch name)")
            return -1
        cdef PyObject* node = PyDict_GetItemWithError(node_of, v)
        if node == NULL:
            self.err("SFC003", _at("$.Transitions", ti, "." + key),
                     f"unknown step or branch {v!r}")
            return -1
        return <int><object>node

    @cython.boundscheck(False)
    @cython.wraparound(False)
    def run(self, obj):
        if not isinstance(obj, dict):
            self.err("SFC014", "$", f"a recipe is a JSON object, not {type(obj).__name__}")
            return None
        self._unknown_keys(obj, _RECIPE_KEYS, "$", -1)
        cdef list steps_in = self._list(obj, "Steps", "$", True)
        cdef list trans_in = self._list(obj, "Transitions", "$", True)
        cdef list acts_in = self._list(obj, "Actions", "$", True)
        cdef list brs_in = self._list(obj, "Branches", "$", False)
        # room for the strings of a recipe this size (names, type ids, parameters,
        # conditions), so the id table is not rehashed as it grows
        cdef Py_ssize_t cap = 1024, want = min(
            3 * len(acts_in) + len(steps_in) + len(brs_in) + len(trans_in) + 64, 1 << 20)
        while 2 * cap < 3 * want:
            cap *= 2
        if self.tab == NULL:
            self._table(cap)
        cdef I32Vec* t = self.t
        cdef I64Vec* t64 = self.t64
        cdef Py_ssize_t i, k, ai, ti, bi, pi, lo, hi, n
        # the int32 tables of one entry per step, action or transition at their size at
        # once rather than grown by copies
        for k in range(X_A_NAME, X_A_RESET + 1):
            _reserve(&t[k], len(acts_in))
        for k in range(X_TR_SRC, X_TR_TEXT + 1):
            _reserve(&t[k], len(trans_in))
        for k in (X_STEP_NAME, X_STEP_FLAGS, X_STEP_PATH):
            _reserve(&t[k], len(steps_in))
        cdef int32_t x, j
        cdef object st, br, a, tr, name

        # ---- steps
        cdef PyObject* f[F_MAX]         # the fields of the element at hand
        cdef list keep = []
        cdef dict node_of = {}          # name -> node id
        cdef list step_names = []
        cdef list initial = []
        for i in range(len(steps_in)):
            st = steps_in[i]
            if not isinstance(st, dict):
                self.err("SFC013", _at("$.Steps", i, ""), "a step is an object with a Name")
                step_names.append(None)
                i32_push(&t[X_STEP_FLAGS], 0)
                continue
            self._fields(st, _STEP_FIELDS, _STEP_INDEX, self.seen_step, 3, _STEP_KEYS,
                         "$.Steps", i, f, keep)
            name = self._name(_val(f[F_NAME]), "$.Steps", i, "a step")
            ini = False if f[F_INITIAL] == NULL else <object>f[F_INITIAL]
            if not isinstance(ini, bool):
                self.err("SFC013", _at("$.Steps", i, ".Initial"), "Initial must be true or false")
                ini = False
            if name is not None and not _insert_new(node_of, name, len(step_names)):
                self.err("SFC002", _at("$.Steps", i, ".Name"), f"duplicate step name {name!r}")
            step_names.append(name)
            i32_push(&t[X_STEP_FLAGS], SF_INITIAL if ini else 0)
            if ini:
                initial.append(i)
        cdef int S = len(step_names)
        if len(initial) != 1:
            if not initial:
                self.err("SFC001", "$.Steps", "no step is marked Initial; exactly one must be")
            else:
                names = ", ".join(repr(step_names[i]) for i in initial)
                self.err("SFC001", "$.Steps",
                         f"{len(initial)} steps are marked Initial ({names}); exactly one must be")

        # ---- branches and paths
        cdef list br_names = []
        cdef list br_types = []
        cdef list br_path_off = [0]
        cdef list path_branch = []
        cdef list path_off = [0]
        cdef list path_steps = []
        cdef list step_path = [-1] * S
        # branch names first, so a path that names a branch is told apart from a typo
        for bi in range(len(brs_in)):
            br = brs_in[bi]
            name = None
            tcode = B_SELECTION
            if not isinstance(br, dict):
                self.err("SFC013", _at("$.Branches", bi, ""),
                         "a branch is an object with Name, Type and Branches")
            else:
                self._unknown_keys(br, _BRANCH_KEYS, "$.Branches", bi)
                name = self._name(_get(br, "Name"), "$.Branches", bi, "a branch")
                btype = _get(br, "Type")
                if not _is_str(btype) or btype not in BRANCH_TYPES:
                    self.err("SFC020", _at("$.Branches", bi, ".Type"),
                             f"unknown branch type {str(btype)[:80]!r}; "
                             f"use selection or simultaneous")
                else:
                    tcode = BRANCH_TYPES[btype]
                if name is not None:
                    if name in node_of:
                        self.err("SFC002", _at("$.Branches", bi, ".Name"),
                                 f"duplicate name {name!r} (steps and branches share one "
                                 f"namespace)")
                    else:
                        node_of[name] = S + bi
            br_names.append(name)
            br_types.append(tcode)
        for bi in range(len(brs_in)):
            br = brs_in[bi]
            name = br_names[bi]
            if not isinstance(br, dict):
                br_path_off.append(len(path_branch))
                continue
            paths = _get(br, "Branches")
            if not isinstance(paths, list):
                self.err("SFC013", _at("$.Branches", bi, ".Branches"),
                         "Branches must be a list of step lists")
                paths = []
            elif not paths:
                self.err("SFC008", _at("$.Branches", bi, ".Branches"),
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
                pidx = len(path_branch)
                path_branch.append(bi)
                for k in range(len(path)):
                    sname = path[k]
                    if not _is_str(sname):
                        self.err("SFC013", f"$.Branches[{bi}].Branches[{pi}][{k}]",
                                 "a branch path lists step names (text)")
                        continue
                    node = node_of.get(sname)
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
                    path_steps.append(node)
                path_off.append(len(path_steps))
            br_path_off.append(len(path_branch))
        cdef int B = len(br_names)
        cdef int P = len(path_branch)
        # Branch names given later in the list that a path mentions were checked above.
        for i in initial:
            if step_path[i] != -1:
                self.err("SFC023", _at("$.Steps", i, ""),
                         f"initial step {step_names[i]!r} is inside a branch path")

        # ---- actions: one entry per association in every table, valid or not
        cdef Py_ssize_t A = len(acts_in)
        cdef list a_names = []
        cdef list a_types = []
        cdef list a_params = []
        cdef list a_hold = []
        cdef list a_restart = []
        cdef list a_subj = []
        cdef list a_corr = []
        cdef dict stored = {}   # name -> association index of non-reset actions
        cdef int sidx, qc, ic, n_v110
        cdef int64_t timeout
        for ai in range(A):
            a = acts_in[ai]
            if not isinstance(a, dict):
                self.err("SFC013", _at("$.Actions", ai, ""), "an action is an object")
                a_names.append(None)
                a_types.append(None)
                a_params.append(None)
                a_hold.append(None)
                a_restart.append(None)
                a_subj.append(None)
                a_corr.append(None)
                i32_push(&t[X_A_STEP], -1)
                i32_push(&t[X_A_QUAL], -1)
                i32_push(&t[X_A_INTER], -1)
                i32_push(&t[X_A_RETRIES], 0)
                i64_push(&t64[X_A_TIMEOUT], 0)
                i64_push(&t64[X_A_HOLD_TIMEOUT], 0)
                i64_push(&t64[X_A_DURATION], 0)
                continue
            # Checked against the v1.0.0 fields: the count of v1.1.0 ones tells
            # _v110 whether it has anything to look at.
            n_v110 = self._fields(a, _ACTION_FIELDS, _ACTION_INDEX, self.seen_action,
                                  F_N_V100, _ACTION_V100_KEYS, "$.Actions", ai, f, keep)
            name = self._name(_val(f[F_NAME]), "$.Actions", ai, "an action")
            if name is not None:
                flaw = _name_flaw(name)
                if flaw == 1:
                    self.err("SFC004", _at("$.Actions", ai, ".Name"),
                             f"action name {name!r} contains ':'; command ids and markers "
                             f"use ':' as a separator")
                elif name in RESERVED_ACTION_NAMES:
                    self.err("SFC004", _at("$.Actions", ai, ".Name"),
                             f"action name {name!r} is reserved (job.* names job parameters)")
                elif flaw == 2:
                    self.err("SFC004", _at("$.Actions", ai, ".Name"),
                             f"action name {name!r} contains whitespace or control characters")
            step = _val(f[F_STEP])
            sidx = -1
            if not _is_str(step):
                self.err("SFC013", _at("$.Actions", ai, ".Step"), "Step is required (a step name)")
            else:
                found = _lookup(node_of, step)
                if found is None or found >= S:
                    self.err("SFC003", _at("$.Actions", ai, ".Step"), f"unknown step {step!r}")
                else:
                    sidx = found
            q = _val(f[F_QUALIFIER])
            found = _lookup(_QUAL, q) if _is_str(q) else None
            if found is None:
                self.err("SFC006", _at("$.Actions", ai, ".Qualifier"),
                         f"unknown qualifier {str(q)[:40]!r}; use one of "
                         f"{', '.join(QUALIFIERS)}")
                qc = -1
            else:
                qc = found
            inter = _val(f[F_INTERACTION])
            found = _lookup(_INTER, inter) if _is_str(inter) else None
            if found is None:
                self.err("SFC007", _at("$.Actions", ai, ".Interaction"),
                         f"unknown interaction {str(inter)[:40]!r}; use push_command or "
                         f"pull_event")
                ic = -1
            else:
                ic = found
            a_types.append(self._text(_val(f[F_TYPE_ID]), "$.Actions", ai, ".TypeId", "TypeId"))
            found = self._seconds(_val(f[F_TIMEOUT]), "TimeoutSeconds", "$.Actions", ai,
                                  "SFC005", False)
            timeout = 0 if found is None else found
            params = _val(f[F_PARAMETERS])
            ptext = None
            if params is not None:
                if not isinstance(params, dict):
                    self.err("SFC013", _at("$.Actions", ai, ".Parameters"),
                             "Parameters must be an object")
                else:
                    if type(params) is dict:
                        ptext = _flat_canonical(<dict>params)
                    try:
                        if ptext is None:
                            ptext = canonical_dumps(params)
                    except (TypeError, ValueError) as e:
                        self.err("SFC013", _at("$.Actions", ai, ".Parameters"),
                                 f"Parameters must be JSON data: {e}")
                    else:
                        if len(ptext) > MAX_PARAMS_CHARS:
                            self.err("SFC015", _at("$.Actions", ai, ".Parameters"),
                                     f"Parameters are {len(ptext)} characters as JSON, the "
                                     f"limit is {MAX_PARAMS_CHARS}")
                            ptext = None
            self._v110(a, ai, qc, ic, timeout, n_v110)
            if qc >= 0 and qc != Q_R and name is not None \
                    and not _insert_new(stored, name, ai):
                self.err("SFC002", _at("$.Actions", ai, ".Name"), f"duplicate action name {name!r}")
            a_names.append(name)
            a_params.append(ptext)
            a_hold.append(self.v_hold)
            a_restart.append(self.v_restart)
            a_subj.append(self.v_subject)
            a_corr.append(self.v_corr)
            i32_push(&t[X_A_STEP], sidx)
            i32_push(&t[X_A_QUAL], qc)
            i32_push(&t[X_A_INTER], ic)
            i32_push(&t[X_A_RETRIES], self.v_retries)
            i64_push(&t64[X_A_TIMEOUT], timeout)
            i64_push(&t64[X_A_HOLD_TIMEOUT], self.v_hold_timeout)
            i64_push(&t64[X_A_DURATION], self.v_duration)
        # resets name a stored (S) action in another step
        cdef const int32_t* a_step = t[X_A_STEP].data
        cdef const int32_t* a_qual = t[X_A_QUAL].data
        for ai in range(A):
            x = -1
            name = a_names[ai]
            if a_qual[ai] == Q_R and name is not None:
                target = stored.get(name)
                if target is None or a_qual[<Py_ssize_t>target] != Q_S:
                    self.err("SFC016", _at("$.Actions", ai, ".Name"),
                             f"R resets {name!r}, which is not an S (stored) action")
                elif (a_step[<Py_ssize_t>target] >= 0
                      and a_step[<Py_ssize_t>target] == a_step[ai]):
                    self.err("SFC016", _at("$.Actions", ai, ".Step"),
                             f"R of {name!r} must be in a later step than its S")
                else:
                    x = target
            i32_push(&t[X_A_RESET], x)

        # ---- transitions
        cb = CondBuilder(stored)
        cb_add = cb.add
        cdef int N = S + B
        cdef bytearray has_out_buf = bytearray(N)
        cdef bytearray entry_buf = bytearray(P)    # a path some explicit transition enters
        cdef char* has_out = has_out_buf
        cdef char* path_entry = entry_buf
        cdef int src, dst, cidx, kind
        for ti in range(len(trans_in)):
            tr = trans_in[ti]
            if not isinstance(tr, dict):
                self.err("SFC013", _at("$.Transitions", ti, ""),
                         "a transition is an object with Source, Target, Condition")
                continue
            self._fields(tr, _TRANSITION_FIELDS, _TRANSITION_INDEX, self.seen_transition,
                         5, _TRANSITION_KEYS, "$.Transitions", ti, f, keep)
            src = self._end(_val(f[F_SOURCE]), "Source", ti, node_of)
            dst = self._end(_val(f[F_TARGET]), "Target", ti, node_of)
            cond_text = _val(f[F_CONDITION])
            cidx = -1
            if not _is_str(cond_text):
                self.err("SFC013", _at("$.Transitions", ti, ".Condition"),
                         "Condition is required (text; 'always' for none)")
                cond_text = None
            elif len(cond_text) > MAX_FIELD_CHARS:
                self.err("SFC015", _at("$.Transitions", ti, ".Condition"),
                         f"Condition is {len(cond_text)} characters, the limit is "
                         f"{MAX_FIELD_CHARS}")
                cond_text = None
            elif cond_text != "always":     # the common case skips the builder call
                try:
                    cidx = cb_add(cond_text)
                except ConditionSyntaxError as e:
                    self.err("SFC011", _at("$.Transitions", ti, ".Condition"),
                             f"{e.message} at position {e.position} in {cond_text[:200]!r}")
            prio = 0 if f[F_PRIORITY] == NULL else <object>f[F_PRIORITY]
            if not _is_int(prio) or not (-1_000_000 <= prio <= 1_000_000):
                self.err("SFC013", _at("$.Transitions", ti, ".Priority"),
                         "Priority must be a whole number between -1000000 and 1000000")
                prio = 0
            if src < 0 or dst < 0:
                continue
            kind = self._kind(src, dst, S, step_path, path_branch, path_off, path_steps,
                              br_types, step_names, br_names, cidx, ti)
            if kind < 0:
                continue
            if kind == TK_ENTRY:
                path_entry[<Py_ssize_t>step_path[dst]] = 1
            has_out[src] = 1
            i32_push(&t[X_TR_SRC], src)
            i32_push(&t[X_TR_DST], dst)
            i32_push(&t[X_TR_PRIO], prio)
            i32_push(&t[X_TR_COND], cidx)
            i32_push(&t[X_TR_KIND], kind)
            i32_push(&t[X_TR_TEXT], self.sid(cond_text) if cond_text is not None else -1)

        if self.problems:
            return None

        # implicit transitions: next step of a path, default entry of a selection path
        _push_list(&t[X_PATH_OFF], path_off)
        _push_list(&t[X_PATH_STEPS], path_steps)
        _push_list(&t[X_PATH_BRANCH], path_branch)
        _push_list(&t[X_B_TYPE], br_types)
        cdef const int32_t* poff = t[X_PATH_OFF].data
        cdef const int32_t* psteps = t[X_PATH_STEPS].data
        cdef const int32_t* pbranch = t[X_PATH_BRANCH].data
        cdef const int32_t* btypes = t[X_B_TYPE].data
        for pi in range(P):
            lo = poff[pi]
            hi = poff[pi + 1]
            for k in range(lo, hi - 1):
                x = psteps[k]
                if not has_out[x]:
                    i32_push(&t[X_TR_SRC], x)
                    i32_push(&t[X_TR_DST], psteps[k + 1])
                    i32_push(&t[X_TR_PRIO], 0)
                    i32_push(&t[X_TR_COND], -1)
                    i32_push(&t[X_TR_KIND], TK_IMPLICIT)
                    i32_push(&t[X_TR_TEXT], -1)
            x = pbranch[pi]
            if btypes[x] == B_SELECTION and not path_entry[pi]:
                i32_push(&t[X_TR_SRC], S + x)
                i32_push(&t[X_TR_DST], psteps[lo])
                i32_push(&t[X_TR_PRIO], 2_000_000)
                i32_push(&t[X_TR_COND], -1)
                i32_push(&t[X_TR_KIND], TK_IMPLICIT)
                i32_push(&t[X_TR_TEXT], -1)

        # CSR of outgoing transitions, by priority then document order: a counting
        # sort by source keeps document order; each node's few are then ordered by
        # priority with a stable sort.
        cdef Py_ssize_t T = t[X_TR_SRC].size
        _csr(&t[X_NODE_OUT_OFF], &t[X_NODE_OUT], t[X_TR_SRC].data, T, N)
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

        # actions per step, document order
        _csr(&t[X_STEP_ACT_OFF], &t[X_STEP_ACTS], a_step, A, S)

        # strings, in the order that fixes their ids (and so the blob)
        for name in a_names:
            i32_push(&t[X_A_NAME], self.sid(name))
        for name in a_types:
            i32_push(&t[X_A_TYPE], self.sid(name))
        for name in a_params:
            i32_push(&t[X_A_PARAMS], self.sid(name) if name is not None else -1)
        for name in a_hold:
            i32_push(&t[X_A_HOLD], self.sid(name) if name is not None else -1)
        for name in a_restart:
            i32_push(&t[X_A_RESTART], self.sid(name) if name is not None else -1)
        for name in a_subj:
            i32_push(&t[X_A_SUBJ], self.sid(name) if name is not None else -1)
        for name in a_corr:
            i32_push(&t[X_A_CORR], self.sid(name) if name is not None else -1)
        for name in step_names:
            i32_push(&t[X_STEP_NAME], self.sid(name))
        for name in br_names:
            i32_push(&t[X_B_NAME], self.sid(name))
        i32_push(&t[X_REF_SEG_OFF], 0)
        for ref in cb.refs:
            i32_push(&t[X_REF_KIND], ref[0])
            i32_push(&t[X_REF_ACTION], ref[1])
            for name in ref[2]:
                i32_push(&t[X_REF_SEGS], self.sid(name))
            i32_push(&t[X_REF_SEG_OFF], <int32_t>t[X_REF_SEGS].size)
        for name in cb.consts:
            i32_push(&t[X_CONST_TEXT], self.sid(name))
        _push_list(&t[X_STEP_PATH], step_path)
        _push_list(&t[X_B_PATH_OFF], br_path_off)
        code, offsets = cb.tables()
        _push_bytes(&t[X_COND_OFF], offsets)
        _push_bytes(&t[X_CODE], code)

        # UTF-8 offsets of the strings; the bytes are copied by _pack
        cdef Py_ssize_t size, total = 0
        _reserve(&t[X_STR_OFF], len(self.strings) + 1)
        i32_push(&t[X_STR_OFF], 0)
        try:
            for name in self.strings:
                utf8_view(name, &size)
                total += size
                i32_push(&t[X_STR_OFF], <int32_t>total)   # wraps only past the limit
        except UnicodeEncodeError as e:
            # json.loads accepts lone surrogates ("\ud800"); they have no UTF-8 form.
            self.err("SFC014", "$", f"recipe text is not valid Unicode: {e.reason} "
                                    f"({e.object[e.start:e.end]!r})")
            return None
        if total > MAX_RECIPE_BYTES:
            self.err("SFC015", "$", f"recipe text is {total} bytes, the limit is "
                                    f"{MAX_RECIPE_BYTES}")
            return None

        cdef int32_t counts[14]
        counts[:] = [S, B, P, t[X_PATH_STEPS].size, T, A, t[X_COND_OFF].size - 1,
                     t[X_CODE].size, t[X_REF_KIND].size, t[X_REF_SEGS].size,
                     t[X_CONST_TEXT].size, len(self.strings), total, initial[0]]
        return self._pack(counts)

    cdef bytes _pack(self, int32_t* c):
        cdef Py_ssize_t lengths[N_I32]
        cdef Py_ssize_t k, n32 = 0, off, n
        cdef int32_t A = c[5], SB = c[12]
        _table_lengths(c, lengths)
        for k in range(N_I32):
            if self.t[k].size != lengths[k]:
                raise AssertionError(f"graph table {k} of length {self.t[k].size}, "
                                     f"expected {lengths[k]}")
            n32 += lengths[k]
        for k in range(N_I64):
            if self.t64[k].size != A:
                raise AssertionError(f"graph table {N_I32 + k} of length {self.t64[k].size}, "
                                     f"expected {A}")
        off = HEADER_SIZE + 4 * n32
        off += (8 - off % 8) % 8
        cdef bytes blob = PyBytes_FromStringAndSize(NULL, off + 3 * 8 * A + SB)
        cdef char* b = PyBytes_AS_STRING(blob)
        memset(b, 0, HEADER_SIZE)
        memcpy(b + 28, c, 14 * sizeof(int32_t))
        cdef char* w = b + HEADER_SIZE
        for k in range(N_I32):
            if lengths[k]:
                memcpy(w, self.t[k].data, lengths[k] * sizeof(int32_t))
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
        fp = hashlib.blake2b(memoryview(blob)[28:], digest_size=16,
                             person=b"sfc-recipe-1." + str(self.minor).encode()).digest()
        cdef uint16_t h16[4]
        h16[:] = [GRAPH_FORMAT_MAJOR, GRAPH_FORMAT_MINOR, self.minor, 0]
        memcpy(b, b"SFCG", 4)          # _MAGIC
        memcpy(b + 4, h16, 8)
        memcpy(b + 12, <const char*>fp, 16)
        return blob

    cdef int _kind(self, int src, int dst, int S, list step_path, list path_branch,
                   list path_off, list path_steps, list br_types, list step_names,
                   list br_names, int cidx, Py_ssize_t ti) except -2:
        """Classify a transition, or report why it crosses a branch path (-1)."""
        cdef int sp, dp
        if src < S:
            sp = step_path[src]
            dp = step_path[dst] if dst < S else -1
            if sp >= 0:
                if dst < S and dp == sp:
                    return TK_PATH
                if dst == S + path_branch[sp]:
                    return TK_PATH_END
                self.err("SFC019", _at("$.Transitions", ti, ""),
                         f"a transition from {step_names[src]!r} (inside a branch path) must "
                         f"stay in its path, or target its own branch "
                         f"{br_names[path_branch[sp]]!r} to end the path")
                return -1
            if dst < S and dp >= 0:
                self.err("SFC019", _at("$.Transitions", ti, ""),
                         f"{step_names[dst]!r} is inside a branch path; target the branch "
                         f"{br_names[path_branch[dp]]!r} instead")
                return -1
            return TK_STEP
        bi = src - S
        if dst < S and step_path[dst] >= 0:
            pidx = step_path[dst]
            if path_branch[pidx] == bi and path_steps[path_off[pidx]] == dst:
                if br_types[bi] == B_SIMULTANEOUS and cidx >= 0:
                    self.err("SFC019", _at("$.Transitions", ti, ""),
                             f"every path of simultaneous branch {br_names[bi]!r} starts; an "
                             f"entry transition cannot carry a condition")
                    return -1
                return TK_ENTRY
            self.err("SFC019", _at("$.Transitions", ti, ""),
                     f"{step_names[dst]!r} is inside a branch path and not the first step "
                     f"of a path of {br_names[bi]!r}")
            return -1
        return TK_EXIT

    cdef void _v110(self, dict a, Py_ssize_t ai, int qual, int inter, int64_t timeout,
                    int n_v110):
        self.v_hold = self.v_restart = self.v_subject = self.v_corr = None
        self.v_hold_timeout = 0
        self.v_retries = 0
        self.v_duration = 0
        present = [k for k in V110_FIELDS if k in a] if n_v110 else None
        if not present:
            if qual == Q_D or qual == Q_L:
                q = QUALIFIER_NAMES[qual]
                self.err("SFC017", _at("$.Actions", ai, ".DurationSeconds"),
                         f"qualifier {q} needs DurationSeconds" + (
                             " (a v1.1.0 field)" if self.minor == 0 else ""))
            return
        if self.minor == 0:
            for k in present:
                self.err("SFC012", _at("$.Actions", ai, "." + k),
                         f"{k} is a v1.1.0 field; this recipe declares v1.0.0")
            if qual == Q_D or qual == Q_L:
                self.err("SFC017", _at("$.Actions", ai, ".DurationSeconds"),
                         f"qualifier {QUALIFIER_NAMES[qual]} needs DurationSeconds "
                         f"(a v1.1.0 field)")
            return
        hold = a.get("HoldTypeId")
        if hold is not None:
            if not _is_str(hold) or not hold:
                self.err("SFC013", _at("$.Actions", ai, ".HoldTypeId"),
                         "HoldTypeId must be non-empty text")
            elif inter == I_PULL:
                self.err("SFC018", _at("$.Actions", ai, ".HoldTypeId"),
                         "only push_command actions can be held")
            else:
                self.v_hold = hold
        restart = a.get("RestartTypeId")
        if restart is not None:
            if hold is None:
                self.err("SFC010", _at("$.Actions", ai, ".RestartTypeId"),
                         "RestartTypeId needs HoldTypeId")
            elif not _is_str(restart) or not restart:
                self.err("SFC013", _at("$.Actions", ai, ".RestartTypeId"),
                         "RestartTypeId must be non-empty text")
            else:
                self.v_restart = restart
        if "HoldTimeoutSeconds" in a:
            if hold is None:
                self.err("SFC010", _at("$.Actions", ai, ".HoldTimeoutSeconds"),
                         "HoldTimeoutSeconds needs HoldTypeId")
            else:
                v = self._seconds(a.get("HoldTimeoutSeconds"), "HoldTimeoutSeconds",
                                  "$.Actions", ai, "SFC005", False)
                self.v_hold_timeout = 0 if v is None else v
        elif self.v_hold is not None:
            self.v_hold_timeout = timeout
        if "Retries" in a:
            r = a.get("Retries")
            if not _is_int(r) or r < 0 or r > 1000:
                self.err("SFC024", _at("$.Actions", ai, ".Retries"),
                         "Retries must be a whole number from 0 to 1000")
            elif inter == I_PULL and r:
                self.err("SFC018", _at("$.Actions", ai, ".Retries"),
                         "Retries re-dispatch a command; a pull_event action has none")
            else:
                self.v_retries = r
        if "DurationSeconds" in a:
            if qual != Q_D and qual != Q_L:
                self.err("SFC017", _at("$.Actions", ai, ".DurationSeconds"),
                         "only qualifiers D and L take DurationSeconds")
            else:
                v = self._seconds(a.get("DurationSeconds"), "DurationSeconds", "$.Actions",
                                  ai, "SFC017", True)
                if v is not None:
                    self.v_duration = v
        elif qual == Q_D or qual == Q_L:
            self.err("SFC017", _at("$.Actions", ai, ".DurationSeconds"),
                     f"qualifier {QUALIFIER_NAMES[qual]} needs DurationSeconds")
        if "Match" in a:
            m = a.get("Match")
            if inter == I_PUSH:
                self.err("SFC018", _at("$.Actions", ai, ".Match"),
                         "Match selects pull events; this is a push_command")
            elif not isinstance(m, dict):
                self.err("SFC013", _at("$.Actions", ai, ".Match"),
                         "Match is an object with Subject and/or CorrelationId")
            else:
                for k in m:
                    if k not in _MATCH_KEYS:
                        self.err("SFC021", f"$.Actions[{ai}].Match.{k}",
                                 f"unknown Match field {str(k)[:40]!r}")
                for k, field in (("Subject", "subject"), ("CorrelationId", "corr")):
                    if k not in m:
                        continue
                    v = m[k]
                    if not _is_str(v):
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


cdef inline bint _in(int32_t v, int32_t lo, int32_t hi) noexcept:
    return lo <= v < hi


cdef int _check_csr(const int32_t* off, Py_ssize_t n, int32_t total) noexcept:
    cdef Py_ssize_t i
    if off[0] != 0 or off[n] != total:
        return -1
    for i in range(n):
        if off[i] > off[i + 1]:
            return -1
    return 0


cdef int _check_range(const int32_t* a, Py_ssize_t n, int32_t lo, int32_t hi) noexcept:
    cdef Py_ssize_t i
    for i in range(n):
        if a[i] < lo or a[i] >= hi:
            return -1
    return 0


cdef class _GraphCtx(CondContext):
    """Condition context over plain dicts, for Graph.evaluate (tools and tests)."""
    cdef Graph g
    cdef dict results
    cdef dict rounds
    cdef dict outcomes
    cdef dict params
    cdef list bare

    cdef object load(self, int32_t ref):
        from sfc_fast.conditions import lookup_path
        kind, act, segs = self.g.refs()[ref]
        if kind == 1:
            return self.rounds.get(self.g.s(self.g.act_name[act]))
        if kind == 2:
            return self.outcomes.get(self.g.s(self.g.act_name[act]))
        if kind == 0:
            return lookup_path(self.results.get(self.g.s(self.g.act_name[act])), segs)
        if kind == 3:
            return lookup_path(self.params, segs)
        head = segs[0]
        for res in self.bare:
            if isinstance(res, dict) and head in res:
                return res[head]
        return self.params.get(head)


cdef list _build_refs(Graph g):
    cdef list out = []
    cdef int r, k
    for r in range(g.n_refs):
        segs = tuple([g.s(g.ref_segs[k]) for k in range(g.ref_seg_off[r], g.ref_seg_off[r + 1])])
        out.append((g.ref_kind[r], g.ref_action[r], segs))
    return out


cdef class Graph:
    """An immutable compiled recipe (see module doc). Build it with ``compile_recipe``
    or ``Graph.from_bytes``."""

    def __init__(self, *args, **kwargs):
        raise TypeError("use compile_recipe() or Graph.from_bytes()")

    @staticmethod
    def from_bytes(data) -> Graph:
        """Load a graph written by ``to_bytes``; GraphFormatError for anything else."""
        cdef bytes blob
        if type(data) is bytes:
            blob = <bytes>data
        elif isinstance(data, (bytearray, memoryview)):
            blob = bytes(data)
        else:
            raise TypeError(f"from_bytes takes bytes, not {type(data).__name__}")
        cdef Graph g = Graph.__new__(Graph)
        _attach(g, blob)
        return g

    def to_bytes(self) -> bytes:
        return self._blob

    def __reduce__(self):
        return (Graph.from_bytes, (self._blob,))

    def __eq__(self, other):
        return isinstance(other, Graph) and (<Graph>other)._blob == self._blob

    def __hash__(self):
        return hash(self._blob[12:28])

    def __repr__(self):
        return (f"<Graph {self.fingerprint[:12]} steps={self.n_steps} "
                f"actions={self.n_actions} branches={self.n_branches}>")

    @property
    def fingerprint(self) -> str:
        """Hex digest of the canonical recipe and its format version."""
        return self._blob[12:28].hex()

    @property
    def dataschema(self) -> str:
        return SCHEMA_V110 if self.schema_minor == 1 else SCHEMA_V100

    @property
    def version(self) -> str:
        return "1.1.0" if self.schema_minor == 1 else "1.0.0"

    @property
    def n_nodes(self) -> int:
        return self.n_steps + self.n_branches

    cdef str s(self, int32_t sid):
        if sid < 0:
            return None
        cdef object v = self._strs[sid]
        if v is None:
            v = PyUnicode_DecodeUTF8(self.str_data + self.str_off[sid],
                                     self.str_off[sid + 1] - self.str_off[sid], "replace")
            self._strs[sid] = v
        return <str>v

    cdef list consts(self):
        if self._consts is None:
            out = []
            for i in range(self.n_consts):
                try:
                    out.append(json.loads(self.s(self.const_text[i])))
                except ValueError:
                    out.append(None)
            self._consts = out
        return self._consts

    cdef list refs(self):
        # the build is a function of its own: its generator's closure would otherwise be
        # allocated on every call, cached or not
        if self._refs is None:
            self._refs = _build_refs(self)
        return self._refs

    cdef object params(self, int a):
        if self._params is None:
            self._params = [0] * self.n_actions
        v = self._params[a]
        if type(v) is int:
            sid = self.act_params[a]
            if sid < 0:
                v = None
            else:
                try:
                    v = json.loads(self.s(sid))
                except ValueError:
                    v = None
            self._params[a] = v
        return v

    cdef object eval_cond(self, int cond, CondContext ctx):
        if cond < 0:
            return True
        return run_condition(self.code, self.cond_off[cond], self.cond_off[cond + 1],
                             self.consts(), ctx)

    # ---- Python-facing views (tools, host, diagrams; not the hot path)

    @property
    def steps(self) -> tuple:
        return tuple(self.s(self.step_name[i]) for i in range(self.n_steps))

    @property
    def actions(self) -> tuple:
        return tuple(self.s(self.act_name[i]) for i in range(self.n_actions))

    @property
    def branches(self) -> tuple:
        return tuple(self.s(self.br_name[i]) for i in range(self.n_branches))

    def node_name(self, int node) -> str:
        if not 0 <= node < self.n_steps + self.n_branches:
            raise IndexError(node)
        if node < self.n_steps:
            return self.s(self.step_name[node])
        return self.s(self.br_name[node - self.n_steps])

    def step_index(self, str name) -> int:
        if self._step_index is None:
            self._step_index = {self.s(self.step_name[i]): i for i in range(self.n_steps)}
        return self._step_index[name]

    cdef dict action_names(self):
        """Action name -> its stored (non-reset) association; built once."""
        if self._action_index is None:
            d = {}
            for i in range(self.n_actions):
                if self.act_qual[i] != Q_R:
                    d[self.s(self.act_name[i])] = i
            self._action_index = d
        return self._action_index

    def action_index(self, str name) -> int:
        """Index of the stored (non-reset) association of an action name."""
        return self.action_names()[name]

    def branch_index(self, str name) -> int:
        if self._branch_index is None:
            self._branch_index = {self.s(self.br_name[i]): i for i in range(self.n_branches)}
        return self._branch_index[name]

    def step_actions(self, int step) -> list:
        if not 0 <= step < self.n_steps:
            raise IndexError(step)
        return [self.step_acts[k] for k in range(self.step_act_off[step],
                                                 self.step_act_off[step + 1])]

    def outgoing(self, int node) -> list:
        """Transition indices leaving a node, in the order they are tried."""
        if not 0 <= node < self.n_steps + self.n_branches:
            raise IndexError(node)
        return [self.node_out[k] for k in range(self.node_out_off[node],
                                                self.node_out_off[node + 1])]

    def step_info(self, int i) -> dict:
        if not 0 <= i < self.n_steps:
            raise IndexError(i)
        p = self.step_path[i]
        return {
            "name": self.s(self.step_name[i]),
            "initial": bool(self.step_flags[i] & SF_INITIAL),
            "branch": None if p < 0 else self.s(self.br_name[self.path_branch[p]]),
            "path": None if p < 0 else p - self.br_path_off[self.path_branch[p]],
            "actions": [self.s(self.act_name[a]) for a in self.step_actions(i)],
        }

    def action_info(self, int i) -> dict:
        if not 0 <= i < self.n_actions:
            raise IndexError(i)
        match = {}
        if self.act_match_subject[i] >= 0:
            match["Subject"] = self.s(self.act_match_subject[i])
        if self.act_match_corr[i] >= 0:
            match["CorrelationId"] = self.s(self.act_match_corr[i])
        return {
            "name": self.s(self.act_name[i]),
            "step": self.s(self.step_name[self.act_step[i]]),
            "qualifier": QUALIFIER_NAMES[self.act_qual[i]],
            "interaction": INTERACTION_NAMES[self.act_inter[i]],
            "type_id": self.s(self.act_type[i]),
            "timeout_ms": self.act_timeout_ms[i],
            "parameters": self.params(i),
            "hold_type_id": self.s(self.act_hold_type[i]),
            "restart_type_id": self.s(self.act_restart_type[i]),
            "hold_timeout_ms": self.act_hold_timeout_ms[i] or None,
            "retries": self.act_retries[i],
            "duration_ms": self.act_duration_ms[i] or None,
            "match": match or None,
            "resets": None if self.act_reset[i] < 0 else self.s(self.act_name[self.act_reset[i]]),
        }

    def transition_info(self, int i) -> dict:
        if not 0 <= i < self.n_transitions:
            raise IndexError(i)
        return {
            "source": self.node_name(self.tr_source[i]),
            "target": self.node_name(self.tr_target[i]),
            "condition": self.s(self.tr_text[i]) if self.tr_text[i] >= 0 else None,
            "priority": self.tr_priority[i],
            "kind": TRANSITION_KINDS[self.tr_kind[i]],
            "always": self.tr_cond[i] < 0,
        }

    def branch_info(self, int i) -> dict:
        if not 0 <= i < self.n_branches:
            raise IndexError(i)
        paths = []
        for p in range(self.br_path_off[i], self.br_path_off[i + 1]):
            paths.append([self.s(self.step_name[self.path_steps[k]])
                          for k in range(self.path_off[p], self.path_off[p + 1])])
        return {"name": self.s(self.br_name[i]), "type": BRANCH_TYPE_NAMES[self.br_type[i]],
                "paths": paths}

    def summary(self) -> dict:
        return {
            "version": self.version,
            "fingerprint": self.fingerprint,
            "steps": self.n_steps,
            "actions": self.n_actions,
            "transitions": self.n_transitions,
            "branches": self.n_branches,
            "initial": self.s(self.step_name[self.initial_step]),
            "bytes": len(self._blob),
        }

    def evaluate(self, int transition, *, results=None, rounds=None, outcomes=None,
                 params=None, bare=None) -> bool:
        """Evaluate a transition's condition against plain dicts keyed by action name."""
        if not 0 <= transition < self.n_transitions:
            raise IndexError(transition)
        cdef _GraphCtx ctx = _GraphCtx()
        ctx.g = self
        ctx.results = results or {}
        ctx.rounds = rounds or {}
        ctx.outcomes = outcomes or {}
        ctx.params = params or {}
        ctx.bare = bare or []
        from sfc_fast.conditions import truthy_value
        return truthy_value(self.eval_cond(self.tr_cond[transition], ctx))

    def arrays(self) -> dict:
        """Read-only numpy views of the int32/int64 tables (for inspection)."""
        import numpy as np
        cdef int32_t counts[12]
        cdef Py_ssize_t lengths[N_I32]
        counts[:] = [self.n_steps, self.n_branches, self.n_paths, self.n_path_steps,
                     self.n_transitions, self.n_actions, self.n_conds, self.n_code,
                     self.n_refs, self.n_ref_segs, self.n_consts, self.n_strings]
        _table_lengths(counts, lengths)
        names = ("step_name", "step_flags", "step_path", "step_act_off", "step_acts",
                 "node_out_off", "node_out", "tr_source", "tr_target", "tr_priority", "tr_cond",
                 "tr_kind", "tr_text", "act_name", "act_step", "act_qual", "act_inter",
                 "act_type", "act_params", "act_hold_type", "act_restart_type", "act_retries",
                 "act_match_subject", "act_match_corr", "act_reset", "br_name", "br_type",
                 "br_path_off", "path_branch", "path_off", "path_steps", "cond_off", "code",
                 "ref_kind", "ref_action", "ref_seg_off", "ref_segs", "const_text", "str_off")
        out = {}
        off = HEADER_SIZE
        for k, name in enumerate(names):
            n = lengths[k]
            out[name] = np.frombuffer(self._blob, dtype="<i4", count=n, offset=off)
            off += 4 * n
        off += (8 - off % 8) % 8
        for name in ("act_timeout_ms", "act_hold_timeout_ms", "act_duration_ms"):
            out[name] = np.frombuffer(self._blob, dtype="<i8", count=self.n_actions, offset=off)
            off += 8 * self.n_actions
        return out


cdef int _attach(Graph g, bytes blob) except -1:
    """Point g's tables into blob after checking every index (never trust bytes)."""
    cdef Py_ssize_t size = PyBytes_GET_SIZE(blob)
    cdef const char* base = PyBytes_AS_STRING(blob)
    cdef int32_t c[14]
    cdef uint16_t major
    cdef Py_ssize_t i, off, n32, k
    if size < HEADER_SIZE or base[0] != b'S' or base[1] != b'F' or base[2] != b'C' \
            or base[3] != b'G':
        raise GraphFormatError("not a compiled recipe graph (bad magic)")
    memcpy(&major, base + 4, 2)
    if major != GRAPH_FORMAT_MAJOR:
        raise GraphFormatError(f"graph format {major}.x; this version reads "
                               f"{GRAPH_FORMAT_MAJOR}.x")
    cdef uint16_t minor
    memcpy(&minor, base + 8, 2)
    if minor > 1:
        raise GraphFormatError("unknown recipe schema in graph header")
    memcpy(c, base + 28, 14 * 4)
    for i in range(13):
        if c[i] < 0 or c[i] > 64 * MAX_ELEMENTS:
            raise GraphFormatError("graph header counts out of range")
    cdef int32_t S = c[0], B = c[1], P = c[2], PS = c[3], T = c[4], A = c[5], C = c[6]
    cdef int32_t K = c[7], R = c[8], RS = c[9], CN = c[10], NS = c[11], SB = c[12]
    cdef int32_t N = S + B
    if S < 1 or not (0 <= c[13] < S):
        raise GraphFormatError("graph has no initial step")
    cdef Py_ssize_t lengths[N_I32]
    n32 = _table_lengths(c, lengths)
    off = HEADER_SIZE + 4 * n32
    off += (8 - off % 8) % 8
    if size != off + 3 * 8 * A + SB:
        raise GraphFormatError("graph size does not match its header")
    cdef const int32_t* p = <const int32_t*>(base + HEADER_SIZE)
    g.step_name = p; p += S
    g.step_flags = p; p += S
    g.step_path = p; p += S
    g.step_act_off = p; p += S + 1
    g.step_acts = p; p += A
    g.node_out_off = p; p += N + 1
    g.node_out = p; p += T
    g.tr_source = p; p += T
    g.tr_target = p; p += T
    g.tr_priority = p; p += T
    g.tr_cond = p; p += T
    g.tr_kind = p; p += T
    g.tr_text = p; p += T
    g.act_name = p; p += A
    g.act_step = p; p += A
    g.act_qual = p; p += A
    g.act_inter = p; p += A
    g.act_type = p; p += A
    g.act_params = p; p += A
    g.act_hold_type = p; p += A
    g.act_restart_type = p; p += A
    g.act_retries = p; p += A
    g.act_match_subject = p; p += A
    g.act_match_corr = p; p += A
    g.act_reset = p; p += A
    g.br_name = p; p += B
    g.br_type = p; p += B
    g.br_path_off = p; p += B + 1
    g.path_branch = p; p += P
    g.path_off = p; p += P + 1
    g.path_steps = p; p += PS
    g.cond_off = p; p += C + 1
    g.code = p; p += K
    g.ref_kind = p; p += R
    g.ref_action = p; p += R
    g.ref_seg_off = p; p += R + 1
    g.ref_segs = p; p += RS
    g.const_text = p; p += CN
    g.str_off = p; p += NS + 1
    cdef const int64_t* q = <const int64_t*>(base + off)
    g.act_timeout_ms = q; q += A
    g.act_hold_timeout_ms = q; q += A
    g.act_duration_ms = q; q += A
    g.str_data = base + off + 3 * 8 * A

    bad = None
    if (_check_range(g.step_name, S, 0, NS) or _check_range(g.step_path, S, -1, P)
            or _check_csr(g.step_act_off, S, A) or _check_range(g.step_acts, A, 0, A)
            or _check_csr(g.node_out_off, N, T) or _check_range(g.node_out, T, 0, T)
            or _check_range(g.tr_source, T, 0, N) or _check_range(g.tr_target, T, 0, N)
            or _check_range(g.tr_cond, T, -1, C) or _check_range(g.tr_kind, T, 0, 6)
            or _check_range(g.tr_text, T, -1, NS)
            or _check_range(g.act_name, A, 0, NS) or _check_range(g.act_step, A, 0, S)
            or _check_range(g.act_qual, A, 0, 8) or _check_range(g.act_inter, A, 0, 2)
            or _check_range(g.act_type, A, 0, NS) or _check_range(g.act_params, A, -1, NS)
            or _check_range(g.act_hold_type, A, -1, NS)
            or _check_range(g.act_restart_type, A, -1, NS)
            or _check_range(g.act_retries, A, 0, 1001)
            or _check_range(g.act_match_subject, A, -1, NS)
            or _check_range(g.act_match_corr, A, -1, NS)
            or _check_range(g.act_reset, A, -1, A)
            or _check_range(g.br_name, B, 0, NS) or _check_range(g.br_type, B, 0, 2)
            or _check_csr(g.br_path_off, B, P) or _check_range(g.path_branch, P, 0, B)
            or _check_csr(g.path_off, P, PS) or _check_range(g.path_steps, PS, 0, S)
            or _check_csr(g.cond_off, C, K) or _check_range(g.ref_kind, R, 0, 5)
            or _check_range(g.ref_action, R, -1, A) or _check_csr(g.ref_seg_off, R, RS)
            or _check_range(g.ref_segs, RS, 0, NS) or _check_range(g.const_text, CN, 0, NS)
            or _check_csr(g.str_off, NS, SB)):
        bad = "a table index is out of range"
    if bad is None:
        # a step's actions point back at it; a transition leaves the node it is listed under
        for i in range(S):
            for k in range(g.step_act_off[i], g.step_act_off[i + 1]):
                if g.act_step[g.step_acts[k]] != i:
                    bad = "step action table is inconsistent"
        for i in range(N):
            for k in range(g.node_out_off[i], g.node_out_off[i + 1]):
                if g.tr_source[g.node_out[k]] != i:
                    bad = "transition table is inconsistent"
        for i in range(A):
            if g.act_timeout_ms[i] < 0 or g.act_hold_timeout_ms[i] < 0 \
                    or g.act_duration_ms[i] < 0:
                bad = "negative time in action table"
        for i in range(C):
            if verify_code(g.code, g.cond_off[i], g.cond_off[i + 1], CN, R) != 0:
                bad = f"condition {i} has invalid bytecode"
                break
    if bad is not None:
        raise GraphFormatError(f"corrupt graph: {bad}")
    g._blob = blob
    g.n_steps, g.n_branches, g.n_paths, g.n_path_steps = S, B, P, PS
    g.n_transitions, g.n_actions, g.n_conds, g.n_code = T, A, C, K
    g.n_refs, g.n_ref_segs, g.n_consts, g.n_strings = R, RS, CN, NS
    g.schema_minor = minor
    g.initial_step = c[13]
    g._strs = [None] * NS
    return 0


def compile_recipe(data, dataschema) -> Graph:
    """Validate a recipe and build its graph.

    ``data`` is the recipe (a dict, or its JSON as str/bytes); ``dataschema`` names
    its format (v1.0.0 or v1.1.0). Raises ``RecipeError`` listing every problem.
    """
    minor = schema_minor(dataschema)
    cdef _Compiler comp
    # A compile makes many short-lived objects (tokens, lists, tuples of references):
    # the cyclic collector would walk them again and again (a third of a big recipe's
    # compile time). None of them outlives the call in a cycle, so it is paused.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        obj = _load(data)
        comp = _Compiler(minor)
        try:
            blob = comp.run(obj)
        except RecursionError:
            raise RecipeError([Problem("SFC014", "$", "recipe is nested too deeply")]) from None
    finally:
        if was_enabled:
            gc.enable()
    if comp.problems:
        raise RecipeError(comp.problems)
    cdef Graph g = Graph.__new__(Graph)
    _attach(g, blob)
    return g
