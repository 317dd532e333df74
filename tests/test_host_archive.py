"""The job hash keeps a state in two parts on a real redis-server: the live part in ``s``
(rewritten by every event) and the archive of settled records appended to chunks
``h:{n}`` of up to 4 KB; readers see them joined, and a format-1 state is written
anew."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from hosts import V110, Station, wait_until
from test_host_flow import S, run, start_host

from sfc_fast import Graph, state_to_json
from sfc_fast.events import Completed
from sfc_host.keys import ScopeKeys
from sfc_host.store import whole_state

K = ScopeKeys(S)
STEPS = 8
PAD = "x" * 1000


def chain_wm() -> dict[str, Any]:
    steps = [{"Name": f"S{i}", "Initial": i == 0} for i in range(STEPS)]
    trans = [{"Source": f"S{i}", "Target": f"S{i + 1}", "Condition": f"a{i}.ok == true"}
             for i in range(STEPS - 1)]
    acts = [{"Name": f"a{i}", "Step": f"S{i}", "Qualifier": "N", "Interaction": "push_command",
             "TypeId": f"com.example.a{i}.v1", "TimeoutSeconds": 60} for i in range(STEPS)]
    return {"ID": "chain", "dataschema": V110,
            "data": {"Steps": steps, "Transitions": trans, "Actions": acts}}


def _timeless(view: dict[str, Any]) -> Any:
    keys = ("phase", "outcome", "attempt", "round", "command_id", "result")
    return (view["status"], view["active_steps"], view["step_rounds"],
            {n: tuple(a[k] for k in keys) for n, a in view["actions"].items()})


def _archive_fields(h: dict[bytes, bytes]) -> list[bytes]:
    return [k for k in h if k.startswith(b"h:")]


def test_settled_records_are_appended_apart_and_read_back_whole(redis_url: str) -> None:
    async def main() -> None:
        # a result of about 1 KB each: eight settled steps fill more than one chunk
        st = Station(lambda c: {"ok": True, "n": int(c.action[1:]), "pad": PAD})
        host = await start_host(redis_url, st, chain_wm())
        try:
            await host.orders.store_order(S, {"JobOrderID": "C",
                                              "WorkMasterID": [{"ID": "chain"}]}, start=True)
            await wait_until(lambda: host.client.exists(K.response("C")), what="response")
            h = await host.client.hgetall(K.job("C"))
            # every completion archived its step's records (the last one too: the job
            # ended, no step is active), appended to a chunk while it stays under 4 KB
            hn = int(h[b"hn"])
            assert 2 <= hn < STEPS
            assert sorted(_archive_fields(h)) == sorted(f"h:{i}".encode()
                                                       for i in range(1, hn + 1))
            assert all(len(h[k]) <= 4096 for k in _archive_fields(h))
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


def test_a_format_1_state_in_redis_is_read_and_written_anew(redis_url: str) -> None:
    data = json.loads((Path(__file__).parent / "data" / "states_v1.json").read_text())
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
