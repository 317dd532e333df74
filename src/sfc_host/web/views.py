"""What the web view shows, read from Redis: plain dicts, no HTML. Nothing here writes.

Every page reads what it shows and little more: the jobs table reads the scope's state
index (one hash) and then the orders of the page it shows, in one pipeline; a job page
reads the job as ``sfc-host inspect`` does, with its pinned recipe kept in memory.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from dataclasses import dataclass
from typing import Any

from sfc_fast import Graph, RecipeError, compile_recipe
from sfc_host.charts.svg import job_classes
from sfc_host.execution.workmaster import resolve_schema
from sfc_host.metrics import Metrics
from sfc_host.names import check_job, check_scope
from sfc_host.store.keys import ScopeKeys
from sfc_host.store.orders import top_state
from sfc_host.store.states import GraphCache, work_master_ids
from sfc_host.store.views import add_scope_rates, rate, read_job, scope_sample, scopes

TOP_STATES = ("NotAllowedToStart", "AllowedToStart", "Running", "Interrupted", "Ended",
              "Aborted")
PER_PAGE = 50
MAX_PER_PAGE = 500
SAMPLE_S = 1.0           # scope readings shared by every viewer this long
GRAPHS_KEPT = 256
ORDER_FIELDS = ("state", "wm", "started", "ended", "reason")


@dataclass
class Sample:
    mono: float
    data: dict[str, Any]


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else (raw or "")


class WebData:
    """The web view's reads. ``metrics`` (the host's own, in ``sfc-host run``) adds the
    commands this host sent a second; ``sfc-host web`` has none."""

    def __init__(self, client: Any, group: str, outage_ms: int,
                 metrics: Metrics | None = None, trace_url: str = "") -> None:
        self.client = client
        self.group = group
        self.outage_ms = outage_ms
        self.metrics = metrics
        self.trace_url = trace_url     # a job's trace id links here (setting trace_url)
        self.graphs = GraphCache(GRAPHS_KEPT)
        self._last: Sample | None = None

    # ---- scopes

    async def scopes(self) -> dict[str, Any]:
        """Every scope: orders per top state, open deadlines, stream, heartbeat, the
        consumers (hosts) of the group, rates against the reading before."""
        now = time.monotonic()
        if self._last is not None and now - self._last.mono < SAMPLE_S:
            return self._last.data
        names = await scopes(self.client)
        data = await scope_sample(self.client, names, self.group)
        pipe = self.client.pipeline(transaction=False)
        for s in names:
            pipe.xinfo_consumers(ScopeKeys(s).work, self.group)
        consumers = await pipe.execute(raise_on_error=False)
        commands = self.metrics["commands_sent"] if self.metrics is not None else None
        data["commands_sent"] = commands
        prev = self._last
        secs = now - prev.mono if prev is not None else 0.0
        data["commands_rate"] = rate(commands, prev.data.get("commands_sent"), secs) \
            if prev is not None else None
        add_scope_rates(data["scopes"], prev.data["scopes"] if prev is not None else [], secs)
        for s, cons in zip(data["scopes"], consumers, strict=True):
            s["hosts"] = [] if isinstance(cons, Exception) else sorted(
                (_text(c.get("name")), int(c.get("idle") or 0)) for c in cons)
            hb = s["heartbeat_age_ms"]
            s["outage"] = hb is None or hb > self.outage_ms
        self._last = Sample(now, data)
        return data

    # ---- the jobs of a scope

    async def jobs(self, scope: str, *, state: str = "", search: str = "", page: int = 1,
                   per_page: int = PER_PAGE) -> dict[str, Any]:
        """One page of a scope's job orders (by id), filtered by top state and by a
        piece of the id; the counts per top state of the whole scope."""
        check_scope(scope)
        k = ScopeKeys(scope)
        per_page = max(1, min(per_page, MAX_PER_PAGE))
        index = await self.client.hgetall(k.index)
        counts = dict.fromkeys(TOP_STATES, 0)
        wanted: list[str] = []
        needle = search.casefold()
        for raw_job, raw_state in index.items():
            top = top_state(_text(raw_state))
            counts[top] = counts.get(top, 0) + 1
            if state and top != state:
                continue
            job = _text(raw_job)
            if needle and needle not in job.casefold():
                continue
            wanted.append(job)
        wanted.sort()
        pages = max(1, -(-len(wanted) // per_page))
        page = max(1, min(page, pages))
        shown = wanted[(page - 1) * per_page:page * per_page]
        pipe = self.client.pipeline(transaction=False)
        for job in shown:
            pipe.hmget(k.order(job), *ORDER_FIELDS)
        rows = []
        for job, values in zip(shown, await pipe.execute(), strict=True):
            row = dict(zip(ORDER_FIELDS, (_text(v) for v in values), strict=True))
            rows.append({"job": job, **row})
        return {"scope": scope, "state": state, "search": search, "page": page,
                "pages": pages, "per_page": per_page, "total": len(wanted),
                "counts": counts, "rows": rows}

    # ---- one job

    async def job(self, scope: str, job: str) -> dict[str, Any]:
        """The job as ``inspect`` reads it, with its recipe, Work Master, order times,
        job response, the chart's classes and a timeline; ``NotFound`` when unknown."""
        check_scope(scope)
        check_job(job)
        k = ScopeKeys(scope)
        view = await read_job(self.client, scope, job, self.graphs)
        pipe = self.client.pipeline(transaction=False)
        pipe.hmget(k.order(job), "wm", "started", "ended")
        pipe.get(k.response(job))
        (wm, started, ended), response = await pipe.execute()
        view["work_master"] = _text(wm)
        view["order_started"], view["order_ended"] = _text(started), _text(ended)
        view["response"] = _json(response)
        graph = self.graphs.get(view.get("fingerprint") or "")
        if graph is None and view["work_master"]:
            graph = await self._work_master_graph(scope, view["work_master"])
        view["graph"] = graph
        steps, actions = job_classes(graph, view["state"]) if graph is not None else ({}, {})
        view["step_classes"], view["action_classes"] = steps, actions
        view["qualifiers"] = _qualifiers(graph)
        view["timeline"] = timeline(view)
        view["trace_url"] = self.trace_url
        return view

    async def job_versions(self, scope: str, job: str) -> tuple[Any, ...]:
        """What moves whenever the job's page may change: the versions of its state and
        order (every write bumps one), whether a response exists, its next deadline."""
        k = ScopeKeys(scope)
        pipe = self.client.pipeline(transaction=False)
        pipe.hget(k.job(job), "v")
        pipe.hget(k.order(job), "v")
        pipe.exists(k.response(job))
        pipe.zscore(k.due, job)
        return tuple(await pipe.execute())

    async def _work_master_graph(self, scope: str, wm_id: str) -> Graph | None:
        """A job not started yet has no pinned recipe: its Work Master's, if it
        compiles."""
        raw = await self.client.get(ScopeKeys(scope).work_master(wm_id))
        checked = check_work_master(_json(raw)) if raw is not None else None
        return checked["graph"] if checked is not None else None

    # ---- Work Masters

    async def work_masters(self, scope: str) -> list[dict[str, Any]]:
        """The scope's Work Masters (its set of ids), each checked."""
        check_scope(scope)
        k = ScopeKeys(scope)
        ids = await work_master_ids(self.client, scope)
        if not ids:
            return []
        values = await self.client.mget([k.work_master(i) for i in ids])
        out = []
        for wm_id, raw in zip(ids, values, strict=True):
            if raw is None:
                continue
            checked = check_work_master(_json(raw))
            checked["id"] = wm_id
            out.append(checked)
        return out


def _json(raw: Any) -> Any:
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return None


def _qualifiers(graph: Graph | None) -> dict[str, str]:
    if graph is None:
        return {}
    out = {}
    for i in range(graph.n_actions):
        ai = graph.action_info(i)
        out[ai["name"]] = ai["qualifier"]
    return out


def check_work_master(doc: Any) -> dict[str, Any]:
    """A stored Work Master compiled as ``sfc-host recipe check`` does: ``ok`` with the
    recipe's summary and ``graph``, or the problems."""
    out: dict[str, Any] = {"doc": doc, "graph": None, "ok": False, "problems": [],
                           "summary": None}
    if not isinstance(doc, dict) or "data" not in doc:
        out["problems"] = [{"code": "SFC014", "path": "$",
                            "message": "not a Work Master (no data)"}]
        return out
    try:
        graph = compile_recipe(doc["data"], resolve_schema(str(doc.get("dataschema", ""))))
    except RecipeError as e:
        out["problems"] = [p.to_dict() for p in e.problems]
        return out
    out.update(ok=True, graph=graph, summary=graph.summary())
    return out


def timeline(view: dict[str, Any]) -> list[tuple[int | None, str, str]]:
    """What happened when, oldest first: (ms or None, what, detail) from the state
    document (start, every command sent and settled, a hold) and the order's times."""
    st = view.get("state")
    out: list[tuple[int | None, str, str]] = []
    if view.get("order_started"):
        out.append((_iso_ms(view["order_started"]), "order Running", ""))
    if st is not None:
        out.append((st["started_ms"], "job started", ""))
        for name, a in st["actions"].items():
            if a.get("since_ms") is not None:
                out.append((a["since_ms"], f"{name} sent",
                            f"attempt {a['attempt']}, round {a['round']}, "
                            f"{a.get('command_id') or '-'}"))
            if a.get("settled_ms") is not None:
                out.append((a["settled_ms"], f"{name} {a.get('outcome') or 'settled'}",
                            json.dumps(a["result"]) if a.get("result") else ""))
        if st.get("held_ms") is not None:
            out.append((st["held_ms"], "held", ""))
    if view.get("order_ended"):
        out.append((_iso_ms(view["order_ended"]), f"order {view.get('order_state') or ''}",
                    view.get("order_reason") or ""))
    out.sort(key=lambda e: (e[0] is None, e[0] or 0))
    return out


def _iso_ms(text: str) -> int | None:
    """An order time (``2026-01-01T12:00:00.000Z``) in ms since the epoch."""
    try:
        t = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return int(t.timestamp() * 1000)
