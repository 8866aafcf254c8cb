"""One read of the system's parent ids, shared by every tree observer for a short while.

Finding a tree's new children needs the parent id of every process on the machine. Read
once per observer per sample, that is ``runs x processes`` reads per interval: at 500
observed runs on a machine with 1,000 processes, 100,000 ``/proc`` reads per 5 s interval,
most of the supervisor's CPU. A :class:`ProcessTable` reads the table once and hands the
same answer to every observer that asks within ``max_age`` seconds, so the cost is one
read per ``max_age`` whatever the number of runs.

What it costs in freshness: a child started after the shared read is found at its tree's
next sample after the table expires (at most ``max_age`` + one interval late), exactly as a
child started after a private read waits for the next sample. A stale table can name a pid
that exited since and now belongs to another process, so :class:`TreeObserver` re-reads
each candidate's parent before it admits it (see ``_admit``).

Known members are not read. What an observer looks up in the table is the children of its
members that it does not know yet, so the parent of a process that is already a member of
a tree being sampled is never needed: the hub names those pids when it expires the table at
a tick (``expire(skip=...)``), and the read passes over their ``stat`` files. With 500 runs
each a one-process tree, that is ~500 of the ~570 files a tick read. The one case it
delays: a member that exited and whose pid was taken, before the tick's read, by a new
child of another member; that child is found a tick later, once the exited member is gone
from its tree.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from typing import TYPE_CHECKING

import psutil  # type: ignore[import-untyped, unused-ignore]

from braid_actors.workers._procstat import read_proc_counters

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Set

_PROC = "/proc"


class ProcessTable:
    """pid → ppid of every process readable now, re-read at most every ``max_age`` seconds.

    Thread-safe: observers sample in worker threads; one read at a time, and an observer
    that arrives while a read is in progress waits for it and shares its answer.
    ``max_age=0`` reads anew on every call (a private observer's behaviour).
    """

    def __init__(
        self,
        max_age: float = 0.0,
        *,
        clock: Callable[[], float] = time.monotonic,
        read: Callable[[Set[str]], Mapping[int, int]] | None = None,
    ) -> None:
        if max_age < 0:
            raise ValueError("max_age must not be negative")
        self.max_age = max_age
        self._clock = clock
        self._read = read or read_parent_ids
        self._lock = threading.Lock()
        self._table: Mapping[int, int] | None = None
        self._children: dict[int, tuple[int, ...]] | None = None
        self._read_at = 0.0
        self._skip: Set[str] = frozenset()
        self.reads = 0
        """How many times the system's table was actually read (for tests and benchmarks)."""

    def parents(self) -> Mapping[int, int]:
        """The shared table (do not modify it)."""
        with self._lock:
            return self._fresh()

    def children(self) -> Mapping[int, tuple[int, ...]]:
        """ppid → its children's pids in ascending order, from the same shared read (built
        once per read: every observer needs it, and building it costs a pass over the
        whole table)."""
        with self._lock:
            table = self._fresh()
            if self._children is None:
                grouped: dict[int, list[int]] = {}
                for pid, ppid in table.items():
                    grouped.setdefault(ppid, []).append(pid)
                self._children = {ppid: tuple(sorted(pids)) for ppid, pids in grouped.items()}
            return self._children

    def expire(self, skip: Set[str] = frozenset()) -> None:
        """Make the next caller read the system's table anew, whatever its age, leaving out
        the processes whose pids (as ``/proc`` names them) are in ``skip``: only processes
        that are members of the trees sampled from this read (see the module note)."""
        with self._lock:
            self._table = None
            self._skip = skip

    def _fresh(self) -> Mapping[int, int]:
        now = self._clock()
        if self._table is None or self.max_age == 0 or now - self._read_at >= self.max_age:
            self._table = self._read(self._skip)
            self._children = None
            self._read_at = self._clock()
            self.reads += 1
        return self._table


def read_parent_ids(skip: Set[str] = frozenset()) -> dict[int, int]:
    """pid → ppid for every process readable now (``/proc`` directly on Linux), but those
    whose pids, written in decimal, are in ``skip``."""
    if sys.platform.startswith("linux") and os.path.isdir(_PROC):
        return _from_proc(skip)
    parents: dict[int, int] = {}
    for proc in psutil.process_iter():
        if str(proc.pid) not in skip:
            with contextlib.suppress(psutil.Error):
                parents[proc.pid] = int(proc.ppid())
    return parents


def _from_proc(skip: Set[str]) -> dict[int, int]:
    # /proc/<pid>/stat is "pid (comm) state ppid ...": comm may hold spaces and ")", so the
    # fields are read after the last ")". A process that exits mid-read is simply absent.
    parents: dict[int, int] = {}
    with os.scandir(_PROC) as entries:
        for entry in entries:
            name = entry.name
            if not name.isdigit() or name in skip:
                continue
            try:
                data = read_proc_counters(f"{_PROC}/{name}/stat")
            except OSError:
                continue
            fields = data.rpartition(b")")[2].split(maxsplit=2)
            if len(fields) >= 2:
                with contextlib.suppress(ValueError):
                    parents[int(name)] = int(fields[1])
    return parents
