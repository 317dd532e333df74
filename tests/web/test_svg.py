"""The SVG picture of a recipe (``sfc_host.charts.svg``) and ``sfc-host recipe diagram --svg``:
well-formed XML naming every step and action, no overlapping boxes, a running job's
active and finished steps marked, one-line refusals of wrong arguments."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from helpers.aio import run
from helpers.cli import cli
from helpers.hosts import Station, flush, quick_config, wait_until, work_master
from helpers.recipes import PACKAGED_RECIPES, V110, generated, linear, pull, push

from sfc_fast import RecipeError, compile_recipe
from sfc_host.charts.svg import FONT, text_width, to_svg
from sfc_host.execution.host import Host

NS = "{http://www.w3.org/2000/svg}"
REPO = Path(__file__).resolve().parents[2]


# ---- recipes with many branches ---------------------------------------------------------

def branchy(seed: int) -> dict[str, Any]:
    """A random recipe of steps and branches in sequence: branches right after branches,
    loops inside paths, paths ended early, skips forward, a three-way choice at a step,
    jumps back to earlier steps and every qualifier. (Branches inside paths are refused by the
    compiler, SFC019, so this is as deep as recipes nest.)"""
    rnd = random.Random(seed)
    steps: list[dict[str, Any]] = [{"Name": "Start", "Initial": True}]
    trans: list[dict[str, Any]] = []
    acts: list[dict[str, Any]] = []
    branches: list[dict[str, Any]] = []
    top: list[str] = ["Start"]          # nodes outside paths, in order
    n = itertools.count()

    def step(name: str) -> str:
        steps.append({"Name": name})
        for _ in range(rnd.randint(0, 3)):
            q = rnd.choice(["N", "N", "P1", "P0", "S", "D", "L", "P"])
            extra: dict[str, Any] = {}
            if q in ("D", "L"):
                extra["DurationSeconds"] = rnd.choice([0.5, 2, 30])
            make = push if rnd.random() < 0.6 else pull
            if make is pull and q in ("D", "L"):
                make = push
            acts.append(make(f"a{next(n)}", name, q, **extra))
        return name

    for u in range(rnd.randint(3, 6)):
        kind = rnd.choice(["step", "selection", "simultaneous", "selection"])
        if kind == "step":
            name = step(f"T{u}")
        else:
            name = f"B{u}"
            paths = []
            for p in range(rnd.randint(2, 4)):
                path = [step(f"P{u}_{p}_{k}") for k in range(rnd.randint(1, 3))]
                if len(path) >= 2 and rnd.random() < 0.5:
                    # a check that loops inside its path, or ends it when it passes
                    trans.append({"Source": path[-1], "Target": path[0],
                                  "Condition": "job.retry == true", "Priority": 1})
                    trans.append({"Source": path[-1], "Target": name,
                                  "Condition": "job.done == true"})
                paths.append(path)
                if kind == "selection" and rnd.random() < 0.6:
                    trans.append({"Source": name, "Target": path[0],
                                  "Condition": f"job.choice == {p}", "Priority": p})
            branches.append({"Name": name, "Type": kind, "Branches": paths})
        trans.append({"Source": top[-1], "Target": name, "Condition": "always"})
        top.append(name)
    if len(top) >= 4:   # a skip over the next node: a long edge past other boxes
        trans.append({"Source": top[1], "Target": top[3], "Condition": "job.skip == true",
                      "Priority": 5})
    # a three-way choice: on, back to the start, or to a side step that jumps back up
    side = step("Side")
    end = step("End")
    last = top[-1]
    if last.startswith("B"):
        last = step("Check")
        trans.append({"Source": top[-1], "Target": last, "Condition": "always"})
    trans += [{"Source": last, "Target": end, "Condition": "job.ok == true"},
              {"Source": last, "Target": "Start", "Condition": "job.again == true",
               "Priority": 1},
              {"Source": last, "Target": side, "Condition": "job.side == true", "Priority": 2},
              {"Source": side, "Target": top[rnd.randrange(1, len(top))],
               "Condition": "always"}]
    # an S action and its reset in another step
    acts.append(push("held_on", "Start", "S"))
    acts.append({**push("held_on", end, "R")})
    return {"Steps": steps, "Transitions": trans, "Actions": acts, "Branches": branches}


def example_recipes() -> list[Path]:
    return sorted(p for p in PACKAGED_RECIPES.glob("*.json") if not p.name.startswith("bad_"))


def compile_example(path: Path) -> Any:
    wm = json.loads(path.read_text())
    return compile_recipe(wm["data"], wm["dataschema"])


def all_graphs() -> list[tuple[str, Any]]:
    out = [(p.stem, compile_example(p)) for p in example_recipes()]
    out += [("linear", compile_recipe(linear(4), V110)),
            ("generated", compile_recipe(generated(40, 6), V110))]
    out += [(f"branchy{s}", compile_recipe(branchy(s), V110)) for s in range(12)]
    return out


GRAPHS = all_graphs()


# ---- reading the picture back -----------------------------------------------------------

def parse(svg: str) -> ET.Element:
    return ET.fromstring(svg.encode())


def groups(root: ET.Element, cls: str) -> list[ET.Element]:
    return [g for g in root.iter(NS + "g") if cls in g.get("class", "").split()]


Box = tuple[float, float, float, float]


def rect_box(r: ET.Element) -> Box:
    x, y = float(r.get("x", 0)), float(r.get("y", 0))
    return x, y, x + float(r.get("width", 0)), y + float(r.get("height", 0))


def union(boxes: list[Box]) -> Box:
    return (min(b[0] for b in boxes), min(b[1] for b in boxes),
            max(b[2] for b in boxes), max(b[3] for b in boxes))


def overlap(a: Box, b: Box) -> bool:
    eps = 0.01
    return a[0] < b[2] - eps and b[0] < a[2] - eps and a[1] < b[3] - eps and b[1] < a[3] - eps


def text_box(t: ET.Element) -> Box:
    x, y = float(t.get("x", 0)), float(t.get("y", 0))
    w = text_width(t.text or "")
    anchor = t.get("text-anchor", "start")
    x0 = x - w / 2 if anchor == "middle" else x
    return x0, y - FONT * 0.85, x0 + w, y + FONT * 0.25


def element_boxes(root: ET.Element) -> list[tuple[str, Box]]:
    """Every step, action, transition bar and condition text, as boxes."""
    out: list[tuple[str, Box]] = []
    for cls in ("step", "action"):
        for g in groups(root, cls):
            rects = [rect_box(r) for r in g.iter(NS + "rect")]
            out.append((f"{cls} {g.get('data-name')}", union(rects)))
    for g in groups(root, "transition"):
        who = f"transition {g.get('data-source')}->{g.get('data-target')}"
        for r in g.iter(NS + "rect"):
            out.append((who + " bar", rect_box(r)))
        for t in g.iter(NS + "text"):
            out.append((who + " condition", text_box(t)))
    return out


# ---- the picture ------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "graph"), GRAPHS, ids=[n for n, _ in GRAPHS])
def test_svg_is_well_formed_and_names_every_step_and_action(name: str, graph: Any) -> None:
    root = parse(to_svg(graph, title=name))
    assert root.tag == NS + "svg"
    step_names = {g.get("data-name") for g in groups(root, "step")}
    assert step_names == set(graph.steps)
    action_names = {g.get("data-name") for g in groups(root, "action")}
    assert action_names == set(graph.actions)
    texts = {t.text for t in root.iter(NS + "text")}
    assert set(graph.steps) <= texts and set(graph.actions) <= texts
    assert {g.get("data-name") for g in groups(root, "branch")} == set(graph.branches)
    initial = groups(root, "initial")
    assert [g.get("data-name") for g in initial] == [graph.steps[graph.initial_step]]
    assert len(list(initial[0].iter(NS + "rect"))) == 2          # double-framed
    assert len(groups(root, "transition")) == graph.n_transitions


@pytest.mark.parametrize(("name", "graph"), GRAPHS, ids=[n for n, _ in GRAPHS])
def test_no_two_elements_overlap(name: str, graph: Any) -> None:
    root = parse(to_svg(graph))
    boxes = element_boxes(root)
    width, height = float(root.get("width", 0)), float(root.get("height", 0))
    for who, b in boxes:
        assert b[0] >= 0 and b[2] <= width and b[1] >= 0 and b[3] <= height, who
    clashes = [(a[0], b[0]) for a, b in itertools.combinations(boxes, 2)
               if overlap(a[1], b[1])]
    assert not clashes, clashes[:5]


def test_branches_draw_single_and_double_lines() -> None:
    graph = compile_recipe(generated(12, 5), V110)
    root = parse(to_svg(graph))
    sel = groups(root, "selection")
    sim = groups(root, "simultaneous")
    assert sel and sim
    # a selection opens and closes with one line, a simultaneous branch with two each
    for g, n in ((sel[0], 2), (sim[0], 4)):
        lines = [ln for ln in g.iter(NS + "line") if ln.get("class") == "branch-line"]
        assert len(lines) == n and all(ln.get("y1") == ln.get("y2") for ln in lines)


def test_jumps_back_are_arrows_going_up() -> None:
    graph = compile_example(PACKAGED_RECIPES / "tighten_rework.json")
    root = parse(to_svg(graph))
    jumps = [p for p in root.iter(NS + "polyline") if p.get("class") == "jump"]
    assert len(jumps) == 1 and jumps[0].get("marker-end") == "url(#arrow)"
    pts = [tuple(map(float, p.split(","))) for p in jumps[0].get("points", "").split()]
    assert pts[-1][1] < pts[0][1]          # ends above where it starts


def test_text_is_escaped_and_long_text_cut() -> None:
    r = linear(2)
    r["Steps"][1]["Name"] = "S<&>\"1'"
    r["Transitions"][0]["Target"] = "S<&>\"1'"
    r["Actions"][1]["Step"] = "S<&>\"1'"
    r["Transitions"][0]["Condition"] = "job.x == '<b>&amp;' and " + " and ".join(
        f"job.k{i} == {i}" for i in range(30))
    graph = compile_recipe(r, V110)
    root = parse(to_svg(graph, title="a <title> & more"))
    assert "S<&>\"1'" in {g.get("data-name") for g in groups(root, "step")}
    cond = next(t for t in root.iter(NS + "text") if t.get("class") == "condition")
    assert cond.text and cond.text.endswith("…") and "<b>&amp;" in cond.text
    tip = groups(root, "transition")[0].find(NS + "title")
    assert tip is not None and tip.text and tip.text.endswith("job.k29 == 29")


def test_a_job_view_colours_steps_and_actions_and_adds_a_legend() -> None:
    graph = compile_example(PACKAGED_RECIPES / "axle_fit_qa.json")
    view = {"job": "J1", "scope": "cell", "status": "running",
            "active_steps": ["QaCheck", "TightenBolts"],
            "step_rounds": {"Init": 1, "Positioning": 1, "TightenBolts": 1, "QaCheck": 1},
            "actions": {"position_axle": {"phase": "done", "outcome": "completed"},
                        "tighten": {"phase": "open", "outcome": None},
                        "camera_qa": {"phase": "done", "outcome": "timeout"}}}
    root = parse(to_svg(graph, view))
    cls = {g.get("data-name"): g.get("class", "").split() for g in groups(root, "step")}
    assert "active" in cls["QaCheck"] and "active" in cls["TightenBolts"]
    assert "finished" in cls["Init"] and "finished" in cls["Positioning"]
    assert "active" not in cls["Complete"] and "finished" not in cls["Complete"]
    acts = {g.get("data-name"): g.get("class", "").split() for g in groups(root, "action")}
    assert acts["tighten"] == ["action", "active"]
    assert acts["position_axle"] == ["action", "finished"]
    assert acts["camera_qa"] == ["action", "failed"]
    assert acts["verify"] == ["action"]
    assert groups(root, "legend")
    assert any("job J1 · scope cell · running" in (t.text or "") for t in root.iter(NS + "text"))
    # without a job: no legend, nothing coloured
    plain = parse(to_svg(graph))
    assert not groups(plain, "legend") and not groups(plain, "active")


def test_the_readme_picture_is_current() -> None:
    """docs/img/axle_fit_qa.svg is what the renderer draws for the example now."""
    graph = compile_example(PACKAGED_RECIPES / "axle_fit_qa.json")
    committed = (REPO / "docs" / "img" / "axle_fit_qa.svg").read_text()
    assert committed == to_svg(graph, title="axle_fit_qa"), (
        "regenerate: sfc-host recipe diagram src/sfc_host/examples/axle_fit_qa.json "
        "--svg docs/img/axle_fit_qa.svg")


def test_branchy_recipes_compile() -> None:
    # the generator must keep producing valid recipes, or the tests above test less
    for s in range(12):
        try:
            compile_recipe(branchy(s), V110)
        except RecipeError as e:  # pragma: no cover - shows the problems
            pytest.fail(f"seed {s}: {[p.to_dict() for p in e.problems]}")


# ---- the command line -------------------------------------------------------------------

Cap = pytest.CaptureFixture[str]


def test_cli_writes_svg_to_a_file_and_to_stdout(capsys: Cap, tmp_path: Path) -> None:
    src = str(PACKAGED_RECIPES / "tighten_rework.json")
    out_file = tmp_path / "t.svg"
    rc, out, err = cli(capsys, "recipe", "diagram", src, "--svg", str(out_file))
    assert (rc, out, err) == (0, "", "")
    rc, out, _ = cli(capsys, "recipe", "diagram", src, "--svg", "-")
    assert rc == 0 and out == out_file.read_text()
    assert {g.get("data-name") for g in groups(parse(out), "step")} == {
        "Load", "Tighten", "Rework", "Unload"}
    rc, out, _ = cli(capsys, "recipe", "diagram", src)      # Mermaid stays the default
    assert rc == 0 and out.startswith("flowchart TD\n")


BAD = str(PACKAGED_RECIPES / "bad_two_initial.json")
GOOD = str(PACKAGED_RECIPES / "axle_fit_qa.json")


@pytest.mark.parametrize("argv", [
    ["--svg"],
    [],
    ["/nonexistent/recipe.json", "--svg", "-"],
    [BAD, "--svg", "-"],
    [GOOD, "--job", "J"],
    [GOOD, "--scope", "cell", "--svg", "-"],
    [GOOD, "--config", "host.toml", "--svg", "-"],
    [GOOD, "--redis", "redis://127.0.0.1:6379/0", "--svg", "-"],
    [GOOD, "--svg", "/nonexistent/folder/x.svg"],
    ["--job", "a{b", "--svg", "-"],
    ["--job", "J", "--scope", "no/slash", "--svg", "-"],
    ["--job", "J", "--svg", "-", "--config", "/nonexistent/host.toml"],
    [GOOD, "--svg", "-", "--bogus"],
], ids=["svg-no-value", "nothing", "missing-file", "bad-recipe", "job-without-svg",
        "scope-without-job", "config-without-job", "redis-without-job", "unwritable",
        "bad-job-id", "bad-scope", "missing-config", "unknown-flag"])
def test_cli_refuses_wrong_arguments_in_one_line(capsys: Cap, argv: list[str]) -> None:
    rc, out, err = cli(capsys, "recipe", "diagram", *argv)
    assert rc == 2, err
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in out + err and out == ""


def test_cli_unreachable_redis_is_one_line(capsys: Cap, tmp_path: Path) -> None:
    cfg = tmp_path / "host.toml"
    cfg.write_text('redis_url = "redis://127.0.0.1:1/0"\n')
    for flags in (["--config", str(cfg)], ["--redis", "redis://u:secret@127.0.0.1:1/0"]):
        rc, out, err = cli(capsys, "recipe", "diagram", "--job", "J", "--scope", "cell",
                           "--svg", "-", *flags)
        assert rc == 1 and out == ""    # a server out of reach: failed, not a mistake
        assert len(err.strip().splitlines()) == 1 and "cannot read from Redis" in err
        assert "secret" not in err and "127.0.0.1:1" in err


# ---- a running job ----------------------------------------------------------------------

S = "cell"


def test_cli_colours_a_running_jobs_steps(capsys: Cap, redis_url: str, tmp_path: Path
                                          ) -> None:
    """A real host runs ``axle_fit_qa``: positioning answered, tightening and the camera
    still waiting. The picture read back from Redis marks the active and finished steps."""
    cfg = tmp_path / "host.toml"
    cfg.write_text(f'redis_url = "{redis_url}"\n')
    out_file = tmp_path / "job.svg"
    results: dict[str, tuple[int, str, str]] = {}

    def draw(name: str, *argv: str) -> None:
        results[name] = cli(capsys, "recipe", "diagram", *argv, "--config", str(cfg))

    async def scenario() -> None:
        await flush(redis_url)
        st = Station(lambda c: None if c.action == "position_axle" else False)
        host = Host(quick_config(redis_url), st.sink)
        st.attach(host)
        await host.store.put_work_master(S, work_master("axle_fit_qa", "axle"))
        await host.add_scope(S)
        await host.start()
        try:
            await host.orders.store_order(S, {"JobOrderID": "A",
                                              "WorkMasterID": [{"ID": "axle"}]}, start=True)

            async def mid_run() -> bool:
                v = await host.inspect(S, "A")
                return bool(v) and v["active_steps"] == ["QaCheck", "TightenBolts"]
            await wait_until(mid_run, what="A tightening and waiting for the camera")
            # the command line runs its own event loop: a thread, while the host runs
            await asyncio.to_thread(draw, "scope", GOOD, "--job", "A", "--scope", S,
                                    "--svg", str(out_file))
            await asyncio.to_thread(draw, "found", "--job", "A", "--svg", "-")
            await asyncio.to_thread(draw, "unknown", "--job", "nope", "--svg", "-")
            await asyncio.to_thread(draw, "other", str(PACKAGED_RECIPES / "tighten_rework.json"),
                                    "--job", "A", "--svg", "-")
        finally:
            await host.aclose()

    run(scenario())
    rc, _, err = results["scope"]
    assert rc == 0, err
    root = parse(out_file.read_text())
    cls = {g.get("data-name"): g.get("class", "").split() for g in groups(root, "step")}
    assert "active" in cls["TightenBolts"] and "active" in cls["QaCheck"]
    assert "finished" in cls["Init"] and "finished" in cls["Positioning"]
    for name in ("VerifyTorque", "Complete"):
        assert not {"active", "finished"} & set(cls[name])
    acts = {g.get("data-name"): g.get("class", "").split() for g in groups(root, "action")}
    assert "finished" in acts["position_axle"] and "active" in acts["tighten"]
    assert groups(root, "legend")
    assert any((t.text or "").startswith("job A · scope cell · running")
               for t in root.iter(NS + "text"))
    # without --scope and FILE: the scope found in the registry, the job's own recipe
    rc, out, err = results["found"]
    assert rc == 0, err
    assert {g.get("data-name") for g in groups(parse(out), "active")} == {
        "TightenBolts", "QaCheck", "tighten", "camera_qa"}
    for name in ("unknown", "other"):
        rc, out, err = results[name]
        assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert "no job 'nope'" in results["unknown"][2]
    assert "not the recipe" in results["other"][2]
