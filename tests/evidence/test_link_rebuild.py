"""The run-link rebuild writes exactly what the plain rebuild writes.

``rebuild_run_links`` encodes a row's evidence once per member source, reads an agent's
entries once per rebuild, and writes only the rows that differ from the stored ones. The
plain rebuild written out here (the algorithm before those shortcuts: delete the run's
cross-file links, recompute every row with its own evidence, ``INSERT OR IGNORE`` them in
order) is run after every ingest, in a transaction rolled back afterwards, and the stored
links must equal its result: fixtures in both orders with copies that share agent ids
(so one agent has many sidechains and many ``Task`` calls), grown files, re-ingests, and
Codex spawns (several spawns of one child, a child before and after its spawner).
"""

from __future__ import annotations

import json
import re
import sqlite3
from contextlib import closing
from typing import TYPE_CHECKING, Any

import pytest

from braid_actors.evidence import EvidenceStore
from braid_actors.evidence._links import RUN_KINDS, relation_of
from braid_actors.evidence._run_links import compaction_boundary

from ._helpers import FIXTURES, claude_line, codex_line, codex_meta, jsonl

if TYPE_CHECKING:
    from pathlib import Path

Row = tuple[str, str, str, str, str | None, str]


def _evidence(**fields: Any) -> str:
    return json.dumps(fields, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def _members(conn: sqlite3.Connection, source_ids: list[str]) -> list[sqlite3.Row]:
    marks = ",".join("?" * len(source_ids))
    return conn.execute(
        "SELECT e.id, e.kind, s.id AS source_id FROM entries e JOIN sources s "
        f"ON s.pk = e.source_pk WHERE s.id IN ({marks}) AND e.latest=1 "
        "ORDER BY e.source_pk, e.sequence, e.ordinal",
        source_ids,
    ).fetchall()


def _plain_rows(conn: sqlite3.Connection, run_id: str) -> list[Row]:
    out: list[Row] = []
    # A subagent is its session and agent id: a call links its own session's sidechains.
    sidechains: dict[tuple[str, str], list[str]] = {}
    for row in conn.execute(
        "SELECT id, session_id, agent_id FROM sources WHERE run_id=? AND agent_id IS NOT NULL "
        "ORDER BY pk",
        (run_id,),
    ):
        sidechains.setdefault((row["session_id"], row["agent_id"]), []).append(row["id"])
    named: set[tuple[str, str]] = set()
    for action in conn.execute(
        "SELECT * FROM actions WHERE run_id=? AND kind='task_agent' ORDER BY pk", (run_id,)
    ).fetchall():
        agent, call = action["agent_id"], action["entry_id"]
        named.add((action["session_id"], agent))
        ids = sidechains.get((action["session_id"], agent), [])
        if not ids:
            continue
        kind = conn.execute(
            "SELECT kind FROM entries WHERE run_id=? AND id=? AND latest=1", (run_id, call)
        ).fetchone()
        members = _members(conn, ids)
        for member in members:
            evidence = _evidence(
                basis="agentId",
                value=agent,
                tool_call_id=action["tool_call_id"],
                action_entry_id=call,
                action_object_hash=action["object_hash"],
                parent_source_id=action["source_id"],
                agent_source_id=member["source_id"],
            )
            relation = relation_of(None if kind is None else kind["kind"])
            out.append((run_id, member["id"], call, "task_agent", relation, evidence))
            if member is members[0]:
                back = relation_of(member["kind"])
                out.append((run_id, call, member["id"], "task_agent", back, evidence))
    for (session, agent), ids in sidechains.items():
        if (session, agent) in named or not agent.startswith("acompact"):
            continue
        boundary = compaction_boundary(conn, run_id, ids)
        if boundary is None:
            continue
        members = _members(conn, ids)
        for member in members:
            evidence = _evidence(
                basis="compact_boundary_after_agent",
                value=agent,
                boundary_entry_id=boundary["id"],
                parent_source_id=boundary["source_id"],
                agent_source_id=member["source_id"],
            )
            out.append((run_id, member["id"], boundary["id"], "compaction_agent", None, evidence))
            if member is members[0]:
                out.append(
                    (run_id, boundary["id"], member["id"], "compaction_agent", None, evidence)
                )
    for action in conn.execute(
        "SELECT * FROM actions WHERE run_id=? AND kind='spawn' AND target IS NOT NULL "
        "AND tool_call_id IS NOT NULL AND target != session_id ORDER BY pk",
        (run_id,),
    ).fetchall():
        call = conn.execute(
            "SELECT e.id FROM entries e JOIN sources s ON s.pk = e.source_pk WHERE e.run_id=? "
            "AND s.id=? AND e.latest=1 AND e.kind='tool_call' AND e.tool_call_id=? "
            "ORDER BY e.sequence, e.ordinal LIMIT 1",
            (run_id, action["source_id"], action["tool_call_id"]),
        ).fetchone()
        if call is None:
            continue
        children = [
            row["id"]
            for row in conn.execute(
                "SELECT id FROM sources WHERE run_id=? AND harness=? AND session_id=? ORDER BY pk",
                (run_id, action["harness"], action["target"]),
            )
        ]
        if not children:
            continue
        members = _members(conn, children)
        for member in members:
            evidence = _evidence(
                basis="native_spawn_result",
                value=action["target"],
                tool_call_id=action["tool_call_id"],
                action_entry_id=action["entry_id"],
                action_object_hash=action["object_hash"],
                parent_source_id=action["source_id"],
                child_source_id=member["source_id"],
            )
            kind = "session_delegation"
            out.append((run_id, member["id"], call["id"], kind, "context_tool_call", evidence))
            if member is members[0]:
                back = relation_of(member["kind"])
                out.append((run_id, call["id"], member["id"], kind, back, evidence))
    return out


def _links(conn: sqlite3.Connection, run_id: str) -> list[tuple[Any, ...]]:
    return sorted(
        tuple(row)
        for row in conn.execute(
            "SELECT entry_id, node_id, kind, relation, evidence FROM links WHERE run_id=?",
            (run_id,),
        )
    )


def _check(home: Path, run_id: str) -> int:
    """Stored links == the plain rebuild's; returns how many run links there are."""
    with closing(sqlite3.connect(home / "evidence.sqlite3", isolation_level=None)) as conn:
        conn.row_factory = sqlite3.Row
        stored = _links(conn, run_id)
        conn.execute("BEGIN IMMEDIATE")
        try:
            marks = ",".join("?" * len(RUN_KINDS))
            conn.execute(
                f"DELETE FROM links WHERE run_id=? AND kind IN ({marks})", (run_id, *RUN_KINDS)
            )
            conn.executemany(
                "INSERT OR IGNORE INTO links(run_id, entry_id, node_id, kind, relation, evidence) "
                "VALUES (?,?,?,?,?,?)",
                _plain_rows(conn, run_id),
            )
            plain = _links(conn, run_id)
        finally:
            conn.execute("ROLLBACK")
    assert stored == plain
    return sum(1 for row in stored if row[2] in RUN_KINDS)


_SESSION = re.compile(rb'"sessionId":"([0-9a-f-]{36})"')


def _copies(tmp: Path, count: int, *, own_sessions: bool = True) -> list[Path]:
    """The Claude Code fixtures ``count`` times with the same agent ids. With
    ``own_sessions`` each copy has its own session ids (file names too): its agents are
    other subagents than the other copies' of the same ids. Without, the copies are the same
    sessions in other folders: every copy's sidechains and ``Task`` calls share their
    subagents."""
    files = sorted((FIXTURES / "claude-code").rglob("*.jsonl"))
    sessions = {m for path in files for m in _SESSION.findall(path.read_bytes())}
    out: list[Path] = []
    for copy in range(count):
        mapping = {s.decode(): f"{copy:08x}{s.decode()[8:]}" for s in sessions if own_sessions}
        for path in files:
            data = path.read_text(encoding="utf-8")
            rel = str(path.relative_to(FIXTURES))
            for old, new in mapping.items():
                data, rel = data.replace(old, new), rel.replace(old, new)
            target = tmp / f"copy{copy}" / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(data, encoding="utf-8")
            out.append(target)
    return out


@pytest.mark.parametrize("own_sessions", [True, False])
@pytest.mark.parametrize("order", ["agents_first", "parents_first"])
def test_rebuild_is_the_plain_rebuild_with_shared_agents(
    tmp_path: Path, order: str, own_sessions: bool
) -> None:
    copies = _copies(tmp_path / "in", 3, own_sessions=own_sessions)
    files = sorted(copies, key=lambda p: ("agent-" in p.name, str(p)))
    if order == "agents_first":
        files.reverse()
    home = tmp_path / "home"
    with EvidenceStore.open(home) as store:
        for path in files:
            data = path.read_bytes()
            lines = data.splitlines(keepends=True)
            path.write_bytes(b"".join(lines[: len(lines) // 2]))
            store.ingest(path, run_id="run_r")
            _check(home, "run_r")
            path.write_bytes(data)
            store.ingest(path, run_id="run_r")
            _check(home, "run_r")
        store.ingest(files[0], run_id="run_r")
        assert _check(home, "run_r") > 0


def _spawn(call: str, child: str) -> list[dict[str, Any]]:
    return [
        {
            "type": "function_call",
            "name": "spawn_agent",
            "call_id": call,
            "arguments": json.dumps({"message": "go"}),
        },
        {
            "type": "function_call_output",
            "call_id": call,
            "output": json.dumps({"agent_id": child}),
        },
    ]


def _rollout(home: Path, name: str, session: str, items: list[dict[str, Any]], **meta: Any) -> Path:
    records = [codex_meta(session, **meta)]
    records += [codex_line("response_item", item) for item in items]
    return jsonl(home / "rollouts" / f"{name}.jsonl", records)


def _say(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


@pytest.mark.parametrize("child_first", [True, False])
def test_rebuild_is_the_plain_rebuild_with_spawns(tmp_path: Path, child_first: bool) -> None:
    home = tmp_path / "home"
    spawned = {"source": {"subagent": {"thread_spawn": {"parent_thread_id": "s-lead"}}}}
    child = _rollout(home, "child", "s-helper", [_say("hi"), _say("done")], **spawned)
    grand = _rollout(home, "grand", "s-grand", [_say("deep")])
    lead_items = [*_spawn("c-1", "s-helper"), *_spawn("c-2", "s-helper"), *_spawn("c-3", "s-other")]
    lead = _rollout(home, "lead", "s-lead", lead_items)
    helper_more = [_say("hi"), _say("done"), *_spawn("c-4", "s-grand"), _say("later")]
    plan = [child, lead] if child_first else [lead, child]
    with EvidenceStore.open(home) as store:
        for path in plan:
            store.ingest(path, run_id="run_s", harness="codex")
            _check(home, "run_s")
        # the child grows and spawns a grandchild, which arrives afterwards
        _rollout(home, "child", "s-helper", helper_more, **spawned)
        for path in (child, grand, lead, child):
            store.ingest(path, run_id="run_s", harness="codex")
            _check(home, "run_s")
        assert _check(home, "run_s") > 0


def test_rebuild_removes_links_that_no_longer_hold(tmp_path: Path) -> None:
    """Links change, not only grow: a compaction agent's transcript grows past its first
    boundary (its links move to the next one), then a ``Task`` call names the agent (its
    compaction links go, ``task_agent`` links come)."""
    session = "44444444-2222-3333-4444-555555555555"
    agent_id = "acompact-def456"

    def said(uuid: str, at: str) -> dict[str, Any]:
        return claude_line(
            session, "user", f"text {uuid}", uuid=uuid, isSidechain=True, agentId=agent_id,
            timestamp=at,
        )  # fmt: skip

    def boundary(uuid: str, at: str) -> dict[str, Any]:
        return {
            "type": "system",
            "subtype": "compact_boundary",
            "content": "Conversation compacted",
            "sessionId": session,
            "uuid": uuid,
            "timestamp": at,
        }

    agent = tmp_path / "agent-acompact-def456.jsonl"
    parent = tmp_path / "parent.jsonl"
    first = said("a1", "2026-01-01T00:00:01.000Z")
    jsonl(agent, [first])
    parent_records = [
        claude_line(session, "user", "hello", uuid="p1"),
        boundary("b1", "2026-01-01T00:00:02.000Z"),
        boundary("b2", "2026-01-01T00:00:04.000Z"),
    ]
    jsonl(parent, parent_records)
    home = tmp_path / "home"
    counts: list[int] = []
    with EvidenceStore.open(home) as store:
        for path in (agent, parent):
            store.ingest(path, run_id="run_m")
            counts.append(_check(home, "run_m"))
        jsonl(agent, [first, said("a2", "2026-01-01T00:00:03.000Z")])
        store.ingest(agent, run_id="run_m")
        counts.append(_check(home, "run_m"))
        call = {"type": "tool_use", "id": "toolu_1", "name": "Task", "input": {"prompt": "go"}}
        progress = {
            "type": "progress",
            "sessionId": session,
            "uuid": "p9",
            "timestamp": "2026-01-01T00:00:05.000Z",
            "parentToolUseID": "toolu_1",
            "data": {"type": "agent_progress", "agentId": agent_id},
        }
        asked = claude_line(session, "assistant", [call], uuid="p8", message_id="msg_9")
        jsonl(parent, [*parent_records, asked, progress])
        store.ingest(parent, run_id="run_m")
        counts.append(_check(home, "run_m"))
        with closing(sqlite3.connect(home / "evidence.sqlite3")) as conn:
            kinds = {row[2] for row in _links(conn, "run_m") if row[2] in RUN_KINDS}
    assert counts[1] > 0 and counts[2] > 0 and kinds == {"task_agent"}


def test_rebuild_after_a_changed_agent_a_revised_call_and_a_nested_call(tmp_path: Path) -> None:
    """The passes that are not additive: a sidechain file rewritten under another agent id
    (its entries are revised too), a parent rewritten so that the ``Task`` call's entry
    becomes a message (a revision: the links to the call lose their relation), and a
    ``Task`` call inside a sidechain (nested subagents)."""
    session = "55555555-2222-3333-4444-555555555555"

    def said(uuid: str, agent: str, **extra: Any) -> dict[str, Any]:
        return claude_line(
            session, "user", f"text {uuid}", uuid=uuid, isSidechain=True, agentId=agent, **extra
        )

    def task(uuid: str, call_id: str, agent: str, **extra: Any) -> list[dict[str, Any]]:
        block = {"type": "tool_use", "id": call_id, "name": "Task", "input": {"prompt": "go"}}
        progress = {
            "type": "progress",
            "sessionId": session,
            "uuid": f"{uuid}-p",
            "timestamp": "2026-01-01T00:00:05.000Z",
            "parentToolUseID": call_id,
            "data": {"type": "agent_progress", "agentId": agent},
            **extra,
        }
        call = claude_line(
            session, "assistant", [block], uuid=uuid, message_id=f"m-{uuid}", **extra
        )
        return [call, progress]

    parent = tmp_path / "parent.jsonl"
    child = tmp_path / "agent-aaa111.jsonl"
    grandchild = tmp_path / "agent-ccc333.jsonl"
    home = tmp_path / "home"
    counts: list[int] = []
    with EvidenceStore.open(home) as store:

        def ingest(path: Path) -> None:
            store.ingest(path, run_id="run_n")
            counts.append(_check(home, "run_n"))

        jsonl(
            parent, [claude_line(session, "user", "hello", uuid="p1"), *task("p2", "t1", "aaa111")]
        )
        jsonl(child, [said("c1", "aaa111"), said("c2", "aaa111")])
        ingest(child)
        ingest(parent)
        jsonl(child, [said("c1", "bbb222"), said("c2", "bbb222")])  # the agent id changed
        ingest(child)
        jsonl(child, [said("c1", "aaa111"), said("c2", "aaa111")])
        ingest(child)
        message = claude_line(session, "assistant", "no call", uuid="p2", message_id="m-p2")
        jsonl(parent, [claude_line(session, "user", "hello", uuid="p1"), message])  # revised
        ingest(parent)
        nested = task("c3", "t2", "ccc333", isSidechain=True, agentId="aaa111")
        jsonl(child, [said("c1", "aaa111"), said("c2", "aaa111"), *nested])
        ingest(child)
        jsonl(grandchild, [said("g1", "ccc333")])
        ingest(grandchild)
    assert counts[1] > 0 and counts[2] == 0 and counts[3] > 0 and counts[-1] > counts[3]


def test_a_call_and_a_boundary_link_only_their_own_sessions_subagents(tmp_path: Path) -> None:
    """Two copies of the Claude Code fixtures with their own session ids but the same
    (short) agent ids: every ``task_agent`` and ``compaction_agent`` link joins entries of
    one session, and two copies hold twice the links of one, not four times."""
    counts = []
    for copies in (1, 2):
        home = tmp_path / f"home{copies}"
        with EvidenceStore.open(home) as store:
            for path in _copies(tmp_path / f"in{copies}", copies):
                store.ingest(path, run_id="run_own")
        with closing(sqlite3.connect(home / "evidence.sqlite3")) as conn:
            rows = conn.execute(
                "SELECT l.kind, a.session_id, b.session_id FROM links l "
                "JOIN entries ea ON ea.run_id = l.run_id AND ea.id = l.entry_id "
                "JOIN sources a ON a.pk = ea.source_pk "
                "JOIN entries eb ON eb.run_id = l.run_id AND eb.id = l.node_id "
                "JOIN sources b ON b.pk = eb.source_pk "
                "WHERE l.kind IN ('task_agent', 'compaction_agent') AND ea.latest = 1 "
                "AND eb.latest = 1"
            ).fetchall()
        assert {kind for kind, _, _ in rows} == {"task_agent", "compaction_agent"}
        assert all(one == other for _, one, other in rows)
        counts.append(len(rows))
    assert counts[1] == 2 * counts[0]
