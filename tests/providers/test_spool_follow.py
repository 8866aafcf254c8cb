"""A spool is followed until its worker is seen gone before a read that reached its end."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import psutil
import pytest
import trio

from braid_actors.providers._local_spool import SpoolSource
from braid_actors.workers import ProcessInfo, StopPolicy, encode_message

if TYPE_CHECKING:
    from pathlib import Path


def _lines(n: int, start: int = 0) -> bytes:
    return b"".join(
        encode_message({"type": "part", "part": {"kind": "text", "part_id": "p", "text": str(i)}})
        for i in range(start, start + n)
    )


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[tuple[bool, int]]:
    """Record each spool read's (worker seen running, bytes read)."""
    reads: list[tuple[bool, int]] = []
    read = SpoolSource._read_more

    def counted(self: SpoolSource, *limit: int) -> tuple[bool, bytes]:
        alive, data = read(self, *limit)
        reads.append((alive, len(data)))
        return alive, data

    monkeypatch.setattr(SpoolSource, "_read_more", counted)
    return reads


async def _drain(source: SpoolSource) -> list[str]:
    texts = []
    while (message := await source.receive()) is not None:
        texts.append(message["part"]["text"])
    return texts


async def test_a_gone_workers_spool_is_drained_with_one_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker is gone (a pid no process has): the first read finds everything and the
    end, so no second read is made (a restart does this for every finished run)."""
    spool = tmp_path / "run.jsonl"
    spool.write_bytes(_lines(50))
    gone = 2**22 - 7  # above pid_max here: never a live process
    source = SpoolSource(
        ProcessInfo(gone, 1.0, gone, ()), spool, tmp_path / "c.jsonl", StopPolicy()
    )
    reads = _counting(monkeypatch)
    assert await _drain(source) == [str(i) for i in range(50)]
    assert reads == [(False, spool.stat().st_size)]


async def test_a_primed_spool_of_a_gone_worker_needs_no_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``prime`` reads the start on the caller's thread: for a gone worker whose spool is
    shorter than ``PRIME_BYTES`` that one read is all, and no thread job follows."""
    spool = tmp_path / "run.jsonl"
    spool.write_bytes(_lines(50))
    gone = 2**22 - 7
    source = SpoolSource(
        ProcessInfo(gone, 1.0, gone, ()), spool, tmp_path / "c.jsonl", StopPolicy()
    )
    reads = _counting(monkeypatch)
    threads: list[object] = []
    run_sync = trio.to_thread.run_sync

    async def counted_thread(*args: Any, **kwargs: Any) -> Any:
        threads.append(args[0])
        return await run_sync(*args, **kwargs)

    monkeypatch.setattr(trio.to_thread, "run_sync", counted_thread)
    source.prime()
    assert await _drain(source) == [str(i) for i in range(50)]
    assert reads == [(False, spool.stat().st_size)]
    assert threads == []


def _writer(release: Path, spool: Path, lines: bytes) -> subprocess.Popen[bytes]:
    """A process that appends ``lines`` to ``spool`` once ``release`` exists, then exits."""
    script = (
        "import os, sys, time\n"
        "while not os.path.exists(sys.argv[1]): time.sleep(0.01)\n"
        "open(sys.argv[2], 'ab').write(sys.stdin.buffer.read())\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(release), str(spool)],
        stdin=subprocess.PIPE,
        start_new_session=True,
    )
    assert proc.stdin is not None
    proc.stdin.write(lines)
    proc.stdin.close()
    return proc


async def test_what_a_worker_writes_before_exiting_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A live worker (a real process) appends after the first read and then exits: the
    spool is followed until a read made after the worker was seen gone, so its last lines
    are read, and only then does the stream end."""
    spool = tmp_path / "run.jsonl"
    spool.write_bytes(_lines(3))
    release = tmp_path / "release"
    proc = _writer(release, spool, _lines(4, start=3))
    try:
        info = ProcessInfo(
            proc.pid, psutil.Process(proc.pid).create_time(), os.getpgid(proc.pid), ()
        )
        source = SpoolSource(info, spool, tmp_path / "c.jsonl", StopPolicy())
        reads = _counting(monkeypatch)
        got: list[str] = []
        first_three = trio.Event()

        async def drain() -> None:
            while (message := await source.receive()) is not None:
                got.append(message["part"]["text"])
                if len(got) == 3:
                    first_three.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(drain)
            with trio.fail_after(10):
                await first_three.wait()
            release.touch()  # the worker writes its last lines and exits
            await trio.to_thread.run_sync(proc.wait)
        assert got == [str(i) for i in range(7)]
        assert reads[0][0] is True  # the first read saw the worker running
        # The end came with the first read that saw the worker gone (it may still have
        # found the last lines: a read after the check is complete): no read after it.
        assert [alive for alive, _ in reads].count(False) == 1
        assert reads[-1][0] is False
    finally:
        proc.kill()
        proc.wait()
