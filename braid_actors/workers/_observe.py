"""Sampling a worker's process tree with psutil: CPU, memory, and who is in it.

Design note. The *tree* of a root process is the root plus every process ever seen as a
child of a tree member, for as long as that process lives: a member stays a member when it
is re-parented (its parent exited, or it double-forked after being seen), so the stragglers
of an exited root are still watched. A process re-parented away before it was first
sampled (a daemon that double-forks between two samples) is never seen, unless it is named
in ``adopt`` (processes known to belong to the tree, e.g. recorded by a supervisor before a
restart: members from the first sample while they run). A process is named
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
  did not change keeps its previous reading (see ``_member.read_from_stat``): a growth
  made without a fault (another process writing into its memory) and too small to move the
  line's approximate figure (under its per-CPU batches) waits for the next change.
* ``wall_seconds``: from the root's creation time to this sample, frozen at the first sample
  that finds the root exited.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Final

import attrs
import psutil  # type: ignore[import-untyped, unused-ignore]
import trio

from braid_actors.workers._identity import CREATE_TIME_TOLERANCE, ProcessKey, same_start
from braid_actors.workers._member import Member, ProcessSnapshot, Reading, read_member
from braid_actors.workers._process import ProcessInfo
from braid_actors.workers._proctable import ProcessTable

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable


ARGV_LIMIT: Final = 1024
"""Characters of a process's argv kept in a snapshot (the arguments' lengths summed)."""


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
    execs: tuple[ProcessSnapshot, ...] = ()
    """Members known before this sample whose command line changed since the sample before
    (an exec; a child caught between ``fork`` and ``exec`` is found with its parent's
    command and listed here once it runs its own), with the new one. Never a new member,
    never an empty or unreadable command line."""

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
class TreeObserver:
    """Samples one process tree; keeps what it needs between samples (see the module note).

    Not thread-safe: call :meth:`sample` from one thread at a time (it may be a different
    thread each time, as with ``trio.to_thread.run_sync``).
    """

    root: ProcessKey
    argv_limit: int = ARGV_LIMIT
    table: ProcessTable = attrs.Factory(ProcessTable)
    """Where new children are looked up; share one between observers (see its module)."""
    adopt: tuple[ProcessKey, ...] = ()
    """Processes known to belong to the tree already (a restarted supervisor's journaled
    children, parents first): members from the first sample on, whether or not they are
    still the root's descendants, when they still run and the root does."""
    _members: dict[ProcessKey, Member] = attrs.Factory(dict)
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
        adopt: Iterable[ProcessKey] = (),
    ) -> TreeObserver:
        key = root.key if isinstance(root, ProcessInfo) else root
        return cls(
            root=key, argv_limit=argv_limit, table=table or ProcessTable(), adopt=tuple(adopt)
        )

    def member_pids(self) -> list[str]:
        """The pids of its members, in decimal (for :meth:`ProcessTable.expire`); call it
        only while no sample is being taken."""
        return [str(key.pid) for key in self._members]

    def close(self) -> None:
        """Close the files it keeps open for its members (a later sample opens them
        again); call it only while no sample is being taken."""
        for member in self._members.values():
            member.release()

    def sample(self) -> TreeSample:
        """Read the tree once and report what changed since the previous sample."""
        self._samples += 1
        if not self._started:
            self._started = True
            self._adopt_root()
            if self.root in self._members:
                self._adopt_known()
        readings: dict[ProcessKey, Reading] = {}
        gone: list[Member] = []
        exited: list[ProcessKey] = []
        if self._samples == 1 and self.root not in self._members:
            exited.append(self.root)  # gone before the first sample
        # Members are kept in discovery order, so a parent is read before its children: a
        # child reaped during the sample is then missing from both readings (and matched
        # later), never counted in both.
        repeated = self._last is not None
        for key, member in list(self._members.items()):
            before = member.reading
            reading = read_member(member, self.argv_limit)
            repeated = repeated and reading is not None and reading is before
            if reading is None:
                member.release()
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
            # Every member read as the previous sample read it (see read_from_stat): accounting
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
        self._last = self._summarise(readings, new, exited, self._execs(readings))
        return self._last

    def _execs(self, readings: dict[ProcessKey, Reading]) -> list[ProcessSnapshot]:
        """The members whose command line changed since their last sample (see
        ``TreeSample.execs``); a member's first reading only sets what it reported."""
        found: list[ProcessSnapshot] = []
        for key, reading in readings.items():
            member = self._members.get(key)
            if member is None:
                continue
            argv = reading.snapshot.argv
            if member.reported is None:
                member.reported = argv or ()
            elif argv and argv != member.reported and not reading.zombie:
                member.reported = argv
                found.append(reading.snapshot)
        return found

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
        member = _running(self.root)
        if member is not None:  # else gone before the first sample: the tree is empty
            self._members[self.root] = member

    def _adopt_known(self) -> None:
        # A known process that left the tree (its parent exited and it was re-parented
        # outside) would never be found again from the root: it is a member by its key.
        for key in self.adopt:
            if key not in self._members and (member := _running(key)) is not None:
                self._members[key] = member

    def _discover(self, readings: dict[ProcessKey, Reading]) -> list[ProcessSnapshot]:
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
                reading = read_member(member, self.argv_limit)
                if reading is None:
                    member.release()
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

    def _admit(self, pid: int, parent: ProcessKey) -> Member | None:
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
        return Member(key=ProcessKey(pid=pid, create_time=start), proc=proc, parent=parent)

    def _link_parents(self, readings: dict[ProcessKey, Reading]) -> None:
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

    def _settle(self, gone: list[Member], readings: dict[ProcessKey, Reading]) -> None:
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
        readings: dict[ProcessKey, Reading],
        new: list[ProcessSnapshot],
        exited: list[ProcessKey],
        execs: list[ProcessSnapshot],
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
            execs=tuple(sorted(execs, key=lambda snapshot: snapshot.key)),
        )

    def _wall(self, now: float, root_running: bool) -> float:
        if not root_running and self._root_ended_at is None:
            self._root_ended_at = now
        end = now if root_running else self._root_ended_at or now
        return max(0.0, end - self.root.create_time)


def _running(key: ProcessKey) -> Member | None:
    """A member (with no parent yet) for the process ``key`` names, if that process runs."""
    try:
        proc = psutil.Process(key.pid)
        start = float(proc.create_time())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    return Member(key=key, proc=proc, parent=None) if same_start(start, key.create_time) else None


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
    try:
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
    finally:
        observer.close()  # no sample is running: to_thread waits for its thread
