"""The local turn's fast path for part updates read by the supervisor's pipe hub.

A streaming worker sends mostly ``part`` lines. When its stdout is read by a
:class:`~braid_actors.workers.PipeHub` and the turn's sink can take a part without waiting
(:class:`~braid_actors.providers.PartNowaitSink`), :func:`fast_parts` gives the hub a
function that handles such a line in the hub's own task: decode it, check it is a part of a
named session, and queue the update; the turn's task is not woken. Anything else (another
message type, a line that does not decode, a sink that can't take it now) is declined, and
the turn's task then reads that line and handles it as every other line, with the same
checks and errors. So the fast path changes who handles a part line, never what is done.
"""

from __future__ import annotations

import contextlib
import math
from typing import TYPE_CHECKING

import trio

from braid_actors.providers._port import PartNowaitSink
from braid_actors.workers import HubLineReader, decode_message, structure_part

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from braid_actors.providers._port import RunSink, SessionInfo


@contextlib.contextmanager
def fast_parts(
    worker: object,
    sink: RunSink,
    session: Callable[[], SessionInfo | None],
    idle: trio.CancelScope,
    idle_seconds: float,
    refresh_every: float,
) -> Iterator[None]:
    """Give the hub the turn's fast path for the block, when ``worker`` is read by a hub
    and ``sink`` can take parts without waiting (else nothing changes).

    ``session`` tells whether the worker named its session yet (a part before it is a
    protocol error the turn's own path reports). A handled line moves the turn's ``idle``
    deadline to ``idle_seconds`` from now, as the turn's own receive does: at most once per
    ``refresh_every`` seconds.
    """
    reader = getattr(worker, "reader", None)
    if not isinstance(reader, HubLineReader) or not isinstance(sink, PartNowaitSink):
        yield
        return
    reader.fast = _fast(sink, session, idle, idle_seconds, refresh_every)
    try:
        yield
    finally:
        reader.fast = None


def _fast(
    sink: PartNowaitSink,
    session: Callable[[], SessionInfo | None],
    idle: trio.CancelScope,
    idle_seconds: float,
    refresh_every: float,
) -> Callable[[bytes], bool]:
    refreshed = -math.inf

    def fast(line: bytes) -> bool:
        nonlocal refreshed
        if session() is None:
            return False
        message = decode_message(line, number=0)  # an error declines: the turn reports it
        if message["type"] != "part":
            return False
        if not sink.part_nowait(structure_part(message.get("part"))):
            return False
        now = trio.current_time()
        if now - refreshed >= refresh_every:
            idle.deadline, refreshed = now + idle_seconds, now
        return True

    return fast
