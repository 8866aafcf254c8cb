"""Re-attaching to a local worker that outlived its supervisor.

Every local worker is started with ``--spool DIR --run RUN_ID --detach-on-eof``: each line
it sends is also appended to ``DIR/<run>.jsonl``, and when Braid's pipes close it keeps
working, reports to the spool only, and reads controls from ``DIR/<run>.control.jsonl``.

A restarted supervisor replays the spool from the beginning through the same message
handling as a live turn, with a :class:`QuietSink` that drops the reports the journal
already holds (the first ``skip`` event-producing messages), answers interactions that are
already answered with their recorded answer (the worker ignores ones it already had), and
waits for the ones still pending. While the worker runs the spool is followed; once it is
gone and the spool is exhausted the turn has ended (a missing ``done`` is reported as such).
"""

from __future__ import annotations

import os
import re
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import attrs
import trio

from braid_actors.providers._port import InteractionAnswer, InteractionRequest, RunSink, SessionInfo
from braid_actors.workers import (
    ProcessInfo,
    StopPolicy,
    StopReport,
    decode_message,
    encode_message,
    recognise,
)
from braid_actors.workers import kill as kill_process
from braid_actors.workers import stop as stop_process

if TYPE_CHECKING:
    from braid_actors.model import Part, Usage
    from braid_actors.providers._port import WorkerInfo

FOLLOW_POLL = 0.05
READ_CHUNK: Final = 1 << 20
PRIME_BYTES: Final = 1 << 16
"""The most :meth:`SpoolSource.prime` reads on the event loop's thread."""
EVENT_TYPES = frozenset({"session", "part", "interaction", "usage"})
"""Spool message types that become journal events (what ``skip`` counts)."""


def spool_began(path: Path) -> bool:
    """True when a spool holds a ``session`` or ``done`` line: the turn really began.

    Every line is compact JSON (``encode_message``) and a part's text can't contain an
    unescaped ``"type":"session"``, so a byte search is exact without decoding every line.
    """
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return False
    return b'"type":"session"' in raw or b'"type":"done"' in raw


def read_spool(path: Path) -> list[dict[str, Any]]:
    """Every complete line of a spool, decoded (a torn last line is ignored)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return []
    lines = raw.split(b"\n")
    return [decode_message(line, number=n + 1) for n, line in enumerate(lines[:-1]) if line]


_PART_PREFIX: Final = b'{"type":"part",'
"""How ``encode_message`` starts a ``part`` message (its ``type`` key comes first)."""
_PART_LINES: Final = re.compile(rb'(?:\{"type":"part",[^\n]*\n)+')
"""One or more whole lines in a row that start as part messages do."""


@attrs.define(eq=False)
class SpoolSource:
    """Stands in for a :class:`WorkerProcess` of a worker this process did not spawn."""

    info: ProcessInfo
    spool: Path
    control: Path
    policy: StopPolicy
    _offset: int = 0
    _buffer: bytes = b""
    _pos: int = 0
    """Where the unread part of ``_buffer`` starts (slicing per line would be quadratic)."""
    _lines: int = 0
    _drained: bool = False
    """The worker was gone before a read that reached the spool's end: nothing can follow."""
    stop_report: StopReport | None = None

    def _alive(self) -> bool:
        return recognise(self.info.pid, self.info.create_time, self.info.pgid)

    def buffered(self, skip_parts: Callable[[int], int] | None = None) -> dict[str, Any] | None:
        """A message already read from the spool, without waiting (replay is not timed).

        With ``skip_parts``, part lines the journal already holds are passed over without
        being decoded: a restart replays every spool from its start, and the parts before
        the committed cursor are most of it (and were checked when first received). Only
        lines the worker's own encoder starts with ``_PART_PREFIX`` are candidates; a run of
        them is found in one regular-expression match, ``skip_parts(n)`` says how many of
        its ``n`` lines are already journaled, and those are passed over at once. Anything
        else is decoded as usual.
        """
        buffer = self._buffer
        while (nl := buffer.find(b"\n", self._pos)) >= 0:
            start = self._pos
            if skip_parts is not None and buffer.startswith(_PART_PREFIX, start):
                run = _PART_LINES.match(buffer, start)
                assert run is not None  # this very line matches
                count = buffer.count(b"\n", start, run.end())
                taken = skip_parts(count)
                if taken:
                    if taken == count:
                        self._pos = run.end()
                    else:
                        for _ in range(taken):
                            self._pos = buffer.index(b"\n", self._pos) + 1
                    self._lines += taken
                    continue
            self._pos = nl + 1
            self._lines += 1
            if nl == start:
                continue
            return decode_message(buffer[start:nl], number=self._lines)
        return None

    def _append(self, chunk: bytes) -> None:
        self._buffer, self._pos = self._buffer[self._pos :] + chunk, 0

    async def receive(self) -> dict[str, Any] | None:
        """The next spool message; waits for more while the worker runs."""
        while True:
            ready = self.buffered()
            if ready is not None:
                return ready
            if self._drained:
                return None
            alive, chunk = await trio.to_thread.run_sync(self._read_more)
            if chunk:
                self._append(chunk)
                continue
            if not alive:
                return None
            await trio.sleep(FOLLOW_POLL)

    def prime(self) -> None:
        """Read the start of the spool (at most :data:`PRIME_BYTES`) now, on the caller's
        thread: a restart reconciles every run by replaying a short spool, and a thread
        round trip (~150 us of the event loop each at 1,000 runs) cost more than reading
        it. A gone worker's whole spool is usually drained by this one read."""
        self._append(self._read_more(PRIME_BYTES)[1])

    def _read_more(self, limit: int = READ_CHUNK) -> tuple[bool, bytes]:
        """Whether the worker ran just before the read, and what the read found.

        The check comes first: a worker seen gone before a read that reached the end of
        the spool can write nothing more, so its spool is drained without another read (a
        restart reconciles every run this way).
        """
        alive = self._alive()
        try:
            with self.spool.open("rb") as f:
                f.seek(self._offset)
                data = f.read(limit)
        except FileNotFoundError:
            data = b""
        self._offset += len(data)
        self._drained = not alive and len(data) < limit
        return alive, data

    async def send(self, message: Mapping[str, Any]) -> None:
        """Append a control line for the detached worker."""
        data = encode_message(message)

        def write() -> None:
            fd = os.open(self.control, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)

        await trio.to_thread.run_sync(write)

    async def wait(self) -> int | None:
        # Not our child, so no exit notification reaches us: poll its identity.
        while self._alive():  # noqa: ASYNC110
            await trio.sleep(FOLLOW_POLL)
        return None  # another process reaps it: its status is not known here

    async def stop(
        self,
        cooperative: Callable[[], Awaitable[None]] | None = None,
        *,
        policy: StopPolicy | None = None,
    ) -> StopReport | None:
        result = await stop_process(self.info, policy or self.policy, cooperative=cooperative)
        del result
        return None

    async def kill(self) -> None:
        await kill_process(self.info)


@attrs.define(eq=False)
class QuietSink:
    """Drops the reports already journaled; re-delivers or awaits interaction answers."""

    inner: RunSink
    skip: int
    answers: Mapping[str, InteractionAnswer | None]
    """Interactions the journal holds: the recorded answer, or None while pending."""
    await_pending: Callable[[str], Awaitable[InteractionAnswer]]
    _seen: int = 0

    def _quiet(self) -> bool:
        self._seen += 1
        return self._seen <= self.skip

    def skip_parts(self, count: int) -> int:
        """Consume quiet slots for up to ``count`` part updates the journal already holds;
        how many it took (none once every journaled report was passed over)."""
        taken = max(0, min(count, self.skip - self._seen))
        self._seen += taken
        return taken

    async def worker_started(self, worker: WorkerInfo) -> None:
        return None  # recorded by the supervisor that started it

    async def session(self, info: SessionInfo) -> None:
        if not self._quiet():
            await self.inner.session(info)

    async def part(self, part: Part) -> None:
        if not self._quiet():
            await self.inner.part(part)

    async def interaction(self, request: InteractionRequest) -> InteractionAnswer:
        if not self._quiet():
            return await self.inner.interaction(request)
        if request.interaction_id in self.answers:
            recorded = self.answers[request.interaction_id]
            if recorded is not None:
                return recorded
            return await self.await_pending(request.interaction_id)
        return InteractionAnswer(False, "the interaction is not in Braid's record")

    async def usage(self, usage: Usage, cost_usd: float | None) -> None:
        if not self._quiet():
            await self.inner.usage(usage, cost_usd)
