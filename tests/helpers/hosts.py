"""Helpers for host tests: quick configs, a clean database, a simulated station that
answers commands through the host's answer path, and polling with a deadline."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from redis import exceptions as rx

from sfc_fast import Command
from sfc_fast.events import Completed, Failed
from sfc_host.config import HostConfig
from sfc_host.execution.dispatch import InProcessSink
from sfc_host.execution.host import Host

EXAMPLES = Path(__file__).resolve().parents[2] / "src" / "sfc_host" / "examples"
V110 = "https://aschamberger.github.io/schemas/microdcs/sfc-recipe/v1.1.0/"


def start_sfc_host(args: list[str], env: dict[str, str], marker: str,
                   timeout: float = 20) -> subprocess.Popen[str]:
    """``python -m sfc_host ARGS`` in a process of its own, once its stderr said
    ``marker`` (e.g. ``host NAME running``)."""
    p = subprocess.Popen([sys.executable, "-m", "sfc_host", *args], stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, **env})
    assert p.stderr is not None
    deadline = time.monotonic() + timeout
    line = ""
    while time.monotonic() < deadline:
        line = p.stderr.readline()
        if marker in line or not line:
            break
    assert marker in line, f"{marker!r} not seen: {line!r}"
    return p


def stop_cleanly(p: subprocess.Popen[str]) -> None:
    """SIGTERM to an ``sfc-host`` process, which must exit 0 within 15 s (killed if
    not, so no test leaves one behind)."""
    p.send_signal(signal.SIGTERM)
    try:
        assert p.wait(15) == 0
    finally:
        if p.poll() is None:
            p.kill()


def quick_config(redis_url: str, **kw: Any) -> HostConfig:
    """Short timings so that sweeps, claims and outages happen within a test."""
    base: dict[str, Any] = dict(
        redis_url=redis_url, sweep_interval_ms=30, read_block_ms=20,
        discover_interval_ms=100, claim_min_idle_ms=300, claim_interval_ms=100,
        max_deliveries=3, outage_threshold_ms=1500)
    base.update(kw)
    return HostConfig(**base)


async def flush(redis_url: str) -> None:
    c = aioredis.Redis.from_url(redis_url)
    try:
        await c.flushall()
    finally:
        await c.aclose()


def one_step(timeout_s: int = 1, retries: int = 0) -> dict[str, Any]:
    """A Work Master ``quick``: one step, one push action with that timeout."""
    return {"ID": "quick", "dataschema": V110, "data": {
        "Steps": [{"Name": "Work", "Initial": True}], "Transitions": [],
        "Actions": [{"Name": "work", "Step": "Work", "Qualifier": "N",
                     "Interaction": "push_command", "TypeId": "com.example.work.v1",
                     "TimeoutSeconds": timeout_s, "Retries": retries}]}}


def work_master(name: str, wm_id: str | None = None) -> dict[str, Any]:
    """An example Work Master shipped with the package (``tighten_rework`` …)."""
    wm = json.loads((EXAMPLES / f"{name}.json").read_text())
    wm["ID"] = wm_id or name
    return wm


async def wait_until(pred: Callable[[], Any], timeout: float = 10.0,
                     what: str = "condition") -> Any:
    """Poll ``pred`` (sync or async) until it is truthy; its value."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while True:
        v = pred()
        if isinstance(v, Awaitable):
            v = await v
        if v:
            return v
        if loop.time() > end:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.01)


async def start_host(redis_url: str, st: Station, *wms: dict[str, Any], scope: str,
                     flush_db: bool = False, ended: list | None = None, **kw: Any) -> Host:
    """A host in this process serving ``scope``, its commands answered by ``st``: the
    Work Masters ``wms`` stored, the scope added, started. ``flush_db`` empties the Redis
    database first; ``ended`` collects (job, status, reason) of every job that ends;
    ``kw`` goes to ``quick_config``."""
    if flush_db:
        await flush(redis_url)
    host = Host(quick_config(redis_url, **kw), st.sink,
                on_end=(lambda s, j, d: ended.append((j, d.status, d.reason)))
                if ended is not None else None)
    st.attach(host)
    for wm in wms:
        await host.store.put_work_master(scope, wm)
    await host.add_scope(scope)
    await host.start()
    return host


async def quiet(host: Host) -> bool:
    """Every served scope's work stream handled: nothing pending, and trimmed empty."""
    for k in host.streams.scopes.values():
        if (await host.client.xpending(k.work, host.config.group))["pending"]:
            return False
        if await host.client.xlen(k.work):
            return False
    return True


Answer = Callable[[Command], "dict[str, Any] | str | bool | None"]


class Station:
    """Answers every command at once through ``host.answer``: ``answer(cmd)`` returns
    the result fields (completed), a string (failed with that reason), or False (no
    answer: the command is only recorded)."""

    def __init__(self, answer: Answer | None = None) -> None:
        self.commands: list[Command] = []
        self.answer_fn = answer or (lambda c: None)
        self.hosts: list[Host] = []
        self.sink = InProcessSink(on_command=self._on_command)

    def attach(self, host: Host) -> Host:
        self.hosts.append(host)
        return host

    def _on_command(self, cmd: Command) -> None:
        self.commands.append(cmd)
        res = self.answer_fn(cmd)
        if res is False or not self.hosts:
            return
        host = self.hosts[len(self.commands) % len(self.hosts)]
        if isinstance(res, str):
            host.answer(cmd.scope, Failed(cmd.command_id, res))
        else:
            host.answer(cmd.scope, Completed(cmd.command_id, res))

    def ids(self) -> list[str]:
        return [c.command_id for c in self.commands]


def torque_ok(cmd: Command) -> dict[str, Any] | None:
    """Answers for ``tighten_rework``: tightening in tolerance at once."""
    return {"torque": 85} if cmd.action == "tighten" else None


async def store_retrying(host: Host, scope: str, job: str, wm: str, tries: int = 300) -> None:
    """Store and start ``job`` as an MES would: again after a refusal of the moment (a
    failover or a slot moving on a Redis Cluster), 0.1 s apart."""
    for _ in range(tries):
        try:
            await host.orders.store_order(scope, {"JobOrderID": job,
                                                  "WorkMasterID": [{"ID": wm}]}, start=True)
            return
        except (rx.RedisError, OSError):
            await asyncio.sleep(0.1)
    raise AssertionError(f"{scope}/{job} was never stored")

