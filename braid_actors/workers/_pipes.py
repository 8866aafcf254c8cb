"""One task reads every worker's stdout: a :class:`PipeHub` over one Linux ``epoll``.

With a reader task per worker, each line a worker writes wakes that worker's task: trio
registers the pipe again, the scheduler resumes the task through its whole call stack, the
task reads, handles the line and parks again. At 500 streaming runs that was a third of
the event loop, most of it the waking rather than the handling.

A :class:`PipeHub` keeps every registered pipe in one private epoll instance (registered
once, level-triggered) and waits on that instance's own descriptor with
``trio.lowlevel.wait_readable``: one wake-up reads every pipe that is ready. Each pipe has a
:class:`HubLineReader`, a :class:`~braid_actors.workers.LineReader` in behaviour (the same
framing, ``max_line`` limit, ``fragment`` and ``lines_read``), whose owner still calls
:meth:`HubLineReader.receive_line`. An owner may also set :attr:`HubLineReader.fast`: the
hub offers it each complete line while the owner is parked in ``receive_line`` with nothing
queued, and a line it takes (returns True) is handled without waking the owner at all. So
the owner sees every line in order: a line the fast path declines, and every line after it
until the owner has caught up, is queued for ``receive_line``. The fast path runs in the
hub's task: it must not block, and whatever it raises is taken as declining the line (the
owner then meets the same line, and its error, on its own path).

The hub is an actor: its owner runs :meth:`PipeHub.run` in a nursery; when it ends, every
reader still registered sees its stream closed. :func:`pipe_hub_supported` says whether
this platform has epoll; without it owners use a plain ``LineReader``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Final

import attrs
import trio
import trio.lowlevel

from braid_actors.errors import WorkerLineTooLong
from braid_actors.workers._wire import DEFAULT_MAX_LINE

READ_SIZE: Final = 1 << 16
"""Bytes read from a ready pipe per wake-up (a worker's lines are far shorter)."""
MAX_EVENTS: Final = 1024
"""Ready pipes taken from the epoll instance per call."""
SLICE: Final = 0.005
"""Seconds of reading the hub does before it lets the event loop's other tasks run.

After a stall every pipe holds many lines, and one pass over hundreds of ready pipes (each
line decoded and queued by a fast path) is one step of the event loop, however long: the
journal, whose acknowledgements those lines wait for, could not run meanwhile (a trio
instrument at 500 runs saw steps of up to 1.3 s in a task named ``run``; the instrument kept
only that last part of the name, which the hub's task shares with two others)."""

TICK: Final = 0.004
"""Least seconds from the start of one pass over the ready pipes to the next.

Without it the hub woke for nearly every line: 500 workers streaming 10 lines/s each made
2,200-2,700 passes/s of about two lines, and each pass is a round of the event loop (its
epoll wait, the hub's readiness registration, the scheduler). With it, lines that arrive
within a tick are read in one pass (about 180 passes/s of 27 lines at that load, with the
supervisor's CPU 69% of a core against 78%); a line waits at most a tick longer."""


def pipe_hub_supported() -> bool:
    """True where :class:`PipeHub` works (Linux: ``select.epoll``)."""
    return hasattr(select, "epoll")


@attrs.define(eq=False)
class HubLineReader:
    """The lines of one pipe read by a :class:`PipeHub` (see the module docstring)."""

    fd: int
    hub: PipeHub
    max_line: int = DEFAULT_MAX_LINE
    fragment: bytes = b""
    """What followed the last newline when the stream ended."""
    lines_read: int = 0
    """Complete lines delivered so far, through ``receive_line`` or the fast path."""
    fast: Callable[[bytes], bool] | None = None
    """Offered each line while the owner waits with nothing queued; True: it took it."""
    _buffer: bytearray = attrs.Factory(bytearray)
    _lines: deque[bytes] = attrs.Factory(deque)
    _eof: bool = False
    _error: BaseException | None = None
    _waiter: trio.lowlevel.Task | None = None

    async def receive_line(self) -> bytes | None:
        """The next line without its newline, or ``None`` at end of stream.

        Raises :class:`WorkerLineTooLong` for an over-long line (the stream is then
        unusable), ``trio.ClosedResourceError`` once the reader or its hub is closed, and
        ``trio.BusyResourceError`` when another task is already waiting on it.
        """
        if self._waiter is not None:
            raise trio.BusyResourceError("another task is already reading this pipe")
        if not self._lines and not self._eof and self._error is None:
            self._waiter = trio.lowlevel.current_task()

            def abort(_: trio.lowlevel.RaiseCancelT) -> trio.lowlevel.Abort:
                self._waiter = None
                return trio.lowlevel.Abort.SUCCEEDED

            await trio.lowlevel.wait_task_rescheduled(abort)
        else:
            # A queued line is returned without a trip through the scheduler (a pending
            # cancellation is still raised). With a full trip per line, an owner that fell
            # behind (its fast path declined a line: the sink's pipeline was full) drained
            # one line per scheduler pass while its stream kept adding them, and so never
            # got back to the fast path: at 5,000 lines/s every line then went through the
            # owners' tasks. Its own awaits (a sink waiting for a commit) still yield.
            await trio.lowlevel.checkpoint_if_cancelled()
        if self._lines:
            self.lines_read += 1
            return self._lines.popleft()
        if self._error is not None:
            raise self._error
        return None

    def close(self) -> None:
        """Stop reading this pipe (idempotent); the owner closes the pipe itself after."""
        self.hub._forget(self)
        if self._error is None and not self._eof:
            self._fail(trio.ClosedResourceError("the reader is closed"))

    # ---- the hub's side -------------------------------------------------------------

    def _readable(self) -> None:
        try:
            chunk = os.read(self.fd, READ_SIZE)
        except BlockingIOError:
            return
        except OSError as exc:
            self.hub._forget(self)
            if exc.errno == errno.EBADF:
                self._fail(trio.ClosedResourceError("the stream is closed"))
            else:
                self._fail(trio.BrokenResourceError(str(exc)))
            return
        if not chunk:
            self.hub._forget(self)
            self._eof = True
            self.fragment = bytes(self._buffer)
            self._buffer.clear()
            self._wake()
            return
        self._take(chunk)

    def _take(self, chunk: bytes) -> None:
        buffer = self._buffer
        if not buffer and chunk.endswith(b"\n"):
            # The usual read: whole lines, nothing left over (no copy into the buffer).
            complete = chunk.split(b"\n")
            complete.pop()
        else:
            start = len(buffer)
            buffer += chunk
            if buffer.find(b"\n", start) < 0:
                if len(buffer) > self.max_line:
                    self._too_long(len(buffer))
                return
            *complete, rest = bytes(buffer).split(b"\n")
            buffer[:] = rest
        for line in complete:
            if len(line) > self.max_line:
                self._too_long(len(line))
                return
            self._offer(line)
        if len(buffer) > self.max_line:
            self._too_long(len(buffer))
            return
        self._wake()

    def _offer(self, line: bytes) -> None:
        fast = self.fast
        if fast is not None and self._waiter is not None and not self._lines:
            try:
                taken = fast(line)
            except Exception:  # declined: the owner meets the line (and its error) itself
                taken = False
            if taken:
                self.lines_read += 1
                self.hub.fast_lines += 1
                return
        self._lines.append(line)

    def _too_long(self, length: int) -> None:
        self.hub._forget(self)
        self._fail(
            WorkerLineTooLong(
                f"a protocol line is longer than {self.max_line} bytes",
                details={"line": self.lines_read + len(self._lines) + 1, "limit": self.max_line},
            )
        )

    def _fail(self, error: BaseException) -> None:
        self._error = error
        self._wake()

    def _wake(self) -> None:
        task = self._waiter
        if task is not None and (self._lines or self._eof or self._error is not None):
            self._waiter = None
            trio.lowlevel.reschedule(task)


@attrs.define(eq=False)
class PipeHub:
    """Reads every registered pipe from one task (see the module docstring)."""

    _readers: dict[int, HubLineReader] = attrs.Factory(dict)
    _epoll: Any = None
    running: bool = False
    fast_lines: int = 0
    """Lines its readers' fast paths took so far."""
    pauses: int = 0
    """Times a pass over the ready pipes stopped to let other tasks run (see SLICE)."""
    passes: int = 0
    """Times the hub woke up to read the pipes that were ready."""
    tick: float = TICK
    """Least seconds from one pass to the next (see :data:`TICK`)."""

    @property
    def watching(self) -> int:
        """Pipes registered now."""
        return len(self._readers)

    def reader(
        self, stream: trio.lowlevel.FdStream, *, max_line: int = DEFAULT_MAX_LINE
    ) -> HubLineReader:
        """Register ``stream`` (a non-blocking pipe this process reads) with the hub."""
        if not self.running:
            raise trio.ClosedResourceError("the pipe hub is not running")
        fd = stream.fileno()
        reader = HubLineReader(fd, self, max_line)
        self._epoll.register(fd, select.EPOLLIN)
        self._readers[fd] = reader
        return reader

    def _forget(self, reader: HubLineReader) -> None:
        if self._readers.get(reader.fd) is reader:
            del self._readers[reader.fd]
            with contextlib.suppress(OSError, ValueError):  # the descriptor is already closed
                self._epoll.unregister(reader.fd)

    async def run(
        self, *, task_status: trio.TaskStatus[PipeHub] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Read the registered pipes until cancelled; then every reader is closed."""
        with contextlib.closing(select.epoll()) as ep:
            self._epoll, self.running = ep, True
            task_status.started(self)
            try:
                while True:
                    await trio.lowlevel.wait_readable(ep.fileno())
                    self.passes += 1
                    began = trio.current_time()
                    until = time.perf_counter() + SLICE
                    for index, (fd, _) in enumerate(ep.poll(0, MAX_EVENTS), 1):
                        # looked up again after a pause: the pipe may have closed meanwhile
                        reader = self._readers.get(fd)
                        if reader is not None:
                            reader._readable()
                        if not index % 8 and time.perf_counter() > until:
                            self.pauses += 1
                            await trio.lowlevel.checkpoint()
                            until = time.perf_counter() + SLICE
                    if self.tick > 0:
                        await trio.sleep_until(began + self.tick)
            finally:
                self.running = False
                for reader in list(self._readers.values()):
                    reader.close()
