"""Process-tree observation with psutil, on real processes."""

from __future__ import annotations

import functools
import os
import signal
import sys
from typing import TYPE_CHECKING

import psutil  # type: ignore[import-untyped, unused-ignore]
import pytest
import trio

from braid_actors.workers import ProcessKey, TreeObserver, TreeSample, observe_tree
from tests.workers._procs import assert_gone, python, read_line, shell_command

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from braid_actors.workers import ProcessInfo

BURN = "while True:\n    pass\n"
"""A process that really burns CPU."""

HOLD = (
    "import sys, time\n"
    "block = bytearray(160 * 1024 * 1024)\n"
    "for i in range(0, len(block), 4096):\n"
    "    block[i] = 1\n"
    "print('ready', flush=True)\n"
    "time.sleep(30)\n"
)
"""A process that really holds 160 MiB of touched memory."""

BUSY_CHILD = (
    f"{sys.executable} -c 'import time\n"
    "t = time.process_time()\n"
    "while time.process_time() - t < 0.25:\n"
    "    pass'"
)
"""A shell command that uses 0.25 CPU seconds, then exits."""


class Samples:
    """Collects an observer's samples and lets a test wait for one that satisfies it."""

    def __init__(self) -> None:
        self.seen: list[TreeSample] = []
        self._changed = trio.Event()

    async def add(self, sample: TreeSample) -> None:
        self.seen.append(sample)
        self._changed.set()
        self._changed = trio.Event()

    async def until(self, check: Callable[[TreeSample], bool]) -> TreeSample:
        """The first sample (already seen or still to come) for which ``check`` holds."""
        with trio.fail_after(5):
            while True:
                for sample in self.seen:
                    if check(sample):
                        return sample
                await self._changed.wait()


def observe(samples: Samples, root: ProcessInfo) -> Callable[..., Awaitable[TreeSample]]:
    """``observe_tree`` on ``root`` every 20 ms, for ``nursery.start`` or ``start_soon``."""
    return functools.partial(observe_tree, root, interval=0.02, on_sample=samples.add)


async def test_cpu_seconds_rise_for_a_busy_process() -> None:
    """A process that burns CPU shows the tree's CPU seconds rising past a threshold."""
    samples = Samples()
    async with python(BURN) as worker, trio.open_nursery() as nursery:
        first = await nursery.start(observe(samples, worker.info))
        assert isinstance(first, TreeSample)
        assert first.number == 1
        assert first.root_alive
        hot = await samples.until(lambda s: (s.cpu_seconds or 0.0) > 0.3)
        nursery.cancel_scope.cancel(reason="enough samples")
    cpu = [s.cpu_seconds for s in samples.seen if s.cpu_seconds is not None]
    assert cpu == sorted(cpu)
    assert hot.wall_seconds >= 0.3
    assert hot.processes[0].key == worker.info.key


async def test_tree_rss_shows_touched_memory() -> None:
    """A process holding 160 MiB of touched memory shows tree RSS (and peak) above it."""
    async with python(HOLD) as worker:
        assert await read_line(worker) == "ready"
        observer = TreeObserver.of(worker.info)
        sample = await trio.to_thread.run_sync(observer.sample)
    assert sample.rss_bytes is not None
    assert sample.rss_bytes > 160 * 1024 * 1024
    assert sample.peak_rss_bytes == sample.rss_bytes
    assert sample.unreadable == ()


async def test_children_are_reported_new_then_exited() -> None:
    """Children of a shell are new deltas with the right ppid, then exited deltas once killed."""
    samples = Samples()
    argv = ("sh", "-c", "sleep 30 & sleep 30 & wait")
    async with shell_command(argv) as worker, trio.open_nursery() as nursery:
        root = worker.info
        nursery.start_soon(observe(samples, root))
        await samples.until(lambda s: [p.argv for p in s.descendants] == [("sleep", "30")] * 2)
        new = [snap for s in samples.seen for snap in s.new]
        assert len(new) == 2
        assert all(snap.ppid == root.pid for snap in new)
        assert all(snap.pgid == root.pgid for snap in new)
        for snap in new:
            os.kill(snap.pid, signal.SIGKILL)
        last = await samples.until(lambda s: s.finished)
    exited = [key for s in samples.seen for key in s.exited]
    assert sorted(exited) == sorted([root.key, *(snap.key for snap in new)])
    assert not any(s.new and set(s.exited) & {n.key for n in s.new} for s in samples.seen)
    assert not last.root_alive
    await assert_gone(snap.key for snap in new)


async def test_exited_children_reaped_inside_the_tree_still_count() -> None:
    """CPU of children that exited and were reaped by the shell stays in the tree's total,
    matching what the kernel charged the whole tree, without double counting."""
    mine = psutil.Process().cpu_times()
    before = mine.children_user + mine.children_system
    samples = Samples()
    script = f"{BUSY_CHILD}; {BUSY_CHILD} & {BUSY_CHILD}; wait; sleep 0.1"
    async with shell_command(("sh", "-c", script)) as worker:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(observe(samples, worker.info))
            last = await samples.until(lambda s: s.finished)
        with trio.fail_after(5):
            await worker.wait()
    mine = psutil.Process().cpu_times()
    charged = mine.children_user + mine.children_system - before
    assert last.cpu_seconds is not None
    assert charged >= 0.7
    assert last.cpu_seconds == pytest.approx(charged, abs=0.08)
    assert sum(len(s.new) for s in samples.seen) >= 3


async def test_churning_children_never_break_a_sample() -> None:
    """Children that appear and vanish mid-sample are tolerated: no sample fails."""
    samples = Samples()
    script = "i=0; while [ $i -lt 150 ]; do /bin/true; i=$((i+1)); done"
    async with shell_command(("sh", "-c", script)) as worker, trio.open_nursery() as nursery:
        nursery.start_soon(observe(samples, worker.info))
        last = await samples.until(lambda s: s.finished)
    assert last.cpu_seconds is not None
    seen = {snap.key for s in samples.seen for snap in s.new}
    ended = {key for s in samples.seen for key in s.exited}
    assert seen <= ended


async def test_a_reused_pid_is_not_the_root() -> None:
    """A root whose creation time does not match the live pid is reported gone, never read."""
    me = psutil.Process()
    root = ProcessKey(pid=me.pid, create_time=float(me.create_time()) - 5.0)
    sample = TreeObserver.of(root).sample()
    assert sample.finished
    assert sample.exited == (root,)
    assert sample.cpu_seconds is None
    assert sample.rss_bytes is None


async def test_argv_is_bounded() -> None:
    """A long command line is cut to the observer's bound and marked as cut."""
    async with shell_command(("sh", "-c", "sleep 30", "x" * 500)) as worker:
        observer = TreeObserver.of(worker.info, argv_limit=40)
        with trio.fail_after(5):
            # Just after exec the kernel may not show the new command line yet.
            while not (root := observer.sample().processes[0]).argv:  # noqa: ASYNC110
                await trio.sleep(0.01)
    assert root.key == worker.info.key
    assert root.argv_truncated
    assert root.argv is not None
    assert root.argv[:3] == ("sh", "-c", "sleep 30")
    assert sum(map(len, root.argv)) == 40


async def test_adopted_processes_are_members_from_the_first_sample() -> None:
    """Processes named in ``adopt`` that still run (the children a restarted supervisor
    recorded, even when they left the root's tree) are members from the first sample, not
    new; their exit is seen. A key whose process started at another time is not taken, and
    nothing is adopted into a tree whose root is gone."""
    sleep = ("sleep", "30")
    async with shell_command(sleep) as root, shell_command(sleep) as outside:
        moved = outside.info.key  # not the root's descendant: a child that left the tree
        reused = ProcessKey(moved.pid, moved.create_time - 100.0)
        observer = TreeObserver.of(root.info, adopt=[moved, reused])
        first = await trio.to_thread.run_sync(observer.sample)
        assert [p.key for p in first.processes] == [root.info.key, moved]
        assert first.new == ()
        assert first.exited == ()
        os.kill(moved.pid, signal.SIGKILL)
        with trio.fail_after(5):
            while True:
                sample = await trio.to_thread.run_sync(observer.sample)
                if moved in sample.exited:
                    break
                await trio.sleep(0.02)
        assert [p.key for p in sample.processes] == [root.info.key]
        observer.close()
        gone_root = ProcessKey(root.info.pid, root.info.create_time - 100.0)
        orphaned = TreeObserver.of(gone_root, adopt=[root.info.key])
        alone = await trio.to_thread.run_sync(orphaned.sample)
        assert alone.finished
        assert alone.exited == (gone_root,)
        orphaned.close()
