"""The encrypted journal store: a synchronous object the journal actor drives from a thread.

Files under ``home`` (a directory of mode 0700):

- ``journal.sqlite3`` (with SQLite's ``-wal`` and ``-shm``), created with mode 0600, opened
  through ``sqlite_utils.Database`` in WAL mode with ``synchronous=FULL`` and
  ``wal_autocheckpoint=0``: commits never run a checkpoint; :meth:`Journal.checkpoint` does,
  on its own connection, off the commit path;
- ``journal.head``, the last acknowledged position (see :mod:`._head`), also the writer lock;
- ``journal.key`` when the key is not given through ``BRAID_KEY`` (see :mod:`._keys`).

Tables (plaintext columns hold only what is needed to find and chain rows; every payload is
AES-GCM encrypted, see :mod:`._crypto` for the associated data that binds it to its row)::

    meta(name TEXT PRIMARY KEY, value TEXT)
        format_version  "1"
        key_check       hex(nonce) ":" hex(ciphertext) of a constant under this key
        commits         number of append transactions (compared with journal.head)
    events(seq INTEGER PRIMARY KEY, stream TEXT, type TEXT, committed_at TEXT,
           nonce BLOB, ciphertext BLOB, prev_hash TEXT, hash TEXT)
        ciphertext = AES-GCM(canonical JSON of the record data)
    operations(op_id TEXT PRIMARY KEY, command TEXT, params_digest TEXT, seq INTEGER,
               nonce BLOB, ciphertext BLOB)
        seq = the last event seq at the operation's commit; ciphertext = its result
    snapshots(snapshot_id INTEGER PRIMARY KEY, seq INTEGER, nonce BLOB, ciphertext BLOB)
        ciphertext = canonical JSON {"checksum", "seq", "state", "version"}; the projection
        version lives only inside the ciphertext. Written by journals before snapshots moved
        to files of their own (``snapshots/``, see :mod:`._snapfiles`, same payload and
        associated data, the newest three kept); still read and verified, never written.

Failures never write: an existing database is first examined through a read-only connection
(format, key check, head), and only when all is well is the writer connection opened. SQLite
corruption is reported as :class:`JournalCorrupt` and never repaired. A ``Journal`` may be
used by one thread at a time; :meth:`Journal.checkpoint` may run concurrently with it.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Self

import attrs
import sqlite_utils

from braid_actors.errors import (
    JournalCorrupt,
    JournalError,
    OperationConflict,
)
from braid_actors.model._canonical import format_time

from ._crypto import (
    GENESIS_HASH,
    NONCE_SIZE,
    Sealer,
    chain_hash_framed,
    event_ad_framed,
    frame,
    operation_ad,
)
from ._encoding import PreparedAppend, encode_payload, prepare_append
from ._head import HEAD_FILE, Head, HeadFile, read_head
from ._inspect import (
    DB_FILE,
    check_head,
    connect_readonly,
    inspect_db,
    link_ok,
    open_event,
    open_operation,
    open_snapshot,
    sqlite_errors,
    translate_sqlite_error,
)
from ._records import CommittedRecord, NewRecord, Operation
from ._schema import connect_writer, insert_events, refuse_orphans
from ._snapfiles import delete_snapshot_files, snapshot_files, with_rows, write_snapshot_file
from ._snapseal import SealedSnapshot, seal_steps

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping, Sequence
    from pathlib import Path
    from types import TracebackType

KEEP_SNAPSHOTS = 3
_READ_CHUNK = 1000
_INSERT_OPERATION = (
    "INSERT INTO operations (op_id, command, params_digest, seq, nonce, ciphertext)"
    " VALUES (?, ?, ?, ?, ?, ?)"
)
_SELECT_EVENTS = (
    "SELECT seq, stream, type, committed_at, nonce, ciphertext, prev_hash, hash FROM events"
    " WHERE seq >= ? ORDER BY seq LIMIT ?"
)


@attrs.frozen
class Staged:
    """A batch written in an open transaction (see :meth:`Journal.stage_prepared`)."""

    records: list[list[CommittedRecord]]
    """The records of each request, as they will be once committed."""
    tip: Head | None
    """The journal's position once committed; None: the batch wrote nothing."""
    has_operations: bool = False


_FRAMED_STREAMS = 4096
"""Most (stream, type) pairs whose framing the writer keeps (a few per active run)."""


class Journal:
    """The encrypted, hash-chained event store; open it with :meth:`Journal.open`."""

    def __init__(
        self,
        home: Path,
        sealer: Sealer,
        conn: sqlite3.Connection,
        head_file: HeadFile | None,
        tip: Head,
    ) -> None:
        self.home = home
        self.path = home / DB_FILE
        self._sealer = sealer
        self._conn = conn
        self._db = sqlite_utils.Database(conn)
        self._head_file = head_file
        self._tip = tip  # replaced whole after each commit, so other threads read it whole
        self._head_written = tip
        self._head_lock = threading.Lock()
        self._ckpt_conn: sqlite3.Connection | None = None
        self._ckpt_lock = threading.Lock()
        self._closed = False
        self._framed: dict[tuple[str, str], bytes] = {}
        """``frame(stream, type)`` of the streams written lately (see stage_prepared)."""

    # ---- opening ---------------------------------------------------------------------

    @classmethod
    def open(cls, home: Path, key: bytes, *, readonly: bool = False) -> Self:
        """Open (or, unless ``readonly``, create) the journal in ``home`` with ``key``.

        Raises :class:`WrongKey` when ``key`` does not open an existing journal,
        :class:`JournalCorrupt` when the database is damaged or ends before its head (committed
        events are missing), and :class:`JournalError` when another process has it open for
        writing. In every failure case nothing is written.
        """
        sealer = Sealer(key)
        if readonly:
            return cls._open_readonly(home, sealer)
        return cls._open_writer(home, sealer)

    @classmethod
    def _open_readonly(cls, home: Path, sealer: Sealer) -> Self:
        path = home / DB_FILE
        if not path.is_file():
            raise JournalError(f"there is no journal at {home}")
        conn = connect_readonly(path)
        try:
            known = read_head(home / HEAD_FILE)  # before the database snapshot, see head_fault
            state = inspect_db(conn, sealer, path)
            if state is None:
                raise JournalError(f"the journal at {home} has not been initialised")
            check_head(conn, state, home / HEAD_FILE, known)
        except BaseException:
            conn.close()
            raise
        return cls(home, sealer, conn, None, state)

    @classmethod
    def _open_writer(cls, home: Path, sealer: Sealer) -> Self:
        path = home / DB_FILE
        head_path = home / HEAD_FILE
        if not home.is_dir():
            home.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(home, 0o700)
        head_file = HeadFile.lock(head_path, create=False) if head_path.exists() else None
        try:
            fresh = True
            if path.exists():
                ro = connect_readonly(path)
                try:
                    known = read_head(head_path)
                    state = inspect_db(ro, sealer, path)
                    fresh = state is None
                    check_head(ro, state or Head(0, 0, GENESIS_HASH), head_path, known)
                finally:
                    ro.close()
            else:
                refuse_orphans(home, head_file)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
                os.close(fd)
            if head_file is None:
                head_file = HeadFile.lock(head_path, create=True)
                head_file.reset(Head(0, 0, GENESIS_HASH))
            conn = connect_writer(path, sealer, fresh=fresh)
            try:
                state = inspect_db(conn, sealer, path)
                assert state is not None
                current = head_file.read()
                if current is None:
                    head_file.reset(state)
                elif current.commits < state.commits:
                    head_file.write(state)
            except BaseException:
                conn.close()
                raise
        except BaseException:
            if head_file is not None:
                head_file.close()
            raise
        return cls(home, sealer, conn, head_file, state)

    # ---- state -----------------------------------------------------------------------

    @property
    def last_seq(self) -> int:
        """Sequence number of the last committed event (0 for an empty journal)."""
        return self._tip.seq

    @property
    def last_hash(self) -> str:
        """Chain hash of the last committed event."""
        return self._tip.hash

    @property
    def readonly(self) -> bool:
        return self._head_file is None

    # ---- writing ---------------------------------------------------------------------

    def append(
        self, batch: Sequence[tuple[Sequence[NewRecord], Operation | None]]
    ) -> list[list[CommittedRecord]]:
        """Write every request of ``batch`` in one transaction, commit durably, return records.

        Nothing is written when any payload is not JSON-compatible (:class:`BadRequest`).
        """
        return self.commit_prepared([prepare_append(recs, op) for recs, op in batch])

    def commit_prepared(
        self, batch: Sequence[PreparedAppend], *, sync_head: bool = True
    ) -> list[list[CommittedRecord]]:
        """Encrypt, chain and commit prepared requests in one transaction.

        :meth:`stage_prepared` then :meth:`finish_staged`. On a database error nothing is
        committed and the store is unchanged. With ``sync_head`` the head file is written
        before returning; if that fails, :class:`JournalError` is raised although the
        records are durable.
        """
        return self.finish_staged(self.stage_prepared(batch), sync_head=sync_head)

    def stage_prepared(self, batch: Sequence[PreparedAppend]) -> Staged:
        """Encrypt and chain ``batch`` and write its rows in an open transaction; nothing
        is durable, or visible to another connection, until :meth:`finish_staged`.

        The journal actor stages on the event loop and finishes in its writer thread: the
        thread then gives the interpreter up once (for the ``COMMIT`` and its fsync)
        instead of after every statement. Each statement hands the interpreter back and
        forth, and under load the writer waited for it after every one of them (a
        commit's wall time was 3x its CPU). Until finished or abandoned, no other write
        may use the journal. On a database error the transaction is rolled back and the
        error raised.
        """
        self._writer()
        now = datetime.now(UTC)
        stamp = format_time(now)
        seal, encrypt = self._sealer.seal, self._sealer.encrypt
        seq, prev = self._tip.seq, self._tip.hash
        event_rows: list[tuple[Any, ...]] = []
        op_rows: list[tuple[Any, ...]] = []
        out: list[list[CommittedRecord]] = []
        # frame(stream, type, stamp) is frame(stream, type) + frame(stamp): the first part
        # is kept from batch to batch (under load each event of a batch is of another
        # run's stream), the second is the batch's own.
        framed = self._framed
        if len(framed) > _FRAMED_STREAMS:
            framed.clear()
        stamped = frame(stamp)
        # one getrandom call for the batch's nonces instead of one per event
        nonces = os.urandom(NONCE_SIZE * sum(len(req.records) for req in batch))
        at = 0
        for req in batch:
            committed: list[CommittedRecord] = []
            for rec, plaintext in zip(req.records, req.plaintexts, strict=True):
                seq += 1
                stream, type_ = rec.stream, rec.type
                head = framed.get((stream, type_))
                if head is None:
                    head = framed[stream, type_] = frame(stream, type_)
                tail = head + stamped
                nonce = nonces[at : at + NONCE_SIZE]
                at += NONCE_SIZE
                ct = encrypt(nonce, plaintext, event_ad_framed(seq, tail))
                link = chain_hash_framed(prev, seq, tail, nonce, ct)
                event_rows.append((seq, stream, type_, stamp, nonce, ct, prev, link))
                committed.append(CommittedRecord(seq, stream, type_, rec.data, now, link))
                prev = link
            op = req.operation
            if op is not None:
                assert req.result_plaintext is not None
                ad = operation_ad(op.op_id, op.command, op.params_digest, seq)
                nonce, ct = seal(req.result_plaintext, ad)
                op_rows.append((op.op_id, op.command, op.params_digest, seq, nonce, ct))
            out.append(committed)
        if not event_rows and not op_rows:
            return Staged(out, None)
        tip = Head(self._tip.commits + 1, seq, prev)
        conn = self._conn
        with self._rolled_back_on_error(has_operations=bool(op_rows)):
            conn.execute("BEGIN")
            insert_events(conn, event_rows)
            if op_rows:
                conn.executemany(_INSERT_OPERATION, op_rows)
            conn.execute("UPDATE meta SET value = ? WHERE name = 'commits'", (str(tip.commits),))
        return Staged(out, tip, bool(op_rows))

    def finish_staged(
        self, staged: Staged, *, sync_head: bool = True
    ) -> list[list[CommittedRecord]]:
        """Commit what :meth:`stage_prepared` wrote (durably: the fsync is here), or roll it
        back and raise; returns the committed records of each request.

        With ``sync_head`` the head file is written before returning (if that fails,
        :class:`JournalError` is raised although the records are durable); the journal
        actor passes False and writes the head itself after acknowledging, so the head's
        fsync is not on the acknowledgement path."""
        if staged.tip is None:
            return staged.records
        with self._rolled_back_on_error(has_operations=staged.has_operations):
            self._conn.execute("COMMIT")
        self._tip = staged.tip
        if sync_head:
            self.write_head()
        return staged.records

    def abandon_staged(self, staged: Staged) -> None:
        """Roll back what :meth:`stage_prepared` wrote (when it is still open)."""
        if staged.tip is not None and self._conn.in_transaction:
            with sqlite_errors(self.path, "roll back a batch"):
                self._conn.execute("ROLLBACK")

    @contextlib.contextmanager
    def _rolled_back_on_error(self, *, has_operations: bool) -> Iterator[None]:
        """Roll the open transaction back when the block raises; a database error becomes
        :class:`OperationConflict` (a recorded operation) or a translated journal error."""
        conn = self._conn
        try:
            try:
                yield
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        except sqlite3.DatabaseError as exc:
            if has_operations and isinstance(exc, sqlite3.IntegrityError):
                raise OperationConflict(
                    "an operation in this batch is already recorded; nothing was written"
                ) from exc
            raise translate_sqlite_error(exc, self.path, "commit a batch") from exc

    def write_head(self) -> None:
        """Record the committed position in ``journal.head`` (fsynced) unless it is there.

        Safe to call from another thread than commits: it writes a position that is already
        durable in the database, so the head may trail the database but never lead it.
        """
        head_file = self._writer()
        with self._head_lock:
            tip = self._tip
            if tip.commits <= self._head_written.commits:
                return
            try:
                head_file.write(tip)
            except OSError as exc:
                raise JournalError(
                    "the journal committed but journal.head could not be updated",
                    details={"errno": exc.errno},
                ) from exc
            self._head_written = tip

    # ---- reading ---------------------------------------------------------------------

    def read(self, after_seq: int = 0) -> Iterator[CommittedRecord]:
        """Yield committed records after ``after_seq`` in order, checking chain and bindings.

        Raises :class:`JournalCorrupt` at the first record that is missing, breaks the hash
        chain or does not decrypt with its binding.
        """
        if after_seq < 0:
            raise ValueError("after_seq must be >= 0")
        prev = GENESIS_HASH if after_seq == 0 else self._hash_at(after_seq)
        if prev is None:
            return
        expected = after_seq + 1
        while True:
            with sqlite_errors(self.path, "read events"):
                rows = self._conn.execute(_SELECT_EVENTS, (expected, _READ_CHUNK)).fetchall()
            if not rows:
                return
            for row in rows:
                if row[0] != expected:
                    raise JournalCorrupt(f"event {expected} is missing from the journal")
                if not link_ok(row, prev):
                    raise JournalCorrupt(f"event {expected} breaks the hash chain")
                record = open_event(self._sealer, row)
                yield record
                prev = record.hash
                expected += 1

    def _hash_at(self, seq: int) -> str | None:
        with sqlite_errors(self.path, "read events"):
            row = self._conn.execute("SELECT hash FROM events WHERE seq = ?", (seq,)).fetchone()
        return None if row is None else str(row[0])

    def get_operation(self, op_id: str) -> Operation | None:
        """The recorded operation ``op_id`` with its decrypted result, or ``None``."""
        with sqlite_errors(self.path, "read operations"):
            row = self._conn.execute(
                "SELECT command, params_digest, seq, nonce, ciphertext FROM operations"
                " WHERE op_id = ?",
                (op_id,),
            ).fetchone()
        if row is None:
            return None
        command, params_digest, seq, nonce, ciphertext = row
        result = open_operation(self._sealer, op_id, command, params_digest, seq, nonce, ciphertext)
        return Operation(op_id, command, params_digest, result)

    def operation_digests(self) -> dict[str, str]:
        """``op_id -> params_digest`` of every recorded operation (no decryption)."""
        with sqlite_errors(self.path, "read operations"):
            rows = self._conn.execute("SELECT op_id, params_digest FROM operations").fetchall()
        return {str(op_id): str(d) for op_id, d in rows}

    # ---- snapshots -------------------------------------------------------------------

    def seal_snapshot(self, seq: int, version: int, state: Mapping[str, Any]) -> SealedSnapshot:
        """Encode and encrypt a snapshot without touching the database (any thread)."""
        return self.seal_snapshot_json(seq, version, encode_payload(state, "the snapshot state"))

    def seal_snapshot_json(self, seq: int, version: int, state_json: bytes) -> SealedSnapshot:
        """Encrypt a snapshot whose state is given as its canonical JSON (any thread)."""
        *_, sealed = self.seal_snapshot_json_steps(seq, version, state_json)
        assert sealed is not None
        return sealed

    def seal_snapshot_json_steps(
        self, seq: int, version: int, state_json: bytes
    ) -> Iterator[SealedSnapshot | None]:
        """:meth:`seal_snapshot_json` in steps that each hash or encrypt at most
        :data:`~._snapseal.SEAL_STEP` bytes: None after each step, the sealed snapshot last.

        The journal actor seals between commits, a step at a time: sealed at once, 1.8 MB
        held the event loop for 6-7 ms, and the acknowledgements waiting meanwhile were
        half of those past the p99 of ``tools/bench runs``.
        """
        return seal_steps(self._sealer, seq, version, state_json)

    def write_snapshot(self, sealed: SealedSnapshot) -> None:
        """Write a sealed snapshot durably and drop all but the newest few.

        It is a file of its own (:mod:`._snapfiles`), not a database row: it may be written
        from any thread while another commits, and no commit waits for it.
        """
        self._writer()
        if sealed.seq > self._tip.seq:
            raise JournalError(f"cannot snapshot seq {sealed.seq}: the journal ends earlier")
        write_snapshot_file(self.home, sealed.seq, sealed.nonce, sealed.ciphertext, KEEP_SNAPSHOTS)

    def save_snapshot(self, seq: int, version: int, state: Mapping[str, Any]) -> None:
        """Store the projection ``state`` (of projection ``version``) as of event ``seq``."""
        self.write_snapshot(self.seal_snapshot(seq, version, state))

    def stored_snapshots(self) -> Iterator[tuple[int, bytes, bytes]]:
        """``(seq, nonce, ciphertext)`` of every stored snapshot, newest first: the files and
        the rows an older journal wrote (a file first where both have a seq). A file is read
        only when the iteration reaches it."""
        with sqlite_errors(self.path, "read snapshots"):
            rows = self._conn.execute(
                "SELECT seq, nonce, ciphertext FROM snapshots ORDER BY seq, snapshot_id"
            ).fetchall()
        for seq, load in reversed(with_rows(snapshot_files(self.home), rows)):
            yield seq, *load()

    def latest_snapshot(self, version: int) -> tuple[int, Mapping[str, Any]] | None:
        """``(seq, state)`` of the newest snapshot of projection ``version``, or ``None``.

        Snapshots of other versions are skipped; one that does not decrypt, or whose content
        does not match its row or checksum, raises :class:`JournalCorrupt`.
        """
        for seq, nonce, ciphertext in self.stored_snapshots():
            snap = open_snapshot(self._sealer, seq, nonce, ciphertext)
            if snap.version != version:
                continue
            if seq > self._tip.seq:
                raise JournalCorrupt(f"a snapshot at seq {seq} is ahead of the journal")
            return seq, snap.state
        return None

    def delete_snapshots(self) -> int:
        """Delete every snapshot (files and older rows); returns how many there were."""
        self._writer()
        with sqlite_errors(self.path, "delete snapshots"), self._db.atomic():
            cursor = self._conn.execute("DELETE FROM snapshots")
        return cursor.rowcount + delete_snapshot_files(self.home)

    # ---- maintenance -----------------------------------------------------------------

    def checkpoint(self) -> None:
        """Run a passive WAL checkpoint on a connection of its own (never blocks commits)."""
        self._writer()
        with self._ckpt_lock, sqlite_errors(self.path, "checkpoint"):
            if self._closed:
                return
            if self._ckpt_conn is None:
                self._ckpt_conn = sqlite3.connect(
                    str(self.path), isolation_level=None, check_same_thread=False
                )
                self._ckpt_conn.execute("PRAGMA busy_timeout = 5000")
                self._ckpt_conn.execute("PRAGMA synchronous = FULL")
            self._ckpt_conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()

    def finish_checkpoint(self) -> bool:
        """Checkpoint on the writer's own connection, between two commits, what
        :meth:`checkpoint` left (the frames of commits made meanwhile); True when every
        frame of the WAL is now in the database, so the next commit writes the WAL from
        its start.

        SQLite starts the WAL over only in a transaction that began with every frame
        copied. Beside a steady stream of commits a checkpoint on another connection never
        leaves it so, and at 5,000 events/s the WAL grew by ~3 MB/s without bound, each
        commit writing to newly allocated blocks. The caller holds the writer role (no
        batch staged), so no commit comes in meanwhile: only a reader can keep frames back.
        """
        self._writer()
        if self._conn.in_transaction:
            raise JournalError("a batch is staged; finish or abandon it first")
        with sqlite_errors(self.path, "checkpoint"):
            row = self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        busy, frames, copied = row
        return not busy and copied == frames

    def close(self) -> None:
        """Bring the head up to date, close the connections, release the writer lock.

        Idempotent.
        """
        if self._closed:
            return
        try:
            if self._head_file is not None:
                self.write_head()
        finally:
            with self._ckpt_lock:
                self._closed = True
                if self._ckpt_conn is not None:
                    self._ckpt_conn.close()
            self._conn.close()
            if self._head_file is not None:
                self._head_file.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _writer(self) -> HeadFile:
        if self._closed:
            raise JournalError("the journal is closed")
        if self._head_file is None:
            raise JournalError("the journal was opened read-only")
        return self._head_file
