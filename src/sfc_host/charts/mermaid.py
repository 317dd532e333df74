"""A compiled recipe as a Mermaid flowchart (text)."""

from __future__ import annotations

from sfc_fast import Graph


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
