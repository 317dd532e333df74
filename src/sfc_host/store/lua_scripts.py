"""The Lua scripts: loaded once, called by SHA, loaded again after ``NOSCRIPT``.

Names and values always travel as KEYS and ARGV, never inside the code. A batch of
calls goes out as one pipeline; calls refused with ``NOSCRIPT`` (a ``SCRIPT FLUSH``,
a restarted or failed-over Redis) are loaded again and retried (``RELOAD_ROUNDS``).

On Redis Cluster the same code runs: ``SCRIPT LOAD`` goes to every primary (redis-py
routes it so), a pipeline groups its calls by the node owning each call's slot (all
keys of a call share the scope's hash tag) and sends the groups concurrently, and a
``NOSCRIPT`` from any node loads the scripts again on every primary before the refused
calls are retried. redis-py refuses ``pipe.evalsha`` on a cluster pipeline (it cannot
know the keys share a slot), so calls are queued as the plain ``EVALSHA`` command,
which the cluster pipeline routes by its keys; on one Redis this is exactly what
``pipe.evalsha`` sends.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from redis.exceptions import NoScriptError

from sfc_host.store.client import REDIS_FAILURES

log = logging.getLogger("sfc_host.store.lua_scripts")

LUA_DIR = Path(__file__).parent / "lua"
# Reloads before a NOSCRIPT is given up: a cache lost again while another task's reload
# was under way (a second flush or failover meanwhile) is loaded again, not reported.
RELOAD_ROUNDS = 3


class Script:
    __slots__ = ("name", "sha", "source")

    def __init__(self, name: str, source: str) -> None:
        self.name = name
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    def __repr__(self) -> str:
        return f"Script({self.name!r}, {self.sha[:8]})"


Call = tuple[Script, Sequence[Any], Sequence[Any]]


class Scripts:
    """All scripts of the host, bound to one client (standalone or cluster). With a
    ``channel`` (``RedisChannel`` on one Redis, ``ClusterChannel`` on a cluster), the
    calls go through it; loading stays on the client."""

    def __init__(self, client: Any, channel: Any = None) -> None:
        self.client = client
        self.channel = channel
        self.reloads = 0
        # calls of ``call_together`` waiting for the end of this loop pass, and the
        # pipelines under way that will answer them
        self._queued: list[tuple[Call, asyncio.Future[Any]]] = []
        self._sending: set[asyncio.Task[None]] = set()
        self.by_name: dict[str, Script] = {}
        for path in sorted(LUA_DIR.glob("*.lua")):
            s = Script(path.stem, path.read_text())
            self.by_name[s.name] = s

    def __getitem__(self, name: str) -> Script:
        return self.by_name[name]

    async def load(self) -> None:
        """Load every script (on every primary of a cluster)."""
        for s in self.by_name.values():
            sha = await self.client.script_load(s.source)
            if sha != s.sha:  # pragma: no cover - would mean a different SHA-1
                raise RuntimeError(f"script {s.name}: server SHA {sha} != {s.sha}")

    async def call(self, script: Script, keys: Sequence[Any], args: Sequence[Any],
                   lazy: bool = False) -> Any:
        """One script call; ``lazy``: it may wait for the channel's next write
        (``RedisChannel``), which it then shares."""
        for _ in range(RELOAD_ROUNDS):
            try:
                return await self._evalsha(script, keys, args, lazy)
            except NoScriptError:
                self.reloads += 1
                log.info("script %s missing on the server: loading it again", script.name)
                await self.load()
        return await self._evalsha(script, keys, args, lazy)

    def _evalsha(self, script: Script, keys: Sequence[Any], args: Sequence[Any],
                 lazy: bool = False) -> Any:
        if self.channel is not None:
            return self.channel.execute("EVALSHA", script.sha, len(keys), *keys, *args,
                                        lazy=lazy)
        return self.client.evalsha(script.sha, len(keys), *keys, *args)

    async def call_together(self, script: Script, keys: Sequence[Any],
                            args: Sequence[Any]) -> Any:
        """``call``, sent with every other ``call_together`` of this loop pass in one
        pipeline: many requests at once (an MES storing a burst of orders) cost one
        round trip and one parse, not one each. Results and errors are each call's own."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        self._queued.append(((script, keys, args), fut))
        if len(self._queued) == 1:
            loop.call_soon(self._send_queued)
        return await fut

    def _send_queued(self) -> None:
        queued, self._queued = self._queued, []
        task = asyncio.get_running_loop().create_task(self._run_queued(queued))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _run_queued(self, queued: list[tuple[Call, asyncio.Future[Any]]]) -> None:
        try:
            results = await self.run([c for c, _ in queued])
        except asyncio.CancelledError:   # the loop is closing
            for _, fut in queued:
                fut.cancel()
            raise
        except Exception as e:           # the connection failed: every caller hears it
            for _, fut in queued:
                if not fut.done():
                    fut.set_exception(e)
            return
        for (_, fut), r in zip(queued, results, strict=True):
            if fut.done():           # its caller was cancelled
                continue
            if isinstance(r, Exception):
                fut.set_exception(r)
            else:
                fut.set_result(r)

    async def run(self, calls: Sequence[Call], lazy: bool = False) -> list[Any]:
        """Run many calls in one pipeline; results in order (an exception in place of
        a failed call's result). ``lazy`` as ``call``'s."""
        if not calls:
            return []
        if len(calls) == 1:
            s, k, a = calls[0]
            try:
                return [await self.call(s, k, a, lazy)]
            except REDIS_FAILURES as e:
                return [e]
        results = await self._pipe(calls, lazy)
        for _ in range(RELOAD_ROUNDS):
            missing = [i for i, r in enumerate(results) if isinstance(r, NoScriptError)]
            if not missing:
                break
            self.reloads += 1
            log.info("%d script calls found no script: loading the scripts again", len(missing))
            await self.load()
            again = await self._pipe([calls[i] for i in missing])
            for i, r in zip(missing, again, strict=True):
                results[i] = r
        return results

    async def _pipe(self, calls: Sequence[Call], lazy: bool = False) -> list[Any]:
        return await self.commands([("EVALSHA", s.sha, len(k), *k, *a) for s, k, a in calls],
                                   lazy)

    async def commands(self, cmds: Sequence[Sequence[Any]], lazy: bool = False) -> list[Any]:
        """Commands in one pipeline, on the channel or on the client's pipeline (a
        cluster's routes each by its keys); the replies in order, an error in place of
        a failed command's. Only commands whose reply redis-py leaves as the server sent
        it (scripts, XACK, HSET, GET, …): the two paths then answer alike."""
        if self.channel is not None:
            return await self.channel.execute_many(cmds, lazy)
        pipe = self.client.pipeline(transaction=False)
        for c in cmds:
            pipe.execute_command(*c)
        return list(await pipe.execute(raise_on_error=False))
