"""How ``sfc-host run`` writes its log: plain text lines (the default) or JSON lines.

Log calls about one job or command pass its fields with ``extra=``: ``job``, ``scope``,
``action``, ``command_id``. The JSON format makes them fields of their own; the text
format keeps the message as it was (it already names scope and job). Both formats take
the password out of any ``scheme://user:password@host`` in a line, a last guard for a
URL that reached a message or a traceback.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from typing import IO, Any

FIELDS: tuple[str, ...] = ("job", "scope", "action", "command_id")
FORMATS: tuple[str, ...] = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# the userinfo of a URL: "redis://:secret@h" and "mqtt://u:secret@h" lose "secret"
_USERINFO = re.compile(r"([a-zA-Z][a-zA-Z0-9+.-]*://[^/@\s:]*):[^/@\s]*@")


def redact(text: str) -> str:
    return _USERINFO.sub(r"\1:***@", text) if "@" in text else text


def iso_ms(created: float) -> str:
    """``2026-12-03T09:15:04.120Z``: ISO 8601 UTC with milliseconds."""
    ms = int(created * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}Z"


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


class JsonFormatter(logging.Formatter):
    """One JSON object a line: ``time``, ``level``, ``logger``, ``message``, the fields of
    ``FIELDS`` the record carries, and ``exception`` (the traceback) when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {"time": iso_ms(record.created), "level": record.levelname,
                               "logger": record.name, "message": redact(record.getMessage())}
        for name in FIELDS:
            v = record.__dict__.get(name)
            if v is not None and v != "":
                doc[name] = v if isinstance(v, (str, int, float, bool)) else str(v)
        if record.exc_info:
            doc["exception"] = redact(self.formatException(record.exc_info))
        if record.stack_info:
            doc["stack"] = redact(self.formatStack(record.stack_info))
        return json.dumps(doc, ensure_ascii=False, separators=(",", ":"))


def formatter(fmt: str) -> logging.Formatter:
    if fmt == "json":
        return JsonFormatter()
    if fmt == "text":
        return TextFormatter()
    raise ValueError(f"unknown log format {fmt!r} (one of {', '.join(FORMATS)})")


def setup(level: int, fmt: str = "text", stream: IO[str] | None = None) -> logging.Handler:
    """The root logger writes ``fmt`` lines at ``level`` to ``stream`` (stderr)."""
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(formatter(fmt))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level)
    return handler
