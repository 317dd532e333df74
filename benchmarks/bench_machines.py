"""The ISA-95 job order machine, one cycle per round (pytest-benchmark).

    python -m pytest benchmarks/bench_machines.py --benchmark-only

One round is the cycle Store, Start, Run, Pause, Resume, Stop, Clear (seven
transitions). The library contenders are skipped when the bench extra is missing.
``benchmarks/machines_ratio.py`` prints the same contenders as transitions/s and ratios.
"""

from __future__ import annotations

import machines_ratio as mr  # benchmarks/ is on sys.path (pytest's rootdir-less import)
import pytest

from sfc_fast.machines import JOB_ORDER


def _bench(benchmark, make) -> None:
    try:
        run = make()
    except ImportError as e:
        pytest.skip(f"{e.name} not installed (bench extra)")
    benchmark(run, 1)


def test_ours_fire_ids(benchmark) -> None:
    _bench(benchmark, mr.ours_ids)
    # the cycle really ends where it should
    s = JOB_ORDER.initial
    for t in mr.CYCLE:
        s = JOB_ORDER.fire(s, JOB_ORDER.trigger_id(t))
    assert JOB_ORDER.state_name(s) == "EndState"


def test_ours_fire_names(benchmark) -> None:
    _bench(benchmark, mr.ours_names)


def test_ours_fire_all(benchmark) -> None:
    _bench(benchmark, mr.ours_fire_all)


def test_transitions_per_event_like_the_original(benchmark) -> None:
    _bench(benchmark, mr.transitions_per_event)


def test_transitions_persistent_model(benchmark) -> None:
    _bench(benchmark, mr.transitions_fastest)


def test_python_statemachine(benchmark) -> None:
    _bench(benchmark, mr.python_statemachine)
