"""Transitions per second of the ISA-95 job order machine: ours against the Python libraries.

    python benchmarks/machines_ratio.py [--seconds 1.0]

Every contender runs the same job order cycle, Store, Start, Run, Pause, Resume, Stop,
Clear (seven transitions from InitialState to EndState), over and over, in this one
process. Printed: transitions per second (best of five rounds), our speed as a
multiple of each, and the memory kept per 1,000 transitions (tracemalloc, after the
run, in a separate pass so tracing does not slow the timed one).

Contenders (the bench extra installs them: ``pip install -e .[bench]``):

- ours, ``JOB_ORDER.fire(state_id, trigger_id)`` called from Python once per
  transition; also with names (``fire("Running", "Pause")``) and ``fire_all`` (the
  whole cycle in one C loop);
- ``transitions`` as the Python original uses it per event: one
  HierarchicalGraphMachine, and per event add the job order as a model at its current
  state, ``may_trigger``, ``trigger``, remove the model;
- ``transitions`` at its fastest: a plain ``Machine`` (flat top-level states) with a
  persistent model, ``model.trigger(name)``;
- ``python-statemachine``: one ``StateMachine`` per job order, ``send(event)``.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
import tracemalloc
from array import array
from collections.abc import Callable

from sfc_fast.machines import JOB_ORDER

CYCLE = ("Store", "Start", "Run", "Pause", "Resume", "Stop", "Clear")
N = len(CYCLE)


# ---- ours ----------------------------------------------------------------------------


def ours_ids() -> Callable[[int], None]:
    fire = JOB_ORDER.fire
    start = JOB_ORDER.initial
    ids = tuple(JOB_ORDER.trigger_id(t) for t in CYCLE)

    def run(cycles: int) -> None:
        for _ in range(cycles):
            s = start
            for t in ids:
                s = fire(s, t)
    return run


def ours_names() -> Callable[[int], None]:
    fire = JOB_ORDER.fire
    start = JOB_ORDER.initial_name

    def run(cycles: int) -> None:
        for _ in range(cycles):
            s = start
            for t in CYCLE:
                s = fire(s, t)
    return run


def ours_fire_all() -> Callable[[int], None]:
    fire_all = JOB_ORDER.fire_all
    start = JOB_ORDER.initial
    ids = array("i", [JOB_ORDER.trigger_id(t) for t in CYCLE])

    def run(cycles: int) -> None:
        for _ in range(cycles):
            fire_all(start, ids)
    return run


# ---- transitions ---------------------------------------------------------------------

# The ISA95JobOrderStateMachineType in the transitions library's format (the OPC UA
# sub-states included, as the Python original builds it).
_READINESS = ["Waiting", "Ready", "Loaded"]
_HSM_STATES = [
    "InitialState",
    {"name": "NotAllowedToStart", "children": _READINESS, "initial": "Ready"},
    {"name": "AllowedToStart", "children": _READINESS, "initial": "Ready"},
    "Running",
    {"name": "Interrupted", "children": ["Held", "Suspended"], "initial": "Suspended"},
    {"name": "Ended", "children": ["Completed", "Closed"], "initial": "Completed"},
    "Aborted",
    {"name": "EndState", "final": True},
]
_FLAT_STATES = ["InitialState", "NotAllowedToStart", "AllowedToStart", "Running",
                "Interrupted", "Ended", "Aborted", "EndState"]


def _lib_transitions() -> list[dict[str, str]]:
    return [{"trigger": t, "source": s, "dest": d}
            for s, t, d in JOB_ORDER.transitions() if "_" not in s]


class _Order:
    """A job order model; trigger/may_trigger are replaced by the machine."""

    def __init__(self) -> None:
        self._state = "InitialState"

    def trigger(self, name: str) -> bool:
        raise NotImplementedError

    def may_trigger(self, name: str) -> bool:
        raise NotImplementedError


def transitions_per_event() -> Callable[[int], None]:
    from transitions.extensions import HierarchicalGraphMachine

    machine = HierarchicalGraphMachine(
        model=None, states=_HSM_STATES, transitions=_lib_transitions(),
        initial="InitialState", auto_transitions=False, queued=True,
        model_attribute="_state", model_override=True)

    def run(cycles: int) -> None:
        for _ in range(cycles):
            state = "InitialState"
            for t in CYCLE:
                order = _Order()  # the original reads the order from Redis per event
                machine.add_model(order, initial=state)
                try:
                    if not order.may_trigger(t):
                        raise RuntimeError(f"{t} refused in {state}")
                    order.trigger(t)
                    state = order._state
                finally:
                    machine.remove_model(order)
    return run


def transitions_fastest() -> Callable[[int], None]:
    from transitions import Machine

    class Order:
        pass

    order = Order()
    machine = Machine(model=order, states=_FLAT_STATES, transitions=_lib_transitions(),
                      initial="InitialState", auto_transitions=False)
    trigger = order.trigger

    def run(cycles: int) -> None:
        for _ in range(cycles):
            machine.set_state("InitialState", order)
            for t in CYCLE:
                trigger(t)
    return run


# ---- python-statemachine -------------------------------------------------------------


def python_statemachine() -> Callable[[int], None]:
    from statemachine import State, StateMachine

    class JobOrder(StateMachine):
        initial_state = State(initial=True)
        not_allowed_to_start = State()
        allowed_to_start = State()
        running = State()
        interrupted = State()
        ended = State()
        aborted = State()
        end_state = State(final=True)

        store = initial_state.to(not_allowed_to_start)
        store_and_start = initial_state.to(allowed_to_start)
        start = not_allowed_to_start.to(allowed_to_start)
        revoke_start = allowed_to_start.to(not_allowed_to_start)
        update = (not_allowed_to_start.to.itself(internal=True)
                  | allowed_to_start.to.itself(internal=True))
        run = allowed_to_start.to(running)
        pause = running.to(interrupted)
        resume = interrupted.to(running)
        stop = running.to(ended) | interrupted.to(ended)
        abort = (not_allowed_to_start.to(aborted) | allowed_to_start.to(aborted)
                 | running.to(aborted) | interrupted.to(aborted))
        cancel = not_allowed_to_start.to(end_state) | allowed_to_start.to(end_state)
        clear = ended.to(end_state) | aborted.to(end_state)

    events = ("store", "start", "run", "pause", "resume", "stop", "clear")

    def run(cycles: int) -> None:
        for _ in range(cycles):
            sm = JobOrder()  # one machine per job order (it ends in a final state)
            for e in events:
                sm.send(e)
    return run


CONTENDERS: list[tuple[str, Callable[[], Callable[[int], None]]]] = [
    ("sfc_fast JOB_ORDER.fire(int, int)", ours_ids),
    ("sfc_fast JOB_ORDER.fire(name, name)", ours_names),
    ("sfc_fast JOB_ORDER.fire_all (C loop)", ours_fire_all),
    ("transitions HGM, per event (original)", transitions_per_event),
    ("transitions Machine, persistent model", transitions_fastest),
    ("python-statemachine, one per order", python_statemachine),
]


def rate(run: Callable[[int], None], seconds: float) -> float:
    """Best of five rounds, in transitions per second."""
    cycles = 1
    while True:  # size a round to about seconds / 5
        t0 = time.perf_counter()
        run(cycles)
        dt = time.perf_counter() - t0
        if dt >= seconds / 25:
            break
        cycles *= 2
    cycles = max(1, int(cycles * (seconds / 5) / dt))
    best = float("inf")
    for _ in range(5):
        gc.collect()
        t0 = time.perf_counter()
        run(cycles)
        best = min(best, time.perf_counter() - t0)
    return cycles * N / best


def kept_bytes_per_1000(run: Callable[[int], None], cycles: int) -> float:
    run(3)  # warm caches so only growth is counted
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    run(cycles)
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return (after - before) / (cycles * N) * 1000


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=1.0, help="time per contender")
    args = ap.parse_args(argv)

    results: list[tuple[str, float, float]] = []
    for name, make in CONTENDERS:
        try:
            run = make()
        except ImportError as e:
            print(f"{name}: skipped ({e.name} not installed: pip install -e .[bench])")
            continue
        run(1)  # the cycle is valid for this contender
        per_s = rate(run, args.seconds)
        slow = per_s < 100_000
        kept = kept_bytes_per_1000(run, 50 if slow else 2000)
        results.append((name, per_s, kept))

    ours = results[0][1] if results and results[0][0].startswith("sfc_fast") else None
    print(f"ISA-95 job order cycle {' > '.join(CYCLE)} ({N} transitions), "
          f"Python {sys.version.split()[0]}")
    print(f"{'contender':<40} {'transitions/s':>15} {'ours is':>9} {'kept/1000':>11}")
    for name, per_s, kept in results:
        ratio = f"{ours / per_s:8.1f}x" if ours else ""
        print(f"{name:<40} {per_s:>15,.0f} {ratio:>9} {kept:>9,.0f} B")
    others = [r for r in results if not r[0].startswith("sfc_fast")]
    if ours and others:
        best = max(others, key=lambda r: r[1])
        print(f"\nfire(int, int) is {ours / best[1]:.1f}x the fastest other contender "
              f"({best[0]}); goal >= 20x.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
