"""One append request waiting for its answer, and the deadline every answer has.

A producer parks on its :class:`Request` until the journal actor answers it (the first
answer wins). A shielded request cannot be cancelled while it waits: the producer gets the
answer, and a cancellation that arrived meanwhile is delivered at its next checkpoint — what
a shielded cancel scope does, without a scope per append (on the hottest path, a cancel
scope with a deadline cost more than the append's own bookkeeping).

The deadline is the journal's, not each producer's: with ``answer_within``, an
:class:`AnswerDeadlines` watchdog answers any request still unanswered that long after it was
made with :class:`JournalTimeout` (its outcome is unknown: the commit may still land, and its
later answer is then ignored). One deadline for all requests keeps the queue of pending
deadlines in the order they fall due, so the watchdog only ever looks at its front.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

import attrs
import trio
import trio.lowlevel

from braid_actors.errors import BraidError, JournalTimeout

if TYPE_CHECKING:
    from ._encoding import PreparedAppend
    from ._records import AppendResult


class Request:
    """One append waiting for its own answer.

    The producer parks on the request itself (what ``trio.Event.wait`` does, without the
    event's task set): this is the hottest path of the journal, once per append.
    """

    __slots__ = ("_task", "due", "outcome", "prepared", "shielded")

    def __init__(self, prepared: PreparedAppend, *, shielded: bool = False) -> None:
        self.prepared = prepared
        self.shielded = shielded
        self.outcome: AppendResult | BraidError | None = None
        self.due = 0.0
        """When the watchdog answers it with :class:`JournalTimeout` (with a deadline)."""
        self._task: trio.lowlevel.Task | None = None

    def answer(self, outcome: AppendResult | BraidError) -> None:
        """Give the answer (the first one wins) and wake the producer if it is parked."""
        if self.outcome is None:
            self.outcome = outcome
            task, self._task = self._task, None
            if task is not None:
                trio.lowlevel.reschedule(task)

    async def wait(self) -> AppendResult | BraidError:
        """Park until answered; cancelling the wait leaves the request queued.

        A shielded request refuses the cancellation (it is delivered at the producer's next
        checkpoint instead).
        """
        if self.outcome is None:
            self._task = trio.lowlevel.current_task()
            shielded = self.shielded

            def abort(_: trio.lowlevel.RaiseCancelT) -> trio.lowlevel.Abort:
                if shielded:
                    return trio.lowlevel.Abort.FAILED  # the answer will reschedule us
                self._task = None
                return trio.lowlevel.Abort.SUCCEEDED

            await trio.lowlevel.wait_task_rescheduled(abort)
        else:
            await trio.lowlevel.cancel_shielded_checkpoint()
        assert self.outcome is not None
        return self.outcome

    async def result(self) -> AppendResult:
        """:meth:`wait`, raising the :class:`BraidError` that answered it."""
        outcome = await self.wait()
        if isinstance(outcome, BraidError):
            raise outcome
        return outcome

    @property
    def answered(self) -> bool:
        """True once the journal (or the watchdog) answered."""
        return self.outcome is not None


@attrs.define(eq=False)
class AnswerDeadlines:
    """Requests in the order they were made, each answered by ``within`` seconds at most."""

    within: float
    pending: deque[Request] = attrs.Factory(deque)

    def add(self, request: Request) -> None:
        request.due = trio.current_time() + self.within
        self.pending.append(request)

    def prune(self) -> None:
        """Drop answered requests from the front (the actor calls it after each batch: an
        answered request must not keep its records alive until the next watchdog tick)."""
        pending = self.pending
        while pending and pending[0].outcome is not None:
            pending.popleft()

    def expire(self, now: float) -> int:
        """Answer every request due by ``now`` with :class:`JournalTimeout`; drop answered ones
        from the front. Returns how many timed out."""
        pending, timed_out = self.pending, 0
        while pending:
            front = pending[0]
            if front.outcome is None:
                if front.due > now:
                    break
                front.answer(
                    JournalTimeout(
                        f"the journal did not answer within {self.within:g} s; "
                        "the request's outcome is unknown",
                        details={"withinS": self.within},
                    )
                )
                timed_out += 1
            pending.popleft()
        return timed_out

    async def watch(self) -> None:
        """Expire due requests, about ten times per deadline (at most once per 10 ms)."""
        tick = max(0.01, self.within / 10)
        while True:
            await trio.sleep(tick)
            self.expire(trio.current_time())
