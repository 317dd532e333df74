"""W3C Trace Context (``traceparent``, ``tracestate``): read from what arrives, made for
what leaves, so one job's trace runs from the MES request through the host to every
equipment command and back.

``traceparent`` is ``{version}-{trace-id}-{parent-id}-{flags}``: two, 32, 16 and two
lower-case hex digits. A header that breaks a rule is refused with the rule it broke
(``InvalidTraceParent``): the caller drops it, counts and logs it, and goes on as if
none had come; a bad header never fails a request. Rules, as the W3C Recommendation
sets them:

- version ``ff`` is invalid; version ``00`` is exactly 55 characters; a later version
  may carry more after a ``-``, which is read past (its first four fields are read as
  ``00``'s);
- trace-id and parent-id are not all zeros;
- the flags are kept as they came (bit 0 is ``sampled``; bits this version does not
  know are passed on, not cleared).

``tracestate`` is a list of ``key=value`` members, at most 32, at most 512 characters
in all; one that breaks that is dropped whole, never cut.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
from dataclasses import dataclass

from sfc_host.errors import SfcHostError

SAMPLED = 0x01
MAX_STATE_MEMBERS = 32
MAX_STATE_CHARS = 512

_HEX = re.compile(r"[0-9a-f]+")
_ZERO_TRACE = "0" * 32
_ZERO_SPAN = "0" * 16
# a member: a simple key or tenant@system, then a value of printable characters
# without ',' and '=' (spaces only inside it)
_MEMBER = re.compile(
    r"(?:[a-z][a-z0-9_\-*/]{0,255}|[a-z0-9][a-z0-9_\-*/]{0,240}@[a-z][a-z0-9_\-*/]{0,13})"
    r"=[\x21-\x2b\x2d-\x3c\x3e-\x7e](?:[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,254}"
    r"[\x21-\x2b\x2d-\x3c\x3e-\x7e])?")


class InvalidTraceParent(SfcHostError, ValueError):
    """A ``traceparent`` that breaks a rule of the W3C format; the message says which."""


@dataclass(frozen=True, slots=True)
class TraceContext:
    """One position in a trace: the trace, the span that is the parent of what comes
    next, the flags and the vendors' ``tracestate`` (empty: none)."""

    trace_id: str
    span_id: str
    flags: int = SAMPLED
    state: str = ""

    @property
    def sampled(self) -> bool:
        return bool(self.flags & SAMPLED)

    @property
    def traceparent(self) -> str:
        return f"00-{self.trace_id}-{self.span_id}-{self.flags:02x}"

    def under(self, key: str) -> TraceContext:
        """The same trace with the span ``key`` names (``span_id_for``) as the parent of
        what follows: ours, named alike on every host."""
        return TraceContext(self.trace_id, span_id_for(self.trace_id, key), self.flags,
                            self.state)

    def attributes(self, key: str) -> dict[str, str]:
        """The CloudEvent attributes that carry the context on, as the span ``key``
        names (``under``): ``traceparent``, and ``tracestate`` when there is one."""
        out = {"traceparent": self.under(key).traceparent}
        if self.state:
            out["tracestate"] = self.state
        return out


def new_trace_id() -> str:
    while True:
        t = os.urandom(16).hex()
        if t != _ZERO_TRACE:
            return t


def new_span_id() -> str:
    while True:
        s = os.urandom(8).hex()
        if s != _ZERO_SPAN:
            return s


def new_trace(sampled: bool = True) -> TraceContext:
    """A trace of its own, for a job started without one."""
    return TraceContext(new_trace_id(), new_span_id(), SAMPLED if sampled else 0)


def _hex(field: str, n: int, what: str) -> str:
    if len(field) != n or not _HEX.fullmatch(field):
        raise InvalidTraceParent(f"{what} is not {n} lower-case hex digits")
    return field


def parse_traceparent(value: object, tracestate: object = None) -> TraceContext:
    """The context a ``traceparent`` (and its ``tracestate``) names; ``InvalidTraceParent``
    for one that breaks a rule. A malformed ``tracestate`` alone does not refuse the
    context: it is dropped (``valid_tracestate``)."""
    if isinstance(value, bytes):
        try:
            value = value.decode("ascii")
        except UnicodeDecodeError:
            raise InvalidTraceParent("not ASCII") from None
    if not isinstance(value, str):
        raise InvalidTraceParent(f"not text: {type(value).__name__}")
    value = value.strip(" \t")
    if len(value) < 55:
        raise InvalidTraceParent(f"{len(value)} characters, at least 55 expected")
    version = _hex(value[:2], 2, "the version")
    if version == "ff":
        raise InvalidTraceParent("version ff is invalid")
    if version == "00" and len(value) != 55:
        raise InvalidTraceParent(f"version 00 is 55 characters, not {len(value)}")
    if len(value) > 55 and value[55] != "-":
        raise InvalidTraceParent("a later version's fields follow a '-'")
    if value[2] != "-" or value[35] != "-" or value[52] != "-":
        raise InvalidTraceParent("fields are not separated by '-'")
    trace_id = _hex(value[3:35], 32, "the trace-id")
    span_id = _hex(value[36:52], 16, "the parent-id")
    flags = int(_hex(value[53:55], 2, "the flags"), 16)
    if trace_id == _ZERO_TRACE:
        raise InvalidTraceParent("the trace-id is all zeros")
    if span_id == _ZERO_SPAN:
        raise InvalidTraceParent("the parent-id is all zeros")
    return TraceContext(trace_id, span_id, flags, valid_tracestate(tracestate))


def valid_tracestate(value: object) -> str:
    """``value`` if it is a well-formed ``tracestate``, else '' (dropped whole)."""
    if isinstance(value, bytes):
        try:
            value = value.decode("ascii")
        except UnicodeDecodeError:
            return ""
    if not isinstance(value, str) or not value or len(value) > MAX_STATE_CHARS:
        return ""
    members = [m.strip(" \t") for m in value.split(",")]
    members = [m for m in members if m]
    if not members or len(members) > MAX_STATE_MEMBERS:
        return ""
    keys = set()
    for m in members:
        if not _MEMBER.fullmatch(m):
            return ""
        key = m.partition("=")[0]
        if key in keys:
            return ""
        keys.add(key)
    return ",".join(members)


def span_id_for(trace_id: str, key: str) -> str:
    """The span id of ``key`` (a command id, a job's run, a request id) in the trace:
    derived, not drawn, so every host names the same span the same way and the host
    that sees a span end can record it, whichever host began it."""
    s = hashlib.blake2b(f"{trace_id}\x00{key}".encode(), digest_size=8).hexdigest()
    return s if s != _ZERO_SPAN else "0" * 15 + "1"


def span_int_for(trace_id: str, key: str) -> int:
    """``span_id_for`` as the number a span is written with (the same hash's bytes)."""
    digest = hashlib.blake2b(f"{trace_id}\x00{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") or 1      # all zeros is no span id


def job_span_key(job: str, token: str) -> str:
    """What names a job's run in its trace (``span_id_for``): the job id and its order's
    token, drawn anew each time the id is stored."""
    return f"job:{job}:{token}"


def job_carried(text: str | bytes | None, job: str,
                token: str | bytes | None) -> dict[str, str] | None:
    """What a job's messages (status events, its job response) carry of its stored
    context: the job's run as the span; None for a job without one."""
    if not text:
        return None
    if isinstance(token, bytes):
        token = token.decode("ascii", "replace")
    return carried(text, job_span_key(job, token or "")) or None


def job_trace(text: str | bytes | None, job: str, token: str | bytes | None,
              work_master: str = "") -> str:
    """What a job keeps of its order's stored context when it starts: the same trace,
    with the job's run (``job_span_key``) as the parent of its commands (the span its
    status events name too), and after it the span the run hangs under (the request
    that stored the order) and the Work Master: what the job's span is recorded with,
    by whichever host ends the job. '' for an order without a context."""
    c = from_stored(text)
    if c is None:
        return ""
    if isinstance(token, bytes):
        token = token.decode("ascii", "replace")
    run = c.under(job_span_key(job, token or ""))
    return f"{run.traceparent}\t{run.state}\t{c.span_id}\t{_one_line(work_master)}"


def _one_line(text: str) -> str:
    return text.replace("\t", " ").replace("\n", " ")[:256]


def job_run(text: str | bytes | None) -> tuple[TraceContext, str, str] | None:
    """A job's stored context (``job_trace``): the run's context, the span it hangs
    under ('' none) and its Work Master; None for a job without one."""
    if not text:
        return None
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    c = _read_stored(text)
    if c is None:
        return None
    parts = text.split("\t")
    return c, (parts[2] if len(parts) > 2 else ""), (parts[3] if len(parts) > 3 else "")


def stored(context: TraceContext) -> str:
    """A context as the host keeps it with a job: the ``traceparent`` as it came, and
    its ``tracestate`` after a tab (a character no ``tracestate`` holds)."""
    tp = context.traceparent
    return f"{tp}\t{context.state}" if context.state else tp


def from_stored(text: str | bytes | None) -> TraceContext | None:
    """The context ``stored`` wrote; None for none (or a value that is not one)."""
    if not text:
        return None
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return _read_stored(text)


# every command of a job carries its stored context on: read once, not per command
@functools.lru_cache(maxsize=4096)
def _read_stored(text: str) -> TraceContext | None:
    tp, _, rest = text.partition("\t")
    state = rest.partition("\t")[0]    # a job's run keeps more after it (``job_trace``)
    try:
        return parse_traceparent(tp, state or None)
    except InvalidTraceParent:
        return None


def carried(text: str | bytes | None, key: str) -> dict[str, str]:
    """The CloudEvent attributes that carry a stored context on, as the span ``key``
    names (a command's id: the command's attempt): ``traceparent`` and, when the job
    has one, ``tracestate``. Empty for a job without a context."""
    c = from_stored(text)
    return c.attributes(key) if c is not None else {}


def context_of(attributes: dict[str, str]) -> TraceContext | None:
    """The context a CloudEvent's ``traceparent`` and ``tracestate`` attributes carry;
    None without one; ``InvalidTraceParent`` for a broken one."""
    tp = attributes.get("traceparent")
    if tp is None:
        return None
    return parse_traceparent(tp, attributes.get("tracestate"))
