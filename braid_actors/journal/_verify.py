"""Offline verification of a journal: read-only, reports faults instead of raising.

``verify_journal`` opens the database read-only (SQLite may create its empty ``-wal``/``-shm``
side files; nothing else is touched) and, inside one read transaction, checks:

- SQLite's own ``integrity_check`` of the file;
- that event sequence numbers are contiguous from 1 and every event links to the previous one
  by the hash chain;
- that every event, operation result and snapshot decrypts with the associated data binding it
  to its row;
- that the database reaches the position recorded in ``journal.head``;
- with a :class:`Projector`, that replaying every event from the initial state reproduces the
  checksum stored in each snapshot of the projector's version, at that snapshot's seq (a
  snapshot's checksum is the canonical digest of the dumped state, so the replay is compared
  through ``digest(projector.dump(state))``), and it reports ``projector.checksum`` of the
  final state.

Faults are plain sentences naming sequence numbers and tables, never payload contents. A key
that does not open the journal raises :class:`WrongKey`; a missing journal raises
:class:`JournalError`; everything else is a fault in the report.
"""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import attrs

from braid_actors.errors import BraidError, JournalCorrupt, JournalError, WrongKey
from braid_actors.model._canonical import digest

from ._crypto import GENESIS_HASH, Sealer
from ._head import HEAD_FILE, Head, read_head
from ._inspect import (
    DB_FILE,
    SnapshotPayload,
    connect_readonly,
    head_fault,
    inspect_db,
    link_ok,
    open_event,
    open_operation,
    open_snapshot,
    translate_sqlite_error,
)
from ._snapfiles import snapshot_files, with_rows

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

    from ._records import CommittedRecord

S = TypeVar("S")
MAX_FAULTS = 50
_CHUNK = 1000


class Projector(Protocol[S]):
    """A fold of the journal that verification can replay."""

    @property
    def version(self) -> int:
        """Projection version; only snapshots of this version are compared."""
        ...

    def initial(self) -> S: ...

    def apply(self, state: S, record: CommittedRecord) -> S: ...

    def checksum(self, state: S) -> str: ...

    def dump(self, state: S) -> Mapping[str, Any]: ...


@attrs.frozen
class VerifyReport:
    """What :func:`verify_journal` found."""

    ok: bool
    """True when no fault was found."""
    events: int
    """Number of event rows examined."""
    last_seq: int
    """Sequence number of the last event row (0 when there is none)."""
    chain_ok: bool
    """Sequence numbers are contiguous and every hash-chain link holds."""
    decrypt_ok: bool
    """Every event, operation and snapshot decrypts with its binding."""
    projection_checksum: str | None
    """``projector.checksum`` after a full replay; ``None`` without a projector or replay."""
    snapshots_checked: int
    """Snapshots decrypted and checked (and compared with the replay when of its version)."""
    faults: tuple[str, ...]
    """Plain sentences, one per fault, without payload contents."""
    operations: int = 0
    """Number of operation rows examined."""

    def render(self) -> str:
        """Human-readable summary."""
        lines = [
            f"journal verification: {'OK' if self.ok else 'FAULTS FOUND'}",
            f"  events:             {self.events} (last seq {self.last_seq})",
            f"  operations:         {self.operations}",
            f"  hash chain:         {'intact' if self.chain_ok else 'BROKEN'}",
            f"  decryption:         {'every payload opens' if self.decrypt_ok else 'FAILED'}",
            f"  snapshots checked:  {self.snapshots_checked}",
            f"  projection:         {self.projection_checksum or 'not replayed'}",
        ]
        if self.faults:
            lines.append("faults:")
            lines.extend(f"  - {fault}" for fault in self.faults)
        return "\n".join(lines)


@attrs.define(eq=False)
class _Findings:
    faults: list[str] = attrs.Factory(list)
    dropped: int = 0
    chain_ok: bool = True
    decrypt_ok: bool = True

    def add(self, fault: str) -> None:
        if len(self.faults) < MAX_FAULTS:
            self.faults.append(fault)
        else:
            self.dropped += 1

    def sentences(self) -> tuple[str, ...]:
        extra = [f"... and {self.dropped} more faults"] if self.dropped else []
        return (*self.faults, *extra)


def verify_journal(home: Path, key: bytes, projector: Projector[Any] | None = None) -> VerifyReport:
    """Check the journal in ``home`` without writing anything (see the module docstring)."""
    sealer = Sealer(key)
    path = home / DB_FILE
    if not path.is_file():
        raise JournalError(f"there is no journal at {home}")
    known = read_head(home / HEAD_FILE)  # before the database snapshot, see head_fault
    conn = connect_readonly(path)
    found = _Findings()
    try:
        conn.execute("BEGIN")
        return _verify(conn, sealer, home, projector, found, known)
    except sqlite3.DatabaseError as exc:
        # a damaged page stops the scan; what could not be read is not claimed to be fine
        found.add(translate_sqlite_error(exc, path, "read the database").message)
        found.chain_ok = found.decrypt_ok = False
        return _report(found, 0, 0, None, 0, 0)
    finally:
        conn.close()


def _report(
    found: _Findings, events: int, last_seq: int, checksum: str | None, snaps: int, ops: int
) -> VerifyReport:
    return VerifyReport(
        ok=not found.faults,
        events=events,
        last_seq=last_seq,
        chain_ok=found.chain_ok,
        decrypt_ok=found.decrypt_ok,
        projection_checksum=checksum,
        snapshots_checked=snaps,
        faults=found.sentences(),
        operations=ops,
    )


def _verify(
    conn: sqlite3.Connection,
    sealer: Sealer,
    home: Path,
    projector: Projector[Any] | None,
    found: _Findings,
    known: tuple[bool, Head | None],
) -> VerifyReport:
    path = home / DB_FILE
    try:
        tip = inspect_db(conn, sealer, path)
    except WrongKey:
        raise
    except JournalError as exc:
        found.add(exc.message)
        return _report(found, 0, 0, None, 0, 0)
    if tip is None:
        found.add(f"{path.name} holds no journal tables")
        return _report(found, 0, 0, None, 0, 0)
    problems = [str(r[0]) for r in conn.execute("PRAGMA integrity_check(100)").fetchall()]
    if problems != ["ok"]:
        found.add(f"SQLite's integrity check reports {len(problems)} problem(s) in {path.name}")

    snapshots = _check_snapshots(conn, sealer, home, found)
    events, last_seq, checksum, compared = _check_events(conn, sealer, found, projector, snapshots)
    for snap in snapshots:
        if snap.seq > last_seq:
            found.add(f"the snapshot at seq {snap.seq} is ahead of the last event {last_seq}")
    fault = head_fault(conn, tip, home / HEAD_FILE, known)
    if fault is not None:
        found.add(fault)
    operations = _check_operations(conn, sealer, found, last_seq)
    snaps_checked = len(snapshots) if projector is None else compared
    return _report(found, events, last_seq, checksum, snaps_checked, operations)


def _check_snapshots(
    conn: sqlite3.Connection, sealer: Sealer, home: Path, found: _Findings
) -> list[SnapshotPayload]:
    """Every snapshot, the files and the rows of older journals, in seq order."""
    good: list[SnapshotPayload] = []
    rows = conn.execute(
        "SELECT seq, nonce, ciphertext FROM snapshots ORDER BY seq, snapshot_id"
    ).fetchall()
    try:
        files = snapshot_files(home)
    except JournalError as exc:
        found.add(exc.message)
        files = []
    for seq, load in with_rows(files, rows):
        try:
            good.append(open_snapshot(sealer, seq, *load()))
        except JournalCorrupt as exc:
            found.decrypt_ok = False
            found.add(exc.message)
        except JournalError as exc:
            found.add(exc.message)
    return good


def _check_events(
    conn: sqlite3.Connection,
    sealer: Sealer,
    found: _Findings,
    projector: Projector[Any] | None,
    snapshots: list[SnapshotPayload],
) -> tuple[int, int, str | None, int]:
    """Scan every event; returns ``(events, last_seq, projection_checksum, compared)``."""
    mine = [s for s in snapshots if projector is not None and s.version == projector.version]
    replay = _Replay(projector, mine, found)
    prev, expected, events, after = GENESIS_HASH, 1, 0, -1
    while True:
        rows = conn.execute(
            "SELECT seq, stream, type, committed_at, nonce, ciphertext, prev_hash, hash"
            " FROM events WHERE seq > ? ORDER BY seq LIMIT ?",
            (after, _CHUNK),
        ).fetchall()
        if not rows:
            break
        for row in rows:
            seq = row[0]
            if seq != expected:
                found.chain_ok = False
                found.add(
                    f"event {seq} follows event {expected - 1}: sequence numbers are not contiguous"
                )
            if not link_ok(row, prev):
                found.chain_ok = False
                found.add(f"event {seq} breaks the hash chain")
            try:
                record: CommittedRecord | None = open_event(sealer, row)
            except JournalCorrupt as exc:
                found.decrypt_ok = False
                found.add(exc.message)
                record = None
            replay.step(seq, record)
            prev, expected, events, after = row[7], seq + 1, events + 1, seq
    return events, max(after, 0), replay.finish(), replay.compared


@attrs.define(eq=False)
class _Replay:
    """Folds records through the projector and compares snapshots at their seq."""

    projector: Projector[Any] | None
    pending: list[SnapshotPayload]
    found: _Findings
    state: Any = None
    broken: bool = False
    compared: int = 0

    def __attrs_post_init__(self) -> None:
        if self.projector is not None:
            self.state = self.projector.initial()
            self._compare_through(0)

    def step(self, seq: int, record: CommittedRecord | None) -> None:
        if self.projector is None or self.broken:
            return
        if record is None:
            self.broken = True
            self.found.add(f"the replay stopped at event {seq}, which does not decrypt")
            return
        try:
            self.state = self.projector.apply(self.state, record)
        except BraidError as exc:
            self.broken = True
            self.found.add(f"the replay stopped at event {seq}: {exc.code}")
            return
        self._compare_through(seq)

    def _compare_through(self, seq: int) -> None:
        assert self.projector is not None
        while self.pending and self.pending[0].seq <= seq:
            snap = self.pending.pop(0)
            if snap.seq < seq:
                continue  # its seq has no event (already reported as a gap)
            self.compared += 1
            if digest(self.projector.dump(self.state)) != snap.checksum:
                self.found.add(
                    f"the snapshot at seq {snap.seq} (projection version {snap.version}) "
                    "does not match a replay of the journal"
                )

    def finish(self) -> str | None:
        if self.projector is None or self.broken:
            return None
        return self.projector.checksum(self.state)


def _check_operations(
    conn: sqlite3.Connection, sealer: Sealer, found: _Findings, last_seq: int
) -> int:
    rows = conn.execute(
        "SELECT op_id, command, params_digest, seq, nonce, ciphertext FROM operations"
        " ORDER BY seq, op_id"
    ).fetchall()
    for op_id, command, params_digest, seq, nonce, ciphertext in rows:
        try:
            open_operation(sealer, op_id, command, params_digest, seq, nonce, ciphertext)
        except JournalCorrupt as exc:
            found.decrypt_ok = False
            found.add(exc.message)
        if seq > last_seq:
            found.add(f"operation {op_id} refers to seq {seq}, after the last event {last_seq}")
    return len(rows)
