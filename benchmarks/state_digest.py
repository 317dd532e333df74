"""A digest of evolve's output over random event sequences, to compare two builds.

    python benchmarks/state_digest.py                         # this checkout's build
    PYTHONPATH=<other checkout>/src python benchmarks/state_digest.py

Drives 60 jobs of each reference recipe and of some generated ones through seeded
random events (answers to open and unknown commands, hold answers, ticks, pull events,
hold, release, resume, shifts, cancels) and prints how many calls it made and the
SHA-256 of every Decision (state bytes, status, reason, commands, work, job
transitions, next deadline, waits). Two builds that print the same digest wrote the
same bytes and decided the same: a speed change that must not touch the state format
or the rules is checked this way.
"""

import contextlib
import hashlib
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from helpers.recipes import V110, generated, linear, load_reference, reference_recipes_dir

from sfc_fast import compile_recipe
from sfc_fast import events as ev_  # ev_.Completed(...): the event classes
from sfc_fast.evolve import evolve


def main() -> None:
    recipes = []
    for f in sorted(reference_recipes_dir().glob("*.json")):
        wm = load_reference(f.name)
        with contextlib.suppress(ValueError):     # one is wrong on purpose
            recipes.append((f.name, compile_recipe(wm["data"], wm["dataschema"])))
    for n, k in ((6, 0), (12, 4), (25, 0)):
        recipes.append((f"gen{n}", compile_recipe(generated(n, k) if k else generated(n), V110)))
    recipes.append(("lin4", compile_recipe(linear(4), V110)))
    h = hashlib.sha256()
    count = 0
    for name, g in recipes:
        rng = random.Random(name)
        for j in range(60):
            job = rng.choice([f"job-{j}", f"jöb-{j}", f"j{j}"])
            now = 1_700_000_000_000 + rng.randrange(10**6)
            params = rng.choice([None, {"mode": "fast", "x": 2}])
            d = evolve(g, None, ev_.Start(job, "s1", params), now)
            state = d.state
            open_ids = [c.command_id for c in d.commands]
            for _ in range(rng.randrange(5, 60)):
                now += rng.randrange(0, 40_000)
                r = rng.random()
                cid = rng.choice(open_ids) if open_ids and rng.random() < 0.9 else f"{job}:x#1"
                if r < 0.45:
                    ev = ev_.Completed(cid, rng.choice([None, {"ok": True, "torque": 85.5},
                                                    {"ok": False, "n": rng.randrange(5)}]))
                elif r < 0.52:
                    ev = ev_.Failed(cid, "bad")
                elif r < 0.56:
                    ev = ev_.Held(cid + ":hold" if rng.random() < 0.7 else cid)
                elif r < 0.59:
                    ev = ev_.NotHeld(cid + ":hold")
                elif r < 0.72:
                    ev = ev_.Tick(tuple(open_ids[:1]) if rng.random() < 0.2 else ())
                elif r < 0.80:
                    ev = ev_.Event(rng.choice(["scan", "done", "part_present", "ready"]),
                               subject=rng.choice([None, job]), data={"ok": True})
                elif r < 0.85:
                    ev = ev_.Hold()
                elif r < 0.91:
                    ev = ev_.Release()
                elif r < 0.94:
                    ev = ev_.Resume()
                elif r < 0.98:
                    ev = ev_.Shift(rng.randrange(1, 100_000))
                else:
                    ev = ev_.Cancel("stop it", rng.random() < 0.5)
                d = evolve(g, state, ev, now)
                count += 1
                cmds = [(c.command_id, c.type_id, c.deadline_ms, c.hold, c.restart)
                        for c in d.commands]
                h.update(repr((d.applied, d.state, d.status, d.reason, cmds, d.work, d.job,
                               d.next_deadline, d.waits_added, d.waits_removed)).encode())
                if d.applied:
                    state = d.state
                    if cmds:
                        open_ids = [c[0] for c in cmds] + open_ids[:3]
    print(count, h.hexdigest())


if __name__ == "__main__":
    main()
