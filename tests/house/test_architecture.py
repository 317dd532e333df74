"""The house plan holds: no import circle, every import in the allowed direction, the
recipe core without I/O, the package map in docs/architecture.md drawn from the code."""

from __future__ import annotations

import ast
import re
import sys

import pytest
from helpers import house_plan as plan


def test_no_module_imports_itself_back() -> None:
    found = plan.cycles(plan.graph())
    assert not found, "import circles: " + "; ".join(" <-> ".join(c) for c in found)


def test_the_allowed_directions_have_no_circle() -> None:
    assert not plan.cycles(plan.ALLOWED)


def test_every_import_goes_an_allowed_direction() -> None:
    g = plan.graph()
    wrong = sorted(f"{m} imports {d} ({plan.room(m)} -> {plan.room(d)})"
                   for m, deps in g.items() for d in deps
                   if plan.room(d) != plan.room(m)
                   and plan.room(d) not in plan.ALLOWED.get(plan.room(m), set()))
    assert not wrong, "\n".join(wrong)


def test_every_room_is_in_the_plan() -> None:
    rooms = {plan.room(m) for m in plan.modules()}
    assert rooms <= set(plan.ALLOWED), f"rooms missing in ALLOWED: {rooms - set(plan.ALLOWED)}"


def test_the_recipe_core_imports_no_client_library() -> None:
    wrong = {m: sorted(bad) for m, path in plan.modules().items() if plan.room(m) == "core"
             and (bad := plan.third_party(path) - set(sys.stdlib_module_names)
                  - plan.CORE_THIRD_PARTY)}
    assert not wrong, wrong


def test_no_module_is_named_like_a_standard_library_module() -> None:
    clash = sorted(m for m in plan.modules()
                   if m.rpartition(".")[2] in sys.stdlib_module_names)
    assert not clash, clash


def test_at_most_nine_modules_at_the_top_of_the_host() -> None:
    top = sorted(p.stem for p in (plan.SRC / "sfc_host").glob("*.py")
                 if p.stem not in ("__init__", "__main__"))
    assert len(top) <= 9, top


def test_the_packages_with_a_face_are_the_planned_ones() -> None:
    """A package has one public surface: a face (``__all__``) the code outside imports
    through, or none, and then its ``__init__.py`` is its map and nothing else."""
    declared = {p for p, path in plan.packages().items() if plan.face(path) is not None}
    assert declared == plan.FACES, f"faces not in FACES: {sorted(declared - plan.FACES)}; " \
        f"FACES without __all__: {sorted(plan.FACES - declared)}"
    maps = sorted(p for p, path in plan.packages().items() if p not in plan.FACES
                  and any(not isinstance(n, ast.Expr) for n in ast.parse(path.read_text(
                      encoding="utf-8")).body))
    assert not maps, f"a package without a face holds only its docstring: {maps}"


def test_the_code_outside_a_face_imports_through_it() -> None:
    wrong = plan.around_faces()
    assert not wrong, "\n".join(wrong)


def test_the_package_map_is_drawn_from_the_code() -> None:
    if not plan.DOC.exists():
        pytest.fail("docs/architecture.md is missing")
    assert plan.drawn() == plan.mermaid(plan.room_graph()), \
        "the package map differs from the imports: python tests/helpers/house_plan.py --write"


def test_a_new_circle_is_found() -> None:
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert plan.cycles(g) == [["a", "b", "c"]]
    assert plan.reduced({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == \
        {"a": {"b"}, "b": {"c"}, "c": set()}


# ---------------------------------------------------------------- the prose


def _section(title: str) -> str:
    text = plan.DOC.read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else len(text)]


def _rooms_named(text: str) -> set[str]:
    """The rooms a piece of prose names in backticks: `store`, `store/`, or a module's
    dotted name (`sfc_fast.wire.otlp` is the room `wire`)."""
    out = set()
    for name in re.findall(r"`([\w.]+)/?`", text):
        out.add(plan.room(name) if name.startswith(("sfc_fast.", "sfc_host.")) else name)
    return out


def _clause(text: str) -> str:
    """What a claim names: up to the first colon, semicolon or full stop, asides in
    parentheses left out."""
    return re.split(r"[:;]|\.(?:\s|$)", re.sub(r"\([^)]*\)", "", text), maxsplit=1)[0]


def may_import_list() -> dict[str, set[str]]:
    """Room -> what the list under "What each room may import" says it may import."""
    body = _section("What each room may import")
    bullets = re.findall(r"^- (.*?)(?=\n- |\n\n|\Z)", body, flags=re.M | re.S)
    out: dict[str, set[str]] = {}
    for bullet in (" ".join(b.split()) for b in bullets):
        subject, verb, rest = bullet.partition(" may import ")
        assert verb, f"a bullet that is not '`room` may import ...': {bullet!r}"
        said = set() if rest.startswith("nothing of ours") else _rooms_named(_clause(rest))
        for r in re.findall(r"`(\w+)`", subject):
            assert r not in out, f"{r} has two bullets"
            out[r] = said
    return out


def code_rooms() -> set[str]:
    return {plan.room(m) for m in plan.modules()}


def test_the_prose_lists_every_room_with_what_the_table_allows() -> None:
    said = may_import_list()
    missing = sorted((set(plan.ALLOWED) | code_rooms()) - set(said))
    assert not missing, f"rooms docs/architecture.md does not list: {missing}"
    forbidden = sorted(f"{r} -> {d}" for r, ds in said.items()
                       for d in ds - plan.ALLOWED.get(r, set()))
    assert not forbidden, f"imports the prose names and ALLOWED forbids: {forbidden}"
    left_out = sorted(f"{r} -> {d}" for r, ds in plan.ALLOWED.items()
                      for d in ds - said.get(r, set()))
    assert not left_out, f"imports ALLOWED has and the prose leaves out: {left_out}"


def contradictions(text: str) -> list[str]:
    """Every sentence of ``text`` that says what a room imports ("`x` never imports",
    "imports nothing of ours", "knows only", "only imports", "imports") and that the
    table contradicts."""
    text = " ".join(text.split())
    rooms = set(plan.ALLOWED) | code_rooms()
    wrong = []
    for m in re.finditer(r"`(\w+)/?` (never imports|imports nothing of ours|knows only|"
                         r"only imports|imports)\b", text):
        r, verb = m.group(1), m.group(2)
        if r not in rooms:
            continue
        allowed = plan.ALLOWED.get(r, set())
        named = _rooms_named(_clause(text[m.end():])) & rooms
        if verb == "never imports" and named & allowed:
            wrong.append(f"says {r} never imports {sorted(named & allowed)}; ALLOWED has it")
        elif verb == "imports nothing of ours" and allowed:
            wrong.append(f"says {r} imports nothing of ours; ALLOWED: {sorted(allowed)}")
        elif verb in ("knows only", "only imports") and allowed - named:
            wrong.append(f"says {r} imports only {sorted(named)}; ALLOWED also "
                         f"{sorted(allowed - named)}")
        if verb in ("imports", "knows only", "only imports") and named - allowed:
            wrong.append(f"says {r} imports {sorted(named - allowed)}; ALLOWED forbids it")
    return wrong


def test_no_sentence_of_the_prose_contradicts_the_table() -> None:
    wrong = contradictions(plan.DOC.read_text(encoding="utf-8"))
    assert not wrong, "\n".join(wrong)


def test_a_sentence_against_the_table_is_caught() -> None:
    """What the prose once said wrongly is found; what the table allows is not."""
    assert len(contradictions("`tracing` imports nothing of ours. `engine` knows only "
                              "`core`, `mqtt` and `config`. `store` never imports "
                              "`tracing`.")) == 4
    assert contradictions("`tracing` imports `wire` (`sfc_fast.wire.otlp`). `mqtt` never "
                          "imports `config` nor `store`.") == []


def test_the_prose_names_every_room_and_module() -> None:
    table = _section("The rooms of `sfc_host`")
    rows = {}
    for line in table.splitlines():
        cells = line.split("|")
        if len(cells) > 2 and "`" in cells[1]:
            for r in re.findall(r"`(\w+)/?`", cells[1]):
                rows[r] = cells[2]
    host_rooms = {plan.room(m) for m in plan.modules() if m.startswith("sfc_host")}
    assert not host_rooms - set(rows), \
        f"rooms without a row in 'The rooms of sfc_host': {sorted(host_rooms - set(rows))}"
    packages = _section("Two packages")
    missing = []
    for m, path in plan.modules().items():
        parts = m.split(".")
        if path.name == "__init__.py":
            continue                    # a package's face: its room is named
        if parts[0] == "sfc_host" and len(parts) > 2:
            if f"`{parts[-1]}`" not in rows[parts[1]]:
                missing.append(f"{m} (in the row of {parts[1]})")
        elif parts[0] == "sfc_fast" and len(parts) > 1 and f"`{parts[-1]}`" not in packages:
            missing.append(f"{m} (under 'Two packages')")
    assert not missing, "modules docs/architecture.md does not name: " + ", ".join(missing)
