"""Opening a damaged journal fails clearly and changes nothing."""

from __future__ import annotations

import os
import shutil
import sqlite3
from typing import TYPE_CHECKING

import pytest

from braid_actors.errors import JournalCorrupt, WrongKey
from braid_actors.journal import Journal, verify_journal

from ._helpers import assert_untouched, file_hashes, rec

if TYPE_CHECKING:
    from pathlib import Path

DB = "journal.sqlite3"
WAL = "journal.sqlite3-wal"
HEAD = "journal.head"


def filled(home: Path, key: bytes, batches: int = 3) -> None:
    with Journal.open(home, key) as j:
        for b in range(batches):
            j.append([([rec(b * 10 + i, text="x" * 500) for i in range(10)], None)])


def copy_with_unchecked_wal(home: Path, key: bytes, dest: Path) -> None:
    """Copy db + WAL + head while a connection keeps the WAL un-checkpointed."""
    with Journal.open(home, key) as j:
        for b in range(3):
            j.append([([rec(b * 10 + i, text="y" * 500) for i in range(10)], None)])
        dest.mkdir()
        for name in (DB, WAL, HEAD):
            shutil.copy2(home / name, dest / name)
    assert (dest / WAL).stat().st_size > 0


def test_wrong_key_is_refused_before_anything_is_written(home: Path, key: bytes) -> None:
    """Opening with another key raises WrongKey and leaves every file byte-identical."""
    filled(home, key)
    before = file_hashes(home)
    with pytest.raises(WrongKey) as info:
        Journal.open(home, os.urandom(32))
    assert info.value.code == "journal_wrong_key"
    assert_untouched(before, file_hashes(home))
    with Journal.open(home, key) as j:  # the right key still opens it
        assert j.last_seq == 30


def test_corrupt_page_is_reported_not_repaired(home: Path, key: bytes) -> None:
    """A damaged B-tree page gives JournalCorrupt; no repair, no new file, bytes unchanged."""
    filled(home, key)
    conn = sqlite3.connect(f"file:{home / DB}?mode=ro", uri=True)
    try:
        root = conn.execute("SELECT rootpage FROM sqlite_schema WHERE name = 'events'").fetchone()
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    finally:
        conn.close()
    with open(home / DB, "r+b") as f:
        f.seek((root[0] - 1) * page_size)
        f.write(b"\xa5" * page_size)
    before = file_hashes(home)
    with pytest.raises(JournalCorrupt) as info:
        Journal.open(home, key)
    assert info.value.code == "journal_corrupt"
    assert "damaged" in info.value.message
    assert_untouched(before, file_hashes(home))
    report = verify_journal(home, key)
    assert not report.ok
    assert any("damaged" in fault for fault in report.faults)
    assert_untouched(before, file_hashes(home))


def test_truncated_wal_is_detected(home: Path, key: bytes, tmp_path: Path) -> None:
    """A WAL that lost its last transaction makes open refuse: committed events are missing."""
    copy = tmp_path / "copy"
    copy_with_unchecked_wal(home, key, copy)
    wal = copy / WAL
    os.truncate(wal, wal.stat().st_size - 100)  # tear the last commit frame
    before = file_hashes(copy)
    with pytest.raises(JournalCorrupt, match="committed events are missing") as info:
        Journal.open(copy, key)
    assert info.value.details["db_seq"] == 20
    assert_untouched(before, file_hashes(copy))
    with pytest.raises(JournalCorrupt, match="committed events are missing"):
        Journal.open(copy, key, readonly=True)
    report = verify_journal(copy, key)
    assert not report.ok
    assert report.last_seq == 20
    assert any("committed events are missing" in fault for fault in report.faults)
    assert_untouched(before, file_hashes(copy))


def test_intact_wal_copy_opens(home: Path, key: bytes, tmp_path: Path) -> None:
    """The same copy with its WAL intact opens with every event: the check has no false alarm."""
    copy = tmp_path / "copy"
    copy_with_unchecked_wal(home, key, copy)
    with Journal.open(copy, key) as j:
        assert j.last_seq == 30
        assert len(list(j.read())) == 30


def test_database_ahead_of_its_head_is_not_a_fault(home: Path, key: bytes) -> None:
    """A crash between the commit and the head write (db ahead of head) opens normally."""
    filled(home, key, batches=1)
    stale_head = (home / HEAD).read_bytes()
    with Journal.open(home, key) as j:
        j.append([([rec(99)], None)])
    (home / HEAD).write_bytes(stale_head)  # as if the head write never happened
    with Journal.open(home, key) as j:
        assert j.last_seq == 11
    assert verify_journal(home, key).ok
    assert (home / HEAD).read_bytes() != stale_head  # brought forward by the writer


def test_one_torn_head_slot_is_tolerated(home: Path, key: bytes) -> None:
    """A torn write damages one slot; the other slot (never ahead of the db) still serves."""
    filled(home, key)
    with open(home / HEAD, "r+b") as f:
        f.write(b"\0" * 64)  # tear slot 0
    with Journal.open(home, key) as j:
        assert j.last_seq == 30


def test_missing_head_is_refused(home: Path, key: bytes) -> None:
    """Without journal.head the loss check cannot run, so a used journal does not open."""
    filled(home, key)
    (home / HEAD).unlink()
    before = file_hashes(home)
    with pytest.raises(JournalCorrupt, match="missing"):
        Journal.open(home, key)
    assert_untouched(before, file_hashes(home))


def test_damaged_head_is_refused(home: Path, key: bytes) -> None:
    """A head file with no valid slot is refused for a journal that has commits."""
    filled(home, key)
    (home / HEAD).write_bytes(b"\x01" * 256)
    before = file_hashes(home)
    with pytest.raises(JournalCorrupt, match="damaged"):
        Journal.open(home, key)
    assert_untouched(before, file_hashes(home))


def test_missing_database_is_not_recreated(home: Path, key: bytes) -> None:
    """A head that records commits without a database refuses to start a fresh journal."""
    filled(home, key)
    (home / DB).unlink()
    with pytest.raises(JournalCorrupt, match="missing"):
        Journal.open(home, key)
    assert not (home / DB).exists()


def test_head_rolled_back_by_hand_is_refused(home: Path, key: bytes) -> None:
    """The head must name an event the database still holds with the same hash."""
    filled(home, key, batches=2)
    with Journal.open(home, key) as j:
        j.append([([rec(1)], None)])
    conn = sqlite3.connect(home / DB, isolation_level=None)
    try:
        conn.execute("UPDATE events SET hash = 'sha256:' || hex(randomblob(32)) WHERE seq = 21")
    finally:
        conn.close()
    with pytest.raises(JournalCorrupt, match="disagree"):
        Journal.open(home, key)
