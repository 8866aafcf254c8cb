"""A member read from its stat line gives what psutil's reading gives."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING

import psutil  # type: ignore[import-untyped, unused-ignore]
import pytest

from braid_actors.workers import ARGV_LIMIT, ProcessKey, _procstat
from braid_actors.workers._member import Member, read_from_stat, read_member

if TYPE_CHECKING:
    pass


def test_the_stat_reader_is_in_use_here() -> None:
    """Braid runs on Linux: the stat reader is what samples a tree here (not psutil)."""
    assert _procstat.AVAILABLE


def _member(pid: int) -> Member:
    proc = psutil.Process(pid)
    return Member(key=ProcessKey(pid, proc.create_time()), proc=proc, parent=None)


def _both(member: Member) -> tuple[object, object]:
    """(stat-line reading, psutil reading) of the same member, one right after the other."""
    fast = read_from_stat(member, 160)
    saved = _procstat.AVAILABLE
    try:
        _procstat.AVAILABLE = False  # type: ignore[misc]
        plain = read_member(member, 160)
    finally:
        _procstat.AVAILABLE = saved  # type: ignore[misc]
    return fast, plain


def test_a_sleeping_and_a_stopped_process_read_the_same(
    children: list[subprocess.Popen[bytes]],
) -> None:
    """State, parent, group, CPU (own and reaped), RSS and the bounded argv agree."""
    script = "import time\nx = bytearray(8 << 20)\ntime.sleep(60)"
    long_arg = "a" * 200  # longer than the argv bound: cut the same way
    sleeping = subprocess.Popen([sys.executable, "-c", script, long_arg])
    stopped = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    children += [sleeping, stopped]
    time.sleep(0.5)
    os.kill(stopped.pid, signal.SIGSTOP)
    time.sleep(0.1)
    for child, status in ((sleeping, "sleeping"), (stopped, "stopped")):
        fast, plain = _both(_member(child.pid))
        assert fast == plain
        assert fast.snapshot.status == status  # type: ignore[attr-defined]
        assert fast.snapshot.argv_truncated is (child is sleeping)  # type: ignore[attr-defined]
        assert fast.snapshot.pgid == os.getpgid(child.pid)  # type: ignore[attr-defined]
    os.kill(stopped.pid, signal.SIGCONT)


def test_a_zombie_reads_as_psutil_reads_it(children: list[subprocess.Popen[bytes]]) -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    children.append(child)
    member = _member(child.pid)
    deadline = time.monotonic() + 10
    while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    fast, plain = _both(member)
    assert fast == plain
    assert fast.zombie and fast.snapshot.rss_bytes is None  # type: ignore[attr-defined]


def test_a_gone_or_reused_pid_is_gone(children: list[subprocess.Popen[bytes]]) -> None:
    """An exited and reaped member reads as gone; so does one whose pid shows another
    start tick (another process under the same pid) or another creation time."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    children.append(child)
    member = _member(child.pid)
    assert read_from_stat(member, ARGV_LIMIT) is not None
    assert member.start_tick is not None
    member.start_tick += 1  # as if the pid now named a process started a tick later
    member.line = None  # (whose stat line, holding its start tick, would differ too)
    assert read_from_stat(member, ARGV_LIMIT) is None
    stranger = Member(
        key=ProcessKey(child.pid, member.key.create_time + 1.0), proc=member.proc, parent=None
    )
    assert read_from_stat(stranger, ARGV_LIMIT) is None  # psutil's creation time disagrees
    child.kill()
    child.wait()
    assert read_from_stat(Member(key=member.key, proc=member.proc, parent=None), ARGV_LIMIT) is None


def test_argv_is_read_by_psutil_s_rules() -> None:
    """NUL-separated arguments, and a rewritten title separated by spaces."""
    me = os.getpid()
    assert _procstat.read_argv(me) == psutil.Process(me).cmdline()
    assert _procstat.read_argv(2**22 + 1) is None  # no such pid


def test_a_proc_file_reads_whole_as_open_reads_it(children: list[subprocess.Popen[bytes]]) -> None:
    """``read_proc_file`` gives ``open().read()``'s bytes, past its first 4 KB read too
    (a 20 KB command line), and ``open``'s error for a pid that does not exist."""
    long_arg = "x" * 20_000
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", long_arg])
    children.append(child)
    deadline = time.monotonic() + 30
    while long_arg not in psutil.Process(child.pid).cmdline():  # until it has exec'd
        assert time.monotonic() < deadline
        time.sleep(0.01)
    for read in (_procstat.read_proc_file, _procstat.read_proc_counters):
        for pid in (os.getpid(), child.pid):
            for name in ("stat", "statm", "cmdline", "status"):
                path = f"/proc/{pid}/{name}"
                with open(path, "rb") as plain:
                    expected = plain.read()
                got = read(path)
                if name in ("stat", "status"):  # CPU times and counters move between reads
                    assert got.split()[:3] == expected.split()[:3]
                elif name == "statm":  # so do the page counts (this process allocates)
                    assert len(got.split()) == len(expected.split()) == 7
                    assert got.endswith(b"\n")
                else:
                    assert got == expected
        assert long_arg.encode() in read(f"/proc/{child.pid}/cmdline")
        with pytest.raises(FileNotFoundError):
            read(f"/proc/{2**22 + 1}/stat")
    assert _procstat.read_argv(child.pid) == psutil.Process(child.pid).cmdline()


def test_counters_are_read_holding_the_interpreter(
    children: list[subprocess.Popen[bytes]],
) -> None:
    """``stat`` and ``statm`` are read through libc functions that keep the interpreter
    (``ctypes.PyDLL``'s, not ``os.read``, which lets it go), each thread into a buffer of
    its own: threads reading at once each get their own process's line."""
    reader = _procstat.read_proc_counters
    assert isinstance(reader, _procstat._HeldReader)
    for function in (reader._open, reader._read, reader._close):
        assert function._flags_ & ctypes._FUNCFLAG_PYTHONAPI  # type: ignore[attr-defined]
    sleepers = [subprocess.Popen(["sleep", "30"]) for _ in range(4)]
    children += sleepers
    wrong: list[bytes] = []

    def read_many(pid: int) -> None:
        prefix = f"{pid} (".encode()
        for _ in range(2000):
            line = reader(f"/proc/{pid}/stat")
            if not line.startswith(prefix):
                wrong.append(line)

    threads = [threading.Thread(target=read_many, args=(p.pid,)) for p in sleepers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert wrong == []


def test_the_command_line_is_read_again_after_an_exec_only(
    children: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A known member's ``cmdline`` is not read again while its executable stays the same;
    after an exec (same pid, a new executable name) its snapshot shows the new command."""
    reads: list[int] = []
    real = _procstat.read_argv

    def counted(pid: int) -> list[str] | None:
        reads.append(pid)
        return real(pid)

    monkeypatch.setattr(_procstat, "read_argv", counted)
    script = "read line; exec sleep 60"
    child = subprocess.Popen(["/bin/sh", "-c", script], stdin=subprocess.PIPE)
    children.append(child)
    deadline = time.monotonic() + 10
    while psutil.Process(child.pid).cmdline() != ["/bin/sh", "-c", script]:  # until it has exec'd
        assert time.monotonic() < deadline
        time.sleep(0.01)
    member = _member(child.pid)
    first = read_from_stat(member, ARGV_LIMIT)
    assert first is not None and first.snapshot.argv == ("/bin/sh", "-c", script)
    for _ in range(5):
        again = read_from_stat(member, ARGV_LIMIT)
        assert again is not None and again.snapshot.argv == first.snapshot.argv
    assert reads == [child.pid]  # one read of the command line for six readings
    assert child.stdin is not None
    child.stdin.write(b"go\n")
    child.stdin.flush()
    deadline = time.monotonic() + 10
    while True:
        after = read_from_stat(member, ARGV_LIMIT)
        assert after is not None  # the same process: an exec keeps the pid and start tick
        if after.snapshot.argv == ("sleep", "60"):
            break
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert reads[0] == child.pid and len(reads) >= 2  # read again once the name changed
    settled = len(reads)
    assert read_from_stat(member, ARGV_LIMIT) is not None
    assert len(reads) == settled  # and not again while it stays the same


def test_an_empty_command_line_is_read_again(
    children: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reading in the middle of an exec (the new name, no arguments yet) does not stick:
    the next reading asks ``cmdline`` again."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    children.append(child)
    member = _member(child.pid)
    monkeypatch.setattr(_procstat, "read_argv", lambda pid: [])
    empty = read_from_stat(member, ARGV_LIMIT)
    assert empty is not None and empty.snapshot.argv == ()
    monkeypatch.undo()
    deadline = time.monotonic() + 10
    while True:
        full = read_from_stat(member, ARGV_LIMIT)
        assert full is not None
        if full.snapshot.argv == tuple(psutil.Process(child.pid).cmdline()):
            break
        assert time.monotonic() < deadline
        time.sleep(0.01)
