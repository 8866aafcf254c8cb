"""The claude_code provider driving the real Claude Code CLI against the scripted model stub.

Each test gets a private HOME and workspace under ``tmp_path``; the provider builds the
CLI's environment from scratch, and the proxy variables point at the stub so any request
for another host would be recorded (each test asserts there was none).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import attrs
import trio

from braid_actors.model import (
    ErrorPart,
    Part,
    ReasoningPart,
    TextPart,
    ToolRequestPart,
    ToolResultPart,
    Usage,
)
from braid_actors.providers import (
    ClaudeCodeProvider,
    ClaudeTimeouts,
    InteractionAnswer,
    InteractionRequest,
    Provider,
    RunControl,
    SessionInfo,
    SessionRequest,
    TurnRequest,
    TurnResult,
    WorkerInfo,
)
from braid_actors.providers._claude_stream import CostBase, turn_cost
from braid_actors.workers import ProcessInfo, process_gone
from tests.providers._context import portable_context, read_jsonl
from tools.model_stub import ModelStub, open_model_stub, parse_script
from tools.model_stub.harness import claude_bin

MODEL = "claude-sonnet-4-5"
TEST_TIMEOUT = 90.0
"""Seconds a whole test may take (every CLI run inside takes a few)."""


@attrs.define(eq=False)
class RecordingSink:
    """A RunSink that records every call and answers permissions from a script."""

    answers: list[InteractionAnswer] = attrs.Factory(list)
    calls: list[str] = attrs.Factory(list)
    workers: list[WorkerInfo] = attrs.Factory(list)
    sessions: list[SessionInfo] = attrs.Factory(list)
    parts: list[Part] = attrs.Factory(list)
    interactions: list[InteractionRequest] = attrs.Factory(list)
    usages: list[tuple[Usage, float | None]] = attrs.Factory(list)
    session_seen: trio.Event = attrs.Factory(trio.Event)

    async def worker_started(self, worker: WorkerInfo) -> None:
        self.calls.append("worker_started")
        self.workers.append(worker)

    async def session(self, info: SessionInfo) -> None:
        self.calls.append("session")
        self.sessions.append(info)
        self.session_seen.set()

    async def part(self, part: Part) -> None:
        self.calls.append("part")
        self.parts.append(part)

    async def interaction(self, request: InteractionRequest) -> InteractionAnswer:
        self.calls.append("interaction")
        self.interactions.append(request)
        return self.answers.pop(0)

    async def usage(self, usage: Usage, cost_usd: float | None) -> None:
        self.calls.append("usage")
        self.usages.append((usage, cost_usd))

    def final_parts(self) -> list[Part]:
        """The last version of each part, in the order parts first appeared."""
        latest: dict[str, Part] = {}
        for part in self.parts:
            latest[part.part_id] = part
        return list(latest.values())


def provider(tmp_path: Path, stub: ModelStub, **env: str) -> ClaudeCodeProvider:
    return ClaudeCodeProvider(
        bin=str(claude_bin()),
        home=tmp_path / "home",
        base_url=stub.url,
        env={
            "ANTHROPIC_API_KEY": "sk-ant-stub",
            "HTTP_PROXY": stub.url,
            "HTTPS_PROXY": stub.url,
            "http_proxy": stub.url,
            "https_proxy": stub.url,
            "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost",
            **env,
        },
        model=MODEL,
        timeouts=ClaudeTimeouts(startup=30, idle=30, cancel_grace=5, exit_grace=5),
    )


def request(
    tmp_path: Path, text: str, session: SessionRequest | None = None, **options: Any
) -> TurnRequest:
    workspace = tmp_path / "workspace"
    workspace.mkdir(exist_ok=True)
    return TurnRequest(
        run_id="run_1",
        turn_id="turn_1",
        workspace=workspace,
        user_message_id="msg_user",
        assistant_message_id="msg_assistant",
        text=text,
        session=session or SessionRequest(),
        options=options,
    )


async def run(
    adapter: Provider, turn: TurnRequest, sink: RecordingSink, control: RunControl | None = None
) -> TurnResult:
    with trio.fail_after(TEST_TIMEOUT):
        result = await adapter.run_turn(turn, sink, control)
    for worker in sink.workers:  # nothing left behind
        info = ProcessInfo(worker.pid, worker.create_time, worker.pgid, worker.command)
        assert process_gone(info)
        try:
            os.killpg(worker.pgid, 0)
        except ProcessLookupError:
            pass
        else:
            raise AssertionError(f"process group {worker.pgid} still has members")
    return result


def assert_offline(stub: ModelStub) -> None:
    proxied = [f"{r.method} {r.path}" for r in stub.requests if r.proxied]
    assert not proxied, f"the CLI tried to reach other hosts: {proxied}"


def conversation(body: dict[str, Any]) -> list[tuple[str, str]]:
    """An Anthropic request's messages as ``(role, text)``, without system reminders."""
    out = []
    for message in body["messages"]:
        content = message["content"]
        parts = [content] if isinstance(content, str) else [p.get("text", "") for p in content]
        text = "".join(p for p in parts if not p.lstrip().startswith("<system-reminder>"))
        out.append((message["role"], text))
    return out


def tool_results(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        block
        for message in body["messages"]
        if isinstance(message["content"], list)
        for block in message["content"]
        if block.get("type") == "tool_result"
    ]


async def test_a_text_turn_reports_parts_session_usage_and_cost(tmp_path: Path) -> None:
    usage = {"input_tokens": 120, "output_tokens": 30, "cache_read_input_tokens": 7}
    steps = {
        "anthropic": [{"thinking": "Consider.", "text": "Hello from the stub.", "usage": usage}]
    }
    async with open_model_stub(parse_script(steps)) as stub:
        adapter = provider(tmp_path, stub)
        assert adapter.available()
        assert adapter.capabilities.usage == "reported"
        assert adapter.capabilities.cost
        sink = RecordingSink()
        result = await run(adapter, request(tmp_path, "Say hello."), sink)
    assert_offline(stub)
    assert result.outcome == "completed", result.reason
    assert sink.calls[:2] == ["worker_started", "session"]
    assert sink.calls[-1] == "usage"
    [session] = sink.sessions
    assert not session.resumed
    assert result.session_id == session.session_id
    assert session.trace_path is not None
    trace = tmp_path / "home" / ".claude" / "projects"
    assert [str(p) for p in trace.glob(f"*/{session.session_id}.jsonl")] == [session.trace_path]
    final = sink.final_parts()
    assert final == [
        ReasoningPart(part_id="msg_stub000001:0", text="Consider."),
        TextPart(part_id="msg_stub000001:1", text="Hello from the stub."),
    ]
    # Text streamed in deltas: earlier versions share the final part's id.
    texts = [p for p in sink.parts if isinstance(p, TextPart)]
    assert len(texts) > 1
    assert {p.part_id for p in texts} == {"msg_stub000001:1"}
    [(reported, cost)] = sink.usages
    assert (reported.input_tokens, reported.output_tokens) == (120, 30)
    assert reported.cache_read_tokens == 7
    assert reported.source == "provider"
    assert cost is not None
    assert cost > 0
    assert (result.usage, result.cost_usd) == (reported, cost)
    proof = await adapter.prove_session(session.session_id)
    assert proof.available
    assert proof.last_message_id == result.session_boundary is not None


def bash_steps(command: str) -> dict[str, Any]:
    call = {"name": "Bash", "input": {"command": command, "description": "marker"}}
    return {"anthropic": [{"tool_use": call}, {"text": "All done."}]}


async def test_a_permission_answered_allow_runs_the_tool(tmp_path: Path) -> None:
    async with open_model_stub(parse_script(bash_steps("touch braid-marker"))) as stub:
        adapter = provider(tmp_path, stub)
        sink = RecordingSink(answers=[InteractionAnswer(allow=True)])
        turn = request(tmp_path, "Make the marker.")
        result = await run(adapter, turn, sink)
    assert_offline(stub)
    assert result.outcome == "completed", result.reason
    [asked] = sink.interactions
    assert asked.kind == "permission"
    assert asked.subject["tool"] == "Bash"
    assert asked.subject["command"] == "touch braid-marker"
    assert (turn.workspace / "braid-marker").exists()
    parts = sink.final_parts()
    [tool] = [p for p in parts if isinstance(p, ToolRequestPart)]
    assert tool.part_id == "msg_stub000001:0"
    assert tool.input == {"command": "touch braid-marker", "description": "marker"}
    [outcome] = [p for p in parts if isinstance(p, ToolResultPart)]
    assert (outcome.request_part_id, outcome.status) == (tool.part_id, "ok")
    assert isinstance(parts[-1], TextPart)
    assert parts[-1].text == "All done."
    first, second = stub.model_requests("anthropic")
    assert not tool_results(first.body)
    [sent] = tool_results(second.body)
    assert sent["tool_use_id"] == tool.call_id
    assert not sent.get("is_error")


async def test_a_permission_answered_deny_runs_nothing(tmp_path: Path) -> None:
    async with open_model_stub(parse_script(bash_steps("touch braid-marker"))) as stub:
        adapter = provider(tmp_path, stub)
        sink = RecordingSink(answers=[InteractionAnswer(allow=False, message="Not today.")])
        turn = request(tmp_path, "Make the marker.")
        result = await run(adapter, turn, sink)
    assert_offline(stub)
    assert result.outcome == "completed", result.reason
    assert len(sink.interactions) == 1
    assert not (turn.workspace / "braid-marker").exists()
    [outcome] = [p for p in sink.final_parts() if isinstance(p, ToolResultPart)]
    assert outcome.status == "denied"
    assert "Not today." in outcome.summary
    _, second = stub.model_requests("anthropic")
    [sent] = tool_results(second.body)
    assert sent["is_error"] is True
    assert "Not today." in str(sent["content"])


async def test_resume_continues_the_session_and_sends_only_the_new_input(
    tmp_path: Path,
) -> None:
    steps = [{"text": "first answer"}, {"text": "second answer"}, {"text": "third answer"}]
    async with open_model_stub(parse_script({"anthropic": steps})) as stub:
        adapter = provider(tmp_path, stub)
        first = await run(adapter, request(tmp_path, "one"), RecordingSink())
        assert first.outcome == "completed", first.reason
        assert first.session_id is not None
        assert first.session_boundary is not None
        proof = await adapter.prove_session(first.session_id)
        assert proof.last_message_id == first.session_boundary

        stale = SessionRequest(first.session_id, expected_boundary="not-the-end")
        refused = await run(adapter, request(tmp_path, "never sent", stale), RecordingSink())
        assert refused.outcome == "failed"
        assert refused.reason is not None
        assert refused.reason.startswith("session_mismatch")

        again = SessionRequest(first.session_id, expected_boundary=first.session_boundary)
        sink = RecordingSink()
        second = await run(adapter, request(tmp_path, "two", again), sink)
        assert second.outcome == "completed", second.reason
        assert sink.sessions == [
            SessionInfo(first.session_id, resumed=True, trace_path=sink.sessions[0].trace_path)
        ]
        assert second.session_id == first.session_id
        assert second.session_boundary not in (None, first.session_boundary)

        fork = SessionRequest(
            first.session_id, expected_boundary=second.session_boundary, fork=True
        )
        fork_sink = RecordingSink()
        forked = await run(adapter, request(tmp_path, "three", fork), fork_sink)
        assert forked.outcome == "completed", forked.reason
        [fork_session] = fork_sink.sessions
        assert not fork_session.resumed
        assert fork_session.session_id not in (None, first.session_id)
    assert_offline(stub)
    bodies = [r.body for r in stub.model_requests("anthropic")]
    assert [conversation(b) for b in bodies] == [
        [("user", "one")],
        [("user", "one"), ("assistant", "first answer"), ("user", "two")],
        [
            ("user", "one"),
            ("assistant", "first answer"),
            ("user", "two"),
            ("assistant", "second answer"),
            ("user", "three"),
        ],
    ]


async def test_prove_session_without_a_transcript_is_unverified(tmp_path: Path) -> None:
    async with open_model_stub(parse_script({"anthropic": []})) as stub:
        adapter = provider(tmp_path, stub)
        missing = await adapter.prove_session("00000000-0000-4000-8000-000000000000")
        assert (missing.available, missing.last_message_id) == (False, None)
        bogus = await adapter.prove_session("../../etc/passwd")
        assert not bogus.available
        unverified = SessionRequest(
            "00000000-0000-4000-8000-000000000000", expected_boundary="anything"
        )
        sink = RecordingSink()
        result = await run(adapter, request(tmp_path, "hi", unverified), sink)
    assert result.outcome == "failed"
    assert result.reason is not None
    assert result.reason.startswith("session_unverified")
    assert not sink.calls
    assert not stub.requests


async def test_portable_context_seeds_a_new_native_session(tmp_path: Path) -> None:
    steps = {"anthropic": [{"text": "copied answer"}, {"text": "next answer"}]}
    async with open_model_stub(parse_script(steps)) as stub:
        adapter = provider(tmp_path, stub)
        assert adapter.capabilities.portable_context
        turn = attrs.evolve(request(tmp_path, "Now summarize."), context=portable_context("m3"))
        sink = RecordingSink()
        result = await run(adapter, turn, sink)
        assert result.outcome == "completed", result.reason
        [session] = sink.sessions
        assert not session.resumed  # a new session with copied context
        receipt = session.receipt
        assert receipt is not None
        assert receipt.source_digest == portable_context("m3").digest
        assert receipt.included_message_ids == ("m1", "m2", "m3")
        assert [(o.message_id, o.part_id, o.kind) for o in receipt.omitted_parts] == [
            ("m2", "p2", "reasoning"),
            ("m4", "p10", "text"),
        ]
        assert [(t.message_id, t.part_id, t.kind) for t in receipt.transformed_parts] == [
            ("m2", "p4", "tool_request"),
            ("m2", "p5", "tool_result"),
            ("m3", "p8", "tool_request"),
            ("m3", "p9", "tool_result"),
        ]
        assert "truncated" in receipt.transformed_parts[-1].how
        assert receipt.destination_runner == "claude_code"
        assert receipt.destination_session_id == session.session_id
        assert result.session_id == session.session_id
        assert session.trace_path is not None
        trace = tmp_path / "home" / ".claude" / "projects"
        assert [str(p) for p in trace.glob(f"*/{session.session_id}.jsonl")] == [session.trace_path]
        records = read_jsonl(session.trace_path)
        seeded = [r for r in records if "braidMessageId" in r]
        # The transcript Braid wrote ends with the last copied assistant message (the CLI
        # answers a trailing user record with a made-up reply); m3 leads the new input.
        assert [(r["type"], r["braidMessageId"]) for r in seeded] == [
            ("user", "m1"),
            ("assistant", "m2"),
        ]
        assert records[: len(seeded)] == seeded
        assert [r["parentUuid"] for r in seeded] == [None, seeded[0]["uuid"]]
        assert {r["sessionId"] for r in seeded} == {session.session_id}
        assert [p for p in sink.final_parts() if isinstance(p, TextPart)][-1].text == (
            "copied answer"
        )
        proof = await adapter.prove_session(session.session_id)
        assert proof.available
        assert proof.last_message_id == result.session_boundary is not None
        assert result.session_boundary not in {r["uuid"] for r in seeded}

        # The seeded session continues like any native one.
        again = SessionRequest(session.session_id, expected_boundary=result.session_boundary)
        resumed = await run(adapter, request(tmp_path, "One more.", again), RecordingSink())
        assert resumed.outcome == "completed", resumed.reason
    assert_offline(stub)
    first, second = (r.body for r in stub.model_requests("anthropic"))
    copied = [
        ("user", "What is in the folder?"),
        (
            "assistant",
            'Let me look.[tool shell] {"cmd": "ls"}[result ok exit=0] notes.txtIt holds notes.txt.',
        ),
    ]
    [*history, (last_role, last_text)] = conversation(first)
    assert history == copied
    assert last_role == "user"
    # The third context message and the new input arrive as one user message (the API
    # merges consecutive user content), as separate typed blocks, the new input last.
    assert last_text.startswith(
        'And the size?[tool shell] {"cmd": "wc -c notes.txt"}[result error]'
    )
    assert last_text.endswith("Now summarize.")
    assert "(truncated)" in last_text
    assert len(last_text) < 4200
    blob = json.dumps(first)
    assert blob.count("What is in the folder?") == 1  # exactly once
    assert blob.count("It holds notes.txt.") == 1
    for absent in ("private source reasoning", "profile instructions", "call_source_1", "call_2"):
        assert absent not in blob
    assert not tool_results(first)
    texts = [b.get("text", "") for b in first["messages"][-1]["content"]]
    texts = [t for t in texts if not t.lstrip().startswith("<system-reminder>")]
    assert texts[:3] == [
        "And the size?",
        '[tool shell] {"cmd": "wc -c notes.txt"}',
        texts[2],
    ]
    assert texts[2].startswith("[result error] xxx")
    assert texts[-1] == "Now summarize."
    assert [m["role"] for m in first["messages"]] == ["user", "assistant", "user"]
    assert [b["text"] for b in first["messages"][1]["content"]] == [
        "Let me look.",
        '[tool shell] {"cmd": "ls"}',
        "[result ok exit=0] notes.txt",
        "It holds notes.txt.",
    ]
    assert "No response requested." not in blob
    assert conversation(second)[: len(copied)] == copied
    assert conversation(second)[-1] == ("user", "One more.")


async def test_a_model_error_fails_the_turn_with_the_message(tmp_path: Path) -> None:
    failure = {"error": {"status": 500, "message": "scripted failure"}}
    async with open_model_stub(parse_script({"fallback": failure})) as stub:
        adapter = provider(tmp_path, stub, CLAUDE_CODE_MAX_RETRIES="0")
        sink = RecordingSink()
        result = await run(adapter, request(tmp_path, "hi"), sink)
    assert_offline(stub)
    assert result.outcome == "failed"
    assert result.reason is not None
    assert "scripted failure" in result.reason
    assert "500" in result.reason
    assert [r.status for r in stub.requests] == [500]
    errors = [p for p in sink.final_parts() if isinstance(p, ErrorPart)]
    assert errors
    assert "scripted failure" in errors[0].message
    assert len(sink.usages) == 1


async def test_cancel_mid_stream_interrupts_the_cli(tmp_path: Path) -> None:
    steps = {"anthropic": [{"text": "too late", "delay": 20}]}
    async with open_model_stub(parse_script(steps)) as stub:
        adapter = provider(tmp_path, stub)
        sink = RecordingSink()
        control = RunControl()
        results: list[TurnResult] = []

        async def turn() -> None:
            results.append(await run(adapter, request(tmp_path, "Be slow."), sink, control))

        start = trio.current_time()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(turn)
            with trio.fail_after(30):
                await sink.session_seen.wait()
                for _ in range(600):  # the model request is in flight (its answer waits)
                    if stub.model_requests("anthropic"):
                        break
                    await trio.sleep(0.05)
            control.request_cancel("user asked")
    elapsed = trio.current_time() - start
    [result] = results
    assert elapsed < 15
    if result.cancel_acknowledged:
        assert (result.outcome, result.reason) == ("cancelled", "user asked")
    else:
        assert result.cancel_acknowledged is False
        assert result.outcome == "failed"
    assert not [p for p in sink.parts if isinstance(p, TextPart) and p.text == "too late"]


FAKE_SESSION = "11111111-2222-4333-8444-555555555555"
FAKE_CLI = f"""\
import json, sys, time
sys.stdin.readline()
init = {{"type": "system", "subtype": "init", "session_id": "{FAKE_SESSION}"}}
print(json.dumps(init), flush=True)
time.sleep(60)
"""
"""A CLI that names its session and then neither answers nor prints anything."""


def silent_cli(tmp_path: Path, **timeouts: float) -> ClaudeCodeProvider:
    script = tmp_path / "fake_claude"
    script.write_text(f"#!{sys.executable}\n{FAKE_CLI}")
    script.chmod(0o755)
    return ClaudeCodeProvider(
        bin=str(script),
        home=tmp_path / "home",
        base_url=None,
        timeouts=ClaudeTimeouts(startup=10, term_grace=2, kill_grace=2, **timeouts),
    )


async def test_an_unanswered_cancel_is_unacknowledged_and_the_cli_stopped(
    tmp_path: Path,
) -> None:
    adapter = silent_cli(tmp_path, idle=30, cancel_grace=0.5)
    sink = RecordingSink()
    control = RunControl()
    results: list[TurnResult] = []

    async def turn() -> None:
        results.append(await run(adapter, request(tmp_path, "hi"), sink, control))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(turn)
        with trio.fail_after(15):
            await sink.session_seen.wait()
        control.request_cancel("user asked")
    [result] = results
    assert result.outcome == "failed"
    assert result.cancel_acknowledged is False
    assert result.reason is not None
    assert result.reason.startswith("cancel_unacknowledged")


async def test_a_silent_cli_fails_at_the_idle_deadline(tmp_path: Path) -> None:
    adapter = silent_cli(tmp_path, idle=0.5)
    sink = RecordingSink()
    result = await run(adapter, request(tmp_path, "hi"), sink)
    assert result.outcome == "failed"
    assert result.reason is not None
    assert result.reason.startswith("worker_unresponsive")
    assert result.session_id == FAKE_SESSION


def test_turn_cost_is_the_turn_share_of_the_running_total_only_when_provable() -> None:
    """Claude Code's total carries a resumed session's earlier cost on; the turn's cost is
    the difference, and only when the running token counts account for this turn alone."""
    usage = Usage(input_tokens=10, output_tokens=5, source="provider")
    models = {"claude-sonnet-4-5": {"inputTokens": 20, "outputTokens": 10}}
    base = CostBase(cost_usd=0.000105, input_tokens=10, output_tokens=5)
    assert turn_cost(0.00021, models, usage, base) == 0.000105
    fresh = {"claude-sonnet-4-5": {"inputTokens": 10, "outputTokens": 5}}
    assert turn_cost(0.000105, fresh, usage, None) == 0.000105  # exactly as reported
    assert turn_cost(0.00021, models, usage, None) is None  # counts more than this turn
    side = {**models, "claude-haiku": {"inputTokens": 3, "outputTokens": 1}}
    assert turn_cost(0.00022, side, usage, base) is None  # a side request in the total
    assert turn_cost(None, models, usage, base) is None
    assert turn_cost(0.0001, models, usage, base) is None  # below the base: not provable
