"""Mission instances under the ``MISSION`` machine, and where their records go.

Rules (ScriptEngine document, Mission machine):

- ``engine.create_mission(name, **args)`` makes an instance in Idle; it may start
  only while the engine is Running. Many instances run at once.
- The mission is an async generator; each ``yield`` is a point where it may pause
  or be cancelled (the document's ``MoveNext``). ``pause()`` moves it to Pausing;
  at its next ``yield`` it becomes Paused and the generator is not advanced until
  ``resume()`` (Resuming, then Running, continuing right after that ``yield``).
- ``cancel()`` from Running or Paused: Canceling; a running step is interrupted
  (``CancelledError`` at its ``await``), the generator is closed (its ``finally``
  blocks run), then Canceled. An exception while closing is Error.
- Finishing is Completed; an exception is Error. Completed, Canceled and Error are
  final: the instance's record (state, log lines, score, timings) is saved, then
  the instance is disposed (removed from the engine).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

from sfc_fast import MISSION
from sfc_host.aio import reap
from sfc_host.engine.api import ScriptAPI, describe
from sfc_host.engine.ports import EngineControl
from sfc_host.engine.script import MissionDef

if TYPE_CHECKING:
    import redis.asyncio as aioredis

log = logging.getLogger("sfc_host.engine")

S = {name: MISSION.state_id(name) for name in MISSION.states}
T = {name: MISSION.trigger_id(name) for name in MISSION.triggers}
TERMINAL = frozenset(S[n] for n in MISSION.final_states())
# In progress: Stopping cancels these (Idle instances are left alone).
ACTIVE = frozenset((S["Running"], S["Pausing"], S["Paused"], S["Resuming"], S["Canceling"]))

MAX_LOG_LINES = 10_000


def _now_ms() -> int:
    return int(time.time() * 1000)


class MissionInstance:
    """One run of a Mission: its state, generator, log, score and timings."""

    def __init__(self, defn: MissionDef, engine: EngineControl,
                 args: dict[str, Any]) -> None:
        self.defn = defn
        self.name = defn.name
        self.args = args
        self.id = f"{defn.name}-{uuid.uuid4().hex[:12]}"
        self._engine = engine
        self._state = MISSION.initial
        self.api = ScriptAPI(engine, "mission", defn.name, keep_log=MAX_LOG_LINES)
        self.steps = 0                  # yields reached
        self.last_value: Any = None     # the value of the last yield
        self.error: BaseException | None = None
        self.error_text: str | None = None
        self.created_at = _now_ms()
        self.started_at: int | None = None
        self.ended_at: int | None = None
        self.paused_s = 0.0
        self._paused_since: float | None = None
        self._t_start: float | None = None
        self.running_s = 0.0
        self.record: dict[str, Any] | None = None
        self.saved = False
        self._driver: asyncio.Task[None] | None = None
        self._step: asyncio.Task[Any] | None = None
        self._wake = asyncio.Event()
        self._ended = asyncio.Event()
        self._changed = asyncio.Event()

    # ---- state --------------------------------------------------------------------

    @property
    def state(self) -> str:
        return MISSION.state_name(self._state)

    @property
    def state_id(self) -> int:
        return self._state

    @property
    def terminal(self) -> bool:
        return self._state in TERMINAL

    @property
    def active(self) -> bool:
        return self._state in ACTIVE

    @property
    def score(self) -> float:
        return self.api.score

    def permitted(self) -> tuple[str, ...]:
        return MISSION.permitted(self._state)

    def _fire(self, trigger: str) -> None:
        old = self._state
        self._state = MISSION.fire(self._state, T[trigger])
        log.debug("mission %s: %s --%s--> %s", self.id, MISSION.state_name(old), trigger,
                  self.state)
        self._changed.set()
        self._engine.notify_change()

    # ---- public operations --------------------------------------------------------

    async def start(self) -> MissionInstance:
        if not MISSION.can_fire(self._state, T["Start"]):
            MISSION.fire(self._state, T["Start"])   # raises InvalidTransition
        self._engine.require_running(f"start mission {self.name}")
        self._fire("Start")
        self.started_at = _now_ms()
        self._t_start = time.monotonic()
        self._driver = asyncio.get_running_loop().create_task(
            self._drive(), name=f"mission:{self.id}")
        return self

    def pause(self) -> str:
        """Running -> Pausing; Paused at the next ``yield``."""
        self._fire("Pause")
        return self.state

    def resume(self) -> str:
        """Paused -> Resuming -> Running, continuing after the ``yield`` it paused at."""
        self._fire("Resume")
        self._wake.set()
        return self.state

    def cancel(self) -> str:
        """Running or Paused -> Canceling -> Canceled."""
        self._fire("Cancel")
        self._interrupt()
        return self.state

    def _interrupt(self) -> None:
        if self._step is not None and not self._step.done():
            self._step.cancel()
        self._wake.set()

    def request_cancel(self) -> None:
        """Cancel for the engine (Stopping, Reset): also from Pausing or Resuming,
        by letting the driver pass through Paused / Running first."""
        self._cancel_requested = True
        if MISSION.can_fire(self._state, T["Cancel"]):
            self.cancel()
        else:
            self._interrupt()

    _cancel_requested = False

    async def force_end(self) -> None:
        """End an instance whose driver would not end on a cancel: cancel the driver
        (the instance is recorded as Canceled) and wait for it."""
        driver = self._driver
        if driver is not None and not driver.done():
            driver.cancel()
            await reap(driver)

    async def wait(self, *states: str, timeout: float | None = None) -> str:
        """Wait until the instance is in one of ``states`` (any final state if none)."""
        want = {MISSION.state_id(s) for s in states} if states else TERMINAL

        async def until() -> None:
            while self._state not in want:
                self._changed.clear()
                await self._changed.wait()
        await asyncio.wait_for(until(), timeout)
        return self.state

    async def join(self, timeout: float | None = None) -> str:
        """Wait until the instance has ended and its record is saved."""
        await asyncio.wait_for(self._ended.wait(), timeout)
        return self.state

    # ---- the driver ---------------------------------------------------------------

    async def _next(self, agen: Any) -> Any:
        return await agen.__anext__()

    async def _drive(self) -> None:
        try:
            args = (self.api,) if self.defn.takes_api else ()
            try:
                agen = self.defn.fn(*args, **self.args)
            except TypeError as e:     # wrong arguments
                self._fail(e)
                return
            await self._run(agen)
        except Exception as e:          # a bug of ours: still end the instance
            log.exception("mission %s: driver failed", self.id)
            if MISSION.can_fire(self._state, T["ErrorOccurred"]):
                self._fail(e)
        finally:
            await self._finish()

    async def _run(self, agen: Any) -> None:
        finished = False   # the generator returned; ending it is still a pause point
        while True:
            # here the generator stands at a yield (or has not started, or has ended)
            if self._state == S["Pausing"]:
                self._fire("CompletePausing")
                self._paused_since = time.monotonic()
                while self._state == S["Paused"]:
                    if self._cancel_requested:
                        self._fire("Cancel")
                        break
                    self._wake.clear()
                    await self._wake.wait()
                self.paused_s += time.monotonic() - self._paused_since
                self._paused_since = None
            if self._state == S["Resuming"]:
                self._fire("CompleteResuming")
            if self._state == S["Running"] and self._cancel_requested:
                self._fire("Cancel")
            if self._state == S["Canceling"]:
                await self._close(agen)
                return
            if finished:
                self._fire("CompleteRunning")
                return
            self._step = asyncio.get_running_loop().create_task(self._next(agen))
            await asyncio.wait({self._step})   # never propagates our cancellation into it
            step, self._step = self._step, None
            if step.cancelled():
                if self._state in (S["Canceling"], S["Pausing"]):
                    continue                   # interrupted on purpose; settled at the top
                self._fail(asyncio.CancelledError("mission step was cancelled"))
                return
            e = step.exception()
            if isinstance(e, StopAsyncIteration):
                finished = True
                continue
            if e is not None:
                if isinstance(e, asyncio.CancelledError) and self._state == S["Canceling"]:
                    continue
                self._fail(e)   # Running, Pausing or Canceling -> Error
                return
            self.steps += 1
            self.last_value = step.result()

    async def _close(self, agen: Any) -> None:
        try:
            await agen.aclose()
        except Exception as e:
            self._fail(e)
            return
        self._fire("CompleteCanceling")

    def _fail(self, e: BaseException) -> None:
        self.error = e
        self.error_text = describe(e, self.defn.file)
        self.api.log.error(f"mission raised {self.error_text}")
        log.error("mission %s raised %s", self.id, self.error_text,
                  exc_info=(type(e), e, e.__traceback__))
        self._fire("ErrorOccurred")

    async def _finish(self) -> None:
        if not self.terminal:   # the driver itself was cancelled (engine shutdown)
            with contextlib.suppress(Exception):
                if self._state in (S["Running"], S["Paused"]):
                    self._fire("Cancel")
                if self._state == S["Canceling"]:
                    self._fire("CompleteCanceling")
        self.ended_at = _now_ms()
        if self._t_start is not None:
            self.running_s = max(0.0, time.monotonic() - self._t_start - self.paused_s)
        self.record = self.to_record()
        self.api.close()
        try:
            await self._engine.mission_ended(self)
        finally:
            self._ended.set()

    def to_record(self) -> dict[str, Any]:
        duration = (None if self.started_at is None or self.ended_at is None
                    else self.ended_at - self.started_at)
        return {
            "id": self.id, "name": self.name, "state": self.state,
            "args": _jsonable(self.args), "score": self.api.score,
            "steps": self.steps, "error": self.error_text,
            "created_at": self.created_at, "started_at": self.started_at,
            "ended_at": self.ended_at, "duration_ms": duration,
            "running_ms": round(self.running_s * 1000),
            "paused_ms": round(self.paused_s * 1000),
            "log": list(self.api.log.lines), "log_dropped": self.api.log.dropped,
        }

    def status(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "state": self.state, "steps": self.steps,
                "score": self.api.score, "started_at": self.started_at}

    def __repr__(self) -> str:
        return f"<MissionInstance {self.id} {self.state}>"


def _jsonable(v: Any) -> Any:
    try:
        json.dumps(v)
        return v
    except (TypeError, ValueError):
        return json.loads(json.dumps(v, default=repr))


# ---- where records go -----------------------------------------------------------------


class MissionStore(Protocol):
    async def save(self, record: dict[str, Any]) -> None: ...
    async def list(self, *, name: str | None = None, state: str | None = None,
                   limit: int = 100) -> list[dict[str, Any]]: ...
    async def get(self, mission_id: str) -> dict[str, Any] | None: ...


def _matches(r: dict[str, Any], name: str | None, state: str | None) -> bool:
    return (name is None or r.get("name") == name) and (state is None or r.get("state") == state)


class MemoryMissionStore:
    """Records in memory (an engine without Redis, and tests)."""

    def __init__(self, keep: int = 10_000) -> None:
        self.records: dict[str, dict[str, Any]] = {}
        self.keep = keep

    async def save(self, record: dict[str, Any]) -> None:
        self.records[record["id"]] = record
        while len(self.records) > self.keep:
            self.records.pop(next(iter(self.records)))

    async def list(self, *, name: str | None = None, state: str | None = None,
                   limit: int = 100) -> list[dict[str, Any]]:
        out = [r for r in reversed(self.records.values()) if _matches(r, name, state)]
        return out[:limit]

    async def get(self, mission_id: str) -> dict[str, Any] | None:
        return self.records.get(mission_id)


def mission_prefix(cluster: bool) -> str:
    """The key prefix of mission records: one hash tag on a cluster, so that a record
    and the index change in one transaction (one slot)."""
    return "{sfc:engine}:" if cluster else "sfc:engine:"


class RedisMissionStore:
    """Records in Redis: ``{prefix}mission:{id}`` (JSON, with a TTL) and the index
    ``{prefix}missions`` (sorted set by end time, capped at ``keep`` entries)."""

    def __init__(self, client: aioredis.Redis, *, prefix: str = "sfc:engine:",
                 ttl_s: int = 30 * 86400, keep: int = 100_000) -> None:
        self.client = client
        self.prefix = prefix
        self.ttl_s = ttl_s
        self.keep = keep

    @classmethod
    def from_url(cls, url: str, **kw: Any) -> RedisMissionStore:
        import redis.asyncio as aioredis
        return cls(aioredis.Redis.from_url(url), **kw)

    def _key(self, mission_id: str) -> str:
        return f"{self.prefix}mission:{mission_id}"

    @property
    def index(self) -> str:
        return f"{self.prefix}missions"

    async def save(self, record: dict[str, Any]) -> None:
        data = json.dumps(record, separators=(",", ":"), default=repr)
        async with self.client.pipeline(transaction=True) as p:
            p.set(self._key(record["id"]), data, ex=self.ttl_s)
            p.zadd(self.index, {record["id"]: record.get("ended_at") or _now_ms()})
            p.zremrangebyrank(self.index, 0, -self.keep - 1)
            await p.execute()

    async def get(self, mission_id: str) -> dict[str, Any] | None:
        raw = await self.client.get(self._key(mission_id))
        return None if raw is None else json.loads(raw)

    async def list(self, *, name: str | None = None, state: str | None = None,
                   limit: int = 100) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        page = 500
        start = 0
        while len(out) < limit:
            ids = await self.client.zrevrange(self.index, start, start + page - 1)
            if not ids:
                break
            raws = await self.client.mget([self._key(_s(i)) for i in ids])
            expired = []
            for i, raw in zip(ids, raws, strict=True):
                if raw is None:
                    expired.append(i)
                    continue
                r = json.loads(raw)
                if _matches(r, name, state):
                    out.append(r)
                    if len(out) >= limit:
                        break
            if expired:   # records past their TTL: drop them from the index
                await self.client.zrem(self.index, *expired)
                start -= len(expired)
            start += page
        return out

    async def close(self) -> None:
        await self.client.aclose()


def _s(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v


def summarize(records: Iterable[dict[str, Any]]) -> list[str]:
    """A header line and one line per record, for ``sfc-host missions list`` (none
    without records)."""
    rows = []
    for r in records:
        ended = r.get("ended_at")
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ended / 1000)) if ended else "-"
        dur = r.get("duration_ms")
        dur_s = f"{dur / 1000:.3f}s" if isinstance(dur, int | float) else "-"
        err = " ".join(str(r.get("error") or "").split())   # one line per record
        rows.append([str(r["id"]), str(r["name"]), str(r["state"]), str(r.get("score", 0)),
                     str(r.get("steps", 0)), dur_s, when, err])
    if not rows:
        return []
    head = ["ID", "MISSION", "STATE", "SCORE", "STEPS", "DURATION", "ENDED", "ERROR"]
    widths = [max(len(row[i]) for row in [head, *rows]) for i in range(len(head))]
    right = {3, 4, 5}   # numbers line up on the right
    return ["  ".join(c.rjust(w) if i in right else c.ljust(w)
                      for i, (c, w) in enumerate(zip(row, widths, strict=True))).rstrip()
            for row in [head, *rows]]
