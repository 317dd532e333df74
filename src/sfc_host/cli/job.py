"""``sfc-host job …`` and ``sfc-host workmaster …``: an MES client over MQTT, speaking
the ISA-95 job control of the Python original (``MesClient``).

``workmaster put`` and ``delete`` are config messages over MQTT like the MES sends;
``workmaster list`` and ``show`` read Redis, since job control has no query for Work
Masters. Exit codes: 0 done; 1 refused by the host (its return status and message on
one line), or a broker or Redis out of reach, or no host answering; 2 a user mistake
(a bad argument, a file that cannot be read, a job or Work Master that does not
exist).
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sfc_host.cli.common import (
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_USAGE,
    UsageError,
    common_args,
    error,
    guarded,
    scope_of,
    table,
)
from sfc_host.config import HostConfig
from sfc_host.isa95 import state_name
from sfc_host.names import check_job
from sfc_host.tracing.context import InvalidTraceParent, parse_traceparent

if TYPE_CHECKING:
    from sfc_host.mes.client import MesClient, Reply

CONTROL = {"start": "Start", "pause": "Pause", "resume": "Resume", "stop": "Stop",
           "abort": "Abort", "clear": "Clear", "cancel": "Cancel", "revoke": "RevokeStart"}


def register(sub: argparse._SubParsersAction) -> None:
    job = sub.add_parser("job", help="submit and control job orders (MES over MQTT)")
    jsub = job.add_subparsers(dest="job_command", metavar="ACTION", parser_class=type(job))
    jsub.required = True

    for name, what in (("submit", "store a job order and start it (Store with --no-start)"),
                       ("update", "replace a stored job order that has not run (Update)")):
        p = jsub.add_parser(name, help=what)
        p.add_argument("work_master", nargs="?", metavar="WORK_MASTER",
                       help="Work Master id (listed first in WorkMasterID)")
        p.add_argument("--order", metavar="FILE", help="an ISA-95 job order JSON file "
                       "(ISA95JobOrderDataType, or {JobOrder: …}); WORK_MASTER, --id and -p "
                       "go on top of it")
        p.add_argument("--id", metavar="JOB", help="job order id" + (
            " (default: generated)" if name == "submit" else ""))
        p.add_argument("-p", "--param", action="append", default=[], metavar="NAME=VALUE",
                       help="a job order parameter (JobOrderParameters; replaces one of "
                       "the same ID); VALUE is JSON if it parses, else a string")
        p.add_argument("--priority", type=int, metavar="N", help="the order's Priority")
        if name == "submit":
            p.add_argument("--no-start", action="store_true", help="Store only (start later)")
        p.add_argument("--comment", default="", help="the request's Comment")
        common_args(p, mqtt=True, redis=False)
        p.set_defaults(func=cmd_submit if name == "submit" else cmd_update)

    p = jsub.add_parser("list", help="list job orders with their states and times")
    p.add_argument("--state", metavar="STATE",
                   help="only this state or top state (Running, Ended, Ended_Completed …)")
    p.add_argument("--index", action="store_true",
                   help="read the retained state index (id and state only; one message)")
    common_args(p, mqtt=True, redis=False)
    p.set_defaults(func=cmd_list)

    p = jsub.add_parser("show", help="one job order, its state and its job response")
    p.add_argument("job", metavar="JOB")
    common_args(p, mqtt=True, redis=False)
    p.set_defaults(func=cmd_show)

    for name, method in CONTROL.items():
        p = jsub.add_parser(name, help=f"{method} a job order")
        p.add_argument("job", metavar="JOB")
        p.add_argument("--comment", default="", help="the request's Comment (the reason)")
        common_args(p, mqtt=True, redis=False)
        p.set_defaults(func=cmd_control, method=method)

    wm = sub.add_parser("workmaster", help="put, list, show or delete Work Masters")
    wsub = wm.add_subparsers(dest="wm_command", metavar="ACTION", parser_class=type(wm))
    wsub.required = True
    p = wsub.add_parser("put", help="store a Work Master (config message over MQTT)")
    p.add_argument("file", metavar="FILE", help="a Work Master JSON file {ID?, data, "
                   "dataschema, …}")
    p.add_argument("--id", metavar="ID", help="its ID (default: the file's ID)")
    common_args(p, mqtt=True, redis=False)
    p.set_defaults(func=cmd_wm_put)
    p = wsub.add_parser("delete", help="delete a Work Master (config message over MQTT)")
    p.add_argument("id", metavar="ID")
    common_args(p, mqtt=True, redis=False)
    p.set_defaults(func=cmd_wm_delete)
    p = wsub.add_parser("list", help="the scope's Work Masters (read from Redis)")
    common_args(p, mqtt=False, redis=True)
    p.set_defaults(func=cmd_wm_list)
    p = wsub.add_parser("show", help="one Work Master as stored (read from Redis)")
    p.add_argument("id", metavar="ID")
    common_args(p, mqtt=False, redis=True)
    p.set_defaults(func=cmd_wm_show)


# ---- plumbing


def _mes(cfg: HostConfig, args: argparse.Namespace) -> MesClient:
    from sfc_host.mes.client import MesClient

    return MesClient(cfg, timeout_s=args.timeout)


async def _requests(cfg: HostConfig, args: argparse.Namespace, body: Any) -> int:
    """``body(mes)`` with a connected client; a broker out of reach or no host answering
    is a failure (exit 1), not the user's mistake."""
    from sfc_host.mes.client import MesError

    try:
        async with _mes(cfg, args) as mes:
            return int(await body(mes))
    except MesError as e:
        return error(str(e), EXIT_REFUSED)


async def _one_request(cfg: HostConfig, args: argparse.Namespace,
                       request: Callable[[MesClient], Awaitable[Reply]], done: str,
                       **fields: str) -> int:
    """One request: on NO_ERROR ``done`` (or with ``--json`` the status and ``fields``),
    else the refusal."""
    async def send(mes: MesClient) -> int:
        reply = await request(mes)
        if not reply.ok:
            return _refused(args, reply)
        print(json.dumps({"ReturnStatus": reply.status, **fields}) if args.json else done)
        return EXIT_OK
    return await _requests(cfg, args, send)


def _refused(args: argparse.Namespace, reply: Reply, *, unknown_is_mistake: bool = True) -> int:
    names = "|".join(reply.status_names)
    if args.json:
        print(json.dumps({"ReturnStatus": reply.status, "ReturnStatusNames": reply.status_names,
                          **reply.data}))
    msg = f": {reply.message}" if reply.message else ""
    print(f"sfc-host: {names}{msg}".replace("\n", " "), file=sys.stderr)
    # naming a job that does not exist is the user's mistake, as in ``inspect``
    if unknown_is_mistake and reply.status_names == ["UNKNOWN_JOB_ORDER_ID"]:
        return EXIT_USAGE
    return EXIT_REFUSED


def _param(text: str) -> tuple[str, Any]:
    name, eq, raw = text.partition("=")
    if not eq or not name:
        raise UsageError(f"--param {text!r}: expected NAME=VALUE")
    try:
        return name, json.loads(raw)
    except ValueError:
        return name, raw


def _read_json(path: str) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror or e}") from None
    except ValueError as e:
        raise UsageError(f"{path} is not JSON: {e}") from None


def build_order(args: argparse.Namespace, *, need_id: bool = False) -> dict[str, Any]:
    """The ISA-95 job order of ``job submit`` / ``update``: ``--order FILE``, then
    WORK_MASTER (listed first), ``--id``, ``--priority`` and ``-p`` on top; a
    parameter of the file with the same ID is replaced, the others are kept."""
    order: dict[str, Any] = {}
    if args.order:
        doc = _read_json(args.order)
        if isinstance(doc, dict) and isinstance(doc.get("JobOrder"), dict):
            doc = doc["JobOrder"]
        if not isinstance(doc, dict):
            raise UsageError(f"{args.order}: a job order is a JSON object")
        order = doc
    wms = order.get("WorkMasterID")
    if wms is not None and not isinstance(wms, list):
        raise UsageError("WorkMasterID is a list of {ID, …} (ISA95JobOrderDataType)")
    if args.work_master:
        rest = [w for w in wms or () if not (isinstance(w, dict)
                                             and w.get("ID") == args.work_master)]
        order["WorkMasterID"] = [{"ID": args.work_master}, *rest]
    first = next((w.get("ID") for w in order.get("WorkMasterID") or ()
                  if isinstance(w, dict) and isinstance(w.get("ID"), str)), None)
    if not first:
        raise UsageError("name a Work Master (WORK_MASTER or WorkMasterID in --order)")
    if args.id:
        order["JobOrderID"] = args.id
    if need_id and not order.get("JobOrderID"):
        raise UsageError("name the job order (--id, or JobOrderID in --order)")
    order.setdefault("JobOrderID", f"{first[:200]}-{uuid.uuid4().hex[:8]}")
    check_job(order["JobOrderID"])
    if args.priority is not None:
        order["Priority"] = args.priority
    params = dict(_param(p) for p in args.param)
    if params:
        have = order.get("JobOrderParameters") or []
        if not isinstance(have, list):
            raise UsageError("JobOrderParameters is a list of {ID, Value} (ISA-95)")
        kept = [p for p in have if not (isinstance(p, dict) and p.get("ID") in params)]
        order["JobOrderParameters"] = [*kept, *({"ID": k, "Value": v}
                                                for k, v in params.items())]
    return order


def _state(doc: Any) -> str:
    """The state name of an ISA95StateDataType list ('?' for one that is not)."""
    try:
        return state_name(doc or [])
    except ValueError:
        return "?"


# ---- job …


def cmd_submit(args: argparse.Namespace) -> int:
    async def body(cfg: HostConfig) -> int:
        scope = scope_of(args, cfg)
        order = build_order(args)
        job = order["JobOrderID"]
        method = "Store" if args.no_start else "StoreAndStart"
        return await _one_request(
            cfg, args, lambda mes: mes.submit(scope, order, start=not args.no_start,
                                              comment=args.comment),
            f"{job}: {method} accepted (scope {scope}, Work Master "
            f"{order['WorkMasterID'][0]['ID']})", JobOrderID=job)
    return guarded(args, body)


def cmd_update(args: argparse.Namespace) -> int:
    async def body(cfg: HostConfig) -> int:
        scope = scope_of(args, cfg)
        order = build_order(args, need_id=True)
        job = order["JobOrderID"]
        return await _one_request(
            cfg, args, lambda mes: mes.update(scope, order, comment=args.comment),
            f"{job}: Update accepted", JobOrderID=job)
    return guarded(args, body)


def _leaf_states(state: str) -> list[str]:
    """The states ``job list --state`` asks for: one, or a top state's sub-states."""
    from sfc_host.mes.client import LISTED_STATES

    if state in LISTED_STATES:
        return [state]
    subs = [s for s in LISTED_STATES if s.split("_", 1)[0] == state]
    if not subs:
        raise UsageError(f"unknown job order state {state!r} (one of "
                         f"{', '.join(LISTED_STATES)}, or a top state such as Ended)")
    return subs


def _row(r: dict[str, Any]) -> list[Any]:
    desc = r.get("Description") if isinstance(r.get("Description"), dict) else {}
    return [r.get("JobOrderID"), _state(r.get("JobState")), r.get("StartTime"),
            r.get("EndTime"), desc.get("Text")]


def cmd_list(args: argparse.Namespace) -> int:
    async def body(cfg: HostConfig) -> int:
        import asyncio

        scope = scope_of(args, cfg)
        wanted = _leaf_states(args.state) if args.state else None

        async def send(mes: MesClient) -> int:
            if args.index:
                return _print_index(args, scope, await mes.state_index(scope), wanted)
            if wanted is None:
                refused, rows = await mes.all_orders(scope)
            else:
                replies = await asyncio.gather(*(mes.by_state(scope, s) for s in wanted))
                refused = next((r for r in replies if not r.ok), None)
                rows = sorted((x for r in replies for x in r.data.get("JobResponses") or ()
                               if isinstance(x, dict)), key=lambda x: str(x.get("JobOrderID")))
            if refused is not None:
                return _refused(args, refused)
            if args.json:
                print(json.dumps(rows, indent=2))
            elif not rows:
                print(f"no job orders{' in ' + args.state if args.state else ''} in scope "
                      f"{scope}")
            else:
                print(table(["JOB", "STATE", "STARTED", "ENDED", "REASON"],
                            [_row(r) for r in rows]))
            return EXIT_OK
        return await _requests(cfg, args, send)
    return guarded(args, body)


def _print_index(args: argparse.Namespace, scope: str, index: dict[str, Any] | None,
                 wanted: list[str] | None) -> int:
    jobs = index.get("jobs") if index else None
    rows = [(j.get("job_order_id"), _state(j.get("state")), j.get("has_result"))
            for j in jobs or () if isinstance(j, dict)]
    if wanted is not None:
        rows = [r for r in rows if r[1] in wanted]
    if args.json:
        print(json.dumps({"seq": (index or {}).get("seq"),
                          "published_at": (index or {}).get("published_at"),
                          "jobs": [{"job_order_id": j, "state": s, "has_result": h}
                                   for j, s, h in rows]}, indent=2))
    elif not rows:
        print(f"no job orders in the state index of scope {scope}")
    else:
        print(table(["JOB", "STATE", "RESULT"], [(j, s, "yes" if h else "-")
                                                 for j, s, h in rows]))
        print(f"(state index seq {(index or {}).get('seq')}, published "
              f"{(index or {}).get('published_at')})")
    return EXIT_OK


def cmd_show(args: argparse.Namespace) -> int:
    async def body(cfg: HostConfig) -> int:
        scope = scope_of(args, cfg)
        job = check_job(args.job)

        async def send(mes: MesClient) -> int:
            retained = await mes.retained(f"{scope}/order/{job}")
            reply = await mes.by_id(scope, job)
            response = reply.data.get("JobResponse") if reply.ok else None
            if retained is None and response is None:
                if reply.ok or reply.status_names == ["UNKNOWN_JOB_ORDER_ID"]:
                    return error(f"no job order {job!r} in scope {scope!r}", EXIT_USAGE)
                return _refused(args, reply)
            doc = {"JobOrder": (retained or {}).get("JobOrder"),
                   "State": (retained or {}).get("State"), "JobResponse": response,
                   "TraceID": _trace_id(reply)}
            text = _show_text(scope, job, doc, cfg.trace_url)
            print(json.dumps(doc, indent=2) if args.json else text)
            return EXIT_OK
        return await _requests(cfg, args, send)
    return guarded(args, body)


def _trace_id(reply: Reply) -> str | None:
    """The job's trace id, as the reply with its job response carries it."""
    tp = reply.event.extensions.get("traceparent") if reply.event is not None else None
    try:
        return parse_traceparent(tp).trace_id if tp else None
    except InvalidTraceParent:
        return None


def _show_text(scope: str, job: str, d: dict[str, Any], trace_url: str = "") -> str:
    order = d.get("JobOrder") if isinstance(d.get("JobOrder"), dict) else {}
    resp = d.get("JobResponse") if isinstance(d.get("JobResponse"), dict) else None
    state = _state(d.get("State")) if d.get("State") else "?"
    if resp is not None and state.split("_", 1)[0] not in ("Ended", "Aborted", "EndState"):
        # the retained order follows a change within a moment; an ended job's response
        # is the newer word then
        state = _state(resp.get("JobState"))
    wms = ", ".join(str(w.get("ID")) for w in order.get("WorkMasterID") or ()
                    if isinstance(w, dict))
    lines: list[tuple[str, Any]] = [("job", job), ("scope", scope), ("state", state),
                                    ("work master", wms or None)]
    for p in order.get("JobOrderParameters") or ():
        if isinstance(p, dict):
            lines.append(("parameter", f"{p.get('ID')} = {json.dumps(p.get('Value'))}"))
    rest = {k: v for k, v in order.items()
            if k not in ("JobOrderID", "WorkMasterID", "JobOrderParameters")}
    if rest:
        lines.append(("order", json.dumps(rest)))
    if resp is None:
        lines.append(("response", "none yet"))
    else:
        desc = resp.get("Description") if isinstance(resp.get("Description"), dict) else {}
        lines += [("started", resp.get("StartTime")), ("ended", resp.get("EndTime")),
                  ("response", _state(resp.get("JobState"))), ("reason", desc.get("Text"))]
        for item in resp.get("JobResponseData") or []:
            if isinstance(item, dict):
                lines.append(("result", f"{item.get('ID')} = {json.dumps(item.get('Value'))}"))
    trace = d.get("TraceID")
    if trace:
        lines.append(("trace", trace_url.replace("{trace_id}", trace) if trace_url else trace))
    w = max(len(k) for k, _ in lines)
    return "\n".join(f"{k.ljust(w)}  {'-' if v is None else v}" for k, v in lines)


def cmd_control(args: argparse.Namespace) -> int:
    async def body(cfg: HostConfig) -> int:
        scope = scope_of(args, cfg)
        job = check_job(args.job)
        return await _one_request(
            cfg, args, lambda mes: mes.control(scope, args.method, job, args.comment),
            f"{job}: {args.method} accepted", JobOrderID=job)
    return guarded(args, body)


# ---- workmaster …


def cmd_wm_put(args: argparse.Namespace) -> int:
    async def body(cfg: HostConfig) -> int:
        scope = scope_of(args, cfg)
        wm = _read_json(args.file)
        if not isinstance(wm, dict) or "data" not in wm:
            raise UsageError(f"{args.file}: a Work Master is a JSON object with data and "
                             "dataschema")
        if args.id:
            wm["ID"] = args.id
        if not isinstance(wm.get("ID"), str) or not wm["ID"]:
            raise UsageError(f"{args.file} has no ID: give one with --id")
        return await _one_request(
            cfg, args, lambda mes: mes.put_work_master(scope, wm),
            f"Work Master {wm['ID']} stored in scope {scope}", ID=wm["ID"])
    return guarded(args, body)


def cmd_wm_delete(args: argparse.Namespace) -> int:
    async def body(cfg: HostConfig) -> int:
        scope = scope_of(args, cfg)

        return await _one_request(
            cfg, args, lambda mes: mes.delete_work_master(scope, args.id),
            f"Work Master {args.id} deleted from scope {scope}", ID=args.id)
    return guarded(args, body)


async def _work_masters(cfg: HostConfig, scope: str, wm_id: str | None) -> list[Any]:
    """``[raw]`` of Work Master ``wm_id``; without one, ``(id, raw)`` of each of the
    scope's."""
    from sfc_host.store.client import connect
    from sfc_host.store.keys import ScopeKeys
    from sfc_host.store.states import work_master_ids

    client = connect(cfg)
    try:
        k = ScopeKeys(scope)
        if wm_id is not None:
            return [await client.get(k.work_master(wm_id))]
        ids = await work_master_ids(client, scope)
        values = await client.mget([k.work_master(i) for i in ids]) if ids else []
        return list(zip(ids, values, strict=True))
    finally:
        await client.aclose()


def _describe(raw: bytes | None) -> tuple[Any, str, str]:
    try:
        wm = json.loads(raw or b"null")
    except ValueError:
        return None, "?", "not JSON"
    if not isinstance(wm, dict):
        return None, "?", "not an object"
    d = wm.get("Description")
    text = d.get("Text") if isinstance(d, dict) else d if isinstance(d, str) else ""
    schema = str(wm.get("dataschema") or "").rstrip("/").rsplit("/", 1)[-1]
    return wm, schema, str(text or "")


def cmd_wm_list(args: argparse.Namespace) -> int:
    async def body(cfg: HostConfig) -> int:
        scope = scope_of(args, cfg)
        rows = []
        for wm_id, raw in await _work_masters(cfg, scope, None):
            if raw is None:
                continue            # deleted between the two reads
            _, schema, text = _describe(raw)
            rows.append((wm_id, schema, text))
        if args.json:
            print(json.dumps([{"ID": i, "dataschema": s, "Description": t}
                              for i, s, t in rows], indent=2))
        elif not rows:
            print(f"no Work Masters in scope {scope}")
        else:
            print(table(["ID", "FORMAT", "DESCRIPTION"], rows))
        return EXIT_OK
    return guarded(args, body)


def cmd_wm_show(args: argparse.Namespace) -> int:
    async def body(cfg: HostConfig) -> int:
        scope = scope_of(args, cfg)
        (raw,) = await _work_masters(cfg, scope, args.id)
        if raw is None:
            return error(f"no Work Master {args.id!r} in scope {scope!r}", EXIT_USAGE)
        wm, _, _ = _describe(raw)
        print(json.dumps(wm, indent=2))
        return EXIT_OK
    return guarded(args, body)
