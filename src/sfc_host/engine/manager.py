"""The Engine manager: builds the scripts folder and runs its Tasks and Missions.

It follows the ``ENGINE`` machine of the ScriptEngine document:

- Initializing -> Idle when the engine is set up (``InitializationCompleted``).
- Scripts are edited and saved only in Idle; elsewhere a clear refusal.
- Build (from Idle, BuildError or Ready) disposes the Tasks and Missions of an
  earlier build, compiles every script and extracts Tasks, Missions and Variables.
  Script errors (with file and line) go to BuildError; success goes to Ready, where
  the Tasks are created anew (in Idle) and Missions can be created.
- Start: Starting auto-starts every Task with ``auto_start``, then Running. Missions
  start only while Running.
- Stop: Stopping stops every Task and cancels every Mission in progress, and goes
  to Ready only when every Task is at rest (Stopped; or Idle / Error, where no timer
  runs) and no Mission is Running. Past ``stop_timeout`` it goes to Fault instead.
- Reset disposes every Task and Mission and returns to Idle (through Resetting
  where the machine says so).
- An unexpected error of the engine itself goes to Fault, which only Reset leaves.
  A built-in Task marked critical (the host's own loops) that fails faults it too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import tempfile
import traceback
from collections import deque
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from sfc_fast import ENGINE, InvalidTransition
from sfc_host.engine.api import JobsNotConnected, LocalBus, VariableStore
from sfc_host.engine.build import SCRIPT_NAME, Build, BuildFailed, BuildProblem, build_scripts
from sfc_host.engine.missions import MemoryMissionStore, MissionInstance, MissionStore
from sfc_host.engine.ports import JobAPI, MissionHandle, MqttLink
from sfc_host.engine.script import MissionDef, TaskDef
from sfc_host.engine.tasks import TaskRunner
from sfc_host.errors import SfcHostError

log = logging.getLogger("sfc_host.engine")

S = {name: ENGINE.state_id(name) for name in ENGINE.states}
T = {name: ENGINE.trigger_id(name) for name in ENGINE.triggers}
HAS_BUILD = frozenset((S["Ready"], S["Starting"], S["Running"], S["Stopping"]))


class EngineStateError(SfcHostError, RuntimeError):
    """An operation the engine does not allow in its current state."""


class EngineFault(SfcHostError, RuntimeError):
    """The engine went to Fault; ``reason`` says why. Only Reset leaves Fault."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"engine fault: {reason}")


class Engine:
    """The ScriptEngine: one scripts folder, its Tasks, Missions and Variables.

    Implements ``EngineControl`` (``sfc_host.engine.ports``), what its Task runners
    and Mission instances call back.
    """

    def __init__(
        self,
        scripts: str | os.PathLike[str],
        *,
        store: MissionStore | None = None,
        mqtt: MqttLink | None = None,
        jobs: JobAPI | None = None,
        stop_timeout: float = 10.0,
        initialize: bool = True,
    ) -> None:
        self.scripts = Path(scripts)
        self.store: MissionStore = store if store is not None else MemoryMissionStore()
        self.mqtt: MqttLink = mqtt if mqtt is not None else LocalBus()
        self.jobs: JobAPI = jobs if jobs is not None else JobsNotConnected()
        self.stop_timeout = stop_timeout
        self.vars = VariableStore()
        self.tasks: dict[str, TaskRunner] = {}
        self.missions: dict[str, MissionDef] = {}
        self.instances: dict[str, MissionInstance] = {}
        self.problems: list[BuildProblem] = []
        self.fault_reason: str | None = None
        self.unsaved: deque[dict[str, Any]] = deque(maxlen=1000)  # records Redis refused
        self.ended = 0                    # mission instances ended since start
        self._builtins: dict[str, TaskDef] = {}
        self._build: Build | None = None
        self._state = ENGINE.initial
        self._lock: asyncio.Lock | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._settled: asyncio.Event | None = None
        self._listeners: list[Callable[[Engine], None]] = []
        self._halting: asyncio.Task[None] | None = None
        if initialize:
            self.initialize()

    # ---- state --------------------------------------------------------------------

    @property
    def state(self) -> str:
        return ENGINE.state_name(self._state)

    def permitted(self) -> tuple[str, ...]:
        return ENGINE.permitted(self._state)

    def _fire(self, trigger: str) -> None:
        old = self._state
        self._state = ENGINE.fire(self._state, T[trigger])
        log.info("engine: %s --%s--> %s", ENGINE.state_name(old), trigger, self.state)
        self.notify_change()

    def on_change(self, listener: Callable[[Engine], None]) -> None:
        """Call ``listener(engine)`` after every state change of the engine, a Task or
        a Mission (on the event loop; keep it short)."""
        self._listeners.append(listener)

    def notify_change(self) -> None:
        """Something changed state: wake the stop waiting for quiescence and call the
        listeners."""
        if self._settled is not None:
            self._settled.set()
        for f in self._listeners:
            try:
                f(self)
            except Exception:
                log.exception("engine listener failed")

    def _bind_loop(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._lock is None:
            self._loop = loop
            self._lock = asyncio.Lock()
            self._settled = asyncio.Event()
        return self._lock

    def run_on_loop(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Schedule ``coro`` on the engine's loop from the loop or a worker thread."""
        loop = self._loop
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is not None and (loop is None or running is loop):
            return running.create_task(coro)
        if loop is None:
            coro.close()
            raise EngineStateError("the engine is not running on an event loop")
        return asyncio.run_coroutine_threadsafe(coro, loop)

    def require_tasks_may_run(self, name: str) -> None:
        """``EngineStateError`` unless Tasks may start (Starting or Running)."""
        if self._state not in (S["Starting"], S["Running"]):
            raise EngineStateError(f"task {name} can start only while the engine is "
                                   f"Starting or Running; it is {self.state}")

    def require_running(self, what: str) -> None:
        """``EngineStateError`` saying it cannot ``what`` unless the engine is Running."""
        if self._state != S["Running"]:
            raise EngineStateError(f"cannot {what}: the engine is {self.state}, "
                                   "not Running")

    # ---- Initializing -------------------------------------------------------------

    def initialize(self) -> None:
        """Initializing -> Idle: the scripts folder exists (created if missing)."""
        if self._state != S["Initializing"]:
            ENGINE.fire(self._state, T["InitializationCompleted"])
        self.scripts.mkdir(parents=True, exist_ok=True)
        self._fire("InitializationCompleted")

    # ---- scripts (Idle only) ------------------------------------------------------

    def _require_idle(self, what: str) -> None:
        if self._state != S["Idle"]:
            raise EngineStateError(
                f"cannot {what}: scripts can be edited only while the engine is Idle; "
                f"it is {self.state} (reset it first)")

    def _script_path(self, name: str) -> Path:
        if not SCRIPT_NAME.match(name):
            raise ValueError(f"{name!r} is not a script name (letters, digits and _, "
                             "ending in .py)")
        return self.scripts / name

    def list_scripts(self) -> list[str]:
        return sorted(p.name for p in self.scripts.glob("*.py") if SCRIPT_NAME.match(p.name))

    def read_script(self, name: str) -> str:
        return self._script_path(name).read_text(encoding="utf-8")

    def save_script(self, name: str, text: str) -> None:
        self._require_idle(f"save {name}")
        path = self._script_path(name)
        fd, tmp = tempfile.mkstemp(dir=self.scripts, prefix=".", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def delete_script(self, name: str) -> None:
        self._require_idle(f"delete {name}")
        self._script_path(name).unlink()

    # ---- built-in tasks -----------------------------------------------------------

    def add_builtin_task(self, name: str, fn: Callable[..., Any], *, interval: float,
                         auto_start: bool = True, critical: bool = True) -> None:
        """Register one of the host's own loops as a Task of every build.

        It is created with the script Tasks at the next build (Building -> Ready),
        starts with the engine and stops with it; ``critical``: an execution that
        raises faults the engine.
        """
        if interval < 0:
            raise ValueError("interval must be >= 0")
        self._builtins[name] = TaskDef(name, fn, float(interval), auto_start,
                                       "<builtin>", 0, builtin=True, critical=critical)

    # ---- Build --------------------------------------------------------------------

    async def build(self) -> list[BuildProblem]:
        """Build the scripts; the problems (empty when the engine is Ready)."""
        async with self._bind_loop():
            self._fire("Build")
            try:
                await self._dispose_all()       # the previous build's Tasks and Missions
                try:
                    build = await asyncio.to_thread(
                        build_scripts, self.scripts, list(self._builtins.values()))
                except BuildFailed as e:
                    self.problems = e.problems
                    self._fire("BuildErrorOccurred")
                    return list(self.problems)
                self._install(build)
                self._fire("BuildingCompleted")
                return []
            except (BuildFailed, InvalidTransition, EngineFault):
                raise
            except Exception as e:
                raise self._fault_now(f"build failed: {_one_line(e)}") from e

    def _install(self, build: Build) -> None:
        self.problems = []
        self._build = build
        self.vars.reset(build.variables)
        for v in build.declared:
            v.bind(self.vars)
        self.missions = dict(build.missions)
        self.tasks = {name: TaskRunner(d, self) for name, d in build.tasks.items()}

    # ---- Start / Stop -------------------------------------------------------------

    async def start(self) -> None:
        """Ready -> Starting (auto-start Tasks) -> Running."""
        async with self._bind_loop():
            self._fire("Start")
            try:
                for t in list(self.tasks.values()):
                    if t.auto_start:
                        await t.start()
                self._fire("StartingCompleted")
            except Exception as e:
                raise self._fault_now(f"start failed: {_one_line(e)}") from e

    def quiescent(self) -> bool:
        """Stopping may end: every Task at rest and no Mission Running.

        A cancelled Mission is waited for until it is Canceled (the seed: "wait for
        Canceled") and its record is saved (an ended instance leaves ``instances``
        only then), so every instance left is Idle.
        """
        return (all(t.at_rest for t in self.tasks.values())
                and all(m.state == "Idle" for m in self.instances.values()))

    def blockers(self) -> list[str]:
        """What keeps Stopping from ending: Tasks not at rest, Missions not Idle."""
        return ([f"task {t.name} is {t.state}" for t in self.tasks.values() if not t.at_rest]
                + [f"mission {m.id} is {m.state}" + (" (saving its record)" if m.terminal
                                                     else "")
                   for m in self.instances.values() if m.state != "Idle"])

    async def stop(self) -> None:
        """Running -> Stopping -> Ready (when every Task is Stopped and no Mission runs)."""
        async with self._bind_loop():
            self._fire("Stop")
            try:
                for m in list(self.instances.values()):
                    if m.active:
                        m.request_cancel()
                stops = [t.stop(self.stop_timeout) for t in self.tasks.values()
                         if t.state in ("Running", "Paused", "Pausing", "Resuming")]
                results = await asyncio.gather(*stops, return_exceptions=True)
                for r in results:
                    if isinstance(r, BaseException) and not isinstance(r, InvalidTransition):
                        log.error("engine stop: a task failed to stop: %s", _one_line(r))
                if not await self._wait_quiescent(self.stop_timeout):
                    raise self._fault_now("stop timed out: " + "; ".join(self.blockers()))
                self._fire("StoppingCompleted")
            except EngineFault:
                raise
            except Exception as e:
                raise self._fault_now(f"stop failed: {_one_line(e)}") from e

    async def _wait_quiescent(self, timeout: float) -> bool:
        assert self._settled is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not self.quiescent():
            left = deadline - loop.time()
            if left <= 0:
                return False
            self._settled.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._settled.wait(), min(left, 0.5))
        return True

    # ---- Reset --------------------------------------------------------------------

    async def reset(self) -> None:
        """Dispose every Task and Mission; back to Idle (through Resetting if need be)."""
        async with self._bind_loop():
            self._fire("Reset")
            try:
                await self._dispose_all()
                self._unload()
                self.fault_reason = None
                if self._state == S["Resetting"]:
                    self._fire("ResettingCompleted")
            except Exception as e:
                raise self._fault_now(f"reset failed: {_one_line(e)}") from e

    def _unload(self) -> None:
        if self._build is not None:
            self._build.unload()
        self._build = None
        self.missions = {}
        self.problems = []
        self.vars.clear()

    async def _dispose_all(self) -> None:
        """Cancel Missions in progress (their records are saved), drop Idle ones, and
        dispose every Task (stopping it first)."""
        if self._halting is not None:
            await asyncio.wait({self._halting})
        active = [m for m in self.instances.values() if m.active]
        for m in active:
            m.request_cancel()
        if active:
            await asyncio.wait([asyncio.ensure_future(m.join()) for m in active],
                               timeout=self.stop_timeout)
        for m in list(self.instances.values()):
            await m.force_end()   # an instance that would not end on the cancel
        self.instances.clear()
        tasks, self.tasks = list(self.tasks.values()), {}
        await asyncio.gather(*(t.dispose(self.stop_timeout) for t in tasks))
        self.notify_change()

    # ---- Fault --------------------------------------------------------------------

    def fault(self, reason: str) -> bool:
        """Report an unexpected engine error: to Fault (if the state allows it), and
        halt every Task and Mission. True if the engine went to Fault."""
        if not ENGINE.can_fire(self._state, T["FaultOccurred"]):
            log.error("engine: fault in state %s (not recorded as Fault): %s",
                      self.state, reason)
            return False
        self.fault_reason = reason
        log.error("engine fault: %s", reason)
        self._fire("FaultOccurred")
        if self._loop is not None and self._loop.is_running():
            self._halting = self._loop.create_task(self._halt_all())
        return True

    def _fault_now(self, reason: str) -> EngineFault:
        log.error("engine: %s\n%s", reason, traceback.format_exc())
        self.fault(reason)
        return EngineFault(reason)

    async def _halt_all(self) -> None:
        # Nothing keeps running in Fault; Reset disposes what is left.
        for m in list(self.instances.values()):
            if m.active:
                m.request_cancel()
        await asyncio.gather(*(t.stop(self.stop_timeout) for t in self.tasks.values()
                               if t.state in ("Running", "Paused")),
                             return_exceptions=True)

    # ---- Tasks and Missions -------------------------------------------------------

    def task(self, name: str) -> TaskRunner:
        try:
            return self.tasks[name]
        except KeyError:
            known = ", ".join(sorted(self.tasks)) or "none"
            raise KeyError(f"no task {name!r} (tasks: {known})") from None

    def create_mission(self, name: str, **args: Any) -> MissionInstance:
        """A new Mission instance in Idle (the engine must have a build)."""
        if self._state not in HAS_BUILD or self._state == S["Stopping"]:
            raise EngineStateError(f"cannot create mission {name}: the engine is "
                                   f"{self.state} (build it first)")
        try:
            defn = self.missions[name]
        except KeyError:
            known = ", ".join(sorted(self.missions)) or "none"
            raise KeyError(f"no mission {name!r} (missions: {known})") from None
        self._bind_loop_soft()
        inst = MissionInstance(defn, self, args)
        self.instances[inst.id] = inst
        self.notify_change()
        return inst

    def _bind_loop_soft(self) -> None:
        with contextlib.suppress(RuntimeError):
            self._bind_loop()

    async def start_mission(self, name: str, **args: Any) -> MissionInstance:
        """Create and start a Mission instance (the engine must be Running)."""
        self.require_running(f"start mission {name}")
        inst = self.create_mission(name, **args)
        try:
            return await inst.start()
        except BaseException:
            self.instances.pop(inst.id, None)
            raise

    async def mission_ended(self, inst: MissionHandle) -> None:
        """A Mission reached a final state: save its record, then dispose it."""
        assert inst.record is not None
        pending = [*self.unsaved, inst.record]
        self.unsaved.clear()
        for i, rec in enumerate(pending):
            try:
                await self.store.save(rec)
                if rec is inst.record:
                    inst.saved = True
            except Exception as e:
                log.error("mission %s: record not saved (%s); kept to retry",
                          rec.get("id"), _one_line(e))
                self.unsaved.extend(pending[i:])
                break
        self.ended += 1
        self.instances.pop(inst.id, None)
        self.notify_change()

    # ---- status -------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "permitted": list(self.permitted()),
            "scripts": str(self.scripts),
            "fault": self.fault_reason,
            "problems": [p.to_dict() for p in self.problems],
            "tasks": [t.status() for t in self.tasks.values()],
            "missions": sorted(self.missions),
            "instances": [m.status() for m in self.instances.values()],
            "missions_ended": self.ended,
            "unsaved_records": len(self.unsaved),
            "variables": {k: _safe(v) for k, v in self.vars.snapshot().items()},
        }

    def __repr__(self) -> str:
        return f"<Engine {self.scripts} {self.state}>"


def _one_line(e: BaseException) -> str:
    return "".join(traceback.format_exception_only(type(e), e)).strip().replace("\n", " ")


def _safe(v: Any) -> Any:
    if isinstance(v, str | int | float | bool) or v is None:
        return v
    return repr(v)

