"""The journal actor's life: subscribers, shutdown, failure, checkpoints, snapshots."""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
import trio
import trio.lowlevel
import trio.testing

from braid_actors.errors import JournalClosed, JournalError
from braid_actors.journal import CommittedRecord, Journal, JournalHandle, run_journal
from braid_actors.journal._head import read_head

from ._helpers import (
    CountingAdmission,
    GatedJournal,
    RecordingAdmission,
    longest_wait_beside,
    rec,
)

if TYPE_CHECKING:
    from pathlib import Path

    from braid_actors.journal._store import Staged


async def test_subscribers_get_records_committed_after_subscribing(journal: Journal) -> None:
    """A subscriber receives, in order, every record committed while it is subscribed."""
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            handle: JournalHandle = await nursery.start(run_journal, journal)
            await handle.append([rec(0)])
            async with handle.subscribe() as records:
                await handle.append([rec(1), rec(2)])
                await handle.append([rec(3)])
                got = [await records.receive() for _ in range(3)]
            await handle.append([rec(4)])
            await handle.aclose()
    assert [r.seq for r in got] == [2, 3, 4]
    assert [r.data["n"] for r in got] == [1, 2, 3]


async def test_slow_subscriber_is_dropped_not_waited_for(journal: Journal) -> None:
    """A subscriber more than its buffer behind is closed; the writer and others carry on."""
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            handle: JournalHandle = await nursery.start(run_journal, journal)
            async with handle.subscribe(buffer=2) as slow, handle.subscribe() as keen:
                for i in range(5):
                    await handle.append([rec(i)])  # nobody reads while the writer goes on
                assert [r.seq async for r in slow] == [1, 2]  # then EndOfChannel
                assert [(await keen.receive()).seq for _ in range(5)] == [1, 2, 3, 4, 5]
            await handle.aclose()
    assert journal.last_seq == 5


async def test_close_drains_and_acknowledges_what_is_queued(home: Path, key: bytes) -> None:
    """aclose refuses new appends, then commits and acks everything already queued."""
    journal = GatedJournal.open(home, key).arm()
    acked: list[int] = []
    try:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                handle: JournalHandle = await nursery.start(run_journal, journal)

                async def produce(n: int) -> None:
                    result = await handle.append([rec(n)])
                    acked.extend(r.data["n"] for r in result.records)

                nursery.start_soon(produce, 0)
                await journal.next_commit()
                for n in (1, 2, 3):
                    nursery.start_soon(produce, n)
                await trio.testing.wait_all_tasks_blocked()
                nursery.start_soon(handle.aclose)
                await trio.testing.wait_all_tasks_blocked()
                assert handle.closed
                with pytest.raises(JournalClosed):
                    await handle.append([rec(99)])
                journal.gate.release()
                assert len(await journal.next_commit()) == 3
                journal.gate.release()
        assert sorted(acked) == [0, 1, 2, 3]
        assert sorted(r.data["n"] for r in journal.read()) == [0, 1, 2, 3]
        with pytest.raises(JournalClosed):
            await handle.append([rec(100)])
    finally:
        journal.close()


async def test_head_is_current_after_a_clean_stop(home: Path, key: bytes) -> None:
    """The head file may trail while running but records the last commit after shutdown."""
    with Journal.open(home, key) as journal:
        async with trio.open_nursery() as nursery:
            handle: JournalHandle = await nursery.start(run_journal, journal)
            async with trio.open_nursery() as producers:
                for i in range(30):
                    producers.start_soon(handle.append, [rec(i)])
            await handle.aclose()
        exists, head = read_head(home / "journal.head")
        assert exists and head is not None
        assert (head.seq, head.hash) == (journal.last_seq, journal.last_hash) == (30, head.hash)


async def test_write_failure_fails_the_batch_and_stops(home: Path, key: bytes) -> None:
    """When a commit raises, its requests get JournalError, queued ones JournalClosed, and the
    actor itself raises instead of carrying on with a diverged admission."""

    class Broken(GatedJournal):
        def finish_staged(
            self, staged: Staged, *, sync_head: bool = True
        ) -> list[list[CommittedRecord]]:
            self.entered.put(staged.records)
            self.gate.acquire(timeout=10)
            self.abandon_staged(staged)
            raise JournalError("simulated disk failure")

    journal = Broken.open(home, key).arm()
    admission = RecordingAdmission()
    outcomes: dict[int, BaseException] = {}
    try:
        actor_error = pytest.RaisesExc(JournalError, match="simulated disk failure")
        with trio.fail_after(10), pytest.RaisesGroup(actor_error, flatten_subgroups=True):
            async with trio.open_nursery() as nursery:
                handle: JournalHandle = await nursery.start(
                    functools.partial(run_journal, journal, admission=admission)
                )

                async def produce(n: int) -> None:
                    try:
                        await handle.append([rec(n)])
                    except JournalError as exc:
                        outcomes[n] = exc

                async with trio.open_nursery() as producers:
                    producers.start_soon(produce, 1)
                    await journal.next_commit()
                    producers.start_soon(produce, 2)
                    await trio.testing.wait_all_tasks_blocked()
                    journal.gate.release()
        assert type(outcomes[1]) is JournalError
        assert "outcome is unknown" in str(outcomes[1])
        assert isinstance(outcomes[2], JournalClosed)
        assert admission.committed_batches == []  # nothing became visible
        with pytest.raises(JournalClosed):
            await handle.append([rec(3)])
    finally:
        journal.close()
    assert Journal.open(home, key).last_seq == 0


class TickingJournal(Journal):
    """Reports each checkpoint to the trio side with the (virtual) time it ran."""

    ticks: trio.MemorySendChannel[float]

    def checkpoint(self) -> None:
        super().checkpoint()
        trio.from_thread.run_sync(lambda: self.ticks.send_nowait(trio.current_time()))


async def test_checkpoints_run_every_interval(
    home: Path, key: bytes, autojump_clock: trio.testing.MockClock
) -> None:
    """A task of the actor runs a checkpoint every checkpoint_interval seconds, off the path."""
    journal = TickingJournal.open(home, key)
    send, ticks = trio.open_memory_channel[float](10)
    journal.ticks = send
    start = trio.current_time()
    try:
        async with trio.open_nursery() as nursery:
            handle: JournalHandle = await nursery.start(
                functools.partial(run_journal, journal, checkpoint_interval=2.5, head_interval=0.0)
            )
            await handle.append([rec(1)])
            times = [await ticks.receive() - start for _ in range(3)]
            await handle.aclose()
    finally:
        journal.close()
    assert times == pytest.approx([2.5, 5.0, 7.5])


async def test_actor_writes_snapshots_of_the_read_model(home: Path, key: bytes) -> None:
    """With snapshot_every, the admission's read model is snapshotted at a committed seq."""
    admission = CountingAdmission()
    with Journal.open(home, key) as journal:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                handle: JournalHandle = await nursery.start(
                    functools.partial(run_journal, journal, admission=admission, snapshot_every=3)
                )
                for i in range(4):
                    await handle.append([rec(i)])
                await handle.aclose()
        assert journal.latest_snapshot(1) == (3, {"count": 3})


async def test_snapshot_every_needs_a_snapshotting_admission(journal: Journal) -> None:
    """Asking for snapshots without a snapshot() method fails at start."""
    async with trio.open_nursery() as nursery:
        with pytest.raises(TypeError, match="snapshot"):
            await nursery.start(
                functools.partial(
                    run_journal, journal, admission=RecordingAdmission(), snapshot_every=5
                )
            )


async def test_a_snapshot_is_gathered_in_slices_that_leave_the_loop_free() -> None:
    """Gathering a snapshot's pieces (1 ms of work each here) yields to the event loop
    after every slice and pauses, so another task is never held up for long, and the
    pieces join in order."""
    from braid_actors.journal._actor import SNAPSHOT_DUTY, _paced

    def pieces() -> Iterator[bytes]:
        for n in range(100):
            end = time.perf_counter() + 0.001
            while time.perf_counter() < end:
                pass
            yield b"%d," % n

    began = time.perf_counter()
    pieces_paced, longest = await longest_wait_beside(lambda: _paced(pieces()))
    took = time.perf_counter() - began
    assert b"".join(pieces_paced) == b"".join(b"%d," % n for n in range(100))
    assert longest < 0.02  # 64 pieces per pass held the loop for 64 ms here
    assert took > 0.1 / SNAPSHOT_DUTY * 0.5  # the pauses spread the work out
