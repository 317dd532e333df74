"""Everything the host keeps in Redis, and every way it reads and writes it.

- ``keys``: the key layout (every key of a scope under its hash tag);
- ``client``: redis-py with the core's request packer, and ``connect`` for a config;
- ``channel``: the hot path's connection, script calls pipelined on it;
- ``lua_scripts`` and ``lua/``: the compare-and-set scripts, the only writers of state;
- ``states``: job states (read many, write with compare-and-set), pinned recipes;
- ``streams``: the work streams of every scope, their consumer groups and dead letters;
- ``orders``: job orders under the ISA-95 job order machine;
- ``outbox``: the orders whose newest state the broker may not have yet;
- ``views``: read-only readings for ``inspect``, ``top`` and the web view.
"""

from sfc_host.store.channel import RedisChannel
from sfc_host.store.client import connect, redis_from_url
from sfc_host.store.keys import SCOPES, ScopeKeys
from sfc_host.store.lua_scripts import Scripts
from sfc_host.store.orders import OrderError, Orders
from sfc_host.store.states import GraphCache, JobRow, Record, Store
from sfc_host.store.streams import Entry, Streams
from sfc_host.store.views import NotFound, read_job, scope_sample

__all__ = [
    "SCOPES",
    "Entry",
    "GraphCache",
    "JobRow",
    "NotFound",
    "OrderError",
    "Orders",
    "Record",
    "RedisChannel",
    "ScopeKeys",
    "Scripts",
    "Store",
    "Streams",
    "connect",
    "read_job",
    "redis_from_url",
    "scope_sample",
]
