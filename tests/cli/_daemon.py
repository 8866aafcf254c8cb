"""Helpers for daemon tests: real `braid serve` processes and JSONL clients on their socket."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from contextlib import asynccontextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import psutil
import trio

from braid_actors.journal import Journal, load_or_create_key

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterator

READY_TIMEOUT = 30.0
BRAID = [sys.executable, "-m", "braid_actors.cli.main"]


def clean_env() -> dict[str, str]:
    """This process's environment without Braid's own variables."""
    drop = {"BRAID_HOME", "BRAID_KEY", "BRAID_MAX_ACTIVE"}
    return {k: v for k, v in os.environ.items() if k not in drop}


@contextlib.contextmanager
def short_dir() -> Iterator[Path]:
    """A directory with a short path: a Unix socket path is limited to 107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="bd", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


class Conn:
    """A JSONL client on one connection: replies by id, unsolicited events in order."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.events: list[dict[str, Any]] = []
        self.closed = trio.Event()
        self._replies: dict[Any, dict[str, Any]] = {}
        self._arrived = trio.Event()
        self._n = 0

    async def read_forever(self) -> None:
        buf = b""
        try:
            while chunk := await self.stream.receive_some(65536):
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    message = json.loads(line)
                    if "event" in message:
                        self.events.append(message)
                    else:
                        self._replies[message.get("id")] = message
                self._arrived.set()
                self._arrived = trio.Event()
        except trio.BrokenResourceError:
            pass
        finally:
            self.closed.set()
            self._arrived.set()

    async def send(self, command: str, params: dict[str, Any] | None = None) -> str:
        self._n += 1
        rid = f"r{self._n}"
        body: dict[str, Any] = {"id": rid, "command": command}
        if params is not None:
            body["params"] = params
        await self.stream.send_all(json.dumps(body).encode() + b"\n")
        return rid

    async def reply(self, rid: str) -> dict[str, Any]:
        while rid not in self._replies:
            assert not self.closed.is_set(), f"connection closed before reply {rid}"
            await self._arrived.wait()
        return self._replies.pop(rid)

    async def call(self, command: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        reply = await self.reply(await self.send(command, params))
        assert reply["ok"], reply
        result: dict[str, Any] = reply["result"]
        return result

    async def event(
        self, match: Callable[[dict[str, Any]], bool], *, start: int = 0
    ) -> dict[str, Any]:
        """The first event from index ``start`` that ``match`` accepts (waits for it)."""
        seen = start
        while True:
            for message in self.events[seen:]:
                if match(message):
                    return message
            seen = len(self.events)
            assert not self.closed.is_set(), "connection closed while waiting for an event"
            await self._arrived.wait()


@asynccontextmanager
async def connected(path: Path) -> AsyncIterator[Conn]:
    stream = await trio.open_unix_socket(str(path))
    async with stream, trio.open_nursery() as nursery:
        conn = Conn(stream)
        nursery.start_soon(conn.read_forever)
        yield conn
        nursery.cancel_scope.cancel()


class Daemon:
    """One `braid serve` process and its home."""

    def __init__(self, proc: trio.Process, home: Path, log: IO[bytes]) -> None:
        self.proc = proc
        self.home = home
        self.path = home / "braid.sock"
        self._log = log

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        self._log.flush()
        return Path(self._log.name).read_text(errors="replace")

    def workers(self) -> list[psutil.Process]:
        """The daemon's descendant processes (run workers and their children)."""
        try:
            return psutil.Process(self.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    async def wait(self) -> int:
        """The exit code; the daemon must exit within 30 s."""
        with trio.fail_after(30):
            return await self.proc.wait()

    async def kill(self) -> None:
        if self.proc.returncode is None:
            stray = self.workers()
            self.proc.kill()
            await self.proc.wait()
            for child in stray:
                with contextlib.suppress(psutil.NoSuchProcess):
                    child.kill()
        self._log.close()


class Daemons:
    """Starts daemons for a test and kills whatever is left at its end."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.home = base / "h"
        self.started: list[Daemon] = []

    async def start(self, *args: str, env: dict[str, str] | None = None) -> Daemon:
        log = (self.base / f"serve{len(self.started)}.log").open("wb")
        proc = await trio.lowlevel.open_process(
            [*BRAID, "--home", str(self.home), "serve", *args],
            stdout=subprocess.PIPE,
            stderr=log,
            env=env or clean_env(),
        )
        daemon = Daemon(proc, self.home, log)
        self.started.append(daemon)
        assert proc.stdout is not None
        line = b""
        with trio.fail_after(READY_TIMEOUT):
            while not line.endswith(b"\n"):
                chunk = await proc.stdout.receive_some(1)
                assert chunk, f"serve exited before it was ready: {daemon.log()}"
                line += chunk
        assert line.decode().strip() == f"braid: serving on {daemon.path}", line
        return daemon

    async def aclose(self) -> None:
        for daemon in self.started:
            await daemon.kill()


def journal_types(home: Path) -> Counter[str]:
    """How many records of each type the journal in ``home`` holds."""
    with Journal.open(home, load_or_create_key(home, {}), readonly=True) as journal:
        return Counter(record.type for record in journal.read())


def gone(pid: int) -> bool:
    """True when no live process has ``pid`` (a zombie counts as gone)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
