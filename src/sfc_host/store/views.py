"""Read one job straight from Redis (``sfc-host inspect``): its order, its state document
(``sfc_fast.state_to_json`` against the pinned recipe), its deadlines and sent markers.

Nothing here writes: an operator can run it against a live system at any time. Every
time is the Redis server's clock (``TIME``), the same clock the hosts decide by.
"""

from __future__ import annotations

import json
from typing import Any

from sfc_fast import Graph, StateFormatError, state_to_json
from sfc_host.errors import SfcHostError
from sfc_host.store.keys import SCOPES, ScopeKeys
from sfc_host.store.states import GraphCache, caught_up, whole_state
from sfc_host.tracing.context import from_stored

# action phases that still wait for something (a command's answer, a timer, an exit)
OPEN_PHASES = ("delayed", "open", "waiting_exit")


class NotFound(SfcHostError, LookupError):
    """No job order and no job state under that id in the scope."""


async def server_ms(client: Any) -> int:
    sec, usec = await client.time()
    return int(sec) * 1000 + int(usec) // 1000


def _text(raw: Any) -> str | None:
    return raw.decode() if isinstance(raw, bytes) else raw


def _json(raw: str | None) -> Any:
    try:
        return json.loads(raw) if raw else None
    except ValueError:      # a stored order is JSON; show nothing rather than fail
        return None


def _in_s(ms: int | None, now: int) -> float | None:
    return None if ms is None else round((ms - now) / 1000, 3)


async def read_job(client: Any, scope: str, job: str,
                   graphs: GraphCache | None = None) -> dict[str, Any]:
    """Everything known of a job; ``NotFound`` when there is neither order nor state.
    ``graphs`` (fingerprint -> recipe) saves reading a pinned recipe again: a
    fingerprint names its content, so a kept one never goes stale."""
    k = ScopeKeys(scope)
    pipe = client.pipeline(transaction=False)
    pipe.hgetall(k.order(job))
    pipe.hgetall(k.job(job))
    pipe.zscore(k.due, job)
    pipe.sismember(k.active, job)
    pipe.exists(k.response(job))
    pipe.get(k.offset)
    order_h, job_h, due, active, has_response, offset = await pipe.execute()
    # due scores and states are kept relative to the scope's outage offset (store.py)
    offset = int(offset or 0)
    if due is not None:
        due = int(due) + offset
    now = await server_ms(client)
    order = {_text(a): _text(b) for a, b in (order_h or {}).items()}
    job_h = job_h or {}
    if not order and not job_h:
        raise NotFound(f"no job {job!r} in scope {scope!r}")
    out: dict[str, Any] = {
        "scope": scope, "job": job, "server_ms": now,
        "order_state": order.get("state"), "order_version": int(order.get("v") or 0),
        "order_reason": order.get("reason") or None, "order": _json(order.get("order")),
        "has_response": bool(has_response), "active": bool(active),
        "due_ms": None if due is None else int(due),
        "due_in_s": None if due is None else _in_s(int(due), now),
        "status": None, "state": None, "state_error": None,
        "markers": {a.decode()[5:]: b.decode() for a, b in job_h.items()
                    if a.startswith(b"sent:")},
        "trace_id": _trace_id(order.get("tp")),
    }
    state, fp = whole_state(job_h), _text(job_h.get(b"g"))
    if state is None:
        return out    # stored, not started yet (or the start aborted before a state)
    out["version"] = int(job_h.get(b"v") or 0)
    out["fingerprint"] = fp
    graph = graphs.get(fp) if graphs is not None and fp else None
    raw_graph = await client.get(k.graph(fp)) if fp and graph is None else None
    if graph is None and raw_graph is None:
        out["state_error"] = f"the pinned recipe {fp!r} is not in Redis"
        return out
    try:
        if graph is None:
            graph = Graph.from_bytes(raw_graph)
            if graphs is not None and fp:
                graphs.put(graph)
        state = caught_up(graph, state, offset - int(job_h.get(b"o") or 0), now)
        view = state_to_json(graph, state)
    except (StateFormatError, ValueError) as e:
        out["state_error"] = f"the state document cannot be read: {e}"
        return out
    out["status"] = view["status"]
    out["state"] = _annotate(view, now)
    return out


def _trace_id(stored_trace: str | None) -> str | None:
    ctx = from_stored(stored_trace)
    return ctx.trace_id if ctx is not None else None


def _annotate(view: dict[str, Any], now: int) -> dict[str, Any]:
    """Seconds from now next to every absolute time, and the open actions picked out."""
    for a in view["actions"].values():
        for name in ("deadline_ms", "hold_deadline_ms", "timer_ms"):
            if a.get(name) is not None:
                a[name.replace("_ms", "_in_s")] = _in_s(a[name], now)
    held = view.get("held_ms")
    view["held_for_s"] = None if held is None else round((now - held) / 1000, 3)
    view["open_actions"] = sorted(n for n, a in view["actions"].items()
                                  if a["phase"] in OPEN_PHASES or a.get("hold") == "hold_open")
    return view


# ---- the scopes at a glance (``sfc-host top``)


async def scopes(client: Any) -> list[str]:
    return sorted(_text(s) or "" for s in await client.smembers(SCOPES))


async def scope_sample(client: Any, scope_names: list[str], group: str) -> dict[str, Any]:
    """One reading of every scope: job orders by top state, jobs in the active set, due
    deadlines, the work stream (length, pending on ``group``, entries ever added) and
    the dead stream, the heartbeat's age. Per-scope read errors (a stream without the
    group yet) leave that field None."""
    now = await server_ms(client)
    pipe = client.pipeline(transaction=False)
    for s in scope_names:
        pipe.get(ScopeKeys(s).offset)
    offsets = [int(v or 0) for v in await pipe.execute()]
    pipe = client.pipeline(transaction=False)
    n = 9
    for s, offset in zip(scope_names, offsets, strict=True):
        k = ScopeKeys(s)
        pipe.hvals(k.base + "state-index")
        pipe.get(k.base + "state-seq")
        pipe.scard(k.active)
        pipe.zcard(k.due)
        pipe.zcount(k.due, "-inf", now - offset)
        pipe.xlen(k.work)
        pipe.xpending(k.work, group)
        pipe.xlen(k.dead)
        pipe.get(k.heartbeat)
    raw = await pipe.execute(raise_on_error=False)
    # entries-added (Redis >= 7) counts every entry ever appended: a rate survives trimming
    pipe = client.pipeline(transaction=False)
    for s in scope_names:
        pipe.xinfo_stream(ScopeKeys(s).work)
    infos = await pipe.execute(raise_on_error=False)
    out = []
    for i, s in enumerate(scope_names):
        r = [None if isinstance(v, Exception) else v for v in raw[i * n:(i + 1) * n]]
        states: dict[str, int] = {}
        for v in r[0] or []:
            st = _text(v) or ""
            states[st] = states.get(st, 0) + 1
        tops: dict[str, int] = {}
        for st, c in states.items():
            top = st.split("_", 1)[0]
            tops[top] = tops.get(top, 0) + c
        info = infos[i] if isinstance(infos[i], dict) else {}
        added = info.get("entries-added", info.get(b"entries-added"))
        hb = r[8]
        out.append({
            "scope": s, "orders": sum(states.values()), "by_state": tops,
            "completed": states.get("Ended_Completed", 0),
            "seq": int(r[1] or 0), "active": r[2], "due": r[3], "due_now": r[4],
            "stream": r[5], "pending": (r[6] or {}).get("pending") if r[6] else None,
            "dead": r[7], "entries_added": None if added is None else int(added),
            "heartbeat_age_ms": None if hb is None else now - int(hb),
        })
    return {"server_ms": now, "scopes": out}


def rate(now: int | None, before: int | None, secs: float) -> float | None:
    """A counter's rate a second between two readings; None without both (a counter
    that went back, a restarted host's, counts as 0)."""
    if now is None or before is None or secs <= 0:
        return None
    return max(0, now - before) / secs


def add_scope_rates(scopes_now: list[dict[str, Any]], scopes_before: list[dict[str, Any]],
                    secs: float) -> None:
    """Each scope's ``rates`` (completions, order changes and stream entries a second)
    from two ``scope_sample`` readings ``secs`` apart."""
    before = {s["scope"]: s for s in scopes_before}
    for s in scopes_now:
        p = before.get(s["scope"], {})
        s["rates"] = {"completed": rate(s["completed"], p.get("completed"), secs),
                      "order_changes": rate(s["seq"], p.get("seq"), secs),
                      "entries": rate(s["entries_added"], p.get("entries_added"), secs)}


class Ambiguous(SfcHostError, LookupError):
    """A job id found in more than one scope: the scope must be named."""


async def find_scope(client: Any, job: str) -> str:
    """The scope that holds a job: every scope a host served is in the registry, and the
    job's key tells which holds it. ``NotFound`` or ``Ambiguous`` otherwise."""
    names = await scopes(client)
    found = [s for s in names if await client.exists(ScopeKeys(s).job(job))]
    if not found:
        raise NotFound(f"no job {job!r} in any scope ({len(names)} known)")
    if len(found) > 1:
        raise Ambiguous(f"job {job!r} is in scopes {', '.join(found)}: give --scope")
    return found[0]
