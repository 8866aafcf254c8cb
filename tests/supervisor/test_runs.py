"""Run actors through the real app: cancellation, retry, selection, focus, workers, limits.

Everything here is real: the encrypted journal, the local runner's worker processes, psutil
observation of their process trees, and the stop ladder.
"""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import trio

from braid_actors import graph
from braid_actors.app import BraidApp, call, open_app
from braid_actors.errors import BraidError
from braid_actors.journal import Journal, load_or_create_key
from braid_actors.supervisor import _spend_log
from braid_actors.supervisor._planning import portable_context


@pytest.fixture
async def braid(tmp_path: Path) -> AsyncIterator[tuple[BraidApp, Path]]:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    home = tmp_path / "home"
    async with trio.open_nursery() as nursery:
        app: BraidApp = await nursery.start(
            functools.partial(open_app, home, env={}, observe_interval=0.1)
        )
        yield app, workspace
        if not app.stopped.is_set():
            await app.shutdown(drain=False, grace=5)
        nursery.cancel_scope.cancel()


async def _conversation(app: BraidApp, workspace: Path) -> str:
    created = await call(app, "create_conversation", {"workspace": str(workspace)})
    branch_id: str = created["branchId"]
    return branch_id


async def _wait_state(app: BraidApp, run_id: str, states: set[str]) -> dict[str, Any]:
    with trio.fail_after(30):
        while app.run(run_id).state not in states:
            await app.changed()
    record: dict[str, Any] = await call(app, "wait_run", {"runId": run_id, "timeoutS": 0})
    return record


async def _allowed_run(app: BraidApp, branch: str, text: str) -> tuple[str, dict[str, Any]]:
    """Submit ``text`` (a ``!`` shell line), allow its permission, wait for the end."""
    sent = await call(app, "submit_turn", {"branchId": branch, "text": text})
    blocked = await _wait_state(app, sent["runId"], {"blocked"})
    await call(
        app,
        "respond_interaction",
        {
            "runId": sent["runId"],
            "interactionId": blocked["interactions"][0]["interactionId"],
            "answer": {"allow": True},
        },
    )
    final = await call(app, "wait_run", {"runId": sent["runId"], "timeoutS": 30})
    return sent["runId"], final


def _gone(pid: int | None) -> bool:
    assert pid is not None
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _run_record_types(app: BraidApp, run_id: str) -> list[str]:
    key = load_or_create_key(app.home, {})
    with Journal.open(app.home, key, readonly=True) as journal:
        return [r.type for r in journal.read() if r.data.get("run_id") == run_id]


async def test_cancel_queued_run_never_dispatches(braid: tuple[BraidApp, Path]) -> None:
    """A queued run is cancelled without any provider being called."""
    app, workspace = braid
    branch = await _conversation(app, workspace)
    first = await call(app, "submit_turn", {"branchId": branch, "text": "?sleep 2"})
    queued = await call(app, "submit_turn", {"branchId": branch, "text": "later"})
    record = await call(app, "cancel_run", {"runId": queued["runId"]})
    assert record["state"] == "cancelled"
    assert record["outcome"]["reason"] == "cancelled before it was admitted"
    assert record["assistantMessageId"] is None
    assert record["startedAt"] is None
    again = await call(app, "cancel_run", {"runId": queued["runId"]})
    assert again["state"] == "cancelled"
    done = await call(app, "wait_run", {"runId": first["runId"], "timeoutS": 30})
    assert done["state"] == "succeeded"


async def test_cancel_running_run_is_two_party(braid: tuple[BraidApp, Path]) -> None:
    """cancel_run journals the request, shows cancelling, and the runner's answer ends it."""
    app, workspace = braid
    branch = await _conversation(app, workspace)
    sent = await call(app, "submit_turn", {"branchId": branch, "text": "?sleep 20"})
    running = await _wait_state(app, sent["runId"], {"running"})
    while not app.run(sent["runId"]).worker_ids:
        await app.changed()
    pid = app.state.workers[app.run(sent["runId"]).worker_ids[0]].pid
    record = await call(app, "cancel_run", {"runId": sent["runId"], "operationId": "op-c1"})
    assert record["state"] in ("cancelling", "cancelled")
    assert running["state"] == "running"
    final = await call(app, "wait_run", {"runId": sent["runId"], "timeoutS": 30})
    assert final["state"] == "cancelled", final["outcome"]
    assert final["outcome"]["kind"] == "cancelled"
    assert _gone(pid)
    types = _run_record_types(app, sent["runId"])
    assert types.index("run.cancel_requested") < types.index("run.finished")
    worker = app.state.workers[app.run(sent["runId"]).worker_ids[0]]
    assert worker.status in ("exited", "killed")


async def test_retry_keeps_the_old_run_and_links_the_new_one(
    braid: tuple[BraidApp, Path],
) -> None:
    """retry adds a run for the same turn with a retried edge; selection picks the reply shown."""
    app, workspace = braid
    branch = await _conversation(app, workspace)
    sent = await call(app, "submit_turn", {"branchId": branch, "text": "hello\n?fail"})
    failed = await call(app, "wait_run", {"runId": sent["runId"], "timeoutS": 30})
    assert failed["state"] == "failed"
    with pytest.raises(BraidError) as refused:
        await call(app, "select_run", {"turnId": sent["turnId"], "runId": "run_nope"})
    assert refused.value.code == "unknown_run"
    retried = await call(app, "retry", {"turnId": sent["turnId"], "session": "fresh"})
    assert retried["runId"] != sent["runId"]
    second = await call(app, "wait_run", {"runId": retried["runId"], "timeoutS": 30})
    assert second["state"] == "failed"  # the input still asks it to fail
    turn = app.state.turns[sent["turnId"]]
    assert turn.run_ids == (sent["runId"], retried["runId"])
    assert app.run(sent["runId"]).state == "failed"
    assert app.run(sent["runId"]).outcome == app.run(sent["runId"]).outcome
    edge = app.state.edges[retried["edgeId"]]
    assert (edge.kind, edge.source_id, edge.destination_id) == (
        "retried",
        sent["runId"],
        retried["runId"],
    )
    history = graph.history(app.state, branch)
    shown = [app.state.messages[m].source_run_id for m in history]
    assert shown == [None, retried["runId"]]  # the latest attempt when none is selected
    await call(app, "select_run", {"turnId": sent["turnId"], "runId": sent["runId"]})
    shown = [app.state.messages[m].source_run_id for m in graph.history(app.state, branch)]
    assert shown == [None, sent["runId"]]
    assert app.state.turns[sent["turnId"]].selected_run_id == sent["runId"]


async def test_focus_run_selects_its_branch_and_keeps_the_draft(
    braid: tuple[BraidApp, Path],
) -> None:
    """focus_run makes the run's branch active and returns that branch's draft unchanged."""
    app, workspace = braid
    main = await _conversation(app, workspace)
    sent = await call(app, "submit_turn", {"branchId": main, "text": "one"})
    await call(app, "wait_run", {"runId": sent["runId"], "timeoutS": 30})
    user = graph.history(app.state, main)[0]
    forked = await call(app, "branch", {"branchId": main, "throughMessageId": user})
    other = await call(app, "submit_turn", {"branchId": forked["branchId"], "text": "two"})
    await call(app, "wait_run", {"runId": other["runId"], "timeoutS": 30})
    conv_id = app.state.branches[main].conversation_id
    assert app.state.conversations[conv_id].active_branch_id == main
    focus = await call(app, "focus_run", {"runId": other["runId"]})
    assert focus["branchId"] == forked["branchId"]
    assert app.state.conversations[conv_id].active_branch_id == forked["branchId"]
    back = await call(app, "focus_run", {"runId": sent["runId"]})
    assert back == {
        "conversationId": conv_id,
        "branchId": main,
        "draft": "",
        "selectedRunId": sent["runId"],
    }


async def test_workers_and_children_are_observed(braid: tuple[BraidApp, Path]) -> None:
    """The root worker and the shell's children become workers with spawned edges and spend."""
    app, workspace = braid
    branch = await _conversation(app, workspace)
    run_id, final = await _allowed_run(app, branch, "!sleep 1.5 & sleep 1.5 & wait")
    assert final["state"] == "succeeded", final["outcome"]
    listed = await call(app, "list_workers", {"runId": run_id})
    workers = listed["workers"]
    root = workers[0]
    assert root["parentWorkerId"] is None
    assert root["pid"] > 0
    assert root["spend"]["cpuSeconds"] is not None
    assert root["spend"]["rssBytes"] > 0
    sleeps = [w for w in workers if w["command"][:1] == ["sleep"]]
    assert len(sleeps) == 2
    assert all(w["status"] == "exited" for w in workers)
    spawned = [e for e in app.state.edges.values() if e.kind == "spawned"]
    ids = {w["workerId"] for w in workers}
    assert {e.destination_id for e in spawned} >= ids
    assert listed["childrenComplete"] is True
    # The root worker's stderr is kept, bounded and redacted, as a content-addressed file.
    log_ref = root["logRef"]
    assert log_ref.startswith("sha256:")
    log = app.home / "artifacts" / "logs" / f"{log_ref.removeprefix('sha256:')}.log"
    assert log.stat().st_mode & 0o777 == 0o600
    assert "local-worker[" in log.read_text()


async def _sleeping_worker(braid: tuple[BraidApp, Path]) -> tuple[str, str]:
    """A run whose worker sleeps 20 s, once its first figures are journaled: (run, worker)."""
    app, workspace = braid
    branch = await _conversation(app, workspace)
    sent = await call(app, "submit_turn", {"branchId": branch, "text": "?sleep 20"})
    worker_id = await _root_worker(app, sent["runId"])
    with trio.fail_after(30):
        while app.state.workers[worker_id].spend is None:
            await app.changed()
    return sent["runId"], worker_id


async def test_unchanged_samples_are_not_journaled_but_the_last_one_is(
    braid: tuple[BraidApp, Path],
) -> None:
    """A worker is sampled every 0.1 s here, but a sample is journaled only when its CPU
    time or peak RSS moved (or 10 s passed): a paused worker's samples are not, and the
    figures it ended with (its wall time while paused) are journaled when it ends."""
    app, _ = braid
    run_id, worker_id = await _sleeping_worker(braid)
    await call(app, "steer_worker", {"workerId": worker_id, "action": "pause"})
    await trio.sleep(0.3)  # (a sample may still see the CPU time it used before it stopped)
    paused_at = _run_record_types(app, run_id).count("worker.observed")
    await trio.sleep(1.5)  # 15 samples of a stopped process: nothing moves
    assert _run_record_types(app, run_id).count("worker.observed") == paused_at
    before = app.state.workers[worker_id].spend
    assert before is not None and before.wall_seconds is not None
    await call(app, "cancel_worker", {"workerId": worker_id, "force": True})
    final = await call(app, "wait_run", {"runId": run_id, "timeoutS": 30})
    assert final["state"] == "failed"
    after = app.state.workers[worker_id].spend
    assert after is not None and after.wall_seconds is not None
    assert after.wall_seconds >= before.wall_seconds + 1.4
    assert after.cpu_seconds == before.cpu_seconds


async def test_a_quiet_worker_is_journaled_once_per_heartbeat(
    braid: tuple[BraidApp, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sleeping worker's samples repeat one another and are taken at once, without a
    task each (the hub's ``on_repeat``), yet its figures are still journaled once per
    heartbeat (here 0.3 s instead of 10)."""
    monkeypatch.setattr(_spend_log, "OBSERVED_HEARTBEAT", 0.3)
    app, _ = braid
    run_id, worker_id = await _sleeping_worker(braid)
    await trio.sleep(0.5)
    repeated = app.runs.hub.repeated_samples
    first = _run_record_types(app, run_id).count("worker.observed")
    await trio.sleep(1.6)
    assert app.runs.hub.repeated_samples >= repeated + 8  # 16 samples, nearly all repeats
    # About five heartbeats in 1.6 s (and the CPU the worker used, if any).
    assert _run_record_types(app, run_id).count("worker.observed") >= first + 3
    await call(app, "cancel_worker", {"workerId": worker_id, "force": True})
    await call(app, "wait_run", {"runId": run_id, "timeoutS": 30})


LIMITS = [
    ("input_tokens", {"inputTokens": 5}, "x" * 200),
    ("output_tokens", {"outputTokens": 5}, "please say a fairly long sentence back to me"),
    ("wall_seconds", {"wallSeconds": 0.6}, "?sleep 10"),
    ("cpu_seconds", {"cpuSeconds": 0.4}, "?burn 20"),
    ("rss_bytes", {"rssBytes": 150 * 1024 * 1024}, "?alloc 400\n?sleep 10"),
]


@pytest.mark.parametrize(("dimension", "limits", "text"), LIMITS, ids=[x[0] for x in LIMITS])
async def test_spend_limit_stops_the_run(
    braid: tuple[BraidApp, Path], dimension: str, limits: dict[str, Any], text: str
) -> None:
    """Crossing a limit ends the run spend_limit_exceeded, names it, and stops the worker."""
    app, workspace = braid
    branch = await _conversation(app, workspace)
    await call(app, "set_run_override", {"branchId": branch, "limits": limits})
    sent = await call(app, "submit_turn", {"branchId": branch, "text": text})
    final = await call(app, "wait_run", {"runId": sent["runId"], "timeoutS": 60})
    assert final["state"] == "failed"
    outcome = final["outcome"]
    assert outcome["kind"] == "spend_limit_exceeded"
    assert outcome["dimension"] == dimension
    assert outcome["measured"] >= outcome["limit"]
    run = app.run(sent["runId"])
    for worker_id in run.worker_ids:
        assert _gone(app.state.workers[worker_id].pid)
    # The crossing event was the last one the runner got to record.
    types = _run_record_types(app, sent["runId"])
    tail = types[types.index("run.finished") - 1 :]
    assert set(tail) <= {"worker.exited", "run.finished", "worker.observed", "run.usage_reported"}


async def _root_worker(app: BraidApp, run_id: str) -> str:
    with trio.fail_after(30):
        while not app.run(run_id).worker_ids:
            await app.changed()
    return app.run(run_id).worker_ids[0]


async def test_steer_worker_pauses_and_resumes_its_process(braid: tuple[BraidApp, Path]) -> None:
    """pause really stops the worker's process (SIGSTOP) and resume lets it finish."""
    app, workspace = braid
    branch = await _conversation(app, workspace)
    sent = await call(app, "submit_turn", {"branchId": branch, "text": "?sleep 2"})
    worker_id = await _root_worker(app, sent["runId"])
    paused = await call(app, "steer_worker", {"workerId": worker_id, "action": "pause"})
    assert paused["status"] == "paused"
    assert [c["result"] for c in paused["controlHistory"]] == ["requested", "paused"]
    assert psutil.Process(paused["pid"]).status() == psutil.STATUS_STOPPED
    resumed = await call(
        app,
        "steer_worker",
        {
            "workerId": worker_id,
            "action": "resume",
            "operationId": "op-r1",
        },
    )
    assert resumed["status"] == "running"
    assert psutil.Process(resumed["pid"]).status() != psutil.STATUS_STOPPED
    again = await call(
        app,
        "steer_worker",
        {
            "workerId": worker_id,
            "action": "resume",
            "operationId": "op-r1",
        },
    )
    assert len(again["controlHistory"]) == 4  # the retried operation did nothing new
    final = await call(app, "wait_run", {"runId": sent["runId"], "timeoutS": 30})
    assert final["state"] == "succeeded"


async def test_cancel_worker_force_kills_it_and_the_run_says_so(
    braid: tuple[BraidApp, Path],
) -> None:
    """cancel_worker with force kills the process at once; the run fails with the reason."""
    app, workspace = braid
    branch = await _conversation(app, workspace)
    sent = await call(app, "submit_turn", {"branchId": branch, "text": "?sleep 20"})
    worker_id = await _root_worker(app, sent["runId"])
    killed = await call(app, "cancel_worker", {"workerId": worker_id, "force": True})
    assert killed["status"] == "killed"
    assert _gone(killed["pid"])
    final = await call(app, "wait_run", {"runId": sent["runId"], "timeoutS": 30})
    assert final["state"] == "failed"
    assert "worker" in final["outcome"]["reason"]
    with pytest.raises(BraidError) as refused:
        await call(app, "steer_worker", {"workerId": worker_id, "action": "pause"})
    assert refused.value.code == "illegal_transition"


async def test_run_overrides_refuse_bad_limits_and_write_nothing(
    braid: tuple[BraidApp, Path],
) -> None:
    """Negative or mistyped limits are invalid_params, and nothing is journaled for them."""
    app, workspace = braid
    branch = await _conversation(app, workspace)
    seq = app.admission.seq
    for limits in ({"cpuSeconds": -1}, {"rssBytes": "big"}, {"tokens": 5}):
        with pytest.raises(BraidError) as refused:
            await call(app, "set_run_override", {"branchId": branch, "limits": limits})
        assert refused.value.code == "invalid_params"
    assert app.admission.seq == seq
    view = await call(
        app, "set_run_override", {"branchId": branch, "model": "m1", "limits": {"wallSeconds": 5}}
    )
    assert view["overrides"]["model"] == "m1"
    assert view["overrides"]["limits"]["wallSeconds"] == 5.0


async def test_finished_run_ingests_its_transcript_as_evidence(
    braid: tuple[BraidApp, Path],
) -> None:
    """A finished run's session file and worker processes are in the evidence store."""
    from braid_actors.evidence import EvidenceStore

    app, workspace = braid
    branch = await _conversation(app, workspace)
    run_id, final = await _allowed_run(app, branch, "!echo hi\nhello")
    assert final["traceRef"] == run_id
    store = await trio.to_thread.run_sync(EvidenceStore.open, app.home)
    try:
        overview = await trio.to_thread.run_sync(store.overview, run_id)
        runtime = await trio.to_thread.run_sync(store.runtime_coverage, run_id)
    finally:
        store.close()
    text = json.dumps(overview)
    assert '"local"' in text
    assert runtime["capture"]["status"] == "ok"


async def test_a_child_that_execs_keeps_both_commands(braid: tuple[BraidApp, Path]) -> None:
    """A shell child that execs another program once it was found: its worker keeps the
    command it was found with and records the new one once (``worker.executed``), and the
    run's runtime evidence holds both command lines."""
    from braid_actors.evidence import EvidenceStore

    app, workspace = braid
    branch = await _conversation(app, workspace)
    text = "!sleep 0.6; exec sleep 0.7"
    run_id, final = await _allowed_run(app, branch, text)
    assert final["state"] == "succeeded", final["outcome"]
    workers = (await call(app, "list_workers", {"runId": run_id}))["workers"]
    (shell,) = [w for w in workers if w["command"] == ["sh", "-c", text[1:]]]
    assert [e["command"] for e in shell["execs"]] == [["sleep", "0.7"]]
    assert shell["execs"][0]["observedAt"]
    assert all(w["execs"] == [] for w in workers if w is not shell)
    assert _run_record_types(app, run_id).count("worker.executed") == 1
    store = await trio.to_thread.run_sync(EvidenceStore.open, app.home)
    try:
        argvs = await trio.to_thread.run_sync(
            store.read_with,
            lambda conn, *_: [
                json.loads(row[0])
                for row in conn.execute("SELECT argv FROM runtime_events WHERE run_id=?", (run_id,))
            ],
        )
    finally:
        store.close()
    assert ["sh", "-c", text[1:]] in argvs
    assert ["sleep", "0.7"] in argvs


async def test_fresh_retry_records_the_context_transfer_receipt(
    braid: tuple[BraidApp, Path],
) -> None:
    """A fresh-session retry copies the branch's context; its run record shows the receipt."""
    app, workspace = braid
    branch = await _conversation(app, workspace)
    first = await call(app, "submit_turn", {"branchId": branch, "text": "hello"})
    done = await call(app, "wait_run", {"runId": first["runId"], "timeoutS": 30})
    assert done["state"] == "succeeded"
    assert done["contextReceipt"]["includedMessageIds"] == []  # a new session: nothing to copy
    second = await call(app, "submit_turn", {"branchId": branch, "text": "again"})
    await call(app, "wait_run", {"runId": second["runId"], "timeoutS": 30})
    retried = await call(app, "retry", {"turnId": second["turnId"], "session": "fresh"})
    record = await call(app, "wait_run", {"runId": retried["runId"], "timeoutS": 30})
    assert record["state"] == "succeeded"
    assert record["sessionLabel"] == "new session with copied context"
    copied = [app.state.turns[first["turnId"]].user_message_id, done["assistantMessageId"]]
    expected = portable_context(app.state, branch, copied)
    receipt = record["contextReceipt"]
    assert receipt["sourceDigest"] == expected.digest
    assert receipt["includedMessageIds"] == copied
    assert (receipt["omittedParts"], receipt["transformedParts"]) == ([], [])
    assert receipt["destinationRunner"] == "local"
    assert receipt["destinationSessionId"] == record["providerSessionId"]
    assert receipt["estimatedInputTokens"] is None  # unavailable, never guessed
    assert app.run(retried["runId"]).context_receipt is not None  # journaled on the run
