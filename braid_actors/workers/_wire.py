"""JSONL framing shared by Braid and its workers, and the wire form of parts.

One message is one JSON object on one ``\\n``-terminated line (JSON text never holds a raw
newline). Parts travel in the model's unstructured form (``make_converter().unstructure``),
tagged by ``kind``; :func:`structure_part` reads them back through ``PART_TYPES`` so an
unknown kind or a stray field is refused by name rather than guessed.
"""

from __future__ import annotations

import errno
import json
import os
from typing import TYPE_CHECKING, Any, Final

import attrs
import cattrs
import orjson
import trio

from braid_actors.errors import ProviderProtocolError, WorkerLineTooLong
from braid_actors.model import PART_TYPES, Part, TextPart, make_converter

if TYPE_CHECKING:
    from collections.abc import Mapping

PROTOCOL_VERSION: Final = 1
"""Version of the local provider protocol (``docs/local-runner.md``)."""
DEFAULT_MAX_LINE: Final = 4 * 1024 * 1024
"""Longest line (bytes, without the newline) a reader accepts by default."""

_converter = make_converter()


@attrs.define(eq=False)
class LineReader:
    """Reads ``\\n``-terminated lines of at most ``max_line`` bytes from a stream.

    At end of stream a trailing fragment without its newline is not a line: it is kept in
    :attr:`fragment` (a writer that died mid-line) and :meth:`receive_line` returns ``None``.
    """

    stream: trio.abc.ReceiveStream
    max_line: int = DEFAULT_MAX_LINE
    fragment: bytes = b""
    """What followed the last newline when the stream ended."""
    lines_read: int = 0
    _buffer: bytearray = attrs.Factory(bytearray)
    _scanned: int = 0
    _eof: bool = False

    async def receive_line(self) -> bytes | None:
        """The next line without its newline, or ``None`` at end of stream.

        Raises :class:`WorkerLineTooLong` for an over-long line; the stream is then
        unusable (its framing is lost).
        """
        while True:
            newline = self._buffer.find(b"\n", self._scanned)
            if newline >= 0:
                line = bytes(self._buffer[:newline])
                del self._buffer[: newline + 1]
                self._scanned = 0
                self._check_length(len(line))
                self.lines_read += 1
                return line
            self._scanned = len(self._buffer)
            self._check_length(len(self._buffer))
            if self._eof:
                self.fragment = bytes(self._buffer)
                self._buffer.clear()
                return None
            chunk = await self._read_chunk()
            if not chunk:
                self._eof = True
            self._buffer += chunk

    async def _read_chunk(self) -> bytes:
        """The next bytes of the stream (``b""`` at its end).

        A pipe (trio's ``FdStream``) is read by waiting for it first and reading once it is
        readable: one pass of the scheduler per chunk. ``FdStream.receive_some`` reads first,
        waits on ``EAGAIN``, reads again and then takes one more schedule point, which for a
        worker that sends a line at a time is twice the passes and one more syscall per line.
        """
        stream = self.stream
        if not isinstance(stream, trio.lowlevel.FdStream):
            return bytes(await stream.receive_some(1 << 16))
        while True:
            fd = stream.fileno()
            if fd < 0:
                raise trio.ClosedResourceError("the stream is closed")
            await trio.lowlevel.wait_readable(fd)
            try:
                return os.read(fd, 1 << 16)
            except BlockingIOError:
                continue
            except OSError as exc:
                if exc.errno == errno.EBADF:
                    raise trio.ClosedResourceError("the stream is closed") from None
                raise trio.BrokenResourceError from exc

    def _check_length(self, length: int) -> None:
        if length > self.max_line:
            raise WorkerLineTooLong(
                f"a protocol line is longer than {self.max_line} bytes",
                details={"line": self.lines_read + 1, "limit": self.max_line},
            )


def decode_message(line: bytes, *, number: int) -> dict[str, Any]:
    """Parse one protocol line into a JSON object with a string ``type``.

    Raises :class:`ProviderProtocolError` otherwise (``details`` name the line number).
    """
    try:
        value = orjson.loads(line)  # stricter than json (no NaN) and several times faster
    except ValueError:
        raise ProviderProtocolError(
            "a protocol line is not JSON", details={"line": number}
        ) from None
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise ProviderProtocolError(
            "a protocol line is not a JSON object with a string type", details={"line": number}
        )
    return value


def encode_message(message: Mapping[str, Any]) -> bytes:
    """One protocol line: compact UTF-8 JSON plus ``\\n``."""
    text = json.dumps(message, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.encode("utf-8") + b"\n"


def unstructure_part(part: Part) -> dict[str, Any]:
    """The wire form of a part (the model's unstructured form, with ``kind``)."""
    value: dict[str, Any] = _converter.unstructure(part)
    return value


def structure_part(value: object) -> Part:
    """Read a part's wire form; raise :class:`ProviderProtocolError` when it is not one."""
    # A stream's hot path: a text part of exactly its three string fields is what the
    # converter would make of it (a test checks it), without the converter's walk.
    if type(value) is dict and len(value) == 3 and value.get("kind") == "text":
        part_id, text = value.get("part_id"), value.get("text")
        if type(part_id) is str and type(text) is str:
            return TextPart(part_id, text)
    if not isinstance(value, dict):
        raise ProviderProtocolError("a part is not a JSON object")
    kind = value.get("kind")
    cls = PART_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ProviderProtocolError(
            "a part has no known kind", details={"kind": kind if isinstance(kind, str) else None}
        )
    try:
        part: Part = _converter.structure(value, cls)
    except (cattrs.BaseValidationError, ValueError, TypeError, KeyError) as exc:
        # transform_error names paths and expectations, never the offending values.
        problems = (
            cattrs.transform_error(exc) if isinstance(exc, cattrs.BaseValidationError) else []
        )
        raise ProviderProtocolError(
            "a part does not match its kind's shape", details={"kind": kind, "problems": problems}
        ) from None
    return part
