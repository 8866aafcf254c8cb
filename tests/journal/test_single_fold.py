"""The read model takes the write model's fold of a part update: it must equal a plain fold."""

from __future__ import annotations

import functools
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pytest
import trio

from braid_actors import graph
from braid_actors.errors import BraidError
from braid_actors.journal import (
    GraphAdmission,
    Journal,
    JournalHandle,
    event_to_record,
    run_journal,
)
from braid_actors.model import (
    Event,
    Outcome,
    RunFinished,
    RunPartUpdated,
    TextPart,
    Usage,
)

from ._helpers import EventLog

if TYPE_CHECKING:
    from pathlib import Path

RUNS = 4
ROUNDS = 6


def _dispatched(n: int) -> tuple[list[Event], list[tuple[str, str, str]]]:
    """Events that leave ``n`` runs dispatched (one per conversation), and each run's
    (conversation, run, reply message)."""
    log = EventLog()
    state, ids, at, add, out = log.state, log.ids, log.at, log.add, log.events
    runs = []
    for i in range(n):
        created = graph.create_conversation(
            state, workspace="/w", title=f"c{i}", profile_ref=None, runner=None,
            operation_id=f"op_c{i}", at=at(), ids=ids,
        )  # fmt: skip
        add(created)
        sub = graph.submit_turn(
            state, branch_id=created.branch.branch_id, text="go", operation_id=f"op_t{i}",
            at=at(), ids=ids,
        )  # fmt: skip
        add(sub)
        for adm in graph.next_admissions(state, at=at()):
            add(adm)
        disp = graph.dispatch(
            state, run_id=sub.run.run_id, receipt="sha256:" + "a" * 64, session_mode="new",
            at=at(), ids=ids,
        )  # fmt: skip
        add(disp)
        runs.append((sub.run.conversation_id, sub.run.run_id, disp.assistant_message.message_id))
    return out, runs


async def test_batched_part_updates_with_refusals_fold_like_a_replay(
    home: Path, key: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Several runs stream at once, so one commit holds part updates of several runs, with
    refused requests between them (an unknown message), a second part and a finish. The
    live read model equals the fold of the journal from scratch, and every run's
    ``events.last_seq`` is the sequence of its last committed event."""
    setup, runs = _dispatched(RUNS)
    journal = Journal.open(home, key)
    admission = GraphAdmission.load(journal)
    at = datetime(2026, 2, 1, tzinfo=UTC)
    refused: list[str] = []
    commits: list[int] = []

    async def stream(conv: str, run: str, msg: str) -> None:
        for r in range(ROUNDS):
            part = TextPart(f"{msg}.p{r % 2}", "." * (r + 1))
            done = await handle.append([event_to_record(RunPartUpdated(conv, run, msg, part, at))])
            # acknowledged: in the read model, under its own sequence number
            assert admission.read.runs[run].events.last_seq == done.records[0].seq
            assert part in admission.read.messages[msg].parts
            try:
                wrong = RunPartUpdated(conv, run, "msg_nope", part, at)
                await handle.append([event_to_record(wrong)])
            except BraidError as exc:
                refused.append(exc.code)
        finished = RunFinished(conv, run, "succeeded", Outcome("completed"), Usage(), 0.0, None, at)
        await handle.append([event_to_record(finished)])

    try:
        async with trio.open_nursery() as nursery:
            handle: JournalHandle = await nursery.start(
                functools.partial(run_journal, journal, admission=admission, commit_interval=0.02)
            )
            for ev in setup:
                await handle.append([event_to_record(ev)])
            plain = graph.apply
            read_folds: list[str] = []

            def counting(state: graph.GraphState, event: Event, seq: int | None = None) -> Any:
                if state is admission.read:
                    read_folds.append(event.type)
                return plain(state, event, seq)

            monkeypatch.setattr(graph, "apply", counting)
            admission.listeners.append(lambda records: commits.append(len(records)))
            async with trio.open_nursery() as producers:
                for conv, run, msg in runs:
                    producers.start_soon(stream, conv, run, msg)
            await handle.aclose()
        assert refused == ["unknown_message"] * (RUNS * ROUNDS)
        assert max(commits) > 1  # the commit floor did batch several runs' events together
        monkeypatch.undo()
        # no part update was folded a second time: only the finishes were
        assert read_folds == ["run.finished"] * RUNS
        reloaded = GraphAdmission.load(journal)
        replayed = reloaded.read
        assert graph.checksum(admission.read) == graph.checksum(replayed)
        # a rebuilt admission's write model starts as its read model (folded once)
        assert graph.checksum(reloaded._write) == graph.checksum(replayed)
        assert reloaded._write is not replayed
        last_seq: dict[str, int] = {}
        for record in journal.read():
            run_id = record.data.get("run_id", record.data.get("runId"))
            if isinstance(run_id, str) and record.type.startswith("run."):
                last_seq[run_id] = record.seq
        for _, run, msg in runs:
            assert admission.read.runs[run].events.last_seq == last_seq[run]
            assert admission.read.runs[run].events.count == 1 + ROUNDS + 1  # dispatch, parts, end
            texts = [p.text for p in admission.read.messages[msg].parts if isinstance(p, TextPart)]
            assert sorted(texts) == ["." * (ROUNDS - 1), "." * ROUNDS]
    finally:
        journal.close()
