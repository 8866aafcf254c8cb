"""`braid demo` end to end on the embedded default."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import trio

from braid_actors.cli.demo import run_demo


async def test_demo_runs_every_step_and_verifies(tmp_path: Path) -> None:
    """The demo's turns succeed, it branches and clones, and the journal verifies OK."""
    lines: list[str] = []
    ok = await run_demo(tmp_path / "home", lines.append)
    out = "\n".join(lines)
    assert ok, out
    assert "runner asks permission" in out
    assert out.count(": succeeded (") == 5
    assert "new session with copied context" in out
    assert "resumed session" in out
    assert "branched from" in out
    assert "clone of" in out
    assert "(clone)" in out
    assert "[tool shell" in out
    assert "[result ok exit=0]" in out
    assert "journal verification: OK" in out
    assert (tmp_path / "home" / "journal.key").stat().st_mode & 0o777 == 0o600


async def test_braid_demo_command_exits_zero() -> None:
    """The console entry point runs the demo in a temporary home and exits 0."""
    env = {k: v for k, v in os.environ.items() if k not in ("BRAID_HOME", "BRAID_KEY")}
    proc = await trio.run_process(
        [sys.executable, "-m", "braid_actors.cli.main", "demo"],
        capture_stdout=True,
        capture_stderr=True,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    assert b"journal verification: OK" in proc.stdout
