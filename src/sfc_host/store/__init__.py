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
