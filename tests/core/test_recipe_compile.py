"""The recipe compiler: what it accepts, and every refusal rule
(docs/design.md#recipe-formats)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from helpers.recipes import (
    PACKAGED_RECIPES,
    V100,
    V110,
    chain,
    linear,
    load_reference,
    pull,
    push,
    reference_recipes_dir,
    with_,
)

from sfc_fast import Graph, Problem, RecipeError, compile_recipe
from sfc_fast.recipe import CODES


def problems(recipe: Any, schema: str = V110) -> list[Problem]:
    with pytest.raises(RecipeError) as ei:
        compile_recipe(recipe, schema)
    assert ei.value.problems, "a RecipeError always lists its problems"
    return ei.value.problems


def codes(recipe: Any, schema: str = V110) -> list[str]:
    return [p.code for p in problems(recipe, schema)]


def one(recipe: Any, code: str, path: str | None = None, schema: str = V110) -> Problem:
    found = [p for p in problems(recipe, schema) if p.code == code]
    assert found, f"expected {code}, got {codes(recipe, schema)}"
    if path is not None:
        assert path in [p.path for p in found], [p.path for p in found]
    return found[0]


# ---------------------------------------------------------------- accepted


@pytest.mark.parametrize("name", ["axle_fit_qa.json", "paint_hold_restart.json",
                                  "tighten_rework.json"])
def test_every_reference_recipe_compiles(name: str) -> None:
    wm = load_reference(name)
    g = compile_recipe(wm["data"], wm["dataschema"])
    assert g.n_steps == len(wm["data"]["Steps"])
    assert g.n_actions == len(wm["data"]["Actions"])
    assert g.dataschema == wm["dataschema"]


def test_the_data_folder_holds_exactly_the_known_reference_recipes() -> None:
    names = sorted(p.name for p in reference_recipes_dir().glob("*.json"))
    assert names == ["axle_fit_qa.json", "bad_two_initial.json", "paint_hold_restart.json",
                     "tighten_rework.json"]


@pytest.mark.parametrize("name", ["axle_fit_qa.json", "bad_two_initial.json",
                                  "paint_hold_restart.json", "tighten_rework.json"])
def test_the_packaged_examples_are_the_reference_recipes(name: str) -> None:
    """The package's examples are the reference recipes with an ID and a Description
    added: the demo and `sfc-host recipe` run what the tests check."""
    ref = load_reference(name)
    packaged = json.loads((PACKAGED_RECIPES / name).read_text(encoding="utf-8"))
    assert {k: v for k, v in packaged.items() if k not in ("ID", "Description")} == ref
    assert packaged["ID"] == name.removesuffix(".json")


def test_bad_two_initial_is_refused_with_all_its_problems() -> None:
    wm = load_reference("bad_two_initial.json")
    got = {(p.code, p.path) for p in problems(wm["data"], wm["dataschema"])}
    assert got == {
        ("SFC001", "$.Steps"),                          # two initial steps
        ("SFC003", "$.Transitions[0].Target"),          # unknown target C
        ("SFC004", "$.Actions[0].Name"),                # ':' in an action name
        ("SFC005", "$.Actions[0].TimeoutSeconds"),      # timeout 0
        ("SFC012", "$.Actions[0].HoldTypeId"),          # hold fields in a v1.0.0 recipe
        ("SFC012", "$.Actions[0].RestartTypeId"),
    }


def test_axle_graph_structure() -> None:
    wm = load_reference("axle_fit_qa.json")
    g = compile_recipe(wm["data"], wm["dataschema"])
    assert g.steps == ("Init", "Positioning", "TightenBolts", "QaCheck", "VerifyTorque",
                       "Complete")
    assert g.branches == ("FitAndQa",)
    assert g.branch_info(0) == {"name": "FitAndQa", "type": "simultaneous",
                                "paths": [["Positioning", "TightenBolts"], ["QaCheck"]]}
    kinds = {(t["source"], t["target"]): t["kind"]
             for t in (g.transition_info(i) for i in range(g.n_transitions))}
    assert kinds == {("Init", "FitAndQa"): "step", ("FitAndQa", "VerifyTorque"): "exit",
                     ("VerifyTorque", "Complete"): "step",
                     ("Positioning", "TightenBolts"): "implicit"}
    assert g.initial_step == g.step_index("Init")
    info = g.action_info(g.action_index("tighten"))
    assert info["parameters"] == {"torque_spec": "85Nm"}
    assert info["timeout_ms"] == 60_000


def test_outgoing_transitions_are_ordered_by_priority_then_document_order() -> None:
    r = linear(3)
    r["Transitions"] = [
        {"Source": "S0", "Target": "S1", "Condition": "x == 1", "Priority": 5},
        {"Source": "S0", "Target": "S2", "Condition": "x == 2", "Priority": 1},
        {"Source": "S0", "Target": "S1", "Condition": "x == 3", "Priority": 1},
    ]
    g = compile_recipe(r, V110)
    conds = [g.transition_info(t)["condition"] for t in g.outgoing(0)]
    assert conds == ["x == 2", "x == 3", "x == 1"]


def test_selection_paths_without_entry_get_a_default_entry_tried_last() -> None:
    r = {
        "Steps": [{"Name": "A", "Initial": True}, {"Name": "B"}, {"Name": "C"},
                  {"Name": "D"}],
        "Branches": [{"Name": "Sel", "Type": "selection", "Branches": [["B"], ["C"]]}],
        "Transitions": [{"Source": "A", "Target": "Sel", "Condition": "always"},
                        {"Source": "Sel", "Target": "C", "Condition": "a.ok == true"},
                        {"Source": "Sel", "Target": "D", "Condition": "always"}],
        "Actions": [push("a", "A")],
    }
    g = compile_recipe(r, V110)
    out = [g.transition_info(t) for t in g.outgoing(g.n_steps + g.branch_index("Sel"))]
    assert [(t["target"], t["kind"]) for t in out] == [("C", "entry"), ("D", "exit"),
                                                     ("B", "implicit")]


def test_a_path_step_may_end_its_path_by_targeting_its_branch() -> None:
    r = {
        "Steps": [{"Name": "A", "Initial": True}, {"Name": "T"}, {"Name": "C"},
                  {"Name": "Q"}, {"Name": "E"}],
        "Branches": [{"Name": "Par", "Type": "simultaneous",
                      "Branches": [["T", "C"], ["Q"]]}],
        "Transitions": [{"Source": "A", "Target": "Par", "Condition": "always"},
                        {"Source": "C", "Target": "T", "Condition": "c.ok == false"},
                        {"Source": "C", "Target": "Par", "Condition": "c.ok"},
                        {"Source": "Par", "Target": "E", "Condition": "always"}],
        "Actions": [push("c", "C")],
    }
    g = compile_recipe(r, V110)
    kinds = sorted(g.transition_info(t)["kind"] for t in range(g.n_transitions))
    assert kinds == ["exit", "implicit", "path", "path_end", "step"]


def test_stored_and_reset_actions_share_a_name() -> None:
    r = linear(3)
    r["Actions"] = [push("lamp", "S0", "S"), push("lamp", "S2", "R"), push("a1", "S1")]
    g = compile_recipe(r, V110)
    assert g.action_info(1)["resets"] == "lamp"
    assert g.action_index("lamp") == 0


def test_v110_fields_are_kept() -> None:
    r = linear(2)
    r["Actions"] = [
        push("a0", "S0", HoldTypeId="h", RestartTypeId="r", HoldTimeoutSeconds=5, Retries=2),
        pull("e1", "S1", "L", DurationSeconds=1.5, Match={"Subject": "{scope}/x",
                                                          "CorrelationId": "{job}"}),
    ]
    g = compile_recipe(r, V110)
    a0, e1 = g.action_info(0), g.action_info(1)
    assert (a0["hold_type_id"], a0["restart_type_id"], a0["hold_timeout_ms"],
            a0["retries"]) == ("h", "r", 5000, 2)
    assert e1["duration_ms"] == 1500
    assert e1["match"] == {"Subject": "{scope}/x", "CorrelationId": "{job}"}


def test_hold_timeout_defaults_to_the_action_timeout() -> None:
    r = linear(1)
    r["Actions"] = [push("a0", "S0", timeout=7, HoldTypeId="h")]
    assert compile_recipe(r, V110).action_info(0)["hold_timeout_ms"] == 7000


def test_data_may_be_json_text_or_bytes() -> None:
    r = linear(3)
    a = compile_recipe(r, V110)
    assert compile_recipe(json.dumps(r), V110) == a
    assert compile_recipe(json.dumps(r).encode(), V110) == a


class _Key(str):
    """A str subclass: equal to a field's name, not a str."""


def _rekey(obj: Any, make: Any) -> Any:
    if isinstance(obj, dict):
        return {make(k): _rekey(v, make) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_rekey(x, make) for x in obj]
    return obj


def test_field_names_match_by_value_whatever_the_key_objects() -> None:
    # Parsed JSON gives each distinct key of a document one object, not the literal's;
    # the compiler finds a field's key by value and remembers that object: keys that
    # are a new object each time, or str subclasses, give the same graph.
    wm = load_reference("paint_hold_restart.json")
    r, schema = wm["data"], wm["dataschema"]
    a = compile_recipe(r, schema)
    assert compile_recipe(json.dumps(r), schema) == a
    assert compile_recipe(_rekey(r, lambda k: "".join(list(k))), schema) == a
    assert compile_recipe(_rekey(r, _Key), schema) == a
    big = chain(50)
    assert compile_recipe(json.dumps(big), V110) == compile_recipe(big, V110)


def test_a_key_that_is_not_text_is_an_unknown_field_in_any_position() -> None:
    # None and numbers are never taken for a field, also after the fields were seen
    r = linear(3)
    r["Steps"][1] = {None: "x", **r["Steps"][1]}
    r["Steps"][2][7] = "y"
    r["Transitions"][0][None] = 1
    with pytest.raises(RecipeError) as e:
        compile_recipe(r, V110)
    assert {(p.code, p.path) for p in e.value.problems} == {
        ("SFC021", "$.Steps[1]"), ("SFC021", "$.Steps[2]"), ("SFC021", "$.Transitions[0]")}


def test_dataschema_without_trailing_slash_is_accepted() -> None:
    assert compile_recipe(linear(2), V110.rstrip("/")).version == "1.1.0"


# ---------------------------------------------------------------- refusals, one per rule


def test_no_initial_step_is_sfc001() -> None:
    r = linear(2)
    r["Steps"][0]["Initial"] = False
    one(r, "SFC001", "$.Steps")


def test_two_initial_steps_is_sfc001() -> None:
    r = linear(2)
    r["Steps"][1]["Initial"] = True
    assert "2 steps are marked Initial" in one(r, "SFC001").message


def test_duplicate_step_name_is_sfc002() -> None:
    r = linear(2)
    r["Steps"].append({"Name": "S1"})
    one(r, "SFC002", "$.Steps[2].Name")


def test_duplicate_action_name_is_sfc002() -> None:
    r = linear(2)
    r["Actions"].append(push("a0", "S1"))
    one(r, "SFC002", "$.Actions[2].Name")


def test_branch_named_like_a_step_is_sfc002() -> None:
    r = linear(2)
    r["Branches"] = [{"Name": "S0", "Type": "selection", "Branches": [["S1"]]}]
    one(r, "SFC002", "$.Branches[0].Name")


@pytest.mark.parametrize("field", ["Source", "Target"])
def test_transition_naming_an_unknown_step_is_sfc003(field: str) -> None:
    r = linear(2)
    r["Transitions"][0][field] = "Nowhere"
    assert "'Nowhere'" in one(r, "SFC003", f"$.Transitions[0].{field}").message


def test_action_naming_an_unknown_step_is_sfc003() -> None:
    r = linear(2)
    r["Actions"][0]["Step"] = "Nowhere"
    one(r, "SFC003", "$.Actions[0].Step")


def test_branch_path_naming_an_unknown_step_is_sfc003() -> None:
    r = linear(2)
    r["Branches"] = [{"Name": "B", "Type": "selection", "Branches": [["Nowhere"]]}]
    one(r, "SFC003", "$.Branches[0].Branches[0][0]")


@pytest.mark.parametrize("name", ["x:y", "job", "has space", "tab\there", ""])
def test_invalid_action_names(name: str) -> None:
    r = linear(1)
    r["Actions"][0]["Name"] = name
    assert codes(r)[0] in ("SFC004", "SFC013")
    if name:
        one(r, "SFC004", "$.Actions[0].Name")


@pytest.mark.parametrize("timeout", [0, -5])
def test_timeout_not_positive_is_sfc005(timeout: int) -> None:
    r = linear(1)
    r["Actions"][0]["TimeoutSeconds"] = timeout
    one(r, "SFC005", "$.Actions[0].TimeoutSeconds")


@pytest.mark.parametrize("timeout", [1.5, "10", None, True])
def test_timeout_of_wrong_type_is_refused(timeout: Any) -> None:
    r = linear(1)
    r["Actions"][0]["TimeoutSeconds"] = timeout
    assert set(codes(r)) <= {"SFC005", "SFC013"}


def test_unknown_qualifier_is_sfc006() -> None:
    r = linear(1)
    r["Actions"][0]["Qualifier"] = "X"
    one(r, "SFC006", "$.Actions[0].Qualifier")


def test_unknown_interaction_is_sfc007() -> None:
    r = linear(1)
    r["Actions"][0]["Interaction"] = "telepathy"
    one(r, "SFC007", "$.Actions[0].Interaction")


def test_empty_branch_and_empty_path_are_sfc008() -> None:
    r = linear(3)
    r["Branches"] = [{"Name": "B", "Type": "selection", "Branches": []},
                     {"Name": "C", "Type": "simultaneous", "Branches": [["S1"], []]}]
    one(r, "SFC008", "$.Branches[0].Branches")
    one(r, "SFC008", "$.Branches[1].Branches[1]")


def test_step_in_two_paths_is_sfc009() -> None:
    r = linear(3)
    r["Branches"] = [{"Name": "B", "Type": "selection", "Branches": [["S1"], ["S2"]]},
                     {"Name": "C", "Type": "selection", "Branches": [["S1"]]}]
    one(r, "SFC009", "$.Branches[1].Branches[0][0]")


def test_restart_without_hold_is_sfc010() -> None:
    r = linear(1)
    r["Actions"][0]["RestartTypeId"] = "r"
    one(r, "SFC010", "$.Actions[0].RestartTypeId")


def test_hold_timeout_without_hold_is_sfc010() -> None:
    r = linear(1)
    r["Actions"][0]["HoldTimeoutSeconds"] = 3
    one(r, "SFC010", "$.Actions[0].HoldTimeoutSeconds")


@pytest.mark.parametrize("cond,pos", [("a0.ok ==", 8), ("(a0.ok", 6), ("a0.x = 1", 5),
                                      ("1 < 2 < 3", 6), ("'open", 0), ("a0.ok &&", 6),
                                      ("nosuch.field == 1", 0), ("a0._secret", 0)])
def test_condition_that_does_not_parse_is_sfc011_with_position(cond: str, pos: int) -> None:
    r = linear(2)
    r["Transitions"][0]["Condition"] = cond
    p = one(r, "SFC011", "$.Transitions[0].Condition")
    assert f"at position {pos}" in p.message


@pytest.mark.parametrize("field,value", [("HoldTypeId", "h"), ("Retries", 1),
                                         ("HoldTimeoutSeconds", 5), ("Match", {}),
                                         ("DurationSeconds", 2), ("RestartTypeId", "r")])
def test_v110_field_in_v100_recipe_is_sfc012(field: str, value: Any) -> None:
    r = linear(1)
    r["Actions"][0][field] = value
    one(r, "SFC012", f"$.Actions[0].{field}", schema=V100)


@pytest.mark.parametrize("missing", ["Name", "Step", "Qualifier", "Interaction", "TypeId",
                                     "TimeoutSeconds"])
def test_missing_action_field_is_refused(missing: str) -> None:
    r = linear(1)
    del r["Actions"][0][missing]
    assert codes(r)


@pytest.mark.parametrize("key", ["Steps", "Transitions", "Actions"])
def test_missing_top_level_list_is_sfc013(key: str) -> None:
    r = linear(2)
    del r[key]
    one(r, "SFC013", "$")


def test_wrong_types_are_sfc013() -> None:
    r = with_(linear(2), Steps=[{"Name": 3}, "S1"])
    assert set(codes(r)) >= {"SFC013"}
    r = linear(2)
    r["Transitions"][0]["Priority"] = "high"
    one(r, "SFC013", "$.Transitions[0].Priority")
    r = linear(2)
    r["Actions"][0]["Parameters"] = [1, 2]
    one(r, "SFC013", "$.Actions[0].Parameters")


def test_unknown_dataschema_is_sfc014() -> None:
    with pytest.raises(RecipeError) as ei:
        compile_recipe(linear(2), "https://example.com/other/v9/")
    assert ei.value.codes == ["SFC014"]


@pytest.mark.parametrize("data", ["not json", b"\xff\xfe", "[1, 2]", "42", "null"])
def test_data_that_is_not_a_json_object_is_sfc014(data: Any) -> None:
    assert codes(data) == ["SFC014"]


def test_oversized_recipe_is_sfc015() -> None:
    huge = json.dumps(linear(2)) + " " * (10 * 1024 * 1024)
    assert codes(huge) == ["SFC015"]
    assert codes(huge.encode()) == ["SFC015"]


def test_oversized_parameters_are_sfc015() -> None:
    r = linear(1)
    r["Actions"][0]["Parameters"] = {"blob": "x" * (2 * 1024 * 1024)}
    one(r, "SFC015", "$.Actions[0].Parameters")


def test_reset_of_an_unknown_or_unstored_action_is_sfc016() -> None:
    r = linear(2)
    r["Actions"].append(push("ghost", "S1", "R"))
    one(r, "SFC016", "$.Actions[2].Name")
    r = linear(2)
    r["Actions"].append(push("a0", "S1", "R"))  # a0 is N, not S
    one(r, "SFC016", "$.Actions[2].Name")


def test_reset_in_the_same_step_as_its_set_is_sfc016() -> None:
    r = linear(2)
    r["Actions"] = [push("lamp", "S0", "S"), push("lamp", "S0", "R")]
    one(r, "SFC016", "$.Actions[1].Step")


@pytest.mark.parametrize("qual", ["D", "L"])
def test_d_and_l_need_a_duration_sfc017(qual: str) -> None:
    r = linear(1)
    r["Actions"][0]["Qualifier"] = qual
    one(r, "SFC017", "$.Actions[0].DurationSeconds")
    one(r, "SFC017", "$.Actions[0].DurationSeconds", schema=V100)


def test_duration_on_other_qualifiers_is_sfc017() -> None:
    r = linear(1)
    r["Actions"][0]["DurationSeconds"] = 3
    one(r, "SFC017", "$.Actions[0].DurationSeconds")


def test_duration_not_positive_is_sfc017() -> None:
    r = linear(1)
    r["Actions"][0].update(Qualifier="D", DurationSeconds=0)
    one(r, "SFC017", "$.Actions[0].DurationSeconds")


def test_fields_that_do_not_fit_the_interaction_are_sfc018() -> None:
    r = linear(2)
    r["Actions"] = [pull("e0", "S0", HoldTypeId="h"), pull("e1", "S1", Retries=2)]
    one(r, "SFC018", "$.Actions[0].HoldTypeId")
    one(r, "SFC018", "$.Actions[1].Retries")
    r = linear(1)
    r["Actions"][0]["Match"] = {"Subject": "x"}
    one(r, "SFC018", "$.Actions[0].Match")


def test_transitions_crossing_a_branch_path_are_sfc019() -> None:
    base = {
        "Steps": [{"Name": "A", "Initial": True}, {"Name": "B"}, {"Name": "C"},
                  {"Name": "D"}],
        "Branches": [{"Name": "Par", "Type": "simultaneous", "Branches": [["B", "C"]]}],
        "Transitions": [{"Source": "A", "Target": "Par", "Condition": "always"},
                        {"Source": "Par", "Target": "D", "Condition": "always"}],
        "Actions": [push("a", "A")],
    }
    compile_recipe(base, V110)
    for bad in ({"Source": "A", "Target": "C", "Condition": "always"},    # into a path
                {"Source": "B", "Target": "D", "Condition": "always"},    # out of a path
                {"Source": "Par", "Target": "C", "Condition": "always"},  # not a first step
                {"Source": "Par", "Target": "B", "Condition": "a.x"}):    # AND entry with cond
        r = with_(base)
        r["Transitions"].append(bad)
        one(r, "SFC019", "$.Transitions[2]")


def test_branch_inside_a_path_is_refused() -> None:
    r = linear(3)
    r["Branches"] = [{"Name": "Outer", "Type": "selection", "Branches": [["Inner"]]},
                     {"Name": "Inner", "Type": "selection", "Branches": [["S1"]]}]
    one(r, "SFC019", "$.Branches[0].Branches[0][0]")


def test_unknown_branch_type_is_sfc020() -> None:
    r = linear(2)
    r["Branches"] = [{"Name": "B", "Type": "parallel", "Branches": [["S1"]]}]
    one(r, "SFC020", "$.Branches[0].Type")


def test_unknown_field_is_sfc021() -> None:
    r = linear(1)
    r["Actions"][0]["Qualifer"] = "N"  # a typo must not pass silently
    one(r, "SFC021", "$.Actions[0].Qualifer")
    r = linear(1)
    r["Extra"] = 1
    one(r, "SFC021", "$.Extra")


def test_description_fields_are_allowed() -> None:
    r = linear(2)
    r["Description"] = "a recipe"
    r["Steps"][0]["Description"] = "first"
    r["Actions"][0]["Description"] = "does a thing"
    compile_recipe(r, V110)


def test_unknown_match_placeholder_is_sfc022() -> None:
    r = linear(1)
    r["Actions"] = [pull("e0", "S0", Match={"Subject": "{station}/x"})]
    one(r, "SFC022", "$.Actions[0].Match.Subject")


def test_initial_step_inside_a_path_is_sfc023() -> None:
    r = linear(2)
    r["Branches"] = [{"Name": "B", "Type": "selection", "Branches": [["S0"]]}]
    one(r, "SFC023", "$.Steps[0]")


@pytest.mark.parametrize("retries", [-1, 1.5, "2", 5000])
def test_bad_retries_are_sfc024(retries: Any) -> None:
    r = linear(1)
    r["Actions"][0]["Retries"] = retries
    one(r, "SFC024", "$.Actions[0].Retries")


def test_every_problem_is_reported_at_once() -> None:
    r = linear(3)
    r["Steps"][1]["Initial"] = True                      # SFC001
    r["Actions"][0]["Qualifier"] = "Q"                   # SFC006
    r["Actions"][1]["TimeoutSeconds"] = 0                # SFC005
    r["Transitions"][1]["Condition"] = "(("              # SFC011
    r["Transitions"][0]["Target"] = "Gone"               # SFC003
    assert sorted(codes(r)) == ["SFC001", "SFC003", "SFC005", "SFC006", "SFC011"]


def test_every_code_has_a_description() -> None:
    assert sorted(CODES) == [f"SFC{i:03d}" for i in range(1, 25)]


def test_recipe_error_message_names_the_first_problem_and_the_count() -> None:
    wm = load_reference("bad_two_initial.json")
    with pytest.raises(RecipeError) as ei:
        compile_recipe(wm["data"], wm["dataschema"])
    assert str(ei.value).startswith("SFC001 $.Steps:")
    assert "and 5 more problems" in str(ei.value)


def test_graph_cannot_be_built_directly() -> None:
    with pytest.raises(TypeError):
        Graph()
