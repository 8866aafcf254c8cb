"""Content-addressed objects: redacted bodies stored once, verified on every read.

An object is a row of ``object_data(ref, data)`` in the evidence database, named by the
SHA-256 of its bytes; its reference is ``sha256:<hex>``. Bytes are always already redacted
when they arrive here (see :mod:`._redact`), so the reference never names a secret. An
ingest writes its objects in the same transaction as the entries citing them, so a reader
never sees an entry without its body; a body already present is not written again. A read
recomputes the digest and raises :class:`EvidenceReadFailed` on any mismatch or when the
body is missing: a tampered object is never served.

Stores written before objects moved into the database kept one file per object at
``<root>/sha256/<first two hex>/<remaining 62 hex>``; such files are still read (and
verified the same way) when the database has no row for the reference.
"""

from __future__ import annotations

import hashlib
import re
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, Final

import attrs

from braid_actors.errors import EvidenceInvalidArgument, EvidenceReadFailed

if TYPE_CHECKING:
    from collections.abc import Iterable

MAX_OBJECT_BYTES: Final = 33_554_432
"""Largest body stored (32 MiB, the spec's ``total_bytes`` ceiling); larger is ``capture_limit``."""
REF_RE: Final = re.compile(r"sha256:[0-9a-f]{64}")
MIN_PAGE: Final = 4
MAX_PAGE: Final = 262_144


def ref_of(data: bytes) -> str:
    """The reference of a body: ``sha256:`` + hex digest."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


@attrs.frozen
class Page:
    """One UTF-8-safe page of an object."""

    text: str
    """The decoded page."""
    offset: int
    """Byte offset of the page's start."""
    next_offset: int
    """Byte offset after the page (a character boundary)."""
    total_bytes: int
    """Size of the whole object."""

    @property
    def has_more(self) -> bool:
        return self.next_offset < self.total_bytes


@attrs.define(eq=False)
class ObjectStore:
    """Objects in the evidence database (and legacy files under ``root``)."""

    root: Path
    """``$BRAID_HOME/objects``: where older stores kept one file per object."""
    conn: sqlite3.Connection

    def path_of(self, ref: str) -> Path:
        """Where an older store kept ``ref`` as a file."""
        if not REF_RE.fullmatch(ref):
            raise EvidenceInvalidArgument("ref must be sha256: and 64 lowercase hex digits")
        hexpart = ref[len("sha256:") :]
        return self.root / "sha256" / hexpart[:2] / hexpart[2:]

    def put(self, data: bytes) -> str:
        """Store ``data`` (already redacted) and return its reference."""
        ref = ref_of(data)
        self.put_many([(ref, data)])
        return ref

    def put_many(self, items: Iterable[tuple[str, bytes]]) -> None:
        """Store ``(ref, data)`` pairs whose refs the caller computed with :func:`ref_of`."""
        self.conn.executemany("INSERT OR IGNORE INTO object_data(ref, data) VALUES (?,?)", items)

    def exists(self, ref: str) -> bool:
        """Whether ``ref`` is stored at all (a row, or an older store's file), verified or not."""
        found = self.conn.execute("SELECT 1 FROM object_data WHERE ref=?", (ref,)).fetchone()
        return found is not None or self.path_of(ref).exists()

    def get(self, ref: str) -> bytes:
        """The verified bytes of ``ref``; :class:`EvidenceReadFailed` if missing or tampered."""
        path = self.path_of(ref)
        row = self.conn.execute("SELECT data FROM object_data WHERE ref=?", (ref,)).fetchone()
        if row is not None:
            data = bytes(row[0])
        else:
            try:
                data = path.read_bytes()
            except OSError:
                raise EvidenceReadFailed(
                    "a stored evidence object could not be read", details={"ref": ref}
                ) from None
        if ref_of(data) != ref:
            raise EvidenceReadFailed(
                "a stored evidence object does not match its hash", details={"ref": ref}
            )
        return data

    def page(self, ref: str, offset: int, limit: int) -> Page:
        """A verified page of at most ``limit`` bytes starting at a UTF-8 boundary ``offset``."""
        if not MIN_PAGE <= limit <= MAX_PAGE:
            raise EvidenceInvalidArgument(
                f"limit must be between {MIN_PAGE} and {MAX_PAGE}", details={"field": "limit"}
            )
        data = self.get(ref)
        total = len(data)
        if offset < 0 or offset > total:
            raise EvidenceInvalidArgument(
                "offset is outside the content", details={"field": "offset"}
            )
        if offset < total and _is_continuation(data[offset]):
            raise EvidenceInvalidArgument(
                "offset is not at a UTF-8 character boundary", details={"field": "offset"}
            )
        end = min(offset + limit, total)
        while end < total and _is_continuation(data[end]):
            end -= 1
        try:
            text = data[offset:end].decode("utf-8")
        except UnicodeDecodeError:
            raise EvidenceReadFailed(
                "a stored evidence object is not UTF-8 text", details={"ref": ref}
            ) from None
        return Page(text=text, offset=offset, next_offset=end, total_bytes=total)


def _is_continuation(byte: int) -> bool:
    return byte & 0xC0 == 0x80
