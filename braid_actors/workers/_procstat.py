"""One read of ``/proc/<pid>/stat`` (Linux): what a tree sample needs of a known member.

psutil reads a member's figures from four files and a syscall (``stat`` twice, once to
check the pid still names the process, ``statm``, ``cmdline``, ``getpgid``), ~75 us a
member; a sample of hundreds of trees per interval is then a large share of a core. The
stat line alone holds the state, the parent, the process group, the CPU times (own and
reaped children), the start tick and the executable's name; with ``statm`` (the resident
set), two reads. The figures are psutil's: the same fields of the same files, divided
the same way (ticks by ``SC_CLK_TCK``, pages by the page size), the same status names.
The resident set is ``statm``'s, not the stat line's: on this kernel (6.18) the stat line's
figure is the per-CPU counters' approximate reading and ``statm``'s their exact sum, 1-7%
apart for 6 of 66 processes read one after the other. ``cmdline`` is read again only when
the executable's name changes (see :class:`~braid_actors.workers.TreeObserver`).

Identity: the start tick of a process never changes and two processes that share a pid
start at different ticks, so a member is the same process exactly when its stat line shows
the start tick of its first reading (which :class:`~braid_actors.workers.TreeObserver`
checks against psutil's creation time once, when the member is first seen).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import resource
import sys
import threading
from typing import TYPE_CHECKING, Final

import attrs

if TYPE_CHECKING:
    from collections.abc import Callable

AVAILABLE: Final = sys.platform.startswith("linux") and os.path.isdir("/proc/self")
"""This module's reading is used only where ``/proc`` is Linux's."""

TICKS: Final = os.sysconf("SC_CLK_TCK") if AVAILABLE else 100
_PAGE: Final = os.sysconf("SC_PAGE_SIZE") if AVAILABLE else 4096
# psutil's names for the state letters (psutil._pslinux.PROC_STATUSES)
_STATUSES: Final = {
    b"R": "running",
    b"S": "sleeping",
    b"D": "disk-sleep",
    b"T": "stopped",
    b"t": "tracing-stop",
    b"Z": "zombie",
    b"X": "dead",
    b"x": "dead",
    b"K": "wake-kill",
    b"W": "waking",
    b"I": "idle",
    b"P": "parked",
}


@attrs.frozen
class StatLine:
    """The fields of one ``/proc/<pid>/stat`` line a tree sample uses."""

    comm: bytes
    """The executable's name as the kernel keeps it (set anew by each ``exec``)."""
    status: str
    ppid: int
    pgid: int
    user: float
    system: float
    children_user: float
    children_system: float
    start_tick: int
    args_at: tuple[int, int] | None = None
    """Where the command line lies in the process's memory (``arg_start``, ``arg_end``):
    each exec lays it out anew; null when the kernel shows no addresses to this reader."""

    @property
    def zombie(self) -> bool:
        return self.status == "zombie"


class Unreadable(Exception):
    """A stat line that cannot be read, or is not one this module knows: ask psutil."""


def read_proc_file(path: str) -> bytes:
    """The whole of a ``/proc`` file, read without a Python file object (half the cost
    of ``open(path, "rb").read()``: no buffered reader, no context manager); raises the
    ``OSError`` that ``open`` would."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = os.read(fd, 4096)
        if len(data) < 4096:  # /proc hands a small file over in one read
            return data
        chunks = [data]
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


_COUNTERS_SIZE: Final = 4096
"""Bytes of a counters file read in one call (a stat line is at most ~1 KB: its only
text, the executable's name, is at most 15 bytes)."""


class _HeldReader:
    """``open``/``read``/``close`` of libc called through :class:`ctypes.PyDLL`, which keeps
    the interpreter across the call, where ``os.open``/``os.read``/``os.close`` each let it
    go and take it back. See :func:`read_proc_counters`."""

    def __init__(self) -> None:
        libc = ctypes.PyDLL(None, use_errno=True)
        self._open = libc.open
        self._open.argtypes = [ctypes.c_char_p, ctypes.c_int]
        self._open.restype = ctypes.c_int
        self._read = libc.read
        self._read.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]
        self._read.restype = ctypes.c_ssize_t
        self._close = libc.close
        self._close.argtypes = [ctypes.c_int]
        self._close.restype = ctypes.c_int
        self._pread = libc.pread
        self._pread.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_long]
        self._pread.restype = ctypes.c_ssize_t
        self._local = threading.local()

    def open_fd(self, path: str) -> int:
        """``open(path)`` for reading; raises the ``OSError`` ``open`` would."""
        encoded = os.fsencode(path)
        while (fd := self._open(encoded, os.O_RDONLY | os.O_CLOEXEC)) < 0:
            _raise_unless_interrupted(path)
        return int(fd)

    def pread_start(self, fd: int, path: str) -> bytes:
        """The file open as ``fd`` read from its start (``path`` names it in errors); a
        counters file whole, else its first :data:`_COUNTERS_SIZE` bytes."""
        buffer = self._buffer()
        while (count := self._pread(fd, buffer, _COUNTERS_SIZE, 0)) < 0:
            _raise_unless_interrupted(path)
        return buffer.raw[:count]

    def close_fd(self, fd: int) -> None:
        self._close(fd)

    def _buffer(self) -> ctypes.Array[ctypes.c_char]:
        buffer: ctypes.Array[ctypes.c_char] | None = getattr(self._local, "buffer", None)
        if buffer is None:
            buffer = self._local.buffer = ctypes.create_string_buffer(_COUNTERS_SIZE)
        return buffer

    def __call__(self, path: str) -> bytes:
        buffer = self._buffer()
        fd = self.open_fd(path)
        try:
            while (count := self._read(fd, buffer, _COUNTERS_SIZE)) < 0:
                _raise_unless_interrupted(path)
            if count < _COUNTERS_SIZE:
                return buffer.raw[:count]
        finally:
            self._close(fd)
        return read_proc_file(path)  # not a counters file after all: read it whole anew


def _raise_unless_interrupted(path: str) -> None:
    code = ctypes.get_errno()
    if code != errno.EINTR:  # retried, as os.open and os.read do (PEP 475)
        raise OSError(code, os.strerror(code), path)  # FileNotFoundError for ENOENT, ...


class _OsFiles:
    """:class:`_HeldReader`'s kept-file calls by ``os`` (which let the interpreter go)."""

    def open_fd(self, path: str) -> int:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)

    def pread_start(self, fd: int, path: str) -> bytes:
        return os.pread(fd, _COUNTERS_SIZE, 0)

    def close_fd(self, fd: int) -> None:
        os.close(fd)


def _held_reader() -> _HeldReader | None:
    if not AVAILABLE:
        return None
    try:
        return _HeldReader()
    except (OSError, AttributeError):  # no C library to call: read as everything else is
        return None


_HELD: Final = _held_reader()
_FILES: Final[_HeldReader | _OsFiles] = _HELD or _OsFiles()
read_proc_counters: Final[Callable[[str], bytes]] = _HELD or read_proc_file
"""The whole of a ``/proc`` file the kernel writes from counters without waiting on the
process (``stat``, ``statm``), read without letting the interpreter go; raises the
``OSError`` that ``open`` would.

Sampling runs in worker threads beside the event loop. Each ``os.*`` call lets the
interpreter go and then waits to take it back, and under load the event loop has it
meanwhile: three calls a file, two files a member, 500 members a tick. Sampling 200
one-process trees in a thread beside a busy thread took 88-358 us of CPU and 115-1,206 us
of wall a sample that way, 51-141 us and 53-388 us with the calls holding it (alone, 35-39
and 39-40 us of CPU). Not for ``cmdline``: reading it takes the process's memory map
lock, which a process can hold for long, and meanwhile no other thread would run."""


class StatFile:
    """One process's ``/proc/<pid>/stat``, opened once and read again at every sample.

    A read of the open file from its start makes the kernel write the line anew, and
    spares each reading the path lookup, the open and the close: a tick of 500 idle
    one-process trees took 10.1-10.6 ms of CPU opening the file each time, 6.3-7.1 ms
    reading kept ones (medians of 8 blocks). The open file stands for the process, not for
    its pid: once the process is reaped, a read fails (``ESRCH``) even if the pid names
    another process by then. Closed by :meth:`close`, or when the last reference to it
    goes; only its owner reads it, one thread at a time.

    At most half of this process's open-file limit is kept so (see :func:`_reserve`): past
    that, a stat file is opened, read and closed at each reading, as before.
    """

    __slots__ = ("_closed", "_fd", "path")

    def __init__(self, path: str, fd: int | None) -> None:
        self.path = path
        self._fd = fd
        """The kept descriptor; ``None``: read by path each time."""
        self._closed = False

    @classmethod
    def open(cls, pid: int) -> StatFile | None:
        """``pid``'s stat file, or ``None`` when there is no such process; raises
        :class:`Unreadable` when it cannot be opened."""
        path = f"/proc/{pid}/stat"
        if not _reserve():
            return cls(path, None)  # its first read says whether the process exists
        try:
            fd = _FILES.open_fd(path)
        except (FileNotFoundError, ProcessLookupError):
            _release()
            return None
        except OSError as exc:
            _release()
            raise Unreadable(str(exc)) from None
        except BaseException:
            _release()
            raise
        return cls(path, fd)

    @property
    def kept(self) -> bool:
        """Whether it holds the file open between readings."""
        return self._fd is not None

    def read(self) -> bytes | None:
        """The stat line now, or ``None`` once the process is gone (or closed); raises
        :class:`Unreadable` when it cannot be read."""
        if self._closed:
            return None
        fd, path = self._fd, self.path
        try:
            data = read_proc_counters(path) if fd is None else _FILES.pread_start(fd, path)
        except (FileNotFoundError, ProcessLookupError):
            return None
        except OSError as exc:
            raise Unreadable(str(exc)) from None
        if len(data) < _COUNTERS_SIZE:
            return data
        raise Unreadable(f"{self.path} is longer than a stat line")

    def close(self) -> None:
        self._closed = True
        fd, self._fd = self._fd, None
        if fd is not None:
            _FILES.close_fd(fd)
            _release()

    def __del__(self) -> None:
        # (at interpreter exit the module's globals may be gone: the OS closes it then)
        with contextlib.suppress(Exception):
            self.close()


_KEPT_LOCK: Final = threading.Lock()
_kept = 0
"""Stat files held open now (sampling threads open them, the event loop closes some)."""


def kept_files() -> int:
    """How many stat files are held open now."""
    return _kept


def _reserve() -> bool:
    """Count one more kept stat file, unless that would pass half the open-file limit."""
    global _kept
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    limit = 1 << 16 if soft == resource.RLIM_INFINITY else soft // 2
    with _KEPT_LOCK:
        if _kept >= limit:
            return False
        _kept += 1
        return True


def _release() -> None:
    global _kept
    with _KEPT_LOCK:
        _kept -= 1


_PROCESSOR: Final = 36
"""Index of the ``processor`` field (the 39th) after the executable's name."""


def stat_identity(data: bytes) -> bytes:
    """``data``, a stat line, up to its 39th field (``processor``, the CPU the process last
    ran on: it moves with every migration between CPUs and tells nothing a sample reads;
    the fields after it are real-time policy, block-I/O delay, guest time, fixed addresses
    and the exit code). Two readings with the same identity hold the same state, parent,
    group, fault counts, CPU times, threads, start tick, size and resident set figure."""
    close = data.rfind(b")")
    fields = data[close + 2 :].split(b" ", _PROCESSOR)
    if len(fields) <= _PROCESSOR:
        return data
    return data[: len(data) - len(fields[_PROCESSOR]) - 1]


def parse_stat(pid: int, data: bytes) -> StatLine:
    """The fields of ``pid``'s stat line ``data``; raises :class:`Unreadable` when it is not
    a stat line."""
    # "pid (comm) state ppid pgrp ...": comm may hold spaces and ")", so the fields are read
    # after the last ")" (as psutil does).
    close = data.rfind(b")")
    fields = data[close + 2 :].split()
    try:
        return StatLine(
            comm=data[data.find(b"(") + 1 : close],
            status=_STATUSES.get(fields[0], "?"),
            ppid=int(fields[1]),
            pgid=int(fields[2]),
            user=float(fields[11]) / TICKS,
            system=float(fields[12]) / TICKS,
            children_user=float(fields[13]) / TICKS,
            children_system=float(fields[14]) / TICKS,
            start_tick=int(fields[19]),
            args_at=_args_at(fields),
        )
    except (IndexError, ValueError):
        raise Unreadable(f"/proc/{pid}/stat is not a stat line this module reads") from None


_ARG_START: Final = 45
"""Index of ``arg_start`` (the 48th field) after the executable's name; ``arg_end`` follows."""


def _args_at(fields: list[bytes]) -> tuple[int, int] | None:
    if len(fields) <= _ARG_START + 1:
        return None  # a kernel older than 3.5
    start, end = int(fields[_ARG_START]), int(fields[_ARG_START + 1])
    return (start, end) if start or end else None  # zeros: hidden from this reader


def read_rss(pid: int) -> int | None:
    """``pid``'s resident set in bytes as psutil reads it (``statm``: the stat line's own
    figure is read from other counters and can differ by a few pages), or ``None``."""
    try:
        return int(read_proc_counters(f"/proc/{pid}/statm").split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return None


def read_argv(pid: int) -> list[str] | None:
    """``pid``'s command line as psutil reads it, or ``None`` when it cannot be read."""
    try:
        data = read_proc_file(f"/proc/{pid}/cmdline").decode("utf-8", "surrogateescape")
    except OSError:
        return None
    if not data:
        return []  # a zombie or a kernel thread
    # psutil's rules: NUL-separated; a process that rewrote its title may use spaces instead
    sep = "\x00" if data.endswith("\x00") else " "
    if data.endswith(sep):
        data = data[:-1]
    argv = data.split(sep)
    if sep == "\x00" and len(argv) == 1 and " " in data:
        argv = data.split(" ")
    return argv
