"""A million bad inputs per decoder: direct calls, seeded random and mutational inputs.

    python benchmarks/fuzz.py                  # 1,000,000 inputs per decoder
    python benchmarks/fuzz.py -n 20000 --seed 7 --only state,stream

Decoders and the one error each may raise on bad input: the recipe compiler
(``RecipeError``), the condition parser (``ConditionSyntaxError``), the CloudEvent
decoder and the answer reading after it (``CloudEventError``; a reason string), the
work stream entry parser (``InvalidEntry``) and the state decoder (``StateFormatError``).
Inputs are mostly mutations of valid ones (the reference recipes, their conditions,
encoded events, real work entries, real job states: bits flipped, bytes cut, inserted,
repeated, fields dropped or swapped) and partly random. Per decoder it prints how many
inputs, how many were accepted, refused with the clear error, crashed (any other
exception: the first few are shown with a reproducer), and the slowest input. Exit 1
on any crash.
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import itertools
import json
import random
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from sfc_fast import Graph, RecipeError, compile_recipe, evolve, state_to_json
from sfc_fast.conditions import CondBuilder, ConditionSyntaxError
from sfc_fast.events import Completed, Event, Hold, Start, Tick
from sfc_fast.state import StateFormatError, check_state
from sfc_fast.wire import mqtt5
from sfc_fast.wire.mqtt5 import MalformedPacket, Properties
from sfc_host.equipment.mqtt_transport import answer_event
from sfc_host.mqtt.cloudevents import (
    CloudEvent,
    CloudEventError,
    decode,
    encode_binary,
    encode_structured,
)
from sfc_host.store.streams import InvalidEntry, parse_entry

EXAMPLES = Path(__file__).resolve().parents[1] / "src" / "sfc_host" / "examples"
REFERENCES = ("tighten_rework", "axle_fit_qa", "paint_hold_restart")
SCHEMAS = ("https://aschamberger.github.io/schemas/microdcs/sfc-recipe/v1.0.0/",
           "https://aschamberger.github.io/schemas/microdcs/sfc-recipe/v1.1.0/",
           "1.1.0", "", "https://example.com/other/")


def _references() -> list[dict[str, Any]]:
    return [json.loads((EXAMPLES / f"{n}.json").read_text()) for n in REFERENCES]


# ------------------------------------------------------------------ mutation tools

def mutate_bytes(rng: random.Random, data: bytes, edits: int = 0) -> bytes:
    """A few random edits of ``data``: bit flips, cuts, inserts, repeats, swaps."""
    b = bytearray(data)
    for _ in range(edits or rng.randint(1, 4)):
        n = len(b)
        op = rng.randrange(6)
        if op == 0 and n:
            b[rng.randrange(n)] ^= 1 << rng.randrange(8)
        elif op == 1 and n:
            del b[rng.randrange(n):]
        elif op == 2:
            i = rng.randint(0, n)
            b[i:i] = rng.randbytes(rng.randint(1, 8))
        elif op == 3 and n:
            i = rng.randrange(n)
            del b[i:i + rng.randint(1, 16)]
        elif op == 4 and n:
            i = rng.randrange(n)
            j = min(n, i + rng.randint(1, 32))
            b[i:i] = b[i:j] * rng.randint(1, 8)          # repeat a run
        elif n:
            b[rng.randrange(n)] = rng.choice(b'{}[]",:0\\\x00\xff-e.')
    return bytes(b)


def random_json(rng: random.Random, depth: int = 0) -> Any:
    r = rng.random()
    if depth > 3 or r < 0.45:
        return rng.choice([None, True, False, 0, -1, 2**63, 2**70, 1.5, 1e308, "", "x",
                           "é\u2028", "\ud800", "a" * rng.randint(0, 300),
                           rng.randint(-10**9, 10**9)])
    if r < 0.7:
        return [random_json(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {rng.choice(["Name", "Steps", "Actions", "x", "", "data", "id"]) + str(i):
            random_json(rng, depth + 1) for i in range(rng.randint(0, 4))}


def mutate_tree(rng: random.Random, tree: Any) -> Any:
    """Edit a JSON tree in place at a random place; returns the (maybe new) root."""
    path: list[tuple[Any, Any]] = []
    node = tree
    while isinstance(node, (dict, list)) and node and rng.random() < 0.8:
        key = rng.choice(list(node)) if isinstance(node, dict) else rng.randrange(len(node))
        path.append((node, key))
        node = node[key]
    if not path:
        return random_json(rng)
    parent, key = path[-1]
    op = rng.randrange(4)
    if op == 0:
        parent[key] = random_json(rng)
    elif op == 1:
        del parent[key]
    elif op == 2 and isinstance(parent, list):
        parent.insert(key, json.loads(json.dumps(parent[key])))
    else:
        donor_parent, donor_key = rng.choice(path)
        parent[key] = json.loads(json.dumps(donor_parent[donor_key]))
    return tree


# ------------------------------------------------------------------ the decoders

@dataclass
class Decoder:
    name: str
    error: type[Exception]
    make: Callable[[random.Random], Any]     # one input
    run: Callable[[Any], Any]                # raises ``error`` on a refusal


def recipe_decoder() -> Decoder:
    refs = _references()
    texts = [json.dumps(r["data"]).encode() for r in refs]

    def make(rng: random.Random) -> Any:
        r = rng.random()
        k = rng.randrange(len(refs))
        schema = refs[k]["dataschema"] if rng.random() < 0.9 else rng.choice(SCHEMAS)
        if r < 0.5:
            return mutate_bytes(rng, texts[k]), schema
        if r < 0.9:
            tree = json.loads(texts[k])
            for _ in range(rng.randint(1, 3)):
                tree = mutate_tree(rng, tree)
            return tree, schema
        return random_json(rng), schema

    return Decoder("recipe compiler", RecipeError, make,
                   lambda a: compile_recipe(*a))


CONDITION_TOKENS = ("tighten", "torque", "job", "mode", "torque_ok", ".", "_round",
                    "_outcome", "__class__", "(", ")", "[", "]", ",", "==", "!=", "<", "<=",
                    ">", ">=", "=", "!", "and", "or", "not", "in", "'s'", '"t"', "'", '"',
                    "\\", "1", "-", "-1.5", "1e3", "1e999", "9" * 30, ".5", "lambda", ":",
                    "true", "false", "null", "always", "**", "%", "é", "\x00", " ")


def reference_conditions() -> list[str]:
    """The transition conditions of the reference recipes."""
    return [t["Condition"] for r in _references() for t in r["data"]["Transitions"]
            if t.get("Condition")]


def condition_decoder() -> Decoder:
    conds = reference_conditions()
    actions = {"load_part": 0, "tighten": 1, "loosen": 2, "unload_part": 3}
    builder = [CondBuilder(actions), 0]

    def make(rng: random.Random) -> str:
        r = rng.random()
        if r < 0.4:
            return mutate_bytes(rng, rng.choice(conds).encode()).decode("utf-8", "replace")
        if r < 0.8:
            sep = rng.choice(("", " "))
            return sep.join(rng.choice(CONDITION_TOKENS) for _ in range(rng.randint(0, 20)))
        if r < 0.85:
            n = rng.randint(1, 300)
            return "(" * n + "1" + ")" * n
        return "".join(chr(rng.randint(0, 0x2FF)) for _ in range(rng.randint(0, 40)))

    def run(text: str) -> Any:
        # a builder keeps every condition it compiled: a fresh one every 1000
        if builder[1] >= 1000:
            builder[:] = [CondBuilder(actions), 0]
        builder[1] += 1
        return builder[0].add(text)

    return Decoder("condition parser", ConditionSyntaxError, make, run)


def cloudevent_decoder() -> Decoder:
    answers = []
    for data in ({"Outcome": "completed", "Result": {"torque": 85}},
                 {"Outcome": "failed", "Reason": "jammed"}, {"Outcome": "held"}, None):
        ev = CloudEvent(id="a-1", source="station", type="com.example.cell.tighten.v1.answer",
                        subject="line1", data=data,
                        extensions={"causationid": "J1:tighten#2", "correlationid": "J1"})
        payload, props = encode_binary(ev)
        answers.append(("binary", payload, props.ContentType, list(props.UserProperty)))
        answers.append(("structured", encode_structured(ev), "application/cloudevents+json",
                        []))
    names = ["specversion", "id", "source", "type", "subject", "time", "datacontenttype",
             "causationid", "correlationid", "data", "Bad Name", ""]

    def make(rng: random.Random) -> tuple[bytes, Any]:
        _, payload, ctype, user = rng.choice(answers)
        r = rng.random()
        if r < 0.4:
            payload = mutate_bytes(rng, payload)
        elif r < 0.5:
            payload = rng.randbytes(rng.randint(0, 200))
        user = list(user)
        for _ in range(rng.randint(0, 3)):
            op = rng.randrange(5)
            if op == 0 and user:
                user.pop(rng.randrange(len(user)))
            elif op == 1:
                user.append((rng.choice(names), rng.choice(["1.0", "", "x" * 2000, "\x00"])))
            elif op == 2 and user and isinstance(user[-1], tuple) and len(user[-1]) == 2:
                user[-1] = (user[-1][0], random_json(rng))     # a value of any type
            elif op == 3:
                ctype = rng.choice([None, "", "application/json", "text/plain",
                                    "application/cloudevents+xml", 7])
            else:
                user.append(rng.choice([(), ("a",), "x", None, ("a", "b", "c")]))
        props = None if rng.random() < 0.1 else SimpleNamespace(
            ContentType=ctype, UserProperty=user,
            ResponseTopic=rng.choice([None, None, "r/t", "", 5]),
            CorrelationData=rng.choice([None, None, b"J1:tighten#2", b"\xff", "text"]))
        return payload, props

    def run(a: tuple[bytes, Any]) -> Any:
        ev = decode(a[0], a[1], max_bytes=1 << 16)
        meaning = answer_event(ev)
        if isinstance(meaning, str) and not meaning:
            raise AssertionError("an answer refused without a reason")
        return meaning

    return Decoder("CloudEvent decoder", CloudEventError, make, run)


def stream_decoder() -> Decoder:
    valid = [{b"k": b"start", b"j": b"J1"}, {b"k": b"tick", b"j": b"J1\nJ2\nJ3"},
             {b"k": b"dispatch:tighten", b"j": b"J1", b"a": b"tighten",
              b"c": b"J1:tighten#2"},
             {b"k": b"job", b"j": b"J1", b"a": b"Abort", b"c": b"the recipe's reason"},
             {b"k": b"event", b"t": b"com.example.qa.v1", b"s": b"line1", b"r": b"J1",
              b"d": b'{"passed": true}'}, {b"k": b"hold", b"j": b"J1"}]
    values = [b"start", b"tick", b"event", b"job", b"dispatch:", b"Run", b"J{1}", b"#",
              b"\xff", b"", b"NaN", b"-1", b"9" * 40, b"[" * 3000, b'{"n": ' + b"1" * 5000
              + b"}", b"x" * 70_000]

    def make(rng: random.Random) -> dict[bytes, bytes]:
        f = dict(rng.choice(valid))
        for _ in range(rng.randint(0, 3)):
            op = rng.randrange(4)
            key = rng.choice([b"k", b"j", b"a", b"c", b"t", b"s", b"r", b"d",
                              rng.randbytes(2)])
            if op == 0:
                f.pop(key, None)
            elif op == 1:
                f[key] = rng.choice(values)
            elif op == 2 and key in f:
                f[key] = mutate_bytes(rng, f[key])
            else:
                f[key] = rng.randbytes(rng.randint(0, 30))
        return f

    return Decoder("stream entry parser", InvalidEntry, make,
                   lambda f: parse_entry("line1", b"1-0", f))


def mqtt_decoder() -> Decoder:
    """What a broker sends, through the host's MQTT reader (``sfc_fast.wire.mqtt5``) in reads
    cut anywhere: answers with their properties, acknowledgements, CONNACK, DISCONNECT."""
    props = Properties(ContentType="application/json", ResponseTopic="r/1",
                       CorrelationData=b"J1:tighten#2", MessageExpiryInterval=60,
                       UserProperty=[("specversion", "1.0"), ("id", "a-1")])
    packets = []
    for qos, p, v5 in ((1, props, True), (0, None, True), (2, props, True), (1, None, False)):
        out = bytearray()
        mqtt5.publish_into(out, "equipment/line1/responses", b'{"Outcome":"completed"}',
                           qos, False, 7 if qos else 0, p, v5)
        packets.append((bytes(out), v5))
    packets += [(b"\x40\x02\x00\x07", False), (b"\x40\x04\x00\x07\x87\x00", True),
                (b"\x90\x04\x00\x01\x00\x01", True), (b"\xd0\x00", False),
                (b"\x20\x08\x00\x00\x05\x21\x00\x14\x24\x01", True),
                (b"\xe0\x04\x8b\x02\x1f\x00", True), (b"\x62\x02\x00\x07", False)]

    def make(rng: random.Random) -> tuple[bytes, list[int], bool]:
        v5 = rng.random() < 0.7
        data = b"".join(rng.choice([p for p, five in packets if five or not v5])
                        for _ in range(rng.randint(1, 4)))
        r = rng.random()
        if r < 0.6:
            data = mutate_bytes(rng, data)
        elif r < 0.7:
            data = rng.randbytes(rng.randint(0, 200))
        return data, sorted(rng.randrange(len(data) + 1) for _ in range(rng.randint(0, 3))), v5

    def run(a: tuple[bytes, list[int], bool]) -> list[Any]:
        data, cuts, v5 = a
        reader = mqtt5.Reader(v5, max_packet=4096)
        got: list[Any] = []
        for lo, hi in itertools.pairwise([0, *cuts, len(data)]):
            got += reader.feed(data[lo:hi])
        return got

    return Decoder("MQTT packet reader", MalformedPacket, make, run)


def real_states() -> list[tuple[Graph, bytes]]:
    out = []
    for wm in _references():
        g = compile_recipe(wm["data"], wm["dataschema"])
        pulls = [a["TypeId"] for a in wm["data"]["Actions"]
                 if a["Interaction"] == "pull_event"] or ["none"]
        d = evolve(g, None, Start("J1", "line1", {"program": 7, "t": "ü"}, "tok"), 1000)
        state, now = d.state, 1000
        out.append((g, state))
        for step in range(12):
            now += 100
            if d.commands:
                d = evolve(g, state, Completed(d.commands[0].command_id,
                                               {"torque": 85, "n": [step]}), now)
            else:
                d = evolve(g, state, Event(pulls[step % len(pulls)], "line1", "J1",
                                           {"passed": True, "torque_ok": True}), now)
            if d.state is None:
                break
            state = d.state
            out.append((g, state))
            if step == 2 and (h := evolve(g, state, Hold(), now).state):
                out.append((g, h))
    return out


def state_decoder() -> Decoder:
    states = real_states()
    tick = Tick()

    def make(rng: random.Random) -> tuple[Graph, bytes]:
        g, s = rng.choice(states)
        r = rng.random()
        if r < 0.85:
            blob = bytearray(mutate_bytes(rng, s[16:]))
            return g, s[:16] + bytes(blob)           # the header kept: the body decoded
        if r < 0.95:
            return g, mutate_bytes(rng, s)
        return g, rng.randbytes(rng.randint(0, 200))

    def run(a: tuple[Graph, bytes]) -> Any:
        g, blob = a
        check_state(g, blob)
        # accepted: the readers and the core must work on it too
        state_to_json(g, blob)
        return evolve(g, blob, tick, 10**7)

    return Decoder("state decoder", StateFormatError, make, run)


DECODERS: dict[str, Callable[[], Decoder]] = {
    "recipe": recipe_decoder, "condition": condition_decoder,
    "cloudevent": cloudevent_decoder, "stream": stream_decoder, "state": state_decoder,
    "mqtt": mqtt_decoder}


# ------------------------------------------------------------------ the run

@dataclass
class Tally:
    name: str
    inputs: int = 0
    accepted: int = 0
    refused: int = 0
    crashes: int = 0
    slowest_s: float = 0.0
    slowest: str = ""
    seconds: float = 0.0
    examples: list[str] = field(default_factory=list)


def _timed(dec: Decoder, x: Any) -> float:
    t0 = time.perf_counter()
    with contextlib.suppress(Exception):
        dec.run(x)
    return time.perf_counter() - t0


def fuzz(dec: Decoder, n: int, seed: int, keep: int = 3, again: int = 64) -> Tally:
    """``n`` inputs through ``dec``. The slowest are timed again afterwards (best of
    three): on a shared machine one call can wait for the CPU, and what counts is the
    time an input costs, not the time one call happened to take."""
    rng = random.Random(f"{seed}:{dec.name}")
    t = Tally(dec.name)
    clock = time.perf_counter
    slow: list[tuple[float, int, Any]] = []      # a min-heap of the slowest inputs
    start = clock()
    for _ in range(n):
        x = dec.make(rng)
        t0 = clock()
        try:
            dec.run(x)
            t.accepted += 1
        except dec.error:
            t.refused += 1
        except RecursionError as e:   # a crash too, but not worth a deep traceback
            t.crashes += 1
            if len(t.examples) < keep:
                t.examples.append(f"RecursionError: {e} on {x!r:.300}")
        except Exception:
            t.crashes += 1
            if len(t.examples) < keep:
                t.examples.append(f"{traceback.format_exc(limit=4)}input: {x!r:.500}")
        dt = clock() - t0
        if len(slow) < again:
            heapq.heappush(slow, (dt, t.inputs, x))
        elif dt > slow[0][0]:
            heapq.heapreplace(slow, (dt, t.inputs, x))
        t.inputs += 1
    t.seconds = clock() - start
    for _, _, x in slow:
        dt = min(_timed(dec, x) for _ in range(3))
        if dt >= t.slowest_s:
            t.slowest_s, t.slowest = dt, f"{x!r:.200}"
    return t


def run(n: int, seed: int, only: list[str] | None = None) -> Iterator[Tally]:
    for key, make in DECODERS.items():
        if only and key not in only:
            continue
        yield fuzz(make(), n, seed)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("-n", type=int, default=1_000_000, help="inputs per decoder")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--only", default="", help=f"comma-separated of {','.join(DECODERS)}")
    p.add_argument("--json", action="store_true", help="one JSON object per decoder")
    p.add_argument("--show-slowest", action="store_true", help="print each slowest input")
    a = p.parse_args(argv)
    only = [s for s in a.only.split(",") if s]
    unknown = set(only) - set(DECODERS)
    if unknown:
        p.error(f"unknown decoder {sorted(unknown)[0]!r}")
    if not a.json:
        print(f"{'decoder':<22}{'inputs':>10}{'accepted':>10}{'refused':>10}{'crashes':>9}"
              f"{'slowest ms':>12}{'total s':>9}")
    crashes = 0
    for t in run(a.n, a.seed, only):
        crashes += t.crashes
        if a.json:
            print(json.dumps({k: v for k, v in vars(t).items()}), flush=True)
            continue
        print(f"{t.name:<22}{t.inputs:>10}{t.accepted:>10}{t.refused:>10}{t.crashes:>9}"
              f"{t.slowest_s * 1000:>12.2f}{t.seconds:>9.1f}", flush=True)
        if a.show_slowest:
            print(f"  slowest: {t.slowest}")
        for ex in t.examples:
            print("  crash: " + ex.replace("\n", "\n    "), file=sys.stderr)
    return 1 if crashes else 0


if __name__ == "__main__":
    sys.exit(main())
