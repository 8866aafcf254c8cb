"""The files an ingest's paths name: a file as given, a directory as its transcripts.

A harness keeps its transcripts in a tree (``~/.claude/projects/<project>/`` with each
session's ``<session>/subagents/`` beside it, ``~/.codex/sessions/YYYY/MM/DD/``,
``~/.gemini/tmp/<hash>/chats/``), so a directory stands for the transcript files under it:
every ``*.jsonl`` file (Claude Code, Codex and Braid's local runner write JSON lines) and
every ``*session*.json`` file (a Gemini CLI chat is one JSON document); other files there
(``settings.json``, ``README.md``, a ``manifest.json``) are not transcripts and are left
out. A file named explicitly is always ingested, whatever its name: its format is then
detected as usual and an unknown one is reported, never skipped.

Directories are walked without following symbolic links to directories (a link back up
the tree would never end), and their files come in path order, so a Claude Code session
file comes before its ``<session>/subagents/`` files. A file reached twice (named and
inside a named directory, or under two directories) is ingested once, where it first
appears. A directory holding no transcript is bad input (``invalid_argument``) and nothing
is ingested: a wrong path should not pass for an empty history.
"""

from __future__ import annotations

import fnmatch
import os
from pathlib import Path
from typing import TYPE_CHECKING, Final

from braid_actors.errors import EvidenceInvalidArgument

if TYPE_CHECKING:
    from collections.abc import Sequence

TRANSCRIPT_PATTERNS: Final = ("*.jsonl", "*session*.json")
"""File names a directory's transcripts have (``fnmatch``, case as written)."""


def transcript_paths(paths: Sequence[Path]) -> list[Path]:
    """The files to ingest for ``paths``, in order, each once (see the module docstring)."""
    found: list[Path] = []
    seen: set[Path] = set()
    for index, path in enumerate(paths, start=1):
        files = _under(path, index) if path.is_dir() else [path]
        for file in files:
            key = file.resolve()
            if key not in seen:
                seen.add(key)
                found.append(file)
    return found


def _under(directory: Path, index: int) -> list[Path]:
    """The transcript files under ``directory`` (the ``index``-th path given), in path order."""

    def unreadable(error: OSError) -> None:
        raise EvidenceInvalidArgument(
            f"path {index} is a directory that cannot be read ({error.strerror})",
            details={"field": "paths", "index": index},
        )

    files: list[Path] = []
    for root, _dirs, names in os.walk(directory, onerror=unreadable, followlinks=False):
        files.extend(
            Path(root, name)
            for name in names
            if any(fnmatch.fnmatchcase(name, pattern) for pattern in TRANSCRIPT_PATTERNS)
        )
    if not files:
        raise EvidenceInvalidArgument(
            f"path {index} is a directory with no transcript files "
            f"({', '.join(TRANSCRIPT_PATTERNS)}) under it",
            details={"field": "paths", "index": index},
        )
    # By the path's text: a session's "<id>.jsonl" comes before its "<id>/" folder ("." < "/").
    return sorted(files, key=os.fspath)
