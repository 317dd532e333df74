"""``sfc-host top`` on a terminal: frames fitted to its width (and height), ``q`` quits
and the terminal's settings come back. The frames are built from samples as
``scope_sample`` gives them; the live runs read a real redis-server through a pty."""

from __future__ import annotations

import fcntl
import os
import select
import struct
import subprocess
import sys
import termios
import time
from typing import Any

import pytest

from sfc_host.cli.ops import HEADERS, render_frame

LONG = "plant-north.assembly-line-12.station-7"


def scope(name: str, k: int) -> dict[str, Any]:
    return {"scope": name, "by_state": {"NotAllowedToStart": 3 * k, "AllowedToStart": k,
                                        "Running": 120 * k, "Interrupted": 2,
                                        "Ended": 40312 * k, "Aborted": 17},
            "active": 121 * k, "due": 118, "due_now": 3, "stream": 10000, "pending": 23,
            "dead": 1, "heartbeat_age_ms": 900, "completed": 40000 * k, "seq": 123456 * k,
            "entries_added": 999999 * k}


def sample(mono: float, k: int, n: int = 3) -> dict[str, Any]:
    names = ["line1.cell1", LONG, "s", *(f"cell{i}" for i in range(n - 3))][:n]
    return {"server_ms": 1_790_000_000_000, "mono": mono,
            "scopes": [scope(x, k) for x in names],
            "metrics": {"hosts": ["http://127.0.0.1:9464/metrics"],
                        "errors": {"http://plant-host-2.example:9464/metrics":
                                   "unreachable (Connect call failed ('10.0.0.12', 9464))"},
                        "counters": {"commands_sent": 123456 * k, "answers_applied": 123000 * k,
                                     "mes_requests": 5000 * k, "entries": 999999 * k,
                                     "dead_entries": 3}}}


def columns(frame: str) -> list[str]:
    """The table's headers (two-word ones joined back)."""
    head = next(ln for ln in frame.splitlines() if ln.startswith("SCOPE"))
    return [h.strip() for h in head.split("  ") if h.strip()]


@pytest.mark.parametrize("width", [80, 120])
def test_a_frame_fits_the_width(width: int) -> None:
    frame = render_frame(sample(2, 2), sample(0, 1), "sfc-host", width=width, keys=True)
    lines = frame.splitlines()
    assert max(len(ln) for ln in lines) <= width
    assert lines[0].startswith("sfc-host top  20") and lines[0].endswith("(q quits)")
    shown = columns(frame)
    # what needs an operator is there at 80 columns; the rest is named, not dropped silently
    assert shown[0] == "SCOPE" and {"RUNNING", "HELD", "ABORTED", "DUE NOW", "DEAD"} <= set(shown)
    assert shown == [h for h in HEADERS if h in shown]          # in their usual order
    note = " ".join(ln for ln in lines if ln.startswith("(not shown") or ln.startswith("  "))
    assert all(h in note for h in HEADERS if h not in shown)
    # a long scope name is cut, the short ones are whole
    rows = {ln.split()[0]: ln.split() for ln in lines[3:6]}
    assert "line1.cell1" in rows and "s" in rows
    assert any(n.endswith("…") and LONG.startswith(n[:-1]) for n in rows)
    # the metrics lines wrap instead of running off the edge
    assert any(ln.startswith("host metrics http://127.0.0.1:9464/metrics: commands sent")
               for ln in lines)
    assert "dead entries 3" in frame.replace("\n  ", " ")


def test_a_wider_frame_shows_more_columns() -> None:
    at = {w: columns(render_frame(sample(2, 2), sample(0, 1), "g", width=w))
          for w in (80, 120, 250)}
    assert len(at[80]) < len(at[120]) < len(at[250]) == len(HEADERS)
    assert set(at[80]) < set(at[120])
    # unbounded (a pipe): every column, the scope name whole
    frame = render_frame(sample(2, 2), sample(0, 1), "g")
    assert columns(frame) == HEADERS and LONG in frame and "(not shown" not in frame


def test_a_frame_fits_the_height() -> None:
    frame = render_frame(sample(0, 1, n=40), None, "g", width=80, height=24)
    lines = frame.splitlines()
    assert len(lines) <= 23 and max(len(ln) for ln in lines) <= 80
    more = [ln for ln in lines if ln.startswith("… ")]
    shown = sum(1 for ln in lines if ln.startswith(("line1", "plant", "s ", "cell")))
    assert more == [f"… {40 - shown} more scopes (choose with --scope)"]
    # a very narrow terminal still gets no line longer than it
    frame = render_frame(sample(0, 1), None, "g", width=20, height=10)
    assert max(len(ln) for ln in frame.splitlines()) <= 20


# ---- a live run on a pty


def _set_size(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _take_terminal() -> None:
    # in the child: the pty (its stdin) becomes the controlling terminal of a session of
    # its own, with top in the foreground, as in an operator's shell
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def _read_until(fd: int, pred: Any, timeout: float) -> bytes:
    seen = b""
    end = time.monotonic() + timeout
    while not pred(seen) and time.monotonic() < end:
        if select.select([fd], [], [], 0.1)[0]:
            try:
                seen += os.read(fd, 65536)
            except OSError:   # the child is gone
                break
    return seen


@pytest.mark.servers
@pytest.mark.parametrize("width", [80, 120])
def test_top_fits_the_terminal_and_quits_on_q(redis_url: str, width: int) -> None:
    leader, follower = os.openpty()
    _set_size(follower, 24, width)
    before = termios.tcgetattr(follower)
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    # a long interval: q must end it at once, not at the next frame
    p = subprocess.Popen([sys.executable, "-m", "sfc_host", "top", "--redis", redis_url,
                          "--scope", LONG, "--scope", "line1.cell1", "--interval", "30"],
                         stdin=follower, stdout=follower, stderr=subprocess.PIPE,
                         start_new_session=True, preexec_fn=_take_terminal, env=env)
    try:
        seen = _read_until(leader, lambda b: b"(q quits)" in b and b"SCOPE" in b, 20)
        assert b"(q quits)" in seen, seen
        # cbreak while it runs: keys come unechoed, one by one
        now = termios.tcgetattr(follower)
        assert not now[3] & termios.ICANON and not now[3] & termios.ECHO
        t0 = time.monotonic()
        os.write(leader, b"q")
        assert p.wait(10) == 0
        assert time.monotonic() - t0 < 5
        assert p.stderr is not None and p.stderr.read() == b""
        after = termios.tcgetattr(follower)
        assert after[3] == before[3]    # ICANON and ECHO back
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        os.close(follower)
    os.close(leader)
    frame = seen.decode().split("\x1b[H\x1b[2J")[-1]
    lines = frame.replace("\r\n", "\n").strip("\n").splitlines()
    assert lines[0].startswith("sfc-host top  20") and max(map(len, lines)) <= width
    assert {"SCOPE", "RUNNING", "HELD", "DUE NOW"} <= set(columns(frame.replace("\r", "")))


@pytest.mark.servers
def test_top_into_a_pipe_reads_no_keys(redis_url: str) -> None:
    # stdin no terminal, stdout a pipe: frames one after another, every column
    p = subprocess.run([sys.executable, "-m", "sfc_host", "top", "--redis", redis_url,
                        "--scope", LONG, "--frames", "2", "--interval", "0.1"],
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
    assert p.returncode == 0 and p.stderr == ""
    frames = p.stdout.split("sfc-host top  ")[1:]
    assert len(frames) == 2 and all(columns(f) == HEADERS for f in frames)
    assert "(q quits)" not in p.stdout and LONG in p.stdout
    # stdin a terminal, stdout a pipe (a pager reads that terminal itself): left alone
    leader, follower = os.openpty()
    before = termios.tcgetattr(follower)
    try:
        q = subprocess.Popen([sys.executable, "-m", "sfc_host", "top", "--redis", redis_url,
                              "--scope", LONG, "--frames", "3", "--interval", "0.3"],
                             stdin=follower, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             start_new_session=True, preexec_fn=_take_terminal, text=True)
        assert q.stdout is not None
        first = q.stdout.readline()    # the first frame is out: top is in its loop
        assert termios.tcgetattr(follower)[3] == before[3]    # no cbreak
        out, err = q.communicate(timeout=30)
        out = first + out
    finally:
        os.close(follower)
        os.close(leader)
    assert q.returncode == 0 and err == "" and out.count("sfc-host top  ") == 3
    assert "(q quits)" not in out
    p = subprocess.run([sys.executable, "-m", "sfc_host", "top", "--redis", redis_url,
                        "--scope", LONG, "--once", "--width", "60"],
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
    assert p.returncode == 0 and max(map(len, p.stdout.splitlines())) <= 60
