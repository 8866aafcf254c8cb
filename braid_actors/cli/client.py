"""``braid headless`` as a client of a running daemon (``braid serve``).

Standard input goes to the daemon's socket unchanged, and the daemon's lines come back on
standard output unchanged, so the protocol is exactly the daemon's. End of standard input
half-closes the connection: the daemon stops reading, still writes the replies it owes,
then closes, and the client exits. The daemon keeps running.
"""

from __future__ import annotations

import os
import sys

import trio

_CHUNK = 65_536


async def _upstream(source: trio.abc.ReceiveStream, sock: trio.SocketStream) -> None:
    try:
        while chunk := await source.receive_some(_CHUNK):
            await sock.send_all(chunk)
        await sock.send_eof()
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass  # the daemon closed the connection; the downstream side ends the client


async def pipe(
    sock: trio.SocketStream, source: trio.abc.ReceiveStream, sink: trio.abc.SendStream
) -> None:
    """Copy ``source`` to the daemon and the daemon's output to ``sink`` until it closes."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_upstream, source, sock)
        try:
            while chunk := await sock.receive_some(_CHUNK):
                await sink.send_all(chunk)
        except trio.BrokenResourceError:
            pass  # a daemon that vanished ends the session like one that closed it
        nursery.cancel_scope.cancel(reason="the daemon closed the connection")


async def run_client(sock: trio.SocketStream) -> None:
    """The client on this process's standard input and output."""
    stdin = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
    stdout = trio.lowlevel.FdStream(os.dup(sys.stdout.fileno()))
    async with sock, stdin, stdout:
        await pipe(sock, stdin, stdout)
