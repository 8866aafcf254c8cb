"""Snapshots as files of their own beside the database, never written by its writer.

A snapshot is 1-2 MB at 500 streaming runs. Written as a row of the journal database, it
held the database's only writer, and every commit queued behind it, for 8-30 ms under load
(most of the slow acknowledgements around each snapshot). As a file it is written by any
thread while commits go on::

    snapshots/<seq, 20 digits>-<n, 10 digits>.snap
        nonce (12 bytes) followed by the AES-GCM ciphertext (the payload and associated data
        of a snapshot row); n counts the writes, as a row's snapshot_id did, so two
        snapshots at one seq (of two projection versions) are two files

A file is written as ``.<name>.tmp`` (mode 0600), fsynced, renamed into place, and the
directory is fsynced: a crash leaves the earlier snapshots and at most a temporary file,
which readers ignore and the next write removes. The newest few are kept. Journals written
before kept their snapshots in the database's ``snapshots`` table; those rows are still read
and verified, never written.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
from typing import TYPE_CHECKING

from braid_actors.errors import JournalCorrupt, JournalError

from ._crypto import NONCE_SIZE
from ._head import fsync_dir

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

SNAPSHOT_DIR = "snapshots"
_NAME = re.compile(r"([0-9]{20})-([0-9]{10})\.snap")
_TAG_SIZE = 16  # AES-GCM's tag: a ciphertext is never shorter


def snapshot_files(home: Path) -> list[tuple[int, Path]]:
    """``(seq, path)`` of every snapshot file in ``home``, oldest first (by seq, then by
    the order they were written)."""
    return [(seq, path) for seq, _n, path in sorted(_listed(home))]


def _listed(home: Path) -> list[tuple[int, int, Path]]:
    """``(seq, n, path)`` of every snapshot file, in no order."""
    folder = home / SNAPSHOT_DIR
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise JournalError(f"cannot list the snapshots in {folder}: {exc.strerror}") from None
    return [
        (int(m.group(1)), int(m.group(2)), folder / name)
        for name in names
        if (m := _NAME.fullmatch(name))
    ]


def with_rows(
    files: list[tuple[int, Path]], rows: list[tuple[int, bytes, bytes]]
) -> list[tuple[int, Callable[[], tuple[bytes, bytes]]]]:
    """Snapshot files and the rows of an older journal (``(seq, nonce, ciphertext)`` in
    ``(seq, snapshot_id)`` order) as one list, oldest first, a row before a file at one seq:
    ``(seq, load)``, where ``load()`` gives ``(nonce, ciphertext)`` (a file is read then)."""
    merged: list[tuple[int, int, Callable[[], tuple[bytes, bytes]]]] = [
        (seq, 1, functools.partial(read_snapshot_file, seq, path)) for seq, path in files
    ]
    merged += [(seq, 0, functools.partial(_sealed, nonce, ct)) for seq, nonce, ct in rows]
    merged.sort(key=lambda entry: entry[:2])  # stable: rows keep their order
    return [(seq, load) for seq, _file, load in merged]


def _sealed(nonce: bytes, ciphertext: bytes) -> tuple[bytes, bytes]:
    return nonce, ciphertext


def read_snapshot_file(seq: int, path: Path) -> tuple[bytes, bytes]:
    """``(nonce, ciphertext)`` of a snapshot file; :class:`JournalCorrupt` when it is too
    short to hold one, :class:`JournalError` when it cannot be read."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise JournalError(f"cannot read the snapshot file {path}: {exc.strerror}") from None
    if len(data) < NONCE_SIZE + _TAG_SIZE:
        raise JournalCorrupt(f"the snapshot at seq {seq} is truncated ({path.name})")
    return data[:NONCE_SIZE], data[NONCE_SIZE:]


def write_snapshot_file(
    home: Path, seq: int, nonce: bytes, ciphertext: bytes | memoryview, keep: int
) -> None:
    """Write a sealed snapshot durably, then drop all but the newest ``keep`` files."""
    folder = home / SNAPSHOT_DIR
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
    except OSError as exc:
        raise JournalError(f"cannot create {folder}: {exc.strerror}") from None
    written = sorted((n, path) for _seq, n, path in _listed(home))  # in the order written
    n = written[-1][0] + 1 if written else 1
    name = f"{seq:020d}-{n:010d}.snap"
    temporary = folder / f".{name}.tmp"
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            for part in (nonce, ciphertext):  # (not joined: a snapshot is megabytes)
                view = memoryview(part)
                while view:
                    view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, folder / name)
        fsync_dir(folder)
        for stale in os.listdir(folder):  # a crash's leftovers (ours was renamed)
            if stale.endswith(".tmp"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(folder / stale)
        for _n, old in [*written, (n, folder / name)][:-keep]:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(old)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise JournalError(f"cannot write the snapshot at seq {seq}: {exc.strerror}") from None


def delete_snapshot_files(home: Path) -> int:
    """Delete every snapshot file; returns how many there were."""
    files = snapshot_files(home)
    try:
        for _seq, path in files:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        if files:
            fsync_dir(home / SNAPSHOT_DIR)
    except OSError as exc:
        raise JournalError(f"cannot delete the snapshots: {exc.strerror}") from None
    return len(files)
