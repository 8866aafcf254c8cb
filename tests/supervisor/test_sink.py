"""Part updates through the journal sink: queued without waiting, committed in order.

Real app, real journal, real local workers read by the supervisor's pipe hub.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from braid_actors.app import BraidApp, call, open_app
from braid_actors.errors import BraidError
from braid_actors.journal import Journal, load_or_create_key
from braid_actors.model import TextPart
from braid_actors.supervisor._sink import PART_PIPELINE, JournalSink


@pytest.fixture
async def braid(tmp_path: Path) -> AsyncIterator[tuple[BraidApp, Path]]:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    async with trio.open_nursery() as nursery:
        app: BraidApp = await nursery.start(
            functools.partial(open_app, tmp_path / "home", env={}, observe_interval=0.2)
        )
        yield app, workspace
        if not app.stopped.is_set():
            await app.shutdown(drain=False, grace=5)
        nursery.cancel_scope.cancel()


async def _finished_run(app: BraidApp, workspace: Path, text: str) -> str:
    created = await call(app, "create_conversation", {"workspace": str(workspace)})
    sent = await call(app, "submit_turn", {"branchId": created["branchId"], "text": text})
    run_id: str = sent["runId"]
    record = await call(app, "wait_run", {"runId": run_id, "timeoutS": 60})
    assert record["state"] == "succeeded", record
    return run_id


def _part_records(app: BraidApp, run_id: str) -> list[dict[str, Any]]:
    with Journal.open(app.home, load_or_create_key(app.home, {}), readonly=True) as journal:
        return [
            dict(r.data)
            for r in journal.read()
            if r.type == "run.part_updated" and r.data.get("run_id") == run_id
        ]


async def test_a_stream_is_journaled_in_order_mostly_by_the_hubs_fast_path(
    braid: tuple[BraidApp, Path],
) -> None:
    """Every update of a streamed part is journaled once, in order, with consecutive
    cursors, and the pipe hub handled them without waking the run's task."""
    app, workspace = braid
    hub = app.runs.pipes
    assert hub is not None
    before = hub.fast_lines
    run_id = await _finished_run(app, workspace, "?stream 2 10")
    records = _part_records(app, run_id)
    streamed = [r for r in records if str(r["part"]["text"]).startswith("Streaming")]
    assert [r["part"]["text"] for r in streamed] == ["Streaming" + "." * n for n in range(1, 21)]
    cursors = [r["cursor"] for r in records]
    assert cursors == list(range(cursors[0], cursors[0] + len(records)))
    # An update takes the task's path when the previous one is not yet committed (the
    # commit floor is 10 ms; updates come 100 ms apart): a few may, most are the hub's.
    assert hub.fast_lines - before >= 15
    message = app.state.messages[app.run(run_id).assistant_message_id or ""]
    assert next(p.text for p in message.parts if isinstance(p, TextPart)) == "Streaming" + "." * 20


async def test_a_refused_part_update_is_raised_by_the_sinks_next_call(
    braid: tuple[BraidApp, Path],
) -> None:
    """``part`` returns once queued; the refusal comes with the next report or ``settle``
    (once), and ``part_nowait`` declines once a queued update is known to be refused."""
    app, workspace = braid
    run_id = await _finished_run(app, workspace, "hello")
    calls: list[str] = []

    async def nothing(*_: object) -> None:
        calls.append("callback")

    sink = JournalSink(app.runs, run_id, on_worker=nothing, on_usage=nothing)
    part = TextPart("part_late", "too late")
    await sink.part(part)  # queued: the run is terminal, so the journal will refuse it
    await sink.part(part)  # pipelined behind it, refused as well
    with pytest.raises(BraidError) as caught:
        await sink.settle()
    assert caught.value.code == "terminal_run_mutation"
    assert not sink._unsettled  # every queued update was answered before it raised
    await sink.settle()  # reported once
    await sink.part(part)
    with trio.fail_after(10):
        while not sink._unsettled[-1].answered:  # noqa: ASYNC110
            await trio.sleep(0.01)
    assert not sink.part_nowait(part)  # refused: the slow path raises it
    with pytest.raises(BraidError):
        await sink.part(part)
    late = [r for r in _part_records(app, run_id) if r["part"]["part_id"] == "part_late"]
    assert late == []
    assert calls == []


async def test_part_updates_are_pipelined_up_to_the_bound_and_committed_in_order(
    braid: tuple[BraidApp, Path],
) -> None:
    """While the journal cannot commit, ``part_nowait`` queues up to ``PART_PIPELINE``
    updates of a live run and then declines; once it can, they commit in queue order."""
    app, workspace = braid
    created = await call(app, "create_conversation", {"workspace": str(workspace)})
    sent = await call(app, "submit_turn", {"branchId": created["branchId"], "text": "?sleep 3"})
    run_id: str = sent["runId"]
    with trio.fail_after(30):
        while app.run(run_id).state != "running":
            await app.changed()

    async def nothing(*_: object) -> None:
        pass

    sink = JournalSink(app.runs, run_id, on_worker=nothing, on_usage=nothing)
    actor = app.journal._actor
    async with actor.writer:  # no batch can be written meanwhile: nothing is answered
        queued = [sink.part_nowait(TextPart("part_pipe", f"v{i}")) for i in range(PART_PIPELINE)]
        assert queued == [True] * PART_PIPELINE
        assert not sink.part_nowait(TextPart("part_pipe", "one too many"))
        assert len(sink._unsettled) == PART_PIPELINE
        assert not any(r.answered for r in sink._unsettled)
    with trio.fail_after(10):
        await sink.settle()
    assert not sink._unsettled
    records = [r for r in _part_records(app, run_id) if r["part"]["part_id"] == "part_pipe"]
    assert [r["part"]["text"] for r in records] == [f"v{i}" for i in range(PART_PIPELINE)]
    cursors = [r["cursor"] for r in records]
    assert cursors == list(range(cursors[0], cursors[0] + PART_PIPELINE))
    assert sink.part_nowait(TextPart("part_pipe", "after"))  # room again
    await sink.settle()
