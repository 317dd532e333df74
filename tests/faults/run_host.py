"""``sfc-host run --config CONFIG`` with a wall clock that can jump, for the fault tests.

    FAULT_CLOCK_JUMPS="1.5:3600,3:-7200" python tests/faults/run_host.py CONFIG

Each ``AFTER:SECONDS`` moves this process's ``time.time``/``time.time_ns`` by SECONDS
(cumulative), AFTER seconds after the start (of the real clock). No root tricks are
needed: the jumps live in this process only (libfaketime is not assumed), and the
host must not care, since every deadline is taken from the Redis server clock.
Without the variable it is plain ``sfc-host run``.
"""

from __future__ import annotations

import os
import sys
import time


def _install(spec: str) -> None:
    real_time, real_ns = time.time, time.time_ns
    t0 = real_time()
    jumps = []
    for part in spec.split(","):
        after, _, by = part.partition(":")
        jumps.append((t0 + float(after), float(by)))

    def offset(now: float) -> float:
        return sum(by for at, by in jumps if now >= at)

    def fake_time() -> float:
        now = real_time()
        return now + offset(now)

    def fake_ns() -> int:
        now = real_ns()
        return now + int(offset(now / 1e9) * 1e9)

    time.time = fake_time
    time.time_ns = fake_ns


if __name__ == "__main__":
    if os.environ.get("FAULT_CLOCK_JUMPS"):
        _install(os.environ["FAULT_CLOCK_JUMPS"])
    from sfc_host.cli.main import main

    sys.exit(main(["run", "--config", sys.argv[1]]))
