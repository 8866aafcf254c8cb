"""``braid journal verify``: the read-only integrity report of a Braid home's journal."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from braid_actors.errors import JournalKeyError
from braid_actors.journal import GraphProjector, VerifyReport, parse_key, verify_journal

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

KEY_FILE = "journal.key"


def read_key(home: Path, env: Mapping[str, str] = os.environ) -> bytes:
    """The existing key (``BRAID_KEY`` or the key file); never creates one."""
    if env.get("BRAID_KEY"):
        return parse_key(env["BRAID_KEY"])
    if not (home / KEY_FILE).exists():
        raise JournalKeyError(f"no journal key in {home} and BRAID_KEY is not set")
    from braid_actors.journal import load_or_create_key

    return load_or_create_key(home, env)


def verify_home(home: Path, env: Mapping[str, str] = os.environ) -> VerifyReport:
    """Verify the journal of ``home`` with the graph projector."""
    return verify_journal(home, read_key(home, env), GraphProjector())
