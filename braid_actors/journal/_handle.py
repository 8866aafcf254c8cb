"""The journal actor's handle: what producers hold (see ``_actor`` for the theory)."""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import trio
import trio.lowlevel

from braid_actors.errors import JournalClosed, JournalCorrupt, OperationConflict

from ._encoding import prepare_append
from ._records import CommittedRecord
from ._request import Request

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Mapping, Sequence

    from ._actor import _Actor
    from ._records import AppendResult, NewRecord, Operation


class JournalHandle:
    """What producers hold: append, subscribe, and shut the journal actor down."""

    __slots__ = ("_actor", "_send")

    def __init__(self, send: trio.MemorySendChannel[Request], actor: _Actor) -> None:
        self._send = send
        self._actor = actor

    @property
    def last_seq(self) -> int:
        """Sequence number of the last acknowledged record."""
        return self._actor.last_seq

    @property
    def answer_within(self) -> float | None:
        """The journal's answer deadline in seconds (see :func:`run_journal`), if any."""
        d = self._actor.deadlines
        return None if d is None else d.within

    @property
    def closed(self) -> bool:
        """True once the journal stopped accepting appends."""
        return self._actor.closing

    async def append(
        self,
        records: Sequence[NewRecord],
        operation: Operation | None = None,
        *,
        shielded: bool = False,
    ) -> AppendResult:
        """Append ``records`` (atomically) and return once the commit holding them is durable.

        Raises the admission's :class:`BraidError` when the request is refused,
        :class:`OperationConflict` when ``operation``'s id was used with other parameters,
        :class:`BadRequest` when a payload is not JSON-compatible, :class:`JournalClosed` once
        the journal stopped accepting appends, and :class:`JournalError` when the write failed
        (the outcome is then unknown). A producer cancelled after sending does not withdraw
        its request; with ``shielded`` the wait itself is not cancellable (the answer is
        returned, and the cancellation is delivered at the producer's next checkpoint). With
        the journal's ``answer_within``, :class:`JournalTimeout` is raised when no answer came
        in that time (the outcome is then unknown).
        """
        request = await self.submit(records, operation, shielded=shielded)
        return await request.result()

    async def submit(
        self,
        records: Sequence[NewRecord],
        operation: Operation | None = None,
        *,
        shielded: bool = False,
    ) -> Request:
        """Queue an append and return its :class:`Request` without waiting for the answer.

        Requests are decided and committed in the order they were queued, so a producer
        may queue one and learn its outcome later (``await request.result()``, which raises
        what :meth:`append` raises). Raises here what is known before queueing:
        :class:`BadRequest` and :class:`JournalClosed`.
        """
        if self._actor.closing:
            raise JournalClosed("the journal is shutting down and accepts no appends")
        request = Request(prepare_append(records, operation), shielded=shielded)
        await trio.lowlevel.checkpoint_if_cancelled()  # a cancelled producer sends nothing
        deadlines = self._actor.deadlines
        if deadlines is not None:
            deadlines.add(request)  # before the send: a send blocked on a full queue counts
        try:
            try:
                # fast path: queue without yielding (a queued request is not withdrawn)
                self._send.send_nowait(request)
            except trio.WouldBlock:
                await self._send.send(request)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            raise JournalClosed("the journal is shutting down and accepts no appends") from None
        return request

    def submit_nowait(
        self,
        records: Sequence[NewRecord],
        operation: Operation | None = None,
        *,
        shielded: bool = False,
    ) -> Request | None:
        """:meth:`submit` without waiting: ``None`` when the request can't be queued at
        once (the queue is full or the journal is closing; :meth:`submit` then waits or
        raises). Raises :class:`BadRequest` as :meth:`submit` does."""
        if self._actor.closing:
            return None
        request = Request(prepare_append(records, operation), shielded=shielded)
        try:
            self._send.send_nowait(request)
        except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
            return None
        if self._actor.deadlines is not None:
            self._actor.deadlines.add(request)
        return request

    async def recorded(self, op_id: str, params_digest: str) -> Mapping[str, Any] | None:
        """The result recorded for a committed operation with this digest, else None.

        Raises :class:`OperationConflict` when the id was committed with another digest. An
        operation still in flight is not seen here; the actor's own ledger check covers it.
        """
        known = self._actor.ledger.get(op_id)
        if known is None:
            return None
        if known != params_digest:
            raise OperationConflict(
                f"operation {op_id} was already used with other parameters",
                details={"op_id": op_id},
            )
        async with self._actor.writer:
            op = await trio.to_thread.run_sync(self._actor.journal.get_operation, op_id)
        if op is None:
            raise JournalCorrupt(f"operation {op_id} is in the ledger but not in the journal")
        return op.result

    @asynccontextmanager
    async def subscribe(
        self, buffer: int = 1024
    ) -> AsyncIterator[trio.MemoryReceiveChannel[CommittedRecord]]:
        """Receive records committed from now on; dropped when ``buffer`` records behind."""
        if buffer < 1:
            raise ValueError("a subscription needs a buffer of at least one record")
        send, receive = trio.open_memory_channel[CommittedRecord](buffer)
        if self._actor.closing:
            send.close()
        else:
            self._actor.subscribers.add(send)
        try:
            async with receive:
                yield receive
        finally:
            self._actor.subscribers.discard(send)
            send.close()

    async def aclose(self) -> None:
        """Stop accepting appends, commit and acknowledge what is queued, wait for the end."""
        self._actor.closing = True
        await self._send.aclose()
        await self._actor.stopped.wait()
