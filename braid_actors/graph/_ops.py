"""Pure builders: from a state and a request to the event(s) that carry it out.

The application calls these (and only these) to turn a command into events; the CF-01
property test drives the very same builders. They check what they can up front so a bad
request fails with a plain error before any event exists, and ``apply`` re-checks the
result, so a forged or replayed event can't bypass the rules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from braid_actors.errors import BadRequest, MissingBoundary, UnknownTurn
from braid_actors.graph._queries import get_branch, get_conversation, history, tip
from braid_actors.model import (
    Boundary,
    Branch,
    BranchCreated,
    Completeness,
    ConversationCloned,
    ConversationCreated,
    Edge,
    EdgeKind,
    Environment,
    IdSource,
    Message,
    Part,
    ProviderBinding,
    Run,
    RunAdmitted,
    RunDispatched,
    RunRetried,
    SessionMode,
    TextPart,
    Turn,
    TurnSubmitted,
    digest,
    format_time,
)
from braid_actors.model import Conversation as ConversationRecord

if TYPE_CHECKING:
    from collections.abc import Sequence
    from datetime import datetime

    from braid_actors.graph._state import GraphState

DEFAULT_RUNNER = "local"
MAX_TITLE = 200


def make_edge(
    ids: IdSource,
    kind: EdgeKind,
    source_id: str,
    destination_id: str,
    operation_id: str,
    at: datetime,
    facts: dict[str, Any] | None = None,
) -> Edge:
    """An edge with its provenance receipt (digest of the facts that justify it)."""
    receipt = digest(
        {
            "kind": kind,
            "source": source_id,
            "destination": destination_id,
            "operation": operation_id,
            "at": format_time(at),
            "facts": facts or {},
        }
    )
    return Edge(ids("edge"), kind, source_id, destination_id, operation_id, at, receipt)


def effective_runner(state: GraphState, branch: Branch) -> str:
    """Branch override, then the branch's binding, then the built-in default."""
    if branch.overrides.runner is not None:
        return branch.overrides.runner
    if branch.binding is not None:
        return branch.binding.runner
    return DEFAULT_RUNNER


def _fresh_binding(runner: str) -> ProviderBinding:
    return ProviderBinding(runner=runner, state="unbound")


def create_conversation(
    state: GraphState,
    *,
    workspace: str,
    title: str | None,
    profile_ref: str | None,
    runner: str | None,
    operation_id: str,
    at: datetime,
    ids: IdSource,
) -> ConversationCreated:
    """A conversation, its first branch, and the workspace's environment (reused if known)."""
    if not workspace.startswith("/"):
        raise BadRequest("workspace must be an absolute path", details={"field": "workspace"})
    conv_id, branch_id = ids("conv"), ids("br")
    env = next(
        (
            e
            for e in sorted(state.environments.values(), key=lambda e: e.environment_id)
            if e.provider == "local_directory"
            and e.workspace == workspace
            and e.lifecycle == "active"
        ),
        None,
    )
    new_env = None
    if env is None:
        new_env = Environment(
            environment_id=ids("env"),
            provider="local_directory",
            workspace=workspace,
            placement={"kind": "local", "path": workspace},
        )
    environment_id = (env or new_env).environment_id  # type: ignore[union-attr]
    branch = Branch(
        branch_id=branch_id,
        conversation_id=conv_id,
        created_at=at,
        source=None,
        profile_ref=profile_ref,
        binding=_fresh_binding(runner or DEFAULT_RUNNER),
        environment_id=environment_id,
    )
    conv = ConversationRecord(
        conversation_id=conv_id,
        workspace=workspace,
        title=(title or "Untitled conversation")[:MAX_TITLE],
        created_at=at,
        active_branch_id=branch_id,
        profile_ref=profile_ref,
    )
    return ConversationCreated(conv, branch, new_env, operation_id, at)


def submit_turn(
    state: GraphState,
    *,
    branch_id: str,
    text: str,
    parts: Sequence[Part] = (),
    operation_id: str,
    at: datetime,
    ids: IdSource,
) -> TurnSubmitted:
    """A user message, its turn, and one queued run on the branch."""
    branch = get_branch(state, branch_id)
    if not text and not parts:
        raise BadRequest("a turn needs text or parts", details={"field": "text"})
    msg_id, turn_id, run_id = ids("msg"), ids("turn"), ids("run")
    all_parts: list[Part] = []
    if text:
        all_parts.append(TextPart(part_id=f"{msg_id}.p0", text=text))
    all_parts.extend(parts)
    message = Message(
        message_id=msg_id,
        conversation_id=branch.conversation_id,
        branch_id=branch_id,
        role="user",
        parts=tuple(all_parts),
        created_at=at,
        updated_at=at,
        completeness=Completeness(state="complete"),
    )
    previous = [t for t in state.turns.values() if t.branch_id == branch_id]
    source = max(previous, key=lambda t: (t.created_at, t.turn_id)).turn_id if previous else None
    edge = make_edge(ids, "continued", source or branch_id, turn_id, operation_id, at)
    run = Run(
        run_id=run_id,
        turn_id=turn_id,
        conversation_id=branch.conversation_id,
        branch_id=branch_id,
        runner=effective_runner(state, branch),
        model=branch.overrides.model,
        state="queued",
        created_at=at,
    )
    turn = Turn(
        turn_id=turn_id,
        conversation_id=branch.conversation_id,
        branch_id=branch_id,
        user_message_id=msg_id,
        created_at=at,
        run_ids=(run_id,),
    )
    return TurnSubmitted(turn, message, run, edge, operation_id, at)


def _text_of(message: Message) -> str:
    return "\n".join(p.text for p in message.parts if isinstance(p, TextPart))


def branch(
    state: GraphState,
    *,
    branch_id: str,
    through_message_id: str,
    draft: str | None,
    operation_id: str,
    at: datetime,
    ids: IdSource,
) -> BranchCreated:
    """``/branch`` at a message of ``branch_id``.

    At an assistant or system message the new branch's context runs through that message
    and the composer starts empty. At a user message the user is editing that input: the
    context runs through the message before it and the draft is the user's text. An
    explicit ``draft`` replaces the default in both cases.
    """
    source = get_branch(state, branch_id)
    visible = history(state, branch_id)
    if through_message_id not in visible:
        raise MissingBoundary(
            f"message {through_message_id} is not on branch {branch_id}",
            details={"branchId": branch_id, "messageId": through_message_id},
        )
    selected = state.messages[through_message_id]
    if selected.role == "user":
        index = visible.index(through_message_id)
        through = visible[index - 1] if index > 0 else None
        default_draft = _text_of(selected)
    else:
        through = through_message_id
        default_draft = ""
    new_id = ids("br")
    new_branch = Branch(
        branch_id=new_id,
        conversation_id=source.conversation_id,
        created_at=at,
        source=Boundary(branch_id, through, through_message_id),
        profile_ref=source.profile_ref,
        connection=source.connection,
        overrides=source.overrides,
        binding=_fresh_binding(effective_runner(state, source)),
        environment_id=source.environment_id,
        draft=default_draft if draft is None else draft,
    )
    edge = make_edge(
        ids,
        "branched_at",
        through_message_id,
        new_id,
        operation_id,
        at,
        {"sourceBranchId": branch_id, "throughMessageId": through},
    )
    return BranchCreated(new_branch, edge, operation_id, at)


def clone_title(state: GraphState, workspace: str, title: str) -> str:
    """``<title> (clone)``, or ``(clone N)`` when that title is taken in the workspace."""
    taken = {c.title for c in state.conversations.values() if c.workspace == workspace}
    candidate, n = f"{title} (clone)", 2
    while candidate in taken:
        candidate, n = f"{title} (clone {n})", n + 1
    return candidate[:MAX_TITLE]


def clone(
    state: GraphState,
    *,
    branch_id: str,
    title: str | None,
    operation_id: str,
    at: datetime,
    ids: IdSource,
) -> ConversationCloned:
    """``/clone``: a new conversation through the branch's current tip, fresh session."""
    source = get_branch(state, branch_id)
    conv = get_conversation(state, source.conversation_id)
    through = tip(state, branch_id)
    conv_id, new_branch_id = ids("conv"), ids("br")
    new_branch = Branch(
        branch_id=new_branch_id,
        conversation_id=conv_id,
        created_at=at,
        source=Boundary(branch_id, through, through),
        profile_ref=source.profile_ref,
        connection=source.connection,
        overrides=source.overrides,
        binding=_fresh_binding(effective_runner(state, source)),
        environment_id=source.environment_id,
    )
    new_conv = ConversationRecord(
        conversation_id=conv_id,
        workspace=conv.workspace,
        title=title[:MAX_TITLE] if title else clone_title(state, conv.workspace, conv.title),
        created_at=at,
        active_branch_id=new_branch_id,
        profile_ref=conv.profile_ref,
        retention=conv.retention,
    )
    edge = make_edge(
        ids,
        "cloned_from",
        branch_id,
        conv_id,
        operation_id,
        at,
        {"throughMessageId": through, "sourceConversationId": conv.conversation_id},
    )
    return ConversationCloned(new_conv, new_branch, edge, operation_id, at)


def next_admissions(
    state: GraphState, *, at: datetime, limit: int | None = None
) -> list[RunAdmitted]:
    """Runs that can be admitted now: the head of every idle branch's queue.

    Fair order across branches: the branch whose head has waited longest goes first.
    ``limit`` caps how many more runs may become active (a global admission limit).
    """
    heads = [
        state.runs[queue[0]]
        for branch_id, queue in state.queues.items()
        if queue and branch_id not in state.active
    ]
    heads.sort(key=lambda r: (r.created_at, r.run_id))
    if limit is not None:
        heads = heads[: max(0, limit)]
    return [RunAdmitted(r.conversation_id, r.run_id, at) for r in heads]


def dispatch(
    state: GraphState,
    *,
    run_id: str,
    receipt: str,
    session_mode: SessionMode,
    at: datetime,
    ids: IdSource,
    handed_from: str | None = None,
) -> RunDispatched:
    """The dispatch intent of an admitted run, with the empty reply message it will fill."""
    run = state.runs[run_id]
    msg_id = ids("msg")
    reply = Message(
        message_id=msg_id,
        conversation_id=run.conversation_id,
        branch_id=run.branch_id,
        role="assistant",
        parts=(),
        created_at=at,
        updated_at=at,
        completeness=Completeness(state="streaming", last_event_seq=0),
        source_run_id=run_id,
    )
    edge = None
    if session_mode == "handed_off" and handed_from is not None:
        edge = make_edge(
            ids,
            "handed_off",
            handed_from,
            run_id,
            run_id,
            at,
            {"runner": run.runner, "receipt": receipt},
        )
    return RunDispatched(run.conversation_id, run_id, receipt, session_mode, reply, at, edge)


def retry(
    state: GraphState,
    *,
    turn_id: str,
    session: Literal["reuse", "fresh"],
    runner: str | None,
    model: str | None,
    operation_id: str,
    at: datetime,
    ids: IdSource,
) -> RunRetried:
    """A new queued run for ``turn_id`` after its last run ended (kept, with its output)."""
    turn = state.turns.get(turn_id)
    if turn is None:
        raise UnknownTurn(f"no turn {turn_id}", details={"turnId": turn_id})
    last = state.runs[turn.run_ids[-1]]
    branch = get_branch(state, turn.branch_id)
    run_id = ids("run")
    run = Run(
        run_id=run_id,
        turn_id=turn_id,
        conversation_id=turn.conversation_id,
        branch_id=turn.branch_id,
        runner=runner or effective_runner(state, branch),
        model=model if model is not None else last.model,
        state="queued",
        created_at=at,
        session_preference=session,
    )
    edge = make_edge(
        ids,
        "retried",
        last.run_id,
        run_id,
        operation_id,
        at,
        {"previousState": last.state, "session": session},
    )
    return RunRetried(turn.conversation_id, turn_id, run, edge, operation_id, at)
