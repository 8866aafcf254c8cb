"""Recorded graph links (``/v1/context/links``) against independent counts of the fixtures."""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from braid_actors.evidence import EvidenceStore

from ._helpers import FIXTURES, claude_line, jsonl, read_records

CLAUDE = FIXTURES / "claude-code" / "marot__spotter" / "test" / "fixtures" / "transcripts"
CODEX = FIXTURES / "codex" / "lanegrid__agtrace" / "crates" / "agtrace-providers" / "tests"
PARENT = CLAUDE / "258c7280-ae70-4798-800f-63464d01a85d.jsonl"
AGENTS = CLAUDE / "258c7280-ae70-4798-800f-63464d01a85d" / "subagents"
_DRAFT_BLOCKS = ("text", "thinking", "redacted_thinking", "tool_use", "server_tool_use")


def claude_expected(path: Path) -> Counter[str]:
    """Served links of a Claude file by relation, counted with plain json: one pair per
    tool result whose call came earlier, and every ordered pair of blocks of one API
    response (``message.id``) whose destination is a tool call or result."""
    expected: Counter[str] = Counter()
    seen: set[str] = set()
    groups: dict[tuple[str, str], list[str]] = {}
    for record in read_records(path):
        if record.get("type") not in ("user", "assistant"):
            continue
        message = record["message"]
        content = message.get("content")
        blocks = [{"type": "text"}] if isinstance(content, str) else content
        for block in blocks:
            kind = block.get("type")
            if kind in ("tool_use", "server_tool_use"):
                seen.add(block["id"])
            if kind == "tool_result" and block.get("tool_use_id") in seen:
                expected["context_tool_call"] += 1
                expected["context_tool_result"] += 1
            if record["type"] == "assistant" and message.get("id") and kind in _DRAFT_BLOCKS:
                key = (record["sessionId"], message["id"])
                groups.setdefault(key, []).append(kind)
    for kinds in groups.values():
        assert len(kinds) <= 64
        calls = sum(k in ("tool_use", "server_tool_use") for k in kinds)
        expected["context_tool_call"] += calls * (len(kinds) - 1)
    return expected


def codex_expected(path: Path) -> Counter[str]:
    """Served links of a Codex rollout: one pair per output whose call came earlier."""
    expected: Counter[str] = Counter()
    seen: set[str] = set()
    for record in read_records(path):
        payload = record.get("payload", {})
        items = [payload] if record.get("type") == "response_item" else []
        if record.get("type") == "compacted":
            items = list(payload.get("replacement_history") or [])
        for item in items:
            if item.get("type") in ("function_call", "custom_tool_call", "local_shell_call"):
                seen.add(item["call_id"])
            elif (
                item.get("type") in ("function_call_output", "custom_tool_call_output")
                and item.get("call_id") in seen
            ):
                expected["context_tool_call"] += 1
                expected["context_tool_result"] += 1
    return expected


def served(store: EvidenceStore, run_id: str) -> tuple[Counter[str], dict[str, Any]]:
    """Every entry's served links counted by relation, and the pages by entry id."""
    counts: Counter[str] = Counter()
    pages: dict[str, Any] = {}
    cursor = None
    while True:
        page = store.entries(run_id, cursor=cursor, limit=200)
        for entry in page["entries"]:
            body = store.links(run_id, entry["id"])
            pages[entry["id"]] = (entry, body)
            assert body["has_more"] is False
            assert ("reason" in body) == (not body["links"])
            counts.update(link["relation"] for link in body["links"])
        if not page["has_more"]:
            return counts, pages
        cursor = page["next_cursor"]


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        (CLAUDE / "short.jsonl", claude_expected),
        (CLAUDE / "subagent.jsonl", claude_expected),
        (PARENT, claude_expected),
        (CODEX / "samples" / "codex_session.jsonl", codex_expected),
    ],
    ids=["claude-short", "claude-subagent", "claude-parent", "codex"],
)
def test_link_counts_match_the_fixture(home: Path, path: Path, expected: Any) -> None:
    """Each file's served links equal an independent count of its call/result pairs and
    API response groups; re-ingesting changes no link."""
    with EvidenceStore.open(home) as store:
        run_id = store.ingest(path, policy="detailed").run_id
        counts, pages = served(store, run_id)
        assert counts == expected(path)
        assert sum(counts.values()) > 0
        conn = sqlite3.connect(home / "evidence.sqlite3")
        before = conn.execute("SELECT * FROM links ORDER BY 1, 2, 3, 4").fetchall()
        store.ingest(path, run_id=run_id)
        assert conn.execute("SELECT * FROM links ORDER BY 1, 2, 3, 4").fetchall() == before
        conn.close()
        for entry, body in pages.values():
            for link in body["links"]:
                target, _ = pages[link["node_id"]]
                assert link["relation"] == f"context_{target['kind']}"
                if (
                    entry["kind"] in ("tool_call", "tool_result")
                    and target["kind"] != entry["kind"]
                ):
                    assert target["tool_call_id"] == entry["tool_call_id"]


def test_subagent_entries_link_to_their_task_call(home: Path) -> None:
    """Every entry of a subagent file links to the Task call whose result names its
    agentId (plain json), in either ingest order; a compaction agent gets no served link."""
    task_of: dict[str, str] = {}
    for record in read_records(PARENT):
        result = record.get("toolUseResult")
        if isinstance(result, dict) and result.get("agentId"):
            block = next(b for b in record["message"]["content"] if b["type"] == "tool_result")
            task_of[result["agentId"]] = block["tool_use_id"]
        data = record.get("data") or {}
        if data.get("type") == "agent_progress" and data.get("agentId"):
            task_of.setdefault(data["agentId"], record["parentToolUseID"])
    files = {read_records(p)[0]["agentId"]: p for p in sorted(AGENTS.glob("*.jsonl"))}
    linked = set(task_of) & set(files)
    assert linked
    with EvidenceStore.open(home) as store:
        run_id = store.ingest(sorted(AGENTS.glob("*.jsonl"))[0], policy="detailed").run_id
        for path in [*sorted(AGENTS.glob("*.jsonl"))[1:], PARENT]:
            store.ingest(path, run_id=run_id, resume_offset=0)
        _, pages = served(store, run_id)
        by_agent: Counter[str] = Counter()
        for entry, body in pages.values():
            agent = entry["source"].get("agent_id")
            if agent is None:
                continue
            calls = [pages[link["node_id"]][0] for link in body["links"]]
            task_calls = [c for c in calls if c["tool_call_id"] == task_of.get(agent)]
            if agent in linked:
                assert len(task_calls) == 1
                assert task_calls[0]["tool_name"] == "Task"
                by_agent[agent] += 1
            else:
                assert not task_calls
        sizes = Counter(
            e["source"]["agent_id"] for e, _ in pages.values() if e["source"].get("agent_id")
        )
        assert by_agent == Counter({a: sizes[a] for a in linked})


def test_an_entry_without_links_says_so_and_unknown_entries_are_404(home: Path) -> None:
    """A lone prompt has no recorded link (explicit reason); an unknown entry is refused."""
    from braid_actors.errors import EvidenceContentNotFound

    path = jsonl(home / "one.jsonl", [claude_line("s-1", "user", "hello")])
    with EvidenceStore.open(home) as store:
        run_id = store.ingest(path).run_id
        entry = store.entries(run_id)["entries"][0]
        body = store.links(run_id, entry["id"])
        assert body == {
            "schema_version": "agentprovenance.agent_context/v1",
            "run_id": run_id,
            "entry_id": entry["id"],
            "basis": "recorded_graph_edge",
            "links": [],
            "has_more": False,
            "reason": "no_recorded_graph_link",
        }
        with pytest.raises(EvidenceContentNotFound):
            store.links(run_id, "ctx_missing")


def _rollout(home: Path, name: str, session: str, *items: dict[str, Any], **meta: Any) -> Path:
    from ._helpers import codex_line, codex_meta

    records = [codex_meta(session, **meta)]
    records += [codex_line("response_item", item) for item in items]
    return jsonl(home / "rollouts" / f"{name}.jsonl", records)


def _say(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def _spawned(parent: str) -> dict[str, Any]:
    return {"source": {"subagent": {"thread_spawn": {"parent_thread_id": parent}}}}


def test_delegation_is_a_link_to_the_spawning_call(home: Path) -> None:
    """A session a spawn result names, ingested into the same run (before or after its
    spawner), links every entry to the spawning tool call, with the spawn result as
    evidence. A message_request target, a child known only by its parent id, and a spawned
    session in another run get no link: those relations are not graph edges."""
    spawn = {
        "type": "function_call",
        "name": "spawn_agent",
        "call_id": "c-spawn",
        "arguments": json.dumps({"message": "go"}),
    }
    spawned = {
        "type": "function_call_output",
        "call_id": "c-spawn",
        "output": json.dumps({"agent_id": "s-helper"}),
    }
    ask = {
        "type": "function_call",
        "name": "send_input",
        "call_id": "c-ask",
        "arguments": json.dumps({"id": "s-peer", "message": "more"}),
    }
    asked = {"type": "function_call_output", "call_id": "c-ask", "output": "{}"}
    child = _rollout(home, "child", "s-helper", _say("hi"), _say("done"), **_spawned("s-lead"))
    lead = _rollout(home, "lead", "s-lead", spawn, spawned, ask, asked)
    peer = _rollout(home, "peer", "s-peer", _say("hello"))
    orphan = _rollout(home, "orphan", "s-orphan", _say("alone"), **_spawned("s-lead"))
    with EvidenceStore.open(home) as store:
        for path in (child, lead, peer, orphan):
            store.ingest(path, run_id="run_d", harness="codex")
        store.ingest(child, run_id="run_e", harness="codex")
        relations = store.session_relations("run_d", harness="codex", session="s-helper")
        assert any(r["kind"] == "delegation" for r in relations["relations"])
        _, pages = served(store, "run_d")
        (call,) = [
            e
            for e, _ in pages.values()
            if e.get("tool_call_id") == "c-spawn" and e["kind"] == "tool_call"
        ]
        (result,) = [
            e
            for e, _ in pages.values()
            if e.get("tool_call_id") == "c-spawn" and e["kind"] == "tool_result"
        ]
        by_session: dict[str, list[set[str]]] = {}
        for entry, body in pages.values():
            targets = {link["node_id"] for link in body["links"]}
            by_session.setdefault(entry["source"]["session_id"], []).append(targets)
        assert len(by_session["s-helper"]) >= 3
        assert all(targets == {call["id"]} for targets in by_session["s-helper"])
        for session in ("s-peer", "s-orphan"):
            assert all(not targets for targets in by_session[session])
        _, elsewhere = served(store, "run_e")
        assert all(not body["links"] for _, body in elsewhere.values())
        conn = sqlite3.connect(home / "evidence.sqlite3")
        rows = conn.execute(
            "SELECT entry_id, node_id, relation, evidence FROM links "
            "WHERE run_id='run_d' AND kind='session_delegation' ORDER BY entry_id, node_id"
        ).fetchall()
        helper_ids = {e["id"] for e, _ in pages.values() if e["source"]["session_id"] == "s-helper"}
        assert {r[0] for r in rows if r[1] == call["id"]} == helper_ids
        (back,) = [r for r in rows if r[0] == call["id"]]
        assert back[1] in helper_ids
        for row in rows:
            evidence = json.loads(row[3])
            assert evidence["basis"] == "native_spawn_result"
            assert evidence["value"] == "s-helper" and evidence["tool_call_id"] == "c-spawn"
            assert evidence["action_entry_id"] == result["id"]
            assert evidence["action_object_hash"] == result["object_hash"]
        before = conn.execute("SELECT * FROM links ORDER BY 1, 2, 3, 4").fetchall()
        store.ingest(lead, run_id="run_d", harness="codex")
        store.ingest(child, run_id="run_d", harness="codex")
        assert conn.execute("SELECT * FROM links ORDER BY 1, 2, 3, 4").fetchall() == before
        conn.close()
