"""The journal actor: batching, acknowledgement after its own commit, ledger, admission."""

from __future__ import annotations

import functools
import threading
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import pytest
import trio
import trio.testing

from braid_actors.errors import BadRequest, OperationConflict
from braid_actors.journal import AppendResult, Journal, JournalHandle, Operation, run_journal

from ._helpers import GatedJournal, RecordingAdmission, rec

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path


@asynccontextmanager
async def running(journal: Journal, **options: Any) -> AsyncIterator[JournalHandle]:
    """Run the actor for the block, then shut it down cleanly."""
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            handle: JournalHandle = await nursery.start(
                functools.partial(run_journal, journal, **options)
            )
            yield handle
            await handle.aclose()


def fresh_seqs(home: Path, key: bytes) -> list[int]:
    """Sequence numbers visible to a brand-new read-only connection."""
    with Journal.open(home, key, readonly=True) as reader:
        return [r.seq for r in reader.read()]


async def test_append_is_acknowledged_with_its_records(journal: Journal) -> None:
    """An append returns its committed records; last_seq follows the acknowledgements."""
    async with running(journal) as handle:
        first = await handle.append([rec(1), rec(2)])
        second = await handle.append([rec(3)])
        assert [r.seq for r in first.records] == [1, 2]
        assert [r.data["n"] for r in second.records] == [3]
        assert first.result is None and not first.duplicate
        assert handle.last_seq == 3
    assert [r.seq for r in journal.read()] == [1, 2, 3]


async def test_ack_waits_for_the_commit_holding_that_request(home: Path, key: bytes) -> None:
    """A request queued while a commit runs is not acknowledged by that commit, only its own."""
    journal = GatedJournal.open(home, key).arm()
    acked: dict[str, tuple[AppendResult, list[int]]] = {}
    try:
        async with running(journal) as handle:

            async def produce(name: str, n: int) -> None:
                result = await handle.append([rec(n)])
                # at the instant of the ack, the records must already be durable and visible
                acked[name] = (result, fresh_seqs(home, key))

            async with trio.open_nursery() as producers:
                producers.start_soon(produce, "a", 1)
                assert len(await journal.next_commit()) == 1  # a's commit is running ...
                producers.start_soon(produce, "b", 2)  # ... while b is queued
                await trio.testing.wait_all_tasks_blocked()
                assert acked == {}

                journal.gate.release()  # a's commit completes
                assert len(await journal.next_commit()) == 1  # b has a commit of its own
                await trio.testing.wait_all_tasks_blocked()
                assert set(acked) == {"a"}  # a's commit woke a, and only a
                assert acked["a"][1] == [1]
                assert fresh_seqs(home, key) == [1]  # b is not durable, so not acked

                journal.gate.release()
            assert [r.seq for r in acked["b"][0].records] == [2]
            assert acked["b"][1] == [1, 2]
    finally:
        journal.close()


async def test_the_writer_thread_only_commits(home: Path, key: bytes) -> None:
    """The actor writes a batch's rows on the event loop and hands the writer thread only
    the COMMIT: under load the thread then waits for the interpreter once per commit, not
    after every statement."""
    journal = Journal.open(home, key)
    statements: list[tuple[int, str]] = []
    journal._conn.set_trace_callback(
        lambda sql: statements.append((threading.get_ident(), sql.split(None, 1)[0].upper()))
    )
    loop = threading.get_ident()
    try:
        async with running(journal, max_batch=4) as handle, trio.open_nursery() as producers:
            for n in range(12):
                producers.start_soon(handle.append, [rec(n)])
    finally:
        journal.close()
    assert fresh_seqs(home, key) == list(range(1, 13))
    # from the first commit on (the actor reads its ledger in a thread when it starts)
    first = next(i for i, (_, sql) in enumerate(statements) if sql == "BEGIN")
    on_loop = [sql for thread, sql in statements[first:] if thread == loop]
    elsewhere = [sql for thread, sql in statements[first:] if thread != loop]
    commits = elsewhere.count("COMMIT")
    assert commits >= 3  # batches of at most 4
    assert on_loop.count("BEGIN") == commits and "INSERT" in on_loop and "COMMIT" not in on_loop
    assert set(elsewhere) == {"COMMIT"}  # (a checkpoint uses a connection of its own)


async def test_every_ack_is_readable_from_a_fresh_connection(home: Path, key: bytes) -> None:
    """Under concurrency, each producer finds its own records durable when its ack arrives."""
    journal = Journal.open(home, key)
    seen_missing: list[int] = []
    try:
        async with running(journal, max_batch=7) as handle:

            async def produce(p: int) -> None:
                for i in range(4):
                    result = await handle.append([rec(p * 10 + i), rec(p * 10 + i)])
                    visible = set(fresh_seqs(home, key))
                    seen_missing.extend(r.seq for r in result.records if r.seq not in visible)

            async with trio.open_nursery() as producers:
                for p in range(25):
                    producers.start_soon(produce, p)
        assert seen_missing == []
        assert journal.last_seq == 25 * 4 * 2
    finally:
        journal.close()


async def test_duplicate_operation_after_commit_writes_nothing(journal: Journal) -> None:
    """Retrying a committed operation returns its recorded result and writes nothing."""
    op = Operation("op-1", "create", "sha256:p", {"id": "c_1"})
    async with running(journal) as handle:
        first = await handle.append([rec(1)], op)
        again = await handle.append([rec(1)], Operation("op-1", "create", "sha256:p", {"x": 0}))
        assert not first.duplicate and first.result == {"id": "c_1"}
        assert again == AppendResult(records=(), result={"id": "c_1"}, duplicate=True)
    assert journal.last_seq == 1


async def test_duplicate_is_recognised_after_a_restart(home: Path, key: bytes) -> None:
    """The ledger is loaded at start, so a retry after a restart is still a duplicate."""
    with Journal.open(home, key) as j:
        async with running(j) as handle:
            await handle.append([rec(1)], Operation("op", "c", "sha256:p", {"r": 1}))
    with Journal.open(home, key) as j:
        async with running(j) as handle:
            again = await handle.append([rec(1)], Operation("op", "c", "sha256:p", {}))
            with pytest.raises(OperationConflict):
                await handle.append([rec(1)], Operation("op", "c", "sha256:other", {}))
        assert again.duplicate and again.result == {"r": 1}
        assert j.last_seq == 1


async def test_reused_operation_with_other_parameters_conflicts(journal: Journal) -> None:
    """The same operation id with another parameter digest is an OperationConflict."""
    async with running(journal) as handle:
        await handle.append([rec(1)], Operation("op", "c", "sha256:a", {}))
        with pytest.raises(OperationConflict) as info:
            await handle.append([rec(2)], Operation("op", "c", "sha256:b", {}))
        assert info.value.details == {"op_id": "op"}
    assert journal.last_seq == 1


async def test_identical_operations_in_one_batch_write_once(home: Path, key: bytes) -> None:
    """Two producers racing the same operation into one batch cause exactly one write."""
    journal = GatedJournal.open(home, key).arm()
    results: list[AppendResult] = []
    try:
        async with running(journal) as handle:

            async def produce(n: int, op: Operation | None) -> None:
                results.append(await handle.append([rec(n)], op))

            async with trio.open_nursery() as producers:
                producers.start_soon(produce, 0, None)
                await journal.next_commit()  # hold the first commit so both queue up
                for _ in range(2):
                    producers.start_soon(produce, 1, Operation("op", "c", "sha256:p", {"r": 1}))
                await trio.testing.wait_all_tasks_blocked()
                journal.gate.release()
                batch = await journal.next_commit()
                assert len(batch) == 1  # the duplicate is not in the write
                await trio.testing.wait_all_tasks_blocked()
                assert len(results) == 1  # neither is answered before that commit
                journal.gate.release()
        dup = [r for r in results if r.duplicate]
        new = [r for r in results[1:] if not r.duplicate]
        assert len(dup) == 1 and len(new) == 1
        assert dup[0].result == new[0].result == {"r": 1}
        assert dup[0].records == () and [r.seq for r in new[0].records] == [2]
        assert journal.last_seq == 2
        assert journal.operation_digests() == {"op": "sha256:p"}
    finally:
        journal.close()


async def test_conflicting_operations_in_one_batch(home: Path, key: bytes) -> None:
    """Within one batch, the later request reusing an id with other parameters conflicts."""
    journal = GatedJournal.open(home, key).arm()
    outcomes: dict[str, object] = {}
    try:
        async with running(journal) as handle:

            async def produce(name: str, op: Operation | None) -> None:
                try:
                    outcomes[name] = await handle.append([rec(1)], op)
                except OperationConflict as exc:
                    outcomes[name] = exc

            async with trio.open_nursery() as producers:
                producers.start_soon(produce, "hold", None)
                await journal.next_commit()
                producers.start_soon(produce, "a", Operation("op", "c", "sha256:a", {}))
                await trio.testing.wait_all_tasks_blocked()
                producers.start_soon(produce, "b", Operation("op", "c", "sha256:b", {}))
                await trio.testing.wait_all_tasks_blocked()
                journal.gate.release()
                assert len(await journal.next_commit()) == 1
                journal.gate.release()
        assert isinstance(outcomes["a"], AppendResult)
        assert isinstance(outcomes["b"], OperationConflict)
        assert journal.operation_digests() == {"op": "sha256:a"}
    finally:
        journal.close()


async def test_admission_rejection_isolates_one_request(home: Path, key: bytes) -> None:
    """A refused request gets its error; the rest of its batch commits; nothing of it lands."""
    journal = GatedJournal.open(home, key).arm()
    admission = RecordingAdmission()
    outcomes: dict[str, object] = {}
    try:
        async with running(journal, admission=admission) as handle:

            async def produce(name: str, type_: str) -> None:
                try:
                    outcomes[name] = await handle.append([rec(1, type_=type_)])
                except BadRequest as exc:
                    outcomes[name] = exc

            async with trio.open_nursery() as producers:
                producers.start_soon(produce, "hold", "t")
                await journal.next_commit()
                for name, type_ in (("first", "ok"), ("refused", "bad"), ("last", "ok")):
                    producers.start_soon(produce, name, type_)
                    await trio.testing.wait_all_tasks_blocked()
                journal.gate.release()
                assert len(await journal.next_commit()) == 2
                await trio.testing.wait_all_tasks_blocked()
                assert "refused" not in outcomes  # answered with its batch, after the commit
                journal.gate.release()
        assert isinstance(outcomes["refused"], BadRequest)
        first, last = outcomes["first"], outcomes["last"]
        assert isinstance(first, AppendResult) and isinstance(last, AppendResult)
        assert [r.seq for r in first.records + last.records] == [2, 3]
        assert [[r.seq for r in b] for b in admission.committed_batches] == [[1], [2, 3]]
        assert [r.type for r in journal.read()] == ["t", "ok", "ok"]
    finally:
        journal.close()


async def test_admission_is_only_called_on_the_trio_thread(journal: Journal) -> None:
    """admit and committed never run in the commit thread."""
    admission = RecordingAdmission()
    async with running(journal, admission=admission) as handle, trio.open_nursery() as producers:
        for i in range(20):
            producers.start_soon(handle.append, [rec(i)])
    assert admission.threads == {threading.get_ident()}
    assert sum(len(b) for b in admission.committed_batches) == 20


async def test_unjsonable_payload_is_refused_in_the_producer(journal: Journal) -> None:
    """A payload that is not JSON never reaches a batch: BadRequest, nothing written."""
    admission = RecordingAdmission()
    async with running(journal, admission=admission) as handle:
        with pytest.raises(BadRequest):
            await handle.append([rec(1, when=object())])
        await handle.append([rec(2)])
    assert [r.data["n"] for r in journal.read()] == [2]
    assert len(admission.admitted) == 1


async def test_cancelled_producer(home: Path, key: bytes) -> None:
    """Cancelling before sending writes nothing; cancelling after sending does not withdraw."""
    journal = GatedJournal.open(home, key).arm()
    try:
        async with running(journal) as handle:
            with trio.CancelScope() as scope:
                scope.cancel()
                await handle.append([rec(1)])
            async with trio.open_nursery() as producers:
                producers.start_soon(handle.append, [rec(2)])
                await journal.next_commit()
                producers.cancel_scope.cancel()
            journal.gate.release()
        assert [r.data["n"] for r in journal.read()] == [2]
    finally:
        journal.close()


async def test_requests_within_the_commit_interval_share_the_next_commit(
    home: Path, key: bytes
) -> None:
    """Requests arriving within ``commit_interval`` of a commit wait and go in one batch;
    a request after a quiet spell longer than the interval is written at once."""
    journal = GatedJournal.open(home, key).arm()
    try:
        async with running(journal, commit_interval=0.5) as handle, trio.open_nursery() as n:
            n.start_soon(handle.append, [rec(1)])
            assert len(await journal.next_commit()) == 1
            journal.gate.release()
            for i in range(3):  # three producers, 20 ms apart, all within the interval
                n.start_soon(handle.append, [rec(10 + i)])
                await trio.sleep(0.02)
            assert len(await journal.next_commit()) == 3  # without the floor: 1, 1, 1
            journal.gate.release()
            await trio.sleep(0.6)  # a quiet spell longer than the interval
            began = trio.current_time()
            n.start_soon(handle.append, [rec(20)])
            assert len(await journal.next_commit()) == 1
            assert trio.current_time() - began < 0.4  # not held back by the floor
            journal.gate.release()
        assert journal.last_seq == 5
    finally:
        journal.close()


async def test_negative_intervals_are_refused(journal: Journal) -> None:
    with pytest.raises(ValueError, match="must not be negative"):
        await run_journal(journal, commit_interval=-1.0)
    with pytest.raises(ValueError, match="must not be negative"):
        await run_journal(journal, head_interval=-1.0)
