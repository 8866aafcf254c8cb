"""The journal's answer deadline and shielded appends."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import pytest
import trio

from braid_actors.errors import JournalTimeout
from braid_actors.journal import AppendResult, Journal, JournalHandle, run_journal
from braid_actors.journal._request import AnswerDeadlines, Request

from ._helpers import GatedJournal, rec

if TYPE_CHECKING:
    from pathlib import Path


async def _start(nursery: trio.Nursery, journal: Journal, **options: Any) -> JournalHandle:
    handle: JournalHandle = await nursery.start(functools.partial(run_journal, journal, **options))
    return handle


async def test_a_shielded_append_gets_its_answer_through_a_cancellation(
    home: Path, key: bytes
) -> None:
    """Cancelled while its commit runs, a shielded append still returns the committed
    records; the cancellation is delivered at the producer's next checkpoint."""
    journal = GatedJournal.open(home, key).arm()
    seen: list[str] = []

    async def producer(shielded: bool, scope: trio.CancelScope) -> None:
        with scope:
            try:
                result = await handle.append([rec(1)], shielded=shielded)
                seen.append(f"answered {result.records[0].seq}")
                await trio.lowlevel.checkpoint()
                seen.append("not cancelled")
            except trio.Cancelled:
                seen.append("cancelled")
                raise

    try:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                handle = await _start(nursery, journal)
                for shielded in (True, False):
                    scope = trio.CancelScope()
                    async with trio.open_nursery() as producers:
                        producers.start_soon(producer, shielded, scope)
                        await journal.next_commit()
                        scope.cancel()
                        await trio.sleep(0.05)  # the cancellation has reached the producer
                        journal.gate.release()
                await handle.aclose()
        # shielded: the answer, then the cancellation; not shielded: the cancellation only
        assert seen == ["answered 1", "cancelled", "cancelled"]
        assert journal.last_seq == 2  # both were written: a sent request is never withdrawn
    finally:
        journal.close()


async def test_a_request_unanswered_within_the_deadline_times_out(home: Path, key: bytes) -> None:
    """A commit stuck past ``answer_within`` answers its producer with journal_timeout (the
    outcome is unknown: here the commit lands afterwards); later requests are unaffected."""
    journal = GatedJournal.open(home, key).arm()
    try:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                handle = await _start(nursery, journal, answer_within=0.2)
                assert handle.answer_within == 0.2
                began = trio.current_time()
                with pytest.raises(JournalTimeout) as info:
                    await handle.append([rec(1)], shielded=True)
                assert len(await journal.next_commit()) == 1  # it is stuck in its commit
                assert info.value.code == "journal_timeout"
                assert 0.2 <= trio.current_time() - began < 1.0
                journal.gate.release()  # the stuck commit now lands
                async with trio.open_nursery() as producers:
                    producers.start_soon(handle.append, [rec(2)])
                    await journal.next_commit()
                    journal.gate.release()
                await handle.aclose()
        assert [r.data["n"] for r in journal.read()] == [1, 2]
    finally:
        journal.close()


async def test_answer_deadlines_expire_only_what_is_due() -> None:
    """Answered requests leave the front; a due one times out; one not yet due waits."""
    deadlines = AnswerDeadlines(within=1.0)
    done, due, later = (Request(None), Request(None), Request(None))  # type: ignore[arg-type]
    deadlines.add(done)
    deadlines.add(due)
    await trio.sleep(0.5)
    deadlines.add(later)
    done.answer(AppendResult((), None, duplicate=False))
    assert deadlines.expire(due.due - 0.001) == 0
    assert list(deadlines.pending) == [due, later]  # the answered one was dropped
    assert deadlines.expire(due.due) == 1
    assert isinstance(due.outcome, JournalTimeout)
    assert later.outcome is None and list(deadlines.pending) == [later]
    deadlines.prune()
    assert list(deadlines.pending) == [later]  # unanswered: kept
    later.answer(AppendResult((), None, duplicate=False))
    deadlines.prune()
    assert not deadlines.pending


async def test_answered_requests_are_let_go_after_each_batch(journal: Journal) -> None:
    """The actor drops answered requests from the deadline queue after every batch, so a
    busy journal does not keep every acknowledged request alive until the next tick."""
    async with trio.open_nursery() as nursery:
        handle = await _start(nursery, journal, answer_within=600.0)
        for i in range(5):
            await handle.append([rec(i)])
        assert handle._actor.deadlines is not None
        assert len(handle._actor.deadlines.pending) == 0
        await handle.aclose()


async def test_the_deadline_must_be_positive(home: Path, key: bytes) -> None:
    journal = GatedJournal.open(home, key).arm()
    try:
        with pytest.raises(ValueError, match="answer_within must be positive"):
            await run_journal(journal, answer_within=0)
    finally:
        journal.close()
