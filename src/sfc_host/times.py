"""Times as text: RFC 3339 in UTC with milliseconds, as events carry them and as the
operator's tools show them."""

from __future__ import annotations

import datetime as dt
import time as _time

# the last whole second formatted and its text, replaced as one tuple: a thread (a
# script's) never reads one second's text with another's number
_second: tuple[int, str] = (-1, "")


def timestamp() -> str:
    """Now as an RFC 3339 UTC time with milliseconds, as events carry it."""
    global _second
    now = _time.time()
    sec = int(now)
    at, text = _second
    if at != sec:           # formatted once a second: every status event carries one
        text = _time.strftime("%Y-%m-%dT%H:%M:%S", _time.gmtime(sec))
        _second = (sec, text)
    return f"{text}.{int(now % 1 * 1000):03d}Z"


def iso(ms: int | None) -> str:
    """A time in milliseconds since the epoch as RFC 3339 UTC text; ``-`` for none."""
    if ms is None:
        return "-"
    t = dt.datetime.fromtimestamp(ms / 1000, dt.UTC)
    return t.isoformat(timespec="milliseconds").replace("+00:00", "Z")
