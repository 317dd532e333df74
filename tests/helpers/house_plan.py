"""The house plan read from the code: which module imports which, grouped into rooms
(a package of ``sfc_host``, a top-level module, the recipe core, the wire codecs).

``tests/house/test_architecture.py`` checks the plan against the rules of
docs/architecture.md; ``python tests/helpers/house_plan.py --write`` draws the package map there
anew from the imports (the test fails while the drawing differs from the code).
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
DOC = ROOT / "docs" / "architecture.md"
BEGIN = "<!-- package map: drawn by `python tests/helpers/house_plan.py --write` -->"
END = "<!-- end of package map -->"

# What each room may import of ours. A room not listed here may import nothing; an
# arrow the code has and this table lacks fails tests/house/test_architecture.py. The table
# has no circle: a room never reaches itself again.
ALLOWED: dict[str, set[str]] = {
    # the compiled recipe core: pure, no I/O, no client library
    "core": set(),
    # the compiled wire codecs, fenced from the recipe core (they share its text helpers)
    "wire": {"core"},
    # the leaves of the host: names, times as text, logs, TLS, metrics, its version
    "sfc_host": set(),
    "names": {"errors"},
    "times": set(),
    "logs": set(),
    "tls": set(),
    "metrics": set(),
    # waiting for cancelled tasks without swallowing the waiter's own cancel
    "aio": set(),
    "versions": {"core", "sfc_host"},
    # the root of the host's exceptions (beneath the core's), the settings error and
    # the unreachable server: every room that raises one of ours imports it
    "errors": {"core"},
    # W3C trace context; with the otel extra, the spans and their OTLP export (the
    # protobuf encoder is a wire codec)
    "tracing": {"wire", "errors"},
    # the ISA-95 model (job orders, states, return statuses): data every face shares
    "isa95": {"core"},
    "config": {"names", "errors"},
    # Redis: keys, client, channel, scripts, job states, streams, orders, read-only views
    "store": {"aio", "core", "wire", "config", "isa95", "metrics", "names", "times", "tls",
              "tracing", "errors"},
    # MQTT: the link on the compiled codec, CloudEvents; settings by a Protocol
    "mqtt": {"aio", "wire", "metrics", "times", "tls", "errors"},
    # running jobs: the host, settle, work entries, dispatch, recovery, sweeps, wake-ups
    "execution": {"aio", "core", "store", "config", "isa95", "metrics", "names", "tracing",
                  "errors"},
    # the OPC UA client of our own: secure channel, session, services, subscriptions,
    # on the compiled codec
    "opcua_client": {"wire", "errors"},
    # the OPC UA server of our own: address space, NodeSets, secure channel, sessions,
    # services, subscriptions; its crypto is the client's
    "opcua_server": {"wire", "opcua_client", "errors"},
    # station equipment over MQTT and over OPC UA: commands out, answers and events in,
    # capabilities
    "equipment": {"aio", "core", "execution", "store", "mqtt", "opcua_client", "wire",
                  "config", "metrics", "names", "tracing", "errors"},
    # the MES face: ISA-95 job control over MQTT, and the MES client of the CLI
    "mes": {"aio", "execution", "equipment", "store", "mqtt", "wire", "isa95", "config", "metrics",
            "names", "sfc_host", "times", "tracing", "errors"},
    # the OPC UA face: ISA-95 Job Control over OPC UA, on the MES side's job control
    "opcua": {"aio", "mes", "execution", "store", "mqtt", "isa95", "config", "metrics", "sfc_host",
              "opcua_server", "wire", "errors"},
    # the script engine: Tasks and Missions under their state machines
    "engine": {"aio", "core", "mqtt", "tracing", "errors"},
    "examples": {"engine"},
    "charts": {"core"},
    "web": {"aio", "core", "charts", "execution", "store", "mes", "isa95", "config", "metrics",
            "names", "times"},
    # the host process: the app that wires every part, preflight checks, HTTP endpoint
    "service": {"aio", "execution", "equipment", "engine", "mes", "web", "store", "mqtt", "wire",
                "isa95", "config", "metrics", "names", "logs", "sfc_host", "tracing", "opcua",
                "errors"},
    "demo": {"service", "execution", "mes", "mqtt", "store", "isa95", "config", "metrics",
             "core", "sfc_host", "errors", "examples"},
    "cli": {"demo", "service", "web", "charts", "engine", "mes", "execution", "store",
            "isa95", "config", "logs", "names", "times", "versions", "core", "sfc_host",
            "tracing", "opcua", "errors"},
    "__main__": {"cli"},
}
# The packages whose ``__init__.py`` is a face: code outside imports their names
# through it, never from their modules (a module the face names in ``__all__``, like
# ``sfc_fast.events``, is public as a whole). The core's public API, the host's version,
# the asyncio helpers, the command's entry point, the script API, our MQTT client, our
# OPC UA client and our OPC UA server.
# Every other package's ``__init__.py`` is only its map: a docstring saying which module
# holds what, and the code imports from the modules.
FACES = {"sfc_fast", "sfc_host", "sfc_host.aio", "sfc_host.cli", "sfc_host.engine",
         "sfc_host.mqtt", "sfc_host.opcua_client", "sfc_host.opcua_server"}
# Beside the standard library, the recipe core imports only these
CORE_THIRD_PARTY = {"numpy", "cython", "cpython", "libc"}

# Cython sources are read line by line: their imports are plain lines like Python's
_PYX_IMPORT = re.compile(r"^\s*(?:from\s+([\w.]+)\s+c?import|c?import\s+([\w.]+))", re.M)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    """Every module of the two packages, by dotted name (a package by its face)."""
    out: dict[str, Path] = {}
    for pkg in ("sfc_fast", "sfc_host"):
        for path in sorted((SRC / pkg).rglob("*")):
            if path.suffix in (".py", ".pyx") and "__pycache__" not in path.parts:
                out[module_name(path)] = path
        # a declarations-only module (``_text.pxd``: inline C helpers) is a module too
        for path in sorted((SRC / pkg).rglob("*.pxd")):
            out.setdefault(module_name(path), path)
    return out


def packages() -> dict[str, Path]:
    """Every package of the two, by dotted name, with its ``__init__.py``."""
    return {m: p for m, p in modules().items() if p.name == "__init__.py"}


def face(path: Path) -> set[str] | None:
    """The names an ``__init__.py`` puts in ``__all__``; None when it declares none."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    return None


def around_faces() -> list[str]:
    """Every import of a module from outside a package with a face that goes around the
    face (to a module it does not name) or takes a name the face does not export."""
    pkgs = packages()
    faces = {p: face(pkgs[p]) or set() for p in FACES}
    wrong = []
    for m, path in modules().items():
        for base, names in _imported_names(path):
            for p, public in faces.items():
                if m == p or m.startswith(p + ".") or not (base == p or base.startswith(p + ".")):
                    continue
                if base == p:
                    wrong += [f"{m} takes {n} from {p}, whose face does not name it"
                              for n in names if n not in public and f"{p}.{n}" not in pkgs]
                    continue
                sub = base[len(p) + 1:].split(".")[0]
                if sub not in public and f"{p}.{sub}" not in pkgs:
                    wrong.append(f"{m} imports {base}, around the face of {p}")
    return sorted(wrong)


def _imported_names(path: Path) -> Iterable[tuple[str, tuple[str, ...]]]:
    """(module, names taken from it) for every import of a file: at the top, inside
    functions and under ``TYPE_CHECKING`` alike (an import for types is still a
    dependency of the design)."""
    text = path.read_text(encoding="utf-8")
    if path.suffix in (".pyx", ".pxd"):
        for m in _PYX_IMPORT.finditer(text):
            yield (m.group(1) or m.group(2)), ()
        return
    pkg = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, ()
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            yield base, tuple(a.name for a in node.names)


def graph() -> dict[str, set[str]]:
    """Module -> the modules of ours it imports (``from pkg import mod`` names mod)."""
    mods = modules()
    out: dict[str, set[str]] = {m: set() for m in mods}
    for m, path in mods.items():
        for base, names in _imported_names(path):
            if not base.startswith(("sfc_fast", "sfc_host")):
                continue
            targets = [f"{base}.{n}" for n in names if f"{base}.{n}" in mods]
            if len(targets) < len(names) or not names:
                t = base
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t:
                    targets.append(t)
            out[m].update(t for t in targets if t != m)
    return out


def third_party(path: Path) -> set[str]:
    """The top-level names of what a file imports that is neither ours nor relative."""
    return {base.split(".")[0] for base, _ in _imported_names(path)
            if base and not base.startswith(("sfc_fast", "sfc_host"))}


def room(module: str) -> str:
    """The room a module belongs to: ``core`` and ``wire`` for the compiled package, the
    package (or top-level module) of ``sfc_host`` by its name."""
    parts = module.split(".")
    if parts[0] == "sfc_fast":
        return "wire" if len(parts) > 1 and parts[1] == "wire" else "core"
    if len(parts) == 1:
        return "sfc_host"
    return parts[1]


def room_graph(g: dict[str, set[str]] | None = None) -> dict[str, set[str]]:
    g = graph() if g is None else g
    out: dict[str, set[str]] = {}
    for m, deps in g.items():
        r = room(m)
        out.setdefault(r, set()).update(room(d) for d in deps if room(d) != r)
    return out


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected parts of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    # a few hundred modules deep at most: the default recursion limit is enough, and
    # raising it here would change what other tests in this process see
    for v in sorted(g):
        if v not in index:
            visit(v)
    return found


def reduced(g: dict[str, set[str]]) -> dict[str, set[str]]:
    """The arrows left when every arrow a longer path already implies is dropped (the
    graph has no cycle): what the picture draws."""
    def reach(v: str, skip: str) -> set[str]:
        seen: set[str] = set()
        todo = [w for w in g.get(v, ()) if w != skip]
        while todo:
            w = todo.pop()
            if w not in seen:
                seen.add(w)
                todo.extend(g.get(w, ()))
        return seen
    return {v: {w for w in ws if w not in reach(v, w)} for v, ws in g.items()}


def mermaid(rooms: dict[str, set[str]]) -> str:
    lines = ["```mermaid", "flowchart TD"]
    for v in sorted(rooms):
        for w in sorted(reduced(rooms)[v]):
            lines.append(f"    {v} --> {w}")
    lines.append("```")
    return "\n".join(lines)


def drawn() -> str:
    """The package map as docs/architecture.md shows it."""
    text = DOC.read_text(encoding="utf-8")
    return text[text.index(BEGIN) + len(BEGIN):text.index(END)].strip()


def write() -> None:
    text = DOC.read_text(encoding="utf-8")
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    DOC.write_text(f"{head}{BEGIN}\n\n{mermaid(room_graph())}\n\n{END}{tail}",
                   encoding="utf-8")


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write()
    else:
        g = graph()
        for c in cycles(g):
            print("circle:", " -> ".join(c))
        for r, deps in sorted(room_graph(g).items()):
            print(f"{r}: {', '.join(sorted(deps))}")
        for c in cycles(room_graph(g)):
            print("room circle:", " -> ".join(c))
