"""Codex through Braid end to end: the real CLI against the scripted Responses API.

Turn 2 continues the thread only because the rollout's last item proves the boundary; the
harness is handed the new input alone and the model server sees turn 1's prompt once.
Codex reports tokens but no cost, so the run's cost stays null (unknown), never 0.
"""

from __future__ import annotations

import json
from pathlib import Path

import trio

from braid_actors.app import call
from tests.supervisor._cli import braid_with, codex_provider
from tools.model_stub import open_model_stub, parse_script


async def test_two_codex_turns_continue_the_thread_with_only_the_new_input(
    tmp_path: Path,
) -> None:
    """Turn 2 resumes the proven thread; usage is reported, cost is honestly null."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    home = tmp_path / "home"
    script = parse_script({"openai": [{"text": "first answer"}, {"text": "second answer"}]})
    async with open_model_stub(script) as stub, trio.open_nursery() as nursery:
        app = await braid_with(nursery, home, codex_provider(tmp_path, stub))
        conv = await call(
            app, "create_conversation", {"workspace": str(workspace), "runner": "codex"}
        )
        first = await call(
            app,
            "submit_turn",
            {"branchId": conv["branchId"], "text": "remember the word heliotrope"},
        )
        one = await call(app, "wait_run", {"runId": first["runId"], "timeoutS": 60})
        assert one["state"] == "succeeded", one["outcome"]
        assert one["sessionLabel"] == "new session"
        assert one["usage"]["source"] == "provider"
        assert one["usage"]["inputTokens"] is not None
        assert one["costUsd"] is None
        second = await call(
            app, "submit_turn", {"branchId": conv["branchId"], "text": "what was the word?"}
        )
        two = await call(app, "wait_run", {"runId": second["runId"], "timeoutS": 60})
        assert two["state"] == "succeeded", two["outcome"]
        assert two["sessionLabel"] == "resumed session"
        assert two["providerSessionId"] == one["providerSessionId"]
        model_calls = [r for r in stub.requests if r.path.startswith("/v1/responses")]
        assert len(model_calls) == 2
        assert all(not r.proxied for r in stub.requests)
        turn2 = json.dumps(model_calls[1].body["input"])
        assert turn2.count("remember the word heliotrope") == 1
        assert turn2.count("what was the word?") == 1
        await app.shutdown(drain=True)
        nursery.cancel_scope.cancel()


async def test_lost_codex_rollout_hands_off_with_copied_context(tmp_path: Path) -> None:
    """CF-10 on Codex: the rollout is gone, so turn 2 starts a new thread seeded with the
    typed history, with a handed_off edge and the honest label — never 'resumed'."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    home = tmp_path / "home"
    script = parse_script({"openai": [{"text": "first answer"}, {"text": "second answer"}]})
    async with open_model_stub(script) as stub, trio.open_nursery() as nursery:
        app = await braid_with(nursery, home, codex_provider(tmp_path, stub))
        conv = await call(
            app, "create_conversation", {"workspace": str(workspace), "runner": "codex"}
        )
        first = await call(
            app,
            "submit_turn",
            {"branchId": conv["branchId"], "text": "remember the word heliotrope"},
        )
        one = await call(app, "wait_run", {"runId": first["runId"], "timeoutS": 60})
        assert one["state"] == "succeeded", one["outcome"]
        await trio.Path(one["tracePath"]).unlink()  # the native thread is lost
        second = await call(
            app, "submit_turn", {"branchId": conv["branchId"], "text": "what was the word?"}
        )
        two = await call(app, "wait_run", {"runId": second["runId"], "timeoutS": 60})
        assert two["state"] == "succeeded", two["outcome"]
        assert two["sessionLabel"] == "new session with copied context"
        assert two["providerSessionId"] != one["providerSessionId"]
        edges = [e for e in app.state.edges.values() if e.kind == "handed_off"]
        assert [(e.source_id, e.destination_id) for e in edges] == [
            (first["runId"], second["runId"])
        ]
        model_calls = [r for r in stub.requests if r.path.startswith("/v1/responses")]
        items = model_calls[1].body["input"]
        copied = [
            i
            for i in items
            if i.get("type") == "message"
            and i.get("role") in ("user", "assistant")
            and "environment_context" not in json.dumps(i)
        ]
        roles = [i["role"] for i in copied]
        assert roles[:2] == ["user", "assistant"]  # typed history, not a flattened prompt
        text = json.dumps(items)
        assert text.count("remember the word heliotrope") == 1
        assert text.count("first answer") == 1
        assert text.count("what was the word?") == 1
        await app.shutdown(drain=True)
        nursery.cancel_scope.cancel()
