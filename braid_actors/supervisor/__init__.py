"""Supervision of runs: admission, run actors, deadlines, limits, cancellation, shutdown."""

from braid_actors.supervisor._kit import (
    DEFAULT_SHUTDOWN_GRACE,
    ChildSpec,
    SupervisorHandle,
    SupervisorSpec,
    run_supervisor,
    supervisor_child,
)
from braid_actors.supervisor._mailbox import ActorRef, Delivery, Mailbox, serve_requests
from braid_actors.supervisor._run_actor import RunActor
from braid_actors.supervisor._runs import (
    DEFAULT_OBSERVE_INTERVAL,
    RECORD_DEADLINE,
    RunsSupervisor,
    commit,
    utc_now,
)
from braid_actors.supervisor._sink import JournalSink, PendingInteraction

__all__ = [
    "DEFAULT_OBSERVE_INTERVAL",
    "DEFAULT_SHUTDOWN_GRACE",
    "RECORD_DEADLINE",
    "ActorRef",
    "ChildSpec",
    "Delivery",
    "JournalSink",
    "Mailbox",
    "PendingInteraction",
    "RunActor",
    "RunsSupervisor",
    "SupervisorHandle",
    "SupervisorSpec",
    "commit",
    "run_supervisor",
    "serve_requests",
    "supervisor_child",
    "utc_now",
]
