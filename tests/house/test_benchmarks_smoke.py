"""The benchmark scripts the docs tell people to run still run: each in a small size,
as a subprocess, its figures read back from what it prints. (The benchmarks reach into
the host for their counters; a change of the host's internals once broke
``host_throughput.py``, and with it ``scopes_rate.py`` and ``report.py``, unnoticed.)"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _run(*args: str, timeout: float = 120) -> str:
    p = subprocess.run([sys.executable, str(BENCH / args[0]), *args[1:]], capture_output=True,
                       text=True, timeout=timeout)
    assert p.returncode == 0, f"{args[0]} failed:\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}"
    return p.stdout


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def test_host_throughput_quick_counts_commands_and_rates() -> None:
    out = _run("host_throughput.py", "--quick")
    m = re.search(r"against the baseline: ([\d.]+)x one by one, ([\d.]+)x pipelined", out)
    assert m, out
    assert float(m.group(1)) > 0 and float(m.group(2)) > 0


def test_scopes_rate_counts_cpu_and_commands_a_completion() -> None:
    out = _run("scopes_rate.py", "--jobs", "300", "--scopes", "30", "--seconds", "0.5")
    r = json.loads(out.strip().splitlines()[-1])
    assert r["rate"] > 0
    # every completion is a compare-and-set with its inner commands
    assert r["redis_commands"] >= 4
    assert 0 < r["client_commands"] < 1
    assert r["host_us"] > 0 and r["redis_us"] > 0
    assert "evalsha" in r["us_by_command"]


def test_paced_cpu_gives_each_process_s_cpu_an_action() -> None:
    # 2 s: the servers' CPU comes from /proc in 10 ms ticks, and mosquitto spends about
    # one tick on 100 actions
    out = _run("paced_cpu.py", "--rates", "200", "--seconds", "2")
    m = re.search(r"200 actions/s: host ([\d,]+) µs .*redis ([\d,]+) µs, mosquitto ([\d,]+) µs; "
                  r"Redis writes a job ([\d.]+)", out)
    assert m, out
    assert all(_number(g) > 0 for g in m.groups())


def test_load_cost_measures_cpu_writes_and_the_tail_over_load_against_the_floor() -> None:
    out = _run("load_cost.py", "--quick", "--json-line", timeout=240)
    r = json.loads(out.strip().splitlines()[-1])
    assert r["saturation_jobs_s"] > 0 and r["sat_cpu_us"] > 0
    for f in ("10", "25", "50", "75"):
        assert r[f"cpu_us@{f}"] > 0 and r[f"p99_ms@{f}"] >= r[f"p50_ms@{f}"] > 0
        # counted on both connections (below 1 a job at high load: shared writes)
        assert r[f"redis_writes_job@{f}"] > 0 and r[f"mqtt_writes_job@{f}"] > 0
    assert r["floor_p99_ms@50"] > 0 and r["p99_over_floor@50"] > 0


def test_mqtt_e2e_quick_measures_saturation_pacing_and_the_broker() -> None:
    out = _run("mqtt_e2e.py", "--quick")
    sat = re.search(r"= ([\d,]+) jobs/s .*host CPU [\d,]+ µs a job, ([\d.]+) µs an action", out)
    paced = re.search(r"p50 ([\d.]+) ms, p99 ([\d.]+) ms", out)
    broker = re.search(r"the host's p99 is ([\d.]+)x the broker's", out)
    assert sat and paced and broker, out
    assert _number(sat.group(1)) > 0 and float(sat.group(2)) > 0
    assert 0 < float(paced.group(1)) <= float(paced.group(2))


def test_cluster_failover_kills_a_primary_and_loses_nothing() -> None:
    out = _run("cluster_failover.py", "--kills", "1", "--every", "2")
    m = re.search(r"jobs: ([\d,]+) stored, ([\d,]+) ended, 0 lost or stuck", out)
    gap = re.search(r"kill 1: port \d+, first completion after ([\d.]+) s", out)
    assert m and gap, out
    assert m.group(1) == m.group(2) and float(gap.group(1)) > 0


def test_opcua_cost_times_the_lists_and_an_event() -> None:
    out = _run("opcua_cost.py", "--orders", "200", "--events", "50", "--rounds", "1")
    lists = re.findall(r"lists of ([\d,]+) orders, (none|one) subscribed: built in ([\d,]+) ms",
                       out)
    event = re.search(r"a status event: ([\d,]+) µs with no subscriber, ([\d,]+) µs", out)
    assert len(lists) == 2 and event, out
    assert all(_number(n) == 200 for n, _, _ in lists)
    assert _number(event.group(1)) > 0 and _number(event.group(2)) > 0


def test_opcua_calls_measures_the_host_against_the_bare_server() -> None:
    out = _run("opcua_calls.py", "--calls", "40", "--sessions", "2", "--rounds", "1",
               timeout=240)
    rows = re.findall(r"^(Store|Start|RequestJobResponseByJobOrderID) +(\d) +([\d,]+) +"
                      r"([\d,]+) +([\d.]+)x", out, re.MULTILINE)
    assert len(rows) == 6, out
    assert all(_number(r[2]) > 0 and _number(r[3]) > 0 for r in rows), out


def test_opcua_equipment_runs_units_and_the_mqtt_yardstick() -> None:
    out = _run("opcua_equipment.py", "--units", "1,3", "--jobs", "2", timeout=240)
    rows = re.findall(r"^ +(\d+) units: OPC UA ([\d,]+) actions/s, host CPU ([\d,]+) µs an "
                      r"action, .*\| MQTT at the same rate ([\d,]+) actions/s, ([\d,]+) µs an "
                      r"action, .*: CPU ([\d.]+)x \| MQTT saturated ([\d,]+) actions/s, "
                      r"([\d,]+) µs an action: CPU ([\d.]+)x$", out, re.MULTILINE)
    assert [r[0] for r in rows] == ["1", "3"], out
    assert all(_number(r[1]) > 0 and _number(r[3]) > 0 and float(r[5]) > 0
               and _number(r[6]) > 0 and float(r[8]) > 0 for r in rows), out


def test_opcua_events_measures_saturation_with_subscribers_and_counts_them() -> None:
    out = _run("opcua_events.py", "--jobs", "150", "--rounds", "1", timeout=300)
    rates = re.findall(r"^(off|on, \d+ clients?) +([\d,]+) jobs/s", out, re.MULTILINE)
    assert [r[0] for r in rates] == ["off", "on, 0 clients", "on, 1 client",
                                     "on, 10 clients"], out
    assert all(_number(r[1]) > 0 for r in rates), out
    got = re.findall(r"([\d,]+) events raised \(0 dropped by the face\), each client "
                     r"received ([\d,]+)–([\d,]+)", out)
    assert len(got) == 2 and "MISSING" not in out, out
    assert all(_number(n) == _number(lo) == _number(hi) > 0 for n, lo, hi in got), out


def test_otel_cost_compares_spans_off_and_on() -> None:
    out = _run("otel_cost.py", "--quick")
    m = re.search(r"round 1: off ([\d,]+) jobs/s, ([\d.]+) µs an action; on ([\d,]+) jobs/s, "
                  r"([\d.]+) µs an action \(([\d,]+) spans, ([\d.]+) a job\)", out)
    assert m, out
    assert all(_number(g) > 0 for g in m.groups())
    assert _number(m.group(6)) == 7.0      # the request, the job, five attempts


def test_spans_ratio_times_both_ways_of_recording() -> None:
    out = _run("spans_ratio.py", "--quick")
    m = re.search(r"written from fields: ([\d.]+) µs a span; as span objects: ([\d.]+) µs "
                  r"a span; objects / fields x([\d.]+)", out)
    assert m, out
    assert all(float(g) > 0 for g in m.groups())


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="--pin needs Linux and two CPUs")
def test_mqtt_e2e_pinned_runs_the_host_on_a_core_of_its_own() -> None:
    out = _run("mqtt_e2e.py", "--quick", "--pin")
    assert re.search(r"the host's p99 is ([\d.]+)x the broker's", out), out


def test_mqtt_floor_relays_every_answer_and_measures_the_broker() -> None:
    out = _run("mqtt_floor.py", "--rate", "500", "--seconds", "1")
    relay = re.search(r"\(([\d,]+) answers\): answer to next command p50 ([\d.]+) ms, "
                      r"p99 ([\d.]+) ms", out)
    broker = re.search(r"the relay's p99 is ([\d.]+)x the broker's", out)
    assert relay and broker, out
    # 100 jobs of five commands: four answers of each lead to a next command
    assert _number(relay.group(1)) == 400
    assert 0 < float(relay.group(2)) <= float(relay.group(3))
    assert float(broker.group(1)) > 0


def test_cas_history_times_a_write_at_three_history_lengths() -> None:
    out = _run("cas_history.py", "--calls", "500", "--batch", "2", "--rounds", "1")
    rows = re.findall(r"^ +(\d+) writes a job: +([\d.]+) µs$", out, re.M)
    # the writes, the whole reads, the lean reads
    assert [int(h) for h, _ in rows] == [5, 50, 500] * 3, out
    assert all(float(us) > 0 for _, us in rows)
    assert len(re.findall(r"500 against 5: ([\d.]+)x", out)) == 3, out


def test_cas_history_refuses_too_few_writes_in_one_line() -> None:
    p = subprocess.run([sys.executable, str(BENCH / "cas_history.py"), "--calls", "3"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines()[-1].endswith(
        "--calls must be at least 500: a job has one write a call")


def test_redis_channel_compares_both_clients() -> None:
    out = _run("redis_channel.py", "--calls", "300", "--rounds", "1")
    rows = [line for line in out.splitlines() if line.startswith("| ") and "x |" in line]
    assert len(rows) == 3, out


@pytest.mark.parametrize(("args", "says"), [
    (["--update"], "--update goes with --only PARTS"),
    (["--only", "scale", "--update", "--out", "no-such-report.md"],
     "no-such-report.md is not there: run the report whole first"),
])
def test_report_update_mistakes_are_one_line(args: list[str], says: str, tmp_path) -> None:
    """Refused before any measuring: one line, exit 2."""
    p = subprocess.run([sys.executable, str(BENCH / "report.py"), *args], cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stdout == "", p.stderr
    assert p.stderr.count("\n") == 1 and says in p.stderr, p.stderr
