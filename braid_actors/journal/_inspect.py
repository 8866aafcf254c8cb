"""Read-only examination of a journal database, shared by ``Journal.open`` and verification.

Nothing in this module writes: it reads through connections opened with ``mode=ro`` (SQLite
may still create its empty ``-wal``/``-shm`` side files, which hold no data) and decrypts.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import attrs
import orjson

from braid_actors.errors import JournalCorrupt, JournalError, WrongKey
from braid_actors.model._canonical import digest, digest_bytes, parse_time

from ._crypto import (
    GENESIS_HASH,
    KEY_CHECK_PLAINTEXT,
    DecryptError,
    Sealer,
    chain_hash,
    event_ad,
    key_check_ad,
    operation_ad,
    snapshot_ad,
)
from ._head import Head
from ._records import CommittedRecord

if TYPE_CHECKING:
    from pathlib import Path

DB_FILE = "journal.sqlite3"
FORMAT_VERSION = 1
TABLES = frozenset({"meta", "events", "operations", "snapshots"})
_SQLITE_CORRUPT = 11
_SQLITE_NOTADB = 26
_SQLITE_FULL = 13


def translate_sqlite_error(exc: sqlite3.DatabaseError, path: Path, action: str) -> JournalError:
    """A :class:`JournalError` for an SQLite failure (corruption -> :class:`JournalCorrupt`)."""
    code = getattr(exc, "sqlite_errorcode", -1) & 0xFF
    details = {"sqlite_error": getattr(exc, "sqlite_errorname", type(exc).__name__)}
    if code in (_SQLITE_CORRUPT, _SQLITE_NOTADB):
        return JournalCorrupt(
            f"the journal database {path} is damaged (could not {action}); it was neither "
            "changed nor repaired. Restore it from a backup.",
            details=details,
        )
    if code == _SQLITE_FULL:
        return JournalError(
            f"the disk holding {path} is full (could not {action})", details=details
        )
    return JournalError(f"could not {action} in the journal database {path}", details=details)


@contextmanager
def sqlite_errors(path: Path, action: str) -> Iterator[None]:
    """Translate SQLite failures inside the block into journal errors."""
    try:
        yield
    except sqlite3.DatabaseError as exc:
        raise translate_sqlite_error(exc, path, action) from exc


def connect_readonly(path: Path) -> sqlite3.Connection:
    """A connection that cannot write to ``path`` (``mode=ro`` and ``query_only``)."""
    uri = path.resolve().as_uri() + "?mode=ro"
    with sqlite_errors(path, "open the database"):
        conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA query_only = 1")
    return conn


def new_key_check(sealer: Sealer) -> str:
    nonce, ciphertext = sealer.seal(KEY_CHECK_PLAINTEXT, key_check_ad(FORMAT_VERSION))
    return f"{nonce.hex()}:{ciphertext.hex()}"


def inspect_db(conn: sqlite3.Connection, sealer: Sealer, path: Path) -> Head | None:
    """The tip of a journal database after checking its format and key.

    ``None`` when the database has no tables yet (a creation that never committed). Raises
    :class:`WrongKey`, :class:`JournalCorrupt` or :class:`JournalError`.
    """
    with sqlite_errors(path, "read the database"):
        own = not conn.in_transaction  # verification reads everything in one transaction
        if own:
            conn.execute("BEGIN")
        try:
            tables = {
                str(row[0])
                for row in conn.execute("SELECT name FROM sqlite_schema WHERE type = 'table'")
            }
            if not tables:
                return None
            if not tables >= TABLES:
                raise JournalCorrupt(f"{path} is not a complete Braid journal")
            meta = {str(k): str(v) for k, v in conn.execute("SELECT name, value FROM meta")}
            last = conn.execute("SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1").fetchone()
        finally:
            if own and conn.in_transaction:
                conn.execute("ROLLBACK")
    if meta.get("format_version") != str(FORMAT_VERSION):
        raise JournalError(
            f"the journal at {path.parent} has an unsupported format",
            details={"format_version": meta.get("format_version")},
        )
    check_key(sealer, meta.get("key_check", ""), path)
    try:
        commits = int(meta["commits"])
    except (KeyError, ValueError):
        raise JournalCorrupt(f"the commit counter of {path} is damaged") from None
    if last is None:
        return Head(commits, 0, GENESIS_HASH)
    return Head(commits, int(last[0]), str(last[1]))


def check_key(sealer: Sealer, key_check: str, path: Path) -> None:
    """Raise :class:`WrongKey` unless ``sealer`` opens the stored key check."""
    try:
        nonce_hex, ct_hex = key_check.split(":")
        plaintext = sealer.open(
            bytes.fromhex(nonce_hex), bytes.fromhex(ct_hex), key_check_ad(FORMAT_VERSION)
        )
    except (ValueError, DecryptError):
        plaintext = b""
    if plaintext != KEY_CHECK_PLAINTEXT:
        raise WrongKey(
            f"this key does not open the journal at {path.parent}; nothing was changed",
            details={"path": str(path.parent)},
        )


def head_fault(
    conn: sqlite3.Connection, tip: Head, head_path: Path, known: tuple[bool, Head | None]
) -> str | None:
    """Why the database and its head file disagree, or ``None`` when they agree.

    ``known`` is :func:`read_head` of ``head_path``, read BEFORE the database snapshot that
    gave ``tip``: the head only ever moves after a commit, so read in that order it can never
    be ahead of an intact database, even while a writer is committing. The database may be
    ahead of the head (a crash between commit and head write); it must never be behind it.
    """
    exists, head = known
    if not exists or head is None:
        if tip.commits == 0:
            return None
        state = "missing" if not exists else "damaged"
        return (
            f"{head_path.name} is {state}, so it cannot be confirmed that no committed "
            "events were lost"
        )
    if tip.commits < head.commits or tip.seq < head.seq:
        return (
            f"committed events are missing: the database ends at event {tip.seq} (commit "
            f"{tip.commits}) but {head_path.name} records event {head.seq} (commit "
            f"{head.commits}); restore the database and its -wal file from a backup"
        )
    if tip.commits == head.commits and (tip.seq, tip.hash) != (head.seq, head.hash):
        return f"the database and {head_path.name} disagree about the last event"
    if head.seq > 0:
        row = conn.execute("SELECT hash FROM events WHERE seq = ?", (head.seq,)).fetchone()
        if row is None or row[0] != head.hash:
            return f"event {head.seq} no longer matches the hash recorded in {head_path.name}"
    return None


def check_head(
    conn: sqlite3.Connection, tip: Head, head_path: Path, known: tuple[bool, Head | None]
) -> None:
    """Raise :class:`JournalCorrupt` when :func:`head_fault` finds a fault."""
    with sqlite_errors(head_path.parent / DB_FILE, "read the database"):
        fault = head_fault(conn, tip, head_path, known)
    if fault is not None:
        raise JournalCorrupt(
            f"the journal at {head_path.parent} was not opened: {fault}",
            details={"db_seq": tip.seq, "db_commits": tip.commits},
        )


def link_ok(row: tuple[Any, ...], prev_hash: str) -> bool:
    """Whether an events row links to ``prev_hash`` and its hash is its own."""
    seq, stream, type_, committed_at, nonce, ciphertext, row_prev, row_hash = row
    return bool(
        row_prev == prev_hash
        and chain_hash(prev_hash, seq, stream, type_, committed_at, nonce, ciphertext) == row_hash
    )


def open_event(sealer: Sealer, row: tuple[Any, ...]) -> CommittedRecord:
    """Decrypt an events row; :class:`JournalCorrupt` when it does not open with its binding."""
    seq, stream, type_, committed_at, nonce, ciphertext, _prev, row_hash = row
    try:
        plaintext = sealer.open(nonce, ciphertext, event_ad(seq, stream, type_, committed_at))
        data = orjson.loads(plaintext)
        when = parse_time(committed_at)
    except (DecryptError, ValueError, TypeError):
        raise JournalCorrupt(
            f"event {seq} does not decrypt with its binding (the row was altered or moved)"
        ) from None
    return CommittedRecord(seq, stream, type_, data, when, row_hash)


def open_operation(
    sealer: Sealer,
    op_id: str,
    command: str,
    params_digest: str,
    seq: int,
    nonce: bytes,
    ciphertext: bytes,
) -> Mapping[str, Any]:
    """Decrypt an operation's recorded result."""
    try:
        plaintext = sealer.open(nonce, ciphertext, operation_ad(op_id, command, params_digest, seq))
        result = orjson.loads(plaintext)
    except (DecryptError, ValueError, TypeError):
        result = None
    if not isinstance(result, dict):
        raise JournalCorrupt(
            f"the result of operation {op_id} does not decrypt with its binding"
        ) from None
    return result


@attrs.frozen
class SnapshotPayload:
    """The decrypted content of a snapshot row."""

    version: int
    seq: int
    state: Mapping[str, Any]
    checksum: str


def open_snapshot(sealer: Sealer, seq: int, nonce: bytes, ciphertext: bytes) -> SnapshotPayload:
    """Decrypt a snapshot and check it against its row and its checksum."""
    try:
        plaintext = sealer.open(nonce, ciphertext, snapshot_ad(seq))
        payload = orjson.loads(plaintext)
    except (DecryptError, ValueError, TypeError):
        raise JournalCorrupt(
            f"the snapshot at seq {seq} does not decrypt with its binding"
        ) from None
    if not (
        isinstance(payload, dict)
        and type(payload.get("version")) is int
        and payload.get("seq") == seq
        and isinstance(payload.get("state"), dict)
        and isinstance(payload.get("checksum"), str)
    ):
        raise JournalCorrupt(f"the snapshot at seq {seq} is malformed")
    checksum: str = payload["checksum"]
    state_bytes = _spliced_state(plaintext, seq, payload["version"], checksum)
    if not (
        (state_bytes is not None and digest_bytes(state_bytes) == checksum)
        or digest(payload["state"]) == checksum
    ):
        raise JournalCorrupt(f"the snapshot at seq {seq} does not match its checksum")
    return SnapshotPayload(payload["version"], seq, payload["state"], checksum)


def snapshot_frame(checksum: str, seq: int, version: int) -> tuple[bytes, bytes]:
    """What comes before and after the state in a snapshot payload: the canonical JSON of
    ``{"checksum", "seq", "state", "version"}`` with the state (already canonical JSON)
    spliced in, so the state is encoded once (``Journal.seal_snapshot_json``)."""
    head = b'{"checksum":' + json.dumps(checksum).encode() + b',"seq":%d,"state":' % seq
    return head, b',"version":%d}' % version


def _spliced_state(plaintext: bytes, seq: int, version: int, checksum: str) -> bytes | None:
    """The state's own bytes in a payload laid out by :func:`snapshot_frame`, or None for
    another layout.

    Hashing them checks the checksum without encoding the state again (a restart's load of
    1,000 runs spent 50-90 ms on that); a payload of another layout is checked by encoding.
    """
    head, tail = snapshot_frame(checksum, seq, version)
    if plaintext.startswith(head) and plaintext.endswith(tail):
        return plaintext[len(head) : len(plaintext) - len(tail)]
    return None
