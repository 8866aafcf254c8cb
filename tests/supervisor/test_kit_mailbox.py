"""The actor kit's mailboxes: typed calls, deadlines, backpressure, answers when an actor stops."""

from __future__ import annotations

import functools

import attrs
import pytest
import trio
import trio.testing

from braid_actors.errors import ActorStopped, BraidError, CallTimeout, UnknownRun
from braid_actors.supervisor._mailbox import ActorRef, Delivery, Mailbox, serve_requests


@attrs.frozen
class Add:
    n: int


@attrs.frozen
class Lookup:
    run_id: str


Request = Add | Lookup


class Broken(Exception):
    """A bug inside an actor (not a BraidError)."""


async def run_adder(
    capacity: int = 4, *, task_status: trio.TaskStatus[ActorRef[Request, int]]
) -> None:
    """Adds to a running total; a Lookup is refused with UnknownRun; Add(-1) is a bug."""
    total = 0

    async def handle(request: Request) -> int:
        nonlocal total
        if isinstance(request, Lookup):
            raise UnknownRun(f"no run {request.run_id}")
        if request.n < 0:
            raise Broken("negative")
        total += request.n
        return total

    async with Mailbox[Request, int]("adder", capacity) as mailbox:
        task_status.started(mailbox.ref)
        await serve_requests(mailbox, handle)


@attrs.define(eq=False)
class Idle:
    """An actor that never reads its mailbox until told, then hands over one delivery."""

    mailbox: Mailbox[Add, int]
    taken: list[Delivery[Add, int]] = attrs.Factory(list)
    take_one: trio.Event = attrs.Factory(trio.Event)


async def run_idle(capacity: int, *, task_status: trio.TaskStatus[Idle]) -> None:
    async with Mailbox[Add, int]("idle", capacity) as mailbox:
        idle = Idle(mailbox)
        task_status.started(idle)
        while True:
            await idle.take_one.wait()
            idle.take_one = trio.Event()
            idle.taken.append(await mailbox.receive())


async def test_call_is_a_typed_round_trip() -> None:
    """A call returns the actor's reply for that request; replies follow the actor's state."""
    async with trio.open_nursery() as nursery:
        ref: ActorRef[Request, int] = await nursery.start(run_adder)
        assert await ref.call(Add(2), timeout=1) == 2
        assert await ref.call(Add(40), timeout=1) == 42
        assert ref.name == "adder"
        nursery.cancel_scope.cancel()


async def test_braid_error_goes_back_to_the_caller_and_the_actor_goes_on() -> None:
    """A BraidError the handler raises is the caller's answer; the next call still works."""
    async with trio.open_nursery() as nursery:
        ref: ActorRef[Request, int] = await nursery.start(run_adder)
        with pytest.raises(UnknownRun) as info:
            await ref.call(Lookup("run_1"), timeout=1)
        assert info.value.code == "unknown_run"
        assert await ref.call(Add(1), timeout=1) == 1
        nursery.cancel_scope.cancel()


async def test_a_bug_ends_the_actor_and_its_caller_gets_actor_stopped() -> None:
    """An exception that is not a BraidError fails the actor; the pending call gets ActorStopped."""
    with pytest.RaisesGroup(Broken):
        async with trio.open_nursery() as nursery:
            ref: ActorRef[Request, int] = await nursery.start(run_adder)
            with pytest.raises(ActorStopped) as info:
                await ref.call(Add(-1), timeout=1)
            assert info.value.code == "actor_stopped"
            assert info.value.details == {"actor": "adder"}
            assert ref.stopped


async def test_call_without_an_answer_times_out(autojump_clock: trio.testing.MockClock) -> None:
    """A call that gets no answer raises CallTimeout exactly at its deadline."""
    async with trio.open_nursery() as nursery:
        idle: Idle = await nursery.start(run_idle, 4)
        idle.take_one.set()
        start = trio.current_time()
        with pytest.raises(CallTimeout) as info:
            await idle.mailbox.ref.call(Add(1), timeout=3)
        assert trio.current_time() - start == pytest.approx(3)
        assert info.value.code == "call_timeout"
        assert isinstance(info.value, BraidError)
        assert len(idle.taken) == 1 and not idle.taken[0].answered
        nursery.cancel_scope.cancel()


async def test_deadline_covers_a_full_mailbox(autojump_clock: trio.testing.MockClock) -> None:
    """A call stuck behind a full mailbox also ends at its deadline."""
    async with trio.open_nursery() as nursery:
        idle: Idle = await nursery.start(run_idle, 0)
        with pytest.raises(CallTimeout):
            await idle.mailbox.ref.call(Add(1), timeout=2)
        nursery.cancel_scope.cancel()


async def test_call_to_a_stopped_actor_gets_actor_stopped() -> None:
    """Once the actor is gone, calls and casts raise ActorStopped at once."""
    async with trio.open_nursery() as nursery:
        ref: ActorRef[Request, int] = await nursery.start(run_adder)
        nursery.cancel_scope.cancel()
    assert ref.stopped
    with pytest.raises(ActorStopped):
        await ref.call(Add(1), timeout=1)
    with pytest.raises(ActorStopped):
        await ref.cast(Add(1))


async def test_actor_stopping_answers_taken_and_queued_calls() -> None:
    """A call taken but unanswered and calls still queued all get ActorStopped, none hangs."""
    outcomes: list[str] = []

    async def caller(ref: ActorRef[Add, int], n: int) -> None:
        try:
            await ref.call(Add(n), timeout=10)
        except ActorStopped as exc:
            outcomes.append(f"{n}: {exc.code}")

    async with trio.open_nursery() as callers, trio.open_nursery() as actor:
        idle: Idle = await actor.start(run_idle, 4)
        for n in range(3):
            callers.start_soon(caller, idle.mailbox.ref, n)
        await trio.testing.wait_all_tasks_blocked()
        idle.take_one.set()
        await trio.testing.wait_all_tasks_blocked()
        assert len(idle.taken) == 1
        actor.cancel_scope.cancel()
    assert sorted(outcomes) == [f"{n}: actor_stopped" for n in range(3)]


async def test_cast_blocks_while_the_mailbox_is_full() -> None:
    """Casts fill the bounded mailbox; the next one waits until the actor takes a request."""
    sent: list[int] = []

    async def cast(ref: ActorRef[Add, int], n: int) -> None:
        await ref.cast(Add(n))
        sent.append(n)

    async with trio.open_nursery() as nursery:
        idle: Idle = await nursery.start(run_idle, 2)
        for n in range(3):
            nursery.start_soon(cast, idle.mailbox.ref, n)
            await trio.testing.wait_all_tasks_blocked()
        assert sent == [0, 1]
        idle.take_one.set()
        await trio.testing.wait_all_tasks_blocked()
        assert sent == [0, 1, 2]
        assert [d.request.n for d in idle.taken] == [0]
        assert not idle.taken[0].expects_reply
        nursery.cancel_scope.cancel()


async def test_sender_blocked_on_a_full_mailbox_gets_actor_stopped() -> None:
    """A cast waiting for room raises ActorStopped when the actor stops instead of hanging."""
    outcomes: list[str] = []

    async def cast(ref: ActorRef[Add, int]) -> None:
        try:
            await ref.cast(Add(1))
        except ActorStopped as exc:
            outcomes.append(exc.code)

    async with trio.open_nursery() as callers, trio.open_nursery() as actor:
        idle: Idle = await actor.start(run_idle, 0)
        callers.start_soon(cast, idle.mailbox.ref)
        await trio.testing.wait_all_tasks_blocked()
        assert outcomes == []
        actor.cancel_scope.cancel()
    assert outcomes == ["actor_stopped"]


async def test_first_answer_wins() -> None:
    """A delivery answered twice keeps its first answer."""
    async with trio.open_nursery() as nursery:
        idle: Idle = await nursery.start(run_idle, 1)

        async def answer() -> None:
            idle.take_one.set()
            await trio.testing.wait_all_tasks_blocked()
            delivery = idle.taken[0]
            delivery.reply(1)
            delivery.fail(UnknownRun("too late"))
            delivery.reply(2)
            assert delivery.answered

        nursery.start_soon(answer)
        assert await idle.mailbox.ref.call(Add(0), timeout=1) == 1
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("capacity", [-1, 1.5, True])
def test_mailbox_capacity_is_a_whole_bound(capacity: int) -> None:
    """An unbounded, fractional or negative capacity is refused."""
    with pytest.raises(ValueError, match="capacity"):
        Mailbox[Add, int]("bad", capacity)


async def test_mailbox_start_uses_partial_arguments() -> None:
    """An actor with arguments starts through functools.partial like any other."""
    async with trio.open_nursery() as nursery:
        ref: ActorRef[Request, int] = await nursery.start(functools.partial(run_adder, 1))
        await ref.cast(Add(5))
        assert await ref.call(Add(1), timeout=1) == 6
        nursery.cancel_scope.cancel()
