"""Redis's time per record of the compare-and-set script against the length of a job's
history: does a write cost more when the job has settled many actions before it? And
what a whole read of such a job (``load.lua``) costs.

    python benchmarks/cas_history.py [--calls 2500] [--batch 16] [--script FILE]

Each record is what an answer's write is: the live state (300 bytes), one dispatch
entry, a new deadline and one piece of archive (settled records, 60 bytes). The calls
are the host's own (``Store.cas_call``), sent to a redis-server started here; every
record's version is carried to the next write, so every write applies. Jobs are
written round-robin, so with ``H`` writes per job every job ends with ``H`` archive
pieces. As in the host, every command sent leaves its sent marker (``marker.lua``,
one field per action: each write here dispatches a new action, as a chain does). Redis's
time is its own (``INFO commandstats``: the script call, its inner commands included),
per record, at H = 5, 50 and 500, and the ratio of the longest history to the
shortest; then per job, a whole read of every job and a lean one (``Store.load``'s
calls: the lean read, the settler's, leaves out the archive and the sent markers).

``--script FILE``: another build's ``cas.lua`` in place of this checkout's (the host
builds the calls the same way), to compare layouts in turns.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import redis
from helpers.servers import RedisServer

from sfc_host.store.lua_scripts import Script, Scripts
from sfc_host.store.states import GraphCache, Record, Store

SCOPE = "bench"
STATE = b"s" * 300
PIECE = b"a" * 60


def _script_us(r: redis.Redis) -> int:
    """Redis's time in script calls so far (µs; their inner commands included)."""
    st = r.info("commandstats").get("cmdstat_evalsha")
    return int(st["usec"]) if st else 0


def run(r: redis.Redis, store: Store, script: Script, history: int, calls: int,
        batch: int) -> tuple[float, float, float]:
    """Redis µs per record with ``history`` writes per job, and per whole and per lean
    read of a job at the end."""
    r.flushall()
    k = store.keys(SCOPE)
    r.xgroup_create(k.work, "g", id="0", mkstream=True)
    jobs = max(1, calls * batch // history)
    versions = [b"0"] * jobs
    marker = store.scripts["marker"]
    spent = 0
    j = 0
    for c in range(calls):
        recs = []
        for _ in range(batch):
            n = j % jobs
            j += 1
            a = f"a{c}"
            recs.append(Record(f"J{n}", versions[n], STATE, 1_000_000 + c, None,
                               entries=[(f"dispatch:{a}", a, f"J{n}:{a}#1")],
                               archive=PIECE))
        _, keys, args = store.cas_call([(SCOPE, recs, True)], 0, ("g", "c", 100))
        before = _script_us(r)
        got = r.evalsha(script.sha, len(keys), *keys, *args)
        spent += _script_us(r) - before
        for rec, v in zip(recs, got[0], strict=True):
            if v == 0:
                raise SystemExit(f"a write of {rec.job} lost its compare-and-set")
            versions[int(rec.job[1:])] = str(v).encode()
        # the commands went out: their markers, and the acks of their entries
        marks = [(SCOPE, rec.job, f"sent:{rec.entries[0][1]}", f"1:{rec.entries[0][2]}")
                 for rec in recs]
        ids = [e for i in range(0, len(got[1]), 3) if isinstance(e := got[1][i], bytes)]
        _, mkeys, margs = store._marker_call(marks, [(SCOPE, eid) for eid in ids])
        r.evalsha(marker.sha, len(mkeys), *mkeys, *margs)
        if c % 64 == 63:
            # the host acks and the sweep trims; here the stream is just kept short
            r.xtrim(k.work, maxlen=0)
            r.xgroup_setid(k.work, "g", id="$")
    cas_us = spent / (calls * batch)
    names = [f"J{n}" for n in range(jobs)]
    reads = []
    for lean in (False, True):
        r.config_resetstat()
        for i in range(0, jobs, batch):
            _, calls_ = store._load_calls({SCOPE: names[i:i + batch]}, lean)
            for sc, keys, args in calls_:
                r.evalsha(sc.sha, len(keys), *keys, *args)
        reads.append(_script_us(r) / jobs)
    return cas_us, reads[0], reads[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--calls", type=int, default=2500)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--script", default="", help="another cas.lua to run instead")
    a = p.parse_args()
    if a.calls < 1 or a.batch < 1 or a.rounds < 1:
        p.error("--calls, --batch and --rounds must be at least 1")
    histories = (5, 50, 500)
    if a.calls < max(histories):
        # a call writes each of its jobs once, so a job has at most one write a call
        p.error(f"--calls must be at least {max(histories)}: a job has one write a call")
    try:
        source = Path(a.script).read_text() if a.script else None
    except OSError as e:
        p.error(f"--script: {e.strerror}: {a.script}")
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp))
        server.start()
        try:
            r = redis.Redis(port=server.port)
            scripts = Scripts(r)
            script = Script("cas", source) if source is not None else scripts["cas"]
            scripts.by_name["cas"] = script
            for sc in scripts.by_name.values():
                r.script_load(sc.source)
            store = Store(r, scripts, GraphCache(16))
            got = {h: [run(r, store, script, h, a.calls, a.batch) for _ in range(a.rounds)]
                   for h in histories}
        finally:
            server.stop()
    lo, hi = min(histories), max(histories)
    name = a.script or "this checkout's cas.lua"
    for col, title in ((0, f"compare-and-set, {a.batch} records a call, Redis's time per "
                           f"record (median of {a.rounds}; {name}):"),
                       (1, "a whole read of the job at the end (load.lua), Redis's time "
                           "per job:"),
                       (2, "a lean read (the settler's: no archive, no markers), Redis's "
                           "time per job:")):
        med = {h: statistics.median(g[col] for g in got[h]) for h in histories}
        print(title)
        for h in histories:
            print(f"  {h:>4} writes a job: {med[h]:8.2f} µs")
        print(f"  {hi} against {lo}: {med[hi] / med[lo]:.2f}x")


if __name__ == "__main__":
    main()
