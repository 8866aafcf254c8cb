"""Restart reconciliation: a supervisor SIGKILLed mid-run comes back and settles every run.

A real `braid headless` process runs the first half and is killed with SIGKILL; its local
worker keeps running (detached, spooling). A new application on the same home rebuilds
the graph, re-attaches to the worker from the journal's cursor, and finishes the run
without duplicating anything.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import trio

from braid_actors.app import BraidApp, call, open_app
from braid_actors.cli.verify import verify_home
from braid_actors.journal import Journal, load_or_create_key
from braid_actors.workers import ProcessKey, find_local_workers, presence


class Headless:
    """A `braid headless` subprocess driven line by line."""

    def __init__(self, proc: trio.Process) -> None:
        self.proc = proc
        self._buf = b""
        self._n = 0

    async def ask(self, command: str, params: dict[str, Any]) -> dict[str, Any]:
        self._n += 1
        line = json.dumps({"id": self._n, "command": command, "params": params}) + "\n"
        assert self.proc.stdin is not None
        await self.proc.stdin.send_all(line.encode())
        assert self.proc.stdout is not None
        with trio.fail_after(30):
            while b"\n" not in self._buf:
                chunk = await self.proc.stdout.receive_some(65536)
                assert chunk, "braid headless closed its output"
                self._buf += chunk
        reply, self._buf = self._buf.split(b"\n", 1)
        message: dict[str, Any] = json.loads(reply)
        assert message["ok"], message
        result: dict[str, Any] = message["result"]
        return result


async def _start_headless(home: Path) -> Headless:
    env = {**os.environ, "BRAID_HOME": str(home)}
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "braid_actors.cli.main", "headless"],
        stdin=-1,
        stdout=-1,
        env=env,
    )
    return Headless(proc)


async def _until(client: Headless, run_id: str, state: str) -> dict[str, Any]:
    """Wait for ``state`` with the turn really begun (the worker reported its session)."""
    with trio.fail_after(30):
        while True:
            record = await client.ask("wait_run", {"runId": run_id, "timeoutS": 0.2})
            if record["state"] == state and record["providerSessionId"] is not None:
                return record


@pytest.fixture
async def restarted(tmp_path: Path) -> AsyncIterator[Any]:
    """Opens a fresh application on a home (after the first process was killed)."""
    async with trio.open_nursery() as nursery:
        apps: list[BraidApp] = []

        async def open_home(home: Path) -> BraidApp:
            app: BraidApp = await nursery.start(
                functools.partial(open_app, home, env={"BRAID_HOME": str(home)})
            )
            apps.append(app)
            return app

        yield open_home
        for app in apps:
            if not app.stopped.is_set():
                await app.shutdown(drain=False, grace=5)
        nursery.cancel_scope.cancel()


async def _shell_turn(home: Path, workspace: Path, text: str) -> tuple[Headless, dict[str, Any]]:
    """A `braid headless` on ``home`` running a turn whose shell command ``text`` (``!...``)
    was allowed; the client and the turn's submission."""
    client = await _start_headless(home)
    conv = await client.ask("create_conversation", {"workspace": str(workspace)})
    sent = await client.ask("submit_turn", {"branchId": conv["branchId"], "text": text})
    blocked = await _until(client, sent["runId"], "blocked")
    await client.ask(
        "respond_interaction",
        {
            "runId": sent["runId"],
            "interactionId": blocked["interactions"][0]["interactionId"],
            "answer": {"allow": True},
        },
    )
    return client, sent


def _spool_dir(home: Path) -> Path:
    return home / "runners" / "local" / "spool"


async def _journaled_child(
    client: Headless, run_id: str, command: list[str]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Wait until the run's workers list a child running ``command``; it and the list."""
    with trio.fail_after(10):
        while True:
            listed = await client.ask("list_workers", {"runId": run_id})
            found = [w for w in listed["workers"] if w["command"] == command]
            if found:
                return found[0], listed["workers"]
            await trio.sleep(0.05)


async def _ends_once_mid_run(app: BraidApp, home: Path, run_id: str, worker_id: str) -> None:
    """The worker ends while its run still runs, the run succeeds, and the journal holds
    one end of the worker, seen by a sample (":exit"), with ``journal verify`` clean."""
    with trio.fail_after(15):
        while app.state.workers[worker_id].status != "exited":
            await app.changed()
    assert app.run(run_id).state == "running"  # ended mid-run, not at the run's end
    record = await call(app, "wait_run", {"runId": run_id, "timeoutS": 30})
    assert record["state"] == "succeeded", record["outcome"]
    await app.shutdown(drain=True)
    key = load_or_create_key(home, {})
    with Journal.open(home, key, readonly=True) as journal:
        ends = [
            r.data["source_event_id"]
            for r in journal.read()
            if r.type == "worker.exited" and r.data["worker_id"] == worker_id
        ]
    assert len(ends) == 1 and ends[0].endswith(":exit"), ends
    report = verify_home(home, {"BRAID_HOME": str(home)})
    assert report.ok, report.render()


async def test_running_worker_is_reattached_after_a_crash(tmp_path: Path, restarted: Any) -> None:
    """The worker outlives the killed supervisor; the new one replays and finishes its run."""
    home, workspace = tmp_path / "home", tmp_path / "ws"
    workspace.mkdir()
    first = await _start_headless(home)
    conv = await first.ask("create_conversation", {"workspace": str(workspace)})
    sent = await first.ask("submit_turn", {"branchId": conv["branchId"], "text": "?sleep 2"})
    await _until(first, sent["runId"], "running")
    first.proc.kill()  # SIGKILL: no shutdown of any kind
    await first.proc.wait()
    alive = find_local_workers(_spool_dir(home)).get(sent["runId"], [])
    assert len(alive) == 1, "the detached worker keeps running without its supervisor"
    app: BraidApp = await restarted(home)
    record = await call(app, "wait_run", {"runId": sent["runId"], "timeoutS": 30})
    assert record["state"] == "succeeded", record["outcome"]
    message = app.state.messages[record["assistantMessageId"]]
    texts = [p.text for p in message.parts if p.kind == "text"]
    assert len(texts) == 1
    assert texts[0].endswith("done.")
    assert message.completeness.state == "complete"
    assert not psutil.pid_exists(alive[0].pid) or psutil.Process(alive[0].pid).status() == "zombie"
    assert find_local_workers(_spool_dir(home)) == {}
    await app.shutdown(drain=True)
    report = verify_home(home, {"BRAID_HOME": str(home)})
    assert report.ok, report.render()


async def test_pending_interaction_is_answerable_after_reconciliation(
    tmp_path: Path, restarted: Any
) -> None:
    """A permission asked before the crash is still pending, answerable, and runs once."""
    home, workspace = tmp_path / "home", tmp_path / "ws"
    workspace.mkdir()
    first = await _start_headless(home)
    conv = await first.ask("create_conversation", {"workspace": str(workspace)})
    sent = await first.ask(
        "submit_turn", {"branchId": conv["branchId"], "text": "!echo ran >> marks.txt"}
    )
    blocked = await _until(first, sent["runId"], "blocked")
    interaction = blocked["interactions"][0]["interactionId"]
    first.proc.kill()
    await first.proc.wait()
    app: BraidApp = await restarted(home)
    with trio.fail_after(10):
        while interaction not in app.runs.pending:  # noqa: ASYNC110 - set by reconciliation
            await trio.sleep(0.05)
    answered = await call(
        app,
        "respond_interaction",
        {
            "runId": sent["runId"],
            "interactionId": interaction,
            "answer": {"allow": True},
        },
    )
    assert answered["state"] == "answered"
    record = await call(app, "wait_run", {"runId": sent["runId"], "timeoutS": 30})
    assert record["state"] == "succeeded", record["outcome"]
    assert (workspace / "marks.txt").read_text() == "ran\n"  # exactly once
    parts = app.state.messages[record["assistantMessageId"]].parts
    assert [p.kind for p in parts].count("tool_result") == 1


async def test_worker_gone_with_its_supervisor_is_unknown(tmp_path: Path, restarted: Any) -> None:
    """When the worker died too and reported no end, the run is unknown with the reason."""
    home, workspace = tmp_path / "home", tmp_path / "ws"
    workspace.mkdir()
    first = await _start_headless(home)
    conv = await first.ask("create_conversation", {"workspace": str(workspace)})
    sent = await first.ask("submit_turn", {"branchId": conv["branchId"], "text": "?sleep 5"})
    await _until(first, sent["runId"], "running")
    workers = find_local_workers(_spool_dir(home))[sent["runId"]]
    first.proc.kill()
    await first.proc.wait()
    for info in workers:
        os.killpg(info.pgid, signal.SIGKILL)
    app: BraidApp = await restarted(home)
    record = await call(app, "wait_run", {"runId": sent["runId"], "timeoutS": 30})
    assert record["state"] == "unknown"
    assert record["outcome"]["kind"] == "lost"
    assert "did not report" in record["outcome"]["reason"]


async def test_a_child_exec_after_a_restart_is_recorded_on_its_journaled_worker(
    tmp_path: Path, restarted: Any
) -> None:
    """A shell child found by the killed supervisor execs after the restart: the new one
    recognises the journaled worker (no second record of the child) and records the new
    command line on it, once; a child the shell starts after the restart is the shell's."""
    home, workspace = tmp_path / "home", tmp_path / "ws"
    workspace.mkdir()
    text = "!sleep 4; sleep 0.6; exec sleep 1"
    first, sent = await _shell_turn(home, workspace, text)
    shell_command = ["sh", "-c", text[1:]]
    with trio.fail_after(10):
        while True:
            listed = await first.ask("list_workers", {"runId": sent["runId"]})
            commands = [w["command"] for w in listed["workers"]]
            if shell_command in commands and ["sleep", "4"] in commands:
                break  # both children are journaled before the kill
            await trio.sleep(0.05)
    first.proc.kill()
    await first.proc.wait()
    app: BraidApp = await restarted(home)
    record = await call(app, "wait_run", {"runId": sent["runId"], "timeoutS": 30})
    assert record["state"] == "succeeded", record["outcome"]
    workers = (await call(app, "list_workers", {"runId": sent["runId"]}))["workers"]
    (shell,) = [w for w in workers if w["command"] == shell_command]
    assert [e["command"] for e in shell["execs"]] == [["sleep", "1"]]
    # The shell's child started after the restart is the shell's, not the root's.
    (later,) = [w for w in workers if w["command"] == ["sleep", "0.6"]]
    assert later["parentWorkerId"] == shell["workerId"]
    assert len(workers) == 4  # the root, the shell, its two sleeps: each recorded once
    await app.shutdown(drain=True)
    key = load_or_create_key(home, {})
    with Journal.open(home, key, readonly=True) as journal:
        records = [r for r in journal.read() if r.data.get("run_id") == sent["runId"]]
    assert [r.type for r in records].count("worker.executed") == 1
    # A child the killed supervisor recorded ends as it exits, seen by the new one's samples
    # (":exit"), not at the run's end (":end"); every worker ends once. (The shell exits
    # as the turn ends: which of the two records it first is a race.)
    (sleep,) = [w for w in workers if w["command"] == ["sleep", "4"]]
    ends = [
        (r.data["worker_id"], r.data["source_event_id"])
        for r in records
        if r.type == "worker.exited"
    ]
    assert sorted(worker for worker, _ in ends) == sorted(w["workerId"] for w in workers)
    assert dict(ends)[sleep["workerId"]].endswith(":exit"), ends
    report = verify_home(home, {"BRAID_HOME": str(home)})
    assert report.ok, report.render()


async def test_a_child_that_ends_while_its_supervisor_is_down_is_ended_at_reconciliation(
    tmp_path: Path, restarted: Any
) -> None:
    """A child the killed supervisor recorded exits before the new one starts: the new
    one's first sample of the run does not find it and its process is gone, so it is
    recorded as exited then (":exit"), while the run goes on, not at the run's end."""
    home, workspace = tmp_path / "home", tmp_path / "ws"
    workspace.mkdir()
    first, sent = await _shell_turn(home, workspace, "!sleep 1; sleep 6")
    child, _ = await _journaled_child(first, sent["runId"], ["sleep", "1"])  # before the kill
    first.proc.kill()
    await first.proc.wait()
    for _ in range(200):  # it ends while no supervisor runs
        if presence(ProcessKey(child["pid"], child["createTime"])) != "running":
            break
        await trio.sleep(0.05)
    else:
        raise AssertionError("the short child never ended")
    app: BraidApp = await restarted(home)
    await _ends_once_mid_run(app, home, sent["runId"], child["workerId"])  # at reconciliation


async def test_a_child_that_left_the_tree_while_its_supervisor_was_down_is_still_watched(
    tmp_path: Path, restarted: Any
) -> None:
    """A child the killed supervisor recorded is re-parented away from the run's tree while
    no supervisor runs (its parent exits) and keeps running: the new supervisor still
    watches it, so its exit is recorded when it happens (":exit"), mid-run, not at the
    run's end."""
    home, workspace = tmp_path / "home", tmp_path / "ws"
    workspace.mkdir()
    first, sent = await _shell_turn(home, workspace, "!(sleep 5 & sleep 1.5); sleep 9")
    # recorded before the kill, while its parent still runs
    child, workers = await _journaled_child(first, sent["runId"], ["sleep", "5"])
    first.proc.kill()
    await first.proc.wait()
    pids = {w["pid"] for w in workers}
    with trio.fail_after(10):  # its parent exits and it is re-parented outside the tree
        while True:
            if psutil.Process(child["pid"]).ppid() not in pids:
                break
            await trio.sleep(0.05)
    app: BraidApp = await restarted(home)
    await _ends_once_mid_run(app, home, sent["runId"], child["workerId"])  # seen exiting
