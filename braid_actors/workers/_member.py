"""Reading one member of a process tree: its figures from its ``/proc`` files (psutil
where those cannot be read), kept from one sample to the next while its stat line stays
the same (see :func:`read_from_stat`). :class:`~braid_actors.workers.TreeObserver` reads
each member of its tree this way."""

from __future__ import annotations

import contextlib
import math
import os
from typing import TYPE_CHECKING, TypeVar

import attrs
import psutil  # type: ignore[import-untyped, unused-ignore]

from braid_actors.workers import _procstat
from braid_actors.workers._identity import ProcessKey, same_start
from braid_actors.workers._process import ProcessInfo

if TYPE_CHECKING:
    from collections.abc import Callable

_T = TypeVar("_T")


@attrs.frozen
class ProcessSnapshot:
    """One tree member as a sample saw it."""

    key: ProcessKey
    """Its identity."""
    ppid: int | None
    """Its parent's pid (it changes when the parent exits); null when unreadable."""
    pgid: int | None
    """Its process group; null when unreadable."""
    argv: tuple[str, ...] | None
    """Its command line, cut to the observer's bound (by default
    :data:`~braid_actors.workers.ARGV_LIMIT` characters); a zombie keeps its last; null when
    never readable."""
    argv_truncated: bool
    """True when ``argv`` was cut."""
    status: str
    """psutil's status (``running``, ``sleeping``, ``stopped``, ``zombie``...), or
    ``unknown`` when unreadable."""
    cpu_seconds: float | None
    """Its own user + system time plus that of the children it reaped; null when unreadable."""
    rss_bytes: int | None
    """Its resident set size; null when unreadable."""

    @property
    def pid(self) -> int:
        return self.key.pid

    @property
    def create_time(self) -> float:
        return self.key.create_time

    def info(self) -> ProcessInfo | None:
        """Its identity for the controls (``None`` when its group was unreadable)."""
        if self.pgid is None:
            return None
        return ProcessInfo(
            pid=self.pid, create_time=self.create_time, pgid=self.pgid, command=self.argv or ()
        )


@attrs.define(eq=False)
class Member:
    """One process of a tree, and what its readings keep between samples."""

    key: ProcessKey
    proc: psutil.Process
    parent: ProcessKey | None
    """The running member that was its parent at the last sample, if any."""
    cpu: float | None = None
    """Its last-read total: own time plus ``reaped``."""
    reaped: float | None = None
    """Its last-read children time (descendants it reaped)."""
    owed: float = 0.0
    """Retired time of gone descendants that its children time may still absorb."""
    zombie: bool = False
    argv: tuple[str, ...] | None = None
    """Its last-read command line, bounded."""
    argv_truncated: bool = False
    start_tick: int | None = None
    """Its start tick once a stat line was read for it (its identity from then on)."""
    comm: bytes | None = None
    """Its executable's name when ``argv`` was read from ``/proc`` (an exec changes both)."""
    args_at: tuple[int, int] | None = None
    """Where its command line lay in its memory when ``argv`` was read (``StatLine.args_at``:
    an exec lays it out anew, also when it keeps the executable's name)."""
    line: bytes | None = None
    """Its last stat line, when ``reading`` holds what was read with a line of the same
    identity (``_procstat.stat_identity``)."""
    reading: Reading | None = None
    """Its last complete reading (figures, resident set and command line all read)."""
    reported: tuple[str, ...] | None = None
    """The command line its samples reported so far (null before its first; see
    ``TreeSample.execs``)."""
    stat: _procstat.StatFile | None = None
    """Its stat file, kept open between readings (see ``_procstat.StatFile``)."""

    def release(self) -> None:
        """Close what it keeps open (its observer does, when it leaves the tree)."""
        if self.stat is not None:
            self.stat.close()
            self.stat = None


@attrs.frozen
class Reading:
    """One member's figures at one sample."""

    snapshot: ProcessSnapshot
    reaped: float | None
    zombie: bool
    readable: bool


def read_member(member: Member, argv_limit: int) -> Reading | None:
    """One member's figures, or ``None`` when it is gone (or its pid was reused).

    The command line is read again after an exec (a child caught between ``fork`` and
    ``exec`` shows its parent's until the next sample); a zombie keeps its last one.
    """
    if _procstat.AVAILABLE:
        with contextlib.suppress(_procstat.Unreadable):
            return read_from_stat(member, argv_limit)
    proc, key = member.proc, member.key
    try:
        if not proc.is_running():  # re-reads the creation time: a reused pid is gone
            return None
        with proc.oneshot():
            status = _attempt(proc.status) or "unknown"
            zombie = status == psutil.STATUS_ZOMBIE
            ppid = _attempt(proc.ppid)
            times = _attempt(proc.cpu_times)
            memory = None if zombie else _attempt(proc.memory_info)
            argv = None if zombie else _attempt(proc.cmdline)
    except psutil.ZombieProcess:
        status, zombie, ppid, times, memory, argv = "zombie", True, None, None, None, None
    except psutil.NoSuchProcess:
        return None
    pgid: int | None = None
    with contextlib.suppress(OSError):
        pgid = os.getpgid(key.pid)
    cpu, reaped = (None, None) if times is None else _cpu_split(times)
    rss = None if memory is None else int(memory.rss)
    if argv is not None:
        member.argv, member.argv_truncated = _bounded(argv, argv_limit)
    snapshot = ProcessSnapshot(
        key=key,
        ppid=ppid,
        pgid=pgid,
        argv=member.argv,
        argv_truncated=member.argv_truncated,
        status=str(status),
        cpu_seconds=cpu,
        rss_bytes=rss,
    )
    readable = status != "unknown" and cpu is not None and (zombie or rss is not None)
    return Reading(snapshot=snapshot, reaped=reaped, zombie=zombie, readable=readable)


def read_from_stat(member: Member, argv_limit: int) -> Reading | None:
    """:func:`read_member` from one stat line (see ``_procstat``); raises
    :class:`~braid_actors.workers._procstat.Unreadable` when psutil must read it."""
    key = member.key
    stat = member.stat
    if stat is None:
        stat = member.stat = _procstat.StatFile.open(key.pid)
        if stat is None:
            return None
    data = stat.read()
    if data is None:
        return None
    last = member.line
    if last is not None and (
        data == last or _procstat.stat_identity(data) == _procstat.stat_identity(last)
    ):
        # The same line up to the CPU it last ran on, byte for byte: the same process
        # (the start tick), state, parent, group, CPU ticks, name, fault counts, size
        # and approximate resident set. The resident set can grow only by faults
        # (counted in the line) or by changes the line's approximate figure shows once
        # they pass its per-CPU batches, so the last reading stands; a sample of an
        # idle tree reads one file a member instead of two and parses nothing else.
        member.line = data
        return member.reading
    line = _procstat.parse_stat(key.pid, data)
    if member.start_tick is None:
        # First reading: the pid must still name the process psutil saw (its creation
        # time is the boot time plus the start tick); from now on the tick names it.
        try:
            start = psutil.boot_time() + line.start_tick / _procstat.TICKS
        except psutil.Error:
            raise _procstat.Unreadable("the boot time cannot be read") from None
        if not same_start(start, key.create_time):
            return None
        member.start_tick = line.start_tick
    elif line.start_tick != member.start_tick:
        return None  # the pid was reused: this member is gone
    zombie = line.zombie
    rss = None
    if not zombie:
        rss = _procstat.read_rss(key.pid)
        # The command line changes with an exec, and an exec names the executable anew
        # and lays the arguments out anew in the new memory (their addresses are in the
        # line, the same name or not): read it again only then (or while it could not be
        # read). Read every sample, it was a third of the reads of a tick of 500 idle
        # runs, for a figure nothing uses after a member is found. A process that
        # rewrites its own title in place is seen by its first reading only. An empty
        # line is read again: the kernel names the new executable before it lays out the
        # new arguments, so a reading in the middle of an exec finds the new name and no
        # arguments yet.
        if member.comm is None or line.comm != member.comm or line.args_at != member.args_at:
            argv = _procstat.read_argv(key.pid)
            if argv is not None:
                member.argv, member.argv_truncated = _bounded(argv, argv_limit)
                member.comm = line.comm if argv else None
                member.args_at = line.args_at
    cpu, reaped = _cpu_split(line)  # the same fields psutil's cpu_times names
    snapshot = ProcessSnapshot(
        key=key,
        ppid=line.ppid,
        pgid=line.pgid,
        argv=member.argv,
        argv_truncated=member.argv_truncated,
        status=line.status,
        cpu_seconds=cpu,
        rss_bytes=rss,
    )
    readable = zombie or rss is not None
    reading = Reading(snapshot=snapshot, reaped=reaped, zombie=zombie, readable=readable)
    # Kept for the next sample only when complete: a figure or a command line that could
    # not be read (or an empty one, mid-exec) is read again.
    settled = readable and (zombie or member.comm is not None)
    member.line, member.reading = (data, reading) if settled else (None, None)
    return reading


def _attempt(read: Callable[[], _T]) -> _T | None:
    """``read()``, or ``None`` when access is denied (a missing figure, not a failure)."""
    try:
        return read()
    except psutil.AccessDenied:
        return None


def _cpu_split(times: object) -> tuple[float, float]:
    """(own + reaped children, reaped children) from psutil's ``cpu_times``."""
    own = math.fsum(float(getattr(times, name, 0.0)) for name in ("user", "system"))
    reaped = math.fsum(
        float(getattr(times, name, 0.0)) for name in ("children_user", "children_system")
    )
    return own + reaped, reaped


def _bounded(argv: list[str] | None, limit: int) -> tuple[tuple[str, ...] | None, bool]:
    if argv is None:
        return None, False
    kept: list[str] = []
    room = limit
    for arg in argv:
        if len(arg) > room:
            if room > 0:
                kept.append(arg[:room])
            return tuple(kept), True
        kept.append(arg)
        room -= len(arg)
    return tuple(kept), False
