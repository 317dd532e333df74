"""Counters of one host instance (exported by the metrics endpoint of the MQTT side)."""

from __future__ import annotations

from collections import Counter


class Metrics:
    """Named counters; ``inc`` is cheap enough for the hot path."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def inc(self, name: str, n: int = 1) -> None:
        self.counts[name] += n

    def __getitem__(self, name: str) -> int:
        return self.counts[name]

    def snapshot(self) -> dict[str, int]:
        return dict(self.counts)
