"""The synchronous store: encrypted, chained, transactional, with snapshots and a ledger."""

from __future__ import annotations

import os
import sqlite3
import stat
from datetime import UTC
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from braid_actors.errors import BadRequest, JournalCorrupt, JournalError, OperationConflict
from braid_actors.journal import Journal, NewRecord, Operation, verify_journal
from braid_actors.journal._crypto import (
    GENESIS_HASH,
    chain_hash,
    chain_hash_framed,
    event_ad,
    event_ad_framed,
    frame,
    snapshot_ad,
)
from braid_actors.journal._encoding import canonical_bytes, prepare_append
from braid_actors.journal._snapfiles import SNAPSHOT_DIR, snapshot_files
from braid_actors.journal._snapseal import SealedSnapshot
from braid_actors.journal._store import KEEP_SNAPSHOTS
from braid_actors.model._canonical import canonical_json, digest, digest_bytes

from ._helpers import rec

if TYPE_CHECKING:
    from pathlib import Path


def raw(home: Path) -> sqlite3.Connection:
    return sqlite3.connect(home / "journal.sqlite3", isolation_level=None)


def commits(home: Path) -> int:
    conn = raw(home)
    try:
        return int(conn.execute("SELECT value FROM meta WHERE name = 'commits'").fetchone()[0])
    finally:
        conn.close()


def test_append_and_read_round_trip(journal: Journal) -> None:
    """Appended records come back in order, decrypted, chained, with contiguous seqs."""
    out = journal.append(
        [([rec(1), rec(2, stream="other")], None), ([NewRecord("s", "u", {"x": [1, "é"]})], None)]
    )
    assert [[r.seq for r in group] for group in out] == [[1, 2], [3]]
    read = list(journal.read())
    assert read == [r for group in out for r in group]
    assert read[2].data == {"x": [1, "é"]}
    assert read[0].committed_at.tzinfo is UTC
    assert read[0].committed_at == read[2].committed_at  # one transaction, one time
    prev = GENESIS_HASH
    for r in read:
        assert r.hash.startswith("sha256:") and r.hash != prev
        prev = r.hash
    assert journal.last_seq == 3 and journal.last_hash == read[-1].hash
    assert [r.seq for r in journal.read(after_seq=2)] == [3]
    assert list(journal.read(after_seq=3)) == []


def test_a_batch_is_one_transaction(journal: Journal, home: Path) -> None:
    """Every request of a batch is written by a single commit."""
    journal.append([([rec(1)], None), ([rec(2)], None), ([], Operation("o", "c", "d", {}))])
    assert commits(home) == 1
    journal.append([([rec(3)], None)])
    assert commits(home) == 2


def visible_seqs(home: Path) -> list[int]:
    """Event sequence numbers another connection sees (what is committed)."""
    conn = raw(home)
    try:
        return [row[0] for row in conn.execute("SELECT seq FROM events ORDER BY seq")]
    finally:
        conn.close()


def test_staged_rows_are_invisible_until_finished(journal: Journal, home: Path) -> None:
    """A staged batch sits in an open transaction: no other connection sees it and the
    journal's position does not move until ``finish_staged`` commits it."""
    journal.append([([rec(1)], None)])
    staged = journal.stage_prepared([prepare_append([rec(2), rec(3)], None)])
    assert visible_seqs(home) == [1]
    assert journal.last_seq == 1 and commits(home) == 1
    out = journal.finish_staged(staged)
    assert [[r.seq for r in group] for group in out] == [[2, 3]]
    assert visible_seqs(home) == [1, 2, 3]
    assert journal.last_seq == 3 and journal.last_hash == out[0][-1].hash
    assert commits(home) == 2


def test_an_abandoned_stage_leaves_the_journal_as_it_was(
    journal: Journal, home: Path, key: bytes
) -> None:
    """Rolling a staged batch back writes nothing; the next batch chains from the old tip."""
    journal.append([([rec(1)], None)])
    tip = (journal.last_seq, journal.last_hash)
    staged = journal.stage_prepared([prepare_append([rec(2)], Operation("o", "c", "d", {}))])
    journal.abandon_staged(staged)
    assert (journal.last_seq, journal.last_hash) == tip
    assert journal.get_operation("o") is None
    journal.append([([rec(9)], None)])
    assert [(r.seq, r.data["n"]) for r in journal.read()] == [(1, 1), (2, 9)]
    journal.close()
    report = verify_journal(home, key)
    assert report.ok, report.render()


def test_state_survives_reopening(home: Path, key: bytes) -> None:
    """Closing and reopening keeps the records, the tip and the ledger."""
    with Journal.open(home, key) as j:
        j.append([([rec(1), rec(2)], Operation("op", "cmd", "sha256:p", {"ok": 1}))])
        tip = (j.last_seq, j.last_hash)
    with Journal.open(home, key) as j:
        assert (j.last_seq, j.last_hash) == tip
        assert [r.data["n"] for r in j.read()] == [1, 2]
        assert j.get_operation("op") == Operation("op", "cmd", "sha256:p", {"ok": 1})
        j.append([([rec(3)], None)])
        assert [r.seq for r in j.read()] == [1, 2, 3]


def test_payloads_are_encrypted_at_rest(home: Path, key: bytes) -> None:
    """No plaintext of data, results or snapshots appears in the database or WAL bytes."""
    markers = ["marker-data-7f3a", "marker-result-91bc", "marker-snapshot-55de"]
    with Journal.open(home, key) as j:
        j.append(
            [
                (
                    [NewRecord("s", "t", {"text": markers[0]})],
                    Operation("o", "c", "d", {"r": markers[1]}),
                )
            ]
        )
        j.save_snapshot(1, 1, {"state": markers[2]})
        live = b"".join(p.read_bytes() for p in home.iterdir() if p.is_file())
        assert (home / "journal.sqlite3-wal").stat().st_size > 0
    at_rest = b"".join(p.read_bytes() for p in home.iterdir() if p.is_file())
    for marker in markers:
        assert marker.encode() not in live
        assert marker.encode() not in at_rest


def test_unjsonable_payload_writes_nothing(journal: Journal, home: Path) -> None:
    """A payload that is not JSON-compatible is a BadRequest and no part of the batch lands."""
    with pytest.raises(BadRequest):
        journal.append([([rec(1)], None), ([NewRecord("s", "t", {"x": object()})], None)])
    with pytest.raises(BadRequest):
        journal.append([([rec(1)], None), ([NewRecord("s", "t", {"x": float("nan")})], None)])
    assert journal.last_seq == 0
    assert commits(home) == 0


def test_operation_ledger(journal: Journal) -> None:
    """Operations are found by id with their decrypted result; digests list every id."""
    journal.append([([rec(1)], Operation("a", "create", "sha256:1", {"id": "x"}))])
    journal.append([([], Operation("b", "delete", "sha256:2", {}))])
    assert journal.get_operation("a") == Operation("a", "create", "sha256:1", {"id": "x"})
    assert journal.get_operation("missing") is None
    assert journal.operation_digests() == {"a": "sha256:1", "b": "sha256:2"}


def test_reused_operation_id_writes_nothing(journal: Journal) -> None:
    """Appending an operation id that is already recorded is refused as a whole batch."""
    journal.append([([rec(1)], Operation("a", "c", "d", {}))])
    with pytest.raises(OperationConflict):
        journal.append([([rec(2)], None), ([rec(3)], Operation("a", "c", "d", {}))])
    assert journal.last_seq == 1
    assert [r.seq for r in journal.read()] == [1]
    journal.append([([rec(2)], None)])  # the store is still usable and consistent
    assert [r.seq for r in journal.read()] == [1, 2]


def test_snapshot_round_trip(journal: Journal) -> None:
    """A saved snapshot comes back for its version at its seq."""
    journal.append([([rec(1), rec(2)], None)])
    journal.save_snapshot(2, 7, {"count": 2, "names": ["a", "b"]})
    assert journal.latest_snapshot(7) == (2, {"count": 2, "names": ["a", "b"]})


def test_a_batch_of_any_size_is_written_whole_and_in_order(
    journal: Journal, home: Path, key: bytes
) -> None:
    """Rows go in as multi-row INSERTs of power-of-two chunks: batches around the chunk
    sizes come back complete, in order, chained, and the journal verifies clean."""
    sizes = [1, 2, 3, 127, 128, 129, 255, 300]
    n = 0
    for size in sizes:
        got = journal.append([([rec(n + i) for i in range(size)], None)])
        assert [r.seq for r in got[0]] == list(range(n + 1, n + size + 1))
        n += size
    back = list(journal.read())
    assert [r.seq for r in back] == list(range(1, n + 1))
    assert [r.data["n"] for r in back] == list(range(n))
    journal.close()
    report = verify_journal(home, key)
    assert report.ok, report.render()
    assert report.events == n


def _seal_raw(journal: Journal, seq: int, plaintext: bytes) -> None:
    """Store a snapshot whose decrypted payload is exactly ``plaintext``."""
    nonce, ciphertext = journal._sealer.seal(plaintext, snapshot_ad(seq))
    journal.write_snapshot(SealedSnapshot(seq, nonce, ciphertext))


def test_snapshot_checksum_is_checked_in_either_layout(journal: Journal) -> None:
    """The checksum is checked on the state's own bytes when the payload is spliced as
    ``seal_snapshot_json`` writes it, and by encoding the state for any other layout: a
    wrong checksum is JournalCorrupt either way, a right one loads either way."""
    journal.append([([rec(1), rec(2)], None)])
    state = {"b": [1, 2], "a": "x"}
    good = digest(state)
    bad = digest({"other": 1})
    spliced = b'{"checksum":"%s","seq":2,"state":%s,"version":7}'
    other = b'{"version": 7, "seq": 2, "checksum": "%s", "state": {"a": "x", "b": [1, 2]}}'
    _seal_raw(journal, 2, spliced % (good.encode(), canonical_json(state)))
    assert journal.latest_snapshot(7) == (2, state)
    _seal_raw(journal, 2, other % good.encode())
    assert journal.latest_snapshot(7) == (2, state)
    # Spliced, the bytes themselves are hashed: a state written with a space (not
    # canonical, so encoding it again would give another digest) matches its own digest.
    loose = b'{"a": "x","b":[1,2]}'
    _seal_raw(journal, 2, spliced % (digest_bytes(loose).encode(), loose))
    assert journal.latest_snapshot(7) == (2, state)
    for layout in (spliced % (bad.encode(), canonical_json(state)), other % bad.encode()):
        _seal_raw(journal, 2, layout)
        with pytest.raises(JournalCorrupt, match="does not match its checksum"):
            journal.latest_snapshot(7)


def test_snapshot_of_another_version_is_ignored(journal: Journal) -> None:
    """latest_snapshot skips snapshots of other projection versions, even newer ones."""
    journal.append([([rec(1), rec(2)], None)])
    journal.save_snapshot(1, 1, {"v": 1})
    journal.save_snapshot(2, 2, {"v": 2})
    assert journal.latest_snapshot(1) == (1, {"v": 1})
    assert journal.latest_snapshot(2) == (2, {"v": 2})
    assert journal.latest_snapshot(3) is None


def test_snapshot_version_lives_only_in_the_ciphertext(journal: Journal, home: Path) -> None:
    """The snapshots table has no plaintext version column for a loader to trust."""
    journal.save_snapshot(0, 5, {})
    conn = raw(home)
    try:
        columns = [row[1] for row in conn.execute("PRAGMA table_info(snapshots)")]
    finally:
        conn.close()
    assert columns == ["snapshot_id", "seq", "nonce", "ciphertext"]


def test_delete_snapshots(journal: Journal) -> None:
    """delete_snapshots removes them all; the events are untouched."""
    journal.append([([rec(1)], None)])
    journal.save_snapshot(1, 1, {"a": 1})
    journal.save_snapshot(1, 2, {"a": 1})
    assert journal.delete_snapshots() == 2
    assert journal.latest_snapshot(1) is None
    assert journal.latest_snapshot(2) is None
    assert [r.seq for r in journal.read()] == [1]


def test_only_the_newest_snapshots_are_kept(journal: Journal, home: Path) -> None:
    """Saving more snapshots keeps the newest few, as files of mode 0600."""
    journal.append([([rec(i) for i in range(6)], None)])
    for seq in range(1, 7):
        journal.save_snapshot(seq, 1, {"at": seq})
    files = snapshot_files(home)
    assert [seq for seq, _path in files] == list(range(7 - KEEP_SNAPSHOTS, 7))
    assert all(stat.S_IMODE(path.stat().st_mode) == 0o600 for _seq, path in files)
    assert stat.S_IMODE((home / SNAPSHOT_DIR).stat().st_mode) == 0o700
    assert journal.latest_snapshot(1) == (6, {"at": 6})


def test_a_snapshot_is_not_written_to_the_database(journal: Journal, home: Path) -> None:
    """A snapshot is a file of its own: the database (its WAL) gets no page of it, so no
    commit waits behind its write."""
    journal.append([([rec(0)], None)])
    conn = raw(home)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()  # the WAL starts empty
        journal.save_snapshot(1, 1, {"blob": os.urandom(400_000).hex()})
        _busy, frames, _done = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        rows = conn.execute("SELECT count(*) FROM snapshots").fetchone()[0]
    finally:
        conn.close()
    assert (frames, rows) == (0, 0)
    assert [seq for seq, _path in snapshot_files(home)] == [1]


def test_a_crash_mid_write_leaves_the_earlier_snapshots(journal: Journal, home: Path) -> None:
    """A temporary file left by a crash is not a snapshot, and the next write removes it."""
    journal.append([([rec(1), rec(2)], None)])
    journal.save_snapshot(1, 1, {"at": 1})
    leftover = home / SNAPSHOT_DIR / f".{2:020d}-{2:010d}.snap.tmp"
    leftover.write_bytes(b"half a snapshot")
    assert journal.latest_snapshot(1) == (1, {"at": 1})
    journal.save_snapshot(2, 1, {"at": 2})
    assert not leftover.exists()
    assert journal.latest_snapshot(1) == (2, {"at": 2})


def test_snapshot_rows_of_an_older_journal_are_still_read(journal: Journal, home: Path) -> None:
    """Journals written before snapshots moved to files kept them as rows: the newest of
    rows and files is the one loaded, and deleting snapshots deletes both."""
    journal.append([([rec(1), rec(2), rec(3)], None)])
    journal.save_snapshot(2, 1, {"at": 2})
    ((_seq, path),) = snapshot_files(home)
    nonce_and_ct = path.read_bytes()
    path.unlink()
    conn = raw(home)
    try:  # what an older journal wrote: the same sealed snapshot, as a row
        conn.execute(
            "INSERT INTO snapshots (seq, nonce, ciphertext) VALUES (2, ?, ?)",
            (nonce_and_ct[:12], nonce_and_ct[12:]),
        )
    finally:
        conn.close()
    assert journal.latest_snapshot(1) == (2, {"at": 2})
    journal.save_snapshot(1, 1, {"at": 1})  # an older seq, as a file
    assert journal.latest_snapshot(1) == (2, {"at": 2})
    journal.save_snapshot(3, 1, {"at": 3})
    assert journal.latest_snapshot(1) == (3, {"at": 3})
    assert journal.delete_snapshots() == 3
    assert journal.latest_snapshot(1) is None


def test_snapshot_ahead_of_the_journal_is_refused(journal: Journal) -> None:
    """A snapshot cannot claim a seq the journal has not reached."""
    journal.append([([rec(1)], None)])
    with pytest.raises(JournalError):
        journal.save_snapshot(2, 1, {})


def test_undecryptable_snapshot_is_corruption(journal: Journal, home: Path) -> None:
    """A snapshot whose ciphertext was moved to another seq raises JournalCorrupt on load."""
    journal.append([([rec(1), rec(2)], None)])
    journal.save_snapshot(1, 1, {"a": 1})
    ((_seq, path),) = snapshot_files(home)
    path.rename(path.with_name(path.name.replace(f"{1:020d}", f"{2:020d}")))
    with pytest.raises(JournalCorrupt, match="seq 2"):
        journal.latest_snapshot(1)


def test_a_truncated_snapshot_file_is_corruption(journal: Journal, home: Path) -> None:
    """A snapshot file too short to hold a nonce and a tag raises JournalCorrupt on load."""
    journal.append([([rec(1)], None)])
    journal.save_snapshot(1, 1, {"a": 1})
    ((_seq, path),) = snapshot_files(home)
    path.write_bytes(path.read_bytes()[:20])
    with pytest.raises(JournalCorrupt, match="truncated"):
        journal.latest_snapshot(1)


def test_read_stops_at_a_broken_chain(journal: Journal, home: Path) -> None:
    """read() raises JournalCorrupt at the first row that breaks the chain."""
    journal.append([([rec(1), rec(2), rec(3)], None)])
    conn = raw(home)
    try:
        conn.execute("UPDATE events SET stream = 'forged' WHERE seq = 2")
    finally:
        conn.close()
    records = journal.read()
    assert next(records).seq == 1
    with pytest.raises(JournalCorrupt, match="event 2"):
        next(records)


def test_second_writer_is_refused(journal: Journal, home: Path, key: bytes) -> None:
    """Only one process may open a journal for writing; read-only opens are fine."""
    journal.append([([rec(1)], None)])
    with pytest.raises(JournalError, match="already open for writing"):
        Journal.open(home, key)
    with Journal.open(home, key, readonly=True) as reader:
        assert [r.seq for r in reader.read()] == [1]
        with pytest.raises(JournalError, match="read-only"):
            reader.append([([rec(2)], None)])


def test_readonly_open_of_a_missing_journal_creates_nothing(home: Path, key: bytes) -> None:
    """A read-only open never creates a journal."""
    with pytest.raises(JournalError, match="no journal"):
        Journal.open(home, key, readonly=True)
    assert not home.exists()


def test_new_files_are_private(journal: Journal, home: Path) -> None:
    """The database, its side files and the head are created with mode 0600."""
    journal.append([([rec(1)], None)])
    for path in home.iterdir():
        assert path.stat().st_mode & 0o077 == 0, path.name


def test_framed_fast_paths_match_the_reference_framing() -> None:
    """The commit path's precomputed framing gives the bytes the module docstring defines."""
    nonce, ct = os.urandom(12), os.urandom(40)
    tail = frame("s", "t", "2026-01-01T00:00:00.000000Z")
    assert event_ad_framed(9, tail) == event_ad(9, "s", "t", "2026-01-01T00:00:00.000000Z")
    assert event_ad(9, "s", "t", "x") == frame("braid.event.v1", 9, "s", "t", "x")
    assert chain_hash_framed(GENESIS_HASH, 9, tail, nonce, ct) == chain_hash(
        GENESIS_HASH, 9, "s", "t", "2026-01-01T00:00:00.000000Z", nonce, ct
    )


_json: st.SearchStrategy[Any] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=40, deadline=None)
@given(st.dictionaries(st.text(), _json, max_size=5))
def test_cached_encoder_is_byte_identical_to_canonical_json(value: dict[str, Any]) -> None:
    """The journal's cached JSON encoder writes exactly model._canonical.canonical_json."""
    assert canonical_bytes(value) == canonical_json(value)
