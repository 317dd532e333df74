# cython: language_level=3
"""Transition conditions: parser, bytecode emitter, verifier and stack machine.

The language (docs/recipes.md): literals (numbers, 'text', true, false, null,
lists), references (``action.field.sub``, ``action._round``, ``action._outcome``,
``job.param``, bare names), ``== != < <= > >= in``, ``not in``, ``and or not``,
parentheses and unary minus. Nothing here calls back into Python code written by
a recipe author: there is no ``eval`` and no attribute access.
"""

from libc.stdint cimport int32_t
from cpython.object cimport PyObject_IsTrue
from cpython.list cimport PyList_GET_SIZE
from cpython.dict cimport PyDict_GetItem, PyDict_GetItemWithError
from cpython.object cimport PyObject
from cpython.ref cimport Py_DECREF, Py_INCREF, Py_XDECREF
from libc.stdlib cimport free, realloc
from cpython.bytes cimport PyBytes_FromStringAndSize

from sfc_fast._vec cimport I32Vec, i32_free, i32_push

import json

from sfc_fast.errors import SfcError

# OP codes are exported for tools (disassembly in tests and docs).
OPCODES = {
    "END": OP_END, "CONST": OP_CONST, "LOAD": OP_LOAD, "EQ": OP_EQ, "NE": OP_NE,
    "LT": OP_LT, "LE": OP_LE, "GT": OP_GT, "GE": OP_GE, "IN": OP_IN, "NOT": OP_NOT,
    "AND_JUMP": OP_AND_JUMP, "OR_JUMP": OP_OR_JUMP, "BOOL": OP_BOOL, "LIST": OP_LIST,
    "NEG": OP_NEG,
}
REF_KINDS = {"result": REF_RESULT, "round": REF_ROUND, "outcome": REF_OUTCOME,
             "job": REF_JOB, "bare": REF_BARE}

TRIVIALLY_TRUE = frozenset(("", "always", "true"))


def _not_json(o):
    raise TypeError(f"{type(o).__name__} is not JSON data")


try:
    from json.encoder import c_make_encoder as _c_make_encoder
    from json.encoder import encode_basestring as _encode_basestring
except ImportError:  # pragma: no cover - CPython always has the C encoder
    _c_make_encoder = None
    from json.encoder import py_encode_basestring as _encode_basestring

if _c_make_encoder is not None:
    # Built once: json.dumps with options constructs a new encoder on every call.
    _C_CANON = _c_make_encoder(None, _not_json, _encode_basestring, None, ":", ",",
                               True, False, False)

    def canonical_dumps(obj) -> str:
        """JSON text with sorted keys and no whitespace (the stored, hashed form)."""
        return "".join(_C_CANON(obj, 0))
else:  # pragma: no cover
    _PY_CANON = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                                 allow_nan=False)

    def canonical_dumps(obj) -> str:
        return _PY_CANON.encode(obj)


class ConditionSyntaxError(SfcError, ValueError):
    """A condition that does not parse; ``position`` is a 0-based character offset."""

    def __init__(self, message: str, position: int) -> None:
        super().__init__(f"{message} at position {position}")
        self.message = message
        self.position = position


# ---------------------------------------------------------------- tokenizer

cdef enum:
    T_EOF = 0
    T_NUM = 1
    T_STR = 2
    T_NAME = 3      # dotted path of identifiers
    T_OP = 4        # == != < <= > >=
    T_LP = 5
    T_RP = 6
    T_LB = 7
    T_RB = 8
    T_COMMA = 9
    T_MINUS = 10
    T_KW = 11       # and or not in true false null

# Keywords (the sub field of a T_KW token).
cdef enum:
    KW_AND = 1
    KW_OR = 2
    KW_NOT = 3
    KW_IN = 4
    KW_TRUE = 5
    KW_FALSE = 6
    KW_NULL = 7

_KEYWORDS = frozenset(("and", "or", "not", "in", "true", "false", "null"))

# One token: no Python object per token. ``sub`` is the keyword (T_KW), the opcode
# (T_OP) or the index of the value in CondBuilder._vals (T_NUM, T_STR).
cdef struct Tok:
    int kind
    int sub
    Py_ssize_t pos
    Py_ssize_t end

from sfc_fast._text cimport PyUnicode_DATA, PyUnicode_KIND, PyUnicode_READ


cdef inline bint _ident_start(Py_UCS4 c) noexcept:
    return c == u'_' or (u'a' <= c <= u'z') or (u'A' <= c <= u'Z')


cdef inline bint _ident_char(Py_UCS4 c) noexcept:
    return _ident_start(c) or (u'0' <= c <= u'9')


cdef inline bint _digit(Py_UCS4 c) noexcept:
    return u'0' <= c <= u'9'


MAX_NUMBER_CHARS = 64
MAX_INT = (1 << 63) - 1


def _short(text: str) -> str:
    """A literal for a message: a 5000-digit number is not repeated whole."""
    return repr(text) if len(text) <= 40 else repr(text[:40]) + "…"


def _dunder(name: str, pos: int) -> None:
    # Nothing reaches Python from a condition, and names like __class__ or __import__
    # only serve to try: refused outright, so a recipe cannot even look like an escape.
    raise ConditionSyntaxError(f"name {_short(name)} is reserved (no segment may start "
                               "with '__')", pos)


cdef int _keyword(int kind, void* d, Py_ssize_t i, Py_ssize_t j) noexcept:
    """The KW_ code of text[i:j], or 0 when it is not a keyword."""
    cdef Py_ssize_t n = j - i
    cdef Py_UCS4 c0
    if n < 2 or n > 5:
        return 0
    c0 = PyUnicode_READ(kind, d, i)
    if n == 2:
        if c0 == u'o' and PyUnicode_READ(kind, d, i + 1) == u'r':
            return KW_OR
        if c0 == u'i' and PyUnicode_READ(kind, d, i + 1) == u'n':
            return KW_IN
        return 0
    if n == 3:
        if c0 == u'a' and PyUnicode_READ(kind, d, i + 1) == u'n' \
                and PyUnicode_READ(kind, d, i + 2) == u'd':
            return KW_AND
        if c0 == u'n' and PyUnicode_READ(kind, d, i + 1) == u'o' \
                and PyUnicode_READ(kind, d, i + 2) == u't':
            return KW_NOT
        return 0
    if n == 4:
        if c0 == u't' and PyUnicode_READ(kind, d, i + 1) == u'r' \
                and PyUnicode_READ(kind, d, i + 2) == u'u' \
                and PyUnicode_READ(kind, d, i + 3) == u'e':
            return KW_TRUE
        if c0 == u'n' and PyUnicode_READ(kind, d, i + 1) == u'u' \
                and PyUnicode_READ(kind, d, i + 2) == u'l' \
                and PyUnicode_READ(kind, d, i + 3) == u'l':
            return KW_NULL
        return 0
    if c0 == u'f' and PyUnicode_READ(kind, d, i + 1) == u'a' \
            and PyUnicode_READ(kind, d, i + 2) == u'l' \
            and PyUnicode_READ(kind, d, i + 3) == u's' \
            and PyUnicode_READ(kind, d, i + 4) == u'e':
        return KW_FALSE
    return 0


cdef bint _has_dunder(int kind, void* d, Py_ssize_t i, Py_ssize_t j) noexcept:
    """A segment of the dotted path text[i:j] starts with '__'."""
    cdef Py_ssize_t k
    cdef bint seg_start = True
    for k in range(i, j - 1):
        if seg_start and PyUnicode_READ(kind, d, k) == u'_' \
                and PyUnicode_READ(kind, d, k + 1) == u'_':
            return True
        seg_start = PyUnicode_READ(kind, d, k) == u'.'
    return False


cdef str _unescape(str text, Py_ssize_t a, Py_ssize_t b):
    """The value of a string literal's body text[a:b] whose escapes were checked."""
    cdef list buf = []
    cdef Py_ssize_t j = a
    cdef Py_UCS4 c, e
    while j < b:
        c = text[j]
        if c == u'\\':
            e = text[j + 1]
            if e == u'n':
                buf.append(u'\n')
            elif e == u't':
                buf.append(u'\t')
            else:
                buf.append(e)
            j += 2
            continue
        buf.append(c)
        j += 1
    return u''.join(buf)


# ---------------------------------------------------------------- parser

_CONST = object()   # marks a folded constant on the parser's value side


cdef class CondBuilder:
    """Collects the bytecode, references and constants of every condition of a recipe.

    ``actions`` maps action names (non-reset associations) to their index.
    Constants and references are shared between conditions.
    """
    # bytecode of every condition, and the start of each in it (one extra at the end):
    # C vectors, so emitting makes no Python int (the `code`/`offsets` views do)
    cdef I32Vec _code
    cdef I32Vec _offsets
    cdef public list refs        # (kind, action index or -1, segments tuple)
    cdef public list consts      # canonical JSON text of each constant
    cdef dict _actions
    cdef dict _ref_ids           # reference text -> index (a text names one reference)
    cdef dict _const_ids
    cdef dict _cache             # condition text -> condition index
    # tokenizer output
    cdef Tok* _tk
    cdef Py_ssize_t _tk_cap
    cdef str _text
    cdef list _vals
    # parser state
    cdef Py_ssize_t _p
    cdef list _out

    def __init__(self, dict actions):
        i32_push(&self._offsets, 0)
        self.refs = []
        self.consts = []
        self._actions = actions
        self._ref_ids = {}
        self._const_ids = {}
        self._cache = {}

    def __dealloc__(self):
        free(self._tk)
        i32_free(&self._code)
        i32_free(&self._offsets)

    @property
    def code(self) -> list:
        return [self._code.data[i] for i in range(self._code.size)]

    @property
    def offsets(self) -> list:
        return [self._offsets.data[i] for i in range(self._offsets.size)]

    def tables(self) -> tuple:
        """(code, offsets) as bytes of native int32, for the recipe compiler to copy."""
        return (PyBytes_FromStringAndSize(<char*>self._code.data, self._code.size * 4),
                PyBytes_FromStringAndSize(<char*>self._offsets.data, self._offsets.size * 4))

    def add(self, str text) -> int:
        """Compile ``text``; return its condition index, or -1 for a trivially true one."""
        stripped = text.strip()     # text itself when there is nothing to strip
        if len(stripped) <= 6 and stripped in TRIVIALLY_TRUE:
            return -1
        cdef PyObject* cached = PyDict_GetItemWithError(self._cache, stripped)
        if cached != NULL:
            return <object>cached
        self._tokenize(stripped)
        self._p = 0
        cdef Tok* tk = self._tk
        cdef Py_ssize_t i
        cdef int32_t ref, cid
        # (a constant third token has a fourth after it, EOF at least)
        if tk[0].kind == T_NAME and tk[1].kind == T_OP and (
                tk[2].kind == T_NUM or tk[2].kind == T_STR or (tk[2].kind == T_KW and (
                    tk[2].sub == KW_TRUE or tk[2].sub == KW_FALSE or tk[2].sub == KW_NULL))) \
                and tk[3].kind == T_EOF:
            # the usual shape, `ref <op> constant`: the code the parser would emit for
            # it, without the descent through every precedence level
            ref = self._ref(stripped[tk[0].pos:tk[0].end], tk[0].pos)
            cid = self._const_id(self._tokconst(&tk[2]))
            i32_push(&self._code, OP_LOAD)
            i32_push(&self._code, ref)
            i32_push(&self._code, OP_CONST)
            i32_push(&self._code, cid)
            i32_push(&self._code, tk[1].sub)
            self._p = 3
        else:
            self._out = []
            kind = self._expr(0)
            if kind is not None:
                self._emit_const(kind)
            if self._tk[self._p].kind == T_EOF:
                for i in range(len(self._out)):
                    i32_push(&self._code, self._out[i])
        cdef Tok* tok = &self._tk[self._p]
        if tok.kind != T_EOF:
            raise ConditionSyntaxError(f"unexpected {self._tokval(tok)!r}", tok.pos)
        i32_push(&self._code, OP_END)
        i32_push(&self._offsets, <int32_t>self._code.size)
        index = self._offsets.size - 2
        self._cache[stripped] = index
        return index

    # ---- tokenizer: fills self._tk with (kind, sub, pos, end), ending with T_EOF

    cdef int _tokenize(self, str text) except -1:
        cdef Py_ssize_t i = 0, n = len(text), j, k, t = 0
        cdef Py_UCS4 c, q, e
        cdef int kind = PyUnicode_KIND(text)
        cdef void* d = PyUnicode_DATA(text)
        cdef Tok* tk
        cdef int kw
        cdef bint esc
        cdef list buf
        cdef object value
        if n + 1 > self._tk_cap:
            tk = <Tok*>realloc(self._tk, (n + 1) * sizeof(Tok))
            if tk == NULL:
                raise MemoryError()
            self._tk = tk
            self._tk_cap = n + 1
        tk = self._tk
        self._text = text
        if self._vals is None or PyList_GET_SIZE(self._vals):
            self._vals = []
        while i < n:
            c = PyUnicode_READ(kind, d, i)
            if c == u' ' or c == u'\t' or c == u'\n' or c == u'\r':
                i += 1
                continue
            tk[t].pos = i
            if _ident_start(c):
                j = i
                while True:
                    while j < n and _ident_char(PyUnicode_READ(kind, d, j)):
                        j += 1
                    # a dot followed by an identifier continues the path
                    if j + 1 < n and PyUnicode_READ(kind, d, j) == u'.' \
                            and _ident_start(PyUnicode_READ(kind, d, j + 1)):
                        j += 1
                        continue
                    break
                kw = _keyword(kind, d, i, j)
                if not kw and _has_dunder(kind, d, i, j):
                    _dunder(text[i:j], i)
                tk[t].kind = T_KW if kw else T_NAME
                tk[t].sub = kw
                tk[t].end = j
                t += 1
                i = j
                continue
            if _digit(c) or (c == u'.' and i + 1 < n and _digit(PyUnicode_READ(kind, d, i + 1))):
                j = i
                while j < n and _digit(PyUnicode_READ(kind, d, j)):
                    j += 1
                if j < n and PyUnicode_READ(kind, d, j) == u'.':
                    j += 1
                    while j < n and _digit(PyUnicode_READ(kind, d, j)):
                        j += 1
                if j < n and (PyUnicode_READ(kind, d, j) == u'e'
                              or PyUnicode_READ(kind, d, j) == u'E'):
                    k = j + 1
                    if k < n and (PyUnicode_READ(kind, d, k) == u'+'
                                  or PyUnicode_READ(kind, d, k) == u'-'):
                        k += 1
                    if k < n and _digit(PyUnicode_READ(kind, d, k)):
                        j = k
                        while j < n and _digit(PyUnicode_READ(kind, d, j)):
                            j += 1
                lit = text[i:j]
                if j < n and _ident_char(PyUnicode_READ(kind, d, j)):
                    raise ConditionSyntaxError(
                        f"malformed number {_short(text[i:j + 1])}", i)
                # A constant must be a finite JSON number an int64 or a double holds:
                # 1e999 (inf) is no JSON, and a 5000-digit int no peer can read.
                if j - i > MAX_NUMBER_CHARS:
                    raise ConditionSyntaxError(
                        f"number {_short(lit)} is longer than {MAX_NUMBER_CHARS} characters", i)
                try:
                    if u'.' in lit or u'e' in lit or u'E' in lit:
                        value = float(lit)
                        if value - value != 0.0:
                            raise ConditionSyntaxError(
                                f"number {_short(lit)} is out of range", i)
                    else:
                        value = int(lit)
                        if value > MAX_INT:
                            raise ConditionSyntaxError(
                                f"number {_short(lit)} is out of range (at most {MAX_INT})", i)
                except ConditionSyntaxError:
                    raise
                except ValueError:
                    raise ConditionSyntaxError(f"malformed number {_short(lit)}", i) from None
                tk[t].kind = T_NUM
                tk[t].sub = len(self._vals)
                self._vals.append(value)
                tk[t].end = j
                t += 1
                i = j
                continue
            if c == u"'" or c == u'"':
                q = c
                j = i + 1
                esc = False
                while True:
                    if j >= n:
                        raise ConditionSyntaxError("unterminated string", i)
                    c = PyUnicode_READ(kind, d, j)
                    if c == q:
                        j += 1
                        break
                    if c == u'\\':
                        if j + 1 >= n:
                            raise ConditionSyntaxError("unterminated string", i)
                        e = PyUnicode_READ(kind, d, j + 1)
                        if not (e == u'n' or e == u't' or e == u'\\' or e == u"'"
                                or e == u'"'):
                            raise ConditionSyntaxError(f"unknown escape \\{e}", j)
                        esc = True
                        j += 2
                        continue
                    j += 1
                if esc:
                    value = _unescape(text, i + 1, j - 1)
                else:
                    value = text[i + 1:j - 1]
                tk[t].kind = T_STR
                tk[t].sub = len(self._vals)
                self._vals.append(value)
                tk[t].end = j
                t += 1
                i = j
                continue
            if c == u'=' or c == u'!' or c == u'<' or c == u'>':
                if i + 1 < n and PyUnicode_READ(kind, d, i + 1) == u'=':
                    tk[t].kind = T_OP
                    tk[t].sub = (OP_EQ if c == u'=' else OP_NE if c == u'!'
                                 else OP_LE if c == u'<' else OP_GE)
                    tk[t].end = i + 2
                    t += 1
                    i += 2
                    continue
                if c == u'<' or c == u'>':
                    tk[t].kind = T_OP
                    tk[t].sub = OP_LT if c == u'<' else OP_GT
                    tk[t].end = i + 1
                    t += 1
                    i += 1
                    continue
                if c == u'=':
                    raise ConditionSyntaxError("'=' is not an operator, use '=='", i)
                raise ConditionSyntaxError("'!' is not an operator, use 'not' or '!='", i)
            if c == u'(':
                tk[t].kind = T_LP
            elif c == u')':
                tk[t].kind = T_RP
            elif c == u'[':
                tk[t].kind = T_LB
            elif c == u']':
                tk[t].kind = T_RB
            elif c == u',':
                tk[t].kind = T_COMMA
            elif c == u'-':
                tk[t].kind = T_MINUS
            else:
                raise ConditionSyntaxError(f"unexpected character {c!r}", i)
            tk[t].sub = 0
            tk[t].end = i + 1
            t += 1
            i += 1
        tk[t].kind = T_EOF
        tk[t].sub = 0
        tk[t].pos = n
        tk[t].end = n
        return 0

    cdef object _tokconst(self, Tok* tok):
        """The value of a constant token (number, string, true, false, null)."""
        if tok.kind == T_KW:
            return True if tok.sub == KW_TRUE else (False if tok.sub == KW_FALSE else None)
        return self._vals[tok.sub]

    cdef object _tokval(self, Tok* tok):
        """The token's value as the error messages show it."""
        if tok.kind == T_EOF:
            return None
        if tok.kind == T_NUM or tok.kind == T_STR:
            return self._vals[tok.sub]
        return self._text[tok.pos:tok.end]

    # The parser returns a Python value wrapper for folded constants, or None when
    # the value has been emitted. (_Const, value) tuples are folded lazily so that
    # literal lists and negative numbers become one constant.

    cdef inline Tok* _peek(self) noexcept:
        return &self._tk[self._p]

    cdef inline Tok* _next(self) noexcept:
        cdef Tok* tok = &self._tk[self._p]
        self._p += 1
        return tok

    cdef _emit_const(self, object folded):
        self._out.append(OP_CONST)
        self._out.append(self._const_id(folded[1]))

    cdef int _const_id(self, object value) except -1:
        # canonical_dumps of the scalars a condition holds, without the encoder call
        if value is None:
            key = "null"
        elif value is True:
            key = "true"
        elif value is False:
            key = "false"
        elif type(value) is int:
            key = repr(value)
        elif type(value) is str:
            key = _encode_basestring(value)
        else:
            key = canonical_dumps(value)
        # bools and numbers must not collide (json keeps them apart: true vs 1)
        cid = self._const_ids.get(key)
        if cid is None:
            cid = len(self.consts)
            self.consts.append(key)
            self._const_ids[key] = cid
        return cid

    cdef _materialize(self, object v):
        if v is not None:
            self._emit_const(v)

    cdef object _expr(self, int depth):
        if depth > MAX_DEPTH:
            raise ConditionSyntaxError("condition nested too deeply", self._peek().pos)
        return self._or(depth)

    cdef object _or(self, int depth):
        cdef list jumps = []
        cdef Tok* tok
        v = self._and(depth)
        while True:
            tok = self._peek()
            if tok.kind == T_KW and tok.sub == KW_OR:
                self._p += 1
                self._materialize(v)
                self._out.append(OP_OR_JUMP)
                jumps.append(len(self._out))
                self._out.append(0)
                v = self._and(depth)
                continue
            break
        if jumps:
            self._materialize(v)
            self._out.append(OP_BOOL)
            for at in jumps:
                self._out[at] = len(self._out)
            return None
        return v

    cdef object _and(self, int depth):
        cdef list jumps = []
        cdef Tok* tok
        v = self._not(depth)
        while True:
            tok = self._peek()
            if tok.kind == T_KW and tok.sub == KW_AND:
                self._p += 1
                self._materialize(v)
                self._out.append(OP_AND_JUMP)
                jumps.append(len(self._out))
                self._out.append(0)
                v = self._not(depth)
                continue
            break
        if jumps:
            self._materialize(v)
            self._out.append(OP_BOOL)
            for at in jumps:
                self._out[at] = len(self._out)
            return None
        return v

    cdef object _not(self, int depth):
        cdef Tok* tok = self._peek()
        if tok.kind == T_KW and tok.sub == KW_NOT:
            self._p += 1
            if depth + 1 > MAX_DEPTH:
                raise ConditionSyntaxError("condition nested too deeply", tok.pos)
            v = self._not(depth + 1)
            self._materialize(v)
            self._out.append(OP_NOT)
            return None
        return self._cmp(depth)

    cdef object _cmp(self, int depth):
        left = self._unary(depth)
        cdef Tok* tok = self._peek()
        cdef Tok* nxt
        cdef int op = -1
        cdef bint negate = False
        if tok.kind == T_OP:
            op = tok.sub
            self._p += 1
        elif tok.kind == T_KW and tok.sub == KW_IN:
            op = OP_IN
            self._p += 1
        elif tok.kind == T_KW and tok.sub == KW_NOT:
            nxt = &self._tk[self._p + 1]
            if nxt.kind == T_KW and nxt.sub == KW_IN:
                op = OP_IN
                negate = True
                self._p += 2
        if op < 0:
            return left
        self._materialize(left)
        right = self._unary(depth)
        self._materialize(right)
        self._out.append(op)
        if negate:
            self._out.append(OP_NOT)
        tok = self._peek()
        if tok.kind == T_OP or (tok.kind == T_KW and tok.sub == KW_IN):
            raise ConditionSyntaxError(
                "comparisons do not chain; use 'and' between them", tok.pos)
        return None

    cdef object _unary(self, int depth):
        cdef Tok* tok = self._peek()
        if tok.kind == T_MINUS:
            self._p += 1
            if depth + 1 > MAX_DEPTH:
                raise ConditionSyntaxError("condition nested too deeply", tok.pos)
            v = self._unary(depth + 1)
            if v is not None:
                value = v[1]
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise ConditionSyntaxError("'-' applies to numbers only", tok.pos)
                return (_CONST, -value)
            self._out.append(OP_NEG)
            return None
        return self._primary(depth)

    cdef object _primary(self, int depth):
        cdef Tok* tok = self._next()
        cdef Tok* close
        cdef int kind = tok.kind
        if kind == T_NUM or kind == T_STR:
            return (_CONST, self._vals[tok.sub])
        if kind == T_KW:
            if tok.sub == KW_TRUE:
                return (_CONST, True)
            if tok.sub == KW_FALSE:
                return (_CONST, False)
            if tok.sub == KW_NULL:
                return (_CONST, None)
            raise ConditionSyntaxError(f"expected an operand, found {self._tokval(tok)!r}",
                                       tok.pos)
        if kind == T_NAME:
            self._out.append(OP_LOAD)
            self._out.append(self._ref(self._text[tok.pos:tok.end], tok.pos))
            return None
        if kind == T_LP:
            v = self._expr(depth + 1)
            close = self._next()
            if close.kind != T_RP:
                raise ConditionSyntaxError("expected ')'", close.pos)
            return v
        if kind == T_LB:
            return self._list(depth + 1, tok.pos)
        if kind == T_EOF:
            raise ConditionSyntaxError("expected an operand, found the end", tok.pos)
        raise ConditionSyntaxError(f"expected an operand, found {self._tokval(tok)!r}",
                                   tok.pos)

    cdef object _list(self, int depth, Py_ssize_t pos):
        if depth > MAX_DEPTH:
            raise ConditionSyntaxError("condition nested too deeply", pos)
        cdef list items = []
        cdef Py_ssize_t mark = len(self._out)
        cdef Tok* tok = self._peek()
        if tok.kind == T_RB:
            self._p += 1
            return (_CONST, [])
        while True:
            items.append((len(self._out), self._expr(depth)))
            tok = self._next()
            if tok.kind == T_COMMA:
                continue
            if tok.kind == T_RB:
                break
            raise ConditionSyntaxError("expected ',' or ']'", tok.pos)
        if len(items) > MAX_STACK:
            raise ConditionSyntaxError("list too long", pos)
        if all(v is not None for _, v in items):
            return (_CONST, [v[1] for _, v in items])
        # A list with references: emit every element in order, then LIST n.
        # Elements already emitted sit in the output; folded ones are spliced in.
        cdef list emitted = self._out[mark:]
        del self._out[mark:]
        cdef Py_ssize_t k, shift, pc
        for k in range(len(items)):
            start, v = items[k]
            end = items[k + 1][0] if k + 1 < len(items) else mark + len(emitted)
            if v is not None:
                self._emit_const(v)
                continue
            # Jumps inside the element are absolute within the condition: move them
            # by the constants spliced in before it.
            shift = len(self._out) - start
            seg = emitted[start - mark:end - mark]
            pc = 0
            while pc < len(seg):
                op = seg[pc]
                if op == OP_AND_JUMP or op == OP_OR_JUMP:
                    seg[pc + 1] += shift
                    pc += 2
                elif op == OP_CONST or op == OP_LOAD or op == OP_LIST:
                    pc += 2
                else:
                    pc += 1
            self._out.extend(seg)
        self._out.append(OP_LIST)
        self._out.append(len(items))
        return None

    cdef int _ref(self, str path, Py_ssize_t pos) except -1:
        # A reference's text decides its (kind, action, segments) and, the actions having
        # distinct indices, the other way round: the text is the key of its index.
        cdef PyObject* found = PyDict_GetItemWithError(self._ref_ids, path)
        if found != NULL:
            return <int><object>found
        key = self._ref_key(path, pos)
        rid = len(self.refs)
        self.refs.append(key)
        self._ref_ids[path] = rid
        return rid

    cdef tuple _ref_key(self, str path, Py_ssize_t pos):
        cdef int kind = PyUnicode_KIND(path)
        cdef void* d = PyUnicode_DATA(path)
        cdef Py_ssize_t n = len(path), dot = 0, k
        cdef PyObject* found
        cdef list segs
        while dot < n and PyUnicode_READ(kind, d, dot) != u'.':
            dot += 1
        if dot == n:
            return (REF_BARE, -1, (path,))
        k = dot + 1
        while k < n and PyUnicode_READ(kind, d, k) != u'.':
            k += 1
        if k == n:
            # the usual two segments, without a split into a list
            head = path[:dot]
            if dot + 1 < n and PyUnicode_READ(kind, d, dot + 1) != u'_' \
                    and not (dot == 3 and head == "job"):
                # action.field: no reserved segment to check
                found = PyDict_GetItemWithError(self._actions, head)
                if found != NULL:
                    return (REF_RESULT, <object>found, (path[dot + 1:],))
            segs = [head, path[dot + 1:]]
        else:
            segs = path.split(".")
        n = PyList_GET_SIZE(segs)
        head = segs[0]
        if head == "job":
            for k in range(1, n):
                if _reserved(segs[k]):
                    raise ConditionSyntaxError(f"unknown reserved field {segs[k]!r}", pos)
            key = (REF_JOB, -1, tuple(segs[1:]))
        else:
            found = PyDict_GetItem(self._actions, head)
            if found == NULL:
                raise ConditionSyntaxError(
                    f"unknown action {head!r} in {path!r} (use a bare name or job.{head})",
                    pos)
            act = <object>found
            second = segs[1]
            if second == "_round" or second == "_outcome":
                if n > 2:
                    raise ConditionSyntaxError(f"{second} has no fields", pos)
                key = (REF_ROUND if second == "_round" else REF_OUTCOME, act, ())
            else:
                for k in range(1, n):
                    if _reserved(segs[k]):
                        raise ConditionSyntaxError(f"unknown reserved field {segs[k]!r}", pos)
                key = (REF_RESULT, act, tuple(segs[1:]))
        return key


cdef inline bint _reserved(str seg):
    """seg.startswith("_")"""
    return len(seg) > 0 and seg[0] == u'_'


# ---------------------------------------------------------------- values

cdef inline bint _is_number(object v) noexcept:
    return (type(v) is int or type(v) is float) or (
        not isinstance(v, bool) and isinstance(v, (int, float)))


cdef bint truthy(object v) except -1:
    if v is None:
        return False
    return PyObject_IsTrue(v)


cdef bint values_equal(object a, object b) except -1:
    if a is None or b is None:
        return a is b
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if _is_number(a) and _is_number(b):
        return a == b
    if type(a) is not type(b):
        return False
    if type(a) is list:
        if len(<list>a) != len(<list>b):
            return False
        for x, y in zip(<list>a, <list>b):
            if not values_equal(x, y):
                return False
        return True
    return a == b


cdef int _order(object a, object b) except -2:
    """-1, 0, 1 for comparable values; 2 when they are not comparable (null, mixed)."""
    if a is None or b is None:
        return 2
    if isinstance(a, bool) or isinstance(b, bool):
        return 2
    if _is_number(a) and _is_number(b):
        return -1 if a < b else (1 if a > b else 0)
    if type(a) is str and type(b) is str:
        return -1 if a < b else (1 if a > b else 0)
    return 2


cdef bint _contains(object item, object container) except -1:
    if item is None or container is None:
        return False
    if type(container) is list:
        for x in <list>container:
            if values_equal(item, x):
                return True
        return False
    if type(container) is str:
        return type(item) is str and (<str>item) in (<str>container)
    if type(container) is dict:
        return type(item) is str and item in (<dict>container)
    return False


# ---------------------------------------------------------------- machine

cdef class CondContext:
    cdef object load(self, int32_t ref):
        return None


cdef inline int _push(PyObject** stack, Py_ssize_t* sp, object v) except -1:
    if sp[0] >= MAX_STACK:
        raise ValueError("condition overflows its stack")
    Py_INCREF(v)
    stack[sp[0]] = <PyObject*>v
    sp[0] += 1
    return 0


cdef inline object _pop(PyObject** stack, Py_ssize_t* sp):
    if sp[0] <= 0:
        raise ValueError("condition left a malformed stack")
    sp[0] -= 1
    cdef object v = <object>stack[sp[0]]
    Py_DECREF(v)        # the stack's reference passes to v
    return v


cdef object run_condition(const int32_t* code, Py_ssize_t start, Py_ssize_t end,
                          list consts, CondContext ctx):
    """Run one verified condition; return its value (a Python object).

    The stack is a C array of references (no list per call); whatever is left on it
    when the run ends, normally or by an exception, is released in ``finally``."""
    cdef PyObject* stack[MAX_STACK]
    cdef Py_ssize_t sp = 0, i
    cdef Py_ssize_t pc = start
    cdef int32_t op
    cdef int o
    cdef Py_ssize_t n
    cdef list items
    if end - start == 6 and code[start] == OP_LOAD and code[start + 2] == OP_CONST:
        # the most common condition, `ref <op> constant` (`a.ok == true`, `t < 5`):
        # the same result as the loop below, without the stack
        op = code[start + 4]
        if op == OP_EQ or op == OP_NE:
            return values_equal(ctx.load(code[start + 1]), consts[code[start + 3]]) \
                == (op == OP_EQ)
        if OP_LT <= op <= OP_GE:
            o = _order(ctx.load(code[start + 1]), consts[code[start + 3]])
            if o == 2:
                return False
            if op == OP_LT:
                return o < 0
            if op == OP_LE:
                return o <= 0
            if op == OP_GT:
                return o > 0
            return o >= 0
    try:
        while pc < end:
            op = code[pc]
            if op == OP_END:
                break
            elif op == OP_CONST:
                _push(stack, &sp, consts[code[pc + 1]])
                pc += 2
            elif op == OP_LOAD:
                _push(stack, &sp, ctx.load(code[pc + 1]))
                pc += 2
            elif op == OP_EQ or op == OP_NE:
                b = _pop(stack, &sp)
                a = _pop(stack, &sp)
                _push(stack, &sp, values_equal(a, b) == (op == OP_EQ))
                pc += 1
            elif OP_LT <= op <= OP_GE:
                b = _pop(stack, &sp)
                a = _pop(stack, &sp)
                o = _order(a, b)
                if o == 2:
                    _push(stack, &sp, False)
                elif op == OP_LT:
                    _push(stack, &sp, o < 0)
                elif op == OP_LE:
                    _push(stack, &sp, o <= 0)
                elif op == OP_GT:
                    _push(stack, &sp, o > 0)
                else:
                    _push(stack, &sp, o >= 0)
                pc += 1
            elif op == OP_IN:
                b = _pop(stack, &sp)
                a = _pop(stack, &sp)
                _push(stack, &sp, _contains(a, b))
                pc += 1
            elif op == OP_NOT:
                _push(stack, &sp, not truthy(_pop(stack, &sp)))
                pc += 1
            elif op == OP_AND_JUMP or op == OP_OR_JUMP:
                if sp <= 0:
                    raise ValueError("condition left a malformed stack")
                if truthy(<object>stack[sp - 1]) == (op == OP_OR_JUMP):
                    # short cut: the top becomes the answer's bool
                    v = _pop(stack, &sp)
                    _push(stack, &sp, op == OP_OR_JUMP)
                    pc = start + code[pc + 1]
                else:
                    _pop(stack, &sp)
                    pc += 2
            elif op == OP_BOOL:
                _push(stack, &sp, truthy(_pop(stack, &sp)))
                pc += 1
            elif op == OP_LIST:
                n = code[pc + 1]
                if n > sp:
                    raise ValueError("condition left a malformed stack")
                items = [None] * n
                for i in range(n - 1, -1, -1):
                    items[i] = _pop(stack, &sp)
                _push(stack, &sp, items)
                pc += 2
            elif op == OP_NEG:
                v = _pop(stack, &sp)
                _push(stack, &sp, -v if _is_number(v) else None)
                pc += 1
            else:
                raise ValueError(f"bad opcode {op}")
        if sp != 1:
            raise ValueError("condition left a malformed stack")
        return _pop(stack, &sp)
    finally:
        for i in range(sp):
            Py_XDECREF(stack[i])


cdef int verify_code(const int32_t* code, Py_ssize_t start, Py_ssize_t end,
                     Py_ssize_t n_consts, Py_ssize_t n_refs) noexcept:
    """0 when the code of one condition is safe to run: known opcodes, operands in
    range, jumps forward inside the condition, bounded stack, ends with END."""
    cdef Py_ssize_t pc = start, depth = 0
    cdef int32_t op, arg
    if end <= start or code[end - 1] != OP_END:
        return -1
    while pc < end - 1:
        op = code[pc]
        if op <= OP_END or op >= OP_COUNT:
            return -1
        if op == OP_CONST or op == OP_LOAD or op == OP_AND_JUMP or op == OP_OR_JUMP \
                or op == OP_LIST:
            if pc + 1 >= end - 1:
                return -1
            arg = code[pc + 1]
            if op == OP_CONST:
                if arg < 0 or arg >= n_consts:
                    return -1
                depth += 1
            elif op == OP_LOAD:
                if arg < 0 or arg >= n_refs:
                    return -1
                depth += 1
            elif op == OP_LIST:
                if arg < 0 or arg > depth:
                    return -1
                depth = depth - arg + 1
            else:
                # target relative to start, strictly forward, inside the condition
                if arg <= pc + 1 - start or start + arg > end - 1:
                    return -1
                if depth < 1:
                    return -1
                depth -= 1
            pc += 2
        else:
            if op == OP_NOT or op == OP_BOOL or op == OP_NEG:
                if depth < 1:
                    return -1
            else:
                if depth < 2:
                    return -1
                depth -= 1
            pc += 1
        if depth > MAX_STACK:
            return -1
    return 0


# ---------------------------------------------------------------- Python-facing helpers

cdef class _DictContext(CondContext):
    cdef list _refs
    cdef dict _results
    cdef dict _rounds
    cdef dict _outcomes
    cdef dict _params
    cdef list _bare
    cdef list _names

    cdef object load(self, int32_t ref):
        kind, act, segs = self._refs[ref]
        if kind == REF_ROUND:
            return self._rounds.get(self._names[act])
        if kind == REF_OUTCOME:
            return self._outcomes.get(self._names[act])
        if kind == REF_RESULT:
            return lookup_path(self._results.get(self._names[act]), segs)
        if kind == REF_JOB:
            return lookup_path(self._params, segs)
        head = segs[0]
        for res in self._bare:
            if type(res) is dict and head in res:
                return (<dict>res)[head]
        return (<dict>self._params).get(head)


cpdef object lookup_path(object value, tuple segs):
    """Walk ``segs`` into nested objects; a missing key or a non-object is null."""
    for s in segs:
        if type(value) is not dict:
            return None
        value = (<dict>value).get(s)
    return value


def truthy_value(v) -> bool:
    """The truth a transition sees: null, false, 0, '' and empty lists are false."""
    return truthy(v)


def evaluate(str text, *, dict results=None, dict rounds=None, dict outcomes=None,
             dict params=None, list bare=None):
    """Compile and evaluate one condition against plain dicts (for tools and tests).

    ``results``/``rounds``/``outcomes`` are keyed by action name; ``bare`` is the list of
    result dicts a bare name is looked up in, newest first, before ``params``.
    Returns the truth value the transition would see.
    """
    results = results or {}
    rounds = rounds or {}
    outcomes = outcomes or {}
    names = sorted(set(results) | set(rounds) | set(outcomes))
    b = CondBuilder({n: i for i, n in enumerate(names)})
    idx = b.add(text)
    if idx < 0:
        return True
    cdef _DictContext ctx = _DictContext()
    ctx._refs = b.refs
    ctx._results = results
    ctx._rounds = rounds
    ctx._outcomes = outcomes
    ctx._params = params or {}
    ctx._bare = bare or []
    ctx._names = names
    consts = [json.loads(c) for c in b.consts]
    import array
    code = array.array("i", b.code)
    cdef const int32_t[:] view = code
    if verify_code(&view[0], b.offsets[idx], b.offsets[idx + 1], len(consts), len(b.refs)) != 0:
        raise AssertionError("the compiler emitted code the verifier refuses")
    return truthy(run_condition(&view[0], b.offsets[idx], b.offsets[idx + 1], consts, ctx))


def disassemble(str text, actions=()):
    """Readable bytecode of one condition, for docs and tests."""
    b = CondBuilder({n: i for i, n in enumerate(actions)})
    idx = b.add(text)
    if idx < 0:
        return ["TRUE"]
    names = {v: k for k, v in OPCODES.items()}
    out = []
    code = b.code
    pc = b.offsets[idx]
    end = b.offsets[idx + 1]
    while pc < end:
        op = code[pc]
        if op in (OP_CONST, OP_LOAD, OP_AND_JUMP, OP_OR_JUMP, OP_LIST):
            arg = code[pc + 1]
            if op == OP_CONST:
                out.append(f"CONST {b.consts[arg]}")
            elif op == OP_LOAD:
                kind, act, segs = b.refs[arg]
                kname = {v: k for k, v in REF_KINDS.items()}[kind]
                out.append(f"LOAD {kname}:{act}:{'.'.join(segs)}")
            else:
                out.append(f"{names[op]} {arg}")
            pc += 2
        else:
            out.append(names[op])
            pc += 1
    return out
