"""The Redis client the host uses: redis-py asyncio with hiredis, one shared pool.

redis-py parses replies with hiredis but packs requests in Python, one argument at a
time; on the host's hot path (a few script calls carrying thousands of arguments) that
packing was half of the CPU. These connection classes pack with the core's packer
(``sfc_fast.wire.resp.pack_command``, hiredis's bytes, as the host's channel does) and fall
back to redis-py for anything it does not take, so errors stay redis-py's.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

import redis.asyncio as aioredis
from redis.asyncio.connection import (
    AbstractConnection,
    BlockingConnectionPool,
    Connection,
    SSLConnection,
    UnixDomainSocketConnection,
)
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from sfc_fast.wire.resp import pack_command
from sfc_host.config import HostConfig

# A call on a connection a Redis restart closed is tried again on a new one, this many
# times and this far apart (exponential, capped): the host's writes are compare-and-set
# scripts, markers and acks, all safe to repeat. The pool, the cluster client and the
# host's channel (channel.py) all follow it.
RETRIES = 3
BACKOFF_BASE_S = 0.05
BACKOFF_CAP_S = 1.0

# What a call raises when Redis or the way to it fails: redis-py's errors (an error
# reply too), its cluster errors (not RedisErrors) and the socket's. What a caller that
# goes on past a failed call catches; anything else is a bug and goes up.
REDIS_FAILURES = (RedisError, RedisClusterException, OSError)


def retry() -> Retry:
    return Retry(ExponentialBackoff(cap=BACKOFF_CAP_S, base=BACKOFF_BASE_S), RETRIES)


def pack_request(args: tuple[Any, ...]) -> bytes:
    """One request in RESP, packed by the core (hiredis's bytes); ``TypeError`` for an
    argument it does not take. A command name of two words (``CLIENT SETNAME``, as
    redis-py writes some) is two arguments."""
    first = args[0]
    if (" " in first) if isinstance(first, str) else (isinstance(first, bytes) and b" " in first):
        args = (*first.split(), *args[1:])
    return pack_command(args)


def _pack(conn: AbstractConnection, args: tuple[Any, ...]) -> list[bytes]:
    try:
        return [pack_request(args)]
    except TypeError:       # redis-py's packer decides, with its own errors
        return AbstractConnection.pack_command(conn, *args)


class FastConnection(Connection):
    def pack_command(self, *args: Any) -> list[bytes]:
        return _pack(self, args)


class FastSSLConnection(SSLConnection):
    def pack_command(self, *args: Any) -> list[bytes]:
        return _pack(self, args)


class FastUnixConnection(UnixDomainSocketConnection):
    def pack_command(self, *args: Any) -> list[bytes]:
        return _pack(self, args)


def connection_class(url: str) -> type[Connection]:
    scheme = urlparse(url).scheme
    if scheme == "rediss":
        return FastSSLConnection
    if scheme == "unix":
        return FastUnixConnection
    return FastConnection


def tls_options(url: str, ca_file: str = "", cert_file: str = "",
                key_file: str = "") -> dict[str, Any]:
    """redis-py's TLS keywords for a ``rediss://`` URL (none for other schemes, whose
    connection classes take no such keywords)."""
    if urlparse(url).scheme != "rediss":
        return {}
    opts: dict[str, Any] = {}
    if ca_file:
        opts["ssl_ca_certs"] = ca_file
    if cert_file:
        opts["ssl_certfile"] = cert_file
        opts["ssl_keyfile"] = key_file or None
    return opts


def redis_from_url(url: str, max_connections: int = 16,
                   pool_timeout_s: float = 30.0, **tls: Any) -> aioredis.Redis:
    """A standalone client with the fast packing connection class for the URL, over a
    blocking pool: a call beyond ``max_connections`` waits for a free connection
    instead of failing. ``tls``: ``tls_options`` for a ``rediss://`` URL."""
    pool = BlockingConnectionPool.from_url(
        url, connection_class=connection_class(url), max_connections=max_connections,
        timeout=pool_timeout_s, retry=retry(),
        retry_on_error=[RedisConnectionError, RedisTimeoutError], **tls)
    return aioredis.Redis(connection_pool=pool)


def connect(config: HostConfig) -> Any:
    """The shared client (a pool of connections) for a config."""
    tls = tls_options(config.redis_url, config.redis_ca_file, config.redis_cert_file,
                      config.redis_key_file)
    if config.redis_cluster:
        from redis.asyncio.cluster import RedisCluster
        return RedisCluster.from_url(config.redis_url, retry=retry(),
                                     retry_on_error=[RedisConnectionError, RedisTimeoutError],
                                     **tls)
    return redis_from_url(config.redis_url, max_connections=config.redis_pool_size, **tls)
