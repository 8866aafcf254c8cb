"""Application actions: the one place each command is implemented.

Headless, the daemon socket, the demo and (later) the TUI call :func:`call`, which parses
the params into a typed object (unknown keys, missing or mistyped values are
``invalid_params``), runs the handler, and returns a JSON-compatible result. Mutating
handlers go through :meth:`BraidApp.mutate`, so every one of them is idempotent under its
``operationId``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
import cattrs
import trio

from braid_actors import graph
from braid_actors.app import _run_actions as _runs
from braid_actors.app._service import APP_VERSION, PROTOCOL_VERSION, BraidApp
from braid_actors.app._session_actions import CloseSessionParams, close_session
from braid_actors.app._views import (
    conversation_summary,
    conversation_view,
    graph_view,
    run_record,
)
from braid_actors.app._wire import to_wire, wire
from braid_actors.errors import BadRequest, UnknownCommand
from braid_actors.journal import Operation
from braid_actors.model import Part, digest, structure_error
from braid_actors.providers import InteractionAnswer

# ---- params ----------------------------------------------------------------------------


@attrs.frozen
class NoParams:
    pass


@attrs.frozen
class CreateConversationParams:
    workspace: str
    title: str | None = None
    profile_ref: str | None = None
    runner: str | None = None
    operation_id: str | None = None


@attrs.frozen
class SubmitTurnParams:
    branch_id: str
    text: str
    parts: tuple[Part, ...] = ()
    operation_id: str | None = None


@attrs.frozen
class WaitRunParams:
    run_id: str
    timeout_s: float = 60.0


@attrs.frozen
class ConversationParams:
    conversation_id: str


@attrs.frozen
class ListConversationsParams:
    workspace: str | None = None


@attrs.frozen
class BranchParams:
    branch_id: str
    through_message_id: str
    draft: str | None = None
    operation_id: str | None = None


@attrs.frozen
class CloneParams:
    branch_id: str
    title: str | None = None
    operation_id: str | None = None


@attrs.frozen
class Answer:
    allow: bool
    message: str | None = None


@attrs.frozen
class RespondInteractionParams:
    run_id: str
    interaction_id: str
    answer: Answer
    operation_id: str | None = None


@attrs.frozen
class ShutdownParams:
    drain: bool = True


# ---- handlers --------------------------------------------------------------------------


def _canonical(params: Any) -> dict[str, Any]:
    data: dict[str, Any] = to_wire(params)
    data.pop("operationId", None)
    return data


async def status(app: BraidApp, _p: NoParams) -> dict[str, Any]:
    return {
        "protocol": PROTOCOL_VERSION,
        "version": APP_VERSION,
        "journal": {"path": str(app.journal_path), "seq": app.admission.seq, "encrypted": True},
        "runners": [
            {"name": name, "available": p.available(), "capabilities": to_wire(p.capabilities)}
            for name, p in sorted(app.providers.items())
        ],
    }


async def create_conversation(app: BraidApp, p: CreateConversationParams) -> dict[str, Any]:
    workspace = p.workspace
    if not Path(workspace).is_absolute() or not await trio.Path(workspace).is_dir():
        raise BadRequest(
            "workspace must be an existing directory given as an absolute path",
            details={"field": "workspace"},
        )
    if p.runner is not None and p.runner not in app.providers:
        raise BadRequest(f"unknown runner {p.runner}", details={"field": "runner"})

    def build(op_id: str) -> tuple[Any, dict[str, Any]]:
        ev = graph.create_conversation(
            app.state,
            workspace=workspace,
            title=p.title,
            profile_ref=p.profile_ref,
            runner=p.runner,
            operation_id=op_id,
            at=app.clock(),
            ids=app.ids,
        )
        return ev, {
            "conversationId": ev.conversation.conversation_id,
            "branchId": ev.branch.branch_id,
        }

    return await app.mutate("create_conversation", _canonical(p), p.operation_id, build)


async def list_conversations(app: BraidApp, p: ListConversationsParams) -> dict[str, Any]:
    convs = sorted(
        app.state.conversations.values(), key=lambda c: (c.created_at, c.conversation_id)
    )
    return {
        "conversations": [
            conversation_summary(app.state, c.conversation_id)
            for c in convs
            if p.workspace is None or c.workspace == p.workspace
        ]
    }


async def get_conversation(app: BraidApp, p: ConversationParams) -> dict[str, Any]:
    return conversation_view(app.state, p.conversation_id)


async def get_graph(app: BraidApp, p: ConversationParams) -> dict[str, Any]:
    return graph_view(app.state, p.conversation_id)


async def submit_turn(app: BraidApp, p: SubmitTurnParams) -> dict[str, Any]:
    def build(op_id: str) -> tuple[Any, dict[str, Any]]:
        ev = graph.submit_turn(
            app.state,
            branch_id=p.branch_id,
            text=p.text,
            parts=p.parts,
            operation_id=op_id,
            at=app.clock(),
            ids=app.ids,
        )
        return ev, {"turnId": ev.turn.turn_id, "runId": ev.run.run_id}

    result = await app.mutate("submit_turn", _canonical(p), p.operation_id, build)
    run = app.run(result["runId"])
    # The position is live: it is the run's place in its branch queue now.
    result["queuePosition"] = graph.queue_position(app.state, run.branch_id, run.run_id)
    return result


async def wait_run(app: BraidApp, p: WaitRunParams) -> dict[str, Any]:
    app.run(p.run_id)
    if not 0 <= p.timeout_s <= 86_400:
        raise BadRequest("timeoutS must be between 0 and 86400", details={"field": "timeoutS"})
    with trio.move_on_after(p.timeout_s):
        while not graph.is_terminal(app.run(p.run_id).state):
            await app.changed()
    record = run_record(app.state, app.run(p.run_id))
    record["timedOut"] = not graph.is_terminal(app.run(p.run_id).state)
    return record


async def branch(app: BraidApp, p: BranchParams) -> dict[str, Any]:
    def build(op_id: str) -> tuple[Any, dict[str, Any]]:
        ev = graph.branch(
            app.state,
            branch_id=p.branch_id,
            through_message_id=p.through_message_id,
            draft=p.draft,
            operation_id=op_id,
            at=app.clock(),
            ids=app.ids,
        )
        return ev, {
            "branchId": ev.branch.branch_id,
            "edgeId": ev.edge.edge_id,
            "draft": ev.branch.draft,
        }

    return await app.mutate("branch", _canonical(p), p.operation_id, build)


async def clone(app: BraidApp, p: CloneParams) -> dict[str, Any]:
    def build(op_id: str) -> tuple[Any, dict[str, Any]]:
        ev = graph.clone(
            app.state,
            branch_id=p.branch_id,
            title=p.title,
            operation_id=op_id,
            at=app.clock(),
            ids=app.ids,
        )
        return ev, {
            "conversationId": ev.conversation.conversation_id,
            "branchId": ev.branch.branch_id,
            "edgeId": ev.edge.edge_id,
            "title": ev.conversation.title,
        }

    return await app.mutate("clone", _canonical(p), p.operation_id, build)


async def respond_interaction(app: BraidApp, p: RespondInteractionParams) -> dict[str, Any]:
    """Journal the (non-secret) answer under its operation, then hand it to the runner."""
    op_id = p.operation_id or app.ids("op")
    params = _canonical(p)
    params_digest = digest({"command": "respond_interaction", "params": params})
    result = {"runId": p.run_id, "interactionId": p.interaction_id, "operationId": op_id}
    if await app.journal.recorded(op_id, params_digest) is None:
        await app.runs.answer(
            p.run_id,
            p.interaction_id,
            InteractionAnswer(p.answer.allow, p.answer.message),
            op_id,
            Operation(op_id, "respond_interaction", params_digest, result),
        )
    run = app.run(p.run_id)
    found = next(i for i in run.interactions if i.interaction_id == p.interaction_id)
    return {**to_wire(found), **result}


async def shutdown(app: BraidApp, p: ShutdownParams) -> dict[str, Any]:
    await app.shutdown(drain=p.drain)
    return {"stopped": True}


# ---- the command table -----------------------------------------------------------------


@attrs.frozen
class Command:
    params: type[Any]
    handler: Callable[[BraidApp, Any], Awaitable[dict[str, Any]]]
    waits: bool = False
    """Long-waiting commands run concurrently instead of in arrival order."""


COMMANDS: Mapping[str, Command] = {
    "status": Command(NoParams, status),
    "create_conversation": Command(CreateConversationParams, create_conversation),
    "list_conversations": Command(ListConversationsParams, list_conversations),
    "get_conversation": Command(ConversationParams, get_conversation),
    "get_graph": Command(ConversationParams, get_graph),
    "submit_turn": Command(SubmitTurnParams, submit_turn),
    "wait_run": Command(WaitRunParams, wait_run, waits=True),
    "branch": Command(BranchParams, branch),
    "clone": Command(CloneParams, clone),
    "respond_interaction": Command(RespondInteractionParams, respond_interaction),
    "shutdown": Command(ShutdownParams, shutdown),
    "cancel_run": Command(_runs.CancelRunParams, _runs.cancel_run),
    "retry": Command(_runs.RetryParams, _runs.retry),
    "select_run": Command(_runs.SelectRunParams, _runs.select_run),
    "focus_run": Command(_runs.RunParams, _runs.focus_run),
    "set_run_override": Command(_runs.OverrideParams, _runs.set_run_override),
    "list_workers": Command(_runs.RunParams, _runs.list_workers),
    "steer_worker": Command(_runs.SteerWorkerParams, _runs.steer_worker),
    "cancel_worker": Command(_runs.CancelWorkerParams, _runs.cancel_worker),
    "close_session": Command(CloseSessionParams, close_session),
}


def parse(command: str, params: object) -> tuple[Command, Any]:
    """Look up a command and structure its params, or raise a stable bad-input error."""
    spec = COMMANDS.get(command)
    if spec is None:
        raise UnknownCommand(f"unknown command {command[:80]}", details={"command": command[:80]})
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise BadRequest("params must be a JSON object")
    try:
        return spec, wire().structure(params, spec.params)
    except (cattrs.BaseValidationError, ValueError, TypeError, KeyError) as exc:
        raise structure_error(exc) from None


async def call(app: BraidApp, command: str, params: object) -> dict[str, Any]:
    """Parse and run one command."""
    spec, parsed = parse(command, params)
    return await spec.handler(app, parsed)
