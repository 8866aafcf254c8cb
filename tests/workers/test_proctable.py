"""The shared process table: one read of the system's parent ids for many observers."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import TYPE_CHECKING

import psutil  # type: ignore[import-untyped, unused-ignore]
import pytest

from braid_actors.workers import ProcessTable, TreeObserver, read_parent_ids
from tests.workers._procs import SPAWN_CHILD, python, read_line

if TYPE_CHECKING:
    from collections.abc import Set


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_read_parent_ids_agrees_with_psutil() -> None:
    table = read_parent_ids()
    me = os.getpid()
    assert table[me] == os.getppid()
    # Every process psutil still finds with the same parent after the read is in the table
    # with that parent (a process can exit or be re-parented in between; those are skipped).
    agreed = 0
    for proc in psutil.process_iter():
        try:
            ppid = int(proc.ppid())
        except psutil.Error:
            continue
        if proc.pid in table:
            agreed += table[proc.pid] == ppid
    assert agreed >= len(table) * 0.9


def test_read_parent_ids_passes_over_the_pids_it_is_told_to() -> None:
    me = os.getpid()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        table = read_parent_ids(skip={str(me)})
        assert me not in table
        assert table[child.pid] == me  # the others are read as before
        assert read_parent_ids()[me] == os.getppid()
    finally:
        child.kill()
        child.wait()


def test_an_expiry_names_what_the_next_read_passes_over() -> None:
    asked: list[Set[str]] = []

    def read(skip: Set[str]) -> dict[int, int]:
        asked.append(skip)
        return {1: 0}

    table = ProcessTable(60.0, read=read)
    table.parents()
    table.expire(frozenset({"7", "9"}))
    table.parents()
    table.expire()
    table.parents()
    assert asked == [frozenset(), {"7", "9"}, frozenset()]


def test_a_table_is_read_once_per_max_age() -> None:
    clock = Clock()
    reads: list[int] = []

    def read(skip: Set[str]) -> dict[int, int]:
        reads.append(1)
        return {1: 0, len(reads) + 1: 1}

    table = ProcessTable(2.0, clock=clock, read=read)
    first = table.parents()
    assert table.parents() is first
    clock.now += 1.9
    assert table.parents() is first
    clock.now += 0.2
    assert table.parents() is not first
    assert table.reads == len(reads) == 2


def test_an_expired_table_is_read_anew_whatever_its_age() -> None:
    clock = Clock()
    tables = [{1: 0, 7: 1}, {1: 0, 8: 1}]
    table = ProcessTable(60.0, clock=clock, read=lambda skip: tables.pop(0))
    assert table.children() == {0: (1,), 1: (7,)}
    table.expire()
    assert table.children() == {0: (1,), 1: (8,)}  # read and grouped again at once
    assert table.reads == 2


def test_children_are_grouped_once_per_read_in_pid_order() -> None:
    clock = Clock()
    tables = [{1: 0, 30: 1, 7: 1, 12: 7, 9: 1}, {1: 0, 5: 1}]

    def read(skip: Set[str]) -> dict[int, int]:
        return tables.pop(0)

    table = ProcessTable(2.0, clock=clock, read=read)
    children = table.children()
    assert children == {0: (1,), 1: (7, 9, 30), 7: (12,)}
    assert table.children() is children  # the same read: not grouped again
    clock.now += 2.1
    assert table.children() == {0: (1,), 1: (5,)}  # a new read: grouped anew
    assert table.reads == 2


def test_max_age_zero_reads_every_time() -> None:
    table = ProcessTable(0.0)
    table.parents()
    table.parents()
    assert table.reads == 2
    with pytest.raises(ValueError, match="negative"):
        ProcessTable(-1.0)


async def test_observers_share_one_read_and_find_a_late_child_once_it_expires() -> None:
    clock = Clock()
    table = ProcessTable(10.0, clock=clock)
    async with python(SPAWN_CHILD) as one, python(SPAWN_CHILD) as two:
        assert await read_line(one) == "ready"
        assert await read_line(two) == "ready"
        a = TreeObserver.of(one.info, table=table)
        b = TreeObserver.of(two.info, table=table)
        assert a.sample().new == ()
        assert b.sample().new == ()
        assert table.reads == 1  # two trees, one read of the system
        await one.send({"go": True})  # any line wakes it
        child = int(await read_line(one))
        # The shared table predates the child: not seen while the table is fresh...
        assert a.sample().new == ()
        assert table.reads == 1
        clock.now += 10.0
        # ...and found at the first sample after it expires.
        found = a.sample().new
        assert [s.pid for s in found] == [child]
        assert table.reads == 2
        assert b.sample().new == ()


async def test_a_stale_entry_naming_another_process_is_not_admitted() -> None:
    async with python(SPAWN_CHILD) as root, python(SPAWN_CHILD) as other:
        assert await read_line(root) == "ready"
        assert await read_line(other) == "ready"
        forged = {root.info.pid: os.getpid(), other.info.pid: root.info.pid}

        # A table that (wrongly, as a stale one could after pid reuse) names `other` as a
        # child of `root`: the observer re-reads the parent and does not adopt it.
        table = ProcessTable(60.0, read=lambda skip: forged)
        observer = TreeObserver.of(root.info, table=table)
        sample = observer.sample()
        assert sample.new == ()
        assert [p.pid for p in sample.processes] == [root.info.pid]
