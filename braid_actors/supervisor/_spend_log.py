"""Which of a run's worker samples are journaled as ``worker.observed``."""

from __future__ import annotations

import math

import attrs
import trio

from braid_actors.model import WorkerSpend

OBSERVED_HEARTBEAT = 10.0
"""A sample whose CPU time and peak RSS did not move since the last journaled one is
journaled only once this many seconds have passed since that one."""


@attrs.define
class SpendLog:
    """The last figures a run journaled for its root worker, and when.

    A sample is journaled when it is the first, when its CPU time or peak RSS moved, and
    otherwise once per :data:`OBSERVED_HEARTBEAT`: an idle worker's samples (every half
    second by default, for every run) would fill the journal with copies. Limits are
    checked on every sample either way, and the run journals its last figures when its
    workers end (:meth:`behind`).
    """

    last: WorkerSpend | None = None
    at: float = -math.inf

    def due(self, spend: WorkerSpend) -> bool:
        """Whether the sample with these figures is journaled."""
        last = self.last
        return (
            last is None
            or spend.cpu_seconds != last.cpu_seconds
            or spend.rss_bytes != last.rss_bytes
            or trio.current_time() - self.at >= OBSERVED_HEARTBEAT
        )

    def behind(self, spend: WorkerSpend | None) -> bool:
        """Whether these latest figures are not journaled yet."""
        return spend is not None and spend is not self.last

    def journaled(self, spend: WorkerSpend) -> None:
        self.last, self.at = spend, trio.current_time()
