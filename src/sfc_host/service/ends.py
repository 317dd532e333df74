"""The ends of hosts' runs, learnt and taken over, so that the answers a host had taken
and not applied when it ended are had again (docs/host.md, "A host dies").

A host learns that another ended from its status topic ``{mes}/hosts/{consumer}``:
the broker publishes the Last Will there the moment a connection ends without a
goodbye (a kill, a crash, a cut cable), and a host that stops says "offline" there
itself once it no longer subscribes. It learns that its own previous run ended from
Redis: ``sfc:hosts`` holds each host's current run, and a run found there at start
that is not ours ended without being taken over.

Every run's end is taken over once, by the first host to set its key
(``keys.run_taken``): that host sends the open push attempts of every scope again
(``execution.handover``). A retained status seen on subscribing counts as well as a
live one: a survivor that was away when the Will came still takes the death, and one
taken already costs one ``SET NX``. A host that stops cleanly unsubscribes first and
settles what it had taken; it then records its own end as taken, so a clean stop costs
no resend.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from sfc_fast.wire.mqtt5 import Message
from sfc_host.aio import reap
from sfc_host.metrics import Metrics
from sfc_host.mqtt import MqttLink
from sfc_host.store.client import REDIS_FAILURES
from sfc_host.store.keys import HOSTS, run_taken

log = logging.getLogger("sfc_host.service.ends")

TAKEN_TTL_S = 86_400     # how long a taken end is remembered (a retained Will outlives it)


class RunEnds:
    """Watches the hosts' status topic and takes over each run that ended."""

    def __init__(self, link: MqttLink, client: Any, metrics: Metrics, consumer: str,
                 run: str, take_over: Callable[[], Awaitable[int]]) -> None:
        self.link = link
        self.client = client
        self.metrics = metrics
        self.consumer = consumer
        self.run = run
        self.take_over = take_over
        self._ready = False
        self._early: list[tuple[str, str, str]] = []   # ends seen before the host was up
        self._tasks: set[asyncio.Task[None]] = set()
        # not shared: every host hears of every end
        link.subscribe(f"{link.config.mes_prefix}/hosts/+", self._on_status, shared=False)

    async def start(self) -> None:
        """Once the host runs (recovered, subscribed): record this run, and take over
        the previous run of this host and the ends seen meanwhile."""
        prev = await self.client.hget(HOSTS, self.consumer)
        await self.client.hset(HOSTS, self.consumer, self.run)
        self._ready = True
        if prev is not None and prev.decode() != self.run:
            self._later(self.consumer, prev.decode(), "its previous run was not taken over")
        for end in self._early:
            self._later(*end)
        self._early.clear()

    async def ended_cleanly(self) -> None:
        """This run stopped with nothing taken and not applied (unsubscribed first,
        then every answer it had settled): its end needs no take-over, by the other
        hosts (its "offline" comes next) or by its next run."""
        if not self._ready:
            return
        try:
            await self.client.set(run_taken(self.consumer, self.run), self.consumer,
                                  nx=True, ex=TAKEN_TTL_S)
        except REDIS_FAILURES as e:   # the others then send its open commands again
            log.warning("could not record the clean stop in Redis (%s): another host "
                        "sends the open commands again", e)

    async def aclose(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        for t in list(self._tasks):
            await reap(t)

    def _on_status(self, message: Message) -> None:
        end = self._ended(message)
        if end is None:
            return
        if self._ready:
            self._later(*end)
        else:
            self._early.append(end)

    def _ended(self, message: Message) -> tuple[str, str, str] | None:
        """(consumer, run, why) of a status that says a run ended, else None."""
        if not message.payload:
            return None
        try:
            body = json.loads(message.payload)
        except ValueError:
            return None
        if not isinstance(body, dict) or body.get("online") is not False:
            return None
        host, run = body.get("host"), body.get("started_at")
        if not isinstance(host, str) or not isinstance(run, str) or not host or not run:
            return None
        if host == self.consumer and run == self.run:
            return None
        return host, run, str(body.get("reason") or "offline")

    def _later(self, consumer: str, run: str, why: str) -> None:
        t = asyncio.get_running_loop().create_task(self._take(consumer, run, why))
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    async def _take(self, consumer: str, run: str, why: str) -> None:
        try:
            if not await self.client.set(run_taken(consumer, run), self.consumer, nx=True,
                                         ex=TAKEN_TTL_S):
                return              # another host took it
            self.metrics.inc("host_ends_taken")
            # a stop is routine; a death is what an operator looks for
            level = logging.INFO if why == "stopped" else logging.WARNING
            n = await self.take_over()
            log.log(level, "host %s (run of %s) ended (%s): its answers in flight may have "
                    "ended with it, so the %d open commands of every scope were sent again",
                    consumer, run, why, n)
        except asyncio.CancelledError:
            raise
        except Exception:   # whatever failed, the watcher of the other hosts goes on
            log.exception("taking over the end of host %s (run of %s) failed; its jobs' "
                          "deadlines settle what it had taken", consumer, run)
