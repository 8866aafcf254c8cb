"""The provider contract: every adapter's capability claims checked against its behaviour.

The same test functions run, unchanged, against every adapter (``local``, ``claude_code``,
``codex``); the ``adapter`` fixture supplies a :class:`~tests.providers._contract.Harness`
that scripts turns for it. A claim that is made must hold; a claim that is not made must
not be contradicted by a silent success.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
import trio

from braid_actors.errors import BraidError
from braid_actors.model import ToolResultPart
from braid_actors.providers import (
    InteractionAnswer,
    ReconcileRequest,
    RunControl,
    SessionRequest,
    TurnResult,
)
from tests.providers._contract import (
    ADAPTERS,
    MARKER,
    Harness,
    RecordingSink,
    Say,
    Shell,
    Slow,
    context_of,
    open_harness,
)

USAGE_SOURCE = {"estimated": "estimate", "reported": "provider", "none": "none"}
"""The ``Usage.source`` each ``Capabilities.usage`` claim promises."""


@pytest.fixture(params=ADAPTERS)
async def adapter(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Harness]:
    async with open_harness(request.param, tmp_path) as harness:
        yield harness


async def test_a_text_turn_completes_with_claimed_usage_and_cost(adapter: Harness) -> None:
    caps = adapter.provider.capabilities
    adapter.script(Say("The lighthouse is lit."))
    sink = RecordingSink()
    result = await adapter.run(adapter.request(Say("The lighthouse is lit.")), sink)
    assert result.outcome == "completed", result.reason
    assert {s.session_id for s in sink.sessions} == {result.session_id}  # one session
    assert [s.resumed for s in sink.sessions] == [False] * len(sink.sessions)
    assert any("The lighthouse is lit." in text for text in sink.final_texts())
    assert result.usage.source == USAGE_SOURCE[caps.usage]
    assert (result.cost_usd is not None) == caps.cost
    if sink.usages:
        assert sink.usages[-1] == (result.usage, result.cost_usd)


async def test_sessions_continue_claim(adapter: Harness) -> None:
    caps = adapter.provider.capabilities
    adapter.script(Say("first answer"), Say("second answer"))
    first = await adapter.run(adapter.request(Say("first answer")), RecordingSink())
    assert first.outcome == "completed", first.reason
    assert first.session_id is not None
    proof = await adapter.provider.prove_session(first.session_id)
    if not caps.sessions_continue:
        assert not proof.available, "prove_session claims what sessions_continue denies"
        return
    assert proof.available, proof.reason
    assert proof.session_id == first.session_id
    assert proof.last_message_id == first.session_boundary is not None
    if first.session_digest is not None:
        assert proof.digest == first.session_digest

    wrong = SessionRequest(first.session_id, expected_boundary="msg_not_the_end")
    refused_sink = RecordingSink()
    refused = await adapter.run(adapter.request(Say("never"), session=wrong), refused_sink)
    assert refused.outcome == "failed"
    assert refused.reason is not None
    assert refused.reason.startswith("session_mismatch"), refused.reason
    assert not refused_sink.parts
    assert await adapter.provider.prove_session(first.session_id) == proof

    right = SessionRequest(first.session_id, first.session_boundary, first.session_digest)
    sink = RecordingSink()
    second = await adapter.run(adapter.request(Say("second answer"), session=right), sink)
    assert second.outcome == "completed", second.reason
    assert second.session_id == first.session_id
    assert sink.sessions
    assert all(s.session_id == first.session_id and s.resumed for s in sink.sessions)
    assert any("second answer" in text for text in sink.final_texts())
    after = await adapter.provider.prove_session(first.session_id)
    assert after.available
    assert after.last_message_id == second.session_boundary not in (None, first.session_boundary)

    stale = SessionRequest(first.session_id, first.session_boundary, first.session_digest)
    again = await adapter.run(adapter.request(Say("never"), session=stale), RecordingSink())
    assert again.outcome == "failed"
    assert again.reason is not None
    assert again.reason.startswith("session_mismatch"), again.reason
    assert await adapter.provider.prove_session(first.session_id) == after


async def test_portable_context_claim(adapter: Harness) -> None:
    caps = adapter.provider.capabilities
    context = context_of("Where is the lighthouse?", "On the northern cape.")
    adapter.script(Say("answer with context"))
    sink = RecordingSink()
    turn = adapter.request(Say("answer with context"), context=context)
    result = await adapter.run(turn, sink)
    if not caps.portable_context:
        assert result.outcome == "failed", "a context the adapter can't take was ignored"
        assert result.reason is not None
        assert result.reason.startswith("portable_context_unsupported"), result.reason
        assert not sink.sessions
        assert not sink.parts
        return
    assert result.outcome == "completed", result.reason
    assert result.session_id is not None
    assert sink.sessions
    assert all(s.session_id == result.session_id and not s.resumed for s in sink.sessions)
    assert any("answer with context" in text for text in sink.final_texts())
    given = adapter.model_input(result.session_id)
    assert "Where is the lighthouse?" in given
    assert "On the northern cape." in given


async def test_interaction_kinds_claim(adapter: Harness) -> None:
    caps = adapter.provider.capabilities
    adapter.script(Shell())
    sink = RecordingSink(answers=[InteractionAnswer(allow=False, message="Not in the contract.")])
    result = await adapter.run(adapter.request(Shell()), sink)
    assert result.outcome == "completed", result.reason
    undeclared = [i.kind for i in sink.interactions if i.kind not in caps.interaction_kinds]
    assert not undeclared, f"interactions of undeclared kinds: {undeclared}"
    if "permission" not in caps.interaction_kinds:
        return
    assert [i.kind for i in sink.interactions] == ["permission"]
    outcomes = [p for p in sink.final_parts() if isinstance(p, ToolResultPart)]
    assert [p.status for p in outcomes] == ["denied"]
    assert not (adapter.workspace / MARKER).exists()


async def test_cancel_is_answered_and_leaves_no_process(adapter: Harness) -> None:
    adapter.script(Slow())
    sink = RecordingSink()
    control = RunControl()
    results: list[TurnResult] = []

    async def turn() -> None:
        results.append(await adapter.run(adapter.request(Slow()), sink, control))

    began = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(turn)
        with trio.fail_after(30):
            await adapter.in_flight(sink)
        control.request_cancel("contract cancels")
    [result] = results
    assert trio.current_time() - began < 20  # it did not just run to its end
    assert sink.workers
    assert not sink.leftovers()
    assert result.cancel_acknowledged is not None
    if result.cancel_acknowledged:
        assert result.outcome == "cancelled", result.reason
    else:
        assert result.outcome != "completed"
    assert not any("too late" in text for text in sink.final_texts())


async def test_sessions_fork_claim(adapter: Harness) -> None:
    """A native fork is a new session holding the parent's history up to the proven
    boundary (the model is sent it once), the parent unchanged; no claim, no fork."""
    caps = adapter.provider.capabilities
    adapter.script(Say("first answer"), Say("forked answer"))
    first = await adapter.run(adapter.request(Say("first answer")), RecordingSink())
    assert first.outcome == "completed", first.reason
    assert first.session_id is not None
    before = await adapter.provider.prove_session(first.session_id)
    fork = SessionRequest(first.session_id, first.session_boundary, first.session_digest, True)
    sink = RecordingSink()
    forked = await adapter.run(adapter.request(Say("forked answer"), session=fork), sink)
    if not caps.sessions_fork:
        assert forked.outcome == "failed", "a fork the adapter does not claim was attempted"
        assert forked.reason is not None
        assert forked.reason.startswith("fork_unsupported"), forked.reason
        assert not sink.workers
        assert not sink.sessions
        assert not sink.parts
        return
    assert forked.outcome == "completed", forked.reason
    assert forked.session_id not in (None, first.session_id)
    assert [s.resumed for s in sink.sessions] == [False] * len(sink.sessions)
    assert any("forked answer" in text for text in sink.final_texts())
    given = adapter.model_input(forked.session_id or "")
    assert given.count("first answer") == 1  # the parent's history, once, natively
    assert await adapter.provider.prove_session(first.session_id) == before
    stale = SessionRequest(first.session_id, "msg_not_the_end", None, True)
    refused = await adapter.run(adapter.request(Say("never"), session=stale), RecordingSink())
    assert refused.outcome == "failed"
    assert refused.reason is not None
    assert refused.reason.startswith("session_mismatch"), refused.reason


async def test_reconcile_of_a_finished_turn_gives_what_was_streamed(adapter: Harness) -> None:
    """Reading a finished turn back from the runner's own record (as after a restart)
    gives its end, the same parts under the same ids, and the same usage and cost."""
    adapter.script(Shell())
    live = RecordingSink()
    turn = adapter.request(Shell())
    result = await adapter.run(turn, live)
    assert result.outcome == "completed", result.reason
    assert result.session_id is not None
    request = ReconcileRequest(
        run_id=turn.run_id,
        turn_id=turn.turn_id,
        workspace=turn.workspace,
        text=turn.text,
        session_id=result.session_id,
        trace_path=live.sessions[-1].trace_path,
        workers=tuple(live.workers),
    )
    sink = RecordingSink()
    with trio.fail_after(30):
        found = await adapter.provider.reconcile(request, sink)
    assert found.workers == "none"
    assert found.result is not None, found.reason
    assert found.result.outcome == "completed"
    assert found.result.session_id == result.session_id
    assert found.result.session_boundary == result.session_boundary
    assert sink.final_parts() == live.final_parts()
    assert found.result.usage == result.usage
    assert found.result.cost_usd == result.cost_usd


async def test_close_session_releases_without_touching_the_record(adapter: Harness) -> None:
    """Closing reports what was released; the runner's own record is left as it was (it is
    the user's), and a malformed session id is refused with a stable code."""
    adapter.script(Say("an answer"))
    result = await adapter.run(adapter.request(Say("an answer")), RecordingSink())
    assert result.outcome == "completed", result.reason
    assert result.session_id is not None
    before = await adapter.provider.prove_session(result.session_id)
    closed = await adapter.provider.close_session(result.session_id)
    assert closed.session_id == result.session_id
    assert closed.released is False  # none of the three keeps a server-side session
    assert closed.detail
    assert await adapter.provider.prove_session(result.session_id) == before
    with pytest.raises(BraidError) as refused:
        await adapter.provider.close_session("../not-a-session")
    assert refused.value.code == "invalid_request"


async def test_available_and_uniquely_named(adapter: Harness, tmp_path: Path) -> None:
    assert adapter.provider.available()
    async with AsyncExitStack() as stack:
        names = [
            (await stack.enter_async_context(open_harness(name, tmp_path / name))).provider.name
            for name in ADAPTERS
        ]
    assert names.count(adapter.provider.name) == 1
    assert len(set(names)) == len(ADAPTERS)
