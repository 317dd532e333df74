"""The Redis key layout. Every key of a scope carries the hash tag ``{scope}``.

One script only touches keys of one scope, so every script runs on one slot and the
same code works on Redis Cluster. Only the scope registry and the hosts' runs are global.
"""

from __future__ import annotations

PREFIX = "sfc"
SCOPES = f"{PREFIX}:scopes"   # set of known scopes (global, never used inside a script)
# hash consumer -> the run of that host now (or last) up: a run that ended is taken over
# once, by a survivor or by the host's next run (global, never used inside a script)
HOSTS = f"{PREFIX}:hosts"


def run_taken(consumer: str, run: str) -> str:
    """Set (with an expiry) by the one host that took over the end of that run."""
    return f"{PREFIX}:taken:{consumer}:{run}"

_WORK_HEAD = len(PREFIX) + 2          # "sfc:{"
_WORK_TAIL = len("}:work")


def scope_of_work(stream: bytes | str) -> str:
    """The scope of a work stream's key (``sfc:{scope}:work``), as Redis names it in a
    reply."""
    name = stream[_WORK_HEAD:-_WORK_TAIL]
    return name.decode() if isinstance(name, bytes) else name


class ScopeKeys:
    """The keys of one scope."""

    __slots__ = ("active", "base", "dead", "due", "errors", "heartbeat", "index",
                 "index_entries", "index_order", "index_seq", "jobs", "live", "offset",
                 "outbox", "results", "scope", "seq", "work")

    def __init__(self, scope: str) -> None:
        self.scope = scope
        self.base = f"{PREFIX}:{{{scope}}}:"
        b = self.base
        self.due = b + "due"            # zset job -> next deadline (ms) minus `offset`
        self.active = b + "active"      # set of running (and held) jobs
        self.work = b + "work"          # work stream
        self.dead = b + "dead"          # dead stream
        self.heartbeat = b + "hb"       # last sweep (server ms)
        self.offset = b + "offset"      # the outages' gaps so far (ms): see sweep.lua
        self.errors = b + "errors"      # hash entry id -> last handler error
        self.index = b + "state-index"  # hash job -> order state (every order not cleared)
        self.seq = b + "state-seq"      # + 1 per order change
        self.index_seq = b + "index-seq"  # + 1 per state-index published (its seq)
        self.index_order = b + "index-order"  # zset job -> Priority (the index's order)
        self.index_entries = b + "index-entries"  # hash job -> its index entry (JSON)
        self.results = b + "results"    # set of the jobs whose job response exists
        self.live = b + "live"          # set of orders not ended (max_job_orders)
        self.outbox = b + "outbox"      # hash job -> stamp of a change the MES may lack
        self.jobs = b + "job:"          # the job hashes' prefix (see job())

    def job(self, job: str) -> str:
        """Job hash: ``s`` state, ``v`` version, ``g`` graph fingerprint, ``o`` the scope
        offset its state has seen (absent: 0), ``sent:*`` markers."""
        return self.jobs + job

    def order(self, job: str) -> str:
        """Job order hash: ``order`` JSON, ``state``, ``v``, ``token``, ``reason``."""
        return self.base + "order:" + job

    def response(self, job: str) -> str:
        return self.base + "response:" + job

    def waits(self, type_id: str) -> str:
        """zset job -> since (ms) of jobs waiting for a pull event of that type."""
        return self.base + "waits:" + type_id

    def graph(self, fingerprint: str) -> str:
        return self.base + "graph:" + fingerprint

    def work_master(self, wm_id: str) -> str:
        return self.base + "wm:" + wm_id

    @property
    def work_masters(self) -> str:
        """Set of the scope's Work Master ids (the keys ``work_master`` names)."""
        return self.base + "wms"

    def catalog(self, kind: str) -> str:
        """Set of the ids an MES configured for the scope (``equipment``,
        ``materialclass``, ``materialdefinition``, ``personnel``, ``physicalasset``)."""
        return self.base + "cfg:" + kind

    @property
    def acceptance(self) -> str:
        """The scope's ``max_downloadable_job_orders`` (config.jobacceptance)."""
        return self.base + "cfg:jobacceptance"

    def seen(self, digest: str) -> str:
        """A request already answered (source and id hashed): its reply, for a repeat."""
        return self.base + "seen:" + digest
