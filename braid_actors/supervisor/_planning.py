"""Planning a dispatch: session choice, portable context, the exact request and its receipt."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from braid_actors import graph
from braid_actors.model import Limits, Part, ProviderBinding, SessionMode, converter, digest
from braid_actors.providers import (
    ContextMessage,
    PortableContext,
    Provider,
    SessionRequest,
    TurnRequest,
)
from braid_actors.supervisor._fork_plan import plan_fork

if TYPE_CHECKING:
    from braid_actors.graph import GraphState

PROOF_DEADLINE = 10.0


def portable_context(state: GraphState, branch_id: str, before: list[str]) -> PortableContext:
    """Canonical context of the messages ``before`` (ordered, typed parts, digest)."""
    messages = tuple(
        ContextMessage(mid, state.messages[mid].role, state.messages[mid].parts) for mid in before
    )
    complete = all(state.messages[mid].completeness.state == "complete" for mid in before)
    through = before[-1] if before else None
    source_conversation = state.branches[branch_id].conversation_id
    body: dict[str, Any] = {
        "sourceConversationId": source_conversation,
        "sourceBranchId": branch_id,
        "throughMessageId": through,
        "messages": [converter().unstructure(m) for m in messages],
        "complete": complete,
    }
    return PortableContext(
        source_conversation, branch_id, through, messages, complete, digest(body)
    )


async def plan_session(
    provider: Provider,
    binding: ProviderBinding | None,
    boundary: str | None,
    preference: str,
) -> tuple[SessionMode, SessionRequest]:
    """Continue only on a matching proof; otherwise a fresh session with copied context."""
    if (
        preference == "reuse"
        and binding is not None
        and binding.state == "bound"
        and binding.session_id is not None
        and binding.runner == provider.name
        and provider.capabilities.sessions_continue
        and binding.boundary_message_id == boundary
    ):
        native = binding.native_boundary or binding.boundary_message_id
        with trio.move_on_after(PROOF_DEADLINE):
            proof = await provider.prove_session(binding.session_id)
            if (
                proof.available
                and proof.last_message_id == native
                and (binding.session_digest is None or proof.digest == binding.session_digest)
            ):
                return "continued", SessionRequest(
                    binding.session_id, native, binding.session_digest
                )
    # No proof, a mismatch, or nothing to continue: a fresh session with copied context.
    return ("new" if boundary is None else "handed_off"), SessionRequest()


# ---- the run -------------------------------------------------------------------------


async def prepare_request(
    state: GraphState, run_id: str, limits: Limits, provider: Provider
) -> tuple[TurnRequest, SessionMode, str]:
    """The exact request for this run, its session mode and its receipt digest.

    Deterministic for a given graph state and session proof, so a dispatch resumed
    after a restart can prove it sends the very request whose intent was committed.
    """
    run = state.runs[run_id]
    branch = state.branches[run.branch_id]
    conv = state.conversations[run.conversation_id]
    turn = state.turns[run.turn_id]
    history = graph.history(state, branch.branch_id)
    before = (
        history[: history.index(turn.user_message_id)]
        if turn.user_message_id in history
        else history
    )
    boundary = before[-1] if before else None
    mode, session = await plan_session(provider, branch.binding, boundary, run.session_preference)
    if mode != "continued":
        fork = await plan_fork(state, branch, provider, boundary, run.session_preference)
        if fork is not None:
            mode, session = "forked", fork
    native = mode in ("continued", "forked")
    context = None if native else portable_context(state, branch.branch_id, before)
    user = state.messages[turn.user_message_id]
    workspace = conv.workspace
    if branch.environment_id is not None:
        workspace = state.environments[branch.environment_id].workspace
    request_body: dict[str, Any] = {
        "runId": run_id,
        "turnId": run.turn_id,
        "runner": run.runner,
        "model": run.model,
        "workspace": workspace,
        "session": converter().unstructure(session),
        "contextDigest": context.digest if context else None,
        "inputDigest": digest(converter().unstructure(user.parts, tuple[Part, ...])),
        "limits": converter().unstructure(limits),
    }
    request = TurnRequest(
        run_id=run_id,
        turn_id=run.turn_id,
        workspace=Path(workspace),
        user_message_id=user.message_id,
        assistant_message_id=run.assistant_message_id or "",
        text="\n".join(p.text for p in user.parts if p.kind == "text"),
        session=session,
        context=context,
        model=run.model,
    )
    return request, mode, digest(request_body)
