"""Pictures of a compiled recipe: a Mermaid flowchart (text); and the reading of a
running job from Redis for the SVG picture (``sfc_host.charts.svg``)."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from sfc_fast import Graph
from sfc_host.config import HostConfig
from sfc_host.store.keys import SCOPES, InvalidName, ScopeKeys, check_job, check_scope


def _label(text: str) -> str:
    # Mermaid labels in double quotes; quotes and angle brackets as entities.
    return (text.replace("&", "#amp;").replace('"', "#quot;")
            .replace("<", "#lt;").replace(">", "#gt;"))


def _node_id(graph: Graph, node: int) -> str:
    return f"s{node}" if node < graph.n_steps else f"b{node - graph.n_steps}"


def to_mermaid(graph: Graph) -> str:
    """A ``flowchart TD`` with steps (their actions inside), branches as fork and join
    nodes around their paths, and transitions labelled with their conditions."""
    lines = ["flowchart TD"]
    branch_of_step: dict[int, int] = {}
    last_steps: dict[int, list[int]] = {}
    for b in range(graph.n_branches):
        info = graph.branch_info(b)
        last_steps[b] = []
        for path in info["paths"]:
            for name in path:
                branch_of_step[graph.step_index(name)] = b
            last_steps[b].append(graph.step_index(path[-1]))

    def step_line(i: int) -> str:
        info = graph.step_info(i)
        acts = []
        for a in graph.step_actions(i):
            ai = graph.action_info(a)
            kind = "push" if ai["interaction"] == "push_command" else "pull"
            acts.append(f"{ai['qualifier']} {ai['name']} ({kind})")
        text = _label(info["name"] + ("".join("<br/>" + _label(x) for x in acts) if acts else ""))
        text = text.replace("#lt;br/#gt;", "<br/>")
        if info["initial"]:
            return f'    s{i}(["{text}"])'
        return f'    s{i}["{text}"]'

    for i in range(graph.n_steps):
        if i not in branch_of_step:
            lines.append(step_line(i))
    for b in range(graph.n_branches):
        info = graph.branch_info(b)
        sym = "AND" if info["type"] == "simultaneous" else "OR"
        name = _label(info["name"])
        lines.append(f'    subgraph g{b}["{name} ({info["type"]})"]')
        lines.append("    direction TB")
        lines.append(f'    b{b}{{{{"{name} {sym}"}}}}')
        for path in info["paths"]:
            for step_name in path:
                lines.append("    " + step_line(graph.step_index(step_name)))
        lines.append(f'    j{b}{{{{"end {name} {sym}"}}}}')
        lines.append("    end")
    for t in range(graph.n_transitions):
        tr = graph.transition_info(t)
        src = graph.step_index(tr["source"]) if tr["source"] in graph.steps else (
            graph.n_steps + graph.branch_index(tr["source"]))
        dst = graph.step_index(tr["target"]) if tr["target"] in graph.steps else (
            graph.n_steps + graph.branch_index(tr["target"]))
        src_id = _node_id(graph, src)
        dst_id = _node_id(graph, dst)
        if tr["kind"] == "exit":
            src_id = f"j{src - graph.n_steps}"
        elif tr["kind"] == "path_end":
            dst_id = f"j{dst - graph.n_steps}"
        cond = tr["condition"]
        if cond is None or tr["always"]:
            label = ""
        else:
            label = _label(cond)
            if tr["priority"]:
                label += f" [{tr['priority']}]"
        arrow = f'-->|"{label}"|' if label else "-->"
        lines.append(f"    {src_id} {arrow} {dst_id}")
    for b in range(graph.n_branches):
        info = graph.branch_info(b)
        if info["type"] == "simultaneous":
            for path in info["paths"]:
                lines.append(f"    b{b} ==> s{graph.step_index(path[0])}")
        # a path whose last step has no transition of its own converges on the join
        for s in last_steps[b]:
            if not graph.outgoing(s):
                lines.append(f"    s{s} --> j{b}")
    return "\n".join(lines) + "\n"


# ---- a running job, for the SVG picture -------------------------------------------------

class JobNotReadable(Exception):
    """A job that cannot be shown: unknown, ambiguous, or Redis not reachable (one line)."""


def _no_credentials(url: str) -> str:
    # an error line may end up in a log or a ticket: never the password
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=host))


async def _find_scope(client: Any, job: str) -> str:
    # Every scope a host served is in the registry; the job's key tells which holds it.
    scopes = sorted(s.decode() if isinstance(s, bytes) else s
                    for s in await client.smembers(SCOPES))
    found = [s for s in scopes if await client.exists(ScopeKeys(s).job(job))]
    if not found:
        raise JobNotReadable(f"no job {job!r} in any scope ({len(scopes)} known)")
    if len(found) > 1:
        raise JobNotReadable(f"job {job!r} is in scopes {', '.join(found)}: give --scope")
    return found[0]


async def read_job(config: HostConfig, job: str, scope: str | None = None,
                   timeout_s: float = 15.0) -> tuple[Graph, dict[str, Any]]:
    """The recipe a job runs (pinned by fingerprint) and its ``state_to_json`` view, read
    from Redis through the host's store. Nothing is written."""
    from redis.exceptions import RedisClusterException, RedisError

    from sfc_fast import StateFormatError, state_to_json
    from sfc_host.execution.host import connect
    from sfc_host.store.lua_scripts import Scripts
    from sfc_host.store.states import GraphCache, Store

    try:
        check_job(job)
        if scope is not None:
            check_scope(scope)
    except InvalidName as e:
        raise JobNotReadable(str(e)) from None
    client = connect(config)

    async def read() -> tuple[Graph, dict[str, Any]]:
        sc = scope if scope is not None else await _find_scope(client, job)
        store = Store(client, Scripts(client), GraphCache(2), cluster=config.redis_cluster)
        row = (await store.load({sc: [job]}))[sc][1][job]
        if row.state is None or row.fingerprint is None:
            raise JobNotReadable(f"no job {job!r} in scope {sc!r}")
        graph = await store.graph(sc, row.fingerprint)
        if graph is None:
            raise JobNotReadable(f"job {job!r}: its recipe {row.fingerprint[:12]} is not "
                                 f"stored in scope {sc!r}")
        try:
            return graph, state_to_json(graph, row.state)
        except (StateFormatError, ValueError) as e:
            raise JobNotReadable(f"job {job!r}: the state cannot be read ({e})") from None

    try:
        return await asyncio.wait_for(read(), timeout_s)
    except (RedisError, RedisClusterException, OSError, TimeoutError) as e:
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        # the cause tells the CLI a server out of reach (exit 1) from a mistake (2)
        raise JobNotReadable(f"cannot read from Redis at {_no_credentials(config.redis_url)} "
                             f"({why})") from e
    finally:
        await client.aclose()
