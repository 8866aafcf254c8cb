"""The local provider adapter driving the real local worker process."""

from __future__ import annotations

import itertools
import os
import signal
import stat
import sys
import time
from typing import TYPE_CHECKING

import attrs
import pytest
import trio

from braid_actors.errors import ProviderProtocolError
from braid_actors.model import (
    Part,
    ReasoningPart,
    TextPart,
    ToolRequestPart,
    ToolResultPart,
    Usage,
)
from braid_actors.providers import (
    Capabilities,
    ContextMessage,
    InteractionAnswer,
    InteractionRequest,
    LocalProvider,
    LocalTimeouts,
    PortableContext,
    Provider,
    SessionInfo,
    SessionRequest,
    TurnRequest,
    WorkerInfo,
)
from braid_actors.workers import ProcessInfo, process_gone, read_session, session_path

if TYPE_CHECKING:
    from pathlib import Path


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
    first_part: trio.Event = attrs.Factory(trio.Event)

    async def worker_started(self, worker: WorkerInfo) -> None:
        self.calls.append("worker_started")
        self.workers.append(worker)
        await trio.lowlevel.checkpoint()

    async def session(self, info: SessionInfo) -> None:
        self.calls.append("session")
        self.sessions.append(info)
        await trio.lowlevel.checkpoint()

    async def part(self, part: Part) -> None:
        self.calls.append("part")
        self.parts.append(part)
        self.first_part.set()
        await trio.lowlevel.checkpoint()

    async def interaction(self, request: InteractionRequest) -> InteractionAnswer:
        self.calls.append("interaction")
        self.interactions.append(request)
        await trio.lowlevel.checkpoint()
        return self.answers.pop(0) if self.answers else InteractionAnswer(allow=True)

    async def usage(self, usage: Usage, cost_usd: float | None) -> None:
        self.calls.append("usage")
        self.usages.append((usage, cost_usd))
        await trio.lowlevel.checkpoint()

    def finals(self) -> dict[str, Part]:
        """The latest version of each part, by part id."""
        return {part.part_id: part for part in self.parts}

    def gone(self) -> bool:
        (worker,) = self.workers
        return process_gone(ProcessInfo(worker.pid, worker.create_time, worker.pgid, ()))


@attrs.define(eq=False)
class SpawnClock(RecordingSink):
    """A RecordingSink that also notes when each worker was started, in a shared list."""

    spawned: list[float] = attrs.field(kw_only=True)

    async def worker_started(self, worker: WorkerInfo) -> None:
        self.spawned.append(trio.current_time())
        await super().worker_started(worker)


def provider(tmp_path: Path, **timeouts: float) -> LocalProvider:
    return LocalProvider(tmp_path / "sessions", timeouts=LocalTimeouts(**timeouts))


_ids = itertools.count(1)


def request(
    tmp_path: Path,
    text: str,
    *,
    session: SessionRequest | None = None,
    context: PortableContext | None = None,
) -> TurnRequest:
    n = next(_ids)
    workspace = tmp_path / "ws"
    workspace.mkdir(exist_ok=True)
    return TurnRequest(
        run_id=f"run_{n}",
        turn_id=f"turn_{n}",
        workspace=workspace,
        user_message_id=f"msg_u{n}",
        assistant_message_id=f"msg_a{n}",
        text=text,
        session=session or SessionRequest(),
        context=context,
    )


CONTEXT = PortableContext(
    source_conversation_id="conv_1",
    source_branch_id="br_1",
    through_message_id="msg_c2",
    messages=(
        ContextMessage("msg_c1", "user", (TextPart(part_id="part_1", text="what is here?"),)),
        ContextMessage(
            "msg_c2",
            "assistant",
            (
                ToolRequestPart(part_id="part_2", name="shell", input={"command": "ls"}),
                ToolResultPart(
                    part_id="part_3", request_part_id="part_2", status="ok", summary="a.txt"
                ),
                TextPart(part_id="part_4", text="One file."),
            ),
        ),
    ),
    complete=True,
    digest="sha256:" + "1" * 64,
)


def fake_worker(tmp_path: Path, body: str) -> str:
    """An executable standing in for the interpreter: it ignores its arguments."""
    path = tmp_path / "fake-python"
    path.write_text(f"#!{sys.executable}\n{body}")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


HELLO = 'import sys, time\nprint(\'{"type":"hello","protocol":1,"pid":0}\', flush=True)\n'


# ---- the port ---------------------------------------------------------------------------


def test_capabilities_and_availability(tmp_path: Path) -> None:
    """The local runner is named local, is available, and claims what it does."""
    local: Provider = provider(tmp_path)
    assert local.name == "local"
    assert local.available()
    assert local.capabilities == Capabilities(
        sessions_continue=True,
        sessions_fork=False,
        portable_context=True,
        interaction_kinds=("permission",),
        usage="estimated",
        cost=True,
    )
    missing = LocalProvider(tmp_path, python=str(tmp_path / "no-python"))
    assert not missing.available()


def test_idle_deadline_must_outlast_the_shell_limit() -> None:
    """An idle deadline shorter than the shell limit is refused."""
    with pytest.raises(ValueError, match="idle deadline"):
        LocalTimeouts(idle=10.0, shell=30.0)


async def test_turn_streams_and_completes(tmp_path: Path) -> None:
    """A plain turn reports its worker and session, streams one replaced part, and completes."""
    sink = RecordingSink()
    req = request(tmp_path, "hello")
    result = await provider(tmp_path).run_turn(req, sink)
    assert result.outcome == "completed"
    assert result.reason is None
    assert sink.calls[:2] == ["worker_started", "session"]
    assert sink.calls[-1] == "usage"
    assert sink.gone()
    (info,) = sink.sessions
    assert info.resumed is False
    assert result.session_id == info.session_id
    assert info.trace_path == str(session_path(tmp_path / "sessions", info.session_id))
    assert len(sink.parts) >= 2
    assert {p.part_id for p in sink.parts} == {f"part_{req.assistant_message_id[4:]}_001"}
    texts = [p.text for p in sink.parts if isinstance(p, TextPart)]
    assert all(later.startswith(earlier) for earlier, later in itertools.pairwise(texts))
    assert texts[-1] == "You said: hello (0 earlier messages in this session)"
    assert result.session_boundary == req.assistant_message_id


async def test_usage_is_estimated_and_free(tmp_path: Path) -> None:
    """Usage is labelled estimate with integer counts, and the cost is a real zero."""
    sink = RecordingSink()
    result = await provider(tmp_path).run_turn(request(tmp_path, "hello"), sink)
    ((usage, cost),) = sink.usages
    assert usage.source == "estimate"
    assert usage.input_tokens == 2
    assert isinstance(usage.output_tokens, int)
    assert usage.output_tokens > 0
    assert cost == 0.0
    assert result.usage == usage
    assert result.cost_usd == 0.0


# ---- directives -------------------------------------------------------------------------


async def test_shell_allowed_runs_the_real_command(tmp_path: Path) -> None:
    """An allowed ! command runs in the workspace and reports its output and exit code."""
    sink = RecordingSink()
    command = "printf 'out\\n'; printf 'err\\n' >&2; echo made > made.txt; exit 3"
    result = await provider(tmp_path).run_turn(request(tmp_path, f"!{command}"), sink)
    assert result.outcome == "completed"
    (asked,) = sink.interactions
    assert asked.kind == "permission"
    assert asked.subject == {"tool": "shell", "command": command}
    tool_request, tool_result = sink.finals().values()
    assert isinstance(tool_request, ToolRequestPart)
    assert tool_request.name == "shell"
    assert tool_request.input == {"command": command}
    assert isinstance(tool_result, ToolResultPart)
    assert tool_result.request_part_id == tool_request.part_id
    assert tool_result.status == "error"
    assert tool_result.exit_code == 3
    assert tool_result.summary == "out\nerr\n"
    assert tool_result.truncated is False
    assert (tmp_path / "ws" / "made.txt").read_text() == "made\n"


async def test_shell_ok(tmp_path: Path) -> None:
    """A command that exits 0 is reported ok with exit code 0."""
    sink = RecordingSink()
    await provider(tmp_path).run_turn(request(tmp_path, "!pwd"), sink)
    tool_result = list(sink.finals().values())[-1]
    assert isinstance(tool_result, ToolResultPart)
    assert tool_result.status == "ok"
    assert tool_result.exit_code == 0
    assert tool_result.summary == f"{tmp_path / 'ws'}\n"


async def test_shell_denied_runs_nothing(tmp_path: Path) -> None:
    """A denied ! command is reported denied and never runs."""
    sink = RecordingSink(answers=[InteractionAnswer(allow=False, message="not today")])
    result = await provider(tmp_path).run_turn(request(tmp_path, "!touch made.txt"), sink)
    assert result.outcome == "completed"
    tool_result = list(sink.finals().values())[-1]
    assert isinstance(tool_result, ToolResultPart)
    assert tool_result.status == "denied"
    assert tool_result.exit_code is None
    assert tool_result.summary == "Permission denied. not today"
    assert not (tmp_path / "ws" / "made.txt").exists()


async def test_think_emits_reasoning(tmp_path: Path) -> None:
    """?think emits a reasoning part."""
    sink = RecordingSink()
    await provider(tmp_path).run_turn(request(tmp_path, "?think\nhi"), sink)
    first, second = sink.finals().values()
    assert isinstance(first, ReasoningPart)
    assert first.text.startswith("Thinking about 2 input line(s)")
    assert isinstance(second, TextPart)


async def test_fail_directive_fails_the_run(tmp_path: Path) -> None:
    """?fail ends the turn failed with a reason, after the parts before it."""
    sink = RecordingSink()
    req = request(tmp_path, "before\n?fail\nafter")
    result = await provider(tmp_path).run_turn(req, sink)
    assert result.outcome == "failed"
    assert result.reason is not None
    assert result.reason.startswith("failed_by_request: ")
    assert len(sink.finals()) == 1
    assert result.session_boundary == req.assistant_message_id


async def test_sleep_streams_over_about_n_seconds(tmp_path: Path) -> None:
    """?sleep N streams one part over about N seconds."""
    sink = RecordingSink()
    began = trio.current_time()
    result = await provider(tmp_path).run_turn(request(tmp_path, "?sleep 0.6"), sink)
    assert trio.current_time() - began >= 0.6
    assert result.outcome == "completed"
    assert len(sink.parts) >= 3
    assert len(sink.finals()) == 1
    final = sink.parts[-1]
    assert isinstance(final, TextPart)
    assert final.text.endswith(" done.")


async def test_cancellation_stops_the_worker_before_propagating(tmp_path: Path) -> None:
    """Cancelling a ?sleep turn ends it promptly; its process is gone when the cancel lands."""
    sink = RecordingSink()
    req = request(tmp_path, "?sleep 20")
    gone_at_cancel: list[bool] = []
    scope = trio.CancelScope()

    async def run() -> None:
        with scope:
            await provider(tmp_path).run_turn(req, sink)
        gone_at_cancel.append(sink.gone())

    began = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        with trio.fail_after(10):
            await sink.first_part.wait()
        scope.cancel(reason="test cancels the run")
    assert gone_at_cancel == [True]
    assert trio.current_time() - began < 5
    (info,) = sink.sessions
    state = read_session(session_path(tmp_path / "sessions", info.session_id))
    assert state.last_message_id == req.user_message_id


async def test_worker_killed_mid_turn_fails_with_reason(tmp_path: Path) -> None:
    """A worker killed mid-turn gives a failed result that says so, never a success."""
    sink = RecordingSink()
    req = request(tmp_path, "?sleep 20")
    async with trio.open_nursery() as nursery:
        results = []

        async def run() -> None:
            results.append(await provider(tmp_path).run_turn(req, sink))

        nursery.start_soon(run)
        with trio.fail_after(10):
            await sink.first_part.wait()
        os.kill(sink.workers[0].pid, signal.SIGKILL)
    (result,) = results
    assert result.outcome == "failed"
    assert result.reason == (
        "worker_exited: the local worker was ended by signal 9 before it reported the end of "
        "the turn"
    )
    assert result.session_id == sink.sessions[0].session_id


# ---- sessions ---------------------------------------------------------------------------


async def test_fresh_session_with_context_then_native_continuation(tmp_path: Path) -> None:
    """Context seeds a fresh session; continuing at its proven boundary adds only new input."""
    local = provider(tmp_path)
    first = await local.run_turn(request(tmp_path, "one", context=CONTEXT), RecordingSink())
    assert first.session_id is not None
    proof = await local.prove_session(first.session_id)
    assert proof.available
    assert proof.last_message_id == first.session_boundary
    assert proof.digest == first.session_digest
    path = session_path(tmp_path / "sessions", first.session_id)
    before = path.read_bytes()
    assert [line.message_id for line in read_session(path).lines][:2] == ["msg_c1", "msg_c2"]
    assert read_session(path).lines[1].text == (
        '[tool request shell: {"command":"ls"}]\n[tool result ok] a.txt\nOne file.'
    )

    sink = RecordingSink()
    req = request(
        tmp_path,
        "two",
        session=SessionRequest(first.session_id, proof.last_message_id, proof.digest),
    )
    second = await local.run_turn(req, sink)
    assert second.outcome == "completed"
    assert sink.sessions[0].resumed is True
    assert path.read_bytes().startswith(before)
    added = read_session(path).lines[-2:]
    assert [(line.message_id, line.role) for line in added] == [
        (req.user_message_id, "user"),
        (req.assistant_message_id, "assistant"),
    ]
    assert added[1].text == "You said: two (4 earlier messages in this session)"
    assert len(read_session(path).lines) == 6
    assert (await local.prove_session(first.session_id)).digest == second.session_digest


async def test_fresh_session_with_context_reports_a_transfer_receipt(tmp_path: Path) -> None:
    """The session report of a fresh session names what it got of the context, by part id."""
    context = attrs.evolve(
        CONTEXT,
        messages=(
            *CONTEXT.messages,
            ContextMessage(
                "msg_c3", "assistant", (ReasoningPart(part_id="part_5", text="private"),)
            ),
        ),
    )
    sink = RecordingSink()
    result = await provider(tmp_path).run_turn(request(tmp_path, "one", context=context), sink)
    assert result.outcome == "completed"
    receipt = sink.sessions[0].receipt
    assert receipt is not None
    assert receipt.source_digest == context.digest
    assert receipt.included_message_ids == ("msg_c1", "msg_c2", "msg_c3")
    assert [(o.message_id, o.part_id, o.kind) for o in receipt.omitted_parts] == [
        ("msg_c3", "part_5", "reasoning")
    ]
    assert [(t.message_id, t.part_id, t.kind) for t in receipt.transformed_parts] == [
        ("msg_c2", "part_2", "tool_request"),
        ("msg_c2", "part_3", "tool_result"),
    ]
    assert receipt.destination_runner == "local"
    assert receipt.destination_session_id == result.session_id

    resumed = RecordingSink()
    session = SessionRequest(result.session_id, result.session_boundary, result.session_digest)
    await provider(tmp_path).run_turn(request(tmp_path, "two", session=session), resumed)
    assert resumed.sessions[0].receipt is None


async def test_boundary_mismatch_refuses_and_leaves_file_identical(tmp_path: Path) -> None:
    """A stale boundary is refused with session_mismatch and the file is byte-identical."""
    local = provider(tmp_path)
    first = await local.run_turn(request(tmp_path, "one"), RecordingSink())
    assert first.session_id is not None
    path = session_path(tmp_path / "sessions", first.session_id)
    before = path.read_bytes()
    sink = RecordingSink()
    stale = SessionRequest(first.session_id, expected_boundary="msg_elsewhere")
    result = await local.run_turn(request(tmp_path, "two", session=stale), sink)
    assert result.outcome == "failed"
    assert result.reason is not None
    assert result.reason.startswith("session_mismatch: ")
    assert result.session_boundary == first.session_boundary
    assert sink.sessions == []
    assert sink.parts == []
    assert path.read_bytes() == before


async def test_prove_session(tmp_path: Path) -> None:
    """prove_session reports the file's end, or unavailable with a reason."""
    local = provider(tmp_path)
    first = await local.run_turn(request(tmp_path, "one"), RecordingSink())
    assert first.session_id is not None
    proof = await local.prove_session(first.session_id)
    state = read_session(session_path(tmp_path / "sessions", first.session_id))
    assert (proof.available, proof.last_message_id, proof.digest) == (
        True,
        state.last_message_id,
        state.digest,
    )
    bad = await local.prove_session("../etc/passwd")
    assert not bad.available
    assert bad.reason == "not a local session id"
    missing = await local.prove_session("sess_" + "b" * 24)
    assert not missing.available
    assert missing.reason is not None
    assert missing.reason.startswith("session_missing: ")
    corrupt = session_path(tmp_path / "sessions", "sess_" + "c" * 24)
    corrupt.write_text('{"messageId": "msg_1"}\n')
    broken = await local.prove_session("sess_" + "c" * 24)
    assert not broken.available
    assert broken.reason is not None
    assert broken.reason.startswith("session_corrupt: ")


# ---- misbehaving workers ----------------------------------------------------------------


async def test_malformed_output_is_a_protocol_error(tmp_path: Path) -> None:
    """A worker line that is not JSON raises ProviderProtocolError; the worker is stopped."""
    python = fake_worker(tmp_path, HELLO + "print('not json', flush=True)\ntime.sleep(30)\n")
    sink = RecordingSink()
    local = LocalProvider(tmp_path / "sessions", python=python)
    with trio.fail_after(10), pytest.raises(ProviderProtocolError):
        await local.run_turn(request(tmp_path, "hi"), sink)
    assert sink.gone()


async def test_unknown_part_kind_is_a_protocol_error(tmp_path: Path) -> None:
    """A part of a kind the model lacks raises ProviderProtocolError naming the kind."""
    body = (
        HELLO
        + 'print(\'{"type":"session","sessionId":"sess_0123456789","resumed":false,'
        + '"path":null}\', flush=True)\n'
        + 'print(\'{"type":"part","part":{"kind":"hologram","part_id":"p"}}\', '
        + "flush=True)\ntime.sleep(30)\n"
    )
    sink = RecordingSink()
    local = LocalProvider(tmp_path / "sessions", python=fake_worker(tmp_path, body))
    with trio.fail_after(10), pytest.raises(ProviderProtocolError) as caught:
        await local.run_turn(request(tmp_path, "hi"), sink)
    assert caught.value.details == {"kind": "hologram"}
    assert sink.gone()


async def test_silent_worker_hits_the_startup_deadline(tmp_path: Path) -> None:
    """A worker that never says hello fails the turn at the startup deadline."""
    python = fake_worker(tmp_path, "import time\ntime.sleep(30)\n")
    sink = RecordingSink()
    timeouts = LocalTimeouts(startup=0.5, cancel_grace=0.2, term_grace=1.0)
    local = LocalProvider(tmp_path / "sessions", timeouts=timeouts, python=python)
    with trio.fail_after(10):
        result = await local.run_turn(request(tmp_path, "hi"), sink)
    assert result.outcome == "failed"
    assert result.reason == "worker_unresponsive: the local worker sent nothing for 0.5 s"
    assert sink.gone()


async def test_workers_start_a_limited_number_at_a_time(tmp_path: Path) -> None:
    """With ``start_limit`` 1, a second worker is spawned only once the first one's start
    is over (here: its startup deadline), so each start gets the whole deadline to itself;
    the place is given back after a failed start, and a third turn still starts."""
    python = fake_worker(tmp_path, "import time\ntime.sleep(30)\n")
    timeouts = LocalTimeouts(startup=0.5, cancel_grace=0.2, term_grace=1.0)
    local = LocalProvider(tmp_path / "sessions", timeouts=timeouts, python=python, start_limit=1)
    spawned: list[float] = []
    sinks = [SpawnClock(spawned=spawned) for _ in range(3)]

    async def turn(sink: RecordingSink) -> None:
        result = await local.run_turn(request(tmp_path, "hi"), sink)
        assert result.reason == "worker_unresponsive: the local worker sent nothing for 0.5 s"

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            for sink in sinks:
                nursery.start_soon(turn, sink)
    assert len(spawned) == 3
    assert spawned[1] - spawned[0] >= 0.45 and spawned[2] - spawned[1] >= 0.45
    assert local.starting.value == 1
    assert all(sink.gone() for sink in sinks)
    with pytest.raises(ValueError, match="start_limit"):
        LocalProvider(tmp_path / "sessions", start_limit=0)


async def test_a_worker_silent_mid_turn_hits_the_idle_deadline(tmp_path: Path) -> None:
    """A worker that stops sending (``?at`` far ahead) fails the turn at the idle deadline,
    not before it nor long after it."""
    sink = RecordingSink()
    local = provider(tmp_path, idle=1.0, shell=0.5, cancel_grace=0.2, term_grace=1.0)
    began = trio.current_time()
    with trio.fail_after(20):
        result = await local.run_turn(request(tmp_path, f"?at {time.time() + 60:.3f}"), sink)
    assert result.outcome == "failed"
    assert result.reason == "worker_unresponsive: the local worker sent nothing for 1 s"
    assert 0.85 <= trio.current_time() - began < 10
    assert sink.gone()


async def test_a_worker_that_keeps_streaming_is_never_idle(tmp_path: Path) -> None:
    """Messages 0.25 s apart for 2 s keep a 1 s idle deadline away the whole turn."""
    sink = RecordingSink()
    local = provider(tmp_path, idle=1.0, shell=0.5)
    with trio.fail_after(20):
        result = await local.run_turn(request(tmp_path, "?stream 2 4"), sink)
    assert result.outcome == "completed", result.reason


async def test_cancel_escalates_for_a_worker_that_ignores_it(tmp_path: Path) -> None:
    """Cancelling a turn whose worker ignores cancel and SIGTERM still leaves no process."""
    body = (
        "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        + HELLO
        + 'print(\'{"type":"session","sessionId":"sess_0123456789","resumed":false,'
        + '"path":null}\', flush=True)\n'
        + 'print(\'{"type":"part","part":{"kind":"text","part_id":"p","text":"x"}}\','
        + " flush=True)\ntime.sleep(30)\n"
    )
    sink = RecordingSink()
    timeouts = LocalTimeouts(cancel_grace=0.3, term_grace=0.3, kill_grace=2.0)
    local = LocalProvider(
        tmp_path / "sessions", timeouts=timeouts, python=fake_worker(tmp_path, body)
    )
    began = trio.current_time()
    with trio.move_on_after(10) as outer:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(local.run_turn, request(tmp_path, "hi"), sink)
            await sink.first_part.wait()
            nursery.cancel_scope.cancel(reason="test cancels the run")
    assert not outer.cancelled_caught
    assert sink.gone()
    assert 0.6 <= trio.current_time() - began < 5


def test_public_names_are_exported_once() -> None:
    """Every name in the providers package's __all__ exists and appears once."""
    import braid_actors.providers as package

    assert len(package.__all__) == len(set(package.__all__))
    assert all(hasattr(package, name) for name in package.__all__)
