"""One host instance in its own process, for the fault tests.

    python tests/helpers/host_proc.py REDIS_URL CONSUMER

Settings come from ``HostConfig.load`` (``SFC_*`` environment variables), with the
Redis URL and consumer name from the command line. Commands go to the Redis list
``test:commands`` as JSON (``command_id``, ``action``, ``scope``, ``job``, plus the
sending ``consumer`` and its ``batch`` number: one number per ``send`` call). Answers
come from the lists ``test:answers:{CONSUMER}`` and ``test:answers`` as JSON
``{scope, command_id, result}`` (or ``reason`` instead of ``result``: a failure) and go
to ``host.answer``. ``HOST_PROC_SINK_DELAY_MS`` makes the sink return that much later
after queueing (a slow link). Prints ``ready`` once the host runs; SIGTERM (or SIGINT) closes
the host, writes its counters to stderr (``metrics {json}``) and exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from sfc_fast import Command
from sfc_fast.events import Completed, Failed
from sfc_host.config import HostConfig
from sfc_host.execution.host import Host

COMMANDS = "test:commands"
ANSWERS = "test:answers"

log = logging.getLogger("host_proc")


class ListSink:
    """Queues each command on the Redis list ``test:commands``. With ``delay_s`` it
    returns that much later (a slow link: the crash window between a command going out
    and its sent marker is wider)."""

    def __init__(self, client: Any, consumer: str, delay_s: float = 0.0) -> None:
        self.client = client
        self.consumer = consumer
        self.delay_s = delay_s
        self.batch = 0

    async def send(self, commands: Sequence[Command]) -> list[bool]:
        if not commands:
            return []
        self.batch += 1
        await self.client.rpush(COMMANDS, *(json.dumps({
            "command_id": c.command_id, "action": c.action, "scope": c.scope, "job": c.job,
            "consumer": self.consumer, "batch": self.batch}) for c in commands))
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        return [True] * len(commands)


async def answers(host: Host, client: Any, consumer: str) -> None:
    """Hand answers from the answer lists to the host, for ever."""
    keys = [f"{ANSWERS}:{consumer}", ANSWERS]
    while True:
        try:
            got = await client.blpop(keys, timeout=1)
        except RedisError as e:
            log.warning("answer list: %s", e)
            await asyncio.sleep(0.1)
            continue
        if got is None:
            continue
        try:
            a = json.loads(got[1])
            if "reason" in a:
                host.answer(a["scope"], Failed(a["command_id"], a["reason"]))
            else:
                host.answer(a["scope"], Completed(a["command_id"], a.get("result")))
        except (ValueError, KeyError, TypeError) as e:
            log.warning("bad answer %r: %s", got[1], e)


async def main(redis_url: str, consumer: str) -> None:
    config = HostConfig.load(redis_url=redis_url, consumer=consumer)
    logging.basicConfig(level=config.log_level, stream=sys.stderr,
                        format=f"{consumer} %(levelname)s %(name)s: %(message)s")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    side = aioredis.Redis.from_url(redis_url)     # the sink and the answer lists
    try:
        delay = float(os.environ.get("HOST_PROC_SINK_DELAY_MS", "0")) / 1000
        async with Host(config, ListSink(side, consumer, delay)) as host:
            task = asyncio.create_task(answers(host, side, consumer))
            print("ready", flush=True)
            await stop.wait()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            print("metrics " + json.dumps(host.metrics.snapshot(), sort_keys=True),
                  file=sys.stderr, flush=True)
    finally:
        await side.aclose()


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: host_proc.py REDIS_URL CONSUMER")
    try:
        import uvloop
    except ImportError:
        asyncio.run(main(sys.argv[1], sys.argv[2]))
    else:
        uvloop.run(main(sys.argv[1], sys.argv[2]))
