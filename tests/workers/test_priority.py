"""A worker runs at a lower CPU priority than the supervisor that started it."""

from __future__ import annotations

import os
import sys

import trio

from braid_actors.workers import open_worker
from braid_actors.workers._process import WORKER_NICE

from ._procs import FAST, read_line

# Reports its own priority, then that of a process it starts, once told to go (the
# supervisor sets the priority right after the spawn, before this reads its input).
SCRIPT = """
import os, subprocess, sys
sys.stdin.readline()
print(os.getpriority(os.PRIO_PROCESS, 0), flush=True)
child = [sys.executable, "-c", "import os; print(os.getpriority(os.PRIO_PROCESS, 0))"]
print(subprocess.run(child, capture_output=True, text=True).stdout, flush=True)
sys.stdin.readline()
"""


async def priorities(nice: int | None) -> tuple[int, int]:
    argv = (sys.executable, "-c", SCRIPT)
    opened = (
        open_worker(argv, policy=FAST)
        if nice is None
        else open_worker(argv, policy=FAST, nice=nice)
    )
    async with opened as worker:
        stdin = worker.process.stdin
        assert stdin is not None
        await stdin.send_all(b"go\n")
        own, child = int(await read_line(worker)), int(await read_line(worker))
        with trio.move_on_after(5):
            await stdin.send_all(b"done\n")
            await worker.wait()
    return own, child


async def test_a_worker_and_what_it_starts_run_below_the_supervisor() -> None:
    """By default a worker is WORKER_NICE steps below its supervisor, and a process it
    starts inherits that; with nice=0 it keeps the supervisor's priority."""
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    lowered = min(19, mine + WORKER_NICE)
    assert lowered > mine or mine == 19  # (a test run at the lowest priority can't go lower)
    assert await priorities(None) == (lowered, lowered)
    assert await priorities(0) == (mine, mine)
