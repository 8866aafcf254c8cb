"""Content-addressed objects: redacted bodies stored once, verified on every read.

An object lives at ``<root>/sha256/<first two hex>/<remaining 62 hex>`` (mode 0600), named by
the SHA-256 of its bytes; its reference is ``sha256:<hex>``. Bytes are always already
redacted when they arrive here (see :mod:`._redact`), so the reference never names a secret.
Writes go to a temporary file that is renamed into place, so a reader never sees half an
object; a body already present is not rewritten. A read recomputes the digest and raises
:class:`EvidenceReadFailed` on any mismatch or I/O error: a tampered object is never served.

Objects are not fsynced one by one: the evidence store can be rebuilt from the transcripts,
and a torn object is caught by the read check, never served.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Final

import attrs

from braid_actors.errors import EvidenceInvalidArgument, EvidenceReadFailed

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
    """Objects under ``root`` (``$BRAID_HOME/objects``)."""

    root: Path

    def path_of(self, ref: str) -> Path:
        if not REF_RE.fullmatch(ref):
            raise EvidenceInvalidArgument("ref must be sha256: and 64 lowercase hex digits")
        hexpart = ref[len("sha256:") :]
        return self.root / "sha256" / hexpart[:2] / hexpart[2:]

    def put(self, data: bytes) -> str:
        """Store ``data`` (already redacted) and return its reference."""
        ref = ref_of(data)
        path = self.path_of(ref)
        if path.exists():
            return ref
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(tmp, path)
        return ref

    def get(self, ref: str) -> bytes:
        """The verified bytes of ``ref``; :class:`EvidenceReadFailed` if missing or tampered."""
        path = self.path_of(ref)
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
