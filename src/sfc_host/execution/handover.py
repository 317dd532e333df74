"""A dead host's answers, had from their stations again: every open push attempt of the
scopes' running jobs is sent again with its command id.

Answers reach the hosts through a shared subscription, so any answer in flight may
have gone to the host that died; a broker such as mosquitto drops a dead member's
unacknowledged messages instead of handing them on. Which ones is known to no one, so
the host that takes over a death sends every open attempt again, once: the equipment
contract answers a repeated command id with the answer it gave (work done) or with
the answer to come (work in progress), never by doing the work twice, and the
compare-and-set absorbs an answer that was applied already. The markers of the sent
commands are written as on any send, so a dispatch entry the dead host left pending
finds the command out when it is claimed. The reasons and the alternatives are in
docs/host.md, "A host dies".
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from sfc_fast import Command, Graph, open_command, sent_markers
from sfc_host.execution.dispatch import Dispatcher
from sfc_host.execution.settle import Fresh
from sfc_host.metrics import Metrics
from sfc_host.store.states import JobRow, Store

log = logging.getLogger("sfc_host.execution.handover")

CHUNK = 256


async def resend_open(store: Store, dispatcher: Dispatcher, metrics: Metrics,
                      scopes: list[str], keep: Callable[[Command], bool] | None = None
                      ) -> int:
    """Send every open push attempt of the running jobs of ``scopes`` again (those
    ``keep`` says yes to); how many commands went to the sink."""
    sent = 0
    for scope in scopes:
        active = store.keys(scope).active
        cursor = 0
        while True:
            cursor, members = await store.client.sscan(active, cursor, count=CHUNK)
            jobs = [m.decode() for m in members]
            if jobs:
                sent += await _resend(store, dispatcher, scope, jobs, keep)
            if cursor == 0:
                break
    metrics.inc("commands_resent", sent)
    return sent


async def _resend(store: Store, dispatcher: Dispatcher, scope: str, jobs: list[str],
                  keep: Callable[[Command], bool] | None) -> int:
    rows = (await store.load({scope: jobs}))[scope][1]
    items: list[Fresh] = []
    for job in jobs:
        row = rows[job]
        if row.state is None or row.fingerprint is None:
            continue
        graph = await store.graph(scope, row.fingerprint)
        if graph is None:
            continue
        try:
            items.extend(open_attempts(scope, row, graph))
        except ValueError as e:
            log.error("job %s/%s cannot be read to send its open commands again: %s",
                      scope, job, e, extra={"scope": scope, "job": job})
    if keep is not None:
        items = [f for f in items if keep(f.command)]
    return await dispatcher.resend(items)


def open_attempts(scope: str, row: JobRow, graph: Graph) -> list[Fresh]:
    """The commands of a job's open push attempts, to go out whatever their markers
    say (a hold command keeps its check: work that never went out is not held)."""
    state = row.live or row.state
    assert state is not None
    started, fields = sent_markers(graph, state)
    out: list[Fresh] = []
    seen: set[str] = set()
    for field, cid in fields:
        action = field[len("sent:"):].removesuffix(":hold")
        cmd = open_command(graph, state, action)
        if cmd is None or cmd.command_id != cid or cid in seen:
            continue
        seen.add(cid)
        sent_marker = row.markers.get(f"sent:{action}".encode()) if cmd.hold else None
        out.append(Fresh(scope, row.job, cmd, b"", sent_marker, None, started, row.trace))
    return out
