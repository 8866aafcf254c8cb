"""Sampling a worker's process tree with psutil: CPU, memory, and who is in it.

Design note. The *tree* of a root process is the root plus every process ever seen as a
child of a tree member, for as long as that process lives: a member stays a member when it
is re-parented (its parent exited, or it double-forked after being seen), so the stragglers
of an exited root are still watched. A process re-parented away before it was first
sampled (a daemon that double-forks between two samples) is never seen. A process is named
by :class:`ProcessKey` ``(pid, create_time)``; a reused pid is a different process.

:class:`TreeObserver` is the synchronous core: each :meth:`~TreeObserver.sample` reads every
member once (under ``psutil.Process.oneshot``), finds new children from one pass over the
system's parent ids, and reports what changed: ``new`` (first seen, never the root) and
``exited`` (seen exiting since the previous sample, root included) are distinct deltas. A
process that vanishes or turns zombie in the middle of a sample is an exit; one whose figures
cannot be read (``AccessDenied``) is listed in ``unreadable``; neither is an error.
:func:`observe_tree` drives the core from trio, running each sample in a worker thread,
until the tree is empty or the caller cancels.

What the figures count.

* ``cpu_seconds``: user + system time of every running or zombie member, each including its
  ``children_user + children_system`` (the time of the exited descendants it reaped with
  ``wait``, which the kernel adds to the reaper), plus *retired* time: the last-sampled total
  of members that are gone and whose time no member's children time absorbed. When a member
  goes, its total is first matched against the growth of its nearest surviving ancestor's
  children time (that ancestor reaped it); what the growth does not cover is retired, and
  taken back if the ancestor's children time grows by it later (a reap that raced the
  sample). The root is reaped by Braid and orphans by init, so their time is retired. The
  reported figure is the largest total seen, so it never decreases.
  Not counted: time a member used after its last sample when it is reaped outside the tree
  (so the root's last interval); descendants auto-reaped by a parent that ignores
  ``SIGCHLD`` (the kernel adds nothing to the parent) after their last sample; processes
  never sampled that were reaped outside the tree. A never-sampled child reaped inside the
  tree *is* counted (through its reaper), but its time can mask a retired member's. So the
  figure is a lower bound; it is not inflated by double counting, except that a member
  acting as a child subreaper for members that outlived their parent is not modelled.
* ``rss_bytes``: the sum of the resident set sizes of the running members at this sample.
  Pages shared between members (fork copies, shared libraries) are counted once per member,
  so the sum can exceed the physical memory in use; ``peak_rss_bytes`` is the largest sum at
  any sample (a spike between two samples is not seen). On Linux a member whose stat line
  did not change keeps its previous reading (see :meth:`TreeObserver._read_stat`): a growth
  made without a fault (another process writing into its memory) and too small to move the
  line's approximate figure (under its per-CPU batches) waits for the next change.
* ``wall_seconds``: from the root's creation time to this sample, frozen at the first sample
  that finds the root exited.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from typing import TYPE_CHECKING, Final, TypeVar

import attrs
import psutil  # type: ignore[import-untyped, unused-ignore]
import trio

from braid_actors.workers import _procstat
from braid_actors.workers._identity import CREATE_TIME_TOLERANCE, ProcessKey, same_start
from braid_actors.workers._process import ProcessInfo
from braid_actors.workers._proctable import ProcessTable

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

_T = TypeVar("_T")

ARGV_LIMIT: Final = 1024
"""Characters of a process's argv kept in a snapshot (the arguments' lengths summed)."""


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
    """Its command line, cut to the observer's bound (:data:`ARGV_LIMIT` characters by
    default); a zombie keeps its last; null when never readable."""
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


@attrs.frozen
class TreeSample:
    """What one sample of a process tree found (see the module note for what is counted)."""

    root: ProcessKey
    """The tree's root."""
    number: int
    """1 for the first sample of an observer, then 2, 3..."""
    taken_at: float
    """When the sample was taken (seconds since the epoch)."""
    wall_seconds: float
    """Since the root was created; frozen once the root has exited."""
    cpu_seconds: float | None
    """CPU time of the tree so far (a lower bound); null until some member could be read."""
    rss_bytes: int | None
    """Sum of the running members' RSS now; null when none could be read."""
    peak_rss_bytes: int | None
    """Largest ``rss_bytes`` of any sample so far; null until one was read."""
    processes: tuple[ProcessSnapshot, ...]
    """Every running member (the root first while it runs), in pid order otherwise."""
    new: tuple[ProcessSnapshot, ...]
    """Members first seen in this sample (never the root); one may already have exited."""
    exited: tuple[ProcessKey, ...]
    """Members that exited since the previous sample (the root too), in pid order."""
    unreadable: tuple[ProcessKey, ...]
    """Running members some figure of which could not be read (the totals omit it)."""
    repeated: bool = False
    """True when every member read as at the previous sample and no child was new: the
    figures are the previous sample's (only the number, the time and the wall clock moved)."""

    @property
    def root_alive(self) -> bool:
        return bool(self.processes) and self.processes[0].key == self.root

    @property
    def descendants(self) -> tuple[ProcessSnapshot, ...]:
        """The running members other than the root."""
        return tuple(p for p in self.processes if p.key != self.root)

    @property
    def finished(self) -> bool:
        """True when no member runs any more: later samples can only repeat this one."""
        return not self.processes


@attrs.define(eq=False)
class _Member:
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
    line: bytes | None = None
    """Its last stat line, when ``reading`` holds what was read with a line of the same
    identity (``_procstat.stat_identity``)."""
    reading: _Reading | None = None
    """Its last complete reading (figures, resident set and command line all read)."""


@attrs.frozen
class _Reading:
    snapshot: ProcessSnapshot
    reaped: float | None
    zombie: bool
    readable: bool


@attrs.define(eq=False)
class TreeObserver:
    """Samples one process tree; keeps what it needs between samples (see the module note).

    Not thread-safe: call :meth:`sample` from one thread at a time (it may be a different
    thread each time, as with ``trio.to_thread.run_sync``).
    """

    root: ProcessKey
    argv_limit: int = ARGV_LIMIT
    table: ProcessTable = attrs.Factory(ProcessTable)
    """Where new children are looked up; share one between observers (see its module)."""
    _members: dict[ProcessKey, _Member] = attrs.Factory(dict)
    _started: bool = False
    _samples: int = 0
    _retired_cpu: float = 0.0
    _cpu: float | None = None
    _peak_rss: int | None = None
    _root_ended_at: float | None = None
    _last: TreeSample | None = None

    @classmethod
    def of(
        cls,
        root: ProcessKey | ProcessInfo,
        *,
        argv_limit: int = ARGV_LIMIT,
        table: ProcessTable | None = None,
    ) -> TreeObserver:
        key = root.key if isinstance(root, ProcessInfo) else root
        return cls(root=key, argv_limit=argv_limit, table=table or ProcessTable())

    def member_pids(self) -> list[str]:
        """The pids of its members, in decimal (for :meth:`ProcessTable.expire`); call it
        only while no sample is being taken."""
        return [str(key.pid) for key in self._members]

    def sample(self) -> TreeSample:
        """Read the tree once and report what changed since the previous sample."""
        self._samples += 1
        if not self._started:
            self._started = True
            self._adopt_root()
        readings: dict[ProcessKey, _Reading] = {}
        gone: list[_Member] = []
        exited: list[ProcessKey] = []
        if self._samples == 1 and self.root not in self._members:
            exited.append(self.root)  # gone before the first sample
        # Members are kept in discovery order, so a parent is read before its children: a
        # child reaped during the sample is then missing from both readings (and matched
        # later), never counted in both.
        repeated = self._last is not None
        for key, member in list(self._members.items()):
            before = member.reading
            reading = self._read(member)
            repeated = repeated and reading is not None and reading is before
            if reading is None:
                gone.append(member)
                del self._members[key]
                if not member.zombie:
                    exited.append(key)
                continue
            if reading.zombie and not member.zombie:
                exited.append(key)
            member.zombie = reading.zombie
            readings[key] = reading
        if repeated and not exited:
            # Every member read as the previous sample read it (see _read_stat): accounting
            # and totals are the previous sample's, unless the tree found a new child.
            new = self._discover(readings)
            if not new:
                return self._repeat()
        else:
            self._settle(gone, readings)
            new = self._discover(readings)
        for snapshot in new:
            if self._members[snapshot.key].zombie:
                exited.append(snapshot.key)
        self._link_parents(readings)
        self._last = self._summarise(readings, new, exited)
        return self._last

    def _repeat(self) -> TreeSample:
        """The previous sample again, taken now."""
        last = self._last
        assert last is not None
        now = time.time()
        self._last = last = TreeSample(
            root=last.root,
            number=self._samples,
            taken_at=now,
            wall_seconds=self._wall(now, last.root_alive),
            cpu_seconds=last.cpu_seconds,
            rss_bytes=last.rss_bytes,
            peak_rss_bytes=last.peak_rss_bytes,
            processes=last.processes,
            new=(),
            exited=(),
            unreadable=last.unreadable,
            repeated=True,
        )
        return last

    # ---- reading ---------------------------------------------------------------------

    def _adopt_root(self) -> None:
        try:
            proc = psutil.Process(self.root.pid)
            start = float(proc.create_time())
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return  # gone before the first sample: the tree is empty from the start
        if same_start(start, self.root.create_time):
            self._members[self.root] = _Member(key=self.root, proc=proc, parent=None)

    def _read(self, member: _Member) -> _Reading | None:
        """One member's figures, or ``None`` when it is gone (or its pid was reused).

        The command line is read again after an exec (a child caught between ``fork`` and
        ``exec`` shows its parent's until the next sample); a zombie keeps its last one.
        """
        if _procstat.AVAILABLE:
            with contextlib.suppress(_procstat.Unreadable):
                return self._read_stat(member)
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
            member.argv, member.argv_truncated = _bounded(argv, self.argv_limit)
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
        return _Reading(snapshot=snapshot, reaped=reaped, zombie=zombie, readable=readable)

    def _read_stat(self, member: _Member) -> _Reading | None:
        """:meth:`_read` from one stat line (see ``_procstat``); raises
        :class:`~braid_actors.workers._procstat.Unreadable` when psutil must read it."""
        key = member.key
        data = _procstat.read_stat_bytes(key.pid)
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
            # The command line changes with an exec, and an exec names the executable anew:
            # read it again only then (or while it could not be read). Read every sample, it
            # was a third of the reads of a tick of 500 idle runs, for a figure nothing uses
            # after a member is found. A process that rewrites its own title in place is
            # seen by its first reading only. An empty line is read again: the kernel names
            # the new executable before it lays out the new arguments, so a reading in the
            # middle of an exec finds the new name and no arguments yet.
            if member.comm is None or line.comm != member.comm:
                argv = _procstat.read_argv(key.pid)
                if argv is not None:
                    member.argv, member.argv_truncated = _bounded(argv, self.argv_limit)
                    member.comm = line.comm if argv else None
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
        reading = _Reading(snapshot=snapshot, reaped=reaped, zombie=zombie, readable=readable)
        # Kept for the next sample only when complete: a figure or a command line that could
        # not be read (or an empty one, mid-exec) is read again.
        settled = readable and (zombie or member.comm is not None)
        member.line, member.reading = (data, reading) if settled else (None, None)
        return reading

    def _discover(self, readings: dict[ProcessKey, _Reading]) -> list[ProcessSnapshot]:
        """Children of running members not yet known, found breadth-first from one pass
        over the system's parent ids (a child started after that pass waits for the next
        sample)."""
        by_pid = {k.pid: k for k, m in self._members.items() if not m.zombie}
        known = {k.pid for k in self._members}
        children = self.table.children()
        found: list[ProcessSnapshot] = []
        queue = list(by_pid)
        while queue:
            parent_pid = queue.pop(0)
            parent = by_pid[parent_pid]
            for pid in children.get(parent_pid, ()):
                if pid in known:
                    continue
                member = self._admit(pid, parent)
                if member is None:
                    continue
                reading = self._read(member)
                if reading is None:
                    continue  # exited before it could be read: its parent's time holds it
                known.add(pid)
                member.zombie = reading.zombie
                self._members[member.key] = member
                readings[member.key] = reading
                found.append(reading.snapshot)
                if not reading.zombie:
                    by_pid[pid] = member.key
                    queue.append(pid)
        return found

    def _admit(self, pid: int, parent: ProcessKey) -> _Member | None:
        try:
            proc = psutil.Process(pid)
            start = float(proc.create_time())
            # The table may be older than this sample: the pid must still be the parent's.
            if int(proc.ppid()) != parent.pid:
                return None
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return None
        if start < parent.create_time - CREATE_TIME_TOLERANCE:
            return None  # older than its "parent": the pid changed hands during the pass
        return _Member(key=ProcessKey(pid=pid, create_time=start), proc=proc, parent=parent)

    def _link_parents(self, readings: dict[ProcessKey, _Reading]) -> None:
        running = {k.pid: k for k, m in self._members.items() if not m.zombie}
        for key, member in self._members.items():
            reading = readings.get(key)
            if reading is None:
                continue
            if reading.snapshot.cpu_seconds is not None:
                member.cpu = reading.snapshot.cpu_seconds
            if reading.reaped is not None:
                member.reaped = reading.reaped
            ppid = reading.snapshot.ppid
            if ppid is not None and key != self.root:
                member.parent = running.get(ppid)

    def _settle(self, gone: list[_Member], readings: dict[ProcessKey, _Reading]) -> None:
        """Account for the members that are gone (see "What the figures count")."""
        by_key = {member.key: member for member in gone}
        need: dict[ProcessKey, float] = {}
        for member in gone:
            heir = member.parent
            while heir is not None and heir in by_key:
                heir = by_key[heir].parent
            survivor = None if heir is None else self._members.get(heir)
            if survivor is None:  # reaped outside the tree (or by a gone member)
                self._retired_cpu += member.cpu or 0.0
                continue
            need[survivor.key] = need.get(survivor.key, 0.0) + (member.cpu or 0.0)
            survivor.owed += member.owed
        for key, member in self._members.items():
            now = readings[key].reaped
            grown = 0.0
            if now is not None and member.reaped is not None:
                grown = max(0.0, now - member.reaped)
            pending = need.get(key, 0.0)
            covered = min(grown, pending)
            self._retired_cpu += pending - covered
            member.owed += pending - covered
            back = min(grown - covered, member.owed)
            member.owed -= back
            self._retired_cpu -= back

    # ---- totals ----------------------------------------------------------------------

    def _summarise(
        self,
        readings: dict[ProcessKey, _Reading],
        new: list[ProcessSnapshot],
        exited: list[ProcessKey],
    ) -> TreeSample:
        now = time.time()
        running = [r for r in readings.values() if not r.zombie]
        running.sort(key=lambda r: (r.snapshot.key != self.root, r.snapshot.key))
        cpu_parts = [r.snapshot.cpu_seconds for r in readings.values()]
        known_cpu = [c for c in cpu_parts if c is not None]
        if known_cpu or self._retired_cpu > 0 or self._cpu is not None:
            total = self._retired_cpu + math.fsum(known_cpu)
            self._cpu = total if self._cpu is None else max(self._cpu, total)
        rss_parts = [r.snapshot.rss_bytes for r in running if r.snapshot.rss_bytes is not None]
        rss = sum(rss_parts) if rss_parts else None
        if rss is not None:
            self._peak_rss = rss if self._peak_rss is None else max(self._peak_rss, rss)
        root_running = any(r.snapshot.key == self.root for r in running)
        return TreeSample(
            root=self.root,
            number=self._samples,
            taken_at=now,
            wall_seconds=self._wall(now, root_running),
            cpu_seconds=self._cpu,
            rss_bytes=rss,
            peak_rss_bytes=self._peak_rss,
            processes=tuple(r.snapshot for r in running),
            new=tuple(new),
            exited=tuple(sorted(set(exited))),
            unreadable=tuple(sorted(r.snapshot.key for r in running if not r.readable)),
        )

    def _wall(self, now: float, root_running: bool) -> float:
        if not root_running and self._root_ended_at is None:
            self._root_ended_at = now
        end = now if root_running else self._root_ended_at or now
        return max(0.0, end - self.root.create_time)


async def observe_tree(
    root: ProcessKey | ProcessInfo,
    *,
    interval: float,
    on_sample: Callable[[TreeSample], Awaitable[None]],
    argv_limit: int = ARGV_LIMIT,
    table: ProcessTable | None = None,
    task_status: trio.TaskStatus[TreeSample] = trio.TASK_STATUS_IGNORED,
) -> TreeSample:
    """Sample ``root``'s tree every ``interval`` seconds and hand each sample to
    ``on_sample``, until a sample finds the tree empty; return that last sample.

    Runs in the caller's task (start it in a nursery, or with ``nursery.start``, which
    returns once the first sample has been delivered). Each sample runs in a worker thread;
    ``on_sample`` is awaited before the next sample is scheduled, so a slow consumer slows
    the observer rather than queueing samples. Samples start ``interval`` apart (or back
    to back when one takes longer).
    """
    if not interval > 0:
        raise ValueError("interval must be positive")
    observer = TreeObserver.of(root, argv_limit=argv_limit, table=table)
    started = False
    while True:
        began = trio.current_time()
        sample = await trio.to_thread.run_sync(observer.sample)
        await on_sample(sample)
        if not started:
            started = True
            task_status.started(sample)
        if sample.finished:
            return sample
        await trio.sleep_until(began + interval)


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
