"""RunControl's cancel request and its callbacks (what run_watched starts its watch from)."""

from __future__ import annotations

from braid_actors.providers import RunControl


def test_callbacks_run_once_when_the_first_cancel_is_requested() -> None:
    control = RunControl()
    calls: list[str] = []
    control.on_cancel(lambda: calls.append("a"))
    remove_b = control.on_cancel(lambda: calls.append("b"))
    remove_b()
    assert calls == []
    control.request_cancel("stop")
    control.request_cancel("again")
    assert calls == ["a"]
    assert control.reason == "stop"
    assert control.cancel_requested.is_set()


def test_a_callback_added_after_the_request_runs_at_once() -> None:
    control = RunControl()
    control.request_cancel("stop")
    calls: list[int] = []
    remove = control.on_cancel(lambda: calls.append(1))
    remove()  # nothing left to remove: harmless
    assert calls == [1]
