"""The operator commands against a real host: ``job …`` over MQTT (mosquitto), ``inspect``
and ``top`` over Redis (redis-server). The host (``App``) and a simulated station run on
an event loop in a thread of their own; the commands run through ``cli.main`` in the
test's thread, as an operator's shell would run them."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from helpers.cli import cli
from helpers.hosts import Station, quick_config, work_master
from helpers.mqtt_station import MqttStation
from helpers.servers import RedisClusterServer, free_port

from sfc_host.execution.host import Host
from sfc_host.isa95 import state_list, status_names
from sfc_host.service.app import App

TIGHTEN = "com.example.cell.tighten.v1"
PAINT = "com.example.booth.paint.v1"
PAINT_HOLD = "com.example.booth.paint.hold.v1"


def answer(cmd: dict[str, Any]) -> dict[str, Any] | None:
    """Every command completes at once, except the tightening of a ``slow-`` job and
    any painting, which are never answered (the job stays Running with an open
    command); a paint hold command is answered ``held``."""
    if cmd["type"] == TIGHTEN:
        if str(cmd["correlationid"]).startswith("slow-"):
            return None
        return {"Outcome": "completed", "Result": {"torque": 85}}
    if cmd["type"] == PAINT:
        return None
    if cmd["type"] == PAINT_HOLD:
        return {"Outcome": "held"}
    return {}


class LoopThread:
    """An event loop in a thread of its own, for servers the commands talk to."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def call(self, coro: Coroutine[Any, Any, Any], timeout: float = 30) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


class HostThread(LoopThread):
    """An ``App`` and an ``MqttStation`` on a loop in a thread."""

    def __init__(self, redis_url: str, mqtt_url: str, scope: str) -> None:
        super().__init__()
        self.scope = scope
        self.metrics_port = free_port()
        self.app = App(quick_config(redis_url, mqtt_url=mqtt_url, scopes=[scope],
                                    metrics_port=self.metrics_port, consumer="ops-test"))
        self.station = MqttStation(mqtt_url, answer)
        self.call(self._start())

    async def _start(self) -> None:
        store = self.app.host.store
        await store.put_work_master(self.scope, work_master("tighten_rework", "wm"))
        await store.put_work_master(self.scope, work_master("paint_hold_restart", "paint"))
        await self.app.start()
        await self.station.__aenter__()

    def close(self) -> None:
        self.call(self.station.__aexit__(None, None, None))
        self.call(self.app.aclose())
        self.stop()

    def order_state(self, job: str) -> str | None:
        o = self.call(self.app.host.orders.get(self.scope, job))
        return o["state"] if o else None

    def wait_state(self, job: str, want: str, timeout: float = 15) -> None:
        end = time.monotonic() + timeout
        while (got := self.order_state(job)) != want:
            assert time.monotonic() < end, f"{job}: {got}, not {want}"
            time.sleep(0.02)

    def wait_open(self, job: str, action: str, timeout: float = 15) -> None:
        """Until ``job``'s ``action`` has a command out."""
        end = time.monotonic() + timeout
        while not any(str(c["id"]).startswith(f"{job}:{action}#")
                      for c in self.station.commands):
            assert time.monotonic() < end, f"{job}: no {action} command"
            time.sleep(0.02)


@pytest.fixture(scope="module")
def host(redis_url: str, mqtt_url: str) -> Iterator[HostThread]:
    # a scope of its own: the broker keeps retained topics across the session's tests
    h = HostThread(redis_url, mqtt_url, f"ops-{uuid.uuid4().hex[:8]}")
    yield h
    h.close()
    # the session's Redis outlives this module: leave no scope with running jobs for a
    # later host to recover
    c = redis.Redis.from_url(redis_url)
    try:
        keys = list(c.scan_iter(match=f"sfc:{{{h.scope}}}:*", count=1000))
        if keys:
            c.delete(*keys)
        c.srem("sfc:scopes", h.scope)
    finally:
        c.close()


@pytest.fixture
def conf(host: HostThread, redis_url: str, mqtt_url: str, tmp_path: Path) -> str:
    """The config an operator would use: the hosts' file, naming the one scope."""
    p = tmp_path / "host.toml"
    p.write_text(f'[host]\nredis_url = "{redis_url}"\nmqtt_url = "{mqtt_url}"\n'
                 f'scopes = ["{host.scope}"]\nmetrics_port = {host.metrics_port}\n')
    return str(p)


def sfc(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc, out, err = cli(capsys, *argv)
    assert "Traceback" not in out + err
    return rc, out, err


def one_line_error(rc: int, err: str, *words: str) -> None:
    assert rc == 2, err
    assert err.count("\n") == 1 and err.startswith("sfc-host"), err
    for w in words:
        assert w in err, (w, err)


def rows_of(out: str) -> dict[str, list[str]]:
    """A printed table by its first column."""
    return {ln.split()[0]: ln.split() for ln in out.splitlines()[1:] if ln.strip()}


# ---- job …


def test_status_names_from_the_bits() -> None:
    assert status_names(1) == ["NO_ERROR"]
    assert status_names(8) == ["INVALID_JOB_ORDER_STATUS"]
    assert status_names(2 ** 32 | 16) == ["UNABLE_TO_ACCEPT_JOB_ORDER", "INVALID_REQUEST"]
    assert status_names(4) == ["BIT_2"]
    assert status_names(0) == ["INVALID_STATUS_0"]


def test_job_submit_show_and_list(host: HostThread, conf: str, capsys) -> None:
    rc, out, err = sfc(capsys, "job", "submit", "wm", "--config", conf, "--id", "J1",
                       "-p", "program=7", "-p", "note=first part")
    assert rc == 0, err
    assert out.strip() == f"J1: StoreAndStart accepted (scope {host.scope}, Work Master wm)"
    host.wait_state("J1", "Ended_Completed")
    stored = json.loads(host.call(host.app.host.orders.get(host.scope, "J1"))["order"])
    assert stored["JobOrderParameters"] == [{"ID": "program", "Value": 7},
                                            {"ID": "note", "Value": "first part"}]
    assert stored["WorkMasterID"] == [{"ID": "wm"}]

    rc, out, _ = sfc(capsys, "job", "show", "J1", "--config", conf)
    assert rc == 0
    lines = dict(ln.split(None, 1) for ln in out.splitlines()
                 if ln.split(None, 1)[0] in ("job", "state", "result"))
    assert lines["job"] == "J1" and lines["state"] == "Ended_Completed"
    assert "tighten.torque = 85" in out and "program = 7" in out
    assert "started" in out and "ended" in out
    end = time.monotonic() + 5     # the retained order follows within a moment
    while (doc := json.loads(sfc(capsys, "job", "show", "J1", "--config", conf,
                                 "--json")[1]))["State"] != state_list("Ended_Completed"):
        assert time.monotonic() < end, doc
    assert {"ID": "tighten.torque", "Value": 85} in doc["JobResponse"]["JobResponseData"]

    # an ISA-95 job order file, stored only, with a generated id; -p adds to the file's
    # parameters (and replaces one of the same ID), then started
    f = Path(conf).parent / "order.json"
    f.write_text(json.dumps({"JobOrder": {
        "WorkMasterID": [{"ID": "wm"}], "Priority": 3,
        "JobOrderParameters": [{"ID": "program", "Value": 5}, {"ID": "lot", "Value": 1}]}}))
    rc, out, err = sfc(capsys, "job", "submit", "--order", str(f), "--no-start",
                       "-p", "lot=[1,2]", "--config", conf, "--json")
    assert rc == 0, err
    job = json.loads(out)["JobOrderID"]
    assert job.startswith("wm-")
    stored = json.loads(host.call(host.app.host.orders.get(host.scope, job))["order"])
    assert stored["Priority"] == 3
    assert stored["JobOrderParameters"] == [{"ID": "program", "Value": 5},
                                            {"ID": "lot", "Value": [1, 2]}]
    # Update replaces the order before it runs
    rc, out, err = sfc(capsys, "job", "update", "--order", str(f), "--id", job,
                       "--priority", "8", "--config", conf)
    assert rc == 0 and out.strip() == f"{job}: Update accepted", err
    stored = json.loads(host.call(host.app.host.orders.get(host.scope, job))["order"])
    assert stored["Priority"] == 8

    rc, out, _ = sfc(capsys, "job", "list", "--config", conf)
    assert rc == 0
    assert out.splitlines()[0].split() == ["JOB", "STATE", "STARTED", "ENDED", "REASON"]
    rows = rows_of(out)
    assert rows["J1"][1] == "Ended_Completed"
    assert rows["J1"][2].endswith("Z") and rows["J1"][3].endswith("Z")   # start and end
    assert rows[job][1] == "NotAllowedToStart_Ready"
    rc, out, _ = sfc(capsys, "job", "list", "--state", "Ended", "--config", conf, "--json")
    assert [r["JobOrderID"] for r in json.loads(out)] == ["J1"]
    rc, out, _ = sfc(capsys, "job", "list", "--state", "Running", "--config", conf)
    assert rc == 0 and out.strip() == f"no job orders in Running in scope {host.scope}"

    rc, out, err = sfc(capsys, "job", "start", job, "--config", conf)
    assert rc == 0, err
    assert out.strip() == f"{job}: Start accepted"
    host.wait_state(job, "Ended_Completed")

    # the retained state index: one message with every id
    end = time.monotonic() + 5
    while True:
        rc, out, _ = sfc(capsys, "job", "list", "--index", "--config", conf, "--json")
        idx = json.loads(out)
        states = {j["job_order_id"]: j["state"] for j in idx["jobs"]}
        if states.get(job) == "Ended_Completed" or time.monotonic() > end:
            break
    assert states["J1"] == "Ended_Completed" and states[job] == "Ended_Completed"
    assert idx["seq"] >= 1
    rc, out, _ = sfc(capsys, "job", "list", "--index", "--config", conf)
    assert rows_of(out.rsplit("\n(", 1)[0])["J1"] == ["J1", "Ended_Completed", "yes"]
    assert f"(state index seq {idx['seq']}" in out or "(state index seq" in out
    # Clear: the order leaves the list
    rc, out, err = sfc(capsys, "job", "clear", "J1", "--config", conf)
    assert rc == 0 and out.strip() == "J1: Clear accepted", err
    rc, out, _ = sfc(capsys, "job", "list", "--config", conf)
    assert "J1" not in rows_of(out)


def test_job_control_and_refusals(host: HostThread, conf: str, capsys) -> None:
    rc, _, err = sfc(capsys, "job", "submit", "wm", "--id", "slow-1", "--config", conf)
    assert rc == 0, err
    host.wait_open("slow-1", "tighten")
    host.wait_state("slow-1", "Running")
    for cmd, method, state in (("pause", "Pause", "Interrupted_Suspended"),
                               ("resume", "Resume", "Running"),
                               ("stop", "Stop", "Ended_Completed")):
        rc, out, err = sfc(capsys, "job", cmd, "slow-1", "--config", conf)
        assert rc == 0, err
        assert out.strip() == f"slow-1: {method} accepted"
        assert host.order_state("slow-1") == state
    sfc(capsys, "job", "submit", "wm", "--id", "slow-2", "--config", conf)
    host.wait_state("slow-2", "Running")
    rc, out, _ = sfc(capsys, "job", "abort", "slow-2", "--comment", "bad part", "--config",
                     conf, "--json")
    assert rc == 0 and json.loads(out) == {"ReturnStatus": 1, "JobOrderID": "slow-2"}
    end = time.monotonic() + 5
    while "bad part" not in (out := sfc(capsys, "job", "show", "slow-2", "--config", conf)[1]):
        assert time.monotonic() < end, out
    # Store only, RevokeStart is refused there, Cancel takes it away
    rc, _, err = sfc(capsys, "job", "submit", "wm", "--id", "kept", "--no-start",
                     "--config", conf)
    assert rc == 0, err
    rc, _, err = sfc(capsys, "job", "revoke", "kept", "--config", conf)
    assert rc == 1 and "INVALID_JOB_ORDER_STATUS: RevokeStart is not allowed" in err
    rc, out, err = sfc(capsys, "job", "cancel", "kept", "--config", conf)
    assert rc == 0 and out.strip() == "kept: Cancel accepted", err

    # refusals by the host: the status names and the message on one line, exit 1
    rc, out, err = sfc(capsys, "job", "pause", "slow-2", "--config", conf)
    assert rc == 1 and out == ""
    assert err.count("\n") == 1
    assert err.startswith("sfc-host: INVALID_JOB_ORDER_STATUS: Pause is not allowed in Aborted")
    # an unknown job is the user's mistake (exit 2, as in inspect)
    rc, out, err = sfc(capsys, "job", "show", "nope", "--config", conf, "--json")
    one_line_error(rc, err, "no job order 'nope'")
    for cmd in ("start", "pause", "resume", "stop", "abort", "clear", "cancel", "revoke"):
        rc, out, err = sfc(capsys, "job", cmd, "nope", "--config", conf)
        assert out == ""
        one_line_error(rc, err, "UNKNOWN_JOB_ORDER_ID")
    rc, _, err = sfc(capsys, "job", "submit", "no-such-wm", "--config", conf)
    assert rc == 1 and err.startswith("sfc-host: UNABLE_TO_ACCEPT_JOB_ORDER: Work Master")
    rc, _, err = sfc(capsys, "job", "submit", "wm", "--id", "slow-2", "-p", "x=1",
                     "--config", conf)
    assert rc == 0, err    # another order for an ended id replaces it (it is not live)
    rc, _, err = sfc(capsys, "job", "resume", "slow-1", "--config", conf)
    assert rc == 1 and "INVALID_JOB_ORDER_STATUS" in err


def test_workmaster_put_list_show_delete(host: HostThread, conf: str, tmp_path: Path,
                                        capsys) -> None:
    from sfc_host.execution.workmaster import example_files

    axle = next(p for p in example_files() if p.name == "axle_fit_qa.json")
    rc, out, err = sfc(capsys, "workmaster", "put", str(axle), "--config", conf)
    assert rc == 0 and out.strip() == f"Work Master axle_fit_qa stored in scope {host.scope}"
    rc, out, err = sfc(capsys, "workmaster", "put", str(axle), "--id", "axle2",
                       "--config", conf)
    assert rc == 0, err
    rc, out, _ = sfc(capsys, "workmaster", "list", "--config", conf)
    rows = rows_of(out)
    assert rows["axle_fit_qa"][1] == "v1.0.0" and "axle2" in rows and "wm" in rows
    rc, out, _ = sfc(capsys, "workmaster", "show", "axle2", "--config", conf)
    assert rc == 0 and json.loads(out)["ID"] == "axle2"
    rc, out, _ = sfc(capsys, "workmaster", "delete", "axle2", "--config", conf)
    assert rc == 0 and out.strip() == f"Work Master axle2 deleted from scope {host.scope}"
    rc, _, err = sfc(capsys, "workmaster", "show", "axle2", "--config", conf)
    one_line_error(rc, err, "no Work Master 'axle2'")
    # a Work Master that cannot run is refused by the host (exit 1); mistakes are exit 2
    bad = next(p for p in example_files() if p.name == "bad_two_initial.json")
    rc, _, err = sfc(capsys, "workmaster", "put", str(bad), "--config", conf)
    assert rc == 1 and err.startswith("sfc-host: INVALID_REQUEST: the Work Master cannot")
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({"data": {}, "dataschema": "1.1.0"}))
    rc, _, err = sfc(capsys, "workmaster", "put", str(bare), "--config", conf)
    one_line_error(rc, err, "has no ID")
    rc, _, err = sfc(capsys, "workmaster", "put", str(tmp_path / "none.json"),
                     "--config", conf)
    one_line_error(rc, err, "cannot read")


def test_a_work_master_stored_before_the_scope_kept_its_ids_is_listed(
        host: HostThread, conf: str, redis_url: str, capsys) -> None:
    """A Work Master written by a release that kept no set of a scope's ids (its key
    alone) is found once by its key, then listed from the set."""
    from sfc_host.store.keys import ScopeKeys

    k = ScopeKeys(host.scope)
    c = redis.Redis.from_url(redis_url)
    try:
        ids = {m.decode() for m in c.smembers(k.work_masters)}
        c.delete(k.work_masters)
        raw = c.get(k.work_master("wm"))
        assert raw is not None
        c.set(k.work_master("old*[1]"), raw.replace(b'"ID": "wm"', b'"ID": "old*[1]"'))
        rc, out, _ = sfc(capsys, "workmaster", "list", "--config", conf)
        assert rc == 0 and {"wm", "old*[1]"} <= set(rows_of(out)), out
        assert {m.decode() for m in c.smembers(k.work_masters)} == ids | {"old*[1]"}
    finally:
        c.close()


def test_mes_client_many_requests_at_once(host: HostThread, conf: str) -> None:
    from sfc_host.config import HostConfig
    from sfc_host.mes.client import MesClient, NoReply

    async def body() -> None:
        cfg = HostConfig.load(conf)
        async with MesClient(cfg) as mes:
            replies = await asyncio.gather(*(
                mes.submit(host.scope, {"JobOrderID": f"many-{i}",
                                        "WorkMasterID": [{"ID": "wm"}]}, start=False)
                for i in range(20)))
            assert all(r.ok for r in replies)
            r = await mes.by_state(host.scope, "NotAllowedToStart_Ready")
            assert {f"many-{i}" for i in range(20)} <= {
                x["JobOrderID"] for x in r.data["JobResponses"]}
            r = await mes.control(host.scope, "Cancel", "many-0")
            assert r.ok
            r = await mes.control(host.scope, "Cancel", "many-0")
            assert r.status_names == ["UNKNOWN_JOB_ORDER_ID"] and "many-0" in r.message
        cfg = HostConfig.load(conf, mes_prefix="nobody")
        async with MesClient(cfg, timeout_s=0.3) as mes:
            with pytest.raises(NoReply):
                await mes.by_id(host.scope, "many-1")
    host.call(body())


def test_job_user_mistakes_are_one_line_and_exit_2(host: HostThread, conf: str,
                                                    tmp_path: Path, capsys) -> None:
    rc, _, err = sfc(capsys, "job", "submit", "--config", conf)
    one_line_error(rc, err, "name a Work Master")
    rc, _, err = sfc(capsys, "job", "submit", "wm", "-p", "novalue", "--config", conf)
    one_line_error(rc, err, "--param 'novalue': expected NAME=VALUE")
    rc, _, err = sfc(capsys, "job", "submit", "--order", str(tmp_path / "none.json"),
                     "--config", conf)
    one_line_error(rc, err, "cannot read")
    rc, _, err = sfc(capsys, "job", "submit", "wm", "--id", "a{b}", "--config", conf)
    one_line_error(rc, err, "invalid job id")
    rc, _, err = sfc(capsys, "job", "pause", "x#1", "--config", conf)
    one_line_error(rc, err, "invalid job id")
    rc, _, err = sfc(capsys, "job", "list", "--state", "Sleeping", "--config", conf)
    one_line_error(rc, err, "unknown job order state 'Sleeping'")
    rc, _, err = sfc(capsys, "job", "show", "J1", "--config", conf, "--scope", "a/b")
    one_line_error(rc, err, "invalid scope")
    rc, _, err = sfc(capsys, "job", "show", "J1", "--config", conf, "--timeout", "-1")
    one_line_error(rc, err, "must be positive")
    rc, _, err = sfc(capsys, "job", "fly", "J1")
    one_line_error(rc, err, "invalid choice: 'fly'")
    # no scope given and none in the config
    bare = tmp_path / "bare.toml"
    bare.write_text(f'mqtt_url = "mqtt://127.0.0.1:{free_port()}"\n')
    rc, _, err = sfc(capsys, "job", "list", "--config", str(bare))
    one_line_error(rc, err, "--scope is required")
    # a bad setting, an unreachable broker, no host answering
    bad = tmp_path / "bad.toml"
    bad.write_text("mqtt_qos = 'high'\n")
    rc, _, err = sfc(capsys, "job", "list", "--config", str(bad), "--scope", "s")
    one_line_error(rc, err, "setting mqtt_qos")
    # a broker out of reach and no host answering are failures (exit 1), one line
    rc, _, err = sfc(capsys, "job", "list", "--config", str(bare), "--scope", "s")
    assert rc == 1 and err.count("\n") == 1 and "cannot reach the MQTT broker" in err
    silent = tmp_path / "silent.toml"
    silent.write_text(Path(conf).read_text().replace("[host]", '[host]\nmes_prefix = "nobody"'))
    rc, _, err = sfc(capsys, "job", "show", "J1", "--config", str(silent), "--timeout", "0.5")
    assert rc == 1 and err.count("\n") == 1 and "no reply from a host" in err
    assert "within 0.5 s" in err


def test_job_commands_in_structured_mode(host: HostThread, conf: str, capsys) -> None:
    f = Path(conf).parent / "structured.toml"
    f.write_text(Path(conf).read_text().replace("[host]", "[host]\nmqtt_binary = false"))
    rc, out, err = sfc(capsys, "job", "submit", "wm", "--id", "st-1", "--config", str(f))
    assert rc == 0, err
    assert out.startswith("st-1: StoreAndStart accepted")
    host.wait_state("st-1", "Ended_Completed")
    rc, _, err = sfc(capsys, "job", "resume", "st-1", "--config", str(f))
    assert rc == 1 and err.startswith("sfc-host: INVALID_JOB_ORDER_STATUS: Resume")


def test_job_commands_on_mqtt_311(make_redis: Any, mqtt_url: str, tmp_path: Path,
                                  capsys) -> None:
    # hosts and client on 3.1.1 (one config): structured events, replies on the shared
    # {mes}/{scope}/replies; a Redis and an MES prefix of their own, apart from `host`
    server = make_redis()
    settings = dict(mqtt_url=mqtt_url, mqtt_version=3, mes_prefix="mes311",
                    equipment_prefix="eq311", scopes=["v3"])
    lt = LoopThread()

    async def start() -> App:
        app = App(quick_config(server.url, **settings))
        await app.host.store.put_work_master("v3", work_master("tighten_rework", "wm"))
        return await app.start()

    app = lt.call(start())
    try:
        f = tmp_path / "v3.toml"
        f.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in settings.items()))
        rc, out, err = sfc(capsys, "job", "submit", "wm", "--id", "v3-1", "--no-start",
                           "--config", str(f))
        assert rc == 0, err
        assert out.startswith("v3-1: Store accepted (scope v3")
        rc, out, _ = sfc(capsys, "job", "list", "--config", str(f))
        assert rows_of(out)["v3-1"][1] == "NotAllowedToStart_Ready"
        rc, _, err = sfc(capsys, "job", "pause", "v3-1", "--config", str(f))
        assert rc == 1 and err.startswith("sfc-host: INVALID_JOB_ORDER_STATUS: Pause")
    finally:
        lt.call(app.aclose())
        lt.stop()


def test_job_errors_in_a_real_process_have_no_traceback(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "sfc_host", "job", "list", "--scope", "s",
                        "--mqtt", f"mqtt://127.0.0.1:{free_port()}"],
                       capture_output=True, text=True, timeout=30,
                       env={**os.environ, "SFC_MES_PREFIX": "mes"})
    assert r.returncode == 1 and r.stdout == ""    # a server out of reach: failed
    assert r.stderr.count("\n") == 1 and "cannot reach the MQTT broker" in r.stderr


# ---- inspect


def test_inspect_running_held_and_ended(host: HostThread, conf: str, capsys) -> None:
    sfc(capsys, "job", "submit", "wm", "--id", "slow-3", "--config", conf)
    host.wait_open("slow-3", "tighten")
    host.wait_state("slow-3", "Running")
    rc, out, err = sfc(capsys, "inspect", "slow-3", "--config", conf)
    assert rc == 0, err
    fields = {ln[:15].strip(): ln[15:].strip() for ln in out.splitlines()[1:]
              if ln[:1] != " " and not ln.startswith("open")}
    assert out.splitlines()[0].startswith(f"job slow-3 in scope {host.scope} (server time 20")
    assert fields["status"] == "running" and fields["order state"].startswith("Running")
    assert fields["active steps"] == "Tighten" and fields["held"] == "no"
    assert fields["next deadline"].endswith(" s)") and "(in " in fields["next deadline"]
    assert fields["settled"] == "load_part completed"
    row = rows_of("\n".join(ln.strip() for ln in out.split("open actions:\n")[1].splitlines()
                            if ln.startswith("  ")))["tighten"]
    assert row[1:5] == ["Tighten", "open", "1", "1"]
    assert row[5] == "slow-3:tighten#2"
    assert "in" in row and row[-1] == "-"          # due in some seconds; no hold

    rc, out, _ = sfc(capsys, "inspect", "slow-3", "--config", conf, "--json")
    v = json.loads(out)
    t = v["state"]["actions"]["tighten"]
    assert v["status"] == "running" and v["state"]["open_actions"] == ["tighten"]
    assert 0 < t["deadline_in_s"] <= 30 and t["deadline_ms"] == v["due_ms"]
    assert v["markers"]["tighten"].endswith(":slow-3:tighten#2")

    # paused: held since the hold, the command still open (its deadline waits)
    assert sfc(capsys, "job", "pause", "slow-3", "--config", conf)[0] == 0
    end = time.monotonic() + 10
    while (v := json.loads(sfc(capsys, "inspect", "slow-3", "--config", conf, "--json")[1])
           )["status"] != "held":
        assert time.monotonic() < end
        time.sleep(0.05)
    assert v["order_state"] == "Interrupted_Suspended" and v["state"]["held_ms"] > 0
    rc, out, _ = sfc(capsys, "inspect", "slow-3", "--config", conf)
    assert "status         held" in out and "held           since 20" in out

    # ended: aborted with the reason; no open actions, no deadline
    sfc(capsys, "job", "abort", "slow-3", "--comment", "scrap", "--config", conf)
    end = time.monotonic() + 10
    while (v := json.loads(sfc(capsys, "inspect", "slow-3", "--config", conf, "--json")[1])
           )["status"] == "held":
        assert time.monotonic() < end
        time.sleep(0.05)
    assert v["order_state"] == "Aborted" and v["status"] == "aborted"
    rc, out, _ = sfc(capsys, "inspect", "slow-3", "--config", conf)
    assert "open actions:  none" in out and "reason         scrap" in out
    assert "next deadline  -" in out

    # stored, not started: the order only
    sfc(capsys, "job", "submit", "wm", "--id", "stored-1", "--no-start", "--config", conf)
    rc, out, _ = sfc(capsys, "inspect", "stored-1", "--config", conf)
    assert rc == 0 and "status         not started" in out
    assert "order state    NotAllowedToStart_Ready" in out


def test_inspect_shows_equipment_hold_ids(host: HostThread, conf: str, capsys) -> None:
    sfc(capsys, "job", "submit", "paint", "--id", "paint-1", "--config", conf)
    host.wait_open("paint-1", "paint")
    assert sfc(capsys, "job", "pause", "paint-1", "--config", conf)[0] == 0
    end = time.monotonic() + 10
    while (v := json.loads(sfc(capsys, "inspect", "paint-1", "--config", conf, "--json")[1])
           )["state"]["actions"]["paint"].get("hold") != "held":
        assert time.monotonic() < end, v["state"]["actions"]["paint"]
        time.sleep(0.05)
    paint = v["state"]["actions"]["paint"]
    assert paint["hold_command_id"] == f"{paint['command_id']}:hold"
    out = sfc(capsys, "inspect", "paint-1", "--config", conf)[1]
    rows = rows_of("\n".join(ln.strip() for ln in out.split("open actions:\n")[1].splitlines()
                             if ln.startswith("  ")))
    assert rows["paint"][5] == paint["command_id"]
    assert rows["paint"][-2:] == ["held", paint["hold_command_id"]]
    # held work has no deadline (only a restart gets it going); it went out before
    assert rows["paint"][6:9] == ["-", "-", "yes"]
    # the pull event it waits for has no command; its deadline stands still while held
    assert rows["booth_ready"][2] == "open" and rows["booth_ready"][5] == "-"
    assert " ".join(rows["booth_ready"][7:12]).endswith("s left at release")
    sfc(capsys, "job", "abort", "paint-1", "--config", conf)


def test_inspect_and_top_on_redis_cluster(redis_cluster: RedisClusterServer, tmp_path: Path,
                                         capsys) -> None:
    scope = f"opc-{uuid.uuid4().hex[:8]}"
    station = Station(lambda c: False if c.action == "tighten" else None)
    lt = LoopThread()

    async def start() -> Host:
        h = Host(quick_config(redis_cluster.url, redis_cluster=True, scopes=[scope]),
                 station.sink)
        station.attach(h)
        await h.start()
        await h.store.put_work_master(scope, work_master("tighten_rework", "wm"))
        await h.orders.store_order(scope, {"JobOrderID": "C1",
                                           "WorkMasterID": [{"ID": "wm"}]}, start=True)
        return h

    h = lt.call(start())
    try:
        end = time.monotonic() + 15
        while "C1:tighten#2" not in station.ids():
            assert time.monotonic() < end
            time.sleep(0.02)
        conf = tmp_path / "cluster.toml"
        conf.write_text(f'redis_url = "{redis_cluster.url}"\nredis_cluster = true\n')
        end = time.monotonic() + 10
        while True:     # the order goes Running through a work entry of its own
            rc, out, err = sfc(capsys, "inspect", "C1", "--config", str(conf), "--scope", scope)
            if "order state    Running" in out or time.monotonic() > end:
                break
            time.sleep(0.05)
        assert rc == 0, err
        assert "status         running" in out and "order state    Running" in out
        assert "C1:tighten#2" in out
        rc, out, err = sfc(capsys, "top", "--once", "--config", str(conf), "--scope", scope)
        assert rc == 0, err
        row = out.splitlines()[3].split()
        assert row[0] == scope and row[3] == "1" and row[7] == "1"    # running, active
    finally:
        lt.call(h.aclose())
        lt.stop()


def test_inspect_user_mistakes(host: HostThread, conf: str, capsys) -> None:
    rc, _, err = sfc(capsys, "inspect", "ghost", "--config", conf)
    one_line_error(rc, err, f"no job 'ghost' in scope '{host.scope}'")
    rc, _, err = sfc(capsys, "inspect", "a}b", "--config", conf)
    one_line_error(rc, err, "invalid job id")
    port = free_port()
    rc, _, err = sfc(capsys, "inspect", "J1", "--config", conf, "--redis",
                     f"redis://:hunter2@127.0.0.1:{port}/0")
    # a server out of reach is a failure (1), not the user's mistake; one line still
    assert rc == 1 and err.count("\n") == 1, err
    assert err.startswith(f"sfc-host: error: cannot reach Redis at redis://127.0.0.1:{port}/0: ")
    assert "hunter2" not in err
    rc, _, err = sfc(capsys, "inspect", "--config", conf)
    one_line_error(rc, err, "the following arguments are required: JOB")


# ---- top


def test_top_once_frames_and_json(host: HostThread, conf: str, redis_url: str,
                                  capsys) -> None:
    for i in range(3):
        sfc(capsys, "job", "submit", "wm", "--id", f"top-{i}", "--config", conf)
    sfc(capsys, "job", "submit", "wm", "--id", "slow-top", "--config", conf)
    host.wait_state("top-2", "Ended_Completed")
    host.wait_state("slow-top", "Running")
    sfc(capsys, "job", "pause", "slow-top", "--config", conf)
    c = redis.Redis.from_url(redis_url)
    index = {k.decode(): v.decode() for k, v in
             c.hgetall(f"sfc:{{{host.scope}}}:state-index").items()}
    c.close()
    by = {top: sum(1 for s in index.values() if s.split("_")[0] == top)
          for top in ("NotAllowedToStart", "Running", "Interrupted", "Ended", "Aborted")}

    rc, out, err = sfc(capsys, "top", "--once", "--config", conf, "--scope", host.scope)
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("sfc-host top  20") and "1 scope  group sfc-host" in lines[0]
    head = lines[2].split()
    assert head[:7] == ["SCOPE", "STORED", "READY", "RUNNING", "HELD", "ENDED", "ABORTED"]
    row = lines[3].split()
    assert row[0] == host.scope
    assert [int(x) for x in (row[1], row[3], row[4], row[5], row[6])] == [
        by["NotAllowedToStart"], by["Running"], by["Interrupted"], by["Ended"], by["Aborted"]]
    assert by["Interrupted"] == 1 and by["Ended"] >= 3
    assert row[-3:] == ["-", "-", "-"]          # no rates from one frame
    assert lines[-1].startswith(f"host metrics http://127.0.0.1:{host.metrics_port}/metrics: "
                                "commands sent ")

    # two frames with completions in between: the second has rates
    def finish_more() -> None:
        time.sleep(0.3)
        for i in range(3, 6):   # straight to the host: this thread's output is not ours
            host.call(host.app.host.orders.store_order(
                host.scope, {"JobOrderID": f"top-{i}", "WorkMasterID": [{"ID": "wm"}]}, start=True))
    t = threading.Thread(target=finish_more)
    t.start()
    rc, out, _ = sfc(capsys, "top", "--frames", "2", "--interval", "1.5", "--config", conf,
                     "--scope", host.scope, "--json")
    t.join()
    first, second = (json.loads(x) for x in out.splitlines())
    s1, s2 = first["scopes"][0], second["scopes"][0]
    assert s1["rates"]["completed"] is None
    assert s2["completed"] > s1["completed"] and s2["rates"]["completed"] > 0
    assert s2["rates"]["order_changes"] > 0 and s2["rates"]["entries"] > 0
    assert second["metrics"]["counters"]["commands_sent"] > 0
    assert second["metrics"]["rates"]["commands_sent"] > 0

    # every known scope by default
    rc, out, _ = sfc(capsys, "top", "--once", "--config", conf)
    assert host.scope in rows_of("\n".join(out.splitlines()[2:]).split("\n\n")[0])


def test_top_live_on_a_terminal_until_ctrl_c(host: HostThread, conf: str) -> None:
    # a terminal gets each frame drawn in place (home, clear); Ctrl-C ends it with 0
    import pty
    import signal

    leader, follower = pty.openpty()
    p = subprocess.Popen([sys.executable, "-m", "sfc_host", "top", "--config", conf,
                          "--scope", host.scope, "--interval", "0.2"],
                         stdin=subprocess.DEVNULL, stdout=follower, stderr=subprocess.PIPE,
                         text=True)
    os.close(follower)
    seen = b""
    try:
        end = time.monotonic() + 20
        # four frame starts: the first three frames are then whole (a read may end mid-frame)
        while seen.count(b"\x1b[H\x1b[2J") < 4 and time.monotonic() < end:
            seen += os.read(leader, 65536)
        p.send_signal(signal.SIGINT)
        assert p.wait(15) == 0
        assert p.stderr is not None and p.stderr.read() == ""
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        os.close(leader)
    frames = seen.decode().split("\x1b[H\x1b[2J")[1:-1]
    assert len(frames) >= 3 and all(f.startswith("sfc-host top  20") for f in frames)
    assert all(host.scope in f for f in frames)


def test_top_user_mistakes(host: HostThread, conf: str, capsys) -> None:
    rc, _, err = sfc(capsys, "top", "--once", "--config", conf, "--scope", "bad/scope")
    one_line_error(rc, err, "invalid scope")
    rc, _, err = sfc(capsys, "top", "--frames", "-1", "--config", conf)
    one_line_error(rc, err, "--frames must not be negative")
    rc, _, err = sfc(capsys, "top", "--interval", "0", "--config", conf)
    one_line_error(rc, err, "must be positive")
    rc, _, err = sfc(capsys, "top", "--once", "--config", conf, "--redis",
                     f"redis://127.0.0.1:{free_port()}/0")
    assert rc == 1 and err.count("\n") == 1 and "cannot reach Redis at" in err, err
    rc, _, err = sfc(capsys, "top", "--once", "--config", conf, "--width", "0")
    one_line_error(rc, err, "must be positive")
    # an unreachable metrics endpoint is shown, not fatal; reachable ones add up
    port = free_port()
    good = f"http://127.0.0.1:{host.metrics_port}/metrics"
    rc, out, _ = sfc(capsys, "top", "--once", "--config", conf, "--scope", host.scope,
                     "--metrics", f"http://127.0.0.1:{port}/metrics")
    assert rc == 0 and f"host metrics http://127.0.0.1:{port}/metrics: unreachable" in out
    rc, out, _ = sfc(capsys, "top", "--once", "--config", conf, "--scope", host.scope,
                     "--metrics", good, "--metrics", good, "--json")
    m = json.loads(out)["metrics"]
    assert m["hosts"] == [good, good] and m["errors"] == {}
    rc, out, _ = sfc(capsys, "top", "--once", "--config", conf, "--scope", host.scope,
                     "--metrics", good, "--metrics", "ftp://x/metrics")
    assert "host metrics 2 hosts" not in out and f"host metrics {good}: commands sent" in out
    assert "host metrics ftp://x/metrics: unusable URL" in out
