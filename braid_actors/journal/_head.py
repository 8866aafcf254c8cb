"""The head file: how far the database is known to reach.

Why it exists: SQLite silently ignores WAL frames after the last intact commit frame. If the
``-wal`` file loses its tail (a careless copy, a truncating backup tool, a filesystem fault),
the database still opens cleanly, only without those transactions: acknowledged events would
vanish unnoticed. So after every commit the journal records ``(commits, last_seq, last_hash)``
in ``journal.head`` and fsyncs it, and at open the database must reach at least that point:

- database ahead of the head: normal after a crash between the database commit and the head
  write; the writer brings the head forward;
- database behind the head (fewer commits than the head records): committed transactions are
  missing, and the journal refuses to open (:class:`JournalCorrupt`).

Layout: two 128-byte slots. A write goes to the slot that does not hold the newest head, with
``pwrite`` and ``fdatasync``, so a torn write can only damage the slot being written; the other
slot still holds the previous head, which is never ahead of the database. A slot is the magic
``BRAIDHD1`` (8 bytes), ``commits`` and ``seq`` (unsigned 64-bit big-endian), the last chain
hash (32 raw bytes), the SHA-256 of those 56 bytes, then zero padding. The valid slot with the
most commits wins.

The writer keeps the file open with an exclusive ``flock``: one writer per journal.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import struct
from typing import TYPE_CHECKING

import attrs

from braid_actors.errors import JournalError

if TYPE_CHECKING:
    from pathlib import Path

HEAD_FILE = "journal.head"
SLOT_SIZE = 128
_MAGIC = b"BRAIDHD1"
_BODY = struct.Struct(">8sQQ32s")
_PREFIX = "sha256:"


@attrs.frozen
class Head:
    """A position of the journal."""

    commits: int
    """Number of append transactions committed so far."""
    seq: int
    """Sequence number of the last event (0 when there is none)."""
    hash: str
    """Chain hash of the last event (the genesis hash when there is none)."""


def encode_slot(head: Head) -> bytes:
    body = _BODY.pack(_MAGIC, head.commits, head.seq, bytes.fromhex(head.hash[len(_PREFIX) :]))
    raw = body + hashlib.sha256(body).digest()
    return raw + b"\0" * (SLOT_SIZE - len(raw))


def decode_slot(raw: bytes) -> Head | None:
    """The head in one slot, or ``None`` when the slot is torn or empty."""
    size = _BODY.size
    if len(raw) < size + 32:
        return None
    body, check = raw[:size], raw[size : size + 32]
    if hashlib.sha256(body).digest() != check:
        return None
    magic, commits, seq, digest = _BODY.unpack(body)
    if magic != _MAGIC:
        return None
    return Head(commits=commits, seq=seq, hash=_PREFIX + digest.hex())


def decode_head(raw: bytes) -> Head | None:
    """The newest valid slot of a head file's bytes, or ``None`` when no slot is valid."""
    heads = [decode_slot(raw[i * SLOT_SIZE : (i + 1) * SLOT_SIZE]) for i in (0, 1)]
    valid = [h for h in heads if h is not None]
    return max(valid, key=lambda h: h.commits) if valid else None


def read_head(path: Path) -> tuple[bool, Head | None]:
    """``(exists, head)`` of a head file, read without writing; ``(True, None)`` is damaged."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return False, None
    return True, decode_head(raw)


def fsync_dir(directory: Path) -> None:
    """Make a directory entry (a newly created file) durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class HeadFile:
    """The writer's open, locked head file."""

    __slots__ = ("_fd", "_newest_slot", "path")

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd = fd
        self._newest_slot = 0
        raw = os.pread(fd, 2 * SLOT_SIZE, 0)
        heads = [decode_slot(raw[i * SLOT_SIZE : (i + 1) * SLOT_SIZE]) for i in (0, 1)]
        if heads[1] is not None and (heads[0] is None or heads[1].commits > heads[0].commits):
            self._newest_slot = 1

    @classmethod
    def lock(cls, path: Path, *, create: bool) -> HeadFile:
        """Open (or exclusively create) and lock the head file; busy -> :class:`JournalError`."""
        flags = os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW
        if create:
            flags |= os.O_CREAT | os.O_EXCL
        try:
            fd = os.open(path, flags, 0o600)
        except FileExistsError:
            raise JournalError(
                f"the journal at {path.parent} is being created by another process"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise JournalError(
                f"the journal at {path.parent} is already open for writing"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        if create:
            fsync_dir(path.parent)
        return cls(path, fd)

    def read(self) -> Head | None:
        return decode_head(os.pread(self._fd, 2 * SLOT_SIZE, 0))

    def write(self, head: Head) -> None:
        """Record ``head`` durably in the slot that does not hold the newest head."""
        slot = 1 - self._newest_slot
        os.pwrite(self._fd, encode_slot(head), slot * SLOT_SIZE)
        os.fdatasync(self._fd)
        self._newest_slot = slot

    def reset(self, head: Head) -> None:
        """Write ``head`` into both slots (a new or repaired-at-zero head)."""
        slot = encode_slot(head)
        os.pwrite(self._fd, slot + slot, 0)
        os.fdatasync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # closing the descriptor releases the flock
            self._fd = -1
