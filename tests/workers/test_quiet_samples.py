"""A tree whose stat lines did not change is sampled from them alone, and still reports
what changed: memory growth, a new child, an exit, the wall clock."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import TYPE_CHECKING

import psutil  # type: ignore[import-untyped, unused-ignore]
import pytest

from braid_actors.workers import ProcessKey, ProcessTable, TreeObserver, TreeSample, _procstat

if TYPE_CHECKING:
    from collections.abc import Callable

_GROW = (
    "import sys\n"
    "kept = []\n"
    "print('ready', flush=True)\n"
    "for line in sys.stdin:\n"
    "    kept.append(b'x' * (48 << 20))\n"  # written, so resident
    "    print('grown', flush=True)\n"
)


@pytest.fixture
def statm_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The ``statm`` files read from now on (the resident set's exact figure)."""
    reads: list[str] = []
    real = _procstat.read_proc_counters

    def counted(path: str) -> bytes:
        if path.endswith("/statm"):
            reads.append(path)
        return real(path)

    monkeypatch.setattr(_procstat, "read_proc_counters", counted)
    return reads


def _key(pid: int) -> ProcessKey:
    return ProcessKey(pid, psutil.Process(pid).create_time())


def _until_quiet(sample: Callable[[], TreeSample], statm_reads: list[str]) -> TreeSample:
    """Sample until one reads no ``statm`` (every line as the previous sample read it) and
    finds every member asleep (waiting, so its line stays: two samples taken while a member
    ran could also read alike)."""
    deadline = time.monotonic() + 10
    while True:
        before = len(statm_reads)
        taken = sample()
        if len(statm_reads) == before and all(p.status == "sleeping" for p in taken.processes):
            return taken
        assert time.monotonic() < deadline, "the tree never read as unchanged"
        time.sleep(0.05)


def test_a_quiet_member_is_read_from_its_stat_line_and_its_growth_is_seen(
    children: list[subprocess.Popen[bytes]], statm_reads: list[str]
) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", _GROW], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    children.append(child)
    assert child.stdout is not None
    assert child.stdout.readline() == b"ready\n"  # from now on it waits on its input
    observer = TreeObserver.of(_key(child.pid))
    first = observer.sample()
    assert statm_reads  # a first reading reads the resident set
    quiet = _until_quiet(observer.sample, statm_reads)
    time.sleep(0.05)
    before = len(statm_reads)
    again = observer.sample()
    assert len(statm_reads) == before
    assert again.number == quiet.number + 1 and again.taken_at > quiet.taken_at
    assert again.wall_seconds > quiet.wall_seconds  # the root runs: its wall clock does too
    assert (again.cpu_seconds, again.rss_bytes, again.peak_rss_bytes) == (
        quiet.cpu_seconds,
        quiet.rss_bytes,
        quiet.peak_rss_bytes,
    )
    assert again.processes == quiet.processes and again.new == () and again.exited == ()
    assert again.repeated and quiet.repeated and not first.repeated
    assert quiet.rss_bytes is not None and first.rss_bytes is not None

    assert child.stdin is not None
    child.stdin.write(b"grow\n")
    child.stdin.flush()
    assert child.stdout.readline() == b"grown\n"
    before = len(statm_reads)
    grown = observer.sample()
    assert len(statm_reads) == before + 1  # the faults changed its line: read again
    assert grown.rss_bytes is not None and grown.peak_rss_bytes is not None
    assert grown.rss_bytes >= quiet.rss_bytes + (40 << 20)
    assert grown.peak_rss_bytes == grown.rss_bytes
    assert grown.rss_bytes == psutil.Process(child.pid).memory_info().rss
    assert not grown.repeated


def test_a_quiet_tree_reports_a_new_child_then_its_exit(
    children: list[subprocess.Popen[bytes]], statm_reads: list[str]
) -> None:
    """The root does nothing (its line stays the same) while a child it started earlier
    comes into the parent table (kept out of the table's first reads): the child is
    reported as new once, then its exit once."""
    root = subprocess.Popen(
        ["/bin/sh", "-c", "sleep 60 & echo $!; read x"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    children.append(root)
    assert root.stdout is not None
    grandchild = int(root.stdout.readline())
    table = ProcessTable()
    table.expire(frozenset({str(grandchild)}))  # the table's reads pass over the child
    observer = TreeObserver.of(_key(root.pid), table=table)
    observer.sample()
    quiet = _until_quiet(observer.sample, statm_reads)
    assert [p.pid for p in quiet.processes] == [root.pid] and quiet.new == ()

    table.expire(frozenset())  # the next read finds the child under the quiet root
    found = observer.sample()
    assert [p.pid for p in found.new] == [grandchild]
    assert [p.pid for p in found.processes] == [root.pid, grandchild]
    assert not found.repeated
    after = _until_quiet(observer.sample, statm_reads)
    assert after.new == () and after.processes == found.processes and after.repeated

    psutil.Process(grandchild).kill()
    deadline = time.monotonic() + 10
    while True:
        ended = observer.sample()
        if ended.exited:
            break
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert [k.pid for k in ended.exited] == [grandchild]
    assert [p.pid for p in ended.processes] == [root.pid]
    later = _until_quiet(observer.sample, statm_reads)
    assert later.exited == () and [p.pid for p in later.processes] == [root.pid]


def test_a_quiet_zombie_root_keeps_its_wall_clock_stopped(
    children: list[subprocess.Popen[bytes]], statm_reads: list[str]
) -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    children.append(child)
    observer = TreeObserver.of(_key(child.pid))
    deadline = time.monotonic() + 10
    while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    first = observer.sample()
    assert first.exited == (first.root,) and first.processes == ()
    time.sleep(0.05)
    again = observer.sample()
    assert again.exited == () and again.wall_seconds == first.wall_seconds and again.repeated
    assert again.number == 2 and statm_reads == []  # a zombie has no resident set to read


def test_the_stat_identity_ends_before_the_cpu_the_process_last_ran_on() -> None:
    """Two readings that differ only in the CPU the process ran on last have one identity;
    any change before it (faults, CPU ticks) gives another; a line without that field is
    its own identity."""
    line = _procstat.read_proc_counters(f"/proc/{os.getpid()}/stat").rstrip(b"\n")
    close = line.rfind(b")")
    fields = line[close + 2 :].split(b" ")
    assert int(fields[36]) == psutil.Process().cpu_num()  # psutil's cpu_num: this field

    def variant(index: int, value: bytes) -> bytes:
        changed = list(fields)
        changed[index] = value
        return line[: close + 2] + b" ".join(changed)

    same = _procstat.stat_identity(line)
    assert same == line[: close + 2] + b" ".join(fields[:36])
    assert _procstat.stat_identity(variant(36, b"999")) == same
    assert _procstat.stat_identity(variant(7, str(int(fields[7]) + 1).encode())) != same
    assert _procstat.stat_identity(variant(11, str(int(fields[11]) + 1).encode())) != same
    short = line[: close + 2] + b" ".join(fields[:30])
    assert _procstat.stat_identity(short) == short
