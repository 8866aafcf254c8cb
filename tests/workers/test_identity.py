"""Process identity: pid plus creation time, and the cheap answer for a pid nobody holds."""

from __future__ import annotations

import subprocess
import sys

import psutil  # type: ignore[import-untyped, unused-ignore]

from braid_actors.workers._identity import ProcessKey, find_process, presence


def _free_pid() -> int:
    """A pid no process holds right now (a reaped child's)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_live_process_is_found_by_pid_and_creation_time() -> None:
    me = psutil.Process()
    key = ProcessKey(me.pid, me.create_time())
    found = find_process(key)
    assert found is not None
    assert found.pid == me.pid
    assert presence(key) == "running"


def test_another_creation_time_is_not_the_same_process() -> None:
    me = psutil.Process()
    assert find_process(ProcessKey(me.pid, me.create_time() - 1.0)) is None


def test_a_free_pid_and_group_numbers_are_gone() -> None:
    assert find_process(ProcessKey(_free_pid(), 1.0)) is None
    for pid in (0, -1):
        assert find_process(ProcessKey(pid, 1.0)) is None
        assert presence(ProcessKey(pid, 1.0)) == "gone"
