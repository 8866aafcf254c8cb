"""The ingest's shortcuts give exactly what the plain computation gives.

The redactor skips rules whose literal hint is absent, remembers short strings, and redacts
a JSON body by the rules its encoding hints at; entry ids are hashed without a general JSON
encode; an ingest that cannot change the run's cross-file links does not rebuild them. Each
is checked against the plain computation: for the redactor, every rule's regular expression
applied in order (no hints, no memory, written out here) on strings built from secrets, hint
literals, replacement markers, escapes and case-folding letters; for the links, a full
rebuild after every ingest of the fixtures.
"""

from __future__ import annotations

import json
import re
import sqlite3
from contextlib import closing
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from braid_actors.evidence import EvidenceStore
from braid_actors.evidence._materialize import entry_id, object_digest
from braid_actors.evidence._redact import BUILTIN_PATTERNS, Redactor
from braid_actors.evidence._run_links import rebuild_run_links
from braid_actors.model import digest

from ._helpers import FIXTURES, claude_line, jsonl

if TYPE_CHECKING:
    from pathlib import Path

CONFIGURED = ("ACME-[0-9]{4}", "braid-fixture")
FRAGMENTS = (
    "sk-ant-api03-Zq9xWv8uTs7rQp6oNm5lKj4iHg3fEd2cBa1Zy0Xw",
    "sk-proj-abcdefghijklmnopqrstuvwxyz",
    "AKIAZ7Q4XK3PB2M9LW5N",
    "aws_secret_access_key=t0pS3cr3tAwsK3yV4lu3Zq9xWv8uTs7rQp6oNm5l",
    "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9",
    "Bearer\tabcdefgh12345",
    "Basic dXNlcjpwYXNzd29yZDEy",
    "-----BEGIN RSA PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----",
    "-----BEGIN PRIVATE KEY-----",
    "https://me:pa55word@example.com/x",
    "ghp_abcdefghijklmnopqrstuvwxyz0123456789",
    "glpat-abcdefghij0123456789",
    "xoxb-1234567890-abc",
    "sk_live_abcdefghijklmnop1234",
    "AIzaSyA1234567890abcdefghijklmnopqrstuv",
    "eyJhbGciOiJI.eyJzdWIiOiIx.abcdefghijk",
    "password = 'Hunter2Hunter2x'",
    '"password": "Hunter2Hunter2x"',
    "auth_token: a1b2c3d4e5f6g7h8",
    "refresh-token=zzzzzzzz1111yyyy",
    "PRIVATE_KEY=abcdefgh12345678",
    "credentials",
    "api_key",
    "input_tokens",
    "token",
    "ACME-7731",
    "braid-fixture",
    "[REDACTED:openai_key]",
    "[REDACTED:",
    "google_api_key]",
    "\u017fecret_key=abc123def456ghi",  # long s: folds to "s" in the regex engine
    "\u212a",  # Kelvin sign: folds to "k"
    "\u0130",  # dotted capital I: lower() makes two characters
    "é",
    "\t",
    "\n",
    '"',
    "\\",
    " ",
    "=",
    ":",
    "'",
    "@",
    "x",
    "7",
)

PAD = "p " * 150  # longer than the redactor remembers: the unremembered path runs
texts = st.one_of(
    st.lists(st.sampled_from(FRAGMENTS), max_size=8).map("".join),
    st.lists(st.sampled_from(FRAGMENTS), max_size=8).map(lambda parts: PAD + "".join(parts)),
    st.text(max_size=40),
    st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=6), max_size=6).map("".join),
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | texts,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
    max_leaves=12,
)


def _plain_rules(configured: tuple[str, ...]) -> list[tuple[str, re.Pattern[str]]]:
    return [(kind, re.compile(source)) for kind, source in BUILTIN_PATTERNS] + [
        ("configured", re.compile(source)) for source in configured
    ]


def _plain_text(value: str, rules: list[tuple[str, re.Pattern[str]]]) -> tuple[str, bool]:
    changed = False
    for kind, pattern in rules:
        marker = f"[REDACTED:{kind}]"
        if "keep" in pattern.groupindex:

            def keep(match: re.Match[str], marker: str = marker) -> str:
                return (match.group("keep") or "") + marker

            value, count = pattern.subn(keep, value)
        else:
            value, count = pattern.subn(marker, value)
        changed = changed or count > 0
    return value, changed


def _plain_value(value: Any, rules: list[tuple[str, re.Pattern[str]]]) -> tuple[Any, bool]:
    if isinstance(value, str):
        return _plain_text(value, rules)
    if isinstance(value, list):
        pairs = [_plain_value(item, rules) for item in value]
        return [p[0] for p in pairs], any(p[1] for p in pairs)
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        changed = False
        for key, item in value.items():
            clean_key, key_hit = _plain_text(key, rules)
            clean, hit = _plain_value(item, rules)
            out[clean_key] = clean
            changed = changed or key_hit or hit
        return out, changed
    return value, False


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


REDACTOR = Redactor.create(CONFIGURED)  # shared on purpose: its memory carries across examples
RULES = _plain_rules(CONFIGURED)


@given(texts)
def test_text_is_the_plain_rule_by_rule_result(value: str) -> None:
    expected = _plain_text(value, RULES)
    for redactor in (REDACTOR, Redactor.create(CONFIGURED)):
        first = redactor.text(value)
        again = redactor.text(value)  # remembered when short
        assert (first.text, first.redacted) == expected
        assert (again.text, again.redacted) == expected


@given(json_values)
def test_value_is_the_plain_result(value: Any) -> None:
    assert REDACTOR.value(value) == _plain_value(value, RULES)


@given(json_values)
def test_json_text_is_redacting_strings_then_the_encoding(value: Any) -> None:
    """What an object's bytes were before the shortcut: redact every string and key, encode,
    redact the encoded text."""
    clean, hit = _plain_value(value, RULES)
    text, text_hit = _plain_text(_compact(clean), RULES)
    result = REDACTOR.json_text(value, _compact(value))
    assert (result.text, result.redacted) == (text, hit or text_hit)


@pytest.mark.parametrize(
    "value",
    [
        {"a": PAD + "\u017fecret_key=abc123def456ghi"},
        {"a": PAD + "\u212aey \u0130 PASSWORD = 'Hunter2Hunter2x'"},
        {PAD + "Bearer": "\tabcdefgh12345", "b": [PAD + "BASIC dXNlcjpwYXNzd29yZDEy"]},
        {"password": PAD + "é", "x": "=Hunter2Hunter2x"},
    ],
)
def test_json_text_on_long_and_case_folding_strings(value: Any) -> None:
    clean, hit = _plain_value(value, RULES)
    text, text_hit = _plain_text(_compact(clean), RULES)
    result = Redactor.create(CONFIGURED).json_text(value, _compact(value))
    assert (result.text, result.redacted) == (text, hit or text_hit)


def test_json_text_redacts_a_secret_split_between_a_key_and_its_value() -> None:
    result = REDACTOR.json_text({"password": "Hunter2Hunter2x"}, '{"password":"Hunter2Hunter2x"}')
    assert "Hunter2" not in result.text and result.redacted


@given(texts, texts)
def test_entry_id_is_the_digest_of_the_pair(run_id: str, source_key: str) -> None:
    expected = "ctx_" + digest([run_id, source_key])[len("sha256:") :][:32]
    assert entry_id(run_id, source_key) == expected


@given(json_values)
def test_object_digest_is_the_model_digest(value: Any) -> None:
    try:
        expected = digest(value)
    except ValueError:  # infinity: refused by both
        with pytest.raises(ValueError, match="not JSON compliant"):
            object_digest(value)
        return
    assert object_digest(value) == expected


RUN_LINK_KINDS = ("task_agent", "compaction_agent")


def _run_links(conn: sqlite3.Connection, run_id: str) -> list[tuple[Any, ...]]:
    marks = ",".join("?" * len(RUN_LINK_KINDS))
    return sorted(
        tuple(row)
        for row in conn.execute(
            "SELECT entry_id, node_id, kind, relation, evidence FROM links "
            f"WHERE run_id=? AND kind IN ({marks})",
            (run_id, *RUN_LINK_KINDS),
        )
    )


@pytest.mark.parametrize("order", ["agents_first", "parents_first"])
def test_skipped_run_link_rebuilds_change_nothing(tmp_path: Path, order: str) -> None:
    """An ingest skips rebuilding the run's cross-file links when it cannot change them; after
    every ingest of every fixture (subagents, compaction agents, Codex, a grown file, a
    re-ingest), the links are exactly what a full rebuild gives."""
    files = sorted(FIXTURES.rglob("*.jsonl"), key=lambda p: ("agent-" in p.name, str(p)))
    if order == "agents_first":
        files.reverse()
    assert any("acompact" in p.name for p in files) and any("codex" in str(p) for p in files)
    home = tmp_path / "home"
    with EvidenceStore.open(home) as store:
        plan: list[Path] = []
        for number, path in enumerate(files):
            copy = tmp_path / "in" / str(number) / path.name
            copy.parent.mkdir(parents=True)
            data = path.read_bytes()
            lines = data.splitlines(keepends=True)
            copy.write_bytes(b"".join(lines[: len(lines) // 2]))
            plan += [copy]
            store.ingest(copy, run_id="run_links")
            _check_links(home)
            copy.write_bytes(data)  # grown: continues from the cursor
            store.ingest(copy, run_id="run_links")
            _check_links(home)
        store.ingest(plan[0], run_id="run_links")  # unchanged: all duplicates
        _check_links(home)
        with closing(sqlite3.connect(home / "evidence.sqlite3")) as conn:
            kinds = {kind for (_e, _n, kind, _r, _v) in _run_links(conn, "run_links")}
        assert kinds == set(RUN_LINK_KINDS)  # both kinds are really exercised


def _check_links(home: Path) -> None:
    with closing(sqlite3.connect(home / "evidence.sqlite3", isolation_level=None)) as conn:
        conn.row_factory = sqlite3.Row  # as the store's own connection (the rebuild reads rows)
        stored = _run_links(conn, "run_links")
        conn.execute("BEGIN IMMEDIATE")
        try:
            rebuild_run_links(conn, "run_links")
            rebuilt = _run_links(conn, "run_links")
        finally:
            conn.execute("ROLLBACK")
    assert stored == rebuilt


def test_a_new_compact_boundary_rebuilds_the_run_links(tmp_path: Path) -> None:
    """A parent file with no Task call whose new record is a ``compact_boundary`` after a
    compaction agent's transcript: the rebuild runs and links the agent to the boundary."""
    session = "33333333-2222-3333-4444-555555555555"
    agent = jsonl(
        tmp_path / "agent-acompact-abc123.jsonl",
        [
            claude_line(
                session,
                "user",
                "summarize the conversation",
                uuid="c1",
                isSidechain=True,
                agentId="acompact-abc123",
                timestamp="2026-01-01T00:00:05.000Z",
            )
        ],
    )
    parent_records = [claude_line(session, "user", "hello", uuid="p1")]
    boundary = {
        "type": "system",
        "subtype": "compact_boundary",
        "content": "Conversation compacted",
        "sessionId": session,
        "uuid": "p2",
        "timestamp": "2026-01-01T00:00:09.000Z",
        "compactMetadata": {"trigger": "auto", "preTokens": 100},
    }
    home = tmp_path / "home"
    with EvidenceStore.open(home) as store:
        store.ingest(agent, run_id="run_links")
        parent = jsonl(tmp_path / "parent.jsonl", parent_records)
        store.ingest(parent, run_id="run_links")
        _check_links(home)
        jsonl(tmp_path / "parent.jsonl", [*parent_records, boundary])
        store.ingest(parent, run_id="run_links")
        _check_links(home)
    with closing(sqlite3.connect(home / "evidence.sqlite3")) as conn:
        kinds = [kind for (_e, _n, kind, _r, _v) in _run_links(conn, "run_links")]
    assert kinds and set(kinds) == {"compaction_agent"}
