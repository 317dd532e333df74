"""Exit codes of ``sfc-host``, table-driven, each run as an operator runs it (a process of
its own): 0 done, 1 refused or failed (a refused recipe, a server out of reach), 2 a user
mistake. An error is one line on stderr and never a traceback. No server is needed: the
servers "out of reach" are ports nothing listens on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from helpers.recipes import linear, reference_recipes_dir

from sfc_host.demo.servers import free_port

OK, FAILED, MISTAKE = 0, 1, 2

SCRIPT = """\
    from sfc_host.engine import mission

    @mission
    async def load(api, parts=1):
        yield parts
"""


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """What the command lines name: files and folders that are (or are not) there, and
    servers nothing answers on."""
    d = tmp_path_factory.mktemp("exit-codes")
    bare = d / "bare.json"
    bare.write_text(json.dumps(linear(3)))
    scripts = d / "scripts"
    scripts.mkdir()
    (scripts / "cell.py").write_text(textwrap.dedent(SCRIPT))
    broken = d / "broken"
    broken.mkdir()
    (broken / "cell.py").write_text("x = (\n")
    bad_toml = d / "bad.toml"
    bad_toml.write_text("redis_url = [\n")
    dead = f"redis://127.0.0.1:{free_port()}/0"
    no_broker = f"mqtt://127.0.0.1:{free_port()}"
    order = d / "order.json"
    order.write_text(json.dumps({"JobOrder": {"JobOrderID": "J9",
                                              "WorkMasterID": "wm"}}))
    cluster = d / "cluster.toml"
    cluster.write_text(f'redis_url = "{dead}"\nredis_cluster = true\n')
    ref = reference_recipes_dir()
    return {"good": str(ref / "axle_fit_qa.json"), "bad": str(ref / "bad_two_initial.json"),
            "bare": str(bare), "dir": str(d), "missing": str(d / "missing.json"),
            "scripts": str(scripts), "broken": str(broken), "bad_toml": str(bad_toml),
            "cluster": str(cluster), "dead": dead, "no_broker": no_broker,
            "order": str(order)}


# (id, argv, exit code, a piece of the error line; None: no error line expected)
CASES: list[tuple[str, list[str], int, str | None]] = [
    # what every command shares: the parser
    ("no-command", [], MISTAKE, "required: COMMAND"),
    ("unknown-command", ["fly"], MISTAKE, "invalid choice: 'fly'"),
    ("unknown-recipe-action", ["recipe", "draw"], MISTAKE, "invalid choice: 'draw'"),
    ("unknown-flag", ["recipe", "check", "--wrong-flag", "{good}"], MISTAKE,
     "unrecognized arguments: --wrong-flag"),
    ("version-unknown-flag", ["version", "--all"], MISTAKE, "unrecognized arguments"),
    ("job-unknown-action", ["job", "fly", "J1"], MISTAKE, "invalid choice: 'fly'"),
    ("engine-unknown-action", ["engine", "run"], MISTAKE, "invalid choice: 'run'"),
    ("missions-no-action", ["missions"], MISTAKE, "required: ACTION"),
    # recipes
    ("check-no-file", ["recipe", "check"], MISTAKE, "required: FILE"),
    ("check-unknown-file", ["recipe", "check", "{missing}"], MISTAKE, "cannot read"),
    ("check-folder", ["recipe", "check", "{dir}"], MISTAKE, "is a folder"),
    ("check-bad-dataschema", ["recipe", "check", "--dataschema", "9.9.9", "{bare}"], MISTAKE,
     "--dataschema '9.9.9'"),
    ("check-bare-needs-dataschema", ["recipe", "check", "{bare}"], MISTAKE, "--dataschema"),
    ("check-refused", ["recipe", "check", "{bad}"], FAILED, None),
    ("check-unknown-file-among-good", ["recipe", "check", "{good}", "{missing}", "{good}"],
     MISTAKE, "cannot read"),
    ("diagram-unknown-file", ["recipe", "diagram", "{missing}"], MISTAKE, "cannot read"),
    ("diagram-folder", ["recipe", "diagram", "{dir}"], MISTAKE, "is a folder"),
    ("diagram-bad-dataschema", ["recipe", "diagram", "--dataschema", "9.9.9", "{bare}"],
     MISTAKE, "unknown dataschema"),
    ("diagram-unwritable", ["recipe", "diagram", "{good}", "--svg", "{missing}/x.svg"],
     MISTAKE, "cannot write"),
    ("diagram-job-unreachable", ["recipe", "diagram", "--job", "J1", "--scope", "s",
                                 "--svg", "-", "--redis", "{dead}"], FAILED,
     "cannot read from Redis"),
    # the script engine
    ("engine-build-missing-folder", ["engine", "build", "--scripts", "{missing}"], MISTAKE,
     "does not exist"),
    ("engine-start-missing-folder", ["engine", "start", "--scripts", "{missing}"], MISTAKE,
     "does not exist"),
    ("engine-status-missing-folder", ["engine", "status", "--scripts", "{missing}"], MISTAKE,
     "does not exist"),
    ("engine-stop-missing-folder", ["engine", "stop", "--scripts", "{missing}"], MISTAKE,
     "does not exist"),
    ("engine-status-never-ran", ["engine", "status", "--scripts", "{scripts}"], MISTAKE,
     "no engine has run on"),
    ("engine-start-unknown-mission", ["engine", "start", "--scripts", "{scripts}",
                                      "--no-redis", "--mission", "unload", "--for", "5"],
     MISTAKE, "--mission unload: no such mission"),
    ("engine-start-bad-mission-args", ["engine", "start", "--scripts", "{scripts}",
                                       "--no-redis", "--mission", 'load={"pieces": 2}',
                                       "--for", "5"], MISTAKE, "'pieces'"),
    ("engine-start-bad-for", ["engine", "start", "--scripts", "{scripts}", "--for", "-1"],
     MISTAKE, "must be positive"),
    ("engine-start-bad-redis-url", ["engine", "start", "--scripts", "{scripts}", "--redis",
                                    "nope", "--for", "1"], MISTAKE, "--redis nope"),
    ("engine-start-unreachable", ["engine", "start", "--scripts", "{scripts}", "--redis",
                                  "{dead}", "--for", "1"], FAILED, "cannot reach Redis"),
    ("engine-build-broken", ["engine", "build", "--scripts", "{broken}"], FAILED, None),
    ("missions-bad-limit", ["missions", "list", "--limit", "0"], MISTAKE, "must be positive"),
    ("missions-unknown-config", ["missions", "list", "--config", "{missing}"], MISTAKE,
     "cannot read"),
    ("missions-unreachable", ["missions", "list", "--redis", "{dead}"], FAILED,
     "cannot reach Redis"),
    # job orders and Work Masters (an MES client over MQTT; list and show read Redis)
    ("job-submit-no-wm", ["job", "submit", "--scope", "s", "--mqtt", "{no_broker}"],
     MISTAKE, "name a Work Master"),
    ("job-submit-bad-param", ["job", "submit", "wm", "-p", "x", "--scope", "s"], MISTAKE,
     "expected NAME=VALUE"),
    ("job-submit-string-wm-in-file", ["job", "submit", "--order", "{order}", "--scope", "s"],
     MISTAKE, "WorkMasterID is a list"),
    ("job-submit-unknown-file", ["job", "submit", "--order", "{missing}", "--scope", "s"],
     MISTAKE, "cannot read"),
    ("job-update-no-id", ["job", "update", "wm", "--scope", "s"], MISTAKE,
     "name the job order"),
    ("job-clear-bad-id", ["job", "clear", "a#b", "--scope", "s"], MISTAKE, "invalid job id"),
    ("job-list-bad-state", ["job", "list", "--state", "Sleeping", "--scope", "s"], MISTAKE,
     "unknown job order state"),
    ("job-no-broker", ["job", "cancel", "J1", "--scope", "s", "--mqtt", "{no_broker}"],
     FAILED, "cannot reach the MQTT broker"),
    ("job-revoke-no-broker", ["job", "revoke", "J1", "--scope", "s", "--mqtt",
                              "{no_broker}"], FAILED, "cannot reach the MQTT broker"),
    ("workmaster-put-unknown-file", ["workmaster", "put", "{missing}", "--scope", "s"],
     MISTAKE, "cannot read"),
    ("workmaster-put-no-id", ["workmaster", "put", "{bare}", "--scope", "s"], MISTAKE,
     "data and dataschema"),
    ("workmaster-put-no-broker", ["workmaster", "put", "{good}", "--id", "wm", "--scope", "s",
                                  "--mqtt",
                                  "{no_broker}"], FAILED, "cannot reach the MQTT broker"),
    ("workmaster-delete-no-broker", ["workmaster", "delete", "wm", "--scope", "s", "--mqtt",
                                     "{no_broker}"], FAILED, "cannot reach the MQTT broker"),
    ("workmaster-list-unreachable", ["workmaster", "list", "--scope", "s", "--redis",
                                     "{dead}"], FAILED, "cannot reach Redis"),
    ("workmaster-show-no-scope", ["workmaster", "show", "wm", "--redis", "{dead}"], MISTAKE,
     "--scope is required"),
    # inspect and top
    ("inspect-no-job", ["inspect"], MISTAKE, "required: JOB"),
    ("inspect-bad-scope", ["inspect", "J1", "--scope", "bad/scope", "--redis", "{dead}"],
     MISTAKE, "invalid scope"),
    ("inspect-bad-job", ["inspect", "a{b}", "--scope", "s", "--redis", "{dead}"], MISTAKE,
     "invalid job id"),
    ("inspect-no-scope", ["inspect", "J1", "--redis", "{dead}"], MISTAKE,
     "--scope is required"),
    ("inspect-bad-config", ["inspect", "J1", "--config", "{bad_toml}"], MISTAKE,
     "not valid TOML"),
    ("inspect-unknown-config", ["inspect", "J1", "--config", "{missing}"], MISTAKE,
     "cannot read"),
    ("inspect-unreachable", ["inspect", "J1", "--scope", "s", "--redis", "{dead}"], FAILED,
     "cannot reach Redis"),
    ("inspect-unreachable-cluster", ["inspect", "J1", "--scope", "s", "--config",
                                     "{cluster}"], FAILED, "cannot reach Redis"),
    ("top-bad-scope", ["top", "--once", "--scope", "bad/scope", "--redis", "{dead}"],
     MISTAKE, "invalid scope"),
    ("top-negative-frames", ["top", "--frames", "-1", "--redis", "{dead}"], MISTAKE,
     "--frames must not be negative"),
    ("top-bad-width", ["top", "--width", "0"], MISTAKE, "must be positive"),
    ("top-bad-interval", ["top", "--interval", "often"], MISTAKE, "expected a number"),
    ("top-unreachable", ["top", "--once", "--redis", "{dead}"], FAILED, "cannot reach Redis"),
    ("top-unreachable-cluster", ["top", "--once", "--config", "{cluster}"], FAILED,
     "cannot reach Redis"),
    # a host: the settings are checked before it starts
    ("run-bad-scope", ["run", "--scope", "bad/scope"], MISTAKE, "invalid scope 'bad/scope'"),
    ("run-unknown-config", ["run", "--config", "{missing}"], MISTAKE, "cannot read"),
    # the web view alone: a port, Redis, and the access rules
    ("web-no-port", ["web", "--redis", "{dead}"], MISTAKE, "set metrics_port"),
    ("web-bad-port", ["web", "--port", "70000"], MISTAKE, "is not a port"),
    ("web-no-token", ["web", "--port", "8080", "--host", "0.0.0.0"], MISTAKE,
     "is not loopback: set web_token"),
    ("web-unknown-config", ["web", "--config", "{missing}"], MISTAKE, "cannot read"),
    ("web-unreachable", ["web", "--redis", "{dead}", "--port", "8080"], FAILED,
     "cannot reach Redis"),
    # done
    ("version-flag", ["--version"], OK, None),
    ("version", ["version"], OK, None),
    ("check-good", ["recipe", "check", "{good}", "{good}"], OK, None),
    ("engine-build", ["engine", "build", "--scripts", "{scripts}"], OK, None),
]


def sfc_host(argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SFC_")}
    return subprocess.run([sys.executable, "-m", "sfc_host", *argv], capture_output=True,
                          text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL)


def _fill(arg: str, paths: dict[str, str]) -> str:
    for name, value in paths.items():
        arg = arg.replace(f"{{{name}}}", value)
    return arg


@pytest.mark.parametrize(("argv", "code", "words"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_exit_code(paths: dict[str, str], argv: list[str], code: int,
                   words: str | None) -> None:
    p = sfc_host([_fill(a, paths) for a in argv])
    assert "Traceback" not in p.stdout + p.stderr, p.stderr
    assert p.returncode == code, (p.returncode, p.stderr)
    if words is None:
        assert p.stderr == ""
        assert p.stdout.strip()     # said what it did, or what is wrong with the input
        return
    assert p.stderr.count("\n") == 1 and p.stderr.startswith("sfc-host"), p.stderr
    assert words in p.stderr, p.stderr


def test_json_results_are_json_also_for_unreadable_files(paths: dict[str, str]) -> None:
    p = sfc_host(["recipe", "check", "--json", paths["good"], paths["missing"], paths["bad"]])
    assert p.returncode == MISTAKE and p.stderr == ""
    doc = json.loads(p.stdout)
    assert [d["ok"] for d in doc] == [True, False, False]
    assert "cannot read" in doc[1]["error"] and doc[2]["problems"]
