"""CF-01: generated operation sequences keep the graph's invariants.

Each example is a sequence of operations drawn from everything the graph accepts (create,
submit, admit, dispatch, stream parts, interactions, finish, branch, clone, bind
environments) and from forged events that must be refused (mutating a finished run, a
cycle, a boundary that is not on its branch, a cross-workspace binding). After every step
the invariants hold; a refused event leaves the checksum unchanged; and at the end folding
the accepted events one by one equals a full replay and a dump/load round trip.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from braid_actors import graph
from braid_actors.errors import BraidError
from braid_actors.graph import GraphState
from braid_actors.model import (
    TERMINAL_RUN_STATES,
    Boundary,
    BranchCreated,
    CountingIds,
    Edge,
    Environment,
    EnvironmentBound,
    Event,
    Interaction,
    Outcome,
    OutcomeKind,
    RunCancelRequested,
    RunFinished,
    RunInteractionAnswered,
    RunInteractionRequested,
    RunPartUpdated,
    RunWorkerStarted,
    TerminalState,
    TextPart,
    TurnRunSelected,
    Usage,
    Worker,
    WorkerExited,
    WorkerSpawned,
    converter,
)

# Weighted: lifecycle steps are common so sequences reach deep states; forgeries are rarer.
OPS = (
    ("create",) * 1
    + ("submit",) * 3
    + ("admit",) * 2
    + ("dispatch",) * 3
    + ("part",) * 3
    + ("ask",) * 2
    + ("answer",) * 2
    + ("finish",) * 2
    + ("branch",) * 3
    + ("clone",) * 1
    + ("bind_env",) * 1
    + ("cancel_req", "retry", "select", "worker_start", "worker_child", "worker_exit")
    + ("forge_terminal", "forge_cycle", "forge_boundary", "forge_cross_workspace")
)
WORKSPACES = ("/w/alpha", "/w/beta")
OUTCOME_OF: dict[str, OutcomeKind] = {
    "succeeded": "completed",
    "failed": "failed",
    "cancelled": "cancelled",
    "unknown": "lost",
}


@attrs.define
class World:
    """The state under test plus what the test remembers independently of it."""

    state: GraphState = attrs.Factory(GraphState)
    ids: CountingIds = attrs.Factory(CountingIds)
    accepted: list[Event] = attrs.Factory(list)
    frozen_runs: dict[str, Any] = attrs.Factory(dict)
    clock: datetime = datetime(2026, 1, 1, tzinfo=UTC)
    refused: int = 0

    def now(self) -> datetime:
        self.clock += timedelta(seconds=1)
        return self.clock

    def pick(self, items: list[str], n: int) -> str | None:
        return sorted(items)[n % len(items)] if items else None

    def accept(self, event: Event) -> None:
        graph.apply(self.state, event)
        self.accepted.append(event)

    def refuse(self, event: Event) -> None:
        """The event must be refused with a stable code and change nothing."""
        before = graph.checksum(self.state)
        with pytest.raises(BraidError) as caught:
            graph.apply(self.state, event)
        assert caught.value.code != "internal_error"
        self.refused += 1
        assert graph.checksum(self.state) == before


def _run_in(world: World, states: set[str], n: int) -> str | None:
    return world.pick([r.run_id for r in world.state.runs.values() if r.state in states], n)


def step(world: World, op: str, n: int, m: int) -> None:
    s = world.state
    op_id = f"op_{len(world.accepted)}_{op}"
    if op == "create":
        world.accept(
            graph.create_conversation(
                s,
                workspace=WORKSPACES[n % 2],
                title=f"t{m % 3}",
                profile_ref=None,
                runner=None,
                operation_id=op_id,
                at=world.now(),
                ids=world.ids,
            )
        )
    elif op == "submit":
        if (b := world.pick(list(s.branches), n)) is not None:
            world.accept(
                graph.submit_turn(
                    s, branch_id=b, text=f"u{m}", operation_id=op_id, at=world.now(), ids=world.ids
                )
            )
    elif op == "admit":
        for admission in graph.next_admissions(s, at=world.now(), limit=1 + m % 3):
            world.accept(admission)
    elif op == "dispatch":
        if (r := _run_in(world, {"admitted"}, n)) is not None:
            world.accept(
                graph.dispatch(
                    s,
                    run_id=r,
                    receipt=f"sha256:{m:064x}",
                    session_mode="new",
                    at=world.now(),
                    ids=world.ids,
                )
            )
    elif op == "part":
        if (r := _run_in(world, {"running", "blocked"}, n)) is not None:
            run = s.runs[r]
            assert run.assistant_message_id is not None
            world.accept(
                RunPartUpdated(
                    run.conversation_id,
                    r,
                    run.assistant_message_id,
                    TextPart(f"{run.assistant_message_id}.p{m % 2}", "x" * (m % 5)),
                    world.now(),
                )
            )
    elif op == "ask":
        if (r := _run_in(world, {"running"}, n)) is not None:
            interaction = Interaction(
                world.ids("int"), "permission", {"command": "ls"}, "pending", world.now()
            )
            world.accept(
                RunInteractionRequested(s.runs[r].conversation_id, r, interaction, world.now())
            )
    elif op == "answer":
        if (r := _run_in(world, {"blocked"}, n)) is not None:
            run = s.runs[r]
            pending = [i for i in run.interactions if i.state == "pending"]
            world.accept(
                RunInteractionAnswered(
                    run.conversation_id,
                    r,
                    pending[0].interaction_id,
                    {"allow": bool(m % 2)},
                    op_id,
                    world.now(),
                )
            )
    elif op == "finish":
        if (r := _run_in(world, {"queued", "admitted", "running", "blocked"}, n)) is not None:
            run = s.runs[r]
            ends: tuple[TerminalState, ...] = ("cancelled", "failed", "succeeded", "unknown")
            end = ends[m % 4]
            if run.state == "queued":
                end = "cancelled" if m % 2 else "unknown"
            if end == "succeeded" and run.state != "running":
                end = "failed"
            kind: OutcomeKind = OUTCOME_OF[end]
            world.accept(
                RunFinished(
                    run.conversation_id, r, end, Outcome(kind), Usage(), None, None, world.now()
                )
            )
            world.frozen_runs[r] = converter().unstructure(s.runs[r])
    elif op == "branch":
        with_history = [b for b in s.branches if graph.history(s, b)]
        if (b := world.pick(with_history, n)) is not None:
            visible = [
                mid
                for mid in graph.history(s, b)
                if s.messages[mid].completeness.state != "streaming"
            ]
            if (mid := world.pick(visible, m)) is not None:
                world.accept(
                    graph.branch(
                        s,
                        branch_id=b,
                        through_message_id=mid,
                        draft=None,
                        operation_id=op_id,
                        at=world.now(),
                        ids=world.ids,
                    )
                )
    elif op == "clone":
        if (b := world.pick(list(s.branches), n)) is not None:
            t = graph.tip(s, b)
            if t is None or s.messages[t].completeness.state != "streaming":
                world.accept(
                    graph.clone(
                        s,
                        branch_id=b,
                        title=None,
                        operation_id=op_id,
                        at=world.now(),
                        ids=world.ids,
                    )
                )
    elif op == "bind_env":
        if (b := world.pick(list(s.branches), n)) is not None:
            br = s.branches[b]
            ws = s.conversations[br.conversation_id].workspace
            env = Environment(world.ids("env"), "local_directory", ws)
            world.accept(EnvironmentBound(br.conversation_id, b, env, None, world.now()))
    elif op == "cancel_req":
        if (r := _run_in(world, {"admitted", "running", "blocked"}, n)) is not None:
            world.accept(
                RunCancelRequested(s.runs[r].conversation_id, r, "user", op_id, world.now())
            )
    elif op == "retry":
        finished = [
            t.turn_id
            for t in s.turns.values()
            if all(s.runs[x].state in TERMINAL_RUN_STATES for x in t.run_ids)
        ]
        if (t := world.pick(finished, n)) is not None:
            world.accept(
                graph.retry(
                    s,
                    turn_id=t,
                    session="fresh" if m % 2 else "reuse",
                    runner=None,
                    model=None,
                    operation_id=op_id,
                    at=world.now(),
                    ids=world.ids,
                )
            )
    elif op == "select":
        done = [r.run_id for r in s.runs.values() if r.state in TERMINAL_RUN_STATES]
        if (r := world.pick(done, n)) is not None:
            run = s.runs[r]
            world.accept(TurnRunSelected(run.conversation_id, run.turn_id, r, world.now()))
    elif op == "worker_start":
        live = [
            r.run_id
            for r in s.runs.values()
            if r.state in ("running", "blocked") and not r.worker_ids
        ]
        if (r := world.pick(live, n)) is not None:
            worker = Worker(world.ids("wrk"), r, "running", pid=1000 + m, create_time=float(m))
            edge = graph.make_edge(world.ids, "spawned", r, worker.worker_id, op_id, world.now())
            world.accept(RunWorkerStarted(s.runs[r].conversation_id, r, worker, edge, world.now()))
    elif op == "worker_child":
        live = [
            r.run_id for r in s.runs.values() if r.state in ("running", "blocked") and r.worker_ids
        ]
        if (r := world.pick(live, n)) is not None:
            run = s.runs[r]
            parent = run.worker_ids[m % len(run.worker_ids)]
            child = Worker(world.ids("wrk"), r, "running", parent_worker_id=parent, pid=m)
            edge = graph.make_edge(
                world.ids, "spawned", parent, child.worker_id, op_id, world.now()
            )
            world.accept(
                WorkerSpawned(
                    run.conversation_id, r, child, edge, f"proc:{child.worker_id}", world.now()
                )
            )
    elif op == "worker_exit":
        running = [
            (r.run_id, w)
            for r in s.runs.values()
            if r.state in ("running", "blocked")
            for w in r.worker_ids
            if s.workers[w].status == "running"
        ]
        if running:
            r, w = running[n % len(running)]
            world.accept(
                WorkerExited(
                    s.runs[r].conversation_id, r, w, "exited", 0, None, f"exit:{w}", world.now()
                )
            )
    elif op == "forge_terminal":
        if world.frozen_runs:
            r = world.pick(list(world.frozen_runs), n)
            assert r is not None
            run = s.runs[r]
            forged: Event = RunPartUpdated(
                run.conversation_id,
                r,
                run.assistant_message_id or "msg_x",
                TextPart("p", "late"),
                world.now(),
            )
            if m % 2:
                forged = RunFinished(
                    run.conversation_id,
                    r,
                    "succeeded",
                    Outcome("completed"),
                    Usage(),
                    None,
                    None,
                    world.now(),
                )
            world.refuse(forged)
    elif op == "forge_cycle":
        if (b := world.pick(list(s.branches), n)) is not None:
            br = s.branches[b]
            # An edge back from the branch to a node it came from, or to itself.
            src = next((e.source_id for e in s.edges.values() if e.destination_id == b), b)
            edge = Edge(
                world.ids("edge"),
                "forked_environment",
                b,
                src,
                op_id,
                world.now(),
                "sha256:" + "0" * 64,
            )
            env = Environment(src, "local_directory", s.conversations[br.conversation_id].workspace)
            world.refuse(EnvironmentBound(br.conversation_id, b, env, edge, world.now()))
    elif op == "forge_boundary":
        if len(s.branches) >= 1 and s.messages:
            b = world.pick(list(s.branches), n)
            assert b is not None
            outside = [mid for mid in s.messages if mid not in graph.history(s, b)]
            mid = world.pick(outside, m) or "msg_missing"
            # The builder refuses this too; forge the event to prove apply re-checks.
            nb = attrs.evolve(
                s.branches[b],
                branch_id=world.ids("br"),
                source=Boundary(b, mid, mid),
                message_ids=(),
                draft="",
            )
            edge = Edge(
                world.ids("edge"),
                "branched_at",
                mid,
                nb.branch_id,
                op_id,
                world.now(),
                "sha256:" + "0" * 64,
            )
            world.refuse(BranchCreated(nb, edge, op_id, world.now()))
    elif op == "forge_cross_workspace" and (b := world.pick(list(s.branches), n)) is not None:
        br = s.branches[b]
        ws = s.conversations[br.conversation_id].workspace
        other = WORKSPACES[1] if ws == WORKSPACES[0] else WORKSPACES[0]
        env = Environment(world.ids("env"), "local_directory", other)
        world.refuse(EnvironmentBound(br.conversation_id, b, env, None, world.now()))


def check_invariants(world: World) -> None:
    s = world.state
    # Acyclic: no edge path returns to its start.
    out: dict[str, list[str]] = {}
    for e in s.edges.values():
        out.setdefault(e.source_id, []).append(e.destination_id)
    colour: dict[str, int] = {}

    def visit(node: str) -> None:
        colour[node] = 1
        for nxt in out.get(node, ()):
            assert colour.get(nxt) != 1, f"cycle through {nxt}"
            if nxt not in colour:
                visit(nxt)
        colour[node] = 2

    for node in list(out):
        if node not in colour:
            visit(node)
    # Valid boundaries: every branch's history resolves to stored messages, and a branch's
    # boundary message is on its source branch.
    for b in s.branches.values():
        hist = graph.history(s, b.branch_id)
        assert all(mid in s.messages for mid in hist)
        assert len(hist) == len(set(hist))
        if b.source is not None and b.source.through_message_id is not None:
            # The boundary is on the source's sequence (it may since show another attempt
            # of that turn: the child keeps the reply it branched from).
            raw = graph.history(s, b.source.branch_id, all_attempts=True)
            assert b.source.through_message_id in raw
            assert b.source.through_message_id in hist
    # Terminal runs never change once terminal.
    for r, frozen in world.frozen_runs.items():
        assert converter().unstructure(s.runs[r]) == frozen
    # Environment bindings stay inside the conversation's workspace.
    for b in s.branches.values():
        if b.environment_id is not None:
            env = s.environments[b.environment_id]
            assert env.workspace == s.conversations[b.conversation_id].workspace
    # Workers belong to their run; a run's spawned edges form a tree rooted at the run.
    for run in s.runs.values():
        for w in run.worker_ids:
            assert s.workers[w].run_id == run.run_id
        assert len(run.source_event_ids) == len(set(run.source_event_ids))
    # Every turn shows at most one reply on its branch.
    for b in s.branches.values():
        shown = [s.messages[m].source_run_id for m in graph.history(s, b.branch_id)]
        turns = [s.runs[r].turn_id for r in shown if r is not None]
        assert len(turns) == len(set(turns))
    # One active run per branch, queue positions 1..n.
    for branch_id, queue in s.queues.items():
        assert [s.turns[s.runs[r].turn_id].queue_position for r in queue] == list(
            range(1, len(queue) + 1)
        )
        assert all(s.runs[r].state == "queued" for r in queue)
        active = s.active.get(branch_id)
        assert active is None or s.runs[active].state not in TERMINAL_RUN_STATES


operations = st.lists(
    st.tuples(st.sampled_from(OPS), st.integers(0, 1_000), st.integers(0, 1_000)),
    min_size=10,
    max_size=60,
)


@given(operations)
def test_cf01_generated_sequences_keep_invariants(ops: list[tuple[str, int, int]]) -> None:
    """Any operation sequence keeps the graph acyclic, bounded, immutable and replayable."""
    world = World()
    step(world, "create", 0, 0)
    for op, n, m in ops:
        step(world, op, n, m)
        check_invariants(world)
    replayed = GraphState()
    conv = converter()
    for event in world.accepted:
        # Through the journal's form: unstructure, then structure back as the union.
        graph.apply(replayed, conv.structure(conv.unstructure(event), Event))  # type: ignore[arg-type]
    assert graph.checksum(replayed) == graph.checksum(world.state)
    assert graph.checksum(graph.load_state(graph.dump_state(world.state))) == graph.checksum(
        world.state
    )
