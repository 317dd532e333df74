"""A host's start-up (docs/design.md#start-order): a host that fails it takes no message
another host should have had; SIGTERM ends it at any moment; every user mistake is one line and
exit 2, an unreachable server one line and exit 1; ``run --check``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from helpers.hosts import flush, quick_config, start_sfc_host, wait_until, work_master
from helpers.mqtt_station import MqttStation
from helpers.servers import free_port

from sfc_host.mes.client import MesClient, job_order
from sfc_host.service.app import App

SFC = [sys.executable, "-m", "sfc_host"]
S = "startup1"

MISSION = ("from sfc_host.engine import mission\n\n"
           "@mission\nasync def station(api, scope, speed=1.0):\n    yield\n")
# fails its build only after a while: a host that subscribed before building would
# hold its share of the messages meanwhile
SLOW_BROKEN = "import time\ntime.sleep(1.0)\nraise RuntimeError('misconfigured')\n"


def sfc(args: list[str], env: dict[str, str] | None = None, timeout: float = 30
        ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(SFC + args, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})})


def answer_all(cmd: dict[str, Any]) -> dict[str, Any]:
    if cmd["type"] == "com.example.cell.tighten.v1":
        return {"Outcome": "completed", "Result": {"torque": 85}}
    return {}


# ---- a failing host beside a healthy one


def test_a_failing_host_restarted_in_a_loop_takes_no_message(
        redis_url: str, mqtt_url: str, tmp_path: Path) -> None:
    """A misconfigured host restarted by its service manager beside a healthy one while
    an MES sends 200 requests (67 of them orders, whose jobs a station runs): every
    request is answered, and every answer applied (no command goes out twice, which a
    swallowed answer would cause through its deadline)."""
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "slow.py").write_text(SLOW_BROKEN)
    bad_kinds = [  # (settings, exit status)
        ({"SFC_SCRIPTS_DIR": str(broken), "SFC_REDIS_URL": redis_url}, 2),
        ({"SFC_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}, 1)]
    exits: list[tuple[int, int, str]] = []

    async def failing_host_loop(stop: asyncio.Event) -> None:
        n = 0
        while not stop.is_set():
            settings, _ = bad_kinds[n % 2]
            p = await asyncio.create_subprocess_exec(
                *SFC, "run", stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE, env={**os.environ, **settings,
                                             "SFC_MQTT_URL": mqtt_url,
                                             "SFC_CONSUMER": f"bad-{n}"})
            _, err = await p.communicate()
            exits.append((n % 2, p.returncode or 0, err.decode()))
            n += 1

    async def main() -> None:
        await flush(redis_url)
        app = App(quick_config(redis_url, mqtt_url=mqtt_url, scopes=[S],
                               consumer="healthy"))
        ended: list[str] = []
        prev = app.host.settler.on_end

        def on_end(scope: str, job: str, decision: Any) -> None:
            ended.append(job)
            if prev is not None:
                prev(scope, job, decision)
        app.host.settler.on_end = on_end
        await app.start(connect_timeout_s=5)
        stop = asyncio.Event()
        loop_task = asyncio.create_task(failing_host_loop(stop))
        took = 0.0
        try:
            async with (MqttStation(mqtt_url, answer_all) as station,
                        MesClient(quick_config(redis_url, mqtt_url=mqtt_url),
                                  timeout_s=8) as mes):
                assert (await mes.put_work_master(S, work_master("tighten_rework",
                                                                 "wm"))).ok
                await wait_until(lambda: len(exits) >= 1, 20, "a failing host's first exit")

                async def one(i: int) -> bool:
                    if i % 3 == 0:
                        return (await mes.submit(S, job_order(f"J{i}", "wm"))).ok
                    return (await mes.by_state(S, "Ended_Completed")).ok
                t0 = time.monotonic()
                sent = []
                for i in range(200):   # about 10 s: several lives of the failing host
                    sent.append(asyncio.create_task(one(i)))
                    await asyncio.sleep(0.05)
                results = await asyncio.gather(*sent, return_exceptions=True)
                took = time.monotonic() - t0
                unanswered = [r for r in results if isinstance(r, BaseException)]
                assert not unanswered, (f"{len(unanswered)} of 200 requests unanswered: "
                                        f"{unanswered[:3]}")
                assert all(results)
                jobs = {f"J{i}" for i in range(0, 200, 3)}
                await wait_until(lambda: jobs <= set(ended), 15, "every job ended")
                ids = [c["id"] for c in station.commands]
                assert len(ids) == len(set(ids)) == 3 * len(jobs), "a command went out twice"
                assert app.metrics["answers_applied"] == len(ids)
        finally:
            stop.set()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(loop_task, 15)
            await app.aclose()
        assert len(exits) >= 4, f"the failing host started only {len(exits)} times in {took:.1f} s"
        for kind, code, err in exits:
            assert code == bad_kinds[kind][1], err
            assert "Traceback" not in err, err
            errors = [ln for ln in err.splitlines() if ln.startswith("sfc-host: error:")]
            assert len(errors) == 1, err
    asyncio.run(asyncio.wait_for(main(), 120))


# ---- SIGTERM at any moment


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
def test_a_signal_during_the_connect_attempts_ends_the_host_within_2_s(
        redis_url: str, sig: int) -> None:
    # the broker is not there: the host tries for 10 s, and a signal ends it at once
    p = start_sfc_host(["run"], {"SFC_REDIS_URL": redis_url,
                                      "SFC_MQTT_URL": f"mqtt://127.0.0.1:{free_port()}"},
                            "MQTT connection to")
    try:
        t0 = time.monotonic()
        p.send_signal(sig)
        code = p.wait(10)
        took = time.monotonic() - t0
        rest = p.stderr.read() if p.stderr else ""
        assert took < 2, f"{took:.2f} s"
        assert code == 0 and "Traceback" not in rest, rest
        assert "stopped during its start-up" in rest
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_sigterm_during_a_slow_script_build_ends_the_host_within_2_s(
        redis_url: str, mqtt_url: str, tmp_path: Path) -> None:
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "slow.py").write_text("import time\ntime.sleep(8)\n")
    p = start_sfc_host(["run"], {"SFC_REDIS_URL": redis_url, "SFC_MQTT_URL": mqtt_url,
                                      "SFC_SCRIPTS_DIR": str(scripts)},
                            "engine: Idle --Build--> Building")
    try:
        time.sleep(0.3)
        t0 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        code = p.wait(10)
        assert time.monotonic() - t0 < 2
        assert code == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_sigterm_while_running_is_a_clean_stop_within_2_s(
        redis_url: str, mqtt_url: str) -> None:
    p = start_sfc_host(["run", "--scope", S],
                            {"SFC_REDIS_URL": redis_url, "SFC_MQTT_URL": mqtt_url,
                             "SFC_CONSUMER": "term-running"}, "host term-running running")
    try:
        t0 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        assert p.wait(10) == 0
        assert time.monotonic() - t0 < 2
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


# ---- user mistakes: one line, exit 2


def _scripts(tmp_path: Path) -> Path:
    d = tmp_path / "scripts"
    d.mkdir(exist_ok=True)
    (d / "station.py").write_text(MISSION)
    return d


def _mistakes(tmp_path: Path, redis_url: str, mqtt_url: str, busy_port: int
              ) -> list[tuple[list[str], dict[str, str], str]]:
    """(arguments, environment, what the one line must say)."""
    scripts = str(_scripts(tmp_path))
    ok = {"SFC_REDIS_URL": redis_url, "SFC_MQTT_URL": mqtt_url}
    with_scripts = {**ok, "SFC_SCRIPTS_DIR": scripts}
    return [
        (["--scope", "bad/scope"], ok, "setting scopes: invalid scope 'bad/scope'"),
        ([], {**ok, "SFC_METRICS_PORT": "70000"}, "setting metrics_port: 70000"),
        ([], {**ok, "SFC_MQTT_URL": "mqtt://127.0.0.1:70000"}, "setting mqtt_url"),
        ([], {**ok, "SFC_SCRIPTS_DIR": str(tmp_path / "nowhere")},
         "setting scripts_dir: '" + str(tmp_path / "nowhere")),
        ([], {**ok, "SFC_METRICS_PORT": str(busy_port)},
         f"setting metrics_port: cannot listen on 127.0.0.1:{busy_port}: already in use"),
        ([], {**with_scripts, "SFC_MISSIONS": "station"},
         "setting missions: 'station': mission station(scope, speed): missing a required "
         "argument: 'scope'"),
        ([], {**with_scripts, "SFC_MISSIONS": '["station={\\"scope\\": \\"a\\", \\"pace\\": 2}"]'},
         "unexpected keyword argument 'pace'"),
        ([], {**with_scripts, "SFC_MISSIONS": '["nosuch"]'},
         "setting missions: 'nosuch': no mission 'nosuch' (missions: station)"),
        ([], {**with_scripts, "SFC_MISSIONS": 'station={"scope": "a", "speed": 2}'},
         "setting missions: 'station={\"scope\": \"a\"': arguments are not JSON"),
        ([], {**with_scripts, "SFC_MISSIONS": '["station", 1]'},
         "SFC_MISSIONS: expected a JSON list of strings"),
        ([], {**ok, "SFC_MISSIONS": '["station={\\"scope\\": \\"a\\"}"]'},
         "no mission 'station' (missions: none)"),
        ([], {**ok, "SFC_LOG_LEVEL": "chatty"}, "setting log_level: unknown level 'chatty'"),
        (["--connect"], ok, "--connect goes with --check"),
    ]


def test_every_user_mistake_is_one_line_and_exit_2(
        redis_url: str, mqtt_url: str, tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        for args, env, says in _mistakes(tmp_path, redis_url, mqtt_url, port):
            for check in ([], ["--check"]):
                if check and args == ["--connect"]:
                    continue
                r = sfc(["run", *check, *args], env=env)
                shown = f"{check + args} {env}: {r.stderr}"
                assert r.returncode == 2, shown
                assert "Traceback" not in r.stderr, shown
                # one error line; the start-up's INFO log lines may come before it
                errors = [ln for ln in r.stderr.splitlines()
                          if not (" INFO " in ln and ln[:4].isdigit())]
                assert len(errors) == 1 and errors[0].startswith("sfc-host: error: "), shown
                assert says in errors[0], shown


def test_sfc_missions_carries_json_and_run_check_accepts_it(
        redis_url: str, mqtt_url: str, tmp_path: Path) -> None:
    scripts = _scripts(tmp_path)
    missions = ['station={"scope": "line1", "speed": 2}', 'station={"scope": "a,b"}']
    env = {"SFC_SCRIPTS_DIR": str(scripts), "SFC_MISSIONS": json.dumps(missions),
           "SFC_REDIS_URL": redis_url, "SFC_MQTT_URL": mqtt_url}
    r = sfc(["run", "--check"], env=env)
    assert r.returncode == 0, r.stderr
    assert "1 missions" in r.stdout and "2 missions to start" in r.stdout
    # the same in a file, as docs/operations.md shows it
    conf = tmp_path / "host.toml"
    conf.write_text(f'[host]\nscripts_dir = "{scripts}"\n'
                    'missions = ["station={\\"scope\\": \\"line1\\"}", '
                    '"station={\\"scope\\": \\"line2\\", \\"speed\\": 2}"]\n')
    r = sfc(["run", "--check", "--config", str(conf)])
    assert r.returncode == 0, r.stderr
    r = sfc(["run", "--check", "--connect", "--config", str(conf)], env={
        "SFC_REDIS_URL": redis_url, "SFC_MQTT_URL": mqtt_url})
    assert r.returncode == 0, r.stderr
    assert "reachable" in r.stdout


@pytest.mark.parametrize("which", ["redis", "mqtt"])
def test_run_check_connect_says_which_server_is_unreachable(
        redis_url: str, mqtt_url: str, which: str) -> None:
    env = {"SFC_REDIS_URL": redis_url, "SFC_MQTT_URL": mqtt_url}
    if which == "redis":
        env["SFC_REDIS_URL"] = f"redis://127.0.0.1:{free_port()}/0"
        says = "cannot reach Redis at redis://127.0.0.1:"
    else:
        env["SFC_MQTT_URL"] = f"mqtt://127.0.0.1:{free_port()}"
        says = "cannot reach the MQTT broker at mqtt://127.0.0.1:"
    r = sfc(["run", "--check"], env=env)
    assert r.returncode == 0, r.stderr       # without --connect no server is asked
    r = sfc(["run", "--check", "--connect"], env=env, timeout=40)
    assert r.returncode == 1, r.stderr
    lines = r.stderr.strip().splitlines()
    assert "Traceback" not in r.stderr and says in lines[-1], r.stderr


def test_unreachable_redis_with_retained_capabilities_is_one_line(
        redis_url: str, mqtt_url: str) -> None:
    """The broker holds a retained capabilities message: a host whose Redis is away
    never subscribes, so it never tries to store it (that was a 40-line traceback)."""
    import paho.mqtt.publish as publish

    port = int(mqtt_url.rsplit(":", 1)[1])
    publish.single(f"equipment/{S}/capabilities/st1",
                   json.dumps({"TypeIds": ["com.example.cell.load.v1"]}),
                   retain=True, hostname="127.0.0.1", port=port)
    try:
        r = sfc(["run"], env={"SFC_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
                              "SFC_MQTT_URL": mqtt_url})
        assert r.returncode == 1, r.stderr
        errors = [ln for ln in r.stderr.splitlines()
                  if not (" INFO " in ln and ln[:4].isdigit())]
        assert len(errors) == 1 and "cannot reach Redis" in errors[0], r.stderr
    finally:
        publish.single(f"equipment/{S}/capabilities/st1", b"", retain=True,
                       hostname="127.0.0.1", port=port)
