"""Two-party cancellation shared by the adapters: run a turn while watching for a cancel.

The adapter's ``watch`` waits for :class:`RunControl`'s request, asks its runner to stop
in the runner's own way, and, if no answer comes within its grace, cancels the turn's
scope. :func:`run_watched` then returns ``None``: the cancel went unanswered, and the
adapter stops the process itself and reports ``cancel_acknowledged=False``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from braid_actors.providers._port import RunControl, TurnResult


async def run_watched(
    turn: Callable[[], Awaitable[TurnResult]],
    control: RunControl | None,
    watch: Callable[[RunControl, trio.CancelScope], Awaitable[None]],
) -> TurnResult | None:
    """The turn's result, or ``None`` when ``watch`` ended it (an unanswered cancel)."""
    if control is None:
        return await turn()
    ended: list[TurnResult] = []
    async with trio.open_nursery() as nursery:
        # The watch starts only once a cancel is requested: no task per run waits for it.
        remove = control.on_cancel(lambda: nursery.start_soon(watch, control, nursery.cancel_scope))
        try:
            ended.append(await turn())
        finally:
            remove()
        nursery.cancel_scope.cancel()
    return ended[0] if ended else None
