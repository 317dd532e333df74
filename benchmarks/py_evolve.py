"""A plain-Python interpretation of the execution rules, the baseline for the core's ratio.

    from py_evolve import load_recipe, py_evolve
    model = load_recipe(recipe_dict)
    applied, state, work, commands, next_deadline = py_evolve(model, None, Start(...), now)

It mirrors ``sfc_fast.evolve`` rule for rule (docs/execution.md; their reasons are
docs/design.md, sections 3 and 12-14: sequence, branches, loops and rounds, the eight
qualifiers, push answers, retries, unsent re-dispatch, pull waits with Match, cancel,
hold and release, equipment hold, shift, resume) and is written the way a
straightforward Python engine would be:

- the recipe is read once into dicts and lists (steps, actions, transitions sorted by
  priority, branches and paths), conditions parsed once into small trees;
- the state document is a JSON object: ``json.loads`` in, mutate the dict, ``json.dumps``
  out, once per call;
- conditions are evaluated by walking their tree on every call.

Nothing here calls into the compiled core except the event classes of
``sfc_fast.events``, so the same event objects drive both implementations.
It assumes a recipe that ``sfc_fast.compile_recipe`` accepts (it does not validate).
``tests/core/test_py_evolve_parity.py`` checks that both agree step by step.

The contract is smaller than the core's Decision: ``(applied, state, work, commands,
next_deadline)``; status and reason are in the state (``status_of``), waits index
changes are not computed. Commands are dicts with the fields of ``sfc_fast.Command``.
"""

from __future__ import annotations

import json
import re
from typing import Any

from sfc_fast.events import (
    Cancel,
    Completed,
    Event,
    Failed,
    Held,
    Hold,
    NotHeld,
    Release,
    Resume,
    Shift,
    Start,
    Tick,
)

#: Step entries one call may make before the recipe is judged to loop without waiting.
MAX_ENTRIES_PER_CALL = 10_000
STATE_VERSION = 1

# phases, outcomes, hold progress (strings: this is a JSON document)
IDLE, DELAYED, OPEN, DONE, WAIT_EXIT = "idle", "delayed", "open", "done", "wait_exit"
HOLD_OPEN, HELD, NOT_HELD = "hold_open", "held", "not_held"
_UNSETTLED = (OPEN, DELAYED, WAIT_EXIT)
_LIVE = (OPEN, DELAYED)
_HOLDING = ("N", "L", "D")
_PULSES = ("P", "P1", "P0")
_NO_TIME = -(1 << 62)       # sorts before every real time (bare-name order)


# ===================================================================== conditions


class ConditionSyntaxError(ValueError):
    pass


_KEYWORDS = frozenset(("and", "or", "not", "in", "true", "false", "null"))
_TOKEN = re.compile(
    r"""\s*(?:
      (?P<num>(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)(?P<bad>[A-Za-z0-9_])?
    | (?P<name>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)
    | (?P<str>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")
    | (?P<op>==|!=|<=|>=|<|>)
    | (?P<punct>[()\[\],-])
    )""",
    re.VERBOSE,
)
_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\", "'": "'", '"': '"'}


def tokenize(text: str) -> list[tuple[str, Any, int]]:
    """(kind, value, position) tuples ending with ("eof", None, len)."""
    out: list[tuple[str, Any, int]] = []
    pos, n = 0, len(text)
    while True:
        while pos < n and text[pos] in " \t\r\n":
            pos += 1
        if pos >= n:
            break
        m = _TOKEN.match(text, pos)
        if m is None:
            raise ConditionSyntaxError(f"unexpected character {text[pos]!r} at {pos}")
        at = m.start(m.lastgroup) if m.lastgroup else pos
        if m.group("num") is not None:
            if m.group("bad") is not None:
                raise ConditionSyntaxError(f"malformed number at {at}")
            lit = m.group("num")
            value: Any = float(lit) if ("." in lit or "e" in lit or "E" in lit) else int(lit)
            out.append(("num", value, at))
        elif m.group("name") is not None:
            word = m.group("name")
            out.append(("kw" if word in _KEYWORDS else "name", word, at))
        elif m.group("str") is not None:
            raw = m.group("str")[1:-1]
            chars: list[str] = []
            i = 0
            while i < len(raw):
                c = raw[i]
                if c == "\\":
                    e = raw[i + 1]
                    if e not in _ESCAPES:
                        raise ConditionSyntaxError(f"unknown escape \\{e} at {at + i}")
                    chars.append(_ESCAPES[e])
                    i += 2
                    continue
                chars.append(c)
                i += 1
            out.append(("str", "".join(chars), at))
        elif m.group("op") is not None:
            out.append(("op", m.group("op"), at))
        else:
            out.append((m.group("punct"), m.group("punct"), at))
        pos = m.end()
    out.append(("eof", None, n))
    return out


class _Parser:
    """Recursive descent into tuples: ("const", v), ("ref", kind, action, segs),
    ("cmp", op, l, r), ("in", l, r), ("not", x), ("and", [..]), ("or", [..]),
    ("list", [..]), ("neg", x)."""

    def __init__(self, text: str, actions: dict[str, Any]) -> None:
        self.toks = tokenize(text)
        self.p = 0
        self.actions = actions

    def peek(self) -> tuple[str, Any, int]:
        return self.toks[self.p]

    def next(self) -> tuple[str, Any, int]:
        t = self.toks[self.p]
        self.p += 1
        return t

    def parse(self) -> tuple:
        node = self.expr()
        t = self.peek()
        if t[0] != "eof":
            raise ConditionSyntaxError(f"unexpected {t[1]!r} at {t[2]}")
        return node

    def expr(self) -> tuple:
        items = [self.and_()]
        while self.peek()[:2] == ("kw", "or"):
            self.next()
            items.append(self.and_())
        return items[0] if len(items) == 1 else ("or", items)

    def and_(self) -> tuple:
        items = [self.not_()]
        while self.peek()[:2] == ("kw", "and"):
            self.next()
            items.append(self.not_())
        return items[0] if len(items) == 1 else ("and", items)

    def not_(self) -> tuple:
        if self.peek()[:2] == ("kw", "not"):
            self.next()
            return ("not", self.not_())
        return self.cmp()

    def cmp(self) -> tuple:
        left = self.unary()
        t = self.peek()
        if t[0] == "op":
            self.next()
            node: tuple = ("cmp", t[1], left, self.unary())
        elif t[:2] == ("kw", "in"):
            self.next()
            node = ("in", left, self.unary())
        elif t[:2] == ("kw", "not") and self.toks[self.p + 1][:2] == ("kw", "in"):
            self.p += 2
            node = ("not", ("in", left, self.unary()))
        else:
            return left
        t = self.peek()
        if t[0] == "op" or t[:2] == ("kw", "in"):
            raise ConditionSyntaxError("comparisons do not chain; use 'and' between them")
        return node

    def unary(self) -> tuple:
        if self.peek()[0] == "-":
            self.next()
            v = self.unary()
            if v[0] == "const":
                if isinstance(v[1], bool) or not isinstance(v[1], (int, float)):
                    raise ConditionSyntaxError("'-' applies to numbers only")
                return ("const", -v[1])
            return ("neg", v)
        return self.primary()

    def primary(self) -> tuple:
        kind, value, at = self.next()
        if kind in ("num", "str"):
            return ("const", value)
        if kind == "kw":
            if value in ("true", "false", "null"):
                return ("const", {"true": True, "false": False, "null": None}[value])
            raise ConditionSyntaxError(f"expected an operand, found {value!r} at {at}")
        if kind == "name":
            return self.ref(value)
        if kind == "(":
            node = self.expr()
            if self.next()[0] != ")":
                raise ConditionSyntaxError("expected ')'")
            return node
        if kind == "[":
            items: list[tuple] = []
            if self.peek()[0] == "]":
                self.next()
                return ("const", [])
            while True:
                items.append(self.expr())
                t = self.next()
                if t[0] == ",":
                    continue
                if t[0] == "]":
                    break
                raise ConditionSyntaxError("expected ',' or ']'")
            if all(i[0] == "const" for i in items):
                return ("const", [i[1] for i in items])
            return ("list", items)
        raise ConditionSyntaxError(f"expected an operand at {at}")

    def ref(self, path: str) -> tuple:
        segs = path.split(".")
        head = segs[0]
        if len(segs) == 1:
            return ("ref", "bare", None, (head,))
        if head == "job":
            return ("ref", "job", None, tuple(segs[1:]))
        if head in self.actions:
            if segs[1] == "_round":
                return ("ref", "round", head, ())
            if segs[1] == "_outcome":
                return ("ref", "outcome", head, ())
            return ("ref", "result", head, tuple(segs[1:]))
        raise ConditionSyntaxError(f"unknown action {head!r} in {path!r}")


def parse_condition(text: str, actions: dict[str, Any]) -> tuple | None:
    """The tree of a condition, or None for a trivially true one."""
    text = text.strip()
    if text in ("", "always", "true"):
        return None
    return _Parser(text, actions).parse()


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _equal(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is b
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if _is_number(a) and _is_number(b):
        return a == b
    if type(a) is not type(b):
        return False
    if type(a) is list:
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _compare(op: str, a: Any, b: Any) -> bool:
    if op == "==":
        return _equal(a, b)
    if op == "!=":
        return not _equal(a, b)
    # ordering: numbers with numbers, text with text; anything else (null) is false
    if not ((_is_number(a) and _is_number(b)) or (type(a) is str and type(b) is str)):
        return False
    if op == "<":
        return a < b
    if op == "<=":
        return a <= b
    if op == ">":
        return a > b
    return a >= b


def _contains(item: Any, container: Any) -> bool:
    if item is None or container is None:
        return False
    if type(container) is list:
        return any(_equal(item, x) for x in container)
    if type(container) is str:
        return type(item) is str and item in container
    if type(container) is dict:
        return type(item) is str and item in container
    return False


def lookup(value: Any, segs: tuple[str, ...]) -> Any:
    for s in segs:
        if type(value) is not dict:
            return None
        value = value.get(s)
    return value


def evaluate(node: tuple, load) -> Any:
    """The value of a condition tree; ``load(ref_node)`` resolves references."""
    op = node[0]
    if op == "const":
        return node[1]
    if op == "ref":
        return load(node)
    if op == "cmp":
        return _compare(node[1], evaluate(node[2], load), evaluate(node[3], load))
    if op == "and":
        return all(bool(evaluate(x, load)) for x in node[1])
    if op == "or":
        return any(bool(evaluate(x, load)) for x in node[1])
    if op == "not":
        return not evaluate(node[1], load)
    if op == "in":
        return _contains(evaluate(node[1], load), evaluate(node[2], load))
    if op == "list":
        return [evaluate(x, load) for x in node[1]]
    if op == "neg":
        v = evaluate(node[1], load)
        return -v if _is_number(v) else None
    raise ValueError(f"bad condition node {op!r}")


# ===================================================================== the recipe


class PyRecipe:
    """The recipe as plain Python structures, built once from its JSON dict."""

    def __init__(self, recipe: dict[str, Any]) -> None:
        if "Steps" not in recipe and isinstance(recipe.get("data"), dict):
            recipe = recipe["data"]
        self.steps: list[str] = [s["Name"] for s in recipe["Steps"]]
        self.step_set = set(self.steps)
        self.initial: str = next(s["Name"] for s in recipe["Steps"] if s.get("Initial"))
        # actions: every association in document order; stored ones (not R) by name
        self.step_actions: dict[str, list[dict[str, Any]]] = {s: [] for s in self.steps}
        self.actions: list[dict[str, Any]] = []
        self.by_name: dict[str, dict[str, Any]] = {}
        for i, a in enumerate(recipe["Actions"]):
            hold = a.get("HoldTypeId")
            match = a.get("Match") or {}
            rec = {
                "index": i,
                "name": a["Name"],
                "step": a["Step"],
                "qual": a["Qualifier"],
                "push": a["Interaction"] == "push_command",
                "type": a["TypeId"],
                "timeout_ms": a["TimeoutSeconds"] * 1000,
                "params": a.get("Parameters"),
                "retries": a.get("Retries", 0),
                "duration_ms": round(a.get("DurationSeconds", 0) * 1000),
                "hold_type": hold,
                "restart_type": a.get("RestartTypeId"),
                "hold_timeout_ms": (a.get("HoldTimeoutSeconds", a["TimeoutSeconds"]) * 1000
                                    if hold else 0),
                "subject": match.get("Subject"),
                "corr": match.get("CorrelationId"),
            }
            self.step_actions[rec["step"]].append(rec)
            if rec["qual"] != "R":
                self.actions.append(rec)
                self.by_name[rec["name"]] = rec
        # branches and paths
        self.branches: dict[str, dict[str, Any]] = {}
        self.step_path: dict[str, tuple[str, int]] = {}
        for b in recipe.get("Branches", ()):
            paths = [list(p) for p in b["Branches"]]
            self.branches[b["Name"]] = {"type": b["Type"], "paths": paths}
            for pi, path in enumerate(b["Branches"]):
                for st in path:
                    self.step_path[st] = (b["Name"], pi)
        # transitions, classified, then sorted per source by priority and document order
        trans: list[dict[str, Any]] = []
        has_out: set[str] = set()
        entry_paths: dict[str, set[int]] = {b: set() for b in self.branches}
        for t in recipe["Transitions"]:
            src, dst = t["Source"], t["Target"]
            kind = self._kind(src, dst)
            if kind == "entry":
                entry_paths[src].add(self.step_path[dst][1])
            has_out.add(src)
            trans.append({"source": src, "target": dst, "kind": kind,
                          "priority": t.get("Priority", 0),
                          "cond": parse_condition(t["Condition"], self.by_name)})
        for bname, br in self.branches.items():
            for pi, path in enumerate(br["paths"]):
                for k in range(len(path) - 1):
                    if path[k] not in has_out:
                        trans.append({"source": path[k], "target": path[k + 1],
                                      "kind": "implicit", "priority": 0, "cond": None})
                if br["type"] == "selection" and pi not in entry_paths[bname]:
                    trans.append({"source": bname, "target": path[0], "kind": "implicit",
                                  "priority": 2_000_000, "cond": None})
        self.out: dict[str, list[dict[str, Any]]] = {}
        for _, t in sorted(enumerate(trans), key=lambda it: (it[1]["priority"], it[0])):
            self.out.setdefault(t["source"], []).append(t)

    def _kind(self, src: str, dst: str) -> str:
        if src in self.step_set:
            sp = self.step_path.get(src)
            if sp is not None:
                if dst in self.step_set and self.step_path.get(dst) == sp:
                    return "path"
                return "path_end"           # to its own branch (the compiler checks)
            return "step"
        dp = self.step_path.get(dst) if dst in self.step_set else None
        if dp is not None and dp[0] == src and self.branches[src]["paths"][dp[1]][0] == dst:
            return "entry"
        return "exit"


def load_recipe(recipe: dict[str, Any]) -> PyRecipe:
    """Read a recipe (its ``data`` dict, or the document with ``dataschema``/``data``)."""
    return PyRecipe(recipe)


# ===================================================================== one call


class _Loop(Exception):
    pass


_NONE_TRUE = "none-true"      # choose(): transitions of the kind exist, none is true
_NO_KIND = "no-kind"          # choose(): no transition of the kind
_ENTRY_KINDS = frozenset(("entry", "implicit"))
_EXIT_KINDS = frozenset(("exit",))


def _new_act() -> dict[str, Any]:
    return {"phase": IDLE, "hold": None, "outcome": None, "restart": False,
            "abort_pending": False, "attempt": 0, "round": 0, "cmd_n": 0, "hold_n": 0,
            "deadline": None, "hold_deadline": None, "timer": None, "since": None,
            "done_at": None, "result": None}


class _Run:
    def __init__(self, m: PyRecipe, s: dict[str, Any], now: int) -> None:
        self.m = m
        self.s = s
        self.acts: dict[str, dict[str, Any]] = s["acts"]
        self.now = now
        self.work: list[tuple[str, str, str]] = []
        self.commands: list[dict[str, Any]] = []
        self.changed = False
        self.entries = 0

    # ---- effects

    def emit(self, a: dict[str, Any], n: int, hold: bool, restart: bool,
             deadline: int | None) -> None:
        name = a["name"]
        cid = f"{self.s['job']}:{name}#{n}"
        if hold:
            cid += ":hold"
            type_id = a["hold_type"]
        elif restart:
            type_id = a["restart_type"]
        else:
            type_id = a["type"]
        self.commands.append({
            "command_id": cid, "action": name, "type_id": type_id,
            "parameters": a["params"], "deadline_ms": deadline, "hold": hold,
            "restart": restart, "job": self.s["job"], "scope": self.s["scope"],
            "attempt": self.acts[name]["attempt"],
        })
        self.work.append(("dispatch:" + name, name, cid))

    def job(self, transition: str) -> None:
        self.work.append(("job", transition, ""))

    def rec(self, a: dict[str, Any]) -> dict[str, Any]:
        x = self.acts.get(a["name"])
        if x is None:
            x = self.acts[a["name"]] = _new_act()
        return x

    # ---- arming and settling

    def arm(self, a: dict[str, Any]) -> None:
        now = self.now
        s = self.s
        x = self.rec(a)
        x["round"] = s["rounds"].get(a["step"], 0)
        x["attempt"] = 1
        x["outcome"] = None
        x["hold"] = None
        x["hold_n"] = 0
        x["hold_deadline"] = None
        x["restart"] = False
        x["abort_pending"] = False
        x["since"] = now
        x["timer"] = None
        x["phase"] = OPEN
        x["deadline"] = now + a["timeout_ms"]
        if a["qual"] == "L":
            x["timer"] = now + a["duration_ms"]
        if a["push"]:
            s["counter"] += 1
            x["cmd_n"] = s["counter"]
            self.emit(a, x["cmd_n"], False, False, x["deadline"])
        else:
            x["cmd_n"] = 0
        self.changed = True

    def redispatch(self, a: dict[str, Any], new_attempt: bool) -> None:
        x = self.acts[a["name"]]
        restart = x["restart"]
        if new_attempt:
            x["attempt"] += 1
            self.s["counter"] += 1
            x["cmd_n"] = self.s["counter"]
            x["restart"] = False
            restart = False
        x["deadline"] = self.now + a["timeout_ms"]
        x["since"] = self.now
        self.emit(a, x["cmd_n"], False, restart, x["deadline"])
        self.changed = True

    def restart(self, a: dict[str, Any]) -> None:
        x = self.acts[a["name"]]
        self.s["counter"] += 1
        x["cmd_n"] = self.s["counter"]
        x["restart"] = True
        x["hold"] = None
        x["hold_n"] = 0
        x["hold_deadline"] = None
        x["deadline"] = self.now + a["timeout_ms"]
        x["since"] = self.now
        if a["restart_type"] is not None:
            self.emit(a, x["cmd_n"], False, True, x["deadline"])
        else:
            x["restart"] = False
            self.emit(a, x["cmd_n"], False, False, x["deadline"])
        self.changed = True

    def settle(self, name: str, outcome: str) -> None:
        x = self.acts[name]
        x["phase"] = DONE
        x["outcome"] = outcome
        x["deadline"] = None
        x["timer"] = None
        x["hold"] = None
        x["hold_deadline"] = None
        x["restart"] = False
        x["done_at"] = self.now
        self.changed = True

    def withdraw_all(self, only_pulses: bool) -> None:
        for a in self.m.actions:
            x = self.acts.get(a["name"])
            if x is None or x["phase"] not in _UNSETTLED:
                continue
            if only_pulses and a["qual"] not in _PULSES:
                continue
            self.settle(a["name"], "cancelled")

    def abort(self, reason: str) -> None:
        s = self.s
        self.withdraw_all(False)
        s["status"] = "aborted"
        s["reason"] = reason
        s["active"] = []
        s["held"] = False
        s["ending"] = False
        s["held_at"] = None
        self.job("Abort")
        self.changed = True

    # ---- steps, branches, transitions

    def enter_step(self, st: str) -> None:
        s = self.s
        self.entries += 1
        if self.entries > MAX_ENTRIES_PER_CALL:
            raise _Loop(st)
        s["rounds"][st] = s["rounds"].get(st, 0) + 1
        if st not in s["active"]:
            s["active"].append(st)
        self.changed = True
        for a in self.m.step_actions[st]:
            q = a["qual"]
            if q == "R":
                x = self.acts.get(a["name"])
                if x is not None and x["phase"] in _LIVE:
                    self.settle(a["name"], "cancelled")
            elif q == "P0":
                x = self.rec(a)
                x["phase"] = WAIT_EXIT
                x["round"] = s["rounds"][st]
            elif q == "D":
                x = self.rec(a)
                x["phase"] = DELAYED
                x["outcome"] = None
                x["round"] = s["rounds"][st]
                x["timer"] = self.now + a["duration_ms"]
                x["deadline"] = None
                x["since"] = self.now
            else:
                self.arm(a)

    def exit_step(self, st: str) -> None:
        active = self.s["active"]
        if st in active:
            # swap-remove, as the core's active array does (the order decides who leaves
            # first and so the numbering of command ids)
            i = active.index(st)
            last = active.pop()
            if i < len(active):
                active[i] = last
        self.s["last_exit"] = st
        for a in self.m.step_actions[st]:
            if a["qual"] == "P0" and self.acts[a["name"]]["phase"] == WAIT_EXIT:
                self.arm(a)
        self.changed = True

    def step_done(self, st: str) -> bool:
        for a in self.m.step_actions[st]:
            if a["qual"] in _HOLDING:
                x = self.acts.get(a["name"])
                if x is None or x["phase"] != DONE:
                    return False
        return True

    def choose(self, node: str, src_step: str | None, kinds: frozenset[str] | None):
        any_kind = False
        for t in self.m.out.get(node, ()):
            if kinds is not None and t["kind"] not in kinds:
                continue
            any_kind = True
            if t["cond"] is None:
                return t
            if evaluate(t["cond"], self.loader(src_step)):
                return t
        return _NONE_TRUE if any_kind else _NO_KIND

    def loader(self, src_step: str | None):
        s, acts, m = self.s, self.acts, self.m
        bare: list[dict[str, Any]] | None = None

        def load(node: tuple) -> Any:
            nonlocal bare
            _, kind, action, segs = node
            if kind == "result":
                x = acts.get(action)
                return lookup(x["result"] if x is not None else None, segs)
            if kind == "round":
                return s["rounds"].get(m.by_name[action]["step"], 0)
            if kind == "outcome":
                x = acts.get(action)
                if x is None:
                    return None
                return "open" if x["phase"] in _UNSETTLED else x["outcome"]
            if kind == "job":
                return lookup(s["params"], segs)
            # bare name: the source step's results, newest first, then job parameters
            if bare is None:
                bare = self.bare_results(src_step)
            head = segs[0]
            for res in bare:
                if type(res) is dict and head in res:
                    return lookup(res, segs)
            return lookup(s["params"], segs)

        return load

    def bare_results(self, src_step: str | None) -> list[Any]:
        if src_step is None:
            return []
        items = []
        for a in self.m.step_actions[src_step]:
            x = self.acts.get(a["name"])
            if x is not None and x["result"] is not None:
                done = x["done_at"] if x["done_at"] is not None else _NO_TIME
                items.append((done, self.m.by_name[a["name"]]["index"], x["result"]))
        items.sort(key=lambda it: (it[0], it[1]), reverse=True)
        return [it[2] for it in items]

    def leave(self, st: str) -> None:
        t = self.choose(st, st, None)
        if t is _NONE_TRUE:
            self.abort(f"no transition out of step {st!r} is true")
            return
        self.exit_step(st)
        if t is _NO_KIND:
            p = self.m.step_path.get(st)
            if p is not None:
                self.path_ended(p)
            else:
                self.recipe_end()
            return
        self.take(t)

    def take(self, t: dict[str, Any]) -> None:
        if t["kind"] == "path_end":
            self.path_ended(self.m.step_path[t["source"]])
        elif t["target"] in self.m.step_set:
            self.enter_step(t["target"])
        else:
            self.enter_branch(t["target"])

    def enter_branch(self, b: str) -> None:
        br = self.m.branches[b]
        self.s["branches"][b] = 0
        self.changed = True
        if br["type"] == "simultaneous":
            for path in br["paths"]:
                self.enter_step(path[0])
            return
        t = self.choose(b, self.s["last_exit"], _ENTRY_KINDS)
        if not isinstance(t, dict):
            del self.s["branches"][b]
            self.abort(f"no entry of selection branch {b!r} is true")
            return
        self.enter_step(t["target"])

    def path_ended(self, p: tuple[str, int]) -> None:
        b = p[0]
        br = self.m.branches[b]
        ended = self.s["branches"]
        if br["type"] == "simultaneous":
            ended[b] = ended.get(b, -1) + 1
            if ended[b] < len(br["paths"]):
                return
        ended.pop(b, None)
        self.changed = True
        t = self.choose(b, self.s["last_exit"], _EXIT_KINDS)
        if t is _NO_KIND:
            self.recipe_end()
        elif t is _NONE_TRUE:
            self.abort(f"no exit transition of branch {b!r} is true")
        else:
            self.take(t)

    def recipe_end(self) -> None:
        self.s["ending"] = True
        self.changed = True
        self.check_end()

    def check_end(self) -> None:
        s = self.s
        if not s["ending"] or s["status"] != "running" or s["held"]:
            return
        for a in self.m.actions:
            if a["qual"] == "S":
                x = self.acts.get(a["name"])
                if x is not None and x["phase"] in _LIVE:
                    return
        self.withdraw_all(True)
        s["status"] = "completed"
        s["ending"] = False
        s["active"] = []
        self.job("Complete")
        self.changed = True

    def advance(self) -> None:
        s = self.s
        if s["status"] != "running" or s["held"]:
            return
        for a in self.m.actions:        # a failure recorded while held is routed now
            x = self.acts.get(a["name"])
            if x is not None and x["abort_pending"]:
                x["abort_pending"] = False
                self.abort(s["reason"] or f"action {a['name']!r} failed while held")
                return
        while s["status"] == "running":
            for st in s["active"]:
                if self.step_done(st):
                    self.leave(st)
                    break
            else:
                break
        self.check_end()

    # ---- answers

    def parse(self, cid: str) -> tuple[dict[str, Any], int, bool] | None:
        job = self.s["job"]
        lj = len(job)
        if not cid.startswith(job) or len(cid) <= lj + 2 or cid[lj] != ":":
            return None
        rest = cid[lj + 1:]
        is_hold = rest.endswith(":hold")
        if is_hold:
            rest = rest[:-5]
        pos = rest.rfind("#")
        if pos <= 0:
            return None
        num = rest[pos + 1:]
        if not num.isdigit() or len(num) > 15 or not num.isascii():
            return None
        a = self.m.by_name.get(rest[:pos])
        if a is None or not a["push"]:
            return None
        return a, int(num), is_hold

    def on_completed(self, ev: Completed) -> None:
        p = self.parse(ev.command_id)
        if p is None:
            return
        a, n, is_hold = p
        if is_hold:
            self.on_held_n(a, n, True)      # a hold answered "completed": it holds
            return
        x = self.acts.get(a["name"])
        if x is None or x["phase"] != OPEN or x["cmd_n"] != n:
            return                          # late or duplicate: absorbed
        self.settle(a["name"], "completed")
        x["result"] = ev.result             # the latest answer replaces the result
        self.advance()

    def on_failed(self, ev: Failed) -> None:
        p = self.parse(ev.command_id)
        if p is None:
            return
        a, n, is_hold = p
        if is_hold:
            self.on_not_held_n(a, n)
            return
        x = self.acts.get(a["name"])
        if x is None or x["phase"] != OPEN or x["cmd_n"] != n:
            return
        reason = f"action {a['name']!r} failed" + (f": {ev.reason}" if ev.reason else "")
        self.settle(a["name"], "failed")
        if self.s["held"]:
            x["abort_pending"] = True       # recorded now, routed on release
            self.s["reason"] = reason
            return
        self.abort(reason)

    def on_held_n(self, a: dict[str, Any], n: int, is_hold: bool) -> None:
        x = self.acts.get(a["name"])
        if x is None or x["phase"] != OPEN:
            return
        if is_hold:
            if x["hold_n"] != n:
                return
        elif x["cmd_n"] != n or x["hold_n"] == 0:
            return
        if x["hold"] not in (HOLD_OPEN, NOT_HELD):
            return
        x["hold"] = HELD                    # a late "held" still counts
        x["hold_deadline"] = None
        x["deadline"] = None
        self.changed = True
        if not self.s["held"]:
            self.restart(a)                 # the release came before the answer

    def on_not_held_n(self, a: dict[str, Any], n: int) -> None:
        x = self.acts.get(a["name"])
        if x is None or x["phase"] != OPEN or x["hold_n"] != n or x["hold"] != HOLD_OPEN:
            return
        x["hold"] = NOT_HELD
        x["hold_deadline"] = None
        self.changed = True
        if not self.s["held"]:
            self.redispatch(a, False)

    def on_hold_answer(self, cid: str, held: bool) -> None:
        p = self.parse(cid)
        if p is None:
            return
        a, n, is_hold = p
        if held:
            self.on_held_n(a, n, is_hold)
            return
        if not is_hold:
            x = self.acts.get(a["name"])
            if x is None or x["cmd_n"] != n:
                return
            n = x["hold_n"]
        self.on_not_held_n(a, n)

    def on_event(self, ev: Event) -> None:
        best = None
        best_since = 0
        for a in self.m.actions:
            if a["push"]:
                continue
            x = self.acts.get(a["name"])
            if x is None or x["phase"] != OPEN or a["type"] != ev.type_id:
                continue
            if not self.matches(a, a["subject"], ev.subject):
                continue
            if not self.matches(a, a["corr"], ev.correlation_id):
                continue
            if best is None or x["since"] < best_since:
                best = a
                best_since = x["since"]
        if best is None:
            return
        self.settle(best["name"], "completed")
        self.acts[best["name"]]["result"] = ev.data
        self.advance()

    def matches(self, a: dict[str, Any], tpl: str | None, value: str | None) -> bool:
        if tpl is None:
            return True
        if value is None:
            return False
        if "{" in tpl:
            tpl = (tpl.replace("{job}", self.s["job"]).replace("{scope}", self.s["scope"])
                   .replace("{action}", a["name"]))
        return tpl == value

    # ---- time

    def on_tick(self, ev: Tick) -> None:
        now = self.now
        s = self.s
        if s["held"]:
            # while held only hold commands expire
            for x in self.acts.values():
                if x["phase"] == OPEN and x["hold"] == HOLD_OPEN \
                        and x["hold_deadline"] is not None and x["hold_deadline"] <= now:
                    x["hold"] = NOT_HELD
                    x["hold_deadline"] = None
                    self.changed = True
            return
        for a in self.m.actions:
            if s["status"] != "running":
                break
            name = a["name"]
            x = self.acts.get(name)
            if x is None:
                continue
            if x["phase"] == DELAYED:
                if x["timer"] is not None and x["timer"] <= now:
                    self.arm(a)
                continue
            if x["phase"] != OPEN:
                continue
            if x["hold"] == HOLD_OPEN and x["hold_deadline"] is not None \
                    and x["hold_deadline"] <= now:
                x["hold"] = NOT_HELD        # the hold was never answered: issue again
                x["hold_deadline"] = None
                self.redispatch(a, False)
                continue
            if a["qual"] == "L" and x["timer"] is not None and x["timer"] <= now:
                self.settle(name, "limited")
                continue
            if x["deadline"] is None or x["deadline"] > now:
                continue
            if not a["push"]:
                self.settle(name, "timeout")
                self.abort(f"action {name!r} timed out waiting for {a['type']} after "
                           f"{a['timeout_ms'] / 1000:g} s")
                break
            if ev.unsent and f"{s['job']}:{name}#{x['cmd_n']}" in ev.unsent:
                self.redispatch(a, False)   # it never went out: no retry spent
            elif x["attempt"] <= a["retries"]:
                self.redispatch(a, True)
            else:
                self.settle(name, "timeout")
                self.abort(f"action {name!r} timed out after {a['timeout_ms'] / 1000:g} s "
                           f"(attempt {x['attempt']})")
                break
        self.advance()

    def shift(self, gap: int, holds_too: bool) -> None:
        for x in self.acts.values():
            if x["phase"] not in _LIVE:
                continue
            if x["deadline"] is not None:
                x["deadline"] += gap
                self.changed = True
            if x["timer"] is not None:
                x["timer"] += gap
                self.changed = True
            if holds_too and x["hold_deadline"] is not None:
                x["hold_deadline"] += gap
                self.changed = True

    def on_hold(self) -> None:
        s = self.s
        if s["held"]:
            return
        s["held"] = True
        s["held_at"] = self.now
        self.changed = True
        for a in self.m.actions:
            x = self.acts.get(a["name"])
            if x is None or x["phase"] != OPEN or not a["push"] or a["hold_type"] is None:
                continue
            if x["hold"] == HELD:
                continue
            x["hold"] = HOLD_OPEN
            x["hold_n"] = x["cmd_n"]
            x["hold_deadline"] = self.now + (a["hold_timeout_ms"] or a["timeout_ms"])
            self.emit(a, x["cmd_n"], True, False, x["hold_deadline"])

    def on_release(self) -> None:
        s = self.s
        if not s["held"]:
            return
        gap = max(self.now - s["held_at"], 0)
        s["held"] = False
        s["held_at"] = None
        self.changed = True
        self.shift(gap, False)
        for a in self.m.actions:
            x = self.acts.get(a["name"])
            if x is None or x["phase"] != OPEN or not a["push"]:
                continue
            if x["hold"] == HELD:
                self.restart(a)
            elif x["hold"] == HOLD_OPEN:
                pass                        # the answer to the hold decides
            else:
                x["hold"] = None
                if x["deadline"] is None:
                    x["deadline"] = self.now + a["timeout_ms"]
                self.emit(a, x["cmd_n"], False, x["restart"], x["deadline"])
        self.advance()

    def on_resume(self) -> None:
        if self.s["held"]:
            return
        for a in self.m.actions:
            x = self.acts.get(a["name"])
            if x is None or x["phase"] != OPEN or not a["push"]:
                continue
            if x["hold"] == HELD:
                self.restart(a)
            elif x["deadline"] is None:
                self.redispatch(a, False)
            elif x["restart"]:
                self.emit(a, x["cmd_n"], False, True, x["deadline"])
        self.advance()

    def on_cancel(self, ev: Cancel) -> None:
        s = self.s
        self.withdraw_all(False)
        s["status"] = "stopped" if ev.stop else "aborted"
        s["reason"] = ev.reason or ("stopped" if ev.stop else "aborted")
        s["active"] = []
        s["held"] = False
        s["ending"] = False
        s["held_at"] = None
        self.changed = True

    def on_shift(self, ev: Shift) -> None:
        if ev.gap_ms > 0:
            self.shift(ev.gap_ms, True)
            if self.s["held_at"] is not None:
                # the outage is not part of the hold: release moves by the hold alone
                self.s["held_at"] += ev.gap_ms
                self.changed = True


# ===================================================================== the API


def next_deadline(s: dict[str, Any]) -> int | None:
    """Earliest open deadline; while held, the earliest hold deadline."""
    if s["status"] != "running":
        return None
    best = None
    held = s["held"]
    for x in s["acts"].values():
        if x["phase"] not in _LIVE:
            continue
        t = x["hold_deadline"]
        if t is not None and (best is None or t < best):
            best = t
        if held:
            continue
        for t in (x["deadline"], x["timer"]):
            if t is not None and (best is None or t < best):
                best = t
    return best


def new_state(ev: Start, now: int) -> dict[str, Any]:
    return {"v": STATE_VERSION, "job": ev.job, "scope": ev.scope, "order": ev.order,
            "params": ev.params or {}, "status": "running", "reason": "", "held": False,
            "ending": False, "held_at": None, "started": now, "counter": 0,
            "last_exit": None, "active": [], "rounds": {}, "branches": {}, "acts": {}}


def decode(state: bytes | str) -> dict[str, Any]:
    s = json.loads(state)
    if type(s) is not dict or s.get("v") != STATE_VERSION:
        raise ValueError("not a state document of this version")
    return s


def status_of(state: bytes | str | None) -> tuple[str, str | None]:
    """(status, reason) of a state document; status ``held`` for a held running job."""
    if state is None:
        return "none", None
    s = decode(state)
    status = "held" if s["status"] == "running" and s["held"] else s["status"]
    return status, s["reason"] or None


def _absorbed(s: dict[str, Any] | None, before: Any) -> tuple:
    return False, before, [], [], (next_deadline(s) if s is not None else None)


_HANDLERS = {
    Completed: _Run.on_completed,
    Failed: _Run.on_failed,
    Held: lambda r, ev: r.on_hold_answer(ev.command_id, True),
    NotHeld: lambda r, ev: r.on_hold_answer(ev.command_id, False),
    Event: _Run.on_event,
    Tick: _Run.on_tick,
    Cancel: _Run.on_cancel,
    Hold: lambda r, ev: r.on_hold(),
    Release: lambda r, ev: r.on_release(),
    Resume: lambda r, ev: r.on_resume(),
    Shift: _Run.on_shift,
}


def py_evolve(m: PyRecipe, state: bytes | str | None, event: Any, now_ms: int) -> tuple:
    """Apply ``event`` to a job's JSON ``state`` at ``now_ms``.

    Returns ``(applied, state, work, commands, next_deadline)``; applied False means
    absorbed (the state returned is the one given; nothing to write).
    """
    s = decode(state) if state is not None else None
    if type(event) is Start:
        if s is not None:
            if s["status"] == "running":
                return _absorbed(s, state)          # already running: a repeat
            if event.order and event.order == s["order"]:
                return _absorbed(s, state)          # same order, already ended
        s = new_state(event, now_ms)
        r = _Run(m, s, now_ms)
        try:
            r.job("Run")
            r.enter_step(m.initial)
            r.advance()
        except _Loop as e:
            _loop_abort(r, e)
        return _decided(r, state)
    if s is None:
        return _absorbed(None, None)
    if s["status"] != "running":
        return _absorbed(s, state)                  # a terminal job stays terminal
    r = _Run(m, s, now_ms)
    try:
        _HANDLERS[type(event)](r, event)
    except _Loop as e:
        _loop_abort(r, e)
    return _decided(r, state)


def _loop_abort(r: _Run, e: _Loop) -> None:
    r.work = []
    r.commands = []
    r.abort(f"the recipe loops without waiting (more than {MAX_ENTRIES_PER_CALL} step "
            f"entries in one step, last at {e.args[0]!r})")


def _decided(r: _Run, before: Any) -> tuple:
    if not r.changed and not r.work:
        return _absorbed(r.s, before)
    return True, json.dumps(r.s).encode("utf-8"), r.work, r.commands, next_deadline(r.s)
