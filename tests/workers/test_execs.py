"""A member that runs a new command line after it was found is reported once, in ``execs``:
a child caught between ``fork`` and ``exec`` (found with its parent's command), and a root
that execs. New members and unchanged ones never are."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import TYPE_CHECKING

import psutil  # type: ignore[import-untyped, unused-ignore]

from braid_actors.workers import ProcessKey, ProcessSnapshot, TreeObserver, TreeSample

if TYPE_CHECKING:
    from collections.abc import Callable

# The child waits between fork and exec until the test writes a line to the parent.
_FORK_THEN_EXEC = (
    "import os, sys\n"
    "r, w = os.pipe()\n"
    "pid = os.fork()\n"
    "if pid == 0:\n"
    "    os.close(w)\n"
    "    os.read(r, 1)\n"
    "    os.execvp('sleep', ['sleep', '30'])\n"
    "os.close(r)\n"
    "print(pid, flush=True)\n"
    "sys.stdin.readline()\n"
    "os.write(w, b'x')\n"
    "os.waitpid(pid, 0)\n"
)


def _key(pid: int) -> ProcessKey:
    return ProcessKey(pid, psutil.Process(pid).create_time())


def _sample_until(
    observer: TreeObserver, done: Callable[[TreeSample], bool], seen: list[TreeSample]
) -> TreeSample:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        sample = observer.sample()
        seen.append(sample)
        if done(sample):
            return sample
        time.sleep(0.05)
    raise AssertionError("the tree never reached the awaited state")


def test_a_child_found_before_its_exec_is_reported_once_it_runs_its_own_command(
    children: list[subprocess.Popen[bytes]],
) -> None:
    root = subprocess.Popen(
        [sys.executable, "-c", _FORK_THEN_EXEC], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    children.append(root)
    assert root.stdout is not None and root.stdin is not None
    child_pid = int(root.stdout.readline())
    observer = TreeObserver.of(_key(root.pid))
    seen: list[TreeSample] = []
    first = _sample_until(observer, lambda s: any(p.pid == child_pid for p in s.new), seen)
    (found,) = [p for p in first.new if p.pid == child_pid]
    assert found.argv is not None and found.argv[0] == sys.executable  # the parent's command
    assert not any(s.execs for s in seen)
    for _ in range(3):  # nothing changes while it waits
        assert not observer.sample().execs
    root.stdin.write(b"go\n")
    root.stdin.flush()
    exec_sample = _sample_until(observer, lambda s: bool(s.execs), seen)
    (executed,) = exec_sample.execs
    assert executed.key == found.key
    assert executed.argv == ("sleep", "30")
    assert exec_sample.new == ()
    later = [observer.sample() for _ in range(3)]
    assert all(s.execs == () for s in later)  # reported once
    running = {p.pid: p.argv for p in later[-1].processes}
    assert running[child_pid] == ("sleep", "30")
    root_argv = running[root.pid]
    assert root_argv is not None and root_argv[0] == sys.executable


def _exec_of_root(root: subprocess.Popen[bytes]) -> tuple[TreeSample, ProcessSnapshot]:
    """Observe ``root``, let it exec (a line on its input) and sample until the exec is
    reported: the first sample and the one reported exec, which no other sample repeats."""
    assert root.stdin is not None
    observer = TreeObserver.of(_key(root.pid))
    first = observer.sample()
    assert first.execs == ()  # a first reading is no change
    root.stdin.write(b"go\n")
    root.stdin.flush()
    seen: list[TreeSample] = []
    exec_sample = _sample_until(observer, lambda s: bool(s.execs), seen)
    (executed,) = exec_sample.execs
    assert executed.key == first.root
    assert not any(s.execs for s in seen[:-1])
    assert not observer.sample().execs  # reported once
    return first, executed


def test_a_root_that_execs_is_reported_with_its_new_command(
    children: list[subprocess.Popen[bytes]],
) -> None:
    root = subprocess.Popen(
        ["sh", "-c", "read line; exec sleep 30"], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    children.append(root)
    assert root.stdin is not None
    command = ["sh", "-c", "read line; exec sleep 30"]
    deadline = time.monotonic() + 10
    while psutil.Process(root.pid).cmdline() != command:  # (not caught mid-exec of sh)
        assert time.monotonic() < deadline
        time.sleep(0.01)
    first, executed = _exec_of_root(root)
    assert first.processes[0].argv == ("sh", "-c", "read line; exec sleep 30")
    assert executed.argv == ("sleep", "30")


# A Python process that runs the same executable again with other arguments: its name (the
# stat line's ``comm``) stays the same across the exec.
_SAME_NAME_EXEC = (
    "import os, sys\n"
    "sys.stdin.readline()\n"
    "os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(30)', 'again'])\n"
)


def test_an_exec_that_keeps_the_executables_name_is_reported(
    children: list[subprocess.Popen[bytes]],
) -> None:
    """The exec lays the arguments out anew (``arg_start``/``arg_end`` in the stat line), so
    the new command line is read although the executable's name did not change."""
    root = subprocess.Popen(
        [sys.executable, "-c", _SAME_NAME_EXEC], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    children.append(root)
    assert root.stdin is not None
    deadline = time.monotonic() + 10
    while psutil.Process(root.pid).cmdline() != [sys.executable, "-c", _SAME_NAME_EXEC]:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    name = psutil.Process(root.pid).name()
    _, executed = _exec_of_root(root)
    assert executed.argv == (sys.executable, "-c", "import time; time.sleep(30)", "again")
    assert psutil.Process(root.pid).name() == name  # the same name before and after
