"""A worker runs at a lower CPU priority than the supervisor that started it, as a batch task."""

from __future__ import annotations

import os
import sys

import trio

from braid_actors.workers import open_worker
from braid_actors.workers._process import WORKER_NICE, _yield_to_supervisor

from ._procs import FAST, read_line

# Reports its own priority and scheduling policy, then those of a process it starts, once
# told to go (the supervisor sets them right after the spawn, before this reads its input).
SCRIPT = """
import os, subprocess, sys
sys.stdin.readline()
print(os.getpriority(os.PRIO_PROCESS, 0), os.sched_getscheduler(0), flush=True)
child = [
    sys.executable,
    "-c",
    "import os; print(os.getpriority(os.PRIO_PROCESS, 0), os.sched_getscheduler(0))",
]
print(subprocess.run(child, capture_output=True, text=True).stdout, flush=True)
sys.stdin.readline()
"""


async def priorities(nice: int | None) -> tuple[str, str]:
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
        own, child = (await read_line(worker)).strip(), (await read_line(worker)).strip()
        with trio.move_on_after(5):
            await stdin.send_all(b"done\n")
            await worker.wait()
    return own, child


async def test_a_worker_and_what_it_starts_run_below_the_supervisor() -> None:
    """By default a worker is WORKER_NICE steps below its supervisor and a batch task, and a
    process it starts inherits both; with nice=0 it keeps the supervisor's."""
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    lowered = min(19, mine + WORKER_NICE)
    assert lowered > mine or mine == 19  # (a test run at the lowest priority can't go lower)
    policy = os.sched_getscheduler(0)
    assert policy != os.SCHED_BATCH
    below = f"{lowered} {os.SCHED_BATCH}"
    assert await priorities(None) == (below, below)
    assert await priorities(0) == (f"{mine} {policy}", f"{mine} {policy}")


# Starts a thread, says so, and once told to go prints the priority and policy each of its
# two threads sees for itself.
THREADED = """
import os, sys, threading
go = threading.Event()
seen = []
def report():
    go.wait()
    seen.append((os.getpriority(os.PRIO_PROCESS, 0), os.sched_getscheduler(0)))
thread = threading.Thread(target=report)
thread.start()
print("started", flush=True)
sys.stdin.readline()
go.set()
thread.join()
print(os.getpriority(os.PRIO_PROCESS, 0), os.sched_getscheduler(0), *seen[0], flush=True)
sys.stdin.readline()
"""


async def test_every_thread_a_worker_already_has_is_lowered() -> None:
    """Linux keeps priority and policy per thread: a thread the worker started before the
    supervisor lowered it is lowered too."""
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    lowered = min(19, mine + WORKER_NICE)
    async with open_worker((sys.executable, "-c", THREADED), policy=FAST, nice=0) as worker:
        assert (await read_line(worker)).strip() == "started"
        _yield_to_supervisor(worker.process.pid, WORKER_NICE)
        stdin = worker.process.stdin
        assert stdin is not None
        await stdin.send_all(b"go\n")
        main, main_policy, thread, thread_policy = map(int, (await read_line(worker)).split())
        with trio.move_on_after(5):
            await stdin.send_all(b"done\n")
            await worker.wait()
    assert (main, main_policy) == (lowered, os.SCHED_BATCH)
    assert (thread, thread_policy) == (lowered, os.SCHED_BATCH)
