"""Worker controls: pause, resume, stop, kill, and recognising a worker after a restart.

Design note. A control acts on a process named by ``(pid, create_time, pgid)`` — a
:class:`ProcessInfo` from the journal, so that a restarted supervisor can act on workers it
did not spawn — or on a :class:`WorkerProcess` this process owns (then its trio process is
waited on and reaped). Every signal is preceded by an identity check through psutil: a pid
whose creation time differs, or whose process group is not the recorded one, is another
process, and the control reports ``gone`` without signalling anything.

A group leader (``pid == pgid``, every worker Braid starts) is signalled as a whole group;
any other process (a child the observer found) is signalled alone, so stopping a child
never touches its siblings. After a leader has exited, ``stop`` and ``kill`` sweep its group
with ``SIGKILL`` — but only when the pid is free or still names the exited leader (a zombie):
Linux keeps a pid reserved while a process group of that number exists, so such a group can
only hold the worker's own stragglers; once another process holds the pid, the old group is
known to be empty and nothing is sent.

Each control returns a :class:`ControlResult` for the worker's control history
(:meth:`ControlResult.record` gives the ``model.WorkerControl``); ``at`` is when the control
was applied. ``stop`` runs the shared stop ladder (:func:`climb_ladder`); like the ladder, it
raises :class:`~braid_actors.errors.WorkerStopTimeout` when the process survives SIGKILL's
bounded wait, and ``kill`` does the same — the caller records that as result
:data:`UNSTOPPABLE`. The exit of a process this one did not spawn is awaited on a pidfd
(Linux), else by polling. psutil reads here are single ``/proc`` lookups, cheap enough to
make in the trio thread.
"""

from __future__ import annotations

import contextlib
import os
import signal
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Final, Literal

import attrs
import psutil  # type: ignore[import-untyped, unused-ignore]
import trio

from braid_actors.errors import WorkerStopTimeout
from braid_actors.model import WorkerControl
from braid_actors.workers._identity import ProcessKey, find_process, presence, same_start
from braid_actors.workers._process import (
    Cooperative,
    ProcessInfo,
    StopPolicy,
    WorkerProcess,
    climb_ladder,
)

if TYPE_CHECKING:
    from collections.abc import Callable

ControlAction = Literal["pause", "resume", "stop", "kill"]
ControlOutcome = Literal[
    "paused",
    "resumed",
    "signalled",
    "exited",
    "cooperative",
    "terminated",
    "killed",
    "gone",
    "denied",
]
"""How a control went:

* ``paused`` / ``resumed``: the signal was sent and psutil confirmed the new status;
* ``signalled``: pause or resume was sent, but the status did not confirm it in time;
* ``exited`` / ``cooperative`` / ``terminated`` / ``killed``: the stop ladder's stage
  (``killed`` is also a ``kill`` that took effect);
* ``gone``: the process had already exited, or its pid names another process — nothing
  was signalled (apart from the sweep of an exited leader's own group);
* ``denied``: the operating system refused the signal (``EPERM``).
"""
UNSTOPPABLE: Final = "survived_kill"
"""The result to record when ``stop`` or ``kill`` raised :class:`WorkerStopTimeout`."""

POLL_INTERVAL: Final = 0.02
"""Seconds between psutil checks while waiting for a status change (or for the exit of a
process this one did not spawn, where the system has no pidfd)."""
CONFIRM_WITHIN: Final = 1.0
"""Seconds ``pause`` and ``resume`` wait for psutil to show the new status."""

Target = ProcessInfo | WorkerProcess


def utc_now() -> datetime:
    return datetime.now(UTC)


@attrs.frozen
class ControlResult:
    """One control applied to a worker, and how it went."""

    action: ControlAction
    """``pause``, ``resume``, ``stop`` or ``kill``."""
    at: datetime
    """When it was applied."""
    result: ControlOutcome
    """See :data:`ControlOutcome`."""
    returncode: int | None = None
    """Exit status when this process reaped the worker (negative: the signal); null when
    unknown (a worker it did not spawn is reaped by someone else)."""
    escalation: WorkerStopTimeout | None = None
    """For ``stop``: set when the ladder went past the cooperative step (the slow case)."""

    def record(self) -> WorkerControl:
        """The entry for ``model.Worker.control_history``."""
        return WorkerControl(action=self.action, at=self.at, result=self.result)


# ---- identity --------------------------------------------------------------------------


def recognise(pid: int, create_time: float, pgid: int) -> bool:
    """True when ``pid`` still names the running process created at ``create_time`` and it
    is still in process group ``pgid`` — the test for re-adopting a journaled worker after a
    restart. An exited process (a zombie) is not recognised."""
    return _state(ProcessInfo(pid=pid, create_time=create_time, pgid=pgid, command=())) == (
        "running"
    )


def adopt(pid: int, create_time: float, pgid: int) -> ProcessInfo | None:
    """A :class:`ProcessInfo` for a recognised worker (its command read back from the
    system, empty when unreadable), or ``None`` when :func:`recognise` says no."""
    if not recognise(pid, create_time, pgid):
        return None
    command: tuple[str, ...] = ()
    proc = find_process(ProcessKey(pid=pid, create_time=create_time))
    if proc is not None:
        with contextlib.suppress(psutil.Error):
            command = tuple(proc.cmdline())
    return ProcessInfo(pid=pid, create_time=create_time, pgid=pgid, command=command)


def _state(info: ProcessInfo) -> Literal["running", "zombie", "gone"]:
    """Like :func:`presence`, and a process that left its recorded group counts as gone."""
    state = presence(info.key)
    if state == "running":
        try:
            if os.getpgid(info.pid) != info.pgid:
                return "gone"
        except ProcessLookupError:
            return "gone"
    return state


def _info(target: Target) -> ProcessInfo:
    return target.info if isinstance(target, WorkerProcess) else target


def _exited(target: Target) -> bool:
    """True once the worker no longer runs (a zombie counts as exited)."""
    if isinstance(target, WorkerProcess) and target.returncode is not None:
        return True
    return _state(_info(target)) != "running"


# ---- signals ---------------------------------------------------------------------------


def _deliver(info: ProcessInfo, sig: signal.Signals) -> Literal["sent", "gone", "denied"]:
    """Send ``sig`` to the worker (its group when it leads one) after an identity check."""
    if _state(info) != "running":
        return "gone"
    try:
        if info.pid == info.pgid:
            os.killpg(info.pgid, sig)
        else:
            os.kill(info.pid, sig)
    except ProcessLookupError:
        return "gone"
    except PermissionError:
        return "denied"
    return "sent"


def _sweep(info: ProcessInfo) -> None:
    """SIGKILL what is left of an exited leader's group (see the module note)."""
    if info.pid != info.pgid:
        return
    if _pid_in_use(info.pid):  # else the pid is free: a group of that number is the worker's
        try:
            start = float(psutil.Process(info.pid).create_time())
        except psutil.NoSuchProcess:
            pass  # freed since: as above
        except psutil.AccessDenied:
            return
        else:
            if not same_start(start, info.create_time):
                return  # another process holds the pid: the worker's group is empty
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(info.pgid, signal.SIGKILL)


def _pid_in_use(pid: int) -> bool:
    """Signal 0: a free pid answers at once, without psutil reading ``/proc``."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


async def _wait_exit(target: Target) -> None:
    """Return once the worker has exited (for one this process did not spawn: once it is
    a zombie or gone), waiting on a pidfd where the system has them."""
    if isinstance(target, WorkerProcess):
        await target.wait()
        return
    try:
        pidfd = os.pidfd_open(target.pid)
    except ProcessLookupError:
        return
    except (AttributeError, OSError):
        pidfd = None
    if pidfd is None:
        # No pidfd: nothing can wake us when a process we did not spawn exits.
        while _state(target) == "running":  # noqa: ASYNC110
            await trio.sleep(POLL_INTERVAL)
        return
    try:
        if _state(target) == "running":  # the pidfd is ours only if the pid still is
            await trio.lowlevel.wait_readable(pidfd)
    finally:
        os.close(pidfd)


async def _confirm(info: ProcessInfo, *, stopped: bool) -> Literal["confirmed", "gone", "no"]:
    with trio.move_on_after(CONFIRM_WITHIN):
        while True:
            proc = find_process(info.key)
            if proc is None:
                return "gone"
            try:
                status = proc.status()
            except psutil.NoSuchProcess:
                return "gone"
            except psutil.AccessDenied:
                return "no"
            if status == psutil.STATUS_ZOMBIE:
                return "gone"
            if (status == psutil.STATUS_STOPPED) == stopped:
                return "confirmed"
            await trio.sleep(POLL_INTERVAL)
    return "no"


# ---- the controls ----------------------------------------------------------------------


async def pause(target: Target, *, clock: Callable[[], datetime] = utc_now) -> ControlResult:
    """``SIGSTOP`` the worker (its whole group when it leads one); result ``paused`` once
    psutil shows it stopped."""
    return await _steer("pause", target, signal.SIGSTOP, clock())


async def resume(target: Target, *, clock: Callable[[], datetime] = utc_now) -> ControlResult:
    """``SIGCONT`` the worker (its whole group when it leads one); result ``resumed`` once
    psutil no longer shows it stopped."""
    return await _steer("resume", target, signal.SIGCONT, clock())


async def _steer(
    action: Literal["pause", "resume"], target: Target, sig: signal.Signals, at: datetime
) -> ControlResult:
    info = _info(target)
    if _exited(target):
        return ControlResult(action, at, "gone")
    sent = _deliver(info, sig)
    if sent != "sent":
        return ControlResult(action, at, sent)
    seen = await _confirm(info, stopped=action == "pause")
    if seen == "gone":
        return ControlResult(action, at, "gone")
    if seen == "no":
        return ControlResult(action, at, "signalled")
    return ControlResult(action, at, "paused" if action == "pause" else "resumed")


async def stop(
    target: Target,
    policy: StopPolicy | None = None,
    *,
    cooperative: Cooperative | None = None,
    clock: Callable[[], datetime] = utc_now,
) -> ControlResult:
    """Stop the worker through the ladder: ``cooperative()`` (if given) and a wait bounded
    by ``policy.grace``, then ``SIGTERM``, then ``SIGKILL``, each with its bounded wait.

    A paused worker is resumed first, so it can take part. For a :class:`WorkerProcess`
    this is :meth:`WorkerProcess.stop` (idempotent; ``policy`` defaults to the worker's);
    otherwise the same ladder runs over psutil. Raises :class:`WorkerStopTimeout` when the
    worker survives SIGKILL's bounded wait. Call it shielded if the caller may be cancelled.
    """
    at = clock()
    info = _info(target)
    if isinstance(target, WorkerProcess):
        if target.stop_report is None and _exited(target):
            report = await target.stop(policy=policy)
            return ControlResult("stop", at, "gone", returncode=report.returncode)
        _deliver(info, signal.SIGCONT)
        report = await target.stop(cooperative, policy=policy)
        return ControlResult(
            "stop", at, report.stage, returncode=report.returncode, escalation=report.escalation
        )
    policy = policy or StopPolicy()
    if _exited(target):
        _sweep(info)
        return ControlResult("stop", at, "gone")
    _deliver(info, signal.SIGCONT)
    stage, escalation = await climb_ladder(
        info.pid,
        policy,
        cooperative=cooperative,
        running=lambda: _state(info) == "running",
        wait=lambda: _wait_exit(info),
        send=lambda sig: _ignore(_deliver(info, sig)),
    )
    _sweep(info)
    return ControlResult("stop", at, stage, escalation=escalation)


async def kill(
    target: Target, *, grace: float = 2.0, clock: Callable[[], datetime] = utc_now
) -> ControlResult:
    """``SIGKILL`` the worker (its whole group when it leads one) at once, then wait up to
    ``grace`` seconds for it to be gone; raises :class:`WorkerStopTimeout` if it is not."""
    at = clock()
    info = _info(target)
    if _exited(target):
        _sweep(info)
        return ControlResult("kill", at, "gone", returncode=_returncode(target))
    sent = _deliver(info, signal.SIGKILL)
    if sent != "sent":
        return ControlResult("kill", at, sent)
    with trio.move_on_after(grace):
        await _wait_exit(target)
    if not _exited(target):
        raise WorkerStopTimeout(
            f"worker {info.pid} survived SIGKILL for {grace} s",
            details={"pid": info.pid, "stage": "kill", "grace": grace},
        )
    _sweep(info)
    return ControlResult("kill", at, "killed", returncode=_returncode(target))


def _returncode(target: Target) -> int | None:
    return target.returncode if isinstance(target, WorkerProcess) else None


def _ignore(_: object) -> None:
    """Discard a delivery result: the ladder judges by whether the process still runs."""
