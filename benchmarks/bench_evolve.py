"""The execution core: evolve, evolve_many, the state codec, the Runner (pytest-benchmark).

    python -m pytest benchmarks/bench_evolve.py --benchmark-only

Measured: evolve of an action completion in a 6-step recipe (with and without a result
dict); evolve_many ticking 100,000 jobs, all due; state decode (``job_index``) and
decode + encode (an applied ``Shift(1)``). ``DeadlineIndex.pop_due`` of 100,000 due
among 1,000,000 is in bench_deadlines.py. The plain-Python baseline's completion is
here too for the table; ``benchmarks/evolve_ratio.py`` prints the ratios and the
Runner's memory per job.
"""

from __future__ import annotations

from collections import deque

import pytest
from evolve_ratio import NOW, RESULT, evolve_read, job_ids, six_steps, step3_states
from helpers.recipes import V110
from py_evolve import load_recipe, py_evolve

from sfc_fast import Runner, compile_recipe
from sfc_fast.events import Completed, Shift, Start, Tick
from sfc_fast.evolve import evolve, evolve_many, job_index

JOB = "job-0000001"
SWEEP = 100_000


@pytest.fixture(scope="module")
def graph():
    return compile_recipe(six_steps(), V110)


@pytest.fixture(scope="module")
def model():
    return load_recipe(six_steps())


@pytest.fixture(scope="module")
def at_s2(graph, model) -> tuple[bytes, bytes]:
    """Core and py state of JOB at step S2 of 6 (two completions done, with results)."""
    return step3_states(graph, model, JOB)


# ---------------------------------------------------------------- one completion


@pytest.mark.parametrize("result", [None, RESULT], ids=["no-result", "result-dict"])
def test_completion_6_steps(benchmark, graph, at_s2, result) -> None:
    ev = Completed(f"{JOB}:a2#3", result)
    d = benchmark(evolve, graph, at_s2[0], ev, NOW)
    assert d.applied and [c.command_id for c in d.commands] == [f"{JOB}:a3#4"]


def test_completion_6_steps_id_read(benchmark, graph, at_s2) -> None:
    """The same completion, then the new command's id read: the Decision builds its
    commands on first read, so this is the cost a caller that sends them pays."""
    ev = Completed(f"{JOB}:a2#3")
    cid = benchmark(evolve_read, graph, at_s2[0], ev, NOW)
    assert cid == f"{JOB}:a3#4"


@pytest.mark.parametrize("result", [None, RESULT], ids=["no-result", "result-dict"])
def test_py_baseline_completion_6_steps(benchmark, model, at_s2, result) -> None:
    ev = Completed(f"{JOB}:a2#3", result)
    applied, _, _, commands, _ = benchmark(py_evolve, model, at_s2[1], ev, NOW)
    assert applied and [c["command_id"] for c in commands] == [f"{JOB}:a3#4"]


def test_late_answer_absorbed(benchmark, graph, at_s2) -> None:
    """An answer to an earlier attempt: decode, find it late, write nothing."""
    d = benchmark(evolve, graph, at_s2[0], Completed(f"{JOB}:a1#2"), NOW)
    assert not d.applied


# ---------------------------------------------------------------- the codec


def test_state_decode_job_index(benchmark, graph, at_s2) -> None:
    """Decode cost: job_index decodes the state and reads status, deadline, waits."""
    out = benchmark(job_index, graph, at_s2[0])
    assert out[0] == "running"


def test_state_decode_encode_shift(benchmark, graph, at_s2) -> None:
    """Decode + encode: an applied Shift(1) moves one deadline and writes the state."""
    d = benchmark(evolve, graph, at_s2[0], Shift(1), NOW)
    assert d.applied and len(d.state) == len(at_s2[0])


# ---------------------------------------------------------------- sweeps


@pytest.fixture(scope="module")
def retry_graph():
    return compile_recipe(six_steps(retries=3), V110)


@pytest.fixture(scope="module")
def sweep_states(retry_graph) -> list[bytes]:
    """SWEEP jobs at step S0, their first command open, deadline NOW + 10 s."""
    start = [evolve(retry_graph, None, Start(j, "s1"), NOW) for j in job_ids(SWEEP)]
    return [d.state for d in start]


def test_evolve_many_tick_100k_all_due(benchmark, retry_graph, sweep_states) -> None:
    """Every job is due: each tick spends a retry and dispatches a new attempt."""
    due = NOW + 10_000
    out = benchmark.pedantic(evolve_many, args=(retry_graph, sweep_states, Tick(), due),
                             rounds=5, warmup_rounds=1)
    assert len(out) == SWEEP and all(d.applied and len(d.commands) == 1 for d in out)


def test_evolve_many_tick_100k_none_due(benchmark, retry_graph, sweep_states) -> None:
    """Nothing is due yet: every tick is absorbed (a sweep between deadlines)."""
    out = benchmark.pedantic(evolve_many, args=(retry_graph, sweep_states, Tick(), NOW + 1),
                             rounds=5, warmup_rounds=1)
    assert not any(d.applied for d in out)


# ---------------------------------------------------------------- embedded runner


def test_runner_job_run(benchmark, graph) -> None:
    """One job through the Runner: start, six completions as dispatched, done."""
    sent: deque[str] = deque()
    runner = Runner(lambda c: sent.append(c.command_id), clock=lambda: NOW)
    seq = iter(range(10**9))

    def run() -> str:
        job = f"job-{next(seq)}"
        runner.start(job, graph, "s1")
        while sent:
            runner.complete(sent.popleft(), RESULT)
        runner.forget(job)
        return job

    benchmark(run)
    assert len(runner) == 0
