"""The limits of this machine, for benchmarks/report.py: what redis-benchmark gets from
the same redis-server for plain commands and for a script shaped like the host's
compare-and-set, and how many QoS 1 messages a second mosquitto carries from one
publisher process to one subscriber process with no host in between."""

from __future__ import annotations

import csv
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

# Shaped like one job's record in the host's compare-and-set (cas.lua): read the
# version field, compare, write state and version, the due index, the active set and one
# work entry (trimmed, so memory stays flat over millions of calls).
CAS_LIKE = """
local v = tonumber(redis.call('HGET', KEYS[1], 'v') or '0')
if v >= tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 's', ARGV[2], 'v', v + 1)
redis.call('ZADD', KEYS[2], ARGV[3], KEYS[1])
redis.call('SADD', KEYS[3], KEYS[1])
redis.call('XADD', KEYS[4], 'MAXLEN', '~', 10000, '*', 'k', 'dispatch:a', 'j', KEYS[1])
return v + 1
"""
# The whole Redis work of one completion, as the host's two scripts do it for one job
# (cas.lua: the scope's offset, version check, state, due index, the dispatch entry, the
# action's markers, delivering the new entry to this consumer; marker.lua after the
# send: the sent marker while the state exists, the ack), in one script. The host packs
# many jobs into one call of each, so it pays the per-call cost less often than this.
COMPLETION_LIKE = """
local offset = redis.call('GET', KEYS[5]) or '0'
local v = tonumber(redis.call('HGET', KEYS[1], 'v') or '0')
if v >= tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 's', ARGV[2], 'v', v + 1)
redis.call('ZADD', KEYS[2], ARGV[3], KEYS[1])
local id = redis.call('XADD', KEYS[4], 'MAXLEN', '~', 10000, '*', 'k', 'dispatch:a',
                      'j', KEYS[1], 'a', 'a', 'c', ARGV[3])
redis.call('HMGET', KEYS[1], 'sent:a', 'sent:a:hold')
redis.call('XREADGROUP', 'GROUP', 'g', 'c', 'COUNT', 1, 'STREAMS', KEYS[4], '>')
if redis.call('HEXISTS', KEYS[1], 's') == 1 then
  redis.call('HSET', KEYS[1], 'sent:a', ARGV[3])
end
redis.call('XACK', KEYS[4], 'g', id)
return v + 1
"""
STATE = "x" * 150   # a core state document of a running job is about 140 bytes


def _bench(port: int, n: int, clients: int, pipeline: int, extra: list[str]) -> dict[str, float]:
    """redis-benchmark's requests/s per test (its CSV output)."""
    argv = ["redis-benchmark", "-h", "127.0.0.1", "-p", str(port), "-n", str(n),
            "-c", str(clients), "-P", str(pipeline), "-r", "100000", "--csv", *extra]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=True).stdout
    rows = list(csv.reader(io.StringIO(out)))
    return {r[0]: float(r[1]) for r in rows[1:] if len(r) > 1}


def redis_limits(port: int, n: int, sha: str, completion_sha: str) -> dict[str, Any]:
    """SET/GET, the compare-and-set-like EVALSHA and the completion-like one, one request
    per round trip per client and pipelined 16 deep, 50 clients. The completion script
    needs the group ``g`` on ``b:cwork``."""
    if shutil.which("redis-benchmark") is None:
        return {}
    out: dict[str, Any] = {"clients": 50, "pipeline": 16, "requests": n}
    for label, depth in (("plain", 1), ("pipelined", 16)):
        got = _bench(port, n, 50, depth, ["-t", "set,get"])
        out[f"set_{label}"] = got.get("SET", 0.0)
        out[f"get_{label}"] = got.get("GET", 0.0)
        script = _bench(port, n, 50, depth,
                        ["EVALSHA", sha, "4", "b:job:__rand_int__", "b:due", "b:active",
                         "b:work", "1000000000000", STATE, "__rand_int__"])
        out[f"evalsha_{label}"] = max(script.values()) if script else 0.0
        script = _bench(port, n, 50, depth,
                        ["EVALSHA", completion_sha, "5", "b:job:__rand_int__", "b:due",
                         "b:active", "b:cwork", "b:offset", "1000000000000", STATE,
                         "__rand_int__"])
        out[f"completion_{label}"] = max(script.values()) if script else 0.0
    return out


def mqtt_limit(port: int, n: int) -> dict[str, float]:
    """Messages/s from a publisher process to a subscriber process through the broker."""
    proc = HERE / "mqtt_limit_proc.py"
    sub = subprocess.Popen([sys.executable, str(proc), "sub", "127.0.0.1", str(port), str(n)],
                           stdout=subprocess.PIPE, text=True)
    try:
        assert sub.stdout is not None
        if sub.stdout.readline().strip() != "ready":
            raise RuntimeError("the MQTT subscriber did not start")
        pub = subprocess.run([sys.executable, str(proc), "pub", "127.0.0.1", str(port), str(n)],
                             capture_output=True, text=True, timeout=300, check=True)
        got = json.loads(sub.stdout.readline())
        sub.wait(30)
    finally:
        if sub.poll() is None:
            sub.kill()
            sub.wait()
    sent = json.loads(pub.stdout)
    return {"messages": n, "delivered_per_s": got["n"] / got["seconds"],
            "acked_per_s": sent["n"] / sent["seconds"]}
