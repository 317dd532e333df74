"""``sfc-host demo``: everything on this machine, end to end.

A real redis-server and an MQTT broker on free loopback ports (``embedded``), one host
in this process or ``--hosts N`` host processes (``sfc-host run``), a simulated station
per scope written as a script Mission (``examples/station_mission.py``, run by the
first host's script engine with its MQTT link: settings ``scripts_dir``, ``missions``),
and an MES side that puts the example Work Masters and submits jobs as ISA-95
StoreAndStart CloudEvents, ``--parallel`` at a time per scope, as a line releases
orders. A live progress line, then a summary (``demo_report``).

``--web``: the first host serves the web view (its settings ``web``, ``metrics_port``
on loopback, ``web_control`` with ``--web-control``), the address is printed before the
jobs go out, and after the summary everything keeps running, so the finished jobs stay
in view, until Ctrl-C or SIGTERM.

Everything it started is stopped at the end, on Ctrl-C or SIGTERM; exit 0 when every
job ended (completed or aborted), 1 when some did not within ``--timeout`` or the run
failed (a host died), 130 when interrupted during the run (after it, with ``--web``:
the run's own status), 2 for a wrong option or a missing server.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from sfc_host.config import HostConfig
from sfc_host.demo import report as demo_report
from sfc_host.demo.servers import (
    EmbeddedError,
    Servers,
    free_port,
    spawn,
    tail,
    terminate,
    wait_ready,
)
from sfc_host.demo.tally import Job, Tally
from sfc_host.errors import SfcHostError
from sfc_host.isa95 import BY_ID, JOB_CONTROL, WORK_MASTER, comment, state_name
from sfc_host.mes.codec import levels
from sfc_host.metrics import Histogram, Metrics
from sfc_host.mqtt import Message, MqttLink
from sfc_host.mqtt.cloudevents import (
    CloudEvent,
    CloudEventError,
    decode,
    encode_binary,
    encode_structured,
    new,
)

if TYPE_CHECKING:
    from sfc_host.service.app import App

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
RECIPES = ("axle_fit_qa", "tighten_rework", "paint_hold_restart")
SHORT = {"axle_fit_qa": "axle", "tighten_rework": "tighten", "paint_hold_restart": "paint"}
REPLY_TIMEOUT_S = 15.0
UNIT_WORK_S = 0.1          # a PackML unit's work per action at speed 1 (--equipment opcua)
WEB_HOST = "127.0.0.1"     # loopback: the view needs no access token there
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class DemoFailed(SfcHostError, RuntimeError):
    """Something stopped the run midway (a host died, no reply); one line for the user."""


class WrongOption(SfcHostError, ValueError):
    """A flag the demo cannot use as given (exit 2); one line for the user."""


@dataclass
class Options:
    jobs: int = 200
    scopes: int = 4
    hosts: int = 1
    seed: int = 1
    speed: float = 1.0
    parallel: int = 10
    timeout: float = 0.0        # 0: from the number of jobs and the speed
    web: bool = False           # the first host serves the web view
    web_control: bool = False   # with its job control buttons
    web_port: int = 0           # 0: a free one
    equipment: str = "mqtt"     # "opcua": the push actions on PackML units (demo.units)

    def deadline_s(self) -> float:
        return self.timeout or 60.0 + 2.0 * self.jobs / self.speed


def check_web_port(port: int) -> None:
    """The view's port can be bound now (the host binds it only after Redis, the broker
    and its scripts are up: a port in use would fail the demo late and less clearly)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as the server does
            s.bind((WEB_HOST, port))
    except OSError as e:
        why = "already in use" if e.errno == errno.EADDRINUSE else (e.strerror or str(e))
        raise WrongOption(f"--web-port {port}: cannot listen on {WEB_HOST}:{port}: {why} "
                          "(leave --web-port out for a free port)") from None


def run(opts: Options) -> int:
    """Run the demo with these options: its exit status (the module docstring lists them).
    A wrong option is one line on stderr and 2, before anything starts."""
    import uvloop

    try:
        for flag, given in (("--web-control", opts.web_control),
                            ("--web-port", bool(opts.web_port))):
            if given and not opts.web:
                raise WrongOption(f"{flag} goes with --web")
        if opts.web_port:
            check_web_port(opts.web_port)
    except WrongOption as e:
        print(f"sfc-host demo: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    return int(uvloop.run(_interruptible(opts)))


async def _interruptible(opts: Options) -> int:
    """Run the demo; SIGINT/SIGTERM cancel it, and its cleanup runs before we return."""
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    assert main is not None
    signals: list[int] = []

    def on_signal(sig: int) -> None:
        if not signals:
            main.cancel()
        signals.append(sig)

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    demo = Demo(opts, sys.stdout)
    try:
        outcome = await demo.run()
        if signals:
            # the cancel came while a step swallowed it: the run went on to its end,
            # but the operator asked it to stop
            print("\nsfc-host demo: interrupted; everything it started is stopped",
                  file=sys.stderr)
            return EXIT_INTERRUPTED
        return outcome
    except asyncio.CancelledError:
        if not signals:
            raise
        if demo.outcome is not None:
            # the run had ended and the web view served it until the signal asked to stop
            print("\nsfc-host demo: stopped the web view and everything else it started",
                  flush=True)
            return demo.outcome
        print("\nsfc-host demo: interrupted; everything it started is stopped",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    except EmbeddedError as e:
        print(f"sfc-host demo: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except DemoFailed as e:
        print(f"sfc-host demo: failed: {e}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


# ---- the MES side ---------------------------------------------------------------------


class Mes:
    """Requests with replies, and the job order status events, over its own MQTT link."""

    def __init__(self, link: MqttLink, scopes: list[str],
                 on_status: Callable[[dict[str, Any]], None]) -> None:
        self.link = link
        self.prefix = link.config.mes_prefix
        self.inbox = f"sfc-demo/{uuid.uuid4().hex[:8]}/replies"
        self.waiting: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self.on_status = on_status
        self.stations: dict[str, dict[str, Any]] = {}     # scope -> its last report
        link.subscribe(self.inbox, self._on_reply, shared=False)
        self._lookups: set[asyncio.Task[None]] = set()
        for s in scopes:   # MQTT 3.1.1 has no response topic: replies come here
            link.subscribe(f"{self.prefix}/{levels(s)}/replies", self._on_reply, shared=False)
            link.subscribe(f"{self.prefix}/{levels(s)}/events", self._on_event, shared=False)
            link.subscribe(f"{link.config.equipment_prefix}/{s}/station", self._on_station,
                           shared=False)

    @staticmethod
    def _decode(message: Message) -> CloudEvent | None:
        try:
            return decode(message.payload, message.properties)
        except CloudEventError:
            return None

    def _on_reply(self, message: Message) -> None:
        ev = self._decode(message)
        fut = self.waiting.pop(ev.causationid or "", None) if ev is not None else None
        if fut is not None and not fut.done():
            fut.set_result(ev.data if isinstance(ev.data, dict) else {})

    def _on_event(self, message: Message) -> None:
        """A status event ``{JobOrder, JobState}``: the order's id and state name; an
        aborted job's reason is its job response's Description (asked for by id)."""
        ev = self._decode(message)
        if ev is None or not isinstance(ev.data, dict) or not ev.subject:
            return
        try:
            state = state_name(ev.data.get("JobState") or [])
        except ValueError:
            return
        job = (ev.data.get("JobOrder") or {}).get("JobOrderID")
        status = {"JobOrderID": job, "JobState": state}
        if state != "Aborted":
            self.on_status(status)
            return
        t = asyncio.get_running_loop().create_task(self._aborted(ev.subject, status))
        self._lookups.add(t)
        t.add_done_callback(self._lookups.discard)

    async def _aborted(self, scope: str, status: dict[str, Any]) -> None:
        with contextlib.suppress(DemoFailed):
            rep = await self.request(scope, BY_ID, {"JobOrderID": status["JobOrderID"]})
            desc = (rep.get("JobResponse") or {}).get("Description") or {}
            status["Reason"] = desc.get("Text") if isinstance(desc, dict) else None
        self.on_status(status)

    def _on_station(self, message: Message) -> None:
        with contextlib.suppress(ValueError):
            report = json.loads(message.payload)
            if isinstance(report, dict):
                self.stations[message.topic.split("/")[1]] = report

    async def request(self, scope: str, type_: str, data: dict[str, Any],
                      **ext: str) -> dict[str, Any]:
        corr = uuid.uuid4()
        ev = new(type_, "sfc-demo", data, subject=scope, correlationid=str(corr), **ext)
        fut = asyncio.get_running_loop().create_future()
        self.waiting[ev.id] = fut
        topic = f"{self.prefix}/{levels(scope)}/commands"
        if self.link.v5:
            ev.response_topic = self.inbox
            ev.correlation_data = corr.bytes
            payload, props = encode_binary(ev)
            self.link.publish_nowait(topic, payload, props)
        else:
            self.link.publish_nowait(topic, encode_structured(ev))
        try:
            return await asyncio.wait_for(fut, REPLY_TIMEOUT_S)
        except TimeoutError:
            raise DemoFailed(f"no reply to {type_.rsplit('.', 2)[-2]} in {scope} within "
                             f"{REPLY_TIMEOUT_S:.0f} s") from None
        finally:
            self.waiting.pop(ev.id, None)


# ---- jobs -----------------------------------------------------------------------------


# paint jobs the MES pauses for a while (equipment hold); few, since the time a job is
# paused counts in the host's answer-to-command histogram (held answer -> restart)
PAUSED_SHARE = 0.06


def plan(opts: Options, scopes: list[str]) -> list[Job]:
    rng = random.Random(opts.seed)
    jobs = []
    for i in range(opts.jobs):
        r = rng.choice(RECIPES)
        job = Job(f"{SHORT[r]}-{i + 1:04d}", r, scopes[i % len(scopes)])
        if r == "paint_hold_restart" and rng.random() < PAUSED_SHARE:
            # most likely while it paints: the booth holds the work, and restarts it
            job.pause_at_s = rng.uniform(0.25, 0.5) / opts.speed
            job.pause_for_s = rng.uniform(0.1, 0.3) / opts.speed
        jobs.append(job)
    return jobs


def work_master(name: str) -> dict[str, Any]:
    wm: dict[str, Any] = json.loads((EXAMPLES / f"{name}.json").read_text())
    return {**wm, "ID": name}


# ---- hosts ----------------------------------------------------------------------------


class Hosts:
    """One App in this process, or N ``sfc-host run`` processes with metrics endpoints."""

    def __init__(self, opts: Options, base: dict[str, Any], workdir: Path,
                 stations: dict[str, Any], web: dict[str, Any]) -> None:
        self.n = opts.hosts
        self.base = base
        self.workdir = workdir
        self.stations = stations      # the first host's settings that run the station
        self.web = web                # and those that serve the web view (or none)
        self.app: App | None = None
        self.procs: list[tuple[subprocess.Popen[bytes], Path, int]] = []  # log, metrics port

    async def start(self) -> None:
        if self.n == 1:
            from sfc_host.service.app import App

            self.app = App(HostConfig(**self.base, **self.stations, **self.web,
                                      consumer="demo-host-1"))
            try:
                await self.app.start()
            except (ValueError, OSError, TimeoutError) as e:   # ConfigError is a ValueError
                raise DemoFailed(f"the host did not start: {e}") from e
            return
        for i in range(1, self.n + 1):
            first = {**self.stations, **self.web} if i == 1 else {}
            port = int(first.get("metrics_port") or free_port())
            conf = self.workdir / f"host-{i}.toml"
            settings = {**self.base, **first, "consumer": f"demo-host-{i}",
                        "metrics_port": port}
            # JSON strings, numbers and arrays of strings are TOML as they are
            conf.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in settings.items()))
            log = self.workdir / f"host-{i}.log"
            proc = spawn([sys.executable, "-m", "sfc_host", "run", "--config", str(conf)], log)
            self.procs.append((proc, log, port))
        # ready: subscribed, engine running, recovery done (the port answers earlier)
        for i, (proc, log, port) in enumerate(self.procs, 1):
            await wait_ready(lambda p=port: _ready(p), f"host {i} (sfc-host run)",
                             proc, log, timeout=30)

    async def units_bound(self) -> None:
        """Until every host found its PackML units (the processes' ``/readyz`` says so
        already: they were waited for)."""
        if self.app is None:
            return
        eq = self.app.opcua_equipment
        loop = asyncio.get_running_loop()
        end = loop.time() + 30
        while eq.not_ready():
            if loop.time() > end:
                raise DemoFailed("the PackML units were not bound: "
                                 + "; ".join(eq.not_ready()[:3]))
            await asyncio.sleep(0.05)

    def latency(self) -> Histogram | None:
        """The hosts' answer-to-command histogram, merged."""
        if self.app is not None:
            return self.app.metrics.histograms.get("answer_to_command_seconds")
        return demo_report.merge_histograms([_scrape(port) or "" for _, _, port in self.procs],
                                            "sfc_answer_to_command_seconds")

    def answers(self) -> list[int]:
        """Equipment answers each host received: how the broker split the work."""
        if self.app is not None:
            return [self.app.metrics["answers_received"]]
        return [demo_report.counter(_scrape(port) or "", "sfc_answers_received_total")
                for _, _, port in self.procs]

    def died(self) -> str | None:
        for i, (proc, log, _) in enumerate(self.procs, 1):
            if proc.poll() is not None:
                last = tail(log).splitlines()[-1:] or ["no output"]
                return f"host {i} exited with {proc.returncode}: {last[0]}"
        return None

    async def aclose(self) -> None:
        if self.app is not None:
            await self.app.aclose()
            self.app = None
        await asyncio.gather(*(asyncio.to_thread(terminate, p) for p, _, _ in self.procs))
        self.procs.clear()


def _scrape(port: int) -> str | None:
    """A host's /metrics text ("" before its first sample), None if it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            return str(r.read().decode())
    except OSError:
        return None


def _ready(port: int) -> bool:
    """The host answers ``/readyz`` with 200."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
            return bool(r.status == 200)
    except OSError:   # HTTPError (503: not ready yet) is one
        return False


# ---- the run --------------------------------------------------------------------------


class Demo:
    def __init__(self, opts: Options, out: TextIO) -> None:
        self.opts = opts
        self.out = out
        self.scopes = [f"line{i + 1}" for i in range(opts.scopes)]
        self.tally = Tally()
        self._mes: Mes | None = None
        self._pausers: set[asyncio.Task[None]] = set()
        self.outcome: int | None = None    # the run's exit status, once it has ended

    def say(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)

    async def run(self) -> int:
        workdir = Path(tempfile.mkdtemp(prefix="sfc-demo-"))
        try:
            async with contextlib.AsyncExitStack() as stack:
                return await self._run(stack, workdir)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    async def _run(self, stack: contextlib.AsyncExitStack, workdir: Path) -> int:
        o = self.opts
        servers = await stack.enter_async_context(Servers(workdir))
        assert servers.redis is not None and servers.broker is not None
        broker = servers.broker
        if o.hosts > 1 and not broker.shared:
            raise EmbeddedError(f"--hosts {o.hosts} needs a broker with shared "
                                "subscriptions (mosquitto); the amqtt fallback has none")
        self.say(f"sfc-host demo: Redis on 127.0.0.1:{servers.redis.port} "
                 f"({servers.redis.origin}), MQTT broker {broker.name} on "
                 f"127.0.0.1:{broker.port}")
        base = {"redis_url": servers.redis.url, "mqtt_url": broker.url,
                "mqtt_version": broker.version,
                "mqtt_shared_group": "sfc" if broker.shared else "",
                "scopes": self.scopes, "log_level": "WARNING"}
        if o.equipment == "opcua":
            base["equipment_opcua"] = str(await self._units(stack, workdir))
        mes_cfg = HostConfig(**{**base, "mqtt_shared_group": ""}, consumer="demo-mes")
        link = MqttLink(mes_cfg, Metrics(), client_id=f"sfc-demo-mes-{os.getpid()}")
        stack.push_async_callback(link.aclose)
        mes = self._mes = Mes(link, self.scopes, self.tally.on_status)
        await link.start()
        await link.wait_connected(10)
        web = self._web_settings()
        hosts = Hosts(o, base, workdir, self._station_settings(workdir), web)
        stack.push_async_callback(hosts.aclose)
        await hosts.start()
        await self._stations_ready(mes, hosts)
        if o.equipment == "opcua":
            await hosts.units_bound()
        where = "in this process" if o.hosts == 1 else "as sfc-host run processes"
        self.say(f"{o.hosts} host{'s' if o.hosts > 1 else ''} {where}; a station mission "
                 f"per scope ({', '.join(self.scopes)}) in the script engine of host 1; "
                 f"speed {o.speed:g}, seed {o.seed}")
        url = f"http://{WEB_HOST}:{web['metrics_port']}/" if web else ""
        if url:
            self.say(f"web view: {url} "
                     + ("(job control on)" if o.web_control else "(read-only)"))
        await self._work_masters(mes)
        jobs = plan(o, self.scopes)
        self.tally.jobs = {j.id: j for j in jobs}
        self.tally.slots = {s: asyncio.Semaphore(o.parallel) for s in self.scopes}
        counts = {r: sum(j.recipe == r for j in jobs) for r in RECIPES}
        self.say(f"submitting {o.jobs} jobs over MQTT (StoreAndStart), up to {o.parallel} "
                 f"at a time per scope: " + ", ".join(f"{n} {r}" for r, n in counts.items()))
        finished = await self._submit_and_watch(jobs, hosts, servers.redis.url)
        await asyncio.sleep(0.6)     # the stations' last report (every half second)
        report = await demo_report.collect(servers.redis.url, self.tally, hosts.latency(),
                                           mes.stations, {r: work_master(r) for r in RECIPES},
                                           hosts.answers())
        self.say()
        self.say(demo_report.render(report))
        code = EXIT_OK if finished else EXIT_FAILED
        if url:
            self.outcome = code
            self.say()
            self.say(f"web view: {url} stays up, with the hosts and stations, until Ctrl-C")
            await self._serve(hosts)
        return code

    async def _units(self, stack: contextlib.AsyncExitStack, workdir: Path) -> Path:
        """The PackML units on an OPC UA server of this process, and their file."""
        from sfc_host.demo.units import equipment_file, start_units

        server, endpoint = await start_units(self.scopes, UNIT_WORK_S / self.opts.speed)
        stack.push_async_callback(server.stop)
        self.say(f"PackML units on {endpoint}: one per push action type in each scope "
                 "(the host drives them over OPC UA)")
        return equipment_file(workdir / "equipment.toml", endpoint, self.scopes)

    def _web_settings(self) -> dict[str, Any]:
        """The first host's settings that serve the web view: the host's own ``web``,
        ``web_control`` and HTTP port, on loopback (no access token needed)."""
        o = self.opts
        if not o.web:
            return {}
        return {"web": True, "web_control": o.web_control, "metrics_host": WEB_HOST,
                "metrics_port": o.web_port or free_port()}

    async def _serve(self, hosts: Hosts) -> None:
        """Keep everything running for the web view until a signal cancels this."""
        while True:
            await asyncio.sleep(0.5)
            why = hosts.died()
            if why:
                raise DemoFailed(f"the web view is gone: {why}")

    def _station_settings(self, workdir: Path) -> dict[str, Any]:
        """``scripts_dir`` with the station script, and one mission per scope."""
        scripts = workdir / "scripts"
        scripts.mkdir()
        shutil.copy(EXAMPLES / "station_mission.py", scripts / "station_mission.py")
        args: dict[str, Any] = {"speed": self.opts.speed, "seed": self.opts.seed}
        if self.opts.equipment == "opcua":
            args["events_only"] = True       # the machines are the units: sensors only
        return {"scripts_dir": str(scripts),
                "missions": [f"station={json.dumps({'scope': s, **args})}"
                             for s in self.scopes]}

    async def _stations_ready(self, mes: Mes, hosts: Hosts) -> None:
        """Each station says it is ready once subscribed: no command goes unheard."""
        loop = asyncio.get_running_loop()
        end = loop.time() + 15
        while set(mes.stations) != set(self.scopes):
            why = hosts.died()
            if why or loop.time() > end:
                raise DemoFailed(why or "the station missions did not report ready")
            await asyncio.sleep(0.02)

    async def _work_masters(self, mes: Mes) -> None:
        calls = [(s, r) for s in self.scopes for r in RECIPES]
        replies = await asyncio.gather(*(mes.request(s, WORK_MASTER, work_master(r),
                                                     method="PUT") for s, r in calls))
        for (s, r), rep in zip(calls, replies, strict=True):
            if rep.get("ReturnStatus") != 1:
                raise DemoFailed(f"Work Master {r} refused in {s}: {rep.get('Message')}")
        self.say(f"put {len(RECIPES)} Work Masters in each scope: {', '.join(RECIPES)}")

    async def _submit_and_watch(self, jobs: list[Job], hosts: Hosts, redis_url: str) -> bool:
        """Submit (a window per scope), show progress; True when every job ended."""
        t = self.tally
        t.started_at = time.monotonic()
        by_scope = {s: [j for j in jobs if j.scope == s] for s in self.scopes}
        assert self._mes is not None
        feeders = [asyncio.create_task(self._feed(self._mes, js)) for js in by_scope.values()]
        progress = Progress(self.out, len(jobs), t)
        deadline = t.started_at + self.opts.deadline_s()
        reconciled = time.monotonic()
        try:
            while t.ended < len(jobs):
                t.changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(t.changed.wait(), 0.1)
                progress.show()
                for f in feeders:
                    if f.done() and f.exception() is not None:
                        raise f.exception()  # type: ignore[misc]
                why = hosts.died()
                if why:
                    raise DemoFailed(why)
                now = time.monotonic()
                if now - max(t.last_end, reconciled) > 3.0:
                    # status events are best effort (dropped when the host's queue is
                    # nearly full): ask Redis about jobs quiet for a while
                    reconciled = now
                    await t.reconcile(redis_url)
                if now > deadline:
                    break
        finally:
            for f in [*feeders, *self._pausers]:
                f.cancel()
            progress.done()
        return t.ended == len(jobs)

    async def _feed(self, mes: Mes, jobs: list[Job]) -> None:
        for job in jobs:
            await self.tally.slots[job.scope].acquire()
            order = {"JobOrderID": job.id, "WorkMasterID": [{"ID": job.recipe}],
                     "Description": [{"Locale": "en", "Text": f"demo job {job.id}"}]}
            rep = await mes.request(job.scope, JOB_CONTROL + "StoreAndStart.v2",
                                    {"JobOrder": order})
            if rep.get("ReturnStatus") != 1:
                self.tally.end(job.id, "NotAccepted", str(rep.get("Message") or
                                                          rep.get("ReturnStatus")))
            elif job.pause_at_s:
                t = asyncio.create_task(self._pause(mes, job))
                self._pausers.add(t)
                t.add_done_callback(self._pausers.discard)

    async def _pause(self, mes: Mes, job: Job) -> None:
        """An operator's break: MES Pause, then Resume (refused when it already ended)."""
        await asyncio.sleep(job.pause_at_s)
        rep = await mes.request(job.scope, JOB_CONTROL + "Pause.v2",
                                {"JobOrderID": job.id, "Comment": comment("operator break")})
        if rep.get("ReturnStatus") != 1:
            return
        job.paused = True
        await asyncio.sleep(job.pause_for_s)
        await mes.request(job.scope, JOB_CONTROL + "Resume.v2", {"JobOrderID": job.id})


# ---- progress -------------------------------------------------------------------------


class Progress:
    """A bar redrawn in place on a terminal; a plain line every few seconds otherwise."""

    WIDTH = 30

    def __init__(self, out: TextIO, total: int, tally: Tally) -> None:
        self.out = out
        self.total = total
        self.tally = tally
        self.tty = out.isatty()
        self.last = 0.0

    def line(self) -> str:
        t = self.tally
        elapsed = max(time.monotonic() - t.started_at, 1e-9)
        done = int(self.WIDTH * t.ended / self.total)
        bar = "#" * done + "." * (self.WIDTH - done)
        return (f"[{bar}] {t.ended}/{self.total} ended: {t.completed} completed, "
                f"{t.ended - t.completed} aborted, {t.ended / elapsed:.1f} jobs/s, "
                f"{elapsed:.1f} s")

    def show(self) -> None:
        now = time.monotonic()
        if self.tty:
            self.out.write("\r" + self.line() + "\x1b[K")
            self.out.flush()
        elif now - self.last >= 2.0:
            self.last = now
            print(self.line(), file=self.out, flush=True)

    def done(self) -> None:
        if self.tty:
            self.out.write("\r" + self.line() + "\x1b[K\n")
        else:
            print(self.line(), file=self.out)
        self.out.flush()

