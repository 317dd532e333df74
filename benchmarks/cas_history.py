"""Redis's time per record of the compare-and-set script against the length of a job's
history: does a write cost more when the job has settled many actions before it?

    python benchmarks/cas_history.py [--calls 2500] [--batch 16] [--script FILE]

Each record is what an answer's write is: the live state (300 bytes), one dispatch
entry, a new deadline and one piece of archive (settled records, 60 bytes). The calls
are the host's own (``Store.cas_call``), sent to a redis-server started here; every
record's version is carried to the next write, so every write applies. Jobs are
written round-robin, so with ``H`` writes per job every job ends with ``H`` archive
pieces. Redis's time is its own (``INFO commandstats``: the script call, its inner
commands included), per record, at H = 5, 50 and 500, and the ratio of the longest
history to the shortest.

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
from servers import RedisServer

from sfc_host.scripts import Script, Scripts
from sfc_host.store import GraphCache, Record, Store

SCOPE = "bench"
STATE = b"s" * 300
PIECE = b"a" * 60


def run(r: redis.Redis, store: Store, script: Script, history: int, calls: int,
        batch: int) -> float:
    """Redis µs per record with ``history`` writes per job."""
    r.flushall()
    k = store.keys(SCOPE)
    r.xgroup_create(k.work, "g", id="0", mkstream=True)
    jobs = max(1, calls * batch // history)
    versions = [b"0"] * jobs
    r.config_resetstat()
    j = 0
    for c in range(calls):
        recs = []
        for _ in range(batch):
            n = j % jobs
            j += 1
            a = f"a{c % 7}"
            recs.append(Record(f"J{n}", versions[n], STATE, 1_000_000 + c, None,
                               entries=[(f"dispatch:{a}", a, f"J{n}:{a}#{c}")],
                               archive=PIECE))
        _, keys, args = store.cas_call([(SCOPE, recs, True)], 0, ("g", "c", 100))
        got = r.evalsha(script.sha, len(keys), *keys, *args)
        for rec, v in zip(recs, got[0], strict=True):
            if v == 0:
                raise SystemExit(f"a write of {rec.job} lost its compare-and-set")
            versions[int(rec.job[1:])] = str(v).encode()
        if c % 64 == 63:
            # the host acks and the sweep trims; here the stream is just kept short
            r.xtrim(k.work, maxlen=0)
            r.xgroup_setid(k.work, "g", id="$")
    st = r.info("commandstats")
    return st["cmdstat_evalsha"]["usec"] / (calls * batch)


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
            r.script_load(script.source)
            store = Store(r, scripts, GraphCache(16))
            us = {h: statistics.median(run(r, store, script, h, a.calls, a.batch)
                                       for _ in range(a.rounds)) for h in histories}
        finally:
            server.stop()
    name = a.script or "this checkout's cas.lua"
    print(f"compare-and-set, {a.batch} records a call, Redis's time per record "
          f"(median of {a.rounds}; {name}):")
    for h in histories:
        print(f"  {h:>4} writes a job: {us[h]:6.2f} µs")
    print(f"  {max(histories)} against {min(histories)}: "
          f"{us[max(histories)] / us[min(histories)]:.2f}x")


if __name__ == "__main__":
    main()
