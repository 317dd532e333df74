"""benchmarks/fuzz_guided.py: coverage-guided fuzzing (atheris) of the six decoders.

A small run of every decoder, and a planted bug the harness must find and reproduce;
both skip without atheris (an optional extra, ``pip install '.[fuzz]'``). The bytes
mapping of each decoder and the missing-atheris path run everywhere.
"""

from __future__ import annotations

import importlib.util
import random
import re
import shlex
import shutil
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

# benchmarks/fuzz_guided.py loads this file as a target in a process of its own
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # tests/, for helpers
from helpers.paths import benchmarks_on_path

benchmarks_on_path()
import fuzz  # noqa: E402 (benchmarks/ on sys.path first)
import fuzz_guided as fg  # noqa: E402

needs_atheris = pytest.mark.skipif(
    importlib.util.find_spec("atheris") is None,
    reason="atheris is not installed (optional: pip install '.[fuzz]')")

# decoder, feedback, inputs, cov, ft, corpus, crashes (then the time)
ROW = re.compile(r"^(.+?)\s+(python|outcome|none)" + r"\s+(\d+)" * 5 + r"\s+[\d.]+$", re.M)


def _accepts(target: fg.Target, x: Any) -> bool:
    try:
        target.decoder.run(x)
    except target.decoder.error:
        return False
    return True


def test_every_decoder_of_fuzz_py_has_a_target() -> None:
    assert list(fg.TARGETS) == list(fuzz.DECODERS)


@pytest.mark.parametrize("key", list(fg.TARGETS))
def test_an_accepted_input_is_still_accepted_after_its_bytes_round_trip(key: str) -> None:
    """The seed corpus is bytes: a valid seed must stay valid through write and read."""
    target = fg.TARGETS[key]()
    rng = random.Random(5)
    inputs = [*target.seeds, *(target.decoder.make(rng) for _ in range(target.samples))]
    accepted = [x for x in inputs if _accepts(target, x)]
    assert len(accepted) >= 3, key
    for x in accepted:
        assert _accepts(target, target.read(target.write(x))), (key, x)


def test_without_atheris_one_line_and_exit_0(monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "atheris" else real(name, *a))
    assert fg.main(["-n", "10"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "atheris is not installed" in out


@needs_atheris
def test_a_small_run_of_every_decoder_ends_without_crashes(
        capsys: pytest.CaptureFixture[str]) -> None:
    rc = fg.main(["-n", "2000"])
    out = capsys.readouterr().out
    assert rc == 0, out
    rows = {m[1]: m.groups()[1:] for m in ROW.finditer(out)}
    assert list(rows) == ["recipe compiler", "condition parser", "CloudEvent decoder",
                          "stream entry parser", "state decoder", "MQTT packet reader"], out
    for name, (feedback, inputs, cov, _ft, _corpus, crashes) in rows.items():
        assert int(inputs) == 2000 and int(crashes) == 0, (name, out)
        # the Python decoders are instrumented; the Cython ones feed back their refusals
        python = name in ("CloudEvent decoder", "stream entry parser")
        assert feedback == ("python" if python else "outcome") and int(cov) > 0, (name, out)
    assert "no coverage from the Cython code of sfc_fast" in out


def planted() -> fg.Target:
    """The stream target with a parser that reads the kind field without checking it:
    a KeyError once a mutation drops or changes the ``k`` field of the seed (the empty
    input libFuzzer tries first is refused)."""
    target = fg.stream_target()

    def parse(fields: dict[bytes, bytes]) -> bytes:
        if not fields:
            raise target.decoder.error("an empty entry")
        return fields[b"k"]

    return replace(target, decoder=replace(target.decoder, name="planted parser", run=parse),
                   seeds=[{b"k": b"start", b"j": b"J1"}], samples=0, covered=False)


@needs_atheris
def test_a_planted_crash_is_found_with_a_reproducer(
        capsys: pytest.CaptureFixture[str]) -> None:
    rc = fg.main(["-n", "200000", "--only", "stream", "--target", f"{__file__}:planted"])
    out = capsys.readouterr().out
    kept = re.search(r"kept in (.+)$", out, re.M)
    try:
        assert rc == 1, out
        row = ROW.search(out)
        assert row and row[1] == "planted parser" and row[7] == "1", out
        assert int(row[3]) > 1, out                 # found by a mutation, not the seed
        assert "crash: KeyError" in out, out
        line = re.search(r"reproduce: (.+)$", out, re.M)
        assert line, out
        args = shlex.split(line[1])
        assert args[0] == "python" and args[1].endswith("fuzz_guided.py"), args
        assert fg.main(args[2:]) == 1            # the written input crashes again
        replay = capsys.readouterr()
        assert "KeyError" in replay.err and "planted parser: crash" in replay.out
    finally:
        if kept:
            shutil.rmtree(kept[1], ignore_errors=True)
