"""The hot path's Redis connections on a Redis Cluster: one ``RedisChannel`` per
primary, each request routed by the slot of its first key.

On one Redis the host's script calls go through its own channel (``channel.py``); on a
cluster they went through redis-py's cluster client, one awaited call at a time, at 2.5
times the host's CPU a completion. Here every primary gets a channel of its own, so a
loop pass's requests to one node go out in one write, as on one Redis.

- **Routing.** The slot table comes from ``CLUSTER SLOTS``; a key's slot is CRC16 of its
  hash tag (every key of a scope carries the scope's, so its requests go to one node),
  computed by redis-py's ``key_slot``.
- **MOVED**: the table is read again and the request sent to its new node. **ASK** (a
  slot migrating): the one request goes to the node named, after ``ASKING``, in one
  write. **TRYAGAIN** and **CLUSTERDOWN** (a failover, a migration): tried again after
  a pause.
- **A node that vanishes** (killed, a failover under way): its requests fail with a
  connection error after its channel's own retries; the table is read again (from any
  node that answers) and they are sent to the slot's owner now, with backoff, for up to
  ``FAILOVER_S``. Every caller gets its answer or, past that, the error.

TLS and the ACL user of the URL go to every node's channel. Replies and errors are
redis-py's classes, as on one Redis.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote, urlsplit

from redis import exceptions as rx
from redis.crc import key_slot

from sfc_host.metrics import Metrics
from sfc_host.store.channel import RedisChannel

log = logging.getLogger("sfc_host.store.cluster")

SLOTS = 16384
FAILOVER_S = 30.0          # how long a request waits for its slot to have an owner again
PAUSE_S = 0.1              # the first pause before trying again (doubling, up to 1 s)
MAX_REDIRECTS = 5          # MOVED/ASK hops of one request

def key_of(args: Sequence[Any]) -> Any:
    """The key a command is routed by: a script call's first key, another command's
    first argument; None for a script call without keys."""
    name = args[0]
    if isinstance(name, bytes):
        name = name.decode()
    upper = name.upper()
    if upper in ("EVALSHA", "EVAL", "EVALSHA_RO", "EVAL_RO", "FCALL"):
        return args[3] if int(args[2]) > 0 else None
    if upper in ("XREADGROUP", "XREAD"):
        for i, a in enumerate(args):
            if a in ("STREAMS", b"STREAMS", "streams"):
                return args[i + 1]
        return None
    return args[1] if len(args) > 1 else None


def _log_moves(before: list[tuple[str, int] | None],
               after: list[tuple[str, int] | None]) -> None:
    """One line per owner change a table read found (a failover, a reshard): what a
    night shift looks for in the log next to the counters."""
    moves: dict[tuple[Any, Any], int] = {}
    for old, new in zip(before, after, strict=True):
        if old != new:
            moves[(old, new)] = moves.get((old, new), 0) + 1
    for (old, new), n in moves.items():
        log.warning("Redis Cluster: %d slot%s moved from %s to %s", n, "" if n == 1 else "s",
                    _addr(old), _addr(new))


def _addr(addr: tuple[str, int] | None) -> str:
    return "no node" if addr is None else f"{addr[0]}:{addr[1]}"


class ClusterChannel:
    """Requests to a cluster, pipelined per primary; the ``RedisChannel`` interface."""

    def __init__(self, url: str, *, ca_file: str = "", cert_file: str = "",
                 key_file: str = "", metrics: Metrics | None = None) -> None:
        u = urlsplit(url)
        self.scheme = u.scheme or "redis"
        self.username = u.username
        self.password = u.password
        self._tls_files = (ca_file, cert_file, key_file)
        self.seeds = [(u.hostname or "localhost", u.port or 6379)]
        self.nodes: dict[tuple[str, int], RedisChannel] = {}
        self.slots: list[tuple[str, int] | None] = [None] * SLOTS
        self._refreshing: asyncio.Task[None] | None = None
        self.refreshes = 0
        self.redirects = 0
        self.retries = 0
        # what a night shift looks for after a failover or a reshard
        self.metrics = metrics if metrics is not None else Metrics()
        self._closed = False

    def __repr__(self) -> str:
        return f"ClusterChannel({len(self.nodes)} primaries)"

    # ---- the slot table

    def _channel(self, addr: tuple[str, int]) -> RedisChannel:
        ch = self.nodes.get(addr)
        if ch is None:
            cred = ""
            if self.password is not None:
                cred = (f"{quote(self.username or '', safe='')}:"
                        f"{quote(self.password, safe='')}@")
            ch = self.nodes[addr] = RedisChannel(
                f"{self.scheme}://{cred}{addr[0]}:{addr[1]}/0", ca_file=self._tls_files[0],
                cert_file=self._tls_files[1], key_file=self._tls_files[2])
        return ch

    async def refresh(self) -> None:
        """Read the slot table again (one read at a time, however many callers ask)."""
        task = self._refreshing
        if task is None or task.done():
            task = self._refreshing = asyncio.get_running_loop().create_task(self._refresh())
        await asyncio.shield(task)

    async def _refresh(self) -> None:
        last: Exception | None = None
        for addr in [*self.nodes, *(s for s in self.seeds if s not in self.nodes)]:
            try:
                table = await self._channel(addr).execute("CLUSTER", "SLOTS")
            except (rx.ConnectionError, rx.ResponseError) as e:
                last = e
                continue
            slots: list[tuple[str, int] | None] = [None] * SLOTS
            for entry in table:
                start, end, primary = int(entry[0]), int(entry[1]), entry[2]
                host = primary[0].decode() if isinstance(primary[0], bytes) else primary[0]
                owner = (host or addr[0], int(primary[1]))
                self._channel(owner)
                for s in range(start, end + 1):
                    slots[s] = owner
            if self.refreshes:
                _log_moves(self.slots, slots)
            self.slots = slots
            self.refreshes += 1
            self.metrics.inc("redis_cluster_table_reads")
            return
        raise rx.ConnectionError(f"no node of the cluster answered CLUSTER SLOTS: {last}")

    @staticmethod
    def slot(key: Any) -> int:
        """The slot of ``key``: CRC16 of its hash tag, as redis-py computes it."""
        if isinstance(key, str):
            key = key.encode()
        elif not isinstance(key, bytes):
            key = str(key).encode()
        return int(key_slot(key))

    async def _owner(self, slot: int) -> RedisChannel:
        addr = self.slots[slot]
        if addr is None:
            await self.refresh()
            addr = self.slots[slot]
            if addr is None:
                raise rx.ClusterDownError(f"no node serves slot {slot}")
        return self._channel(addr)

    # ---- requests

    async def execute(self, *args: Any, lazy: bool = False) -> Any:
        (r,) = await self.execute_many([args], lazy)
        if isinstance(r, Exception):
            raise r
        return r

    async def execute_many(self, commands: Sequence[Sequence[Any]],
                           lazy: bool = False) -> list[Any]:
        """The replies in order, an error in place of a failed command's."""
        if not commands:
            return []
        if not self.refreshes:
            await self.refresh()
        results: list[Any] = [None] * len(commands)
        todo = list(range(len(commands)))
        deadline = time.monotonic() + FAILOVER_S
        pause = PAUSE_S
        while todo:
            again = await self._round(commands, todo, results, lazy)
            if not again:
                return results
            if time.monotonic() + pause > deadline or self._closed:
                for i, err in again:
                    results[i] = err
                return results
            self.retries += len(again)
            self.metrics.inc("redis_cluster_retries", len(again))
            await asyncio.sleep(pause)
            pause = min(pause * 2, 1.0)
            await self._refresh_quietly()
            todo = [i for i, _ in again]
        return results

    async def _refresh_quietly(self) -> None:
        try:
            await self.refresh()
        except rx.ConnectionError as e:
            log.warning("Redis Cluster: the slot table could not be read: %s", e)

    async def _round(self, commands: Sequence[Sequence[Any]], todo: list[int],
                     results: list[Any], lazy: bool) -> list[tuple[int, Exception]]:
        """Send ``todo`` to the slots' owners, a batch per node; fill ``results``; the
        requests to try again after a pause (a node lost, the cluster down)."""
        by_node: dict[RedisChannel, list[int]] = {}
        again: list[tuple[int, Exception]] = []
        for i in todo:
            key = key_of(commands[i])
            slot = self.slot(key) if key is not None else 0
            try:
                node = await self._owner(slot)
            except rx.RedisError as e:
                again.append((i, e))
                continue
            by_node.setdefault(node, []).append(i)
        nodes = list(by_node.items())
        replies = await asyncio.gather(*(node.execute_many([commands[i] for i in idx], lazy)
                                         for node, idx in nodes), return_exceptions=True)
        redirected: list[tuple[int, str]] = []
        for (_, idx), got in zip(nodes, replies, strict=True):
            if isinstance(got, BaseException):
                if not isinstance(got, rx.RedisError):
                    raise got
                again.extend((i, got) for i in idx)     # the node is gone: all of them
                continue
            for i, r in zip(idx, got, strict=True):
                if isinstance(r, rx.ResponseError):
                    word = str(r).split(" ", 1)[0]
                    if word in ("MOVED", "ASK"):
                        redirected.append((i, str(r)))
                        continue
                    if word in ("TRYAGAIN", "CLUSTERDOWN"):
                        again.append((i, r))
                        continue
                results[i] = r
        if redirected:
            await self._redirect(commands, redirected, results, again)
        return again

    async def _redirect(self, commands: Sequence[Sequence[Any]],
                        redirected: list[tuple[int, str]], results: list[Any],
                        again: list[tuple[int, Exception]]) -> None:
        """MOVED: the table is read again, the request sent to its new owner. ASK: the
        one request goes to the node named, after ASKING, in one write."""
        if any(text.startswith("MOVED") for _, text in redirected):
            await self._refresh_quietly()
        self.redirects += len(redirected)
        self.metrics.inc("redis_cluster_redirects", len(redirected))
        for i, text in redirected:
            hops = 0
            while True:
                word, _, where = text.split(" ", 2)
                host, _, port = where.rpartition(":")
                node = self._channel((host, int(port)))
                try:
                    if word == "ASK":
                        _, r = await node.execute_many([("ASKING",), commands[i]])
                    else:
                        (r,) = await node.execute_many([commands[i]])
                except rx.RedisError as e:
                    again.append((i, e))
                    break
                hops += 1
                if isinstance(r, rx.ResponseError) and str(r).startswith(("MOVED", "ASK")) \
                        and hops < MAX_REDIRECTS:
                    text = str(r)
                    continue
                results[i] = r
                break

    @property
    def writes(self) -> int:
        return sum(ch.writes for ch in self.nodes.values())

    async def aclose(self) -> None:
        self._closed = True
        for ch in list(self.nodes.values()):
            await ch.aclose()
