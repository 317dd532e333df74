"""The API a Task or Mission gets as ``api``: variables, log, score, MQTT, jobs.

One ``ScriptAPI`` per Task and per Mission instance (its log and score are its own);
the variables, the MQTT link and the job API are the engine's, shared by all.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
import os
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from sfc_host.engine.ports import (
    EngineControl,
    Handler,
    JobAPI,
    MissionHandle,
    Props,
    TaskHandle,
    Variables,
)
from sfc_host.errors import SfcHostError
from sfc_host.mqtt import filter_problem, topic_matches
from sfc_host.tracing.context import InvalidTraceParent, parse_traceparent, valid_tracestate

log = logging.getLogger("sfc_host.engine")


def describe(e: BaseException, script_file: str | None = None) -> str:
    """``Type: message (file line N)``, the line being the innermost one of the script."""
    text = f"{type(e).__name__}: {e}".replace("\n", " ")
    if script_file:
        line = 0
        for frame, lineno in traceback.walk_tb(e.__traceback__):
            if frame.f_code.co_filename == script_file:
                line = lineno
        if line:
            text += f" ({os.path.basename(script_file)} line {line})"
    return text


class ScriptAPIError(SfcHostError, RuntimeError):
    """A script called the API in a way it cannot serve (named in the message)."""


# ---- variables ------------------------------------------------------------------------


class VariableStore:
    """The engine's shared variables: only declared names (a typo is an error)."""

    def __init__(self) -> None:
        self._values: dict[str, Any] = {}
        self._lock = threading.Lock()   # sync tasks run in worker threads

    def reset(self, initial: dict[str, Any]) -> None:
        with self._lock:
            self._values = dict(initial)

    def clear(self) -> None:
        self.reset({})

    def __getitem__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            raise KeyError(f"no variable {name!r}; declare it in a script with "
                           f"Variable({name!r}, initial)") from None

    def __setitem__(self, name: str, value: Any) -> None:
        with self._lock:
            if name not in self._values:
                raise KeyError(f"no variable {name!r}; declare it in a script with "
                               f"Variable({name!r}, initial)")
            self._values[name] = value

    def get(self, name: str, default: Any = None) -> Any:
        return self._values.get(name, default)

    def set(self, name: str, value: Any) -> None:
        self[name] = value

    def __contains__(self, name: object) -> bool:
        return name in self._values

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._values))

    def __len__(self) -> int:
        return len(self._values)

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return dict(self._values)


# ---- log ------------------------------------------------------------------------------


class ScriptLog:
    """Log lines of one Task or Mission: kept (bounded) and sent to Python logging."""

    def __init__(self, kind: str, name: str, *, keep: int) -> None:
        self.logger = logging.getLogger(f"sfc_host.engine.scripts.{kind}.{name}")
        self.lines: deque[dict[str, Any]] = deque(maxlen=keep)
        self.dropped = 0

    def _add(self, level: int, msg: str) -> None:
        if len(self.lines) == self.lines.maxlen:
            self.dropped += 1
        self.lines.append({"t": int(time.time() * 1000), "level": logging.getLevelName(level),
                           "msg": str(msg)})
        self.logger.log(level, "%s", msg)

    def __call__(self, msg: str) -> None:
        self._add(logging.INFO, msg)

    def debug(self, msg: str) -> None:
        self._add(logging.DEBUG, msg)

    def info(self, msg: str) -> None:
        self._add(logging.INFO, msg)

    def warning(self, msg: str) -> None:
        self._add(logging.WARNING, msg)

    def error(self, msg: str) -> None:
        self._add(logging.ERROR, msg)


# ---- MQTT -----------------------------------------------------------------------------


def wants_properties(handler: Handler) -> bool:
    """Whether a handler takes a third positional parameter (the properties)."""
    try:
        params = inspect.signature(handler).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = [p for p in params
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 3 or any(p.kind is p.VAR_POSITIONAL for p in params)


class LocalBus:
    """An in-process MQTT stand-in: scripts of one engine talk to each other.

    Used when the engine has no MQTT link; keeps retained messages like a broker.
    """

    def __init__(self) -> None:
        self._subs: list[tuple[str, Handler]] = []
        self.retained: dict[str, tuple[bytes, Props]] = {}

    async def publish(self, topic: str, payload: bytes, *, qos: int = 0,
                      retain: bool = False, properties: Props | None = None) -> None:
        props = dict(properties or {})
        if retain:
            if payload:
                self.retained[topic] = (payload, props)
            else:
                self.retained.pop(topic, None)
        for flt, handler in list(self._subs):
            if topic_matches(flt, topic):
                await _deliver(handler, topic, payload, props)

    def subscribe(self, topic_filter: str, handler: Handler) -> Callable[[], None]:
        entry = (topic_filter, handler)
        self._subs.append(entry)
        for topic, (payload, props) in list(self.retained.items()):
            if topic_matches(topic_filter, topic):
                asyncio.get_running_loop().create_task(
                    _deliver(handler, topic, payload, props))

        def unsubscribe() -> None:
            if entry in self._subs:
                self._subs.remove(entry)
        return unsubscribe


async def _deliver(handler: Handler, topic: str, payload: bytes, props: Props) -> None:
    try:
        r = handler(topic, payload, props) if wants_properties(handler) else \
            handler(topic, payload)
        if inspect.isawaitable(r):
            await r
    except Exception:
        log.exception("MQTT handler for %s raised", topic)


def _to_bytes(payload: Any) -> bytes:
    if isinstance(payload, bytes):
        return payload
    if isinstance(payload, str):
        return payload.encode()
    import json
    return json.dumps(payload, separators=(",", ":")).encode()


class ScriptMqtt:
    """``api.mqtt``: publish and subscribe through the engine's link.

    ``publish`` schedules the send and returns a future: ``await`` it in async code,
    ignore it (or ``.result()``) in a sync task, which runs in a worker thread.
    Subscriptions end with their Task or Mission.
    """

    def __init__(self, engine: EngineControl) -> None:
        self._engine = engine
        self._unsubs: list[Callable[[], None]] = []

    def publish(self, topic: str, payload: Any, *, qos: int = 0, retain: bool = False,
                properties: Props | None = None, traceparent: str | None = None,
                tracestate: str | None = None,
                ) -> asyncio.Future[None] | concurrent.futures.Future[None]:
        """``traceparent`` (and ``tracestate``) put the message in a trace: sent as the
        CloudEvent attributes of that name in the MQTT 5 user properties (a message in
        structured mode carries them in its JSON instead). ``ScriptAPIError`` for one
        that breaks the W3C format."""
        if traceparent is not None:
            try:
                parse_traceparent(traceparent)
            except InvalidTraceParent as e:
                raise ScriptAPIError(f"api.mqtt.publish: traceparent {traceparent!r}: "
                                     f"{e}") from None
            properties = {**(properties or {}), "traceparent": traceparent}
            state = valid_tracestate(tracestate)
            if state:
                properties["tracestate"] = state
        coro = self._engine.mqtt.publish(topic, _to_bytes(payload), qos=qos, retain=retain,
                                         properties=properties)
        return self._engine.run_on_loop(coro)

    def subscribe(self, topic_filter: str, handler: Handler) -> Callable[[], None]:
        """``ScriptAPIError`` at once for what is no MQTT topic filter (the broker would
        refuse it, or the link could not even send it)."""
        problem = filter_problem(topic_filter)
        if problem:
            raise ScriptAPIError(f"api.mqtt.subscribe({str(topic_filter)[:200]!r}): {problem}")
        unsub = self._engine.mqtt.subscribe(topic_filter, handler)
        self._unsubs.append(unsub)
        return unsub

    def close(self) -> None:
        for u in self._unsubs:
            try:
                u()
            except Exception:
                log.exception("unsubscribe failed")
        self._unsubs.clear()


# ---- jobs -----------------------------------------------------------------------------


class JobsNotConnected:
    """The job API of an engine that runs without the host's job control."""

    def _refuse(self, what: str) -> ScriptAPIError:
        return ScriptAPIError(f"api.jobs.{what}: this engine is not connected to job "
                              "control (run it inside the host: sfc-host run)")

    async def submit(self, job_order: dict[str, Any], *, scope: str,
                     start: bool = True) -> str:
        raise self._refuse("submit")

    async def query(self, job_id: str, *, scope: str) -> dict[str, Any] | None:
        raise self._refuse("query")

    async def pause(self, job_id: str, *, scope: str, reason: str = "") -> str:
        raise self._refuse("pause")

    async def resume(self, job_id: str, *, scope: str, reason: str = "") -> str:
        raise self._refuse("resume")

    async def stop(self, job_id: str, *, scope: str, reason: str = "") -> str:
        raise self._refuse("stop")

    async def abort(self, job_id: str, *, scope: str, reason: str = "") -> str:
        raise self._refuse("abort")


# ---- the API object -------------------------------------------------------------------


class ScriptAPI:
    """Passed as the first argument to every Task execution and Mission."""

    def __init__(self, engine: EngineControl, kind: str, name: str, *, keep_log: int) -> None:
        self._engine = engine
        self.kind = kind
        self.name = name
        self.log = ScriptLog(kind, name, keep=keep_log)
        self.score: float = 0
        self.mqtt = ScriptMqtt(engine)

    @property
    def vars(self) -> Variables:
        return self._engine.vars

    @property
    def jobs(self) -> JobAPI:
        return self._engine.jobs

    def add_score(self, points: float) -> float:
        self.score += points
        return self.score

    def task(self, name: str) -> TaskHandle:
        """Another Task of the engine (``enable()`` / ``disable()`` it, read its state)."""
        return self._engine.task(name)

    def create_mission(self, name: str, **args: Any) -> MissionHandle:
        return self._engine.create_mission(name, **args)

    async def start_mission(self, name: str, **args: Any) -> MissionHandle:
        return await self._engine.start_mission(name, **args)

    def close(self) -> None:
        self.mqtt.close()

