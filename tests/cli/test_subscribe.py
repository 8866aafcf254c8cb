"""`subscribe` in the in-process loop: events on the session's own output, filters, bounds."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import pytest
import trio
import trio.testing

from braid_actors.app import BraidApp, open_app
from braid_actors.cli.headless import Writer, serve_lines
from tests.cli._daemon import clean_env

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path


class Lines:
    """Reads the loop's output: replies by id, events in order."""

    def __init__(self, send: trio.abc.SendStream, receive: trio.abc.ReceiveStream) -> None:
        self.send = send
        self.receive = receive
        self.buf = b""
        self.events: list[dict[str, Any]] = []
        self.replies: dict[Any, dict[str, Any]] = {}
        self.n = 0

    async def request(self, command: str, params: dict[str, Any] | None = None) -> str:
        self.n += 1
        rid = f"q{self.n}"
        body: dict[str, Any] = {"id": rid, "command": command}
        if params is not None:
            body["params"] = params
        await self.send.send_all(json.dumps(body).encode() + b"\n")
        return rid

    async def one(self) -> dict[str, Any]:
        while b"\n" not in self.buf:
            chunk = await self.receive.receive_some(65536)
            assert chunk, "the loop closed its output"
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        message: dict[str, Any] = json.loads(line)
        if "event" in message:
            self.events.append(message)
        else:
            self.replies[message.get("id")] = message
        return message

    async def reply(self, rid: str) -> dict[str, Any]:
        while rid not in self.replies:
            await self.one()
        return self.replies.pop(rid)

    async def ok(self, command: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        reply = await self.reply(await self.request(command, params))
        assert reply["ok"], reply
        result: dict[str, Any] = reply["result"]
        return result

    async def until(self, name: str) -> dict[str, Any]:
        for message in self.events:
            if message["event"] == name:
                return message
        while True:
            message = await self.one()
            if message.get("event") == name:
                return message


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[BraidApp]:
    (tmp_path / "ws").mkdir()
    async with trio.open_nursery() as nursery:
        running: BraidApp = await nursery.start(
            lambda task_status: open_app(tmp_path / "home", env={}, task_status=task_status)
        )
        yield running
        if not running.stopped.is_set():
            await running.shutdown(drain=False, grace=5)
        nursery.cancel_scope.cancel()


def _loop(
    nursery: trio.Nursery, app: BraidApp, *, lockstep: bool = False
) -> tuple[Lines, trio.abc.SendStream]:
    to_send, to_recv = trio.testing.memory_stream_one_way_pair()
    if lockstep:
        out_send, out_recv = trio.testing.lockstep_stream_one_way_pair()
    else:
        out_send, out_recv = trio.testing.memory_stream_one_way_pair()
    nursery.start_soon(serve_lines, app, to_recv, Writer(out_send))
    return Lines(to_send, out_recv), to_send


async def test_subscribe_in_process_filters_by_run(app: BraidApp, tmp_path: Path) -> None:
    """Events reach the loop's own output; a runId filter hears of that run only."""
    ws = str(tmp_path / "ws")
    async with trio.open_nursery() as nursery:
        lines, _ = _loop(nursery, app)
        conv = await lines.ok("create_conversation", {"workspace": ws})
        first = await lines.ok("submit_turn", {"branchId": conv["branchId"], "text": "?sleep 0.3"})
        second = await lines.ok("submit_turn", {"branchId": conv["branchId"], "text": "two"})
        sub = await lines.ok("subscribe", {"runId": second["runId"]})
        done = await lines.until("run.finished")
        assert done["data"]["runId"] == second["runId"]
        own = [e for e in lines.events if e["event"] != "journal.committed"]
        assert {e["data"]["runId"] for e in own} == {second["runId"]}
        assert all(e["subscriptionId"] == sub["subscriptionId"] for e in lines.events)
        states = [e["data"]["state"] for e in own if e["event"] == "run.state"]
        assert states[0] in ("admitted", "running")
        assert states[-1] == "succeeded"
        del first
        nursery.cancel_scope.cancel()


async def test_subscribe_reports_interactions(app: BraidApp, tmp_path: Path) -> None:
    """A permission request and its answer arrive as `run.interaction` events."""
    (tmp_path / "ws" / "marker.txt").write_text("x")
    async with trio.open_nursery() as nursery:
        lines, _ = _loop(nursery, app)
        conv = await lines.ok("create_conversation", {"workspace": str(tmp_path / "ws")})
        await lines.ok("subscribe", {"conversationId": conv["conversationId"]})
        sent = await lines.ok("submit_turn", {"branchId": conv["branchId"], "text": "!ls"})
        with trio.fail_after(20):
            asked = await lines.until("run.interaction")
        interaction = asked["data"]["interaction"]
        assert interaction["state"] == "pending"
        assert interaction["subject"]["command"] == "ls"
        states = [e["data"]["state"] for e in lines.events if e["event"] == "run.state"]
        assert states[-1] == "blocked"
        await lines.ok(
            "respond_interaction",
            {
                "runId": sent["runId"],
                "interactionId": interaction["interactionId"],
                "answer": {"allow": True},
            },
        )
        with trio.fail_after(20):
            finished = await lines.until("run.finished")
        answered = [
            e["data"]["interaction"] for e in lines.events if e["event"] == "run.interaction"
        ]
        assert [i["state"] for i in answered] == ["pending", "answered"]
        assert finished["data"]["state"] == "succeeded"
        nursery.cancel_scope.cancel()


async def test_subscribe_refuses_bad_params(app: BraidApp) -> None:
    """Unknown filters and mistyped params get error codes and start nothing."""
    async with trio.open_nursery() as nursery:
        lines, _ = _loop(nursery, app)
        for params, code in (
            ({"conversationId": "conv_nope"}, "unknown_conversation"),
            ({"runId": "run_nope"}, "unknown_run"),
            ({"runId": 5}, "invalid_params"),
            ({"bogus": True}, "invalid_params"),
        ):
            reply = await lines.reply(await lines.request("subscribe", params))
            assert reply["error"]["code"] == code
        assert app.events.subscriptions == 0
        nursery.cancel_scope.cancel()


async def test_a_slow_subscriber_is_dropped_and_never_blocks_the_journal(
    app: BraidApp, tmp_path: Path
) -> None:
    """A reader that stops reading gets one `subscription.dropped`; commits never wait."""
    app.events.buffer = 3
    ws = str(tmp_path / "ws")
    async with trio.open_nursery() as nursery:
        lines, _ = _loop(nursery, app, lockstep=True)
        conv = await lines.ok("create_conversation", {"workspace": ws})
        await lines.ok("subscribe", {"conversationId": conv["conversationId"]})
        rid = await lines.request("submit_turn", {"branchId": conv["branchId"], "text": "a b c"})
        # Nobody reads now: the pump blocks on the output, the buffer overflows.
        with trio.fail_after(20):
            while not any(r.state == "succeeded" for r in app.state.runs.values()):
                await app.changed()
        assert app.events.subscriptions == 0
        with trio.fail_after(10):
            dropped = await lines.until("subscription.dropped")
            await lines.reply(rid)
        assert dropped["data"]["buffer"] == 3
        assert dropped["data"]["lastSeq"] > 0
        before = [e for e in lines.events if e["event"] != "subscription.dropped"]
        assert len(before) <= 3 + 1  # the buffer, and the one the pump was writing
        status = await lines.ok("status")
        assert status["journal"]["seq"] > dropped["data"]["lastSeq"]
        assert [e["event"] for e in lines.events].count("subscription.dropped") == 1
        nursery.cancel_scope.cancel()


async def test_end_of_input_drains_while_the_subscription_reports(tmp_path: Path) -> None:
    """A real in-process `braid headless`: EOF drains the run and its events reach stdout."""
    ws = tmp_path / "ws"
    ws.mkdir()
    home = tmp_path / "home"
    env = {**clean_env(), "BRAID_HOME": str(home)}
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "braid_actors.cli.main", "headless", "--in-process"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
    )
    assert proc.stdin is not None
    assert proc.stdout is not None
    lines = Lines(proc.stdin, proc.stdout)
    with trio.fail_after(30):
        conv = await lines.ok("create_conversation", {"workspace": str(ws)})
        await lines.ok("subscribe", {"conversationId": conv["conversationId"]})
        await lines.ok("submit_turn", {"branchId": conv["branchId"], "text": "?sleep 0.5"})
        await proc.stdin.aclose()
        finished = await lines.until("run.finished")
        assert finished["data"]["state"] == "succeeded"
        assert await proc.wait() == 0
