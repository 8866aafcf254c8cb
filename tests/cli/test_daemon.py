"""`braid serve` as a real process: the socket, clients, signals, subscriptions, concurrency."""

from __future__ import annotations

import itertools
import json
import signal
import socket
import time
from typing import TYPE_CHECKING, Any

import pytest
import trio

from braid_actors.cli.verify import verify_home
from tests.cli._daemon import (
    BRAID,
    Conn,
    Daemons,
    clean_env,
    connected,
    gone,
    journal_types,
    short_dir,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

ACTIVE = {"admitted", "running", "blocked", "detached", "cancelling"}


@pytest.fixture
async def daemons() -> AsyncIterator[Daemons]:
    with short_dir() as base:
        (base / "ws").mkdir()
        manager = Daemons(base)
        try:
            yield manager
        finally:
            await manager.aclose()


def workspace(daemons: Daemons) -> str:
    return str(daemons.base / "ws")


async def test_socket_is_private_and_a_second_daemon_refuses(daemons: Daemons) -> None:
    """The socket has mode 0600; a second `serve` on the home exits 2 and leaves it alone."""
    daemon = await daemons.start()
    assert daemon.path.stat().st_mode & 0o777 == 0o600
    second = await trio.run_process(
        [*BRAID, "--home", str(daemons.home), "serve"],
        capture_stdout=True,
        capture_stderr=True,
        env=clean_env(),
        check=False,
    )
    assert second.returncode == 2
    assert b"daemon_running" in second.stderr
    assert daemon.path.exists()
    async with connected(daemon.path) as conn:
        assert (await conn.call("status"))["protocol"] == 1


async def test_a_stale_socket_is_replaced(daemons: Daemons) -> None:
    """A socket file left by a dead daemon is removed and the new daemon serves."""
    daemons.home.mkdir(mode=0o700)
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(daemons.home / "braid.sock"))
    dead.close()  # the file stays, nobody listens
    daemon = await daemons.start()
    async with connected(daemon.path) as conn:
        assert (await conn.call("status"))["protocol"] == 1


async def test_headless_client_round_trips_and_leaves_the_daemon_running(
    daemons: Daemons,
) -> None:
    """`braid headless` talks to the daemon; its EOF exits 0 and the daemon keeps serving."""
    daemon = await daemons.start()
    requests = [
        {"id": 1, "command": "status"},
        {
            "id": 2,
            "command": "create_conversation",
            "params": {"workspace": workspace(daemons), "operationId": "op-client"},
        },
        {"id": 3, "command": "no_such_command"},
    ]
    proc = await trio.run_process(
        [*BRAID, "--home", str(daemons.home), "headless"],
        stdin="".join(json.dumps(r) + "\n" for r in requests).encode(),
        capture_stdout=True,
        capture_stderr=True,
        env=clean_env(),
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    replies = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["id"] for r in replies] == [1, 2, 3]
    assert replies[0]["result"]["journal"]["path"] == str(daemons.home / "journal.sqlite3")
    assert replies[1]["ok"]
    assert replies[2]["error"]["code"] == "unknown_command"
    assert daemon.proc.returncode is None
    async with connected(daemon.path) as conn:
        listed = await conn.call("list_conversations")
    assert [c["conversationId"] for c in listed["conversations"]] == [
        replies[1]["result"]["conversationId"]
    ]


async def test_connection_eof_does_not_stop_the_daemon(daemons: Daemons) -> None:
    """A connection that ends its input still gets owed replies; the daemon serves on."""
    daemon = await daemons.start()
    stream = await trio.open_unix_socket(str(daemon.path))
    async with stream:
        await stream.send_all(b'{"id":"a","command":"status"}\n{"id":"b","command":"status"}\n')
        await stream.send_eof()
        received = b""
        with trio.fail_after(10):
            while chunk := await stream.receive_some(65536):
                received += chunk
    assert [json.loads(x)["id"] for x in received.splitlines()] == ["a", "b"]
    await trio.sleep(0.2)
    assert daemon.proc.returncode is None
    async with connected(daemon.path) as conn:
        assert (await conn.call("status"))["protocol"] == 1
    assert journal_types(daemons.home)["application.shutdown.requested"] == 0


async def test_shutdown_command_stops_the_daemon_and_removes_the_socket(
    daemons: Daemons,
) -> None:
    """`shutdown` replies, the daemon exits 0, its socket is gone and the journal verifies."""
    daemon = await daemons.start()
    async with connected(daemon.path) as conn, connected(daemon.path) as idle:
        assert (await idle.call("status"))["protocol"] == 1
        assert await conn.call("shutdown", {"drain": True}) == {"stopped": True}
        assert await daemon.wait() == 0
        with trio.fail_after(5):
            await idle.closed.wait()
    assert not daemon.path.exists()
    report = verify_home(daemons.home, {})
    assert report.ok, report.render()
    assert journal_types(daemons.home)["application.shutdown.requested"] == 1


async def _running_turn(conn: Conn, ws: str, text: str) -> tuple[str, str]:
    """Create a conversation, subscribe to it, submit ``text``; returns (conv, run) once the
    run streams its first part (its worker is up)."""
    conv = await conn.call("create_conversation", {"workspace": ws})
    await conn.call("subscribe", {"conversationId": conv["conversationId"]})
    sent = await conn.call("submit_turn", {"branchId": conv["branchId"], "text": text})
    run_id = sent["runId"]
    with trio.fail_after(20):
        await conn.event(lambda e: e["event"] == "run.event" and e["data"]["runId"] == run_id)
    return conv["conversationId"], run_id


async def test_sigterm_drains_and_journals_one_shutdown_request(daemons: Daemons) -> None:
    """Two SIGTERMs: one `application.shutdown.requested`; the active run drains to success."""
    daemon = await daemons.start()
    async with connected(daemon.path) as conn:
        conv_id, run_id = await _running_turn(conn, workspace(daemons), "?sleep 1.5")
        daemon.proc.send_signal(signal.SIGTERM)
        await trio.sleep(0.2)
        daemon.proc.send_signal(signal.SIGTERM)
        with trio.fail_after(20):
            finished = await conn.event(lambda e: e["event"] == "run.finished")
        assert finished["data"]["state"] == "succeeded"
    assert await daemon.wait() == 0
    assert not daemon.path.exists()
    types = journal_types(daemons.home)
    assert types["application.shutdown.requested"] == 1
    assert types["application.stopped"] == 1
    assert conv_id and run_id


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_signal_with_cancel_stops_the_worker_and_records_cancelled(
    daemons: Daemons, signum: signal.Signals
) -> None:
    """`--on-shutdown cancel`: a signal kills the running worker; the run ends `cancelled`."""
    daemon = await daemons.start("--on-shutdown", "cancel", "--drain-grace", "5")
    async with connected(daemon.path) as conn:
        conv_id, run_id = await _running_turn(conn, workspace(daemons), "?sleep 30")
        workers = daemon.workers()
        assert workers, "the run's worker process is not running"
        started = time.monotonic()
        daemon.proc.send_signal(signum)
        assert await daemon.wait() == 0
    assert time.monotonic() - started < 15
    for worker in workers:
        assert gone(worker.pid), f"worker {worker.pid} outlived the shutdown"
    assert not daemon.path.exists()
    assert journal_types(daemons.home)["application.shutdown.requested"] == 1
    again = await daemons.start()
    async with connected(again.path) as conn:
        view = await conn.call("get_conversation", {"conversationId": conv_id})
        record = next(r for r in view["runs"] if r["runId"] == run_id)
        assert record["state"] == "cancelled"
        assert record["outcome"]["kind"] == "cancelled"
        await conn.call("shutdown")
    assert await again.wait() == 0


async def test_subscribe_streams_a_turn(daemons: Daemons) -> None:
    """A subscription gets run.state, run.event by part id, run.finished and journal.committed."""
    daemon = await daemons.start()
    async with connected(daemon.path) as conn, connected(daemon.path) as other:
        ws = workspace(daemons)
        conv = await conn.call("create_conversation", {"workspace": ws})
        elsewhere = await other.call("create_conversation", {"workspace": ws})
        sub = await conn.call("subscribe", {"conversationId": conv["conversationId"]})
        assert sub["subscriptionId"].startswith("sub_")
        await other.call("subscribe", {"conversationId": elsewhere["conversationId"]})
        sent = await conn.call("submit_turn", {"branchId": conv["branchId"], "text": "hi there"})
        with trio.fail_after(20):
            finished = await conn.event(lambda e: e["event"] == "run.finished")
    events = conn.events
    assert all(e["subscriptionId"] == sub["subscriptionId"] for e in events)
    states = [e["data"]["state"] for e in events if e["event"] == "run.state"]
    assert states[0] == "queued"
    assert states[-1] == "succeeded"
    assert "running" in states
    parts = [e["data"] for e in events if e["event"] == "run.event"]
    assert parts
    assert all(p["runId"] == sent["runId"] and p["partId"] == p["part"]["partId"] for p in parts)
    last_text = [p["part"]["text"] for p in parts if p["part"]["kind"] == "text"][-1]
    assert "hi there" in last_text
    assert finished["data"]["run"]["state"] == "succeeded"
    assert finished["data"]["outcome"]["kind"] == "completed"
    seqs = [e["data"]["seq"] for e in events if e["event"] == "journal.committed"]
    assert seqs == sorted(seqs)
    assert seqs
    assert [e for e in other.events if e["event"] != "journal.committed"] == []


async def test_hundred_runs_across_twenty_branches_respect_order_and_limit(
    daemons: Daemons,
) -> None:
    """100 runs, 20 branches, 5 connections, limit 4: all succeed, in order, never over 4."""
    started = time.monotonic()
    daemon = await daemons.start("--max-active", "4")
    ws = workspace(daemons)
    submitted: dict[str, list[str]] = {}  # branch -> run ids in submission order
    conversations: list[str] = []
    records: list[dict[str, Any]] = []

    async def client(index: int) -> None:
        async with connected(daemon.path) as conn:
            branches = []
            for n in range(4):
                conv = await conn.call(
                    "create_conversation", {"workspace": ws, "title": f"c{index}-{n}"}
                )
                conversations.append(conv["conversationId"])
                branches.append(conv["branchId"])
                submitted[conv["branchId"]] = []
            for turn in range(5):
                for branch in branches:
                    sent = await conn.call(
                        "submit_turn", {"branchId": branch, "text": f"turn {turn}"}
                    )
                    submitted[branch].append(sent["runId"])
            waits = [
                await conn.send("wait_run", {"runId": run_id, "timeoutS": 60})
                for branch in branches
                for run_id in submitted[branch]
            ]
            for rid in waits:
                reply = await conn.reply(rid)
                assert reply["ok"], reply
                records.append(reply["result"])

    async with connected(daemon.path) as watch:
        await watch.call("subscribe")
        with trio.fail_after(90):
            async with trio.open_nursery() as nursery:
                for index in range(5):
                    nursery.start_soon(client, index)
            await watch.event(lambda e: e["event"] == "run.finished" and _all_done(watch.events))
        elapsed = time.monotonic() - started
        await watch.call("shutdown")
    assert await daemon.wait() == 0

    assert len(records) == 100
    assert all(r["state"] == "succeeded" and not r["timedOut"] for r in records), [
        (r["runId"], r["state"], r["outcome"]) for r in records if r["state"] != "succeeded"
    ]
    by_id = {r["runId"]: r for r in records}
    assert sum(len(v) for v in submitted.values()) == 100
    for branch, run_ids in submitted.items():
        runs = [by_id[run_id] for run_id in run_ids]
        assert [r["branchId"] for r in runs] == [branch] * 5
        starts = [r["startedAt"] for r in runs]
        assert starts == sorted(starts), f"branch {branch} started out of submission order"
        for before, after in itertools.pairwise(runs):
            assert before["endedAt"] <= after["startedAt"], f"two active runs on {branch}"
    assert 2 <= _max_overlap(records) <= 4

    # The subscription saw the same: at most 4 active at any point, one per branch.
    active: dict[str, str] = {}
    peak = 0
    for e in watch.events:
        if e["event"] != "run.state":
            continue
        data = e["data"]
        if data["state"] in ACTIVE:
            assert data["branchId"] not in active.values() or active.get(data["runId"]), data
            active[data["runId"]] = data["branchId"]
        else:
            active.pop(data["runId"], None)
        peak = max(peak, len(active))
    assert 2 <= peak <= 4
    assert not any(e["event"] == "subscription.dropped" for e in watch.events)
    print(f"100 runs through the daemon in {elapsed:.1f} s")
    assert elapsed < 60


def _all_done(events: list[dict[str, Any]]) -> bool:
    return sum(1 for e in events if e["event"] == "run.finished") >= 100


def _max_overlap(records: list[dict[str, Any]]) -> int:
    """Most runs whose [startedAt, endedAt] intervals overlap at one instant."""
    points = [(r["startedAt"], 1) for r in records] + [(r["endedAt"], -1) for r in records]
    points.sort(key=lambda p: (p[0], p[1]))  # an end before a start at the same instant
    peak = current = 0
    for _, step in points:
        current += step
        peak = max(peak, current)
    return peak


def test_admission_limit_comes_from_the_flag_or_the_environment() -> None:
    """`--max-active` wins over `BRAID_MAX_ACTIVE`; a bad value is refused."""
    from braid_actors.cli.main import _max_active
    from braid_actors.errors import BadRequest

    assert _max_active(None, {}) is None
    assert _max_active(None, {"BRAID_MAX_ACTIVE": "3"}) == 3
    assert _max_active(2, {"BRAID_MAX_ACTIVE": "3"}) == 2
    for bad_flag, env in ((0, {}), (None, {"BRAID_MAX_ACTIVE": "x"})):
        with pytest.raises(BadRequest):
            _max_active(bad_flag, env)
