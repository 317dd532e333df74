"""One host instance: the driver around the core, on Redis.

Tasks: the consumer (work entries of the scopes known to have new ones, every scope
now and then), the answer applier (equipment answers, settled in batches), the sweeper
(the scopes whose deadline, claim look or heartbeat is due), and discovery (new scopes
from the registry). Recovery runs once at start. Any number of instances
may share the same Redis: consumer groups split the entries, the compare-and-set
scripts settle every race.

    async with Host(HostConfig(redis_url=...), sink) as host:
        await host.orders.store_order("line1", order, start=True)   # ISA95JobOrderDataType
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from sfc_fast import job_of_command, state_to_json
from sfc_fast.events import BaseEvent
from sfc_host.aio import reap
from sfc_host.config import HostConfig
from sfc_host.execution.dispatch import CommandSink, Dispatcher, InProcessSink
from sfc_host.execution.handover import resend_open
from sfc_host.execution.recovery import recover_scope
from sfc_host.execution.settle import APPLIED, CONFLICT, ERROR, MISSING, Item, Settler
from sfc_host.execution.sweep import Sweeper
from sfc_host.execution.wakeup import WakeOne
from sfc_host.execution.work import WorkHandler
from sfc_host.metrics import Metrics
from sfc_host.names import check_scope
from sfc_host.store.channel import RedisChannel
from sfc_host.store.client import connect
from sfc_host.store.cluster_channel import ClusterChannel
from sfc_host.store.keys import SCOPES
from sfc_host.store.lua_scripts import Scripts
from sfc_host.store.orders import Orders
from sfc_host.store.states import GraphCache, Store
from sfc_host.store.streams import Streams

log = logging.getLogger("sfc_host")

GC_THRESHOLDS = (50_000, 20, 100)
CLOSE_MARKERS_S = 5.0      # closing waits this long for the last sent markers
ERROR_BACKOFF_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0)
DISCOVER_FULL_EVERY = 30     # discovery passes between two full reads of the registry


class Host:
    def __init__(self, config: HostConfig | None = None, sink: CommandSink | None = None,
                 *, on_end: Callable[[str, str, Any], None] | None = None,
                 client: Any = None, loops: bool = True,
                 metrics: Metrics | None = None) -> None:
        self.config = config or HostConfig()
        self.sink = sink if sink is not None else InProcessSink()
        self.metrics = metrics if metrics is not None else Metrics()
        self.client = client if client is not None else connect(self.config)
        self._own_client = client is None
        # script calls (the hot path) pipelined on connections of our own: one to a
        # standalone Redis, one to each primary of a cluster
        c = self.config
        self.channel: RedisChannel | ClusterChannel | None = None
        if client is None:
            tls = dict(ca_file=c.redis_ca_file, cert_file=c.redis_cert_file,
                       key_file=c.redis_key_file)
            self.channel = ClusterChannel(c.redis_url, metrics=self.metrics, **tls) \
                if c.redis_cluster else RedisChannel(c.redis_url, **tls)
        self.scripts = Scripts(self.client, self.channel)
        self.store = Store(self.client, self.scripts, GraphCache(self.config.graph_cache_size),
                           self.config.state_cache_size, self.config.group,
                           cluster=self.config.redis_cluster)
        self._on_end = on_end
        self.settler = Settler(self.store, self.config, self.metrics, self._job_ended)
        self.dispatcher = Dispatcher(self.store, self.settler, self.sink, self.metrics)
        self.orders = Orders(self.store, self.scripts, self.metrics,
                             ended_retention_s=self.config.ended_retention_s)
        self.streams = Streams(self.client, self.scripts, self.config, self.metrics,
                               cluster=self.config.redis_cluster)
        self.work = WorkHandler(self.store, self.settler, self.dispatcher, self.orders,
                                self.config, self.metrics)
        self.sweeper = Sweeper(self.scripts, self.config, self.metrics)
        self.settler.dispatcher = self.dispatcher
        self.settler.serves = self.streams.scopes.__contains__
        self.settler.on_delivered = self._delivered
        # what makes a scope worth a read or a sweep on the next pass (idle scopes cost
        # nothing per pass): work this host appended without taking it, its deadlines
        self.settler.on_work = self.streams.wrote
        self.settler.on_due = self.sweeper.note_due
        self.orders.on_work = self.streams.mark
        self.sweeper.on_ticks = self.streams.mark
        self.sweeper.on_orphans = self.streams.note_orphans
        self.sweeper.touched = self.streams.touched
        self._local: list[tuple[str, bytes, dict[bytes, bytes]]] = []
        self._local_ready = asyncio.Event()
        self._stopping = asyncio.Event()
        self._gc_was: tuple[int, int, int] | None = None
        self._loops = loops
        self._tasks: list[asyncio.Task[None]] = []
        # (scope, event, receipt or None): see ``answer``
        self._answers: list[tuple[str, BaseEvent, Any]] = []
        self.on_answers_done: Callable[[list[Any]], None] | None = None
        self._answers_dropping = False       # warned about this overflow already
        self._answers_ready = WakeOne()      # one worker an arrival, not all of them
        self._closing = False
        self._registry_size = -1         # the scope registry's size at the last read
        self._discoveries = 0

    def _job_ended(self, scope: str, job: str, decision: Any) -> None:
        """A job this host settled to its end: one INFO line (operators follow jobs in
        the log), then the caller's ``on_end``."""
        fields = {"scope": scope, "job": job}
        why = decision.reason or ("no reason given" if decision.status == "aborted" else "")
        if why:
            log.info("job %s in %s %s: %s", job, scope, decision.status, why, extra=fields)
        else:
            log.info("job %s in %s %s", job, scope, decision.status, extra=fields)
        if self._on_end is not None:
            self._on_end(scope, job, decision)

    # ---- lifecycle

    async def start(self) -> Host:
        await self.scripts.load()
        for s in self.config.scopes:
            await self.orders.register_scope(s)
        await self.discover()
        for scope in list(self.streams.scopes):
            n = await recover_scope(self.store, self.settler, self.metrics, scope)
            if n:
                self.streams.mark(scope)     # the entries its Resumes wrote
                log.info("recovery: scope %s: %d running jobs", scope, n)
        if self.config.tune_gc and self._gc_was is None:
            # The hot path makes many short-lived objects (events, decisions, commands)
            # while thousands of answers are in flight; with the default thresholds the
            # full collections over them cost half of a loaded host's time and free
            # nothing. Collections stay, much rarer; aclose restores the thresholds.
            self._gc_was = gc.get_threshold()
            gc.freeze()
            gc.set_threshold(*GC_THRESHOLDS)
        if self._loops:
            self._tasks = [asyncio.create_task(self._run(name, fn), name=f"sfc-{name}")
                           for name, fn in self.passes()]
        return self

    def passes(self) -> list[tuple[str, Callable[[], Awaitable[None]]]]:
        """The host's loops as named passes, each guarded (``guarded``): run back to
        back by the host itself, or as built-in Tasks of the script engine (``App``)."""
        steps: list[tuple[str, Callable[[], Any]]] = [
            ("consume", self.consume_once),
            *((f"answers{i}", self._answer_pass) for i in range(self.config.answer_workers)),
            ("local", self._local_pass),
            ("sweep", self._sweep_pass),
            ("discover", self._discover_pass)]
        return [(name, self.guarded(name, step)) for name, step in steps]

    def guarded(self, name: str, step: Callable[[], Any]) -> Callable[[], Awaitable[None]]:
        """One pass of ``step`` that never raises: a failure is logged, counted
        (``loop_errors_{name}``) and followed by a growing pause before the next."""
        fails = 0

        async def one_pass() -> None:
            nonlocal fails
            if self._closing:
                # closing: whoever runs the passes is about to stop them
                await asyncio.sleep(0.05)
                return
            try:
                await step()
                fails = 0
            except asyncio.CancelledError:
                raise
            except Exception:
                self.metrics.inc(f"loop_errors_{name}")
                delay = ERROR_BACKOFF_S[min(fails, len(ERROR_BACKOFF_S) - 1)]
                fails += 1
                log.exception("%s pass failed; again in %.2f s", name, delay)
                await self._sleep(int(delay * 1000))     # cut short by closing
        return one_pass

    def begin_close(self) -> None:
        """Tell every pass to finish: the waits they block in end now."""
        self._closing = True
        self._stopping.set()
        self._answers_ready.open()
        self._local_ready.set()
        self.streams.ready.set()

    async def __aenter__(self) -> Host:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop: each loop finishes the pass it is in (a batch half sent would wait
        for the claim idle time on another host), then the client is closed."""
        self.begin_close()
        if self._tasks:
            _, late = await asyncio.wait(self._tasks, timeout=max(
                2.0, 2 * self.config.read_block_ms / 1000))
            for t in late:
                t.cancel()
        for t in self._tasks:
            await reap(t)
        self._tasks = []
        # the acknowledgements and markers of the last commands sent, before their
        # connection goes
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.dispatcher.drain(), CLOSE_MARKERS_S)
        if self._gc_was is not None:
            gc.set_threshold(*self._gc_was)
            gc.unfreeze()
            self._gc_was = None
        if self._own_client:
            if self.channel is not None:
                await self.channel.aclose()
            await self.client.aclose()

    async def _run(self, name: str, one_pass: Callable[[], Awaitable[None]]) -> None:
        while not self._closing:
            await one_pass()

    # ---- scopes

    async def add_scope(self, scope: str) -> None:
        check_scope(scope)
        await self.orders.register_scope(scope)
        await self._serve(scope)

    async def _serve(self, scope: str) -> bool:
        """Read and sweep the scope from now on (its first read and sweep in the next
        passes); True if it is new to this host."""
        if not await self.streams.add_scope(scope):
            return False
        self.sweeper.add(scope)
        return True

    async def discover(self) -> None:
        # The registry only grows: an unchanged size is nothing new, and a read of
        # thousands of names each pass costs the host more than all its idle scopes.
        # A full read now and then still sees a registry emptied and filled again.
        self._discoveries += 1
        size = await self.client.scard(SCOPES)
        if size == self._registry_size and self._discoveries % DISCOVER_FULL_EVERY:
            return
        members = await self.client.smembers(SCOPES)
        self._registry_size = len(members)
        served = self.streams.scopes
        for m in members:
            scope = m.decode()
            if scope in served:
                continue
            try:
                check_scope(scope)
            except ValueError:
                self.metrics.inc("invalid_scopes")
                continue
            if await self._serve(scope):
                log.info("serving scope %s", scope)

    async def _sleep(self, ms: int) -> bool:
        """Sleep, cut short by ``aclose``; False when closing."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), ms / 1000)
        return not self._closing

    async def _discover_pass(self) -> None:
        if await self._sleep(self.config.discover_interval_ms):
            await self.discover()

    # ---- work entries

    def _delivered(self, scope: str, entries: list[tuple[bytes, dict[bytes, bytes]]]) -> None:
        """Entries a compare-and-set delivered to this host: handled by the local task."""
        self._local.extend((scope, eid, f) for eid, f in entries)
        self._local_ready.set()

    async def _handle_local(self) -> int:
        n = 0
        while self._local:
            raws, self._local = self._local[:self.config.read_count * 4], \
                self._local[self.config.read_count * 4:]
            done, failed = await self.work.handle(raws)
            await self._ack(done, failed)
            n += len(raws)
        return n

    async def _ack(self, done: dict[str, list[bytes]],
                   failed: dict[str, list[tuple[bytes, str]]]) -> None:
        """Ack handled entries: plain acks go to the marker writer (in the background,
        riding the channel's next request: the pass reads on at once); failure notes,
        and the acks that clear an earlier failure's note, are written now."""
        if not failed and not self.streams.noted(done):
            if done:
                self.dispatcher.markers.add((), [(s, eid) for s, ids in done.items()
                                                 for eid in ids], ())
            return
        await self.streams.ack(done, failed)

    async def _local_pass(self) -> None:
        await self._local_ready.wait()
        self._local_ready.clear()
        if self._closing:
            return
        await self._handle_local()

    async def consume_once(self, block_ms: int | None = None) -> int:
        """Read and handle one batch of entries (and orphans taken over); how many."""
        if self._local:
            return await self._handle_local()
        if not self.streams.scopes:
            await asyncio.sleep(self.config.read_block_ms / 1000)
            return 0
        raws = await self.streams.read(self.config.read_block_ms if block_ms is None
                                       else block_ms)
        more, dead = await self.streams.claim()
        raws.extend(more)
        if dead:
            await self.streams.dead_letter(dead)
        if not raws:
            return 0
        done, failed = await self.work.handle(raws)
        await self._ack(done, failed)
        return len(raws)

    # ---- answers from equipment (the MQTT path calls these)

    def answer(self, scope: str, event: BaseEvent, receipt: Any = None) -> None:
        """Queue an answer (Completed, Failed, Held, NotHeld) for the applier. Beyond
        ``answer_queue_max`` (Redis away) the oldest 1 % go: a dropped answer is settled
        by its action's deadline (the command goes out again and is answered again).
        ``receipt`` (the MQTT acknowledgement the answer's message waits for) goes to
        ``on_answers_done`` once the answer is applied, absorbed, refused or dropped:
        never while it may still be lost with this process."""
        answers = self._answers
        if not answers:
            # a worker is woken when the queue fills; one that leaves answers behind
            # wakes the next (see _answer_pass)
            self._answers_ready.ring()
        answers.append((scope, event, receipt))
        limit = self.config.answer_queue_max
        if len(answers) > limit:
            # in chunks: deleting one at the front per answer moves the whole list each time
            n = len(answers) - limit + (limit - 1) // 100
            self._done_with(answers[:n])
            del answers[:n]
            self.metrics.inc("answers_dropped", n)
            if not self._answers_dropping:
                self._answers_dropping = True
                log.warning("answer queue full (%d answers; is Redis away?): the oldest "
                            "dropped, their deadlines settle them; warned again after the "
                            "queue has emptied", limit)

    @property
    def backlog(self) -> int:
        """Answers and delivered entries waiting for a pass."""
        return len(self._answers) + len(self._local)

    def _done_with(self, answers: Sequence[tuple[str, BaseEvent, Any]]) -> None:
        """The receipts of answers this host is done with, to ``on_answers_done``."""
        done = self.on_answers_done
        if done is not None:
            receipts = [a[2] for a in answers if a[2] is not None]
            if receipts:
                done(receipts)

    async def settle_answers(self, answers: Sequence[tuple[Any, ...]]) -> list[Item]:
        """Apply answers ``(scope, event[, receipt])`` now; faults are counted and
        logged: an answer that cannot be applied is left to the action's deadline. Only
        Redis being away (a connection error or timeout after the client's retries) is
        raised: the caller keeps the answers for later."""
        items = []
        for a in answers:
            scope, ev = a[0], a[1]
            cid = getattr(ev, "command_id", "")
            job = job_of_command(cid)
            if not job:
                self.metrics.inc("answers_unknown_id")
                log.warning("answer in scope %s refused: command id %r names no job", scope,
                            cid[:100], extra={"scope": scope, "command_id": cid[:100]})
                continue
            items.append(Item(scope, job, [ev]))
        try:
            await self.settler.settle(items)
        except (RedisConnectionError, RedisTimeoutError):
            raise
        except Exception:
            self.metrics.inc("answer_errors", len(items))
            log.exception("%d answers could not be applied", len(items))
            return items
        for it in items:
            if it.outcome == APPLIED:
                self.metrics.inc("answers_applied")
            elif it.outcome in (CONFLICT, ERROR):
                self.metrics.inc("answer_errors")
            elif it.outcome == MISSING:
                self.metrics.inc("answers_unknown_job")
            else:
                self.metrics.inc("answers_absorbed")
        return items

    async def _answer_pass(self) -> None:
        # Several of these run at once: while one batch waits for Redis, the next is
        # evolved. Two batches holding answers of one job settle it through the
        # compare-and-set like any race.
        await self._answers_ready.wait()
        while self._answers:
            if self._closing:
                # Closing: settle what was queued, not what the commands sent meanwhile
                # bring back (a station answering at once would never let us stop).
                batch, self._answers = self._answers, []
                await self.settle_answers(batch)
                self._done_with(batch)
                return
            n = self.config.answer_batch
            batch, self._answers = self._answers[:n], self._answers[n:]
            if self._answers:
                self._answers_ready.ring()
            try:
                await self.settle_answers(batch)
            except (RedisConnectionError, RedisTimeoutError):
                # Redis is away: the answers wait (in order) for a worker's next pass,
                # after this one's pause
                self._answers[:0] = batch
                self._answers_ready.ring()
                raise
            self._done_with(batch)
        self._answers_dropping = False   # drained: the next overflow is warned of again

    async def queue_event(self, scope: str, type_id: str, subject: str | None = None,
                          correlation_id: str | None = None,
                          data: dict[str, Any] | None = None) -> bool:
        """Queue a pull event as an ``event`` entry, only when some job of the scope
        waits for its type; False (counted) when none does."""
        arrived = time.perf_counter()
        k = self.store.keys(check_scope(scope))
        if not await self.client.exists(k.waits(type_id)):
            self.metrics.inc("events_unmatched")
            return False
        fields: dict[str, Any] = {"k": "event", "t": type_id}
        if subject is not None:
            fields["s"] = subject
        if correlation_id is not None:
            fields["r"] = correlation_id
        if data is not None:
            fields["d"] = json.dumps(data)
        eid = await self.client.xadd(k.work, fields)
        self.streams.mark(scope)
        self.work.event_queued(eid, arrived)
        return True

    # ---- time

    async def resend_open(self, keep: Callable[[Any], bool] | None = None) -> int:
        """Send every open push attempt of the served scopes again (another host ended
        with answers it had taken: ``handover``), those ``keep`` says yes to (all when
        None); how many commands went out."""
        return await resend_open(self.store, self.dispatcher, self.metrics,
                                 list(self.streams.scopes), keep)

    async def sweep_once(self) -> int:
        """Sweep every served scope now (a pass sweeps only the due ones)."""
        return await self.sweeper.sweep(list(self.streams.scopes.values()))

    async def _sweep_pass(self) -> None:
        if await self._sleep(self.config.sweep_interval_ms) and self.streams.scopes:
            await self.sweeper.sweep_due(self.streams.scopes)

    # ---- reading

    async def inspect(self, scope: str, job: str) -> dict[str, Any] | None:
        """The readable state of a job, or None."""
        _, rows = (await self.store.load({scope: [job]}))[scope]
        row = rows[job]
        if row.state is None or row.fingerprint is None:
            return None
        graph = await self.store.graph(scope, row.fingerprint)
        if graph is None:
            return None
        view = state_to_json(graph, row.state)
        view["version"] = int(row.version)
        view["markers"] = {k.decode(): v.decode() for k, v in row.markers.items()}
        return view
