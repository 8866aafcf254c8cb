"""The observation hub: one observer ticking for every watched tree, on real processes."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import pytest
import trio

from braid_actors.workers import (
    ObservationHub,
    ProcessKey,
    ProcessTable,
    TreeSample,
    Watch,
    read_parent_ids,
)
from braid_actors.workers._hub import CHUNK
from tests.workers._procs import SPAWN_CHILD, open_stat_files, python, read_line

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Set

SLEEPER = "import time\nprint('ready', flush=True)\ntime.sleep(30)\n"
SHORT = "import time\nprint('ready', flush=True)\ntime.sleep(0.3)\n"


class Seen:
    def __init__(self, delay: float = 0.0) -> None:
        self.samples: list[TreeSample] = []
        self.delay = delay
        self._changed = trio.Event()

    async def __call__(self, sample: TreeSample) -> None:
        self.samples.append(sample)
        self._changed.set()
        self._changed = trio.Event()
        await trio.sleep(self.delay)

    async def until(self, check: Callable[[list[TreeSample]], bool]) -> None:
        with trio.fail_after(10):
            while not check(self.samples):
                await self._changed.wait()


async def test_watched_trees_are_sampled_every_tick_from_one_table() -> None:
    hub = ObservationHub(0.2)
    one_seen, two_seen = Seen(), Seen()
    async with python(SLEEPER) as one, python(SLEEPER) as two, trio.open_nursery() as n:
        assert await read_line(one) == "ready"
        assert await read_line(two) == "ready"
        await n.start(hub.run)
        hub.watch(one.info.key, one_seen, n)
        hub.watch(two.info.key, two_seen, n)
        await trio.sleep(1.1)
        n.cancel_scope.cancel()
    assert 4 <= len(one_seen.samples) <= 8
    assert 4 <= len(two_seen.samples) <= 8
    assert [s.number for s in one_seen.samples] == list(range(1, len(one_seen.samples) + 1))
    assert all(s.root_alive for s in one_seen.samples + two_seen.samples)
    assert hub.table is not None
    # Both trees in every tick, but the system's table read once per tick (and once for
    # the first samples before the first tick), not once per tree per tick.
    assert hub.table.reads <= hub.ticks + 1 < len(one_seen.samples) + len(two_seen.samples)
    # Every delivered sample was counted, with the thread time it took.
    assert hub.samples >= len(one_seen.samples) + len(two_seen.samples)
    assert 0 < hub.sample_cpu_seconds < 1.1
    # Two sleeping trees: after their first samples most repeat, and each is counted.
    delivered = one_seen.samples + two_seen.samples
    repeated = sum(1 for s in delivered if s.repeated)
    assert repeated >= len(delivered) // 2
    assert not one_seen.samples[0].repeated and not two_seen.samples[0].repeated
    assert repeated <= hub.repeated_samples <= hub.samples


async def test_a_new_watch_gets_its_first_sample_without_waiting_for_the_tick() -> None:
    hub = ObservationHub(30.0)
    seen = Seen()
    async with python(SLEEPER) as worker, trio.open_nursery() as n:
        assert await read_line(worker) == "ready"
        await n.start(hub.run)
        hub.watch(worker.info.key, seen, n)
        await seen.until(bool)
        n.cancel_scope.cancel()
    assert seen.samples[0].number == 1
    assert seen.samples[0].root_alive


async def test_a_finished_tree_ends_its_watch_after_the_last_sample() -> None:
    hub = ObservationHub(0.1)
    seen = Seen()
    async with python(SHORT) as worker, trio.open_nursery() as n:
        assert await read_line(worker) == "ready"
        await n.start(hub.run)
        watch = hub.watch(worker.info.key, seen, n)
        await seen.until(lambda samples: bool(samples) and samples[-1].finished)
        await trio.sleep(0.05)  # the delivery task ends
        assert watch.closed
        count = len(seen.samples)
        await trio.sleep(0.4)
        n.cancel_scope.cancel()
    assert seen.samples[-1].finished
    assert len(seen.samples) == count  # nothing after the last one
    assert hub.watching == 0


async def test_a_slow_consumer_delays_only_its_own_samples() -> None:
    hub = ObservationHub(0.1)
    slow, quick = Seen(delay=0.6), Seen()
    async with python(SLEEPER) as one, python(SLEEPER) as two, trio.open_nursery() as n:
        assert await read_line(one) == "ready"
        assert await read_line(two) == "ready"
        await n.start(hub.run)
        hub.watch(one.info.key, slow, n)
        hub.watch(two.info.key, quick, n)
        await trio.sleep(1.0)
        n.cancel_scope.cancel()
    assert len(slow.samples) <= 2  # one being handled at a time, none queued behind it
    assert len(quick.samples) >= 6


async def test_a_closed_watch_gets_nothing_more() -> None:
    hub = ObservationHub(0.1)
    seen = Seen()
    async with python(SLEEPER) as worker, trio.open_nursery() as n:
        assert await read_line(worker) == "ready"
        await n.start(hub.run)
        watch = hub.watch(worker.info.key, seen, n)
        await seen.until(lambda samples: len(samples) >= 2)
        assert open_stat_files(worker.info.pid) == 1  # kept between samples
        watch.close()
        count = len(seen.samples)
        await trio.sleep(0.4)
        assert open_stat_files(worker.info.pid) == 0  # closed with the watch
        n.cancel_scope.cancel()
    assert len(seen.samples) <= count + 1  # at most the one already being taken
    assert hub.watching == 0


async def test_a_repeated_sample_is_offered_to_on_repeat_first() -> None:
    """``on_repeat`` takes a repeated sample at once (True: ``on_sample`` never sees it) or
    hands it on (False); a first sample, which repeats nothing, goes to ``on_sample``."""
    hub = ObservationHub(0.1)
    taking, passing = Seen(), Seen()
    offered: dict[str, list[TreeSample]] = {"taking": [], "passing": []}

    def offer(name: str, taken: bool) -> Callable[[TreeSample], bool]:
        def on_repeat(sample: TreeSample) -> bool:
            offered[name].append(sample)
            return taken

        return on_repeat

    async with python(SLEEPER) as one, python(SLEEPER) as two, trio.open_nursery() as n:
        assert await read_line(one) == "ready"
        assert await read_line(two) == "ready"
        await n.start(hub.run)
        hub.watch(one.info.key, taking, n, on_repeat=offer("taking", True))
        hub.watch(two.info.key, passing, n, on_repeat=offer("passing", False))
        await trio.sleep(1.0)
        n.cancel_scope.cancel()
    assert len(offered["taking"]) >= 5
    assert all(s.repeated for s in offered["taking"] + offered["passing"])
    assert taking.samples and not any(s.repeated for s in taking.samples)
    assert not taking.samples[0].repeated
    # Handed on: on_sample got every sample, the repeated ones after they were offered.
    assert [s for s in passing.samples if s.repeated] == offered["passing"]
    assert len(offered["passing"]) >= 5


async def test_what_on_repeat_raises_fails_its_watcher_only() -> None:
    seen = Seen()

    def on_repeat(sample: TreeSample) -> bool:
        raise RuntimeError("boom")

    watch = await _fails_its_watcher_only(
        lambda hub, key, watcher: hub.watch(key, seen, watcher, on_repeat=on_repeat), "boom"
    )
    assert watch.closed
    # its first samples, until one repeated the one before (a process settling after
    # its start can change between the first two)
    assert seen.samples and not any(s.repeated for s in seen.samples)


def test_an_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        ObservationHub(0.0)


async def test_a_failing_sample_fails_its_watcher_only() -> None:
    def broken(skip: Set[str]) -> dict[int, int]:
        raise RuntimeError("the process table could not be read")

    def watch_broken(hub: ObservationHub, key: ProcessKey, watcher: trio.Nursery) -> Watch:
        watch = hub.watch(key, Seen(), watcher)
        watch.observer.table = ProcessTable(read=broken)
        return watch

    await _fails_its_watcher_only(watch_broken, "could not be read")


async def _fails_its_watcher_only(
    start: Callable[[ObservationHub, ProcessKey, trio.Nursery], Watch], match: str
) -> Watch:
    """Two sleeping trees, one watched as usual, one by ``start`` in a nursery of its own
    that must fail with ``match``: the hub goes on sampling the other. Returns the failed
    watch."""
    hub = ObservationHub(0.1)
    quick = Seen()
    async with python(SLEEPER) as one, python(SLEEPER) as two, trio.open_nursery() as n:
        assert await read_line(one) == "ready"
        assert await read_line(two) == "ready"
        await n.start(hub.run)
        hub.watch(two.info.key, quick, n)
        with pytest.raises(ExceptionGroup) as failed:  # noqa: PT012
            async with trio.open_nursery() as watcher:
                watch = start(hub, one.info.key, watcher)
                await trio.sleep(10)  # (ended by the failure; if none comes, raises fails)
        assert failed.group_contains(RuntimeError, match=match)
        count = len(quick.samples)
        await quick.until(lambda samples: len(samples) >= count + 3)  # the hub goes on
        n.cancel_scope.cancel()
    return watch


async def test_chunks_of_a_tick_are_spread_over_half_the_interval() -> None:
    """130 watches are sampled in chunks of CHUNK trees, spread over half a 0.6 s interval."""
    hub = ObservationHub(0.6)
    first_seen: list[float] = []
    all_seen = trio.Event()

    async def note(sample: TreeSample) -> None:
        if sample.number == 1:
            first_seen.append(trio.current_time())
            if len(first_seen) == 130:
                all_seen.set()

    async with python(SLEEPER) as worker, trio.open_nursery() as n:
        assert await read_line(worker) == "ready"
        await n.start(hub.run)
        for _ in range(130):
            hub.watch(worker.info.key, note, n)
        with trio.fail_after(10):
            await all_seen.wait()
        n.cancel_scope.cancel()
    chunks = math.ceil(130 / CHUNK)
    gap = 0.6 / (2 * chunks)
    assert max(first_seen) - min(first_seen) >= (chunks - 1) * gap - 0.01


async def test_the_chunks_of_a_tick_share_one_read_of_the_process_table() -> None:
    """130 watches take their chunks spread over half of each 0.4 s tick; the system's parent
    ids are read once per tick for all of them (a table lasting a quarter interval was read
    two or three times per tick)."""
    hub = ObservationHub(0.4)
    samples = 0

    async def note(sample: TreeSample) -> None:
        nonlocal samples
        samples += 1

    async with python(SLEEPER) as worker, trio.open_nursery() as n:
        assert await read_line(worker) == "ready"
        await n.start(hub.run)
        for _ in range(130):
            hub.watch(worker.info.key, note, n)
        await trio.sleep(4 * 0.4 + 0.3)  # four ticks, and the fourth one's chunks
        n.cancel_scope.cancel()
    assert hub.ticks >= 3  # (a loaded machine may run a tick late)
    assert hub.table is not None
    assert samples >= 3 * 130
    assert hub.table.reads <= hub.ticks + 1


async def test_a_tick_reads_the_table_without_the_members_and_still_finds_new_children() -> None:
    """At a tick the table passes over the pids of the trees' members (nothing looks up
    their parents); a child one of them starts is not a member, so it is read and found."""
    asked: list[Set[str]] = []

    def read(skip: Set[str]) -> Mapping[int, int]:
        asked.append(skip)
        return read_parent_ids(skip)

    hub = ObservationHub(0.1, table=ProcessTable(0.1, read=read))
    seen = Seen()
    async with python(SPAWN_CHILD) as worker, trio.open_nursery() as n:
        assert await read_line(worker) == "ready"
        await n.start(hub.run)
        hub.watch(worker.info.key, seen, n)
        await seen.until(lambda samples: len(samples) >= 3)
        assert str(worker.info.pid) in asked[-1]  # a member: passed over
        await worker.send({"go": True})
        child = int(await read_line(worker))
        await seen.until(lambda samples: any(s.pid == child for x in samples for s in x.new))
        reads = len(asked)
        await seen.until(lambda samples: len(asked) > reads)  # the next tick's read
        n.cancel_scope.cancel()
    assert {str(worker.info.pid), str(child)} <= asked[-1]  # both members by then
