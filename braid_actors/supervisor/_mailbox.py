"""Actor mailboxes: a bounded channel an actor owns, and the references its callers hold.

Theory of operation
-------------------
An actor opens a :class:`Mailbox` for its lifetime and hands out ``mailbox.ref``, usually
through ``task_status.started``::

    async def run_counter(*, task_status=trio.TASK_STATUS_IGNORED):
        async with Mailbox[Add, int]("counter", capacity=16) as mailbox:
            task_status.started(mailbox.ref)
            await serve_requests(mailbox, handle)

Callers hold an :class:`ActorRef`:

* ``await ref.cast(request)`` queues a request and returns; the ``await`` is the backpressure:
  it blocks while the mailbox is full.
* ``await ref.call(request, timeout=...)`` queues a request with its own reply slot and waits
  on that slot; sending and waiting both run under ``trio.fail_after(timeout)``.

Every call ends: with the reply, with the :class:`BraidError` the actor chose
(:meth:`Delivery.fail`), with :class:`CallTimeout`, or with :class:`ActorStopped`. Leaving the
mailbox's ``async with`` (the actor returned, failed or was cancelled) answers every call whose
caller still waits — queued, taken but unanswered, or blocked on a full mailbox — with
:class:`ActorStopped`, and closes the channel: a cast blocked on a full mailbox and every later
request get ActorStopped too, while casts already queued are dropped (a cast only promises that
it was queued). A call that timed out may still be handled: its outcome is unknown to the
caller.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Generic, TypeVar

import attrs
import trio

from braid_actors.errors import ActorStopped, BraidError, CallTimeout

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from types import TracebackType

Req = TypeVar("Req")
Rep = TypeVar("Rep")


@attrs.define(eq=False)
class _ReplySlot(Generic[Rep]):
    """The answer to one call: the first answer wins, later ones are ignored."""

    _outcome: tuple[Rep] | BraidError | None = None
    _done: trio.Event = attrs.Factory(trio.Event)

    @property
    def answered(self) -> bool:
        return self._outcome is not None

    def answer(self, outcome: tuple[Rep] | BraidError) -> None:
        if self._outcome is None:
            self._outcome = outcome
            self._done.set()

    async def wait(self) -> Rep:
        await self._done.wait()
        outcome = self._outcome
        if isinstance(outcome, BraidError):
            raise outcome
        assert outcome is not None
        return outcome[0]


@attrs.frozen
class _Envelope(Generic[Req, Rep]):
    request: Req
    slot: _ReplySlot[Rep] | None


@attrs.define(eq=False)
class Delivery(Generic[Req, Rep]):
    """One request taken from a mailbox; a call is answered with :meth:`reply` or :meth:`fail`."""

    request: Req
    """What the caller sent."""
    _slot: _ReplySlot[Rep] | None

    @property
    def expects_reply(self) -> bool:
        """True for a call, False for a cast."""
        return self._slot is not None

    @property
    def answered(self) -> bool:
        """True once the call was answered (a cast never is)."""
        return self._slot is not None and self._slot.answered

    def reply(self, value: Rep) -> None:
        """Answer the call with ``value``; nothing for a cast or an answered call."""
        self._answer((value,))

    def fail(self, error: BraidError) -> None:
        """Answer the call with ``error``, which its caller raises."""
        self._answer(error)

    def _answer(self, outcome: tuple[Rep] | BraidError) -> None:
        if self._slot is not None:
            self._slot.answer(outcome)


@attrs.define(eq=False)
class ActorRef(Generic[Req, Rep]):
    """What callers hold: send requests to one actor's mailbox."""

    _mailbox: Mailbox[Req, Rep]

    @property
    def name(self) -> str:
        return self._mailbox.name

    @property
    def stopped(self) -> bool:
        """True once the actor's mailbox closed; every request then gets ActorStopped."""
        return self._mailbox.closed

    # A required ``timeout`` (not a ``fail_after`` left to each caller) is what makes every
    # call have a deadline; the call itself runs under ``trio.fail_after``.
    async def call(self, request: Req, *, timeout: float) -> Rep:  # noqa: ASYNC109
        """Send ``request`` and return the actor's reply.

        Raises the :class:`BraidError` the actor answered with, :class:`CallTimeout` when no
        answer came within ``timeout`` seconds (queueing included), and :class:`ActorStopped`
        when the actor stopped before answering.
        """
        slot = _ReplySlot[Rep]()
        waiting = self._mailbox._waiting
        waiting.add(slot)
        try:
            with trio.fail_after(timeout):
                await self._send(_Envelope(request, slot))
                return await slot.wait()
        except trio.TooSlowError:
            raise CallTimeout(self.name, timeout) from None
        finally:
            waiting.discard(slot)

    async def cast(self, request: Req) -> None:
        """Queue ``request`` without waiting for it to be handled; blocks while the mailbox is
        full. Raises :class:`ActorStopped` when the actor stopped."""
        await self._send(_Envelope(request, None))

    async def _send(self, envelope: _Envelope[Req, Rep]) -> None:
        try:
            await self._mailbox._send.send(envelope)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            raise ActorStopped(self.name) from None


class Mailbox(Generic[Req, Rep]):
    """An actor's bounded mailbox; use it as ``async with`` for the actor's whole life."""

    def __init__(self, name: str, capacity: int) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 0:
            raise ValueError(f"a mailbox needs a whole, non-negative capacity, not {capacity!r}")
        self.name = name
        self.capacity = capacity
        self._send, self._receive = trio.open_memory_channel[_Envelope[Req, Rep]](capacity)
        self._waiting: set[_ReplySlot[Rep]] = set()  # every call whose caller still waits
        self._closed = False
        self.ref: ActorRef[Req, Rep] = ActorRef(self)

    @property
    def closed(self) -> bool:
        return self._closed

    async def receive(self) -> Delivery[Req, Rep]:
        """The next request, waiting for one if the mailbox is empty."""
        envelope = await self._receive.receive()
        return Delivery(envelope.request, envelope.slot)

    def __aiter__(self) -> Mailbox[Req, Rep]:
        return self

    async def __anext__(self) -> Delivery[Req, Rep]:
        return await self.receive()

    def close(self) -> None:
        """Answer every pending call with ActorStopped and refuse further requests."""
        if self._closed:
            return
        self._closed = True
        # Calls queued, taken or still waiting for room: each caller waits on its slot.
        for slot in self._waiting:
            slot.answer(ActorStopped(self.name))
        self._waiting.clear()
        # Drops the queued casts; senders blocked on a full mailbox get BrokenResourceError,
        # hence ActorStopped, and so does every later send.
        self._receive.close()

    async def __aenter__(self) -> Mailbox[Req, Rep]:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


async def serve_requests(
    mailbox: Mailbox[Req, Rep], handler: Callable[[Req], Awaitable[Rep]]
) -> None:
    """Answer requests one at a time with ``handler``, until cancelled.

    A :class:`BraidError` the handler raises for a call is that caller's answer, and serving
    goes on. Any other exception, or a BraidError while handling a cast (there is no caller to
    tell), ends the actor: it propagates, and the mailbox's ``async with`` answers the pending
    calls with ActorStopped.
    """
    async for delivery in mailbox:
        try:
            reply = await handler(delivery.request)
        except BraidError as exc:
            if not delivery.expects_reply:
                raise
            delivery.fail(exc)
            continue
        delivery.reply(reply)
