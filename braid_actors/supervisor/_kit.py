"""Supervisors: own children's nursery, restart them by an OTP strategy, escalate past intensity.

Theory of operation
-------------------
:func:`run_supervisor` is started with ``nursery.start``. It opens its own nursery and starts
its children in order, each with ``await nursery.start`` inside a task of its own that runs
the child in the child's own :class:`trio.CancelScope`. A child is an async function
``start(*, task_status)`` that calls ``task_status.started(handle)`` once it is ready (an
actor passes its :class:`ActorRef`). If a child fails to start, the children already started
are stopped in reverse order and the supervisor fails to start with
:class:`ChildStartFailed` (the cause is the child's error): start-up failures surface at the
parent's ``await nursery.start(...)``. Once every child runs, ``task_status.started`` receives
the :class:`SupervisorHandle`.

The supervisor then handles one message at a time from its inbox: a child's exit, or a stop
request. An exception escaping a running child, or the return of a permanent child, is an exit
that calls for a restart (``_strategies.RESTART_ON``); the restart is counted against the
intensity window and, within it, carried out as ``_strategies.plan_restart`` says. A child
whose restart fails to start fails again, so a child that cannot start soon exhausts the
intensity. One restart too many: every child is stopped in reverse start order and the
supervisor raises :class:`SupervisorEscalation`, whose ``failures`` group holds each failure
with a note naming its child; a parent supervisor sees that as its child failing.

Stopping a child is a ladder bounded by the child's ``shutdown_grace``: its cooperative
``stop`` hook if it has one, then the cancellation of its own scope, each followed by a wait of
at most the grace. A child still running after that is abandoned: a
:class:`ChildStopTimeout` is recorded (``SupervisorHandle.stop_errors()``) and the supervisor
goes on — its restarts and its stop never wait longer. The abandoned task stays in the
supervisor's nursery with its scope cancelled (trio never leaves a task behind), so the
supervisor's own task ends only once it finally returns.

Cancelling the supervisor's task cancels exactly its subtree, all at once;
:meth:`SupervisorHandle.stop` is the orderly shutdown (reverse start order, each child's
ladder). Only exceptions are supervised: ``Cancelled``, ``KeyboardInterrupt`` and the like
always propagate.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import attrs
import trio

from braid_actors.errors import (
    ChildExited,
    ChildNotRunning,
    ChildStartFailed,
    ChildStopTimeout,
    SupervisorEscalation,
)

from ._strategies import (
    RESTART_ON,
    RESTARTS,
    STRATEGIES,
    Restart,
    RestartWindow,
    Strategy,
    plan_restart,
)

T = TypeVar("T")

DEFAULT_SHUTDOWN_GRACE = 5.0


def _check_grace(_instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{attribute.name} must be a finite number >= 0, not {value!r}")


@attrs.frozen
class ChildSpec:
    """How a supervisor starts, restarts and stops one child."""

    name: str
    """Unique among the supervisor's children; names the child in errors and notes."""
    start: Callable[..., Awaitable[object]]
    """``async def start(*, task_status)``, which calls ``task_status.started(handle)``."""
    restart: Restart = "permanent"
    """``permanent``: restart on any exit; ``transient``: on failure; ``temporary``: never."""
    shutdown_grace: float = attrs.field(default=DEFAULT_SHUTDOWN_GRACE, validator=_check_grace)
    """Seconds each step of the stop ladder waits for the child to finish."""
    stop: Callable[[Any], Awaitable[object]] | None = None
    """Optional cooperative stop, called with the child's handle before its scope is cancelled."""

    def __attrs_post_init__(self) -> None:
        if self.restart not in RESTARTS:
            raise ValueError(f"restart must be one of {', '.join(RESTARTS)}, not {self.restart!r}")

    @property
    def stop_budget(self) -> float:
        """The longest the stop ladder can take for this child."""
        return self.shutdown_grace * (2 if self.stop is not None else 1)


@attrs.frozen
class SupervisorSpec:
    """A supervisor: its children in start order, its strategy and its restart intensity."""

    name: str
    """Names the supervisor in errors, notes and task names."""
    children: tuple[ChildSpec, ...]
    """Started in this order, stopped in the reverse order."""
    strategy: Strategy = "one_for_one"
    """Which children a restart stops and starts again (see ``_strategies``)."""
    max_restarts: int = 3
    """More restarts than this within ``period`` seconds and the supervisor escalates."""
    period: float = 5.0
    """The intensity window, in seconds of the trio clock."""

    def __attrs_post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(
                f"strategy must be one of {', '.join(STRATEGIES)}, not {self.strategy!r}"
            )
        names = [child.name for child in self.children]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"supervisor {self.name} has duplicate children: {duplicates}")
        RestartWindow[None](self.max_restarts, self.period)  # validates both


def supervisor_child(
    spec: SupervisorSpec,
    *,
    restart: Restart = "permanent",
    shutdown_grace: float | None = None,
) -> ChildSpec:
    """A child spec running a nested supervisor, stopped in order through its handle.

    The default grace covers the whole orderly stop of its subtree.
    """
    if shutdown_grace is None:
        shutdown_grace = sum(child.stop_budget for child in spec.children)
    return ChildSpec(
        name=spec.name,
        start=functools.partial(run_supervisor, spec),
        restart=restart,
        shutdown_grace=shutdown_grace,
        stop=SupervisorHandle.stop,
    )


# ---- runtime objects ---------------------------------------------------------------------


@attrs.define(eq=False)
class _Instance:
    """One run of a child: its task's scope, its handle, how it ended."""

    spec: ChildSpec
    scope: trio.CancelScope = attrs.Factory(trio.CancelScope)
    done: trio.Event = attrs.Factory(trio.Event)
    handle: object = None
    error: Exception | None = None
    """The exception that ended it, if any (set before ``done``)."""


@attrs.define(eq=False)
class _Slot:
    """A child's place in the supervisor: its current instance, if any."""

    spec: ChildSpec
    instance: _Instance | None = None
    live: bool = True
    """Running, or waiting to be started again; false once it exited for good."""
    restarts: int = 0


@attrs.frozen
class _Exited:
    instance: _Instance


@attrs.frozen
class _StopRequested:
    pass


_Message = _Exited | _StopRequested


class _StartProbe(trio.TaskStatus[object]):
    """Forwards ``started`` and remembers it was called: failures before it belong to start."""

    def __init__(self, inner: trio.TaskStatus[object]) -> None:
        self._inner = inner
        self.called = False

    def started(self, value: object = None) -> None:
        self._inner.started(value)
        self.called = True


class _Supervisor:
    def __init__(self, spec: SupervisorSpec, nursery: trio.Nursery) -> None:
        self.spec = spec
        self.name = spec.name
        self.nursery = nursery
        self.slots = {child.name: _Slot(child) for child in spec.children}
        self.window = RestartWindow[tuple[str, Exception]](spec.max_restarts, spec.period)
        self.restarts = 0
        self.stop_errors: list[tuple[str, Exception]] = []
        self.inbox_send, self.inbox = trio.open_memory_channel[_Message](math.inf)
        self.children_stopped = trio.Event()
        self.handle = SupervisorHandle(self)

    # ---- one child -----------------------------------------------------------------------

    async def run_child(self, instance: _Instance, *, task_status: trio.TaskStatus[object]) -> None:
        probe = _StartProbe(task_status)
        try:
            try:
                with instance.scope:
                    await instance.spec.start(task_status=probe)
            except Exception as exc:
                if not probe.called:
                    raise  # a start-up failure: ``nursery.start`` raises it
                # A running child's failure is the supervisor's to handle: it is reported
                # through the inbox, never lost.
                instance.error = exc
        finally:
            instance.done.set()
        if probe.called:
            self.inbox_send.send_nowait(_Exited(instance))

    async def start(self, slot: _Slot) -> None:
        """Start ``slot``'s child; its start-up failure is raised here."""
        instance = _Instance(slot.spec)
        instance.handle = await self.nursery.start(
            self.run_child, instance, name=f"{self.name}/{slot.spec.name}"
        )
        slot.instance = instance
        slot.live = True

    async def stop(self, slot: _Slot, why: str) -> None:
        """Stop ``slot``'s child by its ladder; never waits past its grace per step."""
        instance, slot.instance = slot.instance, None
        if instance is None:
            return
        spec = instance.spec
        # A child already done failed on its own, its exit still queued behind this restart.
        ended_before = instance.done.is_set()
        if spec.stop is not None and not instance.done.is_set():
            with trio.move_on_after(spec.shutdown_grace):
                try:
                    await spec.stop(instance.handle)
                except Exception as exc:
                    # The ladder goes straight on to cancellation; the hook's failure is kept.
                    self._note(exc, spec.name, "failed in its stop hook")
                    self.stop_errors.append((spec.name, exc))
                else:
                    await instance.done.wait()
        if not instance.done.is_set():
            instance.scope.cancel(reason=f"supervisor {self.name} stops {spec.name}: {why}")
            with trio.move_on_after(spec.shutdown_grace):
                await instance.done.wait()
        if not instance.done.is_set():
            timeout = ChildStopTimeout(self.name, spec.name, spec.shutdown_grace)
            self.stop_errors.append((spec.name, timeout))
        elif instance.error is not None:
            how = "failed" if ended_before else "failed while being stopped"
            self._note(instance.error, spec.name, how)
            self.stop_errors.append((spec.name, instance.error))

    async def stop_all(self, why: str) -> None:
        for slot in reversed(self.slots.values()):
            await self.stop(slot, why)

    # ---- the supervisor ------------------------------------------------------------------

    async def start_all(self) -> ChildStartFailed | None:
        started: list[_Slot] = []
        for slot in self.slots.values():
            try:
                await self.start(slot)
            except Exception as exc:
                self._note(exc, slot.spec.name, "failed to start")
                for done in reversed(started):
                    await self.stop(done, f"{slot.spec.name} failed to start")
                failure = ChildStartFailed(self.name, slot.spec.name)
                failure.__cause__ = exc
                return failure
            started.append(slot)
        return None

    async def serve(self) -> SupervisorEscalation | None:
        """Handle exits and the stop request, one at a time; the escalation, if any."""
        try:
            while True:
                message = await self.inbox.receive()
                if isinstance(message, _StopRequested):
                    await self.stop_all("the supervisor is stopping")
                    return None
                escalation = await self._exited(message.instance)
                if escalation is not None:
                    return escalation
        finally:
            self.children_stopped.set()

    async def _exited(self, instance: _Instance) -> SupervisorEscalation | None:
        slot = self.slots[instance.spec.name]
        if slot.instance is not instance:
            return None  # it was stopped (or replaced) while its exit was queued
        slot.instance = None
        name = instance.spec.name
        error: Exception
        if instance.error is not None:
            error = instance.error
            self._note(error, name, "failed")
            kind = "failed"
        else:
            error = ChildExited(self.name, name)
            kind = "returned"
        if kind not in RESTART_ON[instance.spec.restart]:
            slot.live = False
            return None
        return await self._restart(slot, error)

    async def _restart(self, slot: _Slot, error: Exception) -> SupervisorEscalation | None:
        failures = [(slot, error)]
        while failures:
            slot, error = failures.pop()
            if not self.window.record(trio.current_time(), (slot.spec.name, error)):
                return await self._escalate()
            self.restarts += 1
            plan = plan_restart(
                self.spec.strategy,
                list(self.slots),
                [name for name, other in self.slots.items() if other.live],
                slot.spec.name,
                {name: other.spec.restart for name, other in self.slots.items()},
            )
            why = f"{slot.spec.name} is restarted ({self.spec.strategy})"
            for name in plan.stop:
                await self.stop(self.slots[name], why)
                self.slots[name].live = name in plan.start
            for name in plan.start:
                again = self.slots[name]
                assert again.instance is None, f"{name} is still running"
                try:
                    await self.start(again)
                except Exception as exc:
                    # The children after it stay live but unstarted: the next plan covers them.
                    self._note(exc, name, "failed to restart")
                    failures.append((again, exc))
                    break
                again.restarts += 1
        return None

    async def _escalate(self) -> SupervisorEscalation:
        before = len(self.stop_errors)
        await self.stop_all("the supervisor exceeded its restart intensity")
        failures = list(self.window.causes(trio.current_time()))
        failures += self.stop_errors[before:]
        return SupervisorEscalation(
            self.name,
            max_restarts=self.spec.max_restarts,
            period=self.spec.period,
            failures=failures,
        )

    def _note(self, exc: BaseException, child: str, what: str) -> None:
        exc.add_note(f"child {child!r} of supervisor {self.name!r} {what}")


class SupervisorHandle:
    """What a supervisor's parent holds: its children's handles, its state, its stop."""

    def __init__(self, supervisor: _Supervisor) -> None:
        self._sup = supervisor

    @property
    def name(self) -> str:
        return self._sup.name

    def running(self) -> tuple[str, ...]:
        """Names of the children running now, in start order."""
        return tuple(
            name
            for name, slot in self._sup.slots.items()
            if slot.instance is not None and not slot.instance.done.is_set()
        )

    @property
    def restarts(self) -> int:
        """How many restarts this supervisor carried out (what its intensity counts)."""
        return self._sup.restarts

    def restarts_of(self, child: str) -> int:
        """How many times ``child`` was started again."""
        return self._slot(child).restarts

    def failures(self) -> tuple[Exception, ...]:
        """The failures still counted by the intensity window, oldest first, each noted."""
        return tuple(error for _, error in self._sup.window.causes(trio.current_time()))

    def stop_errors(self) -> tuple[Exception, ...]:
        """What went wrong while stopping children: ChildStopTimeout, hook failures."""
        return tuple(error for _, error in self._sup.stop_errors)

    def child(self, name: str, kind: type[T]) -> T:
        """The handle the running child ``name`` passed to ``task_status.started``.

        A restarted child has a new handle: ask again rather than keep an old one. Raises
        :class:`ChildNotRunning`, and ``TypeError`` when the handle is not a ``kind``.
        """
        instance = self._slot(name).instance
        if instance is None or instance.done.is_set():
            raise ChildNotRunning(self._sup.name, name)
        handle = instance.handle
        if not isinstance(handle, kind):
            raise TypeError(f"child {name}'s handle is a {type(handle).__name__}, not a {kind}")
        return handle

    async def stop(self) -> None:
        """Stop every child in reverse start order, each by its ladder, then the supervisor.

        Returns once every child finished or was abandoned (see :meth:`stop_errors`).
        """
        if not self._sup.children_stopped.is_set():
            self._sup.inbox_send.send_nowait(_StopRequested())
            await self._sup.children_stopped.wait()

    def _slot(self, name: str) -> _Slot:
        try:
            return self._sup.slots[name]
        except KeyError:
            raise LookupError(f"supervisor {self._sup.name} has no child {name}") from None


async def run_supervisor(
    spec: SupervisorSpec,
    *,
    task_status: trio.TaskStatus[SupervisorHandle] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run a supervisor; start it with ``await nursery.start(run_supervisor, spec)``.

    ``task_status.started`` receives the :class:`SupervisorHandle` once every child runs.
    Raises :class:`ChildStartFailed` (before ``started``) when a child cannot start, and
    :class:`SupervisorEscalation` when the restart intensity is exceeded; returns after
    :meth:`SupervisorHandle.stop`.
    """
    outcome: ChildStartFailed | SupervisorEscalation | None = None
    async with trio.open_nursery() as nursery:
        sup = _Supervisor(spec, nursery)
        try:
            outcome = await sup.start_all()
            if outcome is None:
                task_status.started(sup.handle)
                outcome = await sup.serve()
        finally:
            sup.children_stopped.set()
    # Raised outside the nursery, so the parent sees this error itself, not a group of one.
    if outcome is not None:
        raise outcome
