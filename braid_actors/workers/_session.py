"""The local runner's native session file: format, reading, proofs and guarded appends.

A session is ``<dir>/<session_id>.jsonl``: append-only, one canonical-JSON object per line,
``{"messageId", "role", "text"}``, one line per message the runner has seen (the portable
context it was started with, each user input, and its own replies). The session's digest is
``sha256:`` of the canonical JSON of the *list* of those objects in file order, so a reader
that holds the file can prove exactly where the session ends.

Everything here is synchronous, small-file I/O: the worker calls it directly (it is a
single-purpose process) and the provider calls it through ``trio.to_thread``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
from typing import TYPE_CHECKING, Any, Final

import attrs

from braid_actors.model import canonical_json, digest

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence
    from pathlib import Path

SESSION_ID_RE: Final = re.compile(r"sess_[0-9a-f]{8,64}")
"""What a local session id looks like; anything else is refused before touching a path."""
ROLES: Final = frozenset({"user", "assistant", "system"})
LINE_KEYS: Final = frozenset({"messageId", "role", "text"})


class SessionFileError(Exception):
    """A session file is missing or does not have the documented format.

    ``code`` is the protocol error code the worker reports (``session_missing`` or
    ``session_corrupt``). Internal to the runner; providers translate it at their edge.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@attrs.frozen
class SessionLine:
    """One message of a native session."""

    message_id: str
    """The Braid message identifier the runner was given."""
    role: str
    """``user``, ``assistant`` or ``system``."""
    text: str
    """The message's text in the runner's native form."""

    def to_json(self) -> dict[str, str]:
        return {"messageId": self.message_id, "role": self.role, "text": self.text}


@attrs.frozen
class SessionState:
    """What a session file holds and proves."""

    lines: tuple[SessionLine, ...]
    """Every message, in file order."""
    digest: str
    """``sha256:`` of the canonical JSON of the list of lines."""

    @property
    def last_message_id(self) -> str | None:
        """The session's boundary: the last message id, or null when empty."""
        return self.lines[-1].message_id if self.lines else None

    def has_message(self, message_id: str) -> bool:
        return any(line.message_id == message_id for line in self.lines)


def is_session_id(value: object) -> bool:
    """True when ``value`` is a well-formed local session id."""
    return isinstance(value, str) and SESSION_ID_RE.fullmatch(value) is not None


def session_path(directory: Path, session_id: str) -> Path:
    """Where a session lives; refuses ids that are not local session ids."""
    if not is_session_id(session_id):
        raise ValueError(f"{session_id!r} is not a local session id")
    return directory / f"{session_id}.jsonl"


def session_digest(lines: Sequence[SessionLine]) -> str:
    """The documented digest of a sequence of lines."""
    return digest([line.to_json() for line in lines])


def encode_lines(lines: Sequence[SessionLine]) -> bytes:
    """The file bytes of ``lines``: canonical JSON, one per line, each ending in ``\\n``."""
    return b"".join(canonical_json(line.to_json()) + b"\n" for line in lines)


def parse_session(data: bytes) -> SessionState:
    """Parse a session file's bytes; raise :class:`SessionFileError` (``session_corrupt``)."""
    if data and not data.endswith(b"\n"):
        raise SessionFileError("session_corrupt", "the session file ends with an incomplete line")
    lines: list[SessionLine] = []
    for number, raw in enumerate(data.splitlines(), start=1):
        lines.append(_parse_line(raw, number))
    return SessionState(lines=tuple(lines), digest=session_digest(lines))


def _parse_line(raw: bytes, number: int) -> SessionLine:
    try:
        obj: Any = json.loads(raw)
    except ValueError:
        raise SessionFileError(
            "session_corrupt", f"line {number} of the session file is not JSON"
        ) from None
    if (
        not isinstance(obj, dict)
        or set(obj) != LINE_KEYS
        or not all(isinstance(obj[key], str) for key in LINE_KEYS)
        or obj["role"] not in ROLES
    ):
        raise SessionFileError(
            "session_corrupt", f"line {number} of the session file does not have the line format"
        )
    return SessionLine(message_id=obj["messageId"], role=obj["role"], text=obj["text"])


def read_session(path: Path) -> SessionState:
    """Read and parse a session file without modifying it."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise SessionFileError("session_missing", "the session file does not exist") from None
    return parse_session(data)


def create_session(path: Path, lines: Sequence[SessionLine]) -> SessionState:
    """Create a new session file holding ``lines``; fails if the file already exists."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
    try:
        _write_all(fd, encode_lines(lines))
        os.fsync(fd)
    finally:
        os.close(fd)
    return SessionState(lines=tuple(lines), digest=session_digest(lines))


@contextlib.contextmanager
def locked_session(path: Path) -> Iterator[_LockedSession]:
    """Open an existing session under an exclusive lock, so a check and an append are atomic
    with respect to other local workers using the same session."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_APPEND)
    except FileNotFoundError:
        raise SessionFileError("session_missing", "the session file does not exist") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield _LockedSession(fd)
    finally:
        os.close(fd)  # closing releases the lock


@attrs.define(eq=False)
class _LockedSession:
    fd: int

    def read(self) -> SessionState:
        os.lseek(self.fd, 0, os.SEEK_SET)
        chunks: list[bytes] = []
        while chunk := os.read(self.fd, 1 << 16):
            chunks.append(chunk)
        return parse_session(b"".join(chunks))

    def append(self, state: SessionState, lines: Sequence[SessionLine]) -> SessionState:
        """Append ``lines`` after ``state`` (which must be what the file holds now)."""
        _write_all(self.fd, encode_lines(lines))
        os.fsync(self.fd)
        every = (*state.lines, *lines)
        return SessionState(lines=every, digest=session_digest(every))


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
