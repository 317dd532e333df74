"""The web view's HTML, rendered on the server. Every text that comes from Redis (a
scope, a job id, a Work Master, a step or action name, a reason, a result) goes through
``esc`` (HTML text and quoted attributes alike); the chart's SVG escapes its own names.
No inline script or style: the page's behaviour is ``static/web.js`` (the CSP forbids
anything else)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from html import escape
from typing import Any
from urllib.parse import urlencode

from sfc_host.charts.svg import to_svg
from sfc_host.isa95 import status_names
from sfc_host.times import iso
from sfc_host.web.views import TOP_STATES

CONTROLS = ("Pause", "Resume", "Abort", "Stop", "Clear")
# the top states as ``sfc-host top`` heads them
SHORT = {"NotAllowedToStart": "stored", "AllowedToStart": "ready", "Running": "running",
         "Interrupted": "held", "Ended": "ended", "Aborted": "aborted"}
REFRESH_MS = 2000        # scopes and jobs tables: fetched again this often


def esc(value: Any) -> str:
    """Text for HTML content and double-quoted attribute values."""
    return escape("" if value is None else str(value), quote=True)


def _rate(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def url(path: str, **query: Any) -> str:
    q = {k: v for k, v in query.items() if v not in (None, "")}
    return path + ("?" + urlencode(q) if q else "")


def job_url(scope: str, job: str) -> str:
    return url(f"/scopes/{scope}/job", id=job)


def page(title: str, body: str, *, crumbs: Sequence[tuple[str, str]] = ()) -> str:
    nav = " / ".join(['<a href="/">scopes</a>'] + [
        f'<a href="{esc(href)}">{esc(text)}</a>' if href else esc(text)
        for text, href in crumbs])
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{esc(title)} · sfc-host</title>"
            "<link rel=\"icon\" href=\"data:,\">"   # no favicon request
            "<link rel=\"stylesheet\" href=\"/static/web.css\">"
            "<script src=\"/static/web.js\" defer></script></head>"
            f"<body><header><span class=\"brand\">sfc-host</span> <nav>{nav}</nav></header>"
            f"<main>{body}</main></body></html>\n")


def table(headers: Iterable[str], rows: Iterable[str], *, cls: str = "",
          body_id: str = "") -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    tbody = f'<tbody id="{esc(body_id)}">' if body_id else "<tbody>"
    return (f'<table class="{esc(cls)}"><thead><tr>{head}</tr></thead>{tbody}'
            + "".join(rows) + "</tbody></table>")


def _tr(cells: Iterable[Any], cls: str = "", tail: str = "") -> str:
    """A row of cells (already escaped HTML), then ``tail`` (whole ``<td>`` elements)."""
    attr = f' class="{esc(cls)}"' if cls else ""
    return f"<tr{attr}>" + "".join(f"<td>{c}</td>" for c in cells) + tail + "</tr>"


# ---- scopes


def scopes_part(data: Mapping[str, Any]) -> str:
    """The scopes table (the page fetches it again every ``REFRESH_MS``)."""
    rows = []
    for s in data["scopes"]:
        scope = s["scope"]
        r = s["rates"]
        hb = s["heartbeat_age_ms"]
        hosts = ", ".join(f"{esc(name)} ({idle / 1000:.1f} s)" for name, idle in s["hosts"])
        health = '<span class="bad">OUTAGE</span>' if s["outage"] else '<span class="ok">ok</span>'
        rows.append(_tr([
            f'<a href="{esc(url(f"/scopes/{scope}/jobs"))}">{esc(scope)}</a> <a class="small" '
            f'href="{esc(url(f"/scopes/{scope}/workmasters"))}">Work Masters</a>',
            *(s["by_state"].get(c, 0) for c in TOP_STATES),
            _rate(r["completed"]), _rate(r["order_changes"]), _rate(r["entries"]),
            s["due"], s["due_now"], s["pending"], s["dead"],
            "-" if hb is None else f"{hb / 1000:.1f} s", health, hosts or "-"],
            "outage" if s["outage"] else ""))
    cmds = data.get("commands_rate")
    foot = (f'<p class="note">this host: {data["commands_sent"]} commands sent '
            f'({_rate(cmds)}/s)</p>' if data.get("commands_sent") is not None else "")
    return (f'<p class="note">server time {esc(iso(data["server_ms"]))}</p>'
            + table(["scope", *(SHORT[t] for t in TOP_STATES), "done/s", "order chg/s",
                     "entries/s", "deadlines", "overdue", "pending", "dead", "heartbeat",
                     "health", "hosts (idle)"], rows, cls="scopes")
            + ("" if rows else "<p>no scopes known</p>") + foot)


def scopes_page(data: Mapping[str, Any]) -> str:
    body = ("<h1>Scopes</h1>"
            f'<div id="scopes" data-refresh="/part/scopes" data-every="{REFRESH_MS}">'
            f"{scopes_part(data)}</div>")
    return page("scopes", body)


# ---- jobs of a scope


def jobs_part(d: Mapping[str, Any]) -> str:
    scope = d["scope"]
    rows = [_tr([f'<a href="{esc(job_url(scope, r["job"]))}">{esc(r["job"])}</a>',
                 esc(r["state"] or "-"), esc(r["wm"] or "-"), esc(r["started"] or "-"),
                 esc(r["ended"] or "-"), esc(r["reason"] or "")], "job")
            for r in d["rows"]]
    base = f"/scopes/{scope}/jobs"

    def to(n: int, rel: str, text: str) -> str:
        href = url(base, state=d["state"], q=d["search"], page=n)
        return f'<a rel="{rel}" href="{esc(href)}">{text}</a>'

    pager = [to(d["page"] - 1, "prev", "previous")] if d["page"] > 1 else []
    pager.append(f'page {d["page"]} of {d["pages"]} ({d["total"]} jobs)')
    if d["page"] < d["pages"]:
        pager.append(to(d["page"] + 1, "next", "next"))
    return (table(["job order", "state", "Work Master", "start", "end", "reason"], rows,
                  cls="jobs") + f'<p class="pager">{" · ".join(pager)}</p>')


def jobs_page(d: Mapping[str, Any]) -> str:
    scope = d["scope"]
    base = f"/scopes/{scope}/jobs"
    states = " ".join(
        f'<a class="{"chosen" if d["state"] == s else ""}" '
        f'href="{esc(url(base, state=s, q=d["search"]))}">{esc(s or "all")} '
        f'({sum(d["counts"].values()) if not s else d["counts"].get(s, 0)})</a>'
        for s in ("", *TOP_STATES))
    form = (f'<form method="get" action="{esc(base)}" class="search">'
            f'<input type="hidden" name="state" value="{esc(d["state"])}">'
            f'<input type="search" name="q" value="{esc(d["search"])}" '
            'placeholder="job order id contains…" aria-label="search by id">'
            "<button>search</button></form>")
    part = url(base, state=d["state"], q=d["search"], page=d["page"], part=1)
    body = (f"<h1>Jobs of {esc(scope)}</h1><p class=\"states\">{states}</p>{form}"
            f'<div id="jobs" data-refresh="{esc(part)}" data-every="{REFRESH_MS}">'
            f"{jobs_part(d)}</div>")
    return page(f"jobs of {scope}", body, crumbs=[(scope, base)])


# ---- one job


def inline_svg(svg: str) -> str:
    """``to_svg``'s document without its XML declaration, for an HTML page."""
    return svg.split("?>", 1)[1] if svg.startswith("<?xml") else svg


def _due(ms: int | None, held_ms: int | None) -> str:
    if ms is None:
        return "<td>-</td>"
    held = f' data-held="{held_ms}"' if held_ms is not None else ""
    return f'<td class="due" data-due="{ms}"{held}>{esc(iso(ms))}</td>'


def actions_part(v: Mapping[str, Any]) -> str:
    st = v.get("state")
    if st is None:
        return "<p>not started</p>"
    held = st.get("held_ms")
    rows = []
    for name, a in sorted(st["actions"].items(), key=lambda kv: kv[1].get("since_ms") or 0):
        result = json.dumps(a["result"], sort_keys=True) if a.get("result") else ""
        rows.append(_tr([esc(name), esc(a["step"]), esc(v["qualifiers"].get(name, "")),
                         esc(a["phase"]), esc(a.get("outcome") or ""), a["attempt"],
                         a["round"], esc(a.get("command_id") or "-")], "action")[:-5]
                    + _due(a.get("deadline_ms"), held) + f"<td>{esc(result)}</td></tr>")
    return table(["action", "step", "qualifier", "phase", "outcome", "attempt", "round",
                  "command id", "deadline", "result"], rows, cls="actions")


def summary_part(v: Mapping[str, Any]) -> str:
    st = v.get("state") or {}
    held = st.get("held_ms")
    items = [
        ("order state", v.get("order_state") or "-"),
        ("status", v.get("status") or "not started"),
        ("reason", v.get("order_reason") or st.get("reason") or "-"),
        ("Work Master", v.get("work_master") or "-"),
        ("start", v.get("order_started") or "-"),
        ("end", v.get("order_ended") or "-"),
        ("active steps", ", ".join(st.get("active_steps") or ()) or "-"),
        ("held", f"since {iso(held)}" if held is not None else "no"),
        ("next deadline", iso(v.get("due_ms"))),
    ]
    if v.get("state_error"):
        items.append(("problem", v["state_error"]))
    dl = "".join(f'<dt>{esc(k)}</dt><dd class="{esc(k.replace(" ", "-"))}">{esc(val)}</dd>'
                 for k, val in items)
    return f"<dl>{dl}{trace_item(v.get('trace_id'), v.get('trace_url') or '')}</dl>"


def trace_item(trace_id: str | None, trace_url: str) -> str:
    """The job's trace id; a link to the plant's trace viewer with ``trace_url``."""
    if not trace_id:
        return '<dt>trace</dt><dd class="trace">-</dd>'
    if not trace_url:
        return f'<dt>trace</dt><dd class="trace"><code>{esc(trace_id)}</code></dd>'
    href = trace_url.replace("{trace_id}", trace_id)
    return (f'<dt>trace</dt><dd class="trace"><a href="{esc(href)}" rel="noopener">'
            f'<code>{esc(trace_id)}</code></a></dd>')


def timeline_part(v: Mapping[str, Any]) -> str:
    rows = [_tr([esc(iso(ms)), esc(what), esc(detail)]) for ms, what, detail in v["timeline"]]
    return table(["time", "what", "detail"], rows, cls="timeline")


def _pre(doc: Any) -> str:
    if doc is None:
        return "<p>none (yet)</p>"
    return f"<pre>{esc(json.dumps(doc, indent=2, sort_keys=True))}</pre>"


def response_part(v: Mapping[str, Any]) -> str:
    return _pre(v.get("response"))


def live_parts(v: Mapping[str, Any]) -> dict[str, str]:
    """The parts of a job page that change while it runs, by element id."""
    return {"summary": summary_part(v), "actions": actions_part(v),
            "timeline": timeline_part(v), "response": response_part(v)}


def chart(v: Mapping[str, Any]) -> str:
    graph = v.get("graph")
    if graph is None:
        return "<p>no chart: the job's recipe is not in Redis</p>"
    view = dict(v["state"] or {}, job=v["job"], scope=v["scope"]) if v.get("state") else None
    return inline_svg(to_svg(graph, view, title=v.get("work_master") or None))


def controls(scope: str, job: str, csrf: str) -> str:
    buttons = "".join(f'<button name="method" value="{m}">{m}</button>' for m in CONTROLS)
    return (f'<form method="post" action="/scopes/{esc(scope)}/control" class="controls">'
            f'<input type="hidden" name="id" value="{esc(job)}">'
            f'<input type="hidden" name="csrf" value="{esc(csrf)}">{buttons}</form>')


def flash(message: str | None) -> str:
    return f'<p class="flash" role="status">{esc(message)}</p>' if message else ""


def job_page(v: Mapping[str, Any], *, csrf: str | None = None,
             message: str | None = None) -> str:
    scope, job = v["scope"], v["job"]
    live = url(f"/scopes/{scope}/live", id=job)
    held = "held" if (v.get("state") or {}).get("held_ms") is not None else ""
    parts = live_parts(v)
    body = (f"<h1>Job {esc(job)}</h1>{flash(message)}"
            + (controls(scope, job, csrf) if csrf is not None else "")
            + f'<div id="live" data-live="{esc(live)}" data-server-ms="{v["server_ms"]}">'
            f'<section class="top"><div id="summary">{parts["summary"]}</div>'
            f'<div id="chart" class="chart {held}">{chart(v)}</div></section>'
            f'<h2>Actions</h2><div id="actions">{parts["actions"]}</div>'
            f'<h2>Timeline</h2><div id="timeline">{parts["timeline"]}</div>'
            f'<h2>Job response</h2><div id="response">{parts["response"]}</div>'
            f"</div><h2>Job order</h2>{_pre(v.get('order'))}")
    return page(f"job {job}", body, crumbs=[(scope, f"/scopes/{scope}/jobs"), (job, "")])


def control_message(method: str, status: int, detail: str) -> str:
    """What the user sees after a button: the ISA-95 return status, as the MES gets it."""
    names = "|".join(status_names(status))
    return f"{method}: ReturnStatus {status} ({names})" + (f": {detail}" if detail else "")


# ---- Work Masters


def _check_line(wm: Mapping[str, Any]) -> str:
    if wm["ok"]:
        s = wm["summary"]
        return (f'<p class="ok">recipe check: ok, recipe v{esc(s["version"])}, '
                f'{s["steps"]} steps, {s["actions"]} actions, {s["branches"]} branches, '
                f'{s["transitions"]} transitions, initial {esc(s["initial"])}, '
                f'fingerprint {esc(s["fingerprint"])}</p>')
    items = "".join(f"<li>{esc(p['code'])} {esc(p['path'])}: {esc(p['message'])}</li>"
                    for p in wm["problems"])
    return f'<div class="bad">recipe check: refused<ul>{items}</ul></div>'


def work_masters_page(scope: str, wms: Sequence[Mapping[str, Any]]) -> str:
    parts = []
    for wm in wms:
        desc = ((wm["doc"] or {}).get("Description") or {})
        text = desc.get("Text", "") if isinstance(desc, dict) else ""
        svg = inline_svg(to_svg(wm["graph"], title=wm["id"])) if wm["graph"] is not None \
            else ""
        parts.append(f'<section class="wm"><h2>{esc(wm["id"])}</h2><p>{esc(text)}</p>'
                     f'{_check_line(wm)}<div class="chart">{svg}</div></section>')
    body = (f"<h1>Work Masters of {esc(scope)}</h1>"
            + ("".join(parts) or "<p>no Work Masters stored</p>"))
    return page(f"Work Masters of {scope}", body,
                crumbs=[(scope, f"/scopes/{scope}/jobs"), ("Work Masters", "")])


def login_page(message: str = "", next_url: str = "/") -> str:
    body = ("<h1>Access token</h1>" + flash(message)
            + '<form method="post" action="/login" class="login">'
            f'<input type="hidden" name="next" value="{esc(next_url)}">'
            '<input type="password" name="token" aria-label="access token" autofocus>'
            "<button>open</button></form>")
    return page("access token", body)


def error_page(status: int, message: str) -> str:
    return page(f"{status}", f"<h1>{status}</h1><p>{esc(message)}</p>")
