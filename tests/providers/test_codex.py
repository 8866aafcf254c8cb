"""The codex provider driving the real Codex CLI against the scripted model stub.

Each test gets a private HOME and workspace under ``tmp_path``; the provider writes its own
``config.toml`` and builds the CLI's environment from scratch, and the proxy variables point
at the stub so any request for another host would be recorded (each test asserts none).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import attrs
import psutil
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
    CodexProvider,
    CodexTimeouts,
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
from braid_actors.workers import ProcessInfo, process_gone
from tests.providers._context import portable_context, read_jsonl
from tools.model_stub import ModelStub, open_model_stub, parse_script
from tools.model_stub.harness import codex_bin

MODEL = "gpt-5.5"
TEST_TIMEOUT = 90.0
"""Seconds a whole turn may take (every CLI run takes about one)."""
MARKER = "braid-tool-ok"


@attrs.define(eq=False)
class RecordingSink:
    """A RunSink that records every call (Codex asks no interactions)."""

    calls: list[str] = attrs.Factory(list)
    workers: list[WorkerInfo] = attrs.Factory(list)
    sessions: list[SessionInfo] = attrs.Factory(list)
    parts: list[Part] = attrs.Factory(list)
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
        raise AssertionError(f"Codex exec asked for an interaction: {request}")

    async def usage(self, usage: Usage, cost_usd: float | None) -> None:
        self.calls.append("usage")
        self.usages.append((usage, cost_usd))

    def final_parts(self) -> list[Part]:
        """The last version of each part, in the order parts first appeared."""
        latest: dict[str, Part] = {}
        for part in self.parts:
            latest[part.part_id] = part
        return list(latest.values())


def provider(tmp_path: Path, stub: ModelStub) -> CodexProvider:
    return CodexProvider(
        bin=str(codex_bin()),
        home=tmp_path / "home",
        base_url=stub.openai_base_url,
        env={
            "BRAID_CODEX_API_KEY": "sk-stub",
            "BRAID_CODEX_MAX_RETRIES": "0",
            "HTTP_PROXY": stub.url,
            "HTTPS_PROXY": stub.url,
            "http_proxy": stub.url,
            "https_proxy": stub.url,
            "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost",
        },
        model=MODEL,
        timeouts=CodexTimeouts(startup=30, idle=30, cancel_grace=5, exit_grace=5),
    )


def request(tmp_path: Path, text: str, session: SessionRequest | None = None) -> TurnRequest:
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
            members = [
                p.pid
                for p in psutil.process_iter()
                if _group_of(p) == worker.pgid and not _zombie(p)
            ]
            # A zombie (killed, not yet reaped by its new parent) runs nothing.
            assert not members, f"process group {worker.pgid} still has members: {members}"
    return result


def _zombie(proc: psutil.Process) -> bool:
    try:
        return bool(proc.status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


def _group_of(proc: psutil.Process) -> int | None:
    try:
        return os.getpgid(proc.pid)
    except ProcessLookupError:
        return None


def assert_offline(stub: ModelStub) -> None:
    assert stub.requests, "the CLI sent the model stub nothing"
    proxied = [f"{r.method} {r.path}" for r in stub.requests if r.proxied]
    assert not proxied, f"the CLI tried to reach other hosts: {proxied}"


def user_texts(body: dict[str, Any]) -> list[str]:
    """The user messages' texts of a Responses request, in order."""
    return [
        "".join(c.get("text", "") for c in item["content"])
        for item in body["input"]
        if item.get("type") == "message" and item.get("role") == "user"
    ]


async def test_a_text_turn_reports_parts_session_and_usage_without_cost(tmp_path: Path) -> None:
    usage = {"input_tokens": 200, "output_tokens": 40, "cache_read_input_tokens": 50}
    steps = {"openai": [{"thinking": "Consider.", "text": "Hello from the stub.", "usage": usage}]}
    async with open_model_stub(parse_script(steps)) as stub:
        adapter = provider(tmp_path, stub)
        assert adapter.available()
        assert adapter.name == "codex"
        caps = adapter.capabilities
        assert (caps.usage, caps.cost, caps.interaction_kinds) == ("reported", False, ())
        assert caps.sessions_continue
        assert caps.portable_context
        sink = RecordingSink()
        result = await run(adapter, request(tmp_path, "Say hello."), sink)
    assert_offline(stub)
    assert result.outcome == "completed", result.reason
    assert sink.calls[:2] == ["worker_started", "session"]
    thread = sink.sessions[0].session_id
    assert result.session_id == thread
    assert not any(s.resumed for s in sink.sessions)
    trace = sink.sessions[-1].trace_path
    assert trace is not None
    assert trace.endswith(f"-{thread}.jsonl")
    assert trace.startswith(str(tmp_path / "home" / ".codex" / "sessions"))
    assert sink.final_parts() == [
        ReasoningPart(part_id=f"{thread}:item_0", text="Consider."),
        TextPart(part_id=f"{thread}:item_1", text="Hello from the stub."),
    ]
    [(reported, cost)] = sink.usages
    assert reported == Usage(
        input_tokens=200,
        output_tokens=40,
        cache_read_tokens=50,
        reasoning_tokens=0,
        source="provider",
    )
    assert cost is None
    assert (result.usage, result.cost_usd) == (reported, None)
    proof = await adapter.prove_session(thread)
    assert proof.available
    assert proof.last_message_id == result.session_boundary is not None
    [sent] = stub.model_requests("openai")
    assert sent.body["model"] == MODEL
    assert user_texts(sent.body)[-1] == "Say hello."


async def test_a_shell_call_round_trips_as_command_parts(tmp_path: Path) -> None:
    call = {"name": "exec_command", "arguments": {"cmd": f"echo {MARKER}"}, "id": "call_braid_1"}
    steps = {"openai": [{"function_call": call}, {"text": f"It printed {MARKER}."}]}
    async with open_model_stub(parse_script(steps)) as stub:
        adapter = provider(tmp_path, stub)
        sink = RecordingSink()
        result = await run(adapter, request(tmp_path, "Run the marker."), sink)
    assert_offline(stub)
    assert result.outcome == "completed", result.reason
    thread = result.session_id
    parts = sink.final_parts()
    [tool] = [p for p in parts if isinstance(p, ToolRequestPart)]
    assert tool.part_id == f"{thread}:item_0"
    assert tool.name == "command_execution"
    assert MARKER in tool.input["command"]
    [outcome] = [p for p in parts if isinstance(p, ToolResultPart)]
    assert outcome.part_id == f"{tool.part_id}:result"
    assert (outcome.request_part_id, outcome.status, outcome.exit_code) == (tool.part_id, "ok", 0)
    assert outcome.summary.strip() == MARKER
    assert parts[-1] == TextPart(part_id=f"{thread}:item_1", text=f"It printed {MARKER}.")
    first, second = stub.model_requests("openai")
    assert not [i for i in first.body["input"] if i.get("type") == "function_call_output"]
    [output] = [i for i in second.body["input"] if i.get("type") == "function_call_output"]
    assert output["call_id"] == "call_braid_1"
    assert MARKER in str(output["output"])


async def test_resume_sends_only_the_new_input_and_checks_the_boundary(tmp_path: Path) -> None:
    steps = [{"text": "first answer"}, {"text": "second answer"}]
    async with open_model_stub(parse_script({"openai": steps})) as stub:
        adapter = provider(tmp_path, stub)
        first = await run(adapter, request(tmp_path, "one"), RecordingSink())
        assert first.outcome == "completed", first.reason
        assert first.session_id is not None
        assert first.session_boundary is not None

        stale = SessionRequest(first.session_id, expected_boundary="not-the-end")
        sink = RecordingSink()
        refused = await run(adapter, request(tmp_path, "never sent", stale), sink)
        assert refused.outcome == "failed"
        assert refused.reason is not None
        assert refused.reason.startswith("session_mismatch")
        assert not sink.calls

        unknown = SessionRequest("00000000-0000-4000-8000-000000000000", expected_boundary="x")
        unverified = await run(adapter, request(tmp_path, "never sent", unknown), sink)
        assert unverified.reason is not None
        assert unverified.reason.startswith("session_unverified")
        bogus = await adapter.prove_session("../../etc/passwd")
        assert not bogus.available
        assert not sink.calls
        assert len(stub.model_requests("openai")) == 1

        again = SessionRequest(first.session_id, expected_boundary=first.session_boundary)
        sink = RecordingSink()
        second = await run(adapter, request(tmp_path, "two", again), sink)
    assert_offline(stub)
    assert second.outcome == "completed", second.reason
    [session] = sink.sessions
    assert (session.session_id, session.resumed) == (first.session_id, True)
    assert session.trace_path is not None
    assert second.session_boundary not in (None, first.session_boundary)
    [(usage, _)] = sink.usages  # this turn's own counts, not the thread's running total
    assert (usage.input_tokens, usage.output_tokens) == (10, 5)
    assert sink.final_parts() == [
        TextPart(part_id=f"{first.session_id}:item_0", text="second answer")
    ]
    _, resumed = stub.model_requests("openai")
    texts = user_texts(resumed.body)
    assert texts.count("one") == 1
    assert texts.count("two") == 1
    assert texts[-1] == "two"
    assert "never sent" not in str(resumed.body)


async def test_a_model_error_fails_the_turn_with_the_message(tmp_path: Path) -> None:
    failure = {"error": {"status": 400, "message": "scripted failure"}}
    async with open_model_stub(parse_script({"fallback": failure})) as stub:
        adapter = provider(tmp_path, stub)
        sink = RecordingSink()
        result = await run(adapter, request(tmp_path, "hi"), sink)
    assert_offline(stub)
    assert result.outcome == "failed"
    assert result.reason is not None
    assert result.reason.startswith("turn_failed")
    assert "scripted failure" in result.reason
    assert result.cost_usd is None
    assert [r.status for r in stub.requests] == [400]
    errors = [p for p in sink.final_parts() if isinstance(p, ErrorPart)]
    assert errors
    assert "scripted failure" in errors[0].message


async def test_cancel_mid_stream_interrupts_codex(tmp_path: Path) -> None:
    steps = {"openai": [{"text": "too late", "delay": 20}]}
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
                    if stub.model_requests("openai"):
                        break
                    await trio.sleep(0.05)
            control.request_cancel("user asked")
    elapsed = trio.current_time() - start
    assert_offline(stub)
    [result] = results
    assert elapsed < 15
    assert (result.outcome, result.reason, result.cancel_acknowledged) == (
        "cancelled",
        "user asked",
        True,
    )
    assert not [p for p in sink.parts if isinstance(p, TextPart) and p.text == "too late"]


async def test_early_cancel_is_acknowledged_only_with_proof(tmp_path: Path) -> None:
    """A cancel that meets Codex before its turn began (the window in which Codex ignores
    SIGINT) is still acknowledged: the interrupt waits for the turn to start, and the
    rollout proves the end — no turn recorded (and then the model was never asked) or the
    turn's own ``turn_aborted``. Swept over delays from spawn through the window."""
    delays = [0.0, 0.05, 0.1, 0.15, 0.2, 0.22, 0.24, 0.26, 0.28, 0.3, 0.35, 0.4, 0.5, 0.7]
    for n, delay in enumerate(delays):
        steps = {"openai": [{"text": "too late", "delay": 20}]}
        async with open_model_stub(parse_script(steps)) as stub:
            (tmp_path / f"t{n}").mkdir()
            adapter = attrs.evolve(provider(tmp_path / f"t{n}", stub), home=tmp_path / f"h{n}")
            sink = RecordingSink()
            control = RunControl()

            async def cancel_later(wait: float = delay, control: RunControl = control) -> None:
                await trio.sleep(wait)
                control.request_cancel("early cancel")

            async with trio.open_nursery() as nursery:
                nursery.start_soon(cancel_later)
                result = await run(adapter, request(tmp_path / f"t{n}", "Be slow."), sink, control)
            assert not [r for r in stub.requests if r.proxied]  # nothing left loopback
            rollouts = list((adapter.codex_home / "sessions").rglob("rollout-*.jsonl"))
            kinds = [
                line.get("payload", {}).get("type")
                for path in rollouts
                for line in read_jsonl(str(path))
            ]
            assert (result.outcome, result.cancel_acknowledged) == ("cancelled", True), (
                delay,
                result.reason,
                kinds,
                len(stub.model_requests("openai")),
                result.worker_log,
            )
            if "task_started" not in kinds:
                assert not stub.model_requests("openai"), delay  # proven: never asked
            else:
                assert "turn_aborted" in kinds, (delay, kinds)
            assert not [p for p in sink.parts if isinstance(p, TextPart) and p.text == "too late"]


def conversation(body: dict[str, Any]) -> list[tuple[str, list[tuple[str, str]]]]:
    """The user / assistant messages of a Responses request: role, typed content blocks."""
    return [
        (item["role"], [(c["type"], c.get("text", "")) for c in item["content"]])
        for item in body["input"]
        if item.get("type") == "message" and item.get("role") in ("user", "assistant")
    ]


async def test_portable_context_seeds_a_new_thread(tmp_path: Path) -> None:
    steps = {"openai": [{"text": "copied answer"}, {"text": "next answer"}]}
    async with open_model_stub(parse_script(steps)) as stub:
        adapter = provider(tmp_path, stub)
        assert adapter.capabilities.portable_context
        turn = attrs.evolve(request(tmp_path, "Now summarize."), context=portable_context())
        sink = RecordingSink()
        result = await run(adapter, turn, sink)
        assert result.outcome == "completed", result.reason
        [session] = sink.sessions  # the rollout exists from the start
        assert not session.resumed  # a new thread with copied context
        receipt = session.receipt
        assert receipt is not None
        assert receipt.source_digest == portable_context().digest
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
        assert receipt.destination_runner == "codex"
        assert receipt.destination_session_id == session.session_id
        thread = session.session_id
        assert result.session_id == thread
        assert sink.workers[0].command[-4:] == ("resume", thread, "--", "Now summarize.")
        sessions = tmp_path / "home" / ".codex" / "sessions"
        rollouts = [str(p) for p in sessions.glob("*/*/*/rollout-*.jsonl")]
        trace = session.trace_path
        assert trace is not None
        assert rollouts == [trace]
        assert trace.endswith(f"-{thread}.jsonl")
        lines = read_jsonl(trace)
        assert lines[0]["type"] == "session_meta"
        assert lines[0]["payload"]["id"] == thread
        assert lines[0]["payload"]["cwd"] == str(tmp_path / "workspace")
        seeded = [line["payload"] for line in lines[1:4]]
        assert [(item["type"], item["role"]) for item in seeded] == [
            ("message", "user"),
            ("message", "assistant"),
            ("message", "user"),
        ]
        assert [p for p in sink.final_parts() if isinstance(p, TextPart)] == [
            TextPart(part_id=f"{thread}:item_0", text="copied answer")
        ]
        proof = await adapter.prove_session(thread)
        assert proof.available
        assert proof.last_message_id == result.session_boundary is not None

        # The seeded thread continues like any native one (the history is not copied again).
        again = SessionRequest(thread, expected_boundary=result.session_boundary)
        later = RecordingSink()
        resumed = await run(adapter, request(tmp_path, "One more.", again), later)
        assert resumed.outcome == "completed", resumed.reason
        assert [(s.session_id, s.resumed) for s in later.sessions] == [(thread, True)]
        assert all(s.receipt is None for s in later.sessions)  # nothing was copied
    assert_offline(stub)
    first, second = (r.body for r in stub.model_requests("openai"))
    copied = [
        ("user", [("input_text", "What is in the folder?")]),
        (
            "assistant",
            [
                ("output_text", "Let me look."),
                ("output_text", '[tool shell] {"cmd": "ls"}'),
                ("output_text", "[result ok exit=0] notes.txt"),
                ("output_text", "It holds notes.txt."),
            ],
        ),
    ]
    talk = conversation(first)
    assert talk[:2] == copied  # the copied history comes first, as typed messages in order
    role, blocks = talk[2]
    assert role == "user"
    assert [kind for kind, _ in blocks] == ["input_text"] * 3
    assert blocks[:2] == [
        ("input_text", "And the size?"),
        ("input_text", '[tool shell] {"cmd": "wc -c notes.txt"}'),
    ]
    assert blocks[2][1].startswith("[result error] xxx")
    assert "(truncated)" in blocks[2][1]
    assert len(blocks[2][1]) < 4200
    # Then Codex's own context for the turn, then the new input, last.
    assert talk[-1] == ("user", [("input_text", "Now summarize.")])
    between = [text for _, texts in talk[3:-1] for _, text in texts]
    assert all(text.lstrip().startswith("<") for text in between), between
    blob = json.dumps(first)
    for once in ("What is in the folder?", "It holds notes.txt.", "And the size?"):
        assert blob.count(once) == 1, once  # exactly once
    assert blob.count("Now summarize.") == 1
    for absent in ("private source reasoning", "profile instructions", "call_source_1", "call_2"):
        assert absent not in blob
    assert not [i for i in first["input"] if i.get("type") != "message"]

    later_talk = conversation(second)
    assert later_talk[:3] == talk[:3]
    assert json.dumps(second).count("What is in the folder?") == 1
    assert ("assistant", [("output_text", "copied answer")]) in later_talk
    assert user_texts(second)[-1] == "One more."
