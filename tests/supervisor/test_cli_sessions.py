"""Closing a branch's native session on the real CLIs (and refusing it while in use).

For Claude Code and Codex there is no server-side session: closing releases nothing on the
runner's side and leaves the native file untouched (it is the user's); Braid records the
binding ``closed`` and never continues it, so the next turn is a fresh session with the
typed history copied, a ``handed_off`` edge and the honest label.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import pytest
import trio

from braid_actors.app import call
from braid_actors.errors import BraidError
from braid_actors.providers import LocalProvider, Provider
from tests.supervisor._cli import braid_with, claude_provider, codex_provider
from tools.model_stub import open_model_stub, parse_script


@pytest.mark.parametrize("runner", ["claude_code", "codex"])
async def test_closed_session_is_never_continued(tmp_path: Path, runner: str) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    home = tmp_path / "home"
    steps = [{"text": "first answer"}, {"text": "second answer"}]
    script = parse_script({"anthropic": steps, "openai": steps})
    async with open_model_stub(script) as stub, trio.open_nursery() as nursery:
        provider: Provider = (
            claude_provider(tmp_path, stub)
            if runner == "claude_code"
            else codex_provider(tmp_path, stub)
        )
        app = await braid_with(nursery, home, provider)
        conv = await call(
            app, "create_conversation", {"workspace": str(workspace), "runner": runner}
        )
        branch = conv["branchId"]
        first = await call(
            app, "submit_turn", {"branchId": branch, "text": "remember the word heliotrope"}
        )
        one = await call(app, "wait_run", {"runId": first["runId"], "timeoutS": 60})
        assert one["state"] == "succeeded", one["outcome"]
        native = await trio.Path(one["tracePath"]).read_bytes()

        closed = await call(app, "close_session", {"branchId": branch, "operationId": "op-close"})
        assert closed["sessionId"] == one["providerSessionId"]
        assert closed["released"] is False  # nothing server-side to release
        binding = app.state.branches[branch].binding
        assert binding is not None
        assert binding.state == "closed"
        again = await call(app, "close_session", {"branchId": branch, "operationId": "op-close"})
        assert again == closed  # the same operation, recorded once
        with pytest.raises(BraidError) as refused:
            await call(app, "close_session", {"branchId": branch})
        assert refused.value.code == "illegal_transition"

        second = await call(app, "submit_turn", {"branchId": branch, "text": "what was the word?"})
        two = await call(app, "wait_run", {"runId": second["runId"], "timeoutS": 60})
        assert two["state"] == "succeeded", two["outcome"]
        assert two["sessionLabel"] == "new session with copied context"
        assert two["providerSessionId"] != one["providerSessionId"]
        edges = [e for e in app.state.edges.values() if e.kind == "handed_off"]
        assert [(e.source_id, e.destination_id) for e in edges] == [
            (first["runId"], second["runId"])
        ]
        assert await trio.Path(one["tracePath"]).read_bytes() == native  # left alone
        api: Literal["anthropic", "openai"] = "anthropic" if runner == "claude_code" else "openai"
        turn2 = json.dumps(stub.model_requests(api)[-1].body)
        assert turn2.count("remember the word heliotrope") == 1
        assert turn2.count("first answer") == 1
        await app.shutdown(drain=True)
        nursery.cancel_scope.cancel()


async def test_a_session_in_use_is_not_closed(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    home = tmp_path / "home"
    async with trio.open_nursery() as nursery:
        app = await braid_with(nursery, home, LocalProvider(home / "runners" / "local"))
        conv = await call(app, "create_conversation", {"workspace": str(workspace)})
        branch = conv["branchId"]
        first = await call(app, "submit_turn", {"branchId": branch, "text": "hello"})
        one = await call(app, "wait_run", {"runId": first["runId"], "timeoutS": 30})
        assert one["state"] == "succeeded", one["outcome"]
        slow = await call(app, "submit_turn", {"branchId": branch, "text": "?sleep 3"})
        with trio.fail_after(30):
            while app.state.runs[slow["runId"]].state in ("queued", "admitted"):  # noqa: ASYNC110
                await trio.sleep(0.05)
        with pytest.raises(BraidError) as refused:
            await call(app, "close_session", {"branchId": branch})
        assert refused.value.code == "illegal_transition"
        binding = app.state.branches[branch].binding
        assert binding is not None
        assert binding.state == "bound"
        done = await call(app, "wait_run", {"runId": slow["runId"], "timeoutS": 30})
        assert done["state"] == "succeeded"
        assert done["sessionLabel"] == "resumed session"
        await app.shutdown(drain=True)
        nursery.cancel_scope.cancel()


def _conversation(body: dict[str, Any]) -> list[tuple[str, str]]:
    """An Anthropic request's messages as ``(role, text)``, without system reminders."""
    out = []
    for message in body["messages"]:
        content = message["content"]
        parts = [content] if isinstance(content, str) else [p.get("text", "") for p in content]
        text = "".join(p for p in parts if not p.lstrip().startswith("<system-reminder>"))
        out.append((message["role"], text))
    return out


async def test_branch_at_the_session_boundary_forks_claude_code_natively(
    tmp_path: Path,
) -> None:
    """A branch whose context ends where the source session ends starts as a native fork
    (a new session holding the source's own history, proven first); the source session is
    unchanged and still continues; a branch at another boundary gets copied context."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    home = tmp_path / "home"
    steps = [{"text": "first answer"}, {"text": "forked answer"}, {"text": "main answer"}]
    async with (
        open_model_stub(parse_script({"anthropic": steps, "fallback": "other answer"})) as stub,
        trio.open_nursery() as nursery,
    ):
        app = await braid_with(nursery, home, claude_provider(tmp_path, stub))
        conv = await call(
            app, "create_conversation", {"workspace": str(workspace), "runner": "claude_code"}
        )
        main = conv["branchId"]
        first = await call(app, "submit_turn", {"branchId": main, "text": "remember heliotrope"})
        one = await call(app, "wait_run", {"runId": first["runId"], "timeoutS": 60})
        assert one["state"] == "succeeded", one["outcome"]
        native = await trio.Path(one["tracePath"]).read_bytes()

        forked = await call(
            app, "branch", {"branchId": main, "throughMessageId": one["assistantMessageId"]}
        )
        sent = await call(app, "submit_turn", {"branchId": forked["branchId"], "text": "fork?"})
        two = await call(app, "wait_run", {"runId": sent["runId"], "timeoutS": 60})
        assert two["state"] == "succeeded", two["outcome"]
        assert two["sessionLabel"] == "new session forked from the source session"
        assert two["providerSessionId"] not in (None, one["providerSessionId"])
        assert two["contextReceipt"] is None  # nothing was copied: the history is native
        assert two["costUsd"] == one["costUsd"] is not None  # the fork's own, not the parent's
        assert not [e for e in app.state.edges.values() if e.kind == "handed_off"]
        assert await trio.Path(one["tracePath"]).read_bytes() == native  # source unchanged
        assert _conversation(stub.model_requests("anthropic")[-1].body) == [
            ("user", "remember heliotrope"),
            ("assistant", "first answer"),
            ("user", "fork?"),
        ]

        again = await call(app, "submit_turn", {"branchId": main, "text": "and the main?"})
        three = await call(app, "wait_run", {"runId": again["runId"], "timeoutS": 60})
        assert three["state"] == "succeeded", three["outcome"]
        assert three["sessionLabel"] == "resumed session"
        assert three["providerSessionId"] == one["providerSessionId"]

        # The main session has moved on: a branch at turn 1's reply can't be proven a
        # fork of it any more, so it gets the history copied.
        late = await call(
            app, "branch", {"branchId": main, "throughMessageId": one["assistantMessageId"]}
        )
        sent = await call(app, "submit_turn", {"branchId": late["branchId"], "text": "late?"})
        four = await call(app, "wait_run", {"runId": sent["runId"], "timeoutS": 60})
        assert four["state"] == "succeeded", four["outcome"]
        assert four["sessionLabel"] == "new session with copied context"
        await app.shutdown(drain=True)
        nursery.cancel_scope.cancel()


async def test_branch_on_codex_gets_copied_context_not_a_fork(tmp_path: Path) -> None:
    """Codex claims no native fork: a branch at the session boundary is handed the history."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    home = tmp_path / "home"
    script = parse_script({"openai": [{"text": "first answer"}, {"text": "branch answer"}]})
    async with open_model_stub(script) as stub, trio.open_nursery() as nursery:
        app = await braid_with(nursery, home, codex_provider(tmp_path, stub))
        conv = await call(
            app, "create_conversation", {"workspace": str(workspace), "runner": "codex"}
        )
        first = await call(
            app, "submit_turn", {"branchId": conv["branchId"], "text": "remember heliotrope"}
        )
        one = await call(app, "wait_run", {"runId": first["runId"], "timeoutS": 60})
        assert one["state"] == "succeeded", one["outcome"]
        other = await call(
            app,
            "branch",
            {"branchId": conv["branchId"], "throughMessageId": one["assistantMessageId"]},
        )
        sent = await call(app, "submit_turn", {"branchId": other["branchId"], "text": "branch?"})
        two = await call(app, "wait_run", {"runId": sent["runId"], "timeoutS": 60})
        assert two["state"] == "succeeded", two["outcome"]
        assert two["sessionLabel"] == "new session with copied context"
        assert two["providerSessionId"] != one["providerSessionId"]
        await app.shutdown(drain=True)
        nursery.cancel_scope.cancel()
