"""The job hash keeps a state in two parts on a real redis-server: the live part in ``s``
(rewritten by every event) and the archive of settled records, each write's in a
field ``h:{n}`` of its own, merged every ``ARCHIVE_MERGE`` writes; readers see them
joined, and a format-1 state is written anew."""

from __future__ import annotations

import base64
import json
from functools import partial
from pathlib import Path
from typing import Any

from helpers import hosts
from helpers.aio import run
from helpers.hosts import V110, Station, wait_until

from sfc_fast import Graph, state_to_json
from sfc_fast.events import Completed
from sfc_host.store.keys import ScopeKeys
from sfc_host.store.states import whole_state

S = "cell"
K = ScopeKeys(S)
start_host = partial(hosts.start_host, scope=S, flush_db=True)
STEPS = 8
PAD = "x" * 1000


ARCHIVE_MERGE = 32         # cas.lua's


def chain_wm(n: int = STEPS) -> dict[str, Any]:
    steps = [{"Name": f"S{i}", "Initial": i == 0} for i in range(n)]
    trans = [{"Source": f"S{i}", "Target": f"S{i + 1}", "Condition": f"a{i}.ok == true"}
             for i in range(n - 1)]
    acts = [{"Name": f"a{i}", "Step": f"S{i}", "Qualifier": "N", "Interaction": "push_command",
             "TypeId": f"com.example.a{i}.v1", "TimeoutSeconds": 60} for i in range(n)]
    return {"ID": "chain", "dataschema": V110,
            "data": {"Steps": steps, "Transitions": trans, "Actions": acts}}


def _timeless(view: dict[str, Any]) -> Any:
    keys = ("phase", "outcome", "attempt", "round", "command_id", "result")
    return (view["status"], view["active_steps"], view["step_rounds"],
            {n: tuple(a[k] for k in keys) for n, a in view["actions"].items()})


def _archive_fields(h: dict[bytes, bytes]) -> list[bytes]:
    return [k for k in h if k.startswith(b"h:")]


async def _ended(host: Any, job: str) -> dict[bytes, bytes]:
    """Store and start an order of the chain Work Master: its job hash once it ended."""
    await host.orders.store_order(S, {"JobOrderID": job, "WorkMasterID": [{"ID": "chain"}]},
                                  start=True)
    await wait_until(lambda: host.client.exists(K.response(job)), what="response")
    # a command's sent marker is written once the broker has it, which may come after
    # its answer ended the job
    await host.dispatcher.drain()
    return await host.client.hgetall(K.job(job))


def test_settled_records_are_appended_apart_and_read_back_whole(redis_url: str) -> None:
    async def main() -> None:
        # a result of about 1 KB each: each write's piece holds one step's records
        st = Station(lambda c: {"ok": True, "n": int(c.action[1:]), "pad": PAD})
        host = await start_host(redis_url, st, chain_wm())
        try:
            h = await _ended(host, "C")
            # every completion archived its step's records (the last one too: the job
            # ended, no step is active), each write's in a field of its own: nothing
            # stored is read to append (fewer than ARCHIVE_MERGE writes: no merge yet)
            hn = int(h[b"hn"])
            assert STEPS - 1 <= hn < ARCHIVE_MERGE
            assert sorted(_archive_fields(h)) == sorted(f"h:{i}".encode()
                                                       for i in range(1, hn + 1))
            assert all(len(PAD) < len(h[k]) < 2 * len(PAD) for k in _archive_fields(h))
            graph = Graph.from_bytes(await host.client.get(K.graph(h[b"g"].decode())))
            live = state_to_json(graph, h[b"s"])
            assert live["archived_missing"] == 2 * STEPS        # action and step round
            assert live["actions"] == {}
            assert len(h[b"s"]) < 120
            whole = state_to_json(graph, whole_state(h))
            assert "archived_missing" not in whole
            assert {n: a["result"] for n, a in whole["actions"].items()} == \
                {f"a{i}": {"ok": True, "n": i, "pad": PAD} for i in range(STEPS)}
            view = await host.inspect(S, "C")
            assert view is not None and view["status"] == "completed"
            assert len(view["actions"]) == STEPS
            # the job response lists the results of the archived actions too
            resp = json.loads(await host.client.get(K.response("C")))
            ids = {d["ID"] for d in resp["JobResponseData"]}
            assert ids == {f"a{i}.{f}" for i in range(STEPS) for f in ("ok", "n", "pad")}
            assert "hn" not in view["markers"]
        finally:
            await host.aclose()
    run(main())


def test_every_merge_th_write_merges_the_pieces_since_the_last_merge(redis_url: str) -> None:
    # 70 steps: merged fields at h:32 and h:64, the pieces after them apart; the job hash
    # keeps few fields however long the job runs, and reads back whole
    n = 70

    async def main() -> None:
        st = Station(lambda c: {"ok": True, "n": int(c.action[1:])})
        host = await start_host(redis_url, st, chain_wm(n))
        try:
            h = await _ended(host, "L")
            hn = int(h[b"hn"])
            assert hn >= n - 1
            merged = list(range(ARCHIVE_MERGE, hn + 1, ARCHIVE_MERGE))
            apart = list(range(merged[-1] + 1, hn + 1))
            assert sorted(_archive_fields(h)) == sorted(f"h:{i}".encode()
                                                       for i in merged + apart)
            graph = Graph.from_bytes(await host.client.get(K.graph(h[b"g"].decode())))
            whole = state_to_json(graph, whole_state(h))
            assert {a: v["result"] for a, v in whole["actions"].items()} == \
                {f"a{i}": {"ok": True, "n": i} for i in range(n)}
            view = await host.inspect(S, "L")
            assert view is not None and view["status"] == "completed"
        finally:
            await host.aclose()
    run(main())


def test_chunks_of_an_earlier_layout_are_carried_on(redis_url: str) -> None:
    # A job written by an earlier host (archive chunks of up to 4 KB, appended in place,
    # `hn` the last chunk's number) goes on with pieces of its own after them; the
    # merge at h:32 reaches back over the old chunks and keeps their order.
    n = 60
    held = {"on": True}

    def answer(c: Any) -> Any:
        if c.action == "a20" and held["on"]:
            return False
        return {"ok": True, "n": int(c.action[1:])}

    async def main() -> None:
        st = Station(answer)
        host = await start_host(redis_url, st, chain_wm(n))
        try:
            await host.orders.store_order(S, {"JobOrderID": "O",
                                              "WorkMasterID": [{"ID": "chain"}]}, start=True)
            cmd = await wait_until(lambda: next((c for c in st.commands if c.action == "a20"),
                                                None), what="a20 sent")
            h = await host.client.hgetall(K.job("O"))
            before = whole_state(h)
            # the same archive as an earlier host kept it: joined, cut into 3 chunks
            arch = b"".join(h[k] for k in sorted(_archive_fields(h), key=lambda k: int(k[2:])))
            third = len(arch) // 3 + 1
            await host.client.hdel(K.job("O"), *_archive_fields(h))
            await host.client.hset(K.job("O"), mapping={
                "h:1": arch[:third], "h:2": arch[third:2 * third], "h:3": arch[2 * third:],
                "hn": "3"})
            assert whole_state(await host.client.hgetall(K.job("O"))) == before
            held["on"] = False
            host.answer(S, Completed(cmd.command_id, {"ok": True, "n": 20}))
            await wait_until(lambda: host.client.exists(K.response("O")), what="response")
            h = await host.client.hgetall(K.job("O"))
            hn = int(h[b"hn"])
            assert hn > ARCHIVE_MERGE
            assert sorted(_archive_fields(h)) == sorted(
                f"h:{i}".encode() for i in [ARCHIVE_MERGE, *range(ARCHIVE_MERGE + 1, hn + 1)])
            graph = Graph.from_bytes(await host.client.get(K.graph(h[b"g"].decode())))
            whole = state_to_json(graph, whole_state(h))
            assert {a: v["result"] for a, v in whole["actions"].items()} == \
                {f"a{i}": {"ok": True, "n": i} for i in range(n)}
        finally:
            await host.aclose()
    run(main())


def test_a_lean_read_has_what_an_event_is_evolved_from_and_nothing_of_the_history(
        redis_url: str) -> None:
    # The settler reads a job it did not write last without its archive and sent
    # markers (their count grows with the job's history), as a cached row has it; a
    # whole read still has both.
    async def main() -> None:
        st = Station(lambda c: {"ok": True, "n": int(c.action[1:])})
        host = await start_host(redis_url, st, chain_wm(40))
        try:
            h = await _ended(host, "R")
            got = await host.store.load({}, {S: ["R", "nobody"]})
            lean = got[S][1]["R"]
            assert lean.state == lean.live == h[b"s"] and not lean.archive_known
            assert lean.version == h[b"v"] and lean.fingerprint == h[b"g"].decode()
            assert lean.markers == {} and lean.archive == b""
            assert got[S][1]["nobody"].state is None
            whole = (await host.store.load({S: ["R"]}, {S: ["R"]}))[S][1]["R"]
            assert whole.archive_known and whole.state == whole_state(h)
            assert whole.markers == {k: v for k, v in h.items() if k.startswith(b"sent:")}
        finally:
            await host.aclose()
    run(main())


def test_answers_routed_to_the_other_host_each_time_end_the_job_whole(
        redis_url: str) -> None:
    # The station answers through the two hosts in turn, so every answer reaches the
    # host that did not write the job last and reads the job from Redis (lean: no
    # archive, no markers); the host that ends it reads the archive once for the job
    # response, and the pieces and merges both hosts wrote end as one whole state.
    n = 40

    async def main() -> None:
        st = Station(lambda c: {"ok": True, "n": int(c.action[1:])})
        h1 = await start_host(redis_url, st, chain_wm(n), consumer="h1")
        h2 = await start_host(redis_url, st, flush_db=False, consumer="h2")
        lean_reads = []
        for host in (h1, h2):
            def spy(wanted: Any, lean: Any = None, _load: Any = host.store.load) -> Any:
                lean_reads.extend(j for jobs in (lean or {}).values() for j in jobs)
                return _load(wanted, lean)
            host.store.load = spy  # type: ignore[method-assign]
        try:
            h = await _ended(h1, "T")
            graph = Graph.from_bytes(await h1.client.get(K.graph(h[b"g"].decode())))
            whole = state_to_json(graph, whole_state(h))
            assert whole["status"] == "completed"
            assert {a: v["result"] for a, v in whole["actions"].items()} == \
                {f"a{i}": {"ok": True, "n": i} for i in range(n)}
            resp = json.loads(await h1.client.get(K.response("T")))
            assert {d["ID"] for d in resp["JobResponseData"]} == \
                {f"a{i}.{f}" for i in range(n) for f in ("ok", "n")}
            # both hosts settled answers of the job, reading it lean when the other
            # host had written it last
            assert h1.metrics["answers_applied"] > 0 and h2.metrics["answers_applied"] > 0
            assert lean_reads.count("T") >= n // 2
        finally:
            await h1.aclose()
            await h2.aclose()
    run(main())


def test_a_format_1_state_in_redis_is_read_and_written_anew(redis_url: str) -> None:
    data = json.loads((Path(__file__).resolve().parents[1] / "data" / "states_v1.json").read_text())
    case = next(c for c in data["cases"] if c["recipe"] == "chain30" and c["status"] == "running"
                and c["applied"] and c["event"][0] == "Completed"
                and len(c["view"]["actions"]) > 3)
    blob = base64.b64decode(data["graphs"]["chain30"])
    graph = Graph.from_bytes(blob)
    old = base64.b64decode(case["state"])

    async def main() -> None:
        st = Station(lambda c: False)
        host = await start_host(redis_url, st)
        try:
            fp = graph.fingerprint
            await host.client.set(K.graph(fp), blob)
            await host.client.hset(K.job("J-1"), mapping={"s": old, "v": "1", "g": fp})
            await host.settle_answers([(S, Completed(*case["event"][1:]))])
            h = await host.client.hgetall(K.job("J-1"))
            assert h[b"v"] != b"1" and h[b"s"][3] == 2
            assert _archive_fields(h)             # the settled records moved out of `s`
            view = state_to_json(graph, whole_state(h))
            # the host decided at its own clock: compare all but the times
            assert _timeless(view) == _timeless(case["after"])
            assert view["format"] == "2.0"
        finally:
            await host.aclose()
    run(main())
