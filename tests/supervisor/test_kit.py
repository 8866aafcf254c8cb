"""Supervisors: start order, strategies, restart types, intensity, escalation, shutdown."""

from __future__ import annotations

import functools
from typing import Literal

import attrs
import pytest
import trio
import trio.testing

from braid_actors.errors import (
    ActorStopped,
    ChildExited,
    ChildNotRunning,
    ChildStartFailed,
    ChildStopTimeout,
    SupervisorEscalation,
)
from braid_actors.supervisor._kit import (
    ChildSpec,
    SupervisorHandle,
    SupervisorSpec,
    run_supervisor,
    supervisor_child,
)
from braid_actors.supervisor._mailbox import ActorRef, Mailbox, serve_requests
from braid_actors.supervisor._strategies import Restart, Strategy


class Boom(Exception):
    """A child's failure."""


@attrs.define(eq=False)
class Puppet:
    """A child's handle: tell it to crash or to return."""

    fate: Literal["crash", "return"] | None = None
    told: trio.Event = attrs.Factory(trio.Event)

    def crash(self) -> None:
        self.fate = "crash"
        self.told.set()

    def finish(self) -> None:
        self.fate = "return"
        self.told.set()


@attrs.define(eq=False)
class Cast:
    """Children that log what happens to them, in one shared list."""

    log: list[str] = attrs.Factory(list)
    starts: dict[str, int] = attrs.Factory(dict)

    def child(
        self,
        name: str,
        *,
        restart: Restart = "permanent",
        grace: float = 1.0,
        fail_starts: frozenset[int] = frozenset(),
        stubborn: float | None = None,
    ) -> ChildSpec:
        """``fail_starts``: which starts (1 = the first) fail; ``stubborn``: seconds it keeps
        running, shielded, after it is cancelled."""

        async def start(*, task_status: trio.TaskStatus[Puppet]) -> None:
            self.starts[name] = count = self.starts.get(name, 0) + 1
            self.log.append(f"start {name}")
            if count in fail_starts:
                raise Boom(f"{name} cannot start")
            puppet = Puppet()
            try:
                task_status.started(puppet)
                await puppet.told.wait()
            except trio.Cancelled:
                self.log.append(f"stop {name}")
                if stubborn is not None:
                    with trio.CancelScope(shield=True):
                        await trio.sleep(stubborn)
                    self.log.append(f"gone {name}")
                raise
            self.log.append(f"{puppet.fate} {name}")
            if puppet.fate == "crash":
                raise Boom(f"{name} crashed")

        return ChildSpec(name, start, restart=restart, shutdown_grace=grace)

    def take(self) -> list[str]:
        """The log so far, emptied."""
        taken, self.log[:] = list(self.log), []
        return taken


def spec(
    name: str,
    *children: ChildSpec,
    strategy: Strategy = "one_for_one",
    max_restarts: int = 3,
    period: float = 5.0,
) -> SupervisorSpec:
    return SupervisorSpec(name, children, strategy, max_restarts, period)


async def crash(sup: SupervisorHandle, name: str) -> None:
    """Crash a running child and let the supervisor do whatever it does about it."""
    sup.child(name, Puppet).crash()
    await trio.testing.wait_all_tasks_blocked()


async def test_children_start_in_order_and_stop_in_reverse() -> None:
    """A supervisor starts its children in order before it is started, and stop reverses it."""
    cast = Cast()
    async with trio.open_nursery() as nursery:
        sup: SupervisorHandle = await nursery.start(
            run_supervisor, spec("s", cast.child("a"), cast.child("b"), cast.child("c"))
        )
        assert cast.take() == ["start a", "start b", "start c"]
        assert sup.running() == ("a", "b", "c")
        await sup.stop()
        assert cast.take() == ["stop c", "stop b", "stop a"]
        assert not sup.running()
        await sup.stop()  # a second stop is a no-op
    assert sup.restarts == 0 and sup.stop_errors() == ()


async def test_one_for_one_restarts_only_the_failed_child() -> None:
    """one_for_one: the failed child starts again; its siblings are untouched."""
    cast = Cast()
    async with trio.open_nursery() as nursery:
        sup: SupervisorHandle = await nursery.start(
            run_supervisor, spec("s", cast.child("a"), cast.child("b"), cast.child("c"))
        )
        cast.take()
        await crash(sup, "b")
        assert cast.take() == ["crash b", "start b"]
        assert sup.running() == ("a", "b", "c")
        assert (sup.restarts, sup.restarts_of("a"), sup.restarts_of("b")) == (1, 0, 1)
        await sup.stop()


async def test_one_for_all_stops_the_rest_in_reverse_then_restarts_all_in_order() -> None:
    """one_for_all: the other children stop last-started first, then all start in order."""
    cast = Cast()
    children = [cast.child(n) for n in "abcd"]
    async with trio.open_nursery() as nursery:
        sup: SupervisorHandle = await nursery.start(
            run_supervisor, spec("s", *children, strategy="one_for_all")
        )
        cast.take()
        await crash(sup, "b")
        assert cast.take() == [
            "crash b",
            *["stop d", "stop c", "stop a"],
            *["start a", "start b", "start c", "start d"],
        ]
        assert sup.running() == ("a", "b", "c", "d") and sup.restarts == 1
        await sup.stop()


async def test_rest_for_one_restarts_the_failed_child_and_those_after_it() -> None:
    """rest_for_one: children started after the failed one stop in reverse, then all restart."""
    cast = Cast()
    children = [cast.child(n) for n in "abcd"]
    async with trio.open_nursery() as nursery:
        sup: SupervisorHandle = await nursery.start(
            run_supervisor, spec("s", *children, strategy="rest_for_one")
        )
        cast.take()
        await crash(sup, "b")
        assert cast.take() == ["crash b", "stop d", "stop c", "start b", "start c", "start d"]
        assert sup.restarts_of("a") == 0 and sup.restarts_of("d") == 1
        await sup.stop()


async def test_permanent_child_that_returns_is_restarted() -> None:
    """A permanent child's normal return is an exit to restart, recorded as ChildExited."""
    cast = Cast()
    async with trio.open_nursery() as nursery:
        sup: SupervisorHandle = await nursery.start(run_supervisor, spec("s", cast.child("a")))
        cast.take()
        sup.child("a", Puppet).finish()
        await trio.testing.wait_all_tasks_blocked()
        assert cast.take() == ["return a", "start a"]
        [failure] = sup.failures()
        assert isinstance(failure, ChildExited) and failure.code == "child_exited"
        await sup.stop()


async def test_transient_child_is_restarted_only_after_a_failure() -> None:
    """A transient child restarts when it fails and stays stopped when it returns."""
    cast = Cast()
    async with trio.open_nursery() as nursery:
        sup: SupervisorHandle = await nursery.start(
            run_supervisor, spec("s", cast.child("t", restart="transient"), cast.child("p"))
        )
        cast.take()
        await crash(sup, "t")
        assert cast.take() == ["crash t", "start t"]
        sup.child("t", Puppet).finish()
        await trio.testing.wait_all_tasks_blocked()
        assert cast.take() == ["return t"]
        assert sup.running() == ("p",) and sup.restarts == 1
        with pytest.raises(ChildNotRunning):
            sup.child("t", Puppet)
        await sup.stop()
        assert cast.take() == ["stop p"]


async def test_temporary_child_is_never_restarted() -> None:
    """A temporary child that fails stays stopped, as does one stopped because of a sibling."""
    cast = Cast()
    children = [cast.child("x", restart="temporary"), cast.child("y", restart="temporary")]
    async with trio.open_nursery() as nursery:
        sup: SupervisorHandle = await nursery.start(
            run_supervisor, spec("s", *children, cast.child("p"), strategy="one_for_all")
        )
        cast.take()
        await crash(sup, "x")
        assert cast.take() == ["crash x"]
        assert sup.running() == ("y", "p") and sup.restarts == 0
        await crash(sup, "p")
        assert cast.take() == ["crash p", "stop y", "start p"]
        assert sup.running() == ("p",)
        await sup.stop()


async def test_start_failure_surfaces_at_nursery_start() -> None:
    """A child that cannot start fails the supervisor's start; the ones started are stopped."""
    cast = Cast()
    children = [cast.child("a"), cast.child("b", fail_starts=frozenset({1})), cast.child("c")]
    async with trio.open_nursery() as nursery:
        with pytest.raises(ChildStartFailed) as info:
            await nursery.start(run_supervisor, spec("s", *children))
    assert cast.take() == ["start a", "start b", "stop a"]
    assert info.value.code == "child_start_failed"
    assert info.value.details == {"supervisor": "s", "child": "b"}
    assert isinstance(info.value.__cause__, Boom)
    assert "child 'b' of supervisor 's' failed to start" in info.value.__cause__.__notes__


async def test_intensity_exceeded_stops_children_in_reverse_and_escalates() -> None:
    """One restart too many: the rest stop last-started first and SupervisorEscalation names
    each failed child."""
    cast = Cast()
    children = [cast.child(n) for n in "abc"]
    with pytest.RaisesGroup(SupervisorEscalation) as group:
        async with trio.open_nursery() as nursery:
            sup: SupervisorHandle = await nursery.start(
                run_supervisor, spec("s", *children, max_restarts=1)
            )
            await crash(sup, "b")
            cast.take()
            await crash(sup, "b")
    assert cast.take() == ["crash b", "stop c", "stop a"]
    [escalation] = group.value.exceptions
    assert isinstance(escalation, SupervisorEscalation)
    assert escalation.code == "supervisor_escalation"
    assert escalation.details == {
        "supervisor": "s",
        "maxRestarts": 1,
        "period": 5.0,
        "children": ["b"],
    }
    assert escalation.failures is not None and escalation.__cause__ is escalation.failures
    assert [str(e) for e in escalation.failures.exceptions] == ["b crashed", "b crashed"]
    for failure in escalation.failures.exceptions:
        assert failure.__notes__ == ["child 'b' of supervisor 's' failed"]
    assert sup.running() == ()


async def test_intensity_window_slides(autojump_clock: trio.testing.MockClock) -> None:
    """Only restarts within the last ``period`` seconds count towards the intensity."""
    cast = Cast()
    with pytest.RaisesGroup(SupervisorEscalation):
        async with trio.open_nursery() as nursery:
            sup: SupervisorHandle = await nursery.start(
                run_supervisor, spec("s", cast.child("a"), max_restarts=2, period=10)
            )
            await crash(sup, "a")  # t=0
            await trio.sleep(4)
            await crash(sup, "a")  # t=4
            await trio.sleep(6.5)
            await crash(sup, "a")  # t=10.5: the restart at 0 no longer counts
            assert sup.restarts == 3 and len(sup.failures()) == 2
            await crash(sup, "a")  # three restarts within 10 s: one too many
    assert trio.current_time() == pytest.approx(10.5)


async def test_restart_that_cannot_start_counts_against_intensity() -> None:
    """A child that fails to start again fails again, until the intensity is exhausted."""
    cast = Cast()
    children = [cast.child("a"), cast.child("b", fail_starts=frozenset({2, 3, 4}))]
    with pytest.RaisesGroup(SupervisorEscalation) as group:
        async with trio.open_nursery() as nursery:
            sup: SupervisorHandle = await nursery.start(
                run_supervisor, spec("s", *children, max_restarts=2)
            )
            cast.take()
            await crash(sup, "b")
    assert cast.take() == ["crash b", "start b", "start b", "stop a"]
    [escalation] = group.value.exceptions
    assert isinstance(escalation, SupervisorEscalation) and escalation.failures is not None
    notes = [e.__notes__[-1] for e in escalation.failures.exceptions]
    assert notes == [
        "child 'b' of supervisor 's' failed",
        "child 'b' of supervisor 's' failed to restart",
        "child 'b' of supervisor 's' failed to restart",
    ]


async def test_rest_for_one_restart_interrupted_by_a_failed_start_resumes() -> None:
    """When a restarted child fails to start, the children after it are started by the retry."""
    cast = Cast()
    children = [cast.child("a"), cast.child("b", fail_starts=frozenset({2})), cast.child("c")]
    async with trio.open_nursery() as nursery:
        sup: SupervisorHandle = await nursery.start(
            run_supervisor, spec("s", *children, strategy="rest_for_one")
        )
        cast.take()
        await crash(sup, "a")
        assert cast.take() == [
            *["crash a", "stop c", "stop b", "start a", "start b"],  # b fails to start
            *["start b", "start c"],  # b's own restart: rest_for_one of b covers c, not a
        ]
        assert sup.running() == ("a", "b", "c") and sup.restarts == 2
        await sup.stop()


async def test_escalation_is_a_child_failure_for_the_parent() -> None:
    """A nested supervisor's escalation makes its parent apply the parent's own strategy."""
    cast = Cast()
    inner = spec("inner", cast.child("x"), cast.child("y"), max_restarts=0)
    async with trio.open_nursery() as nursery:
        root: SupervisorHandle = await nursery.start(
            run_supervisor, spec("root", cast.child("j"), supervisor_child(inner))
        )
        assert cast.take() == ["start j", "start x", "start y"]
        first = root.child("inner", SupervisorHandle)
        await crash(first, "x")
        assert cast.take() == ["crash x", "stop y", "start x", "start y"]
        assert root.running() == ("j", "inner") and root.restarts == 1
        second = root.child("inner", SupervisorHandle)
        assert second is not first and first.running() == ()
        [escalation] = root.failures()
        assert isinstance(escalation, SupervisorEscalation)
        assert escalation.__notes__ == ["child 'inner' of supervisor 'root' failed"]
        assert escalation.failures is not None
        [boom] = escalation.failures.exceptions
        assert boom.__notes__ == ["child 'x' of supervisor 'inner' failed"]
        await root.stop()
        assert cast.take() == ["stop y", "stop x", "stop j"]


async def test_escalation_climbs_while_supervisors_are_out_of_restarts() -> None:
    """Each level without restarts left stops its children and escalates to the next."""
    cast = Cast()
    inner = spec("inner", cast.child("x"), cast.child("y"), max_restarts=0)
    root = spec("root", cast.child("j"), supervisor_child(inner), max_restarts=0)
    with pytest.RaisesGroup(SupervisorEscalation) as group:
        async with trio.open_nursery() as nursery:
            handle: SupervisorHandle = await nursery.start(run_supervisor, root)
            cast.take()
            await crash(handle.child("inner", SupervisorHandle), "x")
    assert cast.take() == ["crash x", "stop y", "stop j"]
    [top] = group.value.exceptions
    assert isinstance(top, SupervisorEscalation) and top.failures is not None
    assert top.children == ("inner",)
    [nested] = top.failures.exceptions
    assert isinstance(nested, SupervisorEscalation) and nested.children == ("x",)


async def test_nested_supervisor_is_stopped_in_order_by_its_parent() -> None:
    """Stopping the root stops a nested supervisor's children in reverse order, through it."""
    cast = Cast()
    inner = spec("inner", cast.child("x"), cast.child("y"))
    async with trio.open_nursery() as nursery:
        root: SupervisorHandle = await nursery.start(
            run_supervisor, spec("root", cast.child("j"), supervisor_child(inner), cast.child("k"))
        )
        cast.take()
        await root.stop()
    assert cast.take() == ["stop k", "stop y", "stop x", "stop j"]
    assert root.stop_errors() == ()


async def test_stubborn_child_is_abandoned_after_its_grace(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A child that ignores cancellation is reported as ChildStopTimeout; stop does not wait."""
    cast = Cast()
    children = [cast.child("a", grace=1, stubborn=30), cast.child("b", grace=2)]
    async with trio.open_nursery() as nursery:
        sup: SupervisorHandle = await nursery.start(run_supervisor, spec("s", *children))
        cast.take()
        await sup.stop()
        assert trio.current_time() == pytest.approx(1)
        assert cast.take() == ["stop b", "stop a"]
        [timeout] = sup.stop_errors()
        assert isinstance(timeout, ChildStopTimeout)
        assert timeout.details == {"supervisor": "s", "child": "a", "grace": 1}
    # The abandoned task still belongs to the nursery, which ends when the task does.
    assert cast.take() == ["gone a"]
    assert trio.current_time() == pytest.approx(30)


async def test_restart_does_not_wait_past_a_stubborn_siblings_grace(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """one_for_all restarts everything once a stubborn sibling's grace is over."""
    cast = Cast()
    children = [cast.child("a", grace=1, stubborn=30), cast.child("b")]
    async with trio.open_nursery() as nursery:
        sup: SupervisorHandle = await nursery.start(
            run_supervisor, spec("s", *children, strategy="one_for_all")
        )
        cast.take()
        await crash(sup, "b")
        assert cast.take() == ["crash b", "stop a"]  # the supervisor waits out a's grace
        await trio.sleep(1.5)
        assert cast.take() == ["start a", "start b"]
        assert sup.running() == ("a", "b")
        assert [type(e) for e in sup.stop_errors()] == [ChildStopTimeout]
        await trio.sleep(30)
        assert cast.take() == ["gone a"]  # the old a, while the new one runs
        assert sup.running() == ("a", "b")
        await sup.stop()


async def test_stop_hook_comes_before_cancellation(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A child with a stop hook is asked first and cancelled only when the hook is not enough."""
    cast = Cast()

    async def finish(puppet: Puppet) -> None:
        puppet.finish()

    async def ignore(puppet: Puppet) -> None:
        await trio.sleep_forever()

    polite = attrs.evolve(cast.child("polite"), stop=finish)
    deaf = attrs.evolve(cast.child("deaf", grace=2), stop=ignore)
    async with trio.open_nursery() as nursery:
        sup: SupervisorHandle = await nursery.start(run_supervisor, spec("s", polite, deaf))
        cast.take()
        await sup.stop()
    assert cast.take() == ["stop deaf", "return polite"]
    assert trio.current_time() == pytest.approx(2)
    assert sup.stop_errors() == ()


async def test_failing_stop_hook_and_failing_cleanup_are_recorded(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A stop hook that raises goes on to cancellation; both errors are kept, each noted."""

    async def start(*, task_status: trio.TaskStatus[None]) -> None:
        task_status.started()
        try:
            await trio.sleep_forever()
        finally:
            raise Boom("cleanup failed")

    async def hook(handle: None) -> None:
        raise Boom("hook failed")

    async with trio.open_nursery() as nursery:
        sup: SupervisorHandle = await nursery.start(
            run_supervisor, spec("s", ChildSpec("c", start, stop=hook))
        )
        await sup.stop()
    assert trio.current_time() == 0  # a failed hook does not wait out the grace
    assert [(str(e), e.__notes__) for e in sup.stop_errors()] == [
        ("hook failed", ["child 'c' of supervisor 's' failed in its stop hook"]),
        ("cleanup failed", ["child 'c' of supervisor 's' failed while being stopped"]),
    ]


async def test_simultaneous_failures_make_one_restart() -> None:
    """Under one_for_all, siblings failing together are restarted once, not once each."""
    cast = Cast()
    children = [cast.child(n) for n in "abc"]
    async with trio.open_nursery() as nursery:
        sup: SupervisorHandle = await nursery.start(
            run_supervisor, spec("s", *children, strategy="one_for_all")
        )
        cast.take()
        sup.child("a", Puppet).crash()
        sup.child("b", Puppet).crash()
        await trio.testing.wait_all_tasks_blocked()
        log = cast.take()  # which of a and b is scheduled first is up to trio
        assert sorted(log[:2]) == ["crash a", "crash b"]
        assert log[2:] == ["stop c", "start a", "start b", "start c"]
        assert sup.restarts == 1
        [first] = sup.failures()
        [second] = sup.stop_errors()  # its exit was queued behind the restart
        assert {str(first), str(second)} == {"a crashed", "b crashed"}
        assert second.__notes__[0].endswith("failed")
        await sup.stop()


async def test_cancelling_the_root_cancels_exactly_its_subtree() -> None:
    """Cancelling the root's task cancels every descendant and nothing outside it."""
    cast = Cast()
    inner = spec("inner", cast.child("x"), cast.child("y"))
    bystander = trio.Event()
    outside: list[str] = []

    async def watch() -> None:
        try:
            await bystander.wait()
            outside.append("finished")
        except trio.Cancelled:
            outside.append("cancelled")
            raise

    async with trio.open_nursery() as outer:
        outer.start_soon(watch)
        async with trio.open_nursery() as host:
            await host.start(run_supervisor, spec("root", cast.child("j"), supervisor_child(inner)))
            cast.take()
            host.cancel_scope.cancel()
        assert sorted(cast.take()) == ["stop j", "stop x", "stop y"]
        bystander.set()
    assert outside == ["finished"]


async def test_restarted_actor_has_a_new_ref_and_the_old_one_reports_stopped() -> None:
    """After a restart, ask the supervisor for the new ref; the old one gets ActorStopped."""

    async def run_echo(*, task_status: trio.TaskStatus[ActorRef[str, str]]) -> None:
        async def echo(text: str) -> str:
            if text == "die":
                raise Boom("asked to die")
            return text

        async with Mailbox[str, str]("echo", 4) as mailbox:
            task_status.started(mailbox.ref)
            await serve_requests(mailbox, echo)

    async with trio.open_nursery() as nursery:
        sup: SupervisorHandle = await nursery.start(
            run_supervisor, spec("s", ChildSpec("echo", run_echo))
        )
        old = sup.child("echo", ActorRef)
        assert await old.call("hi", timeout=1) == "hi"
        with pytest.raises(ActorStopped):
            await old.call("die", timeout=1)
        await trio.testing.wait_all_tasks_blocked()
        new = sup.child("echo", ActorRef)
        assert new is not old and await new.call("again", timeout=1) == "again"
        with pytest.raises(ActorStopped):
            await old.cast("hello?")
        assert sup.restarts == 1
        await sup.stop()


async def test_child_lookup_is_checked() -> None:
    """Unknown names, stopped children and handles of another type are refused."""
    cast = Cast()
    async with trio.open_nursery() as nursery:
        sup: SupervisorHandle = await nursery.start(run_supervisor, spec("s", cast.child("a")))
        with pytest.raises(LookupError, match="no child z"):
            sup.child("z", Puppet)
        with pytest.raises(TypeError, match="Puppet"):
            sup.child("a", SupervisorHandle)
        await sup.stop()
        with pytest.raises(ChildNotRunning) as info:
            sup.child("a", Puppet)
        assert info.value.code == "child_not_running"


def test_specs_are_validated() -> None:
    """Duplicate names, unknown strategies or restart types and bad numbers are refused."""
    cast = Cast()
    with pytest.raises(ValueError, match="duplicate children"):
        spec("s", cast.child("a"), cast.child("a"))
    with pytest.raises(ValueError, match="strategy"):
        SupervisorSpec("s", (), "one_for_some")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_restarts"):
        spec("s", max_restarts=-1)
    with pytest.raises(ValueError, match="period"):
        spec("s", period=0)
    with pytest.raises(ValueError, match="restart"):
        cast.child("a", restart="sometimes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="shutdown_grace"):
        cast.child("a", grace=float("inf"))


def test_nested_supervisor_grace_covers_its_subtree() -> None:
    """supervisor_child's default grace is the longest orderly stop of its children."""
    cast = Cast()

    async def noop(handle: object) -> None:
        return None

    hooked = attrs.evolve(cast.child("h", grace=2), stop=noop)
    child = supervisor_child(spec("inner", cast.child("a", grace=3), hooked))
    assert child.shutdown_grace == 3 + 2 * 2
    assert child.stop is SupervisorHandle.stop
    assert isinstance(child.start, functools.partial)
