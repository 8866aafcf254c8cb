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
    input_fd: int | None = None
    """The descriptor under ``reader``, for a wait that watches it outside trio."""
    control: Path | None = None
    detach_on_eof: bool = False
    detached: bool = False
    _control_offset: int = 0
    _lock: trio.Lock = attrs.Factory(trio.Lock)

    async def send(self, msg_type: str, /, **fields: Any) -> None:
        await self.send_line(encode_message({"type": msg_type, **fields}))

    async def send_line(self, data: bytes) -> None:
        """Send one encoded line (``encode_message``) to the spool and to Braid.

        A cancelled turn must not leave half a line in the pipe, so whatever has to wait is
        shielded. The usual case waits for nothing (the lock is free, the pipe has room):
        it then takes no schedule point and opens no cancel scope, since a streaming
        worker's cost is mostly what it touches per line.
        """
        try:
            self._lock.acquire_nowait()
        except trio.WouldBlock:
            with trio.CancelScope(shield=True):
                await self._lock.acquire()
                try:
                    await self._finish(data, self._write_now(data))
                finally:
                    self._lock.release()
            return
        try:
            sent = self._write_now(data)
            if sent < len(data):
                with trio.CancelScope(shield=True):
                    await self._finish(data, sent)
        finally:
            self._lock.release()

    def _write_now(self, data: bytes) -> int:
        """Append to the spool and write what the pipe takes at once; return bytes sent
        (all of them when detached: the spool is then the only destination)."""
        if self.spool_fd is not None:
            os.write(self.spool_fd, data)
        if self.detached:
            return len(data)
        fileno = getattr(self.out, "fileno", None)
        if fileno is None:
            return 0
        try:
            return os.write(fileno(), data)
        except BlockingIOError:
            return 0
        except BrokenPipeError:
            self._lost_pipe()
            return len(data)
        except OSError as exc:
            if exc.errno != errno.EBADF:
                raise
            raise trio.ClosedResourceError("the output pipe is closed") from None

    async def _finish(self, data: bytes, sent: int) -> None:
        """Send the rest of a line through trio (the pipe was full)."""
        if sent >= len(data) or self.detached:
            return
        try:
            await self.out.send_all(data[sent:])
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._lost_pipe()

    def _lost_pipe(self) -> None:
        """Braid's end of the output pipe closed: detach, or fail the send."""
        if not self._can_detach():
            raise trio.BrokenResourceError("Braid's end of the output pipe closed")
        self._detach("Braid's end of the output pipe closed")

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
