"""An SVG picture of a compiled recipe in the IEC 61131-3 SFC look, optionally with the
state of one job (active steps, finished steps, open and failed actions) coloured.

Pure: a ``Graph`` and an optional ``state_to_json`` view in, SVG text out; standard
library only. Layout: transitions are nodes of their own (bar and condition), so a
recipe is a directed graph of steps, transitions and branch blocks. A layered layout
(back edges found by a depth-first search, longest-path layers, barycentre ordering,
anchor alignment with a non-overlapping placement) puts every node in its own slot;
a branch block holds one such layout per path, side by side between its two lines.
Jumps back go up a lane of their own on the right of their layout.

Text widths are estimated for a monospace font, so no font metrics are needed.
"""

from __future__ import annotations

import itertools
import re
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from xml.sax.saxutils import escape

if TYPE_CHECKING:
    from sfc_fast import Graph

FONT = 12                 # px, every text
CHAR_W = FONT * 0.62      # a monospace advance, a little generous
FONT_FAMILY = "DejaVu Sans Mono,Menlo,Consolas,monospace"
PAD = 14                  # text inset in a box (room for the active-step token)
STEP_H = 28
STEP_MIN_W = 72
ACT_H = 24                # one action row
ACT_GAP = 18              # step box to its action block
TRANS_H = 20
BAR_W = 24                # a transition bar
BAR_T = 3
H_GAP = 24                # between neighbours of one layer
MIN_GAP = 22              # between layers
TRACK = 8                 # horizontal lines in a gap keep this far apart
LANE = 14                 # one lane per jump back
DUMMY_W = 6               # a long edge's slot in a layer it crosses
OVER = 10                 # branch lines reach past their outer paths
PATH_GAP = 36
LABEL_H = 16              # a branch block's name row
MARGIN = 20
MAX_LABEL = 64            # longer names and conditions are cut (full text in <title>)
DEFAULT_ENTRY = 2_000_000  # priority the compiler gives a selection's default entries

INK = "#222"
COLOURS = {               # fills of the job view
    "active": "#9be89b",
    "finished": "#c9d6ea",
    "failed": "#f5a3a3",
    "held": "#f3d37a",
}
LEGEND = (("active", "active step / open action"), ("finished", "finished step / done action"),
          ("failed", "failed or timed-out action"), ("held", "held (paused) step / action"))
_OPEN_PHASES = frozenset(("delayed", "open", "waiting_exit"))
_FAILED = frozenset(("failed", "timeout", "limited"))

# characters XML 1.0 does not allow, even escaped
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff\ud800-\udfff]")


def _esc(text: str) -> str:
    return escape(_NOT_XML.sub("\ufffd", text), {'"': "&quot;"})


def _cut(text: str) -> str:
    return text if len(text) <= MAX_LABEL else text[:MAX_LABEL - 1] + "…"


def text_width(text: str) -> float:
    """Estimated width in px of ``text`` (wide East Asian characters count double)."""
    return CHAR_W * sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def _f(v: float) -> str:
    return f"{v:.1f}".rstrip("0").rstrip(".")


# ---- the layered layout -----------------------------------------------------------------

@dataclass(eq=False)
class _Node:
    kind: str          # step, trans, block, dummy, start, end
    w: float
    h: float
    ax: float          # the flow line's x, from the left edge
    ref: int = -1      # step, transition or branch index
    label: str = ""
    x: float = 0.0     # left and top, in the flow's coordinates
    y: float = 0.0
    layer: int = 0
    block: _Block | None = None
    acts: list[tuple[int, str, str]] = field(default_factory=list)  # (action, qual, kind)
    cols: tuple[float, float, float] = (0.0, 0.0, 0.0)              # action cell widths

    @property
    def cx(self) -> float:
        return self.x + self.ax

    @property
    def out_y(self) -> float:
        # a step's flow line leaves its box, not the foot of its action block
        return self.y + (STEP_H if self.kind == "step" else self.h)


@dataclass
class _Route:
    points: list[tuple[float, float]]
    back: bool


class _Flow:
    """A layered layout of nodes joined by edges ``(u, v)`` from ``root`` down; ``sink``
    (if any) alone in the last layer."""

    def __init__(self, nodes: list[_Node], edges: list[tuple[int, int]], root: int,
                 sink: int | None = None) -> None:
        self.nodes = nodes
        self.edges = edges
        self.routes: list[_Route] = []
        self.w = 0.0
        self.h = 0.0
        self._layout(root, sink)

    def _layout(self, root: int, sink: int | None) -> None:
        nodes, edges = self.nodes, self.edges
        n = len(nodes)
        out: list[list[int]] = [[] for _ in range(n)]
        for e, (u, _v) in enumerate(edges):
            out[u].append(e)
        # depth-first search: an edge to a node on the stack goes back up (a loop)
        state = [0] * n
        disc = [0] * n
        back: set[int] = set()
        count = 0
        starts = [root] + [i for i in range(n) if i not in (root, sink)]
        if sink is not None:
            starts.append(sink)
        for r in starts:
            if state[r]:
                continue
            state[r], disc[r], count = 1, count, count + 1
            stack = [(r, iter(out[r]))]
            while stack:
                u, it = stack[-1]
                for e in it:
                    v = edges[e][1]
                    if state[v] == 1:
                        back.add(e)
                    elif state[v] == 0:
                        state[v], disc[v], count = 1, count, count + 1
                        stack.append((v, iter(out[v])))
                        break
                else:
                    state[u] = 2
                    stack.pop()
        fwd = [e for e in range(len(edges)) if e not in back]
        # longest-path layers over the forward edges; below a virtual start only it is on top
        base = 1 if nodes[root].kind == "start" else 0
        layer = [0 if i == root else base for i in range(n)]
        indeg = [0] * n
        for e in fwd:
            indeg[edges[e][1]] += 1
        ready = sorted((i for i in range(n) if indeg[i] == 0), key=lambda i: disc[i])
        fwd_out: list[list[int]] = [[] for _ in range(n)]
        for e in fwd:
            fwd_out[edges[e][0]].append(e)
        while ready:
            u = ready.pop(0)
            for e in fwd_out[u]:
                v = edges[e][1]
                layer[v] = max(layer[v], layer[u] + 1)
                indeg[v] -= 1
                if indeg[v] == 0:
                    ready.append(v)
        if sink is not None:
            layer[sink] = max((layer[i] for i in range(n) if i != sink), default=0) + 1
        # long edges get a slot in every layer they cross, so no box sits on them
        key: list[float] = [float(d) for d in disc]
        chains: dict[int, list[int]] = {}
        for e in fwd:
            u, v = edges[e]
            chain = [u]
            for k in range(layer[u] + 1, layer[v]):
                d = len(nodes)
                nodes.append(_Node("dummy", DUMMY_W, 0.0, DUMMY_W / 2))
                layer.append(k)
                key.append(disc[u] + 0.5 + k / (layer[v] + 1) / 2)
                chain.append(d)
            chain.append(v)
            chains[e] = chain
        for i, nd in enumerate(nodes):
            nd.layer = layer[i]
        n_layers = max(layer, default=0) + 1
        rows: list[list[int]] = [[] for _ in range(n_layers)]
        for i in sorted(range(len(nodes)), key=lambda i: key[i]):
            rows[layer[i]].append(i)
        preds: list[list[int]] = [[] for _ in nodes]
        succs: list[list[int]] = [[] for _ in nodes]
        for chain in chains.values():
            for a, b in itertools.pairwise(chain):
                succs[a].append(b)
                preds[b].append(a)
        self._order(rows, preds, succs)
        self._place(rows, preds, succs)
        self._route(rows, chains, back, succs, n_layers)

    @staticmethod
    def _order(rows: list[list[int]], preds: list[list[int]], succs: list[list[int]]) -> None:
        """Barycentre sweeps: each node moves towards the mean slot of its neighbours."""
        pos: dict[int, float] = {}
        for row in rows:
            for k, i in enumerate(row):
                pos[i] = k
        for _ in range(4):
            for seq, nb in ((range(1, len(rows)), preds),
                            (range(len(rows) - 2, -1, -1), succs)):
                for li in seq:
                    row = rows[li]
                    bc = {i: (sum(pos[j] for j in nb[i]) / len(nb[i]) if nb[i] else pos[i])
                          for i in row}
                    row.sort(key=lambda i: bc[i])
                    for k, i in enumerate(row):
                        pos[i] = k

    def _place(self, rows: list[list[int]], preds: list[list[int]],
               succs: list[list[int]]) -> None:
        nodes = self.nodes
        for row in rows:
            x = 0.0
            for i in row:
                nodes[i].x = x
                x += nodes[i].w + H_GAP

        def fit(row: list[int], want: list[float]) -> None:
            # closest to the wanted lefts without overlap: the mean of a left-to-right and
            # a right-to-left packing (both keep the gaps, so their mean does too)
            left: list[float] = []
            edge = float("-inf")
            for i, w in zip(row, want, strict=True):
                x = max(w, edge)
                left.append(x)
                edge = x + nodes[i].w + H_GAP
            right = [0.0] * len(row)
            edge = float("inf")
            for k in range(len(row) - 1, -1, -1):
                i = row[k]
                x = min(want[k], edge - nodes[i].w)
                right[k] = x
                edge = x - H_GAP
            for k, i in enumerate(row):
                nodes[i].x = (left[k] + right[k]) / 2

        def sweep(seq: Iterable[int], nb: list[list[int]]) -> None:
            for li in seq:
                row = rows[li]
                want = []
                for i in row:
                    c = (sum(nodes[j].cx for j in nb[i]) / len(nb[i]) if nb[i] else nodes[i].cx)
                    want.append(c - nodes[i].ax)
                fit(row, want)

        for _ in range(4):
            sweep(range(len(rows) - 2, -1, -1), succs)
            sweep(range(1, len(rows)), preds)
        lo = min((nd.x for nd in nodes), default=0.0)
        for nd in nodes:
            nd.x -= lo
        self.w = max((nd.x + nd.w for nd in nodes), default=0.0)

    def _route(self, rows: list[list[int]], chains: dict[int, list[int]], back: set[int],
               succs: list[list[int]], n_layers: int) -> None:
        nodes, edges = self.nodes, self.edges
        lanes = {e: self.w + LANE * (k + 1) for k, e in enumerate(sorted(back))}
        if back:
            self.w += LANE * (len(back) + 1)
        # horizontal runs per gap (gap l lies below layer l; gap -1 above layer 0), grouped:
        # a divergence shares one line, so does a convergence
        runs: dict[int, dict[tuple[str, int], list[float]]] = {}

        def run(gap: int, k: tuple[str, int], a: float, b: float) -> None:
            r = runs.setdefault(gap, {}).setdefault(k, [a, a])
            r[0] = min(r[0], a, b)
            r[1] = max(r[1], a, b)

        def seg_key(a: int, b: int) -> tuple[str, int]:
            return ("d", a) if len(succs[a]) > 1 else ("c", b)

        for chain in chains.values():
            for a, b in itertools.pairwise(chain):
                run(nodes[a].layer, seg_key(a, b), nodes[a].cx, nodes[b].cx)
        for e in back:
            u, v = edges[e]
            run(nodes[u].layer, ("b", e), nodes[u].cx, lanes[e])
            run(nodes[v].layer - 1, ("c", v), nodes[v].cx, lanes[e])
        track: dict[tuple[int, tuple[str, int]], float] = {}
        gap_h: dict[int, float] = {}
        n_tracks: dict[int, int] = {}
        for gap in range(-1, n_layers):
            used: list[float] = []      # right end of each track so far
            for k, (a, b) in sorted(runs.get(gap, {}).items(), key=lambda kv: kv[1][0]):
                if b - a < 0.5:
                    track[(gap, k)] = 0
                    continue
                t = next((t for t, end in enumerate(used) if end + 6 < a), len(used))
                if t == len(used):
                    used.append(b)
                else:
                    used[t] = b
                track[(gap, k)] = t
            n_tracks[gap] = max(1, len(used))
            need = (len(used) + 1) * TRACK if used else 0.0
            gap_h[gap] = max(need, MIN_GAP) if 0 <= gap < n_layers - 1 else need
        tops: list[float] = []
        y = gap_h[-1]
        for li, row in enumerate(rows):
            tops.append(y)
            y += max((nodes[i].h for i in row), default=0.0) + gap_h[li]
        self.h = y
        for nd in nodes:
            nd.y = tops[nd.layer]
        gap_top = [tops[li] + max((nodes[i].h for i in rows[li]), default=0.0)
                   for li in range(n_layers)]

        def ty(gap: int, k: tuple[str, int]) -> float:
            # the tracks of a gap centred in it
            top = 0.0 if gap < 0 else gap_top[gap]
            spare = gap_h[gap] - n_tracks[gap] * TRACK
            return top + spare / 2 + track[(gap, k)] * TRACK + TRACK / 2

        for e, (u, v) in enumerate(edges):
            nu, nv = nodes[u], nodes[v]
            if e in back:
                lane = lanes[e]
                y1 = ty(nu.layer, ("b", e))
                y2 = ty(nv.layer - 1, ("c", v))
                pts = [(nu.cx, nu.out_y), (nu.cx, y1), (lane, y1), (lane, y2), (nv.cx, y2),
                       (nv.cx, nv.y)]
                self.routes.append(_Route(pts, True))
                continue
            chain = chains[e]
            pts = [(nu.cx, nu.out_y)]
            for a, b in itertools.pairwise(chain):
                na, nb = nodes[a], nodes[b]
                yy = ty(na.layer, seg_key(a, b))
                pts += [(na.cx, yy), (nb.cx, yy), (nb.cx, nb.y)]
                if nb.kind == "dummy":
                    pts.append((nb.cx, gap_top[nb.layer]))
            self.routes.append(_Route(pts, False))


# ---- from a graph to nodes --------------------------------------------------------------

@dataclass(eq=False)
class _Block:
    """A branch: its name row, its opening line, the paths side by side, its closing line."""

    ref: int
    name: str
    simultaneous: bool
    paths: list[tuple[float, _Flow, _Node, _Node]]  # (x offset, flow, start, end)
    anchor: float = 0.0
    fork_y: float = 0.0
    paths_y: float = 0.0
    join_y: float = 0.0
    fork: tuple[float, float] = (0.0, 0.0)
    join: tuple[float, float] = (0.0, 0.0)


def _trans_label(tr: Mapping[str, Any]) -> str:
    cond = tr["condition"]
    text = "" if cond is None or tr["always"] else _cut(str(cond))
    if tr["priority"] and tr["priority"] < DEFAULT_ENTRY and text:
        text += f" [{tr['priority']}]"
    return text


def _trans_node(graph: Graph, t: int) -> _Node:
    label = _trans_label(graph.transition_info(t))
    w = BAR_W + 6 + text_width(label) if label else BAR_W
    return _Node("trans", w, TRANS_H, BAR_W / 2, ref=t, label=label)


def _qual_text(ai: Mapping[str, Any]) -> str:
    q = str(ai["qualifier"])
    ms = ai.get("duration_ms")
    if ms:
        secs = ms / 1000
        q += f" T#{secs:g}s"
    return q


def _step_node(graph: Graph, i: int) -> _Node:
    info = graph.step_info(i)
    name = _cut(info["name"])
    box_w = max(STEP_MIN_W, text_width(name) + 2 * PAD)
    nd = _Node("step", box_w, STEP_H, box_w / 2, ref=i, label=name)
    acts = graph.step_actions(i)
    if acts:
        rows = []
        for a in acts:
            ai = graph.action_info(a)
            kind = "push" if ai["interaction"] == "push_command" else "pull"
            rows.append((a, _qual_text(ai), kind))
        qw = max(24.0, max(text_width(q) for _, q, _ in rows) + 10)
        nw = max(text_width(_cut(graph.action_info(a)["name"])) for a, _, _ in rows) + 2 * 8
        kw = text_width("push") + 10
        nd.acts, nd.cols = rows, (qw, nw, kw)
        nd.w = box_w + ACT_GAP + qw + nw + kw
        nd.h = max(STEP_H, ACT_H * len(rows))
    return nd


def _path_flow(graph: Graph, b: int, path: list[str], simultaneous: bool
               ) -> tuple[_Flow, _Node, _Node]:
    """One path of branch ``b``: a virtual start under the opening line, its entry
    transitions (selection), its steps and transitions, a virtual end over the closing
    line."""
    nodes = [_Node("start", 0.0, 0.0, 0.0)]
    edges: list[tuple[int, int]] = []
    idx: dict[int, int] = {}
    for name in path:
        s = graph.step_index(name)
        idx[s] = len(nodes)
        nodes.append(_step_node(graph, s))
    end = len(nodes)
    nodes.append(_Node("end", 0.0, 0.0, 0.0))
    first = graph.step_index(path[0])
    if simultaneous:
        edges.append((0, idx[first]))     # every path starts at the double line
    else:
        for t in graph.outgoing(graph.n_steps + b):
            tr = graph.transition_info(t)
            if tr["kind"] in ("entry", "implicit") and tr["target"] == path[0]:
                edges += [(0, len(nodes)), (len(nodes), idx[first])]
                nodes.append(_trans_node(graph, t))
    for s, k in list(idx.items()):
        outs = graph.outgoing(s)
        if not outs:
            edges.append((k, end))        # the last step ends the path
        for t in outs:
            tr = graph.transition_info(t)
            target = end if tr["kind"] == "path_end" else idx[graph.step_index(tr["target"])]
            edges += [(k, len(nodes)), (len(nodes), target)]
            nodes.append(_trans_node(graph, t))
    return _Flow(nodes, edges, 0, end), nodes[0], nodes[end]


def _block_node(graph: Graph, b: int) -> _Node:
    info = graph.branch_info(b)
    simultaneous = info["type"] == "simultaneous"
    paths = []
    x = 0.0
    for path in info["paths"]:
        flow, start, end = _path_flow(graph, b, list(path), simultaneous)
        paths.append((x, flow, start, end))
        x += flow.w + PATH_GAP
    name = _cut(info["name"])
    blk = _Block(b, name, simultaneous, paths)
    starts = [ox + s.cx for ox, _, s, _ in paths]
    ends = [ox + e.cx for ox, _, _, e in paths]
    # shift right so the lines may reach past the outer paths
    shift = max(0.0, OVER - min(starts + ends))
    blk.paths = [(ox + shift, f, s, e) for ox, f, s, e in paths]
    starts = [v + shift for v in starts]
    ends = [v + shift for v in ends]
    blk.anchor = (min(starts) + max(starts)) / 2
    blk.fork = (min(starts) - OVER, max(starts) + OVER)
    blk.join = (min([*ends, blk.anchor]) - OVER, max([*ends, blk.anchor]) + OVER)
    lines = 2 * BAR_T if simultaneous else 0.0
    blk.fork_y = LABEL_H + 4
    blk.paths_y = blk.fork_y + lines + 2
    bottom = max(blk.paths_y + e.y for _, _, _, e in blk.paths)
    blk.join_y = bottom + 6
    w = max(x - PATH_GAP + shift, blk.join[1], blk.fork[1],
            blk.anchor + 8 + text_width(name))
    h = blk.join_y + lines + 2
    return _Node("block", w, h, blk.anchor, ref=b, label=name, block=blk)


def _chart(graph: Graph) -> _Flow:
    nodes: list[_Node] = []
    index: dict[int, int] = {}          # graph node -> chart node
    for i in range(graph.n_steps):
        if graph.step_info(i)["branch"] is None:
            index[i] = len(nodes)
            nodes.append(_step_node(graph, i))
    for b in range(graph.n_branches):
        index[graph.n_steps + b] = len(nodes)
        nodes.append(_block_node(graph, b))
    edges: list[tuple[int, int]] = []
    step_names = set(graph.steps)
    for g_node, k in list(index.items()):
        for t in graph.outgoing(g_node):
            tr = graph.transition_info(t)
            if tr["kind"] not in ("step", "exit"):
                continue                # inside a branch block
            target = tr["target"]
            tgt = (graph.step_index(target) if target in step_names
                   else graph.n_steps + graph.branch_index(target))
            edges += [(k, len(nodes)), (len(nodes), index[tgt])]
            nodes.append(_trans_node(graph, t))
    return _Flow(nodes, edges, index[graph.initial_step])


# ---- drawing ----------------------------------------------------------------------------

class _Job:
    """How a job's state view colours the picture."""

    def __init__(self, view: Mapping[str, Any] | None) -> None:
        self.view = view
        self.active = set(view.get("active_steps") or ()) if view else set()
        self.rounds: Mapping[str, int] = (view.get("step_rounds") or {}) if view else {}
        self.actions: Mapping[str, Mapping[str, Any]] = (view.get("actions") or {}) if view \
            else {}
        # a held job's work stands still: its active steps and open actions show held
        self.running = "held" if view and view.get("held_ms") is not None else "active"

    def step(self, name: str) -> str:
        if name in self.active:
            return self.running
        return "finished" if self.rounds.get(name) else ""

    def action(self, name: str) -> str:
        a = self.actions.get(name)
        if a is None:
            return ""
        if a.get("phase") in _OPEN_PHASES:
            return self.running
        return "failed" if a.get("outcome") in _FAILED else "finished"


def job_classes(graph: Graph, state: Mapping[str, Any] | None
                ) -> tuple[dict[str, str], dict[str, str]]:
    """The class ``to_svg`` gives each step and each action (by name) for a job's state
    view ("" uncoloured): what a live page needs to recolour a drawn chart."""
    job = _Job(state)
    steps = {name: job.step(name) for name in graph.steps}
    actions = {}
    for i in range(graph.n_actions):
        ai = graph.action_info(i)
        actions[ai["name"]] = "" if ai["qualifier"] == "R" else job.action(ai["name"])
    return steps, actions


class _Pen:
    def __init__(self, graph: Graph, job: _Job) -> None:
        self.graph = graph
        self.job = job
        self.out: list[str] = []

    def line(self, x1: float, y1: float, x2: float, y2: float, width: float = 1.2,
             cls: str = "link") -> None:
        self.out.append(f'<line class="{cls}" x1="{_f(x1)}" y1="{_f(y1)}" x2="{_f(x2)}" '
                        f'y2="{_f(y2)}" stroke="{INK}" stroke-width="{_f(width)}"/>')

    def rect(self, x: float, y: float, w: float, h: float, fill: str = "#fff",
             width: float = 1.2, cls: str = "box") -> None:
        self.out.append(f'<rect class="{cls}" x="{_f(x)}" y="{_f(y)}" width="{_f(w)}" '
                        f'height="{_f(h)}" fill="{fill}" stroke="{INK}" '
                        f'stroke-width="{_f(width)}"/>')

    def text(self, x: float, y: float, text: str, anchor: str = "start",
             cls: str = "label") -> None:
        self.out.append(f'<text class="{cls}" x="{_f(x)}" y="{_f(y + FONT * 0.35)}" '
                        f'text-anchor="{anchor}">{_esc(text)}</text>')

    def flow(self, flow: _Flow, ox: float, oy: float) -> None:
        for r in flow.routes:
            pts = " ".join(f"{_f(x + ox)},{_f(y + oy)}" for x, y in r.points)
            if r.back:
                self.out.append(f'<polyline class="jump" points="{pts}" fill="none" '
                                f'stroke="{INK}" stroke-width="1.2" marker-end="url(#arrow)"/>')
                # an arrow head half way up the lane: the jump goes back up
                (lx, y1), (_, y2) = r.points[2], r.points[3]
                mx, my = lx + ox, (y1 + y2) / 2 + oy
                self.out.append(f'<path class="jump-head" d="M{_f(mx - 4)},{_f(my + 4)} '
                                f'L{_f(mx)},{_f(my - 4)} L{_f(mx + 4)},{_f(my + 4)} z" '
                                f'fill="{INK}"/>')
            else:
                self.out.append(f'<polyline class="link" points="{pts}" fill="none" '
                                f'stroke="{INK}" stroke-width="1.2"/>')
        for nd in flow.nodes:
            x, y = nd.x + ox, nd.y + oy
            if nd.kind == "step":
                self.step(nd, x, y)
            elif nd.kind == "trans":
                self.transition(nd, x, y)
            elif nd.kind == "block" and nd.block is not None:
                self.block(nd, nd.block, x, y)

    def step(self, nd: _Node, x: float, y: float) -> None:
        g = self.graph
        info = g.step_info(nd.ref)
        name: str = info["name"]
        state = self.job.step(name)
        classes = " ".join(c for c in ("step", "initial" if info["initial"] else "", state) if c)
        tip = name
        if self.job.view is not None:
            rounds = self.job.rounds.get(name, 0)
            tip += f": {state or 'not reached'}" + (f", entered {rounds}×" if rounds else "")
        box_w = nd.ax * 2
        self.out.append(f'<g class="{classes}" data-name="{_esc(name)}"><title>{_esc(tip)}'
                        '</title>')
        fill = COLOURS.get(state, "#fff")
        self.rect(x, y, box_w, STEP_H, fill, 2.2 if state == "active" else 1.2)
        if info["initial"]:      # IEC: the initial step is double-framed
            self.rect(x + 3, y + 3, box_w - 6, STEP_H - 6, fill, 1.0, cls="frame")
        if state == "active":    # the token of an active step
            self.out.append(f'<circle cx="{_f(x + 8)}" cy="{_f(y + STEP_H / 2)}" r="3" '
                            f'fill="{INK}"/>')
        self.text(x + box_w / 2, y + STEP_H / 2, nd.label, "middle", "name")
        self.out.append("</g>")
        if not nd.acts:
            return
        qw, nw, kw = nd.cols
        ax = x + box_w + ACT_GAP
        self.line(x + box_w, y + ACT_H / 2, ax, y + ACT_H / 2)
        for k, (a, qual, kind) in enumerate(nd.acts):
            ai = g.action_info(a)
            aname: str = ai["name"]
            st = "" if ai["qualifier"] == "R" else self.job.action(aname)
            ay = y + k * ACT_H
            cls = " ".join(c for c in ("action", st) if c)
            tip = f"{qual} {aname} ({ai['interaction']} {ai['type_id']})"
            if self.job.view is not None and aname in self.job.actions:
                a_st = self.job.actions[aname]
                tip += f": {a_st.get('phase')}" + (f", {a_st['outcome']}"
                                                   if a_st.get("outcome") else "")
            self.out.append(f'<g class="{cls}" data-name="{_esc(aname)}" '
                            f'data-step="{_esc(g.step_info(nd.ref)["name"])}">'
                            f'<title>{_esc(tip)}</title>')
            fill = COLOURS.get(st, "#fff")
            self.rect(ax, ay, qw, ACT_H, fill)
            self.rect(ax + qw, ay, nw, ACT_H, fill)
            self.rect(ax + qw + nw, ay, kw, ACT_H, fill)
            self.text(ax + qw / 2, ay + ACT_H / 2, qual, "middle", "qualifier")
            self.text(ax + qw + 8, ay + ACT_H / 2, _cut(aname), "start", "name")
            self.text(ax + qw + nw + kw / 2, ay + ACT_H / 2, kind, "middle", "kind")
            self.out.append("</g>")

    def transition(self, nd: _Node, x: float, y: float) -> None:
        tr = self.graph.transition_info(nd.ref)
        cond = tr["condition"]
        tip = f"{tr['source']} → {tr['target']}"
        if cond and not tr["always"]:
            tip += f": {cond}"
        if tr["priority"] and tr["priority"] < DEFAULT_ENTRY:
            tip += f" (priority {tr['priority']})"
        cx, cy = x + nd.ax, y + TRANS_H / 2
        self.out.append(f'<g class="transition" data-source="{_esc(tr["source"])}" '
                        f'data-target="{_esc(tr["target"])}"><title>{_esc(tip)}</title>')
        self.line(cx, y, cx, y + TRANS_H)
        self.out.append(f'<rect class="bar" x="{_f(cx - BAR_W / 2)}" '
                        f'y="{_f(cy - BAR_T / 2)}" width="{BAR_W}" height="{BAR_T}" '
                        f'fill="{INK}"/>')
        if nd.label:
            self.text(cx + BAR_W / 2 + 6, cy, nd.label, "start", "condition")
        self.out.append("</g>")

    def block(self, nd: _Node, blk: _Block, x: float, y: float) -> None:
        kind = "simultaneous" if blk.simultaneous else "selection"
        full = _esc(self.graph.branches[blk.ref])
        self.out.append(f'<g class="branch {kind}" data-name="{full}">'
                        f'<title>{full} ({kind})</title>')
        self.text(x + blk.anchor + 8, y + LABEL_H / 2, blk.name, "start", "branch-name")
        a = x + blk.anchor
        self.line(a, y, a, y + blk.fork_y)
        self.line(a, y + blk.join_y, a, y + nd.h)
        for yy, (x0, x1) in ((blk.fork_y, blk.fork), (blk.join_y, blk.join)):
            self.line(x + x0, y + yy, x + x1, y + yy, cls="branch-line")
            if blk.simultaneous:   # IEC: simultaneous branches open and close with double lines
                self.line(x + x0, y + yy + BAR_T, x + x1, y + yy + BAR_T, cls="branch-line")
        under = blk.fork_y + (BAR_T if blk.simultaneous else 0)
        for ox, flow, start, end in blk.paths:
            px, py = x + ox, y + blk.paths_y
            self.line(px + start.cx, y + under, px + start.cx, py + start.y)
            self.line(px + end.cx, py + end.y, px + end.cx, y + blk.join_y)
            self.flow(flow, px, py)
        self.out.append("</g>")


def to_svg(graph: Graph, state: Mapping[str, Any] | None = None, *,
           title: str | None = None) -> str:
    """The SVG picture of ``graph``; with ``state`` (a ``state_to_json`` view) the job's
    active and finished steps and its actions coloured, and a legend."""
    chart = _chart(graph)
    job = _Job(state)
    head: list[tuple[str, str]] = [
        ("title", f"{title or 'recipe'} · v{graph.version} · {graph.fingerprint[:12]}")]
    if state is not None:
        line = (f"job {state.get('job')} · scope {state.get('scope')} · "
                f"{state.get('status')}")
        if state.get("reason"):
            line += f" ({state['reason']})"
        head.append(("job", line))
    head_h = 22 * len(head) + (22 if state is not None else 0) + 6
    legend_w = sum(24 + text_width(t) + 16 for _, t in LEGEND) if state is not None else 0.0
    width = max(chart.w + 2 * MARGIN, legend_w + 2 * MARGIN,
                max(text_width(t) for _, t in head) + 2 * MARGIN)
    height = head_h + chart.h + 2 * MARGIN
    pen = _Pen(graph, job)
    out = pen.out
    out.append('<?xml version="1.0" encoding="UTF-8"?>')
    out.append(f'<svg xmlns="http://www.w3.org/2000/svg" width="{_f(width)}" '
               f'height="{_f(height)}" viewBox="0 0 {_f(width)} {_f(height)}" '
               f'font-family="{FONT_FAMILY}" font-size="{FONT}" fill="{INK}">')
    out.append(f"<title>{_esc(head[0][1])}</title>")
    out.append('<defs><marker id="arrow" viewBox="0 0 8 8" refX="8" refY="4" '
               'markerWidth="8" markerHeight="8" orient="auto-start-reverse">'
               f'<path d="M0,0 L8,4 L0,8 z" fill="{INK}"/></marker></defs>')
    out.append('<rect class="background" width="100%" height="100%" fill="#fff"/>')
    y = MARGIN
    for cls, t in head:
        weight = ' font-weight="bold"' if cls == "title" else ""
        out.append(f'<text class="{cls}" x="{MARGIN}" y="{_f(y + FONT * 0.35)}"{weight}>'
                   f"{_esc(t)}</text>")
        y += 22
    if state is not None:
        out.append('<g class="legend">')
        x = float(MARGIN)
        for key, t in LEGEND:
            out.append(f'<rect class="swatch" x="{_f(x)}" y="{_f(y - 7)}" width="16" '
                       f'height="14" fill="{COLOURS[key]}" stroke="{INK}"/>')
            pen.text(x + 22, y, t)
            x += 24 + text_width(t) + 16
        out.append("</g>")
    out.append('<g class="chart">')
    pen.flow(chart, MARGIN, head_h + MARGIN)
    out.append("</g></svg>")
    return "\n".join(out) + "\n"
