"""The hot path's Redis channel (``sfc_host.store.channel``) against a real redis-server:
requests of one loop pass in one write, replies to their callers in order, redis-py's
error classes, a cancelled caller, a restart, AUTH and SELECT. (The host's scripts go
through it in every host test on a standalone Redis; ``test_host_rules`` checks that
they do and reload after ``SCRIPT FLUSH``.)"""

from __future__ import annotations

import asyncio

import pytest
from redis import exceptions as rx

from sfc_host.store.channel import LAZY_WAIT_S, RedisChannel
from sfc_host.store.client import redis_from_url


def test_calls_of_one_loop_pass_share_a_write_and_each_gets_its_reply(
        redis_url: str) -> None:
    async def main() -> None:
        ch = RedisChannel(redis_url)
        try:
            await ch.execute("DEL", "ch:n")
            before = ch.writes
            got = await asyncio.gather(*(ch.execute("INCR", "ch:n") for _ in range(200)))
            assert got == list(range(1, 201))
            assert ch.writes == before + 1
            many = await ch.execute_many([("SET", "ch:s", "x"), ("GET", "ch:s"),
                                          ("HSET", "ch:h", "f", "v"), ("INCR", "ch:h"),
                                          ("GET", "ch:none")])
            assert many[:3] == [b"OK", b"x", 1] and many[4] is None
            assert isinstance(many[3], rx.ResponseError) and "WRONGTYPE" in str(many[3])
            with pytest.raises(rx.ResponseError, match="WRONGTYPE"):
                await ch.execute("INCR", "ch:h")
            with pytest.raises(rx.NoScriptError):
                await ch.execute("EVALSHA", "0" * 40, 0)
            with pytest.raises(rx.DataError):
                await ch.execute("SET", "ch:s", None)
            assert await ch.execute("GET", "ch:s") == b"x"      # still in step
        finally:
            await ch.aclose()
    asyncio.run(main())


def test_a_cancelled_caller_leaves_the_replies_in_step(redis_url: str) -> None:
    async def main() -> None:
        ch = RedisChannel(redis_url)
        try:
            await ch.execute("SET", "ch:c", "1")
            slow = asyncio.ensure_future(ch.execute("EVAL", "return redis.call('GET', KEYS[1])",
                                                    1, "ch:c"))
            nxt = asyncio.ensure_future(ch.execute("INCR", "ch:c"))
            await asyncio.sleep(0)
            slow.cancel()
            assert await nxt == 2
            assert await ch.execute("GET", "ch:c") == b"2"
        finally:
            await ch.aclose()
    asyncio.run(main())


def test_a_restarted_redis_is_connected_again_and_calls_go_on(make_redis) -> None:
    server = make_redis()

    async def main() -> None:
        ch = RedisChannel(server.url)
        try:
            assert await ch.execute("SET", "k", "before") == b"OK"
            await asyncio.get_running_loop().run_in_executor(None, server.restart)
            # the first call after the restart finds the old connection closed and is
            # sent again on a new one
            assert await ch.execute("SET", "k", "after") == b"OK"
            assert await ch.execute("GET", "k") == b"after"
            assert ch.connects == 2
            await asyncio.get_running_loop().run_in_executor(None, server.stop)
            with pytest.raises(rx.ConnectionError, match="connecting to Redis"):
                await ch.execute("GET", "k")
        finally:
            await ch.aclose()
    asyncio.run(main())


def test_auth_and_the_database_of_the_url(make_redis) -> None:
    server = make_redis()
    base = f"redis://:s3cret@127.0.0.1:{server.port}"

    async def main() -> None:
        plain = redis_from_url(server.url)
        await plain.config_set("requirepass", "s3cret")
        await plain.aclose()
        ch = RedisChannel(f"{base}/3")
        bad = RedisChannel(f"redis://:wrong@127.0.0.1:{server.port}/0")
        try:
            await ch.execute("SET", "where", "three")
            c = redis_from_url(f"{base}/3")
            assert await c.get("where") == b"three"
            await c.aclose()
            with pytest.raises(rx.AuthenticationError):
                await bad.execute("PING")
        finally:
            await ch.aclose()
            await bad.aclose()
    asyncio.run(main())


def test_a_lazy_request_goes_with_the_next_write_or_after_its_wait(redis_url: str) -> None:
    async def main() -> None:
        ch = RedisChannel(redis_url)
        try:
            await ch.execute("DEL", "ch:l")
            before = ch.writes
            lazy = asyncio.ensure_future(ch.execute("INCR", "ch:l", lazy=True))
            await asyncio.sleep(0.001)
            assert not lazy.done() and ch.writes == before      # waiting for company
            assert await ch.execute("INCR", "ch:l") == 2        # in step: lazy went first
            assert await lazy == 1
            assert ch.writes == before + 1                       # one write for both
            t0 = asyncio.get_running_loop().time()
            assert await ch.execute_many([("INCR", "ch:l")], lazy=True) == [3]
            waited = asyncio.get_running_loop().time() - t0     # alone: after its wait
            assert LAZY_WAIT_S * 0.8 <= waited < LAZY_WAIT_S + 0.5
            assert ch.writes == before + 2
        finally:
            await ch.aclose()
    asyncio.run(main())
