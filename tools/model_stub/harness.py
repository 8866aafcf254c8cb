"""Where the real CLIs are: ``BRAID_CLAUDE_BIN`` / ``BRAID_CODEX_BIN``, else the copies
``tools/harnesses/install.sh`` put under ``tools/harnesses/node_modules/.bin``."""

from __future__ import annotations

import os
from pathlib import Path

HARNESSES = Path(__file__).resolve().parent.parent / "harnesses"
"""``tools/harnesses``: the pinned ``package.json``, its lock and ``install.sh``."""
INSTALL_SCRIPT = HARNESSES / "install.sh"


class HarnessMissing(RuntimeError):
    """A CLI is neither configured by its variable nor installed."""


def _resolve(variable: str, name: str) -> Path:
    configured = os.environ.get(variable)
    path = Path(configured) if configured else HARNESSES / "node_modules" / ".bin" / name
    if not (path.is_file() and os.access(path, os.X_OK)):
        origin = f"{variable}={configured}" if configured else str(path)
        raise HarnessMissing(f"{name} is not installed at {origin}; run {INSTALL_SCRIPT}")
    return path


def claude_bin() -> Path:
    """The Claude Code executable (``BRAID_CLAUDE_BIN`` overrides)."""
    return _resolve("BRAID_CLAUDE_BIN", "claude")


def codex_bin() -> Path:
    """The Codex executable (``BRAID_CODEX_BIN`` overrides)."""
    return _resolve("BRAID_CODEX_BIN", "codex")
