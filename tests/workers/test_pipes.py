"""The pipe hub: one task reading every worker pipe, with an owner's fast path.

Real pipes (``os.pipe``) and real worker processes; a hub reader is checked against a plain
:class:`LineReader` reading the same bytes.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest
import trio
import trio.lowlevel
from hypothesis import given, settings
from hypothesis import strategies as st

from braid_actors.errors import WorkerLineTooLong
from braid_actors.workers import (
    HubLineReader,
    LineReader,
    PipeHub,
    StopPolicy,
    open_worker,
    pipe_hub_supported,
)
from braid_actors.workers._pipes import TICK

FAST = StopPolicy(grace=0.5, term_grace=0.5, kill_grace=2.0)


def test_the_hub_is_supported_here() -> None:
    """This machine (Linux) has epoll: the supervisor reads worker pipes with a hub."""
    assert pipe_hub_supported()


@asynccontextmanager
async def running_hub(*, tick: float = TICK) -> AsyncIterator[PipeHub]:
    async with trio.open_nursery() as nursery:
        hub: PipeHub = await nursery.start(PipeHub(tick=tick).run)
        yield hub
        nursery.cancel_scope.cancel()


@asynccontextmanager
async def hub_pipe(
    hub: PipeHub, *, max_line: int = 1 << 20
) -> AsyncIterator[tuple[HubLineReader, int]]:
    """A hub reader on a fresh pipe, and the pipe's write end."""
    read_end, write_end = os.pipe()
    stream = trio.lowlevel.FdStream(read_end)  # makes it non-blocking, closes it
    reader = hub.reader(stream, max_line=max_line)
    try:
        yield reader, write_end
    finally:
        reader.close()
        await stream.aclose()
        os.close(write_end)


async def read_all(reader: HubLineReader | LineReader) -> list[bytes]:
    lines = []
    with trio.fail_after(10):
        while (line := await reader.receive_line()) is not None:
            lines.append(line)
    return lines


async def write_chunks(fd: int, chunks: list[bytes]) -> None:
    for chunk in chunks:
        os.write(fd, chunk)
        await trio.sleep(0.001)  # separate reads, as a worker's writes arrive


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points) if b > a]


@settings(max_examples=40, deadline=None)
@given(
    lines=st.lists(st.binary(max_size=300).map(lambda b: b.replace(b"\n", b"_")), max_size=12),
    tail=st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"_")),
    cuts=st.lists(st.integers(min_value=0, max_value=4000), max_size=8),
)
def test_a_hub_reader_reads_what_a_line_reader_reads(
    lines: list[bytes], tail: bytes, cuts: list[int]
) -> None:
    """However the bytes arrive, the same lines, the same fragment, the same count."""
    data = b"".join(line + b"\n" for line in lines) + tail
    chunks = split_at(data, cuts)

    async def main() -> None:
        async with running_hub() as hub, hub_pipe(hub) as (reader, write_end):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(write_chunks, write_end, chunks)
                got: list[bytes] = []
                with trio.fail_after(10):
                    for _ in lines:
                        line = await reader.receive_line()
                        assert line is not None
                        got.append(line)
            assert got == lines
            assert reader.lines_read == len(lines)
        # the plain reader, on the same bytes, ends with the same fragment at EOF
        plain_read, plain_write = os.pipe()
        os.write(plain_write, data)
        os.close(plain_write)
        plain = LineReader(trio.lowlevel.FdStream(plain_read))
        assert await read_all(plain) == lines
        assert plain.fragment == tail

    trio.run(main)


async def test_at_the_end_of_the_stream_a_trailing_fragment_is_kept() -> None:
    async with running_hub() as hub:
        read_end, write_end = os.pipe()
        stream = trio.lowlevel.FdStream(read_end)
        reader = hub.reader(stream)
        os.write(write_end, b"one\ntwo\nhalf a li")
        os.close(write_end)
        assert await read_all(reader) == [b"one", b"two"]
        assert reader.fragment == b"half a li"
        assert await reader.receive_line() is None
        await stream.aclose()


async def test_an_overlong_line_is_refused_like_a_line_readers() -> None:
    async with running_hub() as hub, hub_pipe(hub, max_line=10) as (reader, write_end):
        os.write(write_end, b"short\n" + b"x" * 11 + b"\n")
        assert await reader.receive_line() == b"short"
        with pytest.raises(WorkerLineTooLong) as caught:
            await reader.receive_line()
        assert caught.value.details == {"line": 2, "limit": 10}
        # and a line that grows past the bound before its newline arrives
    async with running_hub() as hub, hub_pipe(hub, max_line=10) as (reader, write_end):
        os.write(write_end, b"y" * 11)
        with pytest.raises(WorkerLineTooLong):
            await reader.receive_line()


def recording_fast(taken: list[bytes], take: Callable[[bytes], bool]) -> Callable[[bytes], bool]:
    def fast(line: bytes) -> bool:
        if take(line):
            taken.append(line)
            return True
        return False

    return fast


async def until(condition: Callable[[], bool]) -> None:
    # polls the hub's own state, which no event reports
    with trio.fail_after(10):
        while not condition():  # noqa: ASYNC110
            await trio.sleep(0.002)


async def test_the_fast_path_takes_lines_only_while_the_owner_waits_with_none_queued() -> None:
    """A declined line, and every line after it, reach the owner in order."""
    taken: list[bytes] = []
    async with running_hub() as hub, hub_pipe(hub) as (reader, write_end):
        reader.fast = recording_fast(taken, lambda line: line.startswith(b"f"))
        received: list[bytes] = []
        busy = trio.Event()
        async with trio.open_nursery() as nursery:

            async def owner() -> None:
                line = await reader.receive_line()
                assert line is not None
                received.append(line)
                await busy.wait()  # busy with it: the hub must queue, not take
                for _ in range(2):
                    line = await reader.receive_line()
                    assert line is not None
                    received.append(line)

            nursery.start_soon(owner)
            await until(lambda: reader._waiter is not None)
            os.write(write_end, b"f1\ns2\nf3\n")
            await until(lambda: received == [b"s2"])
            os.write(write_end, b"f4\n")
            await until(lambda: len(reader._lines) == 2)  # f3 and f4, queued
            busy.set()
        assert taken == [b"f1"]
        assert received == [b"s2", b"f3", b"f4"]
        # the owner is parked again with nothing queued: the hub takes the next one
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader.receive_line)
            await until(lambda: reader._waiter is not None)
            os.write(write_end, b"f5\n")
            await until(lambda: len(taken) == 2)
            assert taken == [b"f1", b"f5"]
            nursery.cancel_scope.cancel()
        assert reader.lines_read == 5


async def test_a_long_pass_over_ready_pipes_lets_other_tasks_run() -> None:
    """With many pipes ready and slow fast paths, the hub pauses within a pass (every
    ``SLICE`` of reading), so another task runs before the pass ends; every line is taken
    once, in each pipe's order."""
    events: list[str] = []
    pipes = 48

    def slow_fast(line: bytes) -> bool:
        until_ = time.perf_counter() + 0.001  # 1 ms of work a line: ~50 ms a pass
        while time.perf_counter() < until_:
            pass
        events.append(line.decode())
        return True

    async with running_hub() as hub, contextlib.AsyncExitStack() as stack:
        opened = [await stack.enter_async_context(hub_pipe(hub)) for _ in range(pipes)]
        async with trio.open_nursery() as nursery:
            for reader, _write_end in opened:
                reader.fast = slow_fast
                nursery.start_soon(reader.receive_line)  # the owner waits: the hub takes
            await until(lambda: all(r._waiter is not None for r, _ in opened))
            pauses = hub.pauses
            for index, (_reader, write_end) in enumerate(opened):  # all ready at once
                os.write(write_end, f"p{index}.a\np{index}.b\n".encode())

            async def ticker() -> None:
                while True:
                    events.append("tick")
                    await trio.lowlevel.checkpoint()

            nursery.start_soon(ticker)
            await until(lambda: sum(e != "tick" for e in events) == 2 * pipes)
            nursery.cancel_scope.cancel()
    lines = [e for e in events if e != "tick"]
    assert sorted(lines) == sorted(f"p{i}.{x}" for i in range(pipes) for x in "ab")
    for i in range(pipes):
        assert lines.index(f"p{i}.a") < lines.index(f"p{i}.b")
    first, last = events.index(lines[0]), events.index(lines[-1])
    assert "tick" in events[first:last]  # another task ran in the middle of the pass
    assert hub.pauses > pauses


async def test_lines_that_arrive_within_a_tick_are_read_in_one_pass() -> None:
    """After a pass the hub waits out its tick before the next one: lines written to
    several pipes meanwhile are read together, by one pass, a tick after the last began."""
    tick = 0.3
    taken: list[tuple[bytes, float]] = []

    def stamp(line: bytes) -> bool:
        taken.append((line, trio.current_time()))
        return True

    async with running_hub(tick=tick) as hub, contextlib.AsyncExitStack() as stack:
        opened = [await stack.enter_async_context(hub_pipe(hub)) for _ in range(3)]
        async with trio.open_nursery() as nursery:
            for reader, _write_end in opened:
                reader.fast = stamp
                nursery.start_soon(reader.receive_line)  # the owners wait: the hub takes
            await until(lambda: all(r._waiter is not None for r, _ in opened))
            os.write(opened[0][1], b"first\n")
            await until(lambda: len(taken) == 1)
            passes = hub.passes
            for _reader, write_end in opened:  # 20 ms apart, all within the tick
                os.write(write_end, b"later\n")
                await trio.sleep(0.02)
            await until(lambda: len(taken) == 4)
            nursery.cancel_scope.cancel()
    assert [line for line, _ in taken] == [b"first", b"later", b"later", b"later"]
    assert hub.passes == passes + 1
    first_at = taken[0][1]
    assert all(at - first_at >= tick - 0.01 for _, at in taken[1:])


async def test_a_queued_line_is_returned_without_a_trip_through_the_scheduler() -> None:
    """An owner that fell behind drains what is queued without yielding to every other
    task once per line (it would never catch up with a busy stream); a cancellation is
    still raised, and takes no line."""
    async with running_hub() as hub, hub_pipe(hub) as (reader, write_end):
        os.write(write_end, b"a\nb\nc\n")
        await until(lambda: len(reader._lines) == 3)
        ran: list[str] = []

        async def other() -> None:
            ran.append("other")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(other)  # ready: it runs at this task's next schedule point
            got = [await reader.receive_line(), await reader.receive_line()]
            assert ran == []
        assert ran == ["other"]
        assert got == [b"a", b"b"]
        with trio.CancelScope() as scope:
            scope.cancel()
            await reader.receive_line()
        assert scope.cancelled_caught
        assert await reader.receive_line() == b"c"


async def test_one_task_at_a_time_reads_a_pipe() -> None:
    async with running_hub() as hub, hub_pipe(hub) as (reader, write_end):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader.receive_line)
            await until(lambda: reader._waiter is not None)
            with pytest.raises(trio.BusyResourceError):
                await reader.receive_line()
            os.write(write_end, b"for the first\n")
        assert reader.lines_read == 1


async def test_a_fast_path_that_raises_declines_the_line() -> None:
    offered: list[bytes] = []

    def broken(line: bytes) -> bool:
        offered.append(line)
        raise ValueError("not mine")

    async with running_hub() as hub, hub_pipe(hub) as (reader, write_end):
        reader.fast = broken
        os.write(write_end, b"kept\n")
        with trio.fail_after(5):
            assert await reader.receive_line() == b"kept"
        assert offered == [b"kept"]


async def test_a_closed_reader_and_a_stopped_hub_end_their_readers() -> None:
    async with running_hub() as hub, hub_pipe(hub) as (reader, _):
        reader.close()
        with pytest.raises(trio.ClosedResourceError):
            await reader.receive_line()
    read_end, write_end = os.pipe()
    stream = trio.lowlevel.FdStream(read_end)
    async with running_hub() as hub:
        orphan = hub.reader(stream)
    assert not hub.running
    with pytest.raises(trio.ClosedResourceError):
        await orphan.receive_line()
    with pytest.raises(trio.ClosedResourceError):
        hub.reader(stream)
    await stream.aclose()
    os.close(write_end)


async def test_a_worker_opened_with_the_hub_is_read_by_it() -> None:
    """``open_worker(pipes=hub)`` reads stdout through the hub, and unregisters at exit."""
    script = "import json\nfor i in range(50):\n    print(json.dumps({'type': 'n', 'i': i}))\n"
    async with running_hub() as hub:
        async with open_worker((sys.executable, "-c", script), policy=FAST, pipes=hub) as worker:
            assert isinstance(worker.reader, HubLineReader)
            got = []
            with trio.fail_after(10):
                while (message := await worker.receive()) is not None:
                    got.append(message["i"])
        assert got == list(range(50))
        assert hub.watching == 0
