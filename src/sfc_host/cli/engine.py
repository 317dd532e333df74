"""``sfc-host engine build|start|stop|status`` and ``sfc-host missions list``.

``engine start`` runs the engine in the foreground until SIGINT/SIGTERM (or
``--for SECONDS``); while it runs it keeps ``DIR/.sfc-engine.json`` (its pid and
status) up to date, which ``engine status`` reads and ``engine stop`` uses to send
SIGTERM. Mission records go to Redis (``--redis``), where ``missions list`` reads them.

Exit status as every ``sfc-host`` command: 0 done; 1 refused or failed (scripts that do
not build, an engine already running, a fault, Redis out of reach, a stop that timed
out); 2 a user mistake (a missing scripts folder, a folder no engine has run on, a bad
flag, an unknown mission or wrong mission arguments), one line on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from sfc_host.cli.common import EXIT_OK, EXIT_PROBLEMS, UsageError, error
from sfc_host.errors import Unreachable

DEFAULT_REDIS = "redis://127.0.0.1:6379/0"
STATUS_FILE = ".sfc-engine.json"


def _scripts_dir(args: argparse.Namespace) -> Path | None:
    d = Path(args.scripts)
    return d if d.is_dir() else None


def _no_folder(args: argparse.Namespace) -> int:
    return error(f"scripts folder {args.scripts} does not exist")


def _last_status(args: argparse.Namespace) -> dict[str, Any] | int:
    """The status file of ``--scripts``, or the exit status of the mistake: a folder
    that is not there, or one no engine has run on (the wrong folder named)."""
    scripts = _scripts_dir(args)
    if scripts is None:
        return _no_folder(args)
    st = read_status(scripts)
    if st is None:
        return error(f"no engine has run on {scripts} (no {STATUS_FILE}); start one with: "
                    f"sfc-host engine start --scripts {args.scripts}")
    return st


# ---- status file ----------------------------------------------------------------------


def status_path(scripts: Path) -> Path:
    return scripts / STATUS_FILE


def write_status(scripts: Path, doc: dict[str, Any]) -> None:
    path = status_path(scripts)
    tmp = path.with_name(f"{STATUS_FILE}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=repr))
    os.replace(tmp, path)


def read_status(scripts: Path) -> dict[str, Any] | None:
    try:
        return json.loads(status_path(scripts).read_text())
    except (OSError, ValueError):
        return None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ---- engine build ---------------------------------------------------------------------


def cmd_build(args: argparse.Namespace) -> int:
    from sfc_host.engine import Engine

    scripts = _scripts_dir(args)
    if scripts is None:
        return _no_folder(args)

    async def run() -> tuple[Engine, list[Any]]:
        engine = Engine(scripts)
        problems = await engine.build()
        return engine, problems

    engine, problems = asyncio.run(run())
    if args.json:
        doc = {"state": engine.state, "problems": [p.to_dict() for p in problems],
               "tasks": [{"name": t.name, "interval": t.interval, "auto_start": t.auto_start}
                         for t in engine.tasks.values()],
               "missions": {n: d.parameters() for n, d in engine.missions.items()},
               "variables": {k: repr(v) for k, v in engine.vars.snapshot().items()}}
        print(json.dumps(doc, indent=2))
        return EXIT_PROBLEMS if problems else EXIT_OK
    if problems:
        n = len(problems)
        print(f"{scripts}: BuildError, {n} problem{'s' if n != 1 else ''}")
        for p in problems:
            print(f"{scripts / p.file if p.file != str(scripts) else p.file}:{p.line}: "
                  f"{p.message}")
        return EXIT_PROBLEMS
    print(f"{scripts}: Ready, {len(engine.tasks)} tasks, {len(engine.missions)} missions, "
          f"{len(engine.vars)} variables")
    for t in engine.tasks.values():
        auto = "auto start" if t.auto_start else "manual start"
        print(f"  task {t.name}: every {t.interval:g} s, {auto}")
    for name, d in engine.missions.items():
        print(f"  mission {name}({', '.join(d.parameters())})")
    for k, v in engine.vars.snapshot().items():
        print(f"  variable {k} = {v!r}")
    return EXIT_OK


# ---- engine start ---------------------------------------------------------------------


def cmd_start(args: argparse.Namespace) -> int:
    from sfc_host.config import parse_mission_spec

    scripts = _scripts_dir(args)
    if scripts is None:
        return _no_folder(args)
    missions = []
    for spec in args.mission or ():   # before anything starts: a typo costs no start-up
        try:
            missions.append(parse_mission_spec(spec))
        except ValueError as e:
            return error(f"--mission {spec}: {e}")
    prev = read_status(scripts)
    if prev and prev.get("running") and pid_alive(int(prev.get("pid", 0))) \
            and prev.get("pid") != os.getpid():
        return error(f"an engine already runs on {scripts} (pid {prev['pid']}); "
                    "stop it with: sfc-host engine stop --scripts " + str(args.scripts),
                    EXIT_PROBLEMS)
    try:
        return asyncio.run(_run_engine(scripts, args, missions))
    except UsageError as e:
        return error(str(e))
    except Unreachable as e:
        return error(str(e), EXIT_PROBLEMS)


async def _open_store(args: argparse.Namespace) -> Any:
    from sfc_host.engine import MemoryMissionStore, RedisMissionStore
    from sfc_host.store.client import REDIS_FAILURES

    if args.no_redis:
        return MemoryMissionStore()
    from sfc_host.logs import redact

    try:
        store = RedisMissionStore.from_url(args.redis)
    except ValueError as e:   # not a Redis URL
        raise UsageError(f"--redis {redact(args.redis)}: {e}") from None
    try:
        await store.client.ping()
    except REDIS_FAILURES as e:
        await store.close()
        raise Unreachable(f"cannot reach Redis at {redact(args.redis)} ({type(e).__name__}); "
                          "give --redis URL, or --no-redis to keep mission records in memory"
                          ) from e
    return store


async def _run_engine(scripts: Path, args: argparse.Namespace,
                      missions: list[tuple[str, dict[str, Any]]]) -> int:
    from sfc_host.engine import Engine, EngineFault, UnknownMission, check_mission_call

    store = await _open_store(args)
    engine = Engine(scripts, store=store, stop_timeout=args.stop_timeout)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    dirty = True

    def mark(_: Engine) -> None:
        nonlocal dirty
        dirty = True

    def save(running: bool) -> None:
        write_status(scripts, {"pid": os.getpid(), "running": running,
                               "updated": time.time(), **engine.status()})

    engine.on_change(mark)
    try:
        problems = await engine.build()
        if problems:
            save(False)
            for p in problems:
                print(f"{scripts / p.file}:{p.line}: {p.message}", file=sys.stderr)
            return EXIT_PROBLEMS
        for name, margs in missions:   # against the build: before the engine runs
            try:
                check_mission_call(engine.missions, name, margs)
            except UnknownMission as e:
                raise UsageError(f"--mission {name}: no such mission in {scripts} "
                             f"({e.known})") from None
            except ValueError as e:
                raise UsageError(f"--mission {name}: {e}") from None
        await engine.start()
        save(True)
        print(f"engine {engine.state}: {len(engine.tasks)} tasks, {len(engine.missions)} "
              f"missions; stop with: sfc-host engine stop --scripts {scripts}", flush=True)
        for name, margs in missions:
            inst = await engine.start_mission(name, **margs)
            print(f"mission {inst.id} started", flush=True)
        deadline = None if args.seconds is None else loop.time() + args.seconds
        while not stop.is_set():
            if deadline is not None and loop.time() >= deadline:
                break
            timeout = 1.0 if deadline is None else max(0.0, min(1.0, deadline - loop.time()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout)
            if dirty:
                dirty = False
                save(True)
            if engine.state == "Fault":
                print(f"engine Fault: {engine.fault_reason}", file=sys.stderr)
                save(False)
                return EXIT_PROBLEMS
        await engine.stop()
        save(False)
        print(f"engine {engine.state}: stopped, {engine.ended} mission instances ended",
              flush=True)
        return EXIT_OK
    except EngineFault as e:
        save(False)
        print(f"sfc-host: {e}", file=sys.stderr)
        return EXIT_PROBLEMS
    finally:
        close = getattr(store, "close", None)
        if close is not None:
            await close()


# ---- engine stop / status -------------------------------------------------------------


def cmd_stop(args: argparse.Namespace) -> int:
    scripts = Path(args.scripts)
    st = _last_status(args)
    if isinstance(st, int):
        return st
    pid = int(st.get("pid", 0))
    if not st.get("running") or not pid_alive(pid):
        print(f"engine on {scripts} is not running (last state {st.get('state')})")
        return EXIT_OK
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            break
        cur = read_status(scripts) or {}
        if not cur.get("running"):
            break
        time.sleep(0.05)
    else:
        return error(f"engine (pid {pid}) did not stop within {args.timeout:g} s",
                    EXIT_PROBLEMS)
    final = read_status(scripts) or {}
    print(f"engine on {scripts} stopped (state {final.get('state')})")
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    st = _last_status(args)
    if isinstance(st, int):
        return st
    alive = bool(st.get("running")) and pid_alive(int(st.get("pid", 0)))
    if args.json:
        print(json.dumps({**st, "running": alive}, indent=2))
        return EXIT_OK
    when = time.strftime("%H:%M:%S", time.localtime(st.get("updated", 0)))
    run = f"running, pid {st['pid']}" if alive else "not running"
    print(f"engine {st.get('state')} ({run}; as of {when})")
    if st.get("fault"):
        print(f"  fault: {st['fault']}")
    for p in st.get("problems", []):
        print(f"  {p['file']}:{p['line']}: {p['message']}")
    for t in st.get("tasks", []):
        err = f", error: {t['error']}" if t.get("error") else ""
        print(f"  task {t['name']:<20} {t['state']:<9} runs {t['runs']}, skipped "
              f"{t['skipped_paused']} paused / {t['skipped_busy']} busy{err}")
    for m in st.get("instances", []):
        print(f"  mission {m['id']:<32} {m['state']:<9} steps {m['steps']}")
    print(f"  missions ended: {st.get('missions_ended', 0)}")
    return EXIT_OK


# ---- missions list --------------------------------------------------------------------


def cmd_missions_list(args: argparse.Namespace) -> int:
    from sfc_host.config import ConfigError, HostConfig
    from sfc_host.engine import RedisMissionStore, mission_prefix, summarize
    from sfc_host.logs import redact
    from sfc_host.store.client import connect

    # The host's own settings find its records: the same URL, and on a cluster the
    # same client kind and hash-tagged prefix the host wrote them with.
    try:
        cfg = HostConfig.load(args.config, redis_url=args.redis,
                              redis_cluster=True if args.cluster else None)
    except ConfigError as e:
        return error(str(e))
    where = redact(cfg.redis_url)

    try:
        client = connect(cfg)   # no I/O yet: only the URL is read
    except ValueError as e:     # not a Redis URL
        return error(f"redis_url {where}: {e}")

    async def run() -> list[dict[str, Any]]:
        store = RedisMissionStore(client, prefix=mission_prefix(cfg.redis_cluster))
        try:
            return await store.list(name=args.name, state=args.state, limit=args.limit)
        finally:
            await store.close()

    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import RedisClusterException, RedisError

    try:
        records = asyncio.run(run())
    except (OSError, RedisConnectionError) as e:
        return error(f"cannot reach Redis at {where} ({redact(str(e))})", EXIT_PROBLEMS)
    except (RedisError, RedisClusterException) as e:
        return error(f"cannot read mission records from {where} ({redact(str(e))})",
                     EXIT_PROBLEMS)
    if args.json:
        print(json.dumps(records, indent=2))
    else:
        for line in summarize(records):   # a header line first
            print(line)
        print(f"{len(records)} mission record{'s' if len(records) != 1 else ''}")
    return EXIT_OK


# ---- wiring ---------------------------------------------------------------------------


def register(sub: argparse._SubParsersAction) -> None:
    from sfc_host.cli.common import positive

    engine = sub.add_parser("engine", help="build, start, stop and watch the script engine")
    parser_class = type(engine)
    esub = engine.add_subparsers(dest="engine_command", metavar="ACTION",
                                 parser_class=parser_class)
    esub.required = True

    def scripts_arg(p: argparse.ArgumentParser) -> None:
        p.add_argument("--scripts", required=True, metavar="DIR",
                       help="the scripts folder (.py files with @task / @mission)")

    b = esub.add_parser("build", help="build the scripts and show Tasks, Missions, Variables")
    scripts_arg(b)
    b.add_argument("--json", action="store_true")
    b.set_defaults(func=cmd_build)

    s = esub.add_parser("start", help="build and run the engine in the foreground")
    scripts_arg(s)
    s.add_argument("--redis", default=DEFAULT_REDIS, metavar="URL",
                   help=f"where mission records are saved (default {DEFAULT_REDIS})")
    s.add_argument("--no-redis", action="store_true",
                   help="keep mission records in memory only")
    s.add_argument("--mission", action="append", metavar="NAME[=JSON]",
                   help="start a mission instance once running (repeatable)")
    s.add_argument("--for", dest="seconds", type=positive(float), metavar="SECONDS",
                   help="stop after this many seconds")
    s.add_argument("--stop-timeout", type=positive(float), default=10.0, metavar="SECONDS",
                   help="how long Stopping may take before the engine faults")
    s.set_defaults(func=cmd_start)

    st = esub.add_parser("stop", help="stop the engine running on a scripts folder")
    scripts_arg(st)
    st.add_argument("--timeout", type=positive(float), default=30.0, metavar="SECONDS")
    st.set_defaults(func=cmd_stop)

    ss = esub.add_parser("status", help="state of the engine, its Tasks and Missions")
    scripts_arg(ss)
    ss.add_argument("--json", action="store_true")
    ss.set_defaults(func=cmd_status)

    missions = sub.add_parser("missions", help="mission records")
    msub = missions.add_subparsers(dest="missions_command", metavar="ACTION",
                                   parser_class=parser_class)
    msub.required = True
    ml = msub.add_parser("list", help="list ended mission instances (newest first)")
    ml.add_argument("--redis", metavar="URL",
                    help=f"the host's Redis (default: the config's, else {DEFAULT_REDIS})")
    ml.add_argument("--cluster", action="store_true",
                    help="the URL names a node of a Redis Cluster (as redis_cluster = true)")
    ml.add_argument("--config", metavar="FILE",
                    help="the host's TOML settings: redis_url and redis_cluster")
    ml.add_argument("--name", help="only this mission")
    ml.add_argument("--state", choices=("Completed", "Canceled", "Error"),
                    help="only this final state")
    ml.add_argument("--limit", type=positive(int), default=50,
                    help="at most this many records (default 50)")
    ml.add_argument("--json", action="store_true")
    ml.set_defaults(func=cmd_missions_list)
