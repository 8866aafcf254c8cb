"""The graph's rules one by one: branch, clone, queues, run transitions, integrity codes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import attrs
import pytest

from braid_actors import graph
from braid_actors.errors import BraidError
from braid_actors.graph import RUN_TRANSITIONS, GraphState
from braid_actors.model import (
    TERMINAL_RUN_STATES,
    CountingIds,
    Edge,
    Environment,
    EnvironmentBound,
    Interaction,
    Outcome,
    ProviderBinding,
    RunFinished,
    RunInteractionRequested,
    RunPartUpdated,
    TerminalState,
    TextPart,
    Usage,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)


class G:
    """A small graph driver over the pure builders."""

    def __init__(self) -> None:
        self.s = GraphState()
        self.ids = CountingIds()
        self.t = T0

    def at(self) -> datetime:
        self.t += timedelta(seconds=1)
        return self.t

    def conversation(self, workspace: str = "/w/a", title: str = "Fix the build") -> str:
        ev = graph.create_conversation(
            self.s,
            workspace=workspace,
            title=title,
            profile_ref="prof_1",
            runner=None,
            operation_id="op_c",
            at=self.at(),
            ids=self.ids,
        )
        graph.apply(self.s, ev)
        return ev.branch.branch_id

    def turn(self, branch_id: str, text: str, *, finish: bool = True) -> tuple[str, str]:
        ev = graph.submit_turn(
            self.s,
            branch_id=branch_id,
            text=text,
            operation_id="op_t",
            at=self.at(),
            ids=self.ids,
        )
        graph.apply(self.s, ev)
        run_id = ev.run.run_id
        if finish:
            self.run_to_end(run_id, "succeeded")
        return ev.message.message_id, run_id

    def start(self, run_id: str) -> None:
        """Admit what can be admitted and dispatch ``run_id``."""
        for adm in graph.next_admissions(self.s, at=self.at()):
            graph.apply(self.s, adm)
        graph.apply(
            self.s,
            graph.dispatch(
                self.s,
                run_id=run_id,
                receipt="sha256:" + "1" * 64,
                session_mode="new",
                at=self.at(),
                ids=self.ids,
            ),
        )

    def run_to_end(self, run_id: str, end: TerminalState = "succeeded") -> None:
        self.start(run_id)
        run = self.s.runs[run_id]
        assert run.assistant_message_id is not None
        graph.apply(
            self.s,
            RunPartUpdated(
                run.conversation_id,
                run_id,
                run.assistant_message_id,
                TextPart(f"{run.assistant_message_id}.p0", "reply"),
                self.at(),
            ),
        )
        binding = ProviderBinding("local", "bound", "sess_1", run.assistant_message_id)
        graph.apply(
            self.s,
            RunFinished(
                run.conversation_id,
                run_id,
                end,
                Outcome("completed"),
                Usage(),
                0.0,
                binding,
                self.at(),
            ),
        )


def test_branch_at_assistant_message_links_ancestry_without_copying() -> None:
    """/branch at an assistant message: new id, fresh binding, shared env, empty draft."""
    g = G()
    b0 = g.conversation()
    g.turn(b0, "one")
    g.turn(b0, "two")
    first_reply = graph.history(g.s, b0)[1]
    messages_before = len(g.s.messages)
    ev = graph.branch(
        g.s,
        branch_id=b0,
        through_message_id=first_reply,
        draft=None,
        operation_id="op_b",
        at=g.at(),
        ids=g.ids,
    )
    graph.apply(g.s, ev)
    nb = g.s.branches[ev.branch.branch_id]
    assert nb.branch_id != b0
    assert graph.history(g.s, nb.branch_id) == graph.history(g.s, b0)[:2]
    assert len(g.s.messages) == messages_before  # linked, not duplicated
    assert nb.binding == ProviderBinding("local", "unbound")
    source_binding = g.s.branches[b0].binding
    assert source_binding is not None
    assert source_binding.state == "bound"
    assert nb.environment_id is not None
    assert nb.environment_id == g.s.branches[b0].environment_id
    assert g.s.environments[nb.environment_id].confidentiality == {}  # no isolation claim
    assert nb.draft == ""
    assert nb.profile_ref == "prof_1"
    edge = g.s.edges[ev.edge.edge_id]
    assert (edge.kind, edge.source_id, edge.destination_id) == (
        "branched_at",
        first_reply,
        nb.branch_id,
    )
    assert edge.operation_id == "op_b" and edge.receipt.startswith("sha256:")


def test_branch_at_user_message_edits_it() -> None:
    """/branch at a user message: context ends before it and the draft holds its text."""
    g = G()
    b0 = g.conversation()
    g.turn(b0, "one")
    second_user, _ = g.turn(b0, "please fix tests")
    ev = graph.branch(
        g.s,
        branch_id=b0,
        through_message_id=second_user,
        draft=None,
        operation_id="op_b",
        at=g.at(),
        ids=g.ids,
    )
    graph.apply(g.s, ev)
    assert ev.branch.draft == "please fix tests"
    assert graph.history(g.s, ev.branch.branch_id) == graph.history(g.s, b0)[:2]
    explicit = graph.branch(
        g.s,
        branch_id=b0,
        through_message_id=second_user,
        draft="other",
        operation_id="op_c",
        at=g.at(),
        ids=g.ids,
    )
    assert explicit.branch.draft == "other"


def test_branch_does_not_inherit_queued_or_pending_work() -> None:
    """Queued turns and pending interactions after the boundary stay on the source."""
    g = G()
    b0 = g.conversation()
    g.turn(b0, "one")
    _, running = g.turn(b0, "two", finish=False)
    g.start(running)
    graph.apply(
        g.s,
        RunInteractionRequested(
            g.s.runs[running].conversation_id,
            running,
            Interaction("int_1", "permission", {"command": "ls"}, "pending", g.at()),
            g.at(),
        ),
    )
    _, queued = g.turn(b0, "three", finish=False)
    boundary = graph.history(g.s, b0)[1]
    ev = graph.branch(
        g.s,
        branch_id=b0,
        through_message_id=boundary,
        draft=None,
        operation_id="op_b",
        at=g.at(),
        ids=g.ids,
    )
    graph.apply(g.s, ev)
    nb = ev.branch.branch_id
    assert g.s.queues.get(nb, []) == []
    assert nb not in g.s.active
    assert all(r.branch_id != nb for r in g.s.runs.values())
    assert g.s.queues[b0] == [queued]
    assert g.s.turns[g.s.runs[queued].turn_id].queue_position == 1


def test_branch_through_streaming_message_is_refused() -> None:
    """A boundary through a reply that is still streaming is refused (not presented as complete)."""
    g = G()
    b0 = g.conversation()
    _, run_id = g.turn(b0, "one", finish=False)
    g.start(run_id)
    reply = g.s.runs[run_id].assistant_message_id
    assert reply is not None
    ev = graph.branch(
        g.s,
        branch_id=b0,
        through_message_id=reply,
        draft=None,
        operation_id="op_b",
        at=g.at(),
        ids=g.ids,
    )
    with pytest.raises(BraidError) as caught:
        graph.apply(g.s, ev)
    assert caught.value.code == "missing_boundary"


def test_clone_new_conversation_through_tip_with_suffix() -> None:
    """/clone: new conversation and branch ids, tip boundary, fresh session, title suffix."""
    g = G()
    b0 = g.conversation(title="Refactor")
    g.turn(b0, "one")
    _, queued = g.turn(b0, "two", finish=False)
    source_conv = g.s.branches[b0].conversation_id
    tip = graph.tip(g.s, b0)
    ev = graph.clone(g.s, branch_id=b0, title=None, operation_id="op_k", at=g.at(), ids=g.ids)
    graph.apply(g.s, ev)
    conv, nb = ev.conversation, ev.branch
    assert conv.conversation_id != source_conv and nb.branch_id != b0
    assert conv.title == "Refactor (clone)"
    assert graph.history(g.s, nb.branch_id) == graph.history(g.s, b0)
    assert nb.source is not None and nb.source.through_message_id == tip
    assert nb.binding == ProviderBinding("local", "unbound")
    assert nb.environment_id == g.s.branches[b0].environment_id
    assert nb.profile_ref == g.s.branches[b0].profile_ref
    assert g.s.queues.get(nb.branch_id, []) == [] and queued in g.s.queues[b0]
    edge = ev.edge
    assert (edge.kind, edge.source_id, edge.destination_id) == (
        "cloned_from",
        b0,
        conv.conversation_id,
    )
    again = graph.clone(g.s, branch_id=b0, title=None, operation_id="op_k2", at=g.at(), ids=g.ids)
    assert again.conversation.title == "Refactor (clone 2)"


def test_turns_queue_per_branch_with_positions_and_continued_edges() -> None:
    """Later turns queue behind the active run with visible positions; edges chain turns."""
    g = G()
    b0 = g.conversation()
    _, r1 = g.turn(b0, "a", finish=False)
    _, r2 = g.turn(b0, "b", finish=False)
    _, r3 = g.turn(b0, "c", finish=False)
    admitted = graph.next_admissions(g.s, at=g.at())
    assert [a.run_id for a in admitted] == [r1]
    graph.apply(g.s, admitted[0])
    assert graph.next_admissions(g.s, at=g.at()) == []
    positions = [g.s.turns[g.s.runs[r].turn_id].queue_position for r in (r1, r2, r3)]
    assert positions == [None, 1, 2]
    continued = [e for e in g.s.edges.values() if e.kind == "continued"]
    t1, t2, t3 = (g.s.runs[r].turn_id for r in (r1, r2, r3))
    assert {(e.source_id, e.destination_id) for e in continued} == {
        (b0, t1),
        (t1, t2),
        (t2, t3),
    }


def test_admission_limit_and_fair_order_across_branches() -> None:
    """The oldest waiting branch head goes first and the limit caps admissions."""
    g = G()
    a = g.conversation()
    b = g.conversation(workspace="/w/b")
    _, ra = g.turn(a, "a", finish=False)
    _, rb = g.turn(b, "b", finish=False)
    assert [x.run_id for x in graph.next_admissions(g.s, at=g.at(), limit=1)] == [ra]
    assert [x.run_id for x in graph.next_admissions(g.s, at=g.at())] == [ra, rb]


def test_run_transition_table_is_closed_and_terminal_states_are_final() -> None:
    """Every state has a row, terminal rows are empty, and illegal moves have stable codes."""
    assert set(RUN_TRANSITIONS) == {
        "queued",
        "admitted",
        "running",
        "blocked",
        "detached",
        "cancelling",
        "succeeded",
        "failed",
        "cancelled",
        "unknown",
    }
    for state in TERMINAL_RUN_STATES:
        assert RUN_TRANSITIONS[state] == {}  # type: ignore[index]
    with pytest.raises(BraidError) as illegal:
        graph.next_state("run_1", "queued", "dispatch")
    assert illegal.value.code == "illegal_transition"
    with pytest.raises(BraidError) as terminal:
        graph.next_state("run_1", "succeeded", "fail")
    assert terminal.value.code == "terminal_run_mutation"


def test_terminal_run_refuses_every_event() -> None:
    """A finished run can't stream, finish again, or ask anything."""
    g = G()
    b0 = g.conversation()
    _, run_id = g.turn(b0, "one")
    run = g.s.runs[run_id]
    before = graph.checksum(g.s)
    for ev in (
        RunPartUpdated(
            run.conversation_id, run_id, run.assistant_message_id or "", TextPart("p", "x"), g.at()
        ),
        RunFinished(
            run.conversation_id, run_id, "failed", Outcome("failed"), Usage(), None, None, g.at()
        ),
        RunInteractionRequested(
            run.conversation_id,
            run_id,
            Interaction("int_9", "permission", {}, "pending", g.at()),
            g.at(),
        ),
    ):
        with pytest.raises(BraidError) as caught:
            graph.apply(g.s, ev)
        assert caught.value.code == "terminal_run_mutation"
    assert graph.checksum(g.s) == before


def test_cross_workspace_binding_needs_an_explicit_edge() -> None:
    """An environment of another workspace binds only with a forked_environment edge."""
    g = G()
    b0 = g.conversation("/w/a")
    conv = g.s.branches[b0].conversation_id
    source_env = g.s.branches[b0].environment_id
    assert source_env is not None
    foreign = Environment("env_far", "local_directory", "/w/elsewhere")
    with pytest.raises(BraidError) as caught:
        graph.apply(g.s, EnvironmentBound(conv, b0, foreign, None, g.at()))
    assert caught.value.code == "cross_workspace_binding"
    edge = Edge(
        "edge_f", "forked_environment", source_env, "env_far", "op_f", g.at(), "sha256:" + "4" * 64
    )
    graph.apply(g.s, EnvironmentBound(conv, b0, foreign, edge, g.at()))
    assert g.s.branches[b0].environment_id == "env_far"


def test_edges_never_close_a_cycle() -> None:
    """An edge back to an ancestor is refused with graph_cycle."""
    g = G()
    b0 = g.conversation()
    g.turn(b0, "one")
    conv = g.s.branches[b0].conversation_id
    turn_id = next(iter(g.s.turns))
    back = Edge(
        "edge_back", "forked_environment", turn_id, b0, "op_x", g.at(), "sha256:" + "5" * 64
    )
    env = Environment(b0, "local_directory", "/w/a")
    with pytest.raises(BraidError) as caught:
        graph.apply(g.s, EnvironmentBound(conv, b0, env, back, g.at()))
    assert caught.value.code == "graph_cycle"


def test_resumed_label_requires_continued_session() -> None:
    """A run dispatched with a new session can't be reported as resumed."""
    from braid_actors.model import RunSessionReported

    g = G()
    b0 = g.conversation()
    _, run_id = g.turn(b0, "one", finish=False)
    g.start(run_id)
    conv = g.s.runs[run_id].conversation_id
    with pytest.raises(BraidError) as caught:
        graph.apply(g.s, RunSessionReported(conv, run_id, "sess_1", True, None, g.at()))
    assert caught.value.code == "integrity_violation"
    graph.apply(g.s, RunSessionReported(conv, run_id, "sess_1", False, "/x.jsonl", g.at()))
    assert g.s.runs[run_id].provider_session_id == "sess_1"


def test_child_observations_dedupe_and_freeze_at_the_limit() -> None:
    """Children dedupe by source identity; past 512 the history freezes, marked incomplete."""
    from braid_actors.model import MAX_RUN_CHILDREN, Worker, WorkerExited, WorkerSpawned

    g = G()
    conv, run_id, root = _running_run_with_root_fresh(g)

    def spawn(n: int) -> WorkerSpawned:
        child = Worker(f"wrk_c{n}", run_id, "running", parent_worker_id=root, pid=100 + n)
        edge = graph.make_edge(g.ids, "spawned", root, child.worker_id, "op", g.at())
        return WorkerSpawned(conv, run_id, child, edge, f"proc:{100 + n}:1.00:start", g.at())

    graph.apply(g.s, spawn(0))
    with pytest.raises(BraidError) as dup:
        graph.apply(g.s, attrs_evolve_worker(spawn(0), "wrk_other"))
    assert dup.value.code == "duplicate_identifier"
    for n in range(1, MAX_RUN_CHILDREN):
        graph.apply(g.s, spawn(n))
    run = g.s.runs[run_id]
    assert run.children_complete
    assert len(run.worker_ids) == MAX_RUN_CHILDREN + 1
    graph.apply(g.s, spawn(MAX_RUN_CHILDREN))  # the 513th child
    run = g.s.runs[run_id]
    assert not run.children_complete
    assert len(run.worker_ids) == MAX_RUN_CHILDREN + 1
    before = graph.checksum(g.s)
    graph.apply(g.s, spawn(MAX_RUN_CHILDREN + 1))  # frozen: nothing more is recorded
    assert len(g.s.runs[run_id].worker_ids) == MAX_RUN_CHILDREN + 1
    assert before != graph.checksum(g.s)  # only the run's event count moved
    # A frozen child history keeps each child's last observed status.
    graph.apply(g.s, WorkerExited(conv, run_id, "wrk_c1", "exited", 0, None, "x:1", g.at()))
    assert g.s.workers["wrk_c1"].status == "running"
    # The root worker still records its own end.
    graph.apply(g.s, WorkerExited(conv, run_id, root, "exited", 0, None, "x:root", g.at()))
    assert g.s.workers[root].status == "exited"


def test_a_workers_new_command_lines_are_kept_once_each() -> None:
    """``worker.executed`` appends to the worker's ``execs`` (its found ``command`` stays),
    dedupes by source identity, and freezes a child history past the limits."""
    from braid_actors.model import (
        MAX_RUN_SOURCE_EVENTS,
        Worker,
        WorkerExec,
        WorkerExecuted,
        WorkerSpawned,
    )

    g = G()
    conv, run_id, root = _running_run_with_root_fresh(g)
    child = Worker("wrk_c", run_id, "running", parent_worker_id=root, pid=7, command=("node",))
    edge = graph.make_edge(g.ids, "spawned", root, "wrk_c", "op", g.at())
    graph.apply(g.s, WorkerSpawned(conv, run_id, child, edge, "proc:7:1.00:start", g.at()))
    at = g.at()
    graph.apply(g.s, WorkerExecuted(conv, run_id, "wrk_c", ("git", "status"), "x:e1", at))
    graph.apply(g.s, WorkerExecuted(conv, run_id, root, ("sh", "-c", "y"), "x:e2", at))
    assert g.s.workers["wrk_c"].command == ("node",)
    assert g.s.workers["wrk_c"].execs == (WorkerExec(("git", "status"), at),)
    assert g.s.workers[root].execs == (WorkerExec(("sh", "-c", "y"), at),)
    assert {"x:e1", "x:e2"} <= set(g.s.runs[run_id].source_event_ids)
    with pytest.raises(BraidError) as dup:
        graph.apply(g.s, WorkerExecuted(conv, run_id, "wrk_c", ("other",), "x:e1", g.at()))
    assert dup.value.code == "duplicate_identifier"
    with pytest.raises(BraidError) as unknown:
        graph.apply(g.s, WorkerExecuted(conv, run_id, "wrk_none", ("x",), "x:e3", g.at()))
    assert unknown.value.code == "integrity_violation"
    # Past the identities' limit a child's command freezes the child history; the root's
    # is still kept (its identity is not).
    run = g.s.runs[run_id]
    filler = tuple(f"x:fill{n}" for n in range(MAX_RUN_SOURCE_EVENTS - len(run.source_event_ids)))
    g.s.runs[run_id] = attrs.evolve(run, source_event_ids=(*run.source_event_ids, *filler))
    graph.apply(g.s, WorkerExecuted(conv, run_id, "wrk_c", ("later",), "x:e4", g.at()))
    assert [e.command for e in g.s.workers["wrk_c"].execs] == [("git", "status")]
    assert not g.s.runs[run_id].children_complete
    graph.apply(g.s, WorkerExecuted(conv, run_id, root, ("root", "later"), "x:e5", g.at()))
    assert g.s.workers[root].execs[-1].command == ("root", "later")
    assert len(g.s.runs[run_id].source_event_ids) == MAX_RUN_SOURCE_EVENTS
    # A frozen child history keeps the child's commands as they were.
    graph.apply(g.s, WorkerExecuted(conv, run_id, "wrk_c", ("again",), "x:e6", g.at()))
    assert [e.command for e in g.s.workers["wrk_c"].execs] == [("git", "status")]


def attrs_evolve_worker(ev: Any, worker_id: str) -> Any:
    return attrs.evolve(ev, worker=attrs.evolve(ev.worker, worker_id=worker_id))


def test_children_are_distinct_across_runs() -> None:
    """The same child identity on two runs is two observations, one per run."""
    from braid_actors.model import Worker, WorkerSpawned

    g = G()
    ids = []
    for _ in range(2):
        conv, run_id, root = _running_run_with_root_fresh(g)
        child = Worker(f"wrk_{run_id}_c", run_id, "running", parent_worker_id=root, pid=5)
        edge = graph.make_edge(g.ids, "spawned", root, child.worker_id, "op", g.at())
        graph.apply(g.s, WorkerSpawned(conv, run_id, child, edge, "proc:5:1.00:start", g.at()))
        ids.append(run_id)
    assert all(g.s.runs[r].source_event_ids == ("proc:5:1.00:start",) for r in ids)


def _running_run_with_root_fresh(g: G) -> tuple[str, str, str]:
    from braid_actors.model import RunWorkerStarted, Worker

    b0 = g.conversation(workspace=f"/w/{len(g.s.conversations)}")
    _, run_id = g.turn(b0, "one", finish=False)
    g.start(run_id)
    root = Worker(f"wrk_root_{run_id}", run_id, "running", pid=10, create_time=1.0)
    edge = graph.make_edge(g.ids, "spawned", run_id, root.worker_id, "op", g.at())
    conv = g.s.runs[run_id].conversation_id
    graph.apply(g.s, RunWorkerStarted(conv, run_id, root, edge, g.at()))
    return conv, run_id, root.worker_id


def test_a_copied_state_keeps_its_dump_while_the_original_moves_on() -> None:
    """copy_state (what a snapshot dumps in its thread) is not changed by later folds:
    new turns, queue changes, part updates and run endings leave the copy's dump as it was."""
    g = G()
    b0 = g.conversation()
    g.turn(b0, "one")
    _, queued = g.turn(b0, "two", finish=False)
    _, waiting = g.turn(b0, "three", finish=False)
    before = graph.dump_state(g.s)
    copy = graph.copy_state(g.s)
    assert graph.dump_state(copy) == before
    g.run_to_end(queued)  # pops the queue, replaces runs and messages, appends branch ids
    g.run_to_end(waiting)
    g.turn(b0, "four", finish=False)
    assert g.s.queues[b0] != copy.queues[b0]
    assert graph.dump_state(copy) == before
    assert graph.checksum(copy) != graph.checksum(g.s)
    assert copy.queues[b0] == [queued, waiting]


def test_the_state_json_pieces_join_to_the_canonical_dump() -> None:
    """iter_state_json (how snapshots are encoded between commits) gives, joined, exactly
    the canonical JSON of dump_state."""
    from braid_actors.model import canonical_json

    g = G()
    for title in ("one", "two"):
        b = g.conversation(title=title)
        g.turn(b, "first")
        g.turn(b, "second", finish=False)
        g.turn(b, "third", finish=False)
    pieces = list(graph.iter_state_json(g.s, canonical_json))
    assert len(pieces) > 20  # one per entity, not one blob
    assert b"".join(pieces) == canonical_json(graph.dump_state(g.s))
    assert b"".join(graph.iter_state_json(GraphState(), canonical_json)) == canonical_json(
        graph.dump_state(GraphState())
    )


def test_cached_pieces_give_the_same_json_as_the_state_changes() -> None:
    """With a piece cache kept between calls, every call still joins to the canonical
    dump of the state as it is then, the unchanged entities are not encoded again, and
    an entity that left the state leaves the cache."""
    from braid_actors.model import canonical_json

    encoded: list[Any] = []

    def counting(value: Any) -> bytes:
        encoded.append(value)
        return canonical_json(value)

    g = G()
    b = g.conversation(title="one")
    g.turn(b, "first")
    _, run_id = g.turn(b, "second", finish=False)
    cache: graph.PieceCache = {}
    first = b"".join(graph.iter_state_json(graph.copy_state(g.s), counting, cache))
    assert first == canonical_json(graph.dump_state(g.s))
    entities = graph.entity_count(g.s)
    assert len(cache) == entities
    encoded.clear()
    again = b"".join(graph.iter_state_json(graph.copy_state(g.s), counting, cache))
    assert again == first
    # only the queues and the active map are encoded again, no entity
    assert len([v for v in encoded if isinstance(v, dict)]) == 2
    g.run_to_end(run_id)  # replaces a cached run and its reply: their pieces are stale
    g.turn(b, "third", finish=False)  # and new entities
    changed = b"".join(graph.iter_state_json(graph.copy_state(g.s), counting, cache))
    assert changed == canonical_json(graph.dump_state(g.s))
    fresh = b"".join(graph.iter_state_json(g.s, canonical_json))
    assert changed == fresh
    key = next(iter(g.s.messages))
    del g.s.messages[key]  # an entity that leaves the state leaves the cache
    b"".join(graph.iter_state_json(graph.copy_state(g.s), counting, cache))
    assert ("messages", key) not in cache
