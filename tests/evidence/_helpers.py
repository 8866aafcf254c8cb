"""Transcript builders and independent counts (plain ``json``, no evidence code)."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any


def _find_fixtures() -> Path:
    """``shared/fixtures/transcripts`` beside the checkout (CI lays ``shared/`` there), or
    in a folder above it; ``BRAID_SHARED`` names it explicitly. Never skipped: a missing
    folder makes the fixture tests fail."""
    explicit = os.environ.get("BRAID_SHARED")
    if explicit:
        return Path(explicit) / "fixtures" / "transcripts"
    repo = Path(__file__).resolve().parents[2]
    for folder in repo.parents:
        candidate = folder / "shared" / "fixtures" / "transcripts"
        if candidate.is_dir():
            return candidate
    return repo.parent / "shared" / "fixtures" / "transcripts"


FIXTURES = _find_fixtures()


def jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    """Write ``records`` as JSONL (one object per line, trailing newline)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def read_records(path: Path) -> list[dict[str, Any]]:
    return [
        json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()
    ]


def claude_counts(path: Path) -> Counter[str]:
    """Independent counts of a Claude Code session file."""
    counts: Counter[str] = Counter()
    calls: set[str] = set()
    answered: set[str] = set()
    usage: dict[str, dict[str, Any]] = {}
    for record in read_records(path):
        counts["lines"] += 1
        if record.get("isSidechain") is True:
            counts["sidechain_records"] += 1
        if record.get("type") == "system" and record.get("subtype") == "compact_boundary":
            counts["compactions"] += 1
        if record.get("type") not in ("user", "assistant"):
            continue
        message = record["message"]
        content = message.get("content")
        if record["type"] == "assistant" and message.get("id") and message.get("usage"):
            usage[message["id"]] = message["usage"]
        if isinstance(content, str):
            counts["messages"] += 1
            continue
        for block in content:
            kind = block.get("type")
            if kind in ("text", "image", "document"):
                counts["messages"] += 1
            elif kind in ("thinking", "redacted_thinking"):
                counts["reasoning"] += 1
            elif kind in ("tool_use", "server_tool_use"):
                counts["tool_calls"] += 1
                calls.add(block["id"])
            elif kind == "tool_result" or str(kind).endswith("_tool_result"):
                counts["tool_results"] += 1
                answered.add(block.get("tool_use_id"))
    counts["unmatched_calls"] = len(calls - answered)
    counts["usage_responses"] = len(usage)
    counts["usage_output_tokens"] = sum(u.get("output_tokens", 0) for u in usage.values())
    return counts


def codex_counts(path: Path) -> Counter[str]:
    """Independent counts of a Codex rollout file (envelope format)."""
    counts: Counter[str] = Counter()
    calls: set[str] = set()
    outputs: set[str] = set()
    last_total: Any = None
    for record in read_records(path):
        counts["lines"] += 1
        kind = record.get("type")
        payload = record.get("payload", {})
        sub = payload.get("type")
        if kind == "compacted":
            counts["compactions"] += 1
        elif kind == "response_item":
            if sub == "message":
                counts["messages"] += 1
            elif sub == "reasoning":
                counts["reasoning"] += 1
            elif sub in ("function_call", "custom_tool_call", "local_shell_call"):
                counts["tool_calls"] += 1
                calls.add(payload["call_id"])
            elif sub == "web_search_call":
                counts["tool_calls"] += 1
            elif sub in ("function_call_output", "custom_tool_call_output"):
                counts["tool_results"] += 1
                outputs.add(payload["call_id"])
        elif kind == "event_msg":
            if sub in ("user_message", "agent_message", "agent_reasoning"):
                counts["message_events"] += 1
            elif sub == "token_count" and (payload.get("info") or {}).get("total_token_usage"):
                total = payload["info"]["total_token_usage"]
                if total != last_total:
                    counts["usage_responses"] += 1
                    counts["usage_total_tokens"] = total.get("total_tokens", 0)
                last_total = total
    counts["unmatched_calls"] = len(calls - outputs)
    return counts


def claude_line(session: str, kind: str, content: Any, **extra: Any) -> dict[str, Any]:
    """A minimal Claude Code user/assistant record."""
    message: dict[str, Any] = {"role": kind, "content": content}
    if kind == "assistant":
        message.update(id=extra.pop("message_id", "msg_1"), model="claude-test", type="message")
        if "usage" in extra:
            message["usage"] = extra.pop("usage")
    return {
        "type": kind,
        "sessionId": session,
        "uuid": extra.pop("uuid", f"u-{len(str(content))}"),
        "timestamp": extra.pop("timestamp", "2026-01-01T00:00:00.000Z"),
        "cwd": "/work/project",
        "version": "2.1.0",
        "message": message,
        **extra,
    }


def codex_line(
    kind: str, payload: dict[str, Any], ts: str = "2026-01-01T00:00:00.000Z"
) -> dict[str, Any]:
    return {"timestamp": ts, "type": kind, "payload": payload}


def codex_meta(session: str, **extra: Any) -> dict[str, Any]:
    payload = {
        "id": session,
        "cwd": "/work",
        "cli_version": "0.99.0",
        "model_provider": "openai",
        **extra,
    }
    return codex_line("session_meta", payload)
