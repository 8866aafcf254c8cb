"""The WAL is written from its start again while commits never stop (it does not grow)."""

from __future__ import annotations

import functools
import sqlite3
from typing import TYPE_CHECKING

import pytest
import trio
import trio.lowlevel
import trio.testing

from braid_actors.errors import JournalError
from braid_actors.journal import Journal, JournalHandle, run_journal
from braid_actors.journal._encoding import prepare_append
from braid_actors.journal._inspect import DB_FILE

from ._helpers import rec

if TYPE_CHECKING:
    from pathlib import Path


class ReaderInTheWal(Journal):
    """A reader keeps the first checkpoint from copying the frames after its snapshot (as
    commits made meanwhile do under load), then leaves. Each ``finish_checkpoint`` is
    reported to the trio side."""

    reader: sqlite3.Connection | None = None
    finished: trio.MemorySendChannel[bool]
    token: trio.lowlevel.TrioToken

    def checkpoint(self) -> None:
        super().checkpoint()
        if self.reader is not None:
            self.reader.rollback()
            self.reader.close()
            self.reader = None

    def finish_checkpoint(self) -> bool:
        copied_all = super().finish_checkpoint()
        trio.from_thread.run_sync(self.finished.send_nowait, copied_all, trio_token=self.token)
        return copied_all


def hold_a_read(journal: Journal) -> sqlite3.Connection:
    reader = sqlite3.connect(journal.path, isolation_level=None, check_same_thread=False)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM events").fetchall()
    return reader


async def test_frames_a_checkpoint_left_are_copied_between_commits(
    home: Path, key: bytes, autojump_clock: trio.testing.MockClock
) -> None:
    """A checkpoint that left frames behind is finished on the writer between two commits,
    and the commits after it write the WAL from its start: the file does not grow."""
    # jump only once nothing ran for 20 ms of real time: a thread's query is not idleness
    autojump_clock.autojump_threshold = 0.02
    journal = ReaderInTheWal.open(home, key)
    send, finished = trio.open_memory_channel[bool](10)
    journal.finished, journal.token = send, trio.lowlevel.current_trio_token()
    wal = home / f"{DB_FILE}-wal"
    try:
        journal.append([([rec(0)], None)])
        journal.reader = hold_a_read(journal)
        with trio.fail_after(60):  # 24 checkpoints
            async with trio.open_nursery() as nursery:
                handle: JournalHandle = await nursery.start(
                    functools.partial(
                        run_journal, journal, checkpoint_interval=2.5, head_interval=0.0
                    )
                )
                for n in range(1, 41):  # frames past the reader's snapshot
                    await handle.append([rec(n, pad="x" * 2000)])
                assert await finished.receive() is True
                size = wal.stat().st_size
                for n in range(41, 61):
                    await handle.append([rec(n, pad="x" * 2000)])
                assert wal.stat().st_size == size
                await handle.aclose()
    finally:
        journal.close()
    assert [r.seq for r in Journal.open(home, key).read()] == list(range(1, 62))


def test_finish_checkpoint_refuses_while_a_batch_is_staged(home: Path, key: bytes) -> None:
    """It runs between commits only: with a batch staged it raises and leaves the batch."""
    with Journal.open(home, key) as journal:
        staged = journal.stage_prepared([prepare_append([rec(1)], None)])
        with pytest.raises(JournalError, match="staged"):
            journal.finish_checkpoint()
        journal.finish_staged(staged)
        assert journal.finish_checkpoint() is True
        assert journal.last_seq == 1


def test_a_reader_keeps_frames_back_from_finish_checkpoint(home: Path, key: bytes) -> None:
    """False while a reader keeps frames in the WAL, True once it left."""
    with Journal.open(home, key) as journal:
        journal.append([([rec(0)], None)])
        reader = hold_a_read(journal)
        journal.append([([rec(1)], None)])
        assert journal.finish_checkpoint() is False
        reader.rollback()
        reader.close()
        assert journal.finish_checkpoint() is True
