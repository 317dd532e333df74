"""The tighten_rework recipe's answers, shared by the in-process fault tests
(execution/test_host_faults.py) and the fault harness's station (faults/): a job's
tightening is out of tolerance ``reworks(job)`` times, decided by the command number,
so a command seen twice gets the same answer."""

from __future__ import annotations

from typing import Any


def reworks(job: str) -> int:
    """How often the job's tightening is out of tolerance before it is in (0-2)."""
    return int(job[1:]) % 3


def expected_ids(job: str) -> list[str]:
    """The command ids of a tighten_rework job under ``torque_for``, in order."""
    ids = [f"{job}:load_part#1"]
    n = 2
    for _ in range(reworks(job)):
        ids += [f"{job}:tighten#{n}", f"{job}:loosen#{n + 1}"]
        n += 2
    return [*ids, f"{job}:tighten#{n}", f"{job}:unload_part#{n + 1}"]


def torque_for(job: str, command_id: str) -> dict[str, Any] | None:
    """The answer to a command: tightening out of tolerance ``reworks(job)`` times.
    Decided by the command number, so a command seen twice gets the same answer."""
    if ":tighten#" not in command_id:
        return None
    n = int(command_id.rsplit("#", 1)[1])
    return {"torque": 70 if n < 2 + 2 * reworks(job) else 85}
