# cython: language_level=3
"""The compiled recipe: ``Graph``, an immutable bytes blob with int32/int64 tables
inside. The object only holds typed pointers into the blob, so ``to_bytes`` is free
and ``from_bytes`` is a bounds check, not a parse. The graph's vocabulary (qualifiers,
interactions, branch types, transition kinds) is named here."""

cimport cython
from libc.stdint cimport int32_t, int64_t, uint16_t
from libc.string cimport memcpy
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.unicode cimport PyUnicode_DecodeUTF8

from sfc_fast._layout cimport (
    COUNTS_AT, FINGERPRINT_AT, GRAPH_FORMAT_MAJOR, HEADER_SIZE, MAX_COUNT, N_COUNTS, N_I32,
    i64_at, table_lengths,
)
from sfc_fast.conditions cimport CondContext, run_condition, verify_code

import json

from sfc_fast.errors import SfcError

SCHEMA_V100 = "https://aschamberger.github.io/schemas/microdcs/sfc-recipe/v1.0.0/"
SCHEMA_V110 = "https://aschamberger.github.io/schemas/microdcs/sfc-recipe/v1.1.0/"
SCHEMAS = {SCHEMA_V100: 0, SCHEMA_V110: 1}

QUALIFIERS = {"N": Q_N, "P": Q_P, "P1": Q_P1, "P0": Q_P0, "S": Q_S, "R": Q_R,
              "L": Q_L, "D": Q_D}
QUALIFIER_NAMES = {v: k for k, v in QUALIFIERS.items()}
INTERACTIONS = {"push_command": I_PUSH, "pull_event": I_PULL}
INTERACTION_NAMES = {v: k for k, v in INTERACTIONS.items()}
BRANCH_TYPES = {"selection": B_SELECTION, "simultaneous": B_SIMULTANEOUS}
BRANCH_TYPE_NAMES = {v: k for k, v in BRANCH_TYPES.items()}
TRANSITION_KINDS = {TK_STEP: "step", TK_ENTRY: "entry", TK_EXIT: "exit",
                    TK_PATH: "path", TK_IMPLICIT: "implicit", TK_PATH_END: "path_end"}


class GraphFormatError(SfcError, ValueError):
    """Bytes that are not a graph this version can load."""


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
        return hash(self._blob[FINGERPRINT_AT:COUNTS_AT])

    def __repr__(self):
        return (f"<Graph {self.fingerprint[:12]} steps={self.n_steps} "
                f"actions={self.n_actions} branches={self.n_branches}>")

    @property
    def fingerprint(self) -> str:
        """Hex digest of the canonical recipe and its format version."""
        return self._blob[FINGERPRINT_AT:COUNTS_AT].hex()

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
        table_lengths(counts, lengths)
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
        off = i64_at((off - HEADER_SIZE) // 4)
        for name in ("act_timeout_ms", "act_hold_timeout_ms", "act_duration_ms"):
            out[name] = np.frombuffer(self._blob, dtype="<i8", count=self.n_actions, offset=off)
            off += 8 * self.n_actions
        return out


cdef int _attach(Graph g, bytes blob) except -1:
    """Point g's tables into blob after checking every index (never trust bytes)."""
    cdef int32_t c[N_COUNTS]
    cdef int minor = _read_header(blob, c)
    g.n_steps, g.n_branches, g.n_paths, g.n_path_steps = c[0], c[1], c[2], c[3]
    g.n_transitions, g.n_actions, g.n_conds, g.n_code = c[4], c[5], c[6], c[7]
    g.n_refs, g.n_ref_segs, g.n_consts, g.n_strings = c[8], c[9], c[10], c[11]
    g.schema_minor = minor
    g.initial_step = c[13]
    _point(g, PyBytes_AS_STRING(blob))
    bad = _check_tables(g, c[12])
    if bad is not None:
        raise GraphFormatError(f"corrupt graph: {bad}")
    g._blob = blob
    g._strs = [None] * g.n_strings
    return 0


cdef int _read_header(bytes blob, int32_t* c) except -1:
    """The header's counts into c, checked against each other and the blob's size;
    returns the recipe's schema minor."""
    cdef Py_ssize_t size = PyBytes_GET_SIZE(blob)
    cdef const char* base = PyBytes_AS_STRING(blob)
    cdef uint16_t major
    cdef Py_ssize_t i, off, n32
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
    memcpy(c, base + COUNTS_AT, N_COUNTS * 4)
    for i in range(13):
        if c[i] < 0 or c[i] > MAX_COUNT:
            raise GraphFormatError("graph header counts out of range")
    cdef int32_t S = c[0], A = c[5]
    cdef int32_t SB = c[12]
    if S < 1 or not (0 <= c[13] < S):
        raise GraphFormatError("graph has no initial step")
    cdef Py_ssize_t lengths[N_I32]
    n32 = table_lengths(c, lengths)
    off = i64_at(n32)
    if size != off + 3 * 8 * A + SB:
        raise GraphFormatError("graph size does not match its header")
    return minor


cdef void _point(Graph g, const char* base) noexcept:
    """g's table pointers into the blob at base, in blob order (_layout.pxd)."""
    cdef int32_t S = g.n_steps, B = g.n_branches, P = g.n_paths, PS = g.n_path_steps
    cdef int32_t T = g.n_transitions, A = g.n_actions, C = g.n_conds, K = g.n_code
    cdef int32_t R = g.n_refs, RS = g.n_ref_segs, CN = g.n_consts, NS = g.n_strings
    cdef int32_t N = S + B
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
    cdef Py_ssize_t off = i64_at((<const char*>p - base - HEADER_SIZE) // 4)
    cdef const int64_t* q = <const int64_t*>(base + off)
    g.act_timeout_ms = q; q += A
    g.act_hold_timeout_ms = q; q += A
    g.act_duration_ms = q; q += A
    g.str_data = base + off + 3 * 8 * A


cdef object _check_tables(Graph g, int32_t SB):
    """Why g's tables are not a graph (every index in range, the tables consistent,
    every condition's bytecode valid); None when they are."""
    cdef int32_t S = g.n_steps, B = g.n_branches, P = g.n_paths, PS = g.n_path_steps
    cdef int32_t T = g.n_transitions, A = g.n_actions, C = g.n_conds, K = g.n_code
    cdef int32_t R = g.n_refs, RS = g.n_ref_segs, CN = g.n_consts, NS = g.n_strings
    cdef int32_t N = S + B
    cdef Py_ssize_t i, k
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
    return bad


cdef Graph graph_of(bytes blob):
    cdef Graph g = Graph.__new__(Graph)
    _attach(g, blob)
    return g
