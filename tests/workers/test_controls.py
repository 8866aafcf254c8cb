"""Worker controls (pause, resume, stop, kill, recognise) on real processes."""

from __future__ import annotations

import os
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import attrs
import psutil  # type: ignore[import-untyped, unused-ignore]
import pytest
import trio

from braid_actors.errors import WorkerStopTimeout
from braid_actors.model import WorkerControl
from braid_actors.workers import (
    ControlResult,
    ProcessInfo,
    ProcessKey,
    StopPolicy,
    TreeObserver,
    adopt,
    kill,
    pause,
    process_gone,
    recognise,
    resume,
    stop,
)
from braid_actors.workers._identity import presence
from tests.workers._procs import assert_gone, key_of, python, read_line, shell_command

if TYPE_CHECKING:
    from pathlib import Path

COUNTER = (
    "import os, sys, time\n"
    "path = sys.argv[1]\n"
    "i = 0\n"
    "while True:\n"
    "    i += 1\n"
    "    with open(path + '.tmp', 'w') as f:\n"
    "        f.write(str(i))\n"
    "    os.replace(path + '.tmp', path)\n"
    "    time.sleep(0.005)\n"
)
"""Writes a rising counter to the file named by its argument."""

IGNORE_TERM = (
    "import signal, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)
SLEEPER = "print('ready', flush=True)\nimport time\ntime.sleep(60)\n"
WAIT_FOR_FILE = (
    "import os, sys, time\n"
    "print('ready', flush=True)\n"
    "while not os.path.exists(sys.argv[1]):\n"
    "    time.sleep(0.01)\n"
)
"""Exits by itself once the file named by its argument exists: a cooperative protocol."""

ORPHAN = (
    "import subprocess, sys\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],\n"
    "                         start_new_session=True)\n"
    "print(child.pid, flush=True)\n"
)
"""Starts a sleeper in its own session and exits without waiting: init adopts it."""

QUICK = StopPolicy(grace=0.1, term_grace=0.3, kill_grace=2.0)


def counter(path: Path) -> int:
    """The counter's value (0 before the process first wrote it)."""
    try:
        return int(path.read_text() or 0)
    except FileNotFoundError:
        return 0


async def rises_past(path: Path, value: int) -> None:
    with trio.fail_after(5):
        # The counter is a file another process writes: nothing can wake us when it changes.
        while counter(path) <= value:  # noqa: ASYNC110
            await trio.sleep(0.01)


def an_impostor(info: ProcessInfo) -> ProcessInfo:
    """The same pid and group under a different creation time: a reused pid."""
    return attrs.evolve(info, create_time=info.create_time - 3.0)


async def test_pause_stops_progress_and_resume_restarts_it(tmp_path: Path) -> None:
    """A paused worker's counter stops advancing and psutil shows it stopped; resume restarts it."""
    path = tmp_path / "count"
    async with python(COUNTER, str(path)) as worker:
        await rises_past(path, 3)
        paused = await pause(worker.info)
        assert paused.result == "paused"
        assert psutil.Process(worker.info.pid).status() == psutil.STATUS_STOPPED
        frozen = counter(path)
        await trio.sleep(0.2)
        assert counter(path) == frozen
        resumed = await resume(worker)
        assert resumed.result == "resumed"
        await rises_past(path, frozen + 3)
        assert psutil.Process(worker.info.pid).status() != psutil.STATUS_STOPPED
    assert [paused.action, resumed.action] == ["pause", "resume"]


async def test_stop_escalates_to_kill_for_a_process_ignoring_sigterm() -> None:
    """The ladder goes cooperative → SIGTERM → SIGKILL for a process that ignores SIGTERM,
    and records the escalation."""
    async with python(IGNORE_TERM) as worker:
        assert await read_line(worker) == "ready"
        asked: list[str] = []

        async def ignored() -> None:
            asked.append("cancel")

        result = await stop(worker.info, QUICK, cooperative=ignored)
        assert process_gone(worker.info)
    assert asked == ["cancel"]
    assert result.result == "killed"
    assert isinstance(result.escalation, WorkerStopTimeout)
    assert result.escalation.details["next"] == "SIGKILL"
    assert result.record() == WorkerControl(action="stop", at=result.at, result="killed")


async def test_stop_is_cooperative_when_the_process_complies(tmp_path: Path) -> None:
    """A process that exits when asked stops at the cooperative step, with no signal."""
    flag = tmp_path / "please-exit"
    async with python(WAIT_FOR_FILE, str(flag)) as worker:
        assert await read_line(worker) == "ready"

        async def ask() -> None:
            flag.touch()

        result = await stop(worker.info, StopPolicy(grace=5.0), cooperative=ask)
        assert process_gone(worker.info)
    assert result.result == "cooperative"
    assert result.escalation is None


async def test_stop_of_a_process_that_ends_by_itself_sends_nothing() -> None:
    """A worker that exits on its own within the grace is reported ``exited``."""
    async with python("import time; time.sleep(0.1)") as worker:
        result = await stop(worker, StopPolicy(grace=5.0))
    assert result.result == "exited"
    assert result.returncode == 0
    assert result.escalation is None


async def test_stop_reaches_a_paused_worker() -> None:
    """A paused worker is still stopped by SIGTERM (it is continued, not left pending)."""
    async with python(SLEEPER) as worker:
        assert await read_line(worker) == "ready"
        assert (await pause(worker)).result == "paused"
        report = await worker.stop(policy=QUICK)
    assert report.stage == "terminated"
    assert report.returncode == -15


async def test_kill_is_immediate() -> None:
    """kill ends even a SIGTERM-ignoring worker at once, without the grace periods."""
    async with python(IGNORE_TERM) as worker:
        assert await read_line(worker) == "ready"
        began = trio.current_time()
        result = await kill(worker)
        took = trio.current_time() - began
    assert result.result == "killed"
    assert result.returncode == -9
    assert took < 1.0


async def test_controls_refuse_a_pid_with_another_creation_time() -> None:
    """No control signals a pid whose creation time differs: each reports ``gone``."""
    async with python(SLEEPER) as worker:
        assert await read_line(worker) == "ready"
        impostor = an_impostor(worker.info)
        results = [
            await pause(impostor),
            await resume(impostor),
            await stop(impostor, QUICK),
            await kill(impostor),
        ]
        assert [r.result for r in results] == ["gone"] * 4
        assert psutil.Process(worker.info.pid).status() != psutil.STATUS_STOPPED
        assert not process_gone(worker.info)
        wrong_group = attrs.evolve(worker.info, pgid=os.getpgid(0))
        assert (await kill(wrong_group)).result == "gone"
        assert not process_gone(worker.info)


async def test_recognise_names_only_the_live_process() -> None:
    """recognise holds for the running worker's exact identity and for nothing else."""
    async with python(SLEEPER) as worker:
        assert await read_line(worker) == "ready"
        info = worker.info
        assert recognise(info.pid, info.create_time, info.pgid)
        assert not recognise(info.pid, info.create_time + 1.0, info.pgid)
        assert not recognise(info.pid, info.create_time, info.pgid + 1)
        adopted = adopt(info.pid, info.create_time, info.pgid)
        assert adopted is not None
        assert adopted.command == (sys.executable, "-c", SLEEPER)
        await kill(worker)
    assert not recognise(info.pid, info.create_time, info.pgid)
    assert adopt(info.pid, info.create_time, info.pgid) is None


async def test_a_worker_this_process_did_not_spawn_is_adopted_and_stopped() -> None:
    """An orphan (re-parented to init) is recognised by its identity and stopped via psutil."""
    keys: list[ProcessKey] = []
    try:
        async with python(ORPHAN) as helper:
            keys.append(key_of(int(await read_line(helper))))
            with trio.fail_after(5):
                await helper.wait()
        (key,) = keys
        assert psutil.Process(key.pid).ppid() != os.getpid()
        info = adopt(key.pid, key.create_time, pgid=key.pid)
        assert info is not None
        result = await stop(info, QUICK)
        assert result.result == "terminated"
        assert result.returncode is None
        assert process_gone(info)
    finally:
        await assert_gone(keys)


async def test_stopping_a_child_leaves_its_siblings() -> None:
    """A control on a child the observer found signals that child alone, not its group."""
    async with shell_command(("sh", "-c", "sleep 30 & sleep 30 & wait")) as worker:
        observer = TreeObserver.of(worker.info)
        with trio.fail_after(5):
            while len(children := observer.sample().descendants) < 2:  # noqa: ASYNC110
                await trio.sleep(0.02)  # sampling is the only way to see the children appear
        first, second = (child.info() for child in children)
        assert first is not None
        assert second is not None
        assert first.pgid == worker.info.pgid
        result = await stop(first, QUICK)
        assert result.result == "terminated"
        assert process_gone(first)
        assert not process_gone(second)
        assert not process_gone(worker.info)
    await assert_gone([first.key, second.key])


def test_control_result_is_a_worker_control_record() -> None:
    """A ControlResult records as the model's WorkerControl with the same fields."""
    result = ControlResult("pause", at=_epoch(), result="paused")
    assert result.record() == WorkerControl(action="pause", at=_epoch(), result="paused")


def _epoch() -> datetime:
    return datetime(2026, 1, 1, tzinfo=UTC)


LEAVES_A_GROUP_MEMBER = (
    "import subprocess, sys\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
    "print(child.pid, flush=True)\n"
)
"""Starts a sleeper in its own process group and exits: the group outlives its leader."""


async def test_stop_of_an_exited_leader_kills_what_is_left_of_its_group() -> None:
    """The leader exited and its pid is free (signal 0 says so, psutil is not asked): the
    group of that number can only be the worker's, and its last member is killed."""
    keys: list[ProcessKey] = []
    try:
        async with python(LEAVES_A_GROUP_MEMBER) as leader:
            info = leader.info
            keys.append(key_of(int(await read_line(leader))))
            with trio.fail_after(5):
                await leader.wait()  # reaped: its pid is free
            (member,) = keys
            assert os.getpgid(member.pid) == info.pgid == info.pid
            with pytest.raises(ProcessLookupError):
                os.kill(info.pid, 0)
            result = await stop(info, QUICK)  # as a supervisor that did not spawn it
            assert result.result == "gone"
            with trio.fail_after(5):
                while presence(member) == "running":  # noqa: ASYNC110
                    await trio.sleep(0.01)
    finally:
        await assert_gone(keys)
