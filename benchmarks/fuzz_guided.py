"""Coverage-guided fuzzing (atheris, libFuzzer) of the six decoders of benchmarks/fuzz.py.

    python benchmarks/fuzz_guided.py                        # 1,000,000 inputs per decoder
    python benchmarks/fuzz_guided.py -n 20000 --only stream,cloudevent
    python benchmarks/fuzz_guided.py --only stream --reproduce crash-<sha1>

The decoders, the one clear error each may raise and the generator of near-valid inputs
come from ``benchmarks/fuzz.py``; here libFuzzer mutates bytes, keeps the inputs that
reach new code, and each decoder reads the bytes as its own input type (a recipe's
JSON text after a byte picking its dataschema, condition text, an MQTT payload after
header lines of properties, a work stream entry's fields, a state's body after a byte
picking a real state's graph and header). One decoder per process (``atheris.Fuzz``
runs once per process): the script runs itself once per decoder, with a seed corpus
of the valid inputs and a sample of ``fuzz.py``'s mutations, ``-runs``, ``-max_len``
and ``-timeout`` (an input slower than that is a hang).

Coverage comes from the Python code only: ``sfc_host`` (the CloudEvent decoder, the
answer reading and the stream entry parser) is instrumented as it is imported. The
Cython core (the recipe compiler, the condition parser, the state decoder) is not:
there the feedback is the decoder's outcome instead (an input drawing a new kind of
refusal is kept), a stand-in for coverage, not coverage. A crash is any exception
other than the decoder's clear error, a hang or running out of memory: libFuzzer
writes the input, the script prints a reproducer line and exits 1. Without atheris
it prints one line and exits 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import random
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:    # fuzz.py is imported only after the instrumentation is in place
    from fuzz import Decoder

SCRIPT = Path(__file__).resolve()
INSTRUMENTED = ("sfc_host.mqtt.cloudevents", "sfc_host.store.streams",
                "sfc_host.equipment.mqtt_transport")
SAMPLES = 200        # fuzz.py mutations added to each seed corpus
HEADER = 16          # a state's header, kept by fuzz.state_decoder's usual mutation
OUTCOMES = 1024      # feedback counters of a decoder without coverage
_QUOTED = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"")
_PATH = re.compile(r"\$.*: ", re.S)     # to the last ": ": field names hold any text
_SEGMENT = re.compile(r"\.[A-Za-z]\w*|\[\d+\]")   # of a path; mutated names count not
_ECHO = re.compile(r"\.\w+|\\\S+")             # job.<name>, an escape
_WORD = re.compile(r"\bSFC\d+\b|\b[a-z]{3,16}\b|(?<![\w-])\d+")


@dataclass
class Target:
    """A decoder of fuzz.py with the mapping of libFuzzer's bytes to its input."""
    decoder: Decoder
    read: Callable[[bytes], Any]      # fuzzer bytes -> the decoder's input
    write: Callable[[Any], bytes]     # a decoder input -> bytes (for the seed corpus)
    seeds: list[Any]                  # valid inputs
    samples: int = SAMPLES            # plus this many of decoder.make's inputs
    covered: bool = False             # instrumented Python (else Cython: outcome feedback)
    tokens: list[bytes] = field(default_factory=list)   # a libFuzzer -dict: words to insert


# ------------------------------------------------------------------ bytes <-> inputs

def recipe_target() -> Target:
    import fuzz

    refs = fuzz._references()
    # the first byte picks the dataschema (as fuzz.py does: mostly a valid one): a
    # mutated schema text would hide the recipe behind "unknown dataschema"
    schemas = list(dict.fromkeys([*(r["dataschema"] for r in refs), *fuzz.SCHEMAS]))

    def read(data: bytes) -> tuple[bytes, str]:
        return data[1:], schemas[data[0] % len(schemas) if data else 0]   # JSON, schema

    def write(x: tuple[Any, str]) -> bytes:
        data, schema = x
        text = data if isinstance(data, bytes) else json.dumps(data).encode()
        return bytes([schemas.index(schema) if schema in schemas else 0]) + text

    return Target(fuzz.recipe_decoder(), read, write,
                  [(r["data"], r["dataschema"]) for r in refs], tokens=_json_tokens(refs))


def _json_tokens(tree: Any) -> list[bytes]:
    """The keys and short strings of a JSON tree, quoted: without coverage feedback,
    whole words are how the mutations reach past the recipe's JSON into its fields."""
    out: set[str] = set()
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            out.update(node)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, str) and len(node) <= 40:
            out.add(node)
    return sorted(json.dumps(t).encode() for t in out)


def condition_target() -> Target:
    import fuzz

    def read(data: bytes) -> str:
        # surrogateescape: a recipe's JSON can hold lone surrogates ("\udc80") too
        return data.decode("utf-8", "surrogateescape")

    def write(text: str) -> bytes:
        return text.encode("utf-8", "surrogatepass")

    return Target(fuzz.condition_decoder(), read, write, fuzz.reference_conditions(),
                  tokens=[t.encode("utf-8", "surrogatepass") for t in fuzz.CONDITION_TOKENS])


# The MQTT properties as header lines before a blank line: "@ct=" ContentType, "@rt="
# ResponseTopic, "@cd=" CorrelationData (bytes), "name=value" a user property and a
# line without "=" a user property that is not a pair. No blank line: no properties.
_PROPS = {b"@ct": "ContentType", b"@rt": "ResponseTopic"}


def cloudevent_target() -> Target:
    import fuzz

    def read(data: bytes) -> tuple[bytes, Any]:
        head, blank, payload = data.partition(b"\n\n")
        if not blank:
            return data, None
        props = SimpleNamespace(ContentType=None, UserProperty=[], ResponseTopic=None,
                                CorrelationData=None)
        for line in filter(None, head.split(b"\n")):
            name, eq, value = line.partition(b"=")
            text = value.decode("utf-8", "replace")   # the MQTT client gives valid text
            if name == b"@cd":
                props.CorrelationData = value
            elif name in _PROPS and eq:
                setattr(props, _PROPS[name], text)
            elif eq:
                props.UserProperty.append((name.decode("utf-8", "replace"), text))
            else:
                props.UserProperty.append((name.decode("utf-8", "replace"),))
        return payload, props

    def line(name: str, value: Any) -> bytes:
        b = value if isinstance(value, bytes) else str(value).encode("utf-8", "replace")
        return name.encode("utf-8", "replace") + b"=" + b.replace(b"\n", b" ")

    def write(x: tuple[bytes, Any]) -> bytes:
        payload, props = x
        if props is None:
            return payload
        lines = [line(n.decode(), getattr(props, a)) for n, a in _PROPS.items()
                 if isinstance(getattr(props, a), str)]
        if isinstance(props.CorrelationData, bytes):
            lines.append(line("@cd", props.CorrelationData))
        for u in props.UserProperty:
            ok = isinstance(u, tuple) and len(u) == 2
            lines.append(line(str(u[0]), u[1]) if ok else repr(u).replace("=", "").encode())
        return b"\n".join(lines) + b"\n\n" + payload

    return Target(fuzz.cloudevent_decoder(), read, write, [], covered=True)


# A stream entry's fields as records "key \x1f value" joined by \x1e: values hold
# newlines (a tick's job list), these separators they do not.
def stream_target() -> Target:
    import fuzz

    def read(data: bytes) -> dict[bytes, bytes]:
        return dict(r.partition(b"\x1f")[::2] for r in data.split(b"\x1e") if r)

    def write(fields: dict[bytes, bytes]) -> bytes:
        return b"\x1e".join(k + b"\x1f" + v for k, v in fields.items())

    return Target(fuzz.stream_decoder(), read, write, [], covered=True)


def state_target() -> Target:
    import fuzz

    states = fuzz.real_states()[:128]
    # by fingerprint: the decoder's samples come with graphs compiled again
    graphs = list({g.fingerprint: g for g, _ in states}.values())
    index = {g.fingerprint: i for i, g in enumerate(graphs)}

    # The first byte: below 128, a real state whose graph and header are kept and the
    # rest is its body (as fuzz.py mostly does: blind mutations of the header would
    # stop nearly every input at "bad magic"); from 128, a graph and the whole blob.
    def read(data: bytes) -> tuple[Any, bytes]:
        pick = data[0] if data else 0
        if pick & 0x80:
            return graphs[(pick & 0x7F) % len(graphs)], data[1:]
        g, s = states[pick % len(states)]
        return g, s[:HEADER] + data[1:]

    def write(x: tuple[Any, bytes]) -> bytes:
        g, blob = x
        fp, head = g.fingerprint, blob[:HEADER]
        same = (i for i, (h, s) in enumerate(states) if h.fingerprint == fp and s[:HEADER] == head)
        if (i := next(same, None)) is not None:
            return bytes([i]) + blob[HEADER:]
        return bytes([0x80 | index.get(fp, 0)]) + blob

    return Target(fuzz.state_decoder(), read, write, states)


def mqtt_target() -> Target:
    import fuzz

    # the first byte's low bit: MQTT 3.1.1 (1) or 5 (0); the reads are not cut (the
    # reader frames the same packets however the bytes arrive)
    def read(data: bytes) -> tuple[bytes, list[int], bool]:
        return data[1:], [], not (data[:1] and data[0] & 1)

    def write(x: tuple[bytes, list[int], bool]) -> bytes:
        return bytes([0 if x[2] else 1]) + x[0]

    return Target(fuzz.mqtt_decoder(), read, write, [])


TARGETS: dict[str, Callable[[], Target]] = {
    "recipe": recipe_target, "condition": condition_target,
    "cloudevent": cloudevent_target, "stream": stream_target, "state": state_target,
    "mqtt": mqtt_target}


def load_target(key: str, spec: str = "") -> Target:
    """The target ``key``, or with ``spec`` ("file.py:function") a function elsewhere
    returning one (a planted bug, to check that the harness finds it)."""
    if not spec:
        return TARGETS[key]()
    path, _, name = spec.rpartition(":")
    mspec = importlib.util.spec_from_file_location(Path(path).stem, path)
    assert mspec is not None and mspec.loader is not None, spec
    module = importlib.util.module_from_spec(mspec)
    mspec.loader.exec_module(module)
    return getattr(module, name)()


def outcome(refusal: Exception | None, data: bytes) -> str:
    """What a decoder said, as a feedback key: the template of its refusal, i.e. its
    error code and first lowercase words, numbers (positions, sizes) by their digits,
    a recipe's JSON path by its depth, without the bits of input a message echoes
    (the path's field names, quoted text, job.<name>, escapes); or acceptance, by
    the input's size."""
    if refusal is None:
        return f"accepted {len(data).bit_length()}"
    text = str(refusal)
    path = _PATH.search(text)
    depth = min(len(_SEGMENT.findall(path[0])), 8) if path else -1
    text = _QUOTED.sub(" ", _PATH.sub(" ", text))
    words = _WORD.findall(_ECHO.sub(" ", text))[:8]
    return " ".join([type(refusal).__name__, str(depth),
                     *(f"#{len(w)}" if w.isdigit() else w for w in words)])


def one_input(target: Target, feedback: Callable[[str], None] | None = None
              ) -> Callable[[bytes], None]:
    read, run, error = target.read, target.decoder.run, target.decoder.error

    def test_one_input(data: bytes) -> None:
        refusal: Exception | None = None
        try:
            run(read(data))
        except error as e:      # the clear refusal; any other exception is a crash
            refusal = e
        if feedback:
            feedback(outcome(refusal, data))
    return test_one_input


# ------------------------------------------------------------------ one decoder (child)

def _quoted(token: bytes) -> str:
    """A libFuzzer dictionary entry: printable ASCII, the rest as \\xNN."""
    return '"' + "".join(chr(b) if 32 <= b < 127 and b not in b'"\\' else f"\\x{b:02X}"
                         for b in token) + '"'


def outcome_feedback(atheris: Any) -> Callable[[str], None] | None:
    """Feedback for a decoder without coverage (Cython): one libFuzzer counter per kind
    of outcome, so an input that draws a new refusal (a new message, a position of
    another magnitude) is kept and mutated further. Without it libFuzzer keeps no
    input and mutates only the smallest seed. ``_reserve_counter`` and
    ``_trace_branch`` are what atheris's own instrumentation calls; None if absent."""
    if not (hasattr(atheris, "_reserve_counter") and hasattr(atheris, "_trace_branch")):
        return None
    slots = [atheris._reserve_counter() for _ in range(OUTCOMES)]

    def feedback(key: str) -> None:
        # looked up per call: atheris.Setup swaps in the libFuzzer-backed function
        atheris._trace_branch(slots[zlib.crc32(key.encode("utf-8", "surrogatepass"))
                                    % OUTCOMES])
    return feedback


def child(a: argparse.Namespace) -> int:
    import atheris

    work = Path(a.workdir)
    with atheris.instrument_imports(include=["sfc_host"]):
        for name in INSTRUMENTED:
            importlib.import_module(name)
    target = load_target(a.child, a.target)
    feedback = None if target.covered else outcome_feedback(atheris)
    mode = "python" if target.covered else "outcome" if feedback else "none"
    print(f"TARGET {mode} {target.decoder.name}", flush=True)
    corpus = work / f"corpus-{a.child}"
    corpus.mkdir()
    rng = random.Random(f"{a.seed}:{a.child}")
    inputs = [*target.seeds, *(target.decoder.make(rng) for _ in range(target.samples))]
    for i, data in enumerate(dict.fromkeys(target.write(x) for x in inputs)):
        (corpus / f"seed-{i:04d}").write_bytes(data)
    argv = [sys.argv[0], f"-runs={a.n}", f"-max_len={a.max_len}", f"-timeout={a.timeout}",
            f"-seed={a.seed}", "-print_final_stats=1", f"-artifact_prefix={work}/"]
    if not target.covered:
        # outcome feedback: the valid seeds all say "accepted", and only the first would
        # be kept; no coverage to grow the inputs' length by
        argv += ["-keep_seed=1", "-len_control=0"]
    if target.tokens:
        words = work / f"{a.child}.dict"
        words.write_text("".join(f"{_quoted(t)}\n" for t in target.tokens))
        argv.append(f"-dict={words}")
    atheris.Setup([*argv, str(corpus)], one_input(target, feedback))
    atheris.Fuzz()
    return 0


# ------------------------------------------------------------------ the run (parent)

@dataclass
class Result:
    key: str
    name: str
    inputs: int = 0
    feedback: str = ""    # python (instrumented), outcome (Cython: kinds of refusal), none
    edges: int = 0        # libFuzzer's "cov": counters reached (edges, or outcome kinds)
    features: int = 0     # libFuzzer's "ft": counters with hit-count buckets
    corpus: int = 0
    crashes: int = 0
    seconds: float = 0.0
    artifact: str = ""    # the input libFuzzer wrote on a crash
    error: str = ""       # the exception, hang or harness failure


_STATUS = re.compile(r"^#(\d+)\s+\w+\s+(?:cov: (\d+) ft: (\d+) )?corp: (\d+)/", re.M)


def parse_log(r: Result, log: str, rc: int) -> Result:
    """libFuzzer's output: final stats, the last status line and any crash."""
    if m := re.search(r"stat::number_of_executed_units:\s*(\d+)", log):
        r.inputs = int(m[1])
    if status := _STATUS.findall(log):
        last = status[-1]
        r.edges, r.features, r.corpus = int(last[1] or 0), int(last[2] or 0), int(last[3])
    if m := re.search(r"Test unit written to (\S+)", log):
        r.artifact, r.crashes = m[1], 1
        exc = re.search(r"=== Uncaught Python exception: ===\n(.*)", log)
        summary = re.search(r"ERROR: libFuzzer: (.*)", log)
        r.error = exc[1] if exc else summary[1] if summary else "crash"
    elif rc:
        r.crashes = 1      # no input written: the harness itself failed
        r.error = "harness failed: " + " | ".join(log.strip().splitlines()[-5:])
    return r


def fuzz_one(key: str, a: argparse.Namespace, work: Path) -> Result:
    cmd = [sys.executable, str(SCRIPT), "--child", key, "--workdir", str(work),
           "-n", str(a.n), "--max-len", str(a.max_len), "--timeout", str(a.timeout),
           "--seed", str(a.seed), "--target", a.target]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    log = p.stdout + p.stderr
    (work / f"{key}.log").write_text(log)
    m = re.search(r"^TARGET (\w+) (.*)$", log, re.M)
    r = Result(key, m[2] if m else key, feedback=m[1] if m else "?",
               seconds=time.perf_counter() - t0)
    return parse_log(r, log, p.returncode)


def reproducer(key: str, a: argparse.Namespace, artifact: str) -> str:
    target = ["--target", a.target] if a.target else []
    return shlex.join(["python", os.path.relpath(SCRIPT), "--only", key, *target,
                       "--reproduce", artifact])


def reproduce(key: str, spec: str, path: str) -> int:
    """The decoder on one input, in this process: the full traceback of a crash."""
    target = load_target(key, spec)
    x = target.read(Path(path).read_bytes())
    print(f"input: {x!r:.500}")
    t0 = time.perf_counter()
    try:
        target.decoder.run(x)
        said, rc = "accepted", 0
    except target.decoder.error as e:
        said, rc = f"refused: {type(e).__name__}: {str(e)[:200]}", 0
    except Exception:
        traceback.print_exc()
        said, rc = "crash", 1
    print(f"{target.decoder.name}: {said} in {time.perf_counter() - t0:.3f} s")
    return rc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("-n", type=int, default=1_000_000, help="inputs per decoder (-runs)")
    p.add_argument("--only", default="", help=f"comma-separated of {','.join(TARGETS)}")
    p.add_argument("--max-len", type=int, default=4096, help="largest input, bytes")
    p.add_argument("--timeout", type=int, default=5, help="seconds an input may take")
    p.add_argument("--seed", type=int, default=1, help="libFuzzer's -seed")
    p.add_argument("--reproduce", metavar="FILE", help="run one input (needs one --only)")
    p.add_argument("--keep", action="store_true", help="keep corpora and logs")
    p.add_argument("--json", action="store_true", help="one JSON line per decoder instead")
    p.add_argument("--target", default="", help=argparse.SUPPRESS)    # file.py:function
    p.add_argument("--child", default="", help=argparse.SUPPRESS)
    p.add_argument("--workdir", default="", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        return child(a)
    keys = [s for s in a.only.split(",") if s] or list(TARGETS)
    if unknown := set(keys) - set(TARGETS):
        p.error(f"unknown decoder {sorted(unknown)[0]!r}")
    if a.reproduce:
        if len(keys) != 1:
            p.error("--reproduce needs one decoder in --only")
        return reproduce(keys[0], a.target, a.reproduce)
    if importlib.util.find_spec("atheris") is None:
        print("fuzz_guided: atheris is not installed (pip install '.[fuzz]'); skipped")
        return 0

    work = Path(tempfile.mkdtemp(prefix="fuzz_guided-"))
    if not a.json:
        print(f"{'decoder':<22}{'feedback':>10}{'inputs':>10}{'cov':>7}{'ft':>7}"
              f"{'corpus':>8}{'crashes':>9}{'time s':>8}", flush=True)
    results = []
    for key in keys:
        r = fuzz_one(key, a, work)
        results.append(r)
        if a.json:
            print(json.dumps(dataclasses.asdict(r)), flush=True)
            continue
        print(f"{r.name:<22}{r.feedback:>10}{r.inputs:>10}{r.edges:>7}{r.features:>7}"
              f"{r.corpus:>8}{r.crashes:>9}{r.seconds:>8.1f}", flush=True)
        if r.crashes:
            print(f"  crash: {r.error}", flush=True)
            if r.artifact:
                print(f"  reproduce: {reproducer(key, a, r.artifact)}", flush=True)
    if any(r.feedback != "python" for r in results) and not a.json:
        print("no coverage from the Cython code of sfc_fast (not instrumented): feedback "
              "'outcome' counts kinds of refusal instead (cov: how many were seen)")
    crashed = any(r.crashes for r in results)
    if crashed or a.keep:
        print(f"corpora, logs and crashing inputs kept in {work}",
              file=sys.stderr if a.json else sys.stdout)
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if crashed else 0


if __name__ == "__main__":
    sys.exit(main())
