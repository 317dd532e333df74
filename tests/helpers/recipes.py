"""Recipe builders for tests and benchmarks."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from helpers.paths import DATA, ROOT

REFERENCE_RECIPES = DATA / "recipes"
PACKAGED_RECIPES = ROOT / "src" / "sfc_host" / "examples"


def reference_recipes_dir() -> Path:
    """The reference recipes (tests/data/recipes; the package ships them too)."""
    return REFERENCE_RECIPES


def load_reference(name: str) -> dict:
    return json.loads((reference_recipes_dir() / name).read_text())

V100 = "https://aschamberger.github.io/schemas/microdcs/sfc-recipe/v1.0.0/"
V110 = "https://aschamberger.github.io/schemas/microdcs/sfc-recipe/v1.1.0/"


def push(name: str, step: str, qualifier: str = "N", timeout: int = 10,
         **extra: Any) -> dict[str, Any]:
    a = {"Name": name, "Step": step, "Qualifier": qualifier, "Interaction": "push_command",
         "TypeId": f"com.example.{name}.v1", "TimeoutSeconds": timeout}
    a.update(extra)
    return a


def pull(name: str, step: str, qualifier: str = "N", timeout: int = 10,
         **extra: Any) -> dict[str, Any]:
    a = push(name, step, qualifier, timeout, **extra)
    a["Interaction"] = "pull_event"
    return a


def linear(n: int = 3) -> dict[str, Any]:
    """Steps S0..S{n-1} in sequence, one push action each."""
    steps = [{"Name": f"S{i}", "Initial": i == 0} for i in range(n)]
    trans = [{"Source": f"S{i}", "Target": f"S{i + 1}", "Condition": "always"}
             for i in range(n - 1)]
    acts = [push(f"a{i}", f"S{i}") for i in range(n)]
    return {"Steps": steps, "Transitions": trans, "Actions": acts}


def chain(n: int, timeout: int = 3600) -> dict[str, Any]:
    """``n`` steps in sequence, one push action each (with parameters), a condition on
    the previous action's result on every transition."""
    steps = [{"Name": f"S{i}", "Initial": i == 0} for i in range(n)]
    trans = [{"Source": f"S{i}", "Target": f"S{i + 1}", "Condition": f"a{i}.ok != false"}
             for i in range(n - 1)]
    acts = [push(f"a{i}", f"S{i}", timeout=timeout, Parameters={"program": i, "speed": 1.5})
            for i in range(n)]
    return {"Steps": steps, "Transitions": trans, "Actions": acts}


def with_(recipe: dict[str, Any], **changes: Any) -> dict[str, Any]:
    r = copy.deepcopy(recipe)
    r.update(changes)
    return r


def generated(n_steps: int, branch_every: int = 10) -> dict[str, Any]:
    """A large recipe: a sequence with a selection or simultaneous branch every
    ``branch_every`` steps and a condition on every transition."""
    steps: list[dict[str, Any]] = []
    trans: list[dict[str, Any]] = []
    acts: list[dict[str, Any]] = []
    branches: list[dict[str, Any]] = []
    prev = None
    i = 0
    while i < n_steps:
        if i % branch_every == branch_every - 1 and i + 2 < n_steps:
            # a branch of two one-step paths
            bname = f"B{i}"
            kind = "selection" if (i // branch_every) % 2 else "simultaneous"
            a, b = f"S{i}", f"S{i + 1}"
            steps += [{"Name": a}, {"Name": b}]
            acts += [push(f"a{i}", a), pull(f"e{i + 1}", b)]
            branches.append({"Name": bname, "Type": kind, "Branches": [[a], [b]]})
            if kind == "selection":
                trans.append({"Source": bname, "Target": a,
                              "Condition": f"a{i - 1}.ok == true and job.mode != 'skip'"})
            trans.append({"Source": prev, "Target": bname, "Condition": "always"})
            prev = bname
            i += 2
            continue
        name = f"S{i}"
        steps.append({"Name": name, "Initial": i == 0})
        acts.append(push(f"a{i}", name, Parameters={"program": i, "speed": 1.5}))
        if prev is not None:
            cond = "always" if i % 3 else f"a{i - 1}.torque >= 80 and a{i - 1}._round < 3"
            if prev.startswith("B"):
                cond = "always"
            trans.append({"Source": prev, "Target": name, "Condition": cond})
        prev = name
        i += 1
    return {"Steps": steps, "Transitions": trans, "Actions": acts, "Branches": branches}


QA = "com.example.obs.qa.v1"


def event_then_work() -> dict[str, Any]:
    """A pull event, then a pushed command: the event's arrival to that command."""
    return {"ID": "evwork", "dataschema": V110, "data": {
        "Steps": [{"Name": "Wait", "Initial": True}, {"Name": "Work"}],
        "Transitions": [{"Source": "Wait", "Target": "Work", "Condition": "always"}],
        "Actions": [
            {"Name": "qa", "Step": "Wait", "Qualifier": "N", "Interaction": "pull_event",
             "TypeId": QA, "TimeoutSeconds": 30},
            {"Name": "work", "Step": "Work", "Qualifier": "N",
             "Interaction": "push_command", "TypeId": "com.example.obs.work.v1",
             "TimeoutSeconds": 30}]}}
