"""Erlang/OTP restart strategies and restart intensity, as pure decisions.

Theory of operation: when a child of a supervisor exits, :data:`RESTART_ON` says whether that
exit calls for a restart at all (``permanent``: any exit; ``transient``: a failure only;
``temporary``: never). If it does, :class:`RestartWindow` counts the restart against the
supervisor's intensity (at most ``max_restarts`` restarts within any ``period`` seconds), and
:func:`plan_restart` says which siblings to stop (reverse start order) and which children to
start again (start order):

=============  =============================  ====================================
strategy       stops                          starts
=============  =============================  ====================================
one_for_one    nothing                        the failed child
one_for_all    every other live child         all of them, failed child included
rest_for_one   live children started after    the failed child and those
=============  =============================  ====================================

A temporary child stopped because of a sibling is not started again. Everything that decides
which children a failure stops and restarts lives here; the supervisor (``_kit.py``) only
carries the decisions out. No trio and no clock: time is an argument.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Generic, Literal, TypeVar, get_args

import attrs

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

Strategy = Literal["one_for_one", "one_for_all", "rest_for_one"]
Restart = Literal["permanent", "transient", "temporary"]
ExitKind = Literal["failed", "returned"]

STRATEGIES: tuple[Strategy, ...] = get_args(Strategy)
RESTARTS: tuple[Restart, ...] = get_args(Restart)

RESTART_ON: dict[Restart, frozenset[ExitKind]] = {
    "permanent": frozenset({"failed", "returned"}),
    "transient": frozenset({"failed"}),
    "temporary": frozenset(),
}
"""Which kinds of exit make a child of each restart type be started again."""

T = TypeVar("T")


@attrs.frozen
class RestartPlan:
    """What one restart does, in order: stop these, then start those."""

    stop: tuple[str, ...]
    """Live siblings to stop, in reverse start order."""
    start: tuple[str, ...]
    """Children to start, in start order; the failed child is among them."""


def plan_restart(
    strategy: Strategy,
    order: Sequence[str],
    live: Sequence[str],
    failed: str,
    restart: Mapping[str, Restart],
) -> RestartPlan:
    """The restart of ``failed`` (a child whose exit calls for one) under ``strategy``.

    ``order`` names every child in start order; ``live`` the siblings that are running or
    waiting to be started (a restart interrupted by a failed start leaves some waiting).
    """
    if failed not in order:
        raise ValueError(f"{failed} is not a child of this supervisor")
    if strategy == "one_for_one":
        affected: list[str] = []
    elif strategy == "one_for_all":
        affected = [name for name in order if name != failed and name in live]
    else:  # rest_for_one
        later = order[order.index(failed) + 1 :]
        affected = [name for name in later if name in live]
    again = {failed, *(name for name in affected if restart[name] != "temporary")}
    return RestartPlan(
        stop=tuple(reversed(affected)),
        start=tuple(name for name in order if name in again),
    )


@attrs.define(eq=False)
class RestartWindow(Generic[T]):
    """Restart intensity: at most ``max_restarts`` restarts within any ``period`` seconds.

    Each restart is recorded with what caused it; a restart stays counted while
    ``now - its time < period`` (a sliding window).
    """

    max_restarts: int
    period: float
    _recent: deque[tuple[float, T]] = attrs.field(factory=deque, init=False)

    def __attrs_post_init__(self) -> None:
        if self.max_restarts < 0:
            raise ValueError(f"max_restarts must be at least 0, not {self.max_restarts}")
        if not self.period > 0:
            raise ValueError(f"period must be positive, not {self.period}")

    def record(self, now: float, cause: T) -> bool:
        """Count one restart at ``now``; False when that is one too many for the window."""
        self._expire(now)
        self._recent.append((now, cause))
        return len(self._recent) <= self.max_restarts

    def causes(self, now: float) -> tuple[T, ...]:
        """What caused the restarts still counted at ``now``, oldest first."""
        self._expire(now)
        return tuple(cause for _, cause in self._recent)

    def _expire(self, now: float) -> None:
        while self._recent and now - self._recent[0][0] >= self.period:
            self._recent.popleft()
