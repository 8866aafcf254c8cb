"""Naming an OS process so that a reused pid is never mistaken for it.

A pid alone is not an identity: once a process is reaped its number can be given to an
unrelated process. ``(pid, create_time)`` is. psutil computes ``create_time`` from the boot
time and the process's start tick (1/100 s on Linux), so two readings for one process agree
exactly and two processes that share a pid differ by at least one tick; a tolerance of half
a tick separates them.
"""

from __future__ import annotations

import os
from typing import Final, Literal

import attrs
import psutil  # type: ignore[import-untyped, unused-ignore]

CREATE_TIME_TOLERANCE: Final = 0.005
"""Seconds two ``create_time`` readings may differ and still name one process."""

Presence = Literal["running", "zombie", "gone"]
"""``running`` (any live status, stopped included), ``zombie`` (exited, not yet reaped),
or ``gone`` (no such process, or the pid now names another process)."""


@attrs.frozen(order=True)
class ProcessKey:
    """Identity of an OS process: its pid and psutil's creation time."""

    pid: int
    """Operating-system process id."""
    create_time: float
    """psutil's creation time (seconds since the epoch)."""


def same_start(first: float, second: float) -> bool:
    """True when two ``create_time`` readings name the same process."""
    return abs(first - second) <= CREATE_TIME_TOLERANCE


def find_process(key: ProcessKey) -> psutil.Process | None:
    """The psutil handle of ``key``'s process, or ``None`` when it is gone, its pid was
    reused, or its creation time cannot be read (then it cannot be told apart from another
    process, so nothing may act on it). A zombie is still found: it exists until reaped."""
    if key.pid <= 0:
        return None  # 0 and negative numbers name process groups, never one process
    try:
        # Signal 0 checks that the pid exists at all: one syscall, where psutil reads /proc
        # twice. A restart asks this several times for each of its runs' dead workers.
        os.kill(key.pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # it exists (another user's): psutil decides below
    try:
        proc = psutil.Process(key.pid)
        start = float(proc.create_time())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    return proc if same_start(start, key.create_time) else None


def presence(key: ProcessKey) -> Presence:
    """Whether ``key``'s process still runs, is a zombie, or is gone."""
    proc = find_process(key)
    if proc is None:
        return "gone"
    try:
        status = proc.status()
    except psutil.ZombieProcess:
        return "zombie"
    except psutil.NoSuchProcess:
        return "gone"
    except psutil.AccessDenied:
        return "running"  # it exists and is ours by creation time; only its status is hidden
    return "zombie" if status == psutil.STATUS_ZOMBIE else "running"
