"""The headless JSONL loop against a real app: real journal, real local runner processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import trio
import trio.testing

from braid_actors.app import BraidApp, open_app
from braid_actors.cli.headless import MAX_LINE, Writer, serve_lines
from braid_actors.cli.verify import verify_home

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


class Client:
    """Writes request lines into the loop and reads its reply lines."""

    def __init__(self, send: trio.abc.SendStream, receive: trio.abc.ReceiveStream) -> None:
        self._send = send
        self._receive = receive
        self._buf = b""
        self._n = 0
        self.events: list[dict[str, Any]] = []
        self.replies: dict[Any, dict[str, Any]] = {}

    async def raw(self, line: bytes) -> None:
        await self._send.send_all(line)

    async def request(self, command: str, params: dict[str, Any] | None = None) -> str:
        self._n += 1
        rid = f"c{self._n}"
        body: dict[str, Any] = {"id": rid, "command": command}
        if params is not None:
            body["params"] = params
        await self.raw(json.dumps(body).encode() + b"\n")
        return rid

    async def next_reply(self) -> dict[str, Any]:
        while b"\n" not in self._buf:
            chunk = await self._receive.receive_some(65536)
            assert chunk, "the loop closed its output"
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        message: dict[str, Any] = json.loads(line)
        return message

    async def reply_to(self, rid: str) -> dict[str, Any]:
        while rid not in self.replies:
            message = await self.next_reply()
            self.replies[message.get("id")] = message
        return self.replies.pop(rid)

    async def ok(self, command: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        reply = await self.reply_to(await self.request(command, params))
        assert reply["ok"], reply
        result: dict[str, Any] = reply["result"]
        return result

    async def err(self, command: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        reply = await self.reply_to(await self.request(command, params))
        assert not reply["ok"], reply
        error: dict[str, Any] = reply["error"]
        return error


@pytest.fixture
async def running(tmp_path: Path) -> AsyncIterator[tuple[BraidApp, Client, Path]]:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    env = {"BRAID_HOME": str(tmp_path / "home")}
    async with trio.open_nursery() as nursery:
        app: BraidApp = await nursery.start(
            lambda task_status: open_app(tmp_path / "home", env=env, task_status=task_status)
        )
        to_loop_send, to_loop_recv = trio.testing.memory_stream_one_way_pair()
        from_loop_send, from_loop_recv = trio.testing.memory_stream_one_way_pair()
        nursery.start_soon(serve_lines, app, to_loop_recv, Writer(from_loop_send))
        yield app, Client(to_loop_send, from_loop_recv), workspace
        if not app.stopped.is_set():
            await app.shutdown(drain=False, grace=5)
        nursery.cancel_scope.cancel()


async def test_bad_input_gets_its_own_code_and_writes_nothing(
    running: tuple[BraidApp, Client, Path],
) -> None:
    """Malformed JSON, an over-long line, unknown command and bad params each have a code."""
    app, client, workspace = running
    seq_before = app.admission.seq
    await client.raw(b"{not json\n")
    assert (await client.next_reply())["error"]["code"] == "malformed_json"
    await client.raw(b'{"id":"big","command":"status","params":{"x":"' + b"a" * (MAX_LINE + 10))
    await client.raw(b'"}}\n')
    long_reply = await client.next_reply()
    assert long_reply["error"]["code"] == "line_too_long"
    assert (await client.err("no_such_command"))["code"] == "unknown_command"
    missing = await client.err("submit_turn", {"text": "hi"})
    assert missing["code"] == "invalid_params"
    mistyped = await client.err("create_conversation", {"workspace": 5})
    assert mistyped["code"] == "invalid_params"
    extra = await client.err("create_conversation", {"workspace": str(workspace), "bogus": 1})
    assert extra["code"] == "invalid_params"
    assert (await client.err("submit_turn", {"branchId": "br_nope", "text": "x"}))[
        "code"
    ] == "unknown_branch"
    await client.raw(b"[1,2]\n")
    assert (await client.next_reply())["error"]["code"] == "invalid_request"
    status = await client.ok("status")
    assert status["protocol"] == 1
    assert status["journal"]["encrypted"] is True
    runners = {r["name"]: r for r in status["runners"]}
    assert runners["local"]["available"] is True
    assert runners["local"]["capabilities"]["sessionsContinue"] is True
    # The pinned Claude Code install (tools/harnesses) is found and reported honestly.
    assert runners["claude_code"]["available"] is True
    assert runners["claude_code"]["capabilities"]["portableContext"] is True
    assert runners["codex"]["available"] is True
    assert runners["codex"]["capabilities"]["cost"] is False  # Codex reports no cost
    assert app.admission.seq == seq_before


async def test_operation_id_makes_commands_idempotent(
    running: tuple[BraidApp, Client, Path],
) -> None:
    """Same operationId and params returns the recorded result; other params conflict."""
    app, client, workspace = running
    params = {"workspace": str(workspace), "title": "one", "operationId": "op-fixed"}
    first = await client.ok("create_conversation", params)
    seq = app.admission.seq
    again = await client.ok("create_conversation", params)
    assert again == first
    assert app.admission.seq == seq
    conflict = await client.err("create_conversation", {**params, "title": "two"})
    assert conflict["code"] == "operation_conflict"
    assert app.admission.seq == seq
    listed = await client.ok("list_conversations", {"workspace": str(workspace)})
    assert [c["title"] for c in listed["conversations"]] == ["one"]
    generated = await client.ok("create_conversation", {"workspace": str(workspace)})
    assert generated["operationId"].startswith("op_")


async def test_turns_stream_journal_and_continue_the_native_session(
    running: tuple[BraidApp, Client, Path],
) -> None:
    """A turn runs on the local runner; the next continues its proven session."""
    _app, client, workspace = running
    conv = await client.ok("create_conversation", {"workspace": str(workspace), "title": "t"})
    sent = await client.ok("submit_turn", {"branchId": conv["branchId"], "text": "hello there"})
    record = await client.ok("wait_run", {"runId": sent["runId"], "timeoutS": 30})
    assert record["state"] == "succeeded"
    assert record["outcome"]["kind"] == "completed"
    assert record["sessionLabel"] == "new session"
    assert record["usage"]["source"] == "estimate"
    assert record["usage"]["outputTokens"] > 0
    assert record["costUsd"] == 0.0
    assert record["events"]["count"] > 2
    assert record["receipt"].startswith("sha256:")
    view = await client.ok("get_conversation", {"conversationId": conv["conversationId"]})
    reply = next(m for m in view["messages"] if m["role"] == "assistant")
    text = "".join(p["text"] for p in reply["parts"] if p["kind"] == "text")
    assert "hello there" in text
    assert reply["completeness"]["state"] == "complete"
    second = await client.ok("submit_turn", {"branchId": conv["branchId"], "text": "again"})
    record2 = await client.ok("wait_run", {"runId": second["runId"], "timeoutS": 30})
    assert record2["state"] == "succeeded"
    assert record2["sessionLabel"] == "resumed session"
    assert record2["providerSessionId"] == record["providerSessionId"]
    # The native transcript is the session file; the run's trace is the evidence run that
    # ingested it when the run finished.
    assert record2["traceRef"] == record2["runId"]
    session_file = Path(record2["tracePath"])
    lines = [json.loads(x) for x in (await trio.Path(session_file).read_text()).splitlines()]
    assert [x["role"] for x in lines] == ["user", "assistant", "user", "assistant"]


async def test_tool_turn_waits_for_permission_and_records_the_result(
    running: tuple[BraidApp, Client, Path],
) -> None:
    """`!cmd` blocks on a permission interaction; the answer lets the real command run."""
    app, client, workspace = running
    (workspace / "marker.txt").write_text("x")
    conv = await client.ok("create_conversation", {"workspace": str(workspace)})
    sent = await client.ok("submit_turn", {"branchId": conv["branchId"], "text": "!ls"})
    blocked = await client.ok("wait_run", {"runId": sent["runId"], "timeoutS": 0})
    while blocked["state"] != "blocked":
        await app.changed()
        blocked = await client.ok("wait_run", {"runId": sent["runId"], "timeoutS": 0})
    assert blocked["timedOut"] is True
    interaction = blocked["interactions"][0]
    assert interaction["state"] == "pending"
    assert interaction["subject"]["command"] == "ls"
    answered = await client.ok(
        "respond_interaction",
        {
            "runId": sent["runId"],
            "interactionId": interaction["interactionId"],
            "answer": {"allow": True},
        },
    )
    assert answered["state"] == "answered"
    again = await client.err(
        "respond_interaction",
        {
            "runId": sent["runId"],
            "interactionId": interaction["interactionId"],
            "answer": {"allow": True},
        },
    )
    assert again["code"] == "interaction_not_pending"
    record = await client.ok("wait_run", {"runId": sent["runId"], "timeoutS": 30})
    assert record["state"] == "succeeded"
    view = await client.ok("get_conversation", {"conversationId": conv["conversationId"]})
    parts = [p for m in view["messages"] for p in m["parts"]]
    result = next(p for p in parts if p["kind"] == "tool_result")
    assert result["status"] == "ok"
    assert result["exitCode"] == 0
    assert "marker.txt" in result["summary"]
    assert any(p["kind"] == "tool_request" for p in parts)


async def test_branch_and_clone_through_headless_record_their_edges(
    running: tuple[BraidApp, Client, Path],
) -> None:
    """branch and clone return new ids and the graph shows branched_at / cloned_from."""
    _app, client, workspace = running
    conv = await client.ok("create_conversation", {"workspace": str(workspace), "title": "G"})
    for text in ("first", "second"):
        sent = await client.ok("submit_turn", {"branchId": conv["branchId"], "text": text})
        await client.ok("wait_run", {"runId": sent["runId"], "timeoutS": 30})
    view = await client.ok("get_conversation", {"conversationId": conv["conversationId"]})
    history = view["branches"][0]["history"]
    second_user = history[2]
    branched = await client.ok(
        "branch", {"branchId": conv["branchId"], "throughMessageId": second_user}
    )
    assert branched["draft"] == "second"
    bad = await client.err("branch", {"branchId": conv["branchId"], "throughMessageId": "msg_x"})
    assert bad["code"] == "missing_boundary"
    cloned = await client.ok("clone", {"branchId": conv["branchId"]})
    assert cloned["title"] == "G (clone)"
    g = await client.ok("get_graph", {"conversationId": conv["conversationId"]})
    kinds = sorted(e["kind"] for e in g["edges"])
    assert kinds == ["branched_at", "cloned_from", "continued", "continued", "spawned", "spawned"]
    assert g["checksum"].startswith("sha256:")
    after = await client.ok("get_conversation", {"conversationId": conv["conversationId"]})
    new_branch = next(b for b in after["branches"] if b["branchId"] == branched["branchId"])
    assert new_branch["history"] == history[:2]
    assert new_branch["binding"]["state"] == "unbound"
    clone_view = await client.ok("get_conversation", {"conversationId": cloned["conversationId"]})
    assert clone_view["branches"][0]["history"] == history


async def test_turns_queue_behind_the_active_run(running: tuple[BraidApp, Client, Path]) -> None:
    """Later turns on a busy branch wait in order with visible positions."""
    _app, client, workspace = running
    conv = await client.ok("create_conversation", {"workspace": str(workspace)})
    first = await client.ok("submit_turn", {"branchId": conv["branchId"], "text": "?sleep 1"})
    second = await client.ok("submit_turn", {"branchId": conv["branchId"], "text": "b"})
    third = await client.ok("submit_turn", {"branchId": conv["branchId"], "text": "c"})
    assert (second["queuePosition"], third["queuePosition"]) == (1, 2)
    del first
    last = await client.ok("wait_run", {"runId": third["runId"], "timeoutS": 30})
    assert last["state"] == "succeeded"
    view = await client.ok("get_conversation", {"conversationId": conv["conversationId"]})
    starts = sorted((r["startedAt"], r["runId"]) for r in view["runs"])
    assert [r for _, r in starts][1:] == [second["runId"], third["runId"]]


async def test_shutdown_command_stops_and_journal_verifies(
    running: tuple[BraidApp, Client, Path], tmp_path: Path
) -> None:
    """shutdown journals the request first and leaves a clean journal."""
    app, client, workspace = running
    conv = await client.ok("create_conversation", {"workspace": str(workspace)})
    sent = await client.ok("submit_turn", {"branchId": conv["branchId"], "text": "hi"})
    await client.ok("wait_run", {"runId": sent["runId"], "timeoutS": 30})
    assert (await client.ok("shutdown", {"drain": True})) == {"stopped": True}
    assert app.stopped.is_set()
    report = verify_home(tmp_path / "home", {"BRAID_HOME": str(tmp_path / "home")})
    assert report.ok, report.render()


def test_end_of_input_shuts_down_safely(tmp_path: Path) -> None:
    """A real `braid headless` process answers, then exits cleanly at EOF."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    home = tmp_path / "home"
    requests = [
        {
            "id": 1,
            "command": "create_conversation",
            "params": {"workspace": str(workspace), "operationId": "op-a"},
        },
        {"id": 2, "command": "status"},
    ]
    env = {**os.environ, "BRAID_HOME": str(home)}
    proc = subprocess.run(
        [sys.executable, "-m", "braid_actors.cli.main", "headless"],
        input="\n".join(json.dumps(r) for r in requests) + "\n",
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    replies = [json.loads(x) for x in proc.stdout.splitlines()]
    assert [r["id"] for r in replies] == [1, 2]
    assert all(r["ok"] for r in replies)
    report = verify_home(home, {"BRAID_HOME": str(home)})
    assert report.ok, report.render()
    assert report.events >= 4  # started, created, shutdown requested, stopped
