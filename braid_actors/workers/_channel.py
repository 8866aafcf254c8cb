"""The local worker's channel to Braid: JSONL over its pipes, a spool, and detach.

Every line the worker sends is also appended to its spool (when it has one). When Braid
goes away (its pipes close) a worker started with ``--detach-on-eof`` keeps working: it
reports to the spool only and reads controls from the control file, which a re-attached
supervisor writes. See ``docs/local-runner.md``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from pathlib import Path
from typing import Any, Final

import attrs
import trio

from braid_actors.workers._wire import LineReader, decode_message, encode_message

INPUT_MAX_LINE: Final = 64 * 1024 * 1024
"""Longest line the worker accepts from Braid."""

CONTROL_POLL: Final = 0.1
"""How often a detached worker looks at its control file (seconds)."""


@attrs.define(eq=False)
class Channel:
    """JSONL in from Braid, JSONL out to Braid; every send is a whole line.

    With a spool, every line sent is also appended to it (one ``os.write`` per line on an
    ``O_APPEND`` descriptor), so what Braid missed while it was gone can be read back. When
    detached, lines go to the spool only, and input comes from the control file.
    """

    reader: LineReader
    out: trio.abc.SendStream
    spool_fd: int | None = None
    control: Path | None = None
    detach_on_eof: bool = False
    detached: bool = False
    _control_offset: int = 0
    _lock: trio.Lock = attrs.Factory(trio.Lock)

    async def send(self, msg_type: str, /, **fields: Any) -> None:
        data = encode_message({"type": msg_type, **fields})
        # Shielded: a cancelled turn must not leave half a line in the pipe.
        with trio.CancelScope(shield=True):
            # Uncontended (the usual case) the lock is taken without a schedule point:
            # a streaming worker's cost is mostly its passes through the event loop.
            try:
                self._lock.acquire_nowait()
            except trio.WouldBlock:
                await self._lock.acquire()
            try:
                if self.spool_fd is not None:
                    os.write(self.spool_fd, data)
                if self.detached:
                    return
                try:
                    await self._send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    if not self._can_detach():
                        raise
                    self._detach("Braid's end of the output pipe closed")
            finally:
                self._lock.release()

    async def _send_all(self, data: bytes) -> None:
        """Write ``data`` to Braid: at once when the pipe has room, else through trio."""
        sent = 0
        fileno = getattr(self.out, "fileno", None)
        if fileno is not None:
            try:
                sent = os.write(fileno(), data)
            except BlockingIOError:
                sent = 0
            except BrokenPipeError:
                raise trio.BrokenResourceError("Braid's end of the output pipe closed") from None
            except OSError as exc:
                if exc.errno != errno.EBADF:
                    raise
                raise trio.ClosedResourceError("the output pipe is closed") from None
        if sent < len(data):
            await self.out.send_all(data[sent:])

    def _can_detach(self) -> bool:
        return self.detach_on_eof and self.spool_fd is not None and self.control is not None

    def _detach(self, why: str) -> None:
        if not self.detached:
            self.detached = True
            log(f"detached: {why}; reporting to the spool only")

    async def receive(self) -> dict[str, Any] | None:
        if not self.detached:
            line = await self.reader.receive_line()
            if line is not None:
                return decode_message(line, number=self.reader.lines_read)
            if not self._can_detach():
                return None
            self._detach("Braid closed the input pipe")
        return await self._receive_control()

    async def _receive_control(self) -> dict[str, Any]:
        """Next line of the control file a re-attached supervisor writes (polled)."""
        assert self.control is not None
        while True:
            line = await trio.to_thread.run_sync(_read_line_at, self.control, self._control_offset)
            if line is not None:
                self._control_offset += len(line)
                return decode_message(line.rstrip(b"\n"), number=0)
            await trio.sleep(CONTROL_POLL)


def _read_line_at(path: Path, offset: int) -> bytes | None:
    """The complete line starting at ``offset``, or None when there is none yet."""
    try:
        with path.open("rb") as f:
            f.seek(offset)
            line = f.readline(INPUT_MAX_LINE + 1)
    except FileNotFoundError:
        return None
    return line if line.endswith(b"\n") else None


def log(text: str) -> None:
    # stderr is Braid's pipe: once Braid is gone it is broken, and a log line must never
    # be what kills a detached worker.
    with contextlib.suppress(OSError, ValueError):
        print(f"local-worker[{os.getpid()}]: {text}", file=sys.stderr, flush=True)
