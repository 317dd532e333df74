"""Bad input, fuzzed: every decoder the host has takes any input and either accepts it or
refuses it with its documented error (a clear message), in bounded time.

Decoders: the recipe compiler (``RecipeError``), the condition parser
(``ConditionSyntaxError``), the CloudEvent decoder (``CloudEventError``) and the answer
reading after it (a reason string), the work stream entry parser (``InvalidEntry``) and
the state decoder (``StateFormatError``). Then the host itself, with real redis-server
and mosquitto: wrong answers, unknown ids, events nobody waits for, malformed and
oversized payloads on every subscribed topic, wrong scopes, a Work Master replaced while
its jobs run; after each the host still completes a job and the counter moved.

``FUZZ_EXAMPLES=N`` runs every property with N examples (CI keeps the small defaults);
``benchmarks/fuzz.py`` runs a million direct inputs per decoder.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
import os
import random
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest
from helpers.aio import run
from helpers.hosts import Station, flush, quick_config, quiet, torque_ok, wait_until, work_master
from helpers.mqtt_station import MqttStation
from helpers.recipes import load_reference
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from sfc_fast import (
    Graph,
    RecipeError,
    compile_recipe,
    evolve,
    evolve_many,
    job_index,
    open_command,
    state_to_json,
)
from sfc_fast.conditions import CondBuilder, ConditionSyntaxError, evaluate
from sfc_fast.events import Completed, Hold, Tick
from sfc_fast.evolve import sent_markers
from sfc_fast.state import StateFormatError, check_state
from sfc_host.equipment.mqtt_transport import answer_event
from sfc_host.execution.host import Host
from sfc_host.mqtt.cloudevents import CloudEventError, decode
from sfc_host.service.app import App
from sfc_host.store.keys import ScopeKeys
from sfc_host.store.streams import InvalidEntry, parse_entry

FUZZ_EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES") or 0)
SLOW_S = 1.0          # no single input may take longer (a hang shows as a failure)


def fuzz(n: int) -> Callable[[Any], Any]:
    """Hypothesis settings: ``n`` examples in CI, ``FUZZ_EXAMPLES`` when set."""
    return settings(max_examples=FUZZ_EXAMPLES or n, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])


def refused_or_accepted(error: type[Exception], fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``: its value, or None when it raised ``error`` with a message; any
    other exception fails the test, and so does a call slower than ``SLOW_S``."""
    t0 = time.perf_counter()
    try:
        return fn(*args)
    except error as e:
        assert str(e).strip(), f"{type(e).__name__} without a message"
        assert len(str(e)) < 2000, f"a message of {len(str(e))} characters"
        return None
    finally:
        assert time.perf_counter() - t0 < SLOW_S, f"{fn.__name__} took over {SLOW_S} s"


json_leaf = (st.none() | st.booleans() | st.integers(-(2**70), 2**70)
             | st.floats(allow_nan=False) | st.text(max_size=12))
json_values = st.recursive(
    json_leaf, lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=10), inner, max_size=4), max_leaves=20)

REFERENCES = ["tighten_rework.json", "axle_fit_qa.json", "paint_hold_restart.json"]


# ------------------------------------------------------------------ the recipe compiler

def _walk(node: Any, path: list[int]) -> tuple[Any, Any] | None:
    """The container and key at the end of a walk by indices (into dict keys or list
    items), or None when the walk ends at a leaf first."""
    parent, key = None, None
    for i in path:
        if isinstance(node, dict) and node:
            parent, key = node, sorted(node)[i % len(node)]
        elif isinstance(node, list) and node:
            parent, key = node, i % len(node)
        else:
            break
        node = parent[key]
    return None if parent is None else (parent, key)


@st.composite
def mutated_references(draw: st.DrawFn) -> tuple[Any, str]:
    """A reference recipe with a few edits: a value replaced by any JSON, a member
    deleted, a list item duplicated, a subtree moved to another place."""
    wm = load_reference(draw(st.sampled_from(REFERENCES)))
    data = copy.deepcopy(wm["data"])
    for _ in range(draw(st.integers(1, 4))):
        at = _walk(data, draw(st.lists(st.integers(0, 50), min_size=1, max_size=5)))
        if at is None:
            continue
        parent, key = at
        op = draw(st.sampled_from(["set", "delete", "dup", "graft"]))
        if op == "set":
            parent[key] = draw(json_values)
        elif op == "delete":
            del parent[key]
        elif op == "dup" and isinstance(parent, list):
            parent.insert(key, copy.deepcopy(parent[key]))
        elif op == "graft":
            other = _walk(data, draw(st.lists(st.integers(0, 50), min_size=1, max_size=5)))
            if other is not None and other[0] is not parent:
                parent[key] = copy.deepcopy(other[0][other[1]])
    return data, wm["dataschema"]


@fuzz(300)
@given(mutated_references())
def test_mutated_reference_recipes_compile_or_are_refused(case: tuple[Any, str]) -> None:
    data, schema = case
    g = refused_or_accepted(RecipeError, compile_recipe, data, schema)
    if g is not None:
        assert Graph.from_bytes(g.to_bytes()) == g


@fuzz(200)
@given(st.sampled_from(REFERENCES), st.data())
def test_damaged_recipe_text_compiles_or_is_refused(name: str, data: st.DataObject) -> None:
    wm = load_reference(name)
    text = bytearray(json.dumps(wm["data"]).encode())
    for _ in range(data.draw(st.integers(1, 6))):
        i = data.draw(st.integers(0, len(text) - 1))
        op = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        if op == "flip":
            text[i] ^= 1 << data.draw(st.integers(0, 7))
        elif op == "cut":
            del text[i:]
            if not text:
                break
        else:
            text[i:i] = data.draw(st.binary(min_size=1, max_size=8))
    refused_or_accepted(RecipeError, compile_recipe, bytes(text), wm["dataschema"])
    refused_or_accepted(RecipeError, compile_recipe, text.decode("utf-8", "replace"),
                        wm["dataschema"])


# ------------------------------------------------------------------ the condition parser

TOKENS = ["a0", "a1", "job", "torque_ok", ".", "x", "y", "_round", "_outcome", "__class__",
          "__import__", "(", ")", "[", "]", ",", "==", "!=", "<", "<=", ">", ">=", "=", "!",
          "and", "or", "not", "in", "'s'", '"t"', "'", '"', "\\", "1", "-", "-1.5", "1e3",
          "1e999", "9" * 30, ".5", "0x1f", "lambda", ":", "true", "false", "null", "None",
          "always", "**", "%", "+", "@", "#", "{", "}", "é", "\x00", "\ud800", " ", "\n"]
condition_texts = (st.lists(st.sampled_from(TOKENS), max_size=24).map(" ".join)
                   | st.lists(st.sampled_from(TOKENS), max_size=24).map("".join)
                   | st.text(max_size=60))


@fuzz(400)
@given(condition_texts, json_values, json_values)
def test_any_condition_compiles_or_is_refused_and_evaluates_to_a_bool(
        text: str, result: Any, param: Any) -> None:
    builder = CondBuilder({"a0": 0, "a1": 1})
    if refused_or_accepted(ConditionSyntaxError, builder.add, text) is None:
        return
    value = evaluate(text, results={"a0": {"x": result}, "a1": result},
                     rounds={"a0": 2}, outcomes={"a1": "completed"},
                     params={"x": param, "y": [param]}, bare=[{"torque_ok": result}])
    assert isinstance(value, bool)


@fuzz(200)
@given(condition_texts)
def test_a_refused_condition_is_a_recipe_error_naming_the_transition(text: str) -> None:
    wm = load_reference("tighten_rework.json")
    wm["data"]["Transitions"][1]["Condition"] = text
    try:
        CondBuilder({"load_part": 0, "tighten": 1, "loosen": 2, "unload_part": 3}).add(text)
        return          # the compiler may still refuse it for another reason
    except ConditionSyntaxError:
        pass
    with pytest.raises(RecipeError) as e:
        compile_recipe(wm["data"], wm["dataschema"])
    assert any(p.code == "SFC011" and p.path == "$.Transitions[1].Condition"
               for p in e.value.problems)


@pytest.mark.parametrize(("text", "message"), [
    ("1e999", "out of range"), ("tighten.torque > -1e400", "out of range"),
    ("9" * 5000, "longer than 64"), ("1" + "0" * 19, "out of range"),
    ("__import__", "reserved"), ("job.__class__", "reserved"),
])
def test_conditions_found_by_fuzzing_are_recipe_errors(text: str, message: str) -> None:
    """Inputs fuzzing found: 1e999 (inf) is a recipe error, not a plain ValueError out of
    compile_recipe, and a 5000-digit number is not repeated whole in the message."""
    with pytest.raises(ConditionSyntaxError, match=message):
        CondBuilder({"tighten": 0}).add(text)
    wm = load_reference("tighten_rework.json")
    wm["data"]["Transitions"][1]["Condition"] = text
    with pytest.raises(RecipeError) as e:
        compile_recipe(wm["data"], wm["dataschema"])
    [p] = e.value.problems
    assert p.code == "SFC011" and message in p.message and len(p.message) < 300


# ------------------------------------------------------------------ the CloudEvent decoder

PROPERTY_IDS = [1, 2, 3, 8, 9, 11, 35, 38]   # the PUBLISH properties paho unpacks


@st.composite
def wire_properties(draw: st.DrawFn) -> bytes:
    """PUBLISH properties as a broker would send them, often malformed."""
    body = bytearray()
    for _ in range(draw(st.integers(0, 6))):
        pid = draw(st.sampled_from(PROPERTY_IDS) | st.integers(0, 255))
        body.append(pid)
        if pid == 38:      # user property: two length-prefixed strings
            for _ in range(2):
                s = draw(st.sampled_from([b"specversion", b"1.0", b"id", b"type", b"source",
                                          b"causationid", b"J:a#1"]) | st.binary(max_size=8))
                body += len(s).to_bytes(2, "big") + s
        else:
            body += draw(st.binary(max_size=12))
    if draw(st.booleans()):
        return bytes([len(body)]) + bytes(body) if len(body) < 128 else b"\x00"
    return draw(st.binary(max_size=40))


@fuzz(300)
@given(wire_properties(), st.binary(max_size=200) | json_values.map(
    lambda v: json.dumps(v).encode()))
def test_cloudevent_from_wire_properties_decodes_or_is_refused(raw: bytes,
                                                               payload: bytes) -> None:
    props = Properties(PacketTypes.PUBLISH)
    try:
        props.unpack(raw)           # paho's own parsing: a broker never sends worse
    except Exception:
        props = None
    ev = refused_or_accepted(CloudEventError, decode, payload, props)
    if ev is not None:
        meaning = answer_event(ev)
        assert isinstance(meaning, str) or hasattr(meaning, "command_id")


answer_data = st.fixed_dictionaries({}, optional={
    "Outcome": st.sampled_from(["completed", "failed", "held", "not_held", "maybe", ""])
    | json_values,
    "Result": json_values, "Reason": json_values})


@fuzz(300)
@given(answer_data | json_values, st.text(max_size=700) | st.none(),
       st.binary(max_size=20) | st.none())
def test_answer_reading_gives_an_event_or_a_reason(data: Any, cause: str | None,
                                                   corr: bytes | None) -> None:
    obj: dict[str, Any] = {"specversion": "1.0", "id": "1", "source": "s", "type": "t",
                           "data": data}
    if cause is not None:
        obj["causationid"] = cause
    props = Properties(PacketTypes.PUBLISH)
    if corr is not None:
        props.CorrelationData = corr
    ev = refused_or_accepted(CloudEventError, decode, json.dumps(obj).encode(), props)
    if ev is None:
        return
    meaning = answer_event(ev)
    if isinstance(meaning, str):
        assert meaning
    else:
        assert 0 < len(meaning.command_id) <= 600


# ------------------------------------------------------------------ the stream entry parser

FIELD_NAMES = [b"k", b"j", b"a", b"c", b"t", b"s", b"r", b"d"]
FIELD_VALUES = [b"start", b"cancel", b"hold", b"release", b"tick", b"resume", b"event",
                b"job", b"dispatch:tighten", b"dispatch:", b"J1", b"a{b}", b"J#1", b"Run",
                b"Complete", b"Abort", b"-5", b"12", b"9" * 30, b"1_0", b"\xff\xfe", b"",
                b'{"a": 1}', b"[1]", b"NaN", b'{"x": ' + b"1" * 5000 + b"}", b"[" * 5000,
                b"J:tighten#1", b"J1\nJ2", b"J1\n", b"\n".join([b"J"] * 5000)]
field_maps = st.dictionaries(
    st.sampled_from(FIELD_NAMES) | st.binary(max_size=4),
    st.sampled_from(FIELD_VALUES) | st.binary(max_size=40)
    | json_values.map(lambda v: json.dumps(v).encode()), max_size=6)


@fuzz(500)
@given(field_maps)
def test_any_stream_entry_parses_or_is_refused(fields: dict[bytes, bytes]) -> None:
    e = refused_or_accepted(InvalidEntry, parse_entry, "line1", b"1-0", fields)
    if e is not None:
        assert e.kind in ("start", "cancel", "hold", "release", "tick", "resume", "event",
                          "job", "dispatch")
        assert e.kind == "event" or e.job
        if e.kind == "tick":
            assert e.jobs and e.jobs[0] == e.job and all(e.jobs)


@pytest.mark.parametrize(("fields", "message"), [
    ({b"k": b"dispatch:a", b"c": b"x", b"j": b"a{b}"}, "invalid job id"),
    ({b"k": b"event", b"t": b"x", b"d": b'{"n": ' + b"1" * 5000 + b"}"}, "not JSON"),
    ({b"k": b"event", b"t": b"x", b"d": b'{"n": NaN}'}, "not JSON"),
    ({b"k": b"tick", b"j": b"J1\n\nJ2"}, "invalid job id ''"),
    ({b"k": b"tick", b"j": b"\n".join([b"J"] * 5000)}, "tick entry with 5000 jobs"),
    ({b"k": b"x" * 100_000}, "unknown kind"),
    ({b"k": b"start", b"j": b"J" * 100_000}, "invalid job id"),
])
def test_entries_found_by_fuzzing_are_invalid_entries_with_short_messages(
        fields: dict[bytes, bytes], message: str) -> None:
    """Inputs fuzzing found: a bad job id of a dispatch entry and a 5000-digit number in
    event data are invalid entries, not plain ValueErrors; a megabyte field is not
    repeated whole in the message; a tick's job list is checked job by job and bounded."""
    with pytest.raises(InvalidEntry) as e:
        parse_entry("line1", b"1-0", fields)
    assert message in str(e.value) and len(str(e.value)) < 300


# ------------------------------------------------------------------ the state decoder

def _load_benchmark() -> Any:
    """benchmarks/fuzz.py as a module: its real states serve here too."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "fuzz.py"
    spec = importlib.util.spec_from_file_location("bench_fuzz", path)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    sys.modules["bench_fuzz"] = bench           # its dataclasses look themselves up
    spec.loader.exec_module(bench)
    return bench


BENCH = _load_benchmark()
# real states of the reference recipes at several points of a run: started, with
# results, waiting for events, held, ended
STATES: list[tuple[Graph, bytes]] = BENCH.real_states()


def _readable(g: Graph, blob: bytes) -> bool:
    check_state(g, blob)
    return True


def _decode_all(g: Graph, blob: bytes) -> None:
    """Every reader of a state document: each refuses garbage with StateFormatError."""
    if refused_or_accepted(StateFormatError, _readable, g, blob) is None:
        for fn, args in ((state_to_json, (g, blob)), (job_index, (g, blob)),
                         (sent_markers, (g, blob)), (open_command, (g, blob, g.actions[0])),
                         (evolve, (g, blob, Tick(), 10**6))):
            with pytest.raises(StateFormatError):
                fn(*args)
        assert isinstance(evolve_many(g, [blob], Tick(), 10**6)[0], StateFormatError)
        return
    # accepted: every reader works on it, and evolving it gives a decision
    refused_or_accepted(StateFormatError, state_to_json, g, blob)
    refused_or_accepted(StateFormatError, job_index, g, blob)
    refused_or_accepted(StateFormatError, sent_markers, g, blob)
    for a in g.actions:
        refused_or_accepted(StateFormatError, open_command, g, blob, a)
    for ev in (Tick(), Completed("J1:tighten#2", {"torque": 85}), Hold()):
        refused_or_accepted(StateFormatError, evolve, g, blob, ev, 10**6)


@fuzz(300)
@given(st.integers(0, len(STATES) - 1), st.data())
def test_damaged_real_states_are_refused_or_read(k: int, data: st.DataObject) -> None:
    g, state = STATES[k]
    blob = bytearray(state)
    op = data.draw(st.sampled_from(["truncate", "flip", "insert", "delete"]))
    if op == "truncate":
        del blob[data.draw(st.integers(0, len(blob) - 1)):]
    elif op == "flip":
        for _ in range(data.draw(st.integers(1, 3))):
            blob[data.draw(st.integers(8 if data.draw(st.booleans()) else 0,
                                       len(blob) - 1))] ^= 1 << data.draw(st.integers(0, 7))
    elif op == "insert":
        i = data.draw(st.integers(16, len(blob)))
        blob[i:i] = data.draw(st.binary(min_size=1, max_size=8))
    else:
        i = data.draw(st.integers(16, len(blob) - 1))
        del blob[i:i + data.draw(st.integers(1, 8))]
    if op == "flip" and bytes(blob[8:16]) != state[8:16]:
        blob[8:16] = state[8:16]        # keep the fingerprint: reach the body's decoder
    _decode_all(g, bytes(blob))


@fuzz(200)
@given(st.integers(0, len(STATES) - 1), st.binary(max_size=300), st.booleans())
def test_random_state_bytes_are_refused(k: int, tail: bytes, with_header: bool) -> None:
    g, state = STATES[k]
    _decode_all(g, (state[:16] if with_header else b"") + tail)


def test_every_truncation_and_every_bit_flip_of_a_state() -> None:
    """Exhaustive over one mid-run state of each recipe: no reader crashes."""
    for g, state in STATES[1::6]:
        for n in range(len(state)):
            _decode_all(g, state[:n])
        for i in range(16, len(state)):
            for bit in range(8):
                blob = bytearray(state)
                blob[i] ^= 1 << bit
                _decode_all(g, bytes(blob))


# ------------------------------------------------------------------ the host, end to end

S = "line1"
K = ScopeKeys(S)
TIGHTEN = "com.example.cell.tighten.v1"
WM_TYPE = "com.github.aschamberger.ISA95-JOBCONTROL_V2.config.workmaster.v1"


async def start_app(redis_url: str, mqtt_url: str, **kw: Any) -> App:
    await flush(redis_url)
    app = App(quick_config(redis_url, mqtt_url=mqtt_url, mqtt_max_payload=4096, **kw))
    await app.host.store.put_work_master(S, work_master("tighten_rework", "wm"))
    await app.host.add_scope(S)
    await app.start()
    return app


async def ended(app: App, *jobs: str) -> bool:
    for j in jobs:
        o = await app.host.orders.get(S, j)
        if not o or o["state"] != "Ended_Completed":
            return False
    return True


async def still_serves(app: App, job: str) -> None:
    """A fresh job runs to its end: the host kept serving."""
    await app.host.orders.store_order(S, {"JobOrderID": job,
                                          "WorkMasterID": [{"ID": "wm"}]}, start=True)
    await wait_until(lambda: ended(app, job), 15, f"{job} completed")


def no_faults(app: App) -> None:
    """Bad input is refused where it arrives: no loop or handler ever failed on it."""
    faults = {k: v for k, v in app.metrics.snapshot().items()
              if v and (k.startswith("loop_errors") or k in ("mqtt_handler_errors",
                                                              "answer_errors"))}
    assert not faults, faults


def held_tighten(hold: set[str]) -> Callable[[dict[str, Any]], dict[str, Any] | None]:
    """A station answer: the jobs in ``hold`` get no answer to their tightening."""
    def answer(cmd: dict[str, Any]) -> dict[str, Any] | None:
        if cmd["type"] == TIGHTEN:
            if cmd["correlationid"] in hold:
                return None
            return {"Outcome": "completed", "Result": {"torque": 85}}
        return {}
    return answer


async def tightenings_held(app: App, st: MqttStation, jobs: tuple[str, str]) -> None:
    """Store and start ``jobs`` and wait until each tightening went out (unanswered)."""
    for j in jobs:
        await app.host.orders.store_order(S, {"JobOrderID": j,
                                              "WorkMasterID": [{"ID": "wm"}]}, start=True)
    await wait_until(lambda: {f"{j}:tighten#2" for j in jobs} <= set(st.ids()),
                     10, "the tightenings sent")


async def counted(app: App, name: str, before: int, n: int = 1) -> None:
    await wait_until(lambda: app.metrics[name] >= before + n, 10,
                     f"{name} up by {n} (was {before}, is {app.metrics[name]})")


def test_wrong_answers_unknown_ids_and_events_nobody_waits_for(
        redis_url: str, mqtt_url: str) -> None:
    async def main() -> None:
        app = await start_app(redis_url, mqtt_url)
        try:
            async with MqttStation(mqtt_url, held_tighten({"A", "B"})) as st:
                await tightenings_held(app, st, ("A", "B"))
                await asyncio.sleep(0.1)
                before = await app.host.inspect(S, "A")
                assert before is not None
                responses = f"equipment/{S}/responses"

                # B's station names A's commands that are not open: absorbed, A unchanged
                m = app.metrics["answers_absorbed"]
                for cid, data in (("A:load_part#1", {"Result": {"torque": 1}}),
                                  ("A:tighten#1", {}), ("A:tighten#3", {}),
                                  ("A:tighten#2:hold", {"Outcome": "held"}),
                                  ("A:unload_part#4", {}), ("A:nosuch#2", {})):
                    await st.publish(responses, "x.answer", data, causationid=cid)
                await counted(app, "answers_absorbed", m, 6)
                # A's open command named on another scope's topic: no such job there
                m = app.metrics["answers_unknown_job"]
                await st.publish("equipment/line2/responses", "x.answer",
                                 {"Result": {"torque": 1}}, causationid="A:tighten#2")
                await counted(app, "answers_unknown_job", m)
                after = await app.host.inspect(S, "A")
                assert after == before          # version, markers, every action as it was

                # unknown command ids: no job in them, an unknown job, too long
                m_id, m_job, m_bad = (app.metrics["answers_unknown_id"],
                                      app.metrics["answers_unknown_job"],
                                      app.metrics["bad_answers"])
                for cid in ("no-hash", "#1", "ghost:tighten#2", "gh{o}st:a#1"):
                    await st.publish(responses, "x.answer", {}, causationid=cid)
                await st.publish(responses, "x.answer", {}, causationid="J" * 700 + ":a#1")
                await counted(app, "answers_unknown_id", m_id, 2)
                await counted(app, "answers_unknown_job", m_job, 2)
                await counted(app, "bad_answers", m_bad)

                # events no job waits for: counted, nothing queued
                m = app.metrics["events_unmatched"]
                for topic in (f"equipment/{S}/events", "equipment/line2/events"):
                    await st.publish(topic, "com.example.nobody.v1", {"x": 1}, subject=S,
                                     correlationid="A")
                await counted(app, "events_unmatched", m, 2)
                entries = await app.host.client.xrange(K.work)
                assert not [f for _, f in entries if f.get(b"k") == b"event"]
                assert await inspect_equal(app, "A", before)

                # the right answers still finish both jobs; a new one runs through
                for c in list(st.commands):
                    if c["type"] == TIGHTEN:
                        await st.reply(c, {"Result": {"torque": 85}})
                await wait_until(lambda: ended(app, "A", "B"), 15, "A and B completed")
                await still_serves(app, "C")
            no_faults(app)
        finally:
            await app.aclose()
    run(main())


async def inspect_equal(app: App, job: str, view: dict[str, Any]) -> bool:
    return await app.host.inspect(S, job) == view


def _props(**kw: Any) -> Properties:
    p = Properties(PacketTypes.PUBLISH)
    for k, v in kw.items():
        setattr(p, k, v)
    return p


def _binary(user: list[tuple[str, str]]) -> Properties:
    return _props(ContentType="application/json", UserProperty=user)


CE = [("specversion", "1.0"), ("id", "x1"), ("source", "fuzz"), ("type", "t.v1")]
BAD_MESSAGES: list[tuple[str, bytes, Properties | None]] = [
    ("oversized", b'{"specversion": "1.0", "pad": "' + b"x" * 5000 + b'"}', None),
    ("oversized binary", b"[" + b"1," * 3000 + b"1]", _binary(CE)),
    ("not JSON", b"{not json", None),
    ("not UTF-8", b"\xff\xfe\x00", None),
    ("deeply nested", b"[" * 3000 + b"]" * 3000, None),
    ("deep binary data", b"[" * 2000 + b"]" * 2000, _binary(CE)),
    ("a JSON array", b"[1, 2]", None),
    ("null", b"null", None),
    ("empty", b"", None),
    ("no specversion", b'{"id": "1", "source": "s", "type": "t"}', None),
    ("specversion 0.3", b'{"specversion": "0.3", "id": "1", "source": "s", "type": "t"}', None),
    ("binary without id", b"{}", _binary([("specversion", "1.0"), ("source", "s"),
                                          ("type", "t")])),
    ("an attribute twice", b"{}", _binary([*CE, ("id", "x2")])),
    ("bad extension name", b"{}", _binary([*CE, ("Bad-Name", "v")])),
    ("binary data not JSON", b"{oops", _binary(CE)),
    ("NaN in data", b'{"a": NaN}', _binary(CE)),
    ("structured, bad format", b"<xml/>",
     _props(ContentType="application/cloudevents+xml")),
    ("type of 2000 characters", b"{}", _binary([*CE[:3], ("type", "t" * 2000)])),
]


def test_malformed_and_oversized_payloads_and_wrong_scopes_on_every_topic(
        redis_url: str, mqtt_url: str) -> None:
    async def main() -> None:
        app = await start_app(redis_url, mqtt_url)
        try:
            async with MqttStation(mqtt_url, held_tighten(set())) as st:
                topics = {f"equipment/{S}/responses": "bad_answers",
                          f"equipment/{S}/events": "bad_events",
                          f"mes/{S}/commands": "bad_mes_requests"}
                for topic, counter in topics.items():
                    m = app.metrics[counter]
                    for _, payload, props in BAD_MESSAGES:
                        await st.raw(topic, payload, props)
                    await counted(app, counter, m, len(BAD_MESSAGES))
                    # wrong scopes: a valid event on a topic that names no valid scope
                    m = app.metrics[counter]
                    bad_scopes = ("bad{x}", "", "a" * 200, "sp ace", "é")
                    for scope in bad_scopes:
                        wrong = topic.replace(f"/{S}/", f"/{scope}/")
                        await st.publish(wrong, "com.example.x.v1", {}, causationid="A:a#1")
                    await counted(app, counter, m, len(bad_scopes))
                    await still_serves(app, f"after-{counter}")
                assert app.metrics["answers_received"] >= 3 * len(topics)
            no_faults(app)
        finally:
            await app.aclose()
    run(main())


def _three_steps(prefix: str) -> dict[str, Any]:
    """Another recipe under the same Work Master id: other steps and types."""
    steps = ["One", "Two", "Three"]
    return {"ID": "wm", "dataschema": "1.1.0", "data": {
        "Steps": [{"Name": n, "Initial": i == 0} for i, n in enumerate(steps)],
        "Transitions": [{"Source": a, "Target": b, "Condition": "always"}
                        for a, b in itertools.pairwise(steps)],
        "Actions": [{"Name": n.lower(), "Step": n, "Qualifier": "N",
                     "Interaction": "push_command", "TypeId": f"{prefix}.{n.lower()}.v1",
                     "TimeoutSeconds": 10} for n in steps]}}


def test_work_master_replaced_while_its_jobs_run_keeps_their_pinned_recipe(
        redis_url: str, mqtt_url: str) -> None:
    async def main() -> None:
        app = await start_app(redis_url, mqtt_url)
        try:
            async with MqttStation(mqtt_url, held_tighten({"P1", "P2"})) as st:
                await tightenings_held(app, st, ("P1", "P2"))
                pinned = await app.host.client.hget(K.job("P1"), "g")
                # the MES replaces the Work Master (PUT over MQTT) while both jobs run
                m = app.metrics["mes_requests"]
                await st.publish(f"mes/{S}/commands", WM_TYPE, _three_steps("com.example.new"))
                await counted(app, "mes_requests", m)
                stored = json.loads(await app.host.store.work_master(S, "wm"))
                assert stored["data"]["Steps"][0]["Name"] == "One"
                # a new job runs the new recipe …
                await app.host.orders.store_order(S, {"JobOrderID": "N1",
                                                      "WorkMasterID": [{"ID": "wm"}]},
                                                  start=True)
                await wait_until(lambda: ended(app, "N1"), 15, "N1 completed")
                assert [c["type"] for c in st.commands if c["correlationid"] == "N1"] == [
                    "com.example.new.one.v1", "com.example.new.two.v1",
                    "com.example.new.three.v1"]
                assert await app.host.client.hget(K.job("N1"), "g") != pinned
                # … and the running ones finish the recipe they started with
                for c in list(st.commands):
                    if c["type"] == TIGHTEN:
                        await st.reply(c, {"Result": {"torque": 85}})
                await wait_until(lambda: ended(app, "P1", "P2"), 15, "P1 and P2 completed")
                for j in ("P1", "P2"):
                    assert await app.host.client.hget(K.job(j), "g") == pinned
                    assert [c["id"] for c in st.commands if c["correlationid"] == j] == [
                        f"{j}:load_part#1", f"{j}:tighten#2", f"{j}:unload_part#3"]
                    resp = json.loads(await app.host.client.get(K.response(j)))
                    assert {"ID": "tighten.torque", "Value": 85} in resp["JobResponseData"]
            no_faults(app)
        finally:
            await app.aclose()
    run(main())


def test_the_million_input_benchmark_runs_clean_on_a_small_sample() -> None:
    """benchmarks/fuzz.py (a million inputs per decoder, not in CI) on 1000 each."""
    tallies = list(BENCH.run(1000, seed=3))
    assert [t.name for t in tallies] == ["recipe compiler", "condition parser",
                                         "CloudEvent decoder", "stream entry parser",
                                         "state decoder", "MQTT packet reader"]
    for t in tallies:
        assert t.inputs == 1000 and t.crashes == 0, (t.name, t.examples)
        assert t.accepted and t.refused, t.name       # both sides of each decoder reached
        assert t.slowest_s < SLOW_S, (t.name, t.slowest)


def test_random_stream_entries_through_a_running_host(redis_url: str) -> None:
    """A few hundred mutated and random entries (the benchmark's generator) in a scope's
    work stream, as the work handler receives them: each is handled, refused (counted,
    acked) or dead-lettered; none stays pending, no loop fails, and jobs still run."""
    async def main() -> None:
        await flush(redis_url)
        st = Station(torque_ok)
        host = Host(quick_config(redis_url, claim_min_idle_ms=200, max_deliveries=2), st.sink)
        st.attach(host)
        await host.store.put_work_master(S, work_master("tighten_rework", "wm"))
        await host.add_scope(S)
        await host.start()
        try:
            make = BENCH.stream_decoder().make
            rng = random.Random(11)
            entries = [make(rng) for _ in range(300)]
            for f in entries:
                await host.client.xadd(K.work, {k or b"_": v for k, v in f.items()} or
                                       {b"_": b""})
            await wait_until(lambda: host.metrics["invalid_entries"] > 50, 10, "refusals")
            await wait_until(lambda: quiet(host), 20, "every entry acked")
            await host.orders.store_order(S, {"JobOrderID": "OK",
                                              "WorkMasterID": [{"ID": "wm"}]}, start=True)

            async def done() -> bool:
                o = await host.orders.get(S, "OK")
                return bool(o) and o["state"] == "Ended_Completed"
            await wait_until(done, 15, "a job completed after them")
            assert not [k for k, v in host.metrics.snapshot().items()
                        if v and k.startswith("loop_errors")]
        finally:
            await host.aclose()
    run(main())
