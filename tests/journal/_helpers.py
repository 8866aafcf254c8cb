"""Test doubles and file helpers for the journal tests."""

from __future__ import annotations

import functools
import hashlib
import queue
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

import trio
import trio.lowlevel

from braid_actors import graph
from braid_actors.errors import BadRequest
from braid_actors.journal import CommittedRecord, Journal, NewRecord
from braid_actors.model import CountingIds

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping, Sequence
    from pathlib import Path

    from braid_actors.journal._store import Staged
    from braid_actors.model import Event

T = TypeVar("T")

SIDE_FILES = ("journal.sqlite3-wal", "journal.sqlite3-shm")


def rec(n: int, *, stream: str = "s", type_: str = "t", **extra: Any) -> NewRecord:
    return NewRecord(stream, type_, {"n": n, **extra})


def file_hashes(home: Path) -> dict[str, str]:
    """sha256 of every file in ``home`` except SQLite's shared-memory index."""
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(home.iterdir())
        if p.is_file() and not p.name.endswith("-shm")
    }


def assert_untouched(before: Mapping[str, str], after: Mapping[str, str]) -> None:
    """Every file that existed is byte-identical; the only new files are empty side files."""
    for name, digest in before.items():
        assert after.get(name) == digest, f"{name} changed"
    empty = hashlib.sha256(b"").hexdigest()
    for name in set(after) - set(before):
        assert name in SIDE_FILES and after[name] == empty, f"{name} was created"


class GatedJournal(Journal):
    """A real journal whose commits each wait until the test releases them."""

    entered: queue.Queue[list[list[CommittedRecord]]]
    gate: threading.Semaphore

    def arm(self) -> GatedJournal:
        self.entered = queue.Queue()
        self.gate = threading.Semaphore(0)
        return self

    def finish_staged(
        self, staged: Staged, *, sync_head: bool = True
    ) -> list[list[CommittedRecord]]:
        self.entered.put(staged.records)
        if not self.gate.acquire(timeout=10):
            self.abandon_staged(staged)
            raise RuntimeError("the test never released this commit")
        return super().finish_staged(staged, sync_head=sync_head)

    async def next_commit(self) -> list[list[CommittedRecord]]:
        """The records of each request of the next commit, once it is inside
        ``finish_staged`` (its rows are written, not yet committed)."""
        get = functools.partial(self.entered.get, timeout=10)
        return await trio.to_thread.run_sync(get)


class RecordingAdmission:
    """Refuses records of type ``bad``; records what it saw and on which thread."""

    def __init__(self) -> None:
        self.admitted: list[list[NewRecord]] = []
        self.committed_batches: list[list[CommittedRecord]] = []
        self.threads: set[int] = set()

    def admit(self, records: Sequence[NewRecord]) -> None:
        self.threads.add(threading.get_ident())
        if any(r.type == "bad" for r in records):
            raise BadRequest("records of type bad are refused")
        self.admitted.append(list(records))

    def committed(self, records: Sequence[CommittedRecord]) -> None:
        self.threads.add(threading.get_ident())
        self.committed_batches.append(list(records))


class CountingAdmission(RecordingAdmission):
    """A read model that counts committed records and can be snapshotted."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def committed(self, records: Sequence[CommittedRecord]) -> None:
        super().committed(records)
        self.count += len(records)

    def snapshot(self) -> tuple[int, Mapping[str, Any]] | None:
        return 1, {"count": self.count}


class CountProjector:
    """Projector for verification: counts records per type."""

    version = 1

    def initial(self) -> dict[str, int]:
        return {}

    def apply(self, state: dict[str, int], record: CommittedRecord) -> dict[str, int]:
        return {**state, record.type: state.get(record.type, 0) + 1}

    def checksum(self, state: dict[str, int]) -> str:
        from braid_actors.model._canonical import digest

        return digest(state)

    def dump(self, state: dict[str, int]) -> Mapping[str, Any]:
        return state


class EventLog:
    """Graph events built with the app's own builders, folded as they are made."""

    def __init__(self) -> None:
        self.state = graph.GraphState()
        self.ids = CountingIds()
        self.events: list[Event] = []
        self._clock = datetime(2026, 1, 1, tzinfo=UTC)

    def at(self) -> datetime:
        """A time one second after the previous one."""
        self._clock += timedelta(seconds=1)
        return self._clock

    def add(self, ev: Event) -> None:
        graph.apply(self.state, ev)
        self.events.append(ev)


async def longest_wait_beside(work: Callable[[], Awaitable[T]]) -> tuple[T, float]:
    """Run ``work`` beside a task that only yields, again and again; ``work``'s result and
    the longest that task waited for its next turn (seconds)."""
    gaps: list[float] = []
    done = trio.Event()

    async def ticker() -> None:
        last = time.perf_counter()
        while not done.is_set():
            await trio.lowlevel.checkpoint()
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ticker)
        result = await work()
        done.set()
    return result, max(gaps)
