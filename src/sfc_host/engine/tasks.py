"""Task runner: a periodic Task under the ``TASK`` machine.

Rules (ScriptEngine document, Task machine):

- Start (from Idle, Stopped or Error) runs the Task every ``interval`` seconds, the
  first execution at once; only while the engine is Starting or Running.
- Pause (``disable()``) leaves the timer running with its phase; each tick while
  paused is skipped and counted. Pausing lasts until an execution in flight ends,
  so when ``disable()`` returns nothing of the Task is running.
- Resume (``enable()``) lets the next tick execute; the phase is unchanged.
- Stop only comes from the engine (Stopping): the timer ends, the execution in
  flight may finish within the stop timeout, then it is cancelled.
- An execution that raises moves the Task to Error with the exception kept; the
  timer ends. Start runs it again.
- A tick that finds the previous execution still running is skipped and counted:
  a Task never runs twice at once. Ticks missed while the loop was busy are skipped
  too, keeping the phase (``t0 + k * interval``).
- ``dispose()`` works from any state: stops the Task first, then releases it.

Sync functions run in a worker thread so a slow one does not stall the host's loops.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from sfc_fast import TASK
from sfc_host.aio import reap
from sfc_host.engine.api import ScriptAPI, describe
from sfc_host.engine.ports import EngineControl
from sfc_host.engine.script import TaskDef
from sfc_host.errors import SfcHostError

log = logging.getLogger("sfc_host.engine")

S = {name: TASK.state_id(name) for name in TASK.states}
T = {name: TASK.trigger_id(name) for name in TASK.triggers}
# States in which no timer runs: the Task is at rest (what the engine's stop waits for).
AT_REST = frozenset((S["Idle"], S["Stopped"], S["Error"]))


async def _finished(task: asyncio.Task[Any]) -> None:
    """Until ``task`` is done; cancelling the waiter leaves ``task`` running (as with
    ``asyncio.wait``, which costs a set, a waiter and its callbacks: for the host's
    back-to-back passes, a few microseconds an action at moderate rates)."""
    waiter = asyncio.get_running_loop().create_future()

    def done(_: asyncio.Task[Any]) -> None:
        if not waiter.done():
            waiter.set_result(None)
    task.add_done_callback(done)
    try:
        await waiter
    except asyncio.CancelledError:
        task.remove_done_callback(done)
        raise


class TaskDisposed(SfcHostError, RuntimeError):
    pass


class TaskRunner:
    """One Task of the engine: its state, timer, counters and API."""

    def __init__(self, defn: TaskDef, engine: EngineControl) -> None:
        self.defn = defn
        self.name = defn.name
        self.interval = defn.interval
        self.auto_start = defn.auto_start
        self._engine = engine
        self._state = TASK.initial
        self.api = ScriptAPI(engine, "task", defn.name, keep_log=200)
        self.runs = 0              # executions started
        self.skipped_paused = 0    # ticks skipped because the Task was paused
        self.skipped_busy = 0      # ticks skipped because an execution was still running
        self.skipped_late = 0      # ticks missed because the event loop was late
        self.errors = 0
        self.error: BaseException | None = None
        self.error_text: str | None = None
        self.last_start: float | None = None       # monotonic
        self.last_duration: float | None = None    # seconds
        self.disposed = False
        self._timer: asyncio.Task[None] | None = None
        self._exec: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._resumed = asyncio.Event()
        self._args = (self.api,) if defn.takes_api else ()

    # ---- state --------------------------------------------------------------------

    @property
    def state(self) -> str:
        return TASK.state_name(self._state)

    @property
    def state_id(self) -> int:
        return self._state

    @property
    def at_rest(self) -> bool:
        return self._state in AT_REST

    def permitted(self) -> tuple[str, ...]:
        return TASK.permitted(self._state)

    def _fire(self, trigger: str) -> None:
        old = self._state
        self._state = TASK.fire(self._state, T[trigger])
        log.debug("task %s: %s --%s--> %s", self.name, TASK.state_name(old), trigger,
                  self.state)
        self._engine.notify_change()

    def _check_alive(self) -> None:
        if self.disposed:
            raise TaskDisposed(f"task {self.name} is disposed (the engine was reset or "
                               "rebuilt)")

    # ---- public operations --------------------------------------------------------

    async def start(self) -> str:
        """Start (from Idle, Stopped or Error); the engine must be Starting or Running."""
        async with self._lock:
            self._check_alive()
            if not TASK.can_fire(self._state, T["Start"]):
                TASK.fire(self._state, T["Start"])   # raises InvalidTransition
            self._engine.require_tasks_may_run(self.name)
            self.error = None
            self.error_text = None
            self._resumed.set()
            self._fire("Start")
            self._timer = asyncio.get_running_loop().create_task(
                self._timer_loop(), name=f"task:{self.name}:timer")
            return self.state

    async def disable(self) -> str:
        """Pause: Running -> Pausing -> Paused (the timer keeps running)."""
        async with self._lock:
            self._check_alive()
            self._fire("Pause")
            self._resumed.clear()
            await self._wait_exec(None)
            if self._state == S["Pausing"]:
                self._fire("PausingCompleted")
            return self.state

    async def enable(self) -> str:
        """Resume: Paused -> Resuming -> Running (the next tick executes)."""
        async with self._lock:
            self._check_alive()
            self._fire("Resume")
            self._resumed.set()
            if self._state == S["Resuming"]:
                self._fire("ResumingCompleted")
            return self.state

    pause = disable
    resume = enable

    async def stop(self, timeout: float | None = None) -> str:
        """Stop (engine stopping): Running or Paused -> Stopping -> Stopped."""
        async with self._lock:
            self._check_alive()
            await self._stop_locked(timeout)
            return self.state

    async def dispose(self, timeout: float | None = None) -> None:
        """Release the Task from any state, stopping it first if it runs."""
        async with self._lock:
            if self.disposed:
                return
            if TASK.can_fire(self._state, T["Stop"]):
                await self._stop_locked(timeout)
            await self._halt(timeout)
            self.api.close()
            self.disposed = True
            self._engine.notify_change()

    # ---- internals ----------------------------------------------------------------

    async def _stop_locked(self, timeout: float | None) -> None:
        self._fire("Stop")
        await self._halt(timeout)
        if self._state == S["Stopping"]:
            self._fire("StoppingCompleted")

    async def _halt(self, timeout: float | None) -> None:
        """End the timer; let an execution in flight finish within ``timeout``."""
        if self._timer is not None:
            self._timer.cancel()
            await reap(self._timer)
            self._timer = None
        await self._wait_exec(self._engine.stop_timeout if timeout is None else timeout)

    async def _wait_exec(self, timeout: float | None) -> None:
        ex = self._exec
        if ex is None or ex.done():
            return
        done, _ = await asyncio.wait({ex}, timeout=timeout)
        if not done:
            log.warning("task %s: execution still running after %.1f s, cancelling it",
                        self.name, timeout or 0)
            ex.cancel()
            await asyncio.wait({ex})

    async def _timer_loop(self) -> None:
        loop = asyncio.get_running_loop()
        interval = self.interval
        t0 = loop.time()
        k = 0
        while True:
            if interval > 0:
                due = t0 + k * interval
                late = loop.time() - due
                if late >= interval:  # the loop was busy: skip the missed ticks, keep phase
                    missed = int(late // interval)
                    self.skipped_late += missed
                    k += missed
                    due = t0 + k * interval
                delay = due - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                k += 1
            else:
                # back to back: one execution after the other, waiting while paused
                ex = self._exec
                if ex is not None and not ex.done():
                    await _finished(ex)
                if not self._resumed.is_set():
                    self.skipped_paused += 1
                    await self._resumed.wait()
                    continue
                await asyncio.sleep(0)
            self._tick()

    def _tick(self) -> None:
        st = self._state
        if st != S["Running"]:
            if st in (S["Paused"], S["Pausing"], S["Resuming"]):
                self.skipped_paused += 1
            return
        if self._exec is not None and not self._exec.done():
            self.skipped_busy += 1
            return
        self._exec = asyncio.get_running_loop().create_task(
            self._execute(), name=f"task:{self.name}:run{self.runs + 1}")

    async def _execute(self) -> None:
        self.runs += 1
        start = time.monotonic()
        self.last_start = start
        try:
            if self.defn.is_async:
                await self.defn.fn(*self._args)
            else:
                await asyncio.to_thread(self.defn.fn, *self._args)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self._on_error(e)
        finally:
            self.last_duration = time.monotonic() - start

    def _on_error(self, e: BaseException) -> None:
        self.errors += 1
        self.error = e
        self.error_text = describe(e, self.defn.file)
        log.error("task %s: execution raised %s", self.name, self.error_text,
                  exc_info=(type(e), e, e.__traceback__))
        self.api.log.error(f"execution raised {self.error_text}")
        if TASK.can_fire(self._state, T["ErrorOccurred"]):
            self._fire("ErrorOccurred")
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
        if self.defn.critical:
            self._engine.fault(f"built-in task {self.name} failed: {self.error_text}")

    def status(self) -> dict[str, Any]:
        return {
            "name": self.name, "state": self.state, "interval": self.interval,
            "auto_start": self.auto_start, "builtin": self.defn.builtin,
            "runs": self.runs, "skipped_paused": self.skipped_paused,
            "skipped_busy": self.skipped_busy, "skipped_late": self.skipped_late,
            "errors": self.errors, "error": self.error_text,
            "last_duration_s": self.last_duration,
            "file": self.defn.file, "line": self.defn.line,
        }

    def __repr__(self) -> str:
        return f"<Task {self.name} {self.state}>"
