"""A fixed piece of Python work, timed before and after a benchmark: how fast the machine ran.

The same code's figures moved by tens of percent between minutes on the shared machines the
benchmarks run on (the same supervisor code measured 52% and 79% of a core within an
hour). A figure read beside this one can be compared across runs: when the reference took
longer, the machine was slower. It is single-threaded object churn of the kinds Braid
spends its time on (dicts, JSON, hashing, sorting), and takes ~20-40 ms a run. It runs in
a fresh interpreter: run in the benchmark's own process after the benchmark, it took twice
as long (the process then holds the benchmark's heap), which said nothing of the machine.
"""

from __future__ import annotations

import gc
import hashlib
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson

ROUNDS = 7
WARM_UP = 0.5
"""Seconds of the work run first and not timed: after an idle spell the first runs here took
35 ms where the next ones took 21-23 (ten fresh interpreters in a row)."""


def _work() -> int:
    rows: list[dict[str, Any]] = [
        {"seq": i, "text": str(i) * 4, "parts": [i, i + 1, None]} for i in range(10_000)
    ]
    blob = orjson.dumps(rows)
    for _ in range(3):
        rows = orjson.loads(blob)
    digest = hashlib.sha256()
    for row in rows:
        digest.update(repr(row).encode())
    rows.sort(key=lambda row: str(row["text"]))
    return len(digest.hexdigest()) + len(rows)


def reference_ms() -> float:
    """The median wall milliseconds of :data:`ROUNDS` runs of the fixed work, after
    :data:`WARM_UP` seconds of it not counted, with the cyclic collector off (what is timed
    is the same each time)."""
    times = []
    enabled = gc.isenabled()
    gc.disable()
    try:
        warm_until = time.perf_counter() + WARM_UP
        while time.perf_counter() < warm_until:
            _work()
        for _ in range(ROUNDS):
            start = time.perf_counter()
            _work()
            times.append((time.perf_counter() - start) * 1000)
    finally:
        if enabled:
            gc.enable()
    return statistics.median(times)


def reference_ms_fresh() -> float:
    """:func:`reference_ms` measured in a new interpreter (see the module note)."""
    done = subprocess.run(
        [sys.executable, "-m", "tools.benchmarks._reference"],
        capture_output=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
        timeout=120,
    )
    return float(done.stdout)


if __name__ == "__main__":
    print(f"{reference_ms():.3f}")
