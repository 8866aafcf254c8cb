"""A member's stat file is opened once, read again at each sample, and closed when the
member leaves its tree or its observer is closed (a closed watch's: tests/workers/test_hub.py)."""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import subprocess
import sys
import time
from typing import TYPE_CHECKING

import psutil  # type: ignore[import-untyped, unused-ignore]
import pytest

from braid_actors.workers import ProcessKey, TreeObserver, _procstat
from tests.workers._procs import open_stat_files

if TYPE_CHECKING:
    from collections.abc import Callable


def _until(check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not check():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def _state(data: bytes | None) -> bytes:
    assert data is not None
    return data[data.rfind(b")") + 2 :].split()[0]


def test_a_kept_stat_file_shows_the_process_as_it_is_now(
    children: list[subprocess.Popen[bytes]],
) -> None:
    """Each read of the open file is a fresh line (stopped, continued, a zombie); once the
    process is reaped a read says it is gone, and closing is idempotent."""
    child = subprocess.Popen(["sleep", "30"])
    children.append(child)
    stat = _procstat.StatFile.open(child.pid)
    assert stat is not None
    assert _state(stat.read()) in (b"S", b"R")
    os.kill(child.pid, signal.SIGSTOP)
    _until(lambda: _state(stat.read()) == b"T")
    os.kill(child.pid, signal.SIGCONT)
    _until(lambda: _state(stat.read()) != b"T")
    child.kill()
    _until(lambda: _state(stat.read()) == b"Z")
    child.wait()
    assert stat.read() is None  # reaped: ESRCH, whatever the pid names by now
    stat.close()
    stat.close()
    assert stat.read() is None
    assert open_stat_files(child.pid) == 0
    assert _procstat.StatFile.open(child.pid) is None  # no such process


def test_kept_files_are_read_holding_the_interpreter() -> None:
    """Like the other counters reads, the kept file's calls keep the interpreter."""
    held = _procstat._FILES
    assert isinstance(held, _procstat._HeldReader)
    for function in (held._open, held._pread, held._close):
        assert function._flags_ & ctypes._FUNCFLAG_PYTHONAPI  # type: ignore[attr-defined]


def test_an_observer_keeps_one_file_a_member_and_closes_each(
    children: list[subprocess.Popen[bytes]],
) -> None:
    """A tree of a root and a child: one open stat file each after a sample, the same
    ones at later samples; the child's is closed when it exits, the rest by ``close``."""
    root = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time\n"
            "child = subprocess.Popen(['sleep', '30'])\n"
            "print(child.pid, flush=True)\n"
            "sys.stdin.readline()\n"
            "child.kill(); child.wait()\n"
            "time.sleep(30)\n",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    children.append(root)
    assert root.stdout is not None and root.stdin is not None
    child_pid = int(root.stdout.readline())
    observer = TreeObserver.of(ProcessKey(root.pid, psutil.Process(root.pid).create_time()))
    _until(lambda: len(observer.sample().processes) == 2)
    for _ in range(3):
        observer.sample()
    assert open_stat_files(root.pid) == 1
    assert open_stat_files(child_pid) == 1
    root.stdin.write(b"\n")
    root.stdin.flush()
    _until(lambda: child_pid in {k.pid for k in observer.sample().exited})
    assert open_stat_files(child_pid) == 0
    assert open_stat_files(root.pid) == 1
    observer.close()
    assert open_stat_files(root.pid) == 0
    # A later sample opens it again.
    assert observer.sample().root_alive
    assert open_stat_files(root.pid) == 1
    observer.close()


def test_past_half_the_open_file_limit_a_stat_file_is_read_by_path(
    children: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kept files count against the process's open-file limit: once half of it is held
    so, a new stat file is opened, read and closed at each reading, and reads the same."""
    child = subprocess.Popen(["sleep", "30"])
    children.append(child)
    kept = _procstat.StatFile.open(child.pid)
    assert kept is not None and kept.kept
    held = _procstat.kept_files()
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    monkeypatch.setattr(resource, "getrlimit", lambda which: (2 * held, hard))  # half: all held
    by_path = _procstat.StatFile.open(child.pid)
    assert by_path is not None and not by_path.kept
    assert _procstat.kept_files() == held
    assert _state(by_path.read()) in (b"S", b"R")
    assert open_stat_files(child.pid) == 1  # only the kept one
    kept.close()
    assert _procstat.kept_files() == held - 1
    again = _procstat.StatFile.open(child.pid)  # room again
    assert again is not None and again.kept
    child.kill()
    child.wait()
    assert by_path.read() is None and again.read() is None  # gone, either way
    by_path.close()
    again.close()
    assert _procstat.kept_files() == held - 1
