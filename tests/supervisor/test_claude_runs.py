"""Claude Code through Braid end to end: the real CLI, the scripted model on loopback.

Two turns on one branch: the first is a new session; the second continues it only because
the session file's last message proves the boundary, so the harness is handed just the
new input and the model server sees turn 1 exactly once. Usage and cost are as the CLI
reported them, and the run's transcript is ingested as evidence.
"""

from __future__ import annotations

import json
from pathlib import Path

import trio

from braid_actors.app import BraidApp, call
from tests.supervisor._cli import braid_with, claude_provider
from tools.model_stub import open_model_stub, parse_script

MODEL = "claude-sonnet-4-5"


async def _wait_blocked(app: BraidApp, run_id: str) -> dict[str, object]:
    with trio.fail_after(60):
        while app.run(run_id).state != "blocked":
            await app.changed()
    pending = [i for i in app.run(run_id).interactions if i.state == "pending"]
    return {"interactionId": pending[0].interaction_id, "subject": dict(pending[0].subject)}


async def test_two_turns_continue_the_native_session_with_only_the_new_input(
    tmp_path: Path,
) -> None:
    """Turn 2 resumes the proven session: the model sees turn 1 once plus the new input."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    home = tmp_path / "home"
    script = parse_script({"anthropic": [{"text": "first answer"}, {"text": "second answer"}]})
    async with open_model_stub(script) as stub, trio.open_nursery() as nursery:
        app = await braid_with(nursery, home, claude_provider(tmp_path, stub))
        conv = await call(
            app, "create_conversation", {"workspace": str(workspace), "runner": "claude_code"}
        )
        first = await call(
            app,
            "submit_turn",
            {"branchId": conv["branchId"], "text": "remember the word heliotrope"},
        )
        one = await call(app, "wait_run", {"runId": first["runId"], "timeoutS": 60})
        assert one["state"] == "succeeded", one["outcome"]
        assert one["runner"] == "claude_code"
        assert one["sessionLabel"] == "new session"
        assert one["usage"]["source"] == "provider"
        assert one["usage"]["inputTokens"] is not None
        assert one["costUsd"] is not None  # as the CLI reported it
        assert one["traceRef"] == first["runId"]
        assert await trio.Path(one["tracePath"]).is_file()
        reply = app.state.messages[one["assistantMessageId"]]
        assert "first answer" in "".join(p.text for p in reply.parts if p.kind == "text")

        second = await call(
            app, "submit_turn", {"branchId": conv["branchId"], "text": "what was the word?"}
        )
        two = await call(app, "wait_run", {"runId": second["runId"], "timeoutS": 60})
        assert two["state"] == "succeeded", two["outcome"]
        assert two["sessionLabel"] == "resumed session"
        # Same tokens, same price: the resumed turn's cost is its own, not the CLI's
        # running session total (which carries turn 1 on).
        assert two["costUsd"] == one["costUsd"] is not None
        assert two["providerSessionId"] == one["providerSessionId"]

        model_calls = [r for r in stub.requests if r.path.startswith("/v1/messages")]
        assert len(model_calls) == 2
        assert all(not r.proxied for r in stub.requests)
        turn2 = json.dumps(model_calls[1].body["messages"])
        assert turn2.count("remember the word heliotrope") == 1
        assert turn2.count("what was the word?") == 1
        await app.shutdown(drain=True)
        nursery.cancel_scope.cancel()


async def test_missing_session_file_hands_off_with_copied_context(tmp_path: Path) -> None:
    """CF-10: the native session file is gone, so turn 2 is a new session with copied
    context (typed history, a handed_off edge, the honest label), never 'resumed'."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    home = tmp_path / "home"
    script = parse_script({"anthropic": [{"text": "first answer"}, {"text": "second answer"}]})
    async with open_model_stub(script) as stub, trio.open_nursery() as nursery:
        app = await braid_with(nursery, home, claude_provider(tmp_path, stub))
        conv = await call(
            app, "create_conversation", {"workspace": str(workspace), "runner": "claude_code"}
        )
        first = await call(
            app,
            "submit_turn",
            {"branchId": conv["branchId"], "text": "remember the word heliotrope"},
        )
        one = await call(app, "wait_run", {"runId": first["runId"], "timeoutS": 60})
        assert one["state"] == "succeeded", one["outcome"]
        await trio.Path(one["tracePath"]).unlink()  # the native session is lost

        second = await call(
            app, "submit_turn", {"branchId": conv["branchId"], "text": "what was the word?"}
        )
        two = await call(app, "wait_run", {"runId": second["runId"], "timeoutS": 60})
        assert two["state"] == "succeeded", two["outcome"]
        assert two["sessionMode"] == "handed_off"
        assert two["sessionLabel"] == "new session with copied context"
        assert two["providerSessionId"] != one["providerSessionId"]
        edges = [e for e in app.state.edges.values() if e.kind == "handed_off"]
        assert [(e.source_id, e.destination_id) for e in edges] == [
            (first["runId"], second["runId"])
        ]
        model_calls = [r for r in stub.requests if r.path.startswith("/v1/messages")]
        messages = model_calls[1].body["messages"]
        roles = [m["role"] for m in messages]
        assert roles[:2] == ["user", "assistant"]  # typed history, not one flattened prompt
        text = json.dumps(messages)
        assert text.count("remember the word heliotrope") == 1
        assert text.count("first answer") == 1
        assert text.count("what was the word?") == 1
        await app.shutdown(drain=True)
        nursery.cancel_scope.cancel()


async def test_permission_answers_through_respond_interaction(tmp_path: Path) -> None:
    """Claude Code's permission request is a Braid interaction: allow runs the tool, deny
    does not, and the run's parts show which."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    home = tmp_path / "home"
    bash = {"name": "Bash", "input": {"command": "touch braid-marker", "description": "m"}}
    script = parse_script(
        {
            "anthropic": [
                {"tool_use": bash},
                {"text": "done"},
                {"tool_use": bash},
                {"text": "not done"},
            ]
        }
    )
    async with open_model_stub(script) as stub, trio.open_nursery() as nursery:
        app = await braid_with(nursery, home, claude_provider(tmp_path, stub))
        results = {}
        for allow in (False, True):
            conv = await call(
                app, "create_conversation", {"workspace": str(workspace), "runner": "claude_code"}
            )
            sent = await call(
                app, "submit_turn", {"branchId": conv["branchId"], "text": "make the marker"}
            )
            asked = await _wait_blocked(app, sent["runId"])
            assert asked["subject"]["command"] == "touch braid-marker"  # type: ignore[index]
            assert not await trio.Path(workspace / "braid-marker").exists()
            await call(
                app,
                "respond_interaction",
                {
                    "runId": sent["runId"],
                    "interactionId": asked["interactionId"],
                    "answer": {"allow": allow, "message": None if allow else "not now"},
                },
            )
            record = await call(app, "wait_run", {"runId": sent["runId"], "timeoutS": 60})
            assert record["state"] == "succeeded", record["outcome"]
            reply = app.state.messages[record["assistantMessageId"]]
            results[allow] = [p.status for p in reply.parts if p.kind == "tool_result"]
            assert await trio.Path(workspace / "braid-marker").exists() is allow
        assert results == {False: ["denied"], True: ["ok"]}
        await app.shutdown(drain=True)
        nursery.cancel_scope.cancel()


async def test_cost_limit_uses_the_cost_the_runner_reported(tmp_path: Path) -> None:
    """A cost limit is checked against Claude Code's reported total_cost_usd."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    home = tmp_path / "home"
    script = parse_script({"anthropic": [{"text": "an answer"}]})
    async with open_model_stub(script) as stub, trio.open_nursery() as nursery:
        app = await braid_with(nursery, home, claude_provider(tmp_path, stub))
        conv = await call(
            app, "create_conversation", {"workspace": str(workspace), "runner": "claude_code"}
        )
        await call(
            app, "set_run_override", {"branchId": conv["branchId"], "limits": {"costUsd": 0.00001}}
        )
        sent = await call(app, "submit_turn", {"branchId": conv["branchId"], "text": "hi"})
        record = await call(app, "wait_run", {"runId": sent["runId"], "timeoutS": 60})
        outcome = record["outcome"]
        assert record["state"] == "failed"
        assert outcome["kind"] == "spend_limit_exceeded"
        assert outcome["dimension"] == "cost_usd"
        assert outcome["measured"] == record["costUsd"]
        assert outcome["measured"] > outcome["limit"]
        await app.shutdown(drain=True)
        nursery.cancel_scope.cancel()
