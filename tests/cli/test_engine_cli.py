"""sfc-host engine build|start|stop|status and missions list."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

from helpers.cli import cli

SCRIPT = """\
    import asyncio
    from sfc_host.engine import Variable, mission, task

    beats = Variable("beats", 0)

    @task(interval=0.05)
    async def heartbeat(api):
        beats.set(beats.get() + 1)

    @mission
    async def load(api, parts=1):
        for i in range(parts):
            api.score += 1
            api.log.info(f"part {i}")
            yield i

    @mission
    async def idle_loop(api):
        while True:
            await asyncio.sleep(0.01)
            yield
"""


def scripts(tmp_path: Path, text: str = SCRIPT) -> Path:
    d = tmp_path / "scripts"
    d.mkdir(exist_ok=True)
    (d / "cell.py").write_text(textwrap.dedent(text))
    return d


def test_build_lists_tasks_missions_and_variables(tmp_path: Path, capsys) -> None:
    d = scripts(tmp_path)
    rc, out, _ = cli(capsys, "engine", "build", "--scripts", str(d))
    assert rc == 0
    assert out.splitlines() == [
        f"{d}: Ready, 1 tasks, 2 missions, 1 variables",
        "  task heartbeat: every 0.05 s, auto start",
        "  mission load(parts)",
        "  mission idle_loop()",
        "  variable beats = 0",
    ]
    rc, out, _ = cli(capsys, "engine", "build", "--scripts", str(d), "--json")
    doc = json.loads(out)
    assert rc == 0 and doc["state"] == "Ready" and doc["missions"]["load"] == ["parts"]


def test_build_errors_are_file_and_line(tmp_path: Path, capsys) -> None:
    d = scripts(tmp_path, "x = 1\ny = (\n")
    rc, out, err = cli(capsys, "engine", "build", "--scripts", str(d))
    assert rc == 1
    assert out.splitlines()[0] == f"{d}: BuildError, 1 problem"
    assert out.splitlines()[1].startswith(f"{d / 'cell.py'}:2: syntax error")
    rc, _, err = cli(capsys, "engine", "build", "--scripts", str(tmp_path / "missing"))
    assert rc == 2 and err.strip() == (f"sfc-host: error: scripts folder "
                                       f"{tmp_path / 'missing'} does not exist")
    assert "Traceback" not in err


def test_status_and_stop_without_an_engine(tmp_path: Path, capsys) -> None:
    # naming a folder no engine has run on, or none at all, is the user's mistake
    d = scripts(tmp_path)
    for cmd in ("status", "stop"):
        rc, out, err = cli(capsys, "engine", cmd, "--scripts", str(d))
        assert rc == 2 and out == "" and err.count("\n") == 1 and "no engine has run on" in err
        rc, out, err = cli(capsys, "engine", cmd, "--scripts", str(tmp_path / "missing"))
        assert rc == 2 and out == "" and err == (f"sfc-host: error: scripts folder "
                                                 f"{tmp_path / 'missing'} does not exist\n")


def test_start_checks_missions_before_it_starts(tmp_path: Path, capsys) -> None:
    d = scripts(tmp_path)
    for spec, words in [("nope", "--mission nope: no such mission in"),
                        ('load={"zzz": 1}', "--mission load: mission load(parts): got an "
                         "unexpected keyword argument 'zzz'"),
                        ("load={bad", "--mission load={bad: arguments are not JSON"),
                        ("load=[1]", "arguments must be a JSON object")]:
        rc, out, err = cli(capsys, "engine", "start", "--scripts", str(d), "--no-redis",
                           "--mission", spec, "--for", "5")
        assert rc == 2 and out == "" and err.count("\n") == 1 and words in err, (spec, err)
        assert "Traceback" not in err
    rc, _, err = cli(capsys, "engine", "start", "--scripts", str(d), "--no-redis", "--for", "0")
    assert rc == 2 and "must be positive" in err


def test_start_refuses_an_unreachable_redis_in_one_line(tmp_path: Path, capsys) -> None:
    d = scripts(tmp_path)
    rc, _, err = cli(capsys, "engine", "start", "--scripts", str(d), "--redis",
                     "redis://127.0.0.1:1/0", "--for", "0.1")
    assert rc == 1      # a server out of reach is a failure, not the user's mistake
    assert err.startswith("sfc-host: error: cannot reach Redis at redis://127.0.0.1:1/0")
    assert len(err.strip().splitlines()) == 1


def test_a_bad_redis_url_or_config_is_one_line(tmp_path: Path, capsys) -> None:
    d = scripts(tmp_path)
    bad_toml = tmp_path / "bad.toml"
    bad_toml.write_text("redis_url = [\n")
    cases = [
        (["engine", "start", "--scripts", str(d), "--redis", "nope", "--for", "0.1"],
         "--redis nope: Redis URL must specify"),
        (["engine", "start", "--scripts", str(d), "--redis", "http://u:secret@h/0",
          "--for", "0.1"], "Redis URL must specify"),
        (["missions", "list", "--redis", "nope"], "redis_url"),
        (["missions", "list", "--config", str(bad_toml)], "is not valid TOML"),
        (["missions", "list", "--config", str(tmp_path / "nope.toml")], "cannot read"),
        (["missions", "list", "--state", "Sleeping"], "invalid choice: 'Sleeping'"),
    ]
    for argv, words in cases:
        rc, out, err = cli(capsys, *argv)
        assert rc == 2 and out == "", (argv, err)
        assert len(err.strip().splitlines()) == 1 and words in err, (argv, err)
        assert "Traceback" not in err and "secret" not in err
    rc, out, err = cli(capsys, "missions", "list", "--redis", "redis://u:secret@127.0.0.1:1/0")
    assert rc == 1 and out == "" and err.count("\n") == 1 and "secret" not in err
    assert "cannot reach Redis at redis://u:***@127.0.0.1:1/0" in err


def test_start_status_stop_and_missions_list(tmp_path: Path, capsys, redis_url: str) -> None:
    d = scripts(tmp_path)
    prefix_env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "sfc_host", "engine", "start", "--scripts", str(d),
         "--redis", redis_url, "--mission", 'load={"parts": 3}', "--mission", "idle_loop"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=prefix_env)
    try:
        deadline = time.monotonic() + 20
        status: dict = {}
        while time.monotonic() < deadline:
            rc, out, _ = cli(capsys, "engine", "status", "--scripts", str(d), "--json")
            if rc == 0:
                status = json.loads(out)
                if status["running"] and status["missions_ended"] >= 1 \
                        and status["tasks"][0]["runs"] >= 2:
                    break
            time.sleep(0.1)
        assert status.get("state") == "Running", status
        assert status["pid"] == proc.pid
        rc, out, _ = cli(capsys, "engine", "status", "--scripts", str(d))
        assert rc == 0 and out.startswith(f"engine Running (running, pid {proc.pid};")
        assert "task heartbeat" in out and "mission idle_loop-" in out
        rc, out, _ = cli(capsys, "engine", "stop", "--scripts", str(d))
        assert rc == 0 and out.strip() == f"engine on {d} stopped (state Ready)"
        stdout, stderr = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr
    assert "engine Running: 1 tasks, 2 missions" in stdout
    assert "engine Ready: stopped, 2 mission instances ended" in stdout
    rc, out, _ = cli(capsys, "engine", "status", "--scripts", str(d))
    assert out.startswith("engine Ready (not running;")

    rc, out, _ = cli(capsys, "missions", "list", "--redis", redis_url, "--json",
                     "--name", "load")
    records = json.loads(out)
    assert rc == 0 and len(records) >= 1
    load = records[0]
    assert load["state"] == "Completed" and load["score"] == 3 and load["args"] == {"parts": 3}
    assert [x["msg"] for x in load["log"]] == ["part 0", "part 1", "part 2"]
    rc, out, _ = cli(capsys, "missions", "list", "--redis", redis_url, "--state", "Canceled")
    assert rc == 0
    assert out.splitlines()[0].split() == ["ID", "MISSION", "STATE", "SCORE", "STEPS",
                                           "DURATION", "ENDED", "ERROR"]
    assert any(line.startswith("idle_loop-") and " Canceled " in line
               for line in out.splitlines())
    rc, out, _ = cli(capsys, "missions", "list", "--redis", redis_url, "--name",
                     f"none-{uuid.uuid4().hex[:6]}")
    assert out.strip() == "0 mission records"


def test_missions_list_reads_a_cluster_hosts_records(tmp_path: Path, capsys,
                                                     redis_cluster) -> None:
    """A host on a cluster writes under ``{sfc:engine}:``; ``--cluster`` or a config with
    ``redis_cluster = true`` reads them there."""
    import asyncio

    from redis.asyncio.cluster import RedisCluster

    from sfc_host.engine.missions import RedisMissionStore, mission_prefix

    name = f"clustered-{uuid.uuid4().hex[:6]}"
    rid = f"{name}-1"

    async def save() -> None:
        store = RedisMissionStore(RedisCluster.from_url(redis_cluster.url),
                                  prefix=mission_prefix(True))
        try:
            await store.save({"id": rid, "name": name, "state": "Completed", "score": 2,
                              "steps": 1, "ended_at": int(time.time() * 1000), "log": []})
        finally:
            await store.close()

    asyncio.run(save())
    rc, out, err = cli(capsys, "missions", "list", "--redis", redis_cluster.url, "--cluster",
                       "--name", name, "--json")
    assert rc == 0, err
    assert [r["id"] for r in json.loads(out)] == [rid]
    conf = tmp_path / "host.toml"
    conf.write_text(f'[host]\nredis_url = "{redis_cluster.url}"\nredis_cluster = true\n')
    rc, out, err = cli(capsys, "missions", "list", "--config", str(conf), "--name", name)
    assert rc == 0, err
    assert out.splitlines()[0].startswith("ID  ")
    assert out.splitlines()[1].startswith(rid) and out.strip().endswith("1 mission record")
    rc, _, err = cli(capsys, "missions", "list", "--config", str(tmp_path / "nope.toml"))
    assert rc == 2 and "cannot read" in err and len(err.strip().splitlines()) == 1
