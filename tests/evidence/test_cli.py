"""``braid evidence ingest`` and ``braid evidence show``."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from braid_actors.cli import evidence as cli
from braid_actors.evidence import PARALLEL_MIN_BYTES, EvidenceStore

from ._helpers import FIXTURES

if TYPE_CHECKING:
    import pytest

SHORT = FIXTURES / "claude-code/marot__spotter/test/fixtures/transcripts/short.jsonl"
GEMINI = (
    FIXTURES
    / "gemini-cli/lanegrid__agtrace/crates/agtrace-providers/tests/samples/gemini_session.json"
)


def _run(argv: list[str], home: Path) -> int:
    parser = argparse.ArgumentParser(prog="braid")
    cli.add_parser(parser.add_subparsers(dest="command", required=True))
    return cli.run(parser.parse_args(argv), home)


def test_ingest_prints_each_source_coverage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """ingest prints the run, then each source's harness, session, status and counts."""
    assert _run(["evidence", "ingest", str(SHORT), "--run", "run_cli"], tmp_path) == 0
    out = capsys.readouterr().out
    assert out.startswith("run run_cli\n")
    assert "claude_code  session 55604662-cf2a-4331-851a-ec234028f8ca  ok  lines 1-15" in out
    assert "read 15 parsed 15 stored 18 duplicates 0" in out
    assert out.endswith("\n1 file, 1 source: ok 1\n")
    assert _run(["evidence", "ingest", str(SHORT), "--run", "run_cli"], tmp_path) == 0
    assert "stored 0 duplicates 18" in capsys.readouterr().out


def test_ingest_without_run_makes_one_import_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --run the paths share one new run; an unknown-format file exits 1."""
    unknown = tmp_path / "notes.jsonl"
    unknown.write_text('{"note": 1}\n', encoding="utf-8")
    argv = ["evidence", "ingest", str(SHORT), str(GEMINI), str(unknown), "--json"]
    assert _run(argv, tmp_path) == 1
    reports = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["status"] for r in reports] == ["ok", "ok", "failed"]
    assert len({r["run_id"] for r in reports}) == 1
    assert reports[2]["issues"] == [{"code": "unknown_format"}]


def test_show_prints_the_overview(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """show prints policy, counts and coverage; an unknown run is an error with its code."""
    _run(["evidence", "ingest", str(SHORT), "--run", "run_show", "--policy", "detailed"], tmp_path)
    capsys.readouterr()
    assert _run(["evidence", "show", "run_show"], tmp_path) == 0
    out = capsys.readouterr().out
    assert "run run_show  policy detailed  runtime capture legacy_not_recorded" in out
    assert "tool calls 2  tool results 2" in out
    assert _run(["evidence", "show", "run_show", "--json"], tmp_path) == 0
    assert json.loads(capsys.readouterr().out)["tool_calls"] == 2
    assert _run(["evidence", "show", "run_nope"], tmp_path) == 2
    assert "(run_not_found)" in capsys.readouterr().err


def test_ingest_of_many_files_prints_what_one_ingest_after_the_other_prints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Files holding PARALLEL_MIN_BYTES and more go through ingest_many (one process per
    CPU): the printed coverage is the sequential ingest's, file for file, in order."""
    big = FIXTURES / "claude-code/marot__spotter/test/fixtures/transcripts"
    paths: list[Path] = []
    while sum(p.stat().st_size for p in paths) < PARALLEL_MIN_BYTES:
        folder = tmp_path / "corpus" / f"copy{len(paths)}"
        folder.mkdir(parents=True)
        for name in ("258c7280-ae70-4798-800f-63464d01a85d.jsonl", "short.jsonl"):
            shutil.copyfile(big / name, folder / name)
            paths.append(folder / name)
    home = tmp_path / "cli"
    assert _run(["evidence", "ingest", *map(str, paths), "--run", "run_many"], home) == 0
    printed = capsys.readouterr().out
    with EvidenceStore.open(tmp_path / "seq") as store:
        reports = [store.ingest(path, run_id="run_many") for path in paths]
    lines = [cli._line(s.coverage, s.summary) for r in reports for s in r.sources]
    assert {s.coverage["status"] for r in reports for s in r.sources} == {"ok"}
    totals = f"{len(paths)} files, {len(lines)} sources: ok {len(lines)}\n"
    assert printed == "run run_many\n" + "".join(f"{line}\n" for line in lines) + totals
