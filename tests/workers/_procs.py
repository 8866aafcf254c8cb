"""Real processes for the worker tests, and the checks that none is left behind."""

from __future__ import annotations

import os
import signal
import sys
from contextlib import asynccontextmanager, suppress
from typing import TYPE_CHECKING

import psutil  # type: ignore[import-untyped, unused-ignore]
import trio

from braid_actors.workers import ProcessKey, StopPolicy, open_worker
from braid_actors.workers._identity import presence

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterable

    from braid_actors.workers import ProcessInfo, WorkerProcess

SPAWN_CHILD = (
    "import subprocess, sys, time\n"
    "print('ready', flush=True)\n"
    "sys.stdin.readline()\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])\n"
    "print(child.pid, flush=True)\n"
    "time.sleep(30)\n"
)
"""Waits for a line on stdin, then starts one child and prints its pid."""


def open_stat_files(pid: int) -> int:
    """How many files this process has open on ``/proc/<pid>/stat``."""
    target, count = f"/proc/{pid}/stat", 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == target:
                count += 1
        except OSError:  # the listing's own descriptor, closed meanwhile
            continue
    return count


FAST = StopPolicy(grace=0.1, term_grace=0.5, kill_grace=2.0)


@asynccontextmanager
async def python(script: str, *args: str) -> AsyncIterator[WorkerProcess]:
    """``python -c script`` as a worker; on exit its group is gone (asserted)."""
    async with shell_command((sys.executable, "-c", script, *args)) as worker:
        yield worker


@asynccontextmanager
async def shell_command(argv: tuple[str, ...]) -> AsyncIterator[WorkerProcess]:
    info: ProcessInfo | None = None
    try:
        async with open_worker(argv, policy=FAST) as worker:
            info = worker.info
            yield worker
    finally:
        if info is not None:
            await assert_gone([info.key])


async def assert_gone(keys: Iterable[ProcessKey]) -> None:
    """Kill whichever of ``keys`` still runs, then assert (bounded) that none does."""
    keys = list(keys)
    for key in keys:
        if presence(key) == "running":
            with suppress(ProcessLookupError):
                os.kill(key.pid, signal.SIGKILL)
    with trio.move_on_after(3):
        # Nothing signals the exit of a process we did not spawn (or whose reaper is not us).
        while any(presence(key) == "running" for key in keys):  # noqa: ASYNC110
            await trio.sleep(0.02)
    still = [key for key in keys if presence(key) == "running"]
    assert not still, f"processes left running: {still}"


def key_of(pid: int) -> ProcessKey:
    return ProcessKey(pid=pid, create_time=float(psutil.Process(pid).create_time()))


async def read_line(worker: WorkerProcess) -> str:
    """The next stdout line of a plain (non-protocol) worker."""
    with trio.fail_after(5):
        line = await worker.reader.receive_line()
    assert line is not None, "the worker closed stdout"
    return line.decode().strip()
