"""Job id and scope checks (no server)."""

from __future__ import annotations

import pytest

from sfc_host.names import MAX_JOB_ID, InvalidName, check_job


def _allowed(ch: str) -> bool:
    # the documented rule: no control characters, braces (the cluster hash tag) or '#'
    return ord(ch) >= 32 and ch not in "{}#"


@pytest.mark.parametrize("block", range(0, 0x110000, 0x11000))
def test_a_job_id_character_is_refused_exactly_by_the_rule(block: int) -> None:
    for code in range(block, min(block + 0x11000, 0x110000)):
        ch = chr(code)
        job = f"J{ch}1"
        if _allowed(ch):
            assert check_job(job) == job
        else:
            with pytest.raises(InvalidName, match="invalid job id"):
                check_job(job)


@pytest.mark.parametrize("job", ["", "x" * (MAX_JOB_ID + 1), None, 7, b"J1"])
def test_a_job_id_that_is_empty_too_long_or_no_string_is_refused(job: object) -> None:
    with pytest.raises(InvalidName, match="invalid job id"):
        check_job(job)  # type: ignore[arg-type]


def test_the_longest_job_id_passes() -> None:
    assert check_job("x" * MAX_JOB_ID) == "x" * MAX_JOB_ID
