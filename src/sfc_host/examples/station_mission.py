"""A simulated station cell, as a script Mission (``sfc-host demo`` runs one per scope).

It serves the example recipes: answers the commands of ``axle_fit_qa``,
``tighten_rework`` and ``paint_hold_restart`` after a random working time, emits the
pull events they wait for (camera QA, torque verification, booth ready), now and then
fails a command (the job aborts, or the recipe retries) and tightens out of tolerance
(the recipe loosens and tightens again). A hold command (the MES paused the job) stops
the work in progress and answers ``held`` (``not_held`` when the work is done already);
the restart after the Resume does the work again.

A command id it has seen before is never worked again (the equipment contract: a host
sends an open command again when another host died with its answer): answered, it gets
the same answer again; in progress, its answer comes when the work is done.

    mission station(api, scope, speed=1.0, seed=0, equipment="equipment", mes="mes",
                    events_only=False)

``events_only``: the cell's machines are PLCs the host drives over OPC UA (``sfc-host demo
--equipment opcua``); the mission is only its sensors, publishing each pull event every
``SENSOR_S``.

It announces the types it serves (retained ``{equipment}/{scope}/capabilities/station``),
again whenever a host asks on ``{equipment}/{scope}/capabilities``, and withdraws them
when it stops. It reads commands in either CloudEvents mode and
sends its answers and events in structured mode (one JSON object). On
``{equipment}/{scope}/station`` (retained) it says when it is ready and, every half
second, how many commands it answered and the time from each answer to the job's next
command as it sees it.
"""

import asyncio
import json
import random
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from sfc_host.engine import mission

# working time per command type at speed 1 (ms): low, high; the mode is nearer low
WORK_MS = {
    "com.example.station.position.v1": (60, 250),
    "com.example.station.tighten.v1": (120, 400),
    "com.example.cell.load.v1": (50, 200),
    "com.example.cell.tighten.v1": (100, 350),
    "com.example.cell.loosen.v1": (40, 150),
    "com.example.cell.unload.v1": (50, 200),
    "com.example.booth.prime.v1": (80, 250),
    "com.example.booth.paint.v1": (200, 600),
    "com.example.booth.paint.hold.v1": (10, 40),
    "com.example.booth.paint.restart.v1": (150, 400),
    "com.example.booth.cure.v1": (150, 500),
}
QA_MS = (80, 300)          # camera inspection, from the part's arrival
VERIFY_MS = (20, 80)       # torque verification, after tightening and QA
BOOTH_READY_MS = (30, 120)
EVENTS = ("com.example.station.qa_result.v1", "com.example.station.torque_result.v1",
          "com.example.booth.ready.v1")
# command type -> (probability, reason) of a failed answer
FAILURES = {
    "com.example.station.position.v1": (0.03, "axle misaligned in the fixture"),
    "com.example.cell.load.v1": (0.02, "part jammed in the gripper"),
    "com.example.cell.tighten.v1": (0.05, "nutrunner fault"),    # the recipe retries once
    "com.example.booth.cure.v1": (0.02, "oven over temperature"),
}
REWORK = 0.25              # a tightening outside 80-90 Nm: loosen and tighten again
MAX_TIGHTENS = 3           # the recipe's rework rounds; the last one is in tolerance
SENSOR_S = 0.05           # the sensors' pull events, each this often (at speed 1)
RESEND_S = 0.5             # a verification no job took (it came too early) goes again
KEEP_LATENCIES = 5000      # samples of the answer-to-next-command time reported
KEEP_ANSWERS = 20_000      # answers remembered for a command id sent again


class Cell:
    def __init__(self, api: Any, scope: str, speed: float, rng: random.Random,
                 equipment: str) -> None:
        self.api = api
        self.scope = scope
        self.speed = max(float(speed), 0.001)
        self.rng = rng
        self.eq = equipment
        self.jobs: dict[str, dict[str, Any]] = {}   # job id -> what the station knows
        self.last_answer: dict[str, float] = {}    # job id -> when its last answer went
        self.tasks: set[asyncio.Task[None]] = set()
        self.working: dict[str, asyncio.Task[None]] = {}   # command id -> its answer to come
        self.booth_jobs: set[str] = set()   # running paint jobs (the sensors' booth events)
        # command id -> (type, data, attributes) of the answer it got, oldest first
        self.answered: dict[str, tuple[str, dict[str, Any], dict[str, str]]] = {}
        self.served = 0
        self.held = 0          # hold commands answered "held" (an MES Pause mid-work)
        self.restarted = 0     # restart commands served (the Resume after a hold)
        self.latency_ms: list[float] = []
        self.reported = -1

    def ms(self, span: tuple[int, int]) -> float:
        lo, hi = span
        return self.rng.triangular(lo, hi, lo + (hi - lo) / 3) / 1000 / self.speed

    def later(self, delay: float, fn: Callable[..., Awaitable[None]],
              *args: Any) -> asyncio.Task[None]:
        async def run() -> None:
            await asyncio.sleep(delay)
            await fn(*args)
        t = asyncio.get_running_loop().create_task(run())
        self.tasks.add(t)
        t.add_done_callback(self.tasks.discard)
        return t

    def job(self, job_id: str) -> dict[str, Any]:
        return self.jobs.setdefault(job_id, {"tightens": 0, "tightened": False, "qa": False,
                                             "verify_at": None})

    async def publish(self, leaf: str, type_: str, data: Any, **attrs: str) -> None:
        ev = {"specversion": "1.0", "id": uuid.uuid4().hex, "source": f"station/{self.scope}",
              "type": type_, "subject": self.scope, "datacontenttype": "application/json",
              **attrs, "data": data}
        await self.api.mqtt.publish(f"{self.eq}/{self.scope}/{leaf}", json.dumps(ev), qos=1)

    # ---- commands

    def on_command(self, topic: str, payload: bytes, props: dict[str, Any]) -> None:
        cmd = event_of(payload, props)
        if cmd["id"] in self.working:
            return                                  # the same command: its answer comes
        again = self.answered.get(cmd["id"])
        if again is not None:                       # answered: the same answer again
            self.later(0, self.publish, "responses", again[0], again[1], **again[2])
            return
        ctx = (cmd.get("data") or {}).get("Context") or {}
        job_id = ctx.get("JobOrderID") or cmd.get("correlationid")
        type_ = cmd["type"]
        sent = self.last_answer.pop(job_id, None)
        if sent is not None and len(self.latency_ms) < KEEP_LATENCIES:
            self.latency_ms.append(round((time.perf_counter() - sent) * 1000, 2))
        job = self.job(job_id)
        if type_ == "com.example.station.position.v1":
            # the camera sees the part as it arrives, whatever happens to it later
            self.later(self.ms(QA_MS), self.qa_done, job_id)
        elif type_ == "com.example.booth.paint.v1" and not ctx.get("Restart"):
            self.later(self.ms(BOOTH_READY_MS), self.booth_ready, job_id)
        if ctx.get("Hold"):
            # a hold stops the work in progress; work already done cannot be held
            work = self.working.pop(cmd["id"].removesuffix(":hold"), None)
            cmd["held"] = work is not None and work.cancel()
        t = self.later(self.ms(WORK_MS.get(type_, (50, 200))), self.answer, cmd, job_id, job)
        self.working[cmd["id"]] = t
        t.add_done_callback(lambda _: self.working.pop(cmd["id"], None))

    async def answer(self, cmd: dict[str, Any], job_id: str, job: dict[str, Any]) -> None:
        type_ = cmd["type"]
        result: dict[str, float] | None = None
        outcome, reason = "completed", ""
        p, why = FAILURES.get(type_, (0.0, ""))
        if type_.endswith(".hold.v1"):
            outcome = "held" if cmd.get("held") else "not_held"
            self.held += outcome == "held"
        elif type_.endswith(".restart.v1"):
            self.restarted += 1
        elif self.rng.random() < p:
            outcome, reason = "failed", why
        elif type_ == "com.example.station.tighten.v1":
            result = {"torque": round(self.rng.uniform(83, 87), 1)}
        elif type_ == "com.example.cell.tighten.v1":
            job["tightens"] += 1
            off = job["tightens"] < MAX_TIGHTENS and self.rng.random() < REWORK
            torque = self.rng.choice((self.rng.uniform(72, 79), self.rng.uniform(91, 96))) \
                if off else self.rng.uniform(81, 89)
            result = {"torque": round(torque, 1)}
        data: dict[str, Any] = {"Outcome": outcome}
        if result is not None:
            data["Result"] = result
        if reason:
            data["Reason"] = reason
        # in the command's trace: a trace viewer shows the station's work under it
        trace = {k: cmd[k] for k in ("traceparent", "tracestate") if cmd.get(k)}
        attrs = {"causationid": cmd["id"], "correlationid": job_id, **trace}
        self.answered[cmd["id"]] = (type_ + ".answer", data, attrs)
        if len(self.answered) > KEEP_ANSWERS:
            del self.answered[next(iter(self.answered))]
        await self.publish("responses", type_ + ".answer", data, **attrs)
        if outcome != "held":      # what follows a hold waits for the MES to resume
            self.last_answer[job_id] = time.perf_counter()
        self.served += 1
        self.api.score = self.served
        if type_ == "com.example.station.tighten.v1" and outcome == "completed":
            job["tightened"] = True
            self.maybe_verify(job_id, job)

    # ---- pull events

    async def qa_done(self, job_id: str) -> None:
        await self.publish("events", "com.example.station.qa_result.v1", {"passed": True},
                           correlationid=job_id)
        job = self.jobs.get(job_id)
        if job is not None:
            job["qa"] = True
            self.maybe_verify(job_id, job)

    async def booth_ready(self, job_id: str) -> None:
        await self.publish("events", "com.example.booth.ready.v1", {"ready": True},
                           correlationid=job_id)

    def maybe_verify(self, job_id: str, job: dict[str, Any]) -> None:
        if job["tightened"] and job["qa"] and job["verify_at"] is None:
            job["verify_at"] = time.monotonic() + 3600     # scheduled, not yet sent
            self.later(self.ms(VERIFY_MS), self.verify, job_id)

    async def verify(self, job_id: str) -> None:
        job = self.jobs.get(job_id)
        if job is None:
            return
        job["verify_at"] = time.monotonic()
        await self.publish("events", "com.example.station.torque_result.v1",
                           {"torque_ok": True}, correlationid=job_id)

    def resend(self) -> None:
        """A verification reaches a job only while it waits for one; if it came before
        the job got there (its answers still being settled), say it again."""
        now = time.monotonic()
        for job_id, job in list(self.jobs.items()):
            if job["verify_at"] is not None and now - job["verify_at"] > RESEND_S:
                job["verify_at"] = now + 3600
                self.later(0, self.verify, job_id)

    # ---- job ends (the MES status events)

    def on_status(self, topic: str, payload: bytes, props: dict[str, Any]) -> None:
        # ISA-95 status event: {JobOrder, JobState}, the state a list whose first
        # entry is the top state (Ended, Aborted, EndState end a job)
        data = event_of(payload, props).get("data") or {}
        states = data.get("JobState") or [{}]
        top = ((states[0] if isinstance(states, list) else {}).get("StateText") or {})
        order = data.get("JobOrder") or {}
        job_id = order.get("JobOrderID")
        if top.get("Text") in ("Ended", "Aborted", "EndState"):
            self.jobs.pop(job_id, None)
            self.last_answer.pop(job_id, None)
            self.booth_jobs.discard(job_id)
        elif top.get("Text") == "Running" and any(
                str((w or {}).get("ID", "")).startswith("paint")
                for w in order.get("WorkMasterID") or []):
            self.booth_jobs.add(job_id)      # the booth's sensor reports for this job

    async def announce(self, types: list[str]) -> None:
        """The types this station serves, retained, so a Work Master using one it does
        not is refused when it is put (H-13)."""
        await self.api.mqtt.publish(f"{self.eq}/{self.scope}/capabilities/station",
                                    json.dumps({"TypeIds": types}), qos=1, retain=True)

    async def report(self, state: str = "ready") -> None:
        if self.served == self.reported and state == "ready":
            return
        self.reported = self.served
        await self.api.mqtt.publish(
            f"{self.eq}/{self.scope}/station",
            json.dumps({"state": state, "answers": self.served, "held": self.held,
                        "restarted": self.restarted, "latency_ms": self.latency_ms}),
            qos=1, retain=True)

    def close(self) -> None:
        for t in list(self.tasks):
            t.cancel()


def event_of(payload: bytes, props: dict[str, Any]) -> dict[str, Any]:
    """A CloudEvent as one dict, from structured mode or binary (MQTT 5 properties)."""
    if props and "type" in props and "specversion" in props:
        ev = {k: v for k, v in props.items() if k[:1].islower()}
        ev["data"] = json.loads(payload) if payload else None
        return ev
    ev = json.loads(payload)
    return ev if isinstance(ev, dict) else {}


async def sensors(cell: Cell) -> None:
    """The cell's sensors alone (its machines are PLCs the host drives over OPC UA):
    each pull event, again and again; a job that waits for one takes it."""
    while True:
        await cell.publish("events", EVENTS[0], {"passed": True})
        await cell.publish("events", EVENTS[1], {"torque_ok": True})
        for job_id in list(cell.booth_jobs):      # the booth reports per job
            await cell.publish("events", EVENTS[2], {"ready": True}, correlationid=job_id)
        await asyncio.sleep(SENSOR_S / cell.speed)


@mission
async def station(api: Any, scope: str, speed: float = 1.0, seed: int = 0,
                  equipment: str = "equipment", mes: str = "mes",
                  events_only: bool = False) -> AsyncIterator[int]:
    cell = Cell(api, scope, speed, random.Random(f"{seed}/{scope}"), equipment)
    if events_only:
        api.mqtt.subscribe(f"{mes}/{scope.replace('.', '/')}/events", cell.on_status)
        await cell.announce(list(EVENTS))
        await cell.report()
        task = asyncio.get_running_loop().create_task(sensors(cell))
        try:
            while True:
                await asyncio.sleep(0.5)
                yield 0
        finally:
            task.cancel()
            api.mqtt.publish(f"{equipment}/{scope}/capabilities/station", b"", qos=1,
                             retain=True)
    api.mqtt.subscribe(f"{equipment}/{scope}/commands", cell.on_command)
    api.mqtt.subscribe(f"{mes}/{scope.replace('.', '/')}/events", cell.on_status)
    # a host that starts asks for the announcement again (its broker may keep retained
    # messages from a wildcard subscription)
    api.mqtt.subscribe(f"{equipment}/{scope}/capabilities",
                       lambda *_: cell.later(0, cell.announce, [*WORK_MS, *EVENTS]))
    api.log.info(f"station for scope {scope} ready (speed {speed})")
    await cell.announce([*WORK_MS, *EVENTS])
    await cell.report()     # after the subscriptions: the broker has them by now
    try:
        n = 0
        while True:
            await asyncio.sleep(0.1)
            cell.resend()
            n += 1
            if n % 5 == 0:
                await cell.report()
            yield cell.served
    finally:
        cell.close()
        # withdrawn when the station stops (queued, not awaited: we may be cancelled)
        api.mqtt.publish(f"{equipment}/{scope}/capabilities/station", b"", qos=1, retain=True)
        api.log.info(f"station for scope {scope} stopped after {cell.served} answers")
