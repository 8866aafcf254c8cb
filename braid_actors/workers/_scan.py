"""Finding local workers by their command line (for restart reconciliation).

A worker Braid started but never managed to record (it crashed between spawn and the
journal commit) is still recognisable: its argv names the local worker module, the spool
directory and its run id. Reconciliation uses this to re-adopt or stop it: no orphans.
"""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING

import psutil  # type: ignore[import-untyped, unused-ignore]

from braid_actors.workers._launch import LOCAL_WORKER_MODULE
from braid_actors.workers._process import ProcessInfo

if TYPE_CHECKING:
    from pathlib import Path


def find_local_workers(spool_dir: Path) -> dict[str, list[ProcessInfo]]:
    """Live local workers spooling into ``spool_dir``, by run id."""
    found: dict[str, list[ProcessInfo]] = {}
    target = str(spool_dir)
    for proc in psutil.process_iter(["pid", "cmdline", "create_time", "status"]):
        with contextlib.suppress(psutil.Error):
            argv = proc.info.get("cmdline") or []
            if LOCAL_WORKER_MODULE not in argv or proc.info.get("status") == "zombie":
                continue
            run_id = _flag(argv, "--run")
            if run_id is None or _flag(argv, "--spool") != target:
                continue
            pgid = os.getpgid(proc.info["pid"])
            found.setdefault(run_id, []).append(
                ProcessInfo(
                    pid=proc.info["pid"],
                    create_time=float(proc.info["create_time"]),
                    pgid=pgid,
                    command=tuple(argv),
                )
            )
    return found


def _flag(argv: list[str], name: str) -> str | None:
    if name in argv:
        at = argv.index(name)
        if at + 1 < len(argv):
            return argv[at + 1]
    return None
