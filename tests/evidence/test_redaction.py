"""Secrets never land: not in objects, entries, the database files or printed output."""

from __future__ import annotations

import argparse
import json
import sqlite3
from contextlib import closing
from typing import TYPE_CHECKING

import pytest

from braid_actors.cli import evidence as cli
from braid_actors.evidence import EvidenceStore, Redactor

from ._helpers import claude_line, jsonl

if TYPE_CHECKING:
    from pathlib import Path

S = "11111111-2222-3333-4444-555555555555"
ANTHROPIC = "sk-ant-api03-Zq9xWv8uTs7rQp6oNm5lKj4iHg3fEd2cBa1Zy0Xw-AbCdEfGh"
AWS_ID = "AKIAZ7Q4XK3PB2M9LW5N"
AWS_SECRET = "t0pS3cr3tAwsK3yV4lu3Zq9xWv8uTs7rQp6oNm5l"
BEARER = "eyJhbGciOiJIUzI1NiJ9QmVhcmVyVG9rZW5WYWx1ZTEyMzQ1Ng"
PEM_BODY = "MIIEowIBAAKCAQEAuniquePemBodyLineThatMustNotLeak0123456789abcdef"
PEM = (
    f"-----BEGIN RSA PRIVATE KEY-----\n{PEM_BODY}\n"
    "MIIEpemSecondLine9876543210\n-----END RSA PRIVATE KEY-----"
)
CONFIGURED = "ACME-INTERNAL-7731-TOKEN"
SECRETS = (ANTHROPIC, AWS_ID, AWS_SECRET, BEARER, PEM_BODY, CONFIGURED)


def _transcript(path: Path) -> Path:
    return jsonl(
        path,
        [
            claude_line(S, "user", f"use key {ANTHROPIC} and {CONFIGURED} please", uuid="u1"),
            claude_line(
                S,
                "assistant",
                [
                    {"type": "text", "text": f"Here is the key:\n{PEM}\n"},
                    {
                        "type": "tool_use",
                        "id": "toolu_1",
                        "name": "Bash",
                        "input": {
                            "command": (
                                f"AWS_ACCESS_KEY_ID={AWS_ID} "
                                f"aws_secret_access_key={AWS_SECRET} aws s3 ls"
                            )
                        },
                    },
                ],
                uuid="a1",
            ),
            claude_line(
                S,
                "user",
                [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_1",
                        "content": f"curl -H 'Authorization: Bearer {BEARER}'",
                    }
                ],
                uuid="u2",
                toolUseResult={"stdout": f"Authorization: Bearer {BEARER}"},
            ),
        ],
    )


def _all_bytes(home: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(home.rglob("*")) if p.is_file())


@pytest.mark.parametrize("policy", ["basic", "detailed"])
def test_seeded_secrets_are_nowhere_in_the_store(tmp_path: Path, policy: str) -> None:
    """Keys, bearer tokens, PEM blocks and configured patterns are redacted before storage."""
    home = tmp_path / "home"
    path = _transcript(tmp_path / "t.jsonl")
    with EvidenceStore.open(home, redaction_patterns=[r"ACME-INTERNAL-\d+-TOKEN"]) as store:
        report = store.ingest(path, run_id="run_secret", policy=policy)
        assert report.coverage[0]["status"] == "ok"
        page = store.entries("run_secret", limit=200)
        dumped = json.dumps(page) + json.dumps(store.overview("run_secret"))
        bodies = []
        for entry in page["entries"]:
            for key in ("content", "raw_content", "intent_content"):
                ref = entry.get(key, {}).get("ref")
                if ref:
                    bodies.append(store.content("run_secret", ref, limit=262_144)["content"])
        redacted = [e for e in page["entries"] if e["content"].get("redacted")]
        assert redacted, "redacted bodies say so"
    everything = _all_bytes(home)
    with closing(sqlite3.connect(home / "evidence.sqlite3")) as conn:
        blobs = [bytes(data) for (data,) in conn.execute("SELECT data FROM object_data")]
    assert bodies and {body.encode() for body in bodies} <= set(blobs)
    for secret in SECRETS:
        assert all(secret.encode() not in blob for blob in blobs), secret
        assert secret not in dumped
        assert all(secret not in body for body in bodies)
        assert secret.encode() not in everything, secret
    assert any("[REDACTED:anthropic_key]" in body for body in bodies)
    assert any("[REDACTED:pem_private_key]" in body for body in bodies)


def test_cli_output_carries_no_secret(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """What `braid evidence ingest` and `show` print (text and JSON) holds no secret."""
    parser = argparse.ArgumentParser(prog="braid")
    cli.add_parser(parser.add_subparsers(dest="command", required=True))
    path = _transcript(tmp_path / "t.jsonl")
    home = tmp_path / "home"
    for argv in (
        ["evidence", "ingest", str(path), "--run", "run_cli", "--policy", "detailed"],
        ["evidence", "ingest", str(path), "--run", "run_cli", "--json"],
        ["evidence", "show", "run_cli"],
        ["evidence", "show", "run_cli", "--json"],
    ):
        assert cli.run(parser.parse_args(argv), home) == 0
    out = capsys.readouterr()
    for secret in SECRETS[:-1]:
        assert secret not in out.out and secret not in out.err


def test_redactor_keeps_ordinary_text() -> None:
    """Redaction replaces secret shapes only: names stay readable and ordinary code is untouched."""
    redactor = Redactor.create()
    assert (
        redactor.clean("password = 'Hunter2Hunter2x'")
        == "password = '[REDACTED:secret_assignment]'"
    )
    assert (
        redactor.clean("Authorization: Bearer abcdefgh12345")
        == "Authorization: Bearer [REDACTED:bearer_token]"
    )
    assert (
        redactor.clean("https://me:pa55word@example.com/x")
        == "https://me:[REDACTED:url_credentials]@example.com/x"
    )
    for text in (
        "token_count = 5",
        "mix phx.server 2>&1 | head -80",
        "the basic setup",
        "sk-learn",
    ):
        assert redactor.clean(text) == text
    value, hit = redactor.value({ANTHROPIC: [f"x {AWS_ID}"]})
    assert (
        hit
        and json.dumps(value) == '{"[REDACTED:anthropic_key]": ["x [REDACTED:aws_access_key_id]"]}'
    )
