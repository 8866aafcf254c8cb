"""Fault injection for the crash matrix: SIGKILL this process at a named durable boundary.

``BRAID_CRASH_AT=<point>[@<n>]`` makes the n-th pass (default the first) through
``crash_point(point)`` kill the process with SIGKILL: no cleanup, no flush, nothing after
it runs — what a real crash leaves behind is exactly what recovery then sees. Without the
variable the check is one comparison against ``None``. The points are listed in
``CRASH_POINTS`` so a test can walk all of them.
"""

from __future__ import annotations

import os
import signal

CRASH_POINTS: tuple[str, ...] = (
    "op.create_conversation",
    "op.submit_turn",
    "run.admitted",
    "run.dispatched",
    "worker.started",
    "run.interaction",
    "interaction.answered",
    "run.part",
    "run.usage",
    "run.finishing",
    "run.finished",
    "op.cancel_run",
    "journal.committed",
    "shutdown.requested",
)

_target: str | None = None
_nth = 1
_seen = 0


def _configure() -> None:
    global _target, _nth
    spec = os.environ.get("BRAID_CRASH_AT") or None
    if spec is not None and "@" in spec:
        name, _, count = spec.partition("@")
        _target, _nth = name, max(1, int(count))
    else:
        _target, _nth = spec, 1


_configure()


def crash_point(name: str) -> None:
    """Kill this process here if ``BRAID_CRASH_AT`` names this point (see module doc)."""
    global _seen
    if _target is None or name != _target:
        return
    _seen += 1
    if _seen >= _nth:
        os.kill(os.getpid(), signal.SIGKILL)
