"""Compile and load times of generated recipes, printed as a table.

    python benchmarks/recipe_ratio.py

Also prints the ratio of compiling to merely parsing the JSON text with the
standard library (a floor no compiler that starts from text can beat).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from helpers.recipes import V110, generated

from sfc_fast import Graph, compile_recipe


def median_time(fn, repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def main() -> None:
    print(f"{'steps':>7} {'compile dict':>13} {'compile text':>13} {'json.loads':>11} "
          f"{'from_bytes':>11} {'graph bytes':>12}")
    for n in (10, 100, 1000, 10_000):
        r = generated(n)
        text = json.dumps(r)
        g = compile_recipe(r, V110)
        blob = g.to_bytes()
        rep = 200 if n <= 1000 else 20
        c_dict = median_time(lambda r=r: compile_recipe(r, V110), rep)
        c_text = median_time(lambda t=text: compile_recipe(t, V110), rep)
        parse = median_time(lambda t=text: json.loads(t), rep)
        load = median_time(lambda b=blob: Graph.from_bytes(b), rep * 10)
        print(f"{n:>7} {c_dict * 1e3:>10.3f} ms {c_text * 1e3:>10.3f} ms "
              f"{parse * 1e3:>8.3f} ms {load * 1e6:>8.1f} µs {len(blob):>12,}")


if __name__ == "__main__":
    main()
