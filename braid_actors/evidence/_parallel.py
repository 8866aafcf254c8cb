"""Ingest of many files by several processes, written in the order of the files.

Every process (the caller's and ``workers - 1`` spawned ones, each with its own connection)
takes the next file by index, reads and prepares it (parse, redact, hash: the CPU-bound
half of a pass, no lock held), waits until every earlier file is committed (preparing the
files after it meanwhile, a bounded number), then writes it in its own ``BEGIN IMMEDIATE``
transaction. The database thus gets the same transactions in
the same order as a sequential ``ingest`` of each file; what a file's preparation read
before its transaction is read again inside it (``Ingest.prepare``). Files after a failed one
are not written, as a sequential loop would stop there. Only reports and errors cross the
process boundary, never rows: each worker sends its reports through a queue of its own, in
frames that a pipe takes whole (see :func:`send_report`).
"""

from __future__ import annotations

import functools
import math
import multiprocessing
import os
import pickle
import select
import sqlite3
import threading
import time
from collections import deque
from contextlib import contextmanager
from multiprocessing.process import parent_process
from multiprocessing.queues import Queue
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import attrs

from braid_actors import errors
from braid_actors.errors import BraidError, EvidenceStoreUnavailable

from ._gcpause import collection_paused
from ._policy import CapturePolicy
from ._schema import connect

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence
    from contextlib import AbstractContextManager
    from multiprocessing.context import SpawnContext, SpawnProcess
    from multiprocessing.synchronize import Condition

    from ._ingest import Write
    from ._rows import IngestReport

PARALLEL_MIN_BYTES: Final = 8_000_000
"""Below this many bytes in all the files, one process ingests them: a spawned worker
needs about 0.2 s (a fresh interpreter importing the package) before it helps."""
CHECKPOINT_WAIT: Final = 1.0
"""Most seconds a checkpoint round waits for a writer to finish or for readers of older
snapshots to move on (see :func:`background_checkpoints`); then it gives the round up.

With 5 s (the connection's default), a reader left on an old snapshot kept writers out
round after round, and a commit failed. With 50 ms, rounds gave up so often beside two
busy writers that the WAL grew again: Codex files of the bench (23 copies, 2 processes,
9-16 runs each), WAL peaks 77-300 MB (median 122) at 50 ms, 78-232 (106) at 0.25 s,
80-220 (95) at 1 s and 80-167 (92) at 5 s."""
CHECKPOINT_EVERY: Final = 0.25
"""Seconds between the WAL checkpoints of a parallel ingest (see
:func:`background_checkpoints`)."""
AHEAD_FILES: Final = 16
"""Most prepared files one process holds while it waits for their turns (see :func:`_work`)."""
AHEAD_BYTES: Final = 32_000_000
"""Most bytes of files one process holds prepared while it waits for their turns (a file
in hand may take several times its size in memory)."""
_POLL: Final = 0.5
"""Seconds between liveness checks of the other processes while waiting for a turn."""
_REAP_POLL: Final = 0.05
"""Seconds between reads of the workers' reports while waiting for them to end."""
FRAME_BYTES: Final = getattr(select, "PIPE_BUF", 512) - 256
"""Most bytes of a pickled report one queue message carries: with the message's own pickling
(~20 bytes) and the queue's 4-byte length header it stays within ``PIPE_BUF``, so the pipe
takes each message in one write, whole or not at all (see :func:`send_report`)."""


def worker_count(paths: Sequence[str], workers: int | None) -> int:
    """How many processes ingest ``paths``: ``workers`` when given, else one per usable
    CPU when the files hold at least :data:`PARALLEL_MIN_BYTES`; never more than files."""
    if workers is None:
        size = 0
        for path in paths:
            try:
                size += os.stat(path).st_size
            except OSError:
                continue  # the pass reports it (no_input / unreadable)
        workers = len(os.sched_getaffinity(0)) if size >= PARALLEL_MIN_BYTES else 1
    return max(1, min(workers, len(paths)))


@attrs.frozen
class Job:
    """What a spawned worker needs to open the store and ingest like the caller."""

    home: str
    patterns: tuple[str, ...]
    paths: tuple[str, ...]
    run_id: str
    harness: str | None
    policy: str | CapturePolicy | None
    resume_offset: int | None


class _Stopped(Exception):
    """An earlier file failed: this one is not written."""


class Turns:
    """Shared counters of one parallel ingest: the next file to take, the next to commit,
    and the failed file (-1: none). Guarded by one condition shared by the processes."""

    def __init__(self, ctx: SpawnContext, count: int) -> None:
        self.count = count
        self.cond: Condition = ctx.Condition()
        self._take = ctx.RawValue("q", 0)
        self._commit = ctx.RawValue("q", 0)
        self._failed = ctx.RawValue("q", -1)

    def is_next(self, index: int) -> bool:
        """Whether file ``index`` may be written now (every earlier file is committed)."""
        with self.cond:
            return bool(self._commit.value == index)

    def claim(self) -> int | None:
        """The next file index to prepare, or null when none is left (or one failed)."""
        with self.cond:
            index = int(self._take.value)
            if index >= self.count or self._failed.value >= 0:
                return None
            self._take.value = index + 1
            return index

    def _wait(self, index: int, alive: Callable[[], bool]) -> None:
        """Wait (holding the condition) until ``index`` is next to commit."""
        while self._commit.value != index:
            if 0 <= self._failed.value < index:
                raise _Stopped
            if not self.cond.wait(_POLL) and not alive():
                raise EvidenceStoreUnavailable("a parallel ingest worker stopped")
        if self._failed.value >= 0:
            raise _Stopped

    @contextmanager
    def turn(self, index: int, alive: Callable[[], bool]) -> Iterator[None]:
        """Held while file ``index`` is written: entered once every earlier file is
        committed; leaving it normally lets the next file go, an error stops the rest."""
        with self.cond:
            self._wait(index, alive)
        try:
            yield
        except Exception:
            self.fail(index, alive)
            raise
        with self.cond:
            self._commit.value = index + 1
            self.cond.notify_all()

    def fail(self, index: int, alive: Callable[[], bool]) -> None:
        """Record that file ``index`` failed, once every earlier file is committed."""
        with self.cond:
            if self._failed.value != index:
                self._wait(index, alive)
                self._failed.value = index
            self.cond.notify_all()

    def halt(self) -> None:
        """Stop handing out files (the caller is leaving)."""
        with self.cond:
            self._take.value = self.count
            self.cond.notify_all()

    def finished(self) -> int:
        with self.cond:
            return int(self._commit.value)


@attrs.frozen
class _Failure:
    """A file's error as it crosses processes: class name, message and details."""

    name: str
    message: str
    details: dict[str, Any]

    @classmethod
    def of(cls, exc: BaseException) -> _Failure:
        if isinstance(exc, BraidError):
            return cls(type(exc).__name__, exc.message, exc.details)
        return cls("BraidError", "an ingest worker failed", {"error": type(exc).__name__})

    def error(self) -> BraidError:
        kind = getattr(errors, self.name, None)
        if not (isinstance(kind, type) and issubclass(kind, BraidError)):
            kind = BraidError
        return kind(self.message, details=self.details)


def _work(
    prepare: Callable[[str], Write],
    paths: Sequence[str],
    turns: Turns,
    alive: Callable[[], bool],
    done: Callable[[int, IngestReport | _Failure], None],
) -> None:
    """Take, prepare and write files until none is left; ``done`` gets each outcome.

    A process whose next file must wait for an earlier one (held by another process that
    is still preparing it) prepares the files after it meanwhile, up to
    :data:`AHEAD_FILES` files or :data:`AHEAD_BYTES` bytes of them, and writes them in
    order once their turns come. With only one file in hand, a long file held up every
    process at the file after it: two processes ingested the bench's Claude corpus (one
    2.8 MB file and eight small ones per copy) no faster than one.

    The connections run no automatic checkpoint (it would run inside a commit, while the
    next file waits for its turn): :func:`background_checkpoints` runs them.
    """
    ahead: deque[tuple[int, Write, int]] = deque()  # prepared files in hand, in file order
    held = 0
    taking = True
    while ahead or taking:
        room = taking and len(ahead) < AHEAD_FILES and held < AHEAD_BYTES
        if ahead and (not room or turns.is_next(ahead[0][0])):
            index, write, size = ahead.popleft()
            held -= size
            try:
                report = write(functools.partial(turns.turn, index, alive))
            except _Stopped:
                return
            except Exception as exc:  # the file's outcome; files after it are not written
                try:
                    turns.fail(index, alive)
                except _Stopped:
                    return
                done(index, _Failure.of(exc))
                return
            done(index, report)
            continue
        claimed = turns.claim()
        if claimed is None:
            taking = False
            continue
        index = claimed
        try:
            size = os.stat(paths[index]).st_size
        except OSError:
            size = 0  # its pass reports it (no_input / unreadable)
        try:
            write = prepare(paths[index])
        except Exception as exc:  # reported at its turn, where a sequential loop stops
            write = _raising(exc)
        ahead.append((index, write, size))
        held += size


def _raising(exc: Exception) -> Write:
    def write(turn: Callable[[], AbstractContextManager[object]]) -> IngestReport:
        raise exc

    return write


def send_report(queue: Queue[tuple[bool, bytes]], index: int, outcome: object) -> None:
    """Put file ``index``'s outcome on ``queue`` in frames of :data:`FRAME_BYTES`.

    A report that crossed as one message (a six-session file's is ~4 KB) could be cut short
    in the pipe by a worker killed mid-write, and the caller's read of it then waited for
    the rest for good. A frame is written whole or not at all, and only the worker itself
    writes to its queue (a queue's write lock held by a killed worker blocks only its own),
    so the caller never finds part of a message: a report cut short is frames without the
    last one, which :class:`Reports` never takes for a report.
    """
    data = pickle.dumps((index, outcome), protocol=pickle.HIGHEST_PROTOCOL)
    for at in range(0, len(data), FRAME_BYTES):
        queue.put((at + FRAME_BYTES >= len(data), data[at : at + FRAME_BYTES]))


@attrs.define(eq=False)
class Reports:
    """The caller's end of one worker's report queue (see :func:`send_report`)."""

    queue: Queue[tuple[bool, bytes]]
    _partial: bytearray = attrs.Factory(bytearray)

    def collect(self, into: dict[int, Any]) -> None:
        """Move every report whose frames have all arrived into ``into`` (by file index);
        never waits: each frame in the pipe is whole."""
        queue = self.queue
        while not queue.empty():
            last, chunk = queue.get()
            self._partial += chunk
            if last:
                index, outcome = pickle.loads(self._partial)
                self._partial = bytearray()
                into[index] = outcome


def child(job: Job, turns: Turns, results: Queue[tuple[bool, bytes]]) -> None:
    """A spawned worker: open the store and work through the files with the others."""
    from ._store import EvidenceStore  # (here: _store imports this module)

    parent = parent_process()

    def alive() -> bool:
        return parent is None or parent.is_alive()

    store = EvidenceStore.open(Path(job.home), redaction_patterns=job.patterns)
    try:
        with store.checkpoints_deferred(), collection_paused():
            _work(
                functools.partial(store.prepare_for_turn, job=job),
                job.paths,
                turns,
                alive,
                functools.partial(send_report, results),
            )
    finally:
        store.close()


@contextmanager
def background_checkpoints(home: Path, every: float = CHECKPOINT_EVERY) -> Iterator[None]:
    """Inside, a thread of this process checkpoints the WAL every ``every`` seconds, on a
    connection of its own, and is joined on the way out.

    A checkpoint copies committed pages into the database file and syncs both files; on
    the ingesting thread it stopped the ingest meanwhile (Claude Code files of the bench,
    two processes: 0.35 s in 12 checkpoints, 0.13 s of it CPU, in a 2.5 s ingest). The
    thread waits beside the ingest instead. Each round is a ``PASSIVE`` checkpoint, which
    takes no lock a writer needs and waits for none, then a ``RESTART`` one, which copies
    only what was committed meanwhile but keeps writers out while it does, so that the
    next commit writes the WAL from its start: SQLite starts the WAL over only in a
    transaction that began with every frame copied, which beside ingesting processes a
    ``PASSIVE`` checkpoint never leaves, and the WAL of the bench's ingest grew to 206 MB
    (Claude Code files) and 341 MB (Codex), all of it written to newly allocated blocks.
    A round waits at most :data:`CHECKPOINT_WAIT` for a writer to finish or for readers of
    older snapshots (a ``braid evidence serve`` request, say) to move on, and then gives
    up until the next one, so a reader that stays on an old snapshot holds a commit at
    most that long, and writers still get a share of every round. A failed checkpoint
    leaves the commits in the WAL, where the next one (or an automatic one of the store)
    copies them, so it only ends the thread.
    """
    conn = connect(home)
    conn.execute(f"PRAGMA busy_timeout={round(CHECKPOINT_WAIT * 1000)}")
    stop = threading.Event()

    def run() -> None:
        try:
            while not stop.wait(every):
                conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                conn.execute("PRAGMA wal_checkpoint(RESTART)").fetchall()
        except sqlite3.Error:
            return

    thread = threading.Thread(target=run, name="braid-evidence-checkpoints", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        conn.close()


def ingest_in_order(
    prepare: Callable[[str], Write], job: Job, workers: int
) -> Iterator[IngestReport]:
    """Ingest ``job.paths`` with ``workers`` processes (this one included, running
    ``prepare`` with automatic checkpoints off); yield each file's report in file order,
    and raise the first failure where a sequential loop would have."""
    ctx = multiprocessing.get_context("spawn")  # no fork: the caller may hold threads, a db
    turns = Turns(ctx, len(job.paths))
    # A queue per worker whose put never blocks it (a thread of the worker feeds the pipe):
    # with a plain pipe, a worker whose reports filled it (64 KB, some 30 reports) blocked
    # in put while holding the next turn, and this process, which reads reports only after
    # its own writes, waited for that turn: both stopped for good.
    channels = [Reports(ctx.Queue()) for _ in range(workers - 1)]
    procs: list[SpawnProcess] = [
        ctx.Process(target=child, args=(job, turns, channel.queue), daemon=True)
        for channel in channels
    ]
    for proc in procs:
        proc.start()

    def alive() -> bool:
        return all(proc.is_alive() or proc.exitcode == 0 for proc in procs)

    ready: dict[int, IngestReport | _Failure] = {}

    def collect() -> None:
        for channel in channels:
            channel.collect(ready)

    def done(index: int, outcome: IngestReport | _Failure) -> None:
        ready[index] = outcome
        collect()

    def reap(within: float) -> None:
        """Wait for the workers to end, reading their reports meanwhile (a worker ends
        once its feeder thread has written them all to the pipe)."""
        deadline = time.monotonic() + within
        for proc in procs:
            while proc.is_alive() and time.monotonic() < deadline:
                collect()
                proc.join(_REAP_POLL)
        collect()

    try:
        # Paused for the whole loop, not per file: a process holds files it prepared ahead,
        # and each collection between two files would walk all of them.
        with collection_paused(), background_checkpoints(Path(job.home)):
            _work(prepare, job.paths, turns, alive, done)
            reap(math.inf)
    finally:
        turns.halt()
        reap(5.0)
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
                proc.join()
    for index in range(len(job.paths)):
        outcome = ready.get(index)
        if outcome is None:  # no failure before it: a worker died holding it
            raise EvidenceStoreUnavailable("a parallel ingest worker stopped")
        if isinstance(outcome, _Failure):
            raise outcome.error()
        yield outcome
