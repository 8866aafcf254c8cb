"""The graph as the journal's admission: visibility after commit, snapshots, rebuild, verify."""

from __future__ import annotations

import functools
import sqlite3
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import pytest
import trio

from braid_actors import graph
from braid_actors.errors import BraidError
from braid_actors.journal import (
    CommittedRecord,
    GraphAdmission,
    GraphProjector,
    Journal,
    JournalHandle,
    event_to_record,
    run_journal,
    verify_journal,
)
from braid_actors.model import (
    Event,
    Outcome,
    RunDispatched,
    RunFinished,
    RunPartUpdated,
    TextPart,
    Usage,
)

from ._helpers import EventLog

if TYPE_CHECKING:
    from pathlib import Path


def _events(n_turns: int) -> list[Event]:
    """A realistic sequence built with the same builders the app uses."""
    log = EventLog()
    state, ids, at, add, out = log.state, log.ids, log.at, log.add, log.events

    created = graph.create_conversation(
        state,
        workspace="/w",
        title="T",
        profile_ref=None,
        runner=None,
        operation_id="op_0",
        at=at(),
        ids=ids,
    )
    add(created)
    b = created.branch.branch_id
    for i in range(n_turns):
        sub = graph.submit_turn(
            state, branch_id=b, text=f"t{i}", operation_id=f"op_{i}", at=at(), ids=ids
        )
        add(sub)
        for adm in graph.next_admissions(state, at=at()):
            add(adm)
        disp = graph.dispatch(
            state,
            run_id=sub.run.run_id,
            receipt="sha256:" + "a" * 64,
            session_mode="new",
            at=at(),
            ids=ids,
        )
        add(disp)
        msg = disp.assistant_message.message_id
        add(
            RunPartUpdated(
                sub.run.conversation_id,
                sub.run.run_id,
                msg,
                TextPart(f"{msg}.p0", f"reply {i}"),
                at(),
            )
        )
        add(
            RunFinished(
                sub.run.conversation_id,
                sub.run.run_id,
                "succeeded",
                Outcome("completed"),
                Usage(),
                0.0,
                None,
                at(),
            )
        )
    if n_turns:
        add(graph.clone(state, branch_id=b, title=None, operation_id="op_c", at=at(), ids=ids))
    return out


async def _write(home: Path, key: bytes, events: list[Event], *, snapshot_every: int) -> str:
    journal = Journal.open(home, key)
    admission = GraphAdmission.load(journal)
    try:
        async with trio.open_nursery() as nursery:
            handle: JournalHandle = await nursery.start(
                functools.partial(
                    run_journal, journal, admission=admission, snapshot_every=snapshot_every
                )
            )
            for ev in events:
                before = graph.checksum(admission.read)
                result = await handle.append([event_to_record(ev)])
                # Acknowledged means folded into the read model.
                assert admission.seq == result.records[-1].seq
                assert graph.checksum(admission.read) != before
            await handle.aclose()
    finally:
        journal.close()
    return graph.checksum(admission.read)


async def test_snapshot_plus_tail_and_full_replay_rebuild_the_same_state(
    home: Path, key: bytes
) -> None:
    """Loading from a snapshot, or with every snapshot deleted, gives the identical graph."""
    events = _events(8)
    live = await _write(home, key, events, snapshot_every=7)
    with Journal.open(home, key) as journal:
        assert journal.latest_snapshot(graph.PROJECTION_VERSION) is not None
        from_snapshot = graph.checksum(GraphAdmission.load(journal).read)
        assert journal.delete_snapshots() >= 1
        assert journal.latest_snapshot(graph.PROJECTION_VERSION) is None
        from_replay = graph.checksum(GraphAdmission.load(journal).read)
    assert from_snapshot == live == from_replay
    report = verify_journal(home, key, GraphProjector())
    assert report.ok, report.render()
    assert report.projection_checksum == live


async def test_verify_compares_snapshots_with_replay(home: Path, key: bytes) -> None:
    """verify checks every snapshot against a full replay of the graph."""
    await _write(home, key, _events(5), snapshot_every=4)
    report = verify_journal(home, key, GraphProjector())
    assert report.ok, report.render()
    assert report.snapshots_checked >= 1


async def test_refused_graph_event_writes_nothing(home: Path, key: bytes) -> None:
    """An event that breaks a graph rule is refused by admission and never written."""
    events = _events(1)
    await _write(home, key, events, snapshot_every=1000)
    finished = next(ev for ev in events if isinstance(ev, RunFinished))
    journal = Journal.open(home, key)
    admission = GraphAdmission.load(journal)
    last = journal.last_seq
    try:
        async with trio.open_nursery() as nursery:
            handle: JournalHandle = await nursery.start(
                functools.partial(run_journal, journal, admission=admission)
            )
            with pytest.raises(BraidError) as caught:
                await handle.append([event_to_record(finished)])  # a finished run again
            assert caught.value.code == "terminal_run_mutation"
            await handle.aclose()
    finally:
        journal.close()
    with Journal.open(home, key) as journal:
        assert journal.last_seq == last


async def test_journal_verify_command_exits_non_zero_on_a_fault(home: Path, key: bytes) -> None:
    """`braid journal verify` prints OK on a clean journal and fails on a broken chain."""
    await _write(home, key, _events(2), snapshot_every=1000)
    env = {"BRAID_KEY": key.hex(), "PATH": "/usr/bin:/bin"}
    cmd = [sys.executable, "-m", "braid_actors.cli.main", "--home", str(home), "journal", "verify"]
    ok = await trio.run_process(cmd, capture_stdout=True, capture_stderr=True, env=env, check=False)
    assert ok.returncode == 0, ok.stderr
    assert b"OK" in ok.stdout
    with sqlite3.connect(home / "journal.sqlite3") as conn:
        conn.execute("UPDATE events SET prev_hash = 'sha256:' || hex(randomblob(32)) WHERE seq = 3")
    bad = await trio.run_process(
        cmd, capture_stdout=True, capture_stderr=True, env=env, check=False
    )
    assert bad.returncode == 1
    assert b"OK" not in bad.stdout.splitlines()[0]


def test_a_snapshot_waits_for_a_tail_of_k_events_per_entity() -> None:
    """With ``snapshot_per_entity``, ``snapshot()`` declines until the tail since the last
    snapshot holds that many events per entity, then takes one and starts counting again."""
    events = _events(6)
    # Then a long stream of one run's part updates: the tail grows, the entities do not.
    running = events[:-3]  # up to the last turn's dispatch
    dispatched = events[-4]
    assert isinstance(dispatched, RunDispatched)
    run_id, msg = dispatched.run_id, dispatched.assistant_message.message_id
    stream = [
        RunPartUpdated(
            dispatched.conversation_id, run_id, msg, TextPart("p", "x" * n), dispatched.at
        )
        for n in range(1, 200)
    ]
    admission = GraphAdmission()
    admission.snapshot_per_entity = 2
    last, taken, declined = 0, 0, 0
    at = datetime(2026, 1, 1, tzinfo=UTC)
    for seq, ev in enumerate([*running, *stream], start=1):
        record = event_to_record(ev)
        admission.admit([record])
        committed = CommittedRecord(seq, record.stream, record.type, record.data, at, "0" * 64)
        admission.committed([committed])
        due = seq - last >= 2 * graph.entity_count(admission.read)
        assert (admission.snapshot() is not None) == due, f"at seq {seq}"
        if due:
            last, taken = seq, taken + 1
        else:
            declined += 1
    assert taken >= 2
    assert declined > taken
    assert GraphAdmission().snapshot() is not None  # 0: never declines
