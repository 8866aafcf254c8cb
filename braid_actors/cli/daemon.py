"""``braid serve``: Braid as a daemon serving the headless protocol on a Unix socket.

Design note: the daemon owns ``$BRAID_HOME/braid.sock`` (mode 0600) for as long as it runs.
Start-up claims ``braid.lock`` with ``flock`` first, so two daemons on one home can't race
for the socket; then a socket that answers belongs to a live daemon (refuse), and one that
doesn't was left by a dead daemon (remove it). The socket is bound and listening before the
application starts, but connections are accepted only once it has.

Each connection is one :func:`~braid_actors.cli.headless.serve_session`: the headless loop
with its own subscriptions; its end of input never stops Braid. Only the ``shutdown``
command or SIGTERM / SIGINT do, through :meth:`BraidApp.shutdown` (which journals
``application.shutdown.requested`` once, however many times it is asked). After Braid has
stopped the listener closes, the socket is removed, and connections get 2 s for replies
they are owed.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import os
import signal
import socket
import stat
import sys
from typing import TYPE_CHECKING, Literal

import attrs
import trio

from braid_actors.app import DEFAULT_DRAIN_GRACE, BraidApp, open_app
from braid_actors.cli.headless import Writer, serve_session
from braid_actors.errors import BadRequest, DaemonRunning

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterator, Mapping
    from pathlib import Path

SOCKET_NAME = "braid.sock"
LOCK_NAME = "braid.lock"
MAX_SOCKET_PATH = 107
"""Longest path ``AF_UNIX`` accepts on Linux (108 bytes with the terminating NUL)."""
_ACCEPT_RETRY = 0.1
_ACCEPT_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})

ShutdownMode = Literal["drain", "cancel"]


def socket_path(home: Path) -> Path:
    return home / SOCKET_NAME


@attrs.frozen
class ServeOptions:
    """How ``braid serve`` runs."""

    on_shutdown: ShutdownMode = "drain"
    """What a signal does with active runs: let them finish (within the grace) or cancel."""
    drain_grace: float = DEFAULT_DRAIN_GRACE
    """Seconds a draining shutdown waits for active runs before cancelling them."""
    max_active: int | None = None
    """Global admission limit (simultaneously active runs); null is unlimited."""

    def __attrs_post_init__(self) -> None:
        if self.drain_grace < 0:
            raise BadRequest("--drain-grace must be zero or more seconds")
        if self.max_active is not None and self.max_active < 1:
            raise BadRequest("--max-active must be at least 1")


async def connect(home: Path) -> trio.SocketStream | None:
    """A connection to the live daemon of ``home``, or None when none answers."""
    path = socket_path(home)
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        return None
    try:
        return await trio.open_unix_socket(os.fspath(path))
    except OSError:  # no socket file, nobody listening, not a socket: no daemon
        return None


# ---- claiming the home -------------------------------------------------------------------


@contextlib.contextmanager
def _claim(home: Path) -> Iterator[None]:
    """Hold ``braid.lock`` for the daemon's life; refuse when another daemon holds it."""
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(home / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DaemonRunning(
                f"another Braid daemon is serving {home}", details={"home": str(home)}
            ) from None
        yield
    finally:
        os.close(fd)  # releases the lock; the file stays so the next claim never races


def _bind(path: Path) -> socket.socket:
    """A listening socket at ``path`` that only this user may open (mode 0600)."""
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise BadRequest(
            f"the socket path {path} is too long for a Unix socket; use a shorter Braid home",
            details={"path": str(path)},
        )
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        # Before any thread runs: the umask is process-wide.
        old = os.umask(0o177)
        try:
            sock.bind(os.fspath(path))
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
        sock.listen(128)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def _remove_stale(path: Path) -> None:
    try:
        found = path.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(found.st_mode):
        raise BadRequest(
            f"{path} exists and is not a socket; move it away", details={"path": str(path)}
        )
    path.unlink()


def _remove_own(path: Path, inode: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        if path.lstat().st_ino == inode:
            path.unlink()


# ---- serving -----------------------------------------------------------------------------


async def serve(
    home: Path,
    options: ServeOptions,
    *,
    env: Mapping[str, str] = os.environ,
    ready: Callable[[str], None] | None = None,
) -> None:
    """Run Braid and serve the socket until ``shutdown`` or a signal has stopped it."""
    path = socket_path(home)
    with _claim(home):
        live = await connect(home)
        if live is not None:
            await live.aclose()
            raise DaemonRunning(
                f"another Braid daemon answers on {path}", details={"path": str(path)}
            )
        _remove_stale(path)
        sock = _bind(path)
        inode = path.lstat().st_ino
        listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
        try:
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async with trio.open_nursery() as nursery:
                    app: BraidApp = await nursery.start(
                        functools.partial(
                            open_app,
                            home,
                            env=env,
                            admission_limit=options.max_active,
                            settle=True,
                        )
                    )
                    app.drain_grace = options.drain_grace
                    nursery.start_soon(_on_signals, signals, app, options, nursery)
                    async with trio.open_nursery() as connections:
                        accepting = trio.CancelScope()
                        connections.start_soon(_accept, listener, app, connections, accepting)
                        (ready or _say)(f"braid: serving on {path}")
                        await app.stopped.wait()
                        accepting.cancel(reason="Braid stopped")
                        await listener.aclose()
                        _remove_own(path, inode)
                    nursery.cancel_scope.cancel(reason="Braid stopped")
        finally:
            listener.socket.close()
            _remove_own(path, inode)


def _say(line: str) -> None:
    print(line, flush=True)


async def _accept(
    listener: trio.SocketListener,
    app: BraidApp,
    connections: trio.Nursery,
    scope: trio.CancelScope,
) -> None:
    with scope:
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:
                if exc.errno not in _ACCEPT_ERRNOS:
                    raise
                # Out of descriptors or memory: wait for connections to close, keep serving.
                await trio.sleep(_ACCEPT_RETRY)
                continue
            connections.start_soon(_connection, app, stream)


async def _connection(app: BraidApp, stream: trio.SocketStream) -> None:
    try:
        async with stream:
            await serve_session(app, stream, Writer(stream))
    except* (trio.BrokenResourceError, trio.ClosedResourceError):
        pass  # the client went away; its session ends with it
    except* Exception as group:
        # A fault in one session ends that connection, never the daemon and its runs.
        names = sorted({type(e).__name__ for e in _leaves(group)})
        print(f"braid: a connection failed ({', '.join(names)})", file=sys.stderr, flush=True)


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    found: list[BaseException] = []
    for item in group.exceptions:
        found.extend(_leaves(item) if isinstance(item, BaseExceptionGroup) else [item])
    return found


async def _on_signals(
    signals: AsyncIterator[int],
    app: BraidApp,
    options: ServeOptions,
    nursery: trio.Nursery,
) -> None:
    """The first SIGTERM / SIGINT starts the safe shutdown; later ones only say so."""
    started = False
    async for signum in signals:
        name = signal.Signals(signum).name
        if started:
            print(f"braid: {name}: already shutting down", file=sys.stderr, flush=True)
            continue
        started = True
        drain = options.on_shutdown == "drain"
        print(f"braid: {name}: shutting down ({options.on_shutdown})", file=sys.stderr, flush=True)
        nursery.start_soon(functools.partial(app.shutdown, drain=drain))
