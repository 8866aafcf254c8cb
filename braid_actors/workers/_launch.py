"""How to start the built-in local worker program as a separate Python process."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping

_SOURCE_ROOT = Path(__file__).resolve().parents[2]
"""The directory holding the ``braid_actors`` package this code was loaded from."""

LOCAL_WORKER_MODULE = "braid_actors.workers.local"


def local_worker_command(
    sessions_dir: Path,
    *,
    shell_timeout: float | None = None,
    python: str | None = None,
    spool_dir: Path | None = None,
    run_id: str | None = None,
    detach_on_eof: bool = False,
) -> tuple[str, ...]:
    """argv for ``python -m braid_actors.workers.local --sessions DIR [...]``."""
    argv = [python or sys.executable, "-m", LOCAL_WORKER_MODULE, "--sessions", str(sessions_dir)]
    if shell_timeout is not None:
        argv += ["--shell-timeout", repr(float(shell_timeout))]
    if spool_dir is not None and run_id is not None:
        argv += ["--spool", str(spool_dir), "--run", run_id]
    if detach_on_eof:
        argv.append("--detach-on-eof")
    return tuple(argv)


def worker_environment(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a Python worker: ``base`` (default: this process's) with this
    package's source root first on ``PYTHONPATH``, so the worker runs the same code as its
    owner whether or not the package is installed."""
    env = dict(os.environ if base is None else base)
    previous = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(_SOURCE_ROOT) + (os.pathsep + previous if previous else "")
    return env


def spool_path(spool_dir: Path, run_id: str) -> Path:
    """The append-only spool of every message the worker of ``run_id`` sent."""
    return spool_dir / f"{_safe(run_id)}.jsonl"


def control_path(spool_dir: Path, run_id: str) -> Path:
    """Where a re-attached supervisor writes controls for a detached worker."""
    return spool_dir / f"{_safe(run_id)}.control.jsonl"


def _safe(run_id: str) -> str:
    if not run_id or not all(c.isalnum() or c in "_-" for c in run_id):
        raise ValueError("a run id names files, so it is letters, digits, _ and - only")
    return run_id
