"""Supervision of runs: admission, run actors, deadlines, shutdown."""

from braid_actors.supervisor._runs import JournalSink, RunsSupervisor, commit, utc_now

__all__ = ["JournalSink", "RunsSupervisor", "commit", "utc_now"]
