# cython: language_level=3
"""Recipe compiler: validates a v1.0.0 / v1.1.0 SFC recipe and builds its graph.

Every problem of a recipe is collected and reported at once (``RecipeError``).
The graph is one immutable bytes blob with int32/int64 tables inside; the
``Graph`` object only holds typed pointers into it, so ``to_bytes`` is free and
``from_bytes`` is a bounds check, not a parse.
"""

from libc.stdint cimport int32_t, int64_t, uint16_t
from libc.string cimport memcpy
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.unicode cimport PyUnicode_DecodeUTF8

from sfc_fast.conditions cimport CondContext, run_condition, verify_code

import hashlib
import json
import re
from array import array

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
_MATCH_KEYS = frozenset(("Subject", "CorrelationId"))
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


_BAD_NAME = re.compile(r"[\s\x00-\x1f\x7f]")
#: Longest text field (names, type ids, conditions, Match templates).
MAX_FIELD_CHARS = 65536
#: Longest Parameters object of one action, as JSON.
MAX_PARAMS_CHARS = 1024 * 1024


def canonical_json(obj) -> bytes:
    """Sorted keys, no whitespace: how Parameters are stored and fingerprinted."""
    return canonical_dumps(obj).encode("utf-8")


# ---------------------------------------------------------------- compiler

cdef class _Compiler:
    cdef int minor
    cdef list problems
    cdef list strings
    cdef dict string_ids

    def __init__(self, int minor):
        self.minor = minor
        self.problems = []
        self.strings = []
        self.string_ids = {}

    cdef void err(self, str code, str path, str message):
        self.problems.append(Problem(code, path, message))

    cdef int sid(self, str s) except -2:
        i = self.string_ids.get(s)
        if i is None:
            i = len(self.strings)
            self.strings.append(s)
            self.string_ids[s] = i
        return i

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

    cdef void _unknown_keys(self, dict obj, frozenset allowed, str path):
        d = obj.get("Description")
        if d is not None and (not _is_str(d) or len(d) > MAX_FIELD_CHARS):
            self.err("SFC013", f"{path}.Description",
                     f"Description must be text of at most {MAX_FIELD_CHARS} characters")
        for k in obj:
            if k not in allowed:
                if isinstance(k, str) and k in V110_FIELDS:
                    continue   # reported as SFC012 or validated where they belong
                self.err("SFC021", f"{path}.{k}" if isinstance(k, str) else path,
                         f"unknown field {str(k)[:80]!r}")

    cdef object _name(self, dict obj, str path, str what):
        v = obj.get("Name")
        if not _is_str(v) or not v.strip():
            self.err("SFC013", f"{path}.Name", f"{what} needs a non-empty Name (text)")
            return None
        if len(v) > MAX_FIELD_CHARS:
            self.err("SFC015", f"{path}.Name", f"Name is {len(v)} characters, the limit is "
                                               f"{MAX_FIELD_CHARS}")
            return None
        return v

    cdef object _text(self, object v, str path, str what):
        """A non-empty text field of bounded length, or None after reporting."""
        if not _is_str(v) or not v:
            self.err("SFC013", path, f"{what} is required (non-empty text)")
            return None
        if len(v) > MAX_FIELD_CHARS:
            self.err("SFC015", path, f"{what} is {len(v)} characters, the limit is "
                                     f"{MAX_FIELD_CHARS}")
            return None
        return v

    cdef object _seconds(self, dict a, str key, str path, str code, bint allow_float):
        v = a.get(key)
        if allow_float:
            ok = (_is_int(v) or type(v) is float) and v == v
        else:
            ok = _is_int(v)
        if not ok:
            kind = "a number of seconds" if allow_float else "a whole number of seconds"
            self.err("SFC013" if v is None or not isinstance(v, (int, float)) else code,
                     f"{path}.{key}", f"{key} must be {kind}")
            return None
        if v <= 0:
            self.err(code, f"{path}.{key}", f"{key} must be greater than 0, not {v}")
            return None
        if v > MAX_SECONDS:
            self.err(code, f"{path}.{key}", f"{key} must be at most {MAX_SECONDS}")
            return None
        return int(round(v * 1000))

    def run(self, obj):
        if not isinstance(obj, dict):
            self.err("SFC014", "$", f"a recipe is a JSON object, not {type(obj).__name__}")
            return None
        self._unknown_keys(obj, _RECIPE_KEYS, "$")
        steps_in = self._list(obj, "Steps", "$", True)
        trans_in = self._list(obj, "Transitions", "$", True)
        acts_in = self._list(obj, "Actions", "$", True)
        brs_in = self._list(obj, "Branches", "$", False)

        # ---- steps
        cdef dict node_of = {}          # name -> node id
        cdef list step_names = []
        cdef list step_flags = []
        cdef list initial = []
        for i, st in enumerate(steps_in):
            p = f"$.Steps[{i}]"
            if not isinstance(st, dict):
                self.err("SFC013", p, "a step is an object with a Name")
                step_names.append(None)
                step_flags.append(0)
                continue
            self._unknown_keys(st, _STEP_KEYS, p)
            name = self._name(st, p, "a step")
            ini = st.get("Initial", False)
            if not isinstance(ini, bool):
                self.err("SFC013", f"{p}.Initial", "Initial must be true or false")
                ini = False
            if name is not None:
                if name in node_of:
                    self.err("SFC002", f"{p}.Name", f"duplicate step name {name!r}")
                else:
                    node_of[name] = len(step_names)
            step_names.append(name)
            step_flags.append(SF_INITIAL if ini else 0)
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
        for bi, br in enumerate(brs_in):
            p = f"$.Branches[{bi}]"
            name = None
            tcode = B_SELECTION
            if not isinstance(br, dict):
                self.err("SFC013", p, "a branch is an object with Name, Type and Branches")
            else:
                self._unknown_keys(br, _BRANCH_KEYS, p)
                name = self._name(br, p, "a branch")
                btype = br.get("Type")
                if not _is_str(btype) or btype not in BRANCH_TYPES:
                    self.err("SFC020", f"{p}.Type", f"unknown branch type {str(btype)[:80]!r}; "
                                                    f"use selection or simultaneous")
                else:
                    tcode = BRANCH_TYPES[btype]
                if name is not None:
                    if name in node_of:
                        self.err("SFC002", f"{p}.Name", f"duplicate name {name!r} (steps and "
                                                        f"branches share one namespace)")
                    else:
                        node_of[name] = S + bi
            br_names.append(name)
            br_types.append(tcode)
        for bi, br in enumerate(brs_in):
            p = f"$.Branches[{bi}]"
            name = br_names[bi]
            if not isinstance(br, dict):
                br_path_off.append(len(path_branch))
                continue
            paths = br.get("Branches")
            if not isinstance(paths, list):
                self.err("SFC013", f"{p}.Branches", "Branches must be a list of step lists")
                paths = []
            elif not paths:
                self.err("SFC008", f"{p}.Branches", f"branch {name!r} has no paths")
            for pi, path in enumerate(paths):
                pp = f"{p}.Branches[{pi}]"
                if not isinstance(path, list):
                    self.err("SFC013", pp, "a branch path is a list of step names")
                    continue
                if not path:
                    self.err("SFC008", pp, f"path {pi} of branch {name!r} is empty")
                    continue
                pidx = len(path_branch)
                path_branch.append(bi)
                for k, sname in enumerate(path):
                    sp = f"{pp}[{k}]"
                    if not _is_str(sname):
                        self.err("SFC013", sp, "a branch path lists step names (text)")
                        continue
                    node = node_of.get(sname)
                    if node is None:
                        self.err("SFC003", sp, f"unknown step {sname!r}")
                        continue
                    if node >= S:
                        self.err("SFC019", sp,
                                 f"{sname!r} is a branch; paths hold steps only (no nesting)")
                        continue
                    if step_path[node] != -1:
                        self.err("SFC009", sp, f"step {sname!r} is already in a branch path")
                        continue
                    step_path[node] = pidx
                    path_steps.append(node)
                path_off.append(len(path_steps))
            br_path_off.append(len(path_branch))
        cdef int B = len(br_names)
        # Branch names given later in the list that a path mentions were checked above.
        for i in initial:
            if step_path[i] != -1:
                self.err("SFC023", f"$.Steps[{i}]",
                         f"initial step {step_names[i]!r} is inside a branch path")

        # ---- actions
        cdef list acts = []     # dicts of validated fields, or None
        cdef dict stored = {}   # name -> association index of non-reset actions
        for ai, a in enumerate(acts_in):
            p = f"$.Actions[{ai}]"
            if not isinstance(a, dict):
                self.err("SFC013", p, "an action is an object")
                acts.append(None)
                continue
            self._unknown_keys(a, _ACTION_KEYS, p)
            rec = {}
            name = self._name(a, p, "an action")
            if name is not None:
                if ":" in name:
                    self.err("SFC004", f"{p}.Name",
                             f"action name {name!r} contains ':'; command ids and markers "
                             f"use ':' as a separator")
                elif name in RESERVED_ACTION_NAMES:
                    self.err("SFC004", f"{p}.Name",
                             f"action name {name!r} is reserved (job.* names job parameters)")
                elif _BAD_NAME.search(name) is not None:
                    self.err("SFC004", f"{p}.Name",
                             f"action name {name!r} contains whitespace or control characters")
            rec["name"] = name
            step = a.get("Step")
            sidx = node_of.get(step) if _is_str(step) else None
            if not _is_str(step):
                self.err("SFC013", f"{p}.Step", "Step is required (a step name)")
            elif sidx is None or sidx >= S:
                self.err("SFC003", f"{p}.Step", f"unknown step {step!r}")
                sidx = None
            rec["step"] = sidx
            q = a.get("Qualifier")
            qc = QUALIFIERS.get(q) if _is_str(q) else None
            if qc is None:
                self.err("SFC006", f"{p}.Qualifier",
                         f"unknown qualifier {str(q)[:40]!r}; use one of "
                         f"{', '.join(QUALIFIERS)}")
            rec["qual"] = qc
            inter = a.get("Interaction")
            ic = INTERACTIONS.get(inter) if _is_str(inter) else None
            if ic is None:
                self.err("SFC007", f"{p}.Interaction",
                         f"unknown interaction {str(inter)[:40]!r}; use push_command or "
                         f"pull_event")
            rec["inter"] = ic
            rec["type"] = self._text(a.get("TypeId"), f"{p}.TypeId", "TypeId")
            rec["timeout"] = self._seconds(a, "TimeoutSeconds", p, "SFC005", False)
            params = a.get("Parameters")
            ptext = None
            if params is not None:
                if not isinstance(params, dict):
                    self.err("SFC013", f"{p}.Parameters", "Parameters must be an object")
                else:
                    try:
                        ptext = canonical_dumps(params)
                    except (TypeError, ValueError) as e:
                        self.err("SFC013", f"{p}.Parameters", f"Parameters must be JSON data: {e}")
                    else:
                        if len(ptext) > MAX_PARAMS_CHARS:
                            self.err("SFC015", f"{p}.Parameters",
                                     f"Parameters are {len(ptext)} characters as JSON, the "
                                     f"limit is {MAX_PARAMS_CHARS}")
                            ptext = None
            rec["params"] = ptext
            rec["hold"] = rec["restart"] = rec["subject"] = rec["corr"] = None
            rec["hold_timeout"] = None
            rec["retries"] = 0
            rec["duration"] = 0
            self._v110(a, p, rec)
            if qc is not None and qc != Q_R and name is not None:
                if name in stored:
                    self.err("SFC002", f"{p}.Name", f"duplicate action name {name!r}")
                else:
                    stored[name] = ai
            acts.append(rec)
        # resets name a stored (S) action in another step
        for ai, rec in enumerate(acts):
            rec_reset = -1
            if rec is not None and rec["qual"] == Q_R and rec["name"] is not None:
                target = stored.get(rec["name"])
                if target is None or acts[target] is None or acts[target]["qual"] != Q_S:
                    self.err("SFC016", f"$.Actions[{ai}].Name",
                             f"R resets {rec['name']!r}, which is not an S (stored) action")
                elif acts[target]["step"] is not None and acts[target]["step"] == rec["step"]:
                    self.err("SFC016", f"$.Actions[{ai}].Step",
                             f"R of {rec['name']!r} must be in a later step than its S")
                else:
                    rec_reset = target
            if rec is not None:
                rec["reset"] = rec_reset

        # ---- transitions
        cb = CondBuilder(stored)
        cdef list trans = []    # (source, target, priority, cond, kind, text, order)
        cdef int N = S + B
        cdef list has_out = [False] * N
        cdef list entry_paths = [set() for _ in range(B)]
        for ti, t in enumerate(trans_in):
            p = f"$.Transitions[{ti}]"
            if not isinstance(t, dict):
                self.err("SFC013", p, "a transition is an object with Source, Target, Condition")
                continue
            self._unknown_keys(t, _TRANSITION_KEYS, p)
            ends = []
            for key in ("Source", "Target"):
                v = t.get(key)
                if not _is_str(v):
                    self.err("SFC013", f"{p}.{key}", f"{key} is required (a step or branch name)")
                    ends.append(None)
                    continue
                node = node_of.get(v)
                if node is None:
                    self.err("SFC003", f"{p}.{key}", f"unknown step or branch {v!r}")
                ends.append(node)
            cond_text = t.get("Condition")
            cidx = -1
            if not _is_str(cond_text):
                self.err("SFC013", f"{p}.Condition",
                         "Condition is required (text; 'always' for none)")
                cond_text = None
            elif len(cond_text) > MAX_FIELD_CHARS:
                self.err("SFC015", f"{p}.Condition", f"Condition is {len(cond_text)} characters, "
                                                     f"the limit is {MAX_FIELD_CHARS}")
                cond_text = None
            else:
                try:
                    cidx = cb.add(cond_text)
                except ConditionSyntaxError as e:
                    self.err("SFC011", f"{p}.Condition",
                             f"{e.message} at position {e.position} in {cond_text[:200]!r}")
            prio = t.get("Priority", 0)
            if not _is_int(prio) or not (-1_000_000 <= prio <= 1_000_000):
                self.err("SFC013", f"{p}.Priority",
                         "Priority must be a whole number between -1000000 and 1000000")
                prio = 0
            src, dst = ends
            if src is None or dst is None:
                continue
            kind = self._kind(src, dst, S, step_path, path_branch, path_off, path_steps,
                              br_types, step_names, br_names, cond_text, cidx, p)
            if kind < 0:
                continue
            if kind == TK_ENTRY:
                entry_paths[src - S].add(step_path[dst])
            has_out[src] = True
            trans.append([src, dst, prio, cidx, kind,
                          self.sid(cond_text) if cond_text is not None else -1])

        if self.problems:
            return None

        # implicit transitions: next step of a path, default entry of a selection path
        for pidx in range(len(path_branch)):
            lo, hi = path_off[pidx], path_off[pidx + 1]
            for k in range(lo, hi - 1):
                node = path_steps[k]
                if not has_out[node]:
                    trans.append([node, path_steps[k + 1], 0, -1, TK_IMPLICIT, -1])
            bi = path_branch[pidx]
            if br_types[bi] == B_SELECTION and pidx not in entry_paths[bi]:
                trans.append([S + bi, path_steps[lo], 2_000_000, -1, TK_IMPLICIT, -1])

        # CSR of outgoing transitions, by priority then document order
        cdef int T = len(trans)
        order = sorted(range(T), key=lambda i: (trans[i][0], trans[i][2], i))
        node_out_off = [0] * (N + 1)
        for i in range(T):
            node_out_off[trans[i][0] + 1] += 1
        for n in range(N):
            node_out_off[n + 1] += node_out_off[n]

        # actions per step, document order
        A = len(acts)
        step_act_off = [0] * (S + 1)
        for rec in acts:
            step_act_off[rec["step"] + 1] += 1
        for n in range(S):
            step_act_off[n + 1] += step_act_off[n]
        fill = list(step_act_off[:S])
        step_acts = [0] * A
        for ai, rec in enumerate(acts):
            step_acts[fill[rec["step"]]] = ai
            fill[rec["step"]] += 1

        # strings
        a_name = [self.sid(r["name"]) for r in acts]
        a_type = [self.sid(r["type"]) for r in acts]
        a_params = [self.sid(r["params"]) if r["params"] is not None else -1 for r in acts]
        a_hold = [self.sid(r["hold"]) if r["hold"] is not None else -1 for r in acts]
        a_restart = [self.sid(r["restart"]) if r["restart"] is not None else -1 for r in acts]
        a_subj = [self.sid(r["subject"]) if r["subject"] is not None else -1 for r in acts]
        a_corr = [self.sid(r["corr"]) if r["corr"] is not None else -1 for r in acts]
        s_name = [self.sid(n) for n in step_names]
        b_name = [self.sid(n) for n in br_names]
        ref_kind = []
        ref_action = []
        ref_seg_off = [0]
        ref_segs = []
        for kind, act, segs in cb.refs:
            ref_kind.append(kind)
            ref_action.append(act)
            for sg in segs:
                ref_segs.append(self.sid(sg))
            ref_seg_off.append(len(ref_segs))
        const_text = [self.sid(c) for c in cb.consts]

        encoded = [s.encode("utf-8") for s in self.strings]
        str_off = [0]
        for e in encoded:
            str_off.append(str_off[-1] + len(e))
        str_data = b"".join(encoded)
        if len(str_data) > MAX_RECIPE_BYTES:
            self.err("SFC015", "$", f"recipe text is {len(str_data)} bytes, the limit is "
                                    f"{MAX_RECIPE_BYTES}")
            return None

        counts = (S, B, len(path_branch), len(path_steps), T, A, len(cb.offsets) - 1,
                  len(cb.code), len(ref_kind), len(ref_segs), len(const_text),
                  len(self.strings), len(str_data), initial[0])
        i32 = [
            s_name, step_flags, step_path, step_act_off, step_acts,
            node_out_off, order,
            [trans[i][0] for i in range(T)], [trans[i][1] for i in range(T)],
            [trans[i][2] for i in range(T)], [trans[i][3] for i in range(T)],
            [trans[i][4] for i in range(T)], [trans[i][5] for i in range(T)],
            a_name, [r["step"] for r in acts], [r["qual"] for r in acts],
            [r["inter"] for r in acts], a_type, a_params, a_hold, a_restart,
            [r["retries"] for r in acts], a_subj, a_corr, [r["reset"] for r in acts],
            b_name, br_types, br_path_off,
            path_branch, path_off, path_steps,
            cb.offsets, cb.code, ref_kind, ref_action, ref_seg_off, ref_segs, const_text,
            str_off,
        ]
        i64 = [
            [r["timeout"] or 0 for r in acts],
            [r["hold_timeout"] or 0 for r in acts],
            [r["duration"] for r in acts],
        ]
        return _pack(self.minor, counts, i32, i64, str_data)

    cdef int _kind(self, int src, int dst, int S, list step_path, list path_branch,
                   list path_off, list path_steps, list br_types, list step_names,
                   list br_names, object cond_text, int cidx, str p) except -2:
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
                self.err("SFC019", p,
                         f"a transition from {step_names[src]!r} (inside a branch path) must "
                         f"stay in its path, or target its own branch "
                         f"{br_names[path_branch[sp]]!r} to end the path")
                return -1
            if dst < S and dp >= 0:
                self.err("SFC019", p,
                         f"{step_names[dst]!r} is inside a branch path; target the branch "
                         f"{br_names[path_branch[dp]]!r} instead")
                return -1
            return TK_STEP
        bi = src - S
        if dst < S and step_path[dst] >= 0:
            pidx = step_path[dst]
            if path_branch[pidx] == bi and path_steps[path_off[pidx]] == dst:
                if br_types[bi] == B_SIMULTANEOUS and cidx >= 0:
                    self.err("SFC019", p,
                             f"every path of simultaneous branch {br_names[bi]!r} starts; an "
                             f"entry transition cannot carry a condition")
                    return -1
                return TK_ENTRY
            self.err("SFC019", p,
                     f"{step_names[dst]!r} is inside a branch path and not the first step "
                     f"of a path of {br_names[bi]!r}")
            return -1
        return TK_EXIT

    cdef void _v110(self, dict a, str p, dict rec):
        present = [k for k in V110_FIELDS if k in a]
        if not present:
            if rec["qual"] == Q_D or rec["qual"] == Q_L:
                q = QUALIFIER_NAMES[rec["qual"]]
                self.err("SFC017", f"{p}.DurationSeconds",
                         f"qualifier {q} needs DurationSeconds" + (
                             " (a v1.1.0 field)" if self.minor == 0 else ""))
            return
        if self.minor == 0:
            for k in present:
                self.err("SFC012", f"{p}.{k}",
                         f"{k} is a v1.1.0 field; this recipe declares v1.0.0")
            if rec["qual"] == Q_D or rec["qual"] == Q_L:
                self.err("SFC017", f"{p}.DurationSeconds",
                         f"qualifier {QUALIFIER_NAMES[rec['qual']]} needs DurationSeconds "
                         f"(a v1.1.0 field)")
            return
        inter = rec["inter"]
        hold = a.get("HoldTypeId")
        if hold is not None:
            if not _is_str(hold) or not hold:
                self.err("SFC013", f"{p}.HoldTypeId", "HoldTypeId must be non-empty text")
            elif inter == I_PULL:
                self.err("SFC018", f"{p}.HoldTypeId",
                         "only push_command actions can be held")
            else:
                rec["hold"] = hold
        restart = a.get("RestartTypeId")
        if restart is not None:
            if hold is None:
                self.err("SFC010", f"{p}.RestartTypeId", "RestartTypeId needs HoldTypeId")
            elif not _is_str(restart) or not restart:
                self.err("SFC013", f"{p}.RestartTypeId", "RestartTypeId must be non-empty text")
            else:
                rec["restart"] = restart
        if "HoldTimeoutSeconds" in a:
            if hold is None:
                self.err("SFC010", f"{p}.HoldTimeoutSeconds",
                         "HoldTimeoutSeconds needs HoldTypeId")
            else:
                rec["hold_timeout"] = self._seconds(a, "HoldTimeoutSeconds", p, "SFC005", False)
        elif rec["hold"] is not None:
            rec["hold_timeout"] = rec["timeout"]
        if "Retries" in a:
            r = a.get("Retries")
            if not _is_int(r) or r < 0 or r > 1000:
                self.err("SFC024", f"{p}.Retries", "Retries must be a whole number from 0 to 1000")
            elif inter == I_PULL and r:
                self.err("SFC018", f"{p}.Retries",
                         "Retries re-dispatch a command; a pull_event action has none")
            else:
                rec["retries"] = r
        q = rec["qual"]
        if "DurationSeconds" in a:
            if q != Q_D and q != Q_L:
                self.err("SFC017", f"{p}.DurationSeconds",
                         "only qualifiers D and L take DurationSeconds")
            else:
                d = self._seconds(a, "DurationSeconds", p, "SFC017", True)
                if d is not None:
                    rec["duration"] = d
        elif q == Q_D or q == Q_L:
            self.err("SFC017", f"{p}.DurationSeconds",
                     f"qualifier {QUALIFIER_NAMES[q]} needs DurationSeconds")
        if "Match" in a:
            m = a.get("Match")
            if inter == I_PUSH:
                self.err("SFC018", f"{p}.Match", "Match selects pull events; this is a push_command")
            elif not isinstance(m, dict):
                self.err("SFC013", f"{p}.Match", "Match is an object with Subject and/or "
                                                  "CorrelationId")
            else:
                for k in m:
                    if k not in _MATCH_KEYS:
                        self.err("SFC021", f"{p}.Match.{k}", f"unknown Match field {str(k)[:40]!r}")
                for k, field in (("Subject", "subject"), ("CorrelationId", "corr")):
                    if k not in m:
                        continue
                    v = m[k]
                    if not _is_str(v):
                        self.err("SFC013", f"{p}.Match.{k}", f"Match.{k} must be text")
                        continue
                    bad = [ph for ph in _PLACEHOLDER.findall(v) if ph not in PLACEHOLDERS]
                    if bad:
                        self.err("SFC022", f"{p}.Match.{k}",
                                 f"unknown placeholder {{{bad[0]}}}; use {{job}}, {{scope}} or "
                                 f"{{action}}")
                        continue
                    rec[field] = v


# ---------------------------------------------------------------- blob layout

# int32 tables in blob order, with their length in terms of the counts
# (S, B, P, PS, T, A, C, K, R, RS, CN, NS, SB, initial).
cdef enum:
    HEADER_SIZE = 88

_MAGIC = b"SFCG"


def _i32_lengths(c):
    S, B, P, PS, T, A, C, K, R, RS, CN, NS = c[:12]
    return (S, S, S, S + 1, A,
            S + B + 1, T,
            T, T, T, T, T, T,
            A, A, A, A, A, A, A, A, A, A, A, A,
            B, B, B + 1,
            P, P + 1, PS,
            C + 1, K, R, R, R + 1, RS, CN,
            NS + 1)


def _pack(int minor, tuple counts, list i32, list i64, bytes str_data):
    lengths = _i32_lengths(counts)
    parts = []
    for arr, n in zip(i32, lengths):
        if len(arr) != n:
            raise AssertionError(f"graph table of length {len(arr)}, expected {n}")
        parts.append(array("i", arr).tobytes())
    body32 = b"".join(parts)
    pad = (8 - len(body32) % 8) % 8
    body64 = b"".join(array("q", arr).tobytes() for arr in i64)
    import struct
    tail = struct.pack("<14i", *counts)
    tail += b"\0" * (HEADER_SIZE - 28 - len(tail))
    tail += body32 + b"\0" * pad + body64 + str_data
    # The fingerprint is taken over the canonical encoding itself: every field that
    # decides behaviour, in document order, Parameters as sorted-key JSON. Key order
    # and whitespace of the source do not reach it; the schema version does.
    fp = hashlib.blake2b(tail, digest_size=16,
                         person=b"sfc-recipe-1." + str(minor).encode()).digest()
    head = struct.pack("<4sHHHH16s", _MAGIC, GRAPH_FORMAT_MAJOR, GRAPH_FORMAT_MINOR,
                       minor, 0, fp)
    return head + tail


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
        if self._refs is None:
            out = []
            for r in range(self.n_refs):
                segs = tuple(self.s(self.ref_segs[k])
                             for k in range(self.ref_seg_off[r], self.ref_seg_off[r + 1]))
                out.append((self.ref_kind[r], self.ref_action[r], segs))
            self._refs = out
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

    def action_index(self, str name) -> int:
        """Index of the stored (non-reset) association of an action name."""
        if self._action_index is None:
            d = {}
            for i in range(self.n_actions):
                if self.act_qual[i] != Q_R:
                    d[self.s(self.act_name[i])] = i
            self._action_index = d
        return self._action_index[name]

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
        counts = (self.n_steps, self.n_branches, self.n_paths, self.n_path_steps,
                  self.n_transitions, self.n_actions, self.n_conds, self.n_code, self.n_refs,
                  self.n_ref_segs, self.n_consts, self.n_strings)
        names = ("step_name", "step_flags", "step_path", "step_act_off", "step_acts",
                 "node_out_off", "node_out", "tr_source", "tr_target", "tr_priority", "tr_cond",
                 "tr_kind", "tr_text", "act_name", "act_step", "act_qual", "act_inter",
                 "act_type", "act_params", "act_hold_type", "act_restart_type", "act_retries",
                 "act_match_subject", "act_match_corr", "act_reset", "br_name", "br_type",
                 "br_path_off", "path_branch", "path_off", "path_steps", "cond_off", "code",
                 "ref_kind", "ref_action", "ref_seg_off", "ref_segs", "const_text", "str_off")
        out = {}
        off = HEADER_SIZE
        for name, n in zip(names, _i32_lengths(counts)):
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
    n32 = (4 * S + 1 + A + N + 1 + T + 6 * T + 12 * A + 3 * B + 1 + P + P + 1 + PS
           + C + 1 + K + 3 * R + 1 + RS + CN + NS + 1)
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
    obj = _load(data)
    cdef _Compiler comp = _Compiler(minor)
    try:
        blob = comp.run(obj)
    except RecursionError:
        raise RecipeError([Problem("SFC014", "$", "recipe is nested too deeply")]) from None
    if comp.problems:
        raise RecipeError(comp.problems)
    cdef Graph g = Graph.__new__(Graph)
    _attach(g, blob)
    return g
