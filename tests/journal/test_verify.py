"""verify_journal: chain, bindings, head and replay checks, strictly read-only."""

from __future__ import annotations

import os
import sqlite3
from typing import TYPE_CHECKING

import pytest

from braid_actors.errors import JournalError, WrongKey
from braid_actors.journal import Journal, NewRecord, Operation, verify_journal
from braid_actors.journal._crypto import chain_hash

from ._helpers import CountProjector, assert_untouched, file_hashes, rec

if TYPE_CHECKING:
    from pathlib import Path

SECRET = "secret-payload-c0ffee"


@pytest.fixture
def written(home: Path, key: bytes) -> Path:
    """A closed journal with 5 events, an operation and a snapshot at seq 3."""
    with Journal.open(home, key) as j:
        j.append([([rec(1, type_="a"), rec(2, type_="b", text=SECRET)], None)])
        j.append([([rec(3, type_="a")], Operation("op", "cmd", "sha256:x", {"r": SECRET}))])
        j.save_snapshot(3, CountProjector.version, {"a": 2, "b": 1})
        j.append([([rec(4, type_="b"), rec(5, type_="a")], None)])
    return home


def edit(home: Path, *statements: str) -> None:
    conn = sqlite3.connect(home / "journal.sqlite3", isolation_level=None)
    try:
        for sql in statements:
            conn.execute(sql)
    finally:
        conn.close()


def rechain(home: Path) -> None:
    """Recompute every hash-chain link, as a forger who rewrites the chain would."""
    conn = sqlite3.connect(home / "journal.sqlite3", isolation_level=None)
    try:
        rows = conn.execute(
            "SELECT seq, stream, type, committed_at, nonce, ciphertext FROM events ORDER BY seq"
        ).fetchall()
        prev = "sha256:" + "0" * 64
        for seq, stream, type_, at, nonce, ct in rows:
            link = chain_hash(prev, seq, stream, type_, at, nonce, ct)
            conn.execute(
                "UPDATE events SET prev_hash = ?, hash = ? WHERE seq = ?", (prev, link, seq)
            )
            prev = link
    finally:
        conn.close()


def test_clean_journal_verifies(written: Path, key: bytes) -> None:
    """An untouched journal has no fault, and the replay matches the snapshot."""
    report = verify_journal(written, key, CountProjector())
    assert report.ok, report.render()
    assert (report.events, report.last_seq, report.operations) == (5, 5, 1)
    assert report.chain_ok and report.decrypt_ok
    assert report.snapshots_checked == 1
    assert report.projection_checksum == CountProjector().checksum({"a": 3, "b": 2})
    assert "journal verification: OK" in report.render()


def test_without_projector_nothing_is_replayed(written: Path, key: bytes) -> None:
    """Without a projector there is no projection checksum, the snapshot is still decrypted."""
    report = verify_journal(written, key)
    assert report.ok
    assert report.projection_checksum is None
    assert report.snapshots_checked == 1


def test_swapped_ciphertexts_fail_their_binding(written: Path, key: bytes) -> None:
    """Ciphertexts swapped between rows fail decryption even with the chain rewritten."""
    edit(
        written,
        "CREATE TEMP TABLE t AS SELECT seq, nonce, ciphertext FROM events WHERE seq IN (1, 3)",
        "UPDATE events SET nonce = (SELECT nonce FROM t WHERE t.seq = 4 - events.seq),"
        " ciphertext = (SELECT ciphertext FROM t WHERE t.seq = 4 - events.seq)"
        " WHERE seq IN (1, 3)",
    )
    rechain(written)
    report = verify_journal(written, key)
    assert not report.ok
    assert report.chain_ok  # the forger fixed the chain ...
    assert not report.decrypt_ok  # ... but the associated data still binds each row
    assert any("event 1 does not decrypt" in f for f in report.faults)
    assert any("event 3 does not decrypt" in f for f in report.faults)


def test_renamed_stream_fails_its_binding(written: Path, key: bytes) -> None:
    """Changing a plaintext column (stream) breaks decryption of that row."""
    edit(written, "UPDATE events SET stream = 'elsewhere' WHERE seq = 2")
    rechain(written)
    report = verify_journal(written, key)
    assert report.faults == (
        "event 2 does not decrypt with its binding (the row was altered or moved)",
        # the rewritten chain no longer ends at the hash the head file witnessed
        "the database and journal.head disagree about the last event",
    )


def test_edited_row_breaks_the_chain(written: Path, key: bytes) -> None:
    """A row edited with raw SQL is reported as a chain break at that seq."""
    edit(written, "UPDATE events SET prev_hash = hash WHERE seq = 4")
    report = verify_journal(written, key)
    assert not report.ok and not report.chain_ok
    assert report.decrypt_ok
    assert report.faults == ("event 4 breaks the hash chain",)


def test_deleted_event_is_a_gap(written: Path, key: bytes) -> None:
    """A missing row is reported as a sequence gap and a chain break."""
    edit(written, "DELETE FROM events WHERE seq = 2")
    report = verify_journal(written, key)
    assert not report.chain_ok
    assert any("not contiguous" in f for f in report.faults)
    assert any("event 3 breaks the hash chain" in f for f in report.faults)


def test_snapshot_that_disagrees_with_the_replay(home: Path, key: bytes) -> None:
    """A snapshot whose state is not the fold of the events at its seq is reported."""
    with Journal.open(home, key) as j:
        j.append([([rec(1, type_="a"), rec(2, type_="a")], None)])
        j.save_snapshot(2, CountProjector.version, {"a": 3})
        j.save_snapshot(2, 99, {"other": "version, not compared"})
    report = verify_journal(home, key, CountProjector())
    assert report.snapshots_checked == 1
    assert report.faults == (
        "the snapshot at seq 2 (projection version 1) does not match a replay of the journal",
    )


def test_a_moved_or_truncated_snapshot_file_is_reported(written: Path, key: bytes) -> None:
    """A snapshot file renamed to another seq does not decrypt with its binding, and one cut
    short is truncated: both are faults, and verify still writes nothing."""
    folder = written / "snapshots"
    (name,) = os.listdir(folder)
    (folder / name).rename(folder / name.replace(f"{3:020d}", f"{4:020d}"))
    before = file_hashes(written) | file_hashes(folder)
    report = verify_journal(written, key, CountProjector())
    assert not report.decrypt_ok
    assert any("the snapshot at seq 4 does not decrypt" in f for f in report.faults)
    assert_untouched(before, file_hashes(written) | file_hashes(folder))
    (moved,) = os.listdir(folder)
    (folder / moved).write_bytes(b"x" * 20)
    report = verify_journal(written, key)
    assert any("the snapshot at seq 4 is truncated" in f for f in report.faults)


def test_tampered_operation_result_is_reported(written: Path, key: bytes) -> None:
    """An operation row whose binding changed does not decrypt."""
    edit(written, "UPDATE operations SET params_digest = 'sha256:forged'")
    report = verify_journal(written, key)
    assert not report.decrypt_ok
    assert report.faults == ("the result of operation op does not decrypt with its binding",)


def test_faults_never_show_payloads(written: Path, key: bytes) -> None:
    """Fault sentences and the rendering name rows, never payload contents."""
    edit(written, "UPDATE events SET type = 'x' WHERE seq = 2", "UPDATE operations SET seq = 9")
    report = verify_journal(written, key, CountProjector())
    assert not report.ok
    assert SECRET not in report.render()


def test_verify_never_writes(written: Path, key: bytes) -> None:
    """Verification leaves every file byte-identical, for clean and faulty journals alike."""
    before = file_hashes(written)
    verify_journal(written, key, CountProjector())
    assert_untouched(before, file_hashes(written))
    edit(written, "UPDATE events SET prev_hash = hash WHERE seq = 4")
    before = file_hashes(written)
    assert not verify_journal(written, key, CountProjector()).ok
    assert_untouched(before, file_hashes(written))


def test_verify_while_the_writer_has_an_unchecked_wal(home: Path, key: bytes) -> None:
    """Verifying a live journal sees committed WAL content and changes neither file."""
    with Journal.open(home, key) as j:
        j.append([([rec(1), rec(2)], None)])
        before = file_hashes(home)
        report = verify_journal(home, key)
        assert report.ok and report.events == 2
        assert_untouched(before, file_hashes(home))


def test_verify_with_the_wrong_key_raises(written: Path) -> None:
    """The wrong key is not a fault of the journal: it raises WrongKey."""
    with pytest.raises(WrongKey):
        verify_journal(written, os.urandom(32))


def test_verify_of_a_missing_journal_raises(home: Path, key: bytes) -> None:
    """There is nothing to verify without a database, and nothing is created."""
    with pytest.raises(JournalError):
        verify_journal(home, key)
    assert not home.exists()


def test_replay_stops_at_an_undecryptable_event(written: Path, key: bytes) -> None:
    """With a projector, an event that does not open stops the replay and is reported."""
    edit(written, "UPDATE events SET type = 'forged' WHERE seq = 2")
    rechain(written)
    report = verify_journal(written, key, CountProjector())
    assert report.projection_checksum is None
    assert "the replay stopped at event 2, which does not decrypt" in report.faults


def test_new_record_payload_types_survive_verification(home: Path, key: bytes) -> None:
    """Unicode, nesting and numbers round-trip through encryption and verification."""
    data = {"text": "ünïcødé ✓", "nested": {"list": [1, 2.5, None, True]}, "big": 2**60}
    with Journal.open(home, key) as j:
        j.append([([NewRecord("s", "t", data)], None)])
        assert next(j.read()).data == data
    assert verify_journal(home, key).ok
