"""The journal actor: the only writer of durable state.

Theory of operation
-------------------
A producer calls :meth:`JournalHandle.append`. The handle encodes the payloads in the
producer's own task (a payload that is not JSON-compatible is refused there, before it can
reach a batch), puts one request on a bounded memory channel (backpressure is the
``await send``) and waits on *that request's own* event.

The actor takes the first queued request, drains whatever else is already queued
(``receive_nowait``, up to ``max_batch``) and decides each request in order:

1. its operation id is already in the ledger (committed, or accepted earlier in this batch):
   the same parameter digest makes it a duplicate (nothing written, answered with the recorded
   result and ``duplicate=True``); a different digest is an :class:`OperationConflict`;
2. otherwise ``admission.admit(records)`` runs; a :class:`BraidError` rejects this request
   alone and the rest of the batch is unaffected.

The accepted requests are then written in ONE transaction: their rows on the event loop
(:meth:`Journal.stage_prepared`), the ``COMMIT`` in the actor's writer thread, so the event
loop keeps queueing requests during the fsync, and the thread waits for the interpreter once
per commit, not after every statement. Back on the trio thread, and only after the
commit returned: the ledger is updated, ``admission.committed(records)`` runs (the read model;
admission is never touched from the thread), every request of THIS batch is answered, and the
records are published to subscribers. Rejections are answered at the same point, because they
may depend on requests staged earlier in the same batch. A request that arrived during the
commit is still in the channel: it belongs to the next batch and is answered by the commit
that contains it — there is no shared "batch done" signal.

Failure: if the write raises, every request of the batch is answered with
:class:`JournalError` (its outcome is unknown) and the actor raises — the admission has staged
requests that were never committed, so it must not go on. Requests still queued, and any
append made afterwards, get :class:`JournalClosed`.

Subscribers get records committed after they subscribed, in order, through a memory channel of
``buffer`` records. The writer never waits for a subscriber: one that falls more than
``buffer`` records behind is dropped — its channel is closed, so it sees ``EndOfChannel``
after the records it already has — and may catch up from the journal by ``seq``.

Group commit has a floor: two commits start at least ``commit_interval`` apart (1 ms by
default). A request arriving sooner after a commit waits for the rest of the interval with
every other such request, so under load one transaction (one fsync, one thread hop) carries
what the interval gathered; a request arriving after a quiet spell is written at once.

The head file (``journal.head``, the loss detector) is written by a task of the actor's own
nursery after acknowledgements, at most once per ``head_interval`` (20 ms by default),
coalescing commits under load, so its fsync is off the acknowledgement path; it trails the
database by at most the commits of one interval, which the journal tolerates by design (a
database ahead of its head is not a fault).

Checkpoints run in a task of the actor's own nursery, every ``checkpoint_interval`` seconds,
in a thread on their own connection, and what commits added meanwhile is then copied on the
writer thread between two commits, so that the WAL is written from its start again instead
of growing as long as commits never stop. Snapshots (``snapshot_every``) are taken from the
admission on the trio thread right after a commit (the graph's is a copy whose canonical JSON
is gathered in short slices, at most a tenth of the loop's time, between commits), sealed
(hashed, then encrypted) on the trio thread in steps paced the same way, and written to a
file of its own in one of trio's threads while commits go on (no commit waits behind a
snapshot, see ``_snapfiles``).

Deadline: with ``answer_within``, a watchdog task answers any request still unanswered that
long after it was made with :class:`JournalTimeout` (see ``_request``); a producer may also
ask for a *shielded* wait, which a cancellation does not interrupt.

Shutdown: :meth:`JournalHandle.aclose` stops accepting (later appends get
:class:`JournalClosed`; senders blocked on a full channel get it too), commits and
acknowledges everything already queued, then the actor returns.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

import attrs
import trio
import trio.lowlevel

from braid_actors._faults import crash_point
from braid_actors.errors import (
    BraidError,
    JournalClosed,
    JournalCorrupt,
    JournalError,
    OperationConflict,
)

from ._encoding import PreparedAppend
from ._handle import JournalHandle
from ._records import AppendResult, CommittedRecord, NewRecord, Operation
from ._request import AnswerDeadlines, Request
from ._store import Journal, Staged
from ._thread import WriterThread

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence


class Admission(Protocol):
    """Validates requests before they are written and folds them once they are durable."""

    def admit(self, records: Sequence[NewRecord]) -> None:
        """Accept (and stage) one request's records, or raise a :class:`BraidError`."""
        ...

    def committed(self, records: Sequence[CommittedRecord]) -> None:
        """Fold a durable batch, in order, into the read model."""
        ...


@runtime_checkable
class SnapshottingAdmission(Admission, Protocol):
    """An admission whose read model can be snapshotted."""

    def snapshot(self) -> tuple[int, Mapping[str, Any] | Iterable[bytes]] | None:
        """``(projection version, dumped read model)`` as of the last committed record.

        The mapping is encrypted in another thread while later commits go on, so it must be a
        value that later ``committed`` calls do not mutate (a fresh dump, or immutable). In
        place of the mapping, the pieces of its canonical JSON may be given: the actor
        gathers them on the event loop a few at a time, between commits (so they must only
        read values later ``committed`` calls do not mutate), then encrypts them in a
        thread. A large dump then never holds the interpreter for long.
        """
        ...


class _NoAdmission:
    def admit(self, records: Sequence[NewRecord]) -> None:
        return None

    def committed(self, records: Sequence[CommittedRecord]) -> None:
        return None


_WRITE, _DUP_BATCH, _DUP_RECORDED, _REFUSED = range(4)


@attrs.define(eq=False)
class _Plan:
    """How each request of a batch will be answered once the batch is written."""

    writes: list[PreparedAppend] = attrs.Factory(list)
    lookups: set[str] = attrs.Factory(set)
    items: list[tuple[Request, int, Any]] = attrs.Factory(list)


@attrs.define(eq=False)
class _Actor:
    journal: Journal
    admission: Admission
    snapshots: SnapshottingAdmission | None
    max_batch: int
    checkpoint_interval: float
    snapshot_every: int | None
    commit_interval: float
    head_interval: float
    ledger: dict[str, str]
    last_seq: int
    last_snapshot_seq: int
    subscribers: set[trio.MemorySendChannel[CommittedRecord]] = attrs.Factory(set)
    closing: bool = False
    stopped: trio.Event = attrs.Factory(trio.Event)
    writer: trio.Lock = attrs.Factory(trio.Lock)
    snapshotting: bool = False
    inflight: list[Request] = attrs.Factory(list)
    head_dirty: trio.Event = attrs.Factory(trio.Event)
    last_commit_at: float = float("-inf")
    deadlines: AnswerDeadlines | None = None
    thread: WriterThread = attrs.Factory(lambda: WriterThread("braid-journal-writer"))
    """Commits (head writes, checkpoints and snapshot files use trio's threads)."""

    async def serve(
        self, receive: trio.MemoryReceiveChannel[Request], nursery: trio.Nursery
    ) -> None:
        while True:
            try:
                first = await receive.receive()
            except trio.EndOfChannel:
                return
            # Group commit with a floor between commits: under load, requests that arrive
            # within ``commit_interval`` of the previous commit wait for the rest of it and
            # share one transaction (one fsync, one thread hop); an isolated request finds
            # the interval long past and is written at once.
            ready_at = self.last_commit_at + self.commit_interval
            if not self.closing and trio.current_time() < ready_at:
                await trio.sleep_until(ready_at)
            self.last_commit_at = trio.current_time()
            batch = [first]
            while len(batch) < self.max_batch:
                try:
                    batch.append(receive.receive_nowait())
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
            self.inflight = batch
            await self._process(batch, nursery)
            self.inflight = []

    def _plan(self, batch: list[Request]) -> _Plan:
        plan = _Plan()
        staged: dict[str, tuple[str, Request]] = {}  # op_id -> (digest, request) of this batch
        for req in batch:
            op = req.prepared.operation
            if op is not None:
                digest, earlier = staged.get(op.op_id, (self.ledger.get(op.op_id), None))
                if digest is not None:
                    if digest != op.params_digest:
                        conflict = OperationConflict(
                            f"operation {op.op_id} was already used with other parameters",
                            details={"op_id": op.op_id},
                        )
                        plan.items.append((req, _REFUSED, conflict))
                    elif earlier is not None:
                        plan.items.append((req, _DUP_BATCH, earlier))
                    else:
                        plan.lookups.add(op.op_id)
                        plan.items.append((req, _DUP_RECORDED, op.op_id))
                    continue
            try:
                self.admission.admit(req.prepared.records)
            except BraidError as exc:
                plan.items.append((req, _REFUSED, exc))
                continue
            plan.items.append((req, _WRITE, len(plan.writes)))
            plan.writes.append(req.prepared)
            if op is not None:
                staged[op.op_id] = (op.params_digest, req)
        return plan

    def _finish(
        self, staged: Staged, lookups: set[str]
    ) -> tuple[list[list[CommittedRecord]], dict[str, Operation]]:
        """Runs in the writer thread: touches the journal only, never the admission."""
        recorded: dict[str, Operation] = {}
        try:
            for op_id in lookups:
                op = self.journal.get_operation(op_id)
                if op is None:
                    raise JournalCorrupt(
                        f"operation {op_id} is in the ledger but not in the journal"
                    )
                recorded[op_id] = op
        except BaseException:
            self.journal.abandon_staged(staged)
            raise
        return self.journal.finish_staged(staged, sync_head=False), recorded

    async def _process(self, batch: list[Request], nursery: trio.Nursery) -> None:
        try:
            plan = self._plan(batch)
        except BaseException:
            _fail(batch, "the journal's admission failed while checking this request")
            raise
        committed: list[list[CommittedRecord]] = []
        recorded: dict[str, Operation] = {}
        if plan.writes or plan.lookups:
            async with self.writer:
                try:
                    # Rows are written on the loop, the COMMIT (and its fsync) in the
                    # writer thread (see Journal.stage_prepared).
                    staged = self.journal.stage_prepared(plan.writes)
                    committed, recorded = await self.thread.run(self._finish, staged, plan.lookups)
                except BaseException:
                    _fail(batch, "the journal could not write this request's batch")
                    raise
        records = [rec for group in committed for rec in group]
        if records:
            crash_point("journal.committed")
        for prepared in plan.writes:
            if prepared.operation is not None:
                self.ledger[prepared.operation.op_id] = prepared.operation.params_digest
        if records:
            self.last_seq = records[-1].seq
        if plan.writes:
            self.head_dirty.set()
        try:
            if records:
                self.admission.committed(records)
        finally:
            for req, kind, arg in plan.items:
                req.answer(_answer(req, kind, arg, committed, recorded))
            if self.deadlines is not None:
                self.deadlines.prune()
            self._publish(records)
        self._maybe_snapshot(nursery)

    def _publish(self, records: list[CommittedRecord]) -> None:
        if not records:
            return
        for sub in list(self.subscribers):
            try:
                for rec in records:
                    sub.send_nowait(rec)
            except trio.WouldBlock:
                sub.close()  # fell more than its buffer behind: dropped
                self.subscribers.discard(sub)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self.subscribers.discard(sub)

    def _maybe_snapshot(self, nursery: trio.Nursery) -> None:
        if self.snapshots is None or self.snapshot_every is None or self.snapshotting:
            return
        if self.last_seq - self.last_snapshot_seq < self.snapshot_every:
            return
        taken = self.snapshots.snapshot()
        if taken is None:
            return
        version, state = taken
        self.snapshotting = True
        self.last_snapshot_seq = self.last_seq
        nursery.start_soon(self._write_snapshot, self.last_seq, version, state)

    async def _write_snapshot(
        self, seq: int, version: int, state: Mapping[str, Any] | Iterable[bytes]
    ) -> None:
        try:
            if isinstance(state, Mapping):
                sealed = await trio.to_thread.run_sync(
                    self.journal.seal_snapshot, seq, version, state
                )
            else:
                state_json = b"".join(await _paced(state))
                # Sealed here, not in a thread (a third thread wanting the GIL beside the
                # loop and the writer stretched it to 20-30 ms of slow acknowledgements),
                # in paced steps as the pieces were gathered (see seal_snapshot_json_steps).
                steps = self.journal.seal_snapshot_json_steps(seq, version, state_json)
                *_, last = await _paced(steps)
                assert last is not None
                sealed = last
            # A file of its own, written beside the commits: no commit waits behind it.
            await trio.to_thread.run_sync(self.journal.write_snapshot, sealed)
        finally:
            self.snapshotting = False

    async def background(self, scope: trio.CancelScope) -> None:
        """Checkpoints and head writes, until ``scope`` is cancelled at shutdown."""
        with scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._checkpoint_loop)
                nursery.start_soon(self._head_loop)
                if self.deadlines is not None:
                    nursery.start_soon(self.deadlines.watch)

    async def _checkpoint_loop(self) -> None:
        while True:
            await trio.sleep(self.checkpoint_interval)
            await trio.to_thread.run_sync(self.journal.checkpoint)
            # what commits added meanwhile, copied between two commits, so that the next
            # one writes the WAL from its start (see Journal.finish_checkpoint)
            async with self.writer:
                await self.thread.run(self.journal.finish_checkpoint)

    async def _head_loop(self) -> None:
        while True:
            await self.head_dirty.wait()
            self.head_dirty = trio.Event()
            began = trio.current_time()
            await trio.to_thread.run_sync(self.journal.write_head)
            # At most one head fsync per ``head_interval``: commits in between are coalesced
            # into the next write (the head may trail the database; see the module note).
            await trio.sleep_until(began + self.head_interval)

    def abandon(self, receive: trio.MemoryReceiveChannel[Request]) -> None:
        """Answer every request that will never be written, then close the channels."""
        self.closing = True
        for req in self.inflight:
            req.answer(JournalClosed("the journal stopped before this request was written"))
        while True:
            try:
                req = receive.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                break
            req.answer(JournalClosed("the journal stopped before this request was written"))
        receive.close()
        for sub in self.subscribers:
            sub.close()
        self.subscribers.clear()


def _answer(
    req: Request,
    kind: int,
    arg: Any,
    committed: list[list[CommittedRecord]],
    recorded: dict[str, Operation],
) -> AppendResult | BraidError:
    op = req.prepared.operation
    if kind == _WRITE:
        return AppendResult(tuple(committed[arg]), op.result if op else None, duplicate=False)
    if kind == _DUP_BATCH:
        original = arg.prepared.operation
        return AppendResult((), original.result, duplicate=True)
    if kind == _DUP_RECORDED:
        return AppendResult((), recorded[arg].result, duplicate=True)
    assert isinstance(arg, BraidError)
    return arg


def _fail(batch: list[Request], why: str) -> None:
    for req in batch:
        req.answer(JournalError(f"{why}; its outcome is unknown and the journal stopped"))


T = TypeVar("T")

SNAPSHOT_SLICE = 0.001
"""Seconds of gathering or sealing a snapshot at a time on the event loop."""
SNAPSHOT_DUTY = 0.1
"""Share of the event loop's time a snapshot's gathering or sealing may take while it lasts."""


async def _paced(steps: Iterable[T]) -> list[T]:
    """Every item of ``steps``, taken in slices of :data:`SNAPSHOT_SLICE`, each followed by
    a pause long enough to keep the work to :data:`SNAPSHOT_DUTY` of the event loop.

    At 500 streaming runs a snapshot's pieces take 40-95 ms of the loop (4,500 entities;
    the read model's piece cache spares the unchanged ones). Gathered 64 at a time between
    passes they took most of each pass, the loop fell behind, and acknowledgements waited
    100-150 ms for a few hundred milliseconds around every snapshot (the p99 of
    ``tools/bench runs``: 110 ms; 62-70 ms spread out). A snapshot then takes 0.4-1 s to be
    gathered, and a restart replays the events committed meanwhile.
    """
    out: list[T] = []
    clock = time.perf_counter
    rest = (1 - SNAPSHOT_DUTY) / SNAPSHOT_DUTY  # seconds of pause per second of work
    began = clock()
    for step in steps:
        out.append(step)
        worked = clock() - began
        if worked >= SNAPSHOT_SLICE:
            await trio.sleep(worked * rest)
            began = clock()
    await trio.lowlevel.checkpoint()
    return out


async def run_journal(
    journal: Journal,
    *,
    admission: Admission | None = None,
    capacity: int = 4096,
    max_batch: int = 512,
    checkpoint_interval: float = 1.0,
    snapshot_every: int | None = None,
    commit_interval: float = 0.001,
    head_interval: float = 0.02,
    answer_within: float | None = None,
    task_status: trio.TaskStatus[JournalHandle] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the journal actor; start it with ``await nursery.start(run_journal, journal)``.

    ``task_status.started`` receives the :class:`JournalHandle`. Returns after
    :meth:`JournalHandle.aclose` has drained the queue; raises when a write fails. With
    ``snapshot_every``, the admission must have a ``snapshot()`` method and a snapshot is
    written once at least that many records were committed since the actor started or since
    the previous snapshot. ``commit_interval`` is the least time between two commits (a
    request arriving sooner waits for the rest of it, with every other such request: a
    commit per interval under load, none delayed when isolated); ``head_interval`` the
    least time between two head writes. With ``answer_within`` (seconds), a request not
    answered that long after it was made is answered with :class:`JournalTimeout`.
    """
    if capacity < 0 or max_batch < 1 or checkpoint_interval <= 0:
        raise ValueError("capacity >= 0, max_batch >= 1 and checkpoint_interval > 0 are required")
    if commit_interval < 0 or head_interval < 0:
        raise ValueError("commit_interval and head_interval must not be negative")
    if answer_within is not None and not answer_within > 0:
        raise ValueError("answer_within must be positive")
    snapshots: SnapshottingAdmission | None = None
    if snapshot_every is not None:
        if snapshot_every < 1:
            raise ValueError("snapshot_every must be at least 1")
        if not isinstance(admission, SnapshottingAdmission):
            raise TypeError("snapshot_every needs an admission with a snapshot() method")
        snapshots = admission
    ledger = await trio.to_thread.run_sync(journal.operation_digests)
    actor = _Actor(
        journal=journal,
        admission=admission if admission is not None else _NoAdmission(),
        snapshots=snapshots,
        max_batch=max_batch,
        checkpoint_interval=checkpoint_interval,
        snapshot_every=snapshot_every,
        commit_interval=commit_interval,
        head_interval=head_interval,
        ledger=ledger,
        last_seq=journal.last_seq,
        last_snapshot_seq=journal.last_seq,
        deadlines=None if answer_within is None else AnswerDeadlines(answer_within),
    )
    send, receive = trio.open_memory_channel[Request](capacity)
    handle = JournalHandle(send, actor)
    try:
        with actor.thread.running():
            async with trio.open_nursery() as nursery:
                background = trio.CancelScope()
                nursery.start_soon(actor.background, background)
                task_status.started(handle)
                await actor.serve(receive, nursery)
                background.cancel(reason="the journal actor is stopping")
        await trio.to_thread.run_sync(journal.write_head)
        await trio.to_thread.run_sync(journal.checkpoint)
    finally:
        actor.abandon(receive)
        send.close()
        actor.stopped.set()
