"""``braid evidence ingest DIRECTORY``: a directory stands for the transcripts under it."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from braid_actors.evidence import transcript_paths

from ._helpers import FIXTURES
from .test_cli import SHORT, _run

if TYPE_CHECKING:
    import pytest

CLAUDE = FIXTURES / "claude-code/marot__spotter/test/fixtures/transcripts"
SESSION = "258c7280-ae70-4798-800f-63464d01a85d"


def _transcripts_by_hand(root: Path) -> set[str]:
    """Every file under ``root`` a harness writes, by name, without the code under test."""
    return {
        os.path.join(folder, name)
        for folder, _dirs, names in os.walk(root)
        for name in names
        if name.endswith(".jsonl") or (name.endswith(".json") and "session" in name)
    }


def _ingested(out: str) -> list[str]:
    return [json.loads(line)["source"]["path"] for line in out.splitlines()]


def test_a_directory_stands_for_the_transcripts_under_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The fixtures folder: every transcript under it is ingested (and nothing else: no
    README, SOURCES.md or manifest.json), each once, a session's file before its
    subagents' files, and the printout ends with the totals."""
    expected = _transcripts_by_hand(FIXTURES)
    assert len(expected) == 14  # 9 Claude Code, 4 Codex, 1 Gemini CLI
    assert _run(["evidence", "ingest", str(FIXTURES), "--run", "run_dir", "--json"], tmp_path) == 0
    paths = _ingested(capsys.readouterr().out)
    assert set(paths) == {str(Path(p).resolve()) for p in expected}
    assert len(paths) == len(set(paths))
    parent = paths.index(str((CLAUDE / f"{SESSION}.jsonl").resolve()))
    subagents = [i for i, p in enumerate(paths) if f"/{SESSION}/subagents/" in p]
    assert len(subagents) == 2
    assert parent < min(subagents)
    assert _run(["evidence", "ingest", str(FIXTURES), "--run", "run_dir"], tmp_path) == 0
    assert capsys.readouterr().out.endswith("\n14 files, 14 sources: ok 13, partial 1\n")


def test_a_file_reached_twice_is_ingested_once_where_it_first_comes(tmp_path: Path) -> None:
    """Named and inside a named directory, or under two directories: one ingest."""
    folder = tmp_path / "t"
    (folder / "inner").mkdir(parents=True)
    one = Path(shutil.copyfile(SHORT, folder / "one.jsonl"))
    two = Path(shutil.copyfile(SHORT, folder / "inner" / "two.jsonl"))
    assert transcript_paths([two, folder, folder / "inner"]) == [two, one]


def test_a_named_file_is_ingested_whatever_its_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Names only choose the files of a directory: a file given by name is ingested, and a
    directory holding it (it is no transcript by name) is refused."""
    (tmp_path / "t").mkdir()
    named = Path(shutil.copyfile(SHORT, tmp_path / "t" / "session.log"))
    assert _run(["evidence", "ingest", str(named), "--run", "run_named"], tmp_path / "h") == 0
    assert "claude_code  session 55604662" in capsys.readouterr().out
    assert _run(["evidence", "ingest", str(tmp_path / "t")], tmp_path / "h2") == 2


def test_a_directory_without_transcripts_is_refused_and_nothing_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A wrong path is not an empty history: the command is refused with a stable code
    before the store is opened, also when a good path comes first."""
    empty = tmp_path / "notes"
    empty.mkdir()
    (empty / "README.md").write_text("hello\n", encoding="utf-8")
    (empty / "settings.json").write_text("{}\n", encoding="utf-8")
    home = tmp_path / "home"
    assert _run(["evidence", "ingest", str(SHORT), str(empty)], home) == 2
    err = capsys.readouterr().err
    assert "path 2 is a directory with no transcript files" in err
    assert err.rstrip().endswith("(invalid_argument)")
    assert not home.exists()


def test_a_link_back_up_the_tree_is_not_followed(tmp_path: Path) -> None:
    """A symbolic link to a directory above would loop; it is not walked (the file itself
    is found once), while a linked transcript file is a file like any other."""
    folder = tmp_path / "t"
    folder.mkdir()
    shutil.copyfile(SHORT, folder / "a.jsonl")
    (folder / "up").symlink_to(tmp_path, target_is_directory=True)
    (folder / "b.jsonl").symlink_to(SHORT)
    assert transcript_paths([folder]) == [folder / "a.jsonl", folder / "b.jsonl"]
