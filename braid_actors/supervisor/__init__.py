"""Supervision of runs: admission, run actors, deadlines, limits, cancellation, shutdown."""

from braid_actors.supervisor._run_actor import RunActor
from braid_actors.supervisor._runs import (
    DEFAULT_OBSERVE_INTERVAL,
    RunsSupervisor,
    commit,
    utc_now,
)
from braid_actors.supervisor._sink import JournalSink, PendingInteraction

__all__ = [
    "DEFAULT_OBSERVE_INTERVAL",
    "JournalSink",
    "PendingInteraction",
    "RunActor",
    "RunsSupervisor",
    "commit",
    "utc_now",
]
