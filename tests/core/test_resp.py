"""The core's RESP packer gives hiredis's bytes for every argument, and hiredis's
errors for what it refuses (its fast path takes exact bytes, str and 64-bit ints; any
other argument hands the command to hiredis)."""

from __future__ import annotations

from typing import Any

import hiredis
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sfc_fast.wire.resp import pack_command

ARG = st.one_of(st.binary(max_size=300), st.text(max_size=60),
                st.integers(min_value=-(2 ** 63), max_value=2 ** 63 - 1),
                st.integers(), st.floats(allow_nan=False), st.sampled_from([0, -1, 9, 10]))


@settings(max_examples=400)
@given(st.lists(ARG, min_size=1, max_size=40))
def test_packs_what_hiredis_packs(args: list[Any]) -> None:
    assert pack_command(tuple(args)) == hiredis.pack_command(tuple(args))


@pytest.mark.parametrize("args", [
    ("EVALSHA", "0" * 40, 2, "k1", "k2", b"", b"\x00\r\n", -(2 ** 63), 2 ** 63 - 1,
     2 ** 64, -(2 ** 64), "é…", 10 ** 18, 0),
    tuple(range(-1200, 1200, 7)),
    (b"x" * 100_000,),
    ("SET", memoryview(b"ab"), 1.5),
])
def test_edges(args: tuple[Any, ...]) -> None:
    assert pack_command(args) == hiredis.pack_command(args)


@pytest.mark.parametrize("bad", [None, True, bytearray(b"x"), ["a"], "\ud800"])
def test_what_hiredis_refuses_is_refused_alike(bad: Any) -> None:
    with pytest.raises(Exception) as theirs:
        hiredis.pack_command(("SET", "k", bad))
    with pytest.raises(type(theirs.value)):
        pack_command(("SET", "k", bad))


def test_an_empty_command_is_hiredis_s_too() -> None:
    try:
        want: Any = hiredis.pack_command(())
    except Exception as e:      # whatever hiredis does with it, we do too
        with pytest.raises(type(e)):
            pack_command(())
        return
    assert pack_command(()) == want
