"""Restart strategies and restart intensity as pure decisions (no trio, no clock)."""

from __future__ import annotations

import pytest

from braid_actors.supervisor._strategies import (
    RESTART_ON,
    Restart,
    RestartPlan,
    RestartWindow,
    Strategy,
    plan_restart,
)

ORDER = ["a", "b", "c", "d"]
PERMANENT: dict[str, Restart] = dict.fromkeys(ORDER, "permanent")


@pytest.mark.parametrize(
    ("strategy", "plan"),
    [
        ("one_for_one", RestartPlan(stop=(), start=("b",))),
        ("one_for_all", RestartPlan(stop=("d", "c", "a"), start=("a", "b", "c", "d"))),
        ("rest_for_one", RestartPlan(stop=("d", "c"), start=("b", "c", "d"))),
    ],
)
def test_each_strategy_stops_in_reverse_and_starts_in_order(
    strategy: Strategy, plan: RestartPlan
) -> None:
    """The failure of b stops the strategy's siblings last-started first, then starts in order."""
    assert plan_restart(strategy, ORDER, ORDER, "b", PERMANENT) == plan


def test_temporary_sibling_is_stopped_but_not_started_again() -> None:
    """A temporary child stopped because of a sibling's failure stays stopped."""
    restart: dict[str, Restart] = {**PERMANENT, "c": "temporary"}
    plan = plan_restart("one_for_all", ORDER, ORDER, "b", restart)
    assert plan == RestartPlan(stop=("d", "c", "a"), start=("a", "b", "d"))


def test_only_live_siblings_are_affected() -> None:
    """A sibling that exited for good is neither stopped nor started; one waiting to start is."""
    live = ["a", "b", "d"]
    assert plan_restart("one_for_all", ORDER, live, "b", PERMANENT) == RestartPlan(
        stop=("d", "a"), start=("a", "b", "d")
    )
    assert plan_restart("rest_for_one", ORDER, live, "a", PERMANENT) == RestartPlan(
        stop=("d", "b"), start=("a", "b", "d")
    )


def test_unknown_failed_child_is_refused() -> None:
    """Planning the restart of a child the supervisor does not have is an error."""
    with pytest.raises(ValueError, match="not a child"):
        plan_restart("one_for_one", ORDER, ORDER, "z", PERMANENT)


def test_restart_types_table() -> None:
    """Permanent restarts on any exit, transient on failure only, temporary never."""
    assert dict(RESTART_ON) == {
        "permanent": {"failed", "returned"},
        "transient": {"failed"},
        "temporary": set(),
    }


def test_window_allows_max_restarts_then_refuses() -> None:
    """Up to max_restarts restarts within the period are fine; one more is refused."""
    window = RestartWindow[str](max_restarts=2, period=10)
    assert window.record(0.0, "x")
    assert window.record(1.0, "y")
    assert not window.record(2.0, "z")
    assert window.causes(2.0) == ("x", "y", "z")


def test_window_slides() -> None:
    """A restart stops counting exactly ``period`` seconds after it happened."""
    window = RestartWindow[int](max_restarts=1, period=5)
    assert window.record(0.0, 0)
    assert window.causes(4.9) == (0,)
    assert window.record(5.0, 1)  # the restart at 0 expired
    assert not window.record(9.0, 2)
    assert window.causes(20.0) == ()


def test_zero_restarts_refuses_the_first() -> None:
    """With max_restarts=0 the first restart already exceeds the intensity."""
    assert not RestartWindow[None](max_restarts=0, period=1).record(0.0, None)


@pytest.mark.parametrize(("max_restarts", "period"), [(-1, 1.0), (1, 0.0), (1, float("nan"))])
def test_window_refuses_bad_intensity(max_restarts: int, period: float) -> None:
    """A negative restart count or a non-positive period is refused."""
    with pytest.raises(ValueError, match="must be"):
        RestartWindow[None](max_restarts, period)
