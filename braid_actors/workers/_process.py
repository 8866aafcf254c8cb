"""Start, talk to, and stop worker processes.

Design note. A worker is an OS process that Braid starts in its own session (and so its own
process group), talks to over JSONL on stdin/stdout, and never lets outlive the task that
owns it. :func:`open_worker` is the only way to get one: it is an async context manager
whose exit runs the stop ladder under a shield, so a cancelled owner still leaves no process
behind. The ladder is

1. *cooperative*: an optional caller-provided coroutine (for a provider: send ``cancel``
   and read until the worker says it is done), then a wait for the process to exit, all
   bounded by ``move_on_after(grace)``;
2. ``SIGTERM`` to the whole process group (and ``SIGCONT``, so a paused worker gets it),
   bounded wait;
3. ``SIGKILL`` to the whole process group, bounded wait.

The steps live in :func:`climb_ladder`, which the controls (``_controls.py``) also run over
psutil for a worker this process did not spawn.

Escalating past step 1 records a :class:`~braid_actors.errors.WorkerStopTimeout` in the
:class:`StopReport`; a group that survives step 3 raises it. After the leader is gone the
group is swept with ``SIGKILL`` so nothing it started (a shell command, a background job)
survives it. (Linux does not reuse a pid number while it names a live process group, so the
sweep can only reach this worker's own stragglers, or nobody.)

stderr is free-form log: a task drains it into a :class:`BoundedLog` that keeps the last
``log_limit`` bytes. stdout is read by the owner, line by line, through a bounded reader.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, Literal, NoReturn

import attrs
import psutil  # type: ignore[import-untyped, unused-ignore]
import trio
from trio.lowlevel import FdStream

from braid_actors.errors import RuntimeFault, WorkerStartFailed, WorkerStopTimeout
from braid_actors.workers._identity import ProcessKey, presence
from braid_actors.workers._pipes import HubLineReader, PipeHub
from braid_actors.workers._wire import DEFAULT_MAX_LINE, LineReader, decode_message, encode_message

if TYPE_CHECKING:
    from pathlib import Path

DEFAULT_LOG_LIMIT: Final = 64 * 1024
"""How much of a worker's stderr is kept (the most recent bytes)."""

Cooperative = Callable[[], Awaitable[object]]


@attrs.frozen
class ProcessInfo:
    """Identity of a started worker: ``(pid, create_time)`` names it even after pid reuse."""

    pid: int
    """Operating-system process id."""
    create_time: float
    """psutil's creation time (seconds since the epoch)."""
    pgid: int
    """Its process group (equal to ``pid``: every worker leads its own session)."""
    command: tuple[str, ...]
    """The argv it was started with."""

    @property
    def key(self) -> ProcessKey:
        """Its identity without the group and command."""
        return ProcessKey(pid=self.pid, create_time=self.create_time)


@attrs.frozen
class StopPolicy:
    """Bounds of the stop ladder, in seconds."""

    grace: float = 2.0
    """Cooperative stop (or natural exit) before ``SIGTERM``."""
    term_grace: float = 2.0
    """After ``SIGTERM``, before ``SIGKILL``."""
    kill_grace: float = 2.0
    """After ``SIGKILL``, before giving up with :class:`WorkerStopTimeout`."""

    def __attrs_post_init__(self) -> None:
        if min(self.grace, self.term_grace, self.kill_grace) < 0:
            raise ValueError("stop ladder bounds must not be negative")


StopStage = Literal["exited", "cooperative", "terminated", "killed"]


@attrs.frozen
class StopReport:
    """How a worker ended."""

    stage: StopStage
    """``exited`` on its own, after the ``cooperative`` request, ``terminated`` by SIGTERM,
    or ``killed`` by SIGKILL."""
    returncode: int
    """Exit status; negative is the signal that ended it."""
    escalation: WorkerStopTimeout | None = None
    """Set when the ladder went past the cooperative step (the slow case)."""


@attrs.define(eq=False)
class BoundedLog:
    """The most recent ``limit`` bytes written to it, and how many were dropped."""

    limit: int = DEFAULT_LOG_LIMIT
    dropped: int = 0
    """Bytes discarded from the front to stay within ``limit``."""
    _data: bytearray = attrs.Factory(bytearray)

    def append(self, chunk: bytes | bytearray) -> None:
        self._data += chunk
        excess = len(self._data) - self.limit
        if excess > 0:
            del self._data[:excess]
            self.dropped += excess

    def tail(self) -> bytes:
        return bytes(self._data)

    def text(self) -> str:
        """The kept bytes as text (invalid UTF-8 replaced)."""
        return self._data.decode("utf-8", errors="replace")


@attrs.define(eq=False)
class WorkerProcess:
    """A running worker: its identity, its pipes, its stderr log, and its stop ladder."""

    info: ProcessInfo
    process: trio.Process
    reader: LineReader | HubLineReader
    log: BoundedLog
    policy: StopPolicy
    stop_report: StopReport | None = None
    """Set once the worker has been stopped (or found exited) by :meth:`stop`."""
    _send_broken: bool = False
    _stop_lock: trio.Lock = attrs.Factory(trio.Lock)
    _stderr_done: trio.Event = attrs.Factory(trio.Event)

    @property
    def returncode(self) -> int | None:
        """Exit status, or ``None`` while it runs."""
        return self.process.returncode

    async def send(self, message: Mapping[str, Any]) -> None:
        """Write one protocol message to the worker's stdin.

        A send interrupted half-way (cancellation) leaves a partial line in the pipe, so
        every later send raises :class:`trio.BrokenResourceError` instead of corrupting
        the framing; the stop ladder then goes straight to signals.
        """
        stdin = self.process.stdin
        if stdin is None or self._send_broken:
            raise trio.BrokenResourceError("the worker's stdin is not usable")
        self._send_broken = True
        await stdin.send_all(encode_message(message))
        self._send_broken = False

    async def receive(self) -> dict[str, Any] | None:
        """The next protocol message from stdout, or ``None`` once stdout is closed."""
        line = await self.reader.receive_line()
        if line is None:
            return None
        return decode_message(line, number=self.reader.lines_read)

    async def wait(self) -> int:
        return await self.process.wait()

    async def stop(
        self, cooperative: Cooperative | None = None, *, policy: StopPolicy | None = None
    ) -> StopReport:
        """Run the stop ladder (see the module note); idempotent.

        Call it shielded when the caller may be cancelled: every step is bounded.
        """
        async with self._stop_lock:
            if self.stop_report is None:
                self.stop_report = await self._ladder(cooperative, policy or self.policy)
            return self.stop_report

    async def _ladder(self, cooperative: Cooperative | None, policy: StopPolicy) -> StopReport:
        process = self.process
        stage, escalation = await climb_ladder(
            self.info.pid,
            policy,
            cooperative=cooperative,
            running=lambda: process.returncode is None,
            wait=process.wait,
            send=self._signal_group,
        )
        assert process.returncode is not None
        self._signal_group(signal.SIGKILL)  # sweep stragglers in the group
        await self._close_stdin()
        return StopReport(stage=stage, returncode=process.returncode, escalation=escalation)

    def _signal_group(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.info.pgid, sig)

    async def _close_stdin(self) -> None:
        stdin = self.process.stdin
        if stdin is not None:
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await stdin.aclose()

    async def _drain_stderr(self) -> None:
        stream = self.process.stderr
        try:
            if stream is None:
                return
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                while chunk := await stream.receive_some(1 << 16):
                    self.log.append(chunk)
        finally:
            self._stderr_done.set()


async def climb_ladder(
    pid: int,
    policy: StopPolicy,
    *,
    cooperative: Cooperative | None,
    running: Callable[[], bool],
    wait: Callable[[], Awaitable[object]],
    send: Callable[[signal.Signals], None],
) -> tuple[StopStage, WorkerStopTimeout | None]:
    """Steps 1-3 of the stop ladder (see the module note) for any way of watching and
    signalling a process: ``running()`` says whether it still runs, ``wait()`` returns once
    it has exited, ``send(sig)`` delivers to it (for a worker: to its group).

    Returns the stage it ended at and, past the cooperative step, the recorded
    :class:`WorkerStopTimeout`; raises that type when it survives SIGKILL's bounded wait.
    The caller sweeps the group afterwards.
    """
    stage: StopStage = "exited"
    escalation: WorkerStopTimeout | None = None
    if running():
        with trio.move_on_after(policy.grace):
            if cooperative is not None:
                stage = "cooperative"
                # A worker that breaks the pipe or writes junk while being asked to stop
                # is simply escalated; what it said no longer matters.
                with contextlib.suppress(
                    trio.BrokenResourceError, trio.ClosedResourceError, RuntimeFault
                ):
                    await cooperative()
            await wait()
    if running():
        escalation = _slow(pid, "SIGTERM", policy.grace)
        send(signal.SIGTERM)
        # A paused (SIGSTOP) worker would hold SIGTERM pending forever.
        send(signal.SIGCONT)
        with trio.move_on_after(policy.term_grace):
            await wait()
        stage = "terminated"
    if running():
        escalation = _slow(pid, "SIGKILL", policy.term_grace)
        send(signal.SIGKILL)
        with trio.move_on_after(policy.kill_grace):
            await wait()
        stage = "killed"
    if running():
        raise WorkerStopTimeout(
            f"worker {pid} survived SIGKILL for {policy.kill_grace} s",
            details={"pid": pid, "stage": "kill", "grace": policy.kill_grace},
        )
    return stage, escalation


def _slow(pid: int, next_step: str, waited: float) -> WorkerStopTimeout:
    return WorkerStopTimeout(
        f"worker {pid} did not stop within {waited} s; sending {next_step}",
        details={"pid": pid, "next": next_step, "grace": waited},
    )


WORKER_NICE = 5
"""How much lower a worker's CPU priority is than the supervisor's (``nice`` steps).

The supervisor acknowledges, times out, cancels and limits what its workers do, so it must
get the CPU when they want it too. With 500 local workers streaming on 2 cores, at the same
priority the kernel left the supervisor waiting behind them: in some runs of ``tools/bench
runs`` its event loop fell behind for the rest of the run (an acknowledgement's p50 went
from ~14 ms to 117-126 ms), which none of two runs at +5 did. When the CPU is not
contended, a nice value changes nothing. Processes a worker starts inherit it.

A worker below the supervisor also runs under the batch policy (``SCHED_BATCH``, Linux):
the same share of the CPU, but waking up it does not preempt a running task. 500 streaming
workers wake 5,000 times a second, and each wake-up could take the core from the
supervisor's event loop in the middle of a commit: ``tools/bench runs`` had the journal's
rows p99 at 9.7-10.8 ms and its COMMIT p99 at 13-19 ms, and with batch workers 4.9 and
8.0 ms (an acknowledgement's p99 83-89 -> 50 ms; quiet runs, not alternated)."""


def _yield_to_supervisor(pid: int, nice: int) -> None:
    """Give every thread of ``pid`` a CPU priority ``nice`` steps below this process's (at
    most 19) and, where the system has it, the batch scheduling policy; ``nice`` 0 changes
    nothing. Linux keeps both per thread: a thread the worker started before this call
    would otherwise keep the supervisor's, and threads and processes it starts later
    inherit them from their starter."""
    if nice <= 0:
        return
    own = os.getpriority(os.PRIO_PROCESS, 0)
    try:
        threads = [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except OSError:  # no /proc (not Linux), or it is gone already
        threads = [pid]
    batch = getattr(os, "SCHED_BATCH", None)
    for tid in threads:
        # It (or this thread) may be gone already; the stop ladder handles a gone worker.
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, tid, min(19, own + nice))
        if batch is not None:
            with contextlib.suppress(OSError):
                os.sched_setscheduler(tid, batch, os.sched_param(0))


@contextlib.asynccontextmanager
async def open_worker(
    command: Sequence[str],
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    policy: StopPolicy | None = None,
    max_line: int = DEFAULT_MAX_LINE,
    log_limit: int = DEFAULT_LOG_LIMIT,
    pipes: PipeHub | None = None,
    nice: int = WORKER_NICE,
) -> AsyncIterator[WorkerProcess]:
    """Start ``command`` as a worker in its own process group; stop it on exit.

    On exit the stop ladder runs shielded without a cooperative step: after a normal exit
    it first waits ``policy.grace`` for the worker to exit by itself; after an error or a
    cancellation it starts at SIGTERM. An owner that wants a cooperative stop calls
    :meth:`WorkerProcess.stop` with one before leaving. Raises :class:`WorkerStartFailed`
    when the process cannot be started. With a running ``pipes`` hub, stdout is read by
    the hub (:class:`HubLineReader`) instead of a reader of its own. The worker runs
    ``nice`` steps below this process's CPU priority, as a batch task (:data:`WORKER_NICE`;
    0 keeps this process's priority and policy).
    """
    policy = policy or StopPolicy()
    argv = tuple(command)
    try:
        process = await trio.lowlevel.open_process(
            list(argv),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            cwd=cwd,
            env=env,
        )
    except OSError as exc:
        raise WorkerStartFailed(
            "the worker process could not be started",
            details={"program": argv[0] if argv else None, "errno": exc.errno},
        ) from None
    # This frame lives as long as the worker: don't keep a copy of the environment in it.
    del env
    _yield_to_supervisor(process.pid, nice)
    reader: LineReader | HubLineReader | None = None
    try:
        assert process.stdout is not None
        info = _describe(process, argv)
        if pipes is not None and pipes.running and isinstance(process.stdout, FdStream):
            reader = pipes.reader(process.stdout, max_line=max_line)
        else:
            reader = LineReader(process.stdout, max_line=max_line)
        worker = WorkerProcess(
            info=info,
            process=process,
            reader=reader,
            log=BoundedLog(limit=log_limit),
            policy=policy,
        )
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(worker._drain_stderr)
                try:
                    yield worker
                except BaseException:
                    # The owner failed or was cancelled: no waiting for a natural exit.
                    with trio.CancelScope(shield=True):
                        await worker.stop(policy=attrs.evolve(policy, grace=0.0))
                    raise
                else:
                    with trio.CancelScope(shield=True):
                        await worker.stop()
                finally:
                    with trio.CancelScope(shield=True):
                        # Keep the end of stderr, but a grandchild that escaped the group
                        # and holds the pipe must not keep the owner waiting.
                        with trio.move_on_after(min(policy.grace, 0.5)):
                            await worker._stderr_done.wait()
                    nursery.cancel_scope.cancel(reason="worker stopped")
        except BaseExceptionGroup as group:
            _raise_single(group)
    finally:
        with trio.CancelScope(shield=True):
            if process.returncode is None:  # setup failed, or the ladder gave up
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGKILL)
                with trio.move_on_after(policy.kill_grace):
                    await process.wait()
            if isinstance(reader, HubLineReader):
                reader.close()  # before its descriptor is closed (and maybe reused)
            for stream in (process.stdin, process.stdout, process.stderr):
                if stream is not None:
                    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                        await stream.aclose()


def _raise_single(group: BaseExceptionGroup[BaseException]) -> NoReturn:
    """Re-raise the body's own exception out of the stderr nursery.

    The stderr task never fails (it can only be cancelled), so a group holds the body's
    exception, possibly with ``Cancelled`` copies; callers get that exception, not a group.
    """
    others = [exc for exc in group.exceptions if not isinstance(exc, trio.Cancelled)]
    if len(others) > 1 or (others and isinstance(others[0], BaseExceptionGroup)):
        raise group
    inner = others[0] if others else group.exceptions[0]
    context = inner.__context__
    try:
        raise inner
    finally:
        inner.__context__ = context  # don't chain the wrapper group onto its own member
        del inner


def _describe(process: trio.Process, argv: tuple[str, ...]) -> ProcessInfo:
    pid = process.pid
    try:
        pgid = os.getpgid(pid)
        # Not reaped yet (only ``wait`` reaps), so even a worker that already exited still
        # has its /proc entry and its creation time.
        create_time = float(psutil.Process(pid).create_time())
    except (OSError, psutil.Error) as exc:
        raise WorkerStartFailed(
            "the worker process vanished before it could be identified",
            details={"pid": pid},
        ) from exc
    return ProcessInfo(pid=pid, create_time=create_time, pgid=pgid, command=argv)


def process_gone(info: ProcessInfo) -> bool:
    """True when the process ``info`` names no longer runs (a reused pid does not count)."""
    return presence(info.key) != "running"
