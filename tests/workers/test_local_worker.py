"""The local worker program over its raw JSONL protocol, and the process helper under it."""

from __future__ import annotations

import itertools
import json
import sys
import time
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import psutil  # type: ignore[import-untyped, unused-ignore]
import pytest
import trio

from braid_actors.errors import WorkerLineTooLong, WorkerStartFailed, WorkerStopTimeout
from braid_actors.model import digest
from braid_actors.workers import (
    ProcessInfo,
    StopPolicy,
    WorkerProcess,
    local_worker_command,
    open_worker,
    process_gone,
    read_session,
    session_digest,
    session_path,
    worker_environment,
)
from tests._imports import loaded_after

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

FAST = StopPolicy(grace=2.0, term_grace=1.0, kill_grace=2.0)


@asynccontextmanager
async def local_worker(tmp_path: Path, *extra: str) -> AsyncIterator[WorkerProcess]:
    command = (*local_worker_command(tmp_path / "sessions"), *extra)
    async with open_worker(command, env=worker_environment(), policy=FAST) as worker:
        hello = await worker.receive()
        assert hello is not None
        assert hello["type"] == "hello"
        assert hello["protocol"] == 1
        assert hello["pid"] == worker.info.pid
        yield worker


def start(tmp_path: Path, text: str, **overrides: Any) -> dict[str, Any]:
    workspace = tmp_path / "ws"
    workspace.mkdir(exist_ok=True)
    message: dict[str, Any] = {
        "type": "start",
        "runId": "run_1",
        "turnId": "turn_1",
        "userMessageId": "msg_u1",
        "assistantMessageId": "msg_a1",
        "text": text,
        "workspace": str(workspace),
        "session": {"id": None, "expectedBoundary": None, "expectedDigest": None},
        "context": None,
    }
    message.update(overrides)
    return message


async def until_done(worker: WorkerProcess, *, allow: bool = True) -> list[dict[str, Any]]:
    """Every message through ``done``, answering permissions with ``allow``."""
    seen: list[dict[str, Any]] = []
    with trio.fail_after(15):
        while True:
            message = await worker.receive()
            assert message is not None, f"worker ended without done: {seen}"
            seen.append(message)
            if message["type"] == "interaction":
                await worker.send(
                    {
                        "type": "interaction_response",
                        "interactionId": message["interactionId"],
                        "allow": allow,
                        "message": None if allow else "not now",
                    }
                )
            if message["type"] == "done":
                return seen


async def one_turn(tmp_path: Path, text: str, **overrides: Any) -> list[dict[str, Any]]:
    async with local_worker(tmp_path) as worker:
        await worker.send(start(tmp_path, text, **overrides))
        return await until_done(worker)


async def wait_gone(pid: int) -> None:
    """Wait (bounded) until ``pid`` no longer runs; its reaper may take a moment."""
    for _ in range(100):
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        await trio.sleep(0.05)
    raise AssertionError(f"process {pid} still runs")


def of_type(messages: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [m for m in messages if m["type"] == kind]


CONTEXT = {
    "sourceConversationId": "conv_1",
    "sourceBranchId": "br_1",
    "throughMessageId": "msg_c2",
    "complete": True,
    "digest": "sha256:" + "0" * 64,
    "messages": [
        {
            "messageId": "msg_c1",
            "role": "user",
            "parts": [{"kind": "text", "part_id": "part_1", "text": "first question"}],
        },
        {
            "messageId": "msg_c2",
            "role": "assistant",
            "parts": [
                {"kind": "text", "part_id": "part_2", "text": "an answer"},
                {"kind": "reasoning", "part_id": "part_3", "text": "hidden"},
                {
                    "kind": "tool_result",
                    "part_id": "part_4",
                    "request_part_id": "part_5",
                    "status": "ok",
                    "summary": "3 files",
                    "truncated": False,
                    "exit_code": 0,
                    "artifact_ref": None,
                },
            ],
        },
    ],
}


# ---- protocol ---------------------------------------------------------------------------


async def test_turn_message_order(tmp_path: Path) -> None:
    """A turn is session, then parts, then usage, then done, and the worker exits 0."""
    async with local_worker(tmp_path) as worker:
        await worker.send(start(tmp_path, "hello"))
        messages = await until_done(worker)
        with trio.fail_after(5):
            assert await worker.wait() == 0
    kinds = [m["type"] for m in messages]
    assert kinds[0] == "session"
    assert kinds[-2:] == ["usage", "done"]
    assert set(kinds[1:-2]) == {"part"}
    done = messages[-1]
    assert done["outcome"] == "completed"
    assert done["reason"] is None
    assert done["sessionBoundary"] == "msg_a1"


async def test_streaming_replaces_one_part(tmp_path: Path) -> None:
    """A text reply streams as repeated parts with one part id and growing text."""
    parts = [m["part"] for m in of_type(await one_turn(tmp_path, "hi there"), "part")]
    assert len(parts) >= 2
    assert {p["part_id"] for p in parts} == {"part_a1_001"}
    texts = [p["text"] for p in parts]
    assert all(later.startswith(earlier) for earlier, later in itertools.pairwise(texts))
    assert texts[-1] == "You said: hi there (0 earlier messages in this session)"


async def test_at_holds_the_turn_silent_until_the_wall_clock_reads_it(tmp_path: Path) -> None:
    """``?at T`` sends nothing before T; the next line runs after it."""
    at = time.time() + 0.6
    messages = await one_turn(tmp_path, f"?at {at:.3f}\n?stream 0.2 10")
    parts = of_type(messages, "part")
    assert time.time() >= at
    assert parts[-1]["part"]["text"] == "Streaming.."
    # Nothing but the session came before the wait ended: the first part is the stream's.
    assert parts[0]["part"]["text"] == "Streaming."


async def test_each_line_gets_its_own_part(tmp_path: Path) -> None:
    """Each plain input line is answered by its own part, numbered in order."""
    parts = [m["part"] for m in of_type(await one_turn(tmp_path, "one\n\ntwo"), "part")]
    finals = {p["part_id"]: p["text"] for p in parts}
    assert finals == {
        "part_a1_001": "You said: one (0 earlier messages in this session)",
        "part_a1_002": "You said: two (0 earlier messages in this session)",
    }


async def test_usage_is_an_estimate_with_zero_cost(tmp_path: Path) -> None:
    """Usage counts are ceil(chars / 4) estimates, labelled estimate, with a real zero cost."""
    messages = await one_turn(tmp_path, "abcdefgh")
    (usage,) = of_type(messages, "usage")
    reply = "You said: abcdefgh (0 earlier messages in this session)"
    assert usage == {
        "type": "usage",
        "inputTokens": 2,
        "outputTokens": -(-len(reply) // 4),
        "source": "estimate",
        "costUsd": 0.0,
    }


async def test_bad_start_is_refused_without_a_session(tmp_path: Path) -> None:
    """A malformed start gets bad_message and done failed, and no session file is made."""
    messages = await one_turn(tmp_path, "hi", runId=7)
    assert [m["type"] for m in messages] == ["error", "done"]
    assert messages[0]["code"] == "bad_message"
    assert messages[1]["outcome"] == "failed"
    assert messages[1]["reason"].startswith("bad_message: ")
    assert not (tmp_path / "sessions").exists()


async def test_malformed_line_during_turn_is_reported_and_ignored(tmp_path: Path) -> None:
    """A garbage line during a turn gets error bad_message and the turn still completes."""
    async with local_worker(tmp_path) as worker:
        await worker.send(start(tmp_path, "?sleep 0.3"))
        stdin = worker.process.stdin
        assert stdin is not None
        await stdin.send_all(b"this is not json\n")
        messages = await until_done(worker)
    (error,) = of_type(messages, "error")
    assert error["code"] == "bad_message"
    assert messages[-1]["outcome"] == "completed"


async def test_cancel_before_start(tmp_path: Path) -> None:
    """A cancel before start ends the worker with done cancelled and no session."""
    async with local_worker(tmp_path) as worker:
        await worker.send({"type": "cancel"})
        messages = await until_done(worker)
    assert messages == [
        {
            "type": "done",
            "outcome": "cancelled",
            "reason": "cancelled: Braid cancelled before the turn started",
            "sessionId": None,
            "sessionBoundary": None,
            "sessionDigest": None,
        }
    ]


async def test_cancel_during_sleep_is_prompt(tmp_path: Path) -> None:
    """A cancel during ?sleep ends the turn at once; the file keeps only the user input."""
    async with local_worker(tmp_path) as worker:
        await worker.send(start(tmp_path, "?sleep 20"))
        session = await worker.receive()
        first = await worker.receive()
        assert session is not None
        assert first is not None
        assert first["type"] == "part"
        with trio.fail_after(3):
            await worker.send({"type": "cancel"})
            messages = await until_done(worker)
            assert await worker.wait() == 0
    done = messages[-1]
    assert done["outcome"] == "cancelled"
    assert done["sessionBoundary"] == "msg_u1"
    state = read_session(session_path(tmp_path / "sessions", session["sessionId"]))
    assert [line.message_id for line in state.lines] == ["msg_u1"]


# ---- sessions ---------------------------------------------------------------------------


async def test_fresh_session_translates_context_into_native_lines(tmp_path: Path) -> None:
    """Portable context becomes one native line per message, before the new input."""
    messages = await one_turn(tmp_path, "next", context=CONTEXT)
    session = messages[0]
    assert session["resumed"] is False
    path = session_path(tmp_path / "sessions", session["sessionId"])
    assert session["path"] == str(path)
    raw = [json.loads(line) for line in path.read_bytes().splitlines()]
    assert raw == [
        {"messageId": "msg_c1", "role": "user", "text": "first question"},
        {"messageId": "msg_c2", "role": "assistant", "text": "an answer\n[tool result ok] 3 files"},
        {"messageId": "msg_u1", "role": "user", "text": "next"},
        {
            "messageId": "msg_a1",
            "role": "assistant",
            "text": "You said: next (2 earlier messages in this session)",
        },
    ]
    done = messages[-1]
    assert done["sessionDigest"] == digest(raw)
    assert done["sessionDigest"] == session_digest(read_session(path).lines)


async def test_continuation_appends_only_the_new_input(tmp_path: Path) -> None:
    """Continuing a session at its boundary appends just the new input and the reply."""
    first = (await one_turn(tmp_path, "one", context=CONTEXT))[-1]
    path = session_path(tmp_path / "sessions", first["sessionId"])
    before = path.read_bytes()
    messages = await one_turn(
        tmp_path,
        "two",
        userMessageId="msg_u2",
        assistantMessageId="msg_a2",
        session={
            "id": first["sessionId"],
            "expectedBoundary": first["sessionBoundary"],
            "expectedDigest": first["sessionDigest"],
        },
    )
    assert messages[0]["resumed"] is True
    after = path.read_bytes()
    assert after.startswith(before)
    added = [json.loads(line) for line in after[len(before) :].splitlines()]
    assert added == [
        {"messageId": "msg_u2", "role": "user", "text": "two"},
        {
            "messageId": "msg_a2",
            "role": "assistant",
            "text": "You said: two (4 earlier messages in this session)",
        },
    ]
    assert messages[-1]["sessionBoundary"] == "msg_a2"


@pytest.mark.parametrize(
    ("boundary", "digest_value"),
    [("msg_u1", None), ("msg_a1", "sha256:" + "f" * 64)],
    ids=["boundary", "digest"],
)
async def test_mismatch_refuses_and_leaves_file_unchanged(
    tmp_path: Path, boundary: str, digest_value: str | None
) -> None:
    """A continuation whose boundary or digest differs is refused; the file is byte-identical."""
    first = (await one_turn(tmp_path, "one"))[-1]
    path = session_path(tmp_path / "sessions", first["sessionId"])
    before = path.read_bytes()
    messages = await one_turn(
        tmp_path,
        "two",
        userMessageId="msg_u2",
        assistantMessageId="msg_a2",
        session={
            "id": first["sessionId"],
            "expectedBoundary": boundary,
            "expectedDigest": digest_value,
        },
    )
    assert [m["type"] for m in messages] == ["error", "done"]
    assert messages[0]["code"] == "session_mismatch"
    assert messages[1]["outcome"] == "failed"
    assert messages[1]["sessionBoundary"] == "msg_a1"
    assert path.read_bytes() == before


async def test_missing_session(tmp_path: Path) -> None:
    """Continuing a session with no file is session_missing."""
    session = {"id": "sess_" + "a" * 24, "expectedBoundary": "msg_x", "expectedDigest": None}
    messages = await one_turn(tmp_path, "hi", session=session)
    assert messages[0]["code"] == "session_missing"
    assert messages[1]["outcome"] == "failed"


async def test_context_is_refused_for_an_existing_session(tmp_path: Path) -> None:
    """Portable context is never resent into an existing native session."""
    session = {"id": "sess_" + "a" * 24, "expectedBoundary": "msg_x", "expectedDigest": None}
    messages = await one_turn(tmp_path, "hi", session=session, context=CONTEXT)
    assert messages[0]["code"] == "bad_message"


# ---- shell ------------------------------------------------------------------------------


async def test_shell_background_job_ends_with_the_command(tmp_path: Path) -> None:
    """A shell command's background job is killed with its group when the command ends."""
    start_time = trio.current_time()
    messages = await one_turn(tmp_path, "!sleep 30 & echo started $!")
    assert trio.current_time() - start_time < 10
    result = [m["part"] for m in of_type(messages, "part") if m["part"]["kind"] == "tool_result"]
    assert result[0]["status"] == "ok"
    assert result[0]["summary"].startswith("started ")
    background = int(result[0]["summary"].split()[1])
    await wait_gone(background)


async def test_shell_time_limit(tmp_path: Path) -> None:
    """A shell command past the worker's time limit is killed and reported as an error."""
    async with local_worker(tmp_path, "--shell-timeout", "0.5") as worker:
        await worker.send(start(tmp_path, "!echo begun; sleep 30"))
        messages = await until_done(worker)
    result = [m["part"] for m in of_type(messages, "part") if m["part"]["kind"] == "tool_result"]
    assert result[0]["status"] == "error"
    assert result[0]["exit_code"] is None
    assert result[0]["summary"] == "begun\n\n(timed out after 0.5 s)"


async def test_shell_output_is_bounded(tmp_path: Path) -> None:
    """A shell command's summary is bounded and says it was truncated."""
    messages = await one_turn(tmp_path, "!head -c 100000 /dev/zero | tr '\\0' x")
    result = [m["part"] for m in of_type(messages, "part") if m["part"]["kind"] == "tool_result"]
    assert result[0]["truncated"] is True
    assert result[0]["summary"] == "x" * 4000


# ---- the process helper -----------------------------------------------------------------

IGNORE_TERM = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    'print(\'{"type": "ready"}\', flush=True)\n'
    "time.sleep(60)\n"
)


async def test_stop_ladder_escalates_to_sigkill(tmp_path: Path) -> None:
    """A worker that ignores cancel and SIGTERM is killed, and the escalation is recorded."""
    policy = StopPolicy(grace=0.2, term_grace=0.3, kill_grace=2.0)
    asked: list[str] = []

    async def ignored_cancel() -> None:
        asked.append("cancel")

    async with open_worker((sys.executable, "-c", IGNORE_TERM), policy=policy) as worker:
        assert await worker.receive() == {"type": "ready"}
        report = await worker.stop(ignored_cancel)
        assert process_gone(worker.info)
    assert asked == ["cancel"]
    assert report.stage == "killed"
    assert report.returncode == -9
    assert isinstance(report.escalation, WorkerStopTimeout)
    assert report.escalation.details["next"] == "SIGKILL"


async def test_stop_ladder_sigterm_is_enough_for_a_polite_process(tmp_path: Path) -> None:
    """A worker that honours SIGTERM stops at the terminate step."""
    policy = StopPolicy(grace=0.1, term_grace=2.0, kill_grace=2.0)
    async with open_worker(
        (sys.executable, "-c", "import time; time.sleep(60)"), policy=policy
    ) as w:
        report = await w.stop()
    assert report.stage == "terminated"
    assert report.returncode == -15
    assert isinstance(report.escalation, WorkerStopTimeout)


async def test_cooperative_stop_needs_no_signal(tmp_path: Path) -> None:
    """A local worker asked to cancel exits within the grace: no escalation."""
    async with local_worker(tmp_path) as worker:

        async def cancel() -> None:
            await worker.send({"type": "cancel"})

        report = await worker.stop(cancel)
    assert report.stage == "cooperative"
    assert report.returncode == 0
    assert report.escalation is None


async def test_owner_cancellation_kills_the_whole_group() -> None:
    """Cancelling the owning task kills the worker and everything in its process group."""
    script = 'sleep 30 & echo "{\\"type\\": \\"child\\", \\"pid\\": $!}"; sleep 30'
    infos: list[ProcessInfo] = []
    child: list[int] = []
    with trio.move_on_after(5) as scope:
        async with open_worker(("sh", "-c", script), policy=FAST) as worker:
            infos.append(worker.info)
            message = await worker.receive()
            assert message is not None
            child.append(message["pid"])
            scope.cancel(reason="owner cancelled")
            await trio.sleep_forever()
    assert scope.cancelled_caught
    assert process_gone(infos[0])
    await wait_gone(child[0])


async def test_process_identity_and_own_group() -> None:
    """A worker leads its own process group and is named by pid and creation time."""
    async with open_worker((sys.executable, "-c", "pass"), policy=FAST) as worker:
        info = worker.info
        assert info.pgid == info.pid
        assert info.command == (sys.executable, "-c", "pass")
        assert info.create_time == pytest.approx(psutil.Process(info.pid).create_time())
        with trio.fail_after(5):
            await worker.wait()
    assert process_gone(info)


async def test_stderr_log_keeps_the_tail() -> None:
    """stderr is kept as a bounded log of its most recent bytes."""
    script = "import sys\nsys.stderr.write('a' * 200000 + 'THE END')\n"
    async with open_worker((sys.executable, "-c", script), log_limit=1024, policy=FAST) as worker:
        with trio.fail_after(5):
            await worker.wait()
    assert len(worker.log.tail()) == 1024
    assert worker.log.text().endswith("THE END")
    assert worker.log.dropped == 200007 - 1024


async def test_overlong_line_is_refused() -> None:
    """A stdout line past the reader's bound raises WorkerLineTooLong."""
    script = "print('{\"type\": \"' + 'x' * 5000 + '\"}', flush=True)"
    async with open_worker((sys.executable, "-c", script), max_line=1000, policy=FAST) as worker:
        with pytest.raises(WorkerLineTooLong):
            await worker.receive()


async def test_unstartable_worker(tmp_path: Path) -> None:
    """A program that cannot be started raises WorkerStartFailed."""
    with pytest.raises(WorkerStartFailed):
        async with open_worker((str(tmp_path / "missing"),)):
            pass


async def test_concurrent_writer_is_a_session_conflict(tmp_path: Path) -> None:
    """A session changed by someone else during a turn gets no reply appended."""
    first = (await one_turn(tmp_path, "one"))[-1]
    path = session_path(tmp_path / "sessions", first["sessionId"])
    session = {
        "id": first["sessionId"],
        "expectedBoundary": first["sessionBoundary"],
        "expectedDigest": None,
    }
    async with local_worker(tmp_path) as worker:
        await worker.send(
            start(
                tmp_path,
                "?sleep 0.3",
                userMessageId="msg_u2",
                assistantMessageId="msg_a2",
                session=session,
            )
        )
        assert (await worker.receive() or {})["type"] == "session"
        with path.open("ab") as handle:
            handle.write(b'{"messageId":"msg_x","role":"user","text":"sneaky"}\n')
        messages = await until_done(worker)
    (error,) = of_type(messages, "error")
    assert error["code"] == "session_conflict"
    assert messages[-1]["outcome"] == "failed"
    assert messages[-1]["sessionBoundary"] == "msg_x"
    assert [line.message_id for line in read_session(path).lines][-2:] == ["msg_u2", "msg_x"]


def test_public_names_are_exported_once() -> None:
    """Every name in the workers package's __all__ exists and appears once."""
    import braid_actors.workers as package

    assert len(package.__all__) == len(set(package.__all__))
    assert all(hasattr(package, name) for name in package.__all__)


def test_worker_program_loads_no_supervisor_side() -> None:
    """The worker program's start-up loads none of the supervisor's modules (psutil, the
    observation hub, the controls): 500 workers starting at once paid for them in CPU."""
    watched = (
        "psutil",
        "braid_actors.workers._controls",
        "braid_actors.workers._hub",
        "braid_actors.workers._process",
    )
    assert loaded_after(("braid_actors.workers.local",), watched) == []
