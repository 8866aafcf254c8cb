"""``tools/bench journal``: how close the journal actor gets to the raw group-commit limit.

Three measurements of 1 KB events, each in a fresh temporary directory:

(a) raw limit: plain ``sqlite3`` with the journal's pragmas (WAL, ``synchronous=FULL``,
    ``wal_autocheckpoint=0``), canonical JSON, AES-GCM with associated data and the SHA-256
    chain, committed in groups of ``--group`` events; no actors, no trio;
(b) the journal actor at saturation: ``--producers`` concurrent tasks, each appending one event
    and awaiting its acknowledgement, again and again;
(c) the journal actor at an offered load of ``--offered`` events/s: the same producers pace
    themselves (each one event every ``producers / offered`` seconds, phases spread evenly)
    and the time from ``append`` to acknowledgement is recorded.

Targets: (b)/(a) >= 0.5 and p99 ack latency <= 5 ms in (c). Figures are printed as measured,
with PASS or MISS; ``--strict`` makes a MISS exit with status 1.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import trio
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from braid_actors.journal import CommittedRecord, Journal, JournalHandle, NewRecord, run_journal
from braid_actors.model._canonical import canonical_json

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from braid_actors.journal._store import Staged

T = TypeVar("T")
RATIO_TARGET = 0.5
P99_TARGET_MS = 5.0


def event_data(i: int) -> dict[str, Any]:
    """A JSON payload whose canonical form is about 1 KB."""
    return {"n": i, "kind": "bench", "text": "lorem ipsum dolor sit amet " * 36}


def raw_limit(directory: Path, seconds: float, group: int) -> tuple[float, int]:
    """(a): events/s of plain sqlite3 + AES-GCM group commit; returns (rate, events)."""
    conn = sqlite3.connect(str(directory / "raw.sqlite3"), isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    conn.execute(
        "CREATE TABLE events (seq INTEGER PRIMARY KEY, stream TEXT, type TEXT, committed_at TEXT,"
        " nonce BLOB, ciphertext BLOB, prev_hash TEXT, hash TEXT)"
    )
    aead = AESGCM(os.urandom(32))
    prev = "0" * 64
    seq = 0
    datas = [event_data(i) for i in range(group)]
    start = time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
        rows = []
        for data in datas:
            seq += 1
            plaintext = canonical_json(data)
            nonce = os.urandom(12)
            ad = b"%d|bench|event|%s" % (seq, stamp.encode())
            ct = aead.encrypt(nonce, plaintext, ad)
            link = hashlib.sha256(prev.encode() + ad + nonce + ct).hexdigest()
            rows.append((seq, "bench", "event", stamp, nonce, ct, prev, link))
            prev = link
        conn.execute("BEGIN")
        conn.executemany("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - start
    conn.close()
    return seq / elapsed, seq


async def saturation(handle: JournalHandle, producers: int, seconds: float) -> tuple[float, int]:
    """(b): events/s acknowledged with ``producers`` tasks appending back to back."""
    acked = 0
    record = NewRecord("bench", "event", event_data(0))
    deadline = time.perf_counter() + seconds

    async def producer() -> None:
        nonlocal acked
        while time.perf_counter() < deadline:
            await handle.append([record])
            acked += 1

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(producers):
            nursery.start_soon(producer)
    return acked / (time.perf_counter() - start), acked


async def paced(
    handle: JournalHandle, producers: int, offered: float, seconds: float, warmup: float
) -> tuple[list[float], float]:
    """(c): ack latencies (seconds) at ``offered`` events/s; returns (latencies, achieved)."""
    interval = producers / offered
    record = NewRecord("bench", "event", event_data(0))
    latencies: list[float] = []
    begin = trio.current_time() + 0.05
    measure_from = begin + warmup
    end = measure_from + seconds
    sent = 0

    async def producer(phase: float) -> None:
        nonlocal sent
        due = begin + phase
        while due < end:
            await trio.sleep_until(due)
            t0 = time.perf_counter()
            await handle.append([record])
            if due >= measure_from:
                latencies.append(time.perf_counter() - t0)
                sent += 1
            due += interval

    async with trio.open_nursery() as nursery:
        for i in range(producers):
            nursery.start_soon(producer, interval * i / producers)
    return latencies, sent / seconds


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


class CountingJournal(Journal):
    """The real journal, counting commits so the benchmark can report batch sizes."""

    commits = 0
    events = 0

    def finish_staged(
        self, staged: Staged, *, sync_head: bool = True
    ) -> list[list[CommittedRecord]]:
        out = super().finish_staged(staged, sync_head=sync_head)
        self.commits += 1
        self.events += sum(len(group) for group in out)
        return out


async def run_phase(home: Path, phase: Callable[[JournalHandle], Awaitable[T]]) -> tuple[T, float]:
    """Run ``phase`` against a journal actor on a fresh journal; returns (result, mean batch)."""
    journal = CountingJournal.open(home, os.urandom(32))
    assert isinstance(journal, CountingJournal)
    try:
        async with trio.open_nursery() as nursery:
            handle: JournalHandle = await nursery.start(run_journal, journal)
            result = await phase(handle)
            await handle.aclose()
    finally:
        journal.close()
    return result, journal.events / max(journal.commits, 1)


def quiesce(path: Path) -> None:
    """Remove a finished phase's files and flush the disk, so the next phase starts quiet."""
    shutil.rmtree(path, ignore_errors=True)
    os.sync()


async def saturate_phase(home: Path, args: argparse.Namespace) -> tuple[tuple[float, int], float]:
    async def saturate(handle: JournalHandle) -> tuple[float, int]:
        await saturation(handle, args.producers, 0.5)  # warm-up
        return await saturation(handle, args.producers, args.seconds)

    return await run_phase(home, saturate)


async def paced_phase(
    home: Path, args: argparse.Namespace
) -> tuple[tuple[list[float], float], float]:
    async def pace(handle: JournalHandle) -> tuple[list[float], float]:
        return await paced(handle, args.producers, args.offered, args.latency_seconds, 0.5)

    return await run_phase(home, pace)


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="tools/bench journal", description=__doc__.split("\n")[0])
    parser.add_argument("--producers", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=4.0, help="saturation run length")
    parser.add_argument("--group", type=int, default=512, help="raw group-commit size")
    parser.add_argument("--offered", type=float, default=2000.0, help="paced load, events/s")
    parser.add_argument("--latency-seconds", type=float, default=5.0)
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args(argv)

    out = sys.stdout
    out.write(
        f"journal benchmark: ~{len(canonical_json(event_data(0)))} B events, WAL, "
        f"synchronous=FULL, AES-256-GCM, {os.cpu_count()} CPUs\n"
    )
    with tempfile.TemporaryDirectory(prefix="braid-bench-") as tmp:
        directory = Path(tmp)
        os.sync()
        # the latency phase runs first, on a quiet disk; each phase's files are removed and
        # flushed before the next, so no phase pays for another's write-back
        (latencies, achieved), paced_batch = trio.run(paced_phase, directory / "c", args)
        quiesce(directory / "c")
        (directory / "a").mkdir()
        raw_rate, raw_events = raw_limit(directory / "a", args.seconds, args.group)
        quiesce(directory / "a")
        (rate, acked), sat_batch = trio.run(saturate_phase, directory / "b", args)
    out.write(
        f"(a) raw limit: sqlite3 + AES-GCM, group commit of {args.group}: "
        f"{raw_rate:,.0f} events/s ({raw_events:,} events)\n"
    )
    latencies.sort()

    ratio = rate / raw_rate
    lat_ms = [v * 1000 for v in latencies]
    p50, p99 = percentile(lat_ms, 0.50), percentile(lat_ms, 0.99)
    mean = statistics.fmean(lat_ms) if lat_ms else float("nan")
    out.write(
        f"(b) journal actor, {args.producers} producers awaiting acks: "
        f"{rate:,.0f} events/s ({acked:,} events, mean batch {sat_batch:.0f})\n"
        f"    ratio b/a = {ratio:.2f} (target >= {RATIO_TARGET}) {verdict(ratio >= RATIO_TARGET)}\n"
        f"(c) offered {args.offered:,.0f} events/s from {args.producers} paced producers: "
        f"achieved {achieved:,.0f} events/s, {len(lat_ms):,} acks, "
        f"mean batch {paced_batch:.1f}\n"
        f"    ack latency p50 {p50:.2f} ms, p99 {p99:.2f} ms, mean {mean:.2f} ms, "
        f"max {max(lat_ms, default=float('nan')):.2f} ms "
        f"(target p99 <= {P99_TARGET_MS} ms) {verdict(p99 <= P99_TARGET_MS)}\n"
    )
    missed = ratio < RATIO_TARGET or not p99 <= P99_TARGET_MS
    return 1 if args.strict and missed else 0
