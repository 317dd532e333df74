"""Made ``states_v1.json``: job states written by the build of format 1.0, with the next
event of each run and what that build decided for it (test_state_formats.py reads it).

Kept for the record: it was run once, before format 2; a later build writes format 2.

    python tests/data/make_states_v1.py > tests/data/states_v1.json
"""

from __future__ import annotations

import base64
import json
import random
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from helpers.recipes import V110, generated, linear, pull, push  # noqa: E402

from sfc_fast import compile_recipe, evolve, state_to_json  # noqa: E402
from sfc_fast.events import (  # noqa: E402
    Completed,
    Event,
    Failed,
    Hold,
    Release,
    Resume,
    Shift,
    Start,
    Tick,
)

EXAMPLES = HERE.parents[1] / "src" / "sfc_host" / "examples"
RESULTS = [None, {"torque": 70}, {"torque": 85}, {"ok": True}, {"ok": True, "n": 2},
           {"torque_ok": True}, {"torque": 85, "nested": {"v": [1, "a"]}}]


def chain(n: int) -> dict[str, Any]:
    """The report's chain: a condition on the previous action's result everywhere."""
    steps = [{"Name": f"S{i}", "Initial": i == 0} for i in range(n)]
    trans = [{"Source": f"S{i}", "Target": f"S{i + 1}", "Condition": f"a{i}.ok != false"}
             for i in range(n - 1)]
    acts = [push(f"a{i}", f"S{i}") for i in range(n)]
    return {"Steps": steps, "Transitions": trans, "Actions": acts}


def loop_with_stored() -> dict[str, Any]:
    """A loop, a stored action across steps, delayed and limited actions, a pull wait."""
    steps = [{"Name": n, "Initial": n == "A"} for n in ("A", "B", "C")]
    acts = [push("s", "A", "S"), push("a", "A"), push("b", "B", "L", DurationSeconds=5),
            push("d", "B", "D", DurationSeconds=2), pull("w", "C"), push("c", "C"),
            push("s", "C", "R")]
    trans = [{"Source": "A", "Target": "B", "Condition": "a.ok != false"},
             {"Source": "B", "Target": "C", "Condition": "always"},
             {"Source": "C", "Target": "A", "Condition": "c._round < 2", "Priority": 1},
             {"Source": "C", "Target": "A", "Condition": "false", "Priority": 2}]
    return {"Steps": steps, "Transitions": trans, "Actions": acts}


def recipes() -> list[tuple[str, dict[str, Any], str]]:
    out = []
    for name in ("axle_fit_qa", "paint_hold_restart", "tighten_rework"):
        doc = json.loads((EXAMPLES / f"{name}.json").read_text())
        out.append((name, doc["data"], doc["dataschema"]))
    out += [("linear5", linear(5), V110), ("generated40", generated(40), V110),
            ("chain30", chain(30), V110), ("loop_with_stored", loop_with_stored(), V110)]
    return out


def next_event(rng: random.Random, graph: Any, state: bytes, types: dict[str, str]) -> Any:
    view = state_to_json(graph, state)
    acts = view["actions"]
    open_ids = [a["command_id"] for a in acts.values()
                if a["phase"] == "open" and a["command_id"]]
    pulls = [n for n, a in acts.items() if a["phase"] == "open" and not a["command_id"]]
    r = rng.random()
    if r < 0.04:
        return Hold() if view["status"] != "held" else Release()
    if view["status"] == "held":
        return Release() if r < 0.5 else Tick()
    if r < 0.05 and open_ids:
        return Failed(rng.choice(open_ids), "jammed")
    if r < 0.10:
        return rng.choice([Tick(), Resume(), Shift(1500)])
    if pulls and (r < 0.4 or not open_ids):
        return Event(types[rng.choice(pulls)], data=rng.choice(RESULTS))
    if open_ids:
        return Completed(rng.choice(open_ids), rng.choice(RESULTS))
    return Tick()


def describe(ev: Any) -> list[Any]:
    name = type(ev).__name__
    if name == "Completed":
        return [name, ev.command_id, ev.result]
    if name == "Failed":
        return [name, ev.command_id, ev.reason]
    if name == "Event":
        return [name, ev.type_id, ev.data]
    if name == "Shift":
        return [name, ev.gap_ms]
    if name == "Cancel":
        return [name, ev.reason, ev.stop]
    return [name]


def b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


def main() -> None:
    out = []
    graphs = {}
    for name, recipe, schema in recipes():
        graph = compile_recipe(recipe, schema)
        graphs[name] = b64(graph.to_bytes())
        types = {a["Name"]: a.get("TypeId", "") for a in recipe["Actions"]}
        for seed in range(3):
            rng = random.Random(f"{name}/{seed}")
            now = 1_000_000
            d = evolve(graph, None, Start("J-1", "scope-a", {"mode": "run", "n": seed},
                                          "order-7"), now)
            state = d.state
            for i in range(90):
                now += rng.choice([10, 500, 3_000, 20_000])
                ev = next_event(rng, graph, state, types)
                d = evolve(graph, state, ev, now)
                kept = sum(1 for c in out if c["recipe"] == name)
                if kept < 30 and (i % 3 == 0 or d.status != "running"):
                    out.append({
                        "recipe": name,
                        "state": b64(state), "view": state_to_json(graph, state),
                        "now": now, "event": describe(ev), "applied": d.applied,
                        "status": d.status, "reason": d.reason, "work": d.work,
                        "commands": [c.to_dict() for c in d.commands],
                        "next_deadline": d.next_deadline,
                        "waits": [list(d.waits_added), list(d.waits_removed)],
                        "after": state_to_json(graph, d.state) if d.state else None,
                    })
                if d.applied:
                    state = d.state
                if d.status not in ("running", "held"):
                    break
    json.dump({"format": "1.0", "graphs": graphs, "cases": out}, sys.stdout, sort_keys=True,
              separators=(",", ":"))
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
