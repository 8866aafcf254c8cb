"""Waiting without the event loop while nothing can need it: the streaming worker's hot path.

A local worker streaming a part spends its life waiting for the next tick. Waiting in trio
costs a pass of its scheduler per tick (a cancel scope, the deadline heap, an ``epoll``
round), which with hundreds of workers on two cores is most of what they cost. While the
turn streams, though, only two things can need any other task: a line from Braid on the
protocol input (read by the pump task) and SIGTERM. So :meth:`Quiet.wait_until` blocks in
``poll(2)`` on exactly those two descriptors and returns ``True`` when the deadline comes
with neither ready; on ``False`` the caller waits in trio instead, where the pump or the
signal watcher runs and may cancel the turn.

SIGTERM is caught with a Python-level handler that writes a byte to a pipe this object
owns (trio's own wake-up descriptor is left alone): a ``poll`` the signal interrupts is
retried by Python and then sees the pipe readable.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
from typing import TYPE_CHECKING

import attrs
import trio

if TYPE_CHECKING:
    from collections.abc import Iterator
    from types import FrameType


@attrs.define(eq=False)
class Quiet:
    """The descriptors whose readiness means another task has work, and the SIGTERM pipe."""

    signal_fd: int
    """Readable once SIGTERM arrived (drain with :meth:`take_signals`)."""
    input_fd: int | None = None
    """The protocol input; None when the channel has none (then there is no quiet wait)."""
    _poll: select.poll | None = None

    def wait_until(self, deadline: float) -> bool:
        """Block until ``deadline`` (trio clock); ``True`` if it came with nothing to read."""
        if self.input_fd is None:
            return False
        if self._poll is None:
            self._poll = select.poll()
            self._poll.register(self.input_fd, select.POLLIN)
            self._poll.register(self.signal_fd, select.POLLIN)
        while (remaining := deadline - trio.current_time()) > 0:
            if self._poll.poll(remaining * 1000.0):
                return False
        return True

    def take_signals(self) -> int:
        """How many SIGTERMs arrived since the last call (the pipe is drained)."""
        count = 0
        with contextlib.suppress(BlockingIOError):
            while chunk := os.read(self.signal_fd, 64):
                count += len(chunk)
        return count


@contextlib.contextmanager
def catching_sigterm(input_fd: int | None) -> Iterator[Quiet]:
    """Install the SIGTERM handler for the block; restore the previous one after.

    The :class:`Quiet` it yields watches ``input_fd`` (the protocol input) and the pipe."""
    read_fd, write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def _handler(signum: int, frame: FrameType | None) -> None:
        with contextlib.suppress(BlockingIOError):
            os.write(write_fd, b"T")

    previous = signal.signal(signal.SIGTERM, _handler)
    try:
        yield Quiet(signal_fd=read_fd, input_fd=input_fd)
    finally:
        signal.signal(signal.SIGTERM, previous)
        os.close(read_fd)
        os.close(write_fd)
