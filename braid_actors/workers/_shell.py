"""The local runner's shell tool: ``sh -c`` in the workspace, bounded in time and output."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from typing import TYPE_CHECKING, Final

import attrs
import trio

if TYPE_CHECKING:
    from pathlib import Path

SUMMARY_LIMIT: Final = 4000
"""Bytes of a shell command's combined output kept in its ``tool_result`` summary."""


@attrs.frozen
class ShellResult:
    summary: str
    truncated: bool
    exit_code: int | None
    """Exit status (negative: the signal that ended it); null when it timed out or never ran."""


async def run_shell(command: str, workspace: Path, time_limit: float) -> ShellResult:
    """Run ``sh -c command`` in ``workspace`` in its own process group, bounded in time and
    output; the group (background jobs included) is killed when the shell ends, times out,
    or the caller is cancelled."""
    try:
        proc = await trio.lowlevel.open_process(
            ["sh", "-c", command],
            cwd=workspace,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    except OSError:
        return ShellResult("The shell could not be started.", False, None)
    output = bytearray()
    total = 0

    async def read() -> None:
        nonlocal total
        assert proc.stdout is not None
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            while chunk := await proc.stdout.receive_some(1 << 16):
                total += len(chunk)
                output.extend(chunk[: max(0, SUMMARY_LIMIT - len(output))])

    async def reap() -> None:
        await proc.wait()
        _killpg(proc.pid)  # background jobs end with their shell; this also ends the output

    try:
        with trio.move_on_after(time_limit) as deadline:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(read)
                nursery.start_soon(reap)
    finally:
        with trio.CancelScope(shield=True):
            _killpg(proc.pid)
            with trio.move_on_after(2.0):
                await proc.wait()
            if proc.stdout is not None:
                await proc.stdout.aclose()
    summary = output.decode("utf-8", errors="replace")
    truncated = total > len(output)
    if deadline.cancelled_caught:
        return ShellResult(summary + f"\n(timed out after {time_limit:g} s)", truncated, None)
    return ShellResult(summary, truncated, proc.returncode)


def _killpg(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
