"""Operator commands: ``sfc-host inspect`` (one job, read from Redis) and ``sfc-host top``
(every scope, live), and the plumbing the job commands (``job_cli``) share.

Settings are the host's (``--config FILE``, ``SFC_*`` variables, then ``--mqtt`` /
``--redis``), so an operator points the tools at a deployment with the file its hosts
use. A user mistake (a bad argument or setting, an unknown job) is one line on stderr
and exit 2; a server out of reach is one line and exit 1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import sys
import textwrap
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlparse

from sfc_host.cli.common import (
    EXIT_OK,
    UsageError,
    common_args,
    guarded,
    one_line,
    positive,
    scope_of,
    table,
)
from sfc_host.config import HostConfig
from sfc_host.names import check_job, check_scope
from sfc_host.store.views import add_scope_rates, rate
from sfc_host.times import iso

# The MQTT client stack (mes.client) and the Redis client are imported by the commands
# that use them: every ``sfc-host`` command builds this module's parsers.

# ---- registration


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help="one job as stored in Redis (state, deadlines, holds)")
    p.add_argument("job", metavar="JOB")
    common_args(p, mqtt=False, redis=True)
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("top", help="a live view of scopes, jobs and rates")
    p.add_argument("--scope", action="append", metavar="SCOPE",
                   help="only these scopes (default: every known scope)")
    p.add_argument("--interval", type=positive(float), default=2.0, metavar="SECONDS",
                   help="time between frames (default 2)")
    p.add_argument("--once", action="store_true", help="print one frame and exit")
    p.add_argument("--frames", type=int, default=0, metavar="N",
                   help="print N frames and exit (rates from the second on)")
    p.add_argument("--metrics", action="append", metavar="URL",
                   help="a host's metrics endpoint, once per host: their counters add up "
                   "(default: the config's metrics_port)")
    p.add_argument("--width", type=positive(int), metavar="COLUMNS",
                   help="fit frames to this many columns (default: the terminal's width; "
                   "no limit into a pipe)")
    common_args(p, mqtt=False, redis=True, scope=False)
    p.set_defaults(func=cmd_top)


# ---- shared plumbing


# ---- inspect


def cmd_inspect(args: argparse.Namespace) -> int:
    from sfc_host.store.client import connect
    from sfc_host.store.views import read_job

    async def body(cfg: HostConfig) -> int:
        scope = scope_of(args, cfg)
        job = check_job(args.job)
        client = connect(cfg)
        try:
            view = await read_job(client, scope, job)
        finally:
            await client.aclose()
        print(json.dumps(view, indent=2) if args.json else inspect_text(view))
        return EXIT_OK
    return guarded(args, body)


def _in(s: float | None) -> str:
    if s is None:
        return "-"
    return f"in {s:.1f} s" if s >= 0 else f"{-s:.1f} s ago"


def _due(ms: int | None, v: dict[str, Any], *, held: bool = True) -> str:
    """Seconds to a deadline. While a job is held its work deadlines stand still (the
    release moves them by the hold's length): it shows the time left at release. A
    hold command's own deadline runs during the hold (``held=False``)."""
    if ms is None:
        return "-"
    held_ms = (v.get("state") or {}).get("held_ms") if held else None
    if held_ms is not None:
        return f"{(ms - held_ms) / 1000:.1f} s left at release"
    return _in((ms - v["server_ms"]) / 1000)


def _sent(marker: str | None, command_id: str | None, started_ms: int) -> str:
    """Whether the open command went out (its sent marker names it, in this run)."""
    if command_id is None:
        return "-"
    return "yes" if marker == f"{started_ms}:{command_id}" else "no"


def inspect_text(v: dict[str, Any]) -> str:
    st = v.get("state")
    due = f"{iso(v['due_ms'])} ({_in(v['due_in_s'])})" if v["due_ms"] is not None else "-"
    lines = [
        f"job {v['job']} in scope {v['scope']} (server time {iso(v['server_ms'])})",
        f"status         {v['status'] or 'not started'}"
        + (f" ({v['state_error']})" if v["state_error"] else ""),
        f"order state    {v['order_state'] or '-'} (version {v['order_version']})",
        f"reason         {v['order_reason'] or (st or {}).get('reason') or '-'}",
        f"next deadline  {due}",
        f"trace          {v.get('trace_id') or '-'}",
    ]
    if st is None:
        return "\n".join(lines)
    held = st["held_ms"]
    rounds = ", ".join(f"{k} {n}" for k, n in sorted(st["step_rounds"].items())) or "-"
    lines += [
        f"started        {iso(st['started_ms'])}",
        f"active steps   {', '.join(st['active_steps']) or '-'}",
        "held           " + (f"since {iso(held)} ({st['held_for_s']:.1f} s)"
                             if held is not None else "no"),
        f"step rounds    {rounds}",
        f"commands       {st['commands_issued']} issued",
    ]
    acts = st["actions"]
    open_rows = []
    for name in st["open_actions"]:
        a = acts[name]
        hold = a.get("hold")
        if hold:
            hold = " ".join(x for x in (hold, a.get("hold_command_id"),
                                        _due(a.get("hold_deadline_ms"), v, held=False))
                            if x and x != "-")
        open_rows.append([name, a["step"], a["phase"], a["attempt"], a["round"],
                          a["command_id"], iso(a["deadline_ms"]), _due(a["deadline_ms"], v),
                          _sent(v["markers"].get(name), a["command_id"], st["started_ms"]),
                          hold])
    if open_rows:
        lines.append("open actions:")
        lines += ["  " + ln for ln in table(
            ["ACTION", "STEP", "PHASE", "ATTEMPT", "ROUND", "COMMAND ID", "DEADLINE", "DUE",
             "SENT", "HOLD"], open_rows).splitlines()]
    else:
        lines.append("open actions:  none")
    done = [f"{n} {a['outcome']}" for n, a in sorted(acts.items())
            if n not in st["open_actions"] and a["outcome"]]
    if done:
        lines.append(f"settled        {', '.join(done)}")
    return "\n".join(lines)


# ---- top


def cmd_top(args: argparse.Namespace) -> int:
    try:
        return guarded(args, lambda cfg: _top(args, cfg))
    except KeyboardInterrupt:
        return EXIT_OK


COLUMNS = ("NotAllowedToStart", "AllowedToStart", "Running", "Interrupted", "Ended", "Aborted")
HEADERS = ["SCOPE", "STORED", "READY", "RUNNING", "HELD", "ENDED", "ABORTED", "ACTIVE", "DUE",
           "DUE NOW", "STREAM", "PENDING", "DEAD", "HB AGE", "DONE/S", "ORDER CHG/S",
           "ENTRIES/S"]
# The columns a narrow terminal keeps, first to last (SCOPE always): what may need an
# operator now (running, held, aborted, overdue, dead entries, a silent host), then the
# throughput, then the rest. They show in HEADERS' order.
KEEP_FIRST = ("RUNNING", "HELD", "ABORTED", "DUE NOW", "DEAD", "HB AGE", "DONE/S", "ENDED",
              "PENDING", "READY", "STORED", "ACTIVE", "DUE", "STREAM", "ORDER CHG/S",
              "ENTRIES/S")
SCOPE_MIN = 10   # a narrow terminal cuts longer scope names to a quarter of it, not below
RATE_COUNTERS = ("commands_sent", "answers_applied", "mes_requests", "entries", "dead_entries")


async def _top(args: argparse.Namespace, cfg: HostConfig) -> int:
    from sfc_host.store.client import connect
    from sfc_host.store.views import scope_sample, scopes

    if args.frames < 0:
        raise UsageError("--frames must not be negative")
    wanted = [check_scope(s) for s in args.scope or []]
    frames = 1 if args.once else args.frames
    urls = args.metrics or ([f"http://{cfg.metrics_host}:{cfg.metrics_port}/metrics"]
                            if cfg.metrics_port else [])
    live = sys.stdout.isatty() and not args.json
    client = connect(cfg)
    prev: dict[str, Any] | None = None
    n = 0
    quit_ = asyncio.Event()
    try:
        # keys only for the live view: a pager after a pipe reads the terminal itself
        with quit_keys(quit_, live and frames != 1) as keys:
            while True:
                names = wanted or await scopes(client)
                sample = await scope_sample(client, names, cfg.group)
                sample["metrics"] = await fetch_all_metrics(urls) if urls else None
                sample["mono"] = time.monotonic()
                if args.json:
                    print(json.dumps(_with_rates(sample, prev)), flush=True)
                else:
                    # the terminal's size each frame: a resized window gets fitted
                    size = shutil.get_terminal_size() if live else None
                    width = args.width or (size.columns if size else None)
                    text = render_frame(sample, prev, cfg.group, width=width,
                                        height=size.lines if size else None, keys=keys)
                    # a terminal gets the frame in place; a pipe frames one after another
                    sys.stdout.write(("\x1b[H\x1b[2J" if live else "") + text + "\n")
                    if not live and frames != 1:
                        sys.stdout.write("\n")
                    sys.stdout.flush()
                n += 1
                if frames and n >= frames:
                    return EXIT_OK
                prev = sample
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(quit_.wait(), args.interval)
                if quit_.is_set():
                    return EXIT_OK
    finally:
        await client.aclose()


@contextlib.contextmanager
def quit_keys(quit_: asyncio.Event, wanted: bool = True) -> Iterator[bool]:
    """While in the block, ``q`` typed on the terminal (and SIGTERM) sets ``quit_``:
    stdin in cbreak mode (keys come one by one, unechoed; Ctrl-C still interrupts),
    read by the running event loop when a key is there, so the frames never wait for
    one. The terminal's settings come back on the way out, however it is left. Yields
    whether keys are read: not when stdin is no terminal (a pipe, a service) or ``top``
    runs in the background of a shell (changing the terminal would stop it)."""
    try:
        fd = sys.stdin.fileno()
        usable = wanted and os.isatty(fd) and os.tcgetpgrp(fd) == os.getpgrp()
    except (OSError, ValueError, AttributeError):   # no stdin, or one without a fd
        usable = False
    if not usable:
        yield False
        return
    import signal
    import termios
    import tty

    loop = asyncio.get_running_loop()
    saved = termios.tcgetattr(fd)

    def readable() -> None:
        try:
            data = os.read(fd, 64)
        except OSError:
            data = b""
        if not data:   # the terminal went away: stop watching it
            loop.remove_reader(fd)
        elif b"q" in data.lower():
            quit_.set()

    tty.setcbreak(fd, termios.TCSANOW)
    try:
        loop.add_reader(fd, readable)
        # SIGTERM's default would leave the terminal in cbreak mode
        loop.add_signal_handler(signal.SIGTERM, quit_.set)
        yield True
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
        loop.remove_reader(fd)
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _with_rates(sample: dict[str, Any], prev: dict[str, Any] | None) -> dict[str, Any]:
    """Per scope ``rates`` (completions, order changes and stream entries a second),
    from the counters of the previous frame; None on the first frame."""
    secs = sample["mono"] - prev["mono"] if prev else 0.0
    add_scope_rates(sample["scopes"], (prev or {}).get("scopes", []), secs)
    m, pm = sample.get("metrics"), (prev or {}).get("metrics")
    if m is not None:
        before_c = pm["counters"] if pm else {}
        m["rates"] = {k: rate(m["counters"].get(k), before_c.get(k), secs)
                      for k in RATE_COUNTERS}
    return sample


def _f(rate: float | None) -> str:
    return "-" if rate is None else f"{rate:.1f}"


def fit_columns(rows: list[list[str]], width: int) -> tuple[list[str], list[list[str]],
                                                          list[str]]:
    """The headers and rows of the columns that fit ``width`` (in ``KEEP_FIRST``'s
    order; a column that does not fit leaves room for a narrower one after it), scope
    names cut with '…' to a quarter of the width; and the headers left out."""
    widths = [max(len(x) for x in col) for col in zip(HEADERS, *rows, strict=True)]
    scope_w = min(widths[0], max(SCOPE_MIN, width // 4))
    keep, used = [0], scope_w
    for name in KEEP_FIRST:
        i = HEADERS.index(name)
        if used + 2 + widths[i] <= width:
            keep.append(i)
            used += 2 + widths[i]
    keep.sort()
    cut = [[(r[0] if len(r[0]) <= scope_w else r[0][:scope_w - 1] + "…"),
            *(r[i] for i in keep[1:])] for r in rows]
    return ([HEADERS[i] for i in keep], cut,
            [h for i, h in enumerate(HEADERS) if i not in keep])


def _wrap(line: str, width: int | None) -> list[str]:
    if width is None or len(line) <= width:
        return [line]
    return textwrap.wrap(line, width, subsequent_indent="  ", break_on_hyphens=False)


def render_frame(sample: dict[str, Any], prev: dict[str, Any] | None, group: str, *,
                 width: int | None = None, height: int | None = None,
                 keys: bool = False) -> str:
    """One frame as text. With ``width`` no line is longer (columns that do not fit are
    left out and named; long lines wrap), with ``height`` the frame has fewer lines
    (the scopes that do not fit are counted)."""
    sample = _with_rates(sample, prev)
    rows = []
    for s in sample["scopes"]:
        hb = s["heartbeat_age_ms"]
        r = s["rates"]
        rows.append([str(x) for x in (
            s["scope"], *(s["by_state"].get(c, 0) for c in COLUMNS), s["active"], s["due"],
            s["due_now"], s["stream"], s["pending"], s["dead"],
            "-" if hb is None else f"{hb / 1000:.1f}s", _f(r["completed"]),
            _f(r["order_changes"]), _f(r["entries"]))])
    head = (f"sfc-host top  {iso(sample['server_ms'])}  {len(rows)} scope"
            f"{'' if len(rows) == 1 else 's'}  group {group}" + ("  (q quits)" if keys else ""))
    headers, hidden = HEADERS, []
    if rows and width is not None:
        headers, rows, hidden = fit_columns(rows, width)
    note = _wrap(f"(not shown at {width} columns: {', '.join(hidden)})", width) if hidden else []
    tail = []
    m = sample.get("metrics")
    if m is not None:
        tail.append("")
        if m["hosts"]:
            mr = m.get("rates", {})
            parts = [f"{k.replace('_', ' ')} {m['counters'].get(k, 0)} ({_f(mr.get(k))}/s)"
                     for k in RATE_COUNTERS]
            where = m["hosts"][0] if len(m["hosts"]) == 1 else f"{len(m['hosts'])} hosts"
            tail += _wrap(f"host metrics {where}: " + ", ".join(parts), width)
        for url, why in m["errors"].items():
            tail += _wrap(f"host metrics {url}: {why}", width)
    more = []
    if height is not None:
        # the head, a blank line, the table's header, the tail; one line for the cursor
        room = max(1, height - 4 - len(note) - len(tail))
        if len(rows) > room and note:   # rows first: the note gives its lines to them
            room, note = room + len(note), []
        if len(rows) > room:
            n = len(rows) - room + 1
            more = [f"… {n} more scope{'s' if n != 1 else ''} (choose with --scope)"]
            rows = rows[:room - 1]
    body = table(headers, rows).splitlines() if rows or more else ["no scopes known"]
    lines = [head, "", *body, *more, *note, *tail]
    # the last guard: a width below a column's own keeps no line longer than it
    return "\n".join(lines if width is None else [ln[:width] for ln in lines])


async def fetch_all_metrics(urls: list[str]) -> dict[str, Any]:
    """The counters of every endpoint added up, with ``hosts`` (the endpoints read) and
    ``errors`` (endpoint -> why not)."""
    got = await asyncio.gather(*(fetch_metrics(u) for u in urls))
    counters: dict[str, int] = {}
    out: dict[str, Any] = {"hosts": [], "errors": {}, "counters": counters}
    for url, m in zip(urls, got, strict=True):
        if isinstance(m, str):
            out["errors"][url] = m
            continue
        out["hosts"].append(url)
        for k, v in m.items():
            counters[k] = counters.get(k, 0) + v
    return out


async def fetch_metrics(url: str, timeout_s: float = 2.0) -> dict[str, int] | str:
    """The host's counters (``sfc_*_total``, summed over labels) by their short name, or
    why they could not be read (the view goes on without them)."""
    u = urlparse(url)
    if u.scheme != "http" or not u.hostname:
        return f"unusable URL {url!r} (http://host:port/metrics)"
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(u.hostname, u.port or 80), timeout_s)
        writer.write(f"GET {u.path or '/metrics'} HTTP/1.1\r\nHost: {u.hostname}\r\n"
                     "Connection: close\r\n\r\n".encode())
        raw = await asyncio.wait_for(reader.read(), timeout_s)
        writer.close()
    except (OSError, TimeoutError) as e:
        return f"unreachable ({one_line(str(e)) or type(e).__name__})"
    head, _, text = raw.decode("utf-8", "replace").partition("\r\n\r\n")
    if " 200 " not in head.split("\r\n", 1)[0] + " ":
        return f"answered {head.splitlines()[0] if head else 'nothing'}"
    out: dict[str, int] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith("sfc_"):
            continue
        name, _, value = line.rpartition(" ")
        name = name.split("{", 1)[0]
        if not name.endswith("_total"):
            continue
        try:
            out[name[4:-6]] = out.get(name[4:-6], 0) + int(float(value))
        except ValueError:
            continue
    return out
