"""The house plan holds: no import circle, every import in the allowed direction, the
recipe core without I/O, the package map in docs/architecture.md drawn from the code."""

from __future__ import annotations

import sys

import house_plan as plan
import pytest


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


def test_at_most_eight_modules_at_the_top_of_the_host() -> None:
    top = sorted(p.stem for p in (plan.SRC / "sfc_host").glob("*.py")
                 if p.stem not in ("__init__", "__main__"))
    assert len(top) <= 8, top


def test_the_package_map_is_drawn_from_the_code() -> None:
    if not plan.DOC.exists():
        pytest.fail("docs/architecture.md is missing")
    assert plan.drawn() == plan.mermaid(plan.room_graph()), \
        "the package map differs from the imports: python tests/house_plan.py --write"


def test_a_new_circle_is_found() -> None:
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert plan.cycles(g) == [["a", "b", "c"]]
    assert plan.reduced({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == \
        {"a": {"b"}, "b": {"c"}, "c": set()}
