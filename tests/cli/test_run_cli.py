"""``sfc-host run``: serves until SIGTERM; wrong settings and unreachable servers are
one line and a non-zero exit; ``--check`` prints only its findings; the commented
missions example of deploy/host.toml passes the check as written."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from helpers.servers import free_port

SFC = [sys.executable, "-m", "sfc_host"]
REPO = Path(__file__).resolve().parents[2]
HOST_TOML = REPO / "deploy" / "host.toml"
STATION = REPO / "src" / "sfc_host" / "examples" / "station_mission.py"


def _run(args: list[str], env: dict[str, str] | None = None, timeout: float = 30
         ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(SFC + args, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def test_a_wrong_setting_is_one_line_and_exit_2(tmp_path: Path) -> None:
    r = _run(["run"], env={"SFC_READ_COUNT": "lots"})
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0
    assert "SFC_READ_COUNT" in r.stderr and "Traceback" not in r.stderr
    bad = tmp_path / "host.toml"
    bad.write_text("nonsense = 1\n")
    r = _run(["run", "--config", str(bad)])
    assert r.returncode == 2 and "unknown setting 'nonsense'" in r.stderr
    r = _run(["run", "--config", str(tmp_path / "missing.toml")])
    assert r.returncode == 2 and "cannot read" in r.stderr
    bad.write_text("[host\nread_count = 1\n")
    r = _run(["run", "--config", str(bad)])
    assert r.returncode == 2 and "is not valid TOML" in r.stderr
    for flag, url, words in (("--redis", "nope", "setting redis_url: 'nope': use redis:"),
                             ("--mqtt", "http://h:1", "use mqtt://host:port")):
        r = _run(["run", flag, url])
        assert r.returncode == 2 and words in r.stderr, r.stderr
        assert r.stderr.strip().count("\n") == 0 and "Traceback" not in r.stderr


def test_unreachable_redis_is_one_line_and_exit_1(mqtt_url: str) -> None:
    r = _run(["run", "--redis", f"redis://127.0.0.1:{free_port()}/0", "--mqtt", mqtt_url])
    assert r.returncode == 1, r.stderr
    assert "cannot reach Redis" in r.stderr and "Traceback" not in r.stderr


def test_run_serves_until_sigterm(redis_url: str, mqtt_url: str, tmp_path: Path) -> None:
    # the file names a consumer and a wrong Redis; SFC_CONSUMER and --redis win over it
    conf = tmp_path / "host.toml"
    conf.write_text(f'[host]\nredis_url = "redis://127.0.0.1:{free_port()}/0"\n'
                    f'mqtt_url = "{mqtt_url}"\nconsumer = "from-the-file"\n')
    p = subprocess.Popen([*SFC, "run", "--config", str(conf), "--scope", "cli1",
                          "--redis", redis_url], stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "SFC_CONSUMER": "cli-test"})
    try:
        assert p.stderr is not None
        deadline = time.monotonic() + 20
        line = ""
        while time.monotonic() < deadline:
            line = p.stderr.readline()
            # other lines say "running" too (recovery counts a shared Redis's running jobs)
            if "host cli-test running" in line or not line:
                break
        assert "host cli-test running" in line, line
        p.send_signal(signal.SIGTERM)
        assert p.wait(15) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def _config(tmp_path: Path, redis_url: str, mqtt_url: str, **extra: str) -> Path:
    conf = tmp_path / "host.toml"
    lines = [f'redis_url = "{redis_url}"', f'mqtt_url = "{mqtt_url}"',
             *(f"{k} = {v}" for k, v in extra.items())]
    conf.write_text("[host]\n" + "\n".join(lines) + "\n")
    return conf


def test_scripts_that_do_not_build_are_one_line_and_exit_2(
        redis_url: str, mqtt_url: str, tmp_path: Path) -> None:
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "broken.py").write_text("def oops(:\n")
    conf = _config(tmp_path, redis_url, mqtt_url, scripts_dir=f'"{scripts}"')
    r = _run(["run", "--config", str(conf)])
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    errors = [ln for ln in r.stderr.splitlines() if "error:" in ln]
    assert len(errors) == 1 and "scripts do not build" in errors[0] and "broken.py" in errors[0]


def test_an_unknown_mission_is_one_line_and_exit_2(
        redis_url: str, mqtt_url: str, tmp_path: Path) -> None:
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "ok.py").write_text(
        "from sfc_host.engine import mission\n\n"
        "@mission\nasync def known(api):\n    yield\n")
    conf = _config(tmp_path, redis_url, mqtt_url, scripts_dir=f'"{scripts}"',
                   missions='["nosuch"]')
    r = _run(["run", "--config", str(conf)])
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    errors = [ln for ln in r.stderr.splitlines() if "error:" in ln]
    assert len(errors) == 1 and "no mission 'nosuch'" in errors[0] and "known" in errors[0]


# a Task and a Mission: the engine's build logs its state changes at INFO
ENGINE_SCRIPT = """\
from sfc_host.engine import mission, task


@task(interval=1.0)
async def beat(api):
    api.log.info("beat")


@mission
async def load(api, scope, parts=1):
    api.log.info(f"loading {parts} parts in {scope}")
    yield
"""


def test_check_prints_only_its_findings(redis_url: str, mqtt_url: str, tmp_path: Path) -> None:
    """With scripts to build and log_level DEBUG (every log line the host writes), the
    check still says only what it found: the summary, or the problem's one line."""
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "cell.py").write_text(ENGINE_SCRIPT)
    conf = _config(tmp_path, redis_url, mqtt_url, scripts_dir=f'"{scripts}"',
                   missions="""['load={"scope": "line1", "parts": 2}']""",
                   log_level='"DEBUG"')
    r = _run(["run", "--check", "--config", str(conf)])
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stderr == ""
    assert r.stdout == ("settings ok; scripts build: 1 tasks, 1 missions; "
                        "1 missions to start\n")
    r = _run(["run", "--check", "--connect", "--config", str(conf)])
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stderr == ""
    lines = r.stdout.splitlines()
    assert len(lines) == 2 and lines[0].startswith("settings ok; scripts build:"), r.stdout
    assert lines[1].startswith("Redis at redis://") and lines[1].endswith("reachable")
    # a problem: one line on stderr, nothing on stdout
    conf = _config(tmp_path, redis_url, mqtt_url, scripts_dir=f'"{scripts}"',
                   missions='["load"]', log_level='"DEBUG"')
    r = _run(["run", "--check", "--config", str(conf)])
    assert r.returncode == 2 and r.stdout == "", r.stdout + r.stderr
    assert r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("sfc-host: error: setting missions: 'load': ")
    assert "missing a required argument: 'scope'" in r.stderr


def _uncommented_example(text: str, scripts: Path) -> str:
    """deploy/host.toml with its commented scripts_dir and missions example put in
    place of the two settings, as its comment says; the scripts folder is this test's."""
    found = {}
    for name in ("scripts_dir", "missions"):
        examples = re.findall(rf"^# ({name} = .*)$", text, re.M)
        assert len(examples) == 1, f"one commented {name} example in {HOST_TOML}: {examples}"
        found[name] = examples[0]
        default = re.findall(rf"^{name} = .*$", text, re.M)
        assert len(default) == 1, default
        text = text.replace(default[0] + "\n", "", 1)
    folder = re.fullmatch(r'scripts_dir = "(.+)"', found["scripts_dir"])
    assert folder, found["scripts_dir"]
    example = found["scripts_dir"].replace(folder.group(1), str(scripts))
    return f"{text}\n{example}\n{found['missions']}\n"


def test_the_missions_example_of_host_toml_passes_the_check(tmp_path: Path) -> None:
    """The example, uncommented, with the example station script in the folder it
    names, is what `sfc-host run --check` accepts (so it cannot rot unseen)."""
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    shutil.copy(STATION, scripts / "station_mission.py")
    text = HOST_TOML.read_text()
    conf = tmp_path / "host.toml"
    conf.write_text(_uncommented_example(text, scripts))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SFC_")}
    r = subprocess.run([*SFC, "run", "--check", "--config", str(conf)], capture_output=True,
                       text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stderr == ""
    m = re.fullmatch(r"settings ok; scripts build: 0 tasks, 1 missions; (\d+) missions to "
                     r"start\n", r.stdout)
    assert m and int(m.group(1)) >= 1, r.stdout
    # as shipped it is commented out: the settings keep their defaults
    assert re.search(r'^scripts_dir = ""$', text, re.M)
