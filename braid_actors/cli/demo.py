"""``braid demo``: the main job end to end on the embedded default (the local runner).

In a temporary Braid home (unless ``--home`` is given) it creates a conversation in a
scratch workspace, sends a few turns (one runs a shell tool after a permission answer),
branches at an earlier message, clones, prints the graph as a tree, and verifies the
journal. Every step goes through the same application actions headless clients use.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from braid_actors import graph
from braid_actors.app import BraidApp, call, open_app
from braid_actors.model import TextPart, ToolRequestPart, ToolResultPart

Print = Callable[[str], None]


async def _turn(app: BraidApp, branch_id: str, text: str, say: Print, *, allow: bool = True) -> str:
    sent = await call(app, "submit_turn", {"branchId": branch_id, "text": text})
    run_id: str = sent["runId"]
    say(f"  > {text.splitlines()[0]}")
    while True:
        run = app.run(run_id)
        pending = [i for i in run.interactions if i.state == "pending"]
        if pending and run.state == "blocked":
            ask = pending[0]
            say(
                f"    runner asks permission: {ask.kind} {dict(ask.subject)} -> "
                f"{'allow' if allow else 'deny'}"
            )
            await call(
                app,
                "respond_interaction",
                {
                    "runId": run_id,
                    "interactionId": ask.interaction_id,
                    "answer": {"allow": allow},
                },
            )
            continue
        if graph.is_terminal(run.state):
            break
        await app.changed()
    record = await call(app, "wait_run", {"runId": run_id, "timeoutS": 60})
    say(
        f"    run {run_id}: {record['state']} ({record['sessionLabel']}, "
        f"{record['usage']['inputTokens']} in / {record['usage']['outputTokens']} out tokens "
        f"[{record['usage']['source']}], cost {record['costUsd']})"
    )
    return run_id


def _summary(app: BraidApp, message_id: str) -> str:
    msg = app.state.messages[message_id]
    bits: list[str] = []
    for part in msg.parts:
        if isinstance(part, TextPart):
            bits.append(part.text.replace("\n", " ")[:60])
        elif isinstance(part, ToolRequestPart):
            bits.append(f"[tool {part.name} {dict(part.input)}]")
        elif isinstance(part, ToolResultPart):
            output = " ".join(part.summary.split())[:40]
            bits.append(f"[result {part.status} exit={part.exit_code}] {output}".rstrip())
        else:
            bits.append(f"[{part.kind}]")
    return " ".join(bits)


def render_tree(app: BraidApp, conversation_id: str) -> list[str]:
    """The conversation's branches as an indented tree of messages."""
    state = app.state
    conv = state.conversations[conversation_id]
    lines = [f"conversation {conv.conversation_id} \u201c{conv.title}\u201d ({conv.workspace})"]
    for b in graph.branches_of(state, conversation_id):
        if b.source is None:
            origin = "root"
        else:
            src = state.branches[b.source.branch_id]
            where = b.source.through_message_id or "the start"
            kind = "clone of" if src.conversation_id != conversation_id else "branched from"
            origin = f"{kind} {src.branch_id} after {where}"
        lines.append(f"  branch {b.branch_id} ({origin}); draft: {b.draft!r}")
        inherited = len(graph.history(state, b.branch_id)) - len(b.message_ids)
        if inherited:
            lines.append(f"    \u2502 {inherited} message(s) linked from ancestry")
        for mid in b.message_ids:
            msg = state.messages[mid]
            lines.append(f"    \u251c {msg.role:9} {mid}: {_summary(app, mid)}")
    return lines


async def run_demo(home: Path | None, say: Print = print) -> bool:
    """Run the demo; returns True when the final journal verify is clean."""
    from braid_actors.cli.verify import verify_home

    root = Path(tempfile.mkdtemp(prefix="braid-demo-"))
    home = home or root / "home"
    workspace = root / "workspace"
    workspace.mkdir()
    (workspace / "notes.txt").write_text("remember to water the plants\n")
    say(f"Braid home: {home}")
    say(f"workspace:  {workspace}")
    conversation: dict[str, Any]
    async with trio.open_nursery() as nursery:
        app: BraidApp = await nursery.start(open_app, home)
        conversation = await call(
            app,
            "create_conversation",
            {
                "workspace": str(workspace),
                "title": "Demo: look around the workspace",
            },
        )
        main = conversation["branchId"]
        say(f"\nconversation {conversation['conversationId']}, branch {main}")
        await _turn(app, main, "Hello! What can you do?", say)
        await _turn(app, main, "!ls -1", say)
        await _turn(app, main, "?think\nWhat did the listing show?", say)
        first_reply = graph.history(app.state, main)[1]
        forked = await call(app, "branch", {"branchId": main, "throughMessageId": first_reply})
        say(f"\nbranched at {first_reply} -> {forked['branchId']} (edge {forked['edgeId']})")
        await _turn(app, forked["branchId"], "Let's try another approach instead.", say)
        cloned = await call(app, "clone", {"branchId": main})
        say(
            f"cloned {main} -> conversation {cloned['conversationId']} "
            f"\u201c{cloned['title']}\u201d"
        )
        await _turn(app, cloned["branchId"], "Carry on in the clone.", say)
        say("")
        for cid in (conversation["conversationId"], cloned["conversationId"]):
            for line in render_tree(app, cid):
                say(line)
        graph_info = await call(
            app, "get_graph", {"conversationId": conversation["conversationId"]}
        )
        kinds = sorted({e["kind"] for e in graph_info["edges"]})
        say(
            f"\ngraph: {len(graph_info['nodes'])} nodes, {len(graph_info['edges'])} edges "
            f"({', '.join(kinds)}), checksum {graph_info['checksum']}"
        )
        await call(app, "shutdown", {"drain": True})
    report = await trio.to_thread.run_sync(verify_home, home)
    say("\njournal verify:")
    say(report.render())
    return report.ok
